"""fasteagle.fused: the lean inference forward gives the stock decoder layer's output (causal, with
a KV cache and a tree mask, GQA, biases, prepacked weights; close to it with int8 weights), follows
weight changes, and the drafters use it only without autograd."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

from fasteagle import packing
from fasteagle.drafter import CascadedDrafter, DrafterConfig
from fasteagle.fused import FusedLayer
from fasteagle.kvcache import KVCache, attention_mask
from fasteagle.packing import Int8Linear, PackedLinear, pack_linears
from tests.drafters import one_thread

_one_thread = pytest.fixture(autouse=True, scope="module")(one_thread)


def layer_and_rope(bias: bool = False, kv_heads: int = 2) -> tuple[LlamaDecoderLayer, LlamaRotaryEmbedding]:
    cfg = LlamaConfig(hidden_size=32, intermediate_size=48, num_attention_heads=4, num_key_value_heads=kv_heads,
                      head_dim=8, attention_bias=bias, mlp_bias=bias, num_hidden_layers=1)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    layer = LlamaDecoderLayer(cfg, 0).eval()
    for p in layer.parameters():  # norms start at ones and biases at zeros: make them matter
        p.data.normal_(0, 0.3)
    return layer, LlamaRotaryEmbedding(cfg)


def stock(layer, x, pos, rope, mask=None, cache=None):
    y = layer(x, attention_mask=mask, position_ids=pos, past_key_values=cache, use_cache=cache is not None,
              position_embeddings=rope(x, pos))
    return y[0] if isinstance(y, tuple) else y


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("kv_heads", [1, 2, 4])
@pytest.mark.parametrize("packed", [False, True])
def test_same_output_as_the_stock_layer_over_a_cache_and_a_tree(bias, kv_heads, packed):
    if packed and not packing.available():
        pytest.skip("this PyTorch build has no oneDNN linear ops")
    layer, rope = layer_and_rope(bias, kv_heads)
    if packed:
        assert pack_linears(layer) == 7
    fused = FusedLayer(layer)
    x = torch.randn(2, 6, 32)
    pos = torch.arange(6)[None].expand(2, -1)
    with torch.no_grad():
        torch.testing.assert_close(fused(x, rope(x, pos), None), stock(layer, x, pos, rope), rtol=1e-5, atol=1e-5)
        # a prefix in a cache, then a tree of 4 nodes (0 <- 1, 0 <- 2 <- 3) attending to it
        caches = KVCache(1, 16), KVCache(1, 16)
        stock(layer, x, pos, rope, cache=caches[0])
        fused(x, rope(x, pos), None, caches[1])
        anc = torch.tensor([[1, 0, 0, 0], [1, 1, 0, 0], [1, 0, 1, 0], [1, 0, 1, 1]], dtype=torch.bool)
        mask = attention_mask(anc, 6, x.dtype)
        t = torch.randn(2, 4, 32)
        tpos = torch.tensor([6, 7, 7, 8])[None].expand(2, -1)
        want = stock(layer, t, tpos, rope, mask, caches[0])
        got = fused(t, rope(t, tpos), mask, caches[1])
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(caches[1].layers[0].keys, caches[0].layers[0].keys, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(caches[1].layers[0].values, caches[0].layers[0].values, rtol=1e-5, atol=1e-5)


def test_follows_a_change_of_the_weights():
    """Merged weights are copies: an optimizer step (or loading new weights) must not leave them stale."""
    layer, rope = layer_and_rope()
    fused = FusedLayer(layer)
    x = torch.randn(1, 3, 32)
    pos = torch.arange(3)[None]
    with torch.no_grad():
        before = fused(x, rope(x, pos), None)
        layer.self_attn.k_proj.weight.mul_(2)
        layer.mlp.up_proj.weight.add_(0.1)
        after = fused(x, rope(x, pos), None)
        assert not torch.allclose(before, after)
        torch.testing.assert_close(after, stock(layer, x, pos, rope), rtol=1e-5, atol=1e-5)
        # a new Parameter object (as assigning a loaded weight does) is a change too
        layer.self_attn.v_proj.weight = torch.nn.Parameter(layer.self_attn.v_proj.weight * -1)
        torch.testing.assert_close(fused(x, rope(x, pos), None), stock(layer, x, pos, rope), rtol=1e-5, atol=1e-5)
        layer.to(torch.float64)
        x64 = x.double()
        torch.testing.assert_close(fused(x64, rope(x64, pos), None), stock(layer, x64, pos, rope))


def test_the_drafter_uses_it_only_without_autograd(tiny):
    target = tiny
    drafter = CascadedDrafter(DrafterConfig.for_target(target.model, "tiny", num_layers=2)).attach(target.model)
    feats = torch.randn(1, 5, 3 * target.model.config.hidden_size)
    ids = torch.randint(0, target.model.config.vocab_size, (1, 5))
    outs = drafter.depth_outputs(feats, ids)
    assert drafter._fused is None and all(o.requires_grad for o in outs)
    with torch.no_grad():
        lean = drafter.depth_outputs(feats, ids)
    assert drafter._fused is not None
    for a, b in zip(outs, lean):
        torch.testing.assert_close(a.detach(), b, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not packing.available(), reason="this PyTorch build has no oneDNN linear ops")
def test_packing_the_layer_after_first_use_packs_the_merged_products_too():
    layer, rope = layer_and_rope()
    fused = FusedLayer(layer)
    x = torch.randn(1, 3, 32)
    pos = torch.arange(3)[None]
    with torch.no_grad():
        fused(x, rope(x, pos), None)
        assert not isinstance(fused.qkv, PackedLinear)
        pack_linears(layer)
        got = fused(x, rope(x, pos), None)
        assert isinstance(fused.qkv, PackedLinear) and isinstance(fused.gate_up, PackedLinear)
        torch.testing.assert_close(got, stock(layer, x, pos, rope), rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not packing.int8_available(), reason="no vectorised int8-weight product here")
def test_int8_layers_merge_into_int8_products_and_free_their_own_copies():
    layer, rope = layer_and_rope()
    fused = FusedLayer(layer)
    x = torch.randn(1, 3, 32)
    pos = torch.arange(3)[None]
    with torch.no_grad():
        want = stock(layer, x, pos, rope)
        assert pack_linears(layer, "int8") == 7
        got = fused(x, rope(x, pos), None)
    assert isinstance(fused.qkv, Int8Linear) and isinstance(fused.gate_up, Int8Linear)
    assert layer.self_attn.q_proj._copy is None and layer.mlp.up_proj._copy is None  # released: unused here
    assert isinstance(layer.self_attn.o_proj, Int8Linear) and layer.self_attn.o_proj._copy is not None
    assert float((got - want).norm() / want.norm()) < 0.02  # int8 weights: close, not equal
