"""``kvtop attach http://`` on a TensorRT-LLM 1.3+ trtllm-serve: its Prometheus metrics when the JSON stats are off
or drained, and a user told when another reader drains the stats queue.

The Prometheus text is made by prometheus_client itself (what trtllm-serve runs), with the metric names, types and
labels of TensorRT-LLM's ``MetricsCollector`` (tensorrt_llm/metrics/collector.py: Gauges
``trtllm_kv_cache_max_blocks`` / ``_free_blocks`` / ``_used_blocks`` / ``_tokens_per_block`` / ``_hit_rate`` /
``_host_utilization``, Counters ``trtllm_kv_cache_reused_blocks`` / ``_missed_blocks`` / ``_onboard_bytes_total`` /
``trtllm_num_requests_completed_total``, labels ``model_name`` and ``engine_type``). The server is the trtllm-serve
stand-in of tests/sources/test_transport_trtllm_serve.py; the JSON stats there are 1.2's documented /metrics example.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Iterator
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from trtllm_serve_fake import METRICS_EXAMPLE, FakeServe

from kvtop.sources.trtllm_prometheus import parse_samples, stats_from_prometheus
from kvtop.sources.trtllm_serve import DRAINED_HINT, PROM, STATS, TrtllmServeSource
from kvtop.tiers import TierModel

LABELS = {"model_name": "Qwen/Qwen3-8B", "engine_type": "trtllm"}
QWEN3_8B_PER_TOKEN = 147456


def prometheus_text(*, max_blocks: int = 101256, free: int = 101000, tpb: int = 32, reused: int = 40,
                    missed: int = 60, completed: int = 5, onboard_bytes: int = 0) -> bytes:
    """One scrape of a 1.3 trtllm-serve, as collector.py registers and sets its metrics."""
    reg = CollectorRegistry()
    names = list(LABELS)

    def gauge(name: str, value: float) -> None:
        Gauge(name, name, labelnames=names, registry=reg).labels(**LABELS).set(value)

    def counter(name: str, value: float) -> None:
        c = Counter(name, name, labelnames=names, registry=reg)
        if value:
            c.labels(**LABELS).inc(value)

    gauge("trtllm_kv_cache_max_blocks", max_blocks)
    gauge("trtllm_kv_cache_free_blocks", free)
    gauge("trtllm_kv_cache_used_blocks", max_blocks - free)
    gauge("trtllm_kv_cache_tokens_per_block", tpb)
    gauge("trtllm_kv_cache_hit_rate", reused / (reused + missed))
    gauge("trtllm_kv_cache_utilization", (max_blocks - free) / max_blocks)
    gauge("trtllm_kv_cache_host_utilization", 0.0)
    gauge("trtllm_num_requests_running", 3)
    gauge("trtllm_num_requests_waiting", 1)
    counter("trtllm_kv_cache_reused_blocks", reused)
    counter("trtllm_kv_cache_missed_blocks", missed)
    counter("trtllm_kv_cache_onboard_bytes_total", onboard_bytes)
    counter("trtllm_num_requests_completed_total", completed)
    return generate_latest(reg)


@pytest.fixture
def serve() -> Iterator[FakeServe]:
    s = FakeServe()
    try:
        yield s
    finally:
        s.close()


def _source(serve: FakeServe, model: TierModel, statuses: list[tuple[str, str]]) -> TrtllmServeSource:
    return TrtllmServeSource(serve.url, sink=model.apply, interval_s=0.05, perf_metrics=False,
                             on_status=lambda n, m: statuses.append((n, m)))


def test_the_exposition_maps_onto_tensorrt_llm_keys() -> None:
    samples = parse_samples(prometheus_text().decode())
    assert samples["trtllm_kv_cache_reused_blocks_total"] == 40  # prometheus_client adds _total to Counters
    data = stats_from_prometheus(prometheus_text().decode())
    assert data is not None and data["kvtopSource"] == "prometheus"
    assert data["kvCacheStats"] == {"maxNumBlocks": 101256, "freeNumBlocks": 101000, "usedNumBlocks": 256,
                                    "tokensPerBlock": 32, "reusedBlocks": 40, "missedBlocks": 60}
    assert (data["numActiveRequests"], data["numQueuedRequests"]) == (3, 1)
    assert stats_from_prometheus("# nothing here\n") is None
    with pytest.raises(ValueError):
        parse_samples("trtllm_kv_cache_max_blocks{ 12\n")


def test_json_stats_off_prometheus_fills_in(serve: FakeServe) -> None:
    serve.status["/metrics"] = 404
    m = TierModel()
    statuses: list[tuple[str, str]] = []
    src = _source(serve, m, statuses)
    serve.raw["/prometheus/metrics"] = prometheus_text(reused=40, missed=60, completed=5)
    asyncio.run(src.poll_once())  # /metrics answers 404: off; Prometheus asked from the next poll on
    assert src.endpoints[STATS].state == "off"
    asyncio.run(src.poll_once())
    serve.raw["/prometheus/metrics"] = prometheus_text(free=100900, reused=70, missed=80, completed=9)
    asyncio.run(src.poll_once())
    assert src.endpoints[PROM].items == 2
    assert m.bad_records == 0, m.last_bad_reason
    assert m.stats_schema == "prometheus"
    # GPU free from the gauge, GiB from /v1/models' Qwen/Qwen3-8B and the tokens-per-block gauge
    assert m.gpu.free_blocks == 100900 and m.bytes_per_block == QWEN3_8B_PER_TOKEN * 32
    # the counters are cumulative since the engine started, like kvCacheStats': 40 of 100, then 30 more of 50
    assert (m.hit_rate.hits, m.hit_rate.lookups) == (70, 150)
    assert m.requests.in_flight == 4


def test_iterations_missing_between_polls_say_another_reader(serve: FakeServe) -> None:
    m = TierModel()
    statuses: list[tuple[str, str]] = []
    src = _source(serve, m, statuses)
    base = METRICS_EXAMPLE[0]
    # Another reader takes iterations 4-6 and 10-12 between kvtop's polls.
    for batch in ([1, 2, 3], [7, 8, 9], [13, 14]):
        serve.queues["/metrics"].append([dict(copy.deepcopy(base), iter=i) for i in batch])
    serve.raw["/prometheus/metrics"] = prometheus_text()
    for _ in range(3):
        asyncio.run(src.poll_once())
    assert src.stats_drained and src.stats_missing == 6
    drained = [msg for name, msg in statuses if name == "trtllm-serve.stats"]
    assert drained == [f"/metrics: 6 iterations never reached kvtop: {DRAINED_HINT}"]
    assert src.endpoints[STATS].hint == DRAINED_HINT
    asyncio.run(src.poll_once())  # now reading Prometheus too: its gauges, not its counters (JSON stats flow)
    assert src.endpoints[PROM].items == 1
    assert m.stats_schema == "1.0-1.2 + prometheus"
    assert m.bad_records == 0 and m.gpu.free_blocks == 101000


def test_a_gap_in_one_poll_alone_is_not_an_alarm(serve: FakeServe) -> None:
    m = TierModel()
    statuses: list[tuple[str, str]] = []
    src = _source(serve, m, statuses)
    base = METRICS_EXAMPLE[0]
    for batch in ([1, 2], [5, 6], [7, 8]):  # one gap (a restart of the server's loop, a hiccup): counted only
        serve.queues["/metrics"].append([dict(copy.deepcopy(base), iter=i) for i in batch])
    for _ in range(3):
        asyncio.run(src.poll_once())
    assert src.stats_missing == 2 and not src.stats_drained
    assert not any("another reader" in msg for _, msg in statuses)


def test_metrics_empty_while_the_collector_counts_is_drained_whole(serve: FakeServe, monkeypatch: Any) -> None:
    m = TierModel()
    statuses: list[tuple[str, str]] = []
    src = _source(serve, m, statuses)
    for i in range(6):
        serve.raw["/prometheus/metrics"] = prometheus_text(completed=5 + i, reused=40 + i, missed=60 + i)
        asyncio.run(src.poll_once())
    assert src.stats_drained
    assert any(name == "trtllm-serve.stats" and "collector counts finished requests" in msg and DRAINED_HINT in msg
               for name, msg in statuses)
    # with no JSON stats at all, Prometheus gives the counters too
    assert m.hit_rate.lookups > 0 and m.stats_schema == "prometheus"


def test_frames_the_engine_dropped_itself_are_not_another_reader(serve: FakeServe) -> None:
    # Newer main: statsSequence numbers the frames, statsDroppedFrames counts those its buffer dropped
    # (tensorrt_llm/executor/iteration_stats.py, _materialize_frame).
    m = TierModel()
    statuses: list[tuple[str, str]] = []
    src = _source(serve, m, statuses)
    base = METRICS_EXAMPLE[0]
    for batch, dropped in (([1, 2], 0), ([6, 7], 3), ([11, 12], 6)):
        serve.queues["/metrics"].append([dict(copy.deepcopy(base), iter=100 + i, statsSequence=i,
                                              statsDroppedFrames=dropped) for i in batch])
    for _ in range(3):
        asyncio.run(src.poll_once())
    assert not src.stats_drained
    assert not any("another reader" in msg for _, msg in statuses)


def test_moves_from_the_prometheus_byte_counters(serve: FakeServe) -> None:
    # JSON stats off: the collector sees every iteration; its onboard/offload byte totals become blocks.
    serve.status["/metrics"] = 404
    m = TierModel()
    src = _source(serve, m, [])
    bpb = QWEN3_8B_PER_TOKEN * 32
    serve.raw["/prometheus/metrics"] = prometheus_text(onboard_bytes=10 * bpb)
    for _ in range(2):  # off, then the baseline scrape (moves before it are the server's history)
        asyncio.run(src.poll_once())
    serve.raw["/prometheus/metrics"] = prometheus_text(onboard_bytes=13 * bpb + bpb // 2)  # 3.5 blocks more
    asyncio.run(src.poll_once())
    assert m.bad_records == 0, m.last_bad_reason
    assert m.moves.onboarded_blocks == 3 and m.moves.source == "stats"
    serve.raw["/prometheus/metrics"] = prometheus_text(onboard_bytes=14 * bpb)  # the half block completes
    asyncio.run(src.poll_once())
    assert m.moves.onboarded_blocks == 4
    assert m.hit_rate.host_hits == 4  # every onboard is a host hit


def test_a_malformed_moves_field_is_one_bad_record() -> None:
    m = TierModel()
    m.apply_stats({"kvtopSource": "prometheus", "kvtopPrometheusMoves": {"onboardBytes": -3}}, 1.0)
    assert m.bad_records == 1 and "kvtopPrometheusMoves.onboardBytes" in (m.last_bad_reason or "")
