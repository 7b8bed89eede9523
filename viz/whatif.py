"""The what-if panel: a run's expected tokens per step and speed-up against the tree's node budget and
depth, from measured costs, redrawn in the browser as the sliders move (no decode).

Every number comes from `fasteagle.whatif` (the replay of the run's candidate lists and the one speed
formula `bench --tree auto` and `bench --predict` use), computed here for each preset's budgets and
depths; the page's script (whatif.js) only looks them up and draws. A run the model cannot replay (no
candidate lists: vanilla, lookup, EAGLE-3, a version-1 file; lookup's branches joined) gets the panel's
one-line reason instead.
"""

from __future__ import annotations

import html
import json
from collections.abc import Mapping, Sequence
from pathlib import Path

from fasteagle import trace, whatif

# node budgets the sliders stop at: every budget to 16, then coarser (the model's curve is smooth there)
BUDGETS = (*range(1, 17), 20, 24, 28, 32, 40, 48, 56, 64, 80, 96, 128, 160, 192)
RANKS = 4  # sibling ranks the acceptance table shows (the rest in one column)
EMPTY = "After a FastEagle run, this panel predicts its speed at other tree sizes from measured costs."


def whatif_data(run: Mapping, presets: Sequence[whatif.Costs]) -> dict | str:
    """The panel's data for a run (the app's run record), or the reason it has none. Each preset's costs
    are used as given, except the first, "this machine", which is moved through the run's own step."""
    meta, sides = run.get("meta") or {}, run.get("sides") or {}
    spec = sides.get("speculative") or {}
    steps = spec.get("traces") or []
    if not str(meta.get("method_key") or "fasteagle").startswith("fasteagle"):  # a cascade's run, alone or joined
        return (f"What-if replays a cascade's candidate lists; {meta.get('method', 'this method')} drafts "
                "without them. Run FastEagle to see it.")
    try:
        rep = whatif.replay(steps, meta.get("tree_shape") or "product", _k(meta.get("tree_k")),
                            int(meta.get("tree_budget") or 0))
    except whatif.WhatIfError as exc:
        return f"What-if is off for this run: {exc}."
    if not presets:
        return "What-if is off: no measured costs for this target on this device."
    g = whatif.grid(rep, BUDGETS)
    decode = trace.decode_steps(steps)
    draft, verify, other = _step_ms(spec)
    size = sum(len((s.get("tree") or {}).get("tokens") or [1]) for s in decode) / max(len(decode), 1)
    plain = _step_ms(sides.get("vanilla") or {})
    out_presets = []
    for i, costs in enumerate(presets):
        if i == 0:  # this machine: through the run's own step, and plain decoding's as its vanilla side took it
            costs = costs.anchored(rep.run_budget, size, draft, verify, other)
            if sum(plain):
                costs.step_ms = sum(plain)
        out_presets.append(_preset(g, costs))
    measured = _measured(spec, sides.get("vanilla"))
    listed = min(len(p) for step in rep.probs for p in step)  # an older file keeps 3 per depth
    return {"budgets": list(BUDGETS), "depths": g.depths, "run": {
        "budget": rep.run_budget, "tau": round(rep.run_tau, 3), "steps": g.steps, "speedup": measured,
        "listed": listed},
        "presets": out_presets, "ranks": whatif.rank_table(rep, RANKS)}


def _step_ms(side: Mapping) -> tuple[float, float, float]:
    """A side's mean decode step: draft, verify and the rest, in ms (zeros without decode steps)."""
    decode = trace.decode_steps(side.get("traces") or [])
    if not decode:
        return 0.0, 0.0, 0.0
    n = len(decode)
    other = float((side.get("summary") or {}).get("other_ms", 0.0)) / n
    return (sum(float(s.get("draft_ms", 0)) for s in decode) / n, sum(float(s.get("verify_ms", 0)) for s in decode) / n,
            other)


def _k(text):
    """The run's top-k setting as the model takes it (empty: every candidate the run listed)."""
    if not text:
        return None
    ks = [int(x) for x in str(text).replace(" ", "").split(",") if x]
    return ks[0] if len(ks) == 1 else ks


def _preset(g: whatif.Grid, costs: whatif.Costs) -> dict:
    """One preset's numbers for every depth cap and budget it was measured to (and the chains)."""
    budgets = [b for b in BUDGETS if b <= max(costs.largest, 64)]
    by_depth = {}
    for d in g.depths:
        rows = [whatif.predict(g, costs, b, d) for b in budgets]
        by_depth[str(d)] = {k: [r[k] for r in rows] for k in ("tau", "tree_size", "draft_ms", "verify_ms",
                                                               "tokens_per_s", "speedup_vs_decode_step")}
    chains = [whatif.predict(g, costs, 0, d, chain=True) for d in g.depths]
    return {"label": costs.label, "source": costs.source, "step_ms": round(costs.step_ms, 2),
            "other_ms": round(costs.other_ms, 2), "budgets": budgets, "by_depth": by_depth,
            "chain": {k: [c[k] for c in chains] for k in ("tau", "draft_ms", "verify_ms", "tokens_per_s",
                                                           "speedup_vs_decode_step")}}


def _measured(spec: Mapping, vanilla: Mapping | None) -> float | None:
    """The run's measured decode speed-up over its vanilla side (prefill left out of both), or None."""
    def rate(side):
        s = (side or {}).get("summary") or {}
        wall = float(s.get("wall_s", 0)) - float(s.get("prefill_ms", 0)) / 1e3
        return (int(s.get("tokens", 0)) - 1) / wall if wall > 0 else None

    a, b = rate(spec), rate(vanilla)
    return round(a / b, 3) if a and b else None


def whatif_html(run: Mapping | None, presets: Sequence[whatif.Costs] = ()) -> str:
    """The panel: its data for the script, or a line saying why there is none."""
    if not run or not run.get("sides"):
        return f'<div class="fe-whatif"><p class="fe-wi-why">{html.escape(EMPTY)}</p></div>'
    data = whatif_data(run, presets)
    if isinstance(data, str):
        return f'<div class="fe-whatif"><p class="fe-wi-why">{html.escape(data)}</p></div>'
    payload = html.escape(json.dumps(data, separators=(",", ":")), quote=True)
    return f'<div class="fe-whatif" data-ready="0" data-wi="{payload}"><p class="fe-wi-why">drawing…</p></div>'



WHATIF_CSS = """
.fe-whatif { font-size: 0.95rem; }
.fe-whatif .fe-wi-controls { display: flex; flex-wrap: wrap; gap: 0.6rem 1.4rem; align-items: center;
  margin: 0.3rem 0; }
.fe-whatif label { display: inline-flex; gap: 0.4rem; align-items: center; }
.fe-whatif input[type=range] { width: 11rem; }
.fe-whatif input:focus-visible, .fe-whatif button:focus-visible { outline: 3px solid #0072b2; outline-offset: 2px; }
.fe-whatif svg { width: 100%; max-width: 760px; height: auto; display: block; }
.fe-whatif .fe-wi-read { font-variant-numeric: tabular-nums; margin: 0.3rem 0; }
.fe-whatif table { border-collapse: collapse; font-variant-numeric: tabular-nums; margin-top: 0.4rem; }
.fe-whatif td, .fe-whatif th { padding: 0.15rem 0.5rem; text-align: right; }
.fe-whatif .fe-wi-note { opacity: 0.8; font-size: 0.85rem; }
body.fe-present .fe-whatif { font-size: 1.25rem; }
"""

WHATIF_JS = (Path(__file__).with_name("whatif.js")).read_text(encoding="utf-8")
