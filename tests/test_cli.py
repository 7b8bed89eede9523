"""The command line: help for every subcommand, streaming generation, one-line user errors."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from fasteagle.cli import main


def test_help_documents_every_subcommand(capsys):
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    for sub in ("generate", "train", "bench"):
        assert sub in out


@pytest.mark.parametrize("sub,flags", [("generate", ("--prompt", "--method", "--max-new-tokens", "--show-steps")),
                                       ("train", ("--out", "--data", "--config", "--seed")),
                                       ("bench", ("--prompts", "--methods", "--limit", "--out"))])
def test_subcommand_help(sub, flags, capsys):
    """Each subcommand's own help (not the top-level one), listing that subcommand's main flags."""
    with pytest.raises(SystemExit) as done:
        main([sub, "--help"])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: ") and f" {sub} " in out.splitlines()[0] + " "
    for flag in flags:
        assert re.search(rf"^\s+{flag}\b", out, re.M), f"{sub} --help does not document {flag}"


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
    """A bare GPU machine measures without plotly: the result and its table are kept, the charts are left
    for `--redraw`; where plotly is there, the charts are drawn beside the result as `--redraw` draws them."""
    from fasteagle import cli_bench
    from fasteagle.bench import plots

    doc = json.loads((Path(__file__).parents[1] / "bench" / "results" / "cpu-smollm2-135m-budget60-2026-11-26e.json")
                     .read_text())  # a method comparison
    drawn = []
    monkeypatch.setattr(plots, "charts", lambda doc, path: drawn.append(Path(path)))
    assert cli_bench._report(dict(doc), str(tmp_path / "r.json")) == 0 and drawn == [tmp_path / "r.html"]

    def no_plotly(doc, path):
        raise ModuleNotFoundError("No module named 'plotly'", name="plotly")

    monkeypatch.setattr(plots, "charts", no_plotly)
    out = tmp_path / "bare" / "r.json"
    out.parent.mkdir()
    assert cli_bench._report(dict(doc), str(out)) == 0
    assert json.loads(out.read_text())["methods"] == doc["methods"] and out.with_suffix(".md").exists()
    assert not out.with_suffix(".html").exists()
    err = capsys.readouterr().err
    assert f"plotly is not installed): `python -m fasteagle bench --redraw {out}`" in err


def test_node_budget_default_follows_the_method_and_device():
    """Each method starts at the budget `bench --tree auto` picked for it on this kind of device."""
    from fasteagle import methods as m

    assert m.default_budget("fasteagle", on_gpu=False) == m.CPU_BUDGETS["fasteagle"]
    assert m.default_budget("fasteagle+lookup", on_gpu=False) == m.CPU_BUDGETS["fasteagle+lookup"]
    assert m.default_budget("fasteagle-backbone", on_gpu=False) == m.CPU_BUDGETS["fasteagle"]
    assert all(2 <= b <= 16 for b in m.CPU_BUDGETS.values())
    assert m.default_budget("fasteagle", on_gpu=True) == m.GPU_BUDGETS["fasteagle"] > m.CPU_BUDGETS["fasteagle"]
    assert m.default_budget("eagle3", on_gpu=True) == m.PAPER_BUDGET == 60
    assert all(2 <= b <= m.MAX_BUDGET for b in [*m.CPU_BUDGETS.values(), *m.GPU_BUDGETS.values()])


def test_generate_drafts_the_devices_tree_and_bench_the_papers(tiny, tmp_path, monkeypatch):
    """`generate` without --tree-budget must not verify the paper's 60 nodes on a CPU (three decode steps'
    cost there: slower than plain decoding); `bench` keeps 60 unless told, so its recorded commands mean
    what they meant."""
    from types import SimpleNamespace

    import fasteagle.target
    from fasteagle import cli, cli_bench
    from fasteagle.drafter import CascadedDrafter, DrafterConfig
    from fasteagle.errors import FastEagleError
    from fasteagle.methods import CPU_BUDGETS, PAPER_BUDGET

    CascadedDrafter(DrafterConfig.for_target(tiny.model, tiny.name, num_layers=2, intermediate=32)).save(tmp_path)
    args = SimpleNamespace(tree_k=None, tree_budget=None, drafter=str(tmp_path))
    assert cli.make_drafter("fasteagle", tiny, args).tree_budget == CPU_BUDGETS["fasteagle"]
    assert cli.make_drafter("fasteagle", tiny, SimpleNamespace(**{**vars(args), "tree_budget": 9})).tree_budget == 9

    seen = []

    def stop(method, target, a):
        seen.append(a.tree_budget)
        raise FastEagleError("stop here")

    monkeypatch.setattr(fasteagle.target, "load_target", lambda *a, **k: tiny)
    monkeypatch.setattr(cli_bench, "make_drafter", stop)
    prompts = "assets/prompts/sharegpt_holdout.jsonl"
    assert main(["bench", "--prompts", prompts, "--limit", "1", "--methods", "vanilla,fasteagle"]) == 2
    assert main(["bench", "--prompts", prompts, "--limit", "1", "--methods", "fasteagle", "--tree-budget", "12"]) == 2
    assert seen == [PAPER_BUDGET, 12]


@pytest.mark.parametrize("argv,words", [
    (["generate", "--prompt", "hi", "--tree-budget", "1"], "--tree-budget"),
    (["bench", "--redraw", "no/such/result.json"], "cannot read the result file"),
    (["bench", "--redraw", "README.md"], "cannot read the result file"),
    (["bench", "--update-docs", "no/such/README.md"], "cannot read no/such/README.md"),
])
def test_bad_settings_and_files_are_one_line_errors(argv, words, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: ") and words in err and err.count("\n") == 1
