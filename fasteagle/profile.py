"""Where a decoding step's time goes: wall time and dispatched operations per phase.

Why: a small target on a GPU is bound by kernel launches, not arithmetic, so what decides a
speculative decoder's speedup there is how many operations each step issues besides the target's
own forward. This splits every decode step (the prefill excluded) into
- `target`: the target's forward (the tree's verification, or vanilla's one token),
- `draft`: building the tree from the drafter's outputs,
- `extend`: feeding the accepted positions to the drafter,
- `rest`: everything else (attention mask, acceptance, cache commit, the step's trace),
and reports per step the mean milliseconds of each (the device synchronised at phase edges) and,
in a second, identical run, the operations each dispatched (views and no-op conversions left out:
they launch no kernel). `python -m fasteagle bench --profile-step` runs it.
"""

from __future__ import annotations

import time
from collections import Counter
from contextlib import nullcontext

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from fasteagle.errors import FastEagleError
from fasteagle.generate import generate, synchronize
from fasteagle.trace import tau

PHASES = ("target", "draft", "extend", "rest")
_NO_KERNEL = {"detach", "detach_", "resolve_conj", "resolve_neg", "lift_fresh", "alias"}


class _Clock:
    """Accumulates time per phase; `phase` is the phase now running (for the op counter)."""

    def __init__(self, device: torch.device, timed: bool):
        self.device, self.timed = device, timed
        self.ms: Counter = Counter()
        self.phase = "rest"
        self._t0 = 0.0

    def sync(self) -> None:
        if self.timed:
            synchronize(self.device)

    def enter(self, phase: str) -> None:
        self.sync()
        self.phase, self._t0 = phase, time.perf_counter()

    def leave(self) -> None:
        self.sync()
        self.ms[self.phase] += (time.perf_counter() - self._t0) * 1e3
        self.phase = "rest"


class _TimedDrafter:
    """A drafter whose `draft` and `extend` report to a clock (the drafter protocol, forwarded)."""

    def __init__(self, drafter, clock: _Clock):
        self.drafter, self.clock = drafter, clock
        self.feature_layers = drafter.feature_layers

    def reset(self, capacity: int) -> None:
        self.drafter.reset(capacity)

    def extend(self, tokens, features, next_token) -> None:
        self.clock.enter("extend")
        self.drafter.extend(tokens, features, next_token)
        self.clock.leave()

    def draft(self, root: int):
        self.clock.enter("draft")
        tree = self.drafter.draft(root)
        self.clock.leave()
        return tree


class _OpCounter(TorchDispatchMode):
    def __init__(self, clock: _Clock):
        super().__init__()
        self.clock, self.ops = clock, Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        name = func.overloadpacket.__name__
        if not (func.is_view or name in _NO_KERNEL or (name == "to" and args and out is args[0])):
            self.ops[self.clock.phase] += 1
        return out


def _run(target, ids_list, drafter, max_new: int, sampling, count: bool) -> tuple[Counter, Counter, int, int]:
    """One pass over the prompts: (ms per phase, ops per phase, decode steps, tokens after the first)."""
    clock = _Clock(target.device, timed=not count)
    timed = _TimedDrafter(drafter, clock) if drafter is not None else None
    model = target.model
    hooks = [model.register_forward_pre_hook(lambda *_: clock.enter("target")),
             model.register_forward_hook(lambda *_: clock.leave())]
    counter = _OpCounter(clock) if count else None
    total_ms: Counter = Counter()
    ops: Counter = Counter()
    steps = tokens = 0
    try:
        for ids in ids_list:
            gen = generate(target, ids, drafter=timed, max_new_tokens=max_new, sampling=sampling)
            next(gen)  # the prefill is not a decode step
            clock.ms.clear()
            if counter is not None:
                counter.ops.clear()
            clock.sync()
            t0 = time.perf_counter()
            with counter if counter is not None else nullcontext():
                for trace in gen:
                    steps += 1
                    tokens += len(trace.tokens)
            clock.sync()
            wall = (time.perf_counter() - t0) * 1e3
            clock.ms["rest"] += wall - sum(clock.ms[p] for p in PHASES if p != "rest")
            total_ms.update(clock.ms)
            if counter is not None:
                ops.update(counter.ops)
    finally:
        for h in hooks:
            h.remove()
    return total_ms, ops, steps, tokens


def profile_steps(target, methods: dict, ids_list: list[torch.Tensor], max_new: int = 64, sampling=None) -> dict:
    """Per method (name -> drafter, None for vanilla): decode steps, tau, and per phase the mean ms
    and ops of one step, plus the whole step's. A warm-up pass comes first."""
    out = {}
    for name, drafter in methods.items():
        _run(target, ids_list[:1], drafter, 8, sampling, count=False)  # warm-up (and graph capture)
        ms, _, steps, tokens = _run(target, ids_list, drafter, max_new, sampling, count=False)
        if not steps:  # every reply ended with its first token (the prefill's): a mean of nothing
            raise FastEagleError(f"no decode step to profile: every reply ended at its first token (a stop "
                                 f"token, or max new tokens {max_new}); give more new tokens or other prompts")
        _, ops, _, _ = _run(target, ids_list, drafter, max_new, sampling, count=True)
        phases = {p: {"ms": round(ms[p] / steps, 3), "ops": round(ops[p] / steps, 1)}
                  for p in PHASES if drafter is not None or p in ("target", "rest")}
        out[name] = {"steps": steps, "tau": round(tau(tokens, steps), 3),
                     "step_ms": round(sum(ms.values()) / steps, 3),
                     "step_ops": round(sum(ops.values()) / steps, 1), "phases": phases}
    return out


def markdown(doc: dict) -> str:
    """The profile as a table: one row per method, `ms (ops)` per phase."""
    head = (f"**{doc['device']}**, target `{doc['target']}`, {doc['settings']['prompts_desc']} "
            f"{doc['settings']['max_new_tokens']} new tokens: mean per decode step, ms (dispatched ops)\n\n")
    lines = ["| method | tau | step | " + " | ".join(PHASES) + " |", "|---" * (3 + len(PHASES)) + "|"]
    for name, m in doc["methods"].items():
        cells = [f"{m['phases'][p]['ms']:.2f} ({m['phases'][p]['ops']:.0f})" if p in m["phases"] else "-"
                 for p in PHASES]
        lines.append(f"| {name} | {m['tau']:.2f} | {m['step_ms']:.2f} ({m['step_ops']:.0f}) | " + " | ".join(cells)
                     + " |")
    return head + "\n".join(lines) + "\n"
