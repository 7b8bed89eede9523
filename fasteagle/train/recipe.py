"""Drafters trained at equal budgets from one recipe file, then measured side by side:

    python -m fasteagle.train.recipe assets/recipes/equal-training.json

A recipe (a JSON file, see assets/recipes/) names the prompts, the training settings every drafter
shares, each drafter's own settings, and the budgets (optimizer steps) at which every drafter is
saved and benchmarked. The stages, each resumable (a rerun skips what is on disk, and a training run
goes on from its last checkpoint):

1. prompts  the recipe's prompt sources, tokenized once (OUT/prompts.pt);
2. data     the target answers them, and its features go into fp16 shards in the same pass
            (OUT/data/features); beside them, with `written`, ShareGPT conversations as written,
            which cost the target one forward each instead of a generation (OUT/written/features):
            the one teacher pass that every drafter trains on. Each done once (its done.json), so a
            time cap on the generation holds for the whole run;
3. tune     for each drafter of the pair, each candidate learning rate for a few steps; the lowest
            late training loss wins (OUT/tune.json): the one setting that may differ between the two,
            written down. Another drafter (an ablation) takes the lr tuned for the pair's drafter of
            its kind, so that it differs from it in its own settings only;
4. train    each drafter from scratch on the same shards in the same order (same seed, same
            micro-batches, so step n has seen the same tokens for every drafter), saved at every
            budget (OUT/<drafter>/at-<steps>), the smallest budget of every drafter first;
5. eval     at each budget `fasteagle bench` on the saved drafters: the compared pair side by side
            at each one's `--tree auto` budget and at the paper's ~60-node tree, each other drafter
            (a depth ablation) beside vanilla (OUT/eval/*.json, each storing its own command);
6. compare  with `eval.side_by_side`, every drafter at one budget in the same bench runs, on each prompt
            set and tree it names, then one table and one chart (fasteagle/train/compare.py); a drafter
            not saved at that budget yet is left out, and measured with the others once it is;
7. report   the curves as one result file with its Markdown table and Plotly charts (--report FILE);
8. ship     only when asked (--stages ship): the drafters named in `ship`, at its budget, written
            where the repository keeps its drafters: weights, config, the settings they trained with,
            a holdout evaluation (teacher-forced on the target's greedy replies to ShareGPT holdout
            prompts) and a one-stage training log. The model card beside them is written by hand.

A recipe with `steps` instead is a drafter trained stage by stage, as it was (fasteagle/train/steps.py);
the same command runs it.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from fasteagle.errors import FastEagleError, Parser, run_command
from fasteagle.fields import from_json
from fasteagle.files import check_writable, write_text
from fasteagle.train import compare
from fasteagle.train import steps as step_recipes
from fasteagle.train.compare import BenchRun, result_of, snapshot

STAGES = ("prompts", "data", "tune", "train", "eval", "compare", "report", "ship")
DEFAULT_STAGES = STAGES[:-1]  # ship writes into the repository's drafters: only when asked
SNAPSHOT_FILES = ("model.safetensors", "config.json", "README.md", "history.json")


@dataclass
class Recipe:
    prompts: dict  # source -> how many prompts: chat, code, or a category of fasteagle.train.tasks (long too)
    budgets: list[int]  # optimizer steps at which every drafter is saved and measured
    drafters: dict  # name -> its own TrainConfig settings (drafter, num_layers, ...), and "budgets" where
    # they differ from the recipe's (an ablation measured at one budget)
    pair: list[str]  # the two drafters compared side by side: [the cascade, the EAGLE-3-style one]
    train: dict = field(default_factory=dict)  # TrainConfig settings shared by every drafter and the data stage
    max_prompt_tokens: int = 2048  # longer prompts are left out
    tune: dict = field(default_factory=dict)  # {"lr": [...], "steps": n}: tried for the pair's drafters
    eval: dict = field(default_factory=dict)  # bench settings: prompts, limit, max_new_tokens, paper_budget
    written: int = 0  # ShareGPT train conversations as written, besides the self-distilled replies
    ship: dict = field(default_factory=dict)  # {"steps": n, "to": {drafter: folder}, "holdout": prompts}
    out: str = ""  # where it all goes (default: runs/<the recipe file's name>)
    data_from: str = ""  # another recipe's out folder: train on its prompts, replies and shards (its data done)

    def budgets_of(self, name: str) -> list[int]:
        return sorted(self.drafters[name].get("budgets", self.budgets))

    def settings(self, name: str) -> dict:
        """TrainConfig settings of drafter `name`: the shared ones, then its own."""
        return self.train | {k: v for k, v in self.drafters[name].items() if k != "budgets"}


def load(path: str | Path) -> Recipe | step_recipes.StepRecipe:
    """A recipe file, every field and every drafter's settings checked before anything runs (a recipe of
    steps, fasteagle/train/steps.py, every step's)."""
    from fasteagle.train.config import TrainConfig
    from fasteagle.train.tasks import SOURCES

    path = Path(path)
    raw = _read(path)
    if step_recipes.is_step_recipe(raw):
        return step_recipes.load(path, raw)
    recipe = from_json(Recipe, raw, f"recipe {path}")
    recipe.out = recipe.out or str(Path("runs") / path.stem)
    unknown = sorted(set(recipe.prompts) - set(SOURCES))
    if unknown:
        raise FastEagleError(f"recipe {path}: unknown prompt source {unknown[0]!r} (known: "
                             f"{', '.join(SOURCES)})")
    if len(recipe.pair) != 2 or not set(recipe.pair) <= set(recipe.drafters):
        raise FastEagleError(f"recipe {path}: pair must name two of its drafters, not {recipe.pair}")
    if not recipe.budgets or min(recipe.budgets) < 1:
        raise FastEagleError(f"recipe {path}: budgets must be a list of step counts of 1 or more")
    for name in recipe.drafters:
        TrainConfig(out=str(Path(recipe.out) / name), **recipe.settings(name)).check()
    if recipe.ship and (not set(recipe.ship.get("to", {})) <= set(recipe.drafters)
                        or recipe.ship.get("steps") not in recipe.budgets):
        raise FastEagleError(f"recipe {path}: ship needs steps (one of its budgets) and to (drafter -> folder), "
                             f"not {recipe.ship}")
    compare.spec(recipe)
    return recipe


