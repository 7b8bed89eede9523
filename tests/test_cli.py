"""The command line: help for every subcommand, streaming generation, one-line user errors."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fasteagle.cli import main


def test_help_documents_every_subcommand(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    for sub in ("generate", "train", "bench"):
        assert sub in out


@pytest.mark.parametrize("sub", ["generate", "train", "bench"])
def test_subcommand_help(sub, capsys):
    with pytest.raises(SystemExit):
        main([sub, "--help"])
    assert "--" in capsys.readouterr().out


def test_empty_prompt_is_a_one_line_error(capsys):
    assert main(["generate", "--prompt", "   "]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "empty" in err and "Traceback" not in err


def test_unknown_model_is_a_one_line_error(tmp_path, capsys):
    assert main(["generate", "--prompt", "hi", "--target", str(tmp_path / "nope")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and err.count("\n") == 1


def test_missing_drafter_is_a_one_line_error(tmp_path, capsys):
    assert main(["generate", "--prompt", "hi", "--method", "fasteagle", "--drafter", str(tmp_path)]) == 2
    err = capsys.readouterr().err.splitlines()[-1]  # after the target's loading bar
    assert err.startswith("error: ") and "drafter" in err and "Traceback" not in err


@pytest.mark.integration
def test_generate_prints_a_reply_from_the_default_model(smollm):
    out = subprocess.run([sys.executable, "-m", "fasteagle", "generate", "--prompt", "Name three primary colors.",
                          "--max-new-tokens", "24"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.strip()) > 10


@pytest.mark.integration
def test_show_steps_prints_tree_sizes(smollm, capsys):
    assert main(["generate", "--prompt", "Count from 1 to 20.", "--method", "lookup", "--max-new-tokens", "24",
                 "--show-steps"]) == 0
    captured = capsys.readouterr()
    assert "[step   1] tree" in captured.err and "tau" in captured.err
    assert len(captured.out.strip()) > 10  # the reply itself goes to stdout


def test_train_flags_reach_the_config(monkeypatch, tmp_path):
    """What bench/gpu/run.sh passes (a second, sampled reply set with its own seed, more datasets)
    arrives in the trainer's config; --config values stand unless a flag overrides them."""
    import json

    import fasteagle.train.trainer as trainer

    got = {}
    monkeypatch.setattr(trainer, "train", lambda cfg, command=None: got.setdefault("cfg", cfg))
    (tmp_path / "c.json").write_text(json.dumps({"lr": 1e-3, "seed": 5, "epochs": 2.0}))
    assert main(["train", "--out", str(tmp_path / "o"), "--config", str(tmp_path / "c.json"), "--seed", "1",
                 "--distill", "--distill-only", "--distill-sample-every", "1", "--add-data", "a.pt",
                 "--add-data", "b.pt"]) == 0
    cfg = got["cfg"]
    assert (cfg.seed, cfg.distill_sample_every, cfg.extra_data) == (1, 1, ["a.pt", "b.pt"])
    assert cfg.distill and cfg.distill_only and cfg.lr == 1e-3 and cfg.epochs == 2.0


def test_bench_keeps_its_result_where_plotly_is_missing(monkeypatch, tmp_path, capsys):
    """A bare GPU machine measures without plotly: the charts are left for `--redraw`, nothing else."""
    from fasteagle import bench, cli

    drawn = []
    monkeypatch.setattr(bench, "charts", lambda doc, path: drawn.append(path))
    assert cli._charts_beside({}, tmp_path / "r.json") == ", .html charts" and drawn == [tmp_path / "r.html"]

    def no_plotly(doc, path):
        raise ModuleNotFoundError("No module named 'plotly'", name="plotly")

    monkeypatch.setattr(bench, "charts", no_plotly)
    assert cli._charts_beside({}, tmp_path / "r.json") == ""
    err = capsys.readouterr().err
    assert f"plotly is not installed): `python -m fasteagle bench --redraw {tmp_path / 'r.json'}`" in err
