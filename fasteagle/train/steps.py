"""A drafter trained stage by stage, as one recipe of steps run by one command:

    python -m fasteagle.train.recipe assets/recipes/fasteagle.json

Some drafters are not trained once from scratch at one budget (that is `recipe.py`'s kind) but grow
stage by stage, each stage continuing the weights of the one before on data cut for it: the shipped
FastEagle drafter grew over 14 stages on a CPU and a GPU. Such a recipe is a list of steps, each one
fasteagle command: `data` (python -m fasteagle.train.data: prompt files and their cuts), `tasks`
(python -m fasteagle.train.tasks: prompts beyond chat, made from train conversations), `train`
(python -m fasteagle train), `vocab` (python -m fasteagle.train.vocab), `bench` (python -m fasteagle bench:
the trained drafters measured, every step after the trainings, so nothing trains while it times), `compare`
(python -m fasteagle.train.compare: those results joined into one table and one chart), and the MoE study's
`moefy` (python -m fasteagle.train.moefy: a sparse target made from a dense one), `routing` (python -m
fasteagle.bench.routing: routing against a drafter's misses) and `moe` (python -m fasteagle.bench.moe: its
answer, joined). In a step's arguments
`{out}` is the recipe's out folder and `{configs}` the folder its `configs` (file name -> training
settings) are written to.

Before anything runs, every step's arguments are parsed by its own command line, every training
step's settings are checked, and every input under `{out}` must be an earlier step's output. Then the
steps run in order, each in its own process. A finished step leaves OUT/done/<step>.json (its
command and minutes) and a rerun skips it; a training step also resumes from its last checkpoint. A
step marked `"device": "cuda"` stops the recipe on a machine without a GPU, saying so: the same
command on a GPU machine goes on from there.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from fasteagle.errors import FastEagleError
from fasteagle.fields import check_types, from_json
from fasteagle.files import check_writable, write_text

# step kind -> python -m ...
COMMANDS = {"data": ["fasteagle.train.data"], "tasks": ["fasteagle.train.tasks"], "train": ["fasteagle", "train"],
            "vocab": ["fasteagle.train.vocab"], "bench": ["fasteagle", "bench"], "compare": ["fasteagle.train.compare"],
            "moefy": ["fasteagle.train.moefy"], "routing": ["fasteagle.bench.routing"], "moe": ["fasteagle.bench.moe"]}
SUBCOMMANDS = ("train", "bench")  # steps whose command is a `python -m fasteagle` subcommand


@dataclass
class Step:
    name: str  # unique; OUT/done/<name>.json marks it done
    run: str  # one of COMMANDS
    args: list[str]
    device: str = "any"  # "cuda": needs a GPU
    env: dict = field(default_factory=dict)  # environment variables for this step only
    stage: int | None = None  # the stage of the drafter's training log that this step trains


@dataclass
class StepRecipe:
    steps: list
    about: str = ""  # what the recipe makes, and where a rerun departs from what was run
    configs: dict = field(default_factory=dict)  # file name -> TrainConfig settings, written to {configs}
    log: str = ""  # the training_log.json of the drafter this recipe made (its stages: the steps' `stage`)
    ship: dict = field(default_factory=dict)  # step name -> the shipped drafter folder it adds a stage to
    out: str = ""  # where it all goes (default: runs/<the recipe file's name>)
    source: str = ""  # the recipe file it was read from (`load` sets it; not a field of the file)

    def argv(self, step: Step) -> list[str]:
        """The step's arguments with {out} and {configs} filled in."""
        configs = str(Path(self.out) / "configs")
        return [a.replace("{configs}", configs).replace("{out}", self.out) for a in step.args]

    def command(self, step: Step) -> list[str]:
        return [sys.executable, "-m", *COMMANDS[step.run], *self.argv(step)]

    def step_command(self, step: Step) -> str:
        """The recipe command that runs just this step (a result it joins records it: what makes it again)."""
        return shlex.join(["python", "-m", "fasteagle.train.recipe", self.source, "--out", self.out,
                           "--stages", step.name])

    def typed(self, step: Step) -> str:
        """The step's command as a user types it (what is printed and recorded)."""
        return shlex.join(["python", *self.command(step)[1:]])


def is_step_recipe(raw) -> bool:
    return isinstance(raw, dict) and "steps" in raw


def load(path: str | Path, raw: dict) -> StepRecipe:
    """A step recipe (parsed JSON `raw` of file `path`), every step checked before anything runs."""
    what = f"recipe {path}"
    recipe = from_json(StepRecipe, raw, what)
    recipe.out = recipe.out or str(Path("runs") / Path(path).stem)
    recipe.source = str(path)
    if not isinstance(recipe.steps, list) or not recipe.steps:
        raise FastEagleError(f"{what}: steps must be a non-empty list")
    recipe.steps = [from_json(Step, s, f"{what}, step {i + 1}") for i, s in enumerate(recipe.steps)]
    from fasteagle.train.config import TrainConfig

    for name, settings in recipe.configs.items():
        if not isinstance(settings, dict):
            raise FastEagleError(f"{what}: config {name} must be an object of training settings")
        unknown = sorted(set(settings) - set(TrainConfig.__dataclass_fields__))
        if unknown:
            raise FastEagleError(f"{what}: config {name}: unknown setting {unknown[0]!r} (the settings are the "
                                 "fields of TrainConfig in fasteagle/train/config.py)")
        check_types(TrainConfig, settings, f"{what}: config {name}")
    made: list[str] = [str(Path(recipe.out) / "configs")]
    for step in recipe.steps:
        check_step(recipe, step, made, what)
    return recipe


