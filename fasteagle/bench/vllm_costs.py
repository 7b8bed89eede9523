"""vLLM's own step costs on this machine, and from them each method's speed limit at each batch size.

    python -m fasteagle bench --engine vllm --step-costs bench/results/cpu-...-vllm-batches-....json \
        --repeats 5 --out bench/results/cpu-...-vllm-costs-....json

A batch sweep (`fasteagle.bench.batches`) measured tokens/s and tau; this measures what one engine step
costs, in vLLM itself, and asks how close each method came to what those costs allow:

- decode(b): one step of b requests, one new token each: (time of b requests decoding M+1 tokens minus
  the same with 1) / M;
- forward(b, q): a step whose forward reads q tokens per request: decode(b) plus the extra time of a
  one-step call whose requests each bring q uncached tokens after a cached prefix, over one that brings 1
  (prefix caching leaves exactly q tokens to compute; the call's fixed costs cancel).

The target is timed that way for q = 1..k+1 (a chain of k drafts verified), each drafter at its shape (a
Llama of its width, layers, MLP and draft vocabulary, random weights: vLLM runs it as its own model, so
the drafter's fusion of the target's features, a few small matmuls, is left out) for q = 1..2k. A drafter
runs inside the target's engine step, so the step of an almost empty model (one layer of width 64, the
same vocabulary: scheduling, sampling, output) is taken off each drafter's timings. vLLM's
EAGLE-3 path drafts a chain with a first forward over the step's k+1 tokens then k-1 forwards of one; in
parallel drafting (the cascade) one forward over those k+1 and k-1 mask rows, 2k per request
(`vllm/v1/spec_decode/llm_base_proposer.py`). So a step costs

    vanilla: decode(b)      n-gram: forward(b, k+1)      (its host-side matching left out)
    eagle3: forward(b, k+1) + draft(b, k+1) + (k-1) draft(b, 1)      cascade: forward(b, k+1) + draft(b, 2k)

and a method's limit is b * tau / step tokens/s, tau the sweep's own at that batch (tokens per request
and step). Measured over limit says what the rest of the engine (scheduling, sampling, rejection, the
drafter's bookkeeping) costs on top.
"""

from __future__ import annotations

import json
import random
import statistics
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

from fasteagle.errors import FastEagleError

DECODE_TOKENS = 32  # M: new tokens of the decode timing (its one-token call subtracted)
CONTEXT = 256  # cached prefix tokens each timed request attends to (two of vLLM's CPU blocks)


def shape_model(cfg: dict, folder: Path) -> Path:
    """A random-weight Llama with a drafter's shape (`cfg`: our drafter config.json), saved for vLLM."""
    from transformers import LlamaConfig, LlamaForCausalLM

    llama = LlamaConfig(hidden_size=cfg["width"], intermediate_size=cfg["intermediate"],
                        num_hidden_layers=cfg["num_layers"], num_attention_heads=cfg["num_heads"],
                        num_key_value_heads=cfg["num_kv_heads"], head_dim=cfg["head_dim"],
                        vocab_size=cfg.get("draft_vocab") or cfg["vocab_size"], rope_theta=cfg["rope_theta"],
                        rms_norm_eps=cfg["rms_norm_eps"], max_position_embeddings=2048, tie_word_embeddings=False)
    LlamaForCausalLM(llama).save_pretrained(folder)
    return folder


def step_costs(llm, sizes: list[int], queries: list[int], vocab: int, repeats: int, label: str) -> dict:
    """ms per engine step of `llm` at each batch size: {"decode": {b: ms}, "forward": {b: {q: ms}}}, from the
    fastest of `repeats` timings of each call, taken in turn across every (b, q): a call's time varies by
    tens of ms with the hand-offs between vLLM's three processes, and only upwards."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    rng = random.Random(0)
    prefix = [rng.randrange(vocab) for _ in range(CONTEXT)]

    def call(b: int, q: int, new: int) -> float:
        prompts = [TokensPrompt(prompt_token_ids=prefix + [rng.randrange(vocab) for _ in range(q)]) for _ in range(b)]
        params = SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True, detokenize=False)
        start = time.perf_counter()
        llm.generate(prompts, params, use_tqdm=False)
        return (time.perf_counter() - start) * 1e3

    call(1, 1, 2)  # caches the prefix
    cases = [(b, q, 1) for b in sizes for q in queries] + [(b, 1, DECODE_TOKENS + 1) for b in sizes]
    times = {c: [] for c in cases}
    for _ in tqdm(range(repeats), desc=f"vLLM step costs: {label}", unit="round"):
        for c in cases:
            times[c].append(call(*c))
    ms = {c: min(t) for c, t in times.items()}
    decode = {b: (ms[b, 1, DECODE_TOKENS + 1] - ms[b, 1, 1]) / DECODE_TOKENS for b in sizes}
    spread = {b: max(_spread(times[b, q, 1]) for q in queries) for b in sizes}
    return {"decode": {str(b): decode[b] for b in sizes},
            "forward": {str(b): {str(q): decode[b] + ms[b, q, 1] - ms[b, 1, 1] for q in queries} for b in sizes},
            "call_ms": {str(b): ms[b, 1, 1] for b in sizes}, "spread": {str(b): spread[b] for b in sizes}}


def _spread(values: list[float]) -> float:
    """(max - min) / median of one case's timings."""
    return (max(values) - min(values)) / statistics.median(values) if len(values) > 1 else 0.0


