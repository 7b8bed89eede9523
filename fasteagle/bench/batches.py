"""Speculative decoding inside vLLM as the batch grows: every method in one run on the same prompts
(`bench --engine vllm --repeats R`), at each batch size, greedy and sampled.

Per batch size and method: output tokens/s (the median of R timings, interleaved across methods, with
their spread), request latency (vLLM's own timestamps, queued to last token), tau and the acceptance at
each chain position (vLLM's counters), KV-cache bytes per token (target and drafter layers), the
engine's resident memory, and, greedy, how many replies equal vanilla's at the same batch size, with the
fp32 logit gap of the target at every divergence (a near-tie, or a bug).

Batch b decodes the first b prompts at once (the prompt list is cycled when shorter); batch 1 decodes
the first `SINGLE` prompts one after another, so that it is not one prompt's luck.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import torch
from tqdm import tqdm

from fasteagle.bench.serving import cycled, vllm_drafters
from fasteagle.generate import chat_prompt_ids

SINGLE = 4  # prompts decoded one at a time at batch 1


def sweep(target, settings, methods: list[str], texts: list[str], k: int, max_new: int, batch_sizes: list[int],
          temperatures: list[float], repeats: int, target_name: str | None) -> dict:
    """Every method at every batch size and temperature, each timing `repeats` times; methods interleaved
    (repeat r runs them in an order rotated by r, one engine at a time, loaded afresh)."""
    methods = ["vanilla", *[m for m in methods if m != "vanilla"]]
    prompts = [chat_prompt_ids(target, t).tolist() for t in texts]
    runs: dict[tuple, list[dict]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        drafters = vllm_drafters(target, settings, methods, Path(tmp))
        kv = {m: kv_bytes_per_token(target.model.config, drafters.get(m), k) for m in methods}
        total = repeats * len(methods) * len(temperatures) * len(batch_sizes)
        with tqdm(total=total, desc="vLLM batches") as bar:
            for r in range(repeats):
                for m in methods[r % len(methods):] + methods[:r % len(methods)]:
                    for key, row in _one_engine(target_name, m, drafters.get(m), prompts, k, max_new, batch_sizes,
                                                temperatures, keep_replies=r == 0, bar=bar):
                        runs.setdefault(key, []).append(row)
    layers = {m: kv[m]["drafter"] // kv[m]["drafter_layer"] if kv[m]["drafter"] else 0 for m in methods}
    doc = {"k": k, "max_new_tokens": max_new, "prompts": len(texts), "batch_sizes": batch_sizes,
           "temperatures": temperatures, "repeats": repeats, "single": SINGLE,
           "gpu_8b": {"shape": GPU_8B, "methods": gpu_arithmetic(layers)}}
    for temp in temperatures:
        batches = {}
        for b in batch_sizes:
            rows = {m: _summary(runs[(temp, b, m)]) | {"kv_bytes_per_token": kv[m]} for m in methods}
            if temp == 0:
                _compare_replies(target, rows, prompts, b)
            for row in rows.values():
                row["speedup_vs_vanilla"] = row["tokens_per_s"] / rows["vanilla"]["tokens_per_s"]
            batches[str(b)] = {"methods": rows}
        doc["batches" if temp == 0 else f"batches_t{temp:g}"] = batches
    return doc


def _one_engine(target_name, method, drafter, prompts, k, max_new, batch_sizes, temperatures, keep_replies, bar):
    """One engine for `method`: a warm-up, then each (temperature, batch size) timed once; with
    `keep_replies`, the greedy replies too (`_compare_replies` holds them to vanilla's)."""
    import psutil

    from fasteagle import vllm_engine as ve

    llm = ve.engine(target_name, method, drafter, k, max_model_len=ve.context_for(prompts, max_new, k))
    try:
        ve.generate(llm, prompts[:1], 8)
        for temp in temperatures:
            for b in batch_sizes:
                batch = batch_of(prompts, b)
                groups = [[p] for p in batch] if b == 1 else [batch]
                before, t0, replies, latencies, prefill = ve.counters(llm), time.perf_counter(), [], [], 0.0
                for group in groups:
                    out, lat, first = ve.generate_timed(llm, group, max_new, temp)
                    replies += out
                    latencies += lat
                    prefill += first
                seconds = time.perf_counter() - t0
                me = psutil.Process()
                rss = sum(p.memory_info().rss for p in [me, *me.children(recursive=True)])
                tokens = sum(map(len, replies))
                row = {"tokens_per_s": tokens / seconds, "latency_s": statistics.mean(latencies),
                       "prefill_s": prefill, "tokens": tokens, "requests": len(replies), "rss_mb": rss / 2**20}
                row |= {"replies": replies} if keep_replies and temp == 0 else {}
                if method != "vanilla":
                    acc = ve.acceptance(ve.since(ve.counters(llm), before))
                    row |= {"tau": acc["tau"], "per_position": acc["per_position"]}
                bar.update()
                yield (temp, b, method), row
    finally:
        ve.close(llm)


def batch_of(prompts: list[list[int]], b: int) -> list[list[int]]:
    """The prompts of batch size b: at batch 1 the first `SINGLE` (decoded one at a time), else `cycled`."""
    return prompts[:SINGLE] if b == 1 else cycled(prompts, b)


def _summary(rows: list[dict]) -> dict:
    """The repeats of one cell: median tokens/s and its spread ((max - min) / median), the rest of the first."""
    speeds = [r["tokens_per_s"] for r in rows]
    mid = statistics.median(speeds)
    first = dict(rows[0])
    return first | {"tokens_per_s": mid, "tokens_per_s_runs": speeds, "spread": (max(speeds) - min(speeds)) / mid,
                    "latency_s": statistics.median(r["latency_s"] for r in rows),
                    "prefill_s": statistics.median(r["prefill_s"] for r in rows),
                    "rss_mb": max(r["rss_mb"] for r in rows)}


def _compare_replies(target, rows: dict, prompts: list[list[int]], b: int) -> None:
    """Greedy: each method's replies against vanilla's at the same batch size; at every divergence the target's
    fp32 logit gap between the two tokens (ours, one forward over the common prefix)."""
    reference = rows["vanilla"].pop("replies")
    batch = batch_of(prompts, b)
    for m, row in rows.items():
        replies = reference if m == "vanilla" else row.pop("replies")
        gaps = [logit_gap(target, p, a, r) for p, a, r in zip(batch, replies, reference) if a != r]
        row |= {"identical_to_vanilla": len(replies) - len(gaps), "prompts": len(replies),
                "divergence_gaps": [g for g in gaps if g is not None]}


@torch.no_grad()
def logit_gap(target, prompt: list[int], a: list[int], b: list[int]) -> float | None:
    """|logit(a_i) - logit(b_i)| of the target (fp32) at the first position i where replies a and b differ,
    after the prompt and their common prefix; None where one reply is a prefix of the other (a length cap)."""
    i = next((j for j, (x, y) in enumerate(zip(a, b)) if x != y), None)
    if i is None:
        return None
    ids = torch.tensor([prompt + a[:i]], device=target.device)
    logits = target.model(ids).logits[0, -1].float()
    return float((logits[a[i]] - logits[b[i]]).abs())


def layer_kv_bytes(kv_heads: int, head_dim: int, dtype_bytes: int) -> int:
    """One attention layer's KV-cache bytes per token: a key and a value per KV head."""
    return 2 * kv_heads * head_dim * dtype_bytes


def layers_built(num_layers: int, cascade: bool, k: int) -> int:
    """A drafter's layers inside vLLM drafting chains of k: EAGLE-3's all (usually one); the cascade's first
    k at most, all our plugin builds (`fasteagle.vllm_cascade.built_depths`)."""
    return min(num_layers, k) if cascade else num_layers


def kv_bytes_per_token(config, drafter: Path | None, k: int, dtype_bytes: int = 4) -> dict:
    """KV-cache bytes one token holds: the target's layers, and a drafter's (EAGLE-3: its layers, usually one;
    the cascade: one per drafted token, min(N, k), as the plugin builds them), from the configs. vLLM's own CPU
    cache sizes agree (2 GiB held 46,592 tokens of SmolLM2-135M, 45,056 with the one-layer EAGLE-3 drafter,
    38,784 with all 6 of the cascade's layers)."""
    import json

    def per_layer(c) -> int:
        heads = c.get("num_key_value_heads") or c["num_attention_heads"]
        return layer_kv_bytes(heads, c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"], dtype_bytes)

    t = config.to_dict()
    out = {"target": per_layer(t) * t["num_hidden_layers"], "drafter": 0, "drafter_layer": 0}
    if drafter is not None:
        d = json.loads((Path(drafter) / "config.json").read_text())
        n = layers_built(d["num_hidden_layers"], d.get("fasteagle_kind") == "fasteagle", k)
        out |= {"drafter": per_layer(d) * n, "drafter_layer": per_layer(d)}
    return out | {"total": out["target"] + out["drafter"]}


# The paper's serving shape: Llama-3.1-8B in bf16 (32 layers, 8 KV heads of 128) on an 80 GB GPU
GPU_8B = {"layers": 32, "kv_heads": 8, "head_dim": 128, "bytes": 2, "weights_gb": 16.1, "memory_gb": 80}


def binding_batch(kv_per_token: int, context: int, memory_gb: float, weights_gb: float) -> int:
    """The batch at which the KV cache fills a GPU: free memory over one request's KV (context tokens)."""
    return int((memory_gb - weights_gb) * 1e9 // (kv_per_token * context))


def gpu_arithmetic(drafter_layers: dict[str, int], contexts: tuple[int, ...] = (2048, 8192)) -> dict:
    """KV bytes per token of the 8B shape with each method's drafter layers (EAGLE-3: 1, the cascade: min(N, k)), and
    the batch at which the KV cache would fill the 80 GB GPU at each context length."""
    g = GPU_8B
    layer = layer_kv_bytes(g["kv_heads"], g["head_dim"], g["bytes"])
    out = {}
    for m, n in drafter_layers.items():
        per_token = layer * (g["layers"] + n)
        out[m] = {"kv_bytes_per_token": per_token,
                  "binding_batch": {str(c): binding_batch(per_token, c, g["memory_gb"], g["weights_gb"])
                                    for c in contexts}}
    return out


def crossover(batches: dict, method: str) -> int | None:
    """The smallest batch size at which `method` is no faster than vanilla (None: it stays faster)."""
    for b in sorted(batches, key=int):
        if batches[b]["methods"][method]["speedup_vs_vanilla"] <= 1.0:
            return int(b)
    return None


def _label(key: str) -> str:
    return "greedy" if key == "batches" else f"temperature {key.removeprefix('batches_t')}"


def markdown(doc: dict) -> str:
    """Per temperature: tokens/s (median of the repeats, spread) and speedup at each batch size, tau at each;
    then KV bytes per token and each method's crossover batch."""
    sizes = doc["batch_sizes"]
    out = [f"**{doc.get('device', '')}**, vLLM {doc.get('vllm', '')} (its worker on one thread), target "
           f"`{doc.get('target', '')}`, fp32, {doc['prompts']} prompts of {doc.get('prompt_files', '')} (batch b: the "
           f"first b; batch 1: {doc['single']} one at a time), {doc['max_new_tokens']} new tokens, chains of "
           f"{doc['k']} drafted tokens, each timing the median of {doc['repeats']} interleaved runs (spread: max-min "
           "over median)"]
    for key in [k for k in doc if k.startswith("batches")]:
        batches = doc[key]
        methods = list(batches[str(sizes[0])]["methods"])
        head = ["method", *[f"b={b}" for b in sizes], "crossover"]
        out += [f"\n{_label(key)}: tokens/s (spread), speedup vs vanilla; tau\n",
                "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for m in methods:
            cells = []
            for b in sizes:
                r = batches[str(b)]["methods"][m]
                tau = f"; {r['tau']:.2f}" if "tau" in r else ""
                same = (f"; {r['identical_to_vanilla']}/{r['prompts']} same" if m != "vanilla" and "prompts" in r
                        and r["identical_to_vanilla"] < r["prompts"] else "")
                cells.append(f"{r['tokens_per_s']:.1f} ({r['spread']:.0%}), {r['speedup_vs_vanilla']:.2f}x{tau}{same}")
            cross = "–" if m == "vanilla" else (f"b={c}" if (c := crossover(batches, m)) else f"> {sizes[-1]}")
            out.append(f"| {m} | " + " | ".join(cells) + f" | {cross} |")
    first = doc["batches"][str(sizes[0])]["methods"]
    out += ["\nKV-cache bytes per token (fp32): " + ", ".join(
        f"{m} {r['kv_bytes_per_token']['total']:,} ({r['kv_bytes_per_token']['drafter']:,} drafter)"
        for m, r in first.items())]
    if gpu := doc.get("gpu_8b"):
        g = gpu["shape"]
        ctx = list(next(iter(gpu["methods"].values()))["binding_batch"])
        out += [f"\nBy arithmetic, the paper's shape (Llama-3.1-8B, bf16, {g['layers']} layers of {g['kv_heads']} KV "
                f"heads of {g['head_dim']}; {g['weights_gb']} GB of weights on an {g['memory_gb']} GB GPU): KV bytes "
                "per token and the batch at which the KV cache fills the GPU\n",
                "| method | KV bytes per token | " + " | ".join(f"binds at batch, {c}-token contexts" for c in ctx)
                + " |", "|---|---|" + "---|" * len(ctx)]
        for m, r in gpu["methods"].items():
            out.append(f"| {m} | {r['kv_bytes_per_token']:,} | "
                       + " | ".join(str(r["binding_batch"][c]) for c in ctx) + " |")
    return "\n".join(out) + "\n"


def chart(doc: dict, path: str | Path) -> None:
    """Plotly HTML: tokens/s against batch size (log axes) and speedup over vanilla, one line per method;
    greedy solid, sampled dashed; the spread of the repeats as error bars."""
    from plotly.colors import qualitative
    from plotly.subplots import make_subplots

    from fasteagle.files import atomic_path

    fig = make_subplots(rows=1, cols=2, subplot_titles=["output tokens/s", "speedup vs vanilla"])
    sizes = doc["batch_sizes"]
    methods = list(doc["batches"][str(sizes[0])]["methods"])
    color = {m: qualitative.Plotly[i % 10] for i, m in enumerate(methods)}
    for key in [k for k in doc if k.startswith("batches")]:
        dash = "solid" if key == "batches" else "dash"
        for m in methods:
            rows = [doc[key][str(b)]["methods"][m] for b in sizes]
            name = m if key == "batches" else f"{m}, {_label(key)}"
            speeds = [r["tokens_per_s"] for r in rows]
            err = [r["spread"] * r["tokens_per_s"] / 2 for r in rows]
            fig.add_scatter(x=sizes, y=speeds, error_y={"type": "data", "array": err}, name=name, legendgroup=name,
                            line={"color": color[m], "dash": dash}, row=1, col=1)
            fig.add_scatter(x=sizes, y=[r["speedup_vs_vanilla"] for r in rows], name=name, legendgroup=name,
                            showlegend=False, line={"color": color[m], "dash": dash}, row=1, col=2)
    fig.update_xaxes(type="log", title_text="batch size", tickvals=sizes)
    fig.update_yaxes(type="log", row=1, col=1)
    fig.add_hline(y=1.0, line_dash="dot", line_color="grey", row=1, col=2)
    fig.update_layout(title=f"Speculative decoding in vLLM {doc.get('vllm', '')} as the batch grows "
                            f"({doc.get('device', '')}, {doc.get('target', '')})", height=480, width=1100)
    with atomic_path(path) as tmp:
        fig.write_html(str(tmp), include_plotlyjs="cdn", div_id=Path(path).stem)
