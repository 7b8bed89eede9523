"""Rerun the published results a changed drafter makes stale, then redraw the docs from them.

    python -m fasteagle bench --rerun fasteagle-equal --dry-run   # which results, their commands, minutes
    python -m fasteagle bench --rerun fasteagle-equal             # rerun each command, then --update-docs

A result is *published* when a document links it (README.md, docs/*.md, or the app's text); it *names* a
drafter when its recorded command decodes with that drafter: each method of `--methods` resolves through the
method registry (`fasteagle.methods`) with the command's own `--drafter` / `--eagle3-drafter`, so
`fasteagle-equal` names assets/drafters/smollm2-135m-fasteagle-equal and `fasteagle+lookup` names the shipped
cascade. A result made from another (`--step-costs SWEEP` reads the sweep's tau and tokens/s) goes stale with
it and reruns after it. Results measured on a GPU are listed but not rerun here. Each rerun replaces its file
in place (git keeps the old one) with the very command the file recorded. A result that changed after its
drafters did (as git sees both: the last commit, or the file's time where the working tree differs) was
measured with them already and is not stale, so a rerun longer than a session goes on where the last left off.
A result whose file says `"snapshot": "why"` measured a drafter as it was (an older compact vocabulary, say)
for a comparison its command alone cannot make again: it is listed, kept as measured, and never rerun.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from fasteagle.errors import FastEagleError

DOCUMENTS = ("README.md", "docs/*.md", "fasteagle/app/*.py")  # where a published result is linked from
LINK = re.compile(r"bench/results/([\w.+-]+\.json)")
LOAD_S = 45.0  # a method's load and warm-up, where a result predates its recorded wall time
READS = ("--step-costs", "--predict")  # flags whose value is another result file the command reads
SKIP = ("per_category", "rows", "tree_auto", "runs", "budget_curve", "pages")  # blocks that repeat a method's tokens


@dataclass
class Stale:
    """One published result that decodes with a changed drafter."""

    path: Path
    command: str
    drafters: list[str]  # the changed drafters it names (repository-relative)
    seconds: float  # its recorded wall time, else an estimate from its own rates (`estimate`)
    recorded: bool  # whether `seconds` was measured
    gpu: bool  # measured on a GPU: not rerun on this machine
    snapshot: str | None = None  # why it is kept as measured (the file's "snapshot"): not rerun

    @property
    def here(self) -> bool:
        """Whether `--rerun` runs it on this machine."""
        return not (self.gpu or self.snapshot)


def published(root: Path) -> list[Path]:
    """Every result file a document links, once each, in name order."""
    names = {m.group(1) for pattern in DOCUMENTS for doc in root.glob(pattern)
             for m in LINK.finditer(doc.read_text(encoding="utf-8"))}
    return sorted(root / "bench" / "results" / n for n in names if (root / "bench" / "results" / n).is_file())


def drafters_of(command: str, root: Path) -> set[Path]:
    """The drafter folders a recorded `python -m fasteagle bench ...` command decodes with (resolved)."""
    return set(method_drafters(command, root).values())


def method_drafters(command: str, root: Path) -> dict[str, Path]:
    """Each method of a recorded `python -m fasteagle bench ...` command that decodes with a drafter: its
    folder (resolved), as the command's own --drafter, --eagle3-drafter, ... and --drafters resolve it."""
    from fasteagle.methods import ALIASES, REGISTRY, Settings

    argv = shlex.split(command)
    flags = dict(_flags(argv))
    if argv[:3] != ["python", "-m", "fasteagle"] or "--methods" not in flags and "--method" not in flags:
        return {}  # a recipe, a draft step on random weights, the app's load test
    named = tuple((label, _path(folder, root)) for label, _, folder in
                  (x.partition("=") for x in (flags.get("--drafters") or "").split(",") if "=" in x))
    s = Settings(drafter=_path(flags.get("--drafter"), root), eagle3_drafter=_path(flags.get("--eagle3-drafter"), root),
                 dflash_drafter=_path(flags.get("--dflash-drafter"), root),
                 peagle_drafter=_path(flags.get("--peagle-drafter"), root), named=named)
    out = {}
    for m in (flags.get("--methods") or flags.get("--method")).split(","):
        if m in REGISTRY or m in ALIASES or m in dict(named):
            if (d := s.drafter_dir(m)) is not None:
                out[m] = Path(d).resolve()
    return out


