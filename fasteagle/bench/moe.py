"""The MoE study's answer, joined from the files its recipe wrote (assets/recipes/moe-study.json):

    python -m fasteagle.bench.moe --run runs/moe --out bench/results/cpu-smollm2-135m-moe-study.json

The sparse target's quality against the dense one; for each target, arm (cascade, EAGLE-3-style) and seed, the
training loss per depth against steps, tau and acceptance per depth on the held-out chains, speed in our
engine; the cascade's tau on the sparse target as a share of its tau on the dense one (both seeds' mean, with
the spread over seeds); and the routing at the drafters' feature layers against their misses.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from fasteagle.errors import FastEagleError, Parser, run_command
from fasteagle.files import check_writable, write_text

TARGETS, ARMS, SEEDS = ("dense", "sparse"), ("cascade", "eagle3"), (0, 1)
CURVE_STEPS = (50, 100, 150, 220)  # the training steps the loss table shows


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except OSError:
        raise FastEagleError(f"no {path}: run the MoE study's recipe to its end first") from None
    except json.JSONDecodeError as exc:
        raise FastEagleError(f"{path} is not JSON ({exc.msg})") from None


def arm(run: Path, target: str, name: str, seed: int, bench: dict) -> dict:
    """One trained drafter: its loss per depth at CURVE_STEPS, training minutes, and its held-out chains."""
    label = f"{name}-s{seed}"
    history = _read(run / target / label / "history.json")
    depths = sorted(int(k[4:]) for k in history[-1] if k.startswith("loss") and k[4:].isdigit())
    curve = {str(s): [round(h[f"loss{d}"], 3) for d in depths]
             for s in CURVE_STEPS for h in history if h["step"] == s}
    m = bench["methods"].get(label)
    if m is None:
        raise FastEagleError(f"{target}'s chains have no method {label}")
    return {"steps": history[-1]["step"], "minutes": _read(run / "done" / f"{target}-{label}.json")["minutes"],
            "loss_by_depth": curve, "tau": m["tau"], "depth_acceptance": m["depth_acceptance"],
            "speedup_vs_vanilla": m["speedup_vs_vanilla"], "tokens_per_s": m["tokens_per_s"],
            "identical": f"{m['identical_to_vanilla']}/{m['prompts']}"}


def _mean_spread(values: list[float]) -> tuple[float, float]:
    return round(sum(values) / len(values), 3), round(max(values) - min(values), 3)


def study(run: Path) -> dict:
    quality = _read(run / "target" / "quality.json")
    out = {"sparse_target": quality, "arms": {}, "tau": {}}
    for target in TARGETS:
        bench = _read(run / "compare" / f"{target}-chain6.json")
        out[f"{target}_vanilla_tokens_per_s"] = bench["methods"]["vanilla"]["tokens_per_s"]
        for name in ARMS:
            arms = [arm(run, target, name, seed, bench) for seed in SEEDS]
            out["arms"][f"{target}/{name}"] = arms
            out["tau"][f"{target}/{name}"] = _mean_spread([a["tau"] for a in arms])
    out["cascade_tau_sparse_over_dense"] = round(out["tau"]["sparse/cascade"][0] / out["tau"]["dense/cascade"][0], 3)
    out["eagle3_tau_sparse_over_dense"] = round(out["tau"]["sparse/eagle3"][0] / out["tau"]["dense/eagle3"][0], 3)
    out["routing"] = _read(run / "compare" / "routing.json")
    return out


def markdown(doc: dict) -> str:
    s = doc["moe_study"]
    q = s["sparse_target"]
    k = str(q["chosen_top_k"])
    lines = [f"Sparse target: top-{k} of {q['experts']} experts per MLP, perplexity {q['top_k'][k]['perplexity']} "
             f"against dense {q['dense_perplexity']} ({q['top_k'][k]['perplexity_ratio']}x; every k: "
             + ", ".join(f"top-{kk} {v['perplexity_ratio']}x" for kk, v in q["top_k"].items())
             + f"), top-1 agreement with dense greedy replies {q['top_k'][k]['top1_agreement']}, identical replies "
             f"{q['top_k'][k]['identical_replies']}/{q['top_k'][k]['replies']}.", "",
             "| target | drafter | tau (2 seeds: mean, spread) | acceptance by depth (seed 0; seed 1) | speedup vs "
             "vanilla | identical | loss by depth at step " + ", ".join(map(str, CURVE_STEPS)) + " (seed 0) |",
             "|---|---|---|---|---|---|---|"]
    for key, arms in s["arms"].items():
        target, name = key.split("/")
        mean, spread = s["tau"][key]
        acc = "; ".join(", ".join(f"{a:.2f}" for a in x["depth_acceptance"][:3]) for x in arms)
        loss = " / ".join(", ".join(f"{v:.2f}" for v in arms[0]["loss_by_depth"].get(str(st), [])[:3])
                          for st in CURVE_STEPS)
        lines.append(f"| {target} | {name} | {mean:.3f} ± {spread / 2:.3f} | {acc} | "
                     + ", ".join(f"{x['speedup_vs_vanilla']:.2f}x" for x in arms)
                     + f" | {', '.join(x['identical'] for x in arms)} | {loss} |")
    lines += ["", f"Cascade tau, sparse over dense: {s['cascade_tau_sparse_over_dense']}x (EAGLE-3-style: "
              f"{s['eagle3_tau_sparse_over_dense']}x).", "", _routing_table(s["routing"])]
    return "\n".join(lines) + "\n"


def _routing_table(r: dict) -> str:
    lines = ["| drafter | layer | routing change seen: hits, misses | unseen: hits, misses | depth-1 acceptance "
             "when the unseen routing kept its experts / changed some / changed all (steps) |", "|---|---|---|---|---|"]
    for label, d in r["drafters"].items():
        for layer, e in d["layers"].items():
            when = " / ".join(f"{_f(e[f'accept_when_{n}_changed'])} ({e[f'steps_{n}_changed']})"
                              for n in ("none", "some", "all"))
            lines.append(f"| {label} | {layer} | {_f(e['seen_change_hits'])}, {_f(e['seen_change_misses'])} | "
                         f"{_f(e['unseen_change_hits'])}, {_f(e['unseen_change_misses'])} | {when} |")
    return "\n".join(lines)


def _f(x) -> str:
    return "–" if x is None else f"{x:.2f}"


def parser() -> Parser:
    p = Parser(prog="python -m fasteagle.bench.moe", description=__doc__.split("\n\n")[0])
    p.add_argument("--run", required=True, help="the MoE study recipe's out folder")
    p.add_argument("--out", required=True, help="the JSON written (a .md beside it)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    return run_command(lambda: _run(args))


def _run(args) -> int:
    from fasteagle.cli_args import result_command

    check_writable(args.out, "--out")
    doc = {"moe_study": study(Path(args.run)), "command": result_command("fasteagle.bench.moe")}
    write_text(args.out, json.dumps(doc, indent=1) + "\n")
    write_text(Path(args.out).with_suffix(".md"), markdown(doc))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
