"""What a measurement reports: the per-method summaries of per-prompt rows, the result document
(the JSON `bench` writes), its Markdown table, and the documents' result blocks drawn from those."""

from __future__ import annotations

import datetime
import hashlib
import re
import statistics
from pathlib import Path

import torch

from fasteagle import trace
from fasteagle.bench.timing import device_name
from fasteagle.errors import FastEagleError
from fasteagle.files import read_result, write_text
from fasteagle.target import Target
from fasteagle.verify import SamplingParams


def summarize(rows: dict, sampling: SamplingParams) -> dict:
    """Per-method summary of per-prompt rows (`fasteagle.bench` says what it reports)."""
    pooled = {name: sum(len(r["tokens"]) for r in rs) / sum(r["wall_s"] for r in rs) for name, rs in rows.items()}
    out = {}
    for name, rs in rows.items():
        tps = sorted(_rate(r) for r in rs)
        s = {"prompts": len(rs), "tokens": sum(len(r["tokens"]) for r in rs),
             "tokens_per_s": round(pooled[name], 2),
             "tokens_per_s_median": round(statistics.median(tps), 2),
             "tokens_per_s_p10_p90": [round(_quantile(tps, 0.1), 2), round(_quantile(tps, 0.9), 2)]}
        if rs and all("wall_s_runs" in r for r in rs):  # --repeats: the pooled rate of each run, and their spread
            runs = [sum(len(r["tokens"]) for r in rs) / sum(r["wall_s_runs"][j] for r in rs)
                    for j in range(min(len(r["wall_s_runs"]) for r in rs))]
            s["tokens_per_s_runs"] = [round(v, 2) for v in runs]
            s["spread"] = round((max(runs) - min(runs)) / statistics.median(runs), 3)
        for ref in ("vanilla", "hf-generate"):
            if ref in pooled:  # pooled tokens/s over pooled tokens/s; the median of the per-prompt ratios too
                key = f"speedup_vs_{ref.replace('-', '_')}"
                s[key] = round(pooled[name] / pooled[ref], 3)
                s[key + "_median"] = round(statistics.median(_rate(r) / _rate(b) for r, b in zip(rs, rows[ref])), 3)
        if rs[0]["forwards"] is not None:
            steps = sum(r["forwards"] for r in rs)
            s["tau"] = round(trace.tau(sum(len(r["tokens"]) - 1 for r in rs), steps), 3)  # the prefill's token left out
            s["draft_ms"], s["verify_ms"] = (round(_per_step(rs, key), 3) for key in ("draft_ms", "verify_ms"))
            lengths = [n for r in rs for n in r["accepted_lengths"]]
            s["accepted_length_histogram"] = trace.histogram(lengths, 1)
            reached = depth_reached(rs)
            accepted = _sum_ragged([r["depth_accepted"] for r in rs])
            s["depth_acceptance"] = [None if v is None else round(v, 3) for v in trace.depth_rates(reached, accepted)]
            s["depth_reached"] = reached
            if all("below_judged" in r for r in rs):  # after an accepted backbone node, and after a side node
                judged = _sum_ragged([r["below_judged"] for r in rs])
                hits = _sum_ragged([r["below_accepted"] for r in rs])
                s["acceptance_below_backbone"], s["acceptance_below_side"] = (
                    None if v is None else round(v, 3) for v in trace.depth_rates(judged, hits))
        if rs and all(r.get("prefill_ms") is not None for r in rs):  # each request split: prefill, then decode
            s["prefill_s"] = round(sum(r["prefill_ms"] for r in rs) / 1e3 / len(rs), 3)  # per prompt
            s["drafter_prefill_s"] = round(sum(r["drafter_prefill_ms"] for r in rs) / 1e3 / len(rs), 3)
            s["decode_tokens_per_s"] = round(_decode_rate(rs), 2)
        peaks = [r["peak_mb"] for r in rs if r["peak_mb"] is not None]
        s["peak_mb"] = max(peaks) if peaks else None
        if "vanilla" in rows and sampling.greedy:
            s["identical_to_vanilla"] = sum(a["tokens"] == b["tokens"] for a, b in zip(rs, rows["vanilla"]))
        out[name] = s
    if "decode_tokens_per_s" in out.get("vanilla", {}):
        for s in out.values():
            if "decode_tokens_per_s" in s:
                s["decode_speedup_vs_vanilla"] = round(
                    s["decode_tokens_per_s"] / out["vanilla"]["decode_tokens_per_s"], 3)
    return out


