"""fasteagle.packing: prepacked CPU linears give the plain layers' numbers, keep the weights the
model and its drafter read, step aside under autograd, follow in-place weight changes, and leave
decoding token for token the same. Int8 drafter weights stay close to fp32 and never change the output."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from fasteagle import packing
from fasteagle.drafter import CascadedDrafter, DrafterConfig
from fasteagle.generate import run
from fasteagle.packing import Int8Linear, PackedLinear, pack_linears
from fasteagle.target import Target
from tests.conftest import tiny_target
from tests.drafters import OracleDrafter, one_thread, steer

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


@pytest.mark.parametrize("change", ["in place", "dtype round trip"])
def test_a_changed_weight_is_repacked(change):
    """In place (an optimizer step on a drafter packed for a demo) bumps the weight's version;
    `.half()` then `.float()` swaps in new data without one, possibly at the last copy's address."""
    torch.manual_seed(0)
    lin = nn.Linear(8, 40, bias=False)
    packed = PackedLinear.from_linear(lin)
    x = torch.randn(3, 8)
    with torch.no_grad():
        for _ in range(30):
            packed(x)
            if change == "in place":
                lin.weight.mul_(-1.01)
            else:
                lin.half()
                lin.weight.add_(0.5)
                lin.float()
            torch.testing.assert_close(packed(x), F.linear(x, lin.weight), rtol=1e-5, atol=1e-5)


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
    fast = CascadedDrafter.load(tmp_path / "d", packed.model, int8=False)  # a packed target gets a packed drafter
    assert not plain.packed and fast.packing == "fp32"
    ids = torch.randint(4, 320, (9,), generator=torch.Generator().manual_seed(1))
    feats = torch.randn(9, len(cfg.feature_layers) * cfg.target_hidden)
    with torch.inference_mode():
        for d in (plain, fast):
            d.reset(64)
            d.extend(ids, feats, 7)
        torch.testing.assert_close(fast.depth_probs(), plain.depth_probs(), rtol=1e-4, atol=1e-5)
        assert fast.draft(7).tokens.tolist() == plain.draft(7).tokens.tolist()


# -- int8 drafter weights ---------------------------------------------------------------------------
needs_int8 = pytest.mark.skipif(not packing.int8_available(), reason="no vectorised int8-weight product here")


@needs_int8
@pytest.mark.parametrize("shape", [(64,), (4, 64), (1, 3, 64), (5, 64), (2, 9, 64)])
@pytest.mark.parametrize("bias", [False, True])
def test_int8_product_is_close_to_the_plain_one_and_exact_beyond_four_rows(shape, bias):
    torch.manual_seed(0)
    lin = nn.Linear(64, 300, bias=bias)
    x = torch.randn(*shape)
    with torch.no_grad():
        want = lin(x)
        got = Int8Linear.from_linear(lin)(x)
    assert got.shape == want.shape and got.dtype == torch.float32
    rows = x.numel() // 64
    if rows > packing.INT8_ROWS:  # a prompt-sized product: the prepacked fp32 copy
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    else:
        err = float((got - want).norm() / want.norm())
        assert 0 < err < 0.02  # approximate (int8 weights, bf16 activations), but close


@needs_int8
def test_int8_follows_weight_changes_and_steps_aside_under_autograd():
    torch.manual_seed(0)
    lin = nn.Linear(16, 40, bias=False)
    q = Int8Linear.from_linear(lin)
    x = torch.randn(2, 16)
    with torch.no_grad():
        before = q(x)
        lin.weight.mul_(2.0)
        torch.testing.assert_close(q(x), 2 * before, rtol=2e-2, atol=1e-3)
    y = q(x.requires_grad_())  # training sees the exact fp32 product and its gradient
    torch.testing.assert_close(y, lin(x))
    y.sum().backward()
    assert lin.weight.grad is not None
    q.release()
    assert q._copy is None
    with torch.no_grad():
        torch.testing.assert_close(q(x), lin(x), rtol=2e-2, atol=2e-2)  # made again on use


