"""The recipe's compare stage: every drafter of a recipe, at one budget, decoded side by side in the same
bench runs (interleaved and repeated, each under its recipe name), on each prompt set and each tree that
the recipe's `eval.side_by_side` names; then one table (tau, speed-up over vanilla with the runs' spread,
acceptance by depth and below backbone and side nodes, draft ms) and one chart of acceptance against depth.

    "side_by_side": {"steps": 600, "repeats": 3, "max_new_tokens": 64,
                     "prompts": {"chat-code": {"files": [...], "limit": 6}, "tasks": {"files": [...], "limit": 2}},
                     "trees": {"chain": ["--tree-k", "1", "--tree-budget", "7"], "auto": ["--tree", "auto"],
                               "paper": ["--tree-budget", "60"]},
                     "result": "bench/results/....json"}

A chain of N drafts the way vLLM does (one token per depth); "auto" is each drafter's own best tree on
this machine; "paper" the paper's ~60-node tree. The pair's cascade runs as bench's `fasteagle`, its
EAGLE-3-style drafter (if the pair's second is one) as `eagle3`, every other drafter under its own name
(`bench --drafters`).
"""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from fasteagle.errors import FastEagleError
from fasteagle.files import write_text

SPEC_KEYS = {"steps", "repeats", "max_new_tokens", "prompts", "trees", "result"}


def snapshot(out: Path, name: str, steps: int) -> Path:
    """Where drafter `name` is saved after `steps` optimizer steps."""
    return out / name / f"at-{steps}"


@dataclass
class BenchRun:
    """One bench run of the eval or compare stage: the drafters it runs (by recipe name, cascade first), at
    which budget, on which tree ("auto" or "paper"; compare: "<prompt set>/<tree>"), its bench arguments and
    its result file."""

    result: Path
    args: list[str]
    names: list[str]
    steps: int
    tree: str
    methods: tuple[str, ...] = ()  # bench's method names; a result lacking one is measured again


def saved(recipe, out: Path, steps: int) -> list[str]:
    """The recipe's drafters saved at `steps`, in its order: what a compare stage can measure now."""
    return [n for n in recipe.drafters if (snapshot(out, n, steps) / "config.json").exists()]


def result_of(run: BenchRun) -> dict | None:
    """A bench run's result, if it is on disk whole: a bench stopped early (the recipe interrupted) leaves
    the prompts it measured, marked "partial", and the rerun measures them all again; one made before a
    drafter it now runs was saved is measured again with it."""
    try:
        doc = json.loads(run.result.read_text())
    except (OSError, ValueError):
        return None
    return None if "partial" in doc or not set(run.methods) <= set(doc.get("methods", {})) else doc


def spec(recipe) -> dict | None:
    """The recipe's side-by-side settings, checked (None: the recipe has none)."""
    s = recipe.eval.get("side_by_side")
    if s is None:
        return None
    where = "recipe eval.side_by_side"
    if not isinstance(s, dict):
        raise FastEagleError(f"{where} must be an object of settings ({', '.join(sorted(SPEC_KEYS))})")
    unknown = sorted(set(s) - SPEC_KEYS)
    if unknown:
        raise FastEagleError(f"{where}: unknown setting {unknown[0]!r} (known: {', '.join(sorted(SPEC_KEYS))})")
    if not all(s.get("steps") in recipe.budgets_of(name) for name in recipe.drafters):
        raise FastEagleError(f"{where}: steps must be one of the budgets every drafter is saved at, not "
                             f"{s.get('steps')!r}")
    for key in ("prompts", "trees"):
        if not isinstance(s.get(key), dict) or not s[key]:
            raise FastEagleError(f"{where}: {key} must name at least one (label -> settings)")
    for label in [*s["prompts"], *s["trees"]]:
        if not re.fullmatch(r"[a-z0-9-]+", label):
            raise FastEagleError(f"{where}: label {label!r} must be lower-case letters, digits and dashes")
    for label, p in s["prompts"].items():
        if not isinstance(p, dict) or not p.get("files"):
            raise FastEagleError(f"{where}: prompts {label!r} needs files (and may give a limit)")
    return s


