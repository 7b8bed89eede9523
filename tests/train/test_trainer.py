"""A tiny end-to-end training run: the pipeline lowers the layer-wise loss and raises the holdout
acceptance of the backbone tree, and writes a loadable drafter with its evaluation."""

from __future__ import annotations

import json

import pytest
import torch

from fasteagle.drafter import CascadedDrafter
from fasteagle.errors import FastEagleError
from fasteagle.generate import run
from fasteagle.train import trainer as trainer_mod
from fasteagle.train.config import TrainConfig
from fasteagle.train.data import load_token_dataset, save_token_dataset
from fasteagle.train.teacher import Batch, micro_batches
from fasteagle.train.trainer import lr_at, mixed_precision, process_share, train
from tests.conftest import TINY_VOCAB


def self_written(target, n: int, seed: int, new: int = 40) -> dict:
    """Sequences the tiny target writes itself (what self-distillation produces)."""
    g = torch.Generator().manual_seed(seed)
    data = {"input_ids": [], "loss_mask": [], "prompt_ids": [], "ids": []}
    for i in range(n):
        prompt = torch.randint(4, TINY_VOCAB, (6,), generator=g)
        reply, _ = run(target, prompt, max_new_tokens=new, stop_ids=set())
        data["input_ids"].append(prompt.tolist() + reply)
        data["loss_mask"].append([0] * 6 + [1] * len(reply))
        data["prompt_ids"].append(prompt.tolist())
        data["ids"].append(f"s{seed}-{i}")
    return data


def test_tiny_training_lowers_loss_and_raises_acceptance(tiny, tmp_path):
    save_token_dataset(self_written(tiny, 24, seed=1), tmp_path / "train.pt")
    save_token_dataset(self_written(tiny, 6, seed=2), tmp_path / "holdout.pt")
    cfg = TrainConfig(out=str(tmp_path / "drafter"), data=str(tmp_path / "train.pt"),
                      holdout_data=str(tmp_path / "holdout.pt"), num_layers=3, intermediate=96, topk=8,
                      batch_tokens=400, max_steps=120, warmup=5, lr=3e-3, eval_sequences=6, checkpoint_every=60,
                      device="cpu")
    out = train(cfg, target=tiny)
    history = json.loads((out / "history.json").read_text())
    assert history[-1]["loss"] < 0.7 * history[0]["loss"]
    ev = json.loads((out / "eval.json").read_text())
    assert ev["holdout"]["tau_backbone"] > ev["holdout_initial"]["tau_backbone"] + 0.3
    assert ev["holdout"]["depth_top1_given_spine"][0] > ev["holdout_initial"]["depth_top1_given_spine"][0]
    drafter = CascadedDrafter.load(out, tiny.model)
    assert drafter.info["training"]["steps"] == 120
    # the trained drafter is still lossless, and now gets real acceptances
    held = load_token_dataset(tmp_path / "holdout.pt")
    prompt = torch.tensor(held["prompt_ids"][0])
    want, _ = run(tiny, prompt, max_new_tokens=30, stop_ids=set())
    got, traces = run(tiny, prompt, drafter=drafter, max_new_tokens=30, stop_ids=set())
    assert got == want
    assert traces[-1].tau > 1.2
    # the replayed tau of the evaluation is what greedy speculative decoding really does, per tree shape
    replay = ev["holdout"]["tau_replay"]
    assert replay["product"] >= replay["backbone"] > 1.2 and ev["holdout"]["tau_replay_budget"] == 60
    for shape in ("product", "backbone"):
        drafter.tree_shape, drafter.tree_budget = shape, 60
        tokens = forwards = 0
        for ids, mask in zip(held["input_ids"], held["loss_mask"]):
            n = sum(mask)
            reply, traces = run(tiny, torch.tensor(ids[: len(ids) - n]), drafter=drafter, max_new_tokens=n,
                                stop_ids=set())
            assert reply == ids[len(ids) - n:]
            tokens, forwards = tokens + traces[-1].generated - 1, forwards + traces[-1].forwards
        assert tokens / forwards == pytest.approx(replay[shape], abs=0.02), shape


