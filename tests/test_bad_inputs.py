"""Every command on a table of bad inputs: exit code 2, one line `error: ...`, no traceback, nothing
written. The rows run in process through each command's `main` (a subprocess per row would cost the
suite minutes of imports); `test_a_real_process_prints_one_line` runs a few of them as a user does.

A row names the command's main, its arguments ({tmp} is the test's empty folder, {tiny} a tiny saved
target, {bad} a folder of broken files) and a word the message must contain."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fasteagle import cli
from tests.conftest import tiny_target

ROOT = Path(__file__).resolve().parent.parent
READ_ONLY = "/proc/fasteagle-no-such-dir/out.json"  # root may write anywhere else, even in a chmod 555 folder


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory) -> Path:
    """A tiny Llama with its tokenizer, saved as a local model folder."""
    out = tmp_path_factory.mktemp("tiny-target")
    t = tiny_target()
    t.model.save_pretrained(out)
    t.tokenizer.save_pretrained(out)
    return out


@pytest.fixture(scope="module")
def bad_dir(tmp_path_factory, tiny_dir) -> Path:
    """Broken inputs: files that are not UTF-8, not JSON, truncated weights, a model without tokenizer."""
    d = tmp_path_factory.mktemp("bad")
    (d / "latin1.jsonl").write_bytes('{"id": "a", "text": "caf\xe9"}\n'.encode("latin-1"))
    (d / "binary.jsonl").write_bytes(bytes(range(256)) * 4)
    (d / "notjson.json").write_text("{not json")
    (d / "list.json").write_text("[1, 2]")
    (d / "a_file").write_text("x")
    empty = d / "empty-model"
    empty.mkdir()
    notok = d / "no-tokenizer"
    notok.mkdir()
    for f in tiny_dir.iterdir():
        if f.name in ("config.json", "model.safetensors", "generation_config.json"):
            (notok / f.name).write_bytes(f.read_bytes())
    shipped = ROOT / "assets" / "drafters" / "smollm2-135m-fasteagle"
    cut, typo = d / "drafter-truncated", d / "drafter-bad-config"
    for broken in (cut, typo):
        broken.mkdir()
        (broken / "config.json").write_bytes((shipped / "config.json").read_bytes())
    (cut / "model.safetensors").write_bytes((shipped / "model.safetensors").read_bytes()[:5000])
    (typo / "model.safetensors").write_bytes(b"")
    config = json.loads((shipped / "config.json").read_text()) | {"num_layers": "six"}
    (typo / "config.json").write_text(json.dumps(config))
    return d


def expand(args: list[str], tmp: Path, tiny: Path, bad: Path) -> list[str]:
    return [a.format(tmp=tmp, tiny=tiny, bad=bad, ro=READ_ONLY) for a in args]


# (command args, a word the message must name)
CLI_ROWS = [
    (["generate", "--prompt", "   "], "empty"),
    (["generate", "--prompt", "hi", "--seed", "abc"], "seed"),
    (["generate", "--prompt", "hi", "--seed", str(2**64)], "seed"),
    (["generate", "--prompt", "hi", "--seed", "-1"], "seed"),
    (["generate", "--prompt", "caf\udce9"], "UTF-8"),
    (["generate", "--prompt", "hi", "--tree-budget", "1"], "tree-budget"),
    (["generate", "--prompt", "hi", "--tree-k", "abc"], "tree-k"),
    (["generate", "--prompt", "hi", "--tree-k", "0"], "tree-k"),
    (["generate", "--prompt", "hi", "--max-new-tokens", "0"], "max-new-tokens"),
    (["generate", "--prompt", "hi", "--temperature", "nan"], "temperature"),
    (["generate", "--prompt", "hi", "--top-p", "0"], "top"),
    (["generate", "--prompt", "hi", "--method", "nope"], "method"),
    (["generate", "--prompt", "hi", "--dtype", "fp8"], "dtype"),
    (["generate", "--prompt", "hi", "--device", "tpu"], "device"),
    (["generate", "--prompt", "hi", "--target", "{tmp}/nope"], "nope"),
    (["generate", "--prompt", "hi", "--target", "{bad}/empty-model"], "no config.json"),
    (["generate", "--prompt", "hi", "--target", "{bad}/no-tokenizer"], "no tokenizer"),
    (["generate", "--prompt", "hi", "--method", "fasteagle", "--drafter", "{tmp}"], "drafter"),
    (["generate", "--prompt", "hi", "--method", "fasteagle", "--drafter", "{bad}/a_file"], "drafter"),
    (["generate", "--prompt", "hi", "--method", "fasteagle", "--drafter", "{bad}/drafter-bad-config"], "num_layers"),
    (["generate", "--prompt", "hi", "--method", "fasteagle+lookup", "--drafter", "{bad}/drafter-truncated"],
     "truncated"),
    (["generate", "--prompt", "hi", "--method", "eagle3", "--eagle3-drafter", "{tmp}/none"], "no drafter"),
    (["generate", "--prompt", "hi", "--target", "{tiny}", "--tree-budget", "100000", "--method", "lookup"],
     "tree-budget"),
    (["generate", "--prompt", "hi", "--method", "fasteagle", "--tree-k", "1000000"], "tree-k"),
    (["generate", "--prompt", "w7 w8", "--target", "{tiny}", "--method", "lookup", "--max-new-tokens", "2000"],
     "context"),
]


def run_main(main, argv, capsys) -> tuple[int, str, str]:
    try:
        rc = main(argv)
    except SystemExit as exc:  # argparse exits
        rc = exc.code
    out = capsys.readouterr()
    return rc, out.out, out.err


def assert_one_line_error(rc: int, err: str, word: str) -> None:
    lines = [line for line in err.splitlines() if line.strip() and not _is_progress(line)]
    assert rc == 2, err
    assert "Traceback" not in err, err
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert word.lower() in lines[0].lower(), lines[0]


def _is_progress(line: str) -> bool:
    """Loading bars and the cache notice are not part of the error (the target may load before a
    device-dependent check)."""
    return line.startswith(("fasteagle: ", "Loading", "\r")) or "it/s]" in line or "|" in line and "%" in line


@pytest.mark.parametrize("args,word", CLI_ROWS, ids=[" ".join(a)[:60] for a, _ in CLI_ROWS])
def test_cli_bad_input_is_one_line(args, word, tmp_path, tiny_dir, bad_dir, capsys):
    rc, out, err = run_main(cli.main, expand(args, tmp_path, tiny_dir, bad_dir), capsys)
    assert_one_line_error(rc, err, word)
    assert not out.strip(), "nothing of a reply may be printed before the error"
    assert list(tmp_path.iterdir()) == [], "a refused command leaves nothing behind"


def test_a_real_process_prints_one_line(tmp_path):
    """Two rows as a user runs them: the process's own exit code and stderr."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONWARNINGS"}
    for args in (["generate", "--prompt", "hi", "--seed", str(2**64)],
                 ["bench", "--prompts", str(tmp_path / "missing.jsonl"), "--methods", "vanilla"]):
        proc = subprocess.run([sys.executable, "-m", "fasteagle", *args], capture_output=True, text=True,
                              cwd=ROOT, env=env, timeout=120)
        assert proc.returncode == 2, proc.stderr
        assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("error: "), proc.stderr
