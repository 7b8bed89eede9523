"""The EAGLE-3-style baseline: training-time test unrolls exactly what drafting computes, the
EAGLE-2 dynamic tree is well formed, drafting is lossless, and kinds are not mixed up on load."""

from __future__ import annotations

import pytest
import torch

from fasteagle.drafter import CascadedDrafter, DrafterConfig
from fasteagle.eagle3 import AutoregressiveDrafter
from fasteagle.errors import FastEagleError
from fasteagle.generate import run
from fasteagle.methods import load_drafter
from fasteagle.tree import dynamic
from tests.conftest import TINY_VOCAB, tiny_target
from tests.drafters import steer


def make(target, depth=5) -> AutoregressiveDrafter:
    torch.manual_seed(0)
    cfg = AutoregressiveDrafter.config_for(DrafterConfig.for_target(target.model, target.name, intermediate=64),
                                           depth=depth)
    return AutoregressiveDrafter(cfg).attach(target.model).eval()


def feats(target, ids, layers):
    with torch.no_grad():
        out = target.model(input_ids=ids, output_hidden_states=True)
    return torch.cat([out.hidden_states[i] for i in layers], -1)


def test_training_time_test_matches_chain_drafting(tiny):
    """Draft a greedy chain (k=1) after a prefix; feed prefix + chain to the unrolled training
    forward: step a at the prefix's last slot must predict the chain's a-th token."""
    d = make(tiny)
    d.tree_k, d.tree_budget = 1, 99
    prefix = torch.randint(4, TINY_VOCAB, (9,))
    root = 17
    d.reset(64)
    f = feats(tiny, prefix[None], d.cfg.feature_layers)[0]
    d.extend(prefix, f, root)
    tree = d.draft(root)
    chain = tree.tokens[1:]
    assert chain.numel() == d.cfg.depth and tree.depths.tolist() == list(range(d.cfg.depth + 1))
    seq = torch.cat([prefix, torch.tensor([root]), chain])[None]
    full = feats(tiny, seq, d.cfg.feature_layers)
    with torch.no_grad():
        outs = d.depth_outputs(full[:, :-1], seq[:, 1:])
    t = prefix.numel() - 1  # the last real slot: its next token is the root
    for a, h in enumerate(outs, start=1):
        assert int(d.vocab_ids[d.head(h[0, t], a).argmax()]) == int(chain[a - 1]), f"step {a}"


def test_dynamic_tree_keeps_the_best_ancestor_closed_nodes():
    # candidates in expansion order: two at depth 1, then children
    tokens = torch.tensor([10, 11, 12, 13, 14, 15])
    parents = torch.tensor([-1, -1, 0, 0, 1, 2])
    scores = torch.tensor([-0.1, -2.0, -0.5, -3.0, -2.1, -0.9])
    probs = torch.rand(6)
    depths = torch.tensor([1, 1, 2, 2, 2, 3])
    tree = dynamic(5, tokens, parents, scores, probs, depths, total_tokens=5)
    assert tree.tokens.tolist() == [5, 10, 11, 12, 15]
    assert tree.parents.tolist() == [-1, 0, 0, 1, 3]
    assert tree.depths.tolist() == [0, 1, 1, 2, 3]
    for i in range(1, tree.size):
        assert tree.parents[i] < i


@pytest.mark.parametrize("budget", [2, 3, 5])
def test_a_small_tree_drafts_only_the_depths_it_can_reach(tiny, budget, monkeypatch):
    """A tree of B nodes reaches depth B-1 at most: drafting stops there, with no layer pass wasted
    on depths the rerank would drop, and gives exactly the tree all seven depths would have given."""
    ids = torch.randint(4, TINY_VOCAB, (12,))
    f = feats(tiny, ids[None], make(tiny).cfg.feature_layers)[0]
    trees, passes = [], []
    for capped in (True, False):
        if not capped:
            monkeypatch.setattr(AutoregressiveDrafter, "draft_depths", property(lambda self: self.cfg.depth))
        d = make(tiny, depth=7)
        d.tree_k, d.tree_budget = 3, budget
        d.reset(64)
        d.extend(ids, f, 5)
        calls = []
        d.run_layer = lambda *a, _run=d.run_layer, _calls=calls, **kw: _calls.append(1) or _run(*a, **kw)
        trees.append(d.draft(5))
        passes.append(len(calls))
    assert passes == [budget - 2, 6]
    assert trees[0].size == budget
    for name in ("tokens", "parents", "depths"):
        assert torch.equal(getattr(trees[0], name), getattr(trees[1], name)), name