def test_cpu_recipe_bf16_and_a_loss_over_frequent_tokens_still_trains_the_whole_vocab(tiny, tmp_path, monkeypatch):
    """The CPU fine-tuning recipe (bf16 matmuls, the softmax over the most frequent reply tokens plus the
    batch's teacher tokens) trains a drafter that drafts over the whole vocabulary: the holdout, scored
    with the full softmax, accepts much more than before, and decoding stays lossless."""
    save_token_dataset(self_written(tiny, 24, seed=1), tmp_path / "train.pt")
    save_token_dataset(self_written(tiny, 6, seed=2), tmp_path / "holdout.pt")
    cfg = TrainConfig(out=str(tmp_path / "drafter"), data=str(tmp_path / "train.pt"),
                      holdout_data=str(tmp_path / "holdout.pt"), num_layers=3, intermediate=96, topk=8,
                      batch_tokens=400, max_steps=120, warmup=5, lr=3e-3, eval_sequences=6, device="cpu",
                      mixed_precision="bf16", loss_vocab=16)
    monkeypatch.setattr(trainer_mod, "cpu_has_bf16", lambda: True)  # bf16 even where this CPU emulates it
    from accelerate.state import AcceleratorState
    AcceleratorState._reset_state()  # accelerate keeps one precision per process; the other tests run fp32
    try:
        out = train(cfg, target=tiny)
    finally:
        AcceleratorState._reset_state()
    ev = json.loads((out / "eval.json").read_text())
    assert ev["holdout"]["tau_backbone"] > ev["holdout_initial"]["tau_backbone"] + 0.3
    drafter = CascadedDrafter.load(out, tiny.model)
    assert drafter.vocab_ids.numel() == TINY_VOCAB and drafter.info["training"]["loss_vocab"] == 16
    prompt = torch.tensor(load_token_dataset(tmp_path / "holdout.pt")["prompt_ids"][0])
    want, _ = run(tiny, prompt, max_new_tokens=30, stop_ids=set())
    assert run(tiny, prompt, drafter=drafter, max_new_tokens=30, stop_ids=set())[0] == want
    with pytest.raises(FastEagleError, match="mixed_precision"):
        train(TrainConfig(out=str(tmp_path / "x"), mixed_precision="fp8", device="cpu"), target=tiny)


@pytest.mark.parametrize("features", ["online", "cache"])
def test_a_resumed_run_trains_on_what_an_unbroken_one_would(tiny, tmp_path, monkeypatch, features):
    """A run cut off after its step-3 checkpoint and started again goes on where the checkpoint stood
    (not from the epoch's start), with the optimizer, schedule and RNGs restored: the same batches in
    the same order as a run never cut off, and the same weights."""
    from fasteagle.train import trainer

    save_token_dataset(self_written(tiny, 8, seed=3, new=20), tmp_path / "train.pt")
    seen: list[int] = []
    cut_at = [0]  # stop the run when this many batches were seen (0: never)
    real = trainer.CascadedDrafter.forward

    def spy(self, feats, input_ids, *args, **kwargs):  # each optimizer step's batch, by its tokens
        if cut_at[0] and len(seen) == cut_at[0]:
            raise KeyboardInterrupt
        seen.append(int(input_ids.sum()) * 1000 + input_ids.numel())
        return real(self, feats, input_ids, *args, **kwargs)

    monkeypatch.setattr(trainer.CascadedDrafter, "forward", spy)
    kw = dict(data=str(tmp_path / "train.pt"), num_layers=2, intermediate=64, topk=4, batch_tokens=200, warmup=2,
              checkpoint_every=3, device="cpu", features=features, micro_batch=2, epochs=2, max_steps=7)
    whole = train(TrainConfig(out=str(tmp_path / "whole"), **kw), target=tiny)
    unbroken, seen[:], cut_at[0] = list(seen), [], 5
    with pytest.raises(KeyboardInterrupt):
        train(TrainConfig(out=str(tmp_path / "d"), **kw), target=tiny)
    state = json.loads((tmp_path / "d" / "checkpoint" / "state.json").read_text())
    assert state["step"] == 3 and state["train_seconds"] > 0
    seen[:], cut_at[0] = [], 0
    out = train(TrainConfig(out=str(tmp_path / "d"), **kw), target=tiny)
    assert len(unbroken) == 7 and seen == unbroken[3:]  # 7 steps cross into the second epoch
    assert CascadedDrafter.load(out, tiny.model).info["training"]["steps"] == 7
    a, b = CascadedDrafter.load(whole), CascadedDrafter.load(out)
    for (name, x), y in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.allclose(x, y, atol=1e-6), name


