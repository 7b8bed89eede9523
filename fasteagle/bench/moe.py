"""The MoE study's answer, joined from the files its recipe wrote (assets/recipes/moe-study.json):

    python -m fasteagle.bench.moe --run runs/moe --out bench/results/cpu-smollm2-135m-moe-study.json

The sparse target's quality against the dense one; for each target, arm (cascade, EAGLE-3-style) and seed, the
training loss per depth against steps (charted in an .html beside the result), tau and acceptance per depth on the
held-out chains, speed in our engine; the cascade's tau on the sparse target as a share of its tau on the dense one
(both seeds' mean, with the spread over seeds); and the routing at the drafters' feature layers against their
misses.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from fasteagle.errors import FastEagleError, Parser, run_command
from fasteagle.files import check_writable, write_text

TARGETS, ARMS, SEEDS = ("dense", "sparse"), ("cascade", "eagle3"), (0, 1)
TABLE_POINTS = 4  # the loss table shows each curve at this many evenly spaced logged steps, the last included
TABLE_DEPTHS = 3
CHART_DEPTHS = 6  # the chart draws the first this many depths (a cascade's six)


def _read(path: Path) -> dict:
    try:
        return json.loads(path.read_text())
    except OSError:
        raise FastEagleError(f"no {path}: run the MoE study's recipe to its end first") from None
    except json.JSONDecodeError as exc:
        raise FastEagleError(f"{path} is not JSON ({exc.msg})") from None


def loss_curve(history: list[dict]) -> dict:
    """{steps, loss}: the training loss of every depth at every logged step (loss[d-1] is depth d's)."""
    depths = sorted(int(k[4:]) for k in history[-1] if k.startswith("loss") and k[4:].isdigit())
    return {"steps": [h["step"] for h in history], "loss": [[round(h[f"loss{d}"], 3) for h in history] for d in depths]}


def arm(run: Path, target: str, name: str, seed: int, bench: dict) -> dict:
    """One trained drafter: its loss curve per depth, training minutes, and its held-out chains."""
    label = f"{name}-s{seed}"
    history = _read(run / target / label / "history.json")
    m = bench["methods"].get(label)
    if m is None:
        raise FastEagleError(f"{target}'s chains have no method {label}")
    # the trainer's own minutes: they count what a run cut by a stop had trained before it resumed
    minutes = _read(run / target / label / "config.json")["training"]["train_minutes_all"]
    return {"steps": history[-1]["step"], "minutes": minutes,
            "loss_curve": loss_curve(history), "tau": m["tau"], "depth_acceptance": m["depth_acceptance"],
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
             f"vanilla | identical | training minutes | training loss of depths 1-{TABLE_DEPTHS} by step (seed 0) |",
             "|---|---|---|---|---|---|---|---|"]
    for key, arms in s["arms"].items():
        target, name = key.split("/")
        mean, spread = s["tau"][key]
        acc = "; ".join(", ".join(f"{a:.2f}" for a in x["depth_acceptance"][:3]) for x in arms)
        curve = arms[0]["loss_curve"]
        loss = " / ".join(f"{curve['steps'][i]}: " + ", ".join(f"{d[i]:.2f}" for d in curve["loss"][:TABLE_DEPTHS])
                          for i in table_points(len(curve["steps"])))
        minutes = ", ".join(f"{x['minutes']:.1f}" for x in arms)
        lines.append(f"| {target} | {name} | {mean:.3f} ± {spread / 2:.3f} | {acc} | "
                     + ", ".join(f"{x['speedup_vs_vanilla']:.2f}x" for x in arms)
                     + f" | {', '.join(x['identical'] for x in arms)} | {minutes} | {loss} |")
    lines += ["", f"Cascade tau, sparse over dense: {s['cascade_tau_sparse_over_dense']}x (EAGLE-3-style: "
              f"{s['eagle3_tau_sparse_over_dense']}x).", "", _routing_table(s["routing"])]
    return "\n".join(lines) + "\n"


def table_points(n: int) -> list[int]:
    """The indices of TABLE_POINTS evenly spaced entries of an n-long curve, ending at its last."""
    return sorted({round((n - 1) * (i + 1) / TABLE_POINTS) for i in range(TABLE_POINTS)}) if n else []


def chart(doc: dict, path: str | Path) -> None:
    """Plotly HTML of the study's training loss against steps: a panel per drafter kind, a colour per depth,
    solid for the dense target and dotted for the sparse one, each seed a line."""
    from plotly.colors import qualitative
    from plotly.subplots import make_subplots

    from fasteagle.files import atomic_path

    s = doc["moe_study"]
    fig = make_subplots(rows=1, cols=len(ARMS), shared_yaxes=True,
                        subplot_titles=[f"{name}: training loss by depth" for name in ARMS])
    for col, name in enumerate(ARMS, start=1):
        for target in TARGETS:
            for seed, a in zip(SEEDS, s["arms"][f"{target}/{name}"]):
                curve = a["loss_curve"]
                for d, losses in enumerate(curve["loss"][:CHART_DEPTHS], start=1):
                    fig.add_scatter(x=curve["steps"], y=losses, mode="lines", row=1, col=col,
                                    name=f"{target}, depth {d}", legendgroup=f"{target}{d}",
                                    showlegend=col == 1 and seed == SEEDS[0],
                                    line_color=qualitative.Plotly[(d - 1) % len(qualitative.Plotly)],
                                    line_dash="solid" if target == "dense" else "dot",
                                    hovertemplate=f"{target} {name} seed {seed}, depth {d}<br>step %{{x}}: "
                                                  "loss %{y:.2f}<extra></extra>")
        fig.update_xaxes(title_text="training step", row=1, col=col)
    fig.update_yaxes(title_text="cross-entropy (nats)", row=1, col=1)
    fig.update_layout(title="The MoE study: the drafters' training loss, dense (solid) and sparse (dotted) target",
                      height=460, template="plotly_white")
    with atomic_path(path) as tmp:
        fig.write_html(str(tmp), include_plotlyjs="cdn", div_id=Path(path).stem)


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
    chart(doc, Path(args.out).with_suffix(".html"))
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
