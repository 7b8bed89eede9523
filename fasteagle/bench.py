"""Side-by-side measurement of decoding methods on prompt sets.

Protocol: the same chat template and `max_new_tokens` for every method; one warmup run per method
(the longest prompt, all `max_new_tokens`, stop tokens ignored);
methods interleaved prompt by prompt (so drift hits all alike); device sync before each clock read.
Reported per method, overall and per category: tokens/s (pooled, median and spread over prompts),
speedup against our vanilla loop and against Hugging Face `generate`, tau (tokens per target
forward, bonus included), per-depth acceptance, draft and verify ms per step, peak GPU memory, and
how many greedy outputs are token-identical to vanilla (not checked under sampling).

JSON schema (`compare` + `result_document`): {"device", "target", "date", "torch", "settings",
"methods": {name: summary}, "per_category": {category: {name: summary}}, "rows": {name: [per prompt]},
"command"} (+ "partial" for a run stopped early); README "Benchmarks" says what each field holds.
"""

from __future__ import annotations

import datetime
import json
import math
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from tqdm.auto import tqdm

from fasteagle import packing
from fasteagle.errors import FastEagleError
from fasteagle.files import atomic_path, write_text
from fasteagle.generate import chat_prompt_ids, generate, synchronize
from fasteagle.hybrid import LOOKUP_SOURCE
from fasteagle.kvcache import KVCache
from fasteagle.target import Target, default_device, parse_dtype
from fasteagle.tree import chain, path_tree
from fasteagle.verify import SamplingParams, tree_forward

HF_METHODS = ("hf-generate", "hf-prompt-lookup")