def _decode_rate(rows: list[dict]) -> float:
    """Tokens after the prefill's over the time after it, pooled."""
    return sum(len(r["tokens"]) - 1 for r in rows) / max(sum(r["wall_s"] - r["prefill_ms"] / 1e3 for r in rows), 1e-9)


def _per_step(rows: list[dict], key: str) -> float:
    """Mean ms per decode step over all prompts' steps (a prompt that ended at its prefill has none);
    rows from before steps were counted weigh each prompt alike."""
    if any("steps" not in r for r in rows):
        return statistics.fmean(r[key] for r in rows)
    steps = sum(r["steps"] for r in rows)
    return sum(r[key] * r["steps"] for r in rows) / steps if steps else 0.0


def _quantile(sorted_values: list[float], q: float) -> float:
    i = q * (len(sorted_values) - 1)
    lo, hi = int(i), min(int(i) + 1, len(sorted_values) - 1)
    return sorted_values[lo] + (sorted_values[hi] - sorted_values[lo]) * (i - lo)


def depth_reached(rows: list[dict]) -> list[int]:
    """How many steps judged a node of each depth, over a method's per-prompt rows: how far its
    `depth_acceptance` can be trusted."""
    return _sum_ragged([r["depth_reached"] for r in rows])


def _sum_ragged(lists: list[list[int]]) -> list[int]:
    out = [0] * max((len(x) for x in lists), default=0)
    for x in lists:
        for i, v in enumerate(x):
            out[i] += v
    return out


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
                      "tau": _tau(r["accepted_lengths"]) if r.get("accepted_lengths") else None}
                     for r, v in zip(rs, base)]
    return out


def _tau(step_lengths: list[int]) -> float:
    """A row's tau from the tokens each of its steps emitted (the row's `accepted_lengths`)."""
    return trace.tau(sum(step_lengths), len(step_lengths))


def _rate(row: dict) -> float:
    """A row's tokens/s: a measured row holds its tokens, a written one their count `n`; rows with
    neither (hand-made) time the same reply: 1 / wall time."""
    return (len(row["tokens"]) if "tokens" in row else row.get("n", 1)) / row["wall_s"]


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
            "rows": {m: [{k: v for k, v in r.items() if k not in ("tokens", "replay")} | {"n": len(r["tokens"]),
                                                                          "reply": reply_digest(r["tokens"])}
                         for r in rs] for m, rs in rows.items()}}


def reply_digest(tokens) -> str:
    """A reply's token ids as a short digest: a result keeps one per prompt, so that two results (fp32
    and bf16, two machines) can tell which replies are the same without storing them."""
    return hashlib.sha1(",".join(map(str, tokens)).encode()).hexdigest()[:16]


def reply_match(reference: dict, doc: dict) -> dict:
    """Per method of `doc`: how many of its replies equal `reference`'s vanilla reply to the same prompt
    ({"same": k, "compared": n}, over the prompts both results hold digests for)."""
    def prompt(r: dict) -> tuple:
        return r.get("category"), r.get("id")

    ref = {prompt(r): r["reply"] for r in reference.get("rows", {}).get("vanilla", []) if "reply" in r}
    out = {}
    for m, rs in doc["rows"].items():
        pairs = [(r["reply"], ref[prompt(r)]) for r in rs if "reply" in r and prompt(r) in ref]
        out[m] = {"same": sum(a == b for a, b in pairs), "compared": len(pairs)}
    return out


