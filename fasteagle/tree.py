"""Draft trees: which candidate tokens the target verifies in one forward, and how they connect.

Node 0 is the root: the last token the target itself produced, not yet in its KV cache. Every
other node is a drafted token whose parent precedes it (topological order). A node at depth d sits
at position prefix_len + d, and attends to the prefix and its own ancestors only.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from fasteagle.treeorder import product_order


@dataclass
class DraftTree:
    tokens: torch.Tensor  # (T,) long, node 0 = root
    parents: torch.Tensor  # (T,) long, -1 for the root
    depths: torch.Tensor  # (T,) long, 0 for the root
    draft_probs: torch.Tensor  # (T,) float: the drafter's probability of each node (1 for the root)
    sources: torch.Tensor  # (T,) long: drafter layer / step that produced the node (0 for the root)
    ancestors: torch.Tensor  # (T, T) bool: ancestors[i, j] = j is i or an ancestor of i

    @property
    def size(self) -> int:
        return self.tokens.shape[0]

    @property
    def device(self) -> torch.device:
        return self.tokens.device

    def position_ids(self, prefix_len: int) -> torch.Tensor:
        return (self.depths + prefix_len)[None]

    def to(self, device: torch.device | str) -> DraftTree:
        return DraftTree(*(getattr(self, f).to(device) for f in _FIELDS))

    def to_dict(self) -> dict:
        """Plain lists for JSON (the ancestor mask is derived, so it is not stored)."""
        return {f: getattr(self, f).tolist() for f in _FIELDS if f != "ancestors"}

    @classmethod
    def from_dict(cls, d: dict) -> DraftTree:
        return make_tree(torch.tensor(d["tokens"]), torch.tensor(d["parents"]),
                         torch.tensor(d["draft_probs"], dtype=torch.float32), torch.tensor(d["sources"]))


_FIELDS = ("tokens", "parents", "depths", "draft_probs", "sources", "ancestors")


def make_tree(tokens: torch.Tensor, parents: torch.Tensor, draft_probs: torch.Tensor | None = None,
              sources: torch.Tensor | None = None) -> DraftTree:
    """Derive depths and the ancestor mask from parent pointers with one tensor op per depth level."""
    t = tokens.shape[0]
    dev = tokens.device
    idx = torch.arange(t, device=dev)
    up = torch.where(parents < 0, idx, parents)  # the root points at itself
    ancestors = torch.zeros(t, t, dtype=torch.bool, device=dev)
    ancestors[idx, idx] = True
    depths = torch.zeros(t, dtype=torch.long, device=dev)
    cur = idx
    for _ in range(t - 1):  # at most max-depth iterations: stops once every walk reached the root
        nxt = up[cur]
        moved = nxt != cur
        if not bool(moved.any()):
            break
        ancestors[idx, nxt] = True
        depths += moved.long()
        cur = nxt
    if draft_probs is None:
        draft_probs = torch.ones(t, device=dev)
    if sources is None:
        sources = depths.clone()
    return DraftTree(tokens, parents, depths, draft_probs.float(), sources, ancestors)


def select(tree: DraftTree, keep: torch.Tensor) -> DraftTree:
    """The nodes where `keep` (T,) is true, in order, with parents renumbered; `keep` must hold
    every kept node's parent (e.g. every node up to some depth)."""
    idx = keep.nonzero().squeeze(1)
    new_index = keep.long().cumsum(0) - 1
    parents = tree.parents[idx]
    parents = torch.where(parents < 0, parents, new_index[parents.clamp(min=0)])
    return DraftTree(tree.tokens[idx], parents, tree.depths[idx], tree.draft_probs[idx], tree.sources[idx],
                     tree.ancestors[idx][:, idx])


def root_only(root: int, device: torch.device | str = "cpu") -> DraftTree:
    """The one-node tree of plain decoding."""
    return make_tree(torch.tensor([root], device=device), torch.tensor([-1], device=device))


def path_tree(tokens: torch.Tensor, probs: torch.Tensor | None = None) -> DraftTree:
    """A single path tokens[0] -> tokens[1] -> ... (tokens[0] is the root); built directly, since
    a prompt prefill is such a path with hundreds of nodes."""
    dev = tokens.device
    n = tokens.shape[0]
    depths = torch.arange(n, device=dev)
    p = torch.ones(n, device=dev) if probs is None else probs.float()
    ancestors = torch.ones(n, n, dtype=torch.bool, device=dev).tril()
    return DraftTree(tokens.long(), depths - 1, depths, p, depths.clone(), ancestors)


