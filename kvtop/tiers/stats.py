"""The iteration-stats fold: TensorRT-LLM's per-iteration stats dicts into pool gauges, block hit counters (warm-up
apart), moves where the stats count them, request and token counts, and the stats stream's own quality (engine
restarts, iterations that never reached kvtop).

Three shapes, told from the data (``schema``): 1.0-1.2's ``kvCacheStats`` (cumulative counters, diffed;
``maxNumBlocks`` is primary + secondary), 1.3's ``kvCacheIterationStats`` per attention window (V1 manager), and
1.3's V2 manager's pool-group and lifecycle views (kvtop/tiers/model.py's docstring says what each number means).
trtllm-serve's Prometheus metrics come mapped into the same dict (kvtop/sources/trtllm_prometheus.py).

Knows no other fold: the model says whether a record is warm-up and how many bytes a block holds.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from kvtop.records import MAX_BLOCKS, MAX_MAGNITUDE
from kvtop.tiers.common import Bad, describe, nonneg_count, nonneg_number, required_count
from kvtop.tiers.state import RequestRow
from kvtop.tiers.verdict import IterationFit

# The counts read off each stats record, with the path a bad one is named by (built once, not per record).
_KV_KEYS = tuple((key, f"kvCacheStats.{key}") for key in (
    "maxNumBlocks", "freeNumBlocks", "usedNumBlocks", "tokensPerBlock", "allocTotalBlocks", "allocNewBlocks",
    "reusedBlocks", "missedBlocks"))
# What one record of the newer views may claim (the record boundary bounds each number, kvtop/records.py; these
# bound what the numbers say together): at most _MAX_VIEWS windows, pool groups or lifecycles; in each, no gauge
# above its pool's Max; at most _MAX_ITER_BLOCKS blocks counted by one iteration (4.3 G blocks of even 16 KiB is
# 64 TiB copied in one step), and no move above the pool it fills or empties where the view states that pool's
# size; every sum over the views within the record bounds (MAX_BLOCKS for blocks, MAX_MAGNITUDE for the rest).
_MAX_VIEWS = 256
_MAX_ITER_BLOCKS = 1 << 32
# per-iteration moves and the pool that bounds each: an onboard fills a GPU block, an offload copies one out, a
# host drop frees a host one
_MOVE_POOL = (("iterOnboardBlocks", "primaryMaxNumBlocks"), ("iterOffloadBlocks", "primaryMaxNumBlocks"),
              ("iterHostDroppedBlocks", "secondaryMaxNumBlocks"))
_TOP_KEYS = ("iter", "numCompletedRequests", "numActiveRequests", "numQueuedRequests", "gpuMemUsage",
             "pinnedMemUsage")
# The V2 manager's top-level counts of one iteration (tensorrt_llm/_torch/pyexecutor/kv_cache_stats.py,
# ``append_kv_cache_iteration_stats``, TensorRT-LLM main @ a1510015): requests preempted (suspended) and resumed,
# and blocks the disk prefetch moved from disk to host ("prefetch movement only, not reuse hits served from disk").
_V2_TOP_KEYS = ("iterSuspendedRequests", "iterResumedRequests", "iterDiskPrefetchBlocks")
_MAX_LEVELS = 8
# cache-level tier names as TensorRT-LLM writes them (kvCacheLevelTiers; the collector's cache_tier label) -> kvtop's
LEVEL_TIERS = {"gpu": "gpu", "gpu_mem": "gpu", "host": "host", "host_mem": "host", "cpu": "host", "disk": "disk"}
_DEFAULT_LEVELS = ("gpu", "host", "disk")  # CacheTier's order (kv_cache_manager_v2 _common.py: GPU_MEM, HOST_MEM, DISK)


def _iter_blocks(value: Any, path: str) -> int:
    """A count of blocks one iteration did (None is 0), at most _MAX_ITER_BLOCKS."""
    n = nonneg_count(value, path) or 0
    if n > _MAX_ITER_BLOCKS:
        raise Bad(path, f"{n:,} blocks in one iteration, more than {_MAX_ITER_BLOCKS:,}")
    return n


def _sum_bounded(n: int, path: str, limit: int = MAX_BLOCKS) -> None:
    """A sum over one record's windows, pool groups or lifecycles: at most ``limit``."""
    if n > limit:
        raise Bad(path, f"sums to {n:,} in one record, more than {limit:,}")


