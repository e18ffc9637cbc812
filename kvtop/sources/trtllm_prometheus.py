"""trtllm-serve's Prometheus metrics (``GET /prometheus/metrics``) as a stand-in for its JSON iteration stats.

TensorRT-LLM 1.3's ``MetricsCollector`` (tensorrt_llm/metrics/collector.py, names with the ``trtllm_`` prefix, the
labels ``model_name`` / ``engine_type``) turns each iteration-stats dict it sees into gauges and counters. kvtop reads
them when the JSON ``/metrics`` endpoint is off, or drained by another reader (1.3's own collector loop in
tensorrt_llm/serve/openai_server.py drains the same ``get_stats_async`` queue that ``/metrics`` reads, so with
``return_perf_metrics`` each iteration goes to one of the two, never both).

What maps onto what (collector.py ``log_iteration_stats``):

- ``trtllm_kv_cache_max_blocks`` / ``_free_blocks`` / ``_used_blocks`` / ``_tokens_per_block``: ``kvCacheStats``'s
  ``maxNumBlocks`` / ``freeNumBlocks`` / ``usedNumBlocks`` / ``tokensPerBlock``, gauges of the last iteration it saw.
- ``trtllm_kv_cache_reused_blocks_total`` / ``_missed_blocks_total``: the collector adds each iteration's increase
  of ``reusedBlocks`` / ``missedBlocks``, so they equal the cumulative values as of that iteration: the same
  counters kvtop diffs from JSON stats.
- ``trtllm_num_requests_running`` / ``_waiting``: ``numActiveRequests`` / ``numQueuedRequests``.
- ``trtllm_num_requests_completed_total``: the sum of ``numCompletedRequests``; kvtop passes its increase since the
  last scrape as that scrape's ``numCompletedRequests``.
- ``trtllm_kv_cache_onboard_bytes_total`` / ``_offload_bytes_total``: the collector sums each iteration's
  ``iterOnboardBytes`` / ``iterOffloadBytes``; their increase since the previous scrape goes in
  ``kvtopPrometheusMoves`` (bytes), which the fold turns into blocks once the block size is known. Each iteration
  reaches one reader only (``/metrics`` or the collector), so these increases and the JSON stats' own per-iteration
  counters add up to every move, with no iteration counted twice.
- ``trtllm_kv_cache_host_utilization`` (secondary used / max) is kept in the record (``prometheus``) as it is.
- ``trtllm_kv_cache_disk_prefetch_blocks_total`` (the sum of the V2 manager's ``iterDiskPrefetchBlocks``: blocks
  the disk prefetch moved from disk to host) and ``trtllm_prompt_cache_hit_tokens_total{cache_level,cache_tier}``
  (the sum of ``iterCachedTokensByLevel``, per cache level, ``cache_tier`` naming it as ``kvCacheLevelTiers``
  does): their increases since the previous scrape go in the record as those keys (and ``kvCacheLevelTiers``),
  for the same reason as the byte counters. Read from TensorRT-LLM main's collector.py @ 050f80de (the names,
  labels and docstrings; ``_log_cached_tokens_by_level`` creates one series per configured level).

The result is a ``stats`` record whose data uses TensorRT-LLM's own key names for what it maps, plus
``"kvtopSource": "prometheus"``, so the TierModel folds it with the code that folds JSON stats and says on screen
that the numbers came from Prometheus.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["PROMETHEUS_KEYS", "parse_samples", "stats_from_prometheus"]

# sample name -> where it goes ("kv." = kvCacheStats.<key>, otherwise a top-level key)
PROMETHEUS_KEYS = {
    "trtllm_kv_cache_max_blocks": "kv.maxNumBlocks",
    "trtllm_kv_cache_free_blocks": "kv.freeNumBlocks",
    "trtllm_kv_cache_used_blocks": "kv.usedNumBlocks",
    "trtllm_kv_cache_tokens_per_block": "kv.tokensPerBlock",
    "trtllm_kv_cache_reused_blocks_total": "kv.reusedBlocks",
    "trtllm_kv_cache_missed_blocks_total": "kv.missedBlocks",
    "trtllm_num_requests_running": "numActiveRequests",
    "trtllm_num_requests_waiting": "numQueuedRequests",
}
# Counters kept per label set (parse_samples keys them ``name{level,tier}``): the hit tokens per cache level
BY_LEVEL = "trtllm_prompt_cache_hit_tokens_total"
DISK_PREFETCH = "trtllm_kv_cache_disk_prefetch_blocks_total"
_MAX_LEVELS = 8  # as many cache levels as kvtop/tiers/stats.py reads
KEPT = ("trtllm_kv_cache_hit_rate", "trtllm_kv_cache_utilization", "trtllm_kv_cache_host_utilization",
        "trtllm_kv_cache_onboard_bytes_total", "trtllm_kv_cache_offload_bytes_total",
        "trtllm_num_requests_completed_total")


def parse_samples(text: str) -> dict[str, float]:
    """``trtllm_*`` samples of a Prometheus text exposition, summed over label sets (one engine per server;
    attention-DP ranks add up). Raises ValueError for text that is not the exposition format."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name
            if not name.startswith("trtllm_") or name.endswith("_created"):
                continue
            if not math.isfinite(sample.value):
                continue
            out[name] = out.get(name, 0.0) + sample.value
            if name == BY_LEVEL:
                key = f"{name}{{{sample.labels.get('cache_level', '')},{sample.labels.get('cache_tier', '')}}}"
                out[key] = out.get(key, 0.0) + sample.value
    return out