def labels(recipe) -> dict[str, str]:
    """bench's method name -> recipe drafter name, in the table's order: the pair's EAGLE-3-style drafter
    (when the pair's second is one), its cascade, then every other drafter under its own name."""
    cascade, second = recipe.pair
    eagle3 = {"eagle3": second} if recipe.settings(second).get("drafter") == "eagle3" else {}
    paired = {cascade, *eagle3.values()}
    return eagle3 | {"fasteagle": cascade} | {n: n for n in recipe.drafters if n not in paired}


def runs(recipe, out: Path) -> list:
    """One bench run per prompt set and tree, every drafter saved at the spec's steps in it beside vanilla
    (a recipe cut short compares what it has; none before the pair's cascade is saved)."""
    s = spec(recipe)
    if s is None or recipe.pair[0] not in (have := saved(recipe, out, s["steps"])):
        return []
    steps, names = s["steps"], {m: n for m, n in labels(recipe).items() if n in have}
    snap = {n: str(snapshot(out, n, steps)) for n in have}
    drafters = ["--drafter", snap[names["fasteagle"]]]
    if "eagle3" in names:
        drafters += ["--eagle3-drafter", snap[names["eagle3"]]]
    others = [n for m, n in names.items() if m not in ("eagle3", "fasteagle")]
    if others:
        drafters += ["--drafters", ",".join(f"{n}={snap[n]}" for n in others)]
    methods = ["--methods", ",".join(["vanilla", *names])]
    common = ["--max-new-tokens", str(s.get("max_new_tokens", 64)), "--repeats", str(s.get("repeats", 3))]
    common += [a for key in ("target", "device") if recipe.train.get(key) for a in (f"--{key}", recipe.train[key])]
    found = []
    for t_label, tree in s["trees"].items():  # tree by tree: a recipe cut short has its first tree on every set
        for p_label, p in s["prompts"].items():
            chosen = ["--prompts", ",".join(p["files"])] + (["--limit", str(p["limit"])] if p.get("limit") else [])
            found.append(BenchRun(out / "compare" / f"{p_label}-{t_label}-at-{steps}.json",
                                  chosen + [*map(str, tree)] + drafters + methods + common,
                                  have, steps, f"{p_label}/{t_label}", ("vanilla", *names)))
    return found


def run_benches(found: list[BenchRun], out: Path, stage: str) -> None:
    """Every run of `found` whose drafters are saved and whose result is not whole on disk, one bench process
    each (the eval and compare stages)."""
    for r in found:
        if result_of(r) is not None or not all((snapshot(out, n, r.steps) / "config.json").exists() for n in r.names):
            continue
        cmd = [sys.executable, "-m", "fasteagle", "bench", *r.args, "--out", str(r.result)]
        print(f"{stage}:", " ".join(cmd[1:]), flush=True)
        subprocess.run(cmd, check=True)


def evaluate(recipe, out: Path) -> None:
    """The side-by-side runs not yet measured (`run_benches`), of the drafters saved so far."""
    s = spec(recipe)
    missing = [n for n in recipe.drafters if n not in saved(recipe, out, s["steps"])]
    if missing:
        print(f"compare: not saved at {s['steps']} steps, left out: {', '.join(missing)}", flush=True)
    run_benches(runs(recipe, out), out, "compare")


def collect(recipe, out: Path, command: str) -> dict:
    """The side-by-side result document: per prompt set and tree, each drafter's measurement."""
    s, names = spec(recipe), labels(recipe)
    table, device, compared = {}, None, set()
    for r in runs(recipe, out):
        doc = result_of(r)
        if doc is None:
            continue
        compared |= set(r.names)
        device = device or doc.get("device")
        p_label, t_label = r.tree.split("/")
        budgets = doc["settings"].get("tree_budget")
        table.setdefault(p_label, {})[t_label] = {
            "result": str(r.result), "command": doc.get("command"), "prompts": doc["methods"]["vanilla"]["prompts"],
            "methods": {names.get(m, m): _measured(m, doc, budgets) for m in ["vanilla", *names]
                        if m in doc["methods"]}}
    if not table:
        raise FastEagleError(f"nothing compared yet in {out / 'compare'}; run the compare stage first")
    return {"side_by_side": table, "steps": s["steps"], "repeats": s.get("repeats", 3), "device": device,
            "drafters": {n: recipe.settings(n) for n in recipe.drafters if n in compared}, "command": command}


