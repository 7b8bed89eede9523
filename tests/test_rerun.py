"""`bench --rerun`: which published results a changed drafter makes stale, how long they take, and the rerun."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from fasteagle.bench import rerun
from fasteagle.cli import main
from fasteagle.errors import FastEagleError
from fasteagle.methods import DEFAULT_DRAFTER, DEFAULT_EAGLE3, EQUAL_DRAFTER

REPO = Path(__file__).resolve().parent.parent


def test_a_command_names_the_drafters_its_methods_load():
    cmd = "python -m fasteagle bench --methods vanilla,hf-prompt-lookup,eagle3,fasteagle-equal --out x.json"
    assert rerun.drafters_of(cmd, REPO) == {DEFAULT_EAGLE3.resolve(), EQUAL_DRAFTER.resolve()}
    lookup = "python -m fasteagle bench --methods fasteagle+lookup"
    assert rerun.drafters_of(lookup, REPO) == {DEFAULT_DRAFTER.resolve()}
    own = "python -m fasteagle bench --methods fasteagle --drafter runs/stage15 --budget-curve 6"
    assert rerun.drafters_of(own, REPO) == {(REPO / "runs/stage15").resolve()}
    named = "python -m fasteagle bench --methods vanilla,flat --drafters flat=assets/drafters/smollm2-135m-eagle3"
    assert rerun.drafters_of(named, REPO) == {DEFAULT_EAGLE3.resolve()}
    vllm = "python -m fasteagle bench --engine vllm --methods=vanilla,ngram,fasteagle-equal --batch-sizes 1"
    assert rerun.drafters_of(vllm, REPO) == {EQUAL_DRAFTER.resolve()}
    for other in ("python -m fasteagle bench --draft-step smollm2-135m --depths 4,6,8",
                  "python -m fasteagle.train.recipe assets/recipes/equal-training.json --report x.json"):
        assert rerun.drafters_of(other, REPO) == set()


def test_the_estimate_is_the_recorded_wall_time_else_tokens_over_rates():
    assert rerun.estimate({"wall_s": 90.5, "methods": {}}) == (90.5, True)
    doc = {"methods": {"vanilla": {"tokens": 200, "tokens_per_s": 20.0},
                       "fasteagle": {"tokens": 200, "tokens_per_s": 40.0}},
           "per_category": {"chat": {"vanilla": {"tokens": 200, "tokens_per_s": 20.0}}}}  # not counted twice
    assert rerun.estimate(doc) == (10.0 + 5.0 + 2 * rerun.LOAD_S, False)
    engines = {"prompts": 2, "max_new_tokens": 10, "methods": {"vanilla": {
        "vllm": {"tokens_per_s": {"1": 10.0}}, "ours": {"tokens_per_s": {"1": 20.0}}}}}
    assert rerun.estimate(engines) == (2.0 + 1.0 + 2 * rerun.LOAD_S, False)


def _site(root: Path, results: dict[str, str], linked: list[str]) -> None:
    """A repository with these result files (name -> command) and a docs page linking `linked`."""
    (root / "bench" / "results").mkdir(parents=True)
    (root / "docs").mkdir()
    for name, command in results.items():
        (root / "bench" / "results" / name).write_text(json.dumps({"command": command, "wall_s": 60.0, "prompts": 1,
                                                                   "methods": {}}))
    links = "\n".join(f"<!-- result: ../bench/results/{n} -->\nold\n<!-- /result -->" for n in linked)
    (root / "docs" / "results.md").write_text(f"# Results\n\n{links}\n")
    (root / "README.md").write_text("# x\n")


def _commit(root: Path, when: int, *paths: str) -> None:
    """Commit `paths` in `root` (a git repository made on first use) as of the Unix time `when`."""
    if not (root / ".git").is_dir():
        subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    env = os.environ | {f"GIT_{who}_{k}": v for who in ("AUTHOR", "COMMITTER")
                        for k, v in (("NAME", "t"), ("EMAIL", "t@t"), ("DATE", f"@{when} +0000"))}
    subprocess.run(["git", "add", *paths], cwd=root, check=True)
    subprocess.run(["git", "commit", "-q", "-m", "x"], cwd=root, check=True, env=env)


def test_only_published_results_that_decode_with_the_changed_drafter_are_stale(tmp_path):
    _site(tmp_path, {
        "cpu-a.json": "python -m fasteagle bench --methods vanilla,fasteagle-equal --out bench/results/cpu-a.json",
        "cpu-b.json": "python -m fasteagle bench --methods vanilla,eagle3 --out bench/results/cpu-b.json",
        "cpu-unlinked.json": "python -m fasteagle bench --methods fasteagle-equal",
        "gpu-h200-c.json": "python -m fasteagle bench --methods fasteagle-equal --device cuda",
        "cpu-a-costs.json": "python -m fasteagle bench --engine vllm --step-costs bench/results/cpu-a.json --out x",
        "cpu-b-costs.json": "python -m fasteagle bench --engine vllm --step-costs=./bench/results/cpu-b.json",
    }, linked=["cpu-a-costs.json", "cpu-a.json", "cpu-b.json", "cpu-b-costs.json", "gpu-h200-c.json"])
    found = rerun.stale(["fasteagle-equal"], tmp_path)
    assert [(s.path.name, s.drafters, s.gpu, s.seconds) for s in found] == [  # a result made from a sweep after it
        ("cpu-a.json", ["fasteagle-equal"], False, 60.0), ("gpu-h200-c.json", ["fasteagle-equal"], True, 60.0),
        ("cpu-a-costs.json", ["fasteagle-equal"], False, 60.0)]
    listing = rerun.describe(found)
    assert "2 to rerun here, about 2 min" in listing and "GPU, not rerun here" in listing
    assert [s.path.name for s in rerun.stale(["eagle3"], tmp_path)] == ["cpu-b.json", "cpu-b-costs.json"]
    assert rerun.describe(rerun.stale([str(REPO / "assets/drafters/smollm2-135m-eagle3")], tmp_path)).count("\n") == 4
    doc = json.loads((tmp_path / "bench" / "results" / "cpu-a.json").read_text())
    (tmp_path / "bench" / "results" / "cpu-a.json").write_text(json.dumps(doc | {"snapshot": "the old vocabulary"}))
    found = rerun.stale(["fasteagle-equal"], tmp_path)
    assert [(s.path.name, s.here) for s in found] == [
        ("cpu-a.json", False), ("gpu-h200-c.json", False), ("cpu-a-costs.json", True)]
    listing = rerun.describe(found)
    assert "kept as measured  bench/results/cpu-a.json" in listing and "snapshot: the old vocabulary" in listing
    assert "1 to rerun here, about 1 min" in listing
    with pytest.raises(FastEagleError, match="neither a method"):
        rerun.stale(["no-such-drafter"], tmp_path)
    with pytest.raises(FastEagleError, match="loads no trained drafter"):
        rerun.stale(["lookup"], tmp_path)


def test_a_result_measured_since_its_drafter_changed_is_not_stale(tmp_path):
    """So that a rerun longer than a session goes on where the last one left off (git's times decide)."""
    cmd = "python -m fasteagle bench --methods fasteagle --drafter drafters/d --out bench/results/cpu-a.json"
    _site(tmp_path, {"cpu-a.json": cmd}, linked=["cpu-a.json"])
    (tmp_path / "drafters" / "d").mkdir(parents=True)
    (tmp_path / "drafters" / "d" / "config.json").write_text("{}")
    assert [s.path.name for s in rerun.stale(["drafters/d"], tmp_path)] == ["cpu-a.json"]  # not a git repository
    _commit(tmp_path, 1_000_000_000, ".")
    assert [s.path.name for s in rerun.stale(["drafters/d"], tmp_path)] == ["cpu-a.json"]  # not measured after
    result = tmp_path / "bench" / "results" / "cpu-a.json"
    doc = json.loads(result.read_text())
    result.write_text(json.dumps(doc | {"partial": {"prompts_done": 1, "prompts": 2}}))
    assert [s.path.name for s in rerun.stale(["drafters/d"], tmp_path)] == ["cpu-a.json"]  # a rerun stopped midway
    result.write_text(json.dumps(doc) + "\n")
    current = []
    assert rerun.stale(["drafters/d"], tmp_path, current) == []  # remeasured, not committed yet
    assert current == [Path("bench/results/cpu-a.json")]
    assert rerun.describe([], len(current)) == ("nothing to rerun: every published result that decodes with it (1) "
                                                "was measured with it as it is")
    _commit(tmp_path, 1_100_000_000, "bench")
    assert rerun.stale(["drafters/d"], tmp_path) == []  # remeasured and committed
    (tmp_path / "drafters" / "d" / "README.md").write_text("a better card")
    assert rerun.stale(["drafters/d"], tmp_path) == []  # its card is not the drafter
    (tmp_path / "drafters" / "d" / "config.json").write_text('{"changed": true}')
    assert [s.path.name for s in rerun.stale(["drafters/d"], tmp_path)] == ["cpu-a.json"]  # the drafter changed again


def test_a_result_made_from_a_remeasured_sweep_stays_stale_until_remade(tmp_path):
    """`--step-costs` reads a sweep: once the sweep is measured again, what was made from the old one is stale."""
    sweep = "python -m fasteagle bench --methods fasteagle --drafter drafters/d --out bench/results/cpu-a.json"
    costs = "python -m fasteagle bench --engine vllm --step-costs bench/results/cpu-a.json --out x"
    _site(tmp_path, {"cpu-a.json": sweep, "cpu-a-costs.json": costs}, linked=["cpu-a.json", "cpu-a-costs.json"])
    (tmp_path / "drafters" / "d").mkdir(parents=True)
    (tmp_path / "drafters" / "d" / "config.json").write_text("{}")
    _commit(tmp_path, 1_000_000_000, ".")
    names = lambda: [s.path.name for s in rerun.stale(["drafters/d"], tmp_path)]  # noqa: E731
    assert names() == ["cpu-a.json", "cpu-a-costs.json"]
    results = tmp_path / "bench" / "results"
    (results / "cpu-a.json").write_text((results / "cpu-a.json").read_text() + "\n")  # the sweep remeasured
    assert names() == ["cpu-a-costs.json"]
    (results / "cpu-a-costs.json").write_text((results / "cpu-a-costs.json").read_text() + "\n")
    later = (results / "cpu-a.json").stat().st_mtime + 10  # made after the sweep, whatever the clock's grain
    os.utime(results / "cpu-a-costs.json", (later, later))
    assert names() == []


def test_rerun_runs_each_recorded_command_then_redraws_the_docs(tmp_path):
    """A cheap recorded command (a redraw, which names the cascade by its --methods) runs in the repository,
    then the docs' block is drawn from the file it rewrote; a failing command stops with one line."""
    doc = json.loads((REPO / "bench/results/cpu-smollm2-135m-chat30-2026-11-28.json").read_text())
    doc.pop("wall_s", None)  # as a result from before wall times were recorded: the time is estimated
    cmd = "python -m fasteagle bench --methods fasteagle --redraw bench/results/cpu-a.json"
    _site(tmp_path, {"cpu-a.json": cmd}, linked=["cpu-a.json"])
    (tmp_path / "bench/results/cpu-a.json").write_text(json.dumps(doc | {"command": cmd}))
    found = rerun.stale(["fasteagle"], tmp_path)
    assert [s.path.name for s in found] == ["cpu-a.json"] and not found[0].recorded
    assert rerun.rerun(found, ["README.md", "docs/results.md"], tmp_path)
    assert (tmp_path / "bench/results/cpu-a.md").is_file()  # the recorded command ran
    page = (tmp_path / "docs/results.md").read_text()
    assert "old" not in page and "| fasteagle |" in page and f"made by `{cmd}`" in page
    bad = "python -m fasteagle bench --methods fasteagle --redraw bench/results/missing.json"
    (tmp_path / "bench/results/cpu-a.json").write_text(json.dumps(doc | {"command": bad}))
    with pytest.raises(FastEagleError, match="rerunning bench/results/cpu-a.json failed"):
        rerun.rerun(rerun.stale(["fasteagle"], tmp_path), ["docs/results.md"], tmp_path)


def test_bench_rerun_dry_run_lists_and_runs_nothing(capsys):
    before = {p: p.stat().st_mtime_ns for p in (REPO / "bench" / "results").glob("*.json")}
    assert main(["bench", "--rerun", "fasteagle-equal", "--dry-run"]) == 0
    out = capsys.readouterr().out
    current = []
    found = rerun.stale(["fasteagle-equal"], REPO, current)
    assert out.strip() == rerun.describe(found, len(current)).strip()  # what is stale today
    assert {p: p.stat().st_mtime_ns for p in (REPO / "bench" / "results").glob("*.json")} == before
    assert main(["bench", "--rerun", "nope", "--dry-run"]) == 2
    assert "neither a method" in capsys.readouterr().err
