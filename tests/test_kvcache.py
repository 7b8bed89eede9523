"""fasteagle.kvcache: tree attention masks, the preallocated cache, accepted-path commits, overflow."""

from __future__ import annotations

import pytest
import torch

from fasteagle.errors import FastEagleError
from fasteagle.kvcache import ContextOverflowError, KVCache, SlotLayer, attention_mask, causal_ancestors
from fasteagle.tree import make_tree, path_tree, root_only
from fasteagle.verify import tree_forward
from tests.conftest import tiny_target
from tests.drafters import one_thread
from tests.test_tree import brute_ancestors, random_parents

_one_thread = pytest.fixture(autouse=True, scope="module")(one_thread)

TOL = 1e-5


@pytest.fixture(autouse=True)
def _inference_mode():
    """The generation loop runs under inference mode; so do these tests (cache writes included)."""
    with torch.inference_mode():
        yield


@pytest.fixture(scope="module", params=["sdpa", "eager"])
def model(request, tiny):
    """The shared tiny target (sdpa) and a 3-layer eager-attention one (the mask is added to the scores)."""
    return tiny.model if request.param == "sdpa" else tiny_target(seed=1, layers=3, attn="eager").model


def prefill(model, tokens: torch.Tensor, capacity: int = 256) -> tuple[KVCache, torch.Tensor]:
    cache = KVCache.for_model(model, capacity)
    logits, _ = tree_forward(model, cache, path_tree(tokens))
    cache.keep(torch.arange(tokens.numel()))
    return cache, logits


def plain_logits(model, tokens: torch.Tensor) -> torch.Tensor:
    """Reference: a cache-free causal forward over the whole sequence (last position's logits)."""
    return model(input_ids=tokens[None]).logits[0, -1].float()


def random_tree(n: int, gen: torch.Generator):
    return make_tree(torch.randint(4, 320, (n,), generator=gen), random_parents(n, gen))


# -- masks -------------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("seed", range(4))
def test_attention_mask(seed, dtype):
    gen = torch.Generator().manual_seed(seed)
    n = int(torch.randint(1, 40, (), generator=gen))
    past = int(torch.randint(0, 30, (), generator=gen))
    parents = random_parents(n, gen)
    tree = make_tree(torch.zeros(n, dtype=torch.long), parents)
    mask = attention_mask(tree.ancestors, past, dtype)
    assert mask.shape == (1, 1, n, past + n) and mask.dtype == dtype
    values = set(mask.unique().tolist())
    assert values <= {0.0, torch.finfo(dtype).min}
    anc, _ = brute_ancestors(parents.tolist())
    for i in range(n):
        row = mask[0, 0, i]
        assert (row[:past] == 0).all(), "every node sees the whole prefix"
        seen = (row[past:] == 0).tolist()
        assert seen == anc[i], f"node {i} must see exactly itself and its ancestors"


def test_causal_ancestors_is_a_chain_mask():
    a = causal_ancestors(5)
    assert torch.equal(a, path_tree(torch.arange(5)).ancestors)
    m = attention_mask(a, 3, torch.float32)[0, 0]
    assert ((m == 0) == torch.ones(5, 8, dtype=torch.bool).tril(3)).all()


# -- tree forward and commit -------------------------------------------------------------------

@pytest.mark.parametrize("seed", range(3))
def test_tree_forward_matches_each_path_alone(model, seed):
    """Node i's logits from one tree forward == the logits after prefix + (root..i) alone."""
    gen = torch.Generator().manual_seed(seed)
    prefix = torch.randint(4, 320, (int(torch.randint(1, 30, (), generator=gen)),), generator=gen)
    cache, _ = prefill(model, prefix)
    tree = random_tree(int(torch.randint(2, 24, (), generator=gen)), gen)
    logits, _ = tree_forward(model, cache, tree)
    assert cache.length == prefix.numel() + tree.size
    for i in range(tree.size):
        path = tree.ancestors[i].nonzero().squeeze(1)
        ref = plain_logits(model, torch.cat([prefix, tree.tokens[path]]))
        assert (logits[i] - ref).abs().max() < TOL, f"node {i}"