@pytest.mark.parametrize("k,budget,depth", [(1, 8, 7), (4, 20, 4), (10, 60, 7)])
def test_eagle3_drafting_is_lossless(tiny, k, budget, depth):
    """Untrained, every draft is rejected; steered towards the reply (its layer, cache and dynamic
    tree still its own) drafts are accepted, deep paths included: both give vanilla's output."""
    d = make(tiny, depth=depth)
    d.tree_k, d.tree_budget = k, budget
    ids = torch.randint(4, TINY_VOCAB, (10,))
    want, _ = run(tiny, ids, max_new_tokens=30)
    got, traces = run(tiny, ids, drafter=d, max_new_tokens=30)
    assert got == want
    assert all(len(t.tree["tokens"]) <= budget for t in traces[1:])
    assert max(max(t.tree["depths"]) for t in traces[1:]) <= depth
    got, traces = run(tiny, ids, drafter=steer(d, want), max_new_tokens=30)
    assert got == want
    assert all(len(t.tree["tokens"]) <= budget for t in traces[1:])
    assert traces[-1].tau > 2.0 and max(len(t.path) for t in traces[1:]) > min(depth, budget - 1, 4), \
        "the steered drafts must be accepted, deep paths included"


def test_kinds_are_not_mixed_up(tiny, tmp_path):
    make(tiny).save(tmp_path / "e3")
    assert isinstance(load_drafter(tmp_path / "e3", tiny.model), AutoregressiveDrafter)
    with pytest.raises(FastEagleError, match="eagle3"):
        CascadedDrafter.load(tmp_path / "e3", tiny.model)


def test_eagle3_trains_with_the_shared_pipeline(tiny, tmp_path):
    import json

    from fasteagle.train.config import TrainConfig
    from fasteagle.train.data import save_token_dataset
    from fasteagle.train.trainer import train
    from tests.train.test_trainer import self_written

    save_token_dataset(self_written(tiny, 16, seed=1, new=30), tmp_path / "train.pt")
    cfg = TrainConfig(out=str(tmp_path / "d"), data=str(tmp_path / "train.pt"), drafter="eagle3", depth=4,
                      intermediate=64, topk=8, batch_tokens=400, max_steps=40, warmup=3, lr=3e-3, device="cpu")
    out = train(cfg, target=tiny)
    history = json.loads((out / "history.json").read_text())
    assert history[-1]["loss"] < history[0]["loss"]
    assert isinstance(load_drafter(out, tiny.model), AutoregressiveDrafter)


def test_a_certain_child_of_an_unlikely_node_never_outranks_it(tiny):
    """A child's score is its parent's plus log p - a margin; with p = 1 and a parent far below zero
    (-40 here) a fixed 1e-6 margin vanished in float32, the child tied its parent, and the rerank
    kept the child without it: a second root (parent -1, depth 0) in the verified tree."""
    d = make(tiny, depth=2)
    d.tree_k, d.tree_budget = 2, 4
    ids = torch.randint(4, TINY_VOCAB, (8,))
    d.reset(64)
    d.extend(ids, feats(tiny, ids[None], d.cfg.feature_layers)[0], 5)

    def head(h, depth, rows=None):  # depth 1: tokens 10 (p ~ 1) and 11 (log p = -40); below: 20 for sure
        z = torch.full((*h.shape[:-1], TINY_VOCAB), -1e4)
        z[..., 10 if depth == 1 else 20], z[..., 11 if depth == 1 else 21] = 0.0, -40.0 if depth == 1 else -60.0
        return z

    d.head = head
    tree = d.draft(5)
    assert tree.tokens.tolist() == [5, 10, 11, 20] and tree.parents.tolist() == [-1, 0, 0, 1]
    assert tree.depths.tolist() == [0, 1, 1, 2]


def test_a_per_depth_tree_k_drafts_with_its_largest_k(tiny):
    """`tree_k` may be one k per depth, as for the cascade: drafting uses the largest, and `reset`
    must size the draft's cache rows by it too (it failed with a TypeError on a list)."""
    d = make(tiny, depth=3)
    d.tree_k, d.tree_budget = [3, 2], 10
    ids = torch.randint(4, TINY_VOCAB, (10,))
    got, traces = run(tiny, ids, drafter=d, max_new_tokens=12)
    assert got == run(tiny, ids, max_new_tokens=12)[0]
    assert max(len(t.tree["tokens"]) for t in traces[1:]) > 1


def test_a_drafter_moved_to_another_dtype_between_sequences_still_drafts():
    """As the cascade's: `reset` makes the draft cache again in the drafter's new dtype."""
    t = tiny_target()
    d = make(t)
    d.tree_k, d.tree_budget = 4, 8
    prompt = torch.tensor([5, 7, 9, 11, 7, 9])
    assert run(t, prompt, drafter=d, max_new_tokens=6)[0] == run(t, prompt, max_new_tokens=6)[0]
    t.model.to(torch.float64)
    d.to(torch.float64)
    assert run(t, prompt, drafter=d, max_new_tokens=6)[0] == run(t, prompt, max_new_tokens=6)[0]
