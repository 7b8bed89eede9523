"""fasteagle.tree: parent pointers -> depths / ancestor masks / position ids, chains, backbone and product trees."""

from __future__ import annotations

import json

import pytest
import torch

from fasteagle.tree import (
    DraftTree,
    backbone,
    chain,
    dynamic,
    make_tree,
    merge,
    path_tree,
    product,
    product_fits,
    product_fixed,
    root_only,
    select,
)
from tests.drafters import one_thread

_one_thread = pytest.fixture(autouse=True, scope="module")(one_thread)


def random_parents(n: int, gen: torch.Generator, max_fanout_bias: float = 0.5) -> torch.Tensor:
    """Random topologically ordered parent pointers: node i's parent is some j < i."""
    parents = [-1]
    for i in range(1, n):
        if float(torch.rand((), generator=gen)) < max_fanout_bias:
            parents.append(i - 1)  # deepen
        else:
            parents.append(int(torch.randint(0, i, (), generator=gen)))
    return torch.tensor(parents)


def brute_ancestors(parents: list[int]) -> tuple[list[list[bool]], list[int]]:
    n = len(parents)
    anc = [[False] * n for _ in range(n)]
    depths = []
    for i in range(n):
        j, d = i, 0
        anc[i][i] = True
        while parents[j] >= 0:
            j = parents[j]
            anc[i][j] = True
            d += 1
        depths.append(d)
    return anc, depths


def assert_same_tree(a: DraftTree, b: DraftTree) -> None:
    for f in ("tokens", "parents", "depths", "draft_probs", "sources", "ancestors"):
        x, y = getattr(a, f), getattr(b, f)
        assert x.dtype == y.dtype, f
        assert torch.equal(x, y), f


# -- make_tree: depths, ancestors, position ids -------------------------------------------------

def test_make_tree_hand_made():
    #        0
    #      / | \
    #     1  2  3
    #    / \     \
    #   4   5     6
    #   |
    #   7
    parents = torch.tensor([-1, 0, 0, 0, 1, 1, 3, 4])
    tree = make_tree(torch.arange(10, 18), parents)
    assert tree.depths.tolist() == [0, 1, 1, 1, 2, 2, 2, 3]
    assert tree.ancestors[7].nonzero().squeeze(1).tolist() == [0, 1, 4, 7]
    assert tree.ancestors[6].nonzero().squeeze(1).tolist() == [0, 3, 6]
    assert tree.ancestors[0].nonzero().squeeze(1).tolist() == [0]
    assert tree.ancestors[:, 0].all()  # everything descends from the root
    assert tree.position_ids(100).tolist() == [[100, 101, 101, 101, 102, 102, 102, 103]]
    assert tree.draft_probs.tolist() == [1.0] * 8 and tree.sources.tolist() == tree.depths.tolist()
    assert tree.size == 8


@pytest.mark.parametrize("seed", range(12))
def test_make_tree_matches_brute_force(seed):
    gen = torch.Generator().manual_seed(seed)
    n = int(torch.randint(1, 70, (), generator=gen))
    parents = random_parents(n, gen, max_fanout_bias=float(torch.rand((), generator=gen)))
    tree = make_tree(torch.randint(0, 320, (n,), generator=gen), parents)
    anc, depths = brute_ancestors(parents.tolist())
    assert tree.ancestors.dtype == torch.bool
    assert tree.ancestors.tolist() == anc
    assert tree.depths.tolist() == depths
    prefix = int(torch.randint(0, 500, (), generator=gen))
    assert tree.position_ids(prefix).tolist() == [[prefix + d for d in depths]]
    assert tree.position_ids(prefix).shape == (1, n)


def test_position_ids_are_depth_not_index():
    # a wide tree: node index and depth disagree almost everywhere
    tree = make_tree(torch.arange(6), torch.tensor([-1, 0, 0, 0, 0, 4]))
    assert tree.position_ids(7).tolist() == [[7, 8, 8, 8, 8, 9]]