def test_tree_forward_features(tiny):
    cache = KVCache.for_model(tiny.model, 64)
    toks = torch.tensor([1, 5, 9, 12])
    _, feats = tree_forward(tiny.model, cache, path_tree(toks), feature_layers=(0, 2))
    ref = tiny.model(input_ids=toks[None], output_hidden_states=True).hidden_states
    assert feats.shape == (4, 128)
    assert torch.allclose(feats, torch.cat([ref[0][0], ref[2][0]], -1), atol=TOL)


@pytest.mark.parametrize("seed", range(4))
def test_keep_commits_exactly_prefix_plus_path(model, seed):
    """After several verify + keep(path) rounds the cache equals a fresh prefill of the same tokens."""
    gen = torch.Generator().manual_seed(100 + seed)
    seq = torch.randint(4, 320, (int(torch.randint(1, 20, (), generator=gen)),), generator=gen)
    cache, _ = prefill(model, seq)
    for _ in range(4):
        tree = random_tree(int(torch.randint(1, 30, (), generator=gen)), gen)
        tree_forward(model, cache, tree)
        # accept the root-to-node path of a random node (root only, deep paths, leaves...)
        node = int(torch.randint(0, tree.size, (), generator=gen))
        path = tree.ancestors[node].nonzero().squeeze(1)
        cache.keep(path)
        seq = torch.cat([seq, tree.tokens[path]])
        assert cache.length == seq.numel() == cache.get_seq_length()
        fresh, _ = prefill(model, seq)
        for mine, ref in zip(cache.layers, fresh.layers):
            assert mine.length == ref.length == seq.numel()
            assert torch.allclose(mine.keys[:, :, :mine.length], ref.keys[:, :, :ref.length], atol=TOL)
            assert torch.allclose(mine.values[:, :, :mine.length], ref.values[:, :, :ref.length], atol=TOL)
        nxt = root_only(int(torch.randint(4, 320, (), generator=gen)))
        a, _ = tree_forward(model, cache, nxt)
        b, _ = tree_forward(model, fresh, nxt)
        assert (a - b).abs().max() < TOL
        assert (a[0] - plain_logits(model, torch.cat([seq, nxt.tokens]))).abs().max() < TOL
        cache.truncate(seq.numel())  # drop the probe row again


def test_keep_reorders_rows():
    layer = SlotLayer(16)
    k = torch.arange(6.0).view(1, 1, 6, 1)
    layer.update(k[:, :, :2], k[:, :, :2])  # a two-row prefix
    layer.keep(torch.arange(2))
    layer.update(k[:, :, 2:] * 10, k[:, :, 2:] * 10)  # rows 20, 30, 40, 50
    layer.keep(torch.tensor([0, 2, 3]))
    assert layer.length == 5
    assert layer.keys[0, 0, :5, 0].tolist() == [0, 1, 20, 40, 50]
    assert layer.values[0, 0, :5, 0].tolist() == [0, 1, 20, 40, 50]


def test_layers_of_one_shape_share_one_pool(tiny):
    """Every layer's buffer is a view into one pool, so a commit moves all layers' rows at once."""
    cache, _ = prefill(tiny.model, torch.tensor([3, 17, 42]))
    assert all(cache.pooled) and cache.pool.shape[:2] == (2, len(cache.layers))
    base = cache.pool.untyped_storage().data_ptr()
    assert all(layer.keys.untyped_storage().data_ptr() == base for layer in cache.layers)
    assert all(layer.values.untyped_storage().data_ptr() == base for layer in cache.layers)


def test_a_layer_of_another_shape_gets_its_own_buffer_and_still_commits():
    cache = KVCache(2, 16)
    for heads, scale in ((1, 1.0), (2, 100.0)):  # layer 1 has twice the heads: outside the pool
        rows = torch.arange(6.0).view(1, 1, 6, 1).expand(1, heads, 6, 1) * scale
        cache.update(rows, rows + 0.5, heads - 1)
    assert cache.pooled == [True, False]
    cache.keep(torch.tensor([0, 2, 5]))
    assert cache.length == 3
    assert cache.layers[0].keys[0, 0, :3, 0].tolist() == [0, 2, 5]
    assert cache.layers[1].keys[0, 1, :3, 0].tolist() == [0, 200, 500]
    assert cache.layers[1].values[0, 0, :3, 0].tolist() == [0.5, 200.5, 500.5]


