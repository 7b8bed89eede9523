"""`train`, `python -m fasteagle.train.vocab` and `python -m fasteagle.train.data` on bad inputs: exit
code 2, one line `error: ...`, no traceback, nothing written (the harness of tests/test_bad_inputs.py).

Placeholders beside the harness's: {fx} is a folder of tiny training inputs (a token dataset of 8
records `data.pt`, a drafter `drafter/`, broken variants of both, config files)."""

from __future__ import annotations

from pathlib import Path

import pytest

from fasteagle import cli
from fasteagle.train import data as data_mod
from fasteagle.train import vocab
from tests.test_bad_inputs import READ_ONLY, assert_one_line_error, bad_dir, run_main, tiny_dir  # noqa: F401
from tests.train import test_trainer, test_vocab

MAINS = {"train": cli.main, "vocab": vocab.main, "data": data_mod.main}


@pytest.fixture(scope="module")
def fx(tmp_path_factory, tiny) -> Path:
    d = tmp_path_factory.mktemp("train-inputs")
    data_mod.save_token_dataset(test_trainer.self_written(tiny, 8, seed=3, new=20), d / "data.pt")
    test_vocab.make(tiny).save(d / "drafter")
    return d


def _snapshot(d: Path) -> dict[str, int]:
    """Every entry, and each file's mtime (a folder's changes with the writability probe)."""
    return {str(p.relative_to(d)): p.is_file() and p.stat().st_mtime_ns for p in sorted(d.rglob("*"))}


TRAIN = ["train", "--target", "{tiny}", "--device", "cpu", "--data", "{fx}/data.pt"]
VOCAB = ["{fx}/drafter", "--size", "4", "--data", "{fx}/data.pt"]

# (command, args, a word the message must name)
ROWS = [
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
]


@pytest.mark.parametrize("cmd,args,word", ROWS, ids=[f"{c} " + " ".join(a)[:60] for c, a, _ in ROWS])
def test_bad_train_input_is_one_line(cmd, args, word, tmp_path, tiny_dir, bad_dir, fx, capsys):  # noqa: F811
    argv = [a.format(tmp=tmp_path, tiny=tiny_dir, bad=bad_dir, ro=READ_ONLY, fx=fx) for a in args]
    before = _snapshot(fx), _snapshot(bad_dir)
    rc, out, err = run_main(MAINS[cmd], argv, capsys)
    assert_one_line_error(rc, err, word)
    assert not out.strip(), "nothing may be printed before the error"
    assert list(tmp_path.iterdir()) == [], "a refused command leaves nothing behind"
    assert (_snapshot(fx), _snapshot(bad_dir)) == before, "a refused command changes no input"

