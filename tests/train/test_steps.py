"""Recipes of steps: the shipped FastEagle drafter's stages as one recipe that reproduces what its
training log records, and the runner end to end on a tiny target (each step in its own process, a
rerun skipping what is done, a GPU step stopping the recipe where there is no GPU)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from fasteagle.errors import FastEagleError
from fasteagle.train import recipe as recipe_mod
from fasteagle.train import steps as S
from fasteagle.train.config import TrainConfig
from fasteagle.train.data import build_prompt_ids, load_token_dataset, save_token_dataset
from tests.conftest import TINY_VOCAB, tiny_tokenizer
from tests.test_bad_inputs import tiny_dir  # noqa: F401

SHIPPED = "assets/recipes/fasteagle.json"
# where a step's settings may differ from its stage's record: where the data comes from and how long
# (the recipe counts steps instead of minutes; stages 10-12 train on stage 9's replies, not their own)
PROVENANCE = {"out", "data", "holdout_data", "feature_dir", "extra_features", "extra_data", "init_from", "limit",
              "minutes", "distill_minutes", "max_steps", "device", "distill", "distill_batch"}


def shipped() -> S.StepRecipe:
    return S.load(SHIPPED, json.loads(open(SHIPPED).read()))


def test_the_shipped_recipe_trains_every_shipped_stage_as_its_log_records_it():
    recipe = shipped()
    log = [s for s in json.loads(open(recipe.log).read()) if s["shipped"]]
    trains = [s for s in recipe.steps if s.stage is not None]
    assert [s.stage for s in trains] == [s["stage"] for s in log]  # every shipped stage, in order, once
    # a stage continues the one before, or that one's weights given a compact vocab (bit for bit the same)
    made_from = {(ns := S.parse(recipe, s)).out or ns.drafter: ns.drafter for s in recipe.steps if s.run == "vocab"}
    previous = None
    for step, stage in zip(trains, log):
        settings = dataclasses.asdict(TrainConfig(**S.train_settings(recipe, step)))
        record = stage["training"]
        assert settings["max_steps"] == record["steps"], step.name
        differ = {k: (settings[k], record[k]) for k in settings
                  if k in record and k not in PROVENANCE and settings[k] != record[k]}
        assert not differ, (step.name, differ)
        init = settings["init_from"] and made_from.get(settings["init_from"], settings["init_from"])
        assert (init == f"{recipe.out}/{previous}") if previous else init is None, step.name
        assert (step.device == "cuda") == ("H200" in str(record["device"])), step.name
        previous = step.name
    assert recipe.steps[-1].run == "vocab" and "12288" in recipe.steps[-1].args  # the compact vocab it ships


def test_a_bad_step_is_refused_in_one_line_before_anything_runs(tmp_path):
    raw = json.loads(open(SHIPPED).read())
    cases = [({"run": "shell"}, "run must be one of"), ({"device": "tpu"}, "device must be"),
             ({"args": ["--out", "{out}/x", "--lr", "fast"]}, "invalid float value"),
             ({"args": ["--out", "{out}/x", "--data", "{out}/nowhere.pt"]}, "made by no earlier step"),
             ({"args": ["--out", "{out}/x", "--warmup", "-1"]}, "warmup"),
             ({"name": "stage1"}, "two steps have this name"),
             ({"run": "tasks", "args": ["--prompts-out", "{out}/t.pt", "--kinds", "qa"]}, "unrecognized arguments")]
    for change, words in cases:
        bad = raw | {"steps": raw["steps"][:6] + [{"name": "new", "run": "train", "args": []} | change]}
        with pytest.raises(FastEagleError, match=words):
            S.load("x.json", bad)
    with pytest.raises(FastEagleError, match="unknown"):
        S.load("x.json", raw | {"configs": {"a.json": {"lr": 1, "speed": 2}}})
    with pytest.raises(FastEagleError, match="non-empty"):
        S.load("x.json", raw | {"steps": []})


def test_a_dry_run_prints_every_command_and_runs_nothing(tmp_path, capsys):
    assert recipe_mod.main([SHIPPED, "--out", str(tmp_path / "r"), "--dry-run"]) == 0
    printed = capsys.readouterr().out
    steps = shipped().steps
    assert [line[2:] for line in printed.splitlines() if line.startswith("# ")] == [s.name for s in steps]
    assert printed.count("python -m fasteagle train --out") == sum(s.run == "train" for s in steps)
    assert printed.count("TORCH_ALLOW_TF32_CUBLAS_OVERRIDE=1 python") == sum(bool(s.env) for s in steps) == 5
    assert not (tmp_path / "r").exists()
    assert recipe_mod.main([SHIPPED, "--stages", "stage99", "--dry-run"]) == 2
    assert "no step 'stage99'" in capsys.readouterr().err


def test_steps_run_in_order_resume_and_stop_at_a_gpu_step(tmp_path, tiny_dir, capsys, monkeypatch):  # noqa: F811
    g = torch.Generator().manual_seed(0)
    tok = tiny_tokenizer()
    ids = [build_prompt_ids(tok, " ".join(f"w{int(i)}" for i in torch.randint(4, TINY_VOCAB, (5,), generator=g)))
           for _ in range(12)]
    save_token_dataset({"input_ids": ids, "loss_mask": [[0] * len(x) for x in ids], "prompt_ids": ids,
                        "ids": [f"p{i}" for i in range(12)]}, tmp_path / "prompts.pt")
    tiny = ["--target", str(tiny_dir), "--device", "cpu", "--config", "{configs}/tiny.json"]
    recipe = {
        "configs": {"tiny.json": {"intermediate": 64, "num_layers": 2, "topk": 8, "keep_prompt": 16,
                                  "distill_max_new": 8, "distill_batch": 4, "batch_tokens": 256, "warmup": 1}},
        "steps": [
            {"name": "cut", "run": "data", "args": ["--prompts-out", "{out}/data/cut.pt", "--from",
                                                   str(tmp_path / "prompts.pt"), "--only-distilled", "0:4:2"]},
            {"name": "stage1", "run": "train", "stage": 1, "args": [
                "--out", "{out}/stage1", *tiny, "--data", "{out}/data/cut.pt", "--distill", "--max-steps", "3"]},
            {"name": "stage2", "run": "train", "stage": 2, "args": [
                "--out", "{out}/stage2", *tiny, "--data", "{out}/stage1/distilled.pt", "--init-from", "{out}/stage1",
                "--max-steps", "2"]},
            {"name": "drafter", "run": "vocab", "args": ["{out}/stage2", "--size", "20", "--data",
                                                         "{out}/stage1/distilled.pt", "--out", "{out}/drafter"]},
            {"name": "on-a-gpu", "run": "train", "device": "cuda", "args": [
                "--out", "{out}/gpu", *tiny, "--data", "{out}/stage1/distilled.pt", "--max-steps", "1"]}]}
    path, out = tmp_path / "tiny.json", tmp_path / "runs"
    path.write_text(json.dumps(recipe))
    monkeypatch.setattr(S, "_has_cuda", lambda: False)
    assert recipe_mod.main([str(path), "--out", str(out)]) == 2
    assert "step on-a-gpu needs a GPU and this machine has none; 4 of 5 steps are done" in capsys.readouterr().err
    assert len(load_token_dataset(out / "data" / "cut.pt")["ids"]) == 8  # two batches of four
    assert json.loads((out / "stage2" / "config.json").read_text())["training"]["steps"] == 2
    assert json.loads((out / "drafter" / "config.json").read_text())["compact_vocab"]["size"] == 20
    done = json.loads((out / "done" / "stage1.json").read_text())
    assert "--max-steps 3" in done["command"] and not (out / "done" / "on-a-gpu.json").exists()
    before = (out / "drafter" / "model.safetensors").stat().st_mtime_ns
    assert recipe_mod.main([str(path), "--out", str(out), "--stages", "cut,stage1,stage2,drafter"]) == 0
    assert capsys.readouterr().out.count("done already") == 4
    assert (out / "drafter" / "model.safetensors").stat().st_mtime_ns == before
    (out / "done" / "drafter.json").unlink()  # a step redone on its own
    recipe["steps"][3]["args"][2] = "24"
    path.write_text(json.dumps(recipe))
    assert recipe_mod.main([str(path), "--out", str(out), "--stages", "drafter"]) == 0
    assert json.loads((out / "drafter" / "config.json").read_text())["compact_vocab"]["size"] == 24


def test_a_recipe_of_steps_ships_some_of_its_drafters_only_once_their_steps_are_done(tmp_path, capsys):
    layout, out = "assets/recipes/eagle3-layout.json", str(tmp_path / "r")
    assert recipe_mod.main([layout, "--out", out, "--stages", "fasteagle-equal", "--dry-run"]) == 0
    assert "--feature-dir" not in capsys.readouterr().out  # the cascade's step makes its own shards: it runs alone
    cases = [(["--stages", "ship", "--drafters", "fasteagle-equal"], "step fasteagle-equal is not done"),
             (["--stages", "ship", "--drafters", "lstm"], "what the recipe ships (eagle3, fasteagle-equal)"),
             (["--stages", "eagle3", "--drafters", "eagle3"], "--drafters narrows what a recipe of steps ships")]
    for args, words in cases:
        assert recipe_mod.main([layout, "--out", out, *args]) == 2
        err = capsys.readouterr().err
        assert words in err and "Traceback" not in err
