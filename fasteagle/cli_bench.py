"""`python -m fasteagle bench`: a method comparison on prompt sets, or one of its single measurements
(--verify-cost, --draft-step, --profile-step, --budget-curve, --engine vllm), and the result files' upkeep
(--update-docs, --redraw, --rerun). Every list, file and output is checked before the model loads; a
result is printed as a table and kept as JSON with its .md table (and .html charts) beside it."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from fasteagle import cli_vllm
from fasteagle.cli_args import (
    _add_method_args,
    _add_target_args,
    _names,
    command_line,
    int_list,
    make_drafter,
    method_settings,
)
from fasteagle.errors import FastEagleError
from fasteagle.methods import ALIASES, METHODS, PAPER_BUDGET

STARTED = time.monotonic()  # a result's wall_s counts from here: loads included, as a rerun pays them


def _report(doc: dict, out: str | None) -> int:
    """Print a measurement as a table and keep it as JSON, with its .md table and .html charts drawn beside
    it by `bench.draw`, as `--redraw` draws them; every file is replaced whole or not at all. Where plotly
    is missing (a bare GPU machine that only measures) the result and its table are kept and `--redraw`
    draws the charts later."""
    from fasteagle import bench, files

    doc["command"] = command_line()
    doc.setdefault("wall_s", round(time.monotonic() - STARTED, 1))
    if not out:
        print(bench.markdown_table(doc))
        return 0
    files.write_text(out, json.dumps(doc, indent=2))
    try:
        table, drawn = bench.draw(doc, out), ", any .html charts"
    except ModuleNotFoundError as exc:
        table, drawn = bench.markdown_table(doc), ""
        files.write_text(Path(out).with_suffix(".md"), table)
        print(f"no .html charts ({exc.name} is not installed): `python -m fasteagle bench --redraw {out}` draws "
              "them where it is", file=sys.stderr)
    print(table)
    print(f"wrote {out} (+ .md table{drawn})")
    return 0


def _check_out(out: str) -> None:
    """--out and the .md and .html written beside it must be writable before anything is timed: a write
    that fails after the measurement would lose it."""
    from fasteagle.files import check_writable

    path = Path(out)
    if path.suffix in (".md", ".html"):
        raise FastEagleError(f"--out {out} would be overwritten by the {path.suffix} written beside the result; "
                             "give a .json path")
    check_writable(path, "--out")
    for suffix in (".md", ".html"):
        check_writable(path.with_suffix(suffix), f"the {suffix} beside --out,")


def cmd_bench(args) -> int:
    """`bench`: the first mode flag given, in BENCH_MODES order, picks what it does; comparing methods on
    prompt sets is the default. Every list, file and output is checked before the model loads."""
    if args.repeats is not None and args.repeats < 1:
        raise FastEagleError("--repeats must be at least 1")
    mode = next((m for m in BENCH_MODES if getattr(args, m, None)), "compare")
    return BENCH_MODES[mode](args)


def _bench_update_docs(args) -> int:
    from fasteagle import bench

    changed = bench.update_docs(_names(args.update_docs))
    for path in changed:
        print(f"updated {path.as_posix()}")
    if not changed:
        print("every result block is up to date")
    return 0


def _bench_rerun(args) -> int:
    from fasteagle.bench import rerun

    current: list[Path] = []
    found = rerun.stale(_names(args.rerun), current=current)
    print(rerun.describe(found, len(current)))
    if not args.dry_run and found:
        for path in rerun.rerun(found, list(DOCS)):
            print(f"updated {path.as_posix()}")
    return 0


def _bench_redraw(args) -> int:
    from fasteagle import bench

    for f in _names(args.redraw):
        bench.redraw(f)
        print(f"redrew {Path(f).with_suffix('.md')} (+ .html charts where its kind has them)")
    return 0


def _bench_checks(args) -> tuple[list[int] | None, list[int], list[int] | None]:
    """The lists every measurement parses and its --out, checked before the model loads so that none
    fails after the timing: (--verify-cost sizes, --depths, --budget-curve budgets)."""
    from fasteagle import bench

    if args.tree_budget is None:  # measurements keep the paper's size unless told (--tree auto tunes it)
        args.tree_budget = PAPER_BUDGET
    sizes = int_list(args.verify_cost, "--verify-cost") if args.verify_cost else None
    depths = int_list(args.depths, "--depths")
    budgets = int_list(args.budget_curve, "--budget-curve", minimum=2) if args.budget_curve else None
    if args.draft_step and args.draft_step not in bench.SHAPES:
        raise FastEagleError(f"unknown --draft-step shape {args.draft_step!r}; choose one of {', '.join(bench.SHAPES)}")
    if args.out:
        _check_out(args.out)
    return sizes, depths, budgets


def _bench_engines(args) -> int:
    """`--engine vllm`: the flags and prompts checked, the target loaded, then `cli_vllm.bench`."""
    from fasteagle.target import load_target
    from fasteagle.vllm_engine import require_vllm

    require_vllm()
    sizes = int_list(args.batch_sizes or ("32" if args.distill_speed else "1"), "--batch-sizes")
    if args.out:
        _check_out(args.out)
    if args.step_costs:  # vLLM alone, no prompts: our target is not loaded
        return _report(cli_vllm.bench(args, None, method_settings(args), [], [], sizes), args.out)
    if args.distill_speed:  # the target alone writes the replies: no methods to check
        args.methods = "vanilla"
    names, _, prompts = _bench_prompts(args)
    target = load_target(args.target, "cpu", "fp32", pack=args.pack)
    doc = cli_vllm.bench(args, target, method_settings(args), names, [p["text"] for p in prompts], sizes)
    return _report(doc, args.out)


def _bench_draft_step(args) -> int:
    from fasteagle import bench

    _, depths, _ = _bench_checks(args)
    prefixes = int_list(args.prefixes, "--prefixes") if args.prefixes else [128]
    runs = {p: bench.draft_step_cost(args.draft_step, depths, prefix=p, device=args.device, dtype=args.dtype,
                                     pack=args.pack, int8=args.draft_int8) for p in prefixes}
    doc = runs[prefixes[0]]
    if args.prefixes:  # one table over the context lengths
        doc = {k: v for k, v in doc.items() if k not in ("ms", "prefix")} | {
            "by_prefix": {str(p): r["ms"] for p, r in runs.items()}}
    return _report(doc, args.out)


def _bench_verify_cost(args) -> int:
    from fasteagle import bench
    from fasteagle.target import load_target

    sizes, _, _ = _bench_checks(args)
    target = load_target(args.target, args.device, args.dtype, pack=args.pack)
    timed = target
    if args.compare_packing:
        if not target.packed:
            raise FastEagleError("--compare-packing needs a target whose linears can be prepacked (fp32 on CPU)")
        timed = {"prepacked": target, "stock": load_target(args.target, args.device, args.dtype, pack=False)}
    return _report(bench.verify_cost(timed, sizes) | {"device": bench.device_name(target.device),
                                                      "packed_linears": target.packed}, args.out)


def _bench_prompts(args) -> tuple[list[str], list[str], list[dict]]:
    """The methods to measure (vanilla always among them), the prompt files and their prompts."""
    from fasteagle import bench
    from fasteagle.vllm_engine import METHODS as ENGINE_METHODS

    if not args.prompts:
        raise FastEagleError("--prompts is required (a JSON-lines file, or several separated by commas)")
    names = _names(args.methods)
    known = (*bench.HF_METHODS, *METHODS) if getattr(args, "engine", None) != "vllm" else ENGINE_METHODS
    known = (*known, *dict(method_settings(args).named))  # --drafters' labels
    unknown = [m for m in names if m not in known and m not in ALIASES]  # aliases: recorded results cite them
    if unknown:
        raise FastEagleError(f"unknown method {unknown[0]!r}; choose from {', '.join(known)}")
    if "vanilla" not in names:
        names.insert(0, "vanilla")
    prompt_files = _names(args.prompts)
    if not prompt_files:
        raise FastEagleError("--prompts names no file")
    return names, prompt_files, [p for f in prompt_files for p in bench.load_prompts(f, args.limit, args.skip)]


def _bench_setup(args, names: list[str], prompts: list[dict], prompt_files: list[str]) -> tuple:
    """The target, the methods' drafters (name -> drafter, None for vanilla and hf-*) and the run's settings."""
    from fasteagle import bench
    from fasteagle.target import load_target

    target = load_target(args.target, args.device, args.dtype, pack=args.pack)
    methods = {m: None if m in bench.HF_METHODS else make_drafter(m, target, args) for m in names}
    settings = {"prompts": prompt_files, "prompts_desc": f"{len(prompts)} prompts,",
                "max_new_tokens": args.max_new_tokens, "temperature": args.temperature, "top_p": args.top_p,
                "seed": args.seed,
                "tree_k": args.tree_k or {m: d.tree_k for m, d in methods.items() if hasattr(d, "tree_k")},
                "tree_budget": args.tree_budget, "tree_shape": args.tree_shape,
                "full_vocab": method_settings(args).wants_full_vocab(target.device), "dtype": str(target.dtype),
                "packed_linears": target.packed,
                "draft_weights": next((d.packing for d in methods.values() if getattr(d, "packing", None)), None),
                "drafters": _drafter_summaries(methods)}
    return target, methods, settings


def _bench_profile(args) -> int:
    import time

    import torch

    from fasteagle import bench
    from fasteagle.generate import chat_prompt_ids
    from fasteagle.profile import profile_steps
    from fasteagle.verify import SamplingParams

    _bench_checks(args)
    names, prompt_files, prompts = _bench_prompts(args)
    target, methods, settings = _bench_setup(args, names, prompts, prompt_files)
    if any(m in bench.HF_METHODS for m in methods):
        raise FastEagleError("--profile-step times this project's decoding loop: drop the hf-* methods")
    ids = [chat_prompt_ids(target, p["text"]) for p in prompts]
    sampling = SamplingParams(args.temperature, args.top_p)
    doc = {"profile": True, "device": bench.device_name(target.device), "target": target.name,
           "date": time.strftime("%Y-%m-%d"), "torch": torch.__version__, "settings": settings,
           "methods": profile_steps(target, methods, ids, args.max_new_tokens, sampling)}
    return _report(doc, args.out)


def _bench_budget_curve(args) -> int:
    from fasteagle import bench

    _, _, budgets = _bench_checks(args)
    names, prompt_files, prompts = _bench_prompts(args)
    target, methods, settings = _bench_setup(args, names, prompts, prompt_files)
    drafted = [m for m, d in methods.items() if hasattr(d, "tree_budget")]
    if len(drafted) != 1:
        raise FastEagleError("--budget-curve replays one trained drafter: give --methods one of fasteagle, "
                             "eagle3, ... (vanilla aside)")
    d = methods[drafted[0]]
    doc = bench.budget_curve(target, d, prompts, budgets, args.max_new_tokens, args.seed) | {
        "device": bench.device_name(target.device), "target": target.name, "method": drafted[0],
        "drafter": next(iter(settings["drafters"].values()), {}).get("path"), "full_vocab": settings["full_vocab"],
        "prompts_desc": settings["prompts_desc"], "prompts": prompt_files}
    return _report(doc, args.out)


def _bench_diagnose(args) -> int:
    from fasteagle import bench
    from fasteagle.bench import diagnose

    variants = ["full"] + [v for v in _names(args.diagnose) if v != "full"]
    for v in variants:
        diagnose.parse_variant(v)
    if args.out:
        _check_out(args.out)
    names, prompt_files, prompts = _bench_prompts(args)
    drafted = [m for m in names if m != "vanilla"]
    named = dict(method_settings(args).named)
    if not drafted or any(ALIASES.get(m, (m,))[0] != "fasteagle" and m not in named for m in drafted):
        raise FastEagleError("--diagnose replays cascades: give --methods fasteagle (or fasteagle-equal, or "
                             "--drafters labels)")
    target, methods, settings = _bench_setup(args, ["vanilla", *drafted], prompts, prompt_files)
    paths = {m: d.get("path") for m, d in settings["drafters"].items()}
    one = len(drafted) == 1
    doc = diagnose.diagnose(target, methods[drafted[0]] if one else {m: methods[m] for m in drafted}, prompts,
                            args.max_new_tokens, variants) | {
        "device": bench.device_name(target.device), "target": target.name, "threads": _threads(),
        "prompts_desc": settings["prompts_desc"], "prompts": prompt_files, "max_new_tokens": args.max_new_tokens}
    doc |= {"method": drafted[0], "drafter": next(iter(paths.values()), None)} if one else \
        {"drafters": {m: paths.get(m) for m in drafted}}
    return _report(doc, args.out)


def _threads() -> int:
    import torch

    return torch.get_num_threads()


def _reference(args) -> dict | None:
    """--reference: the result whose vanilla replies the comparison's are matched against, read and
    checked before the model loads."""
    from fasteagle import bench

    if not args.reference:
        return None
    ref = bench.read_result(args.reference)
    rows = ref.get("rows")
    vanilla = rows.get("vanilla") if isinstance(rows, dict) else None
    if not isinstance(vanilla, list) or not all(isinstance(r, dict) for r in vanilla) \
            or not any("reply" in r for r in vanilla):
        raise FastEagleError(f"--reference {args.reference} holds no vanilla replies to match (a method comparison "
                             "made by this version records them)")
    return ref


def _bench_compare(args) -> int:
    from fasteagle import bench, files
    from fasteagle.verify import SamplingParams

    _bench_checks(args)
    ref = _reference(args)
    names, prompt_files, prompts = _bench_prompts(args)
    target, methods, settings = _bench_setup(args, names, prompts, prompt_files)
    done = kept = 0  # prompts measured, and those of them whose result is on disk

    def keep_so_far(rows: dict) -> None:  # a run killed by a time limit leaves what it measured
        nonlocal done, kept
        done = len(next(iter(rows.values())))
        if args.out and done < len(prompts):
            partial = {"partial": {"prompts_done": done, "prompts": len(prompts)}}
            files.write_text(args.out, json.dumps(bench.result_document(target, rows, settings) | partial
                                                  | {"command": command_line()}, indent=2))
            kept = done

    replay = _what_if_methods(args, methods, settings)
    try:
        if args.tree == "auto":
            _tune_trees(target, methods, settings, prompt_files, args.limit)
        sampling = SamplingParams(args.temperature, args.top_p)
        rows = bench.compare(target, methods, prompts, args.max_new_tokens, sampling, args.seed,
                             on_prompt=keep_so_far, repeats=args.repeats or 1, replay=replay)
        doc = bench.result_document(target, rows, settings)
        if replay:
            from fasteagle.bench import predict
            from fasteagle.generate import chat_prompt_ids

            budgets = {m: b[m] if isinstance(b := settings["tree_budget"], dict) else b for m in replay}
            doc["what_if"] = predict.record(target, methods, {m: rows[m] for m in replay},
                                            [chat_prompt_ids(target, p["text"]) for p in prompts], budgets, args.seed)
    except KeyboardInterrupt:
        _say_what_was_kept(args.out, kept, done, len(prompts))
        return 130
    if ref is not None:
        doc["reference"] = {"file": args.reference, "dtype": ref.get("settings", {}).get("dtype"),
                            "replies": bench.reply_match(ref, doc)}
    return _report(doc, args.out)


def _what_if_methods(args, methods: dict, settings: dict) -> frozenset:
    """--what-if: the cascade methods whose steps the what-if model keeps; each runs every layer, so its
    steps list the depths a bigger tree would draft (said in `settings`)."""
    if not args.what_if:
        return frozenset()
    from fasteagle.bench.predict import replayable

    names = frozenset(m for m, d in methods.items() if replayable(d))
    if not names:
        raise FastEagleError("--what-if replays a cascade drafting alone: add fasteagle (or another cascade) to "
                             "--methods")
    for m in names:
        methods[m].state.all_layers = True
    settings["what_if"] = {"methods": sorted(names), "all_layers": True}
    return names


def _bench_predict(args) -> int:
    """--predict RESULT: the speed model at --tree-budget (default: the run's, 16, 32, 60) from RESULT's
    what-if record; --costs another device's, --against measured runs beside it."""
    from fasteagle import bench
    from fasteagle.bench import predict

    doc = bench.read_result(args.predict)
    predict.read(doc, args.predict)
    budgets = [args.tree_budget] if args.tree_budget else sorted({*predict.DEFAULT_BUDGETS, *(
        e["run"]["budget"] for e in doc["what_if"].values())})
    costs = predict.costs_from_auto(bench.read_result(args.costs), args.costs) if args.costs else None
    against = [(f, bench.read_result(f)) for f in _names(args.against)] if args.against else []
    if args.out:
        _check_out(args.out)
    doc = {"predict": args.predict, "costs_from": args.costs, "depth": args.tree_depth,
           "methods": predict.table(doc, args.predict, budgets, args.tree_depth, costs, against)}
    return _report(doc, args.out)


def _tune_trees(target, methods: dict, settings: dict, prompt_files: list[str], limit: int | None) -> None:
    """--tree auto: each trained drafter gets the budget that suits it on this device, tuned on prompts
    outside the measured ones; the choices and what they were made from go into `settings`."""
    from fasteagle import bench

    settings["tree_budget"], settings["tree_auto"] = {}, {}
    tune = bench.tuning_prompts(prompt_files, limit)
    settings["tree_auto_prompts"] = [p["id"] for p in tune]
    for m, d in methods.items():
        if hasattr(d, "tree_budget"):  # the trained drafters, alone or joined with lookup
            choice = bench.auto_tree(target, d, tune)
            settings["tree_budget"][m], settings["tree_auto"][m] = choice["budget"], choice


def _say_what_was_kept(out: str | None, kept: int, done: int, total: int) -> None:
    """One line after Ctrl-C: how many prompts' results a stopped comparison kept, and where."""
    if kept:
        print(f"interrupted: kept {kept} of {total} prompts in {out}", file=sys.stderr)
    elif out:
        print(f"interrupted: nothing kept (no prompt had finished); {out} not written", file=sys.stderr)
    else:
        print(f"interrupted: nothing kept (no --out given) after {done} of {total} prompts", file=sys.stderr)


DOCS = ("README.md", "docs/results.md")  # the documents whose result tables `bench --update-docs` draws


# `bench`'s modes, one function each: the first whose flag is given runs (`compare` when none is).
BENCH_MODES = {
    "rerun": _bench_rerun,
    "predict": _bench_predict,
    "update_docs": _bench_update_docs,
    "redraw": _bench_redraw,
    "draft_step": _bench_draft_step,
    "verify_cost": _bench_verify_cost,
    "profile_step": _bench_profile,
    "budget_curve": _bench_budget_curve,
    "diagnose": _bench_diagnose,
    "engine": lambda args: _bench_engines(args) if args.engine == "vllm" else _bench_compare(args),
    "compare": _bench_compare,
}


def _drafter_summaries(methods: dict) -> dict:
    """The trained drafters a run timed, each once (`fasteagle+lookup` reuses fasteagle's weights)."""
    from fasteagle import bench

    out, seen = {}, set()
    for m, d in methods.items():
        if hasattr(d, "info") and d.path not in seen:
            seen.add(d.path)
            out[m] = bench.drafter_summary(d)
    return out


def add_parser(sub) -> None:
    """`bench`: a method comparison, or one of its single measurements (--verify-cost, --draft-step, ...)."""
    b = sub.add_parser("bench", help="compare decoding methods on prompt sets (tokens/s, speedup, tau, lossless)")
    b.add_argument("--prompts", default=None, help="JSON-lines prompt file(s), comma separated")
    b.add_argument("--methods", default="vanilla,hf-generate,hf-prompt-lookup,lookup,fasteagle",
                   help="comma list of: hf-generate, hf-prompt-lookup, " + ", ".join(METHODS)
                   + "; fasteagle-equal: the cascade trained as the eagle3 drafter was")
    b.add_argument("--limit", type=int, default=None,
                   help="prompts per file (per category, in a file of several categories)")
    b.add_argument("--skip", type=int, default=0,
                   help="leave out the first this many per category before --limit: prompts a comparison with "
                        "--limit that many never measures (to choose among drafters on)")
    b.add_argument("--out", default=None, help="result JSON (a .md table and .html charts are written beside it)")
    b.add_argument("--tree", choices=["fixed", "auto"], default="fixed",
                   help="auto: measure this device and give each trained drafter its best tree budget (tokens/s)")
    b.add_argument("--verify-cost", dest="verify_cost", default=None, metavar="SIZES",
                   help="only measure one target forward over trees of these sizes, e.g. 1,8,16,32,64")
    b.add_argument("--compare-packing", dest="compare_packing", action="store_true",
                   help="with --verify-cost: time prepacked and stock linear layers interleaved")
    b.add_argument("--draft-step", dest="draft_step", default=None, metavar="SHAPE",
                   help="only time one draft step of FastEagle vs EAGLE-3-style at a model shape, random weights "
                        "(llama3-8b or smollm2-135m)")
    b.add_argument("--depths", default="4,6,8", help="draft depths for --draft-step")
    b.add_argument("--prefixes", default=None, metavar="TOKENS",
                   help="with --draft-step: time the step, and the drafter's own prefill, after each of these "
                        "context lengths, e.g. 256,1024,2048 (default: one, 128)")
    b.add_argument("--profile-step", dest="profile_step", action="store_true",
                   help="with --prompts/--methods: where each decode step's time goes (ms and dispatched ops for "
                        "the target forward, tree building, drafter extend and the rest)")
    b.add_argument("--budget-curve", dest="budget_curve", default=None, metavar="BUDGETS",
                   help="with --prompts and one trained drafter: tau (greedy) against these tree budgets, e.g. "
                        "6,24,60,128,192, per prompt category, replayed from one decode at the largest; no timing")
    b.add_argument("--diagnose", default=None, metavar="VARIANTS",
                   help="with --prompts and one cascade: where its acceptance goes by kind (reply position, context "
                        "length, copyable tokens), replayed on vanilla's replies, beside these variants: windowW "
                        "(attend over the last W positions), tailT (read only the prompt's last T tokens), e.g. "
                        "window256,tail256 (full: none); no timing")
    b.add_argument("--update-docs", dest="update_docs", nargs="?", const=",".join(DOCS), default=None,
                   metavar="DOCS", help="draw every result table of these documents (comma list; default "
                   f"{','.join(DOCS)}) again from the result file each block names; nothing is timed")
    b.add_argument("--redraw", default=None, metavar="FILES",
                   help="write the .md table (and the .html charts, where a result's kind has them) of these "
                        "result JSON files again, with this version's tables and charts; nothing is timed")
    b.add_argument("--reference", default=None, metavar="RESULT",
                   help="with a method comparison: how many replies of each method equal RESULT's vanilla replies "
                        "to the same prompts (e.g. a bf16 run against an fp32 one)")
    b.add_argument("--drafters", default=None, metavar="LABEL=FOLDER,...",
                   help="more trained drafters to time side by side, each a method of its own label in --methods "
                        "(e.g. --drafters flat=runs/x/at-600 --methods vanilla,fasteagle,flat)")
    b.add_argument("--rerun", default=None, metavar="DRAFTERS",
                   help="rerun every published CPU result that decodes with these drafters (methods such as "
                        "fasteagle-equal, or folders; comma list) by the command it recorded, then --update-docs")
    b.add_argument("--dry-run", dest="dry_run", action="store_true",
                   help="with --rerun: list those results, their commands and minutes; run nothing")
    b.add_argument("--what-if", dest="what_if", action="store_true",
                   help="with a method comparison: keep what the speed model needs to predict other budgets (each "
                        "cascade method's candidates per step, every layer run; this device's verify and draft "
                        "costs measured after the run); `--predict` reads it")
    b.add_argument("--predict", default=None, metavar="RESULT",
                   help="the speed model's tau and tokens/s at --tree-budget (default: the run's, 16, 32, 60) from "
                        "RESULT's what-if record; nothing is timed")
    b.add_argument("--tree-depth", dest="tree_depth", type=int, default=None,
                   help="with --predict: cap the tree's depth (default: every depth the drafter has)")
    b.add_argument("--costs", default=None, metavar="RESULT",
                   help="with --predict: another device's costs, from a `--tree auto` result (e.g. the H200's)")
    b.add_argument("--against", default=None, metavar="RESULTS",
                   help="with --predict: measured runs at other budgets (comma list) set beside the prediction")
    cli_vllm.add_bench_args(b)
    _add_target_args(b)
    _add_method_args(b)
    b.set_defaults(func=cmd_bench)