def _measured(method: str, doc: dict, budgets) -> dict:
    """What the table shows of one method in one bench result, and its tau in each kind of prompt."""
    from fasteagle.bench.reports import depth_reached

    m, kinds = doc["methods"][method], doc.get("per_category") or {}
    keep = ("tau", "tokens_per_s", "speedup_vs_vanilla", "spread", "depth_acceptance", "acceptance_below_backbone",
            "acceptance_below_side", "draft_ms", "identical_to_vanilla", "prompts")
    return {k: m.get(k) for k in keep} | {"depth_reached": depth_reached(doc["rows"][method]),
                                          "tree_budget": budgets.get(method) if isinstance(budgets, dict) else budgets,
                                          "tau_by_kind": {k: v[method].get("tau") for k, v in kinds.items()
                                                          if method in v}}


def report(recipe, out: Path, command: str) -> Path | None:
    """The side-by-side document, its table and its chart (OUT/side-by-side.json, or the spec's result)."""
    s = spec(recipe)
    if s is None:
        return None
    return write_side_by_side(collect(recipe, out, command), Path(s.get("result") or out / "side-by-side.json"))


def write_side_by_side(doc: dict, path: Path) -> Path:
    """A side-by-side document at `path`, its Markdown table and its chart beside it; the table printed."""
    from fasteagle.bench.plots import draw

    write_text(path, json.dumps(doc, indent=2))
    print(draw(doc, path))
    print(f"wrote {path} (+ .md table, .html chart)")
    return path


# -- a recipe of steps: its bench steps' results joined ------------------------------------------


def parser():
    from fasteagle.errors import Parser

    p = Parser(
        prog="python -m fasteagle.train.compare",
        description="A recipe of steps' compare step: its bench results (our engine's, by prompt set and tree; "
                    "vLLM's batch sweeps, by chain) joined into one result file, one table and one chart, beside "
                    "each drafter's parameters and training minutes")
    p.add_argument("--ours", required=True,
                   help="comma list of PROMPTS/TREE=RESULT: `bench` results, every drafter a method of its label")
    p.add_argument("--vllm", default="", help="comma list of LABEL=RESULT: `bench --engine vllm --repeats` results")
    p.add_argument("--drafters", required=True, help="comma list of LABEL=FOLDER: the drafters compared")
    p.add_argument("--out", required=True, help="the joined result JSON (its .md table and .html chart beside it)")
    p.add_argument("--snapshot", default=None, metavar="WHY",
                   help="the result measured a drafter as it was, before it changed (`bench --rerun` keeps it)")
    return p


def drafter_facts(folder: str | Path) -> dict:
    """A trained drafter's kind, trained parameters (its saved tensors; the target's shared embedding and head
    not among them) and what its training took (config.json's `training`)."""
    from safetensors import safe_open

    folder = Path(folder)
    try:
        cfg = json.loads((folder / "config.json").read_text())
    except (OSError, ValueError):
        raise FastEagleError(f"no trained drafter at {folder} (its config.json is missing or unreadable)") from None
    params = 0
    for file in sorted(folder.glob("model*.safetensors")):
        with safe_open(str(file), "pt") as f:
            params += sum(math.prod(f.get_slice(k).get_shape()) for k in f.keys() if k != "vocab_ids")
    t = cfg.get("training") or {}
    continued = t.get("steps_all") not in (None, t.get("steps"))  # its last run continued an earlier one
    return {"kind": cfg.get("kind", "fasteagle"), "folder": str(folder), "params": params,
            "steps": t.get("steps_all", t.get("steps")),
            "train_minutes": t.get("train_minutes_all", t.get("train_minutes")),
            # the runs before the last recorded their steps and minutes in it, not their tokens or CPU time
            **{k: None if continued else t.get(k) for k in ("tokens_trained", "train_cpu_minutes")}}