def test_select_renumbers_parents_and_keeps_the_mask():
    # root 0; 1 and 2 under it; 3 under 1; 4 under 2; 5 under 3; keep depth <= 1 and node 4's branch
    tree = make_tree(torch.tensor([10, 11, 12, 13, 14, 15]), torch.tensor([-1, 0, 0, 1, 2, 3]),
                     torch.tensor([1.0, 0.5, 0.4, 0.3, 0.2, 0.1]), torch.tensor([0, 1, 1, 2, 2, 3]))
    sub = select(tree, torch.tensor([True, True, True, False, True, False]))
    assert sub.tokens.tolist() == [10, 11, 12, 14] and sub.parents.tolist() == [-1, 0, 0, 2]
    assert sub.depths.tolist() == [0, 1, 1, 2] and sub.sources.tolist() == [0, 1, 1, 2]
    assert torch.allclose(sub.draft_probs, torch.tensor([1.0, 0.5, 0.4, 0.2]))
    ref = make_tree(sub.tokens, sub.parents)
    assert torch.equal(sub.ancestors, ref.ancestors)


def test_root_only():
    tree = root_only(42)
    assert tree.tokens.tolist() == [42] and tree.parents.tolist() == [-1] and tree.depths.tolist() == [0]
    assert tree.ancestors.tolist() == [[True]]


@pytest.mark.parametrize("n", [1, 2, 9, 300])
def test_path_tree_equals_make_tree(n):
    toks = torch.arange(n) + 4
    probs = torch.rand(n)
    a = path_tree(toks, probs)
    b = make_tree(toks, torch.arange(n) - 1, probs, torch.arange(n))
    assert_same_tree(a, b)
    assert torch.equal(a.ancestors, torch.ones(n, n, dtype=torch.bool).tril())


def test_chain():
    tree = chain(7, torch.tensor([11, 12, 13]), torch.tensor([0.5, 0.25, 0.125]))
    assert tree.tokens.tolist() == [7, 11, 12, 13]
    assert tree.parents.tolist() == [-1, 0, 1, 2]
    assert tree.depths.tolist() == [0, 1, 2, 3]
    assert tree.draft_probs.tolist() == [1.0, 0.5, 0.25, 0.125]
    assert tree.position_ids(5).tolist() == [[5, 6, 7, 8]]
    assert chain(7, torch.tensor([11])).draft_probs.tolist() == [1.0, 1.0]


# -- backbone ---------------------------------------------------------------------------------

def _topk(n_depth: int, kmax: int, seed: int, vocab: int = 320):
    gen = torch.Generator().manual_seed(seed)
    probs = torch.softmax(torch.randn(n_depth, vocab, generator=gen) * 2.5, -1)
    top_p, top_i = probs.topk(kmax, -1)
    return top_i, top_p


def check_backbone(tree: DraftTree, root: int, ids: torch.Tensor, probs: torch.Tensor, ks, budget: int):
    n_depth, kmax = ids.shape
    ks = [ks] * n_depth if isinstance(ks, int) else list(ks)
    ks = [max(1, min(k, kmax)) for k in ks]
    assert tree.tokens[0] == root and tree.parents[0] == -1
    assert tree.size <= budget or budget < 1
    # the nodes kept: the best budget-1 candidates by P(backbone reaches the parent) * p(node)
    reach = torch.cumprod(torch.cat([torch.ones(1), probs[:, 0]]), 0)
    scores = sorted(((float(reach[d] * probs[d, c]), d, c) for d in range(n_depth) for c in range(ks[d])),
                    reverse=True)
    want = {(d, c) for _, d, c in scores[:max(budget - 1, 0)]}
    depth = sum(1 for d in range(n_depth) if (d, 0) in want)
    assert all((d, 0) in want for d in range(depth)), "the kept backbone is unbroken"
    # the spine: the first node of each depth is that depth's top-1, child of the previous spine node
    spine = [0]
    for d in range(1, min(depth + 1, n_depth) + 1):
        at_d = (tree.depths == d).nonzero().squeeze(1).tolist()
        assert at_d or d == depth + 1, f"depth {d} missing"
        if d <= depth:
            s = at_d[0]
            assert tree.tokens[s] == ids[d - 1, 0] and tree.parents[s] == spine[-1]
            assert tree.draft_probs[s] == probs[d - 1, 0]
            spine.append(s)
        # every other node at depth d is a side leaf under the previous spine node, drafted from depth d's top-k
        col = {int(t): c for c, t in enumerate(ids[d - 1].tolist())}
        assert len(at_d) <= ks[d - 1]
        cols = []
        for i in at_d[1 if d <= depth else 0:]:
            assert tree.parents[i] == spine[d - 1]
            c = col[int(tree.tokens[i])]
            assert 0 < c < ks[d - 1]
            assert tree.draft_probs[i] == probs[d - 1, c]
            cols.append(c)
        assert cols == sorted(cols), "side leaves in probability order"
    assert int(tree.depths.max()) in (depth, depth + 1)  # side leaves may sit one below the last backbone node
    side = [i for i in range(1, tree.size) if i not in spine]
    parents_of_anything = set(tree.parents.tolist())
    assert not any(i in parents_of_anything for i in side), "side leaves must be leaves"
    assert tree.sources.tolist() == tree.depths.tolist()
    # the budget is filled when there are enough candidates, with exactly the best ones
    assert tree.size == 1 + min(max(budget - 1, 0), sum(ks))
    kept = {(int(tree.depths[i]) - 1, {int(t): c for c, t in enumerate(ids[int(tree.depths[i]) - 1].tolist())}
             [int(tree.tokens[i])]) for i in range(1, tree.size)}
    assert kept == want
    return spine, side