def _flags(argv: list[str]):
    """(flag, value) pairs of an argument list, `--x v` and `--x=v` alike."""
    for i, a in enumerate(argv):
        if a.startswith("--") and "=" in a:
            yield tuple(a.split("=", 1))
        elif a.startswith("--") and i + 1 < len(argv) and not argv[i + 1].startswith("--"):
            yield a, argv[i + 1]


def _path(value: str | None, root: Path) -> Path | None:
    return None if value is None else (root / value if not Path(value).is_absolute() else Path(value))


def changed_folders(names: list[str], root: Path) -> dict[Path, str]:
    """The drafter folders `--rerun` names (a method such as fasteagle-equal, or a folder), each with its label."""
    from fasteagle.methods import ALIASES, REGISTRY, Settings

    out = {}
    for name in names:
        if name in REGISTRY or name in ALIASES:
            folder = Settings().drafter_dir(name)
            if folder is None:
                raise FastEagleError(f"--rerun {name}: that method loads no trained drafter")
        elif (root / name).is_dir() or Path(name).is_dir():
            folder = root / name if (root / name).is_dir() else Path(name)
        else:
            raise FastEagleError(f"--rerun {name!r} is neither a method with a drafter nor a drafter folder")
        out[Path(folder).resolve()] = name
    return out


def estimate(doc: dict) -> tuple[float, bool]:
    """Seconds a result took: its recorded `wall_s`, else its decoded tokens over their measured rates (every
    method block with `tokens_per_s`, times its repeats), plus a load per method: (seconds, recorded)."""
    if isinstance(doc.get("wall_s"), (int, float)):
        return float(doc["wall_s"]), True
    new = doc.get("max_new_tokens") or (doc.get("settings") or {}).get("max_new_tokens") or 64
    prompts = doc["prompts"] if isinstance(doc.get("prompts"), int) else 0  # the vLLM files count them here
    repeats = max(int(doc.get("repeats") or 1), 1) * max(len(doc.get("temperatures") or [0]), 1)
    seconds, loaded = 0.0, set()

    def walk(node, path=()):
        nonlocal seconds
        if isinstance(node, dict):
            rate = node.get("tokens_per_s")  # a number, or one per batch size (the engines comparison)
            rates = list(rate.values()) if isinstance(rate, dict) else [rate]
            if path and rates and all(isinstance(r, (int, float)) and r > 0 for r in rates):
                count = node.get("tokens")
                tokens = count if isinstance(count, int) else (node.get("prompts") or prompts) * new
                seconds += sum(tokens / r for r in rates) * repeats
                loaded.add(tuple(k for k in path if not k.isdigit() and k != "methods"))  # a method in an engine
                return
            for k, v in node.items():
                if k not in SKIP:
                    walk(v, (*path, str(k)))

    walk({k: doc[k] for k in ("methods", "batches") if isinstance(doc.get(k), dict)})
    return seconds + LOAD_S * max(len(loaded), 1), False


def stale(names: list[str], root: Path = Path("."), current: list[Path] | None = None) -> list[Stale]:
    """The published results that decode with any drafter `names` gives, in name order; those measured with the
    drafters as they are go to `current` instead, when given."""
    from fasteagle.bench.reports import read_result

    changed = changed_folders(names, root)
    out, derived, named = [], [], {}
    for path in published(root):
        doc = read_result(path)
        command = doc.get("command") or ""
        folders = [f for f in drafters_of(command, root) if f in changed]
        hit = sorted(changed[f] for f in folders)
        named[path.relative_to(root)] = hit
        if hit and not doc.get("snapshot") and not doc.get("partial") and remeasured(path, folders, root):
            if current is not None:
                current.append(path.relative_to(root))
            continue  # measured with the drafters as they are (a snapshot is listed as kept; a cut run is not)
        source = next((v for k, v in _flags(shlex.split(command)) if k in READS), None)
        if hit or source:
            seconds, recorded = estimate(doc)
            gpu = path.name.startswith("gpu-") or "--device cuda" in command
            (out if hit else derived).append((Stale(path.relative_to(root), command, hit, seconds, recorded, gpu,
                                                    doc.get("snapshot")),
                                              source))
    by_path = {s.path: s for s, _ in out}
    for s, source in derived:  # after every direct hit, so a sweep reruns before what is made from it
        if (made_from := by_path.get(Path(source))) is not None:
            s.drafters = made_from.drafters
            by_path[s.path] = s
        elif named.get(Path(source)) and (last_change([root / source], root) or 0) > (
                last_change([root / s.path], root) or 0):  # its sweep was remeasured since it was made
            s.drafters = named[Path(source)]
            by_path[s.path] = s
    return list(by_path.values())


