"""Exact nearest-rank percentiles of a latency (or any value) stream, since start and over a window: the
request fold's TTFT and end-to-end tracks, and the verdict's (kvtop/tiers/verdict.py)."""

from __future__ import annotations

import bisect
import math
from collections import deque

from kvtop.tiers.state import Latency

__all__ = ["LatencyTrack"]


class LatencyTrack:
    """Exact nearest-rank percentiles while the samples fit in the deque; a 1%-wide log histogram past that.

    Read at every dashboard refresh (TTFT and end to end, since start and over the window: four reads), so the
    reads must not walk every sample: sorting the 4,096 samples that fit, twice, and scanning all of them for the
    window, twice, cost ~0.5 ms a refresh on the dev box once a run had that many requests. The samples that fit
    are kept sorted as they come (``bisect.insort``: a C memmove of at most 4,096 pointers); the window is the
    newest samples, read from the newest back, while they came in time order."""

    _STEP = math.log(1.01)

    def __init__(self, maxlen: int):
        self.samples: deque[tuple[float, float]] = deque(maxlen=maxlen)
        self.hist: dict[int, int] = {}
        self.zeros = 0
        self.count = 0
        # every value so far, sorted, while they all fit in the deque (then the histogram answers); None after
        self._sorted: list[float] | None = []
        # whether the samples came in time order (each at or after the one before), so a window is a suffix
        self._in_order = True
        self._buckets: list[int] = []   # the histogram's buckets, sorted (a new one is rare once a run warms up)
        # The last window read, kept up to date between reads while the samples come in time order: its samples (a
        # suffix of ``samples``), their values sorted, and the ``since`` it was read at. A dashboard reads each
        # track's window once a refresh with a ``since`` that only moves forward, so a read drops the samples that
        # left the window and a new sample is added as it comes, where sorting the whole window each refresh was
        # ~0.1 ms a read at ~500 requests in a window (dev box). A ``since`` that moves back rebuilds it.
        self._win: deque[tuple[float, float]] | None = None
        self._win_sorted: list[float] = []
        self._win_since = math.inf

    def add(self, t: float, value: float) -> None:
        samples = self.samples
        if samples and t < samples[-1][0]:
            self._in_order = False   # several sources' clocks interleaved: windows scan every sample
            self._win = None
        win = self._win
        if win is not None:
            if len(win) == samples.maxlen:   # the deque drops its oldest sample now, and that one is in the window
                del self._win_sorted[bisect.bisect_left(self._win_sorted, win.popleft()[1])]
            win.append((t, value))           # read at the next window(), which drops it if it is before since
            bisect.insort(self._win_sorted, value)
        samples.append((t, value))
        self.count += 1
        if self._sorted is not None:
            if self.count <= len(self.samples):
                bisect.insort(self._sorted, value)
            else:
                self._sorted = None   # past the deque: the histogram's percentiles from here on
        if value <= 0.0:
            self.zeros += 1
        else:
            b = math.floor(math.log(value) / self._STEP)
            n = self.hist.get(b)
            if n is None:
                bisect.insort(self._buckets, b)
                n = 0
            self.hist[b] = n + 1

    @staticmethod
    def _rank(sorted_values: list[float], p: float) -> float:
        k = max(1, math.ceil(p / 100.0 * len(sorted_values)))
        return sorted_values[k - 1]

    def percentiles(self) -> Latency:
        if self.count == 0:
            return Latency()
        if self._sorted is not None:
            return Latency(self._rank(self._sorted, 50), self._rank(self._sorted, 99), self.count)
        return Latency(self._hist_rank(50), self._hist_rank(99), self.count)

    def _hist_rank(self, p: float) -> float:
        k = max(1, math.ceil(p / 100.0 * self.count))
        if k <= self.zeros:
            return 0.0
        seen = self.zeros
        for b in self._buckets:
            seen += self.hist[b]
            if seen >= k:
                return math.exp((b + 0.5) * self._STEP)  # the bucket's geometric middle: within 0.5%
        return math.exp((self._buckets[-1] + 0.5) * self._STEP)

    def window(self, since: float) -> Latency:
        if self._in_order and self.samples.maxlen:
            win = self._win
            if win is None or since < self._win_since:
                win = deque()
                for t, v in reversed(self.samples):
                    if t < since:
                        break
                    win.appendleft((t, v))
                self._win = win
                self._win_sorted = sorted(v for _, v in win)
            else:
                values = self._win_sorted
                while win and win[0][0] < since:
                    del values[bisect.bisect_left(values, win.popleft()[1])]
            self._win_since = since
            values = self._win_sorted
        else:
            values = sorted(v for t, v in self.samples if t >= since)
        if not values:
            return Latency()
        return Latency(self._rank(values, 50), self._rank(values, 99), len(values))