@pytest.mark.parametrize("n_depth,ks,budget", [
    (1, 10, 11), (1, 10, 4), (3, 1, 64), (4, [4, 3, 2, 1], 10), (6, 4, 16), (8, 10, 64),
    (5, 10, 64), (8, 10, 5), (8, 10, 9), (8, [10, 8, 6, 4, 3, 2, 2, 1], 30), (8, [1, 5, 1, 5, 1, 5, 1, 5], 20),
    (6, 10, 1), (6, 10, 2), (2, 12, 64),
])
def test_backbone_shape(n_depth, ks, budget):
    kmax = ks if isinstance(ks, int) else max(ks)
    for seed in range(3):
        ids, probs = _topk(n_depth, kmax, seed)
        tree = backbone(5, ids, probs, ks, budget)
        check_backbone(tree, 5, ids, probs, ks, budget)


def test_backbone_hand_made():
    ids = torch.tensor([[10, 11, 12], [20, 21, 22], [30, 31, 32]])
    probs = torch.tensor([[0.5, 0.3, 0.1], [0.9, 0.05, 0.01], [0.6, 0.2, 0.1]])
    tree = backbone(1, ids, probs, 3, budget=6)
    # spine 10 -> 20 -> 30; side scores: depth1 0.3, 0.1; depth2 0.5*0.05=.025; depth3 .45*.2=.09
    assert tree.tokens.tolist() == [1, 10, 11, 12, 20, 30]
    assert tree.parents.tolist() == [-1, 0, 0, 0, 1, 4]
    assert tree.depths.tolist() == [0, 1, 1, 1, 2, 3]
    tree = backbone(1, ids, probs, [2, 3, 3], budget=6)  # depth 1 may only keep its top-2
    assert tree.tokens.tolist() == [1, 10, 11, 20, 30, 31]
    assert tree.parents.tolist() == [-1, 0, 0, 1, 3, 3]
    assert backbone(1, ids, probs, 3, budget=3).tokens.tolist() == [1, 10, 20]  # budget cuts the spine
    # a weak backbone: a second and third guess at depth 1 (0.25, 0.2) beat backbone depth 2 (0.3 * 0.5)
    probs = torch.tensor([[0.3, 0.25, 0.2], [0.5, 0.2, 0.1], [0.6, 0.2, 0.1]])
    tree = backbone(1, ids, probs, 3, budget=4)
    assert tree.tokens.tolist() == [1, 10, 11, 12] and tree.parents.tolist() == [-1, 0, 0, 0]
    assert backbone(1, ids, probs, 3, budget=5).tokens.tolist() == [1, 10, 11, 12, 20]


# -- product (side branches continue) ------------------------------------------------------------

def rank_paths(tree: DraftTree, ids: torch.Tensor) -> list[tuple[int, ...]]:
    """Each node's path as the candidate ranks taken at depths 1, 2, ... (the root's is empty)."""
    paths: list[tuple[int, ...]] = [()]
    for i in range(1, tree.size):
        d = int(tree.depths[i])
        rank = ids[d - 1].tolist().index(int(tree.tokens[i]))
        paths.append(paths[int(tree.parents[i])] + (rank,))
    return paths


