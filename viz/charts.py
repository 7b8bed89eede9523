"""Summary numbers and charts of whole decodes, from lists of `StepTrace.to_dict()`s (pure)."""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from viz.tree import ACCEPTED, REJECTED, VERDICT_COLORS

CHART_HEIGHT = 280
_MARGIN = {"l": 50, "r": 20, "t": 50, "b": 50}
TIME_COLORS = {"prefill": "#9467bd", "draft": "#ff7f0e", "verify": "#1f77b4", "other": "#c7c7c7"}

Traces = Sequence[Mapping]


def accepted_lengths(traces: Traces) -> list[int]:
    """Draft tokens accepted at each decoding step (the prefill excluded; the bonus not counted)."""
    return [max(len(t.get("path") or [0]) - 1, 0) for t in traces if int(t.get("step", 0)) > 0]


def depth_acceptance(traces: Traces) -> list[dict]:
    """Per draft depth d: in how many steps a depth-d node was reached (its parent accepted, so the
    verifier judged it) and in how many one was accepted. rate = accepted / reached: the
    conditional acceptance rate of depth d."""
    reached: Counter = Counter()
    accepted: Counter = Counter()
    for t in traces:
        tree = t.get("tree")
        if not tree or not t.get("status"):
            continue
        seen_r, seen_a = set(), set()
        for d, s in zip(tree["depths"], t["status"]):
            if d > 0 and s in (ACCEPTED, REJECTED):
                seen_r.add(d)
                if s == ACCEPTED:
                    seen_a.add(d)
        reached.update(seen_r)
        accepted.update(seen_a)
    return [{"depth": d, "reached": reached[d], "accepted": accepted[d], "rate": accepted[d] / reached[d]}
            for d in sorted(reached)]


def summarize(traces: Traces, decode_s: float | None = None) -> dict:
    """Totals of one decode. `decode_s`: measured wall time of the whole decode (prefill included);
    without it the sum of the per-step timings is used."""
    if not traces:
        return {"tokens": 0, "forwards": 0, "tau": 0.0, "steps": 0, "prefill_ms": 0.0, "draft_ms": 0.0,
                "verify_ms": 0.0, "other_ms": 0.0, "wall_s": 0.0, "tokens_per_s": 0.0, "finished": None}
    last = traces[-1]
    tokens, forwards = int(last.get("generated", 0)), int(last.get("forwards", 0))
    prefill_ms = sum(float(t.get("verify_ms", 0)) for t in traces if int(t.get("step", 0)) == 0)
    draft_ms = sum(float(t.get("draft_ms", 0)) for t in traces)
    verify_ms = sum(float(t.get("verify_ms", 0)) for t in traces if int(t.get("step", 0)) > 0)
    measured = prefill_ms + draft_ms + verify_ms
    wall_s = decode_s if decode_s is not None else measured / 1e3
    return {
        "tokens": tokens, "forwards": forwards, "steps": len(traces) - 1,
        "tau": (tokens - 1) / forwards if forwards else 0.0,
        "prefill_ms": prefill_ms, "draft_ms": draft_ms, "verify_ms": verify_ms,
        "other_ms": max(wall_s * 1e3 - measured, 0.0), "wall_s": wall_s,
        "tokens_per_s": tokens / wall_s if wall_s > 0 else 0.0, "finished": last.get("finished"),
    }


def _layout(fig: go.Figure, title: str, xtitle: str, ytitle: str) -> go.Figure:
    fig.update_layout(title={"text": title, "x": 0.01, "font": {"size": 14}}, height=CHART_HEIGHT, margin=_MARGIN,
                      xaxis_title=xtitle, yaxis_title=ytitle, plot_bgcolor="white", paper_bgcolor="white",
                      bargap=0.15)
    fig.update_xaxes(showgrid=False)
    fig.update_yaxes(gridcolor="#eeeeee")
    return fig


def acceptance_histogram(traces: Traces) -> go.Figure:
    """How many draft tokens each step accepted (each step also emits the target's bonus token)."""
    lengths = accepted_lengths(traces)
    counts = Counter(lengths)
    xs = list(range(0, max(lengths, default=0) + 1))
    fig = go.Figure(go.Bar(x=xs, y=[counts[x] for x in xs], name="steps", marker_color=VERDICT_COLORS[ACCEPTED],
                           hovertemplate="%{y} steps accepted %{x} draft tokens<extra></extra>"))
    mean = sum(lengths) / len(lengths) if lengths else 0.0
    fig.update_xaxes(dtick=1)
    fig.update_yaxes(tick0=0, dtick=max(1, math.ceil(max(counts.values(), default=1) / 5)))  # whole steps
    # no τ here: the run's τ counts emitted tokens, and a step's accepted drafts may be cut at a stop
    # token, so mean + 1 would disagree with the τ shown beside the reply
    return _layout(fig, f"accepted draft tokens per step (mean {mean:.2f})",
                   "draft tokens accepted in the step", "steps")


def depth_acceptance_chart(traces: Traces) -> go.Figure:
    rows = depth_acceptance(traces)
    fig = go.Figure(go.Bar(
        x=[r["depth"] for r in rows], y=[r["rate"] for r in rows], marker_color=VERDICT_COLORS[ACCEPTED],
        text=[f"{r['accepted']}/{r['reached']}" for r in rows], textposition="outside",
        customdata=[[r["accepted"], r["reached"]] for r in rows],
        hovertemplate="depth %{x}: accepted in %{customdata[0]} of the %{customdata[1]} steps that reached it"
                      "<extra></extra>"))
    fig.update_yaxes(range=[0, 1.15], tickformat=".0%")
    fig.update_xaxes(dtick=1)
    return _layout(fig, "acceptance rate per depth (parent accepted)", "draft depth",
                   "accepted / reached")


def time_split_chart(summaries: Mapping[str, Mapping]) -> go.Figure:
    """Stacked horizontal bars of where each decode's wall time went: {name: summarize(...)}."""
    names = list(summaries)
    fig = go.Figure()
    for part in ("prefill", "draft", "verify", "other"):
        vals = [float(summaries[n].get(f"{part}_ms", 0.0)) for n in names]
        fig.add_trace(go.Bar(y=names, x=vals, name=part, orientation="h", marker_color=TIME_COLORS[part],
                             hovertemplate=f"%{{y}}: {part} %{{x:.0f}} ms<extra></extra>"))
    fig.update_layout(barmode="stack", legend={"orientation": "h", "y": -0.3})
    fig.update_yaxes(autorange="reversed")
    return _layout(fig, "where the time went (ms): draft vs verify", "milliseconds", "")
