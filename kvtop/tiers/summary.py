"""The ``--json`` summary: everything a TierModel reads, as one JSON-able dict (``kvtop --headless --json`` prints
it, and ``TierSnapshot.summary()`` hands out a copy). Its keys are documented and scripts read them
(``tiers.gpu``, ``tiers.host``, plus ``tiers.disk`` where a disk tier exists): add keys, never rename one.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from kvtop.engine_words import hit_rate_unknown_why, requests_unknown_why

if TYPE_CHECKING:
    from kvtop.tiers.model import TierModel


def summary(m: TierModel) -> dict[str, Any]:
    """Everything a ``TierModel`` reads as one JSON-able dict (``kvtop --headless --json`` prints it)."""
    return summary_of(m, live_reads(m))


def live_reads(m: TierModel) -> dict[str, Any]:
    """What the summary reads of a model besides its read-side fields, all of which a TierSnapshot holds: the
    stats fold's warm-up and memory counters, the hits per cache level, the stream fold's own summary. A
    snapshot takes these with its fields, and makes the summary from both only when asked (summary_of)."""
    st = m.stats_fold
    return {"hits_by_tier": dict(m.hits_by_tier), "warm_lookups": st.warm_lookups, "warm_hits": st.warm_hits,
            "gpu_mem_usage": st.gpu_mem_usage, "pinned_mem_usage": st.pinned_mem_usage,
            "stream": None if m.stream_fold is None else m.stream_fold.to_json(),
            # TensorRT-LLM V2's top-level counts (kv_cache_stats.py): preemptions, and the prompt tokens each tier
            # served at admission (iterCachedTokensByLevel / trtllm_prompt_cache_hit_tokens_total)
            "preemptions": {"suspended": st.suspended, "resumed": st.resumed},
            "cached_tokens_by_tier": st.cached_tokens_by_tier()}


def summary_of(m: Any, live: Mapping[str, Any]) -> dict[str, Any]:
    """The summary from ``m``'s read-side fields (a TierModel's or a TierSnapshot's, by the same names) and what
    ``live_reads`` took of the same model at the same moment."""
    tiers = m.tiers
    hr = m.hit_rate
    req = m.requests
    by_prio = m.cached_by_priority
    host = m.host_memory
    hits_by_tier = live["hits_by_tier"]
    return {
        "engine": m.meta.get("engine"),
        "engine_version": m.meta.get("engine_version"),
        "model": m.meta.get("model"),
        "gpu": m.meta.get("gpu"),
        "time": m.now,
        "tokens_per_block": m.tokens_per_block,
        "bytes_per_block": m.bytes_per_block,
        "tiers": {t.name: t.to_json() for t in tiers},
        "stats_schema": m.stats_schema,
        "cold": None if m.cold is None else m.cold.to_json(),
        "hits_by_tier": hits_by_tier,
        "hit_rate": {"cumulative": hr.cumulative, "gpu": hr.gpu, "host": hr.host, "window": hr.window,
                     "window_gpu": hr.window_gpu, "window_host": hr.window_host, "hits": hr.hits,
                     "lookups": hr.lookups, "host_hits": hr.host_hits, "disk": hr.disk, "window_disk": hr.window_disk,
                     "disk_hits": hr.disk_hits, "external": hr.external, "window_external": hr.window_external,
                     "external_hits": hr.external_hits,
                     # the share of lookups each tier served, where the stats say it per cache level (V2)
                     "by_tier": {t: n / hr.lookups for t, n in hits_by_tier.items()} if hr.lookups else {},
                     "warmup_lookups": live["warm_lookups"], "warmup_hits": live["warm_hits"],
                     # why it is unknown and what gives it, where the source lacks the data (a KV event stream
                     # without the engine's /metrics), else None
                     "unknown_why": None if hr.lookups else hit_rate_unknown_why(m.meta, live["stream"])},
        "hit_rate_by_priority": {("none" if p is None else str(p)): {"cumulative": v.cumulative, "gpu": v.gpu,
                                                                      "host": v.host, "lookups": v.lookups}
                                 for p, v in sorted(m.hit_split_by_priority.items(),
                                                    key=lambda kv: -1 if kv[0] is None else kv[0])},
        "moves": m.moves.to_json(),
        "preemptions": live["preemptions"],
        "cached_tokens_by_tier": live["cached_tokens_by_tier"],
        "rates": m.rates.to_json(),
        "requests": {"completed": req.completed, "failed": req.failed, "warmup": req.warmup,
                     "in_flight": req.in_flight, "ttft_ms": req.ttft.to_json_ms(), "e2e_ms": req.e2e.to_json_ms(),
                     "prompt_tokens": req.prompt_tokens, "output_tokens": req.output_tokens,
                     "last_error": req.last_error, "ttft_ms_by_source": req.ttft_by_source_json(),
                     # why the counts above are unknown (0 and null), where the source has no requests to count
                     "unknown_why": requests_unknown_why(live["stream"], req.completed, req.failed)},
        # is each tier below the GPU paying off (kvtop/tiers/verdict.py): says, saved_s, spent_s, net_s, basis
        "verdict": {tier: v.to_json() for tier, v in m.verdict.items()},
        "cached_by_priority": {tier: {("none" if p is None else str(p)): n
                                      for p, n in sorted(per.items(), key=lambda kv: -1 if kv[0] is None
                                                         else kv[0])}
                               for tier, per in by_prio.items()},
        "memory": {
            "gpus": [{"index": g.index, "name": g.name, "memory_used_bytes": g.memory_used_bytes,
                      "memory_total_bytes": g.memory_total_bytes} for _, g in sorted(m.gpus.items())],
            "gpu_error": m.gpu_error,
            "engine_gpu_mem_usage_bytes": live["gpu_mem_usage"],     # the stats' gpuMemUsage
            "engine_pinned_mem_usage_bytes": live["pinned_mem_usage"],  # pinnedMemUsage: 0 on PyTorch, always
            "host": None if host is None else {
                "rss_bytes": host.rss_bytes, "available_bytes": host.available_bytes,
                "total_bytes": host.total_bytes, "pinned_pool_bytes": host.pinned_pool_bytes},
        },
        "quality": m.quality.to_json(),
        "stream": live["stream"],
        "bad_records": m.bad_records,
        "last_bad_reason": m.last_bad_reason,
    }
