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
- The disk tier's moves (``Moves.disk_*``): disk -> host, disk -> GPU and into the disk, from the engine's own
  counters where it has them (TensorRT-LLM V2's ``iterDiskPrefetchBlocks``, Dynamo KVBM's), else the stream's
  disk stores and GPU stores of blocks it holds on disk only (docs/engine-counts.md).
- Hit rate: from the stats counters ``reusedBlocks`` / ``missedBlocks`` (cumulative in the engine, so diffed),
  warm-up excluded. Host hits are onboards (every onboard is a reused block served from host memory), or the
  host level's reused blocks where the V2 lifecycles give them per level; GPU hits are the rest. Both are
  fractions of all block lookups, so ``gpu + host == cumulative``. Where the engine says which tier served each
  hit and has a disk tier, or a hit came from outside it (vLLM's p2p, a remote store), those are shares of their
  own (``disk``, ``external``), and ``gpu + host + disk + external == cumulative``.

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
  priority). Both are counted in the truth test (tests/tiers/test_tiers.py).

How it is built: ``TierModel`` composes small folds, each owning its state and knowing no other fold: KV cache
events and their hot path (kvtop/tiers/events.py), iteration stats (stats.py), request records (requests.py),
meta / gpu / host records (meta.py), the engines' common KV event stream (kvtop/tiers/stream.py), and the rate window
(window.py). It routes each record to its fold, keeps warm-up (told to the folds that split by it), and builds
every reading from the folds' public state: here, in capacity.py (the tiers) and in summary.py (``--json``).
Everything the dashboard reads (``gpu``, ``host``, ``rates``, ``summary()``...) is built on read, 4 times a
second, or once per change through ``snapshot()``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import kvtop.tiers.capacity as _capacity
import kvtop.tiers.summary as _summary
from kvtop.records import Record, RecordError, parse_engine_dict
from kvtop.tiers.common import Bad, Ledger, describe
from kvtop.tiers.departures import trtllm_said
from kvtop.tiers.events import GPU, HOST, EventFold
from kvtop.tiers.meta import MetaFold
from kvtop.tiers.requests import RequestFold
from kvtop.tiers.snapshot import TierSnapshot, Version, history_points
from kvtop.tiers.snapshot import take as take_snapshot
from kvtop.tiers.state import (
    GpuDevice,
    HistoryPoint,
    HitRate,
    HostMemory,
    Moves,
    Quality,
    Rates,
    Requests,
    TierState,
)
from kvtop.tiers.stats import StatsFold
from kvtop.tiers.verdict import CostBasis, TierVerdict, cost_basis, decide, verdict_from_json
from kvtop.tiers.window import RateWindow, Sample

# The read-side types live in kvtop.tiers.state (re-exported by kvtop.tiers); this module exports only the fold.
__all__ = ["TierModel"]

