"""Side-by-side measurement of decoding methods on a prompt set: tokens/s, speedup, tau,
per-depth acceptance, draft/verify time, and whether each output equals vanilla decoding."""

from __future__ import annotations

import json
import statistics
import time
from pathlib import Path

import torch
from tqdm.auto import tqdm

from fasteagle.generate import chat_prompt_ids, generate
from fasteagle.target import Target
from fasteagle.verify import SamplingParams


def load_prompts(path: str | Path, limit: int | None = None) -> list[dict]:
    """JSON lines with `turns` (first turn used), `prompt` or `text`; optional `category`."""
    rows = []
    for line in Path(path).read_text().splitlines():
        if not line.strip():
            continue
        d = json.loads(line)
        text = d["turns"][0] if "turns" in d else d.get("prompt") or d.get("text")
        rows.append({"id": d.get("id", str(len(rows))), "category": d.get("category", Path(path).stem), "text": text})
    return rows[:limit] if limit else rows


def time_one(target: Target, ids: torch.Tensor, drafter, max_new: int, sampling: SamplingParams, seed: int) -> dict:
    if target.device.type == "cuda":
        torch.cuda.synchronize()
    t0 = time.perf_counter()
    traces = list(generate(target, ids, drafter=drafter, max_new_tokens=max_new, sampling=sampling, seed=seed))
    if target.device.type == "cuda":
        torch.cuda.synchronize()
    wall = time.perf_counter() - t0
    tokens = [t for tr in traces for t in tr.tokens]
    steps = traces[1:]
    depth_acc = _depth_acceptance(steps)
    return {"tokens": tokens, "wall_s": wall, "n": len(tokens), "forwards": traces[-1].forwards,
            "tau": traces[-1].tau if traces[-1].forwards else 1.0,
            "draft_ms": statistics.fmean([s.draft_ms for s in steps]) if steps else 0.0,
            "verify_ms": statistics.fmean([s.verify_ms for s in steps]) if steps else 0.0,
            "depth_reached": depth_acc[0], "depth_accepted": depth_acc[1]}


def _depth_acceptance(steps) -> tuple[list[int], list[int]]:
    """Per depth: how often a step's accepted path reached depth d-1 (so depth d was tried), and
    how often depth d was accepted."""
    reached, accepted = [], []
    for s in steps:
        if not s.tree:
            continue
        depths = s.tree["depths"]
        maxd = max(depths)
        acc_len = len(s.path) - 1
        while len(reached) < maxd:
            reached.append(0)
            accepted.append(0)
        for d in range(1, min(acc_len + 1, maxd) + 1):
            reached[d - 1] += 1
            accepted[d - 1] += d <= acc_len
    return reached, accepted


def compare(target: Target, methods: dict, prompts: list[dict], max_new: int = 128,
            sampling: SamplingParams | None = None, seed: int = 0, warmup: int = 1) -> dict:
    """Run every method on every prompt, interleaved prompt by prompt; vanilla must be in `methods`."""
    sampling = sampling or SamplingParams()
    encoded = [chat_prompt_ids(target, p["text"]) for p in prompts]
    for ids in encoded[:warmup]:
        for drafter in methods.values():
            time_one(target, ids, drafter, 16, sampling, seed)
    rows = {name: [] for name in methods}
    for p, ids in zip(tqdm(prompts, desc="bench"), encoded):
        for name, drafter in methods.items():
            r = time_one(target, ids, drafter, max_new, sampling, seed)
            rows[name].append(r | {"id": p["id"], "category": p["category"]})
    return summarize(rows, sampling)


def summarize(rows: dict, sampling: SamplingParams) -> dict:
    vanilla = rows.get("vanilla")
    out = {}
    for name, rs in rows.items():
        tps = [r["n"] / r["wall_s"] for r in rs]
        s = {"tokens_per_s": sum(r["n"] for r in rs) / sum(r["wall_s"] for r in rs),
             "tokens_per_s_median": statistics.median(tps),
             "tau": sum(r["n"] - 1 for r in rs) / max(1, sum(r["forwards"] for r in rs)),
             "draft_ms": statistics.fmean(r["draft_ms"] for r in rs),
             "verify_ms": statistics.fmean(r["verify_ms"] for r in rs)}
        reached, accepted = _sum_ragged([r["depth_reached"] for r in rs]), _sum_ragged([r["depth_accepted"] for r in rs])
        s["depth_acceptance"] = [round(a / max(1, b), 3) for a, b in zip(accepted, reached)]
        if vanilla:
            s["speedup"] = s["tokens_per_s"] / (sum(r["n"] for r in vanilla) / sum(r["wall_s"] for r in vanilla))
            if sampling.greedy:
                s["identical_to_vanilla"] = sum(a["tokens"] == b["tokens"] for a, b in zip(rs, vanilla))
        s["prompts"] = len(rs)
        out[name] = s
    return out


def _sum_ragged(lists: list[list[int]]) -> list[int]:
    out = [0] * max((len(x) for x in lists), default=0)
    for x in lists:
        for i, v in enumerate(x):
            out[i] += v
    return out
