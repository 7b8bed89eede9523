"""`bench` on a table of bad inputs: exit code 2, one line `error: ...`, no traceback, nothing written,
and all of it before a model loads or anything is measured (the rows make either one fail the test).
Also: Ctrl-C during a bench says what it kept."""

from __future__ import annotations

import json
import os
from pathlib import Path
from types import SimpleNamespace

import pytest

import fasteagle.target
from fasteagle import bench, cli, cli_bench, files
from tests.test_bad_inputs import READ_ONLY, assert_one_line_error, bad_dir, run_main, tiny_dir  # noqa: F401
from tests.test_bench import interrupt_on_call

ROOT = Path(__file__).resolve().parent.parent
RESULT = ROOT / "bench" / "results" / "cpu-draft-step-smollm2-135m-2026-11-26.json"
COMPARED = ROOT / "bench" / "results" / "cpu-smollm2-135m-budget60-2026-11-26e.json"  # a method comparison
PROMPTS = [{"id": "a", "category": "chat", "text": "w7 w8 w9 w7 w8"},
           {"id": "b", "category": "chat", "text": "w10 w11 w12 w10"},
           {"id": "c", "category": "code", "text": "w20 w21 w20 w21"}]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> Path:
    """Inputs a bench row needs beside the shared broken files: good prompts, a prompt line without
    text, an empty prompt file, a README without a results section, a folder where a .md would go."""
    d = tmp_path_factory.mktemp("bench-inputs")
    (d / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    (d / "notext.jsonl").write_text(json.dumps(PROMPTS[0]) + "\n" + json.dumps({"id": "x", "category": "chat"}) + "\n")
    (d / "empty.jsonl").write_text("\n")
    (d / "nomarks.md").write_text("# a README without a results section\n")
    (d / "stale.md").write_text("<!-- result: missing.json -->\n<!-- /result -->\n")
    (d / "nocommand.json").write_text(json.dumps({k: v for k, v in json.loads(RESULT.read_text()).items()
                                                  if k != "command"}))
    (d / "nocommand.md").write_text("<!-- result: nocommand.json -->\n<!-- /result -->\n")
    (d / "taken" / "r.md").mkdir(parents=True)
    return d


# (bench args, a word the message must name); {p}: good prompts, {in}: the inputs folder
COMPARE = ["bench", "--prompts", "{p}", "--methods", "vanilla", "--target", "{tiny}", "--device", "cpu"]
ROWS = [
    (["bench", "--verify-cost", "a,b"], "--verify-cost"),
    (["bench", "--verify-cost", "0"], "--verify-cost"),
    (["bench", "--verify-cost", "-5"], "--verify-cost"),
    (["bench", "--verify-cost", "8,,16"], "--verify-cost"),
    (["bench", "--draft-step", "smollm2-135m", "--depths", "x"], "--depths"),
    (["bench", "--draft-step", "smollm2-135m", "--depths", "0"], "--depths"),
    (["bench", "--draft-step", "llama9"], "shape"),
    ([*COMPARE, "--budget-curve", "x"], "--budget-curve"),
    ([*COMPARE, "--diagnose", "wind64"], "--diagnose"),
    ([*COMPARE, "--diagnose", "tail0"], "--diagnose"),
    (["bench", "--prompts", "{p}", "--methods", "lookup", "--diagnose", "tail64"], "replays cascades"),
    (["bench", "--prompts", "{p}", "--methods", "fasteagle,eagle3", "--diagnose", "tail64"], "replays cascades"),
    (["bench", "--draft-step", "smollm2-135m", "--prefixes", "0"], "--prefixes"),
    ([*COMPARE, "--budget-curve", "6,1"], "--budget-curve"),
    (["bench", "--update-docs", "{tmp}/README.md"], "README.md"),
    (["bench", "--update-docs", "{bad}/latin1.jsonl"], "latin1.jsonl"),
    (["bench", "--update-docs", "{in}/nomarks.md"], "<!-- result: FILE -->"),
    (["bench", "--update-docs", "{in}/stale.md"], "missing.json"),
    (["bench", "--update-docs", "{in}/nocommand.md"], "records no command"),
    (["bench", "--prompts", "{tmp}/missing.jsonl", "--methods", "vanilla"], "missing.jsonl"),
    (["bench", "--prompts", "{tmp}", "--methods", "vanilla"], "prompt file"),
    (["bench", "--prompts", "{bad}/latin1.jsonl", "--methods", "vanilla"], "latin1.jsonl"),
    (["bench", "--prompts", "{bad}/binary.jsonl", "--methods", "vanilla"], "binary.jsonl"),
    (["bench", "--prompts", "{bad}/notjson.json", "--methods", "vanilla"], "not JSON"),
    (["bench", "--prompts", "{bad}/list.json", "--methods", "vanilla"], "no prompt"),
    (["bench", "--prompts", "{in}/notext.jsonl", "--methods", "vanilla"], "notext.jsonl:2"),
    (["bench", "--prompts", "{in}/empty.jsonl", "--methods", "vanilla"], "no prompts"),
    (["bench", "--prompts", "{p}", "--methods", "vanilla", "--limit", "0"], "--limit"),
    ([*COMPARE, "--out", "{ro}"], "not writable"),
    ([*COMPARE, "--out", "{bad}/a_file/r.json"], "a file"),
    ([*COMPARE, "--out", "{tmp}"], "folder"),
    ([*COMPARE, "--out", "{in}/taken/r.json"], "r.md"),
    ([*COMPARE, "--out", "{tmp}/r.md"], ".json"),
    (["bench", "--verify-cost", "1,8", "--out", "{ro}"], "not writable"),
    (["bench", "--draft-step", "smollm2-135m", "--out", "{bad}/a_file/r.json"], "a file"),
]


def expand(args: list[str], tmp: Path, tiny: Path, bad: Path, inputs: Path) -> list[str]:
    return [a.format(tmp=tmp, tiny=tiny, bad=bad, ro=READ_ONLY, p=inputs / "prompts.jsonl", **{"in": inputs})
            for a in args]


IDS = [" ".join(a[len(COMPARE):] if a[:len(COMPARE)] == COMPARE else a[1:])[:60] for a, _ in ROWS]


@pytest.mark.parametrize("args,word", ROWS, ids=IDS)
def test_bench_bad_input_is_one_line(args, word, tmp_path, tiny_dir, bad_dir, inputs, capsys, monkeypatch):  # noqa: F811
    def too_late(*a, **k):
        raise AssertionError("the bad input was found only after the model loaded or the timing began")

    for module, name in ((fasteagle.target, "load_target"), (bench, "draft_step_cost"), (bench, "verify_cost")):
        monkeypatch.setattr(module, name, too_late)
    rc, out, err = run_main(cli.main, expand(args, tmp_path, tiny_dir, bad_dir, inputs), capsys)
    assert_one_line_error(rc, err, word)
    assert not out.strip()
    assert list(tmp_path.iterdir()) == [], "a refused command leaves nothing behind"


def test_ctrl_c_says_what_the_bench_kept(tiny_dir, inputs, tmp_path, capsys, monkeypatch):  # noqa: F811
    """Ctrl-C after the first prompt: the result of that prompt is kept (marked partial) and one line
    says so, or says nothing was kept where no --out was given; exit code 130 either way."""
    timed = interrupt_on_call(5, bench.time_one)  # 2 warmup runs, 2 for the first prompt, then the second
    calls = timed.calls
    monkeypatch.setattr(bench.timing, "time_one", timed)
    out = tmp_path / "r.json"
    argv = ["bench", "--prompts", str(inputs / "prompts.jsonl"), "--methods", "vanilla,lookup", "--target",
            str(tiny_dir), "--device", "cpu", "--max-new-tokens", "4"]
    rc, stdout, err = run_main(cli.main, [*argv, "--out", str(out)], capsys)
    assert rc == 130 and "Traceback" not in err
    assert err.strip().splitlines()[-1] == f"interrupted: kept 1 of 3 prompts in {out}"
    assert json.loads(out.read_text())["partial"] == {"prompts_done": 1, "prompts": 3}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["r.json"], "no temporary file is left"

    calls.clear()
    rc, stdout, err = run_main(cli.main, argv, capsys)
    assert rc == 130 and "Traceback" not in err
    assert err.strip().splitlines()[-1] == "interrupted: nothing kept (no --out given) after 1 of 3 prompts"

    calls[:] = [1] * 4  # the first warmup run is the fifth call: no prompt has finished
    fresh = tmp_path / "fresh.json"
    rc, stdout, err = run_main(cli.main, [*argv, "--out", str(fresh)], capsys)
    assert rc == 130 and not fresh.exists()
    assert err.strip().splitlines()[-1] == f"interrupted: nothing kept (no prompt had finished); {fresh} not written"


def test_a_tree_the_target_cannot_hold_is_named(tiny_dir, tmp_path, capsys):  # noqa: F811
    """A --verify-cost size past the target's positions is refused as such, not timed out of range."""
    rc, out, err = run_main(cli.main, ["bench", "--verify-cost", "1,300", "--target", str(tiny_dir), "--device", "cpu",
                                       "--out", str(tmp_path / "r.json")], capsys)
    assert_one_line_error(rc, err, "at most 256")
    assert list(tmp_path.iterdir()) == []


def test_result_files_are_replaced_whole_or_not_at_all(tmp_path, monkeypatch):
    """Every result write (JSON, .md, .html, the README) renames a finished file into place: one that
    fails before the rename (a full disk, a kill) leaves the old files as they were and no stray file."""
    out = tmp_path / "r.json"
    out.write_text(COMPARED.read_text())
    readme = tmp_path / "README.md"
    readme.write_text("top\n<!-- result: r.json -->\nold\n<!-- /result -->\n")
    before = {p.name: p.read_text() for p in tmp_path.iterdir()}

    def crash(src, dst):
        raise OSError(28, "No space left on device", str(dst))

    monkeypatch.setattr(files, "os", SimpleNamespace(**{**vars(os), "replace": crash}))
    doc = json.loads(COMPARED.read_text())
    for write in (lambda: cli_bench._report(dict(doc), str(out)), lambda: bench.redraw(out),
                  lambda: bench.charts(doc, tmp_path / "r.html"), lambda: bench.update_docs([readme])):
        with pytest.raises(OSError, match="No space"):
            write()
    assert {p.name: p.read_text() for p in tmp_path.iterdir()} == before
