"""The ``--json`` summary: everything a TierModel reads, as one JSON-able dict (``kvtop --headless --json`` prints
it, and ``TierSnapshot.summary()`` hands out a copy). Its keys are documented and scripts read them
(``tiers.gpu``, ``tiers.host``, plus ``tiers.disk`` where a disk tier exists): add keys, never rename one.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvtop.tiers.model import TierModel


def summary(m: TierModel) -> dict[str, Any]:
    """Everything a ``TierModel`` reads as one JSON-able dict (``kvtop --headless --json`` prints it)."""
    tiers = m.tiers
    hr = m.hit_rate
    req = m.requests
    by_prio = m.cached_by_priority
    st = m.stats_fold
    host = m.meta_fold.host_memory
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
        "hits_by_tier": m.hits_by_tier,
        "hit_rate": {"cumulative": hr.cumulative, "gpu": hr.gpu, "host": hr.host, "window": hr.window,
                     "window_gpu": hr.window_gpu, "window_host": hr.window_host, "hits": hr.hits,
                     "lookups": hr.lookups, "host_hits": hr.host_hits,
                     # the share of lookups each tier served, where the stats say it per cache level (V2)
                     "by_tier": {t: n / hr.lookups for t, n in m.hits_by_tier.items()} if hr.lookups else {},
                     "warmup_lookups": st.warm_lookups, "warmup_hits": st.warm_hits},
        "hit_rate_by_priority": {("none" if p is None else str(p)): {"cumulative": v.cumulative, "gpu": v.gpu,
                                                                      "host": v.host, "lookups": v.lookups}
                                 for p, v in sorted(m.hit_split_by_priority.items(),
                                                    key=lambda kv: -1 if kv[0] is None else kv[0])},
        "moves": m.moves.to_json(),
        "rates": m.rates.to_json(),
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
                      "memory_total_bytes": g.memory_total_bytes} for _, g in sorted(m.meta_fold.gpus.items())],
            "gpu_error": m.gpu_error,
            "engine_gpu_mem_usage_bytes": st.gpu_mem_usage,     # the stats' gpuMemUsage
            "engine_pinned_mem_usage_bytes": st.pinned_mem_usage,  # pinnedMemUsage: 0 on PyTorch, always
            "host": None if host is None else {
                "rss_bytes": host.rss_bytes, "available_bytes": host.available_bytes,
                "total_bytes": host.total_bytes, "pinned_pool_bytes": host.pinned_pool_bytes},
        },
        "quality": m.quality.to_json(),
        "stream": None if m.stream_fold is None else m.stream_fold.to_json(),
        "bad_records": m.bad_records,
        "last_bad_reason": m.last_bad_reason,
    }