@pytest.mark.parametrize("n_depth,ks,budget", [
    (1, 10, 11), (1, 10, 4), (3, 1, 64), (3, 3, 64), (4, [4, 3, 2, 1], 10), (4, 4, 16), (5, 3, 60),
    (4, [1, 5, 1, 5], 12), (6, 4, 1), (6, 4, 2), (2, 6, 64),
])
def test_product_keeps_the_most_probable_paths(n_depth, ks, budget):
    import itertools

    kmax = ks if isinstance(ks, int) else max(ks)
    k_at = [ks] * n_depth if isinstance(ks, int) else list(ks)
    for seed in range(3):
        ids, probs = _topk(n_depth, kmax, seed)
        tree = product(5, ids, probs, ks, budget)
        # brute force: every rank path of every length, scored by the product of its probabilities
        every = [p for n in range(1, n_depth + 1) for p in itertools.product(*(range(k) for k in k_at[:n]))]
        score = {p: float(torch.tensor([float(probs[d, r]) for d, r in enumerate(p)]).prod()) for p in every}
        want = sorted(every, key=lambda p: (-score[p], len(p)))[: max(budget - 1, 0)]
        paths = rank_paths(tree, ids)
        assert tree.tokens[0] == 5 and tree.parents[0] == -1 and tree.size == 1 + len(want)
        assert set(paths[1:]) == set(want)
        assert all(int(tree.parents[i]) < i for i in range(1, tree.size)), "topological order"
        for i, p in enumerate(paths[1:], start=1):
            assert int(tree.depths[i]) == len(p) == int(tree.sources[i])
            assert tree.tokens[i] == ids[len(p) - 1, p[-1]] and tree.draft_probs[i] == probs[len(p) - 1, p[-1]]
        # siblings are distinct tokens (greedy and sampling verification need that)
        seen = {(int(tree.parents[i]), int(tree.tokens[i])) for i in range(1, tree.size)}
        assert len(seen) == tree.size - 1


def test_product_hand_made_side_branches_continue():
    ids = torch.tensor([[10, 11], [20, 21]])
    probs = torch.tensor([[0.5, 0.4], [0.9, 0.1]])
    # paths: 10 (.5), 10-20 (.45), 11 (.4), 11-20 (.36), 10-21 (.05), 11-21 (.04)
    tree = product(1, ids, probs, 2, budget=5)
    assert tree.tokens.tolist() == [1, 10, 11, 20, 20]
    assert tree.parents.tolist() == [-1, 0, 0, 1, 2]  # the runner-up at depth 1 goes on to depth 2
    # the paper's backbone spends that node on a depth-2 side leaf worth .05
    assert backbone(1, ids, probs, 2, budget=5).parents.tolist() == [-1, 0, 0, 1, 1]
    # with no branch worth continuing the two trees agree
    sure = torch.tensor([[0.9, 0.05], [0.9, 0.05]])
    for budget in range(1, 6):
        assert_same_tree(product(1, ids, sure, 2, budget), backbone(1, ids, sure, 2, budget))


def test_product_never_keeps_a_child_without_its_parent():
    """Certain drafts (p = 1.0) tie a child with its parent; the tree must still be closed."""
    ids = torch.tensor([[10, 11, 12], [20, 21, 22], [30, 31, 32]])
    probs = torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    for budget in range(1, 8):
        tree = product(1, ids, probs, 3, budget)
        assert tree.size == budget
        assert all(int(tree.parents[i]) < i for i in range(1, tree.size))
        # the certain spine comes first, as deep as the budget allows; impossible drafts only after it
        spine = [i for i in range(tree.size) if tree.tokens[i] in (1, 10, 20, 30)]
        assert tree.tokens[spine].tolist() == [1, 10, 20, 30][:min(budget, 4)]
        assert tree.parents[spine[1:]].tolist() == spine[:-1]


@pytest.mark.parametrize("n_depth,ks,budget", [
    (1, 10, 11), (1, 10, 4), (3, 3, 30), (4, [4, 3, 2, 1], 10), (4, 4, 16), (5, 3, 60), (4, [1, 5, 1, 5], 12),
    (6, 4, 2), (2, 6, 37), (6, 32, 192),
])
def test_product_fixed_builds_products_tree(n_depth, ks, budget):
    """The fixed-shape build (what a CUDA graph replays) gives `product`'s tree, node for node."""
    kmax = ks if isinstance(ks, int) else max(ks)
    assert product_fits(ks, n_depth, budget)
    for seed in range(3):
        ids, probs = _topk(n_depth, kmax, seed, vocab=max(320, kmax))
        assert_same_tree(product_fixed(torch.tensor([5]), ids, probs, ks, budget), product(5, ids, probs, ks, budget))


def test_product_fits_counts_the_paths_the_top_k_hold():
    assert product_fits(10, 1, 11) and not product_fits(10, 1, 12)  # 10 paths of one token
    assert product_fits([2, 3], 2, 9) and not product_fits([2, 3], 2, 10)  # 2 + 6 paths
    assert not product_fits(4, 3, 1)  # a root-only tree is no product tree