def chain(root: int, tokens: torch.Tensor, probs: torch.Tensor | None = None) -> DraftTree:
    """A single drafted path root -> tokens[0] -> tokens[1] -> ..."""
    dev = tokens.device
    all_tokens = torch.cat([torch.tensor([root], device=dev), tokens.long()])
    p = None if probs is None else torch.cat([torch.ones(1, device=dev), probs.float()])
    return path_tree(all_tokens, p)


def backbone(root: int, topk_ids: torch.Tensor, topk_probs: torch.Tensor, ks: list[int] | int,
             budget: int) -> DraftTree:
    """FastEagle's backbone expansion from per-depth top-k candidates (N, kmax).

    The top-1 of each depth continues the backbone; the other candidates of depth d are leaves
    under the depth d-1 backbone node (a depth's distribution does not depend on which sibling was
    taken, so nothing grows below a side leaf). With `budget` nodes in all (root included), the
    nodes kept are those most likely to be reached and accepted, P(backbone up to the parent) *
    p(node), backbone nodes and side leaves alike: a big budget keeps the whole backbone, a small
    one keeps as much backbone as pays (a deep backbone node a weak drafter rarely reaches is worth
    less than a second guess at depth 1). Scores fall along the backbone and a leaf never scores
    above its parent, so the kept set is a tree.
    """
    dev = topk_ids.device
    n_depth, kmax = topk_ids.shape
    ks_t = torch.as_tensor(per_depth_k(ks, n_depth, kmax), device=dev)
    reach = torch.cumprod(torch.cat([torch.ones(1, device=dev), topk_probs[:, 0].float()]), 0)[:n_depth]
    score = reach[:, None] * topk_probs.float()  # (N, kmax); column 0 is the backbone
    allowed = torch.arange(kmax, device=dev)[None] < ks_t[:, None]
    score = torch.where(allowed, score, torch.full_like(score, -1.0))
    keep = torch.zeros(n_depth, kmax, dtype=torch.bool, device=dev)
    n = max(0, min(budget - 1, int(allowed.sum())))
    if n:
        keep.view(-1)[score.view(-1).topk(n).indices] = True
    # Ties could keep a node without its parent: cut below the first depth whose backbone node is missing.
    depth = int(keep[:, 0].long().cumprod(0).sum())
    keep[depth + 1:] = False
    # Order nodes depth by depth, the backbone node first, then side leaves by probability.
    d_idx, c_idx = keep.nonzero(as_tuple=True)  # row-major: depth-major, column 0 (backbone) first
    count = keep.sum(1)
    # node id of each depth's backbone node
    first = torch.cumsum(torch.cat([torch.ones(1, device=dev, dtype=torch.long), count[:-1]]), 0)
    parent_of_depth = torch.cat([torch.zeros(1, device=dev, dtype=torch.long), first[:-1]])
    tokens = torch.cat([torch.tensor([root], device=dev), topk_ids[d_idx, c_idx].long()])
    parents = torch.cat([torch.tensor([-1], device=dev), parent_of_depth[d_idx]])
    probs = torch.cat([torch.ones(1, device=dev), topk_probs[d_idx, c_idx].float()])
    sources = torch.cat([torch.zeros(1, device=dev, dtype=torch.long), d_idx + 1])
    return make_tree(tokens, parents, probs, sources)