def remeasured(result: Path, drafters: list[Path], root: Path) -> bool:
    """Whether `result` changed after every one of `drafters` did (its weights or config.json; not its card),
    so that it was measured with them as they are."""
    when = last_change([result], root)
    return when is not None and all(
        (d := last_change([f / "config.json", *sorted(f.glob("model*.safetensors"))], root)) is not None and when > d
        for f in drafters)


def last_change(paths: list[Path], root: Path) -> float | None:
    """When any of `paths` (files) last changed as git sees them: the newest file's time where the working tree
    differs from the last commit (modified or new), else that commit's time; None outside a git repository."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args, "--", *map(str, paths)], cwd=root, capture_output=True, text=True,
                                  timeout=60)
        except (OSError, subprocess.TimeoutExpired):
            return None
        return done.stdout if done.returncode == 0 else None

    status = git("status", "--porcelain")
    if status is None:
        return None
    if status.strip():
        return max((p.stat().st_mtime for p in paths if p.is_file()), default=None)
    stamp = (git("log", "-1", "--format=%ct") or "").strip()
    return float(stamp) if stamp else None


def describe(found: list[Stale], current: int = 0) -> str:
    """The dry run's listing: one line per result, then the total time on this machine (`current`: how many
    results that decode with the drafter were measured with it as it is)."""
    if not found:
        return (f"nothing to rerun: every published result that decodes with it ({current}) was measured with it "
                "as it is" if current else "no published result decodes with that drafter")
    def when(s: Stale) -> str:
        if s.snapshot:
            return "kept as measured"
        return "GPU, not rerun here" if s.gpu else f"{s.seconds / 60:.0f} min" + ("" if s.recorded else " (est.)")

    lines = [f"{when(s):>22}  {s.path}  [{', '.join(s.drafters)}]\n{'':>24}"
             + (f"snapshot: {s.snapshot}" if s.snapshot else s.command) for s in found]
    todo = [s for s in found if s.here]
    return "\n".join(lines) + f"\n{len(todo)} to rerun here, about {sum(s.seconds for s in todo) / 60:.0f} min"


def rerun(found: list[Stale], documents: list[str], root: Path = Path(".")) -> list[Path]:
    """Run each CPU result's recorded command again (in `root`, this Python), then redraw the result blocks
    of those documents that have any. Stops at the first failing command with a one-line error; those done stay done."""
    from tqdm import tqdm

    from fasteagle.bench.reports import RESULT_BLOCK, update_docs

    todo = [s for s in found if s.here]
    for s in tqdm(todo, desc="rerun results", unit="result"):
        argv = shlex.split(s.command)
        start = time.monotonic()
        done = subprocess.run([sys.executable, *argv[1:]], cwd=root, env=_with_package(os.environ))
        if done.returncode:
            raise FastEagleError(f"rerunning {s.path} failed (exit {done.returncode}): {s.command}")
        tqdm.write(f"reran {s.path} in {(time.monotonic() - start) / 60:.1f} min")
    pages = [root / d for d in documents]
    return update_docs([p for p in pages if p.is_file() and RESULT_BLOCK.search(p.read_text(encoding="utf-8"))])


def _with_package(env) -> dict:
    """The environment with this package importable, installed or not (the commands run `python -m fasteagle`)."""
    here = str(Path(__file__).resolve().parents[2])
    return {**env, "PYTHONPATH": os.pathsep.join(p for p in (here, env.get("PYTHONPATH")) if p)}

