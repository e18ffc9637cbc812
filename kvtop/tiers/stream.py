"""The engines' common KV event stream (vLLM, SGLang, TensorRT-LLM's streaming path, Dynamo's mocker): the fold
of its records (``kv_batch``, made by :mod:`kvtop.sources.kv_wire`; ``metrics``; ``summary``) into the counters of
a :class:`kvtop.tiers.TierModel`'s folds, which the model hands it (never the model itself).

A new record kind rather than TensorRT-LLM's ``kv_event`` shape, because the two models of a tier differ: in
TensorRT-LLM a block lives in one tier at a time (``updated`` moves it), while vLLM's and SGLang's offload tiers
keep *copies*: a ``CPU`` BlockStored does not take the block off the GPU, which announces its own BlockRemoved
later. Translating one into the other would count every offload's GPU removal as a host eviction.

The fold (:class:`StreamFold`, one per TierModel, i.e. per source and rank) keeps, per tier, the set of live
block hashes with a reference count (a hash may be announced twice: vLLM's offloading docs ask consumers to
refcount, as Dynamo's router does), and counts moves into the counters of the TierModel's folds (handed to it,
not the model), so rates, history, the fleet table and every sink work unchanged:

- a host (``CPU``) store is an offload; a disk store is counted in the stream's own counters;
- a GPU store of a hash that a lower tier holds is an onboard (the block was loaded, not recomputed);
- a removal of a live hash is an eviction from its tier; of a hash the fold never saw, an unknown removal.

What it cannot know: an engine announces nothing for blocks it held before kvtop attached, and vLLM 0.33 has no
state snapshot (vllm#40363, PRs #50134/#57789 open). So unless the first batch seen has ``seq`` 0 (kvtop saw the
publisher from its start, or replayed from 0), every count is *since attach* (``since_attach``), and removals of
older blocks are unknown. A sequence gap that replay could not fill, or a publisher restart (``seq`` going back),
is counted; a restart clears the fold (a new engine process has an empty cache) and, with ``seq`` 0, makes it
exact again.

Capacities and hits are not in the stream: ``metrics`` records (``kvtop.sources.engine_metrics``: the engine's
Prometheus samples, verbatim) supply them where the engine exports them: ``vllm:cache_config_info``,
``vllm:kv_offload_config_info``, ``vllm:prompt_tokens_cached_by_source_total``, SGLang's ``sglang:*``, Dynamo's
frontend and KVBM. Hits arrive in tokens and are folded as blocks (tokens // tokens per block).

``summary`` records (``kvtop agent``) carry another kvtop's fold of a source, folded here as gauges and totals.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from itertools import islice
from typing import TYPE_CHECKING, Any

from kvtop.records import MAX_BLOCKS, MAX_MAGNITUDE
from kvtop.tiers.departures import add as add_reason
from kvtop.tiers.departures import nonzero, reason_of
from kvtop.tiers.state import Latency, TierState

if TYPE_CHECKING:
    from kvtop.tiers.common import Ledger
    from kvtop.tiers.events import EventFold
    from kvtop.tiers.requests import RequestFold
    from kvtop.tiers.stats import StatsFold

__all__ = [
    "MEDIUM_TIERS",
    "StreamFold",
    "tier_of",
]

_U64 = 1 << 64
_SEQ_LIMIT = 1 << 63  # seq is signed on the wire (vLLM packs it so, and -1 ends a replay answer): 2^63 and up is < 0
# A seq this far past the last one is not the same publisher's sequence: no engine drops 16.7M batches (46 h at
# 100 batches a second) to a subscriber that is still connected. The source skips it as a bad message and follows a
# jump only when the stream goes on from it (a batch then says ``"resync": true``); the fold refuses it otherwise.
MAX_SEQ_JUMP = 1 << 24

# The tiers below each one: a block leaving a tier while one of them holds its hash was offloaded (departures.py)
_LOWER = {"gpu": ("host", "disk", "external"), "host": ("disk", "external"), "disk": ("external",), "external": ()}
# medium (case-folded) -> kvtop tier. shared/engines-kv-events.md section 5.
MEDIUM_TIERS: dict[str, str] = {
    "gpu": "gpu",
    "cpu": "host", "cpu_pinned": "host",
    "storage": "disk", "disk": "disk",
    "external": "external",
}
TIERS = ("gpu", "host", "disk", "external")
_MEDIUM_TIER_CACHE: dict[str | None, str | None] = {None: "gpu", "GPU": "gpu", "CPU": "host"}

# Hit-token counters' tier labels, per engine and version (docs/engines.md says where each was read):
# vLLM's vllm:prompt_tokens_cached_by_source_total{source}: CacheHitSource (vllm/v1/metrics/cache_hit_source.py) in
# every release that has the metric (0.32.0, 0.33.0, 0.34.0): device, host, p2p (another vLLM instance), disk,
# external_unspecified; builds of the PR that added it (#56318) before it merged, its tests and benchmark
# harnesses used cpu, mixed (a range served by more than one tier) and external.
VLLM_SOURCES = {"device": "gpu", "host": "host", "disk": "disk", "p2p": "external",
                "external_unspecified": "external", "cpu": "host", "mixed": "external", "external": "external"}
# SGLang's sglang:cached_tokens_total{cache_source}: device, host, and the L3 storage as storage_<backend class>
# (0.5.9-0.5.19: storage_HiCacheFile, storage_MooncakeStore, storage_unknown...) or storage (0.5.20-0.5.23); total
# for a request without a per-tier breakdown (in 0.5.9 every hit of a server without HiCache: the GPU's; 0.5.16+
# always break it down); before 0.5.9 no cache_source label at all (the GPU's, with the host's in it where HiCache
# was on). Per request it is
# either the breakdown or total (metrics_collector.py observe_one_finished_request), so summing every label counts
# each cached token once.
SGLANG_SOURCES = {"device": "gpu", "host": "host", "storage": "disk", "total": "gpu", "": "gpu"}
UNKNOWN_TIER = "unknown"  # hits under a label kvtop does not know: counted as hits, and said (a problem)
_MAX_UNKNOWN = 64         # distinct unknown labels or media kept by name; more are counted under "(more)"
LAG_WINDOW_S = 10.0
# Live blocks the fold keeps per tier while the tier's capacity is unknown (~90 MB; a 0.5B model on one H200 has
# ~600k GPU blocks); with the capacity from /metrics, twice that (at least MIN, at most MAX)
LIVE_CAP = 1 << 20
LIVE_CAP_MIN = 4096
LIVE_CAP_MAX = 1 << 22


def tier_of(medium: Any) -> str | None:
    """The kvtop tier of an event's ``medium`` (None/missing: the GPU); ``None`` for a medium kvtop does not know."""
    if medium is None or medium == "":
        return "gpu"
    if not isinstance(medium, str):
        return None
    return MEDIUM_TIERS.get(medium.strip().lower())