def product(root: int, topk_ids: torch.Tensor, topk_probs: torch.Tensor, ks: list[int] | int,
            budget: int) -> DraftTree:
    """Backbone expansion with growing side branches: the tree of the `budget - 1` most probable
    paths through per-depth top-k candidates (N, kmax), a path scored by the product of its nodes'
    draft probabilities.

    A depth's distribution is the same whichever sibling was taken above it, so the candidates
    below a side node are that depth's top-k again; a side branch worth more than a deep backbone
    node now continues instead of ending as a leaf. The top-1 spine still scores highest at every
    depth, so with nothing else worth its node this is `backbone`; at about 60 nodes it accepts
    more (docs/design.md, "The product tree by default").

    Found best first by `fasteagle.treeorder.product_order` (a heap, two pushes per kept node), the
    order the what-if model replays: plain Python on a few dozen numbers, because a tensor op per
    depth cost more than the search (docs/design.md, "A lean draft step"). Nodes come out depth by
    depth, the most probable first.
    """
    dev = topk_ids.device
    n_depth, kmax = topk_ids.shape
    k_at = per_depth_k(ks, n_depth, kmax)
    kept = product_order(topk_probs.float().tolist(), k_at, max(0, budget - 1))
    if not kept:
        return root_only(root, dev)
    ids, probs = topk_ids.tolist(), topk_probs.float().tolist()
    # depth by depth, the best first (a stable sort of the best-first order): parents precede children
    order = sorted(range(len(kept)), key=lambda i: kept[i][0])
    new_index = {0: 0} | {i + 1: j for j, i in enumerate(order, start=1)}
    return make_tree(torch.tensor([root] + [ids[kept[i][0]][kept[i][1]] for i in order], device=dev),
                     torch.tensor([-1] + [new_index[kept[i][2]] for i in order], device=dev),
                     torch.tensor([1.0] + [probs[kept[i][0]][kept[i][1]] for i in order], device=dev),
                     torch.tensor([0] + [kept[i][0] + 1 for i in order], device=dev))


def per_depth_k(ks: list[int] | int, n_depth: int, kmax: int | None = None) -> list[int]:
    """Candidates per depth, one int for all or one per depth (a shorter list drafts fewer depths),
    each at least 1 and at most `kmax`, the top-k's width."""
    k_at = [max(int(k), 1) for k in ([ks] * n_depth if isinstance(ks, int) else ks)[:n_depth]]
    return k_at if kmax is None else [min(k, kmax) for k in k_at]


def product_fits(ks: list[int] | int, n_depth: int, budget: int) -> bool:
    """Whether the top-k lists hold at least `budget - 1` paths, so `product_fixed` fills every node."""
    paths, total = 1, 0
    for k in per_depth_k(ks, n_depth):
        paths *= k
        total += min(paths, budget - 1)
    return budget >= 2 and total >= budget - 1


