"""The docs stay short, linked and sourced: the README under 12 KB; every relative link of the README,
docs/ and the drafter cards resolves; every table of measurements is drawn from a committed result file
that stores its command, and drawing them again changes nothing; every documented command parses; each
shipped drafter keeps one training log instead of stage files."""

from __future__ import annotations

import json
import re
import shlex
import string
from pathlib import Path

import pytest

from fasteagle import bench, cli, cli_bench

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
CARDS = sorted((ROOT / "assets" / "drafters").glob("*/README.md"))
PAGES = [README, *DOCS, *CARDS]
DRAFTERS = sorted(p.parent for p in CARDS)
RESULTS = ROOT / "bench" / "results"
BLOCK = re.compile(r"<!-- result: (\S+) -->\n(.*?)<!-- /result -->", re.S)


def rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def test_the_readme_is_short():
    assert README.stat().st_size < 12_000, "the README is for a newcomer: move detail to docs/"


def links(text: str) -> list[str]:
    """Markdown link targets and image sources, code spans left out (they show commands, not links)."""
    text = re.sub(r"```.*?```", "", text, flags=re.S)
    text = re.sub(r"`[^`\n]*`", "", text)
    return re.findall(r"\]\(([^)\s]+)\)", text) + re.findall(r'<img [^>]*src="([^"]+)"', text)


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


@pytest.mark.parametrize("page", PAGES, ids=rel)
def test_every_relative_link_resolves(page):
    broken = []
    for target in links(page.read_text()):
        if re.match(r"[a-z]+:", target):  # https:, mailto: ...
            continue
        file, _, frag = target.partition("#")
        path = (page.parent / file).resolve() if file else page
        if not path.exists() or ROOT not in (path, *path.parents):
            broken.append(target)
        elif frag and path.suffix == ".md":
            headings = re.findall(r"^#+ (.+)$", path.read_text(), re.M)
            if frag not in {anchor(h) for h in headings}:
                broken.append(target)
    assert not broken, f"{rel(page)} links to what is not there: {broken}"


@pytest.mark.parametrize("page", [README, ROOT / "docs" / "results.md"], ids=rel)
def test_result_tables_are_drawn_from_result_files_that_store_their_command(page):
    text = page.read_text()
    blocks = BLOCK.findall(text)
    assert blocks, f"{rel(page)} has no generated result table"
    for file, body in blocks:
        doc = json.loads((page.parent / file).read_text())
        # a bench run, or the recipe that trained the drafters it measures and ran the bench on them
        assert doc.get("command", "").startswith(("python -m fasteagle bench ",
                                                  "python -m fasteagle.train.recipe ")), file
        assert f"made by `{doc['command']}`" in body
    # drawn again from the files, nothing changes: no table was edited by hand, no file changed under one
    assert bench.render_docs([page]) == {page: text}, "run: python -m fasteagle bench --update-docs"


def test_update_docs_draws_the_readme_and_results_by_default():
    assert cli_bench.DOCS == ("README.md", "docs/results.md")
    assert cli.build_parser().parse_args(["bench", "--update-docs"]).update_docs == "README.md,docs/results.md"


@pytest.mark.parametrize("page", [README, *DOCS], ids=rel)
def test_no_table_of_measurements_outside_a_generated_block(page):
    """A table of timings, speedups or acceptances is drawn from a result file, never typed; the one
    exception is training.md's table of stages, which test_the_training_table_matches_the_logs checks."""
    text = BLOCK.sub("", page.read_text())
    tables = re.findall(r"((?:^\|.*\|\n)+)", text, re.M)
    measured = [t for t in tables if re.search(r"\d\.\d|\d(\.\d+)?x\b|\bms\b", t)]
    if page.name == "training.md":
        measured = [t for t in measured if not t.startswith("| stage | where |")]
    assert not measured, f"{rel(page)}: a table of measurements typed by hand:\n{measured[0]}"


def test_every_kept_result_is_cited_and_stores_its_command():
    cited = "\n".join(p.read_text() for p in PAGES)
    for f in sorted(RESULTS.glob("*.json")):
        assert f.name in cited, f"{rel(f)} is cited nowhere: cite it from docs/ or git rm it"
        assert json.loads(f.read_text()).get("command"), f"{rel(f)} stores no command"
    for f in sorted(RESULTS.glob("*")):
        assert f.with_suffix(".json").exists(), f"{rel(f)} has no result file beside it"


def commands(page: Path) -> list[str]:
    """The command lines of a page's bash blocks: continuations joined, VAR="..." lines expanded."""
    out, env = [], {}
    for block in re.findall(r"```bash\n(.*?)```", page.read_text(), re.S):
        for line in block.replace("\\\n", " ").splitlines():
            if m := re.match(r'^([A-Z_]+)="(.*)"$', line.strip()):
                env[m[1]] = m[2]
            elif line.strip() and not line.lstrip().startswith("#"):
                out.append(string.Template(line).safe_substitute(env))
    return out


