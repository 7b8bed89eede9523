"""Verification: one target forward over every tree node, then the lossless acceptance rule.

Greedy: walk from the root while a child equals the target's argmax at its parent; the target's
argmax at the last accepted node is the bonus token. Sampling: at each reached node, try its
children in draft order, accept child x with probability p(x); on rejection zero p(x) and
renormalise; if every child fails (or there is none) sample the bonus from what is left. Each
candidate is a deterministic (one-hot) draft, so this is exact speculative sampling.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fasteagle.errors import FastEagleError
from fasteagle.kvcache import KVCache, attention_mask, limit_to_window
from fasteagle.target import attention_windows
from fasteagle.trace import ACCEPTED, NEVER_REACHED, REJECTED
from fasteagle.tree import DraftTree


@dataclass
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_p: float = 1.0

    def __post_init__(self):
        if not (math.isfinite(self.temperature) and self.temperature >= 0):
            raise FastEagleError(f"temperature must be a finite number >= 0 (got {self.temperature})")
        if not 0 < self.top_p <= 1:
            raise FastEagleError(f"top-p must be in (0, 1] (got {self.top_p})")

    @property
    def greedy(self) -> bool:
        return self.temperature <= 0


@dataclass
class Verdict:
    path: torch.Tensor  # node indices of the accepted path, root first
    bonus: int  # the target's own next token after the path
    status: torch.Tensor  # (T,) NEVER_REACHED / ACCEPTED / REJECTED per node (root: ACCEPTED)
    target_probs: torch.Tensor  # (T,) target probability of each node's token given its parent (root: 1)
    # what sampling drew (greedy: none of it): the uniform draw that judged each node (-1: none), whether
    # the bonus came from a residual after rejections, and the target's distribution at each reached node
    draws: list[float] | None = None
    bonus_kind: str = "bonus"
    dists: list[list] | None = None  # [node, top ids, their probs, the rest's mass] per reached node


DIST_TOP = 32  # tokens of the target's distribution a trace keeps per reached node (the rest as one mass)


def dist_record(node: int, p: torch.Tensor, k: int = DIST_TOP) -> list:
    """[node, ids, probs, rest]: the `k` most probable tokens of distribution `p` (1-D, on the CPU)."""
    top_p, top_i = p.topk(min(k, p.numel()))
    kept = [round(float(v), 6) for v in top_p]
    return [node, top_i.tolist(), kept, max(0.0, round(1.0 - float(top_p.sum()), 6))]


def tree_forward(model: torch.nn.Module, cache: KVCache, tree: DraftTree, feature_layers: tuple[int, ...] = ()):
    """Run the target over all tree nodes; returns logits (T, V) and hidden features (T, F) or None.

    The nodes are appended to the cache; the caller commits the accepted ones with `cache.keep`.
    """
    past = cache.length
    cache.reserve(tree.size)
    dtype = next(model.parameters()).dtype
    positions = tree.position_ids(past)
    out = model(
        input_ids=tree.tokens[None],
        attention_mask=tree_mask(model.config, tree.ancestors, past, positions[0], dtype),
        position_ids=positions,
        past_key_values=cache,
        use_cache=True,
        output_hidden_states=bool(feature_layers),
    )
    feats = torch.cat([out.hidden_states[i][0] for i in feature_layers], -1) if feature_layers else None
    return out.logits[0].float(), feats


def tree_mask(config, ancestors: torch.Tensor, past: int, positions: torch.Tensor, dtype: torch.dtype):
    """The tree's additive mask (`kvcache.attention_mask`), with the model's sliding window applied where
    it has one (rows at `positions`): for every layer, or, where only some layers slide, a mask per layer
    type as the model's forward takes them ({"full_attention": ..., "sliding_attention": ...})."""
    mask = attention_mask(ancestors, past, dtype)
    window, per_type = attention_windows(config)
    if not window:
        return mask
    if not per_type:  # every layer slides: the one mask, windowed in place
        return limit_to_window(mask, positions, window)
    return {"full_attention": mask, "sliding_attention": limit_to_window(mask.clone(), positions, window)}