def test_a_resumed_timed_run_keeps_its_clock(tiny, tmp_path):
    """The wall-time schedule and budget go on from the checkpoint's training time, not from zero; so does
    the CPU time, which a paused or shared run's wall clock overstates."""
    save_token_dataset(self_written(tiny, 8, seed=3, new=20), tmp_path / "train.pt")
    kw = dict(out=str(tmp_path / "d"), data=str(tmp_path / "train.pt"), num_layers=2, intermediate=64, topk=4,
              batch_tokens=200, warmup=1, checkpoint_every=2, device="cpu", minutes=1.0)
    train(TrainConfig(max_steps=2, **kw), target=tiny)
    state_file = tmp_path / "d" / "checkpoint" / "state.json"
    assert json.loads(state_file.read_text())["cpu_seconds"] > 0
    state_file.write_text(json.dumps(json.loads(state_file.read_text()) | {"train_seconds": 60.0, "cpu_seconds": 30.0}))
    out = train(TrainConfig(max_steps=50, **kw), target=tiny)  # its minute is spent: no step more
    info = CascadedDrafter.load(out, tiny.model).info["training"]
    assert info["steps"] == 2 and info["train_minutes"] >= 1.0
    assert info["train_cpu_minutes"] == 0.5  # the checkpoint's CPU time, restored


def test_a_run_killed_while_checkpointing_resumes_from_the_checkpoint_before(tiny, tmp_path, monkeypatch):
    """A kill while a checkpoint is written leaves the one before it whole: the next run resumes from
    there (before, the new state overwrote the old in place, and a cut file broke the resume)."""
    from pathlib import Path

    from accelerate import Accelerator

    save_token_dataset(self_written(tiny, 8, seed=3, new=20), tmp_path / "train.pt")
    kw = dict(out=str(tmp_path / "d"), data=str(tmp_path / "train.pt"), num_layers=2, intermediate=64, topk=4,
              batch_tokens=200, warmup=1, checkpoint_every=2, device="cpu", max_steps=6)
    real, saves = Accelerator.save_state, []

    def killed_in_the_second(self, output_dir=None, **kwargs):
        saves.append(output_dir)
        real(self, output_dir, **kwargs)
        if len(saves) == 2:
            for f in Path(output_dir).iterdir():
                f.write_bytes(b"cut")
            raise KeyboardInterrupt

    monkeypatch.setattr(Accelerator, "save_state", killed_in_the_second)
    with pytest.raises(KeyboardInterrupt):
        train(TrainConfig(**kw), target=tiny)
    ckpt = tmp_path / "d" / "checkpoint"
    assert json.loads((ckpt / "state.json").read_text())["step"] == 2
    monkeypatch.setattr(Accelerator, "save_state", real)
    out = train(TrainConfig(**kw), target=tiny)
    assert CascadedDrafter.load(out, tiny.model).info["training"]["steps"] == 6
    assert json.loads((ckpt / "state.json").read_text())["step"] == 6
    assert sorted(p.name for p in ckpt.iterdir()) == ["state.json", "step-00000006"]


def test_each_process_takes_its_share_of_the_batches():
    order = [7, 3, 9, 0, 5, 2, 8]
    parts = [process_share(order, i, 3) for i in range(3)]
    assert parts == [[7, 0, 8], [3, 5], [9, 2]] and process_share(order, 0, 1) == order


def test_schedule_warms_up_then_anneals_by_steps_or_time():
    cfg = TrainConfig(out="x", lr=1.0, warmup=10)
    assert lr_at(cfg, 0, 100, 0) == 0.1
    assert lr_at(cfg, 10, 100, 0) > 0.9
    assert lr_at(cfg, 100, 100, 0) < 1e-6
    timed = TrainConfig(out="x", lr=1.0, warmup=1, minutes=1.0)
    assert lr_at(timed, 5, 10**6, 60.0) < 1e-6  # out of time: annealed although few steps were taken