def markdown_table(doc: dict) -> str:
    """One Markdown table per result document (what the docs show): a method comparison, a
    verify-cost sweep or a draft-step timing."""
    if "moe_study" in doc:
        from fasteagle.bench.moe import markdown

        return markdown(doc)
    if doc.get("distill_speed"):
        from fasteagle.bench.distill import markdown

        return markdown(doc)
    if "limits" in doc and "drafters" in doc:
        from fasteagle.bench.vllm_costs import markdown

        return markdown(doc)
    if "engines" in doc:
        from fasteagle.bench.serving import markdown

        return markdown(doc)
    if "batches" in doc:
        from fasteagle.bench.batches import markdown

        return markdown(doc)
    if "predict" in doc:
        from fasteagle.bench.predict import markdown

        return markdown(doc)
    if "renumbered_max_gap" in doc:
        from fasteagle.bench.diagnose import markdown

        return markdown(doc)
    if "relative" in doc:
        return _verify_cost_table(doc)
    if "budget_curve" in doc:
        return _budget_curve_table(doc)
    if "equal_training" in doc:
        return _equal_training_table(doc)
    if "side_by_side" in doc:
        return _side_by_side_table(doc)
    if doc.get("profile"):
        from fasteagle.profile import markdown

        return markdown(doc)
    if "by_prefix" in doc:
        rows = "".join(f"| {p} | {d} | {r['fasteagle']:.1f} | {r['eagle3']:.1f} | {r['fasteagle_prefill']:.1f} | "
                       f"{r['eagle3_prefill']:.1f} |\n" for p, by in doc["by_prefix"].items() for d, r in by.items())
        return (f"**{doc['device']}**, {doc['dtype']}{_linears(doc)}: one draft step ({doc['accepted']} accepted "
                f"tokens fed, then the ~60-node tree) and the drafter's own prefill over the context, against "
                f"the context length, at the `{doc['shape']}` shape, random weights\n\n"
                "| context tokens | depth | FastEagle step ms | EAGLE-3-style step ms | FastEagle prefill ms | "
                "EAGLE-3-style prefill ms |\n|---|---|---|---|---|---|\n" + rows)
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
    return _compare_table(doc)