def step_ms(method: str, kind: str | None, b: int, k: int, target: dict, drafts: dict) -> float:
    """One step's ms for `method` at batch b by the formulas above (`kind`: its drafter's, or None)."""
    fwd = target["forward"][str(b)]
    if method == "vanilla":
        return target["decode"][str(b)]
    if kind is None:  # n-gram
        return fwd[str(k + 1)]
    d = drafts[method]["forward"][str(b)]
    if kind == "eagle3":
        return fwd[str(k + 1)] + d[str(k + 1)] + (k - 1) * d["1"]
    return fwd[str(k + 1)] + d[str(2 * k)]


def limits(sweep: dict, target: dict, drafts: dict, kinds: dict) -> dict:
    """Per batch size and method: the step ms, the limit tokens/s (b * tau / step) and the sweep's measured
    tokens/s against it (greedy)."""
    k, out = sweep["k"], {}
    for b, block in sweep["batches"].items():
        out[b] = {}
        for m, r in block["methods"].items():
            ms = step_ms(m, kinds.get(m), int(b), k, target, drafts)
            limit = int(b) * (r.get("tau") or 1.0) / ms * 1e3
            out[b][m] = {"step_ms": ms, "limit_tokens_per_s": limit, "tokens_per_s": r["tokens_per_s"],
                         "of_limit": r["tokens_per_s"] / limit}
    return out


def measure(sweep_file: str | Path, target_dir: str, settings, repeats: int) -> dict:
    """The whole run: the target's and each drafter's step costs at the sweep's batch sizes, and the limits."""
    import datetime

    import torch

    from fasteagle.bench.timing import device_name
    from fasteagle.draftbase import read_config
    from fasteagle.methods import canonical
    from fasteagle.vllm_engine import close, engine

    try:
        sweep = json.loads(Path(sweep_file).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise FastEagleError(f"cannot read the sweep {sweep_file}: {exc}") from None
    if not isinstance(sweep, dict) or "batches" not in sweep or "k" not in sweep:
        raise FastEagleError(f"{sweep_file} is not a vLLM batch sweep (bench --engine vllm --repeats)")
    sizes, k = sorted(int(b) for b in sweep["batches"]), sweep["k"]
    methods = list(next(iter(sweep["batches"].values()))["methods"])
    kinds = {m: canonical(m) for m in methods if m not in ("vanilla", "ngram")}
    options = {"enable_prefix_caching": True, "skip_tokenizer_init": True}
    llm = engine(target_dir, **options)
    vocab = llm.llm_engine.model_config.get_vocab_size()
    target = step_costs(llm, sizes, list(range(1, k + 2)), vocab, repeats, "target")
    close(llm)
    drafts, shapes = {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for m in kinds:
            cfg = read_config(settings.drafter_dir(m))[0]
            shapes[m] = {key: cfg.get(key) for key in ("width", "num_layers", "intermediate", "draft_vocab")}
            llm = engine(str(shape_model(cfg, Path(tmp) / m)), **options)
            drafts[m] = step_costs(llm, sizes, list(range(1, 2 * k + 1)), shapes[m]["draft_vocab"] or 4096,
                                   repeats, m)
            close(llm)
        # an engine step with (next to) no model: what every timed call paid besides the forward
        vocab = max(s["draft_vocab"] or 4096 for s in shapes.values()) if shapes else 4096
        tiny = {"width": 64, "intermediate": 64, "num_layers": 1, "num_heads": 1, "num_kv_heads": 1, "head_dim": 64,
                "draft_vocab": vocab, "rope_theta": 10000.0, "rms_norm_eps": 1e-5}
        llm = engine(str(shape_model(tiny, Path(tmp) / "empty")), **options)
        empty = step_costs(llm, sizes, [1], vocab, repeats, "an empty model")
        close(llm)
    for d in drafts.values():  # a drafter's forward runs inside the target's step: its own step's fixed cost out
        d["forward"] = {b: {q: ms - empty["decode"][b] for q, ms in row.items()} for b, row in d["forward"].items()}
    return {"date": datetime.date.today().isoformat(), "device": device_name(torch.device("cpu")),
            "target_model": sweep.get("target"), "k": k, "sweep": str(sweep_file), "context": CONTEXT,
            "decode_tokens": DECODE_TOKENS, "repeats": repeats, "target": target, "drafters": drafts,
            "empty_step": empty["decode"], "shapes": shapes, "kinds": kinds,
            "limits": limits(sweep, target, drafts, kinds)}


def markdown(doc: dict) -> str:
    """The step costs and each method's measured tokens/s against its limit, one row per batch size."""
    sizes = list(doc["target"]["decode"])
    k = doc["k"]
    head = (f"vLLM step costs (ms; context {doc['context']} cached tokens, fastest of {doc['repeats']}) and "
            f"each method's limit, chain of {k}\n\n| batch | decode | forward k+1 | "
            + " | ".join(f"{m} draft" for m in doc["drafters"]) + " | "
            + " | ".join(f"{m}: measured / limit" for m in next(iter(doc["limits"].values()))) + " |\n")
    head += "|---" * (3 + len(doc["drafters"]) + len(next(iter(doc["limits"].values())))) + "|\n"
    rows = []
    for b in sizes:
        t = doc["target"]
        drafts = [step_ms(m, doc["kinds"][m], int(b), k, t, doc["drafters"]) - t["forward"][b][str(k + 1)]
                  for m in doc["drafters"]]
        lim = doc["limits"].get(b, {})
        rows.append(f"| {b} | {t['decode'][b]:.1f} | {t['forward'][b][str(k + 1)]:.1f} | "
                    + " | ".join(f"{d:.1f}" for d in drafts) + " | "
                    + " | ".join(f"{r['tokens_per_s']:.1f} / {r['limit_tokens_per_s']:.1f} ({r['of_limit']:.0%})"
                                 for r in lim.values()) + " |")
    return head + "\n".join(rows) + "\n"