def test_a_second_drafter_trains_on_the_first_runs_feature_cache(tiny, tmp_path):
    """`reuse_features`: the EAGLE-3-style baseline trains on exactly the shards the cascade saw."""
    save_token_dataset(self_written(tiny, 8, seed=4, new=20), tmp_path / "train.pt")
    kw = dict(data=str(tmp_path / "train.pt"), topk=4, batch_tokens=200, warmup=2, max_steps=2, features="cache",
              device="cpu", intermediate=64)
    train(TrainConfig(out=str(tmp_path / "a"), num_layers=2, **kw), target=tiny)
    shards = sorted((tmp_path / "a" / "features").glob("shard-*.pt"))
    stamps = [p.stat().st_mtime_ns for p in shards]
    out = train(TrainConfig(out=str(tmp_path / "b"), drafter="eagle3", depth=3, reuse_features=True,
                            feature_dir=str(tmp_path / "a" / "features"), **(kw | {"data": None})), target=tiny,
                command="python -m fasteagle train --drafter eagle3 --reuse-features")
    assert [p.stat().st_mtime_ns for p in shards] == stamps and not (tmp_path / "b" / "features").exists()
    assert json.loads((out / "config.json").read_text())["kind"] == "eagle3"
    assert "python -m fasteagle train --drafter eagle3 --reuse-features" in (out / "README.md").read_text()


def test_a_prompt_window_trains_on_shards_cut_to_each_reply(tiny, tmp_path):
    """`prompt_window`: the token data's cached shards keep `keep_prompt` tokens before each reply (here 2 of
    the 6-token prompts), and every reply token."""
    save_token_dataset(self_written(tiny, 8, seed=5, new=20), tmp_path / "train.pt")
    train(TrainConfig(out=str(tmp_path / "a"), data=str(tmp_path / "train.pt"), topk=4, batch_tokens=200, warmup=2,
                      max_steps=2, features="cache", device="cpu", intermediate=64, num_layers=2, prompt_window=True,
                      keep_prompt=2), target=tiny)
    shards = [torch.load(p, weights_only=True) for p in sorted((tmp_path / "a" / "features").glob("shard-*.pt"))]
    assert shards and all(int(d["loss_mask"].float().argmax(1).max()) == 2 for d in shards)
    assert sum(int(d["loss_mask"].sum()) for d in shards) == 8 * 20


def test_reuse_features_refuses_an_empty_feature_dir(tiny, tmp_path):
    with pytest.raises(FastEagleError, match="reuse-features"):
        train(TrainConfig(out=str(tmp_path / "b"), features="cache", reuse_features=True,
                          feature_dir=str(tmp_path / "nothing"), device="cpu"), target=tiny)


def test_micro_batches_cover_every_row_once_and_trim_the_padding():
    L = 12
    mask = torch.zeros(5, L)
    for r, end in enumerate((4, 9, 6, 12, 3)):
        mask[r, 2:end] = 1
    b = Batch(torch.arange(5)[:, None].expand(5, L).clone(), mask, torch.randn(5, L, 6),
              torch.zeros(5, L, 2, dtype=torch.int32), torch.ones(5, L, 2))
    parts = micro_batches(b, 2, torch.Generator().manual_seed(0))
    assert [p.input_ids.shape[0] for p in parts] == [2, 2, 1]
    assert sorted(int(r) for p in parts for r in p.input_ids[:, 0]) == [0, 1, 2, 3, 4]
    for p in parts:
        ends = {0: 4, 1: 9, 2: 6, 3: 12, 4: 3}
        assert p.input_ids.shape[1] == max(ends[int(r)] for r in p.input_ids[:, 0])  # cut after the last counted
        assert p.feats.shape[:2] == p.loss_mask.shape == p.teacher_probs.shape[:2]
        assert float(p.loss_mask.sum()) == sum(ends[int(r)] - 2 for r in p.input_ids[:, 0])
    assert micro_batches(b, 0) == [b] and micro_batches(b, 5) == [b]


