"""The engines' counts kvtop read nowhere before (issue 23, item 3): disk moves, preemptions, hits per cache level.

Each payload is built in the shape the engine writes it, from the source named in its test:

- TensorRT-LLM main's V2 manager stats (tensorrt_llm/_torch/pyexecutor/kv_cache_stats.py @ a1510015,
  ``append_kv_cache_iteration_stats``): top-level ``iterSuspendedRequests`` / ``iterResumedRequests`` (preemptions
  and recoveries of this iteration), ``iterDiskPrefetchBlocks`` ("blocks the disk-prefetch mechanism actually
  migrated from disk to host during this iteration"), ``iterCachedTokensByLevel`` (prompt tokens per cache level
  for the requests admitted this iteration) and ``kvCacheLevelTiers``; written only beside the pool-group view.
  TensorRT-LLM's own unit test of that file asserts 2, 1 and [12, 8, 0] for its snapshot: the first record here.
- TensorRT-LLM main's Prometheus collector (tensorrt_llm/metrics/collector.py @ 050f80de):
  ``trtllm_kv_cache_disk_prefetch_blocks_total`` (Counter, the sum of ``iterDiskPrefetchBlocks``) and
  ``trtllm_prompt_cache_hit_tokens_total{cache_level, cache_tier}`` (Counter, ``iterCachedTokensByLevel`` per
  level, ``cache_tier`` from ``kvCacheLevelTiers``; one series per level created at the first stats), registered
  here with prometheus_client as that file does, labels ``model_name`` / ``engine_type``.
- Dynamo KVBM (lib/runtime/src/metrics/prometheus_names.rs, ``kvbm``): ``kvbm_offload_blocks_h2d`` (host to
  disk), ``kvbm_offload_blocks_d2d`` (device to disk), ``kvbm_onboard_blocks_d2d`` (disk to device); KVBM v2's
  ``kvbm_onboard_blocks_d2h`` (disk to host staging, Dynamo PR #8845).
- vLLM 0.33.0's ``medium="STORAGE"`` events (vllm/distributed/kv_events.py ``MEDIUM_STORAGE``) and SGLang 0.5.23's
  ``"DISK"`` (sglang/srt/disaggregation/kv_events.py ``StorageMedium``).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from kv_publisher import stored
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from kvtop.records import Record, SourceId, make
from kvtop.sources.trtllm_prometheus import PrometheusStats, parse_samples
from kvtop.tiers import TierModel

SRC = SourceId("127.0.0.1:5557", 0, "t")


def _pool0(**kv: int) -> dict[str, Any]:
    """One pool group of ``kvCacheIterationStatsByPoolGroup`` (KV_CACHE_ITERATION_STATS_POOL_GROUP_KEYS)."""
    keys = ("primaryMaxNumBlocks", "primaryFreeNumBlocks", "primaryUsedNumBlocks", "primaryEvictableNumBlocks",
            "primaryPeakFreeNumBlocks", "primaryPeakUsedNumBlocks", "primaryPeakEvictableNumBlocks",
            "iterAllocTotalBlocks", "iterAllocNewBlocks", "iterGenAllocBlocks", "iterOnboardBlocks",
            "iterOnboardBytes", "iterOffloadBlocks", "iterOffloadBytes", "iterIntraDeviceCopyBlocks",
            "iterIntraDeviceCopyBytes", "iterHostDroppedBlocks", "iterHostDroppedBytes")
    out: dict[str, Any] = {"poolGroupId": 0, "slotSize": [4096], "windowSizes": [32], **dict.fromkeys(keys, 0)}
    out.update(primaryMaxNumBlocks=20, primaryFreeNumBlocks=8, primaryUsedNumBlocks=12)
    out.update(kv)
    return out


def v2_record(it: int, *, suspended: int, resumed: int, prefetched: int, cached: list[int], reused: int,
              missed: int, by_level: tuple[list[int], list[int]] | None = None, onboard: int = 0) -> dict[str, Any]:
    """What ``append_kv_cache_iteration_stats`` writes for a V2 report with levels gpu/host/disk (window 32)."""
    lifecycle: dict[str, Any] = {"lifeCycleId": 0, "poolGroupId": 0, "windowSize": 32, "kind": "attention",
                                 "iterReusedBlocks": reused, "iterFullReusedBlocks": reused,
                                 "iterPartialReusedBlocks": 0, "iterMissedBlocks": missed,
                                 "iterCacheHitRate": reused / (reused + missed) if reused + missed else 0.0}
    if by_level is not None:
        lifecycle["iterFullReusedBlocksByLevel"], lifecycle["iterPartialReusedBlocksByLevel"] = by_level
    return {
        "iter": it, "numCompletedRequests": 0, "numActiveRequests": 1, "numQueuedRequests": 0,
        "kvCacheIterationStats": {"32": {"primaryMaxNumBlocks": 0, "iterReusedBlocks": reused,
                                         "iterMissedBlocks": missed}},
        "iterSuspendedRequests": suspended, "iterResumedRequests": resumed, "iterDiskPrefetchBlocks": prefetched,
        "iterCachedTokensByLevel": cached, "kvCacheLevelTiers": ["gpu", "host", "disk"],
        "kvCacheIterationStatsByPoolGroup": {"0": _pool0(iterOnboardBlocks=onboard)},
        "kvCacheIterationStatsByColdPoolGroup": {"0": {
            "coldPoolGroupId": 0, "slotSize": [4096], "windowSizes": [32], "secondaryMaxNumBlocks": 18,
            "secondaryFreeNumBlocks": 7, "secondaryUsedNumBlocks": 11, "secondaryEvictableNumBlocks": 4,
            "secondaryPeakFreeNumBlocks": 14, "secondaryPeakUsedNumBlocks": 13, "secondaryPeakEvictableNumBlocks": 6}},
        "kvCacheIterationStatsByLifecycle": {"0": lifecycle},
    }


def _v2_model() -> TierModel:
    m = TierModel()
    m.apply(make("meta", {"engine": "trtllm", "tokens_per_block": 4, "bytes_per_block": 4096, "disk_blocks": 11},
                 time=1.0))
    m.apply(make("stats", v2_record(7, suspended=2, resumed=1, prefetched=7, cached=[12, 8, 0], reused=6, missed=4),
                 time=2.0))
    m.apply(make("stats", v2_record(8, suspended=0, resumed=1, prefetched=3, cached=[4, 0, 8], reused=2, missed=8),
                 time=3.0))
    assert m.bad_records == 0, m.last_bad_reason
    return m


def test_v2_preemptions_disk_prefetch_and_cached_tokens_by_level() -> None:
    m = _v2_model()
    s = m.summary()
    assert s["preemptions"] == {"suspended": 2, "resumed": 2}
    mv = m.moves
    assert (mv.disk_prefetched_blocks, mv.disk) == (10, True)
    assert s["moves"]["disk_prefetched_blocks"] == 10
    # tokens per level, summed (levels named by kvCacheLevelTiers), and as whole blocks of 4 tokens
    assert s["cached_tokens_by_tier"] == {"gpu": 16, "host": 8, "disk": 8}
    assert m.hits_by_tier == {"gpu": 4, "host": 2, "disk": 2}
    # the hit rate's disk share: 2 of the 20 blocks looked up (8 reused of 20)
    hr = m.hit_rate
    assert (hr.hits, hr.lookups, hr.disk_hits) == (8, 20, 2)
    assert hr.disk == pytest.approx(2 / 20) and hr.gpu == pytest.approx((8 - 2) / 20)   # no onboard: host 0


def test_v2_host_hits_from_the_levels_not_the_onboards() -> None:
    """Where the lifecycles say the level each reused block was on, the host's share is that level's: an onboard
    also serves a resumed (preempted) request or a disk hit (TensorRT-LLM PR #18584: onboard bytes "cannot be used
    to reconstruct hits because blocks also move on resume after preemption and on prefetch")."""
    m = TierModel()
    m.apply(make("meta", {"engine": "trtllm", "tokens_per_block": 4, "disk_blocks": 11}, time=1.0))
    m.apply(make("stats", v2_record(7, suspended=0, resumed=1, prefetched=0, cached=[8, 4, 4], reused=4, missed=6,
                                    by_level=([2, 1, 1], [0, 0, 0]), onboard=3), time=2.0))
    assert m.bad_records == 0, m.last_bad_reason
    hr = m.hit_rate
    assert m.moves.onboarded_blocks == 3                     # three blocks came up from below...
    assert (hr.host_hits, hr.disk_hits, hr.hits) == (1, 1, 4)   # ...one host hit, one disk hit, one resume
    assert (hr.host, hr.disk, hr.gpu) == pytest.approx((0.1, 0.1, 0.2))


def test_v2_counts_out_of_shape_are_one_bad_record() -> None:
    for key, value in (("iterDiskPrefetchBlocks", -1), ("iterSuspendedRequests", 1.5),
                       ("iterCachedTokensByLevel", [1, "x"]), ("iterCachedTokensByLevel", list(range(9)))):
        m = TierModel()
        rec = v2_record(7, suspended=0, resumed=0, prefetched=0, cached=[0, 0, 0], reused=0, missed=0)
        rec[key] = value
        m.apply(make("stats", rec, time=1.0))
        assert m.bad_records == 1 and key in (m.last_bad_reason or ""), (key, m.last_bad_reason)
        assert m.summary()["preemptions"] == {"suspended": 0, "resumed": 0}


def test_v2_warm_up_leaves_cached_tokens_out() -> None:
    m = TierModel(warmup_requests=1)
    m.apply(make("meta", {"engine": "trtllm", "tokens_per_block": 4}, time=1.0))
    warm = v2_record(1, suspended=1, resumed=0, prefetched=2, cached=[40, 0, 0], reused=10, missed=0)
    warm["numCompletedRequests"] = 1
    m.apply(make("stats", warm, time=2.0))
    m.apply(make("stats", v2_record(2, suspended=0, resumed=0, prefetched=0, cached=[0, 8, 0], reused=2, missed=2),
                 time=3.0))
    assert m.summary()["cached_tokens_by_tier"] == {"gpu": 0, "host": 8, "disk": 0}
    assert m.summary()["preemptions"]["suspended"] == 1 and m.moves.disk_prefetched_blocks == 2  # events, all counted


# ------------------------------------------------------------------------------------------ Prometheus-only

LABELS = {"model_name": "Qwen/Qwen3-8B", "engine_type": "trtllm"}


def trtllm_scrape(*, prefetched: int, by_level: list[int], tiers: tuple[str, ...] = ("gpu", "host", "disk"),
                  reused: int = 0, missed: int = 0) -> str:
    """One scrape of trtllm-serve's /prometheus/metrics as collector.py registers the series (see the module doc)."""
    reg = CollectorRegistry()
    names = list(LABELS)
    for name, value in (("trtllm_kv_cache_max_blocks", 30), ("trtllm_kv_cache_free_blocks", 14),
                        ("trtllm_kv_cache_tokens_per_block", 4)):
        Gauge(name, name, labelnames=names, registry=reg).labels(**LABELS).set(value)
    for name, value in (("trtllm_kv_cache_reused_blocks", reused), ("trtllm_kv_cache_missed_blocks", missed),
                        ("trtllm_kv_cache_disk_prefetch_blocks_total", prefetched)):
        c = Counter(name, name, labelnames=names, registry=reg)
        c.labels(**LABELS)
        if value:
            c.labels(**LABELS).inc(value)
    hits = Counter("trtllm_prompt_cache_hit_tokens_total", "per level",
                   labelnames=names + ["cache_level", "cache_tier"], registry=reg)
    for level, n in enumerate(by_level):
        child = hits.labels(**LABELS, cache_level=str(level), cache_tier=tiers[level] if level < len(tiers) else "")
        if n:
            child.inc(n)
    return generate_latest(reg).decode()


def test_prometheus_only_disk_prefetch_and_hits_per_tier() -> None:
    state = PrometheusStats()
    m = TierModel()
    for t, (pre, levels, reused, missed) in enumerate(((5, [40, 8, 0], 10, 10), (12, [60, 16, 24], 20, 20),
                                                       (12, [64, 16, 32], 24, 26)), start=1):
        data = state.stats(parse_samples(trtllm_scrape(prefetched=pre, by_level=levels, reused=reused,
                                                       missed=missed)), counters=True)
        assert data is not None
        m.apply(make("stats", data, time=float(t)))
    assert m.bad_records == 0, m.last_bad_reason
    # the first scrape is the baseline: +7 then +0 blocks prefetched; +24 / +8 / +32 tokens per level (4 a block)
    assert m.moves.disk_prefetched_blocks == 7 and m.moves.disk
    assert m.summary()["cached_tokens_by_tier"] == {"gpu": 24, "host": 8, "disk": 32}
    assert m.hits_by_tier == {"gpu": 6, "host": 2, "disk": 8}
    assert (m.hit_rate.hits, m.hit_rate.lookups) == (24, 50)  # the block counters are cumulative, as kvCacheStats'
    assert m.hit_rate.disk == pytest.approx(8 / 50)


def test_prometheus_levels_without_tier_names_take_cachetier_order() -> None:
    state = PrometheusStats()
    for levels in ([0, 0], [8, 4]):
        data = state.stats(parse_samples(trtllm_scrape(prefetched=0, by_level=levels, tiers=())), counters=True)
    assert data is not None and data["iterCachedTokensByLevel"] == [8, 4] and data["kvCacheLevelTiers"] == ["", ""]
    m = TierModel()
    m.apply(make("meta", {"engine": "trtllm", "tokens_per_block": 4}, time=1.0))
    m.apply(make("stats", data, time=2.0))
    assert m.summary()["cached_tokens_by_tier"] == {"gpu": 8, "host": 4}


# ------------------------------------------------------------------------------------------ KVBM, the stream

KVBM_DISK = """\
# TYPE kvbm_offload_blocks_d2h counter
kvbm_offload_blocks_d2h {d2h}
# TYPE kvbm_onboard_blocks_h2d counter
kvbm_onboard_blocks_h2d 0
# TYPE kvbm_offload_blocks_h2d counter
kvbm_offload_blocks_h2d {h2disk}
# TYPE kvbm_offload_blocks_d2d counter
kvbm_offload_blocks_d2d {dev2disk}
# TYPE kvbm_onboard_blocks_d2d counter
kvbm_onboard_blocks_d2d {disk2dev}
# TYPE kvbm_onboard_blocks_d2h counter
kvbm_onboard_blocks_d2h {disk2host}
"""


def _metrics(text: str, t: float) -> Record:
    from kvtop.sources.engine_metrics import engine_of, parse_metrics

    samples = parse_metrics(text)
    return Record(kind="metrics", data={"engine": engine_of(samples), "url": "x", "samples": samples}, source=SRC,
                  time=t)


def test_kvbm_disk_counters_are_the_disk_moves() -> None:
    m = TierModel()
    m.apply(_metrics(KVBM_DISK.format(d2h=100, h2disk=50, dev2disk=5, disk2dev=7, disk2host=1), 1.0))
    m.apply(_metrics(KVBM_DISK.format(d2h=130, h2disk=70, dev2disk=9, disk2dev=10, disk2host=6), 2.0))
    mv = m.moves
    assert mv.offloaded_blocks == 30                     # GPU -> host, as before
    assert (mv.disk_offloaded_blocks, mv.disk_onboarded_blocks, mv.disk_prefetched_blocks) == (24, 3, 5)
    assert mv.disk
    assert m.rates.disk_offloaded_per_s == 24.0          # over the one second between the scrapes


def test_stream_disk_stores_and_disk_onboards() -> None:
    m = TierModel()

    def batch(seq: int, events: list[Any], t: float) -> Record:
        return Record(kind="kv_batch", data={"seq": seq, "ts": t, "rank": 0, "topic": "", "events": events},
                      source=SRC, time=t)

    from kvtop.sources.kv_wire import normalize_event

    evs = [[stored([1, 2, 3], medium="GPU")], [stored([1, 2], medium="STORAGE")], [stored([3], medium="CPU_PINNED"),
                                                                                  stored([4], medium="DISK")]]
    for i, ev in enumerate(evs):
        m.apply(batch(i, [normalize_event(e) for e in ev], float(i + 1)))
    # the GPU drops everything, then loads 1 (on disk only) and 3 (on the host)
    from kv_publisher import removed

    m.apply(batch(3, [normalize_event(removed([1, 2, 3], medium="GPU"))], 4.0))
    m.apply(batch(4, [normalize_event(stored([1, 3], medium="GPU"))], 5.0))
    mv = m.moves
    assert (mv.disk_offloaded_blocks, mv.disk_onboarded_blocks) == (3, 1)
    assert (mv.onboarded_blocks, mv.offloaded_blocks) == (1, 1)   # host -> GPU, GPU -> host: the host's alone
    assert mv.disk and m.summary()["stream"]["onboarded_from"] == {"host": 1, "disk": 1, "external": 0}


def test_no_disk_no_disk_moves() -> None:
    m = TierModel()
    m.apply(make("meta", {"engine": "trtllm", "tokens_per_block": 4}, time=1.0))
    rec = copy.deepcopy(v2_record(1, suspended=0, resumed=0, prefetched=0, cached=[4, 0], reused=1, missed=1))
    rec["kvCacheLevelTiers"] = ["gpu", "host"]
    m.apply(make("stats", rec, time=2.0))
    assert m.bad_records == 0, m.last_bad_reason
    assert not m.moves.disk and m.hit_rate.disk is None   # a V2 build always writes iterDiskPrefetchBlocks (0)


# ------------------------------------------------------------------------------------------ the panels

async def test_the_hit_rate_and_moves_panels_split_the_disk(tmp_path: Any) -> None:
    """A V2 run with a disk tier: the hit-rate panel's rows carry the disk's share beside GPU and host, and the
    moves panel a disk row (disk -> host prefetch, disk -> GPU, into the disk)."""
    from recordings import session_from_recording

    from kvtop.records import encode
    from kvtop.ui.app import build_app
    from kvtop.ui.panels.hit_rate import HitRatePanel
    from kvtop.ui.panels.moves import MovesPanel

    class Settings:
        refresh = 0.25
        theme = "dark"
        duration = None

    src = SourceId(host="node-a", rank=0, run="disk")
    lines = [encode(make("meta", {"engine": "trtllm", "tokens_per_block": 4, "bytes_per_block": 4096,
                                  "disk_blocks": 11}, src, 1000.0))]
    for i in range(6):   # 10 blocks looked up an iteration: 5 reused, 2 of them served by the disk (8 tokens)
        rec = v2_record(7 + i, suspended=0, resumed=0, prefetched=4, cached=[12, 0, 8], reused=5, missed=5)
        lines.append(encode(make("stats", rec, src, 1001.0 + i)))
    path = tmp_path / "disk.jsonl"
    path.write_text("\n".join(lines) + "\n")
    shown = {}
    for size in ((160, 48), (80, 24)):
        app = build_app(session_from_recording(path, started_at=1000.0), Settings(), run_session=False)
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            shown[size] = (app.screen.query_one(HitRatePanel).text(), app.screen.query_one(MovesPanel).text())
    hit, moves = shown[160, 48]
    total = next(line for line in hit.splitlines() if line.strip().startswith("total"))
    # 50% reused: 30% from the GPU, none from the host, 20% from the disk (2 of 10 blocks)
    assert total.split() == ["total", "50.0%", "GPU", "30.0%", "host", "0.0%", "disk", "20.0%"], total
    row = next(line for line in moves.splitlines() if line.strip().startswith("disk"))
    assert row.split() == ["disk", "→host", "4.00", "→GPU", "0", "in", "0"], row
    # 80x24: the same shares in whole percents under the tiers' initials, never cut short
    total = next(line for line in shown[80, 24][0].splitlines() if line.strip().startswith("total"))
    assert total.split() == ["total", "50.0%", "G", "30%", "h", "0%", "d", "20%"], total
    # and the moves panel's 4 lines keep the disk row: the two evict rows share one there
    rows = [line.split()[:2] for line in shown[80, 24][1].splitlines() if line.strip()]
    assert rows == [["offload", "GPU→host"], ["onboard", "host→GPU"], ["evict", "GPU"], ["disk", "→host"]], rows


def test_the_headless_text_summary_says_the_disk_moves_and_preemptions() -> None:
    from kvtop.run_summary import format_summary

    text = format_summary(_v2_model().summary())
    assert "disk: prefetched to host 10, onboarded to GPU 0, offloaded to disk 0, hits 10.0%" in text
    assert "preemptions: suspended 2, resumed 2" in text


def test_an_agents_summary_carries_the_disk_moves() -> None:
    """kvtop agent -> MQTT -> a dashboard far away: the disk moves travel in the summary's totals (diffed there,
    like the other moves), where the engine has a disk tier."""
    from kvtop.agent import summary_data
    from kvtop.records import decode, encode

    local = TierModel()
    local.apply(_metrics(KVBM_DISK.format(d2h=0, h2disk=0, dev2disk=0, disk2dev=0, disk2host=0), 1.0))
    remote = TierModel()
    src = SourceId("node-7:6880", 0, "r")
    remote.apply(decode(encode(Record("summary", summary_data(local, 0, 0.5, "agent-x"), src, 1.0))))
    local.apply(_metrics(KVBM_DISK.format(d2h=4, h2disk=20, dev2disk=4, disk2dev=3, disk2host=5), 2.0))
    remote.apply(decode(encode(Record("summary", summary_data(local, 1, 0.5, "agent-x"), src, 2.0))))
    mv = remote.moves
    assert (mv.disk_offloaded_blocks, mv.disk_onboarded_blocks, mv.disk_prefetched_blocks, mv.disk) == (24, 3, 5, True)


def test_prometheus_exports_the_disk_moves_and_hit_share() -> None:
    import urllib.request

    from kvtop.sinks.prometheus import PrometheusExporter

    m = _v2_model()
    m.snapshot()  # published by the folding side: what a scrape on the HTTP thread reads
    exporter = PrometheusExporter(lambda: m, port=0)
    port = exporter.start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    finally:
        exporter.stop()
    lines = {line.split(" ")[0]: line.split(" ")[1] for line in text.splitlines() if line.startswith("kvtop_kv_")}
    moved = {k: v for k, v in lines.items() if k.startswith("kvtop_kv_disk_moved_blocks_total")}
    assert sorted((k.split('direction="')[1].split('"')[0], float(v)) for k, v in moved.items()) == [
        ("into_disk", 0.0), ("to_gpu", 0.0), ("to_host", 10.0)]
    (disk,) = [float(v) for k, v in lines.items() if k.startswith("kvtop_kv_hit_ratio") and 'scope="disk"' in k]
    assert disk == pytest.approx(0.1)
