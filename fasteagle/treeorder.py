"""The order in which FastEagle's tree builders take nodes from per-depth candidate lists, in plain
Python: `fasteagle.tree.product` builds its tree from `product_order`, and the what-if model
(`fasteagle.whatif`) replays any budget from both orders without torch. A node is (depth index, rank
among its depth's candidates, its parent's position in the order + 1, 0 for the root)."""

from __future__ import annotations

import heapq
import math


def product_order(probs: list[list[float]], k_at: list[int], n: int) -> list[tuple[int, int, int]]:
    """The first `n` nodes `fasteagle.tree.product` keeps, best first: (depth index, rank among the
    depth's candidates, parent's position in this list + 1, 0 for the root). `probs[d]` are depth d's
    candidate probabilities, best first; depth d offers `k_at[d]` of them. A path scores the sum of its
    nodes' log-probabilities less 1e-6 per depth, so a child, even a certain one, ranks below its
    parent. A heap holds, for each kept node, its best child not yet taken and its next sibling."""
    k_at = [min(k, len(p)) for k, p in zip(k_at, probs)]
    if n <= 0 or not k_at or k_at[0] < 1:
        return []
    logp = [[math.log(max(p, 1e-30)) for p in row[:k]] for row, k in zip(probs, k_at)]
    heap = [(-(logp[0][0] - 1e-6), 0, 0, 0, 0.0)]  # (-score, depth index, parent, rank, parent's sum)
    kept: list[tuple[int, int, int]] = []
    while heap and len(kept) < n:
        _, d, parent, r, parent_sum = heapq.heappop(heap)
        kept.append((d, r, parent))
        node = len(kept)
        if r + 1 < k_at[d]:
            heapq.heappush(heap, (-(parent_sum + logp[d][r + 1] - (d + 1) * 1e-6), d, parent, r + 1, parent_sum))
        if d + 1 < len(k_at) and k_at[d + 1]:
            s = parent_sum + logp[d][r]
            heapq.heappush(heap, (-(s + logp[d + 1][0] - (d + 2) * 1e-6), d + 1, node, 0, s))
    return kept


def backbone_order(probs: list[list[float]], k_at: list[int], n: int) -> list[tuple[int, int, int]]:
    """The first `n` nodes `fasteagle.tree.backbone` keeps, best first, as `product_order` gives them:
    the top-1 of each depth continues the backbone, the others are leaves under the backbone node above,
    each scored by the chance of reaching its parent times its own probability."""
    k_at = [min(k, len(p)) for k, p in zip(k_at, probs)]
    cands, reach = [], 1.0
    for d, (row, k) in enumerate(zip(probs, k_at)):
        cands += [(-(reach * row[r]), d, r) for r in range(k)]
        reach *= row[0] if k else 0.0
    cands.sort()
    kept, backbone_at = [], {}  # backbone_at: depth index -> its backbone node's position + 1
    for _, d, r in cands[:max(n, 0)]:
        if d and d - 1 not in backbone_at:  # a tie kept a node without its parent: the tree ends above it
            break
        kept.append((d, r, backbone_at.get(d - 1, 0)))
        if r == 0:
            backbone_at[d] = len(kept)
    return kept


ORDERS = {"product": product_order, "backbone": backbone_order}
SHAPES = tuple(ORDERS)  # `fasteagle.tree.TREE_BUILDERS`' keys