def test_continue_a_drafter_on_extra_shards_in_micro_batches(tiny, tmp_path):
    """`init_from` starts from a trained drafter (same weights and vocab), `extra_features` adds
    another run's shards, and `micro_batch` turns each shard into several optimizer steps."""
    kw = dict(topk=4, batch_tokens=200, warmup=2, features="cache", device="cpu", intermediate=64, num_layers=2)
    for name, seed in (("a", 5), ("b", 6)):
        save_token_dataset(self_written(tiny, 6, seed=seed, new=20), tmp_path / f"{name}.pt")
        train(TrainConfig(out=str(tmp_path / name), data=str(tmp_path / f"{name}.pt"), max_steps=2, **kw),
              target=tiny)
    first = CascadedDrafter.load(tmp_path / "a", tiny.model)
    n_shards = sum(len(list((tmp_path / d / "features").glob("shard-*.pt"))) for d in "ab")
    out = train(TrainConfig(out=str(tmp_path / "c"), reuse_features=True, feature_dir=str(tmp_path / "a" / "features"),
                            extra_features=[str(tmp_path / "b" / "features")], init_from=str(tmp_path / "a"),
                            micro_batch=1, epochs=1.0, lr=0.0, **kw), target=tiny)
    info = CascadedDrafter.load(out, tiny.model).info["training"]
    assert info["steps"] == 12 > n_shards  # one step per sequence: 6 + 6
    assert info["steps_all"] == 2 + 12 and "12 steps" in (out / "README.md").read_text()
    assert set(info["tokens_per_feature_dir"]) == {str(tmp_path / d / "features") for d in "ab"}
    assert info["train_tokens"] == sum(info["tokens_per_feature_dir"].values())
    again = CascadedDrafter.load(out, tiny.model)
    for (k, v), w in zip(first.state_dict().items(), again.state_dict().values()):
        assert torch.equal(v, w), k  # lr 0: continued from exactly the first drafter's weights
    with pytest.raises(FastEagleError, match="no feature shards"):
        train(TrainConfig(out=str(tmp_path / "d"), reuse_features=True, feature_dir=str(tmp_path / "a" / "features"),
                          extra_features=[str(tmp_path / "none")], **kw), target=tiny)


def test_continuing_with_a_larger_intermediate_widens_the_drafter(tiny, tmp_path):
    """`--init-from` with a larger `--intermediate` keeps the drafter's function (lr 0: the holdout
    metrics before and after match) and saves the widened drafter."""
    data = self_written(tiny, 6, seed=7, new=20)
    save_token_dataset(data, tmp_path / "d.pt")
    kw = dict(data=str(tmp_path / "d.pt"), holdout_data=str(tmp_path / "d.pt"), topk=4, batch_tokens=200, warmup=2,
              device="cpu", num_layers=2, eval_sequences=4)
    train(TrainConfig(out=str(tmp_path / "a"), intermediate=64, max_steps=3, **kw), target=tiny)
    out = train(TrainConfig(out=str(tmp_path / "b"), init_from=str(tmp_path / "a"), intermediate=96, lr=0.0,
                            max_steps=2, **kw), target=tiny)
    wide = CascadedDrafter.load(out, tiny.model)
    assert wide.cfg.intermediate == 96 and wide.layers[0].mlp.up_proj.weight.shape[0] == 96
    ev = json.loads((out / "eval.json").read_text())
    assert ev["holdout"]["depth_top1_given_spine"] == ev["holdout_initial"]["depth_top1_given_spine"]
    assert "MLP 96" in (out / "README.md").read_text()



def test_a_parallel_eagle_drafter_continues_a_trained_eagle3_one(tiny, tmp_path):
    """`--drafter peagle --init-from` an EAGLE-3 drafter: its layer, head and vocab carry over (lr 0: depth 1's
    holdout agreement is the same before and after), a mask row and mask id are added, and it saves as peagle."""
    from fasteagle.peagle import ParallelEagleDrafter

    data = self_written(tiny, 6, seed=7, new=20)
    save_token_dataset(data, tmp_path / "d.pt")
    kw = dict(data=str(tmp_path / "d.pt"), holdout_data=str(tmp_path / "d.pt"), topk=4, batch_tokens=200, warmup=2,
              device="cpu", intermediate=64, depth=3, eval_sequences=4)
    train(TrainConfig(out=str(tmp_path / "a"), drafter="eagle3", max_steps=3, **kw), target=tiny)
    out = train(TrainConfig(out=str(tmp_path / "b"), drafter="peagle", init_from=str(tmp_path / "a"), lr=0.0,
                            max_steps=2, **kw), target=tiny)
    pe = ParallelEagleDrafter.load(out, tiny.model)
    assert pe.cfg.kind == "peagle" and all(pe.cfg.mask_token_id not in ids[6:] for ids in data["input_ids"])
    before, after = (json.loads((tmp_path / run / "eval.json").read_text())["holdout"] for run in "ab")
    assert after["depth_top1_given_spine"][0] == before["depth_top1_given_spine"][0]  # depth 1: the EAGLE-3 layer's


