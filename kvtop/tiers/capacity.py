"""The tiers' sizes and occupancy, read from the folds: each tier's capacity and where it came from, the
``TierState`` of GPU, host, disk and the V2 manager's merged cold tier, the cached blocks per priority, and the
``Quality`` of those numbers.

Capacity sources, best first (kvtop/tiers/model.py's docstring says why): newer stats' ``*MaxNumBlocks``, the
``created`` events, ``meta``, else derived from 1.0-1.2's ``maxNumBlocks`` (primary + secondary). Read-only: these
functions read the folds' public state through the model and change nothing.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from kvtop.tiers.events import GPU, HOST
from kvtop.tiers.state import Quality, TierState

if TYPE_CHECKING:
    from kvtop.tiers.model import TierModel


def meta_blocks(m: TierModel, blocks_key: str, bytes_key: str) -> int | None:
    """A pool's size in blocks from ``meta``: given in blocks, or in bytes once the block size is known."""
    n = m.meta.get(blocks_key)
    if isinstance(n, int):
        return n
    size, bpb = m.meta.get(bytes_key), m.bytes_per_block
    if isinstance(size, int) and size >= 0 and bpb is not None:
        return size // bpb
    return None


def cold_merged(m: TierModel) -> bool:
    """True when the stats' ``secondary*`` gauges are host and disk together (the V2 manager sums every cold
    level into them, kv_cache_stats.py ``_build_stats``), so neither tier's share can be read from them."""
    return m.stats_fold.shape == "1.3+ V2" and disk(m) is not None


def capacity(m: TierModel, level: int) -> tuple[int | None, str | None]:
    it = m.stats_fold.it
    key = "primaryMaxNumBlocks" if level == GPU else "secondaryMaxNumBlocks"
    if level == HOST and cold_merged(m):
        host_meta = meta_blocks(m, "secondary_blocks", "host_cache_bytes")
        if host_meta is not None:
            return host_meta, "meta"
        disk = meta_blocks(m, "disk_blocks", "disk_cache_bytes")
        if it is not None and key in it and disk is not None:
            return max(it[key] - disk, 0), "derived"
        return None, None
    direct = capacity_known(m, level)
    if direct[0] is not None:
        return direct
    # 1.0-1.2: maxNumBlocks = primary + secondary, so either one gives the other.
    other, _ = (capacity_known(m, HOST) if level == GPU else capacity_known(m, GPU))
    if m.stats_fold.max_num_blocks is not None and other is not None:
        return max(m.stats_fold.max_num_blocks - other, 0), "derived"
    return None, None


def capacity_known(m: TierModel, level: int) -> tuple[int | None, str | None]:
    """Capacity from a direct source only (no derivation), to derive the other tier from."""
    it = m.stats_fold.it
    key = "primaryMaxNumBlocks" if level == GPU else "secondaryMaxNumBlocks"
    if it is not None and key in it:
        return it[key], "stats"
    created = m.event_fold.created_capacity(level)
    if created is not None:
        return created, "created"
    meta = m.meta.get("primary_blocks") if level == GPU else meta_blocks(m, "secondary_blocks",
                                                                                 "host_cache_bytes")
    return (meta, "meta") if isinstance(meta, int) else (None, None)


def gpu(m: TierModel) -> TierState:
    if m.stream_fold is not None:
        return m.stream_fold.tier_state("gpu")  # type: ignore[no-any-return]
    cap, _ = capacity(m, GPU)
    it = m.stats_fold.it
    free = it["primaryFreeNumBlocks"] if it is not None and "primaryFreeNumBlocks" in it else \
        m.stats_fold.free_num_blocks
    in_use = max(cap - free, 0) if cap is not None and free is not None else None
    cached = None
    if m.events_seen:
        cached = m.event_fold.cached(GPU)
        if cap is not None:
            cached = min(cached, cap)
    return TierState("gpu", cap, in_use, cached, free, m.tokens_per_block, m.bytes_per_block,
                     m.cached_approximate)


def host(m: TierModel) -> TierState:
    st = _host(m)
    medium = m.meta.get("secondary_medium")
    # KvCacheRetentionConfig(transfer_mode=GDS / POSIX_DEBUG_FALLBACK) offloads into files: same blocks, disk
    return replace(st, medium=medium) if isinstance(medium, str) else st


def _host(m: TierModel) -> TierState:
    if m.stream_fold is not None:
        return m.stream_fold.tier_state("host")  # type: ignore[no-any-return]
    cap, _ = capacity(m, HOST)
    it = m.stats_fold.it
    tpb, bpb = m.tokens_per_block, m.bytes_per_block
    free: int | None
    in_use: int | None
    if cold_merged(m):
        return TierState("host", cap, None, None, None, tpb, bpb, False)
    if it is not None and "secondaryFreeNumBlocks" in it:
        free = it["secondaryFreeNumBlocks"]
        in_use = max(cap - free, 0) if cap is not None else None
    elif cap == 0:
        return TierState("host", 0, 0, 0, 0, tpb, bpb, False)
    elif m.events_seen:
        in_use = 0
        free = cap
    else:
        return TierState("host", cap, None, None, None, tpb, bpb, False)
    cached = None
    if m.events_seen:
        cached = m.event_fold.cached(HOST)
        if cap is not None:
            cached = min(cached, cap)
    return TierState("host", cap, in_use, cached, free, tpb, bpb, m.cached_approximate)


