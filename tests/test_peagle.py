"""Parallel EAGLE: mask rows see the real rows up to their anchor and their own block's earlier rows, drafting
after `extend` equals the teacher-forced forward it trains with (blocks chunked or not), the loss trains the
mask row, greedy losslessness, save/load and the method registry, and the checkpoint vLLM's eagle3 path loads
with `parallel_drafting` (`mask_hidden`, `mask_token_id`)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from fasteagle import eagle3_format, peagle
from fasteagle.draftconfig import DrafterConfig
from fasteagle.errors import FastEagleError
from fasteagle.generate import run
from fasteagle.methods import Settings, build, drafter_kind, load_drafter
from fasteagle.peagle import ParallelEagleDrafter
from tests.conftest import TINY_VOCAB
from tests.drafters import steer

K = 4


def make(target, depth: int = K) -> ParallelEagleDrafter:
    torch.manual_seed(0)
    cfg = DrafterConfig.for_target(target.model, target.name, num_layers=1, intermediate=96, feature_layers=[1, 2])
    cfg.layout = "eagle3"
    cfg = ParallelEagleDrafter.config_for(cfg, depth, mask_token_id=3)
    return ParallelEagleDrafter(cfg).attach(target.model).eval()


def features(target, ids: torch.Tensor, layers) -> torch.Tensor:
    with torch.no_grad():
        out = target.model(input_ids=ids, output_hidden_states=True)
    return torch.cat([out.hidden_states[i] for i in layers], -1)


def test_a_block_reads_the_rows_up_to_its_anchor_and_nothing_after(tiny):
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
    for x, y in zip(a, b):  # depth 1 and the block at t read features 0..t and tokens 1..t+1 only
        torch.testing.assert_close(x[:, :9], y[:, :9])
        assert not torch.allclose(x[:, 9:], y[:, 9:])


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


def test_the_loss_runs_blocks_only_where_a_token_counts_and_trains_the_mask_row(tiny):
    d = make(tiny)
    d.train()
    ids = torch.randint(4, TINY_VOCAB, (2, 24))
    f = features(tiny, ids, d.cfg.feature_layers)
    mask = torch.zeros(2, 24)
    mask[0, 10:] = 1
    mask[1, 16:22] = 1
    t_ids = torch.randint(4, TINY_VOCAB, (2, 24, 3))
    t_p = torch.softmax(torch.randn(2, 24, 3), -1)
    loss, stats = d.loss(f, ids, mask, t_ids, t_p)
    ParallelEagleDrafter.BLOCKS = False  # every position's block: the same loss
    try:
        everywhere, _ = d.loss(f, ids, mask, t_ids, t_p)
    finally:
        ParallelEagleDrafter.BLOCKS = True
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
    assert d.mask_hidden.grad is not None and bool(d.mask_hidden.grad.abs().sum() > 0)


@pytest.mark.parametrize("k,budget", [(1, 4), (3, 12)])
def test_parallel_eagle_decoding_is_lossless(tiny, k, budget):
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
    d.save(tmp_path / "peagle")
    assert drafter_kind(tmp_path / "peagle") == "peagle"
    back = load_drafter(tmp_path / "peagle", tiny.model)
    for (name, a), b in zip(d.state_dict().items(), back.state_dict().values()):
        torch.testing.assert_close(a.float(), b.float(), atol=1e-3, rtol=1e-3, msg=name)
    m = build("peagle", tiny, Settings(peagle_drafter=tmp_path / "peagle", tree_budget=5))
    assert isinstance(m, ParallelEagleDrafter) and m.tree_budget == 5
    ids = torch.randint(4, TINY_VOCAB, (10,))
    assert run(tiny, ids, drafter=m, max_new_tokens=12)[0] == run(tiny, ids, max_new_tokens=12)[0]
    named = build("mine", tiny, Settings(named=(("mine", tmp_path / "peagle"),)))
    assert isinstance(named, ParallelEagleDrafter)


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
