"""How fast each engine makes self-distillation data, on the same prompts:

    python -m fasteagle bench --engine vllm --distill-speed --prompts assets/prompts/tasks_holdout.jsonl \
        --limit 8 --max-new-tokens 192 --out bench/results/cpu-smollm2-135m-distill-speed-....json

The target's greedy replies to every prompt, once by our padded `generate` batches (`teacher.self_distill`,
what the data stage ran before) and once by vLLM's continuous batching (`fast_replies.vllm_replies`), both
fp32 with the same batch size, stop tokens and reply cut. Per engine: replies kept, reply tokens, seconds
(vLLM's start-up apart), replies per minute; and how many replies are token-identical between the two
(fp32 in both, but vLLM's CPU kernels sum in another order, so a near-tie can go the other way).
"""

from __future__ import annotations

import time


def distill_speed(target, target_name: str | None, prompts: list[list[int]], max_new: int, batch: int) -> dict:
    """Both engines' replies to `prompts` (token ids, chat template applied), timed; the result document."""
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
            "speedup": rows["vllm"]["replies_per_min"] / rows["ours"]["replies_per_min"]}


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
            "replies token-identical\n")
