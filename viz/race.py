"""What a finished run teaches at a glance: the step to land on, and the race of target forwards
between speculative and vanilla decoding (pure functions over StepTrace dicts)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

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
