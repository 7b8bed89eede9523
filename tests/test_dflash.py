"""The DFlash drafter: a block sees only the context before its anchor and its own rows, drafting after
`extend` equals the teacher-forced forward it trains with, the loss computes blocks only where a token counts,
save/load and the method registry, greedy losslessness, and the checkpoint stock vLLM reads (names and config
as `vllm/model_executor/models/qwen3_dflash.py` loads them)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from fasteagle import dflash, eagle3_format
from fasteagle.dflash import DFlashDrafter
from fasteagle.draftconfig import DrafterConfig
from fasteagle.errors import FastEagleError
from fasteagle.generate import run
from fasteagle.methods import Settings, build, drafter_kind, load_drafter
from tests.conftest import TINY_VOCAB
from tests.drafters import steer

K = 4


def make(target, depth: int = K, layers: int = 2) -> DFlashDrafter:
    torch.manual_seed(0)
    cfg = DrafterConfig.for_target(target.model, target.name, num_layers=layers, intermediate=96, feature_layers=[1, 2])
    cfg = DFlashDrafter.config_for(cfg, depth, mask_token_id=3)
    return DFlashDrafter(cfg).attach(target.model).eval()


def features(target, ids: torch.Tensor, layers) -> torch.Tensor:
    with torch.no_grad():
        out = target.model(input_ids=ids, output_hidden_states=True)
    return torch.cat([out.hidden_states[i] for i in layers], -1)


def test_a_block_reads_the_context_before_its_anchor_and_nothing_after(tiny):
    d = make(tiny)
    ids = torch.randint(4, TINY_VOCAB, (1, 16))
    f = features(tiny, ids, d.cfg.feature_layers)
    with torch.no_grad():
        a = d.depth_outputs(f[:, :-1], ids[:, 1:])
        f2, ids2 = f.clone(), ids.clone()
        f2[:, 9:] += torch.randn_like(f2[:, 9:])  # features 9.. and tokens 10.. change
        ids2[:, 10:] = torch.randint(4, TINY_VOCAB, (1, 6))
        b = d.depth_outputs(f2[:, :-1], ids2[:, 1:])
    assert len(a) == K and all(o.shape == (1, 15, d.cfg.width) for o in a)
    for x, y in zip(a, b):  # the block at t reads features 0..t and token t+1 only
        torch.testing.assert_close(x[:, :9], y[:, :9])
        assert not torch.allclose(x[:, 9:], y[:, 9:])


def test_drafting_after_extend_is_the_forward_it_trains_with(tiny, monkeypatch):
    """Fed in chunks, the cache's context keys and values and the block [root, masks] give each depth the
    distribution the teacher-forced forward gives at that position, blocks run one chunk at a time or all at
    once."""
    d = make(tiny)
    ids = torch.randint(4, TINY_VOCAB, (1, 20))
    f = features(tiny, ids, d.cfg.feature_layers)
    with torch.no_grad():
        full = d.depth_outputs(f[:, :-1], ids[:, 1:])
        monkeypatch.setattr(dflash, "ANCHOR_CHUNK", 3)
        chunked = d.depth_outputs(f[:, :-1], ids[:, 1:])
    for x, y in zip(full, chunked):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-4)
    d.reset(64)
    d.extend(ids[0, :7], f[0, :7], int(ids[0, 7]))
    d.extend(ids[0, 7:13], f[0, 7:13], int(ids[0, 13]))
    got = d.depth_probs(int(ids[0, 13]))  # the block anchored at 13: full's position 12
    want = torch.stack([d.head(o[0, 12], 1).float().softmax(-1) for o in full])
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)


def test_the_loss_runs_blocks_only_where_a_token_counts_and_trains(tiny):
    d = make(tiny)
    d.train()
    ids = torch.randint(4, TINY_VOCAB, (2, 24))
    f = features(tiny, ids, d.cfg.feature_layers)
    mask = torch.zeros(2, 24)
    mask[0, 10:] = 1
    mask[1, 16:22] = 1  # a reply that ends before the row does
    t_ids = torch.randint(4, TINY_VOCAB, (2, 24, 3))
    t_p = torch.softmax(torch.randn(2, 24, 3), -1)
    loss, stats = d.loss(f, ids, mask, t_ids, t_p)
    DFlashDrafter.BLOCKS = False  # every position's block: the same loss
    try:
        everywhere, _ = d.loss(f, ids, mask, t_ids, t_p)
    finally:
        DFlashDrafter.BLOCKS = True
    torch.testing.assert_close(loss, everywhere)
    assert {f"acc{i}" for i in range(1, K + 1)} <= set(stats)
    opt = torch.optim.Adam(d.parameters(), lr=3e-3)
    first = float(loss.detach())
    for _ in range(30):
        loss, _ = d.loss(f, ids, mask, t_ids, t_p)
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert float(loss.detach()) < 0.5 * first
    assert d.mask_embedding.grad is not None and bool(d.mask_embedding.grad.abs().sum() > 0)


@pytest.mark.parametrize("k,budget", [(1, 4), (3, 12)])
def test_dflash_decoding_is_lossless(tiny, k, budget):
    """Untrained, its drafts are rejected; steered to the reply (its layers, cache and tree still its own),
    deep paths are accepted: both give vanilla's output."""
    d = make(tiny)
    d.tree_k, d.tree_budget = k, budget
    ids = torch.randint(4, TINY_VOCAB, (10,))
    want, _ = run(tiny, ids, max_new_tokens=30)
    assert run(tiny, ids, drafter=d, max_new_tokens=30)[0] == want
    got, traces = run(tiny, ids, drafter=steer(d, want), max_new_tokens=30)
    assert got == want and traces[-1].tau > 2.0
    assert max(len(t.tree["tokens"]) for t in traces[1:]) <= budget