def _read(path: str | Path):
    path = Path(path)
    if not path.is_file():
        raise FastEagleError(f"no recipe file at {path}")
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise FastEagleError(f"recipe {path} is not valid JSON ({exc.msg}, line {exc.lineno})") from None


def run(recipe: Recipe, stages: tuple[str, ...] = DEFAULT_STAGES, report_to: str | None = None,
        only: set[str] | None = None) -> None:
    """The asked stages in order, each skipping what an earlier run already wrote; with `only`, the tune,
    train and ship stages do only those drafters (one retrained while the others' runs stand)."""
    only = set(recipe.drafters) if only is None else only
    if "ship" in stages and not recipe.ship:
        raise FastEagleError("this recipe has no ship section: nothing to ship "
                             "(see assets/recipes/equal-training.json)")
    done = Path(recipe.data_from) / "data" / "done.json" if recipe.data_from else None
    if done and {"tune", "train"} & set(stages) and not done.exists():
        raise FastEagleError(f"data_from {recipe.data_from} has no finished data stage (data/done.json): "
                             "run that recipe's prompts and data stages first")
    out = check_writable(recipe.out, "the recipe's out folder", directory=True)
    target = None
    if {"prompts", "data", "tune", "train", "ship"} & set(stages):
        from fasteagle.target import load_target

        target = load_target(recipe.train.get("target"), device=recipe.train.get("device"),
                             dtype=recipe.train.get("dtype"))
    if not recipe.data_from:  # else another recipe's prompts and data stages made the data
        if "prompts" in stages:
            build_prompts(recipe, target, out / "prompts.pt")
        if "data" in stages:
            distill(recipe, target, out)
    if "tune" in stages:
        tune(recipe, target, out, only)
    if "train" in stages:  # budget by budget, so that each pair is complete (and can be measured) early
        for steps in sorted({b for name in recipe.drafters for b in recipe.budgets_of(name)}):
            for name in recipe.drafters:
                if name in only and steps in recipe.budgets_of(name):
                    train_to(recipe, target, out, name, steps)
    if "eval" in stages:
        evaluate(recipe, out)
    if "compare" in stages and compare.spec(recipe):
        compare.evaluate(recipe, out)
        compare.report(recipe, out, _command())
    if "report" in stages:
        report(recipe, out, report_to)
    if "ship" in stages:
        ship(recipe, target, out, only)