def check_step(recipe: StepRecipe, step: Step, made: list[str], what: str) -> None:
    """One step: a known command, unique name, arguments its command line takes, settings in range, and
    inputs under the out folder that earlier steps made (appended to `made`: this step's outputs)."""
    what = f"{what}, step {step.name}"
    if step.run not in COMMANDS:
        raise FastEagleError(f"{what}: run must be one of {', '.join(COMMANDS)}, not {step.run!r}")
    if step.device not in ("any", "cuda"):
        raise FastEagleError(f"{what}: device must be any or cuda, not {step.device!r}")
    if sum(s.name == step.name for s in recipe.steps) > 1:
        raise FastEagleError(f"{what}: two steps have this name")
    ns = parse(recipe, step, what)
    if step.run == "train":
        from fasteagle.train.config import TrainConfig

        TrainConfig(**train_settings(recipe, step, ns)).check()
    outs = outputs(step, ns)
    out = recipe.out.rstrip("/") + "/"
    for arg in recipe.argv(step):  # a path, or a comma list of paths or LABEL=PATH pairs
        for path in {arg, *(item.rpartition("=")[2] for item in arg.split(","))}:
            if path.startswith(out) and path not in outs and not any(path == m or path.startswith(m + "/")
                                                                     for m in made):
                raise FastEagleError(f"{what}: {path} is made by no earlier step")
    made.extend(outs)


def parse(recipe: StepRecipe, step: Step, what: str = "step"):
    """The step's arguments as its own command line parses them (its error, in one line, if it refuses)."""
    if step.run in SUBCOMMANDS:
        from fasteagle.cli import build_parser

        parser, argv = build_parser(), [step.run, *recipe.argv(step)]
    else:
        import importlib

        parser, argv = importlib.import_module(COMMANDS[step.run][0]).parser(), recipe.argv(step)
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            return parser.parse_args(argv)
    except SystemExit:
        msg = err.getvalue().strip().splitlines()
        raise FastEagleError(f"{what}: {msg[-1].removeprefix('error: ') if msg else 'arguments refused'}") from None


def outputs(step: Step, ns) -> list[str]:
    """What a step writes: a training run's --out, a prompt file, a drafter given a new vocabulary, a result."""
    if step.run == "vocab":
        return [ns.out or ns.drafter]
    if step.run in ("data", "tasks"):
        return [ns.prompts_out] if ns.prompts_out else []
    return [ns.out]


def train_settings(recipe: StepRecipe, step: Step, ns=None) -> dict:
    """A training step's TrainConfig settings: its --config (one of the recipe's `configs`, or a file),
    then its flags over them, as `python -m fasteagle train` resolves them (`ns`: its arguments parsed)."""
    from fasteagle.cli import train_settings as resolve
    from fasteagle.train.config import read_config_file

    ns = ns or parse(recipe, step)
    base = {}
    if ns.config:
        name = Path(ns.config)
        base = (recipe.configs[name.name] if str(name.parent) == str(Path(recipe.out) / "configs")
                and name.name in recipe.configs else read_config_file(ns.config))
    return base | resolve(argparse.Namespace(**(vars(ns) | {"config": None})))


def run(recipe: StepRecipe, names: list[str] | None = None, dry_run: bool = False) -> None:
    """The steps (all, or those named) in order, each skipped when an earlier run finished it."""
    out = Path(recipe.out)
    unknown = sorted(set(names or []) - {s.name for s in recipe.steps})
    if unknown:
        raise FastEagleError(f"no step {unknown[0]!r} in this recipe (its steps: "
                             f"{', '.join(s.name for s in recipe.steps)})")
    steps = [s for s in recipe.steps if not names or s.name in names]
    if dry_run:
        for s in steps:
            done = " (done)" if (out / "done" / f"{s.name}.json").exists() else ""
            env = "".join(f"{k}={v} " for k, v in s.env.items())
            print(f"# {s.name}{done}\n{env}{recipe.typed(s)}")
        return
    check_writable(out, "the recipe's out folder", directory=True)
    for name, settings in recipe.configs.items():
        write_text(out / "configs" / name, json.dumps(settings, indent=2))
    for i, s in enumerate(steps):
        marker = out / "done" / f"{s.name}.json"
        if marker.exists():
            print(f"[{i + 1}/{len(steps)}] {s.name}: done already")
            continue
        if s.device == "cuda" and not _has_cuda():
            raise FastEagleError(f"step {s.name} needs a GPU and this machine has none; {i} of {len(steps)} steps "
                                 "are done: run the same command on a GPU machine to go on from here")
        print(f"[{i + 1}/{len(steps)}] {s.name}: {recipe.typed(s)}", flush=True)
        t0 = time.monotonic()
        rc = subprocess.run(recipe.command(s), env=os.environ | {k: str(v) for k, v in s.env.items()}
                            | {"FASTEAGLE_RECIPE_STEP": recipe.step_command(s)}).returncode
        if rc:
            raise FastEagleError(f"step {s.name} failed (exit code {rc}); fix it and run again: "
                                 "the steps done are skipped")
        write_text(marker, json.dumps({"command": recipe.typed(s), "env": s.env,
                                       "minutes": round((time.monotonic() - t0) / 60, 2),
                                       "date": time.strftime("%Y-%m-%d %H:%M")}, indent=1))


def _has_cuda() -> bool:
    import torch

    return torch.cuda.is_available()