def documented(prog: str) -> list[tuple[str, list[str]]]:
    """(page, argv) of every `python -m <prog> ...` in the README, docs/ and the cards."""
    found = []
    for page in PAGES:
        for line in commands(page):
            lex = shlex.shlex(line, posix=True, punctuation_chars=";&|")
            lex.whitespace_split, lex.commenters = True, "#"
            part: list[str] = []
            for word in [*lex, ";"]:
                if word not in (";", "&&", "||", "|"):
                    part.append(word)
                    continue
                if part[:3] == ["python", "-m", prog] or part[1:4] == ["python", "-m", prog]:  # VAR=1 python ...
                    found.append((rel(page), part[part.index(prog) + 1:]))
                part = []
    return found


def test_every_documented_fasteagle_command_parses_and_its_configs_exist():
    from fasteagle.train.config import TrainConfig, read_config_file

    cmds = documented("fasteagle")
    assert len(cmds) > 5 and {argv[0] for _, argv in cmds} >= {"generate", "bench", "train"}  # (the recipes' steps
    # are parsed by the recipe loader: test_the_shipped_training_configs_pass_the_checks)
    parser = cli.build_parser()
    for page, argv in cmds:
        if "--help" in argv:
            continue
        try:
            args = parser.parse_args(argv)
        except SystemExit:
            pytest.fail(f"{page}: python -m fasteagle {' '.join(argv)} does not parse")
        config = getattr(args, "config", None)
        if config and not config.startswith("runs/"):  # runs/: written by a command before it
            assert (ROOT / config).is_file(), f"{page}: --config {config} is not in the repository"
            TrainConfig(out="x", **read_config_file(ROOT / config)).check()


@pytest.mark.parametrize("module", ["fasteagle.train.data", "fasteagle.train.vocab"])
def test_every_documented_flag_of_the_training_tools_exists(module):
    source = (ROOT / (module.replace(".", "/") + ".py")).read_text()
    cmds = documented(module)
    assert cmds
    for page, argv in cmds:
        for flag in (w for w in argv if w.startswith("--")):
            assert f'"{flag}"' in source, f"{page}: python -m {module} has no {flag}"


@pytest.mark.parametrize("drafter", DRAFTERS, ids=lambda d: d.name)
def test_a_drafter_keeps_one_training_log_not_stage_files(drafter, tmp_path):
    from fasteagle.train.config import TrainConfig, read_config_file

    assert {p.name for p in drafter.iterdir()} == {"README.md", "config.json", "model.safetensors", "eval.json",
                                                   "training_log.json", "configs"}
    log = json.loads((drafter / "training_log.json").read_text())
    assert [s["stage"] for s in log] == list(range(1, len(log) + 1))
    for s in log:
        assert {"stage", "shipped", "date", "hardware", "data", "configs", "training", "eval", "history"} <= set(s)
        assert s["eval"]["holdout"]["tau_backbone"] > 1 and s["configs"]
        for name, config in s["configs"].items():
            (tmp_path / name).write_text(json.dumps(config))
            TrainConfig(out="x", **read_config_file(tmp_path / name)).check()
    current = log[-1]
    assert current["shipped"] and current["eval"] == json.loads((drafter / "eval.json").read_text())
    assert current["training"] == json.loads((drafter / "config.json").read_text())["training"]
    logged = [c for s in log for c in s["configs"].values()]
    for f in (drafter / "configs").iterdir():
        assert json.loads(f.read_text()) in logged, f"{rel(f)} is no stage's config"
    assert (drafter / "README.md").stat().st_size < 6_000
    assert (drafter / "README.md").read_text().startswith("---\nbase_model: HuggingFaceTB/SmolLM2-135M-Instruct\n")


def test_the_training_table_matches_the_logs():
    """docs/training.md's stage table: each stage's holdout tau before and after, as its log entry holds."""
    log = json.loads((ROOT / "assets/drafters/smollm2-135m-fasteagle/training_log.json").read_text())
    rows = re.findall(r"^\| (\d+) \| .* \| (untrained|[\d.]+) -> ([\d.]+) \|$", (ROOT / "docs/training.md").read_text(),
                      re.M)
    assert [int(n) for n, _, _ in rows] == [s["stage"] for s in log]
    for (n, before, after), s in zip(rows, log):
        ev = s["eval"]
        start = ev.get("holdout_initial", {}).get("tau_backbone", 1.0)
        assert (1.0 if before == "untrained" else float(before)) == pytest.approx(start), f"stage {n}"
        assert float(after) == pytest.approx(ev["holdout"]["tau_backbone"]), f"stage {n}"
