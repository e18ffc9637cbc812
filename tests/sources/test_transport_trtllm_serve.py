"""Attach to trtllm-serve: a small local HTTP server (stdlib, in a thread, 127.0.0.1) serves TensorRT-LLM
1.2-shaped payloads: the verbatim /metrics example of trtllm-kv.md 1.5, 2.2/2.5-shaped events, /perf_metrics."""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from trtllm_serve_fake import METRICS_EXAMPLE, FakeServe

from kvtop.records import Record
from kvtop.sources.trtllm_serve import EVENTS, HINTS, PERF, STATS, TrtllmServeSource, request_from_perf
from kvtop.tiers import TierModel

# trtllm-kv.md 2.2 shapes (KVCacheEventSerializer, 1.x), a pool of 101256 GPU blocks and no host pool.
EVENTS_EXAMPLE = [
    {"event_id": 0, "data": {"type": "created", "num_blocks_per_cache_level": [101256, 0]}, "window_size": 4096},
    {"event_id": 1, "data": {"type": "stored", "parent_hash": None, "blocks": [
        {"type": "stored_block", "block_hash": 10385249491213107555,
         "tokens": [{"type": "unique_token", "token_id": t, "token_extra_id": 0} for t in range(32)],
         "cache_level": 0, "priority": 35},
        {"type": "stored_block", "block_hash": 6338905736856950139,
         "tokens": [{"type": "unique_token", "token_id": t, "token_extra_id": 0} for t in range(32, 64)],
         "cache_level": 0, "priority": 35}]}, "window_size": 4096},
    {"event_id": 2, "data": {"type": "removed", "block_hashes": [6338905736856950139]}, "window_size": 4096},
]
PERF_EXAMPLE = [{"request_id": 7, "perf_metrics": {
    "first_iter": 150, "last_iter": 154,
    "timing_metrics": {"server_arrival_time": None, "arrival_time": 1200.5, "first_scheduled_time": 1200.51,
                       "first_token_time": 1200.56, "server_first_token_time": None, "last_token_time": 1201.0},
    "kv_cache_metrics": {"num_total_allocated_blocks": 3, "num_new_allocated_blocks": 3, "num_reused_blocks": 4,
                         "num_missed_blocks": 3121}}}]


@pytest.fixture
def serve() -> Iterator[FakeServe]:
    s = FakeServe()
    try:
        yield s
    finally:
        s.close()


class Collector:
    def __init__(self) -> None:
        self.records: list[Record] = []
        self.status: list[tuple[str, str]] = []
        self.errors: list[tuple[str, str]] = []
        self.model = TierModel()

    def sink(self, rec: Record) -> None:
        self.records.append(rec)
        self.model.apply(rec)

    def source(self, url: str, **kw: Any) -> TrtllmServeSource:
        return TrtllmServeSource(url, interval_s=0.01, sink=self.sink, on_status=self._status, on_error=self._error,
                                 **kw)

    def _status(self, name: str, message: str) -> None:
        self.status.append((name, message))

    def _error(self, name: str, message: str) -> None:
        self.errors.append((name, message))

    def kinds(self) -> list[str]:
        return [r.kind for r in self.records]

    def said(self, name: str, text: str) -> bool:
        return any(n == name and text in m for n, m in self.status)


async def test_attach_turns_12_payloads_into_records_and_tiers(serve: FakeServe) -> None:
    serve.queues["/metrics"].append(copy.deepcopy(METRICS_EXAMPLE))
    serve.queues["/kv_cache_events"].append(copy.deepcopy(EVENTS_EXAMPLE))
    serve.queues["/perf_metrics"].append(copy.deepcopy(PERF_EXAMPLE))
    c = Collector()
    src = c.source(serve.url)
    res = await src.poll_once()
    assert res.reachable and res.counts == {STATS: 1, EVENTS: 3, PERF: 1}
    assert serve.methods["/kv_cache_events"] == "POST" and serve.methods["/metrics"] == "GET"
    assert c.kinds() == ["meta", "stats", "kv_event", "kv_event", "kv_event", "request"]
    meta = c.records[0].data
    assert meta["engine"] == "trtllm" and meta["engine_version"] == "1.2.0" and meta["model"] == "Qwen/Qwen3-8B"
    assert c.records[1].data == METRICS_EXAMPLE[0]  # verbatim
    assert c.records[3].data["data"]["blocks"][0]["block_hash"] == 10385249491213107555  # >= 2^63, exact
    req = c.records[-1].data
    assert req["request_id"] == 7 and req["ttft_s"] == pytest.approx(0.06) and req["e2e_s"] == pytest.approx(0.5)
    assert req["reused_blocks"] == 4 and req["perf_metrics"] == PERF_EXAMPLE[0]["perf_metrics"]
    gpu = c.model.gpu
    assert (gpu.capacity_blocks, gpu.free_blocks, gpu.in_use_blocks, gpu.cached_blocks) == (101256, 101253, 3, 1)
    assert c.said("trtllm-serve", "attached")
    assert not c.errors
    # Drained: the next poll gets nothing new, and meta is not sent again.
    res = await src.poll_once()
    assert res.counts == {STATS: 0, EVENTS: 0, PERF: 0} and len(c.records) == 6


