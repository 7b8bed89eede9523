"""The fixed-shape drafter step (the one a CUDA graph replays), run eagerly on the CPU: the same
outputs and drafts as the dynamic step, prefills and padded steps alike, lossless decoding, and a
clear error when the cache is full. tests/test_gpu.py replays it as a graph on a GPU."""

from __future__ import annotations

import pytest
import torch

from fasteagle.draftgraph import graphs_wanted
from fasteagle.generate import run
from fasteagle.kvcache import ContextOverflowError
from tests.conftest import TINY_VOCAB
from tests.drafters import steer
from tests.test_drafter import features, make


def pair(tiny, budget: int = 16, **kw):
    """The same drafter twice, one per step mode."""
    out = []
    for mode in ("dynamic", "static"):
        d = make(tiny, **kw)
        d.tree_k, d.tree_budget, d.step_mode = 4, budget, mode
        out.append(d)
    return out


@pytest.mark.parametrize("window,tail,inject", [(0, 0, False), (9, 0, False), (0, 5, False), (0, 0, True),
                                                (9, 0, True)])
def test_static_steps_equal_dynamic_steps(tiny, window, tail, inject):
    """A prefill, then accepted paths of every length up to the padded row count (the root plus one
    node per depth): the same layer outputs, distributions and trees; with an attention window, or the
    prompt read from its last `tail` tokens only, too, where both equal the teacher-forced pass over the
    sequence from there (what training and `bench --diagnose` run); and for a cascade whose keys and values
    are its fused input (`kv_inject`), whose dynamic step runs the last row alone."""
    ids = torch.randint(4, TINY_VOCAB, (40,))
    f = features(tiny, ids[None], make(tiny).cfg.feature_layers)[0]
    dyn, sta = pair(tiny, kv_inject=inject)
    for d in (dyn, sta):
        d.attention_window, d.prefill_tail = window, tail
    start = 12 - tail if tail else 0  # the prefill is the first 12 tokens
    with torch.no_grad():  # slot t: token t+1 comes next
        whole = dyn.hidden(f[None, start:39], ids[None, start + 1:], torch.arange(start, 39)[None])
    cuts = [0, 12, 13, 15, 18, 22, 27, 32, 40]  # chunks of 12 (prefill), then 1..5 rows, then 5, 8
    for d in (dyn, sta):
        d.reset(64)
    for a, b in zip(cuts, cuts[1:]):
        nxt = int(ids[b]) if b < 40 else 7
        trees = []
        for d in (dyn, sta):
            d.extend(ids[a:b], f[a:b], nxt)
            trees.append(d.draft(nxt))
        torch.testing.assert_close(sta.last, dyn.last, atol=1e-5, rtol=1e-4)
        if b < 40:
            torch.testing.assert_close(dyn.last, torch.stack([h[0, b - 1 - start] for h in whole])[:len(dyn.last)],
                                       atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(sta.depth_probs(), dyn.depth_probs(), atol=1e-6, rtol=1e-4)
        for name in ("tokens", "parents", "depths", "sources"):
            assert torch.equal(getattr(trees[0], name), getattr(trees[1], name)), name
        torch.testing.assert_close(trees[1].draft_probs, trees[0].draft_probs, atol=1e-6, rtol=1e-4)
    assert sta.state.step.length == 40 and sta.state.step.rows == sta.num_depths + 1


def test_static_step_decodes_losslessly(tiny):
    prompt = torch.tensor([5, 7, 9, 11, 7, 9, 11, 13])
    want, _ = run(tiny, prompt, max_new_tokens=30, stop_ids=set())
    dyn, sta = (steer(d, want) for d in pair(tiny))  # untrained, nothing would be accepted
    got_dyn, tr_dyn = run(tiny, prompt, drafter=dyn, max_new_tokens=30, stop_ids=set())
    got_sta, tr_sta = run(tiny, prompt, drafter=sta, max_new_tokens=30, stop_ids=set())
    assert got_sta == got_dyn == want
    assert [t.tree["tokens"] for t in tr_sta[1:]] == [t.tree["tokens"] for t in tr_dyn[1:]]
    # accepted paths of several lengths: the padded steps fed 2 or more rows, in the loop
    assert len({len(t.path) for t in tr_sta[1:]}) >= 3 and tr_sta[-1].tau > 2.0
    # a second sequence reuses the step (and its buffers) from the start
    step = sta.state.step
    again, _ = run(tiny, prompt, drafter=sta, max_new_tokens=30, stop_ids=set())
    assert again == want and sta.state.step is step


def test_a_step_that_builds_its_own_tree_decodes_the_same(tiny):
    """`tree_on_device` (a CUDA graph's default): the step builds the product tree itself, with no
    host round trip; the same trees as the host's heap, the same lossless reply, and each trace
    keeps its own tree though the next step rebuilds in the same tensors."""
    prompt = torch.tensor([5, 7, 9, 11, 7, 9, 11, 13])
    want, _ = run(tiny, prompt, max_new_tokens=30, stop_ids=set())
    host, dev = steer(pair(tiny)[1], want), steer(pair(tiny)[1], want)  # so that drafts are accepted
    dev.tree_on_device = True
    got_host, tr_host = run(tiny, prompt, drafter=host, max_new_tokens=30, stop_ids=set())
    got_dev, tr_dev = run(tiny, prompt, drafter=dev, max_new_tokens=30, stop_ids=set())
    assert got_dev == got_host == want
    assert tr_dev[-1].tau > 2.0 and max(len(t.path) for t in tr_dev[1:]) > 3
    assert dev.state.step.tree_spec == ((4,) * dev.num_depths, 16) and host.state.step.tree_spec is None
    assert [t.tree for t in tr_dev[1:]] == [t.tree for t in tr_host[1:]]
    dev.tree_shape = "backbone"  # the paper's tree: built by the host again
    got, _ = run(tiny, prompt, drafter=dev, max_new_tokens=30, stop_ids=set())
    assert got == want and dev.state.step.tree_spec is None


def test_a_small_tree_builds_a_step_of_fewer_layers(tiny):
    _, sta = pair(tiny, budget=3)
    ids = torch.randint(4, TINY_VOCAB, (10,))
    sta.reset(64)
    sta.extend(ids, features(tiny, ids[None], sta.cfg.feature_layers)[0], 5)
    assert sta.state.step.layers == 2 and sta.state.step.kv.keys.shape[0] == 2 and sta.last.shape[0] == 2
    assert sta.draft(5).size == 3


def test_a_full_static_cache_refuses_more(tiny):
    _, sta = pair(tiny)
    ids = torch.randint(4, TINY_VOCAB, (20,))
    f = features(tiny, ids[None], sta.cfg.feature_layers)[0]
    sta.reset(16)
    sta.extend(ids[:14], f[:14], int(ids[14]))
    with pytest.raises(ContextOverflowError, match="capacity 16"):
        sta.extend(ids[14:17], f[14:17], int(ids[17]))
    assert sta.state.step.length == 14  # nothing was written


def test_graphs_only_on_a_gpu(monkeypatch):
    assert not graphs_wanted(torch.device("cpu"))
    assert graphs_wanted(torch.device("cuda"))
    monkeypatch.setenv("FASTEAGLE_DRAFT_GRAPH", "0")
    assert not graphs_wanted(torch.device("cuda"))


def test_the_graph_key_follows_every_tensor_it_reads(tiny):
    """A graph replays raw addresses: the key it is captured under changes when the weights it reads
    move, are merged again or the vocabulary grows (and then the step is captured anew)."""
    d = make(tiny, draft_vocab=64)
    d.step_mode = "static"
    ids = torch.randint(4, TINY_VOCAB, (10,))
    d.reset(64)
    d.extend(ids, features(tiny, ids[None], d.cfg.feature_layers)[0], 5)
    step = d.state.step
    key = step._weights_key()
    assert step._weights_key() == key  # stable while nothing changes
    d.grow_vocab(TINY_VOCAB)
    grown = step._weights_key()
    assert grown != key
    with torch.no_grad():
        d.layers[0].self_attn.q_proj.weight.add_(0.0)  # in place: the merged weights are made again
    assert step._weights_key() != grown
    assert step.fits(64, step.layers, step.k) and not step.fits(64, step.layers + 1, step.k)
    d.to(torch.float64)
    assert not step.fits(64, step.layers, step.k)  # another dtype: a new step
