"""Parallel EAGLE: drafting after `extend` equals the teacher-forced forward it trains with (blocks chunked or
not, each batch row its own), and the checkpoint vLLM's eagle3 path loads with `parallel_drafting`
(`mask_hidden`, `mask_token_id`). What it shares with DFlash is tested in test_block_drafters.py."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from fasteagle import eagle3_format, peagle
from fasteagle.draftconfig import DrafterConfig
from fasteagle.errors import FastEagleError
from fasteagle.peagle import ParallelEagleDrafter
from tests.conftest import TINY_VOCAB
from tests.drafters import features

K = 4


def make(target, depth: int = K) -> ParallelEagleDrafter:
    torch.manual_seed(0)
    cfg = DrafterConfig.for_target(target.model, target.name, num_layers=1, intermediate=96, feature_layers=[1, 2])
    cfg.layout = "eagle3"
    cfg = ParallelEagleDrafter.config_for(cfg, depth, mask_token_id=3)
    return ParallelEagleDrafter(cfg).attach(target.model).eval()


def test_drafting_after_extend_is_the_forward_it_trains_with(tiny, monkeypatch):
    d = make(tiny)
    ids = torch.randint(4, TINY_VOCAB, (2, 20))
    f = features(tiny, ids, d.cfg.feature_layers)
    with torch.no_grad():
        full = d.depth_outputs(f[:, :-1], ids[:, 1:])
        monkeypatch.setattr(peagle, "ANCHOR_CHUNK", 3)
        chunked = d.depth_outputs(f[:, :-1], ids[:, 1:])
    for x, y in zip(full, chunked):
        torch.testing.assert_close(x, y, atol=1e-5, rtol=1e-4)
    for r in range(2):  # each batch row's blocks read that row's real rows
        d.reset(64)
        d.extend(ids[r, :7], f[r, :7], int(ids[r, 7]))
        d.extend(ids[r, 7:13], f[r, 7:13], int(ids[r, 13]))
        got = d.depth_probs(int(ids[r, 13]))  # the bonus row at position 12 and the 3 mask rows after it
        with torch.no_grad():
            want = torch.stack([d.head(o[r, 12], 1).float().softmax(-1) for o in full])
        torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-4)
        assert d.cache.length == 13  # the mask rows leave nothing behind
        torch.testing.assert_close(d.depth_probs(0, 2), want[:2], atol=1e-5, rtol=1e-4)  # a shorter chain: causal


def test_export_writes_what_vllms_parallel_eagle3_path_reads(tiny, tmp_path):
    from fasteagle.vllm_engine import speculative_config

    d = make(tiny)
    out = eagle3_format.export(d, tmp_path / "vllm")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["mask_token_id"] == 3
    assert cfg["fasteagle_kind"] == "peagle" and cfg["fasteagle_depth"] == K
    state = load_file(out / "model.safetensors")
    torch.testing.assert_close(state["mask_hidden"].view(-1), d.mask_hidden.detach())  # vLLM: view(1, -1)
    assert "midlayer.self_attn.q_proj.weight" in state and "fc.weight" in state
    assert speculative_config("peagle", out, K) == {"method": "eagle3", "model": str(out), "num_speculative_tokens": K,
                                                    "parallel_drafting": True}
    with pytest.raises(FastEagleError, match="k=5 is more"):
        speculative_config("peagle", out, K + 1)
    back = eagle3_format.load(out, tiny.model)  # an EAGLE-3 checkpoint all the same: it drafts one token a pass
    assert back.cfg.kind == "eagle3"


def test_it_starts_from_a_trained_eagle3_drafter_drafting_depth_1_as_that_one_did(tiny):
    from fasteagle.eagle3 import AutoregressiveDrafter

    torch.manual_seed(1)
    cfg = DrafterConfig.for_target(tiny.model, tiny.name, num_layers=1, intermediate=96, feature_layers=[1, 2])
    cfg.layout = "eagle3"
    e3 = AutoregressiveDrafter(AutoregressiveDrafter.config_for(cfg, K)).attach(tiny.model).eval()
    pe = ParallelEagleDrafter.from_eagle3(e3, mask_token_id=5).eval()
    assert pe.cfg.kind == "peagle" and pe.cfg.mask_token_id == 5 and e3.cfg.kind == "eagle3"
    ids = torch.randint(4, TINY_VOCAB, (1, 12))
    f = features(tiny, ids, cfg.feature_layers)
    with torch.no_grad():
        first, first_e3 = pe.depth_outputs(f[:, :-1], ids[:, 1:])[0], e3.depth_outputs(f[:, :-1], ids[:, 1:])[0]
    torch.testing.assert_close(first, first_e3)
