"""vLLM's own step costs on this machine, and from them each method's speed limit at each batch size.

    python -m fasteagle bench --engine vllm --step-costs bench/results/cpu-...-vllm-batches-....json \
        --repeats 5 --out bench/results/cpu-...-vllm-costs-....json

A batch sweep (`fasteagle.bench.batches`) measured tokens/s and tau; this measures what one engine step
costs, in vLLM itself, and asks how close each method came to what those costs allow. A step of b requests
each feeding q tokens to the model is timed over many steps: b requests decode M*q+1 tokens (about M
steps, whatever q), less the same with 1 (so prefill and the call's fixed costs cancel), over the steps
between. q = 1 is plain decoding;
q > 1 is vLLM's n-gram proposer drafting q-1 tokens a step (its lookup costs next to nothing) on a prompt
that repeats itself, so it drafts at every step: the step that verifies q tokens per request, rejection
sampler included. `query` records the tokens per request and step that ran; where it falls short of q
(steps without a draft), the step at q is drawn on the line through the steps at 1 and at `query` tokens.

The target is timed for q = 1..k+1. Each drafter is timed at its shape (a Llama of its width, layers (the
cascade's first k: all the plugin builds), MLP and draft vocabulary, random weights: vLLM runs it as a model of
its own, so the drafter's fusion of the target's features, a few small matmuls, is left out): its forward of q
tokens for b requests as a decode step of b*q
requests (the same rows through every linear layer; attention over a short context is a small part of
it), less an almost empty model's step at b*q (one layer of width 64, the same vocabulary: scheduling,
sampling), since a drafter runs inside the target's step. vLLM's EAGLE-3 path drafts a chain with a first
forward over the step's k+1 tokens, then k-1 forwards of one; in parallel drafting (the cascade) one
forward over those k+1 and k-1 mask rows, 2k per request (`vllm/v1/spec_decode/llm_base_proposer.py`). So a step costs

    vanilla: step(b, 1)      n-gram: step(b, k+1)
    eagle3: step(b, k+1) + draft(b, k+1) + (k-1) draft(b, 1)      cascade: step(b, k+1) + draft(b, 2k)

and a method's limit is b * tau / step tokens/s, tau the sweep's own at that batch (tokens per request
and step). The sweep's tokens/s also pays each call's prefill (the target's and the drafter's, up to the
first token, by vLLM's clock), which no step prices; where the sweep recorded it (`prefill_s`), the limit
pays it too: tokens / (prefill + (tokens - requests) / (b * tau) steps). Measured over limit says what the
rest (the proposer's bookkeeping, the drafter's inputs and its sampling) costs on top. n-gram's limit
assumes it drafts at every step; on real prompts it does not, so it can beat its limit.
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from pathlib import Path

from tqdm import tqdm

from fasteagle.errors import FastEagleError
from fasteagle.files import read_result

DECODE_TOKENS = 32  # M: steps of a timed call (M * q new tokens; its one-token call subtracted)
PERIOD, REPEATS_IN_PROMPT = 16, 16  # a timed prompt's length: 256 tokens (two CPU blocks), +1


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


def timed_steps(llm, sizes: list[int], prompt: list[int], repeats: int, label: str, q: int = 1) -> dict:
    """ms per engine step of `llm` at each batch size ({b: {"ms", "query", "spread"}}), from the fastest of
    `repeats` timings of each call, taken in turn across batch sizes: a call's time varies by tens of ms with
    the hand-offs between vLLM's three processes, and only upwards. A step that verifies q tokens makes up to
    q, so a call asks for `DECODE_TOKENS` * q: about as many steps whatever q, and the same jitter per step."""
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    from fasteagle.vllm_engine import counters, since

    prompt = TokensPrompt(prompt_token_ids=prompt)

    def call(b: int, new: int) -> tuple[float, dict]:
        params = SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True, detokenize=False)
        before = counters(llm)
        start = time.perf_counter()
        llm.generate([prompt] * b, params, use_tqdm=False)
        return (time.perf_counter() - start) * 1e3, since(counters(llm), before)

    call(1, 2)  # caches the prompt
    new = DECODE_TOKENS * q
    times = {(b, n): [] for b in sizes for n in (1, new + 1)}
    drafted = {}
    for _ in tqdm(range(repeats), desc=f"vLLM steps: {label}", unit="round"):
        for b, n in times:
            ms, c = call(b, n)
            times[b, n].append(ms)
            drafted[b, n] = c
    out = {}
    for b in sizes:
        c = drafted[b, new + 1]
        # steps per request: every token but the accepted drafts took one, or every draft did; each count can
        # fall short (a last step's drafts past the token limit count as accepted; a step without a draft
        # has none), so the larger
        steps = max(new - c["accepted"] / b, c["drafts"] / b)
        out[str(b)] = {"ms": (min(times[b, new + 1]) - min(times[b, 1])) / steps, "steps": steps,
                       "query": 1 + c["draft_tokens"] / (b * steps), "spread": _spread(times[b, new + 1])}
    return out


def _spread(values: list[float]) -> float:
    """(max - min) / median of one call's timings."""
    return (max(values) - min(values)) / statistics.median(values) if len(values) > 1 else 0.0