async def test_events_endpoint_missing_says_which_option_and_keeps_showing_stats(serve: FakeServe) -> None:
    serve.status["/kv_cache_events"] = 404
    c = Collector()
    src = c.source(serve.url)
    for i in range(3):
        stats = copy.deepcopy(METRICS_EXAMPLE)
        stats[0]["iter"] = 154 + i
        serve.queues["/metrics"].append(stats)
        await src.poll_once()
    assert src.endpoints[EVENTS].state == "off"
    assert "event_buffer_max_size" in (src.endpoints[EVENTS].hint or "")
    assert c.said("trtllm-serve.kv_events", "event_buffer_max_size")
    assert sum(k == "stats" for k in c.kinds()) == 3  # what it has, it keeps showing
    assert serve.hits["/kv_cache_events"] == 1  # a missing route is asked again only every 30 s
    assert c.model.gpu.free_blocks == 101253


async def test_stats_empty_while_events_flow_is_reported_as_off(serve: FakeServe) -> None:
    c = Collector()
    src = c.source(serve.url, perf_metrics=False)
    event_id = 0
    for _ in range(4):
        evs = []
        for _ in range(2):
            evs.append({"event_id": event_id, "data": {"type": "removed", "block_hashes": [event_id]},
                        "window_size": 4096})
            event_id += 1
        serve.queues["/kv_cache_events"].append(evs)
        await src.poll_once()
    assert src.endpoints[STATS].state == "off"
    assert c.said("trtllm-serve.stats", "enable_iter_perf_stats: true")
    assert HINTS[STATS] == src.endpoints[STATS].hint
    assert sum(k == "kv_event" for k in c.kinds()) == 8
    # It comes back (a restarted server with the option on): said once, and the hint goes.
    serve.queues["/metrics"].append(copy.deepcopy(METRICS_EXAMPLE))
    await src.poll_once()
    assert src.endpoints[STATS].state == "ok" and src.endpoints[STATS].hint is None
    assert c.said("trtllm-serve.stats", "delivering again")


async def test_idle_server_gets_a_hint_not_an_alarm(serve: FakeServe, monkeypatch: Any) -> None:
    import kvtop.sources.trtllm_serve as ts

    monkeypatch.setattr(ts, "IDLE_HINT_S", 0.0)
    c = Collector()
    src = c.source(serve.url)
    await src.poll_once()
    assert src.endpoints[STATS].state == "empty" and src.endpoints[EVENTS].state == "empty"
    assert c.said("trtllm-serve.stats", "idle, or") and c.said("trtllm-serve.kv_events", "idle, or")
    assert len(c.status) == 3  # attached + one hint per endpoint, and no more on later polls
    await src.poll_once()
    assert len(c.status) == 3


async def test_malformed_items_are_counted_and_skipped(serve: FakeServe) -> None:
    serve.queues["/metrics"].append([METRICS_EXAMPLE[0], "not json {", 5, {"kvCacheStats": []}])
    serve.queues["/kv_cache_events"].append([{"event_id": 1, "data": {"type": "exploded"}}, EVENTS_EXAMPLE[0]])
    serve.queues["/perf_metrics"].append([{"request_id": None}, PERF_EXAMPLE[0]])
    c = Collector()
    src = c.source(serve.url)
    res = await src.poll_once()
    assert res.counts == {STATS: 1, EVENTS: 1, PERF: 1}
    assert (src.endpoints[STATS].bad, src.endpoints[EVENTS].bad, src.endpoints[PERF].bad) == (3, 1, 1)
    assert len(c.errors) == 5 and any("kvCacheStats" in m for _, m in c.errors)