class StatsFold:
    """TensorRT-LLM iteration stats -> gauges and counters (see the module docstring)."""

    def __init__(self, bytes_per_block: Callable[[], int | None]):
        self._bytes_per_block = bytes_per_block  # the model's (meta's), for Prometheus byte counters
        self._last_kv: dict[str, int | None] = {}
        self._last_iter: int | None = None
        self.restarts = 0
        self.iterations_missing = 0            # iterations absent from the stats stream (gaps in "iter")
        self.max_num_blocks: int | None = None
        self.free_num_blocks: int | None = None
        self.tokens_per_block: int | None = None
        self.it: dict[str, int] | None = None   # latest kvCacheIterationStats gauges, summed over windows
        self.offloaded = 0                      # moves from kvCacheIterationStats (or Prometheus byte counters)
        self.onboarded = 0
        self.host_dropped = 0
        self.moves_seen = False                 # ...which then win over the events' (they also count silent ones)
        self.shape: str | None = None           # which TensorRT-LLM's stats shape the numbers come from
        self.prom_seen = False                  # stats mapped from trtllm-serve's Prometheus metrics
        self._prom_bytes = [0, 0]               # offloaded, onboarded bytes from Prometheus counters
        self._prom_blocks = [0, 0]              # ...and the whole blocks already counted from them
        self.level_tiers: list[str] | None = None  # kvCacheLevelTiers (V2): the tier of each cache level
        self.level_hits: dict[int, int] = {}    # reused blocks per cache level (V2 lifecycles), warm-up excluded
        # the V2 manager's top-level counts (kv_cache_stats.py): preemptions, disk -> host prefetch moves, and the
        # prompt tokens each cache level served at admission (iterCachedTokensByLevel; trtllm-serve's
        # trtllm_prompt_cache_hit_tokens_total{cache_level,cache_tier} carries the same, mapped to it)
        self.suspended = 0
        self.resumed = 0
        self.disk_prefetched = 0                # disk -> host (iterDiskPrefetchBlocks; KVBM onboard_blocks_d2h)
        self.disk_onboarded = 0                 # disk -> GPU (KVBM onboard_blocks_d2d)
        self.disk_offloaded = 0                 # into the disk (KVBM offload_blocks_h2d + _d2d)
        self.disk_moves_seen = False            # the engine counts disk moves itself (they win over the events')
        self.level_tokens: dict[int, int] = {}  # cached prompt tokens per cache level, warm-up excluded
        self.warm_level_tokens = 0
        self.completed = 0                      # numCompletedRequests, summed
        self.in_flight: int | None = None
        self.running: tuple[RequestRow, ...] = ()  # the last requestStats' requests in flight (requests view)
        self.ctx_tokens = 0
        self.gen_tokens = 0
        self.gpu_mem_usage: int | None = None
        self.pinned_mem_usage: int | None = None
        # hits: totals past warm-up, and what warm-up took
        self.hits = 0
        self.lookups = 0
        self.warm_hits = 0
        self.warm_lookups = 0
        # Host hits from newer stats' iterOnboardBlocks (they line up with the hit counters); the model reads
        # these when the stats count moves, else the events' onboards, never both.
        self.host_hits = 0
        self.warm_host_hits = 0
        self.reuse_seen = False  # a reuse observed here or in the engines' stream (kvtop/tiers/stream.py)
        # the engine's own iteration times against what each iteration did: the verdict's measured prices
        self.iter_fit = IterationFit()

    def apply(self, d: dict[str, Any], warming: bool) -> None:
        """One iteration-stats dict, parsed; ``warming``: whether its counter deltas are warm-up. Validates
        everything it uses before changing anything."""
        kv = d.get("kvCacheStats")
        if kv is not None and not isinstance(kv, dict):
            raise Bad("kvCacheStats", f"must be an object, got {describe(kv)}")
        # A count that is None or a non-negative int is what nonneg_count gives back as it is: only the others go
        # through it (a float, a bool, a bad value), which is 16 calls a record fewer (5.2 -> 2.9 us a record).
        kvv: dict[str, int | None] = {}
        if kv is not None:
            for key, path in _KV_KEYS:
                v = kv.get(key)
                if v is not None and (v.__class__ is not int or v < 0):
                    v = nonneg_count(v, path)
                kvv[key] = v
            mx = kvv["maxNumBlocks"]
            if mx is not None:
                for key in ("freeNumBlocks", "usedNumBlocks"):
                    v = kvv[key]
                    if v is not None and v > mx:
                        raise Bad(f"kvCacheStats.{key}", f"{v:,} blocks exceed maxNumBlocks {mx:,}")
        if d.get("kvCacheIterationStats") is None and d.get("kvCacheIterationStatsByPoolGroup") is None:
            it_iter, schema, level_tiers, level_hits = None, ("1.0-1.2" if kv is not None else None), None, None
        else:
            it_iter, schema, level_tiers, level_hits = self._kv_iteration(d, kv is not None)
        prom_moves: dict[str, int] | None = None
        raw_moves = d.get("kvtopPrometheusMoves") if d.get("kvtopSource") == "prometheus" else None
        if raw_moves is not None:
            if not isinstance(raw_moves, dict):
                raise Bad("kvtopPrometheusMoves", f"must be an object, got {describe(raw_moves)}")
            prom_moves = {k: required_count(raw_moves[k], f"kvtopPrometheusMoves.{k}")
                          for k in ("offloadBytes", "onboardBytes") if k in raw_moves}
        top = []
        for key in _TOP_KEYS:
            v = d.get(key)
            if v is not None and (v.__class__ is not int or v < 0):
                v = nonneg_count(v, key)
            top.append(v)
        iteration, completed, active, queued, gpu_mem, pinned = top
        # the V2 manager's top-level counts, only where the record has them (a 1.x record pays three lookups: the
        # checks on every record were ~8% of a busy 1.2 recording's fold)
        raw_v2 = (d.get("iterSuspendedRequests"), d.get("iterResumedRequests"), d.get("iterDiskPrefetchBlocks"))
        v2_top = None if raw_v2 == (None, None, None) else [
            _iter_blocks(v, key) for v, key in zip(raw_v2, _V2_TOP_KEYS)]
        raw_tokens = d.get("iterCachedTokensByLevel")
        level_tokens = None if raw_tokens is None else self._level_tokens(raw_tokens)
        if level_tokens is not None and level_tiers is None:
            level_tiers = self._level_tiers(d.get("kvCacheLevelTiers"))
        ifb = d.get("inflightBatchingStats")
        if ifb is not None and not isinstance(ifb, dict):
            raise Bad("inflightBatchingStats", f"must be an object, got {describe(ifb)}")
        ctx_tokens = gen_reqs = None
        if ifb:
            ctx_tokens = ifb.get("numCtxTokens")
            if ctx_tokens is not None and (ctx_tokens.__class__ is not int or ctx_tokens < 0):
                ctx_tokens = nonneg_count(ctx_tokens, "inflightBatchingStats.numCtxTokens")
            gen_reqs = ifb.get("numGenRequests")
            if gen_reqs is not None and (gen_reqs.__class__ is not int or gen_reqs < 0):
                gen_reqs = nonneg_count(gen_reqs, "inflightBatchingStats.numGenRequests")
        running = self._running(d["requestStats"]) if "requestStats" in d else None

        # An engine restart: iter or a cumulative counter went backwards. The new values are then the deltas.
        last = self._last_kv
        restarted = iteration is not None and self._last_iter is not None and iteration < self._last_iter
        for key in ("reusedBlocks", "missedBlocks", "allocTotalBlocks"):
            v, lv = kvv.get(key), last.get(key)
            if v is not None and lv is not None and v < lv:
                restarted = True
        if restarted:
            self.restarts += 1
            last = {}
        elif iteration is not None and self._last_iter is not None and iteration > self._last_iter + 1:
            # Iterations that never reached kvtop: another reader of the drain-once stats queue (the user's own
            # get_stats, trtllm-serve's collector loop) or the queue overflowing. Per-iteration sums undercount.
            self.iterations_missing += iteration - self._last_iter - 1
        if iteration is not None:
            self._last_iter = iteration

        # Completions first: the record that reports the last warm-up completion is still warm-up (the model
        # counts the new completions into its warm-up state after this record).
        was_warm = warming
        if completed:
            self.completed += completed

        reused, missed = kvv.get("reusedBlocks"), kvv.get("missedBlocks")
        if kv is not None and (reused is not None or missed is not None):
            # each counter's delta since the last record (0 where this one lacks it)
            dr = 0 if reused is None else reused - (last.get("reusedBlocks") or 0)
            dm = 0 if missed is None else missed - (last.get("missedBlocks") or 0)
        elif it_iter is not None:
            dr, dm = it_iter.get("iterReusedBlocks", 0), it_iter.get("iterMissedBlocks", 0)
        else:
            dr = dm = 0
        if dr > 0:
            self.reuse_seen = True
        if was_warm:
            self.warm_hits += dr
            self.warm_lookups += dr + dm
        else:
            self.hits += dr
            self.lookups += dr + dm
        for key, v in kvv.items():
            if v is not None:
                last[key] = v
        self._last_kv = last

        if kv is not None:
            if kvv["maxNumBlocks"] is not None:
                self.max_num_blocks = kvv["maxNumBlocks"]
            if kvv["freeNumBlocks"] is not None:
                self.free_num_blocks = kvv["freeNumBlocks"]
            if kvv["tokensPerBlock"]:
                self.tokens_per_block = kvv["tokensPerBlock"]
        if prom_moves:
            # Bytes moved, from trtllm-serve's Prometheus counters: blocks from the running byte totals, so partial
            # copies add up rather than being floored away scrape by scrape.
            bpb = self._bytes_per_block()
            if bpb is not None:
                self.moves_seen = True
                self._prom_bytes[0] += prom_moves.get("offloadBytes", 0)
                self._prom_bytes[1] += prom_moves.get("onboardBytes", 0)
                off, onb = self._prom_bytes[0] // bpb - self._prom_blocks[0], self._prom_bytes[1] // bpb - \
                    self._prom_blocks[1]
                self._prom_blocks = [self._prom_blocks[0] + off, self._prom_blocks[1] + onb]
                self.offloaded += off
                self.onboarded += onb
                if was_warm:
                    self.warm_host_hits += onb
                else:
                    self.host_hits += onb
        if d.get("kvtopSource") == "prometheus":
            self.prom_seen = True  # trtllm-serve's Prometheus metrics, mapped (kvtop/sources/trtllm_prometheus.py)
        elif schema is not None and not (schema == "1.0-1.2" and self.shape in ("1.3", "1.3+ V2")):
            # The schema is the source's, not the last row's: 1.3 gives kvCacheIterationStats every N iterations
            # (the rows between have kvCacheStats alone), and the badge flickered "stats 1.3" / nothing (issue 23)
            self.shape = schema
        if level_tiers is not None:
            self.level_tiers = level_tiers
        if level_hits is not None and not was_warm:
            for i, n in enumerate(level_hits):
                self.level_hits[i] = self.level_hits.get(i, 0) + n
        if v2_top is not None:
            self.suspended += v2_top[0]
            self.resumed += v2_top[1]
            if raw_v2[2] is not None:
                self.disk_prefetched += v2_top[2]
                self.disk_moves_seen = True
        if level_tokens is not None:
            if was_warm:
                self.warm_level_tokens += sum(level_tokens)
            else:
                for i, n in enumerate(level_tokens):
                    self.level_tokens[i] = self.level_tokens.get(i, 0) + n
        if it_iter is not None:
            self.it = it_iter
            if any(k in it_iter for k in ("iterOffloadBlocks", "iterOnboardBlocks", "iterHostDroppedBlocks")):
                self.moves_seen = True
                self.offloaded += it_iter.get("iterOffloadBlocks", 0)
                onb = it_iter.get("iterOnboardBlocks", 0)
                self.onboarded += onb
                self.host_dropped += it_iter.get("iterHostDroppedBlocks", 0)
                # Host hits from the stats' own onboard counter: exact, and aligned with the hit counters; where the
                # V2 lifecycles say the level each reused block was on, from that (an onboard also serves a resumed
                # request or a disk hit, which are no host hits)
                if level_hits is not None:
                    onb = sum(n for i, n in enumerate(level_hits) if self.tier_of_level(i) == "host")
                if was_warm:
                    self.warm_host_hits += onb
                else:
                    self.host_hits += onb
        if active is not None or queued is not None:
            self.in_flight = (active or 0) + (queued or 0)
        if ctx_tokens:
            self.ctx_tokens += ctx_tokens
        if gen_reqs:
            self.gen_tokens += gen_reqs
        latency = d.get("iterLatencyMS")
        if (ctx_tokens is not None and gen_reqs is not None and not was_warm
                and latency.__class__ in (int, float) and 0.0 <= latency < 1e7):
            # what this iteration did against how long it took (a NaN fails the comparison above, as a bool the
            # class check): the verdict's measured prices (kvtop/tiers/verdict.py IterationFit)
            on = off = 0
            if it_iter is not None:
                on, off = it_iter.get("iterOnboardBlocks", 0), it_iter.get("iterOffloadBlocks", 0)
            self.iter_fit.add(latency / 1000.0, ctx_tokens, gen_reqs, on, off)
        if gpu_mem is not None:
            self.gpu_mem_usage = gpu_mem
        if pinned is not None:
            self.pinned_mem_usage = pinned
        if running is not None:
            self.running = running

    # TensorRT-LLM's request stages (requestStats[].stage) as the requests view names them
    STAGES: ClassVar[dict[str, str]] = {"QUEUED": "queued", "CONTEXT_IN_PROGRESS": "prefill",
                                        "GENERATION_IN_PROGRESS": "decode", "ENCODER_IN_PROGRESS": "encode"}

    def _running(self, entries: Any) -> tuple[RequestRow, ...]:
        """The requests in flight of one iteration's ``requestStats`` (enable_iter_req_stats): id, stage, reused
        blocks (the engine does not say from which tier). Those that completed this iteration are left out: their
        ``request`` record says the rest. Checked whole before anything changes."""
        if not isinstance(entries, list):
            raise Bad("requestStats", f"must be a list, got {describe(entries)}")
        out = []
        for i, e in enumerate(entries):
            if not isinstance(e, dict):
                raise Bad(f"requestStats[{i}]", f"must be an object, got {describe(e)}")
            rid = e.get("id")
            if isinstance(rid, bool) or not isinstance(rid, (int, str)):
                raise Bad(f"requestStats[{i}].id", f"must be an integer or a string, got {describe(rid)}")
            stage = e.get("stage")
            if not isinstance(stage, str):
                raise Bad(f"requestStats[{i}].stage", f"must be a string, got {describe(stage)}")
            reused = nonneg_count(e.get("reusedBlocksPerRequest"), f"requestStats[{i}].reusedBlocksPerRequest")
            generated = nonneg_count(e.get("numGeneratedTokens"), f"requestStats[{i}].numGeneratedTokens")
            if stage == "GENERATION_COMPLETE":
                continue
            state = "paused" if e.get("paused") is True else self.STAGES.get(stage, stage.lower()[:12])
            out.append(RequestRow(str(rid)[:64], state, None, None, generated, reused, None, None, None, None, None,
                                  None, None))
        return tuple(out)

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
        # the cold tiers' gauges from the cold view; V2 builds before it existed carry them in the pool-group view
        # (TensorRT-LLM's collector.py reads the cold view, else those), where dropping them left the host unknown
        # while TensorRT-LLM's own gauge read 0.6 (issue 23, item 2)
        out = pools if cold is None else {k: v for k, v in pools.items() if not k.startswith("secondary")}
        for k, v in (cold or {}).items():
            if k.startswith("secondary"):
                out[k] = v
        reuse_keys = ("iterReusedBlocks", "iterMissedBlocks")
        lifecycles = d.get("kvCacheIterationStatsByLifecycle")
        level_hits: list[int] | None = None
        if isinstance(lifecycles, dict) and lifecycles:
            if len(lifecycles) > _MAX_VIEWS:
                raise Bad("kvCacheIterationStatsByLifecycle",
                           f"{len(lifecycles):,} lifecycles, more than {_MAX_VIEWS} in one record")
            for k in reuse_keys:
                out[k] = 0
            for lid, lc in lifecycles.items():
                where = f"kvCacheIterationStatsByLifecycle.{lid}"
                if not isinstance(lc, dict):
                    raise Bad(where, f"must be an object, got {describe(lc)}")
                if lc.get("kind", "attention") != "attention":
                    continue
                for k in reuse_keys:
                    out[k] += _iter_blocks(lc.get(k), f"{where}.{k}")
                for k in ("iterFullReusedBlocksByLevel", "iterPartialReusedBlocksByLevel"):
                    per = lc.get(k)
                    if per is None:
                        continue
                    if not isinstance(per, list) or len(per) > 8:
                        raise Bad(f"{where}.{k}", f"must be a list of counts per cache level, got {describe(per)}")
                    level_hits = level_hits or []
                    for i, v in enumerate(per):
                        n = _iter_blocks(v, f"{where}.{k}[{i}]")
                        if i >= len(level_hits):
                            level_hits.append(0)
                        level_hits[i] += n
        elif windows is not None:
            for k in reuse_keys:
                if k in windows:
                    out[k] = windows[k]
            for k in reuse_keys:
                _sum_bounded(out[k], f"kvCacheIterationStatsByLifecycle.*.{k}")
            for i, n in enumerate(level_hits or ()):
                _sum_bounded(n, f"kvCacheIterationStatsByLifecycle.*.iter*ReusedBlocksByLevel[{i}]")
        return out, "1.3+ V2", self._level_tiers(d.get("kvCacheLevelTiers")), level_hits

    @staticmethod
    def _level_tiers(tiers: Any) -> list[str] | None:
        """``kvCacheLevelTiers``: the tier of each cache level, lower-cased (None where the record has none)."""
        if tiers is None:
            return None
        if not isinstance(tiers, list) or len(tiers) > _MAX_LEVELS or not all(isinstance(t, str) for t in tiers):
            raise Bad("kvCacheLevelTiers", f"must be a list of tier names, got {describe(tiers)}")
        return [t.lower() for t in tiers]

    @staticmethod
    def _level_tokens(raw: Any) -> list[int] | None:
        """``iterCachedTokensByLevel``: the prompt tokens each cache level served to the requests admitted in this
        iteration (at most _MAX_LEVELS levels, each count within the records' bound)."""
        if raw is None:
            return None
        if not isinstance(raw, list) or len(raw) > _MAX_LEVELS:
            raise Bad("iterCachedTokensByLevel", f"must be a list of token counts per cache level, got "
                                                  f"{describe(raw)}")
        out = []
        for i, v in enumerate(raw):
            n = required_count(v, f"iterCachedTokensByLevel[{i}]")
            if n > MAX_MAGNITUDE:
                raise Bad(f"iterCachedTokensByLevel[{i}]", f"{n:,} tokens in one iteration, more than 2^64")
            out.append(n)
        return out

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
            raise Bad(name, f"must be an object, got {describe(raw)}")
        if len(windows) > _MAX_VIEWS:
            raise Bad(name, f"{len(windows):,} windows or pool groups, more than {_MAX_VIEWS} in one record")
        out: dict[str, int] = {}
        for where, w in windows:
            if not isinstance(w, dict):
                raise Bad(f"{name}{where}", f"must be an object, got {describe(w)}")
            wv: dict[str, int] = {}
            for key, v in w.items():
                if not (key.startswith("primary") or key.startswith("secondary") or key.startswith("iter")):
                    continue
                if key == "iterCacheHitRate":
                    nonneg_number(v, f"{name}{where}.{key}")
                    continue
                if key.endswith("ByLevel"):
                    continue
                n = nonneg_count(v, f"{name}{where}.{key}")
                if n is not None:
                    wv[key] = n
            # what the window claims must be possible: no gauge above its pool, no iteration past the cap or
            # moving more blocks than the pool it fills or empties holds (where the view states the pool's size;
            # a pool shared by windows reads 0 in the V2 manager's window view)
            for tier in ("primary", "secondary"):
                mx = wv.get(f"{tier}MaxNumBlocks")
                if mx is None:
                    continue
                for key, n in wv.items():
                    if n > mx and key.startswith(tier) and key.endswith("NumBlocks"):
                        raise Bad(f"{name}{where}.{key}", f"{n:,} blocks exceed {tier}MaxNumBlocks {mx:,}")
            for key, pool in _MOVE_POOL:
                n, size = wv.get(key), wv.get(pool)
                if n is not None and size and n > size:
                    raise Bad(f"{name}{where}.{key}", f"{n:,} blocks moved in one iteration exceed {pool} {size:,}")
            for key, n in wv.items():
                if n > _MAX_ITER_BLOCKS and key.startswith("iter") and key.endswith("Blocks"):
                    raise Bad(f"{name}{where}.{key}",
                               f"{n:,} blocks in one iteration, more than {_MAX_ITER_BLOCKS:,}")
                out[key] = out.get(key, 0) + n
        for key, n in out.items():
            _sum_bounded(n, f"{name}.*.{key}", MAX_BLOCKS if key.endswith("Blocks") else MAX_MAGNITUDE)
        return out

    # ============================================================================================ read side

    @property
    def schema(self) -> str | None:
        """Which TensorRT-LLM's iteration stats the numbers come from, told from the data itself: "1.0-1.2"
        (``kvCacheStats`` only), "1.3" (``kvCacheIterationStats`` per window, V1 manager), "1.3+ V2"
        (the pool-group views of the V2 manager), "prometheus" (trtllm-serve's trtllm_* metrics, when its JSON
        stats are off), "<schema> + prometheus" with both, or None before any stats."""
        if self.prom_seen:
            return "prometheus" if self.shape is None else f"{self.shape} + prometheus"
        return self.shape

    def tier_of_level(self, level: int) -> str:
        """The kvtop tier of cache level ``level`` (named by ``kvCacheLevelTiers``, else CacheTier's order); a
        name kvtop does not know stays as TensorRT-LLM wrote it."""
        names = self.level_tiers or _DEFAULT_LEVELS
        name = names[level] if level < len(names) else ""
        if not name:  # no name for this level (trtllm-serve's cache_tier label is "" without the tier list)
            return _DEFAULT_LEVELS[level] if level < len(_DEFAULT_LEVELS) else f"level{level}"
        return LEVEL_TIERS.get(name, name)

    def hits_by_tier(self, tokens_per_block: int | None = None) -> dict[str, int]:
        """Reused blocks per serving tier, warm-up excluded, where the stats say it: V2 lifecycles'
        ``iter{Full,Partial}ReusedBlocksByLevel``, else the prompt tokens each level served
        (``iterCachedTokensByLevel``, or trtllm-serve's ``trtllm_prompt_cache_hit_tokens_total``) in whole blocks;
        levels named by ``kvCacheLevelTiers``. Empty where the stats do not say it."""
        out: dict[str, int] = {}
        if self.level_hits:
            for level, n in sorted(self.level_hits.items()):
                name = self.tier_of_level(level)
                out[name] = out.get(name, 0) + n
            return out
        tpb = tokens_per_block or self.tokens_per_block
        if self.level_tokens and tpb:
            tokens: dict[str, int] = {}
            for level, n in sorted(self.level_tokens.items()):
                name = self.tier_of_level(level)
                tokens[name] = tokens.get(name, 0) + n
            out = {name: n // tpb for name, n in tokens.items()}
        return out

    def cached_tokens_by_tier(self) -> dict[str, int]:
        """Prompt tokens each tier served at admission, warm-up excluded (``iterCachedTokensByLevel`` summed)."""
        out: dict[str, int] = {}
        for level, n in sorted(self.level_tokens.items()):
            name = self.tier_of_level(level)
            out[name] = out.get(name, 0) + n
        return out