def test_continuing_with_current_token_grows_the_cascade_and_trains_its_new_columns(tiny, tmp_path):
    """`--init-from` a plain cascade with `current_token`: at lr 0 its function is unchanged (the holdout
    metrics before and after match); trained, its `cur_fc` moves, at `current_token_lr` times the others'
    learning rate, and the saved drafter reads it."""
    data = self_written(tiny, 6, seed=7, new=20)
    save_token_dataset(data, tmp_path / "d.pt")
    kw = dict(data=str(tmp_path / "d.pt"), holdout_data=str(tmp_path / "d.pt"), topk=4, batch_tokens=200, warmup=2,
              device="cpu", num_layers=2, eval_sequences=4, intermediate=64)
    train(TrainConfig(out=str(tmp_path / "a"), max_steps=3, **kw), target=tiny)
    out = train(TrainConfig(out=str(tmp_path / "b"), init_from=str(tmp_path / "a"), current_token=True, lr=0.0,
                            max_steps=2, **kw), target=tiny)
    ev = json.loads((out / "eval.json").read_text())
    assert ev["holdout"]["depth_top1_given_spine"] == ev["holdout_initial"]["depth_top1_given_spine"]
    out = train(TrainConfig(out=str(tmp_path / "c"), init_from=str(tmp_path / "a"), current_token=True, max_steps=3,
                            current_token_lr=10.0, **kw), target=tiny)
    grown = CascadedDrafter.load(out, tiny.model)
    assert grown.cfg.current_token and grown.cur_fc.weight.abs().sum() > 0
    groups = trainer_mod.param_groups(grown, TrainConfig(out=str(tmp_path), current_token_lr=10.0))
    assert [g["lr_scale"] for g in groups] == [1.0, 10.0] and groups[1]["params"] == [grown.cur_fc.weight]
    assert sum(p.numel() for g in groups for p in g["params"]) == sum(p.numel() for p in grown.parameters())

def test_continuing_with_a_larger_draft_vocab_grows_it(tiny, tmp_path):
    """`--init-from` with `--draft-vocab` above the drafter's adds the most frequent other reply tokens
    (or, at the vocabulary size, all of them), keeps its tokens, and trains and saves the bigger head."""
    data = self_written(tiny, 6, seed=7, new=20)
    save_token_dataset(data, tmp_path / "d.pt")
    kw = dict(data=str(tmp_path / "d.pt"), holdout_data=str(tmp_path / "d.pt"), topk=4, batch_tokens=200, warmup=2,
              device="cpu", num_layers=2, intermediate=64, eval_sequences=4, max_steps=2)
    small = CascadedDrafter.load(train(TrainConfig(out=str(tmp_path / "a"), draft_vocab=32, **kw), target=tiny))
    assert small.cfg.draft_vocab == 32
    out = train(TrainConfig(out=str(tmp_path / "b"), init_from=str(tmp_path / "a"), draft_vocab=64, **kw),
                target=tiny)
    mid = CascadedDrafter.load(out, tiny.model)
    assert mid.cfg.draft_vocab == 64 and set(small.vocab_ids.tolist()) <= set(mid.vocab_ids.tolist())
    full = CascadedDrafter.load(train(TrainConfig(out=str(tmp_path / "c"), init_from=str(out), draft_vocab=TINY_VOCAB,
                                                  **kw), target=tiny), tiny.model)
    assert full.cfg.draft_vocab == 0 and full.vocab_ids.numel() == TINY_VOCAB
    assert "draft vocab 320 tokens" in (tmp_path / "c" / "README.md").read_text()