def _describe(value: Any) -> str:
    # as the wire decoder names a value (kvtop/sources/kv_wire.py), not kvtop.tiers.common.describe's JSON: the
    # fold's messages read as they did when the two were one module
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


# ============================================================================================== the fold

def _count(value: Any) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, int) and value >= 0:
        return value
    if isinstance(value, float) and math.isfinite(value) and value >= 0:
        return int(value)
    return None


# What an agent's summary says that cannot be diffed from totals: its token rates (null: unknown to the agent too)
SUMMARY_TOKEN_RATES = ("prompt_tokens_per_s", "output_tokens_per_s", "ctx_tokens_per_s", "gen_tokens_per_s")
MAX_LATENCY_S = 1e6  # a TTFT past ~11 days is no measurement: unknown


def _nonnegative(value: Any, limit: float) -> float | None:
    """A finite number in [0, limit] as a float (a summary's figure, from outside); anything else is unknown."""
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    v = float(value)
    return v if math.isfinite(v) and 0.0 <= v <= limit else None


def _said_latency(said: Any) -> Latency:
    if not isinstance(said, Mapping):
        return Latency()
    count = _count(said.get("count")) or 0
    if count == 0:
        return Latency()
    return Latency(_nonnegative(said.get("p50_s"), MAX_LATENCY_S), _nonnegative(said.get("p99_s"), MAX_LATENCY_S),
                   min(count, MAX_BLOCKS))


def _reasons_in(raw: Any) -> dict[str, dict[str, int]]:
    """``{tier: {reason: count}}`` from another kvtop's summary, anything else in it left out."""
    out: dict[str, dict[str, int]] = {}
    if not isinstance(raw, Mapping):
        return out
    for tier, per in list(raw.items())[:8]:
        if isinstance(tier, str) and isinstance(per, Mapping):
            for reason, n in list(per.items())[:16]:
                v = _count(n)
                r = reason_of(reason)
                if v and r:
                    add_reason(out, tier[:20], r, v)
    return out


class _Counter:
    """A cumulative engine counter turned into kvtop's deltas (a counter going back = the engine restarted)."""

    __slots__ = ("last",)

    def __init__(self) -> None:
        self.last: float | None = None

    def delta(self, value: float | None) -> float:
        if value is None:
            return 0.0
        last = self.last
        self.last = value
        if last is None:
            return 0.0  # the first scrape is the baseline: counts are since attach
        return value - last if value >= last else value


