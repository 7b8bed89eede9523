"""The sparse target of the MoE study (`fasteagle.train.moefy`): its experts are the dense MLP's neurons,
grouped by when they fire; with every expert chosen and equal weights a block is the dense MLP; a fitted router
picks the expert that matters; what it saves is a stock Mixtral that our engine decodes losslessly. The routing
analysis joins each step with the position its draft read, and the study's report joins its files."""

from __future__ import annotations

import json

import pytest
import torch

from fasteagle.bench import moe, routing
from fasteagle.bench.reports import markdown_table
from fasteagle.draftconfig import DrafterConfig
from fasteagle.drafter import CascadedDrafter
from fasteagle.generate import run
from fasteagle.target import load_target
from fasteagle.trace import StepTrace
from fasteagle.train import moefy
from tests.conftest import TINY_VOCAB, tiny_target
from tests.drafters import RandomDrafter
from tests.test_bad_inputs import assert_one_line_error, run_main

EXPERTS = 4


@pytest.fixture(scope="module")
def dense():
    return tiny_target(seed=3)


def inputs(n: int = 256, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, 64, generator=torch.Generator().manual_seed(seed))


def test_neuron_groups_are_an_even_partition_that_finds_neurons_firing_together():
    """Four blocks of 32 neurons, each block firing on its own quarter of the tokens, shuffled: the groups are
    the blocks."""
    gen = torch.Generator().manual_seed(0)
    acts = torch.zeros(400, 128)
    for b in range(4):
        acts[b * 100:(b + 1) * 100, b * 32:(b + 1) * 32] = torch.rand(100, 32, generator=gen) + 0.5
    perm = torch.randperm(128, generator=gen)
    groups = moefy.neuron_groups(acts[:, perm], 4)
    assert groups.shape == (4, 32) and sorted(groups.flatten().tolist()) == list(range(128))
    blocks = {frozenset((perm[g] // 32).tolist()) for g in groups}
    assert blocks == {frozenset({b}) for b in range(4)}


def test_every_expert_with_a_flat_router_is_the_dense_mlp(dense):
    mlp = dense.model.model.layers[0].mlp
    x = inputs()
    groups = moefy.neuron_groups(moefy.activations(mlp, x).detach(), EXPERTS)
    block = moefy.moe_block(moefy.mixtral_config(dense.model.config, EXPERTS, EXPERTS), mlp, groups)
    with torch.no_grad():
        torch.testing.assert_close(block(x[None])[0], mlp(x), rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(moefy.expert_parts(mlp, groups, x).sum(1), mlp(x), rtol=1e-4, atol=1e-5)


def test_a_fitted_router_picks_the_expert_that_matters():
    """Tokens from 4 clusters; on each, the expert of its cluster writes almost all of the output. A flat router
    picks one expert for every token and misses most of it; the fitted one picks by cluster."""
    gen = torch.Generator().manual_seed(0)
    cluster = torch.randint(0, EXPERTS, (512,), generator=gen)
    x = torch.nn.functional.one_hot(cluster, 64).float() * 3 + 0.3 * torch.randn(512, 64, generator=gen)
    parts = 0.05 * torch.randn(512, EXPERTS, 16, generator=gen)
    parts[torch.arange(512), cluster] += torch.randn(512, 16, generator=gen)
    dense = parts.sum(1)
    flat = float((moefy.mix(parts, torch.zeros(512, EXPERTS), 1) - dense).pow(2).sum(-1).mean()
                 / dense.pow(2).sum(-1).mean())
    weight, err = moefy.fit_router(parts, x, 1, steps=150)
    assert weight.shape == (EXPERTS, 64) and flat > 0.5 and err < 0.05, (err, flat)


SEQS = [torch.randint(4, TINY_VOCAB, (48,), generator=torch.Generator().manual_seed(s)).tolist() for s in range(4)]


def test_fitting_the_block_makes_up_for_the_neurons_its_token_did_not_pick(dense):
    """Top-1 of 4 experts after its router's fit misses most of the dense MLP; trained together on the layer's
    own output, the chosen expert and the router make up part of it, and the block is frozen again."""
    mlp = dense.model.model.layers[0].mlp
    x = inputs(512)
    groups = moefy.neuron_groups(moefy.activations(mlp, x).detach(), EXPERTS)
    parts = moefy.expert_parts(mlp, groups, x)
    weight, err = moefy.fit_router(parts, x, 1, steps=50)
    block = moefy.moe_block(moefy.mixtral_config(dense.model.config, EXPERTS, 1), mlp, groups)
    with torch.no_grad():
        block.gate.weight.copy_(weight)
        before = float((block(x[None])[0] - mlp(x)).pow(2).sum(-1).mean() / mlp(x).pow(2).sum(-1).mean())
    after = moefy.fit_block(block, x, parts.sum(1), steps=100, lr=1e-2)
    assert before == pytest.approx(err, rel=1e-3) and after < 0.7 * before, (before, after)
    assert not any(p.requires_grad for p in block.parameters())


@pytest.fixture(scope="module")
def sparse(tmp_path_factory):
    """(the changed tiny target, its stock Mixtral, the folder it is saved in, moefy's per-layer stats)."""
    target = tiny_target(seed=4)
    stats = moefy.moefy(target.model, SEQS, EXPERTS, 1, tokens=128, steps=20, block_steps=5)
    model = moefy.as_mixtral(target.model)
    folder = tmp_path_factory.mktemp("sparse")
    model.save_pretrained(folder)
    target.tokenizer.save_pretrained(folder)
    return target, model, folder, stats


def test_the_sparse_model_saves_as_a_mixtral_our_engine_decodes_losslessly(sparse):
    target, sparse, folder, stats = sparse
    seqs = SEQS
    assert [s["layer"] for s in stats] == [0, 1]
    assert all(0 <= s["block_error"] and 0 <= s["router_error"] for s in stats)
    loaded = load_target(str(folder), device="cpu", dtype="fp32")
    assert loaded.model.config.model_type == "mixtral" and loaded.model.config.num_experts_per_tok == 1
    ids = torch.tensor(seqs[0][:20])
    with torch.no_grad():  # the in-place changed model, the stock Mixtral and the loaded copy: the same logits
        want = target.model(ids[None]).logits
        torch.testing.assert_close(sparse(ids[None]).logits, want)
        torch.testing.assert_close(loaded.model(ids[None]).logits, want)
    plain, _ = run(loaded, ids, max_new_tokens=24, stop_ids=set())
    drafted, _ = run(loaded, ids, drafter=RandomDrafter(TINY_VOCAB, "product", 4, 3, 12), max_new_tokens=24,
                     stop_ids=set())
    assert drafted == plain


def test_a_k_above_a_quarter_of_the_experts_is_one_line(tmp_path, capsys):
    rc, _, err = run_main(moefy.main, ["--out", str(tmp_path / "m"), "--experts", "16", "--top-k", "8"], capsys)
    assert_one_line_error(rc, err, "--experts/4")


def test_routing_change_is_the_share_of_experts_newly_picked():
    picks = torch.tensor([[0, 1], [1, 2], [3, 4], [4, 3]])
    assert routing.change(picks).tolist() == [0.0, 0.5, 1.0, 0.0]


def test_each_step_is_joined_with_the_position_its_draft_read():
    """A 5-token prompt; the prefill writes 1 token, step 1 accepts a draft (2 tokens), step 2 none. Step 1's
    draft reads position 4 (the prompt's last, which wrote the prefill's token) and is judged by position 5's
    state; step 2's reads 6 and is judged by 7's."""
    def trace(tokens, path):
        return StepTrace(step=0, tokens=tokens, token_depths=[0] * len(tokens), text="", draft_ms=0.0,
                         verify_ms=0.0, path=path)

    moved = {3: torch.arange(10, dtype=torch.float64) / 8}
    rows = routing.step_rows(5, [trace([7], []), trace([8, 9], [0, 1]), trace([10], [0])], moved)
    assert rows == [{"hit": True, "seen": {"3": 0.5}, "unseen": {"3": 0.625}},
                    {"hit": False, "seen": {"3": 0.75}, "unseen": {"3": 0.875}}]


def test_routes_are_the_routers_own_picks_and_analyse_follows_a_drafter(sparse):
    target, model, folder, _ = sparse
    ids = SEQS[1][:16]
    seen = {}
    gate = model.model.layers[1].mlp.gate
    handle = gate.register_forward_pre_hook(lambda _m, args: seen.setdefault("x", args[0].reshape(16, -1)))
    picks = routing.routes(model, ids, [0, 1])
    handle.remove()
    assert set(picks) == {0, 1} and picks[0].shape == (16, 1)
    assert torch.equal(picks[1][:, 0], (seen["x"] @ gate.weight.T).argmax(-1))
    loaded = load_target(str(folder), device="cpu", dtype="fp32")
    torch.manual_seed(0)
    cfg = DrafterConfig.for_target(loaded.model, loaded.name, num_layers=3, intermediate=64)
    drafter = CascadedDrafter(cfg).attach(loaded.model).eval()
    out = routing.analyse(loaded, {"cascade": drafter}, [SEQS[2][:12], SEQS[3][:12]], depth=3, max_new=12)
    entry = out["cascade"]
    layers = [str(i - 1) for i in cfg.feature_layers if i > 0]
    assert entry["steps"] > 0 and set(entry["layers"]) == set(layers)
    total = sum(entry["layers"][layers[0]][f"steps_{n}_changed"] for n in ("none", "some", "all"))
    assert total == entry["steps"]


def fake_study(run, taus: dict) -> None:
    """A finished MoE study's files, with these tau per "target/arm" (seed 0, seed 1)."""
    def put(path, doc):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(doc))

    put(run / "target" / "quality.json", {"experts": 16, "chosen_top_k": 2, "dense_perplexity": 10.0, "top_k": {
        "4": {"perplexity": 10.5, "perplexity_ratio": 1.05, "top1_agreement": 0.9, "identical_replies": 3,
              "replies": 24},
        "2": {"perplexity": 10.9, "perplexity_ratio": 1.09, "top1_agreement": 0.8, "identical_replies": 1,
              "replies": 24}}})
    for target in moe.TARGETS:
        methods = {"vanilla": {"tokens_per_s": 30.0}}
        for name in moe.ARMS:
            for seed in moe.SEEDS:
                label = f"{name}-s{seed}"
                put(run / target / label / "history.json",
                    [{"step": s, "loss1": 5.0 - s / 100, "loss2": 6.0, "acc1": 0.2} for s in (50, 100, 150, 220)])
                put(run / target / label / "config.json", {"training": {"train_minutes_all": 22.0}})
                methods[label] = {"tau": taus[f"{target}/{name}"][seed], "depth_acceptance": [0.2, 0.1, 0.0],
                                  "speedup_vs_vanilla": 0.95, "tokens_per_s": 28.0, "identical_to_vanilla": 24,
                                  "prompts": 24}
        put(run / "compare" / f"{target}-chain6.json", {"methods": methods})
    put(run / "compare" / "routing.json", {"drafters": {"cascade-s0": {"layers": {"0": {
        "seen_change_hits": 0.1, "seen_change_misses": 0.3, "unseen_change_hits": 0.2, "unseen_change_misses": None,
        "accept_when_none_changed": 0.4, "steps_none_changed": 10, "accept_when_some_changed": None,
        "steps_some_changed": 0, "accept_when_all_changed": 0.1, "steps_all_changed": 5}}}}})


def test_the_study_report_joins_its_files_and_says_the_ratio(tmp_path):
    taus = {"dense/cascade": (1.20, 1.22), "dense/eagle3": (1.25, 1.25), "sparse/cascade": (1.08, 1.10),
            "sparse/eagle3": (1.20, 1.20)}
    fake_study(tmp_path, taus)
    rc = moe.main(["--run", str(tmp_path), "--out", str(tmp_path / "study.json")])
    doc = json.loads((tmp_path / "study.json").read_text())
    s = doc["moe_study"]
    assert rc == 0 and s["tau"]["sparse/cascade"] == [1.09, 0.02]
    assert s["cascade_tau_sparse_over_dense"] == round(1.09 / 1.21, 3)
    assert s["arms"]["sparse/eagle3"][1]["minutes"] == 22.0  # the trainer's own minutes, resumes counted
    assert s["arms"]["dense/cascade"][0]["loss_curve"] == {"steps": [50, 100, 150, 220],
                                                          "loss": [[4.5, 4.0, 3.5, 2.8], [6.0] * 4]}
    table = markdown_table(doc)
    assert "top-2 of 16 experts" in table and "1.090 ± 0.010" in table and "0.40 (10)" in table
    assert "| 22.0, 22.0 |" in table  # each seed's training minutes
    assert "100: 4.00, 6.00 / 150: 3.50, 6.00 / 220: 2.80, 6.00" in table  # the curve's points, the last included
    assert (tmp_path / "study.md").read_text() == table
    chart = (tmp_path / "study.html").read_text()
    assert "sparse, depth 2" in chart and "training step" in chart


def test_the_loss_table_points_are_evenly_spaced_and_end_at_the_last():
    assert moe.table_points(4) == [1, 2, 3] and moe.table_points(1) == [0] and moe.table_points(0) == []
    assert moe.table_points(41) == [10, 20, 30, 40]


def test_a_study_not_run_to_its_end_is_one_line(tmp_path, capsys):
    fake_study(tmp_path, {k: (1.0, 1.0) for k in ("dense/cascade", "dense/eagle3", "sparse/cascade", "sparse/eagle3")})
    (tmp_path / "compare" / "routing.json").unlink()
    rc, _, err = run_main(moe.main, ["--run", str(tmp_path), "--out", str(tmp_path / "s.json")], capsys)
    assert_one_line_error(rc, err, "routing.json")


def _sparse_copy(seed: int = 5):
    target = tiny_target(seed=seed)
    moefy.moefy(target.model, SEQS, EXPERTS, 1, tokens=128, steps=20)
    return moefy.as_mixtral(target.model)


def test_the_fine_tune_brings_the_sparse_model_towards_dense_and_resumes(tmp_path):
    dense = tiny_target(seed=5).model
    ids = torch.tensor(SEQS)

    def kl(model) -> float:
        with torch.no_grad():
            want = torch.log_softmax(dense(ids).logits, -1)
            got = torch.log_softmax(model(ids).logits, -1)
        return float(torch.nn.functional.kl_div(got, want, log_target=True, reduction="none").sum(-1).mean())

    sparse = _sparse_copy()
    before = kl(sparse)
    done = moefy.finetune(dense, sparse, SEQS, minutes=10, folder=tmp_path, lr=3e-3, save_every=4, max_steps=10)
    assert done["steps"] == 10 and kl(sparse) < 0.9 * before, (done, before, kl(sparse))
    again = _sparse_copy()  # rebuilt as a rerun does: the checkpoint carries it to where the first run stopped
    resumed = moefy.finetune(dense, again, SEQS, minutes=10, folder=tmp_path, lr=3e-3, max_steps=10)
    assert resumed["steps"] == done["steps"]
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, sparse(ids).logits)


def test_a_build_is_kept_and_read_back_and_other_settings_make_the_old_fine_tune_stale(tmp_path, monkeypatch):
    """A resumed study does not rebuild: the same settings read the saved build back (no `moefy` call, the same
    logits); other settings rebuild and remove the fine-tune checkpoint made on the old build."""
    args = moefy.parser().parse_args(["--out", str(tmp_path), "--experts", str(EXPERTS), "--top-k", "1",
                                      "--calib-tokens", "128", "--router-steps", "20", "--block-steps", "5"])
    dense = tiny_target(seed=6)
    model = dense.model
    held = [(ids, [1] * len(ids)) for ids in SEQS]
    first, made = moefy.build_once(model, dense.tokenizer, SEQS, held, args, 1)
    assert made["settings"]["block_steps"] == 5 and made["perplexity_before_finetune"] > 1
    assert (tmp_path / "built-k1" / "build.json").exists()
    assert load_target(str(tmp_path / "built-k1"), device="cpu", dtype="fp32").model.config.model_type == "mixtral"
    real = moefy.moefy

    def no_rebuild(*_a, **_k):
        raise AssertionError("rebuilt")

    monkeypatch.setattr(moefy, "moefy", no_rebuild)
    again, same = moefy.build_once(model, dense.tokenizer, SEQS, held, args, 1)
    assert same == made
    ids = torch.tensor(SEQS[0][:16])[None]
    with torch.no_grad():
        torch.testing.assert_close(again(ids).logits, first(ids).logits)
    monkeypatch.setattr(moefy, "moefy", real)
    ckpt = tmp_path / "finetune-k1" / "checkpoint.pt"
    ckpt.parent.mkdir()
    ckpt.write_bytes(b"old")
    args.block_steps = 6
    _, other = moefy.build_once(model, dense.tokenizer, SEQS, held, args, 1)
    assert other["settings"]["block_steps"] == 6 and not ckpt.exists()
