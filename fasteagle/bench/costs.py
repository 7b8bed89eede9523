"""Costs of the two halves of a decode step, timed alone: one target forward over trees of growing
size (`verify_cost`, what decides the tree budget) and one draft step of each drafter at a model's
shape with random weights (`draft_step_cost`)."""

from __future__ import annotations

import statistics
import time

import torch
from tqdm.auto import tqdm

from fasteagle import packing
from fasteagle.bench.timing import device_name
from fasteagle.errors import FastEagleError
from fasteagle.generate import generate, synchronize
from fasteagle.kvcache import KVCache
from fasteagle.target import Target, default_device, parse_dtype
from fasteagle.tree import chain, path_tree
from fasteagle.verify import tree_forward


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


def draft_cost(target: Target, drafter, ids: torch.Tensor, budgets, seed: int = 0, tokens: int = 16) -> dict:
    """A drafter's step at each node budget on this device: the median `draft_ms` (draft and `extend`,
    the device synced after each, so a GPU drafter's kernels count even where a decode overlaps them)
    of a `tokens`-token decode of `ids` at that budget. The drafter's budget is left as it was."""
    before, out = drafter.tree_budget, {}
    try:
        for b in tqdm(sorted(set(budgets)), desc="draft cost", unit="budget"):
            drafter.tree_budget = b
            traces = list(generate(target, ids, drafter=drafter, max_new_tokens=tokens, seed=seed, stop_ids=set(),
                                   sync_phases=True))[1:]
            out[b] = round(statistics.median(t.draft_ms for t in traces), 3)
    finally:
        drafter.tree_budget = before
    return out


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
            fills = []
            for _ in range(3):  # the drafter's own prefill over the prompt: its first extend after a reset
                d.reset(prefix + accepted + 8)
                synchronize(dev)
                t0 = time.perf_counter()
                d.extend(ids[:prefix], feats[:prefix], int(ids[prefix]))
                synchronize(dev)
                fills.append((time.perf_counter() - t0) * 1e3)
            row[f"{kind}_prefill"] = round(statistics.median(fills[1:]), 2)  # the first is warmup
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
