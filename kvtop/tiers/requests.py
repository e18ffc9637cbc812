"""The request fold: kvtop's ``request`` records (one finished request each, from the workload driver or a
server's request log) into completed and failed counts, the last error, token totals, latency percentiles
(TTFT and end to end, since start and over the window) and the hit rate per request priority, split by the tier
that served it.

The first ``warmup_requests`` records are warm-up: counted, but left out of the percentiles and the per-priority
hit rates. Knows no other fold: the model hands in the block size (to turn prompt tokens into blocks).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from kvtop.tiers.common import Bad, describe, nonneg_count, nonneg_number, priority_in_range
from kvtop.tiers.latency import LatencyTrack
from kvtop.tiers.state import HitRate, RequestRow, Requests
from kvtop.tiers.verdict import TierEvidence

_LatencyTrack = LatencyTrack   # its name before it had a module of its own (tests, bench/bench_latency_reads.py)


# Where a finished request's prompt prefix came from, slowest tier first: "disk_hit" when any reused block came
# from disk, "host_hit" when any came from host memory, "gpu_hit" when blocks were reused and all from the GPU,
# "miss" when none was reused (kvtop report, the dashboard's TTFT rows and the JSON summary use the same classes).
PREFIX_SOURCES = ("gpu_hit", "host_hit", "disk_hit", "miss")
# Finished requests the requests view keeps (a row each, ~200 bytes): the newest; the counts and percentiles above
# cover them all.
RECENT_REQUESTS = 500


def _record_count(data: dict[str, Any], *keys: str) -> int | None:
    for k in keys:
        v = data.get(k)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


def prefix_source(data: dict[str, Any]) -> str | None:
    """A request record's prefix source (PREFIX_SOURCES); None when the record does not say (no block counts).
    The host's blocks: ``host_hit_blocks`` (TensorRT-LLM's ``num_onboarded_blocks``, as the driver writes it) or
    the older ``onboarded_blocks``; the disk's: ``disk_hit_blocks``."""
    reused = _record_count(data, "reused_blocks")
    if reused is None:
        return None
    if _record_count(data, "disk_hit_blocks"):
        return "disk_hit"
    if _record_count(data, "host_hit_blocks", "onboarded_blocks"):
        return "host_hit"
    return "gpu_hit" if reused > 0 else "miss"


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
        # TTFT by where the prefix came from (PREFIX_SOURCES), finished requests past warm-up that say it
        self.ttft_by_source = {s: LatencyTrack(latency_samples) for s in PREFIX_SOURCES}
        # the verdict's evidence (kvtop/tiers/verdict.py): per tier below the GPU, its hit requests
        self.tier_evidence = {"host": TierEvidence(), "disk": TierEvidence()}
        self.recent: deque[RequestRow] = deque(maxlen=RECENT_REQUESTS)
        self._recent_made: tuple[RequestRow, ...] | None = None   # tuple(recent) until the next record

    def apply(self, data: dict[str, Any], t: float) -> None:
        """One ``request`` record's data at time ``t``; validates everything before changing anything."""
        ok = data.get("ok")
        if not isinstance(ok, bool):
            raise Bad("ok", f"must be true/false, got {describe(ok)}")
        rid = data.get("request_id")
        if isinstance(rid, bool) or not isinstance(rid, (int, str)):
            raise Bad("request_id", f"must be an integer or a string, got {describe(rid)}")
        ttft = nonneg_number(data.get("ttft_s"), "ttft_s")
        e2e = nonneg_number(data.get("e2e_s"), "e2e_s")
        prompt = nonneg_count(data.get("prompt_tokens"), "prompt_tokens")
        output = nonneg_count(data.get("output_tokens"), "output_tokens")
        reused = nonneg_count(data.get("reused_blocks"), "reused_blocks")
        # Its host hits: the driver writes TensorRT-LLM's num_onboarded_blocks as host_hit_blocks (and so do the
        # recordings); onboarded_blocks is the older spelling. Reading only the latter left every per-priority
        # host share at 0% while a third of the hits came from the host tier.
        onboarded = nonneg_count(data.get("host_hit_blocks"), "host_hit_blocks")
        if onboarded is None:
            onboarded = nonneg_count(data.get("onboarded_blocks"), "onboarded_blocks")
        from_disk = nonneg_count(data.get("disk_hit_blocks"), "disk_hit_blocks")
        prio = data.get("priority")
        if prio is not None:
            prio = priority_in_range(prio, "priority")
        err = data.get("error")
        if err is not None and not isinstance(err, str):
            raise Bad("error", f"must be a string or null, got {describe(err)}")

        self.records += 1  # the model counts it into its warm-up state after this record
        # The tiers of its reused blocks: the host's and the disk's as the record says (a record without disk
        # blocks had none: prefix_source reads it so), the GPU's the rest; unknown where the host's is.
        host = None if reused is None or onboarded is None else min(onboarded, reused)
        disk = None if reused is None else min(from_disk or 0, reused)
        gpu = None if host is None or disk is None or reused is None else max(reused - host - disk, 0)
        self.recent.append(RequestRow(str(rid), "done" if ok else "failed", t, prompt, output, reused, gpu, host,
                                      disk, ttft, e2e, prio, None if ok else (err or "failed")))
        self._recent_made = None
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
        if ok and ttft is not None and reused is not None:
            host, disk = min(onboarded or 0, reused), min(from_disk or 0, reused)
            source = "disk_hit" if disk else "host_hit" if host else "gpu_hit" if reused else "miss"
            self.ttft_by_source[source].add(t, ttft)
            if host:
                self.tier_evidence["host"].add(ttft, host)
            if disk:
                self.tier_evidence["disk"].add(ttft, disk)
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

    def requests(self, now: float | None, window_s: float, in_flight: int | None,
                 running: tuple[RequestRow, ...] = ()) -> Requests:
        """The counts and latencies, the windowed ones over ``[now - window_s, now]``; ``running``: the engine's
        requests in flight (kvtop.tiers.stats)."""
        since = (now - window_s) if now is not None else float("-inf")
        recent = self._recent_made
        if recent is None:
            recent = self._recent_made = tuple(self.recent)
        return Requests(self.completed, self.failed, self.warm_records, in_flight,
                        self.ttft.percentiles(), self.e2e.percentiles(), self.ttft.window(since),
                        self.e2e.window(since), self.prompt_tokens, self.output_tokens, self.last_error,
                        tuple((s, tr.percentiles(), tr.window(since))
                              for s, tr in self.ttft_by_source.items() if tr.count), recent, running)