def test_distill_only_then_a_rerun_trains_on_the_written_replies(tiny, tmp_path, monkeypatch):
    """`distill_only` writes the target's own replies (train and holdout) and stops; a rerun in the same
    out dir trains on them without distilling again (how a GPU session splits its device calls)."""
    g = torch.Generator().manual_seed(8)
    ps = [torch.randint(4, TINY_VOCAB, (6,), generator=g).tolist() for _ in range(8)]
    save_token_dataset({"input_ids": ps, "loss_mask": [[0] * 6] * 8, "prompt_ids": ps,
                        "ids": [f"p{i}" for i in range(8)]}, tmp_path / "p.pt")
    kw = dict(out=str(tmp_path / "run"), data=str(tmp_path / "p.pt"), holdout_data=str(tmp_path / "p.pt"),
              distill=True, distill_max_new=12, distill_batch=4, topk=4, batch_tokens=200, warmup=2, device="cpu",
              intermediate=64, num_layers=2, eval_sequences=3)
    out = train(TrainConfig(distill_only=True, **kw), target=tiny)
    written = load_token_dataset(out / "distilled.pt")
    assert len(written["ids"]) == 8 and (out / "holdout_distilled.pt").exists()
    assert all(sum(m) > 0 for m in written["loss_mask"]) and not (out / "model.safetensors").exists()

    def no_second_pass(*a, **k):
        raise AssertionError("distilled again")

    monkeypatch.setattr("fasteagle.train.trainer.self_distill", no_second_pass)
    train(TrainConfig(max_steps=2, **kw), target=tiny)
    info = CascadedDrafter.load(out, tiny.model).info
    assert info["training"]["train_tokens"] == sum(sum(m) for m in written["loss_mask"])


def test_add_data_trains_on_several_token_datasets_and_distillation_sampling_is_a_knob(tiny, tmp_path, monkeypatch):
    """`extra_data` joins saved token datasets (e.g. greedy replies from one run, sampled ones from
    another); `distill_sample_every` reaches the distiller; shard-based runs are told to use
    `extra_features` instead."""
    a, b = self_written(tiny, 4, seed=9, new=16), self_written(tiny, 3, seed=10, new=16)
    save_token_dataset(a, tmp_path / "a.pt")
    save_token_dataset(b, tmp_path / "b.pt")
    kw = dict(topk=4, batch_tokens=200, warmup=2, device="cpu", intermediate=64, num_layers=2, max_steps=2)
    out = train(TrainConfig(out=str(tmp_path / "ab"), data=str(tmp_path / "a.pt"), extra_data=[str(tmp_path / "b.pt")],
                            **kw), target=tiny)
    info = CascadedDrafter.load(out, tiny.model).info["training"]
    assert info["train_tokens"] == sum(sum(m) for d in (a, b) for m in d["loss_mask"])

    seen = {}
    from fasteagle.train import trainer as trainer_mod

    real = trainer_mod.self_distill

    def spy(*args, **kwargs):
        seen.setdefault("sample_every", kwargs.get("sample_every"))
        return real(*args, **kwargs)

    monkeypatch.setattr(trainer_mod, "self_distill", spy)
    train(TrainConfig(out=str(tmp_path / "d"), data=str(tmp_path / "a.pt"), distill=True, distill_max_new=8,
                      distill_batch=2, distill_sample_every=1, distill_only=True, **kw), target=tiny)
    assert seen["sample_every"] == 1
    with pytest.raises(FastEagleError, match="add-features"):
        train(TrainConfig(out=str(tmp_path / "c"), data=str(tmp_path / "a.pt"), distill=True, features="cache",
                          extra_data=[str(tmp_path / "b.pt")], **kw), target=tiny)


def test_shard_fraction_draws_a_seeded_share_of_the_data_shards_and_keeps_extra_folders_whole(tmp_path):
    from types import SimpleNamespace

    from fasteagle.train.trainer import feature_shards

    mine, extra = tmp_path / "data", tmp_path / "written"
    for folder, n in ((mine, 8), (extra, 3)):
        folder.mkdir()
        for i in range(n):
            (folder / f"shard-{i:05d}.pt").write_bytes(b"")

    def drawn(fraction: float, seed: int) -> dict:
        cfg = TrainConfig(out=str(tmp_path), features="cache", extra_features=[str(extra)], shard_fraction=fraction,
                          seed=seed)
        return feature_shards(SimpleNamespace(cfg=cfg, fdir=mine), None)

    half = drawn(0.5, 0)
    assert len(half[mine]) == 4 and half[mine] == sorted(half[mine]) and len(half[extra]) == 3
    assert half == drawn(0.5, 0) and set(drawn(0.25, 0)[mine]) <= set(mine.glob("shard-*.pt"))
    assert len(drawn(0.25, 0)[mine]) == 2 and len(drawn(1.0, 0)[mine]) == 8
    assert {tuple(drawn(0.5, s)[mine]) for s in range(6)} != {tuple(half[mine])}  # another seed, another draw
    for bad in (0.0, 1.5):
        with pytest.raises(FastEagleError, match="shard_fraction"):
            TrainConfig(out=str(tmp_path), shard_fraction=bad).check()