STREAM_KINDS = ("kv_batch", "metrics", "summary")  # folded by kvtop/tiers/stream.py
_INF = float("inf")


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
        self._warming = warmup_requests > 0  # kept current by _update_warming, and told to the event fold
        self.window_s = float(window_s)
        self.history_step_s = float(history_step_s)

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

        self.stats_fold = StatsFold(lambda: self.bytes_per_block)  # kvtop/tiers/stats.py
        self.request_fold = RequestFold(warmup_requests, latency_samples,  # kvtop/tiers/requests.py
                                        lambda: self.tokens_per_block)
        self._cost_key: tuple[Any, ...] | None = None
        self._cost: CostBasis | None = None
        self.meta_fold = MetaFold()  # kvtop/tiers/meta.py
        self.meta = self.meta_fold.meta  # the same dict: engine, model, block size, pool sizes, as sent

        # the engines' common KV event stream (vLLM, SGLang, Dynamo), their metrics, agent summaries:
        # kvtop/tiers/stream.py, created on the first such record
        self.stream_fold: Any = None

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
                self._bad("data", f"must be an object, got {describe(data)}")
                return
            try:
                if kind == "meta":
                    self.meta_fold.apply_meta(data)
                elif kind == "request":
                    try:
                        self.request_fold.apply(data, float(t))
                    finally:
                        self._update_warming()  # the record it counted (warm-up is a function of the counts)
                elif kind == "gpu":
                    self.meta_fold.apply_gpu(data, float(t))
                else:
                    self.meta_fold.apply_host(data, float(t))
            except Bad as exc:
                self._bad(f"data.{exc.field}", exc.problem)
                return
            except Exception as exc:  # never into the consumer; name what broke
                self._bad("data", f"{type(exc).__name__}: {exc}")
                return
            self._ledger.applied += 1
        else:
            self._bad("kind", f"must be one of meta, stats, kv_event, gpu, host, request, "
                              f"{', '.join(STREAM_KINDS)}, got {describe(kind)}")

    def _apply_stream(self, kind: str, data: Any, t: Any) -> None:
        """A ``kv_batch``, ``metrics`` or ``summary`` record: folded by kvtop/tiers/stream.py into this model."""
        if not self._tick(t):
            return
        if not isinstance(data, dict):
            self._bad("data", f"must be an object, got {describe(data)}")
            return
        if self.stream_fold is None:
            from kvtop.tiers.stream import StreamFold

            # handed what it writes and reads, never the model (design.md, "a fold is handed what it writes")
            self.stream_fold = StreamFold(
                self._ledger, moves=self.event_fold, stats=self.stats_fold, requests=self.request_fold,
                meta=self.meta, tokens_per_block=lambda: self.tokens_per_block,
                bytes_per_block=lambda: self.bytes_per_block, restart_window=self.restart_window)
        try:
            self.stream_fold.apply(kind, data)
        except Exception as exc:  # never into the consumer; name what broke
            self._bad("data", f"{type(exc).__name__}: {exc}")
            return
        self._ledger.applied += 1

    def apply_kv_event_records(self, events: list[Any], t: float) -> list[str] | None:
        """What ``apply`` does for a ``kv_event`` record of each of ``events`` at ``t``, without the records (a drain
        of the simulator's events, Session.emit_kv_events); returns the reasons of those it could not fold, one
        each in order (``last_bad_reason`` after each), or None when it folded them all."""
        led = self._ledger
        if t.__class__ is float and -_INF < t < _INF:  # the drain folded as one (EventFold.apply_drain)
            led.touched += len(events)
            return self.event_fold.apply_drain(events, t)
        apply = self.apply_kv_event
        bad = led.bad_records
        reasons: list[str] | None = None
        for ev in events:
            led.touched += 1
            apply(ev, t)
            if led.bad_records != bad:
                bad = led.bad_records
                if reasons is None:
                    reasons = []
                reasons.append(led.last_bad_reason or "")
        return reasons

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
            self.stats_fold.apply(d, self._warming)
        except RecordError as exc:
            self._bad(exc.field, exc.problem)
            return
        except Bad as exc:
            self._bad(f"stats.{exc.field}", exc.problem)
            return
        except Exception as exc:
            self._bad("stats", f"{type(exc).__name__}: {exc}")
            return
        finally:
            self._update_warming()  # the completions it counted (warm-up is a function of the counts)
        self._ledger.applied += 1

    def reset_window(self) -> None:
        """Start the rate window afresh at ``now`` (the dashboard's "r")."""
        self._window_resets += 1
        self._window.reset(self.now, self._counters())

    def restart_window(self) -> None:
        """Window and history both start at ``now``: what came before is a baseline, not moves of an instant (the
        first agent summary's totals since its attach, kvtop/tiers/stream.py)."""
        if self.now is not None:
            self._window.restart(self.now, self._counters())

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

    # ============================================================================================ time, warm-up

    @property
    def _host_hits(self) -> int:
        return self.stats_fold.host_hits if self.stats_fold.moves_seen else self.event_fold.host_hits

    @property
    def warming(self) -> bool:
        """True while the finished requests seen are fewer than ``warmup_requests``: counter deltas are warm-up."""
        return self._warming

    def _update_warming(self) -> None:
        if self._warming:  # the counts only grow: once past warm-up, always past it (and nothing to do per record)
            done = max(self.stats_fold.completed, self.request_fold.records)
            self._warming = self.event_fold.warming = done < self.warmup_requests

    def _counters(self) -> tuple[int, ...]:
        m, st, rq = self._moves(disk_flag=False), self.stats_fold, self.request_fold
        return (st.hits, st.lookups, self._host_hits, m.offloaded_blocks, m.onboarded_blocks, m.evicted_gpu_blocks,
                m.evicted_host_blocks, rq.completed, rq.failed, rq.prompt_tokens, rq.output_tokens, st.ctx_tokens,
                st.gen_tokens, m.disk_prefetched_blocks, m.disk_onboarded_blocks, m.disk_offloaded_blocks,
                *self._lower_hits())

    def _lower_hits(self) -> tuple[int, int]:
        """Hits the disk served, and hits from outside this engine (vLLM's p2p and external_unspecified, SGLang's
        EXTERNAL, labels kvtop does not know), warm-up excluded, where the engine says it (else 0)."""
        st = self.stats_fold
        if self.stream_fold is None and not st.level_hits and not st.level_tokens:
            return 0, 0   # no engine said which tier served a hit (1.0-1.3 stats): no dict made per sample
        by = self.hits_by_tier
        return by.get("disk", 0), by.get("external", 0) + by.get("unknown", 0)

    def _window_base(self) -> tuple[float, tuple[int, ...]] | None:
        return self._window.base(self.now)

    # ============================================================================================ read side

    @property
    def tokens_per_block(self) -> int | None:
        tpb = self.meta.get("tokens_per_block") or self.stats_fold.tokens_per_block
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

    @property
    def events_seen(self) -> bool:
        """Whether any KV cache event came (TensorRT-LLM's or the engines' common stream)."""
        return self.event_fold.seen or (self.stream_fold is not None and self.stream_fold.events_seen)

    @property
    def counts_approximate(self) -> bool:
        return self.event_fold.approximate or (
            self.stream_fold is not None and self.stream_fold.approximate)

    @property
    def cached_approximate(self) -> bool:
        ev = self.event_fold
        return self.counts_approximate or self.stats_fold.reuse_seen or ev.reuse_seen or ev.stale_dropped > 0

    @property
    def gpu(self) -> TierState:
        return _capacity.gpu(self)

    @property
    def host(self) -> TierState:
        return _capacity.host(self)

    @property
    def disk(self) -> TierState | None:
        """The third tier (TensorRT-LLM's disk cache, V2 manager only), or ``None`` when the engine has none."""
        return _capacity.disk(self)

    @property
    def cold(self) -> TierState | None:
        """Host and disk together, as the V2 manager's stats report them; ``None`` unless they are merged."""
        return _capacity.cold(self)

    @property
    def stats_schema(self) -> str | None:
        """Which TensorRT-LLM's iteration stats the numbers come from (``StatsFold.schema`` says how it is told)."""
        return self.stats_fold.schema

    @property
    def hits_by_tier(self) -> dict[str, int]:
        """Reused blocks per serving tier, warm-up excluded, where the stats say it (V2 lifecycles'
        ``iter{Full,Partial}ReusedBlocksByLevel``, levels named by ``kvCacheLevelTiers``); else empty."""
        if self.stream_fold is not None and self.stream_fold.hit_tokens:
            return self.stream_fold.hits_by_tier()  # type: ignore[no-any-return]  # from the engine's /metrics
        return self.stats_fold.hits_by_tier(self.tokens_per_block)

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
        return self._moves()

    def _moves(self, disk_flag: bool = True) -> Moves:
        """``moves``; ``disk_flag=False`` leaves ``Moves.disk`` False rather than read the disk tier, and leaves out
        why blocks left (the rate window's samples, taken while records fold, read only the counts: ~6% of a busy
        recording's fold)."""
        ev, st, sf = self.event_fold, self.stats_fold, self.stream_fold
        # the disk tier's moves: the engine's own counters (TensorRT-LLM V2 stats or Prometheus, Dynamo KVBM) where
        # it has them, else the stream's disk stores and the GPU stores of blocks held on disk only
        prefetched = st.disk_prefetched
        onboarded, offloaded = st.disk_onboarded, st.disk_offloaded
        if not st.disk_moves_seen and sf is not None:
            onboarded, offloaded = sf.onboarded_from["disk"], sf.stored["disk"]
        disk = bool(prefetched or onboarded or offloaded) or (disk_flag and self.disk is not None)
        said: dict[str, dict[str, int]] | None = None
        inferred: dict[str, dict[str, int]] = {}
        if disk_flag and sf is not None and (sf.batches or sf.summary is not None):
            # the engines' common stream: its removals say the tier, and only sometimes why (stream.py)
            said, inferred = sf.left_reasons()
        if st.moves_seen:
            host = st.host_dropped or ev.evicted[HOST]
            if said is None and disk_flag:
                said = trtllm_said(st.offloaded, ev.evicted[GPU], host, ev.evicted_unknown)
            return Moves(st.offloaded, st.onboarded, ev.evicted[GPU], host, ev.evicted_unknown, "stats",
                         disk_prefetched_blocks=prefetched, disk_onboarded_blocks=onboarded,
                         disk_offloaded_blocks=offloaded, disk=disk, left_said=said or {}, left_inferred=inferred)
        if said is None and disk_flag:
            said = trtllm_said(ev.offloaded, ev.evicted[GPU], ev.evicted[HOST], ev.evicted_unknown)
        return Moves(ev.offloaded, ev.onboarded, ev.evicted[GPU], ev.evicted[HOST], ev.evicted_unknown, "events",
                     disk_prefetched_blocks=prefetched, disk_onboarded_blocks=onboarded,
                     disk_offloaded_blocks=offloaded, disk=disk, left_said=said or {}, left_inferred=inferred)

    @property
    def hit_rate(self) -> HitRate:
        hits, lookups = self.stats_fold.hits, self.stats_fold.lookups
        host_hits = min(self._host_hits, hits)
        # the disk's share where the engine says which tier served each hit and has a disk tier (vLLM pre-creates
        # its disk label at 0 on every server: a share of 0 is shown only where there is a disk tier); the share
        # from outside the engine (p2p, a remote store) only once it served any. GPU is then what none of them did.
        disk_hits, ext_hits = self._lower_hits()
        st = self.stats_fold
        says = self.stream_fold is not None or bool(st.level_hits) or bool(st.level_tokens)
        disk_known = disk_hits > 0 or (says and "disk" in self.hits_by_tier and self.disk is not None)
        ext_known = ext_hits > 0
        disk_part = min(disk_hits, hits - host_hits)
        ext_part = min(ext_hits, hits - host_hits - disk_part)
        cumulative = gpu = host = disk = ext = None
        if lookups > 0:
            cumulative = hits / lookups
            host = host_hits / lookups
            disk = disk_part / lookups if disk_known else None
            ext = ext_part / lookups if ext_known else None
            gpu = cumulative - host - (disk or 0.0) - (ext or 0.0)
        window = wgpu = whost = wdisk = wext = None
        base = self._window_base()
        if base is not None:
            b = base[1]
            dh, dl, dhh = hits - b[0], lookups - b[1], self._host_hits - b[2]
            if dl > 0:
                window = dh / dl
                left = max(dh, 0)
                host_part = min(max(dhh, 0), left)
                whost = host_part / dl
                left -= host_part
                if disk_known:
                    ddh = min(max(disk_hits - (b[16] if len(b) > 16 else disk_hits), 0), left)
                    wdisk, left = ddh / dl, left - ddh
                if ext_known:
                    wext = min(max(ext_hits - (b[17] if len(b) > 17 else ext_hits), 0), left) / dl
                wgpu = window - whost - (wdisk or 0.0) - (wext or 0.0)
        return HitRate(cumulative, window, gpu, host, wgpu, whost, hits, lookups, self._host_hits, disk, wdisk,
                       disk_hits, ext, wext, ext_hits)

    @property
    def rates(self) -> Rates:
        # A source known by a kvtop agent's summaries: its token rates are the agent's (its totals carry no token
        # counts, and a rate the agent did not know stays unknown, not the 0 of counters that never moved).
        said = None if self.stream_fold is None else self.stream_fold.said_token_rates()
        base = self._window_base()
        if base is None or self.now is None or self.now <= base[0]:
            return Rates(window_s=None) if said is None else Rates(window_s=None, **said)
        span = self.now - base[0]
        cur = self._counters()
        r = [(c - b) / span for c, b in zip(cur, base[1])]
        bpb = self.bytes_per_block
        out = Rates(window_s=span, offloaded_per_s=r[3], onboarded_per_s=r[4], evicted_gpu_per_s=r[5],
                    evicted_host_per_s=r[6], hits_per_s=r[0], lookups_per_s=r[1], requests_per_s=r[7],
                    failed_per_s=r[8], prompt_tokens_per_s=r[9], output_tokens_per_s=r[10],
                    ctx_tokens_per_s=r[11], gen_tokens_per_s=r[12],
                    offloaded_bytes_per_s=None if bpb is None else r[3] * bpb,
                    onboarded_bytes_per_s=None if bpb is None else r[4] * bpb,
                    disk_prefetched_per_s=r[13], disk_onboarded_per_s=r[14], disk_offloaded_per_s=r[15])
        return out if said is None else dataclasses.replace(out, **said)

    def history_samples(self) -> list[Sample]:
        """The (time, counters) samples ``history()`` is made of: immutable, so a snapshot keeps them and makes the
        points only when read (kvtop/tiers/snapshot.py)."""
        return self._window.history(self.now, self._counters)

    def history(self) -> list[HistoryPoint]:
        """Rates per ``history_step_s`` over the kept history (oldest first), for the dashboard's sparklines."""
        return history_points(self.history_samples())

    @property
    def cached_by_priority(self) -> dict[str, dict[int | None, int]]:
        """Cached blocks per retention priority, per tier (``None`` = a priority no event gave)."""
        return _capacity.cached_by_priority(self)

    @property
    def hit_rate_by_priority(self) -> dict[int | None, float]:
        """Per request priority (``request`` records' ``priority``): reused / prompt blocks of finished requests,
        warm-up excluded."""
        return self.request_fold.hit_rate_by_priority()

    @property
    def hit_split_by_priority(self) -> dict[int | None, HitRate]:
        """``hit_rate_by_priority`` split by serving tier: the host share from the requests' ``onboarded_blocks``
        (reused blocks that were onboarded), when the driver reports it."""
        return self.request_fold.hit_split_by_priority()

    def _cost_basis(self) -> CostBasis | None:
        """The verdict's cost model for the model, GPU and block size the meta names (kvtop/tiers/verdict.py),
        made again only when one of them changes."""
        meta = self.meta
        key = (meta.get("model"), meta.get("gpu"), meta.get("gpu_profile"), meta.get("tensor_parallel_size"),
               self.tokens_per_block)
        if key != self._cost_key:
            self._cost_key = key
            self._cost = cost_basis(meta, self.tokens_per_block)
        return self._cost

    def _no_cost_reason(self) -> str:
        if self.tokens_per_block is None:
            return "the block size is unknown"
        return f"no cost model for model {self.meta.get('model') or '?'} (a built-in model or its config.json)"

    @property
    def verdict(self) -> dict[str, TierVerdict]:
        """Per tier below the GPU ("host", and "disk" where there is one): is it paying off (see verdict.py)."""
        return self.verdict_of(self.host, self.disk, self.moves)

    def verdict_of(self, host: TierState, disk: TierState | None, moves: Moves) -> dict[str, TierVerdict]:
        """``verdict`` from the tiers and moves the caller read already (a snapshot reads them once: building the
        host tier again was half of a verdict's 135 us under cProfile). A source known only by a kvtop agent's
        summaries (fleets) has the agent's own verdict, which saw the engine's iterations and requests."""
        summary = getattr(self.stream_fold, "summary", None)
        if summary:
            said = summary.get("verdict")
            if isinstance(said, dict):
                got = {t: verdict_from_json(t, said.get(t)) for t in ("host", "disk")}
                if got["host"] is not None:
                    return {t: v for t, v in got.items() if v is not None}
        rq, fit = self.request_fold, self.stats_fold.iter_fit
        now, start = self.now, self._ledger.start
        span = (now - start) if now is not None and start is not None else None
        classified = sum(tr.count for tr in rq.ttft_by_source.values())
        cost, coef, tpb = self._cost_basis(), fit.solve(), self.tokens_per_block
        cap = host.capacity_blocks
        out = {"host": decide("host", -1 if cap is None else cap, moves.onboarded_blocks, moves.offloaded_blocks,
                              rq.tier_evidence["host"], classified, coef, fit.n, cost, span, tpb,
                              self._no_cost_reason)}
        if disk is not None:
            ev = rq.tier_evidence["disk"]
            out["disk"] = decide("disk", -1 if disk.capacity_blocks is None else disk.capacity_blocks,
                                 ev.hit_blocks, 0, ev, classified, coef, fit.n, cost, span, tpb,
                                 self._no_cost_reason)
        return out

    @property
    def requests(self) -> Requests:
        req = self.request_fold.requests(self.now, self.window_s, self.stats_fold.in_flight,
                                         self.stats_fold.running)
        said = None if self.stream_fold is None else self.stream_fold.said_ttft()
        if said is not None:
            # a source known by a kvtop agent's summaries: percentiles do not travel as totals, the agent's own do
            req = dataclasses.replace(req, ttft=said[0], window_ttft=said[1])
        return req

    @property
    def gpus(self) -> dict[int, GpuDevice]:
        return dict(self.meta_fold.gpus)

    @property
    def host_memory(self) -> HostMemory | None:
        return self.meta_fold.host_memory

    @property
    def gpu_error(self) -> str | None:
        """The NVML source's last error ("no NVIDIA driver"...), None while it reads."""
        return self.meta_fold.gpu_error

    @property
    def quality(self) -> Quality:
        """What the numbers are worth: drops, restarts, approximations, where the capacity came from."""
        return _capacity.quality(self)

    @property
    def agent(self) -> str | None:
        """The ``kvtop agent`` (its source key) whose summaries this model folds, else None."""
        summary = None if self.stream_fold is None else self.stream_fold.summary
        agent = summary.get("agent") if summary else None
        return agent if isinstance(agent, str) else None

    @property
    def since_attach(self) -> bool:
        """True when the counts come from the engines' common KV event stream (kvtop/tiers/stream.py) and start at
        kvtop's attach: the engine announced nothing it had cached before (no state snapshot in vLLM 0.33)."""
        return self.stream_fold is not None and bool(self.stream_fold.to_json()["since_attach"])

    @property
    def fold_entries(self) -> int:
        """Blocks the fold holds (cached ones plus not-yet-reconciled stale ones); bounded, see ``_prune``."""
        return self.event_fold.entries

    def summary(self) -> dict[str, Any]:
        """Everything above as one JSON-able dict (``kvtop --headless --json`` prints it; kvtop/tiers/summary.py)."""
        return _summary.summary(self)