def test_product_fixed_keeps_certain_drafts_closed_and_syncs_nothing(conversions):
    """Certain drafts tie a child with its parent's path probability; the tree stays closed, the
    certain spine first, as `product`'s (which of the tied impossible drafts fill the rest may
    differ), and the build never reads a value back to the host (a CUDA graph could not)."""
    ids = torch.tensor([[10, 11, 12], [20, 21, 22], [30, 31, 32]])
    probs = torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [1.0, 0.0, 0.0]])
    for budget in range(2, 8):
        conversions.clear()
        tree = product_fixed(torch.tensor([1]), ids, probs, 3, budget)
        assert sum(conversions.values()) == 0, conversions
        assert tree.size == budget and all(int(tree.parents[i]) < i for i in range(1, tree.size))
        spine = [0]  # the nodes whose whole path is certain
        for i in range(1, tree.size):
            if tree.draft_probs[i] == 1.0 and int(tree.parents[i]) in spine:
                spine.append(i)
        assert tree.tokens[spine].tolist() == [1, 10, 20, 30][:min(budget, 4)]
        assert tree.depths.tolist() == sorted(tree.depths.tolist())  # depth by depth
        assert torch.equal(tree.ancestors, make_tree(tree.tokens, tree.parents).ancestors)


# -- dynamic (EAGLE-2 rerank) ---------------------------------------------------------------------

def _expansion(seed: int, depth: int, k: int):
    """Candidates as an EAGLE-2 expansion makes them: k children under the k best frontier nodes."""
    gen = torch.Generator().manual_seed(seed)
    tokens, parents, scores, depths = [], [], [], []
    frontier = [(-1, 0.0)]
    for d in range(1, depth + 1):
        new = []
        for node, score in frontier:
            lp = torch.log_softmax(torch.randn(50, generator=gen) * 2, -1).topk(k).values.tolist()
            for j in range(k):
                tokens.append(int(torch.randint(4, 320, (), generator=gen)))
                parents.append(node)
                scores.append(score + lp[j] - 1e-6)
                depths.append(d)
                new.append((len(tokens) - 1, scores[-1]))
        frontier = sorted(new, key=lambda x: -x[1])[:k]
    return torch.tensor(tokens), torch.tensor(parents), torch.tensor(scores), torch.tensor(depths)


@pytest.mark.parametrize("seed,depth,k,total",
                         [(0, 4, 3, 12), (1, 6, 8, 60), (2, 3, 2, 100), (3, 5, 4, 1), (4, 1, 10, 6)])
def test_dynamic_keeps_the_best_candidates_closed_under_ancestors(seed, depth, k, total):
    tokens, parents, scores, depths = _expansion(seed, depth, k)
    probs = torch.rand(tokens.shape[0])
    tree = dynamic(7, tokens, parents, scores, probs, depths, total)
    n = min(total - 1, tokens.shape[0])
    assert tree.size == n + 1 and tree.tokens[0] == 7 and tree.parents[0] == -1
    kept = scores.topk(n).indices.sort().values.tolist()  # candidate index of each kept node, in order
    assert tree.tokens[1:].tolist() == tokens[kept].tolist()
    assert tree.draft_probs[1:].tolist() == probs[kept].tolist()
    for i, c in enumerate(kept, start=1):
        p = int(parents[c])
        want = 0 if p < 0 else kept.index(p) + 1  # the parent was kept too, and comes earlier
        assert int(tree.parents[i]) == want < i
        assert int(tree.depths[i]) == int(depths[c])
    assert tree.sources[1:].tolist() == depths[kept].tolist()


# -- serialisation ------------------------------------------------------------------------------

@pytest.mark.parametrize("which", ["root", "chain", "backbone", "product", "random"])
def test_tree_dict_round_trip(which):
    gen = torch.Generator().manual_seed(3)
    if which == "root":
        tree = root_only(9)
    elif which == "chain":
        tree = chain(9, torch.tensor([4, 5, 6]), torch.tensor([0.3, 0.2, 0.1]))
    elif which == "backbone":
        ids, probs = _topk(6, 4, 1)
        tree = backbone(9, ids, probs, [4, 3, 2, 2, 1, 1], 14)
    elif which == "product":
        ids, probs = _topk(6, 4, 1)
        tree = product(9, ids, probs, [4, 3, 2, 2, 1, 1], 30)
    else:
        n = 40
        tree = make_tree(torch.randint(0, 320, (n,), generator=gen), random_parents(n, gen),
                         torch.rand(n, generator=gen), torch.randint(0, 6, (n,), generator=gen))
    d = json.loads(json.dumps(tree.to_dict()))
    assert "ancestors" not in d
    assert_same_tree(DraftTree.from_dict(d), tree)
    assert_same_tree(tree.to("cpu"), tree)


