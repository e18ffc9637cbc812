"""The fold's read-side value types: what a sink reads of a tier, the moves, hit rates, rates, requests, quality.

Immutable dataclasses with no behaviour beyond unit conversions and ``to_json``; the model and its folds
(kvtop/tiers/model.py, capacity.py, requests.py; stream.py) build them, and no fold's internals leak
through them.
"""

from __future__ import annotations

from dataclasses import asdict, field
from typing import Any

from kvtop.values import frozen

# A tier's name -> the label the dashboard, the report and the text summary show. Tiers are a list (GPU, host,
# disk when the engine has one), so a sink draws what ``TierModel.tiers`` holds rather than two fixed panels.
TIER_LABELS = {"gpu": "GPU", "host": "Host", "disk": "Disk"}


# ------------------------------------------------------------------------------------------------ read-side types

@frozen
class TierState:
    """One tier's blocks (``None`` = unknown), with tokens and bytes once the block size is known."""

    name: str
    capacity_blocks: int | None
    in_use_blocks: int | None
    cached_blocks: int | None
    free_blocks: int | None
    tokens_per_block: int | None = None
    bytes_per_block: int | None = None
    cached_approximate: bool = False
    medium: str | None = None  # what holds the tier's data when it is not the usual (a host tier sent to files)

    @property
    def label(self) -> str:
        """What a person reads: "GPU", "Host", "Disk" (the name itself for a tier kvtop has no label for)."""
        return TIER_LABELS.get(self.name, self.name)

    def bytes(self, blocks: int | None) -> int | None:
        if blocks is None or self.bytes_per_block is None:
            return None
        return blocks * self.bytes_per_block

    def tokens(self, blocks: int | None) -> int | None:
        if blocks is None or self.tokens_per_block is None:
            return None
        return blocks * self.tokens_per_block

    @property
    def capacity_bytes(self) -> int | None:
        return self.bytes(self.capacity_blocks)

    @property
    def in_use_bytes(self) -> int | None:
        return self.bytes(self.in_use_blocks)

    @property
    def cached_bytes(self) -> int | None:
        return self.bytes(self.cached_blocks)

    @property
    def free_bytes(self) -> int | None:
        return self.bytes(self.free_blocks)

    @property
    def capacity_tokens(self) -> int | None:
        return self.tokens(self.capacity_blocks)

    @property
    def cached_tokens(self) -> int | None:
        return self.tokens(self.cached_blocks)

    def to_json(self) -> dict[str, Any]:
        return {
            "capacity_blocks": self.capacity_blocks, "in_use_blocks": self.in_use_blocks,
            "cached_blocks": self.cached_blocks, "free_blocks": self.free_blocks,
            "capacity_bytes": self.capacity_bytes, "in_use_bytes": self.in_use_bytes,
            "cached_bytes": self.cached_bytes, "free_bytes": self.free_bytes,
            "cached_approximate": self.cached_approximate,
            **({"medium": self.medium} if self.medium is not None else {}),
        }


@frozen
class Moves:
    """Block moves since the fold started (totals; kvtop's own, so they continue across engine restarts)."""

    offloaded_blocks: int = 0
    onboarded_blocks: int = 0
    evicted_gpu_blocks: int = 0
    evicted_host_blocks: int = 0
    evicted_unknown_blocks: int = 0   # removed hashes the fold did not know (after dropped events)
    source: str = "events"            # "events" (1.0-1.2) or "stats" (newer kvCacheIterationStats)
    # The disk tier's moves, where the engine reports them (``disk``: it does): disk -> host (TensorRT-LLM V2's
    # iterDiskPrefetchBlocks, Dynamo KVBM's onboard_blocks_d2h), disk -> GPU (KVBM onboard_blocks_d2d; a GPU store
    # of a block the stream holds on disk only), and into the disk (KVBM offload_blocks_h2d + _d2d; vLLM STORAGE /
    # SGLang DISK stores)
    disk_prefetched_blocks: int = 0
    disk_onboarded_blocks: int = 0
    disk_offloaded_blocks: int = 0
    disk: bool = False
    # Why blocks left their tier, {tier: {reason: blocks}} (kvtop/tiers/departures.py): as the engine's events say
    # it, and as kvtop inferred it where they do not (vLLM's and SGLang's BlockRemoved carry no reason)
    left_said: dict[str, dict[str, int]] = field(default_factory=dict)
    left_inferred: dict[str, dict[str, int]] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@frozen
class HitRate:
    """Block hit rates, warm-up excluded: cumulative and over the window, split by the tier that served the hit."""

    cumulative: float | None = None
    window: float | None = None
    gpu: float | None = None
    host: float | None = None
    window_gpu: float | None = None
    window_host: float | None = None
    hits: int = 0
    lookups: int = 0
    host_hits: int = 0
    # the disk tier's share, where the engine says which tier served each hit (TensorRT-LLM V2 by cache level,
    # vLLM's prompt_tokens_cached_by_source, SGLang's cached_tokens_total): then ``gpu`` is what neither lower
    # tier served; None where the engine has no disk tier or does not say
    disk: float | None = None
    window_disk: float | None = None
    disk_hits: int = 0
    # served from outside this engine (vLLM's p2p and external_unspecified, SGLang's EXTERNAL, a label kvtop does
    # not know), where the engine says so; None until any was
    external: float | None = None
    window_external: float | None = None
    external_hits: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@frozen
