"""fasteagle.packing: prepacked CPU linears give the plain layers' numbers, keep the weights the
model and its drafter read, step aside under autograd, follow in-place weight changes, and leave
decoding token for token the same."""

from __future__ import annotations

import copy

import pytest
import torch
from torch import nn

from fasteagle import packing
from fasteagle.drafter import CascadedDrafter, DrafterConfig
from fasteagle.generate import run
from fasteagle.packing import PackedLinear, pack_linears
from fasteagle.target import Target
from tests.conftest import tiny_target
from tests.drafters import OracleDrafter, one_thread

pytestmark = pytest.mark.skipif(not packing.available(), reason="this PyTorch build has no oneDNN linear ops")
_one_thread = pytest.fixture(autouse=True, scope="module")(one_thread)


def packed_copy(target: Target) -> Target:
    model = copy.deepcopy(target.model)
    n = pack_linears(model)
    assert n > 0
    return Target(model=model, tokenizer=target.tokenizer, name=target.name, packed=n)


@pytest.mark.parametrize("shape", [(7,), (5, 7), (1, 16, 7), (2, 3, 7)])
@pytest.mark.parametrize("bias", [False, True])
def test_same_product_as_the_plain_layer(shape, bias):
    torch.manual_seed(0)
    lin = nn.Linear(7, 300, bias=bias)
    x = torch.randn(*shape[:-1], 7) if len(shape) > 1 else torch.randn(7)
    with torch.no_grad():
        want = lin(x)
        got = PackedLinear.from_linear(lin)(x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_pack_keeps_weights_ties_and_state_dict():
    target = tiny_target()
    target.model.lm_head.weight = target.model.model.embed_tokens.weight  # tie, as SmolLM2 does
    keys = set(target.model.state_dict())
    n_linear = sum(type(m) is nn.Linear for m in target.model.modules())
    n = pack_linears(target.model)
    assert n == n_linear > 0
    assert not any(type(m) is nn.Linear for m in target.model.modules())
    assert target.model.lm_head.weight is target.model.model.embed_tokens.weight
    assert target.model.get_output_embeddings().weight is target.model.model.embed_tokens.weight
    assert set(target.model.state_dict()) == keys


def test_logits_match_the_unpacked_model(tiny):
    packed = packed_copy(tiny)
    ids = torch.randint(4, 320, (1, 23), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        want = tiny.model(ids).logits
        got = packed.model(ids).logits
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_autograd_uses_the_plain_product():
    torch.manual_seed(0)
    lin = nn.Linear(8, 5)
    packed = PackedLinear.from_linear(copy.deepcopy(lin))
    x = torch.randn(3, 8, requires_grad=True)
    lin(x).square().sum().backward()
    g_plain, w_plain = x.grad.clone(), lin.weight.grad.clone()
    x.grad = None
    packed(x).square().sum().backward()
    torch.testing.assert_close(x.grad, g_plain)
    torch.testing.assert_close(packed.weight.grad, w_plain)


def test_an_in_place_weight_change_is_repacked():
    torch.manual_seed(0)
    lin = nn.Linear(8, 40, bias=False)
    packed = PackedLinear.from_linear(lin)
    x = torch.randn(2, 8)
    with torch.no_grad():
        before = packed(x)
        lin.weight.mul_(2.0)  # e.g. an optimizer step on a drafter that was packed for a demo
        after = packed(x)
    torch.testing.assert_close(after, 2 * before, rtol=1e-5, atol=1e-5)


def test_only_fp32_cpu_modules_are_packed():
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2)).to(torch.bfloat16)
    assert pack_linears(model) == 0
    assert all(type(m) is not PackedLinear for m in model.modules())


def test_decoding_is_unchanged_and_lossless(tiny):
    packed = packed_copy(tiny)
    g = torch.Generator().manual_seed(3)
    for seed in range(3):
        ids = torch.randint(4, 320, (12,), generator=g)
        ref, _ = run(tiny, ids, max_new_tokens=40)
        out, _ = run(packed, ids, max_new_tokens=40)
        assert out == ref
        drafter = OracleDrafter(ref, 320, "backbone", 4, 4, 12, seed=seed, corrupt=0.1, side=0.25)
        spec, traces = run(packed, ids, drafter=drafter, max_new_tokens=40)
        assert spec == ref and traces[-1].tau > 1.5


def test_a_packed_drafter_drafts_what_the_plain_one_drafts(tiny, tmp_path):
    packed = packed_copy(tiny)
    cfg = DrafterConfig.for_target(tiny.model, tiny.name, num_layers=3, draft_vocab=64)
    CascadedDrafter(cfg).save(tmp_path / "d", dtype=torch.float32)
    plain = CascadedDrafter.load(tmp_path / "d", tiny.model)
    fast = CascadedDrafter.load(tmp_path / "d", packed.model)  # a packed target gets a packed drafter
    assert not plain.packed and fast.packed
    ids = torch.randint(4, 320, (9,), generator=torch.Generator().manual_seed(1))
    feats = torch.randn(9, len(cfg.feature_layers) * cfg.target_hidden)
    with torch.inference_mode():
        for d in (plain, fast):
            d.reset(64)
            d.extend(ids, feats, 7)
        torch.testing.assert_close(fast.depth_probs(), plain.depth_probs(), rtol=1e-4, atol=1e-5)
        assert fast.draft(7).tokens.tolist() == plain.draft(7).tokens.tolist()