def build_prompts(recipe: Recipe, target, path: Path) -> None:
    """The prompt-only token dataset the target will answer: the first n prompts of each source."""
    from fasteagle.train import data as data_mod
    from fasteagle.train import tasks

    if path.exists():
        return
    prompts = tasks.prompt_dataset(target.tokenizer, recipe.prompts, recipe.max_prompt_tokens)
    print(f"prompts: {len(prompts['prompt_ids'])} ({', '.join(f'{s} {n}' for s, n in recipe.prompts.items())})")
    data_mod.save_token_dataset(prompts, path)


def config(recipe: Recipe, name: str | None, root: Path, **more):
    """The TrainConfig of one run: the data stage (`name` None) or drafter `name` on the shared shards (in
    `root`, or in `data_from`'s folder)."""
    from fasteagle.train.config import TrainConfig

    root = data_root(recipe, root)
    shared = {"data": str(root / "prompts.pt"), "features": "cache", "feature_dir": str(root / "data" / "features"),
              "distill": True, "eval_initial": False, "schedule": "constant",
              "extra_features": [str(root / "written" / "features")] if recipe.written else []}
    settings = recipe.train if name is None else recipe.settings(name)
    return TrainConfig(**(shared | settings | more)).check()


def distill(recipe: Recipe, target, out: Path) -> None:
    """Self-distillation into the shared feature shards, then the conversations as written; each once
    (its done.json), so that a time cap on the generation holds for the whole run."""
    from fasteagle.train.trainer import train

    if not (out / "data" / "done.json").exists():
        train(config(recipe, None, out, out=str(out / "data"), distill_only=True, extra_features=[]),
              target=target, command=_command())
        write_text(out / "data" / "done.json", json.dumps(shard_summary(out / "data" / "features")))
    if recipe.written and not (out / "written" / "done.json").exists():
        train(config(recipe, None, out, out=str(out / "written"), distill_only=True, distill=False, data=None,
                     limit=recipe.written, feature_dir=str(out / "written" / "features"), extra_features=[]),
              target=target, command=_command())
        write_text(out / "written" / "done.json", json.dumps(shard_summary(out / "written" / "features")))


def shard_summary(folder: Path) -> dict:
    """The shards, sequences and reply tokens in a folder of feature shards."""
    import torch

    summary = {"shards": 0, "sequences": 0, "reply_tokens": 0}
    for path in sorted(folder.glob("shard-*.pt")):
        mask = torch.load(path, weights_only=True, mmap=True)["loss_mask"]  # the features stay on disk
        summary = {"shards": summary["shards"] + 1, "sequences": summary["sequences"] + mask.shape[0],
                   "reply_tokens": summary["reply_tokens"] + int(mask.sum())}
    return summary