def test_keeping_the_leading_rows_moves_nothing_and_drops_the_rest(tiny):
    """keep(0..n-1), plain decoding's commit, only sets the length; the next forward then overwrites
    the dropped rows, and the cache still equals a fresh prefill."""
    model = tiny.model
    seq = torch.tensor([3, 17, 42, 8, 99])
    cache, _ = prefill(model, seq)
    tree = random_tree(6, torch.Generator().manual_seed(7))
    tree_forward(model, cache, tree)
    before = [layer.keys.clone() for layer in cache.layers]
    path = torch.tensor([0, 1])  # node 1 always hangs from the root
    cache.keep(path)
    assert cache.length == seq.numel() + path.numel()
    assert all(torch.equal(layer.keys, k) for layer, k in zip(cache.layers, before))  # nothing moved
    seq = torch.cat([seq, tree.tokens[path]])
    nxt = root_only(250)
    a, _ = tree_forward(model, cache, nxt)
    assert (a[0] - plain_logits(model, torch.cat([seq, nxt.tokens]))).abs().max() < TOL


# -- overflow, truncate, reset -----------------------------------------------------------------

def test_reserve_raises_before_anything_is_written(tiny):
    model = tiny.model
    prefix = torch.tensor([1, 5, 9, 12, 40])
    cache, _ = prefill(model, prefix, capacity=12)
    before = [(layer.keys.clone(), layer.values.clone()) for layer in cache.layers]
    big = make_tree(torch.arange(4, 12), torch.tensor([-1, 0, 1, 2, 3, 4, 5, 6]))  # 5 + 8 > 12
    with pytest.raises(ContextOverflowError) as info:
        tree_forward(model, cache, big)
    assert isinstance(info.value, FastEagleError)
    msg = str(info.value)
    assert "5 cached + 8 new" in msg and "capacity 12" in msg
    assert cache.length == 5
    for layer, (k, v) in zip(cache.layers, before):
        assert layer.length == 5 and torch.equal(layer.keys, k) and torch.equal(layer.values, v)
    # the cache is still good: a tree that fits gives the same logits as on an untouched cache
    small = make_tree(torch.tensor([7, 8, 9]), torch.tensor([-1, 0, 0]))
    untouched, _ = prefill(model, prefix, capacity=12)
    a, _ = tree_forward(model, cache, small)
    b, _ = tree_forward(model, untouched, small)
    assert torch.allclose(a, b, atol=TOL)


def test_exact_fit_is_allowed(tiny):
    cache, _ = prefill(tiny.model, torch.tensor([1, 5, 9]), capacity=6)
    tree_forward(tiny.model, cache, make_tree(torch.tensor([4, 5, 6]), torch.tensor([-1, 0, 0])))
    assert cache.length == 6
    cache.reserve(0)
    with pytest.raises(ContextOverflowError):
        cache.reserve(1)


def test_slot_layer_overflow_raises():
    layer = SlotLayer(4)
    x = torch.zeros(1, 2, 3, 8)
    layer.update(x, x)
    with pytest.raises(ContextOverflowError, match="capacity 4"):
        layer.update(x, x)
    assert layer.length == 3


def test_truncate_and_reset(tiny):
    seq = torch.tensor([1, 5, 9, 12, 40, 41, 42])
    cache, _ = prefill(tiny.model, seq, capacity=32)
    cache.truncate(4)
    assert cache.length == 4 and all(layer.length == 4 for layer in cache.layers)
    nxt = root_only(99)
    a, _ = tree_forward(tiny.model, cache, nxt)
    assert (a[0] - plain_logits(tiny.model, torch.cat([seq[:4], nxt.tokens]))).abs().max() < TOL
    cache.truncate(100)  # never grows
    assert cache.length == 5
    cache.reset()
    assert cache.length == 0 and cache.get_seq_length() == 0
    fresh, _ = prefill(tiny.model, seq[:2], capacity=32)
    tree_forward(tiny.model, cache, path_tree(seq[:2]))
    cache.keep(torch.arange(2))
    a, _ = tree_forward(tiny.model, cache, nxt)
    b, _ = tree_forward(tiny.model, fresh, nxt)
    assert torch.allclose(a, b, atol=TOL)


def test_for_model(tiny):
    cache = KVCache.for_model(tiny.model, 33)
    assert len(cache.layers) == tiny.model.config.num_hidden_layers
    assert cache.capacity == 33 and cache.length == 0