class Rates:
    """Per-second rates over the sliding window (``None`` until two instants are seen)."""

    window_s: float | None = None
    offloaded_per_s: float | None = None
    onboarded_per_s: float | None = None
    evicted_gpu_per_s: float | None = None
    evicted_host_per_s: float | None = None
    hits_per_s: float | None = None
    lookups_per_s: float | None = None
    requests_per_s: float | None = None
    failed_per_s: float | None = None
    prompt_tokens_per_s: float | None = None
    output_tokens_per_s: float | None = None
    ctx_tokens_per_s: float | None = None     # engine-side, from the stats (numCtxTokens)
    gen_tokens_per_s: float | None = None     # engine-side, from the stats (numGenRequests, beam width 1)
    offloaded_bytes_per_s: float | None = None
    onboarded_bytes_per_s: float | None = None
    disk_prefetched_per_s: float | None = None   # disk -> host
    disk_onboarded_per_s: float | None = None    # disk -> GPU
    disk_offloaded_per_s: float | None = None    # into the disk

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@frozen
class HistoryPoint:
    """One step of the coarse history: rates over ``[t - step, t]``."""

    t: float
    hit_rate: float | None
    host_hit_rate: float | None
    offloaded_per_s: float
    onboarded_per_s: float
    evicted_gpu_per_s: float
    evicted_host_per_s: float
    requests_per_s: float
    output_tokens_per_s: float
    disk_prefetched_per_s: float = 0.0
    disk_onboarded_per_s: float = 0.0
    disk_offloaded_per_s: float = 0.0


@frozen
class Latency:
    p50_s: float | None = None
    p99_s: float | None = None
    count: int = 0

    def to_json_ms(self) -> dict[str, float | None]:
        return {"p50": None if self.p50_s is None else self.p50_s * 1000.0,
                "p99": None if self.p99_s is None else self.p99_s * 1000.0}


@frozen(slots=True)
class RequestRow:
    """One request as the requests view shows it: finished (a ``request`` record: done or failed) or in flight
    (the engine's ``requestStats``: queued, prefill, decode). None is unknown."""

    key: str                          # its id as text (the driver's or the server's; the engine's in flight)
    state: str                        # "done", "failed", "queued", "prefill", "decode", "paused"
    t: float | None                   # when it finished (model time); None in flight
    prompt_tokens: int | None
    output_tokens: int | None
    reused_blocks: int | None         # prompt blocks reused, from whichever tier
    gpu_blocks: int | None            # ...of them found on the GPU
    host_blocks: int | None           # ...onboarded from host memory
    disk_blocks: int | None           # ...loaded from disk
    ttft_s: float | None
    e2e_s: float | None
    priority: int | None
    error: str | None


@frozen
class Requests:
    completed: int = 0
    failed: int = 0
    warmup: int = 0                       # request records left out of the percentiles
    in_flight: int | None = None          # from the stats: numActiveRequests + numQueuedRequests
    ttft: Latency = field(default_factory=Latency)
    e2e: Latency = field(default_factory=Latency)
    window_ttft: Latency = field(default_factory=Latency)
    window_e2e: Latency = field(default_factory=Latency)
    prompt_tokens: int = 0
    output_tokens: int = 0
    last_error: str | None = None
    # TTFT by where each request's prefix came from (kvtop.tiers.requests.PREFIX_SOURCES), the classes with
    # requests: (source, since start, over the window)
    ttft_by_source: tuple[tuple[str, Latency, Latency], ...] = ()
    # The requests view's rows: the last RECENT_REQUESTS finished (newest last), and the engine's in flight
    # (its requestStats, where it sends them: enable_iter_req_stats)
    recent: tuple[RequestRow, ...] = ()
    running: tuple[RequestRow, ...] = ()

    def ttft_by_source_json(self) -> dict[str, dict[str, Any]]:
        """``requests.ttft_ms_by_source`` of the JSON summary: per class, count and p50 / p99 in ms since the
        start, and the same over the window."""
        out: dict[str, dict[str, Any]] = {}
        for source, whole, win in self.ttft_by_source:
            out[source] = {"count": whole.count, **whole.to_json_ms(),
                           "window": {"count": win.count, **win.to_json_ms()}}
        return out


@frozen
class GpuDevice:
    index: int
    name: str | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    time: float
    data: dict[str, Any]


@frozen
class HostMemory:
    rss_bytes: int | None           # the engine process's resident memory (pinned pages show here, as shared)
    available_bytes: int | None     # the system's available memory
    pinned_pool_bytes: int | None   # the engine's pinned host pool (as reported, or pool size x bytes per block)
    time: float
    data: dict[str, Any]            # the record's data, verbatim
    total_bytes: int | None = None  # the system's total memory


@frozen
class Quality:
    events_seen: bool = False
    events_dropped: int = 0              # from event id gaps
    counts_approximate: bool = False     # event-folded counts may be off (drops, mid-stream attach, unknowns)
    cached_approximate: bool = False     # cached counts are an upper bound (see the module docstring)
    unknown_hashes: int = 0
    unknown_parents: int = 0             # stored events whose parent the fold did not hold
    stale_cached_dropped: int = 0        # fold entries proven gone by later events (silent detaches)
    pruned_entries: int = 0              # fold entries dropped to keep memory bounded
    duplicate_events: int = 0
    event_restarts: int = 0
    stats_restarts: int = 0
    stats_iterations_missing: int = 0    # gaps in the stats' "iter": another reader drained them, or an overflow
    host_without_events: bool = False    # a host pool is configured but no event stream: host occupancy unknown
    capacity_source: str | None = None   # where the GPU capacity came from: stats, created, meta, derived
    stats_schema: str | None = None      # which TensorRT-LLM's stats shape: 1.0-1.2, 1.3, 1.3+ V2 (see TierModel)
    stats_max_includes_host: bool | None = None  # 1.0-1.2 semantics of maxNumBlocks, when it can be told

    def to_json(self) -> dict[str, Any]:
        return asdict(self)