def disk(m: TierModel) -> TierState | None:
    """The third tier (TensorRT-LLM's disk cache: ``KvCacheConfig.disk_cache_size``, V2 manager only), or
    ``None`` when the engine has none. Known from ``meta`` (the configured size) or from the stats'
    ``kvCacheLevelTiers`` naming a "disk" level. Its occupancy is unknown: the V2 stats sum it with the host's
    (see ``cold``); its capacity is the configured size, or the cold pools' total less the host's."""
    if m.stream_fold is not None and "disk" in m.stream_fold.tiers_present():
        return m.stream_fold.tier_state("disk")  # type: ignore[no-any-return]  # vLLM STORAGE, SGLang DISK
    cap = meta_blocks(m, "disk_blocks", "disk_cache_bytes")
    named = m.stats_fold.level_tiers is not None and "disk" in m.stats_fold.level_tiers
    if not (isinstance(cap, int) and cap > 0) and not named:
        return None
    if not (isinstance(cap, int) and cap > 0):
        it = m.stats_fold.it
        host = meta_blocks(m, "secondary_blocks", "host_cache_bytes")
        cap = (max(it["secondaryMaxNumBlocks"] - host, 0)
               if it is not None and "secondaryMaxNumBlocks" in it and host is not None else None)
    return TierState("disk", cap, None, None, None, m.tokens_per_block, m.bytes_per_block, False)


def cold(m: TierModel) -> TierState | None:
    """Host and disk together, as the V2 manager's stats report them (``secondary*`` of
    ``kvCacheIterationStatsByColdPoolGroup``, summed over cold levels); ``None`` unless they are merged."""
    it = m.stats_fold.it
    if not cold_merged(m) or it is None or "secondaryMaxNumBlocks" not in it:
        return None
    cap = it["secondaryMaxNumBlocks"]
    free = it.get("secondaryFreeNumBlocks")
    used = it.get("secondaryUsedNumBlocks", None if free is None else max(cap - free, 0))
    return TierState("cold", cap, used, None, free, m.tokens_per_block, m.bytes_per_block, False)


def cached_by_priority(m: TierModel, gpu: TierState | None = None,
                       host: TierState | None = None) -> dict[str, dict[int | None, int]]:
    """Cached blocks per retention priority, per tier (``None`` = a priority no event gave). ``gpu``, ``host``:
    the model's tiers where the caller read them already (a snapshot), else read here."""
    out: dict[str, dict[int | None, int]] = {}
    for level, name in ((GPU, "gpu"), (HOST, "host")):
        per = out[name] = m.event_fold.cached_by_priority(level)
        # The fold's map may still hold blocks TensorRT-LLM detached without an event (partial reuse); the
        # tier's cached count is clamped to its pool, so the split is scaled to that total (largest
        # remainders), never showing more cached blocks than the pool has. Flagged by cached_approximate.
        tier = (m.gpu if gpu is None else gpu) if level == GPU else (m.host if host is None else host)
        cap = tier.cached_blocks
        total = sum(per.values())
        if cap is not None and total > cap:
            shares = {k: n * cap / total for k, n in per.items()}
            scaled = {k: int(v) for k, v in shares.items()}
            for k in sorted(shares, key=lambda k: shares[k] - scaled[k], reverse=True)[:cap - sum(scaled.values())]:
                scaled[k] += 1
            out[name] = {k: v for k, v in scaled.items() if v}
    return out


def quality(m: TierModel) -> Quality:
    ev = m.event_fold
    cap_src = capacity(m, GPU)[1]
    host_cap = capacity(m, HOST)[0]
    includes = None
    pri = capacity_known(m, GPU)[0]
    sec = capacity_known(m, HOST)[0]
    if m.stats_fold.max_num_blocks is not None and pri is not None and sec:
        if m.stats_fold.max_num_blocks == pri + sec:
            includes = True
        elif m.stats_fold.max_num_blocks == pri:
            includes = False
    return Quality(
        events_seen=m.events_seen, events_dropped=ev.dropped,
        counts_approximate=m.counts_approximate, cached_approximate=m.cached_approximate,
        unknown_hashes=ev.unknown_hashes, unknown_parents=ev.unknown_parents,
        stale_cached_dropped=ev.stale_dropped, pruned_entries=ev.pruned,
        duplicate_events=ev.duplicates, event_restarts=ev.restarts,
        stats_restarts=m.stats_fold.restarts, stats_iterations_missing=m.stats_fold.iterations_missing,
        host_without_events=bool(host_cap) and not m.events_seen and "secondaryFreeNumBlocks" not in (
            m.stats_fold.it or {}),
        capacity_source=cap_src, stats_max_includes_host=includes, stats_schema=m.stats_schema)
