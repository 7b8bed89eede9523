"""Timing decodes: one prompt with one method (`time_one`), every method on every prompt
interleaved (`compare`), and the name of the device that ran them."""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable

import torch
from tqdm.auto import tqdm

from fasteagle import trace
from fasteagle.generate import chat_prompt_ids, generate, synchronize
from fasteagle.target import Target
from fasteagle.verify import SamplingParams

HF_METHODS = ("hf-generate", "hf-prompt-lookup")


def time_one(target: Target, ids: torch.Tensor, method: str, drafter, max_new: int, sampling: SamplingParams,
             seed: int, stop: bool = True, replay: bool = False) -> dict:
    """Decode one prompt with one method and measure it (`stop`=False: all `max_new` tokens, stop
    tokens or not, as a warmup wants; `replay`: keep the steps as the what-if model reads them, under
    `replay`, read after the clock stopped)."""
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
    steps = trace.decode_steps(traces)
    reached, accepted = trace.depth_counts(steps)
    below_judged, below_accepted = trace.below_counts(steps)
    return {"tokens": [t for tr in traces for t in tr.tokens], "wall_s": wall, "forwards": traces[-1].forwards,
            "steps": len(steps), "prefill_ms": traces[0].verify_ms + traces[0].draft_ms,  # target's + drafter's
            "drafter_prefill_ms": traces[0].draft_ms,
            "draft_ms": statistics.fmean([s.draft_ms for s in steps]) if steps else 0.0,
            "verify_ms": statistics.fmean([s.verify_ms for s in steps]) if steps else 0.0,
            "accepted_lengths": trace.step_lengths(steps),  # the schema's name: tokens per step, bonus included
            "depth_reached": reached, "depth_accepted": accepted, "below_judged": below_judged,
            "below_accepted": below_accepted, "peak_mb": _peak_mb(dev),
            "tree_size": statistics.fmean(len(s.tree["tokens"]) for s in steps) if steps else 1.0,
            "replay": _replay(traces, drafter) if replay and steps else None}


def _replay(traces: list, drafter):
    """The what-if model's reading of a decode (None where it cannot read it: the error says why, and
    `bench --what-if` reports the method as unreplayed)."""
    from fasteagle import whatif

    try:
        return whatif.replay(traces, drafter.tree_shape, drafter.tree_k, drafter.tree_budget)
    except whatif.WhatIfError:
        return None


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


def compare(target: Target, methods: dict, prompts: list[dict], max_new: int = 128,
            sampling: SamplingParams | None = None, seed: int = 0, warmup: int = 1,
            on_prompt: Callable[[dict], None] | None = None, repeats: int = 1, replay: frozenset = frozenset()) -> dict:
    """Run every method on every prompt, interleaved prompt by prompt. `methods`: name -> drafter
    (None for vanilla and the hf-* methods). Returns the per-prompt rows by method. With `repeats`, each
    prompt is decoded that many times by every method in turn, and its row keeps the first decode with
    the median wall time (`wall_s_runs`: every run's). `on_prompt(rows)` runs after each prompt (every
    method then has as many rows), so a run cut short by a time limit can still keep what it measured.
    The methods in `replay` keep their steps for the what-if model (`time_one`)."""
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
        runs = {name: [] for name in names}
        for _ in range(repeats):
            for name in names[i % len(names):] + names[:i % len(names)]:  # each method goes first in turn
                runs[name].append(time_one(target, ids, name, methods[name], max_new, sampling, seed,
                                           replay=name in replay))
        for name, rs in runs.items():
            walls = [r["wall_s"] for r in rs]
            extra = {"wall_s": statistics.median(walls), "wall_s_runs": walls} if repeats > 1 else {}
            rows[name].append(rs[0] | extra | {"id": p["id"], "category": p["category"]})
        if on_prompt is not None:
            on_prompt(rows)
    return rows


def device_name(dev: torch.device) -> str:
    """The device as results name it: CPU timings differ by model and vector ISA (AVX2 vs AVX-512
    changes what a tree forward costs against one decode step), so both are recorded. A GPU's name
    comes with its host's CPU: a small target is bound by how fast that CPU launches kernels, so
    speedups move with it (docs/results.md, "How we measure")."""
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