@needs_int8
def test_int8_packing_swaps_prepacked_layers_and_spares_what_its_kernel_cannot_take():
    model = nn.Sequential(nn.Linear(32, 16), nn.ReLU(), nn.Linear(16, 8), nn.ReLU(), nn.Linear(8, 4))
    assert pack_linears(model) == 3
    assert pack_linears(model, "int8") == 2  # rows of 8 values: PyTorch's int8 kernel would read past them
    assert [type(m) for m in model[::2]] == [Int8Linear, Int8Linear, PackedLinear]
    assert packing.copy_class("int8", 8) is PackedLinear and packing.copy_class("int8", 48) is Int8Linear
    odd = Int8Linear(torch.randn(5, 8))
    x = torch.randn(2, 8)
    with torch.no_grad():
        torch.testing.assert_close(odd(x), x @ odd.weight.T)  # made directly: the plain product, never the kernel
    assert pack_linears(nn.Sequential(nn.Linear(16, 16)).to(torch.bfloat16), "int8") == 0


@needs_int8
def test_int8_drafter_drafts_close_to_fp32_and_decoding_stays_lossless(tiny, tmp_path, monkeypatch):
    packed = packed_copy(tiny)
    g = torch.Generator().manual_seed(5)
    prompts = [torch.randint(4, 320, (10,), generator=g) for _ in range(2)]
    refs = [run(packed, prompt, max_new_tokens=30)[0] for prompt in prompts]
    counts = torch.bincount(torch.tensor(refs[0] + refs[1]), minlength=320)  # a draft vocab holding the replies
    cfg = DrafterConfig.for_target(tiny.model, tiny.name, num_layers=3, draft_vocab=64)
    CascadedDrafter(cfg).init_from_target(tiny.model).set_vocab(counts).save(tmp_path / "d", dtype=torch.float32)
    fp32 = CascadedDrafter.load(tmp_path / "d", packed.model, int8=False)
    int8 = CascadedDrafter.load(tmp_path / "d", packed.model)  # the default where available
    assert fp32.packing == "fp32" and int8.packing == "int8"
    n_int8 = sum(isinstance(m, Int8Linear) for m in int8.modules())
    assert n_int8 == sum(type(m) is PackedLinear for m in fp32.modules())
    monkeypatch.setenv("FASTEAGLE_DRAFT_INT8", "0")
    assert CascadedDrafter.load(tmp_path / "d", packed.model).packing == "fp32"
    ids = torch.randint(4, 320, (9,), generator=torch.Generator().manual_seed(1))
    feats = torch.randn(9, len(cfg.feature_layers) * cfg.target_hidden)
    with torch.inference_mode():
        for d in (fp32, int8):
            d.reset(64)
            d.extend(ids, feats, 7)
        p, q = fp32.depth_probs(), int8.depth_probs()
        assert not torch.equal(p, q)
        torch.testing.assert_close(q, p, rtol=0, atol=0.05)
    for seed, (prompt, ref) in enumerate(zip(prompts, refs)):
        int8.tree_budget = 8
        out, _ = run(packed, prompt, drafter=int8, max_new_tokens=30, seed=seed)
        assert out == ref
        # untrained, it accepts nothing: steered, its int8 products run over several accepted rows too
        steered = steer(CascadedDrafter.load(tmp_path / "d", packed.model, int8=True), ref, seed=seed)
        steered.tree_budget = 8
        out, traces = run(packed, prompt, drafter=steered, max_new_tokens=30)
        assert out == ref and steered.packing == "int8"
        assert traces[-1].tau > 1.8 and max(len(t.path) for t in traces[1:]) >= 3


def test_moe_experts_give_each_token_the_same_numbers_whatever_tokens_share_its_experts():
    """A verify forward routes a tree's tokens through experts together, a decode step one token alone: with the
    prepacked router and experts each token's output is the same to the bit, and close to the stock loop's."""
    from transformers import MixtralConfig
    from transformers.models.mixtral.modeling_mixtral import MixtralSparseMoeBlock

    torch.manual_seed(0)
    cfg = MixtralConfig(hidden_size=64, intermediate_size=96, num_local_experts=8, num_experts_per_tok=2)
    cfg._experts_implementation = "eager"
    block = MixtralSparseMoeBlock(cfg).eval()
    for p in block.parameters():
        nn.init.normal_(p, std=0.2)
    x = torch.randn(1, 9, 64)
    with torch.no_grad():
        eager = block(x)
        assert packing.pack_experts(block) == 1
        together = block(x)
        alone = torch.cat([block(x[:, i:i + 1]) for i in range(9)], dim=1)
    assert torch.equal(together, alone)
    torch.testing.assert_close(together, eager, rtol=1e-5, atol=1e-5)
    with torch.enable_grad():  # autograd takes the stock loop
        torch.testing.assert_close(block(x), eager, rtol=0, atol=0)