def product_fixed(root: torch.Tensor, topk_ids: torch.Tensor, topk_probs: torch.Tensor, ks: list[int] | int,
                  budget: int) -> DraftTree:
    """`product`'s tree (the same nodes, in the same order, ties aside) in fixed-shape tensor ops on
    the top-k's own device, `root` a one-element tensor there: no host round trip, so a CUDA graph
    builds it right after the draft step, and the target's forward is queued while the GPU drafts.
    Needs `product_fits`.

    Why it finds the same nodes: a child scores below its parent, so a node among the best
    `budget - 1` at depth d has its parent among the best at depth d-1. A beam of `budget - 1`
    paths per depth, each depth's best of (beam x top-k), thus holds every node `product` keeps;
    the best `budget - 1` of all the beams are those nodes. Scores are summed in float64, as the
    host's are.
    """
    dev = topk_ids.device
    n_depth, kmax = topk_ids.shape
    w = budget - 1
    k_at = per_depth_k(ks, n_depth, kmax)
    col = torch.arange(kmax, device=dev)
    logp = topk_probs.double().clamp_min(1e-30).log()
    logp = logp.masked_fill(torch.stack([col >= k for k in k_at]), -math.inf)
    slots = torch.arange(w, device=dev)
    beam = torch.where(slots == 0, 0.0, -math.inf).double()  # the root's path: the only one at depth 1
    scores, parents, cands = [], [], []
    for d in range(n_depth):
        s, i = (beam[:, None] + logp[d][None, :]).view(-1).topk(w)
        scores.append(s - (d + 1) * 1e-6)  # as `product`: a certain child still ranks below its parent
        parents.append(i // kmax)
        cands.append(i % kmax)
        beam = s
    flat = torch.stack(scores).view(-1).topk(w).indices  # best first
    depth = flat // w
    # depth by depth, the best first within a depth: a top-k of distinct keys, not a sort, since the draft
    # step's graph already captures top-k, while some sort kernels (CUB's stable sort) refuse capture
    order = (-(depth * w + slots)).topk(w).indices
    flat, depth = flat[order], depth[order]
    cand = torch.stack(cands).view(-1)[flat]
    node_of = torch.zeros(n_depth * w, dtype=torch.long, device=dev).scatter(0, flat, slots + 1)  # entry -> node
    above = (depth - 1).clamp(min=0) * w + torch.stack(parents).view(-1)[flat]
    parent = torch.where(depth == 0, 0, node_of[above])
    zero = torch.zeros(1, dtype=torch.long, device=dev)
    tokens = torch.cat([root.view(1).long(), topk_ids[depth, cand].long()])
    probs = torch.cat([torch.ones(1, device=dev), topk_probs[depth, cand].float()])
    depths = torch.cat([zero, depth + 1])
    up = torch.cat([zero, parent])  # the root points at itself
    idx = torch.arange(budget, device=dev)
    ancestors, cur = idx[:, None] == idx[None, :], idx
    for _ in range(n_depth):  # elementwise: no indexed writes (nor Python-scalar ones) in the graph
        cur = up[cur]
        ancestors = ancestors | (idx[None, :] == cur[:, None])
    return DraftTree(tokens, torch.cat([zero - 1, parent]), depths, probs, depths.clone(), ancestors)


TREE_BUILDERS = {"product": product, "backbone": backbone}  # FastEagle's tree shapes, the default first
TREE_SHAPES = tuple(TREE_BUILDERS)
DEFAULT_TREE_SHAPE = TREE_SHAPES[0]


def dynamic(root: int, tokens: torch.Tensor, parents: torch.Tensor, scores: torch.Tensor, probs: torch.Tensor,
            depths: torch.Tensor, total_tokens: int) -> DraftTree:
    """EAGLE-2's global rerank: keep the `total_tokens - 1` candidates with the best cumulative
    log-probability. Candidates come in expansion order (a parent precedes its children; parent
    -1 is the root), and a child scores strictly below its parent, so the kept set is closed
    under ancestors and stays in topological order."""
    dev = tokens.device
    n = min(total_tokens - 1, tokens.shape[0])
    keep = scores.topk(n).indices.sort().values
    new_index = torch.full((tokens.shape[0],), -1, dtype=torch.long, device=dev)
    new_index[keep] = torch.arange(1, n + 1, device=dev)
    kept_parents = torch.where(parents[keep] < 0, torch.zeros_like(keep), new_index[parents[keep].clamp_min(0)])
    return make_tree(torch.cat([torch.tensor([root], device=dev), tokens[keep].long()]),
                     torch.cat([torch.tensor([-1], device=dev), kept_parents]),
                     torch.cat([torch.ones(1, device=dev), probs[keep].float()]),
                     torch.cat([torch.zeros(1, dtype=torch.long, device=dev), depths[keep]]))


def merge(a: DraftTree, b: DraftTree, source: int = -1) -> DraftTree:
    """The union of two trees with the same root, as a trie: a path of `b` that `a` already holds
    adds nothing, the rest is appended below its deepest shared node. Siblings keep distinct tokens
    (which greedy and sampling verification both need) and `a`'s nodes keep their indices. `b`'s
    new nodes get `source` as their source, so a picture can tell the two drafters apart.

    Built on the host and moved to `a`'s device once: on a GPU, the merged tree's ancestor mask
    would otherwise cost a host sync per depth."""
    if b.size <= 1:  # nothing to add: `a` untouched, not even read (on a GPU, a read waits for its drafting)
        return a
    tokens = a.tokens.tolist()
    if a.size and tokens[0] != int(b.tokens[0]):
        raise ValueError("trees to merge must share their root token")
    parents, probs, sources = a.parents.tolist(), a.draft_probs.tolist(), a.sources.tolist()
    child = {(p, tok): i for i, (p, tok) in enumerate(zip(parents, tokens))}  # (parent, token) -> node
    where = [0] * b.size  # b's node -> merged node
    for j, (p, tok, pr) in enumerate(zip(b.parents.tolist()[1:], b.tokens.tolist()[1:], b.draft_probs.tolist()[1:]),
                                     start=1):
        key = (where[p], tok)
        if key not in child:
            child[key] = len(tokens)
            tokens.append(tok)
            parents.append(where[p])
            probs.append(pr)
            sources.append(source)
        where[j] = child[key]
    if len(tokens) == a.size:
        return a
    return make_tree(torch.tensor(tokens), torch.tensor(parents), torch.tensor(probs),
                     torch.tensor(sources)).to(a.device)