class StreamFold:
    """The common stream's state for one source (see the module doc). Lives inside a TierModel, which hands it
    what it writes and reads, never itself: the ledger (``now``), the folds whose counters it writes (the event
    fold's moves and host hits, whose ``warming`` the model keeps current; the stats fold's hits, lookups and
    engine-counted moves; the request fold's completions), the meta dict (the pool sizes a capacity falls back
    to), the model's block size and bytes per block, and its window's restart."""

    def __init__(self, ledger: Ledger, *, moves: EventFold, stats: StatsFold, requests: RequestFold,
                 meta: Mapping[str, Any], tokens_per_block: Callable[[], int | None],
                 bytes_per_block: Callable[[], int | None], restart_window: Callable[[], None]):
        self._ledger = ledger
        self._moves = moves
        self._stats = stats
        self._requests = requests
        self._meta = meta
        self._tokens_per_block = tokens_per_block
        self._bytes_per_block = bytes_per_block
        self._restart_window = restart_window
        # tier -> {key: refcount}; key = the hash for KV cache group 0 (every non-hybrid model), else (group, hash):
        # no tuple per block on the hot path
        self.live: dict[str, dict[Any, int]] = {t: {} for t in TIERS}
        self.tier_tpb: dict[str, int] = {}        # tokens per block per tier (the events' block_size)
        self.batches = 0
        self.events = 0
        self.first_seq: int | None = None
        self.next_seq: int | None = None
        self.lost_batches = 0                     # from seq gaps replay did not fill
        self.replayed_batches = 0
        self.restarts = 0
        self.seq_jumps = 0                        # implausible seq jumps the source followed (a "resync" batch)
        # lag: how long the last live batch waited in kvtop (behind a replay) and how many waited after it; the
        # largest of the last LAG_WINDOW_S (model time) is what the dashboard and summary show, and the run's max
        self.lag_s = 0.0
        self.lag_batches = 0
        self._lag_at: float | None = None
        self.max_lag_s = 0.0
        self.max_lag_batches = 0
        self.duplicates = 0                       # stores of a hash already live (refcounted)
        self.unknown_removals = 0                 # removals of hashes stored before kvtop attached
        self.unknown_media: dict[str, int] = {}   # events under a medium kvtop does not know: skipped, said
        self.unknown_labels: dict[str, int] = {}  # hit counters' tier labels kvtop does not know (scrapes seen)
        self.bad_events = 0
        self.since_attach = True
        # Live blocks kept per tier at most (memory: ~90 B a block): twice the tier's capacity once /metrics gives
        # it, else LIVE_CAP; stores past it forget the oldest (``forgotten``)
        self.live_cap = dict.fromkeys(TIERS, LIVE_CAP)
        self.forgotten = dict.fromkeys(TIERS, 0)
        self.stored = dict.fromkeys(TIERS, 0)     # new hashes per tier
        self.removed = dict.fromkeys(TIERS, 0)
        self.onboarded_from = {"host": 0, "disk": 0, "external": 0}
        self.clears = 0
        # why blocks left each tier (kvtop/tiers/departures.py): said by a BlockRemoved ``reason`` or an
        # AllBlocksCleared; else inferred: offloaded when a lower tier holds the hash, evicted when none does
        self.left_said: dict[str, dict[str, int]] = {}
        self.left_inferred: dict[str, dict[str, int]] = {t: {"evicted": 0, "offloaded": 0} for t in TIERS}
        # each tier's lower tiers' live sets (the same dict objects for the fold's life: _clear_all clears them)
        self._below = {t: tuple(self.live[lower] for lower in _LOWER[t]) for t in TIERS}
        # metrics
        self.metrics_engine: str | None = None
        self.metrics_scrapes = 0
        self.capacity: dict[str, int] = {}        # tier -> blocks, from metrics
        self.in_use: dict[str, int] = {}          # tier -> blocks held by requests, from metrics
        self.used_gauge: dict[str, int] = {}      # tier -> resident blocks from an engine gauge (SGLang host)
        self.capacity_tokens: dict[str, int] = {}
        self.used_tokens: dict[str, int] = {}
        self.in_use_fraction: float | None = None
        self._counters: dict[str, _Counter] = {}  # "<page url> <counter>" -> its last value
        self._page = ""
        self._page_scrapes: dict[str, int] = {}
        self.hit_tokens: dict[str, float] = {}     # serving tier -> hit tokens since attach
        self.lookup_tokens = 0.0
        self._hits_written = 0
        self._lookups_written = 0
        self._host_hits_written = 0
        self.metric_moves = {"offloaded": 0.0, "onboarded": 0.0}
        self.extra: dict[str, float] = {}          # other engine gauges worth showing (KVBM hit rates)
        # summary (from an agent)
        self.summary: dict[str, Any] | None = None
        self.summary_seq: int | None = None
        self.summaries = 0
        self.summaries_lost = 0
        self.raw_ignored = 0
        self._sum_last: dict[str, int] = {}

    # ------------------------------------------------------------------------------------------ batches

    def apply(self, kind: str, data: Mapping[str, Any]) -> None:
        if kind != "summary" and self.summary is not None:
            # An agent run with --raw sends both for one source: its summary is the fold, the raw records are
            # for sinks (a recorder, a drill-down); folding both would count every move twice.
            self.raw_ignored += 1
            return
        if kind == "kv_batch":
            self.apply_batch(data)
        elif kind == "metrics":
            self.apply_metrics(data)
        elif kind == "summary":
            self.apply_summary(data)

    def _seq(self, seq: int, replayed: bool, resync: bool = False) -> None:
        if resync and self.first_seq is not None:
            # The source followed a jump past MAX_SEQ_JUMP: a new start whose batches in between are unknown
            self.seq_jumps += 1
            self._clear_all()
            self.since_attach = True
        elif self.first_seq is None:
            self.first_seq = seq
            self.since_attach = seq != 0
        elif self.next_seq is not None:
            if seq > self.next_seq:
                self.lost_batches += seq - self.next_seq
            elif seq < self.next_seq:
                # seq went back: the publisher restarted (a new engine process has an empty cache)
                self.restarts += 1
                self._clear_all()
                self.since_attach = seq != 0
        self.next_seq = seq + 1
        if replayed:
            self.replayed_batches += 1

    def _lag(self, lag: Any, behind: Any) -> None:
        if isinstance(lag, bool) or not isinstance(lag, (int, float)) or not 0 <= lag < 1e9:
            return
        n = behind if behind.__class__ is int and 0 <= behind < _U64 else 0
        now = self._ledger.now
        stale = self._stale_lag(now)
        if stale or lag >= self.lag_s:
            self.lag_s, self._lag_at = float(lag), now
            self.lag_batches = n if stale else max(n, self.lag_batches)
        self.max_lag_s = max(self.max_lag_s, float(lag))
        self.max_lag_batches = max(self.max_lag_batches, n)

    def _stale_lag(self, now: float | None) -> bool:
        at = self._lag_at
        return at is None or now is None or now - at >= LAG_WINDOW_S

    def recent_lag(self) -> tuple[float, int]:
        """The most a live batch waited in kvtop in the last ``LAG_WINDOW_S`` (model time), and the batches that
        waited after it then: (0.0, 0) once that is older."""
        if self._stale_lag(self._ledger.now):
            return 0.0, 0
        return self.lag_s, self.lag_batches

    def _forget(self, tier: str, live: dict[Any, int]) -> None:
        """More live blocks than a tier can hold: the oldest stores (an eighth of the bound more than the excess, so
        this runs once per many stores) are forgotten. Their removals will be unknown ones; the counts approximate."""
        n = len(live) - self.live_cap[tier] + self.live_cap[tier] // 8
        for key in list(islice(live, n)):
            del live[key]
        self.forgotten[tier] += n

    def _clear_all(self) -> None:
        for live in self.live.values():
            live.clear()

    def apply_batch(self, data: Mapping[str, Any]) -> None:
        seq = data.get("seq")
        events = data.get("events")
        if seq.__class__ is not int or not 0 <= seq < _SEQ_LIMIT:
            raise ValueError(f"seq: must be an integer in [0, 2^63), got {_describe(seq)}")
        if not isinstance(events, list):
            raise ValueError(f"events: must be a list, got {_describe(events)}")
        resync = data.get("resync") is True
        if not resync and self.next_seq is not None and seq - self.next_seq > MAX_SEQ_JUMP:
            raise ValueError(f"seq: {seq:,} is {seq - self.next_seq:,} batches past the next one expected "
                             f"({self.next_seq:,}), more than {MAX_SEQ_JUMP:,}: not this stream's")
        self._seq(seq, bool(data.get("replayed")), resync)
        lag = data.get("lag_s")
        if lag is not None:
            self._lag(lag, data.get("behind"))
        self.batches += 1
        bad = data.get("bad_events")
        if isinstance(bad, int) and bad > 0:
            self.bad_events += bad
        m = self._moves  # the TierModel's moves (kvtop/tiers/events.py)
        tiers = _MEDIUM_TIER_CACHE
        # The hot path (bench/JOURNAL.md, "The ZMQ attach at 10,000 events/s, halved"): ~0.1 us a hash, ~0.5 us an
        # event on the dev box. Per hash only what each one needs (a new hash, a repeated one: refcounted); per
        # event the counts, summed; the fold's dicts looked up once a batch; the lower tiers looked in only where
        # one holds anything. A store takes its own loop (group 0, no lower tier holding anything) or the long way
        # (_store_keys); tests/sources/test_kv_stream.py holds the two to a refcounted reference
        # (test_fold_agrees_with_a_refcounted_reference: groups 0 and 1, onboards from host and disk) and to the
        # tier's bound (test_a_tier_past_its_bound_forgets_its_oldest_once_an_event).
        live_of, stored_n, removed_n, tpb_of, cap_of = (self.live, self.stored, self.removed, self.tier_tpb,
                                                        self.live_cap)
        gpu_below = self._below["gpu"]
        n_events = 0
        try:
            for ev in events:
                if ev.__class__ is not dict and not isinstance(ev, Mapping):
                    self.bad_events += 1
                    continue
                etype = ev.get("type")
                if etype == "AllBlocksCleared":
                    # vLLM's reset_prefix_cache, SGLang's flush_cache, a worker restart: nothing is cached any
                    # more. Like Dynamo's router, every tier of this source is dropped; the fold is exact from here.
                    for tname, tlive in live_of.items():
                        if tlive:
                            add_reason(self.left_said, tname, "cleared", len(tlive))
                    self._clear_all()
                    self.clears += 1
                    self.since_attach = False
                    n_events += 1
                    continue
                hashes = ev.get("block_hashes")
                if hashes.__class__ is not list and not isinstance(hashes, list):
                    self.bad_events += 1
                    continue
                stored = etype == "BlockStored"
                if not stored and etype != "BlockRemoved":
                    self.bad_events += 1
                    continue
                medium = ev.get("medium")
                tier = tiers.get(medium) if medium.__class__ is str or medium is None else None
                if tier is None:
                    tier = tier_of(medium)
                    if medium.__class__ is str and len(tiers) < 64:
                        tiers[medium] = tier   # a medium's tier, remembered (the few spellings engines send)
                if tier is None:
                    self._unknown(self.unknown_media, str(medium)[:40])
                    continue
                group = ev.get("group_idx")
                g = group if group.__class__ is int else 0
                live = live_of[tier]
                n_events += 1
                if stored:
                    size = ev.get("block_size")
                    if size.__class__ is int and size > 0:
                        tpb_of[tier] = size
                    before = len(live)
                    if g == 0 and not (tier == "gpu" and (gpu_below[0] or gpu_below[1] or gpu_below[2])):
                        # the common case: no key to build, no lower tier to look in
                        dup = bad_h = 0
                        for h in hashes:
                            if h.__class__ is not int:
                                bad_h += 1
                                continue
                            n = live.get(h)
                            if n:
                                live[h] = n + 1
                                dup += 1
                            else:
                                live[h] = 1
                        new = len(live) - before
                    else:
                        new, dup, bad_h = self._store_keys(tier, live, hashes, g, m)
                    if len(live) > cap_of[tier]:
                        self._forget(tier, live)
                    stored_n[tier] += new
                    if dup:
                        self.duplicates += dup
                    if bad_h:
                        self.bad_events += bad_h
                    if tier == "host":
                        m.offloaded += new
                    continue
                said = reason_of(ev.get("reason")) if "reason" in ev else None
                before = len(live)
                unknown = 0
                if g == 0:
                    for h in hashes:
                        n = live.get(h) if h.__class__ is int else None
                        if n == 1:
                            del live[h]
                        elif not n:
                            unknown += 1
                        else:
                            live[h] = n - 1
                else:
                    for h in hashes:
                        key = (g, h)
                        n = live.get(key) if h.__class__ is int else None
                        if not n:
                            unknown += 1
                        elif n > 1:
                            live[key] = n - 1
                        else:
                            del live[key]
                gone = before - len(live)
                if gone:
                    removed_n[tier] += gone
                    if tier == "gpu":
                        m.evicted[0] += gone
                    elif tier == "host":
                        m.evicted[1] += gone
                if unknown:
                    self.unknown_removals += unknown
                    if tier == "gpu" or tier == "host":
                        m.evicted_unknown += unknown
                    # A removal of a hash kvtop never saw left its (stated) tier all the same
                    gone += unknown
                if not gone:
                    continue
                # Why they left, counted per event (no work per hash)
                if said is not None:
                    add_reason(self.left_said, tier, said, gone)
                    continue
                # offloaded: the gone hashes a lower tier holds (set operations in C, only where a lower tier
                # holds anything: none without offloading)
                held: set[Any] | None = None
                for lv in self._below[tier]:
                    if lv:
                        both = lv.keys() & (hashes if g == 0 else [(g, h) for h in hashes])
                        held = both if held is None else held | both
                if held:
                    # less those still held in this tier (refcounted): not gone. ``keys() & set`` walks the smaller
                    # of the two (``held -= live.keys()`` would walk every live block of the tier)
                    offloaded = len(held) - len(live.keys() & held)
                    self.left_inferred[tier]["offloaded"] += offloaded
                    gone -= offloaded
                self.left_inferred[tier]["evicted"] += gone
        finally:
            self.events += n_events

    def _store_keys(self, tier: str, live: dict[Any, int], hashes: list[Any], g: int,
                    m: EventFold) -> tuple[int, int, int]:
        """A store's hashes the long way (a KV cache group's keys, a GPU store that may be an onboard): (new,
        repeated, bad) hashes."""
        below: list[tuple[str, dict[Any, int]]] = [
            (lower, lv) for lower, lv in zip(_LOWER[tier], self._below[tier]) if lv] if tier == "gpu" else []
        new = dup = bad_h = 0
        for h in hashes:
            if h.__class__ is not int:
                bad_h += 1
                continue
            key = h if g == 0 else (g, h)
            n = live.get(key)
            if n:
                live[key] = n + 1
                dup += 1
                continue
            live[key] = 1
            new += 1
            for lower, lv in below:
                if key in lv:
                    # from the disk: a move of its own (the moves panel's disk row, Moves.disk_*)
                    if lower != "disk":
                        m.onboarded += 1
                    self.onboarded_from[lower] += 1
                    break
        return new, dup, bad_h

    # ------------------------------------------------------------------------------------------ metrics

    def _delta(self, name: str, value: float | None) -> float:
        if value is None:
            return 0.0
        key = f"{self._page} {name}"
        c = self._counters.get(key)
        if c is None:
            c = self._counters[key] = _Counter()
            if self._page_scrapes.get(self._page, 0) > 1:
                # Absent from an earlier scrape of this page, so created since: it counted from 0 after kvtop
                # attached (SGLang creates a cache_source label on its first increment; Dynamo's frontend its
                # histograms on the first request).
                c.last = 0.0
        return c.delta(value)

    def apply_metrics(self, data: Mapping[str, Any]) -> None:
        """One scrape. A capacity outside the records' bounds (a block count or block size over 2^40, a token
        count over 2^64: kvtop.records) raises ``ValueError`` before anything is folded: the model counts the
        record as bad, as it would a record carrying such a number."""
        samples = data.get("samples")
        if not isinstance(samples, list):
            raise ValueError(f"samples: must be a list, got {_describe(samples)}")
        # name -> [(labels, value)]
        by: dict[str, list[tuple[Mapping[str, Any], float]]] = {}
        for s in samples:
            if not isinstance(s, (list, tuple)) or len(s) != 3:
                continue
            name, labels, value = s
            if not isinstance(name, str) or not isinstance(labels, Mapping):
                continue
            if labels.get("tp_rank") not in (None, "0"):
                continue  # SGLang: every TP rank reports the same logical count; read one
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                continue
            by.setdefault(name, []).append((labels, float(value)))

        def total(name: str, **match: str) -> float | None:
            rows = by.get(name)
            if not rows:
                return None
            picked = [v for labels, v in rows if all(str(labels.get(k)) == w for k, w in match.items())]
            return sum(picked) if picked else None

        def bounded(what: str, value: float, limit: int) -> int:
            if not 0 <= value <= limit:  # NaN fails too
                raise ValueError(f"{what}: {value:g} is out of bounds (at most {limit:,}: kvtop.records)")
            return int(value)

        def label(name: str, key: str, limit: int) -> int | None:
            for labels, _v in by.get(name, ()):
                raw = labels.get(key)
                try:
                    n = float(str(raw))
                except (TypeError, ValueError):
                    continue
                if n >= 0 or n != n:
                    return bounded(f"{name}{{{key}}}", n, limit)
            return None

        def gauge(name: str, limit: int) -> int | None:
            v = total(name)
            return None if v is None else bounded(name, v, limit)

        # --- tokens per block and capacities, checked before anything is folded
        tpb = label("vllm:cache_config_info", "block_size", MAX_BLOCKS)
        if tpb is None:
            tpb = gauge("dynamo_frontend_model_kv_cache_block_size", MAX_BLOCKS)
        gpu_blocks = label("vllm:cache_config_info", "num_gpu_blocks", MAX_BLOCKS)
        if gpu_blocks is None:
            gpu_blocks = gauge("dynamo_frontend_model_total_kv_blocks", MAX_BLOCKS)
        cpu_chunks = label("vllm:kv_offload_config_info", "cpu_num_chunks", MAX_BLOCKS)
        cpu_tokens = None if cpu_chunks is not None else label("vllm:kv_offload_config_info",
                                                                "cpu_kv_cache_size_tokens", MAX_MAGNITUDE)
        sglang_tokens = {tier: gauge(name, MAX_MAGNITUDE) for name, tier in (
            ("sglang:max_total_num_tokens", "gpu"), ("sglang:hicache_host_total_tokens", "host"))}
        host_used = gauge("sglang:hicache_host_used_tokens", MAX_MAGNITUDE)

        engine = data.get("engine")
        self.metrics_engine = engine if isinstance(engine, str) else None
        self.metrics_scrapes += 1
        url = str(data.get("url", ""))
        self._page = url
        self._page_scrapes[url] = self._page_scrapes.get(url, 0) + 1
        if tpb:
            self.tier_tpb.setdefault("gpu", tpb)
        if gpu_blocks is not None:
            self.capacity["gpu"] = gpu_blocks
        if cpu_chunks is not None:
            self.capacity["host"] = cpu_chunks
        elif cpu_tokens is not None:
            self.capacity_tokens["host"] = cpu_tokens
        for tier, blocks in self.capacity.items():
            if tier in self.live_cap:
                self.live_cap[tier] = min(max(2 * blocks, LIVE_CAP_MIN), LIVE_CAP_MAX)
        for tier, tokens in sglang_tokens.items():
            if tokens is not None:
                self.capacity_tokens[tier] = tokens
        if host_used is not None:
            self.used_tokens["host"] = host_used
        usage = total("vllm:kv_cache_usage_perc")
        if usage is None:
            usage = total("sglang:token_usage")
        if usage is not None and 0.0 <= usage <= 1.0:
            self.in_use_fraction = usage
        # --- hits (tokens), by the tier that served them
        lookups = total("vllm:prefix_cache_queries_total")
        if lookups is None:
            lookups = total("sglang:prompt_tokens_total")
        if lookups is None:
            lookups = total("dynamo_frontend_input_sequence_tokens_sum")
        # counter key -> (tier, value): every label value the page has, each a tier kvtop knows or UNKNOWN_TIER
        hit_parts: dict[str, tuple[str, float | None]] = {}
        if "vllm:prompt_tokens_cached_by_source_total" in by:
            self._label_parts(hit_parts, by, "vllm:prompt_tokens_cached_by_source_total", "source", VLLM_SOURCES)
        elif "sglang:cached_tokens_total" in by:
            self._label_parts(hit_parts, by, "sglang:cached_tokens_total", "cache_source", SGLANG_SOURCES)
        elif "vllm:prefix_cache_hits_total" in by:
            hit_parts["vllm:device"] = ("gpu", total("vllm:prefix_cache_hits_total"))
        elif "dynamo_frontend_cached_tokens_sum" in by:
            hit_parts["dynamo:device"] = ("gpu", total("dynamo_frontend_cached_tokens_sum"))
        for name, (tier, value) in hit_parts.items():
            d = self._delta(name, value)
            self.hit_tokens[tier] = self.hit_tokens.get(tier, 0.0) + d
        self.lookup_tokens += self._delta("lookups", lookups)
        # --- moves from Dynamo KVBM (blocks): they win over the events' moves, like newer TensorRT-LLM's stats
        # KVBM's counters carry no _total; prometheus_client's parser adds it to any TYPE counter: either name
        d2h = total("kvbm_offload_blocks_d2h")
        d2h = total("kvbm_offload_blocks_d2h_total") if d2h is None else d2h
        h2d = total("kvbm_onboard_blocks_h2d")
        h2d = total("kvbm_onboard_blocks_h2d_total") if h2d is None else h2d
        if d2h is not None or h2d is not None:
            self.metric_moves["offloaded"] += self._delta("kvbm:d2h", d2h)
            self.metric_moves["onboarded"] += self._delta("kvbm:h2d", h2d)
            self._stats.moves_seen = True
            self._stats.offloaded = int(self.metric_moves["offloaded"])
            self._stats.onboarded = int(self.metric_moves["onboarded"])
        # KVBM's disk (G3) counters (Dynamo lib/runtime/src/metrics/prometheus_names.rs, kvbm: offload_blocks_h2d
        # "from host to disk", offload_blocks_d2d "from device to disk (bypassing host memory)", onboard_blocks_d2d
        # "from disk to device"; onboard_blocks_d2h, KVBM v2's disk -> host staging, PR #8845). Note the two
        # "d2d": the offload one is device -> disk, the onboard one disk -> device.
        disk = {name: self._kvbm(total, name) for name in (
            "kvbm_offload_blocks_h2d", "kvbm_offload_blocks_d2d", "kvbm_onboard_blocks_d2d", "kvbm_onboard_blocks_d2h")}
        if any(v is not None for v in disk.values()):
            for name, v in disk.items():
                self.metric_moves[name] = self.metric_moves.get(name, 0.0) + self._delta(name, v)
            st = self._stats
            st.disk_moves_seen = True
            st.disk_offloaded = int(self.metric_moves["kvbm_offload_blocks_h2d"]
                                    + self.metric_moves["kvbm_offload_blocks_d2d"])
            st.disk_onboarded = int(self.metric_moves["kvbm_onboard_blocks_d2d"])
            st.disk_prefetched = int(self.metric_moves["kvbm_onboard_blocks_d2h"])
        for name in ("kvbm_host_cache_hit_rate", "kvbm_disk_cache_hit_rate", "vllm:kv_offload_cpu_cache_usage_perc"):
            v = total(name)
            if v is not None:
                self.extra[name] = v
        self._write_hits()

    def _label_parts(self, parts: dict[str, tuple[str, float | None]],
                     by: Mapping[str, list[tuple[Mapping[str, Any], float]]], name: str, label: str,
                     tiers: Mapping[str, str]) -> None:
        """Every value of ``label`` the page has for counter ``name``, summed per value, with its tier; a value
        kvtop does not know is a hit of UNKNOWN_TIER, named in ``unknown_labels`` (the session says it: a
        problem, never a silent drop)."""
        sums: dict[str, float] = {}
        for labels, v in by.get(name, ()):
            src = str(labels.get(label, ""))
            sums[src] = sums.get(src, 0.0) + v
        for src, v in sums.items():
            tier = tiers.get(src)
            if tier is None and tiers is SGLANG_SOURCES and src.startswith("storage_"):
                tier = "disk"   # storage_<backend class> (SGLang 0.5.9-0.5.19)
            if tier is None:
                tier = UNKNOWN_TIER
                self._unknown(self.unknown_labels, f'{name}{{{label}="{src[:40]}"}}')
            parts[f"{name}{{{src}}}"] = (tier, v)

    @staticmethod
    def _unknown(seen: dict[str, int], name: str) -> None:
        if name not in seen and len(seen) >= _MAX_UNKNOWN:
            name = "(more)"
        seen[name] = seen.get(name, 0) + 1

    @property
    def unknown_seen(self) -> int:
        """How often a label or medium kvtop does not know came (scrapes with such a label, events with such a
        medium): the session turns a change into a problem (kvtop/session.py)."""
        return sum(self.unknown_labels.values()) + sum(self.unknown_media.values())

    @staticmethod
    def _kvbm(total: Any, name: str) -> float | None:
        """A KVBM counter by its own name (no ``_total``) or with the ``_total`` prometheus_client's parser adds to
        any counter it reads with a TYPE line."""
        v = total(name)
        return total(f"{name}_total") if v is None else v

    def _write_hits(self) -> None:
        """Hit tokens since attach -> the TierModel's block counters (hits, lookups, host hits)."""
        tpb = self._tpb("gpu")
        if not tpb:
            return  # held until the block size is known (the first BlockStored or cache_config_info)
        st, ev = self._stats, self._moves
        hits = int(sum(self.hit_tokens.values()) // tpb)
        lookups = int(self.lookup_tokens // tpb)
        host = int(self.hit_tokens.get("host", 0.0) // tpb)
        dh, dl, dhh = hits - self._hits_written, lookups - self._lookups_written, host - self._host_hits_written
        self._hits_written, self._lookups_written, self._host_hits_written = hits, lookups, host
        if dh > 0:
            st.reuse_seen = True
        if ev.warming:
            st.warm_hits += dh
            st.warm_lookups += dl
            ev.warm_host_hits += dhh
            st.warm_host_hits += dhh
        else:
            st.hits += dh
            st.lookups += dl
            # Host hits from the engine's own counter; written to both of the TierModel's host-hit sources (it
            # reads one of them, never their sum), and the events' onboards never add to them.
            ev.host_hits += dhh
            st.host_hits += dhh

    # ------------------------------------------------------------------------------------------ summaries

    def apply_summary(self, data: Mapping[str, Any]) -> None:
        tiers = data.get("tiers")
        if not isinstance(tiers, Mapping):
            raise ValueError(f"tiers: must be an object, got {_describe(tiers)}")
        seq = data.get("seq")
        if seq.__class__ is int:
            if self.summary_seq is not None and seq > self.summary_seq + 1:
                self.summaries_lost += seq - self.summary_seq - 1
            self.summary_seq = seq
        self.summaries += 1
        self.summary = dict(data)
        totals = data.get("totals")
        if not isinstance(totals, Mapping):
            totals = {}
        d: dict[str, int] = {}
        for key in ("hits", "lookups", "host_hits", "offloaded", "onboarded", "evicted_gpu", "evicted_host",
                    "evicted_unknown", "completed", "failed", "disk_prefetched", "disk_onboarded", "disk_offloaded"):
            v = _count(totals.get(key))
            if v is None:
                continue
            last = self._sum_last.get(key)
            self._sum_last[key] = v
            # A total going back is an agent restart: its new total is what happened since. The first summary's
            # totals are counts since the agent attached, unless raw records of this source were folded here
            # before it (--raw): they counted those moves already, so the first summary is only the baseline.
            if last is None:
                d[key] = 0 if self.batches or self.metrics_scrapes else v
            else:
                d[key] = v - last if v >= last else v
        st, ev, rq = self._stats, self._moves, self._requests
        st.hits += d.get("hits", 0)
        st.lookups += d.get("lookups", 0)
        ev.host_hits += d.get("host_hits", 0)
        st.host_hits += d.get("host_hits", 0)
        ev.offloaded += d.get("offloaded", 0)
        ev.onboarded += d.get("onboarded", 0)
        ev.evicted[0] += d.get("evicted_gpu", 0)
        ev.evicted[1] += d.get("evicted_host", 0)
        ev.evicted_unknown += d.get("evicted_unknown", 0)
        rq.completed += d.get("completed", 0)
        rq.failed += d.get("failed", 0)
        if any(k in totals for k in ("disk_prefetched", "disk_onboarded", "disk_offloaded")):
            # the agent's disk moves: the engine's own counters, as there
            st.disk_moves_seen = True
            st.disk_prefetched += d.get("disk_prefetched", 0)
            st.disk_onboarded += d.get("disk_onboarded", 0)
            st.disk_offloaded += d.get("disk_offloaded", 0)
        if d.get("hits"):
            st.reuse_seen = True
        tpb = _count(data.get("tokens_per_block"))
        if tpb:
            self.tier_tpb.setdefault("gpu", tpb)
        if self.summaries == 1 and self._ledger.now is not None:
            # The first summary's totals are counts since the agent attached, not moves of this instant: the rate
            # window and the history start after them (an older retained meta would otherwise make them a spike).
            self._restart_window()

    def said_ttft(self) -> tuple[Latency, Latency] | None:
        """TTFT as the agent measured it (its summaries' ``ttft``): since its start, and over its window. ``None``
        for a source not fed by summaries; unknown (no count) for a summary without one (an older agent)."""
        if self.summary is None:
            return None
        said = self.summary.get("ttft")
        window = said.get("window") if isinstance(said, Mapping) else None
        return _said_latency(said), _said_latency(window)

    def said_token_rates(self) -> dict[str, float | None] | None:
        """The agent's token rates (``None`` each where the agent did not know it, or an older agent sent none);
        ``None`` for a source not fed by summaries."""
        if self.summary is None:
            return None
        rates = self.summary.get("rates")
        if not isinstance(rates, Mapping):
            rates = {}
        return {k: _nonnegative(rates.get(k), MAX_MAGNITUDE) for k in SUMMARY_TOKEN_RATES}

    # ------------------------------------------------------------------------------------------ read side

    def left_reasons(self) -> tuple[dict[str, dict[str, int]], dict[str, dict[str, int]]]:
        """Why blocks left each tier since attach: (said by the engine, inferred by kvtop), zeros left out; from an
        agent's summary where one feeds this source (none from an agent that does not send them)."""
        if self.summary is not None:
            left = self.summary.get("left")
            if not isinstance(left, Mapping):
                return {}, {}
            return _reasons_in(left.get("said")), _reasons_in(left.get("inferred"))
        return nonzero(self.left_said), nonzero(self.left_inferred)

    @property
    def events_seen(self) -> bool:
        return self.batches > 0 or (self.summary is not None and bool(self.summary.get("events_seen")))

    @property
    def approximate(self) -> bool:
        if self.summary is not None:
            return bool(self.summary.get("approximate"))
        return (self.since_attach or self.lost_batches > 0 or self.unknown_removals > 0
                or any(self.forgotten.values()))

    def cached(self, tier: str) -> int:
        return len(self.live[tier])

    def _tpb(self, tier: str) -> int | None:
        # A tier's own block size, else the GPU's, else any tier's (SGLang's host pages are its GPU pages)
        tpb = self.tier_tpb
        return tpb.get(tier) or tpb.get("gpu") or next(iter(tpb.values()), None) or self._tokens_per_block()

    def _from_tokens(self, tokens: int | None, tier: str) -> int | None:
        tpb = self._tpb(tier)
        if tokens is None or not tpb:
            return None
        return tokens // tpb

    def tier_state(self, tier: str) -> TierState:
        tpb = self._tpb(tier)
        bpb = self._bytes_per_block()
        if self.summary is not None:
            s = self.summary.get("tiers", {}).get(tier)
            if not isinstance(s, Mapping):
                return TierState(tier, None, None, None, None, tpb, bpb, False)
            return TierState(tier, _count(s.get("capacity_blocks")), _count(s.get("in_use_blocks")),
                             _count(s.get("cached_blocks")), _count(s.get("free_blocks")), tpb, bpb,
                             bool(s.get("cached_approximate")))
        cap = self.capacity.get(tier)
        if cap is None:
            cap = self._from_tokens(self.capacity_tokens.get(tier), tier)
        if cap is None:
            meta = self._meta.get({"gpu": "primary_blocks", "host": "secondary_blocks"}.get(tier, ""))
            cap = meta if isinstance(meta, int) else None
        cached: int | None = None
        gauge = self._from_tokens(self.used_tokens.get(tier), tier)
        if gauge is not None:
            cached = gauge  # the engine's own residency gauge (SGLang's host tier) beats a since-attach count
        elif self.batches > 0:
            cached = self.cached(tier)
        if cached is not None and cap is not None:
            cached = min(cached, cap)
        in_use: int | None = None
        if tier == "gpu" and self.in_use_fraction is not None and cap is not None:
            in_use = round(self.in_use_fraction * cap)
        free = cap - in_use if cap is not None and in_use is not None else None
        return TierState(tier, cap, in_use, cached, free, tpb, bpb, self.approximate and gauge is None)

    def tiers_present(self) -> list[str]:
        """Tiers beyond GPU and host that this source has (disk, external), for the summary."""
        out = []
        for tier in ("disk", "external"):
            if self.live[tier] or self.stored[tier] or tier in self.capacity or tier in self.capacity_tokens or (
                    self.summary is not None and tier in self.summary.get("tiers", {})):
                out.append(tier)
        return out

    def hits_by_tier(self) -> dict[str, int]:
        """Hit blocks since attach per serving tier (the engine's token counters // tokens per block)."""
        tpb = self._tpb("gpu")
        return {t: int(v // tpb) for t, v in sorted(self.hit_tokens.items())} if tpb else {}

    def to_json(self) -> dict[str, Any]:
        tpb = self._tpb("gpu")
        hits_by_tier = self.hits_by_tier()
        lag_s, lag_batches = self.recent_lag()
        return {
            "since_attach": self.since_attach if self.summary is None else bool(self.summary.get("since_attach")),
            "batches": self.batches, "events": self.events, "first_seq": self.first_seq,
            "last_seq": None if self.next_seq is None else self.next_seq - 1,
            "lost_batches": self.lost_batches, "replayed_batches": self.replayed_batches,
            "publisher_restarts": self.restarts, "seq_jumps": self.seq_jumps, "clears": self.clears,
            # lag: the most a live batch waited in kvtop (behind a replay) in the last 10 s, with the batches
            # that waited after it; and the run's most
            "lag_s": lag_s, "lag_batches": lag_batches, "max_lag_s": self.max_lag_s,
            "max_lag_batches": self.max_lag_batches, "duplicates": self.duplicates,
            "unknown_removals": self.unknown_removals, "unknown_media": dict(self.unknown_media),
            "unknown_labels": dict(self.unknown_labels),
            "bad_events": self.bad_events,
            "stored_blocks": dict(self.stored), "removed_blocks": dict(self.removed),
            "forgotten_blocks": dict(self.forgotten),
            "onboarded_from": dict(self.onboarded_from),
            "metrics_engine": self.metrics_engine, "metrics_scrapes": self.metrics_scrapes,
            "hit_blocks_by_tier": hits_by_tier, "lookup_blocks": int(self.lookup_tokens // tpb) if tpb else None,
            "engine_gauges": dict(self.extra),
            "summaries": self.summaries, "summaries_lost": self.summaries_lost, "raw_ignored": self.raw_ignored,
        }