def _compare_table(doc: dict) -> str:
    """A method comparison: the run's settings, one row per method, one per prompt category."""
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
    hf = any(m.get("speedup_vs_hf_generate") is not None for m in doc["methods"].values())
    lines = ["| method | tokens/s | speedup vs vanilla |" + " vs HF generate |" * hf + " tau | acceptance by depth | "
             "draft ms | verify ms | identical |" + " peak MB |" * peak, "|---|---|---|---|---|---|---|---|"
             + "---|" * (hf + peak)]
    for name, m in doc["methods"].items():
        def f(key, fmt="{:.2f}", m=m):
            return fmt.format(m[key]) if m.get(key) is not None else "–"
        ident = f"{m['identical_to_vanilla']}/{m['prompts']}" if "identical_to_vanilla" in m else "–"
        lines.append(f"| {name} | {f('tokens_per_s', '{:.1f}')} | {f('speedup_vs_vanilla', '{:.2f}x')} |"
                     + f" {f('speedup_vs_hf_generate', '{:.2f}x')} |" * hf + f" {f('tau')} | {_depths(m)} | "
                     f"{f('draft_ms', '{:.1f}')} | {f('verify_ms', '{:.1f}')} | {ident} |"
                     + f" {f('peak_mb', '{:.0f}')} |" * peak)
    if any(m.get("depth_reached") for m in doc["methods"].values()):
        lines.append(f"\nAcceptance by depth: the depths judged at least {MIN_JUDGED} times.")
    spreads = {n: m["spread"] for n, m in doc["methods"].items() if "spread" in m}
    if spreads:
        runs = len(next(m for m in doc["methods"].values() if "spread" in m)["tokens_per_s_runs"])
        lines.append(f"\nEach prompt decoded {runs} times by every method in turn (tokens/s: the median run per "
                     "prompt); "
                     "spread of the pooled tokens/s over the runs (max - min over median): "
                     + ", ".join(f"{n} {v:.0%}" for n, v in spreads.items()) + ".")
    split = {n: m for n, m in doc["methods"].items() if "prefill_s" in m}
    if split:
        lines.append("\nEach request split, per prompt: prefill s (the target's, plus the drafter's own), then the "
                     "decode alone, tokens/s and speedup vs vanilla's decode: "
                     + "; ".join(f"{n} {m['prefill_s']:.2f} s (drafter {m['drafter_prefill_s']:.2f}), "
                                 f"{m['decode_tokens_per_s']:.1f} tok/s, {m.get('decode_speedup_vs_vanilla', 1):.2f}x"
                                 for n, m in split.items()) + ".")
    if float(s.get("temperature") or 0) > 0:
        lines.append("\nSampling: each method draws its own sample, so outputs are not compared with vanilla's.")
    if doc.get("reference"):
        ref = doc["reference"]
        lines.append(f"\nReplies equal to vanilla's in `{ref['file']}` ({ref.get('dtype', '')}), prompt by prompt: "
                     + ", ".join(f"{m} {r['same']}/{r['compared']}" for m, r in ref["replies"].items()) + ".")
    cats = doc.get("per_category") or {}
    if len(cats) > 1:  # speedup and tau per prompt category
        names = list(doc["methods"])
        lines += ["", "| category | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        for cat, ms in cats.items():
            cells = [f"{ms[n]['speedup_vs_vanilla']:.2f}x" + (f", tau {ms[n]['tau']:.2f}" if "tau" in ms[n] else "")
                     + (f", decode {ms[n]['decode_speedup_vs_vanilla']:.2f}x" if "decode_speedup_vs_vanilla" in ms[n]
                        and n != "vanilla" else "")
                     if ms.get(n, {}).get("speedup_vs_vanilla") is not None else "–" for n in names]
            lines.append(f"| {cat} | " + " | ".join(cells) + " |")
    return head + "\n".join(lines) + "\n"


MIN_JUDGED = 20  # a depth judged fewer times than this is left out of the tables and charts of results


def judged_depths(summary: dict) -> list[float | None]:
    """A drafter's acceptance per depth (`trace.depth_rates`), None where fewer than `MIN_JUDGED` steps judged
    a node of that depth (a rate of 1.00 from one try says nothing); all of them when the counts are unknown."""
    rates, reached = summary.get("depth_acceptance") or [], summary.get("depth_reached")
    return rates if reached is None else [r if n >= MIN_JUDGED else None for r, n in zip(rates, reached)]


def _depths(summary: dict, shown: int = 4) -> str:
    """A drafter's acceptance at each depth judged often enough (`judged_depths`), the first `shown`; – for
    none."""
    rates = [r for r in judged_depths(summary)[:shown] if r is not None]
    return ", ".join(f"{r:.2f}" for r in rates) if rates else "–"


def _side_by_side_table(doc: dict) -> str:
    """A recipe's compare stage (`fasteagle.train.compare`): a row per prompt set, tree and drafter."""
    steps = f"{doc['steps']} steps of" if doc.get("steps") else "unequal"
    others = [n for n, f in (doc.get("drafter_facts") or {}).items() if doc.get("steps") and f["steps"] != doc["steps"]]
    beside = f" ({', '.join(others)} beside them in vLLM as shipped)" if others else ""
    head = (f"**{doc.get('device', '?')}**: every drafter at {steps} equal training{beside}, decoded side by "
            f"side in one run per prompt set and tree (each prompt {doc['repeats']} times by every method in turn; "
            "speed-up: pooled tokens/s over vanilla's in the same run, ± the runs' spread; acceptance by depth: "
            f"the depths judged at least {MIN_JUDGED} times)\n\n"
            "| prompts | tree | drafter | nodes | tau | speed-up vs vanilla | acceptance by depth "
            "| below a backbone / side node | draft ms | identical | tau by kind |\n"
            "|---|---|---|---|---|---|---|---|---|---|---|\n")
    rows = []
    for p_label, trees in doc["side_by_side"].items():
        for t_label, run in trees.items():
            for name, m in run["methods"].items():
                if name == "vanilla":
                    continue
                spread = f" ± {100 * m['spread']:.0f}%" if m.get("spread") is not None else ""
                rows.append(f"| {p_label} ({run['prompts']}) | {t_label} | {name} | {m.get('tree_budget') or '–'} "
                            f"| {m['tau']:.2f} | {m['speedup_vs_vanilla']:.2f}x{spread} "
                            f"| {_depths(m)} | {_shown(m.get('acceptance_below_backbone'))} / "
                            f"{_shown(m.get('acceptance_below_side'))} | {m['draft_ms']:.1f} "
                            f"| {m['identical_to_vanilla']}/{m['prompts']} "
                            f"| {', '.join(f'{k} {t:.2f}' for k, t in (m.get('tau_by_kind') or {}).items()) or '–'} |")
    return _drafter_facts_table(doc) + head + "\n".join(rows) + "\n" + _vllm_chains_table(doc)


def _drafter_facts_table(doc: dict) -> str:
    """A recipe of steps' compared drafters: what each is and what its training took."""
    facts = doc.get("drafter_facts")
    if not facts:
        return ""
    rows = [f"| {name} | {f['kind']} | {f['params'] / 1e6:.1f}M | {f.get('steps') or '–'} "
            f"| {_shown_int(f.get('tokens_trained'))} | {f.get('train_minutes') or '–'} |" for name, f in facts.items()]
    return ("The drafters (parameters: the trained tensors; the target's embedding and head are shared):\n\n"
            "| drafter | kind | parameters | steps | tokens seen | training minutes |\n|---|---|---|---|---|---|\n"
            + "\n".join(rows) + "\n\n")


def _shown_int(value) -> str:
    return "–" if value is None else f"{value:,}"


def conditional(per_position: list[float]) -> list[float]:
    """vLLM's acceptance per position (accepted there / drafted steps) as a rate given the one before accepted."""
    return [x / prev if prev else 0.0 for x, prev in zip(per_position, [1.0, *per_position])]


def _vllm_chains_table(doc: dict) -> str:
    """A recipe of steps' vLLM sweeps: each drafter's chain of k at each batch size."""
    chains = doc.get("vllm")
    if not chains:
        return ""
    rows = []
    for label, c in chains.items():
        for b, methods in c["batches"].items():
            for name, m in methods.items():
                if name == "vanilla":
                    continue
                spread = f" ± {100 * m['spread']:.0f}%" if m.get("spread") is not None else ""
                pos = " / ".join(f"{x:.2f}" for x in conditional(m.get("per_position") or []))
                rows.append(f"| {label} | {c['k']} | {b} | {name} | {m['tokens_per_s']:.1f}{spread} "
                            f"| {m['speedup_vs_vanilla']:.2f}x | {_shown(m.get('tau'))} | {pos or '–'} "
                            f"| {m.get('identical_to_vanilla', '–')}/{m.get('prompts', '–')} |")
    return ("\nIn vLLM (stock for eagle3, dflash and peagle; the cascade through our plugin), chains of k, every "
            "timing repeated and interleaved across methods (acceptance per position, conditional: of the drafted "
            "steps that reached it, where vLLM counts it over all drafted steps):\n\n"
            "| run | k | batch | drafter | tokens/s | vs vanilla | tau | acceptance per position | identical |\n"
            "|---|---|---|---|---|---|---|---|---|\n" + "\n".join(rows) + "\n")


def _shown(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f}"


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


def _equal_training_table(doc: dict) -> str:
    """Drafters trained on the same shards in the same order, measured at each budget (`fasteagle.train.recipe`)."""
    def cell(m: dict | None, key: str, fmt: str) -> str:
        return format(m[key], fmt) if m and m.get(key) is not None else "–"

    lines = ["| drafter | steps | tokens trained | train min | lr | auto tree | τ | tokens/s | speed-up | draft ms "
             "| τ at paper tree | per-depth acceptance (auto tree) |", "|---|" + "---|" * 11]
    for name, points in doc["equal_training"].items():
        for p in points:
            a, b = p.get("auto_tree"), p.get("paper_tree")
            depth = " ".join(f"{x:.2f}" for x in (a or {}).get("depth_acceptance") or [])
            lines.append(f"| {name} | {p['steps']} | {p.get('tokens_trained') or '–'} | "
                         f"{cell(p, 'train_minutes', '.1f')} | {cell(p, 'lr', 'g')} | {cell(a, 'tree_budget', 'd')} | "
                         f"{cell(a, 'tau', '.2f')} | {cell(a, 'tokens_per_s', '.1f')} | "
                         f"{cell(a, 'speedup_vs_vanilla', '.2f')}x | {cell(a, 'draft_ms', '.1f')} | "
                         f"{cell(b, 'tau', '.2f')} ({cell(b, 'tree_budget', 'd')}) | {depth or '–'} |")
    r, data = doc.get("recipe", {}), doc.get("data", {})
    prompts = f"{', '.join(f'{s} {n}' for s, n in r.get('prompts', {}).items())} prompts"
    if "data" in data:  # the target answered only some prompts where the recipe capped its minutes
        prompts = (f"the target's replies to {data['data']['sequences']} of {prompts}, "
                   f"{data['data']['reply_tokens']} tokens")
    if "written" in data:
        prompts += (f"; {data['written']['sequences']} ShareGPT conversations as written, "
                    f"{data['written']['reply_tokens']} tokens")
    head = (f"**{doc.get('device', '?')}**: drafters trained from scratch on the same feature shards in the same "
            f"order ({prompts}), "
            f"each measured against vanilla on {', '.join(Path(x).name for x in r.get('eval', {}).get('prompts', []))}"
            f" at its own `--tree auto` budget and at the paper's tree; the pair: {' vs '.join(doc.get('pair', []))}"
            "\n\n")
    rows = doc.get("head_to_head") or []
    if rows:
        a, b = doc["pair"]
        lines += ["", f"Each at its best tree (the higher speed-up over its run's vanilla), {a} over {b}:", "",
                  f"| steps | tokens trained | {a}: tree, speed-up, τ | {b}: tree, speed-up, τ | speed-up ratio "
                  "| τ ratio |", "|---|---|---|---|---|---|"]
        lines += [f"| {r['steps']} | {r.get('tokens_trained') or '–'} | "
                  + " | ".join(f"{r[n]['tree']} ({r[n]['tree_budget']}), {r[n]['speedup']:.2f}x, {r[n]['tau']:.2f}"
                               for n in (a, b))
                  + f" | {r['speed_ratio']:.2f}x | {r['tau_ratio']:.2f} |" for r in rows]
    return head + "\n".join(lines) + "\n"


def _linears(d: dict) -> str:
    """Which linear layers a result ran on (`fasteagle.packing`); results from before the choice say nothing."""
    if "packed_linears" not in d:
        return ""
    drafters = f", {d['draft_weights']} drafter weights" if d.get("draft_weights") else ""
    return (", prepacked linears" if d["packed_linears"] else ", stock linears") + drafters


RESULT_BLOCK = re.compile(r"<!-- result: (\S+) -->\n.*?<!-- /result -->", re.S)


def result_block(document: str | Path, rel: str) -> str:
    """One generated block of a document: the table of the result file at `rel` (a path relative to the
    document, as a Markdown link is) and the command that made it, which the result stores."""
    path = Path(document).parent / rel
    doc = read_result(path)
    if not doc.get("command"):
        raise FastEagleError(f"{path} records no command: a table cites the command that made it")
    return (f"<!-- result: {rel} -->\n{markdown_table(doc)}\n<sub>from [`{Path(rel).name}`]({rel}), "
            f"made by `{doc['command']}`</sub>\n<!-- /result -->")


def render_docs(documents: list[str | Path]) -> dict[Path, str]:
    """Each document's text with every `<!-- result: FILE -->` ... `<!-- /result -->` block drawn again
    from its result file (tables are never typed by hand); nothing is written."""
    out = {}
    for document in documents:
        try:
            text = Path(document).read_text(encoding="utf-8")
        except OSError as exc:
            raise FastEagleError(f"cannot read {document}: {exc.strerror or exc} (run from the repository root "
                                 "or name the documents: --update-docs README.md,docs/results.md)") from None
        except UnicodeDecodeError as exc:
            raise FastEagleError(f"{document} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
        if not RESULT_BLOCK.search(text):
            raise FastEagleError(f"{document} has no <!-- result: FILE --> ... <!-- /result --> block")
        out[Path(document)] = RESULT_BLOCK.sub(lambda m, d=document: result_block(d, m.group(1)), text)
    return out


def update_docs(documents: list[str | Path]) -> list[Path]:
    """Regenerate every result block of these documents from the result files they name; returns the
    documents that changed (only those are written). Every document and result is read before the first is
    written, so a bad one leaves every document as it was."""
    changed = {path: text for path, text in render_docs(documents).items()
               if text != path.read_text(encoding="utf-8")}
    for path, text in changed.items():
        write_text(path, text)
    return list(changed)
