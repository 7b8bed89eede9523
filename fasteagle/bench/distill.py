"""How fast each engine makes self-distillation data, on the same prompts:

    python -m fasteagle bench --engine vllm --distill-speed --prompts assets/prompts/tasks_holdout.jsonl \
        --limit 8 --max-new-tokens 192 --out bench/results/cpu-smollm2-135m-distill-speed-....json

The target's greedy replies to every prompt, once by our padded `generate` batches (`teacher.self_distill`,
what the data stage ran before) and once by vLLM's continuous batching (`fast_replies.vllm_replies`), both
fp32 with the same batch size, stop tokens and reply cut. Per engine: replies kept, reply tokens, seconds
(vLLM's start-up apart), replies per minute; and how many replies are token-identical between the two
(fp32 in both, but vLLM's CPU kernels sum in another order, so a near-tie can go the other way).

Then the other half of a data stage: the teacher's features over vLLM's replies (`teacher.cache_features`,
the target's pass over prompt and reply into fp16 shards), once over whole rows and once keeping each
row's last `keep_prompt` prompt tokens (`prompt_window`): seconds, positions written, shard bytes.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from fasteagle.train.config import TrainConfig

BATCH_TOKENS = TrainConfig.batch_tokens  # the default shard size, what the recipes' data stages write
KEEP_PROMPT = TrainConfig.keep_prompt


def distill_speed(target, target_name: str | None, prompts: list[list[int]], max_new: int, batch: int) -> dict:
    """Both engines' replies to `prompts` (token ids, chat template applied), timed, then the teacher's features
    over vLLM's replies, whole and windowed; the result document."""
    from fasteagle.train.fast_replies import vllm_replies
    from fasteagle.train.teacher import self_distill

    timing: dict = {}
    theirs = vllm_replies(target_name, target.tokenizer, prompts, max_new, batch, sample_every=0, timing=timing)
    start = time.monotonic()
    ours = self_distill(target.model, target.tokenizer, prompts, max_new, batch, sample_every=0)
    ours_s = time.monotonic() - start
    rows = {"ours": _rate(ours, ours_s) | {"engine": "ours (transformers generate, padded batches)"},
            "vllm": _rate(theirs, timing["generate_s"]) | {"engine": theirs["engine"], "load_s": timing["load_s"]}}
    a, b = dict(zip(ours["ids"], ours["input_ids"])), dict(zip(theirs["ids"], theirs["input_ids"]))
    both = sorted(a.keys() & b.keys())
    return {"distill_speed": True, "prompts": len(prompts), "max_new_tokens": max_new, "batch": batch, "engines": rows,
            "identical": sum(a[i] == b[i] for i in both), "compared": len(both),
            "speedup": rows["vllm"]["replies_per_min"] / rows["ours"]["replies_per_min"],
            "features": features_speed(target, theirs)}


def features_speed(target, data: dict) -> dict:
    """The teacher's feature shards over `data` (a token dataset), whole rows and then windowed, timed."""
    from fasteagle.draftconfig import DrafterConfig
    from fasteagle.train.teacher import cache_features

    layers = DrafterConfig.for_target(target.model, target.name).feature_layers  # a drafter's, by default
    out = {"batch_tokens": BATCH_TOKENS, "keep_prompt": KEEP_PROMPT,
           "read": sum(len(s) for s in data["input_ids"]), "reply_tokens": sum(sum(m) for m in data["loss_mask"])}
    for name, keep in (("whole", None), ("window", KEEP_PROMPT)):
        with tempfile.TemporaryDirectory() as d:
            start = time.monotonic()
            cache_features(target.model, data, d, layers, BATCH_TOKENS, keep_prompt=keep)
            seconds = time.monotonic() - start
            shards = sorted(Path(d).glob("shard-*.pt"))
            written = sum(_positions(p) for p in shards)
            out[name] = {"seconds": seconds, "positions": written, "mb": sum(p.stat().st_size for p in shards) / 2**20,
                         "read_per_s": out["read"] / seconds}
    out["speedup"] = out["whole"]["seconds"] / out["window"]["seconds"]
    return out


def _positions(shard: Path) -> int:
    """Token positions a shard stores, padding included (what a training step reads)."""
    import torch

    return torch.load(shard, weights_only=True, mmap=True)["input_ids"].numel()


def _rate(data: dict, seconds: float) -> dict:
    """Replies, reply tokens and their rates for one engine's dataset made in `seconds`."""
    replies, tokens = len(data["ids"]), sum(sum(m) for m in data["loss_mask"])
    return {"replies": replies, "reply_tokens": tokens, "seconds": seconds, "replies_per_min": replies / seconds * 60,
            "tokens_per_s": tokens / seconds}


def markdown(doc: dict) -> str:
    """The two engines side by side."""
    rows = "".join(f"| {name} | {r['replies']} | {r['reply_tokens']} | {r['seconds']:.0f} | {r['replies_per_min']:.1f} "
                   f"| {r['tokens_per_s']:.1f} |\n" for name, r in doc["engines"].items())
    return (f"Self-distillation on {doc['prompts']} prompts (greedy, up to {doc['max_new_tokens']} new tokens, batches "
            f"of {doc['batch']}); vLLM's start-up ({doc['engines']['vllm']['load_s']:.0f} s) apart\n\n"
            "| engine | replies | reply tokens | seconds | replies/min | tokens/s |\n|---|---|---|---|---|---|\n"
            + rows + f"\nvLLM {doc['speedup']:.1f}x the replies per minute; {doc['identical']} of {doc['compared']} "
            "replies token-identical\n" + (_features_table(doc["features"]) if "features" in doc else ""))


def _features_table(f: dict) -> str:
    """The teacher's pass over vLLM's replies: whole rows against the prompt window."""
    names = {"whole": "whole rows", "window": f"last {f['keep_prompt']} prompt tokens and the reply"}
    rows = "".join(f"| {names[k]} | {f[k]['seconds']:.0f} | {f[k]['read_per_s']:.0f} | {f[k]['positions']} "
                   f"| {f[k]['mb']:.0f} |\n" for k in ("whole", "window"))
    return (f"\nThe teacher's features over vLLM's replies ({f['read']} tokens read, {f['reply_tokens']} of them "
            f"reply; shards of {f['batch_tokens']} tokens)\n\n"
            "| shard rows keep | seconds | tokens read/s | positions written | shard MB |\n|---|---|---|---|---|\n"
            + rows + f"\nThe window {f['speedup']:.1f}x faster, with "
            f"{f['whole']['positions'] / f['window']['positions']:.1f}x fewer positions for training to read\n")