def prefill_forward(model: torch.nn.Module, cache: KVCache, ids: torch.Tensor, feature_layers: tuple[int, ...] = ()):
    """The prompt `ids` (1-D) into an empty cache: the last position's logits (1, V) and every position's
    features (L, F) or None. Plain causal attention with no added (L, L) mask, and the LM head over the
    last position only: the head over every prompt token, which a tree forward computes, and the mask were
    a third of a long prompt's prefill."""
    if cache.length:
        raise ValueError("prefill_forward fills an empty cache")
    cache.reserve(ids.numel())
    out = model(input_ids=ids[None], position_ids=torch.arange(ids.numel(), device=ids.device)[None],
                past_key_values=cache, use_cache=True, output_hidden_states=bool(feature_layers), logits_to_keep=1)
    feats = torch.cat([out.hidden_states[i][0] for i in feature_layers], -1) if feature_layers else None
    return out.logits[0].float(), feats


def target_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """The distribution the target samples from: temperature, then nucleus (top-p) filtering."""
    if params.greedy:
        return torch.softmax(logits.float(), -1)
    probs = torch.softmax(logits.float() / params.temperature, -1)
    if params.top_p < 1.0:
        sorted_p, order = probs.sort(-1, descending=True)
        # keep the smallest prefix whose mass reaches top_p (the first token always stays)
        drop = (sorted_p.cumsum(-1) - sorted_p) >= params.top_p
        sorted_p = sorted_p.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, order, sorted_p)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def verify_greedy(logits: torch.Tensor, tree: DraftTree) -> Verdict:
    """Longest path whose every node equals the target's argmax at its parent, in tensor ops."""
    pred = logits.argmax(-1)  # (T,)
    parent = tree.parents.clamp(min=0)
    correct = tree.tokens == pred[parent]
    correct[0] = True
    accepted = (tree.ancestors & ~correct[None]).sum(1) == 0  # every ancestor-or-self is correct
    # siblings hold distinct tokens, so the accepted nodes form one path: take its deepest node
    last = torch.where(accepted, tree.depths, torch.full_like(tree.depths, -1)).argmax()
    path = tree.ancestors[last].nonzero().squeeze(1)  # ancestors in topological = depth order
    reached = accepted[parent] & (tree.parents >= 0)
    status = torch.where(accepted, ACCEPTED, torch.where(reached, REJECTED, NEVER_REACHED))
    probs = torch.softmax(logits.float(), -1)
    tp = probs[parent, tree.tokens]
    tp[0] = 1.0
    return Verdict(path=path, bonus=int(pred[last]), status=status, target_probs=tp)


def verify_sampling(logits: torch.Tensor, tree: DraftTree, params: SamplingParams,
                    generator: torch.Generator | None = None) -> Verdict:
    """Multi-candidate speculative sampling over the tree (exact: keeps the target's distribution).

    `generator` is a CPU generator: draws happen on the CPU so a seed means the same on any device.
    """
    probs = target_probs(logits, params)  # (T, V)
    parent = tree.parents.clamp(min=0)
    tp = probs[parent, tree.tokens]
    tp[0] = 1.0
    parents = tree.parents.tolist()
    tokens = tree.tokens.tolist()
    children: list[list[int]] = [[] for _ in tokens]
    for i, p in enumerate(parents[1:], start=1):
        children[p].append(i)
    status = [NEVER_REACHED] * len(tokens)
    status[0] = ACCEPTED
    draws, dists = [-1.0] * len(tokens), []
    path, node = [0], 0
    while True:
        p = probs[node].to("cpu", copy=True)  # one row per reached node; random draws stay on the CPU generator
        dists.append(dist_record(node, p))
        for child in children[node]:
            status[child] = REJECTED
        chosen = None
        for child in children[node]:
            x = tokens[child]
            u = float(torch.rand((), generator=generator))
            draws[child] = u
            if u < float(p[x]):
                chosen = child
                break
            p[x] = 0.0  # rejected: the residual is p without x, renormalised
            p = p / p.sum()
        if chosen is None:
            bonus = int(torch.multinomial(p, 1, generator=generator))
            kind = "resampled" if children[node] else "bonus"
            break
        status[chosen] = ACCEPTED
        path.append(chosen)
        node = chosen
    dev = tree.device
    return Verdict(path=torch.tensor(path, device=dev), bonus=bonus, status=torch.tensor(status, device=dev),
                   target_probs=tp, draws=draws, bonus_kind=kind, dists=dists)


def verify(logits: torch.Tensor, tree: DraftTree, params: SamplingParams,
           generator: torch.Generator | None = None) -> Verdict:
    if params.greedy:
        return verify_greedy(logits, tree)
    return verify_sampling(logits, tree, params, generator)
