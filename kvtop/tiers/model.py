"""TierModel: the fold from kvtop records to the per-tier state a person wants to see.

Pure: no I/O, no clock of its own (``record.time``, or the ``t`` passed in, is "now"), no Textual or Rich. Every
sink reads it; only the source side feeds it.

What each number means (exactly; trtllm-kv.md sections 1, 2, 6 and 8 say why):

- ``capacity_blocks``: the pool's size. From newer stats' ``primaryMaxNumBlocks`` / ``secondaryMaxNumBlocks`` when
  present (live, per window, summed), else the ``created`` event's ``num_blocks_per_cache_level`` (summed over
  attention windows), else ``meta`` (``primary_blocks`` / ``secondary_blocks``), else derived from 1.0-1.2's
  ``maxNumBlocks``, which is primary + secondary: either tier's size gives the other's. Otherwise unknown: with no
  pool sizes, ``maxNumBlocks`` alone cannot say how much of it is host memory.
- ``free_blocks``: TensorRT-LLM's "free": held by no request, empty or cached-and-evictable. GPU:
  ``freeNumBlocks``. Host: ``capacity - in_use``.
- ``in_use_blocks``: GPU: ``capacity - freeNumBlocks`` (never ``usedNumBlocks``, which in 1.0-1.2 is
  ``maxNumBlocks - freeNumBlocks`` and so counts the whole host pool: issue #3376's record has used 5495 with only
  250 GPU blocks held). Host: 0 (host blocks are always free in TensorRT-LLM 1.2: one leaves the host free queue
  only inside a single offload or onboard, which puts another one back before it returns), or newer stats'
  ``secondaryMaxNumBlocks - secondaryFreeNumBlocks``.
- ``cached_blocks``: blocks in the reuse tree whose memory is in that tier, folded from ``stored`` (cache_level per
  block), ``removed`` and ``updated`` (cache_level 0->1 offload, 1->0 onboard) events keyed by block hash. On the
  GPU some of these are also in use (a running request holds its reused and stored blocks).
- Moves: ``updated`` 0->1 is an offload, 1->0 an onboard (counted from the event itself, known hash or not);
  ``removed`` of a block the fold holds as GPU-resident is a GPU eviction, host-resident a host eviction (a host
  block that is the target of a new offload is dropped from the host tier, whatever its block object becomes).
  Newer TensorRT-LLM stats (``kvCacheIterationStats``: ``iterOffloadBlocks``, ``iterOnboardBlocks``,
  ``iterHostDroppedBlocks``) are used instead when present: they also count the offloads no event shows.
- Hit rate: from the stats counters ``reusedBlocks`` / ``missedBlocks`` (cumulative in the engine, so diffed),
  warm-up excluded. Host hits are onboards (every onboard is a reused block served from host memory); GPU hits
  are the rest. Both are fractions of all block lookups, so ``gpu + host == cumulative``.

Warm-up: the first ``warmup_requests`` finished requests are warm-up. The finished count is the larger of the sum
of the stats' ``numCompletedRequests`` (per iteration) and the number of ``request`` records: either source alone
is enough, and with both the larger one is the one that has seen more. Counter deltas (hits, lookups, onboards)
are warm-up while that count is below ``warmup_requests``, including the delta of the stats record that reports the
last warm-up completion. The first ``warmup_requests`` request records are left out of the latency percentiles.

Data quality (``quality``), never hidden:

- An event id gap means the engine's event buffer overflowed and dropped events: counted, and every count folded
  from events is approximate from then on (``counts_approximate``). Attaching mid-stream (first id > 0) is the
  same. A ``created`` event with id 0 after that (an engine restart) makes the fold exact again.
- A host pool but no event stream: host in-use, cached and free are ``None`` (unknown), never 0.
- Counters going backwards (or ``iter`` going backwards): the engine restarted; the new values are the deltas.
- Unknown hashes in ``removed`` / ``updated`` are counted and make counts approximate; nothing goes negative.
- The known hole: TensorRT-LLM 1.2 takes a cached block out of the reuse tree with no event when a prompt
  partially matches it and it is an idle leaf (trtllm-kv.md 2.3). The fold then still holds it, so cached counts
  can only be too high, by at most the number of such detaches. They are reconciled when an event proves the
  block gone: a ``stored`` event that re-uses its hash (the tree never holds one hash twice), or the ``removed``
  of its parent (``freeChildren`` removes children first, so a child still in the fold when its parent goes was
  already gone). Reported cached counts are clamped to the tier's capacity, and the fold's own map is bounded
  (``_PRUNE_FACTOR``). Since any reuse may have been such a partial match, ``cached_approximate`` is set once a
  reuse is observed (a hit in the stats or an onboard), and means "an upper bound, possibly above the truth".
- Per-priority cached counts drift in two more ways no event shows: timed priorities that lapse back to 35, and
  TensorRT-LLM's ``updated`` priority event for a partially matched block that is then copied rather than reused
  (``loadOrAllocateBlocks`` enqueues the event before its partial-match branch; the copied block keeps its
  priority). Both are counted in the truth test (tests/test_tiers.py).

The fold is a package of small folds, each owning its state, that this module composes: the KV event fold and
its hot path (kvtop/tiers/events.py), the field checks and the shared ledger (kvtop/tiers/common.py), the rate
window (kvtop/tiers/window.py). Everything the dashboard reads (``gpu``, ``host``, ``rates``, ``summary()``...)
is built on read, 4 times a second.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Iterable
from dataclasses import replace
from typing import Any

from kvtop.records import Record, RecordError, parse_engine_dict
from kvtop.tiers.common import Ledger, _Bad, _count, _describe, _number, _priority, _required_count
from kvtop.tiers.events import GPU, HOST, EventFold
from kvtop.tiers.snapshot import TierSnapshot, Version
from kvtop.tiers.snapshot import take as take_snapshot
from kvtop.tiers.state import (
    GpuDevice,
    HistoryPoint,
    HitRate,
    HostMemory,
    Latency,
    Moves,
    Quality,
    Rates,
    Requests,
    TierState,
)
from kvtop.tiers.window import RateWindow

# The read-side types live in kvtop.tiers.state (re-exported by kvtop.tiers); this module exports only the fold.
__all__ = ["TierModel"]

STREAM_KINDS = ("kv_batch", "metrics", "summary")  # folded by kvtop/kv_stream.py
_MAX_GPUS = 64  # gpu records keep one entry per device index; more than this is a malformed stream


class _LatencyTrack:
    """Exact nearest-rank percentiles while the samples fit in the deque; a 1%-wide log histogram past that."""

    _STEP = math.log(1.01)

    def __init__(self, maxlen: int):
        self.samples: deque[tuple[float, float]] = deque(maxlen=maxlen)
        self.hist: dict[int, int] = {}
        self.zeros = 0
        self.count = 0

    def add(self, t: float, value: float) -> None:
        self.samples.append((t, value))
        self.count += 1
        if value <= 0.0:
            self.zeros += 1
        else:
            b = math.floor(math.log(value) / self._STEP)
            self.hist[b] = self.hist.get(b, 0) + 1

    @staticmethod
    def _rank(sorted_values: list[float], p: float) -> float:
        k = max(1, math.ceil(p / 100.0 * len(sorted_values)))
        return sorted_values[k - 1]

    def percentiles(self) -> Latency:
        if self.count == 0:
            return Latency()
        if self.count <= len(self.samples):
            values = sorted(v for _, v in self.samples)
            return Latency(self._rank(values, 50), self._rank(values, 99), self.count)
        return Latency(self._hist_rank(50), self._hist_rank(99), self.count)

    def _hist_rank(self, p: float) -> float:
        k = max(1, math.ceil(p / 100.0 * self.count))
        if k <= self.zeros:
            return 0.0
        seen = self.zeros
        for b in sorted(self.hist):
            seen += self.hist[b]
            if seen >= k:
                return math.exp((b + 0.5) * self._STEP)  # the bucket's geometric middle: within 0.5%
        return math.exp((max(self.hist) + 0.5) * self._STEP)

    def window(self, since: float) -> Latency:
        values = sorted(v for t, v in self.samples if t >= since)
        if not values:
            return Latency()
        return Latency(self._rank(values, 50), self._rank(values, 99), len(values))


# ------------------------------------------------------------------------------------------------ the fold

class TierModel:
    """Folds kvtop records (or raw TensorRT-LLM stats and event dicts) into per-tier state. See the module doc."""

    def __init__(self, warmup_requests: int = 0, window_s: float = 10.0, *, history_step_s: float = 1.0,
                 history_len: int = 600, latency_samples: int = 4096):
        if warmup_requests < 0:
            raise ValueError(f"warmup_requests: must be >= 0, got {warmup_requests}")
        if not window_s > 0:
            raise ValueError(f"window_s: must be > 0, got {window_s}")
        if not history_step_s > 0:
            raise ValueError(f"history_step_s: must be > 0, got {history_step_s}")
        self.warmup_requests = warmup_requests
        self._warming = warmup_requests > 0  # kept current by _update_warming (read on the hot path)
        self.window_s = float(window_s)
        self.history_step_s = float(history_step_s)
        self._reuse_seen = False  # a reuse in the stats or the engines' stream (the events' own: EventFold)

        # rate samples (fine ones for the window, coarse ones for the history), and the ledger every fold writes:
        # now, records in, folded and bad (kvtop/tiers/window.py, kvtop/tiers/common.py)
        self._window = RateWindow(self.window_s, self.history_step_s, history_len)
        self._ledger = Ledger(self._window, self._counters)
        self._tick = self._ledger.tick
        self._bad = self._ledger.bad

        # the folds, each owning its state
        self.event_fold = EventFold(self._ledger)  # kvtop/tiers/events.py
        # the hot path, bound here so that a call costs what it cost when it was this class's method
        self.apply_kv_event = self.event_fold.apply
        self.event_fold.warming = self._warming

        # stats
        self._last_kv: dict[str, int | None] = {}
        self._last_iter: int | None = None
        self._stats_restarts = 0
        self._iter_missing = 0                 # iterations absent from the stats stream (gaps in "iter")
        self._max_num_blocks: int | None = None
        self._free_num_blocks: int | None = None
        self._stats_tpb: int | None = None
        self._it: dict[str, int] | None = None   # latest kvCacheIterationStats gauges, summed over windows
        self._it_offloaded = 0
        self._it_onboarded = 0
        self._it_host_dropped = 0
        self._it_moves_seen = False
        self._stats_schema: str | None = None     # which TensorRT-LLM's stats shape the numbers come from
        self._prom_seen = False                    # stats mapped from trtllm-serve's Prometheus metrics
        self._prom_bytes = [0, 0]                  # offloaded, onboarded bytes from Prometheus counters
        self._prom_blocks = [0, 0]                 # ...and the whole blocks already counted from them
        self._level_tiers: list[str] | None = None  # kvCacheLevelTiers (V2): the tier of each cache level
        self._level_hits: dict[int, int] = {}     # reused blocks per cache level (V2 lifecycles), warm-up excluded
        self._stats_completed = 0
        self._in_flight: int | None = None
        self._ctx_tokens = 0
        self._gen_tokens = 0
        self._gpu_mem_usage: int | None = None
        self._pinned_mem_usage: int | None = None

        # hits: totals past warm-up, and what warm-up took
        self._hits = 0
        self._lookups = 0
        self._warm_hits = 0
        self._warm_lookups = 0
        # Host hits = onboards: from the events (1.0-1.2, EventFold.host_hits), or from newer stats'
        # iterOnboardBlocks, which win when present (they line up with the hit counters). Kept apart so that having
        # both never counts twice.
        self._st_host_hits = 0
        self._st_warm_host_hits = 0

        # requests
        self._req_records = 0
        self._completed = 0
        self._failed = 0
        self._warm_records = 0
        self._prompt_tokens = 0
        self._output_tokens = 0
        self._last_error: str | None = None
        self._ttft = _LatencyTrack(latency_samples)
        self._e2e = _LatencyTrack(latency_samples)
        # request priority -> [reused blocks, prompt blocks, requests, onboarded (host-hit) blocks]
        self._prio_req: dict[int | None, list[int]] = {}

        # meta, gpu, host
        self.meta: dict[str, Any] = {}
        self._gpus: dict[int, GpuDevice] = {}
        self.gpu_error: str | None = None
        self._host_mem: HostMemory | None = None

        # the engines' common KV event stream (vLLM, SGLang, Dynamo), their metrics, agent summaries:
        # kvtop/kv_stream.py, created on the first such record
        self._stream: Any = None

        # what readers on other threads read: the last snapshot taken (kvtop/tiers/snapshot.py)
        self.published: TierSnapshot | None = None
        self._window_resets = 0

    # ============================================================================================ entry points

    def apply(self, record: Record) -> None:
        """Any kvtop record; ``record.time`` is "now". Never raises: bad input is counted in ``bad_records``."""
        self._ledger.touched += 1
        try:
            kind = record.kind
            data = record.data
            t = record.time
        except AttributeError:
            self._bad("record", f"must be a kvtop Record, got {type(record).__name__}")
            return
        if kind == "kv_event":
            self.apply_kv_event(data, t)
        elif kind == "stats":
            self.apply_stats(data, t)
        elif kind in STREAM_KINDS:
            self._apply_stream(kind, data, t)
        elif kind in ("meta", "gpu", "host", "request"):
            if not self._tick(t):
                return
            if not isinstance(data, dict):
                self._bad("data", f"must be an object, got {_describe(data)}")
                return
            try:
                if kind == "meta":
                    self._apply_meta(data)
                elif kind == "request":
                    self._apply_request(data, float(t))
                elif kind == "gpu":
                    self._apply_gpu(data, float(t))
                else:
                    self._apply_host(data, float(t))
            except _Bad as exc:
                self._bad(f"data.{exc.field}", exc.problem)
                return
            except Exception as exc:  # never into the consumer; name what broke
                self._bad("data", f"{type(exc).__name__}: {exc}")
                return
            self._ledger.applied += 1
        else:
            self._bad("kind", f"must be one of meta, stats, kv_event, gpu, host, request, "
                              f"{', '.join(STREAM_KINDS)}, got {_describe(kind)}")

    def _apply_stream(self, kind: str, data: Any, t: Any) -> None:
        """A ``kv_batch``, ``metrics`` or ``summary`` record: folded by kvtop/kv_stream.py into this model."""
        if not self._tick(t):
            return
        if not isinstance(data, dict):
            self._bad("data", f"must be an object, got {_describe(data)}")
            return
        if self._stream is None:
            from kvtop.kv_stream import StreamFold

            self._stream = StreamFold(self)
        try:
            self._stream.apply(kind, data)
        except Exception as exc:  # never into the consumer; name what broke
            self._bad("data", f"{type(exc).__name__}: {exc}")
            return
        self._ledger.applied += 1

    def apply_kv_events(self, events: Iterable[Any], t: float | None = None) -> None:
        for ev in events:
            self.apply_kv_event(ev, t)

    def apply_records(self, records: Iterable[Record]) -> None:
        for r in records:
            self.apply(r)

    def apply_stats(self, stats: Any, t: float | None = None) -> None:
        """One TensorRT-LLM iteration-stats dict (or its JSON string, as 1.x's docstring shows)."""
        self._ledger.touched += 1
        if t is not None and not self._tick(t):
            return
        try:
            d = parse_engine_dict(stats, "stats")
            self._apply_stats(d)
        except RecordError as exc:
            self._bad(exc.field, exc.problem)
            return
        except _Bad as exc:
            self._bad(f"stats.{exc.field}", exc.problem)
            return
        except Exception as exc:
            self._bad("stats", f"{type(exc).__name__}: {exc}")
            return
        self._ledger.applied += 1

    def reset_window(self) -> None:
        """Start the rate window afresh at ``now`` (the dashboard's "r")."""
        self._window_resets += 1
        self._window.reset(self.now, self._counters())

    @property
    def now(self) -> float | None:
        """The newest record time seen ("now": the fold has no clock of its own), None before any."""
        return self._ledger.now

    @property
    def records_applied(self) -> int:
        return self._ledger.applied

    @property
    def bad_records(self) -> int:
        """Records that could not be folded (each one counted, none raised into the caller)."""
        return self._ledger.bad_records

    @property
    def last_bad_reason(self) -> str | None:
        """Why the last bad record was bad: the field and the problem, one line."""
        return self._ledger.last_bad_reason

    @property
    def version(self) -> Version:
        """Moves whenever what a reader sees may have changed: every record handed in (folded, bad, or a duplicate
        that only a quality count notes), every window reset."""
        led = self._ledger
        return (led.touched, led.bad_records, self._window_resets)

    def snapshot(self) -> TierSnapshot:
        """The model now, immutable, and published as ``self.published`` for readers on other threads. Call it
        on the folding thread; a model that did not change since the last call hands out the same snapshot."""
        version = self.version
        snap = self.published
        if snap is None or snap.version != version:
            snap = self.published = take_snapshot(self, version)
        return snap

    # ============================================================================================ stats

    def _apply_stats(self, d: dict[str, Any]) -> None:
        # Validate everything used before changing anything.
        kv = d.get("kvCacheStats")
        if kv is not None and not isinstance(kv, dict):
            raise _Bad("kvCacheStats", f"must be an object, got {_describe(kv)}")
        kvv: dict[str, int | None] = {}
        if kv is not None:
            for key in ("maxNumBlocks", "freeNumBlocks", "usedNumBlocks", "tokensPerBlock", "allocTotalBlocks",
                        "allocNewBlocks", "reusedBlocks", "missedBlocks"):
                kvv[key] = _count(kv.get(key), f"kvCacheStats.{key}")
        it_iter, schema, level_tiers, level_hits = self._kv_iteration(d, kv is not None)
        prom_moves: dict[str, int] | None = None
        raw_moves = d.get("kvtopPrometheusMoves") if d.get("kvtopSource") == "prometheus" else None
        if raw_moves is not None:
            if not isinstance(raw_moves, dict):
                raise _Bad("kvtopPrometheusMoves", f"must be an object, got {_describe(raw_moves)}")
            prom_moves = {k: _required_count(raw_moves[k], f"kvtopPrometheusMoves.{k}")
                          for k in ("offloadBytes", "onboardBytes") if k in raw_moves}
        iteration = _count(d.get("iter"), "iter")
        completed = _count(d.get("numCompletedRequests"), "numCompletedRequests")
        active = _count(d.get("numActiveRequests"), "numActiveRequests")
        queued = _count(d.get("numQueuedRequests"), "numQueuedRequests")
        gpu_mem = _count(d.get("gpuMemUsage"), "gpuMemUsage")
        pinned = _count(d.get("pinnedMemUsage"), "pinnedMemUsage")
        ifb = d.get("inflightBatchingStats")
        if ifb is not None and not isinstance(ifb, dict):
            raise _Bad("inflightBatchingStats", f"must be an object, got {_describe(ifb)}")
        ctx_tokens = _count(ifb.get("numCtxTokens"), "inflightBatchingStats.numCtxTokens") if ifb else None
        gen_reqs = _count(ifb.get("numGenRequests"), "inflightBatchingStats.numGenRequests") if ifb else None

        # An engine restart: iter or a cumulative counter went backwards. The new values are then the deltas.
        last = self._last_kv
        restarted = iteration is not None and self._last_iter is not None and iteration < self._last_iter
        for key in ("reusedBlocks", "missedBlocks", "allocTotalBlocks"):
            v, lv = kvv.get(key), last.get(key)
            if v is not None and lv is not None and v < lv:
                restarted = True
        if restarted:
            self._stats_restarts += 1
            last = {}
        elif iteration is not None and self._last_iter is not None and iteration > self._last_iter + 1:
            # Iterations that never reached kvtop: another reader of the drain-once stats queue (the user's own
            # get_stats, trtllm-serve's collector loop) or the queue overflowing. Per-iteration sums undercount.
            self._iter_missing += iteration - self._last_iter - 1
        if iteration is not None:
            self._last_iter = iteration

        # Completions first: the record that reports the last warm-up completion is still warm-up.
        was_warm = self._warming
        if completed:
            self._stats_completed += completed
            self._update_warming()

        def delta(key: str) -> int:
            v = kvv.get(key)
            if v is None:
                return 0
            lv = last.get(key)
            return v - (lv or 0)

        if kv is not None and (kvv.get("reusedBlocks") is not None or kvv.get("missedBlocks") is not None):
            dr, dm = delta("reusedBlocks"), delta("missedBlocks")
        elif it_iter is not None:
            dr, dm = it_iter.get("iterReusedBlocks", 0), it_iter.get("iterMissedBlocks", 0)
        else:
            dr = dm = 0
        if dr > 0:
            self._reuse_seen = True
        if was_warm:
            self._warm_hits += dr
            self._warm_lookups += dr + dm
        else:
            self._hits += dr
            self._lookups += dr + dm
        for key, v in kvv.items():
            if v is not None:
                last[key] = v
        self._last_kv = last

        if kv is not None:
            if kvv["maxNumBlocks"] is not None:
                self._max_num_blocks = kvv["maxNumBlocks"]
            if kvv["freeNumBlocks"] is not None:
                self._free_num_blocks = kvv["freeNumBlocks"]
            if kvv["tokensPerBlock"]:
                self._stats_tpb = kvv["tokensPerBlock"]
        if prom_moves:
            # Bytes moved, from trtllm-serve's Prometheus counters: blocks from the running byte totals, so partial
            # copies add up rather than being floored away scrape by scrape.
            bpb = self.bytes_per_block
            if bpb is not None:
                self._it_moves_seen = True
                self._prom_bytes[0] += prom_moves.get("offloadBytes", 0)
                self._prom_bytes[1] += prom_moves.get("onboardBytes", 0)
                off, onb = self._prom_bytes[0] // bpb - self._prom_blocks[0], self._prom_bytes[1] // bpb - \
                    self._prom_blocks[1]
                self._prom_blocks = [self._prom_blocks[0] + off, self._prom_blocks[1] + onb]
                self._it_offloaded += off
                self._it_onboarded += onb
                if was_warm:
                    self._st_warm_host_hits += onb
                else:
                    self._st_host_hits += onb
        if d.get("kvtopSource") == "prometheus":
            self._prom_seen = True  # trtllm-serve's Prometheus metrics, mapped (kvtop/sources/trtllm_prometheus.py)
        elif schema is not None:
            self._stats_schema = schema
        if level_tiers is not None:
            self._level_tiers = level_tiers
        if level_hits is not None and not was_warm:
            for i, n in enumerate(level_hits):
                self._level_hits[i] = self._level_hits.get(i, 0) + n
        if it_iter is not None:
            self._it = it_iter
            if any(k in it_iter for k in ("iterOffloadBlocks", "iterOnboardBlocks", "iterHostDroppedBlocks")):
                self._it_moves_seen = True
                self._it_offloaded += it_iter.get("iterOffloadBlocks", 0)
                onb = it_iter.get("iterOnboardBlocks", 0)
                self._it_onboarded += onb
                self._it_host_dropped += it_iter.get("iterHostDroppedBlocks", 0)
                # Host hits from the stats' own onboard counter: exact, and aligned with the hit counters.
                if was_warm:
                    self._st_warm_host_hits += onb
                else:
                    self._st_host_hits += onb
        if active is not None or queued is not None:
            self._in_flight = (active or 0) + (queued or 0)
        if ctx_tokens:
            self._ctx_tokens += ctx_tokens
        if gen_reqs:
            self._gen_tokens += gen_reqs
        if gpu_mem is not None:
            self._gpu_mem_usage = gpu_mem
        if pinned is not None:
            self._pinned_mem_usage = pinned

    def _kv_iteration(self, d: dict[str, Any], has_kv: bool) -> tuple[dict[str, int] | None, str | None,
                                                                      list[str] | None, list[int] | None]:
        """The newer stats' views, summed: (gauges and counters, which schema, tier names per cache level,
        reused blocks per cache level this iteration). Checked whole before anything changes.

        TensorRT-LLM 1.3 with the V1 manager: ``kvCacheIterationStats`` per window holds everything
        (tensorrt_llm/executor/stats_serialization.py). With the V2 manager (tensorrt_llm/_torch/pyexecutor/
        kv_cache_stats.py, ``append_kv_cache_iteration_stats``) the window view drops the cold tiers and a pool
        shared by windows reads 0 there, so, as TensorRT-LLM's own Prometheus collector does
        (tensorrt_llm/metrics/collector.py): GPU gauges and move counters from
        ``kvCacheIterationStatsByPoolGroup``, cold (host + disk, summed over cold levels) gauges from
        ``kvCacheIterationStatsByColdPoolGroup``, reuse from the attention lifecycles (else the windows), and
        the tier of each cache level from ``kvCacheLevelTiers``.
        """
        windows = self._iteration_stats(d.get("kvCacheIterationStats"))
        by_pool = d.get("kvCacheIterationStatsByPoolGroup")
        if by_pool is None:
            if windows is None:
                return None, ("1.0-1.2" if has_kv else None), None, None
            return windows, "1.3", None, None
        pools = self._iteration_stats(by_pool, "kvCacheIterationStatsByPoolGroup", by_key=True) or {}
        cold = self._iteration_stats(d.get("kvCacheIterationStatsByColdPoolGroup"),
                                     "kvCacheIterationStatsByColdPoolGroup", by_key=True)
        out = {k: v for k, v in pools.items() if not k.startswith("secondary")}
        for k, v in (cold or {}).items():
            if k.startswith("secondary"):
                out[k] = v
        reuse_keys = ("iterReusedBlocks", "iterMissedBlocks")
        lifecycles = d.get("kvCacheIterationStatsByLifecycle")
        level_hits: list[int] | None = None
        if isinstance(lifecycles, dict) and lifecycles:
            for k in reuse_keys:
                out[k] = 0
            for lid, lc in lifecycles.items():
                where = f"kvCacheIterationStatsByLifecycle.{lid}"
                if not isinstance(lc, dict):
                    raise _Bad(where, f"must be an object, got {_describe(lc)}")
                if lc.get("kind", "attention") != "attention":
                    continue
                for k in reuse_keys:
                    out[k] += _count(lc.get(k), f"{where}.{k}") or 0
                for k in ("iterFullReusedBlocksByLevel", "iterPartialReusedBlocksByLevel"):
                    per = lc.get(k)
                    if per is None:
                        continue
                    if not isinstance(per, list) or len(per) > 8:
                        raise _Bad(f"{where}.{k}", f"must be a list of counts per cache level, got {_describe(per)}")
                    level_hits = level_hits or []
                    for i, v in enumerate(per):
                        n = _count(v, f"{where}.{k}[{i}]") or 0
                        if i >= len(level_hits):
                            level_hits.append(0)
                        level_hits[i] += n
        elif windows is not None:
            for k in reuse_keys:
                if k in windows:
                    out[k] = windows[k]
        tiers = d.get("kvCacheLevelTiers")
        level_tiers: list[str] | None = None
        if tiers is not None:
            if not isinstance(tiers, list) or len(tiers) > 8 or not all(isinstance(t, str) for t in tiers):
                raise _Bad("kvCacheLevelTiers", f"must be a list of tier names, got {_describe(tiers)}")
            level_tiers = [t.lower() for t in tiers]
        return out, "1.3+ V2", level_tiers, level_hits

    def _iteration_stats(self, raw: Any, name: str = "kvCacheIterationStats",
                         by_key: bool = False) -> dict[str, int] | None:
        """Newer TensorRT-LLM's ``kvCacheIterationStats``: ``{"<window>": {...}}`` (or one flat dict, or a list):
        gauges and per-iteration counters summed over windows."""
        if raw is None:
            return None
        if isinstance(raw, dict) and "primaryMaxNumBlocks" in raw and not by_key:
            windows: list[tuple[str, Any]] = [("", raw)]
        elif isinstance(raw, dict):
            windows = [(f".{k}", v) for k, v in raw.items()]
        elif isinstance(raw, list):
            windows = [(f"[{i}]", v) for i, v in enumerate(raw)]
        else:
            raise _Bad(name, f"must be an object, got {_describe(raw)}")
        out: dict[str, int] = {}
        for where, w in windows:
            if not isinstance(w, dict):
                raise _Bad(f"{name}{where}", f"must be an object, got {_describe(w)}")
            for key, v in w.items():
                if not (key.startswith("primary") or key.startswith("secondary") or key.startswith("iter")):
                    continue
                if key == "iterCacheHitRate":
                    _number(v, f"{name}{where}.{key}")
                    continue
                if key.endswith("ByLevel"):
                    continue
                n = _count(v, f"{name}{where}.{key}")
                if n is not None:
                    out[key] = out.get(key, 0) + n
        return out

    # ============================================================================================ other records

    def _apply_meta(self, data: dict[str, Any]) -> None:
        checked: dict[str, Any] = {}
        for key in ("bytes_per_block", "tokens_per_block", "primary_blocks", "secondary_blocks", "disk_blocks",
                    "kv_bytes_per_token", "host_cache_bytes", "disk_cache_bytes"):
            if key in data:
                checked[key] = _count(data[key], key)
        for key in ("engine", "engine_version", "model", "gpu"):
            v = data.get(key)
            if v is not None and not isinstance(v, str):
                raise _Bad(key, f"must be a string, got {_describe(v)}")
        self.meta.update(data)
        self.meta.update(checked)

    def _apply_request(self, data: dict[str, Any], t: float) -> None:
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

        self._req_records += 1
        self._update_warming()
        warm = self._req_records <= self.warmup_requests
        if ok:
            self._completed += 1
        else:
            self._failed += 1
            self._last_error = err or "failed"
        self._prompt_tokens += prompt or 0
        self._output_tokens += output or 0
        if warm:
            self._warm_records += 1
            return
        if ok:
            if ttft is not None:
                self._ttft.add(t, ttft)
            if e2e is not None:
                self._e2e.add(t, e2e)
        tpb = self.tokens_per_block
        if ok and reused is not None and prompt and tpb:
            acc = self._prio_req.get(prio)
            if acc is None:
                acc = self._prio_req[prio] = [0, 0, 0, 0]
            acc[0] += reused
            acc[1] += -(-prompt // tpb)
            acc[2] += 1
            acc[3] += min(onboarded or 0, reused)

    def _apply_gpu(self, data: dict[str, Any], t: float) -> None:
        idx = data.get("index")
        if idx.__class__ is not int:
            raise _Bad("index", f"must be an integer, got {_describe(idx)}")
        err = data.get("error")
        if err is not None:
            self.gpu_error = str(err)
            if idx < 0:
                return  # a source-level "no NVIDIA driver" record, not a device
        if not 0 <= idx < _MAX_GPUS:
            raise _Bad("index", f"must be in [0, {_MAX_GPUS}), got {idx}")
        name = data.get("name")
        if name is not None and not isinstance(name, str):
            raise _Bad("name", f"must be a string, got {_describe(name)}")
        used = _count(data.get("memory_used_bytes"), "memory_used_bytes")
        total = _count(data.get("memory_total_bytes"), "memory_total_bytes")
        self._gpus[idx] = GpuDevice(idx, name, used, total, t, dict(data))

    def _apply_host(self, data: dict[str, Any], t: float) -> None:
        # kvtop's host source writes process_rss_bytes / system_available_bytes / system_total_bytes; the short
        # names are accepted too.
        values: dict[str, int | None] = {}
        for short, long in (("rss_bytes", "process_rss_bytes"), ("available_bytes", "system_available_bytes"),
                            ("total_bytes", "system_total_bytes"), ("pinned_pool_bytes", "pinned_pool_bytes")):
            v = _count(data.get(short), short)
            values[short] = v if v is not None else _count(data.get(long), long)
        self._host_mem = HostMemory(values["rss_bytes"], values["available_bytes"], values["pinned_pool_bytes"], t,
                                    dict(data), values["total_bytes"])

    # ============================================================================================ time, warm-up

    @property
    def _host_hits(self) -> int:
        return self._st_host_hits if self._it_moves_seen else self.event_fold.host_hits

    def _update_warming(self) -> None:
        self._warming = self.event_fold.warming = max(self._stats_completed, self._req_records) < self.warmup_requests

    def _counters(self) -> tuple[int, ...]:
        m = self.moves
        return (self._hits, self._lookups, self._host_hits, m.offloaded_blocks, m.onboarded_blocks,
                m.evicted_gpu_blocks, m.evicted_host_blocks, self._completed, self._failed, self._prompt_tokens,
                self._output_tokens, self._ctx_tokens, self._gen_tokens)

    def _window_base(self) -> tuple[float, tuple[int, ...]] | None:
        return self._window.base(self.now)

    # ============================================================================================ read side

    @property
    def tokens_per_block(self) -> int | None:
        tpb = self.meta.get("tokens_per_block") or self._stats_tpb
        return tpb if isinstance(tpb, int) and tpb > 0 else None

    @property
    def bytes_per_block(self) -> int | None:
        """``meta``'s ``bytes_per_block``, else its ``kv_bytes_per_token`` times the tokens per block (a server's
        meta knows the model but not the block size, which its stats' ``tokensPerBlock`` then gives)."""
        bpb = self.meta.get("bytes_per_block")
        if isinstance(bpb, int) and bpb > 0:
            return bpb
        per_token, tpb = self.meta.get("kv_bytes_per_token"), self.tokens_per_block
        if isinstance(per_token, int) and per_token > 0 and tpb is not None:
            return per_token * tpb
        return None

    def _meta_blocks(self, blocks_key: str, bytes_key: str) -> int | None:
        """A pool's size in blocks from ``meta``: given in blocks, or in bytes once the block size is known."""
        n = self.meta.get(blocks_key)
        if isinstance(n, int):
            return n
        size, bpb = self.meta.get(bytes_key), self.bytes_per_block
        if isinstance(size, int) and size >= 0 and bpb is not None:
            return size // bpb
        return None

    @property
    def _cold_merged(self) -> bool:
        """True when the stats' ``secondary*`` gauges are host and disk together (the V2 manager sums every cold
        level into them, kv_cache_stats.py ``_build_stats``), so neither tier's share can be read from them."""
        return self._stats_schema == "1.3+ V2" and self.disk is not None

    def _capacity(self, level: int) -> tuple[int | None, str | None]:
        it = self._it
        key = "primaryMaxNumBlocks" if level == GPU else "secondaryMaxNumBlocks"
        if level == HOST and self._cold_merged:
            host_meta = self._meta_blocks("secondary_blocks", "host_cache_bytes")
            if host_meta is not None:
                return host_meta, "meta"
            disk = self._meta_blocks("disk_blocks", "disk_cache_bytes")
            if it is not None and key in it and disk is not None:
                return max(it[key] - disk, 0), "derived"
            return None, None
        if it is not None and key in it:
            return it[key], "stats"
        created = self.event_fold.created_capacity(level)
        if created is not None:
            return created, "created"
        meta = self.meta.get("primary_blocks") if level == GPU else self._meta_blocks("secondary_blocks",
                                                                                     "host_cache_bytes")
        if isinstance(meta, int):
            return meta, "meta"
        # 1.0-1.2: maxNumBlocks = primary + secondary, so either one gives the other.
        other, _ = (self._capacity_known(HOST) if level == GPU else self._capacity_known(GPU))
        if self._max_num_blocks is not None and other is not None:
            return max(self._max_num_blocks - other, 0), "derived"
        return None, None

    def _capacity_known(self, level: int) -> tuple[int | None, str | None]:
        """Capacity from a direct source only (no derivation), to derive the other tier from."""
        it = self._it
        key = "primaryMaxNumBlocks" if level == GPU else "secondaryMaxNumBlocks"
        if it is not None and key in it:
            return it[key], "stats"
        created = self.event_fold.created_capacity(level)
        if created is not None:
            return created, "created"
        meta = self.meta.get("primary_blocks") if level == GPU else self._meta_blocks("secondary_blocks",
                                                                                     "host_cache_bytes")
        return (meta, "meta") if isinstance(meta, int) else (None, None)

    @property
    def _events_seen(self) -> bool:
        return self.event_fold.seen or (self._stream is not None and self._stream.events_seen)

    @property
    def counts_approximate(self) -> bool:
        return self.event_fold.approximate or (
            self._stream is not None and self._stream.approximate)

    @property
    def cached_approximate(self) -> bool:
        ev = self.event_fold
        return self.counts_approximate or self._reuse_seen or ev.reuse_seen or ev.stale_dropped > 0

    @property
    def gpu(self) -> TierState:
        if self._stream is not None:
            return self._stream.tier_state("gpu")  # type: ignore[no-any-return]
        cap, _ = self._capacity(GPU)
        it = self._it
        free = it["primaryFreeNumBlocks"] if it is not None and "primaryFreeNumBlocks" in it else self._free_num_blocks
        in_use = max(cap - free, 0) if cap is not None and free is not None else None
        cached = None
        if self._events_seen:
            cached = self.event_fold.cached(GPU)
            if cap is not None:
                cached = min(cached, cap)
        return TierState("gpu", cap, in_use, cached, free, self.tokens_per_block, self.bytes_per_block,
                         self.cached_approximate)

    @property
    def host(self) -> TierState:
        st = self._host()
        medium = self.meta.get("secondary_medium")
        # KvCacheRetentionConfig(transfer_mode=GDS / POSIX_DEBUG_FALLBACK) offloads into files: same blocks, disk
        return replace(st, medium=medium) if isinstance(medium, str) else st

    def _host(self) -> TierState:
        if self._stream is not None:
            return self._stream.tier_state("host")  # type: ignore[no-any-return]
        cap, _ = self._capacity(HOST)
        it = self._it
        tpb, bpb = self.tokens_per_block, self.bytes_per_block
        free: int | None
        in_use: int | None
        if self._cold_merged:
            return TierState("host", cap, None, None, None, tpb, bpb, False)
        if it is not None and "secondaryFreeNumBlocks" in it:
            free = it["secondaryFreeNumBlocks"]
            in_use = max(cap - free, 0) if cap is not None else None
        elif cap == 0:
            return TierState("host", 0, 0, 0, 0, tpb, bpb, False)
        elif self._events_seen:
            in_use = 0
            free = cap
        else:
            return TierState("host", cap, None, None, None, tpb, bpb, False)
        cached = None
        if self._events_seen:
            cached = self.event_fold.cached(HOST)
            if cap is not None:
                cached = min(cached, cap)
        return TierState("host", cap, in_use, cached, free, tpb, bpb, self.cached_approximate)

    @property
    def disk(self) -> TierState | None:
        """The third tier (TensorRT-LLM's disk cache: ``KvCacheConfig.disk_cache_size``, V2 manager only), or
        ``None`` when the engine has none. Known from ``meta`` (the configured size) or from the stats'
        ``kvCacheLevelTiers`` naming a "disk" level. Its occupancy is unknown: the V2 stats sum it with the host's
        (see ``cold``); its capacity is the configured size, or the cold pools' total less the host's."""
        if self._stream is not None and "disk" in self._stream.tiers_present():
            return self._stream.tier_state("disk")  # type: ignore[no-any-return]  # vLLM STORAGE, SGLang DISK
        cap = self._meta_blocks("disk_blocks", "disk_cache_bytes")
        named = self._level_tiers is not None and "disk" in self._level_tiers
        if not (isinstance(cap, int) and cap > 0) and not named:
            return None
        if not (isinstance(cap, int) and cap > 0):
            it = self._it
            host = self._meta_blocks("secondary_blocks", "host_cache_bytes")
            cap = (max(it["secondaryMaxNumBlocks"] - host, 0)
                   if it is not None and "secondaryMaxNumBlocks" in it and host is not None else None)
        return TierState("disk", cap, None, None, None, self.tokens_per_block, self.bytes_per_block, False)

    @property
    def cold(self) -> TierState | None:
        """Host and disk together, as the V2 manager's stats report them (``secondary*`` of
        ``kvCacheIterationStatsByColdPoolGroup``, summed over cold levels); ``None`` unless they are merged."""
        it = self._it
        if not self._cold_merged or it is None or "secondaryMaxNumBlocks" not in it:
            return None
        cap = it["secondaryMaxNumBlocks"]
        free = it.get("secondaryFreeNumBlocks")
        used = it.get("secondaryUsedNumBlocks", None if free is None else max(cap - free, 0))
        return TierState("cold", cap, used, None, free, self.tokens_per_block, self.bytes_per_block, False)

    @property
    def stats_schema(self) -> str | None:
        """Which TensorRT-LLM's iteration stats the numbers come from, told from the data itself: "1.0-1.2"
        (``kvCacheStats`` only), "1.3" (``kvCacheIterationStats`` per window, V1 manager), "1.3+ V2"
        (the pool-group views of the V2 manager), "prometheus" (trtllm-serve's trtllm_* metrics, when its JSON
        stats are off), "<schema> + prometheus" with both, or None before any stats."""
        if self._prom_seen:
            return "prometheus" if self._stats_schema is None else f"{self._stats_schema} + prometheus"
        return self._stats_schema

    @property
    def hits_by_tier(self) -> dict[str, int]:
        """Reused blocks per serving tier, warm-up excluded, where the stats say it (V2 lifecycles'
        ``iter{Full,Partial}ReusedBlocksByLevel``, levels named by ``kvCacheLevelTiers``); else empty."""
        if self._stream is not None and self._stream.hit_tokens:
            return self._stream.hits_by_tier()  # type: ignore[no-any-return]  # from the engine's /metrics
        names = self._level_tiers or ["gpu", "host", "disk"]
        out: dict[str, int] = {}
        for level, n in sorted(self._level_hits.items()):
            name = names[level] if level < len(names) else f"level{level}"
            out[name] = out.get(name, 0) + n
        return out

    @property
    def tiers(self) -> list[TierState]:
        """Every tier the engine has, fastest first: GPU, host, then disk when there is one.

        The host tier is listed even when its pool is 0 blocks (1.0-1.2 users mostly run without one, and the
        dashboard says so); the disk tier only when the engine has it.
        """
        out = [self.gpu, self.host]
        disk = self.disk
        if disk is not None:
            out.append(disk)
        return out

    @property
    def moves(self) -> Moves:
        ev = self.event_fold
        if self._it_moves_seen:
            return Moves(self._it_offloaded, self._it_onboarded, ev.evicted[GPU],
                         self._it_host_dropped or ev.evicted[HOST], ev.evicted_unknown, "stats")
        return Moves(ev.offloaded, ev.onboarded, ev.evicted[GPU], ev.evicted[HOST], ev.evicted_unknown, "events")

    @property
    def hit_rate(self) -> HitRate:
        hits, lookups = self._hits, self._lookups
        host_hits = min(self._host_hits, hits)
        cumulative = gpu = host = None
        if lookups > 0:
            cumulative = hits / lookups
            host = host_hits / lookups
            gpu = cumulative - host
        window = wgpu = whost = None
        base = self._window_base()
        if base is not None:
            dh, dl, dhh = hits - base[1][0], lookups - base[1][1], self._host_hits - base[1][2]
            if dl > 0:
                window = dh / dl
                whost = min(max(dhh, 0), max(dh, 0)) / dl
                wgpu = window - whost
        return HitRate(cumulative, window, gpu, host, wgpu, whost, hits, lookups, self._host_hits)

    @property
    def rates(self) -> Rates:
        base = self._window_base()
        if base is None or self.now is None or self.now <= base[0]:
            return Rates(window_s=None)
        span = self.now - base[0]
        cur = self._counters()
        r = [(c - b) / span for c, b in zip(cur, base[1])]
        bpb = self.bytes_per_block
        return Rates(window_s=span, offloaded_per_s=r[3], onboarded_per_s=r[4], evicted_gpu_per_s=r[5],
                     evicted_host_per_s=r[6], hits_per_s=r[0], lookups_per_s=r[1], requests_per_s=r[7],
                     failed_per_s=r[8], prompt_tokens_per_s=r[9], output_tokens_per_s=r[10],
                     ctx_tokens_per_s=r[11], gen_tokens_per_s=r[12],
                     offloaded_bytes_per_s=None if bpb is None else r[3] * bpb,
                     onboarded_bytes_per_s=None if bpb is None else r[4] * bpb)

    def history(self) -> list[HistoryPoint]:
        """Rates per ``history_step_s`` over the kept history (oldest first), for the dashboard's sparklines."""
        out: list[HistoryPoint] = []
        samples = self._window.history(self.now, self._counters)
        for (t0, a), (t1, b) in zip(samples, samples[1:]):
            dt = t1 - t0
            if dt <= 0:
                continue
            d = [y - x for x, y in zip(a, b)]
            hit = d[0] / d[1] if d[1] > 0 else None
            host = min(max(d[2], 0), max(d[0], 0)) / d[1] if d[1] > 0 else None
            out.append(HistoryPoint(t1, hit, host, d[3] / dt, d[4] / dt, d[5] / dt, d[6] / dt, d[7] / dt,
                                    d[10] / dt))
        return out

    @property
    def cached_by_priority(self) -> dict[str, dict[int | None, int]]:
        """Cached blocks per retention priority, per tier (``None`` = a priority no event gave)."""
        out: dict[str, dict[int | None, int]] = {}
        for level, name in ((GPU, "gpu"), (HOST, "host")):
            per = out[name] = self.event_fold.cached_by_priority(level)
            # The fold's map may still hold blocks TensorRT-LLM detached without an event (partial reuse); the
            # tier's cached count is clamped to its pool, so the split is scaled to that total (largest
            # remainders), never showing more cached blocks than the pool has. Flagged by cached_approximate.
            cap = (self.gpu if level == GPU else self.host).cached_blocks
            total = sum(per.values())
            if cap is not None and total > cap:
                shares = {k: n * cap / total for k, n in per.items()}
                scaled = {k: int(v) for k, v in shares.items()}
                for k in sorted(shares, key=lambda k: shares[k] - scaled[k], reverse=True)[:cap - sum(scaled.values())]:
                    scaled[k] += 1
                out[name] = {k: v for k, v in scaled.items() if v}
        return out

    @property
    def hit_rate_by_priority(self) -> dict[int | None, float]:
        """Per request priority (``request`` records' ``priority``): reused / prompt blocks of finished requests,
        warm-up excluded."""
        return {p: acc[0] / acc[1] for p, acc in self._prio_req.items() if acc[1] > 0}

    @property
    def hit_split_by_priority(self) -> dict[int | None, HitRate]:
        """``hit_rate_by_priority`` split by serving tier: the host share from the requests' ``onboarded_blocks``
        (reused blocks that were onboarded), when the driver reports it."""
        out: dict[int | None, HitRate] = {}
        for p, (reused, blocks, _n, onboarded) in self._prio_req.items():
            if blocks > 0:
                out[p] = HitRate(cumulative=reused / blocks, gpu=(reused - onboarded) / blocks,
                                 host=onboarded / blocks, hits=reused, lookups=blocks, host_hits=onboarded)
        return out

    @property
    def requests(self) -> Requests:
        since = (self.now - self.window_s) if self.now is not None else float("-inf")
        return Requests(self._completed, self._failed, self._warm_records, self._in_flight,
                        self._ttft.percentiles(), self._e2e.percentiles(), self._ttft.window(since),
                        self._e2e.window(since), self._prompt_tokens, self._output_tokens, self._last_error)

    @property
    def gpus(self) -> dict[int, GpuDevice]:
        return dict(self._gpus)

    @property
    def host_memory(self) -> HostMemory | None:
        return self._host_mem

    @property
    def quality(self) -> Quality:
        ev = self.event_fold
        cap_src = self._capacity(GPU)[1]
        host_cap = self._capacity(HOST)[0]
        includes = None
        pri = self._capacity_known(GPU)[0]
        sec = self._capacity_known(HOST)[0]
        if self._max_num_blocks is not None and pri is not None and sec:
            if self._max_num_blocks == pri + sec:
                includes = True
            elif self._max_num_blocks == pri:
                includes = False
        return Quality(
            events_seen=self._events_seen, events_dropped=ev.dropped,
            counts_approximate=self.counts_approximate, cached_approximate=self.cached_approximate,
            unknown_hashes=ev.unknown_hashes, unknown_parents=ev.unknown_parents,
            stale_cached_dropped=ev.stale_dropped, pruned_entries=ev.pruned,
            duplicate_events=ev.duplicates, event_restarts=ev.restarts,
            stats_restarts=self._stats_restarts, stats_iterations_missing=self._iter_missing,
            host_without_events=bool(host_cap) and not self._events_seen and "secondaryFreeNumBlocks" not in (
                self._it or {}),
            capacity_source=cap_src, stats_max_includes_host=includes, stats_schema=self.stats_schema)

    @property
    def agent(self) -> str | None:
        """The ``kvtop agent`` (its source key) whose summaries this model folds, else None."""
        summary = None if self._stream is None else self._stream.summary
        agent = summary.get("agent") if summary else None
        return agent if isinstance(agent, str) else None

    @property
    def since_attach(self) -> bool:
        """True when the counts come from the engines' common KV event stream (kvtop/kv_stream.py) and start at
        kvtop's attach: the engine announced nothing it had cached before (no state snapshot in vLLM 0.33)."""
        return self._stream is not None and bool(self._stream.to_json()["since_attach"])

    @property
    def fold_entries(self) -> int:
        """Blocks the fold holds (cached ones plus not-yet-reconciled stale ones); bounded, see ``_prune``."""
        return self.event_fold.entries

    def summary(self) -> dict[str, Any]:
        """Everything above as one JSON-able dict (``kvtop --headless --json`` prints it)."""
        tiers = self.tiers
        hr = self.hit_rate
        req = self.requests
        by_prio = self.cached_by_priority
        return {
            "engine": self.meta.get("engine"),
            "engine_version": self.meta.get("engine_version"),
            "model": self.meta.get("model"),
            "gpu": self.meta.get("gpu"),
            "time": self.now,
            "tokens_per_block": self.tokens_per_block,
            "bytes_per_block": self.bytes_per_block,
            "tiers": {t.name: t.to_json() for t in tiers},
            "stats_schema": self.stats_schema,
            "cold": None if self.cold is None else self.cold.to_json(),
            "hits_by_tier": self.hits_by_tier,
            "hit_rate": {"cumulative": hr.cumulative, "gpu": hr.gpu, "host": hr.host, "window": hr.window,
                         "window_gpu": hr.window_gpu, "window_host": hr.window_host, "hits": hr.hits,
                         "lookups": hr.lookups, "host_hits": hr.host_hits,
                         # the share of lookups each tier served, where the stats say it per cache level (V2)
                         "by_tier": {t: n / hr.lookups for t, n in self.hits_by_tier.items()} if hr.lookups else {},
                         "warmup_lookups": self._warm_lookups, "warmup_hits": self._warm_hits},
            "hit_rate_by_priority": {("none" if p is None else str(p)): {"cumulative": v.cumulative, "gpu": v.gpu,
                                                                          "host": v.host, "lookups": v.lookups}
                                     for p, v in sorted(self.hit_split_by_priority.items(),
                                                        key=lambda kv: -1 if kv[0] is None else kv[0])},
            "moves": self.moves.to_json(),
            "rates": self.rates.to_json(),
            "requests": {"completed": req.completed, "failed": req.failed, "warmup": req.warmup,
                         "in_flight": req.in_flight, "ttft_ms": req.ttft.to_json_ms(), "e2e_ms": req.e2e.to_json_ms(),
                         "prompt_tokens": req.prompt_tokens, "output_tokens": req.output_tokens,
                         "last_error": req.last_error},
            "cached_by_priority": {tier: {("none" if p is None else str(p)): n
                                          for p, n in sorted(per.items(), key=lambda kv: -1 if kv[0] is None
                                                             else kv[0])}
                                   for tier, per in by_prio.items()},
            "memory": {
                "gpus": [{"index": g.index, "name": g.name, "memory_used_bytes": g.memory_used_bytes,
                          "memory_total_bytes": g.memory_total_bytes} for _, g in sorted(self._gpus.items())],
                "gpu_error": self.gpu_error,
                "engine_gpu_mem_usage_bytes": self._gpu_mem_usage,     # the stats' gpuMemUsage
                "engine_pinned_mem_usage_bytes": self._pinned_mem_usage,  # pinnedMemUsage: 0 on PyTorch, always
                "host": None if self._host_mem is None else {
                    "rss_bytes": self._host_mem.rss_bytes, "available_bytes": self._host_mem.available_bytes,
                    "total_bytes": self._host_mem.total_bytes, "pinned_pool_bytes": self._host_mem.pinned_pool_bytes},
            },
            "quality": self.quality.to_json(),
            "stream": None if self._stream is None else self._stream.to_json(),
            "bad_records": self.bad_records,
            "last_bad_reason": self.last_bad_reason,
        }