class PrometheusStats:
    """Scrapes in, ``stats`` dicts out. ``counters``: pass the cumulative counters too (only while no JSON stats
    arrive: the two would interleave values from different iterations)."""

    def __init__(self) -> None:
        self._completed: float | None = None
        self._moved: dict[str, float] = {}  # the last scrape's byte totals (and the other per-iteration sums)
        self.scrapes = 0

    def stats(self, samples: dict[str, float], *, counters: bool) -> dict[str, Any] | None:
        if not any(k in samples for k in PROMETHEUS_KEYS):
            return None  # a server whose collector has seen no iteration yet (or 1.1/1.2's request-only metrics)
        self.scrapes += 1
        kv: dict[str, int] = {}
        top: dict[str, Any] = {"kvtopSource": "prometheus"}
        for name, where in PROMETHEUS_KEYS.items():
            if name not in samples:
                continue
            if not counters and name.endswith("_total"):
                continue
            value = int(samples[name])
            if where.startswith("kv."):
                kv[where[3:]] = value
            else:
                top[where] = value
        if kv:
            top["kvCacheStats"] = kv
        done = samples.get("trtllm_num_requests_completed_total")
        if done is not None:
            if counters and self._completed is not None and done >= self._completed:
                top["numCompletedRequests"] = int(done - self._completed)
            self._completed = done
        moves: dict[str, int] = {}
        for name, key in (("trtllm_kv_cache_offload_bytes_total", "offloadBytes"),
                          ("trtllm_kv_cache_onboard_bytes_total", "onboardBytes")):
            total = samples.get(name)
            if total is None:
                continue
            last = self._moved.get(name)
            if last is not None:
                # A total that went down is a restarted server: its whole new total is the increase.
                moves[key] = int(total - last) if total >= last else int(total)
            self._moved[name] = total
        if moves:
            top["kvtopPrometheusMoves"] = moves
        prefetched = self._increase(DISK_PREFETCH, samples.get(DISK_PREFETCH))
        if prefetched is not None:
            top["iterDiskPrefetchBlocks"] = int(prefetched)
        by_level: dict[int, tuple[str, float]] = {}
        for key, total in samples.items():
            if not key.startswith(BY_LEVEL + "{"):
                continue
            level, _, tier = key[len(BY_LEVEL) + 1:-1].partition(",")
            if not level.isdigit() or int(level) >= _MAX_LEVELS:
                continue  # not a cache level TensorRT-LLM writes (str(level) of a configured tier)
            inc = self._increase(key, total)
            if inc is not None:
                by_level[int(level)] = (tier, inc)
        if by_level:
            levels = range(max(by_level) + 1)
            top["iterCachedTokensByLevel"] = [int(by_level[i][1]) if i in by_level else 0 for i in levels]
            top["kvCacheLevelTiers"] = [by_level[i][0] if i in by_level else "" for i in levels]
        top["prometheus"] = {k: samples[k] for k in KEPT if k in samples}
        return top


    def _increase(self, name: str, total: float | None) -> float | None:
        """A per-iteration sum's increase since the last scrape (None on the first: the baseline); a total that
        went down is a restarted server, whose whole new total is the increase."""
        if total is None:
            return None
        last = self._moved.get(name)
        self._moved[name] = total
        if last is None:
            return None
        return total - last if total >= last else total


def stats_from_prometheus(text: str, state: PrometheusStats | None = None, *,
                          counters: bool = True) -> dict[str, Any] | None:
    """One scrape's ``stats`` record data (see the module doc), or None when it holds no KV metric."""
    return (state or PrometheusStats()).stats(parse_samples(text), counters=counters)