async def test_not_a_trtllm_serve_and_server_errors_never_raise(serve: FakeServe) -> None:
    serve.raw["/metrics"] = b"<html>hello</html>"
    serve.status["/kv_cache_events"] = 500
    c = Collector()
    src = c.source(serve.url, perf_metrics=False)
    await src.poll_once()
    await src.poll_once()
    assert src.endpoints[STATS].state == "error" and src.endpoints[EVENTS].state == "error"
    assert c.said("trtllm-serve.stats", "not JSON") and c.said("trtllm-serve.kv_events", "HTTP 500")
    assert sum(1 for n, _ in c.status if n == "trtllm-serve.kv_events") == 1  # once per streak


@pytest.mark.slow
async def test_unreachable_server_then_up(serve: FakeServe) -> None:
    port = serve.port
    serve.close()  # nothing listens there now
    c = Collector()
    src = c.source(f"127.0.0.1:{port}")  # the scheme is optional
    task = asyncio.ensure_future(src.run())
    await _until(lambda: c.said("trtllm-serve", "cannot reach"))
    assert src.reachable is False and not c.records
    # Back on the same port (a restarted server).
    again = FakeServe(port)
    try:
        again.queues["/metrics"].append(copy.deepcopy(METRICS_EXAMPLE))
        await _until(lambda: any(r.kind == "stats" for r in c.records), 8.0)  # backoff is capped at 5 s
        assert c.said("trtllm-serve", "attached") and src.reachable is True
    finally:
        src.stop()
        await asyncio.wait_for(task, 5.0)
        again.close()


def test_request_from_perf_without_token_times() -> None:
    item = copy.deepcopy(PERF_EXAMPLE[0])
    item["perf_metrics"]["timing_metrics"]["first_token_time"] = 0  # TensorRT-LLM's zero duration: unknown
    item["ctx_request_id"] = 3
    data = request_from_perf(item)
    assert data["ttft_s"] is None and data["e2e_s"] == pytest.approx(0.5) and data["ctx_request_id"] == 3


def test_bad_url() -> None:
    with pytest.raises(ValueError, match="http://host:port"):
        TrtllmServeSource("mqtt://x", sink=lambda r: None)


async def _until(cond: Callable[[], bool], timeout: float = 5.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not cond():
        assert loop.time() < deadline, "condition not met in time"
        await asyncio.sleep(0.02)


async def test_attention_dp_ranks_are_sources_of_their_own(serve: FakeServe) -> None:
    """TensorRT-LLM main with attention data parallelism: one /metrics row per rank each iteration, tagged
    ``attentionDpRank`` (py_executor.py ``_append_iter_stats``), each with its rank's own cumulative kvCacheStats.
    Two ranks x 5 iterations, reused 10*it and 3*it, missed 4*it and 3*it, free 100 and 40: folded as one stream
    they read as 195 hits of 300 lookups (a restart every row) and free 40; each rank its own source, the run's
    total is 65 of 100 (each rank's counters from zero, as a source attached at the engine's start), free 140, no
    restart."""
    from kvtop.fleet import aggregate
    from kvtop.session import Session

    rows = []
    for it in range(1, 6):
        for rank, (reused, missed, free) in enumerate(((10, 4, 100), (3, 3, 40))):
            row = copy.deepcopy(METRICS_EXAMPLE[0])
            row.update(iter=it, attentionDpRank=rank)
            row["kvCacheStats"].update(reusedBlocks=reused * it, missedBlocks=missed * it, freeNumBlocks=free,
                                       maxNumBlocks=400, usedNumBlocks=400 - free)
            rows.append(row)
    serve.queues["/metrics"].append(rows)
    session = Session()
    src = TrtllmServeSource(serve.url, interval_s=0.01, sink=session.emit, perf_metrics=False)
    await src.poll_once()
    assert len(session.models) == 2
    ranks = sorted(session.models.items(), key=lambda kv: kv[0])
    assert [k.split("/")[1] for k, _ in ranks] == ["0", "1"]
    for (_, m), (hits, lookups, free) in zip(ranks, ((50, 70, 100), (15, 30, 40))):
        assert (m.hit_rate.hits, m.hit_rate.lookups, m.gpu.free_blocks) == (hits, lookups, free)
        assert m.quality.stats_restarts == 0 and m.meta.get("model") == "Qwen/Qwen3-8B"
    total = aggregate(session.models)
    assert (total["hits"], total["lookups"]) == (65, 100)
    assert sum(m.gpu.free_blocks for _, m in ranks) == 140
    assert src.stats_missing == 0   # each rank's iterations are its own sequence