def costs_at(model: str, queries: list[int], sizes: list[int], prompt: list[int], repeats: int, label: str,
             **options) -> dict:
    """`model`'s step at each batch size for q = 1 and each q in `queries` ({q: {b: ...}}): q = 1 decoding,
    q > 1 with vLLM's n-gram proposer drafting q-1 tokens a step. Where it drafted at fewer steps than all
    (`query` under q), the step at q is drawn on the line through the steps at 1 and at `query` tokens."""
    from fasteagle.vllm_engine import close, engine

    out = {}
    for q in sorted({1, *queries}):
        spec = {"method": "ngram", "num_speculative_tokens": q - 1, "prompt_lookup_min": 1, "prompt_lookup_max": 4}
        llm = engine(model, enable_prefix_caching=True, skip_tokenizer_init=True,
                     **({"speculative_config": spec} if q > 1 else {}), **options)
        try:
            out[str(q)] = timed_steps(llm, sizes, prompt, repeats, f"{label}, q={q}", q)
        finally:
            close(llm)
    for q, row in out.items():
        for b, r in row.items():
            one = out["1"][b]["ms"]
            r["measured_ms"] = r["ms"]
            if 1.05 < r["query"] < int(q) - 0.05:  # drafted at fewer steps than all
                r["ms"] = one + (r["measured_ms"] - one) * (int(q) - 1) / (r["query"] - 1)
    return out


def repeating_prompt(vocab: int | None = None, tokenizer=None) -> list[int]:
    """A prompt that repeats itself, one token past two of vLLM's CPU blocks (it caches whole blocks and
    recomputes a prompt's last token): a sentence the target will go on repeating (so that n-gram lookup
    drafts at every step), or random tokens for a model of random weights, which is only timed decoding."""
    if tokenizer is not None:
        ids = tokenizer("The quick brown fox jumps over the lazy dog. " * 40)["input_ids"]
    else:
        rng = random.Random(0)
        ids = [rng.randrange(vocab) for _ in range(PERIOD)] * REPEATS_IN_PROMPT * 2
    return ids[:PERIOD * REPEATS_IN_PROMPT + 1]


def step_ms(method: str, kind: str | None, b: int, k: int, target: dict, drafts: dict) -> float:
    """One step's ms for `method` at batch b by the formulas above (`kind`: its drafter's, or None)."""
    def t(q):
        return target[str(q)][str(b)]["ms"]

    def d(q):
        return drafts[method][str(q)][str(b)]["ms"]

    if method == "vanilla":
        return t(1)
    if kind is None:  # n-gram
        return t(k + 1)
    return t(k + 1) + (d(k + 1) + (k - 1) * d(1) if kind == "eagle3" else d(2 * k))


def draft_queries(kind: str, k: int) -> list[int]:
    """The tokens per request of each forward a drafter of `kind` runs in a step (the formulas above)."""
    return [1, k + 1] if kind == "eagle3" else [2 * k]


def limits(sweep: dict, target: dict, drafts: dict, kinds: dict) -> dict:
    """Per batch size and method: the step ms, the limit tokens/s (b * tau / step, with the call's measured
    prefill where the sweep has it) and the sweep's measured tokens/s against it (greedy)."""
    k, out = sweep["k"], {}
    for b, block in sweep["batches"].items():
        out[b] = {}
        for m, r in block["methods"].items():
            ms, tau = step_ms(m, kinds.get(m), int(b), k, target, drafts), r.get("tau") or 1.0
            limit = int(b) * tau / ms * 1e3
            if r.get("prefill_s") is not None:  # the prefill it measured, then its decode steps at the limit
                steps = (r["tokens"] - r["requests"]) / (int(b) * tau)
                limit = r["tokens"] / (r["prefill_s"] + steps * ms / 1e3)
            out[b][m] = {"step_ms": ms, "limit_tokens_per_s": limit, "tokens_per_s": r["tokens_per_s"],
                         "of_limit": r["tokens_per_s"] / limit, "prefill_s": r.get("prefill_s")}
    return out


