"""`bench --what-if` and `bench --predict`: a comparison that keeps what the speed model needs, and the
model's tokens per step and tokens/s at other budgets read back from it (`fasteagle.whatif`).

A `--what-if` run lists, for each cascade method, every depth's candidates at every step (each layer
runs, so a small tree's run still lists the depths a bigger one drafts), and then measures this
device's costs at the run's mean context: a target forward over trees of growing size, and the
drafter's step at growing budgets. It keeps, per method, the replayed grid (tokens per step by budget
and depth cap), acceptance by depth and sibling rank, the measured cost curves, and the run's own step
(budget, tree size, draft, verify and the rest, in ms), under `what_if` in the result.

`--predict` anchors the cost curves at the run's own step (the curves say how a cost changes with the
tree; the run, the level) and prints the model at a budget; `--costs` takes another device's measured
costs instead (a `--tree auto` result: the H200's), `--against` sets measured runs at other budgets
beside the prediction, with the error of each.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from fasteagle import whatif
from fasteagle.bench.costs import draft_cost, verify_cost
from fasteagle.errors import FastEagleError

DEFAULT_BUDGETS = (16, 32, 60)  # what `--predict` prints besides the run's own budget
CPU_SIZES = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64)
GPU_SIZES = CPU_SIZES + (96, 128, 192)


def replayable(drafter) -> bool:
    """A cascade drafting alone: its steps list each depth's candidates (joined with lookup they do
    not: lookup's branches come on top of its tree)."""
    return getattr(drafter, "KIND", None) == "fasteagle" and hasattr(drafter, "state")


def pooled(replays: list[whatif.Replay], budget: int) -> whatif.Replay:
    """One Replay of a method's prompts: their steps together, the run's tau over all of them."""
    first = replays[0]
    n = sum(len(r.probs) for r in replays)
    return whatif.Replay([p for r in replays for p in r.probs], [k for r in replays for k in r.ranks], first.shape,
                         first.k_at, budget, sum(r.run_tau * len(r.probs) for r in replays) / max(n, 1),
                         [x for r in replays for x in (r.room or [0] * len(r.probs))])


def record(target, methods: dict, rows: dict, encoded: list, budgets: dict, seed: int = 0) -> dict:
    """The `what_if` part of a result: per replayable method, its grid, rank table, measured costs and
    own step, from the compare's rows (each holding its prompt's `replay`)."""
    out = {}
    on_gpu = target.device.type == "cuda"
    sizes = GPU_SIZES if on_gpu else CPU_SIZES
    context = int(statistics.fmean(ids.numel() for ids in encoded)) + 32
    timed = None
    for m, rs in rows.items():
        reps = [r["replay"] for r in rs if r.get("replay") is not None]
        if not reps:
            continue
        d, budget = methods[m], int(budgets[m])
        g = whatif.grid(pooled(reps, budget), range(1, GPU_SIZES[-1] + 1))  # to a GPU's budgets, for --costs
        if timed is None:
            timed = whatif.nondecreasing(verify_cost(target, sizes, prefix=context, reps=12)["ms"])
        n_layers = d.cfg.num_layers
        d.state.all_layers = False  # timed as a decode at each budget runs it: the layers that budget can use
        try:
            drafts = draft_cost(target, d, encoded[0], sorted({*range(2, n_layers + 2), 12, 16, 32, sizes[-1], budget}),
                                seed)
        finally:
            d.state.all_layers = True
        steps = sum(r["steps"] for r in rs)
        decode_s = sum(r["wall_s"] - r["prefill_ms"] / 1e3 for r in rs)
        draft_ms = sum(r["draft_ms"] * r["steps"] for r in rs) / steps
        verify_ms = sum(r["verify_ms"] * r["steps"] for r in rs) / steps
        costs = whatif.Costs("this machine", {int(k): v for k, v in timed.items()}, drafts, timed["1"],
                             source=f"measured after the run, at a {context}-token context")
        out[m] = {"grid": g.to_dict(), "rank_table": whatif.rank_table(pooled(reps, budget)), "costs": costs.to_dict(),
                  # the run ran every layer, as a budget of layers + 1 or more does: its draft ms is that budget's
                  "run": {"budget": budget, "draft_as_budget": max(budget, n_layers + 1),
                          "tree_size": round(statistics.fmean(r["tree_size"] for r in rs), 2),
                          "draft_ms": round(draft_ms, 3), "verify_ms": round(verify_ms, 3),
                          "other_ms": round(max(1e3 * decode_s / steps - draft_ms - verify_ms, 0.0), 3),
                          "tau": round(sum(len(r["tokens"]) - 1 for r in rs) / steps, 3)}}
    return out


