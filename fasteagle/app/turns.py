"""The app's one decoder, taken in turns: first come, first served, with each waiting page's place in
line and an estimate of its wait.

Every decode the app runs (a page's run, a comparison of all methods, an example being cached in the
background) holds a turn for its whole length, so no decode's measured time includes another's. A
page's request goes ahead of background work that has not started yet. What does not decode, such as
an example replayed from the cache, takes no turn and never waits here.
"""

from __future__ import annotations

import itertools
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

QUIET_S = 8.0  # background work takes its turn only after this long with no page's decode


@dataclass(eq=False)
class Ticket:
    estimate_s: float  # how long its decode should take, from this machine's measured costs
    background: bool = False  # work nobody waits for: any page's request goes first
    started: float | None = None  # time.monotonic() when its turn came
    number: int = field(default_factory=itertools.count().__next__)


@dataclass(frozen=True)
class Place:
    ahead: int  # decodes before this one, the running one included (0: its turn)
    wait_s: float  # estimated seconds until its turn


class Turns:
    """The line at the decoder. `join` a ticket, `wait` until its turn (in short waits, so that a
    streaming page can show its place meanwhile), decode, then `leave` (also when the page is gone)."""

    def __init__(self):
        self._cond = threading.Condition()
        self._line: list[Ticket] = []  # _line[0] holds the decoder once started
        self._page_left = time.monotonic()  # when a page's turn last ended (at first: the start, so that
        # background work also leaves the first moments after a start to the first pages)

    def join(self, estimate_s: float, background: bool = False) -> Ticket:
        t = Ticket(max(float(estimate_s), 0.0), background)
        with self._cond:
            i = len(self._line)
            if not background:  # ahead of background work still waiting
                while i > 0 and self._line[i - 1].background and self._line[i - 1].started is None:
                    i -= 1
            self._line.insert(i, t)
            self._cond.notify_all()
        return t

    def wait(self, t: Ticket, timeout: float) -> bool:
        """True once it is `t`'s turn (it then holds the decoder until `leave`); False after `timeout`
        seconds of waiting."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._line and self._line[0] is t, timeout):
                return False
            if t.started is None:
                t.started = time.monotonic()
            return True

    def leave(self, t: Ticket) -> None:
        with self._cond:
            if t in self._line:
                self._line.remove(t)
                if not t.background:
                    self._page_left = time.monotonic()
            self._cond.notify_all()

    @contextmanager
    def background(self, estimate_s: float, quiet_s: float = QUIET_S) -> Iterator[Ticket]:
        """A background job's turn, held for the `with` block: taken once no page has held or waited for
        one for `quiet_s` seconds, so a visitor's run never shares the CPU with it."""
        while not self.quiet(quiet_s):
            time.sleep(1.0)
        t = self.join(estimate_s, background=True)
        try:
            while not self.wait(t, 5.0):
                pass
            yield t
        finally:
            self.leave(t)

    def quiet(self, seconds: float) -> bool:
        """No page holds or waits for a turn, and none has for `seconds`: background work may start."""
        with self._cond:
            busy = any(not t.background for t in self._line)
            return not busy and time.monotonic() - self._page_left >= seconds

    def place(self, t: Ticket) -> Place:
        """Where `t` stands: how many decodes are before it and about how long they take (the running
        one by what is left of its estimate)."""
        now = time.monotonic()
        with self._cond:
            ahead = self._line[:self._line.index(t)] if t in self._line else []
            wait = sum(max(a.estimate_s - (now - a.started), 0.5) if a.started is not None else a.estimate_s
                       for a in ahead)
        return Place(len(ahead), wait)

    def waiting(self) -> int:
        """Pages waiting for a turn (background work not counted)."""
        with self._cond:
            return sum(1 for t in self._line if t.started is None and not t.background)

    def idle(self) -> bool:
        with self._cond:
            return not self._line