def test_bf16_on_a_cpu_without_native_bf16_trains_in_fp32(monkeypatch, capsys):
    """torch emulates bf16 matmuls on a CPU without AVX512-BF16 or AMX (an AVX2 machine here: a training
    step that took seconds in fp32 had not finished in ten minutes): such a run trains in fp32, saying so."""
    monkeypatch.setattr(trainer_mod, "cpu_has_bf16", lambda: False)
    assert mixed_precision(TrainConfig(out="x", mixed_precision="bf16", device="cpu")) == "no"
    assert "training in fp32" in capsys.readouterr().err
    monkeypatch.setattr(trainer_mod, "cpu_has_bf16", lambda: True)
    assert mixed_precision(TrainConfig(out="x", mixed_precision="bf16", device="cpu")) == "bf16"
    assert mixed_precision(TrainConfig(out="x", device="cpu")) == "no"


@pytest.mark.parametrize("kind,layers", [("dflash", 2), ("peagle", 1)])
def test_a_block_drafter_trains_on_blocks_and_then_accepts(tiny, tmp_path, kind, layers):
    """`drafter="dflash"` and `"peagle"`: blocks anchored at the reply's positions lower the loss and raise the
    replayed holdout tau; the mask id is one no training reply holds (vLLM knows DFlash's mask rows by it), and
    the drafter decodes losslessly."""
    from fasteagle.methods import load_drafter

    train_data = self_written(tiny, 24, seed=1)
    save_token_dataset(train_data, tmp_path / "train.pt")
    save_token_dataset(self_written(tiny, 6, seed=2), tmp_path / "holdout.pt")
    cfg = TrainConfig(out=str(tmp_path / kind), data=str(tmp_path / "train.pt"), drafter=kind, depth=3,
                      holdout_data=str(tmp_path / "holdout.pt"), num_layers=layers, intermediate=96, topk=8,
                      batch_tokens=400, max_steps=120, warmup=5, lr=3e-3, eval_sequences=6, device="cpu")
    out = train(cfg, target=tiny)
    history = json.loads((out / "history.json").read_text())
    assert history[-1]["loss"] < 0.7 * history[0]["loss"]
    ev = json.loads((out / "eval.json").read_text())
    assert ev["holdout"]["tau_replay"]["product"] > ev["holdout_initial"]["tau_replay"]["product"] + 0.3
    drafter = load_drafter(out, tiny.model, kind=kind)
    assert drafter.cfg.depth == 3 and len(drafter.layers) == layers
    assert all(drafter.cfg.mask_token_id not in ids[6:] for ids in train_data["input_ids"])
    prompt = torch.tensor(load_token_dataset(tmp_path / "holdout.pt")["prompt_ids"][0])
    want, _ = run(tiny, prompt, max_new_tokens=30, stop_ids=set())
    got, traces = run(tiny, prompt, drafter=drafter, max_new_tokens=30, stop_ids=set())
    assert got == want and traces[-1].tau > 1.2


def test_switches_a_drafter_kind_lacks_are_refused_before_anything_loads():
    for settings, says in (({"drafter": "eagle3", "norm_output": True}, "norm_output is a cascade's switch"),
                           ({"drafter": "dflash", "fc_norm": True}, "fc_norm is for the cascade"),
                           ({"drafter": "peagle", "kv_inject": True}, "kv_inject is a cascade's switch"),
                           ({"loss_weights": "uniform"}, "loss_weights")):
        with pytest.raises(FastEagleError, match=says):
            TrainConfig(out="x", **settings).check()
    TrainConfig(out="x", fc_norm=True, norm_output=True, kv_inject=True, loss_weights="until-fail").check()
