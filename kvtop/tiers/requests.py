"""The request fold: kvtop's ``request`` records (one finished request each, from the workload driver or a
server's request log) into completed and failed counts, the last error, token totals, latency percentiles
(TTFT and end to end, since start and over the window) and the hit rate per request priority, split by the tier
that served it.

The first ``warmup_requests`` records are warm-up: counted, but left out of the percentiles and the per-priority
hit rates. Knows no other fold: the model hands in the block size (to turn prompt tokens into blocks).
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Callable
from typing import Any

from kvtop.tiers.common import _Bad, _count, _describe, _number, _priority
from kvtop.tiers.state import HitRate, Latency, Requests


class _LatencyTrack:
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


# ------------------------------------------------------------------------------------------------ the fold


class RequestFold:
    """``request`` records -> counts, latencies and per-priority hit rates (see the module docstring)."""

    def __init__(self, warmup_requests: int, latency_samples: int, tokens_per_block: Callable[[], int | None]):
        self.warmup_requests = warmup_requests
        self._tokens_per_block = tokens_per_block  # the model's (meta's, else the stats')
        self.records = 0
        self.completed = 0
        self.failed = 0
        self.warm_records = 0
        self.prompt_tokens = 0
        self.output_tokens = 0
        self.last_error: str | None = None
        self.ttft = _LatencyTrack(latency_samples)
        self.e2e = _LatencyTrack(latency_samples)
        # request priority -> [reused blocks, prompt blocks, requests, onboarded (host-hit) blocks]
        self.by_priority: dict[int | None, list[int]] = {}

    def apply(self, data: dict[str, Any], t: float) -> None:
        """One ``request`` record's data at time ``t``; validates everything before changing anything."""
        ok = data.get("ok")
        if not isinstance(ok, bool):
            raise _Bad("ok", f"must be true/false, got {_describe(ok)}")
        rid = data.get("request_id")
        if isinstance(rid, bool) or not isinstance(rid, (int, str)):
            raise _Bad("request_id", f"must be an integer or a string, got {_describe(rid)}")
        ttft = _number(data.get("ttft_s"), "ttft_s")
        e2e = _number(data.get("e2e_s"), "e2e_s")
        prompt = _count(data.get("prompt_tokens"), "prompt_tokens")
        output = _count(data.get("output_tokens"), "output_tokens")
        reused = _count(data.get("reused_blocks"), "reused_blocks")
        # Its host hits: the driver writes TensorRT-LLM's num_onboarded_blocks as host_hit_blocks (and so do the
        # recordings); onboarded_blocks is the older spelling. Reading only the latter left every per-priority
        # host share at 0% while a third of the hits came from the host tier.
        onboarded = _count(data.get("host_hit_blocks"), "host_hit_blocks")
        if onboarded is None:
            onboarded = _count(data.get("onboarded_blocks"), "onboarded_blocks")
        prio = data.get("priority")
        if prio is not None:
            prio = _priority(prio, "priority")
        err = data.get("error")
        if err is not None and not isinstance(err, str):
            raise _Bad("error", f"must be a string or null, got {_describe(err)}")

        self.records += 1  # the model counts it into its warm-up state after this record
        warm = self.records <= self.warmup_requests
        if ok:
            self.completed += 1
        else:
            self.failed += 1
            self.last_error = err or "failed"
        self.prompt_tokens += prompt or 0
        self.output_tokens += output or 0
        if warm:
            self.warm_records += 1
            return
        if ok:
            if ttft is not None:
                self.ttft.add(t, ttft)
            if e2e is not None:
                self.e2e.add(t, e2e)
        tpb = self._tokens_per_block()
        if ok and reused is not None and prompt and tpb:
            acc = self.by_priority.get(prio)
            if acc is None:
                acc = self.by_priority[prio] = [0, 0, 0, 0]
            acc[0] += reused
            acc[1] += -(-prompt // tpb)
            acc[2] += 1
            acc[3] += min(onboarded or 0, reused)

    # ============================================================================================ read side

    def hit_rate_by_priority(self) -> dict[int | None, float]:
        """Per request priority (``request`` records' ``priority``): reused / prompt blocks of finished requests,
        warm-up excluded."""
        return {p: acc[0] / acc[1] for p, acc in self.by_priority.items() if acc[1] > 0}

    def hit_split_by_priority(self) -> dict[int | None, HitRate]:
        """``hit_rate_by_priority`` split by serving tier: the host share from the requests' ``onboarded_blocks``
        (reused blocks that were onboarded), when the driver reports it."""
        out: dict[int | None, HitRate] = {}
        for p, (reused, blocks, _n, onboarded) in self.by_priority.items():
            if blocks > 0:
                out[p] = HitRate(cumulative=reused / blocks, gpu=(reused - onboarded) / blocks,
                                 host=onboarded / blocks, hits=reused, lookups=blocks, host_hits=onboarded)
        return out

    def requests(self, now: float | None, window_s: float, in_flight: int | None) -> Requests:
        """The counts and latencies, the windowed ones over ``[now - window_s, now]``."""
        since = (now - window_s) if now is not None else float("-inf")
        return Requests(self.completed, self.failed, self.warm_records, in_flight,
                        self.ttft.percentiles(), self.e2e.percentiles(), self.ttft.window(since),
                        self.e2e.window(since), self.prompt_tokens, self.output_tokens, self.last_error)