# -- built with tensor ops, not per-node Python loops ---------------------------------------------

CONVERSIONS = ("tolist", "item", "__iter__", "__int__", "__index__", "__float__", "__bool__")


@pytest.fixture
def conversions(monkeypatch):
    """Counts every tensor -> Python conversion (how a per-node Python loop would show up)."""
    from collections import Counter

    counts = Counter()
    for name in CONVERSIONS:
        orig = getattr(torch.Tensor, name)

        def counted(self, *a, _orig=orig, _name=name, **k):
            counts[_name] += 1
            return _orig(self, *a, **k)

        monkeypatch.setattr(torch.Tensor, name, counted)
    return counts


@pytest.mark.parametrize("width", [8, 400])
def test_tree_building_is_tensor_ops(conversions, width):
    from fasteagle.kvcache import attention_mask

    # a root with `width` children, each with one child, one of which has a chain of 3 below it
    n = 1 + 2 * width + 3
    parents = torch.cat([torch.tensor([-1]), torch.zeros(width, dtype=torch.long), torch.arange(1, width + 1),
                         torch.tensor([width + 1, 2 * width + 1, 2 * width + 2])])
    tokens = torch.arange(n)
    ids, probs = _topk(6, 10, 0)
    conversions.clear()
    tree = make_tree(tokens, parents)
    assert sum(conversions.values()) <= 6, conversions  # about one check per depth level (max depth 5)
    conversions.clear()
    mask = attention_mask(tree.ancestors, 50, torch.float32)
    tree.position_ids(50)
    path_tree(tokens)
    assert sum(conversions.values()) == 0, conversions
    conversions.clear()
    backbone(3, ids, probs, 10, 40)
    assert sum(conversions.values()) <= 6 + 3, conversions  # make_tree's per-level checks (depth 6) + O(1)
    conversions.clear()
    product(3, ids, probs, 10, 40)
    assert sum(conversions.values()) <= 2 * 6 + 3, conversions  # one count per depth, make_tree's checks
    assert mask.shape == (1, 1, n, 50 + n)


# -- merge ----------------------------------------------------------------------------------------

def _paths(tree: DraftTree) -> set[tuple[int, ...]]:
    """Every root-to-node token path (root excluded)."""
    out = set()
    for i in range(tree.size):
        path, j = [], i
        while j > 0:
            path.append(int(tree.tokens[j]))
            j = int(tree.parents[j])
        out.add(tuple(path[::-1]))
    return out


def test_merge_is_the_union_of_paths_with_distinct_siblings():
    a = make_tree(torch.tensor([7, 1, 2, 3, 4]), torch.tensor([-1, 0, 0, 1, 3]))  # 7 -> 1 -> 3 -> 4, 7 -> 2
    b = chain(7, torch.tensor([1, 3, 5, 6]))  # shares 1 -> 3, then branches off
    m = merge(a, b, source=-1)
    assert _paths(m) == _paths(a) | _paths(b)
    assert m.size == a.size + 2  # only 5 and 6 are new
    assert m.tokens[:a.size].tolist() == a.tokens.tolist() and m.parents[:a.size].tolist() == a.parents.tolist()
    assert m.sources[a.size:].tolist() == [-1, -1] and m.sources[:a.size].tolist() == a.sources.tolist()
    for p in set(m.parents.tolist()):  # no two children of one parent hold the same token
        kids = [int(t) for t, q in zip(m.tokens, m.parents) if int(q) == p]
        assert len(kids) == len(set(kids))
    assert (m.parents[1:] < torch.arange(1, m.size)).all()  # topological order
    assert m.depths.tolist() == [0, 1, 1, 2, 3, 3, 4]


def test_merge_of_a_subtree_or_a_root_changes_nothing(conversions):
    a = backbone(9, torch.tensor([[3, 4], [5, 6]]), torch.tensor([[0.6, 0.3], [0.5, 0.2]]), 2, 10)
    nothing = root_only(9)
    conversions.clear()
    assert merge(a, nothing) is a
    assert sum(conversions.values()) == 0, conversions  # `a` not even read: on a GPU it may still be drafting
    assert merge(a, chain(9, torch.tensor([3, 5]))) is a
    with pytest.raises(ValueError):
        merge(a, chain(8, torch.tensor([3])))
