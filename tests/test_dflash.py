"""The DFlash drafter: drafting after `extend` equals the teacher-forced forward it trains with, and the
checkpoint stock vLLM reads (names and config as `vllm/model_executor/models/qwen3_dflash.py` loads them).
What it shares with parallel EAGLE is tested in test_block_drafters.py."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from fasteagle import dflash, eagle3_format
from fasteagle.dflash import DFlashDrafter
from fasteagle.draftconfig import DrafterConfig
from fasteagle.errors import FastEagleError
from fasteagle.methods import load_drafter
from tests.conftest import TINY_VOCAB
from tests.drafters import features

K = 4


def make(target, depth: int = K, layers: int = 2) -> DFlashDrafter:
    torch.manual_seed(0)
    cfg = DrafterConfig.for_target(target.model, target.name, num_layers=layers, intermediate=96, feature_layers=[1, 2])
    cfg = DFlashDrafter.config_for(cfg, depth, mask_token_id=3)
    return DFlashDrafter(cfg).attach(target.model).eval()


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