def measure(sweep_file: str | Path, target_dir: str | None, settings, repeats: int) -> dict:
    """The whole run: the target's and each drafter's step costs at the sweep's batch sizes, and the limits."""
    import datetime

    import torch

    from fasteagle.bench.batches import layers_built
    from fasteagle.bench.timing import device_name
    from fasteagle.draftconfig import read_config
    from fasteagle.methods import canonical
    from fasteagle.vllm_engine import target_dir as resolve

    sweep = read_result(sweep_file)
    if "batches" not in sweep or "k" not in sweep:
        raise FastEagleError(f"{sweep_file} is not a vLLM batch sweep (bench --engine vllm --repeats)")
    sizes, k = sorted(int(b) for b in sweep["batches"]), sweep["k"]
    methods = list(next(iter(sweep["batches"].values()))["methods"])
    kinds = {m: canonical(m) for m in methods if m not in ("vanilla", "ngram")}
    from transformers import AutoTokenizer

    model = resolve(target_dir)
    target = costs_at(model, list(range(2, k + 2)), sizes, repeating_prompt(tokenizer=AutoTokenizer.from_pretrained(
        model)), repeats, "target")
    rows = {m: sorted({b * q for b in sizes for q in draft_queries(kind, k)}) for m, kind in kinds.items()}
    drafts, shapes, raw = {}, {}, {}
    with tempfile.TemporaryDirectory() as tmp:
        for m in kinds:
            cfg = read_config(settings.drafter_dir(m))[0]
            cfg = cfg | {"num_layers": layers_built(cfg["num_layers"], kinds[m] != "eagle3", k)}
            shapes[m] = {key: cfg.get(key) for key in ("width", "num_layers", "intermediate", "draft_vocab")}
            raw[m] = costs_at(str(shape_model(cfg, Path(tmp) / m)), [], rows[m],
                              repeating_prompt(shapes[m]["draft_vocab"] or cfg["vocab_size"]), repeats, m,
                              max_num_seqs=max(rows[m]))["1"]
        # an engine step with (next to) no model: what every drafter's timing paid besides its forward
        vocab = max(s["draft_vocab"] or 4096 for s in shapes.values()) if shapes else 4096
        tiny = {"width": 64, "intermediate": 64, "num_layers": 1, "num_heads": 1, "num_kv_heads": 1, "head_dim": 64,
                "draft_vocab": vocab, "rope_theta": 10000.0, "rms_norm_eps": 1e-5}
        every = sorted({n for r in rows.values() for n in r})
        empty = costs_at(str(shape_model(tiny, Path(tmp) / "empty")), [], every, repeating_prompt(vocab), repeats,
                         "empty model", max_num_seqs=max(every, default=1))["1"]
    for m, decode in raw.items():  # q tokens of b requests: the rows of a decode step of b*q requests, its step out
        drafts[m] = {str(q): {str(b): {"ms": decode[str(b * q)]["ms"] - empty[str(b * q)]["ms"],
                                       "step_ms": decode[str(b * q)]["ms"], "rows": b * q} for b in sizes}
                     for q in draft_queries(kinds[m], k)}
    return {"date": datetime.date.today().isoformat(), "device": device_name(torch.device("cpu")),
            "target_model": sweep.get("target"), "k": k, "sweep": str(sweep_file),
            "prompt_tokens": PERIOD * REPEATS_IN_PROMPT + 1, "decode_tokens": DECODE_TOKENS, "repeats": repeats,
            "target": target, "drafters": drafts, "empty": empty, "shapes": shapes, "kinds": kinds,
            "limits": limits(sweep, target, drafts, kinds)}


def markdown(doc: dict) -> str:
    """The step costs and each method's measured tokens/s against its limit, one row per batch size."""
    k, t = doc["k"], doc["target"]
    sizes = list(t["1"])
    names = list(next(iter(doc["limits"].values())))
    prefilled = any(r.get("prefill_s") is not None for row in doc["limits"].values() for r in row.values())
    prices = "its measured prefill, then b x tau per step" if prefilled else "b x tau / step"
    # before 2026-11-29 a probe decoded decode_tokens new tokens whatever q; since then that many steps
    span = "steps" if "steps" in next(iter(t["1"].values())) else "new tokens"
    head = (f"vLLM's steps on this CPU (ms, the fastest of {doc['repeats']} timings of {doc['decode_tokens']} {span} "
            f"after a {doc['prompt_tokens']}-token prompt; the drafters at their shapes) and each method's limit "
            f"({prices}), chains of {k}\n\n| batch | step, 1 token | step, {k + 1} tokens | "
            + " | ".join(f"{m} drafting" for m in doc["drafters"]) + " | "
            + " | ".join(f"{m}: measured / limit" for m in names) + " |\n")
    head += "|---" * (3 + len(doc["drafters"]) + len(names)) + "|\n"
    rows = []
    for b in sizes:
        drafting = [step_ms(m, doc["kinds"][m], int(b), k, t, doc["drafters"]) - t[str(k + 1)][b]["ms"]
                    for m in doc["drafters"]]
        lim = doc["limits"].get(b, {})
        rows.append(f"| {b} | {t['1'][b]['ms']:.1f} | {t[str(k + 1)][b]['ms']:.1f} | "
                    + " | ".join(f"{d:.1f}" for d in drafting) + " | "
                    + " | ".join(f"{r['tokens_per_s']:.1f} / {r['limit_tokens_per_s']:.1f} ({r['of_limit']:.0%})"
                                 for r in lim.values()) + " |")
    return head + "\n".join(rows) + "\n"
