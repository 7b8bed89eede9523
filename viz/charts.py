"""Charts of whole decodes, from lists of `StepTrace.to_dict()`s (pure); the numbers they show are
`fasteagle.trace`'s."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence

import plotly.graph_objects as go

from fasteagle.trace import ACCEPTED, accepted_lengths, depth_acceptance, histogram
from viz.tree import TITLE_CHARS, VERDICT_COLORS, wrap

CHART_HEIGHT = 280
_MARGIN = {"l": 50, "r": 20, "t": 50, "b": 50}
TIME_COLORS = {"prefill": "#9467bd", "draft": "#ff7f0e", "verify": "#1f77b4", "other": "#c7c7c7"}
METHOD_COLORS = ["#2e9d49", "#1f77b4", "#ff7f0e", "#9467bd", "#d62728", "#8c564b"]  # one line per method
METHOD_DASHES = ["solid", "dash", "dot", "dashdot"]
METHOD_SYMBOLS = ["circle", "square", "diamond", "triangle-up", "x", "star"]

Traces = Sequence[Mapping]


def _layout(fig: go.Figure, title: str, xtitle: str, ytitle: str) -> go.Figure:
    """A chart's common look; its title wrapped at words to fit a phone's width."""
    title = wrap(title.split(" "), TITLE_CHARS, " ")
    fig.update_layout(title={"text": title, "x": 0.01, "font": {"size": 14}}, height=CHART_HEIGHT, margin=_MARGIN,
                      xaxis_title=xtitle, yaxis_title=ytitle, plot_bgcolor="white", paper_bgcolor="white",
                      bargap=0.15)
    fig.update_xaxes(showgrid=False)
    fig.update_yaxes(gridcolor="#eeeeee")
    return fig


def acceptance_histogram(traces: Traces) -> go.Figure:
    """How many draft tokens each step accepted (each step also emits the target's bonus token)."""
    lengths = accepted_lengths(traces)
    counts = histogram(lengths, 0)
    fig = go.Figure(go.Bar(x=list(range(len(counts))), y=counts, name="steps", marker_color=VERDICT_COLORS[ACCEPTED],
                           hovertemplate="%{y} steps accepted %{x} draft tokens<extra></extra>"))
    mean = sum(lengths) / len(lengths) if lengths else 0.0
    fig.update_xaxes(dtick=1)
    fig.update_yaxes(tick0=0, dtick=max(1, math.ceil(max(counts, default=1) / 5)))  # whole steps
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


def depth_acceptance_lines(runs: Mapping[str, Traces]) -> go.Figure:
    """Per-depth acceptance of several decodes of one prompt, a line per method ({name: traces}):
    `fasteagle.trace.depth_acceptance` of each, depths no step reached left out. Methods often
    accept alike, so each line is drawn thinner than the one before it, with its own dash and marker:
    a line that another covers exactly still shows around it."""
    fig = go.Figure()
    for k, (name, traces) in enumerate(runs.items()):
        rows = [r for r in depth_acceptance(traces) if r["rate"] is not None]
        under = len(runs) - 1 - k  # lines drawn over this one
        fig.add_trace(go.Scatter(
            x=[r["depth"] for r in rows], y=[r["rate"] for r in rows], mode="lines+markers", name=name,
            line={"color": METHOD_COLORS[k % len(METHOD_COLORS)], "width": 2 + 2 * under,
                  "dash": METHOD_DASHES[k % len(METHOD_DASHES)]},
            marker={"symbol": METHOD_SYMBOLS[k % len(METHOD_SYMBOLS)], "size": 7 + 3 * under},
            customdata=[[r["accepted"], r["reached"]] for r in rows],
            hovertemplate=f"{name}, depth %{{x}}: accepted in %{{customdata[0]}} of %{{customdata[1]}} steps"
                          "<extra></extra>"))
    fig.update_yaxes(range=[0, 1.05], tickformat=".0%")
    fig.update_xaxes(dtick=1)
    fig.update_layout(legend={"orientation": "h", "y": -0.3})
    return _layout(fig, "acceptance rate per depth, each method", "draft depth", "accepted / reached")


def batch_speedup_chart(doc: Mapping) -> go.Figure:
    """Speculative decoding inside vLLM as the batch grows, from a `bench --engine vllm --repeats` result:
    each method's speedup over vLLM's plain decoding (greedy) against batch size, one line per method."""
    fig = go.Figure()
    sizes = [int(b) for b in doc["batches"]]
    methods = [m for m in doc["batches"][str(sizes[0])]["methods"] if m != "vanilla"]
    for k, m in enumerate(methods):
        rows = [doc["batches"][str(b)]["methods"][m] for b in sizes]
        fig.add_trace(go.Scatter(
            x=sizes, y=[r["speedup_vs_vanilla"] for r in rows], mode="lines+markers", name=m,
            line={"color": METHOD_COLORS[k % len(METHOD_COLORS)], "width": 2,
                  "dash": METHOD_DASHES[k % len(METHOD_DASHES)]},
            customdata=[[r["tokens_per_s"], r.get("tau", 1.0)] for r in rows],
            hovertemplate=f"{m}, batch %{{x}}: %{{y:.2f}}x (%{{customdata[0]:.0f}} tokens/s, tau "
                          "%{customdata[1]:.2f})<extra></extra>"))
    fig.add_hline(y=1.0, line_dash="dot", line_color="grey")
    fig.update_xaxes(type="log", tickvals=sizes, ticktext=[str(b) for b in sizes], showgrid=False)
    fig.update_layout(legend={"orientation": "h", "y": -0.35})
    return _layout(fig, f"speedup over plain decoding in vLLM, by batch size ({doc.get('device', '')})",
                   "requests decoded together (batch size)", "speedup vs vanilla")
