"""The rate window: samples of a fold's cumulative counters over time, from which rates and the history come.

Two series of ``(time, counters)``: fine samples, 100 per window (512 kept: 5 windows), for the sliding window's
rates and windowed hit rates; coarse ones, one per history step, for the dashboard's sparklines. A sample holds
the counters as of the last instant seen (every record up to it folded), stamped with that instant: the record
that moved time on is not folded yet when :meth:`advance` takes it. One sample per step of time, and always one
before a gap, so a quiet stretch is a rate of zero, not an average over the silence.

Pure and small: the fold (kvtop/tiers/model.py) owns its counters and hands them in; nothing here knows what
they count.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable

Counters = tuple[int, ...]
Sample = tuple[float, Counters]

FINE_PER_WINDOW = 100
FINE_KEPT = 512


class RateWindow:
    def __init__(self, window_s: float, history_step_s: float, history_len: int):
        self.window_s = window_s
        self.history_step_s = history_step_s
        self._fine_step = window_s / FINE_PER_WINDOW
        self.fine: deque[Sample] = deque(maxlen=FINE_KEPT)
        self.coarse: deque[Sample] = deque(maxlen=max(2, history_len + 1))

    def advance(self, last: float, t: float, counters: Callable[[], Counters]) -> None:
        """Time moves from ``last`` to ``t``: take the samples that came due (``counters()`` only if one did)."""
        taken: Counters | None = None
        if not self.fine or t - self.fine[-1][0] >= self._fine_step:
            taken = counters()
            self.fine.append((last, taken))
        if not self.coarse or t - self.coarse[-1][0] >= self.history_step_s:
            self.coarse.append((last, taken if taken is not None else counters()))

    def reset(self, now: float | None, counters: Counters) -> None:
        """The window starts afresh at ``now`` (the history keeps its past): the dashboard's "r"."""
        self.fine.clear()
        if now is not None:
            self.fine.append((now, counters))

    def restart(self, now: float, counters: Counters) -> None:
        """Window and history both start at ``now``: what came before is a baseline, not moves of an instant."""
        self.fine.clear()
        self.coarse.clear()
        self.fine.append((now, counters))
        self.coarse.append((now, counters))

    def base(self, now: float | None) -> Sample | None:
        """The newest sample at or before the window's start (else the oldest): rates are taken from it to now."""
        if now is None or not self.fine:
            return None
        since = now - self.window_s
        for sample in reversed(self.fine):
            if sample[0] <= since:
                return sample
        return self.fine[0]

    def history(self, now: float | None, counters: Callable[[], Counters]) -> list[Sample]:
        """The coarse samples, oldest first, with ``now``'s counters last when time has moved on since."""
        samples = list(self.coarse)
        if now is not None and samples and now > samples[-1][0]:
            samples.append((now, counters()))
        return samples


__all__ = ["Counters", "RateWindow", "Sample"]