def read(doc: dict, name: str) -> dict:
    """A result's `what_if` part, or a one-line error saying how to make one."""
    part = doc.get("what_if")
    if not isinstance(part, dict) or not part:
        raise FastEagleError(f"{name} holds no what-if record: make one with `python -m fasteagle bench --what-if "
                             "--methods vanilla,fasteagle ...` (a cascade drafting alone)")
    return part


def costs_from_auto(doc: dict, name: str, method: str = "fasteagle") -> whatif.Costs:
    """--costs: another device's costs from a `--tree auto` result, or a one-line error."""
    costs = whatif.costs_from_auto(doc, method)
    if costs is None:
        raise FastEagleError(f"--costs {name} holds no `--tree auto` costs for {method}: give a result made with "
                             "--tree auto")
    costs.source = name
    return costs


def table(doc: dict, name: str, budgets: list[int], depth: int | None = None, costs: whatif.Costs | None = None,
          against: list[tuple[str, dict]] = ()) -> dict:
    """The model's rows per method at `budgets` (and at every budget of the `against` results), measured
    runs beside their budget's row with the model's error: {method: {"costs", "run", "steps", "rows"}}."""
    part = read(doc, name)
    data = {}
    vanilla = doc.get("methods", {}).get("vanilla", {}).get("decode_tokens_per_s")
    for m, entry in part.items():
        own = doc.get("methods", {}).get(m, {})
        g = whatif.Grid.from_dict(entry["grid"])
        c = costs or whatif.record_costs(entry)
        measured = {}
        for path, other in against:
            s = other.get("methods", {}).get(m)
            b = other.get("settings", {}).get("tree_budget")
            b = b.get(m) if isinstance(b, dict) else b
            if s and b:
                measured[int(b)] = (path, s)
        rows = []
        for b in sorted({*budgets, *measured}):
            p = whatif.predict(g, c, b, depth)
            row = {"budget": b, **{k: p[k] for k in ("tau", "tree_size", "draft_ms", "verify_ms", "tokens_per_s")}}
            if costs is None and own.get("prefill_s") is not None:  # end to end: the run's own prefills added
                n, tokens = own["prompts"], own["tokens"]
                decode_s = (tokens - n) / p["tokens_per_s"]
                row["tokens_per_s_with_prefill"] = round(tokens / (n * own["prefill_s"] + decode_s), 2)
            if costs is None and vanilla:
                row["speedup_vs_vanilla"] = round(p["tokens_per_s"] / vanilla, 3)
            if b in measured:
                path, s = measured[b]
                row |= {"measured_tau": s.get("tau"), "measured_tokens_per_s": s.get("decode_tokens_per_s"),
                        "measured_tokens_per_s_with_prefill": s.get("tokens_per_s"), "file": path}
                row["tau_error"] = _err(p["tau"], s.get("tau"))
                row["tokens_per_s_error"] = _err(p["tokens_per_s"], s.get("decode_tokens_per_s"))
                if "tokens_per_s_with_prefill" in row:
                    row["with_prefill_error"] = _err(row["tokens_per_s_with_prefill"], s.get("tokens_per_s"))
            rows.append(row)
        data[m] = {"costs": c.to_dict(), "run": entry["run"], "steps": g.steps, "rows": rows}
    return data


def markdown(doc: dict) -> str:
    """A `--predict` document as tables, one per method: the model's rows, measured runs beside theirs."""
    lines = []
    for m, d in doc["methods"].items():
        c, run = d["costs"], d["run"]
        source = f" ({c['source']})" if c.get("source") else ""
        lines += [f"**{m}**, from `{Path(doc['predict']).name}` (its own {run['budget']}-node run, tau {run['tau']}; "
                  f"{d['steps']} steps replayed), costs: {c['label']}{source}",
                  "", "| budget | tau | tree | draft ms | verify ms | decode tokens/s | with prefill | measured tau | "
                  "measured decode | measured with prefill | error tau | error decode | error with prefill |",
                  "|---" * 13 + "|"]
        for r in d["rows"]:
            lines.append(f"| {r['budget']} | {r['tau']} | {r['tree_size']} | {r['draft_ms']} | {r['verify_ms']} | "
                         f"{r['tokens_per_s']} | {r.get('tokens_per_s_with_prefill', '')} | "
                         f"{r.get('measured_tau', '')} | "
                         f"{r.get('measured_tokens_per_s', '')} | {r.get('measured_tokens_per_s_with_prefill', '')} | "
                         f"{_pct(r.get('tau_error'))} | {_pct(r.get('tokens_per_s_error'))} | "
                         f"{_pct(r.get('with_prefill_error'))} |")
        lines.append("")
    return "\n".join(lines)


def _err(predicted, measured) -> float | None:
    return None if not measured else round(predicted / measured - 1, 4)


def _pct(x) -> str:
    return "" if x is None else f"{100 * x:+.1f}%"
