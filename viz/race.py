"""What a finished run teaches at a glance: the step to land on, and the race of target forwards
between speculative and vanilla decoding (pure functions over StepTrace dicts)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from html import escape

from fasteagle import trace


def landing_step(traces: Sequence[Mapping]) -> int:
    """The index of the most instructive step: the first decode step with the longest accepted path
    (the last step is often a lone bonus token); the last index when no step verified a tree."""
    best, best_len = len(traces) - 1, -1
    for i, tr in enumerate(traces):
        if int(tr.get("step", 0)) <= 0:
            continue
        n = trace.accepted_lengths([tr])[0]
        if n > best_len:
            best, best_len = i, n
    return max(best, 0)


def _bar(label: str, forwards: int, most: int, color: str) -> str:
    """One row: the bar's length is its share of the longest, of the row less its label and count
    (`--fe-race-gutter`, narrower on a phone), so the bars keep their ratio at any width."""
    share = forwards / most if most else 0.0
    return (f'<div class="fe-race-row"><span class="fe-race-name">{escape(label)}</span>'
            f'<span class="fe-race-bar" style="width:calc((100% - var(--fe-race-gutter, 220px)) * {share:.3f});'
            f'background:{color}"></span>'
            f'<span class="fe-race-n">{forwards}</span></div>')


def race_html(spec_traces: Sequence[Mapping], van_traces: Sequence[Mapping] | None, spec_wall_s: float | None,
              van_wall_s: float | None = None, method: str = "speculative",
              van_modelled: Mapping | None = None) -> str:
    """The race of a finished run, as HTML: target forwards of the speculative decode against vanilla
    decoding (the steady number), tau, and the wall-clock speed-up this run measured on this machine.
    The wall times are each decode's seconds (None: the sum of its steps' timings). `van_modelled`:
    without vanilla traces, vanilla's modelled summary (one forward per token, its time from a
    measured step), drawn and named as modelled."""
    spec = trace.run_summary(spec_traces, spec_wall_s)
    head = f'<div class="fe-race" data-forwards="{spec["forwards"]}">'
    if not van_traces and van_modelled:
        return head + _modelled(spec, van_modelled, method)
    if not van_traces:
        return (head + f"<b>{escape(method)}</b>: {spec['forwards']} target forwards for {spec['tokens']} tokens · "
                f"τ {spec['tau']:.2f} (no vanilla decode in this trace)</div>")
    van = trace.run_summary(van_traces, van_wall_s)
    most = max(spec["forwards"], van["forwards"], 1)
    fewer = van["forwards"] / spec["forwards"] if spec["forwards"] else 0.0
    speed = spec["tokens_per_s"] / van["tokens_per_s"] if van["tokens_per_s"] > 0 else 0.0
    same = "" if spec["tokens"] == van["tokens"] else f" (the replies: {spec['tokens']} and {van['tokens']} tokens)"
    return (head + f'<div class="fe-race-head"><b>{spec["forwards"]} vs {van["forwards"]} target forwards: '
            f"{fewer:.2f}× fewer</b>{same} · τ {spec['tau']:.2f} tokens per forward · "
            f"wall-clock speed-up <b>{speed:.2f}×</b></div>"
            + _bar(method, spec["forwards"], most, "#2e9d49") + _bar("vanilla", van["forwards"], most, "#8a96a8")
            + '<div class="fe-race-note">Target forwards are the steady number: the same on any machine. '
            "The wall-clock speed-up is what this run measured on this machine (a GPU usually gains more than a "
            "small CPU).</div></div>")


def _modelled(spec: Mapping, van: Mapping, method: str) -> str:
    """The race against a vanilla decode that was not run: its forwards are one per token after the
    prefill (exact for the same reply), its time a model, and the strip says so."""
    most = max(spec["forwards"], int(van["forwards"]), 1)
    fewer = van["forwards"] / spec["forwards"] if spec["forwards"] else 0.0
    speed = spec["tokens_per_s"] / van["tokens_per_s"] if van["tokens_per_s"] > 0 else 0.0
    return (f'<div class="fe-race-head" data-modelled="true"><b>{spec["forwards"]} vs {int(van["forwards"])} target '
            f"forwards: {fewer:.2f}× fewer</b> · τ {spec['tau']:.2f} tokens per forward · wall-clock speed-up "
            f"<b>{speed:.2f}× (modelled)</b></div>"
            + _bar(method, spec["forwards"], most, "#2e9d49")
            + _bar("vanilla (modelled)", int(van["forwards"]), most, "#b9c2cf")
            + '<div class="fe-race-note">Vanilla was not decoded: other pages were waiting. Its forwards are one per '
            "token of this reply; its time is modelled from a plain decode step measured on this machine "
            f"({float(van.get('step_ms', 0)):.0f} ms per forward).</div></div>")