def join(ours: dict[str, str], vllm: dict[str, str], drafters: dict[str, str], command: str) -> dict:
    """The side-by-side document of a recipe of steps (the shape `report` writes, plus `vllm` and each drafter's
    facts): per prompt set and tree, each drafter's measurement in our engine; per chain and batch size, in
    vLLM."""
    from fasteagle.files import read_result

    facts = {label: drafter_facts(folder) for label, folder in drafters.items()}
    table, device, repeats = {}, None, set()
    for key, path in ours.items():
        p_label, slash, t_label = key.partition("/")
        if not slash:
            raise FastEagleError(f"--ours: {key!r} must be PROMPTS/TREE")
        doc = read_result(path)
        device = device or doc.get("device")
        repeats |= {len(r.get("wall_s_runs") or [None]) for rows in doc["rows"].values() for r in rows}  # --repeats
        budgets = doc["settings"].get("tree_budget")
        table.setdefault(p_label, {})[t_label] = {
            "result": str(path), "command": doc.get("command"), "prompts": doc["methods"]["vanilla"]["prompts"],
            "methods": {m: _measured(m, doc, budgets) for m in ["vanilla", *facts] if m in doc["methods"]}}
    keep = ("tokens_per_s", "spread", "speedup_vs_vanilla", "tau", "per_position", "identical_to_vanilla", "prompts")
    steps = {f["steps"] for f in facts.values()}  # the compared drafters' (vLLM's runs may add a shipped one)
    chains = {}
    for label, path in vllm.items():
        doc = read_result(path)
        by_method = _vllm_labels(doc.get("command") or "", facts)
        chains[label] = {"k": doc["k"], "result": str(path), "command": doc.get("command"),
                         "batches": {b: {by_method[m]: {x: s.get(x) for x in keep} for m, s in run["methods"].items()
                                         if m in by_method} for b, run in doc["batches"].items()}}
    return {"side_by_side": table, "vllm": chains, "drafter_facts": facts,
            "steps": steps.pop() if len(steps) == 1 else None, "repeats": repeats.pop() if len(repeats) == 1 else None,
            "device": device, "command": command}


def _vllm_labels(command: str, facts: dict) -> dict[str, str]:
    """vLLM's method -> the label it is shown under: the compared drafter whose folder the run's command decoded
    with it (`rerun.method_drafters`), or, for a drafter not compared (a shipped one beside them), the method's
    own name, its facts added to `facts`."""
    from fasteagle.bench.rerun import method_drafters

    folders = {Path(f["folder"]).resolve(): label for label, f in facts.items()}
    out = {"vanilla": "vanilla"}
    for method, folder in method_drafters(command, Path(".")).items():
        out[method] = folders.get(folder, method)
        if out[method] == method and method not in facts:
            facts[method] = drafter_facts(folder)
    return out


def main(argv: list[str] | None = None) -> int:
    from fasteagle.cli_args import result_command
    from fasteagle.errors import run_command

    args = parser().parse_args(argv)
    command = result_command("fasteagle.train.compare", argv)

    def go() -> int:
        from fasteagle.cli_args import label_pairs

        pairs = {flag: dict(label_pairs(getattr(args, flag), f"--{flag}", value))
                 for flag, value in (("ours", "RESULT"), ("vllm", "RESULT"), ("drafters", "FOLDER"))}
        doc = join(pairs["ours"], pairs["vllm"], pairs["drafters"], command)
        write_side_by_side(doc | ({"snapshot": args.snapshot} if args.snapshot else {}), Path(args.out))
        return 0

    return run_command(go)


if __name__ == "__main__":
    raise SystemExit(main())