def load_prompts(path: str | Path, limit: int | None = None) -> list[dict]:
    """JSON lines with `turns` (first turn used), `prompt` or `text`; optional `category`. A line
    without a prompt is an error that names it, as is a file without any."""
    if limit is not None and limit < 1:
        raise FastEagleError(f"--limit must be at least 1 (got {limit})")
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise FastEagleError(f"cannot read the prompt file {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError as exc:
        raise FastEagleError(f"the prompt file {path} is not UTF-8 text ({exc.reason} at byte {exc.start}); "
                             "save it as UTF-8") from None
    rows = []
    for n, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            d = json.loads(line)
        except json.JSONDecodeError as exc:
            raise FastEagleError(f"{path}:{n}: not JSON ({exc.msg})") from None
        d = d if isinstance(d, dict) else {}
        if "turns" in d:
            text = d["turns"][0] if isinstance(d["turns"], list) and d["turns"] else None
        else:
            text = d.get("prompt") or d.get("text")
        if not isinstance(text, str) or not text.strip():
            raise FastEagleError(f"{path}:{n}: no prompt (a non-empty `turns` list, `prompt` or `text`)")
        rows.append({"id": str(d.get("id", len(rows))), "category": str(d.get("category") or Path(path).stem),
                     "text": text})
    if not rows:
        raise FastEagleError(f"{path} holds no prompts")
    return rows[:limit] if limit else rows


def tuning_prompts(files: list[str], limit: int | None, n: int = 3) -> list[dict]:
    """Prompts for `--tree auto` to tune on: `n` from past each file's `--limit`, taken in turn from
    the files, so the budget is not picked on the prompts it is then measured on; the first `n`
    measured ones where the files hold no more."""
    spare = [load_prompts(f)[limit:] if limit else [] for f in files]
    picked = [p for group in zip(*spare) for p in group] if all(spare) else [p for g in spare for p in g]
    return picked[:n] if len(picked) >= n else [p for f in files for p in load_prompts(f, limit)][:n]


def time_one(target: Target, ids: torch.Tensor, method: str, drafter, max_new: int, sampling: SamplingParams,
             seed: int, stop: bool = True) -> dict:
    """Decode one prompt with one method and measure it (`stop`=False: all `max_new` tokens, stop
    tokens or not, as a warmup wants)."""
    dev = target.device
    if dev.type == "cuda":
        torch.cuda.reset_peak_memory_stats(dev)
    if method in HF_METHODS:
        return _time_hf(target, ids, max_new, sampling, seed, lookup=method == "hf-prompt-lookup", stop=stop)
    synchronize(dev)
    t0 = time.perf_counter()
    traces = list(generate(target, ids, drafter=drafter, max_new_tokens=max_new, sampling=sampling, seed=seed,
                           stop_ids=None if stop else set()))
    synchronize(dev)
    wall = time.perf_counter() - t0
    steps = traces[1:]
    reached, accepted = _depth_acceptance(steps)
    return {"tokens": [t for tr in traces for t in tr.tokens], "wall_s": wall, "forwards": traces[-1].forwards,
            "steps": len(steps),
            "draft_ms": statistics.fmean([s.draft_ms for s in steps]) if steps else 0.0,
            "verify_ms": statistics.fmean([s.verify_ms for s in steps]) if steps else 0.0,
            "accepted_lengths": [len(s.tokens) for s in steps],
            "depth_reached": reached, "depth_accepted": accepted, "peak_mb": _peak_mb(dev)}


def _time_hf(target: Target, ids: torch.Tensor, max_new: int, sampling: SamplingParams, seed: int,
             lookup: bool, stop: bool = True) -> dict:
    """Hugging Face `generate` (optionally its prompt-lookup decoding), batch 1, same stop ids."""
    model, dev = target.model, target.device
    x = ids.to(dev)[None]
    kwargs = {"max_new_tokens": max_new, "attention_mask": torch.ones_like(x), "top_k": None,
              "eos_token_id": sorted(target.stop_ids()), "pad_token_id": target.tokenizer.eos_token_id}
    if not stop:
        kwargs["min_new_tokens"] = max_new
    if sampling.greedy:
        kwargs |= {"do_sample": False, "temperature": None, "top_p": None}
    else:
        kwargs |= {"do_sample": True, "temperature": sampling.temperature, "top_p": sampling.top_p}
    if lookup:
        kwargs["prompt_lookup_num_tokens"] = 10
    torch.manual_seed(seed)
    synchronize(dev)
    t0 = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(x, **kwargs)
    synchronize(dev)
    wall = time.perf_counter() - t0
    return {"tokens": out[0, x.shape[1]:].tolist(), "wall_s": wall, "forwards": None, "draft_ms": None,
            "verify_ms": None, "accepted_lengths": [], "depth_reached": [], "depth_accepted": [],
            "peak_mb": _peak_mb(dev)}


def _peak_mb(dev: torch.device) -> float | None:
    return round(torch.cuda.max_memory_allocated(dev) / 2**20, 1) if dev.type == "cuda" else None


def _depth_acceptance(steps) -> tuple[list[int], list[int]]:
    """Per depth d: in how many steps the verifier judged a depth-d node (the accepted depth-(d-1)
    node has children: a path that ends at a leaf reached no deeper), and in how many it accepted one."""
    reached, accepted = [], []
    for s in steps:
        if not s.tree:
            continue
        has_children = set(s.tree["parents"])
        acc_len = len(s.path) - 1
        for d in range(1, acc_len + 2):
            if s.path[d - 1] not in has_children:
                break
            if len(reached) < d:
                reached.append(0)
                accepted.append(0)
            reached[d - 1] += 1
            accepted[d - 1] += d <= acc_len
    return reached, accepted


def compare(target: Target, methods: dict, prompts: list[dict], max_new: int = 128,
            sampling: SamplingParams | None = None, seed: int = 0, warmup: int = 1,
            on_prompt: Callable[[dict], None] | None = None) -> dict:
    """Run every method on every prompt, interleaved prompt by prompt. `methods`: name -> drafter
    (None for vanilla and the hf-* methods). Returns the per-prompt rows by method. `on_prompt(rows)`
    runs after each prompt (every method then has as many rows), so a run cut short by a time limit
    can still keep what it measured."""
    sampling = sampling or SamplingParams()
    encoded = [chat_prompt_ids(target, p["text"]) for p in prompts]
    # Warm up on the longest prompt for the whole max_new, past any stop token: every decode path runs,
    # and a drafter's fixed-shape step (a CUDA graph) is captured for the largest context the timed runs need.
    for ids in sorted(encoded, key=lambda x: x.numel())[len(encoded) - warmup:]:
        for name, drafter in methods.items():
            time_one(target, ids, name, drafter, max_new, sampling, seed, stop=False)
    rows = {name: [] for name in methods}
    names = list(methods)
    for i, (p, ids) in enumerate(zip(tqdm(prompts, desc="bench", unit="prompt"), encoded)):
        for name in names[i % len(names):] + names[:i % len(names)]:  # each method goes first in turn
            r = time_one(target, ids, name, methods[name], max_new, sampling, seed)
            rows[name].append(r | {"id": p["id"], "category": p["category"]})
        if on_prompt is not None:
            on_prompt(rows)
    return rows


def summarize(rows: dict, sampling: SamplingParams) -> dict:
    """Per-method summary of per-prompt rows (see the module docstring)."""
    pooled = {name: sum(len(r["tokens"]) for r in rs) / sum(r["wall_s"] for r in rs) for name, rs in rows.items()}
    out = {}
    for name, rs in rows.items():
        tps = sorted(_rate(r) for r in rs)
        s = {"prompts": len(rs), "tokens": sum(len(r["tokens"]) for r in rs),
             "tokens_per_s": round(pooled[name], 2),
             "tokens_per_s_median": round(statistics.median(tps), 2),
             "tokens_per_s_p10_p90": [round(_quantile(tps, 0.1), 2), round(_quantile(tps, 0.9), 2)]}
        for ref in ("vanilla", "hf-generate"):
            if ref in pooled:  # pooled tokens/s over pooled tokens/s; the median of the per-prompt ratios too
                key = f"speedup_vs_{ref.replace('-', '_')}"
                s[key] = round(pooled[name] / pooled[ref], 3)
                s[key + "_median"] = round(statistics.median(_rate(r) / _rate(b) for r, b in zip(rs, rows[ref])), 3)
        if rs[0]["forwards"] is not None:
            steps = sum(r["forwards"] for r in rs)
            # the prefill's token comes without a verify step, so it is not counted
            s["tau"] = round(sum(len(r["tokens"]) - 1 for r in rs) / max(1, steps), 3)
            s["draft_ms"], s["verify_ms"] = (round(_per_step(rs, key), 3) for key in ("draft_ms", "verify_ms"))
            lengths = [n for r in rs for n in r["accepted_lengths"]]
            s["accepted_length_histogram"] = [lengths.count(n) for n in range(1, max(lengths, default=1) + 1)]
            reached = _sum_ragged([r["depth_reached"] for r in rs])
            accepted = _sum_ragged([r["depth_accepted"] for r in rs])
            s["depth_acceptance"] = [round(a / b, 3) if b else None for a, b in zip(accepted, reached)]
        peaks = [r["peak_mb"] for r in rs if r["peak_mb"] is not None]
        s["peak_mb"] = max(peaks) if peaks else None
        if "vanilla" in rows and sampling.greedy:
            s["identical_to_vanilla"] = sum(a["tokens"] == b["tokens"] for a, b in zip(rs, rows["vanilla"]))
        out[name] = s
    return out


def _per_step(rows: list[dict], key: str) -> float:
    """Mean ms per decode step over all prompts' steps (a prompt that ended at its prefill has none);
    rows from before steps were counted weigh each prompt alike."""
    if any("steps" not in r for r in rows):
        return statistics.fmean(r[key] for r in rows)
    steps = sum(r["steps"] for r in rows)
    return sum(r[key] * r["steps"] for r in rows) / steps if steps else 0.0


def _verify_cost_table(doc: dict) -> str:
    sizes = list(doc["ms"])
    variants = doc.get("variants") or {"": {"ms": doc["ms"], "relative": doc["relative"]}}
    first = next(iter(variants))
    rows = []
    for name, v in variants.items():
        label = f" ({name} linears)" if name else ""
        rows.append(f"| ms{label} | " + " | ".join(f"{v['ms'][t]:.1f}" for t in sizes) + " |")
        rows.append(f"| vs T=1{label} | " + " | ".join(f"{v['relative'][t]:.2f}x" for t in sizes) + " |")
        if name != first:
            rows.append(f"| {name} / {first} | " + " | ".join(f"{v[f'over_{first}'][t]:.2f}x" for t in sizes) + " |")
    what = (f"; {' and '.join(variants)} linear layers timed interleaved" if len(variants) > 1 else _linears(doc))
    return (f"**{doc.get('device', '?')}**{what}: one target forward over a tree of T nodes after "
            f"{doc['prefix']} tokens of context, against T=1 (one decode step)\n\n| T | " + " | ".join(sizes)
            + " |\n|---|" + "---|" * len(sizes) + "\n" + "\n".join(rows) + "\n")


def _linears(d: dict) -> str:
    """Which linear layers a result ran on (`fasteagle.packing`); results from before the choice say nothing."""
    if "packed_linears" not in d:
        return ""
    drafters = f", {d['draft_weights']} drafter weights" if d.get("draft_weights") else ""
    return (", prepacked linears" if d["packed_linears"] else ", stock linears") + drafters


def _quantile(sorted_values: list[float], q: float) -> float:
    i = q * (len(sorted_values) - 1)
    lo, hi = int(i), min(int(i) + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (i - lo)


def _sum_ragged(lists: list[list[int]]) -> list[int]:
    out = [0] * max((len(x) for x in lists), default=0)
    for x in lists:
        for i, v in enumerate(x):
            out[i] += v
    return out


def device_name(dev: torch.device) -> str:
    """The device as results name it: CPU timings differ by model and vector ISA (AVX2 vs AVX-512
    changes what a tree forward costs against one decode step), so both are recorded. A GPU's name
    comes with its host's CPU: a small target is bound by how fast that CPU launches kernels (two
    H200 loans ran the same decode step in 23.4 and 16.6 ms), so speedups move with it."""
    if dev.type == "cuda":
        host = cpu_model()
        return torch.cuda.get_device_name(dev) + (f" (host {host})" if host else "")
    threads = torch.get_num_threads()
    return (f"CPU ({cpu_model() or platform.processor() or platform.machine()}, "
            f"{torch.backends.cpu.get_cpu_capability()}, {threads} thread{'s' * (threads != 1)})")


def cpu_model() -> str | None:
    """The CPU's model name from /proc/cpuinfo (Linux), None elsewhere."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip() or None
    except OSError:
        return None
    return None


def _repo_path(path: str | None) -> str | None:
    """A path relative to the working directory when it lies inside it (results name repo files,
    not one machine's absolute paths)."""
    if path is None:
        return None
    try:
        return Path(path).resolve().relative_to(Path.cwd().resolve()).as_posix()
    except ValueError:
        return str(path)


def drafter_summary(drafter) -> dict:
    """Which trained drafter a result measured: its directory and what its training cost."""
    t, h = drafter.info.get("training") or {}, drafter.info.get("holdout") or {}
    return {"path": _repo_path(getattr(drafter, "path", None)), "weights": getattr(drafter, "packing", None),
            "steps": t.get("steps_all", t.get("steps")),
            "train_minutes": t.get("train_minutes_all", t.get("train_minutes")),
            "train_tokens": t.get("train_tokens"), "device": t.get("device"),
            "holdout_tau_backbone": h.get("tau_backbone"),
            "draft_vocab": int(drafter.vocab_ids.numel()) if hasattr(drafter, "vocab_ids") else None}


def result_document(target: Target, rows: dict, settings: dict) -> dict:
    """The JSON written by `bench`: overall and per-category summaries plus the per-prompt rows."""
    sampling = SamplingParams(settings.get("temperature", 0.0), settings.get("top_p", 1.0))
    categories = sorted({r["category"] for rs in rows.values() for r in rs})
    per_cat = {c: summarize({m: [r for r in rs if r["category"] == c] for m, rs in rows.items()}, sampling)
               for c in categories}
    return {"device": device_name(target.device), "target": target.name,
            "date": datetime.date.today().isoformat(), "torch": torch.__version__, "settings": settings,
            "methods": summarize(rows, sampling), "per_category": per_cat,
            "rows": {m: [{k: v for k, v in r.items() if k != "tokens"} | {"n": len(r["tokens"])} for r in rs]
                     for m, rs in rows.items()}}


def markdown_table(doc: dict) -> str:
    """One Markdown table per result document (what the README shows): a method comparison, a
    verify-cost sweep or a draft-step timing."""
    if "relative" in doc:
        return _verify_cost_table(doc)
    if "budget_curve" in doc:
        return _budget_curve_table(doc)
    if doc.get("profile"):
        from fasteagle.profile import markdown

        return markdown(doc)
    if "shape" in doc:
        graph = any("fasteagle_graph" in r for r in doc["ms"].values())
        rows = "".join(f"| {d} | {r['fasteagle']:.1f} | {r['eagle3']:.1f} | {r['eagle3_over_fasteagle']:.2f}x |"
                       + (f" {r.get('fasteagle_graph', float('nan')):.2f} |" if graph else "") + "\n"
                       for d, r in doc["ms"].items())
        return (f"**{doc['device']}**, {doc['dtype']}{_linears(doc)}: one draft step ({doc['accepted']} accepted "
                f"tokens fed, then the ~60-node tree) at the `{doc['shape']}` shape, random weights\n\n"
                "| depth | FastEagle ms | EAGLE-3-style ms | EAGLE-3 / FastEagle |"
                + (" FastEagle as a CUDA graph ms |\n|---|---|---|---|---|\n" if graph else "\n|---|---|---|---|\n")
                + rows)
    s = doc["settings"]
    cut = doc.get("partial")
    budget = s.get("tree_budget")
    if isinstance(budget, dict):  # --tree auto: one per drafter
        budget = ", ".join(f"{k} {v}" for k, v in budget.items()) + " (auto)"
    head = ((f"**Partial: the run stopped after {cut['prompts_done']} of {cut['prompts']} prompts.** " if cut else "")
            + f"**{doc['device']}**{_linears(s)}, target `{doc['target']}`, {s.get('prompts_desc', '')} "
            f"{s.get('max_new_tokens')} new tokens, temperature {s.get('temperature')}, tree budget {budget} nodes"
            + (f", fasteagle tree {s['tree_shape']}" if s.get("tree_shape") else "")
            + (", drafting over the whole vocabulary (--full-vocab)" if s.get("full_vocab") else "")
            + f", {doc['date']}"
            + "".join(f"; {m} drafter `{d['path']}` ({d['steps']} steps, {d['train_minutes']} min"
                      + (f", drafting over {d['draft_vocab']} tokens" if d.get("draft_vocab") else "") + ")"
                      for m, d in (s.get("drafters") or {}).items()) + "\n\n")
    peak = any(m.get("peak_mb") is not None for m in doc["methods"].values())
    lines = ["| method | tokens/s | speedup vs vanilla | vs HF generate | tau | draft ms | verify ms | "
             "identical |" + " peak MB |" * peak, "|---|---|---|---|---|---|---|---|" + "---|" * peak]
    for name, m in doc["methods"].items():
        def f(key, fmt="{:.2f}", m=m):
            return fmt.format(m[key]) if m.get(key) is not None else "–"
        ident = f"{m['identical_to_vanilla']}/{m['prompts']}" if "identical_to_vanilla" in m else "–"
        lines.append(f"| {name} | {f('tokens_per_s', '{:.1f}')} | {f('speedup_vs_vanilla', '{:.2f}x')} | "
                     f"{f('speedup_vs_hf_generate', '{:.2f}x')} | {f('tau')} | {f('draft_ms', '{:.1f}')} | "
                     f"{f('verify_ms', '{:.1f}')} | {ident} |" + f" {f('peak_mb', '{:.0f}')} |" * peak)
    if float(s.get("temperature") or 0) > 0:
        lines.append("\nSampling: each method draws its own sample, so outputs are not compared with vanilla's.")
    cats = doc.get("per_category") or {}
    if len(cats) > 1:  # speedup and tau per prompt category
        names = list(doc["methods"])
        lines += ["", "| category | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        for cat, ms in cats.items():
            cells = [f"{ms[n]['speedup_vs_vanilla']:.2f}x" + (f", tau {ms[n]['tau']:.2f}" if "tau" in ms[n] else "")
                     if ms.get(n, {}).get("speedup_vs_vanilla") is not None else "–" for n in names]
            lines.append(f"| {cat} | " + " | ".join(cells) + " |")
    return head + "\n".join(lines) + "\n"


def per_prompt(doc: dict) -> dict[str, list[dict]]:
    """Each method's speedup over vanilla (tokens/s over tokens/s: sampled replies differ in length)
    and tau on each prompt (what averages hide: which prompts a drafter wins or loses on). Needs the
    vanilla rows; tau is None for Hugging Face's methods."""
    rows = doc.get("rows") or {}
    base = rows.get("vanilla")
    if not base:
        return {}
    out = {}
    for name, rs in rows.items():
        if name == "vanilla":
            continue
        out[name] = [{"id": r["id"], "category": r["category"], "speedup": _rate(r) / _rate(v),
                      "tau": statistics.fmean(r["accepted_lengths"]) if r.get("accepted_lengths") else None}
                     for r, v in zip(rs, base)]
    return out


def _rate(row: dict) -> float:
    """A row's tokens/s: a measured row holds its tokens, a written one their count `n`; rows with
    neither (hand-made) time the same reply: 1 / wall time."""
    return (len(row["tokens"]) if "tokens" in row else row.get("n", 1)) / row["wall_s"]


def charts(doc: dict, path: str | Path) -> None:
    """Plotly HTML: speedup and tau per method, per-depth acceptance of the drafters, (with
    `--tree auto`) each drafter's expected speedup against the tree budget it was chosen from, and
    below, every method's speedup prompt by prompt (tau in the hover)."""
    from plotly.colors import qualitative
    from plotly.subplots import make_subplots

    names = list(doc["methods"])
    auto = doc.get("settings", {}).get("tree_auto") or {}
    prompts = per_prompt(doc)
    cols = 3 + bool(auto)
    titles = ["speedup vs vanilla", "tau (tokens / target forward)", "per-depth acceptance"]
    titles += ["--tree auto: expected speedup vs budget"] * bool(auto)
    specs = [[{}] * cols] + ([[{"colspan": cols}] + [None] * (cols - 1)] if prompts else [])
    fig = make_subplots(rows=1 + bool(prompts), cols=cols, specs=specs, vertical_spacing=0.18,
                        subplot_titles=titles + ["speedup vs vanilla, prompt by prompt"] * bool(prompts))
    palette = qualitative.Plotly
    color = {n: palette[i % len(palette)] for i, n in enumerate(names)}  # one colour per method, every panel
    shown = set()

    def legend(n: str) -> dict:
        first = n not in shown
        shown.add(n)
        return {"name": n, "legendgroup": n, "showlegend": first, "marker_color": color[n]}

    for col, key in ((1, "speedup_vs_vanilla"), (2, "tau")):
        fig.add_bar(x=names, y=[doc["methods"][n].get(key) for n in names], row=1, col=col, showlegend=False,
                    marker_color=[color[n] for n in names])
    for n in names:
        acc = doc["methods"][n].get("depth_acceptance") or []
        if acc:
            fig.add_scatter(x=list(range(1, len(acc) + 1)), y=acc, mode="lines+markers", row=1, col=3,
                            line_color=color[n], **legend(n))
    for n, choice in auto.items():
        curve = choice.get("speedup_vs_decode_step") or {}
        fig.add_scatter(x=[int(b) for b in curve], y=list(curve.values()), mode="lines+markers", row=1, col=4,
                        name=f"{n} (picked {choice['budget']})", line_color=color.get(n), line_dash="dot")
    if auto:
        fig.update_xaxes(type="log", title_text="tree nodes", row=1, col=4)
    for n, rs in prompts.items():
        hover = f"{n}<br>%{{x}}: %{{y:.2f}}x" + ("<br>tau %{customdata:.2f}" if rs[0]["tau"] is not None else "")
        fig.add_bar(x=[f"{r['category']}/{r['id']}" for r in rs], y=[r["speedup"] for r in rs],
                    customdata=[r["tau"] for r in rs], row=2, col=1, hovertemplate=hover + "<extra></extra>",
                    **legend(n))
    if prompts:
        fig.update_layout(barmode="group")
        fig.add_hline(y=1.0, line_dash="dot", line_color="gray", row=2, col=1)
    fig.update_layout(title=f"{doc['target']} on {doc['device']}", height=420 + 380 * bool(prompts),
                      template="plotly_white")
    with atomic_path(path) as tmp:
        fig.write_html(str(tmp), include_plotlyjs="cdn", div_id=Path(path).stem)  # a fixed id: a redraw changes nothing


@torch.inference_mode()
def verify_cost(target: Target | dict[str, Target], sizes=(1, 8, 16, 32, 64), prefix: int = 256,
                reps: int = 10) -> dict:
    """Median time of one target forward over a tree of T nodes after a `prefix`-token context,
    and its ratio to T=1 (one plain decode step). This is what decides the tree budget. Each rep
    times every size once, so a machine that speeds up or slows down mid-sweep biases no size.

    Several targets (name -> Target: the same model with prepacked and with stock linear layers)
    are timed interleaved, rep by rep, and reported under `variants` with their ratio to the first.
    """
    targets = target if isinstance(target, dict) else {"": target}
    g = torch.Generator().manual_seed(0)
    first = next(iter(targets.values()))
    vocab, dev = first.model.config.vocab_size, first.device
    max_pos = getattr(first.model.config, "max_position_embeddings", None)
    if min(sizes) < 1 or (max_pos and prefix + max(sizes) > max_pos):
        most = f" and at most {max_pos - prefix} (this target's {max_pos} positions less {prefix} of context)"
        raise FastEagleError(f"--verify-cost sizes must be at least 1{most if max_pos else ''} "
                             f"(got {','.join(map(str, sizes))})")
    context = torch.randint(vocab, (prefix,), generator=g).to(dev)
    caches = {}
    for name, t in targets.items():
        caches[name] = KVCache.for_model(t.model, prefix + max(sizes) + 1)
        tree_forward(t.model, caches[name], path_tree(context))
        caches[name].keep(torch.arange(prefix, device=dev))
    trees = {T: chain(int(torch.randint(vocab, (1,), generator=g)), torch.randint(vocab, (T - 1,), generator=g)).to(dev)
             for T in sizes}
    times = {name: {T: [] for T in sizes} for name in targets}
    for r in range(reps + 2):  # sizes and targets interleaved within each rep: drift hits all alike
        for T in sizes:
            for name, t in targets.items():
                synchronize(dev)
                t0 = time.perf_counter()
                tree_forward(t.model, caches[name], trees[T])
                synchronize(dev)
                if r >= 2:
                    times[name][T].append((time.perf_counter() - t0) * 1e3)
                caches[name].truncate(prefix)
    ms = {name: {T: statistics.median(times[name][T]) for T in sizes} for name in targets}

    def table(m: dict) -> dict:
        return {"ms": {str(t): round(v, 2) for t, v in m.items()},
                "relative": {str(t): round(v / m[sizes[0]], 2) for t, v in m.items()}}

    names = list(targets)
    doc = {"prefix": prefix} | table(ms[names[0]])
    if len(names) > 1:
        doc["variants"] = {name: table(ms[name]) | {f"over_{names[0]}": {str(t): round(ms[name][t] / ms[names[0]][t], 2)
                                                                         for t in sizes}}
                           for name in names}
    return doc


AUTO_BUDGETS = (2, 3, 4, 5, 6, 8, 12, 16, 24, 32, 48, 64)
GPU_AUTO_BUDGETS = AUTO_BUDGETS + (96, 128, 192)  # a launch-bound GPU verifies a few hundred nodes at ~one step's cost


def auto_tree(target: Target, drafter, prompts: list[dict], budgets=None, max_new: int = 64, seed: int = 0) -> dict:
    """Pick the tree budget B that maximises expected tokens/s on this device, and set it:

        tokens/s(B) = tokens per step(B) / (draft ms(B) + verify ms(B))

    verify ms(B) is this device's cost of one target forward over the tree B gives (`verify_cost`,
    made non-decreasing in tree size by `nondecreasing`), draft ms(B) the drafter's measured step at
    budget B (draft and `extend`, the device synced after each, so a GPU drafter's kernels count even
    where a decode overlaps them), and tokens per step(B) comes from the drafter's own acceptance,
    replayed: one greedy decode at the largest budget records every tree and its accepted path; the
    tree budget B would have drafted is the best B-1 of those nodes (`replay_budget`), and greedy
    acceptance in it is the recorded path cut at its first missing node. One decode thus scores every
    budget, with no run-to-run timing noise in the acceptance part.

    A drafter joined with prompt lookup (`fasteagle.hybrid.WithLookup`) is tuned the same way: B is
    the budget of its own tree, lookup's nodes are in every budget's tree (lookup ignores B), and the
    verify cost is that of the joined tree's size, interpolated between timed sizes. The budgets
    tried go to 64 nodes on a CPU, where a tree's forward grows with its size, and to 192 on a GPU.
    """
    if budgets is None:
        budgets = GPU_AUTO_BUDGETS if target.device.type == "cuda" else AUTO_BUDGETS
    budgets = sorted(set(budgets))
    encoded = [chat_prompt_ids(target, p["text"]) for p in prompts]
    drafter.tree_budget = budgets[-1]
    time_one(target, encoded[0], "draft", drafter, 8, SamplingParams(), seed)  # warmup
    replayed = []  # (tree, path, the nodes lookup proposed) per step, the prefill left out
    for ids in tqdm(encoded, desc="auto tree: replay decode"):
        replayed += [step[:3] for step in _recorded_steps(target, drafter, ids, max_new, seed) if step[4]]
    outcomes = {b: [replay_budget(tree, path, b, lookup, sizes=True) for tree, path, lookup in replayed]
                for b in budgets}
    per_step = {b: statistics.fmean(n + 1 for n, _ in outcomes[b]) for b in budgets}
    context = int(statistics.fmean(ids.numel() for ids in encoded)) + max_new // 2
    biggest = max(size for b in budgets for _, size in outcomes[b])
    sizes = sorted({1, *budgets, *(s for s in (2, 3, 5, 96, 128) if s <= biggest)} | {biggest})
    timed = nondecreasing(verify_cost(target, sizes, prefix=context, reps=20)["ms"])
    verify_ms = {b: statistics.fmean(_interpolate(timed, size) for _, size in outcomes[b]) for b in budgets}
    draft_ms = {}
    for b in tqdm(budgets, desc="auto tree: draft cost"):
        drafter.tree_budget = b
        traces = list(generate(target, encoded[0], drafter=drafter, max_new_tokens=16, seed=seed, stop_ids=set(),
                               sync_phases=True))[1:]
        draft_ms[b] = statistics.median(t.draft_ms for t in traces)
    rate = {b: 1e3 * per_step[b] / (draft_ms[b] + verify_ms[b]) for b in budgets}
    best = max(rate, key=rate.get)
    drafter.tree_budget = best
    vanilla = 1e3 / timed["1"]
    return {"budget": best, "tokens_per_s": {str(b): round(v, 2) for b, v in rate.items()},
            "speedup_vs_decode_step": {str(b): round(v / vanilla, 3) for b, v in rate.items()},
            "tokens_per_step": {str(b): round(v, 3) for b, v in per_step.items()},
            "tree_size": {str(b): round(statistics.fmean(s for _, s in outcomes[b]), 2) for b in budgets},
            "draft_ms": {str(b): round(v, 2) for b, v in draft_ms.items()},
            "verify_ms": {str(b): round(v, 2) for b, v in verify_ms.items()}, "decode_step_ms": timed["1"],
            "replayed_steps": len(replayed), "context": context}


def budget_curve(target: Target, drafter, prompts: list[dict], budgets, max_new: int = 128, seed: int = 0) -> dict:
    """Tokens per target forward (tau, bonus included) against the tree budget, per prompt category:
    one greedy decode of each prompt at the largest budget, every smaller budget replayed from it
    (`replay_budget`, exact for greedy), so the curve costs one decode and has no timing in it.
    It says what a bigger tree buys where verifying it costs little more than a small one (a GPU).
    `decoded` is the tau the decode itself measured (its last steps draft no deeper than the tokens
    left, as in `compare`): the replay leaves those steps out, and a decode at a smaller budget would
    visit other positions, so read the curve to a few hundredths."""
    budgets = sorted(set(budgets))
    drafter.tree_budget = budgets[-1]
    steps: dict[str, list] = {}
    emitted: dict[str, list] = {}  # tokens each step of the decode emitted
    for p in tqdm(prompts, desc="budget curve", unit="prompt"):
        recorded = _recorded_steps(target, drafter, chat_prompt_ids(target, p["text"]), max_new, seed)
        steps.setdefault(p["category"], []).extend(step[:3] for step in recorded if step[4])
        emitted.setdefault(p["category"], []).extend(step[3] for step in recorded)
    if len(steps) > 1:
        steps["all"] = [s for rec in list(steps.values()) for s in rec]
        emitted["all"] = [n for rec in list(emitted.values()) for n in rec]
    tau = {c: {str(b): round(statistics.fmean(replay_budget(tree, path, b, lookup) + 1 for tree, path, lookup in rec),
                             3) for b in budgets} for c, rec in steps.items()}
    return {"budget_curve": tau, "decoded": {c: round(statistics.fmean(n), 3) for c, n in emitted.items()},
            "steps": {c: len(rec) for c, rec in steps.items()}, "max_new_tokens": max_new}


def _budget_curve_table(doc: dict) -> str:
    curve = doc["budget_curve"]
    budgets = list(next(iter(curve.values())))
    head = (f"**{doc['device']}**, target `{doc['target']}`, drafter `{doc['drafter']}`"
            + (" drafting over the whole vocabulary" if doc.get("full_vocab") else "")
            + f", {doc['prompts_desc']} {doc['max_new_tokens']} new tokens, greedy: tokens per target forward (tau, "
            "bonus included) against the tree budget (nodes, root included), replayed from one decode at the "
            "largest (the last column: what that decode measured)\n\n")
    decoded = doc.get("decoded") or {}
    lines = ["| prompts | " + " | ".join(budgets) + f" | decoded at {budgets[-1]} |",
             "|---|" + "---|" * (len(budgets) + 1)]
    lines += [f"| {c} ({doc['steps'][c]} steps) | " + " | ".join(f"{v:.2f}" for v in row.values())
              + (f" | {decoded[c]:.2f} |" if c in decoded else " | – |") for c, row in curve.items()]
    return head + "\n".join(lines) + "\n"


def _recorded_steps(target: Target, drafter, ids: torch.Tensor, max_new: int, seed: int) -> list[tuple]:
    """One greedy decode for replay: (tree, path, nodes lookup proposed, tokens emitted, whole) per
    decode step. The lookup nodes are empty unless the drafter is joined with lookup, whose tree of a
    step is read as that step comes out (the next step replaces it). `whole` is false for the last
    steps, whose trees `generate` cut to the tokens left: a replay would count the length limit."""
    recorded, room = [], []
    for s in generate(target, ids, drafter=drafter, max_new_tokens=max_new, seed=seed):
        if not s.tree:  # the prefill
            continue
        last = getattr(drafter, "last_lookup", None)
        recorded.append((s.tree, s.path, lookup_nodes(s.tree, last.to_dict()) if last is not None else set(),
                         len(s.tokens)))
        room.append(max_new - (s.generated - len(s.tokens)) - 1)  # the deepest node this step could keep
    deepest = max((max(step[0]["depths"]) for step in recorded), default=0)
    return [step + (r >= deepest,) for step, r in zip(recorded, room)]


def lookup_nodes(tree: dict, lookup_tree: dict) -> set[int]:
    """The non-root nodes of a recorded (joined) tree whose token path lookup's tree holds."""
    proposed = token_paths(lookup_tree)
    return {i for i, p in enumerate(node_paths(tree)) if i and p in proposed}


def node_paths(tree: dict) -> list[tuple[int, ...]]:
    """Each node's root-to-node token path (root excluded, so the root's is empty) of a recorded tree."""
    paths: list[tuple[int, ...]] = [()]
    for i in range(1, len(tree["parents"])):
        paths.append(paths[tree["parents"][i]] + (tree["tokens"][i],))
    return paths


def token_paths(tree: dict) -> set[tuple[int, ...]]:
    return set(node_paths(tree)[1:])


def nondecreasing(ms: dict) -> dict:
    """Timed verify costs (size -> ms) made non-decreasing in size by pooling adjacent violators
    (isotonic regression). A bigger tree never costs less; where a CPU's flat region (1-6 nodes
    cost one decode step here) meets run-to-run noise, raw medians said it did by 2-8 ms, and
    the budget choice swung between 4 and 6 nodes from run to run."""
    sizes = sorted(ms, key=int)
    blocks: list[list] = []  # [mean, count] of pooled runs of sizes
    for k in sizes:
        blocks.append([ms[k], 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            (m2, n2), (m1, n1) = blocks.pop(), blocks.pop()
            blocks.append([(m1 * n1 + m2 * n2) / (n1 + n2), n1 + n2])
    fitted = [m for m, n in blocks for _ in range(n)]
    return {k: round(v, 2) for k, v in zip(sizes, fitted)}


def _interpolate(ms: dict, size: int) -> float:
    """Verify ms of a tree of `size` nodes from the timed sizes (linear between neighbours)."""
    pts = sorted((int(k), v) for k, v in ms.items())
    lo = max((p for p in pts if p[0] <= size), default=pts[0])
    hi = min((p for p in pts if p[0] >= size), default=pts[-1])
    if hi[0] == lo[0]:
        return lo[1]
    return lo[1] + (hi[1] - lo[1]) * (size - lo[0]) / (hi[0] - lo[0])


def best_nodes(tree: dict, budget: int) -> list[int]:
    """The `budget`-1 non-root nodes of a recorded tree (`DraftTree.to_dict()`) with the highest path
    probability, best first; nodes only prompt lookup proposed (source -1) are not the drafter's
    and do not compete."""
    parents, probs = tree["parents"], tree["draft_probs"]
    sources = tree.get("sources") or [0] * len(parents)
    logp = [0.0] * len(parents)
    for i in range(1, len(parents)):
        logp[i] = logp[parents[i]] + math.log(max(probs[i], 1e-30))
    own = [i for i in range(1, len(parents)) if sources[i] != LOOKUP_SOURCE]
    return sorted(own, key=lambda i: (-logp[i], i))[: max(budget - 1, 0)]


def replay_budget(tree: dict, path: list[int], budget: int, lookup: set[int] = frozenset(), sizes: bool = False):
    """Draft tokens greedy verification would have accepted had the drafter been given `budget`
    nodes (root included) instead of the recorded tree: both tree builders keep the candidates with
    the highest path probability (product of draft probabilities from the root), so the smaller tree
    is the recorded one's best budget-1 nodes, closed under ancestors (a child never outranks its
    parent; ties go to the earlier node, i.e. the parent). Greedy acceptance does not depend on which
    other nodes are in the tree, so the accepted path is the recorded one up to its first dropped node.

    `lookup`: the nodes prompt lookup proposed that step (`lookup_nodes`: present at every budget).
    With `sizes`, returns (accepted, nodes in that budget's tree).
    """
    kept = set(best_nodes(tree, budget)) | lookup
    n = 0
    for node in path[1:]:
        if node not in kept:
            break
        n += 1
    return (n, len(kept) + 1) if sizes else n


# Layer shapes for `draft_step_cost` (random weights: only the timing matters). EAGLE-3 drafts
# LLaMA-3-8B over a 32k draft vocab; the default target is included to compare scales.
SHAPES = {
    "llama3-8b": dict(target_hidden=4096, vocab_size=128256, width=4096, intermediate=14336, num_heads=32,
                      num_kv_heads=8, head_dim=128, rope_theta=500000.0, draft_vocab=32000),
    "smollm2-135m": dict(target_hidden=576, vocab_size=49152, width=576, intermediate=1536, num_heads=9,
                         num_kv_heads=3, head_dim=64, rope_theta=100000.0, draft_vocab=6144),
}


class _BorrowedEnds(torch.nn.Module):
    """Stands in for a target: a drafter only borrows its embedding and LM head."""

    def __init__(self, vocab: int, hidden: int):
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, hidden)
        self.lm_head = torch.nn.Linear(hidden, vocab, bias=False)

    def get_input_embeddings(self):
        return self.embed

    def get_output_embeddings(self):
        return self.lm_head


@torch.inference_mode()
def draft_step_cost(shape: str | dict = "llama3-8b", depths=(4, 6, 8), prefix: int = 128, accepted: int = 3,
                    reps: int = 5, device: str | torch.device | None = None, dtype: str | None = None,
                    pack: bool | None = None, int8: bool | None = None) -> dict:
    """Median time of one draft step -- feed `accepted` new positions, then build the ~60-node tree --
    of the cascade (one pass through N layers) and of the EAGLE-3-style drafter (one layer, run once
    per depth), with random weights at a model shape. The gap is the single-pass advantage. Both run
    eagerly; on a GPU `fasteagle_graph` adds the cascade's step replayed as a CUDA graph (what
    generation uses there).

    Both drafters get prepacked linears where the engine would give them (fp32 CPU; `pack`=False: stock),
    with int8 weights unless `int8` is False (`CascadedDrafter.pack_for_cpu`)."""
    from fasteagle.drafter import CascadedDrafter, DrafterConfig
    from fasteagle.eagle3 import AutoregressiveDrafter

    if isinstance(shape, str) and shape not in SHAPES:
        raise FastEagleError(f"unknown shape {shape!r}; choose one of {', '.join(SHAPES)}")
    dims = SHAPES[shape] if isinstance(shape, str) else shape
    dev = torch.device(device) if device else default_device()
    dtype = parse_dtype(dtype, dev)
    pack = packing.wanted(dev, dtype) if pack is None else pack and packing.wanted(dev, dtype)
    g = torch.Generator().manual_seed(0)
    with dev:  # built where it runs: initialising an 8B-shape drafter on the CPU first takes minutes
        ends = _BorrowedEnds(dims["vocab_size"], dims["target_hidden"]).to(dev, dtype)
    feats = torch.randn(prefix + accepted, 3 * dims["target_hidden"], generator=g).to(dev, dtype)
    ids = torch.randint(dims["vocab_size"], (prefix + accepted + 1,), generator=g).to(dev)
    out = {"shape": shape if isinstance(shape, str) else "custom", "device": device_name(dev), "dtype": str(dtype),
           "prefix": prefix, "accepted": accepted, "packed_linears": int(pack), "draft_weights": None, "ms": {}}
    for depth in tqdm(depths, desc="draft step"):
        row = {}
        kinds = [("fasteagle", CascadedDrafter, "dynamic"), ("eagle3", AutoregressiveDrafter, None)]
        if dev.type == "cuda":
            kinds.append(("fasteagle_graph", CascadedDrafter, "graph"))
        for kind, cls, mode in kinds:
            cfg = DrafterConfig(target="random", feature_layers=[0, 1, 2], num_layers=depth, **dims)
            if cls is AutoregressiveDrafter:
                cfg = AutoregressiveDrafter.config_for(cfg, depth)
            with dev:
                d = cls(cfg).to(dev, dtype).eval().attach(ends, check=False)
            if pack:
                d.pack_for_cpu(int8)
            d.step_mode = mode
            out["draft_weights"] = d.packing
            d.reset(prefix + accepted + 8)
            d.extend(ids[:prefix], feats[:prefix], int(ids[prefix]))
            times = []
            for r in range(reps + 1):
                synchronize(dev)
                t0 = time.perf_counter()
                d.extend(ids[prefix:prefix + accepted], feats[prefix:], int(ids[prefix + accepted]))
                d.draft(int(ids[prefix + accepted]))
                synchronize(dev)
                if r:  # the first is warmup
                    times.append((time.perf_counter() - t0) * 1e3)
                d.rewind(prefix)
            row[kind] = round(statistics.median(times), 2)
            del d
        row["eagle3_over_fasteagle"] = round(row["eagle3"] / row["fasteagle"], 2)
        out["ms"][str(depth)] = row
    return out


README_START, README_END = "<!-- results:start -->", "<!-- results:end -->"


def read_result(path: str | Path) -> dict:
    """A result JSON, or a one-line error naming the file (a typo, a .md given for the .json)."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise FastEagleError(f"cannot read the result file {path}: {exc}") from None
    if not isinstance(doc, dict):
        raise FastEagleError(f"{path} is not a bench result (a JSON object)")
    return doc


def redraw(result_file: str | Path) -> None:
    """The .md table (and, for a method comparison, the .html charts) of a result JSON, drawn again."""
    path = Path(result_file)
    doc = read_result(path)
    write_text(path.with_suffix(".md"), markdown_table(doc))
    if "methods" in doc and "rows" in doc:
        charts(doc, path.with_suffix(".html"))


def update_readme(result_files: list[str | Path], readme: str | Path = "README.md") -> None:
    """Regenerate the README's results section from committed result files (never typed by hand).
    The README is read first, so a wrong --readme is named before the results are read."""
    try:
        text = Path(readme).read_text(encoding="utf-8")
    except OSError as exc:
        raise FastEagleError(f"cannot read --readme {readme}: {exc.strerror or exc} (run from the repository root "
                             "or give --readme PATH)") from None
    except UnicodeDecodeError as exc:
        raise FastEagleError(f"--readme {readme} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if README_START not in text or README_END not in text:
        raise FastEagleError(f"--readme {readme} has no {README_START} ... {README_END} section")
    docs = [read_result(f) for f in sorted(result_files)]
    body = "\n".join(f"{markdown_table(d)}\n<sub>from `{Path(f).as_posix()}`"
                     + (f", made by `{d['command']}`" if d.get("command") else "") + "</sub>\n"
                     for d, f in zip(docs, sorted(result_files)))
    pre, rest = text.split(README_START, 1)
    post = rest.split(README_END, 1)[1]
    write_text(readme, f"{pre}{README_START}\n{body}{README_END}{post}")