def tune(recipe: Recipe, target, out: Path, only: set[str]) -> None:
    """For each drafter of the pair without its own lr: `tune.steps` steps at each of `tune.lr`; the lr
    with the lowest mean loss over the last quarter of logged steps is written to OUT/tune.json."""
    from fasteagle.train.trainer import train

    lrs, steps = recipe.tune.get("lr", []), recipe.tune.get("steps", 0)
    if not lrs or not steps:
        return
    chosen = tuned(out)
    for name in recipe.pair:
        if "lr" in recipe.drafters[name] or name in chosen or name not in only:
            continue
        losses = {}
        for lr in lrs:
            run_dir = out / "tune" / f"{name}-lr{lr:g}"
            if not (run_dir / "history.json").exists():
                train(config(recipe, name, out, out=str(run_dir), lr=lr, max_steps=steps, reuse_features=True),
                      target=target, command=_command())
            history = json.loads((run_dir / "history.json").read_text())
            late = history[len(history) * 3 // 4:] or history
            losses[f"{lr:g}"] = round(sum(h["loss"] for h in late) / max(1, len(late)), 4)
        best = min(losses, key=losses.get)
        chosen[name] = {"lr": float(best), "late_loss_by_lr": losses, "steps": steps}
        print(f"tune {name}: lr {best} (late loss by lr: {losses})")
        write_text(out / "tune.json", json.dumps(chosen, indent=2))


def tuned(out: Path) -> dict:
    path = out / "tune.json"
    return json.loads(path.read_text()) if path.exists() else {}


def tuned_lr(recipe: Recipe, out: Path, name: str) -> float | None:
    """The lr tune chose for drafter `name`, or for the pair's drafter of its kind; None: its own or
    the shared lr stands."""
    if "lr" in recipe.drafters[name]:
        return None
    kind = recipe.settings(name).get("drafter", "fasteagle")
    same = [p for p in recipe.pair if recipe.settings(p).get("drafter", "fasteagle") == kind]
    chosen = tuned(out)
    return next((chosen[n]["lr"] for n in [name, *same] if n in chosen), None)


def train_to(recipe: Recipe, target, out: Path, name: str, steps: int) -> Path:
    """Drafter `name` trained to `steps` optimizer steps (on from its last checkpoint), its weights and
    config copied to OUT/<name>/at-<steps> once there."""
    from fasteagle.train.trainer import train

    snap = snapshot(out, name, steps)
    if (snap / "config.json").exists():
        return snap
    lr = tuned_lr(recipe, out, name)
    more = {"lr": lr} if lr is not None else {}
    run_dir = out / name / "run"
    train(config(recipe, name, out, out=str(run_dir), max_steps=steps, reuse_features=True, **more),
          target=target, command=_command())
    part = snap.with_name(snap.name + ".part")
    shutil.rmtree(part, ignore_errors=True)
    part.mkdir(parents=True)
    for f in SNAPSHOT_FILES:
        if (run_dir / f).exists():
            shutil.copy2(run_dir / f, part / f)
    part.rename(snap)
    return snap


def bench_runs(recipe: Recipe, out: Path) -> list[BenchRun]:
    """Every measurement: per budget the pair at its auto trees (vanilla beside it) and at the paper's
    tree; per budget of every other drafter, it beside vanilla."""
    e = recipe.eval
    common = ["--prompts", ",".join(e.get("prompts", ["assets/prompts/sharegpt_holdout.jsonl"])),
              "--limit", str(e.get("limit", 8)), "--max-new-tokens", str(e.get("max_new_tokens", 64))]
    common += [a for key in ("target", "device") if recipe.train.get(key) for a in (f"--{key}", recipe.train[key])]
    cascade, eagle3 = recipe.pair
    runs = []
    for steps in recipe.budgets:
        pair = ["--drafter", str(snapshot(out, cascade, steps)), "--eagle3-drafter", str(snapshot(out, eagle3, steps)),
                "--methods", "vanilla,fasteagle,eagle3"]
        runs.append(BenchRun(out / "eval" / f"pair-at-{steps}.json", common + pair + ["--tree", "auto"],
                             recipe.pair, steps, "auto"))
        runs.append(BenchRun(out / "eval" / f"paper-at-{steps}.json",
                             common + pair + ["--tree-budget", str(e.get("paper_budget", 60))],
                             recipe.pair, steps, "paper"))
    for name in recipe.drafters:
        if name in recipe.pair:
            continue
        for steps in recipe.budgets_of(name):
            runs.append(BenchRun(out / "eval" / f"{name}-at-{steps}.json",
                                 common + ["--drafter", str(snapshot(out, name, steps)),
                                           "--methods", "vanilla,fasteagle", "--tree", "auto"], [name], steps, "auto"))
    return runs


def evaluate(recipe: Recipe, out: Path) -> None:
    """Every bench run whose drafters are saved and whose result is not written yet, one process each."""
    compare.run_benches(bench_runs(recipe, out), out, "eval")


def curves(recipe: Recipe, out: Path) -> dict:
    """The measured points: per drafter and budget, what it was trained on and what bench measured."""
    points: dict[str, list[dict]] = {name: [] for name in recipe.drafters}
    for r in bench_runs(recipe, out):
        doc = result_of(r)
        if doc is None:
            continue
        for name, method in zip(r.names, ("fasteagle", "eagle3")):
            m = doc["methods"][method]
            point = _point(points[name], r.steps, snapshot(out, name, r.steps))
            point[f"{r.tree}_tree"] = {
                "tau": m.get("tau"), "tokens_per_s": m.get("tokens_per_s"),
                "speedup_vs_vanilla": m.get("speedup_vs_vanilla"), "draft_ms": m.get("draft_ms"),
                "depth_acceptance": m.get("depth_acceptance"),
                "tree_budget": _budget(doc["settings"].get("tree_budget"), method),
                "identical": m.get("identical_to_vanilla"), "prompts": m.get("prompts"),
                "result": str(r.result), "command": doc.get("command")}
    return {name: sorted(p, key=lambda x: x["steps"]) for name, p in points.items()}


def head_to_head(points: dict[str, list[dict]], pair: list[str]) -> list[dict]:
    """Per budget both drafters of the pair, each at its best tree (the higher speed-up over the vanilla
    of its own run, auto or paper tree), and the cascade's speed-up and tau over the other's."""
    rows = []
    other = {p["steps"]: p for p in points.get(pair[1], [])}
    for a in points.get(pair[0], []):
        best = [_best_tree(a), _best_tree(other.get(a["steps"], {}))]
        if None in best:
            continue
        (_, ma), (_, mb) = best
        rows.append({"steps": a["steps"], "tokens_trained": a.get("tokens_trained")}
                    | {name: {"tree": tree, "tree_budget": m["tree_budget"], "speedup": m["speedup_vs_vanilla"],
                              "tau": m["tau"]} for name, (tree, m) in zip(pair, best)}
                    | {"speed_ratio": ma["speedup_vs_vanilla"] / mb["speedup_vs_vanilla"],
                       "tau_ratio": ma["tau"] / mb["tau"]})
    return rows


def _best_tree(point: dict) -> tuple[str, dict] | None:
    """The tree ("auto" or "paper") at which a point decoded fastest against its run's vanilla, and its
    measurement."""
    measured = [(t, point[f"{t}_tree"]) for t in ("auto", "paper")
                if (point.get(f"{t}_tree") or {}).get("speedup_vs_vanilla")]
    return max(measured, key=lambda tm: tm[1]["speedup_vs_vanilla"]) if measured else None


def _point(points: list[dict], steps: int, snap: Path) -> dict:
    """The point of `points` at `steps`, made from the snapshot's training record the first time."""
    for p in points:
        if p["steps"] == steps:
            return p
    info = json.loads((snap / "config.json").read_text()).get("training", {})
    points.append({"steps": steps, "tokens_trained": info.get("tokens_trained"),
                   "train_minutes": info.get("train_minutes"), "device": info.get("device"),
                   "lr": info.get("lr"), "kind": info.get("drafter")})
    return points[-1]


def _budget(budget, method: str):
    return budget.get(method) if isinstance(budget, dict) else budget


def report(recipe: Recipe, out: Path, dest: str | None) -> Path:
    """The curves as one result document (with the recipe and the command), its table and charts."""
    from fasteagle.bench.plots import draw

    points = curves(recipe, out)
    measured = next((doc for doc in map(result_of, bench_runs(recipe, out)) if doc is not None), None)
    if measured is None:
        raise FastEagleError(f"nothing measured yet in {out / 'eval'}; run the eval stage first")
    device = measured.get("device")
    data = shard_data(data_root(recipe, out))
    doc = {"equal_training": points, "pair": recipe.pair, "head_to_head": head_to_head(points, recipe.pair),
           "recipe": dataclasses.asdict(recipe), "data": data,
           "tune": tuned(out), "device": device, "command": _command()}
    path = Path(dest or out / "equal-training.json")
    write_text(path, json.dumps(doc, indent=2))
    print(draw(doc, path))
    print(f"wrote {path} (+ .md table, .html charts)")
    return path


def ship(recipe: Recipe, target, out: Path, only: set[str]) -> None:
    """The drafters of `recipe.ship` at its budget (those in `only`), each into its folder with a holdout
    evaluation and a training log of one stage (the form of every shipped drafter, docs/training.md)."""
    from fasteagle.methods import load_drafter
    from fasteagle.train.holdout import evaluate

    steps, n = recipe.ship["steps"], recipe.ship.get("holdout", 60)
    to = {name: folder for name, folder in recipe.ship["to"].items() if name in only}
    if not to:
        raise FastEagleError("--drafters names none of the drafters this recipe ships "
                             f"({', '.join(recipe.ship['to'])})")
    for name, folder in to.items():  # before any work: every snapshot there, every folder writable
        if not (snapshot(out, name, steps) / "config.json").exists():
            raise FastEagleError(f"{name} is not trained to {steps} steps yet ({snapshot(out, name, steps)}); "
                                 "run the train stage first")
        check_writable(folder, f"the folder {name} ships to", directory=True)
    shared = config(recipe, None, out, out=str(out))  # the settings every drafter shares, defaults filled in
    holdout = holdout_replies(shared, target, out, n)
    data = shard_data(data_root(recipe, out))
    for name, folder in to.items():
        snap = snapshot(out, name, steps)
        drafter = load_drafter(snap).attach(target.model)
        ev = {"holdout": evaluate(drafter, target.model, holdout, n, shared.max_len, drafter.tree_k)}
        lr = tuned_lr(recipe, out, name)
        settings = recipe.settings(name) | ({"lr": lr} if lr is not None else {})
        write_stage(Path(folder), snap, settings, ev, {"data": data, "recipe": dataclasses.asdict(recipe),
                                                       "tune": tuned(out).get(name)}, first=True)
        print(f"shipped {name} at {steps} steps to {folder}: holdout tau {ev['holdout']['tau_backbone']}")


def write_stage(dest: Path, snap: Path, settings: dict, ev: dict, about: dict, first: bool = False) -> int:
    """The drafter trained in `snap` into the shipped folder `dest` as the next stage of its training log
    (`first`: the only one): weights, config, its training settings (configs/train.json), eval.json, and
    the log entry with `about` (what data and recipe made it). Returns the stage's number."""
    import time

    dest.mkdir(parents=True, exist_ok=True)
    log = [] if first or not (dest / "training_log.json").exists() else json.loads((dest / "training_log.json")
                                                                                   .read_text())
    for f in ("model.safetensors", "config.json"):
        shutil.copy2(snap / f, dest / f)
    shutil.rmtree(dest / "configs", ignore_errors=True)
    (dest / "configs").mkdir()
    write_text(dest / "configs" / "train.json", json.dumps(settings, indent=2))
    training = json.loads((snap / "config.json").read_text())["training"]
    stage = {"stage": len(log) + 1, "shipped": True, "date": time.strftime("%Y-%m-%d"),
             "hardware": f"{training.get('device')}, "
                         + ("bf16 matmuls" if training.get("mixed_precision") == "bf16" else "fp32"),
             **about, "configs": {"train.json": settings}, "training": training, "eval": ev,
             "history": json.loads((snap / "history.json").read_text()) if (snap / "history.json").exists() else []}
    write_text(dest / "eval.json", json.dumps(ev, indent=2))
    write_text(dest / "training_log.json", json.dumps([*log, stage], indent=1))
    return stage["stage"]


def holdout_replies(cfg, target, out: Path, n: int) -> dict:
    """The target's greedy replies to the first `n` ShareGPT holdout prompts, with the recipe's shared
    settings `cfg` (OUT/holdout_distilled.pt, once)."""
    from fasteagle.train import data as data_mod
    from fasteagle.train.trainer import greedy_replies

    return greedy_replies(target.model, target.tokenizer,
                          lambda: data_mod.build_token_dataset(target.tokenizer, "holdout", cfg.max_len,
                                                               limit=n)["prompt_ids"][:n],
                          cfg, out / "holdout_distilled.pt")


def data_root(recipe: Recipe, out: Path) -> Path:
    """The folder holding the prompts, replies and shards the drafters train on."""
    return Path(recipe.data_from) if recipe.data_from else out


def shard_data(out: Path) -> dict:
    """What the shared shards hold (the data stage's done.json summaries): the target's replies, and the
    conversations as written."""
    return {part: json.loads((out / part / "done.json").read_text()) for part in ("data", "written")
            if (out / part / "done.json").exists()}


def ship_steps(recipe: step_recipes.StepRecipe, only: list[str] | None = None, holdout_n: int = 60) -> None:
    """`--stages ship`: each drafter a step of `recipe.ship` trained (the step's --out; those in `only`) added
    to its shipped folder as the next stage of its training log, evaluated on the first `holdout_n` ShareGPT
    holdout prompts' greedy replies (made once, in the recipe's out folder)."""
    from fasteagle.methods import load_drafter
    from fasteagle.target import load_target
    from fasteagle.train.config import TrainConfig
    from fasteagle.train.holdout import evaluate

    by_name = {s.name: s for s in recipe.steps}
    to = {n: folder for n, folder in recipe.ship.items() if only is None or n in only}
    missing = [n for n in to if n not in by_name or not (Path(recipe.out) / "done" / f"{n}.json").exists()]
    if missing:
        raise FastEagleError(f"step {missing[0]} is not done: run the recipe's steps before --stages ship")
    target, out = load_target(None, "cpu", "fp32"), Path(recipe.out)
    for name, folder in to.items():
        ns = step_recipes.parse(recipe, by_name[name])
        settings = {k: v for k, v in step_recipes.train_settings(recipe, by_name[name], ns).items() if k != "out"}
        cfg = TrainConfig(out=ns.out, **settings)  # where the run was is this machine's, not the drafter's
        holdout = holdout_replies(cfg, target, out, holdout_n)
        drafter = load_drafter(ns.out).attach(target.model)
        ev = {"holdout": evaluate(drafter, target.model, holdout, holdout_n, cfg.max_len, drafter.tree_k)}
        about = {"data": {"features": shard_summary(Path(cfg.feature_dir or Path(ns.out) / "features"))},
                 "recipe": {"steps": recipe.typed(by_name[name]), "about": recipe.about}}
        stage = write_stage(Path(folder), Path(ns.out), settings, ev, about)
        print(f"shipped step {name} to {folder} as stage {stage}: holdout tau {ev['holdout']['tau_backbone']}")


def _command() -> str:
    from fasteagle.cli_args import module_command

    return module_command("fasteagle.train.recipe")


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m fasteagle.train.recipe", description=__doc__.splitlines()[0])
    p.add_argument("recipe", help="recipe JSON file (see assets/recipes/)")
    p.add_argument("--stages", default=None,
                   help=f"comma list of: {', '.join(STAGES)} (default: all but ship); for a recipe of steps "
                        "(fasteagle/train/steps.py), of its step names (default: all)")
    p.add_argument("--out", default=None, help="where the runs go (default: the recipe's out, or runs/<its name>)")
    p.add_argument("--report", default=None, metavar="FILE", help="the report's result file (default: in --out)")
    p.add_argument("--drafters", default=None, metavar="NAMES",
                   help="comma list of the recipe's drafters to tune, train and ship (default: all); the others' "
                        "runs stand, e.g. one drafter retrained with a new switch; a recipe of steps: those of "
                        "its ship section --stages ship ships")
    p.add_argument("--dry-run", action="store_true", help="a recipe of steps: print its commands, run nothing")
    args = p.parse_args(argv)
    names = _comma_list(args.stages)
    only = None if args.drafters is None else _comma_list(args.drafters)

    def go() -> int:
        recipe = load(args.recipe)
        recipe.out = args.out or recipe.out
        if isinstance(recipe, step_recipes.StepRecipe):
            shipping = names == ["ship"] and recipe.ship and "ship" not in {s.name for s in recipe.steps}
            if only is not None and not shipping:
                raise FastEagleError("--drafters narrows what a recipe of steps ships (--stages ship); to run some "
                                     "of its steps, name them in --stages")
            if shipping:
                if only is not None:
                    _check_names("--drafters", only, recipe.ship, f"what the recipe ships ({', '.join(recipe.ship)})")
                ship_steps(recipe, only)
            else:
                step_recipes.run(recipe, names, args.dry_run)
            return 0
        stages = tuple(names) if args.stages is not None else DEFAULT_STAGES
        _check_names("--stages", stages, STAGES, ", ".join(STAGES))
        if args.dry_run:
            raise FastEagleError("--dry-run is for a recipe of steps (one with \"steps\")")
        if only is not None:
            _check_names("--drafters", only, recipe.drafters, f"the recipe's drafters ({', '.join(recipe.drafters)})")
        run(recipe, stages, args.report, None if only is None else set(only))
        return 0

    return run_command(go)


def _comma_list(value: str | None) -> list[str]:
    return [s.strip() for s in (value or "").split(",") if s.strip()]


def _check_names(flag: str, names, known, what: str) -> None:
    """Refuse in one line a list (--stages, --drafters) that names something not in `known`, or nothing."""
    bad = [n for n in names if n not in known]
    if bad or not names:
        raise FastEagleError(f"{flag} takes {what}, not {bad[0] if bad else 'nothing'!r}")


if __name__ == "__main__":
    raise SystemExit(main())