def test_it_saves_loads_and_decodes_as_a_method(tiny, tmp_path):
    d = make(tiny)
    d.save(tmp_path / "dflash")
    assert drafter_kind(tmp_path / "dflash") == "dflash"
    back = load_drafter(tmp_path / "dflash", tiny.model)
    for (name, a), b in zip(d.state_dict().items(), back.state_dict().values()):
        torch.testing.assert_close(a.float(), b.float(), atol=1e-3, rtol=1e-3, msg=name)
    m = build("dflash", tiny, Settings(dflash_drafter=tmp_path / "dflash", tree_budget=5))
    assert isinstance(m, DFlashDrafter) and m.tree_budget == 5
    ids = torch.randint(4, TINY_VOCAB, (10,))
    assert run(tiny, ids, drafter=m, max_new_tokens=12)[0] == run(tiny, ids, max_new_tokens=12)[0]


def test_export_writes_what_vllms_dflash_loader_reads(tiny, tmp_path):
    d = make(tiny, layers=2)
    out = eagle3_format.export(d, tmp_path / "vllm")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["DFlashDraftModel"] and cfg["model_type"] == "qwen3"
    assert cfg["dflash_config"] == {"mask_token_id": 3, "target_layer_ids": [j - 1 for j in d.cfg.feature_layers]}
    assert cfg["head_dim"] == d.cfg.head_dim and cfg["num_key_value_heads"] == d.cfg.num_kv_heads
    assert cfg["rope_parameters"]["rope_theta"] == d.cfg.rope_theta and "eagle_config" not in cfg
    names = set(load_file(out / "model.safetensors"))
    layer = {f"layers.{i}.{n}.weight" for i in range(2) for n in (
        "input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
        "self_attn.o_proj", "self_attn.q_norm", "self_attn.k_norm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")}
    assert names == layer | {"fc.weight", "hidden_norm.weight", "norm.weight"}  # the target's head, shared
    d.shrink_vocab(torch.arange(4, 100))  # over part of the vocabulary: its head rows and d2t, as vLLM reads them
    part = eagle3_format.export(d, tmp_path / "part")
    state = load_file(part / "model.safetensors")
    assert set(state) == names | {"lm_head.weight", "d2t", "t2d"}
    assert json.loads((part / "config.json").read_text())["draft_vocab_size"] == 96
    assert torch.equal(state["d2t"] + torch.arange(96), torch.arange(4, 100))
    mask = torch.load(out / "mask_embedding.pt", weights_only=True)
    assert mask["mask_token_id"] == 3 and torch.equal(mask["embedding"], d.mask_embedding.detach())
    d.cfg.feature_layers = [2, 1]  # vLLM would sort them and read the fc's columns in another order
    with pytest.raises(FastEagleError, match="ascending"):
        eagle3_format.export(d, tmp_path / "unordered")


def test_the_layers_share_one_k_norm_and_save_it_per_layer(tiny, tmp_path):
    d = make(tiny, layers=3)
    assert len({id(layer.self_attn.k_norm.weight) for layer in d.layers}) == 1
    with torch.no_grad():
        d.layers[0].self_attn.k_norm.weight.mul_(1.5)
    out = eagle3_format.export(d, tmp_path / "vllm")
    state = load_file(out / "model.safetensors")
    for i in range(3):
        torch.testing.assert_close(state[f"layers.{i}.self_attn.k_norm.weight"], torch.full((d.cfg.head_dim,), 1.5))
    d.save(tmp_path / "ours", dtype=torch.float32)
    back = load_drafter(tmp_path / "ours", tiny.model)
    assert back.layers[2].self_attn.k_norm.weight is back.layers[0].self_attn.k_norm.weight


def test_vllm_is_given_no_more_drafted_tokens_than_the_block_was_trained_for(tiny, tmp_path):
    from fasteagle.vllm_engine import speculative_config

    out = eagle3_format.export(make(tiny), tmp_path / "vllm")  # blocks of K = 4 masks
    assert speculative_config("dflash", out, K) == {"method": "dflash", "model": str(out), "num_speculative_tokens": K}
    with pytest.raises(FastEagleError, match="k=5 is more"):
        speculative_config("dflash", out, K + 1)
