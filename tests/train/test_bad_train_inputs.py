"""`train` and `python -m fasteagle.train.vocab`, `.data` and `.tasks` on bad inputs: exit
code 2, one line `error: ...`, no traceback, nothing written (the harness of tests/test_bad_inputs.py).

Placeholders beside the harness's: {fx} is a folder of tiny training inputs (a token dataset of 8
records `data.pt`, a drafter `drafter/`, broken variants of both, config files)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch

from fasteagle import cli
from fasteagle.errors import FastEagleError
from fasteagle.train import data as data_mod
from fasteagle.train import tasks, vocab
from fasteagle.train.config import TrainConfig, read_config_file
from tests.test_bad_inputs import READ_ONLY, ROOT, assert_one_line_error, bad_dir, run_main, tiny_dir  # noqa: F401
from tests.train import test_trainer, test_vocab

MAINS = {"train": cli.main, "vocab": vocab.main, "data": data_mod.main, "tasks": tasks.main}


@pytest.fixture(scope="module")
def fx(tmp_path_factory, tiny) -> Path:
    d = tmp_path_factory.mktemp("train-inputs")
    data_mod.save_token_dataset(test_trainer.self_written(tiny, 8, seed=3, new=20), d / "data.pt")
    test_vocab.make(tiny).save(d / "drafter")
    payload = torch.load(d / "data.pt", weights_only=True)
    del payload["input_ids"]
    torch.save(payload, d / "no_ids.pt")
    shutil.copytree(d / "drafter", d / "cut-drafter")
    weights = d / "cut-drafter" / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    shutil.copytree(d / "drafter", d / "badtype-drafter")
    config = json.loads((d / "drafter" / "config.json").read_text())
    (d / "badtype-drafter" / "config.json").write_text(json.dumps(config | {"num_layers": "six"}))
    for name, text in {"notjson": "{not json", "list": "[1, 2]", "wrongtype": '{"lr": "fast"}',
                       "unknown": '{"learning_rate": 0.001}', "epochs": '{"epochs": -1}',
                       "distill": '{"distill": "yes"}', "topk": '{"topk": 1000}'}.items():
        (d / f"{name}.json").write_text(text)
    return d


def _snapshot(d: Path) -> dict[str, int]:
    """Every entry, and each file's mtime (a folder's changes with the writability probe)."""
    return {str(p.relative_to(d)): p.is_file() and p.stat().st_mtime_ns for p in sorted(d.rglob("*"))}


@contextmanager
def deadline(seconds: int):
    """Raise TimeoutError in the block after `seconds`, so that a hang fails the test."""
    def expire(signum, frame):
        raise TimeoutError(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


TRAIN = ["train", "--target", "{tiny}", "--device", "cpu", "--data", "{fx}/data.pt"]
VOCAB = ["{fx}/drafter", "--size", "4", "--data", "{fx}/data.pt"]

# (command, args, a word the message must name)
ROWS = [
    ("train", [*TRAIN, "--out", "{tmp}/out", "--max-steps", "2", "--skip", "1000"], "no training data left"),
    ("train", [*TRAIN, "--out", "{tmp}/out", "--max-steps", "2", "--distill", "--distill-max-new", "2"],
     "kept no replies"),
    ("train", [*TRAIN, "--out", "{tmp}/out", "--config", "{tmp}/missing.json"], "no such file"),
    ("train", [*TRAIN, "--out", "{tmp}/out", "--config", "{fx}"], "folder"),
    ("train", [*TRAIN, "--out", "{tmp}/out", "--config", "{fx}/notjson.json"], "not valid JSON"),
    ("train", [*TRAIN, "--out", "{tmp}/out", "--config", "{fx}/list.json"], "JSON object"),
    ("train", [*TRAIN, "--out", "{tmp}/out", "--config", "{fx}/wrongtype.json"], "lr must be a number"),
    ("train", [*TRAIN, "--out", "{tmp}/out", "--config", "{fx}/unknown.json"], "learning_rate"),
    ("train", [*TRAIN, "--out", "{tmp}/out", "--config", "{fx}/epochs.json"], "epochs"),
    ("train", [*TRAIN, "--out", "{tmp}/out", "--config", "{fx}/distill.json"], "true or false"),
    ("train", [*TRAIN, "--out", "{tmp}/out", "--data", "{fx}/no_ids.pt"], "input_ids"),
    ("train", [*TRAIN, "--out", "{tmp}/out", "--data", "{tmp}/missing.pt"], "no token dataset"),
    ("train", [*TRAIN, "--out", "{tmp}/out", "--lr", "nan"], "lr"),
    ("train", [*TRAIN, "--out", "{tmp}/out", "--lr", "-1"], "lr"),
    ("train", [*TRAIN, "--out", "{tmp}/out", "--num-layers", "0"], "num-layers"),
    ("train", [*TRAIN, "--out", "{tmp}/out", "--max-len", "0"], "max-len"),
    ("train", [*TRAIN, "--out", "{tmp}/out", "--max-len", "2"], "max-len"),  # no reply token within it
    ("train", [*TRAIN, "--out", "{tmp}/out", "--config", "{fx}/topk.json"], "topk"),
    ("train", [*TRAIN, "--out", "{tmp}/out", "--draft-vocab", "-5"], "draft-vocab"),
    ("train", [*TRAIN, "--out", "{tmp}/out", "--epochs", "-1"], "epochs"),
    ("train", [*TRAIN, "--out", "{tmp}/out", "--intermediate", "0"], "intermediate"),
    ("train", [*TRAIN, "--out", "{tmp}/out", "--batch-tokens", "0"], "batch-tokens"),
    ("train", [*TRAIN, "--out", "{tmp}/out", "--minutes", "inf"], "minutes"),
    ("train", [*TRAIN, "--out", "{tmp}/out", "--seed", "-1"], "seed"),
    ("train", [*TRAIN, "--out", "{tmp}/out", "--reuse-features"], "features cache"),
    ("train", [*TRAIN, "--out", "{ro}"], "not writable"),
    ("train", [*TRAIN, "--out", "{bad}/a_file"], "a file"),
    ("train", [*TRAIN, "--out", "{bad}/a_file/drafter"], "a file"),
    ("train", [*TRAIN, "--out", "{tmp}/out", "--features", "cache", "--feature-dir", "{ro}"], "not writable"),
    ("vocab", ["{fx}/cut-drafter", "--size", "4", "--data", "{fx}/data.pt"], "truncated"),
    ("vocab", ["{fx}/badtype-drafter", "--size", "4", "--data", "{fx}/data.pt"], "num_layers must be an integer"),
    ("vocab", ["{fx}/drafter", "--size", "4", "--data", "{fx}/no_ids.pt"], "input_ids"),
    ("vocab", ["{tmp}/missing", "--size", "4", "--data", "{fx}/data.pt"], "no drafter"),
    ("vocab", ["{fx}/drafter", "--size", "0", "--data", "{fx}/data.pt"], "size"),
    ("vocab", ["{fx}/drafter", "--size", "x", "--data", "{fx}/data.pt"], "size"),
    ("vocab", ["{fx}/drafter", "--size", "100000", "--data", "{fx}/data.pt"], "fit"),
    ("vocab", ["{fx}/drafter", "--size", "4", "--data", "{tmp}/missing.pt"], "token dataset"),
    ("vocab", [*VOCAB, "--out", "{ro}"], "not writable"),
    ("vocab", [*VOCAB, "--out", "{bad}/a_file"], "a file"),
    ("vocab", [*VOCAB, "--out", "{bad}/a_file/drafter"], "a file"),
    ("data", [], "nothing to do"),
    ("data", ["--prompts-out", "{tmp}/p.pt", "--from", "{tmp}/missing.pt"], "token dataset"),
    ("data", ["--prompts-out", "{ro}", "--from", "{fx}/data.pt"], "not writable"),
    ("tasks", ["--prompts-out", "{tmp}/p.pt", "--counts", "poetry=5"], "--counts"),
    ("tasks", ["--prompts-out", "{tmp}/p.pt", "--counts", "math=0"], "--counts"),
    ("tasks", ["--prompts-out", "{ro}"], "not writable"),
    ("tasks", ["--prompts-out", "{bad}/a_file/p.pt"], "a file"),
]


def _row_id(cmd: str, args: list[str]) -> str:
    return f"{cmd} " + " ".join(args[len(TRAIN):] if args[:len(TRAIN)] == TRAIN else args)[:60]


@pytest.mark.parametrize("cmd,args,word", ROWS, ids=[_row_id(c, a) for c, a, _ in ROWS])
def test_bad_train_input_is_one_line(cmd, args, word, tmp_path, tiny_dir, bad_dir, fx, capsys):  # noqa: F811
    argv = [a.format(tmp=tmp_path, tiny=tiny_dir, bad=bad_dir, ro=READ_ONLY, fx=fx) for a in args]
    before = _snapshot(fx), _snapshot(bad_dir)
    with deadline(60):  # a row that used to hang fails instead
        rc, out, err = run_main(MAINS[cmd], argv, capsys)
    assert_one_line_error(rc, err, word)
    assert not out.strip(), "nothing may be printed before the error"
    assert list(tmp_path.iterdir()) == [], "a refused command leaves nothing behind"
    assert (_snapshot(fx), _snapshot(bad_dir)) == before, "a refused command changes no input"



def test_an_epoch_without_batches_stops_the_run(tiny, fx, tmp_path, monkeypatch):
    """A process whose share of an epoch is empty (more processes than batches) says so at once
    rather than looping over empty epochs forever, and writes no drafter."""
    from fasteagle.train import trainer

    monkeypatch.setattr(trainer, "process_share", lambda order, index, count: [])
    cfg = TrainConfig(out=str(tmp_path / "out"), data=str(fx / "data.pt"), num_layers=2, intermediate=64,
                              topk=4, batch_tokens=200, max_steps=2, minutes=0.01, device="cpu")
    with deadline(60), pytest.raises(FastEagleError, match="no batch"):
        trainer.train(cfg, target=tiny)
    assert not (tmp_path / "out" / "model.safetensors").exists()


def test_the_shipped_training_configs_pass_the_checks():
    files = sorted(ROOT.glob("assets/drafters/*/configs/*.json"))
    assert len(files) >= 3
    for f in files:
        TrainConfig(**read_config_file(f) | {"out": "x"}).check()
    from fasteagle.train.recipe import load

    recipes = sorted(ROOT.glob("assets/recipes/*.json"))
    assert len(recipes) >= 2
    for f in recipes:  # every drafter's settings in every recipe, checked as TrainConfig
        load(f)


def test_the_vocab_command_prints_one_line_as_a_process(tmp_path):
    """`python -m fasteagle.train.vocab` as a user runs it: its own exit code and stderr."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    proc = subprocess.run([sys.executable, "-m", "fasteagle.train.vocab", str(tmp_path / "missing"), "--size", "4",
                           "--data", str(tmp_path / "r.pt")], capture_output=True, text=True, cwd=ROOT, env=env,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: no drafter"), proc.stderr
