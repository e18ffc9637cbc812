"""Prometheus exporter: a real scrape over HTTP on 127.0.0.1 returns the documented metric names."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import REGISTRY

from kvtop.records import SourceId, make
from kvtop.sinks.prometheus import PrometheusExporter
from kvtop.tiers import TierModel

ROOT = Path(__file__).resolve().parents[2]
SRC = SourceId("gpu-07", 0, "prom")

EXPECTED = [
    "kvtop_kv_capacity_blocks", "kvtop_kv_in_use_blocks", "kvtop_kv_cached_blocks", "kvtop_kv_free_blocks",
    "kvtop_kv_hit_ratio", "kvtop_kv_offloaded_blocks_total", "kvtop_kv_onboarded_blocks_total",
    "kvtop_kv_evicted_blocks_total", "kvtop_kv_counts_approximate", "kvtop_kv_events_dropped_total",
    "kvtop_kv_block_bytes", "kvtop_bad_records_total", "kvtop_request_ttft_seconds_bucket",
    "kvtop_request_e2e_seconds_bucket", "kvtop_requests_total", "kvtop_records_total",
    "kvtop_gpu_memory_used_bytes", "kvtop_gpu_memory_total_bytes", "kvtop_host_pinned_pool_bytes",
    "kvtop_request_ttft_by_prefix_seconds_bucket", "kvtop_tier_verdict_seconds", "kvtop_tier_verdict",
]


def _feed(model: TierModel, exporter: PrometheusExporter) -> None:
    recs = [
        make("meta", {"engine": "sim", "primary_blocks": 100, "secondary_blocks": 50, "tokens_per_block": 32,
                      "bytes_per_block": 4_718_592}, SRC, 1.0),
        make("kv_event", {"event_id": 0, "data": {"type": "created", "num_blocks_per_cache_level": [100, 50]},
                          "window_size": 4096}, SRC, 1.0),
        make("kv_event", {"event_id": 1, "data": {"type": "stored", "parent_hash": None, "blocks": [
            {"type": "stored_block", "block_hash": 11, "tokens": [], "cache_level": 0, "priority": 35},
            {"type": "stored_block", "block_hash": 12, "tokens": [], "cache_level": 0, "priority": 35}]},
            "window_size": 4096}, SRC, 1.1),
        make("kv_event", {"event_id": 2, "data": {"type": "updated", "block_hash": 12,
                                                  "cache_level": {"type": "event_diff", "new_value": 1,
                                                                  "old_value": 0},
                                                  "priority": None}, "window_size": 4096}, SRC, 1.2),
        make("stats", {"iter": 1, "kvCacheStats": {"maxNumBlocks": 150, "freeNumBlocks": 90, "usedNumBlocks": 60,
                                                   "tokensPerBlock": 32, "allocTotalBlocks": 10,
                                                   "allocNewBlocks": 10, "reusedBlocks": 3, "missedBlocks": 7,
                                                   "cacheHitRate": 0.3}}, SRC, 2.0),
        make("gpu", {"index": 0, "name": "NVIDIA H200", "memory_used_bytes": 100 * 2**30,
                     "memory_total_bytes": 141 * 2**30, "process_used_bytes": 90 * 2**30}, SRC, 2.0),
        make("host", {"process_rss_bytes": 40 * 2**30, "system_available_bytes": 900 * 2**30,
                      "pinned_pool_bytes": 32 * 10**9}, SRC, 2.0),
        make("request", {"request_id": 1, "ok": True, "ttft_s": 0.042, "e2e_s": 1.5, "prompt_tokens": 200,
                         "reused_blocks": 3, "host_hit_blocks": 1}, SRC, 2.1),
        make("request", {"request_id": 2, "ok": False, "error": "boom", "e2e_s": 0.2}, SRC, 2.2),
    ]
    for r in recs:
        model.apply(r)
        exporter.observe(r)


def test_scrape_over_http_on_localhost_returns_the_metric_names() -> None:
    model = TierModel()
    exporter = PrometheusExporter(lambda: model, port=0)
    port = exporter.start()
    try:
        assert exporter._server.server_address[0] == "127.0.0.1"  # bound to loopback by default
        _feed(model, exporter)
        model.snapshot()  # the folding side publishes (a Session every publish_s); the scrape reads that
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            assert resp.status == 200
            text = resp.read().decode()
    finally:
        exporter.stop()
    names = set(re.findall(r"^([a-z0-9_]+)(?:\{| )", text, re.M))
    missing = [n for n in EXPECTED if n not in names]
    assert not missing, missing
    labels = 'host="gpu-07",rank="0",run="prom"'
    assert f'kvtop_kv_capacity_blocks{{{labels},tier="gpu"}} 100.0' in text
    assert f'kvtop_kv_capacity_blocks{{{labels},tier="host"}} 50.0' in text
    assert f'kvtop_kv_free_blocks{{{labels},tier="gpu"}} 90.0' in text
    # one exporter for every engine: its "free" names TensorRT-LLM's field and vLLM's, not TensorRT-LLM's alone
    assert ("# HELP kvtop_kv_free_blocks KV cache blocks held by no request, empty or cached-and-evictable "
            "(TensorRT-LLM's freeNumBlocks, vLLM's free blocks)") in text
    assert f'kvtop_kv_offloaded_blocks_total{{{labels}}} 1.0' in text
    assert f'kvtop_kv_hit_ratio{{{labels},scope="cumulative"}} 0.3' in text
    assert 'kvtop_request_ttft_seconds_bucket{host="gpu-07",le="0.05",rank="0",run="prom"} 1.0' in text
    assert 'kvtop_requests_total{host="gpu-07",outcome="failed",rank="0",run="prom"} 1.0' in text
    assert ('kvtop_request_ttft_by_prefix_seconds_bucket{host="gpu-07",le="0.05",prefix_source="host_hit",'
            'rank="0",run="prom"} 1.0') in text
    # one offload, no onboard, no model to price the store with: the host tier is idle, its store unpriced
    assert f'kvtop_tier_verdict{{basis="estimated",{labels},says="idle",tier="host"}} 1.0' in text
    assert 'kvtop_tier_verdict_seconds{host="gpu-07",part="saved",rank="0",run="prom",tier="host"} 0.0' in text
    assert 'part="spent"' not in text   # unpriced stays absent, never 0
    rss = re.search(r'^kvtop_host_process_rss_bytes\{' + re.escape(labels) + r'\} (\S+)$', text, re.M)
    assert rss is not None and float(rss.group(1)) == 40 * 2**30
    # A dedicated registry: nothing of kvtop's in the process-global one (the user's own metrics stay theirs).
    assert not [m for m in REGISTRY.collect() if m.name.startswith("kvtop")]


def test_unknown_stays_absent_and_many_sources_are_labelled() -> None:
    a, b = TierModel(), TierModel()
    exporter = PrometheusExporter(lambda: {"n1/0/r": a, "n2/3/r": b}, port=0)
    b.apply(make("kv_event", {"event_id": 0, "data": {"type": "created", "num_blocks_per_cache_level": [8, 4]},
                              "window_size": 64}, SourceId("n2", 3, "r"), 1.0))
    text = exporter.render().decode()
    assert 'kvtop_kv_capacity_blocks{host="n2",rank="3",run="r",tier="gpu"} 8.0' in text
    assert 'kvtop_kv_capacity_blocks{host="n1"' not in text  # unknown is absent, never 0
    assert 'kvtop_kv_hit_ratio{host="n1"' not in text


def test_docs_list_every_metric() -> None:
    doc = (ROOT / "docs" / "prometheus.md").read_text()
    for name in EXPECTED + ["kvtop_host_available_bytes", "kvtop_gpu_memory_process_bytes"]:
        base = re.sub(r"_(bucket|total)$", "", name)
        assert base in doc, name


def test_a_scrape_reads_the_published_snapshot_never_the_live_fold() -> None:
    """A scrape on the HTTP thread sees what the folding side last published: nothing before the first
    snapshot, then that snapshot's figures even while the model moves on, and the new ones once published."""
    model = TierModel()
    exporter = PrometheusExporter(lambda: model, port=0)
    port = exporter.start()

    def scrape() -> str:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            return resp.read().decode()

    try:
        _feed(model, exporter)
        assert "kvtop_kv_capacity_blocks{" not in scrape()  # folded, not published: absent, never half-read
        model.snapshot()
        labels = 'host="gpu-07",rank="0",run="prom"'
        assert f'kvtop_kv_offloaded_blocks_total{{{labels}}} 1.0' in scrape()
        model.apply(make("kv_event", {"event_id": 3, "data": {"type": "updated", "block_hash": 11,
                                                              "cache_level": {"old_value": 0, "new_value": 1}}},
                         SRC, 3.0))
        assert f'kvtop_kv_offloaded_blocks_total{{{labels}}} 1.0' in scrape()  # the model moved on; not published
        model.snapshot()
        assert f'kvtop_kv_offloaded_blocks_total{{{labels}}} 2.0' in scrape()
    finally:
        exporter.stop()


def test_scrapes_while_another_thread_folds_never_fail() -> None:
    """The old exporter read the live model from the HTTP thread and retried on 'dict changed size'; now the fold
    publishes and scrapes read immutable snapshots: 100 scrapes during 20,000 folded events all succeed, and the
    offload total they see never goes back."""
    import threading

    model = TierModel()
    exporter = PrometheusExporter(lambda: model, port=0)
    port = exporter.start()
    _feed(model, exporter)
    model.snapshot()
    done = threading.Event()

    def fold() -> None:
        for i in range(20_000):
            h = 1000 + i
            model.apply(make("kv_event", {"event_id": 3 + 2 * i, "data": {"type": "stored", "parent_hash": None,
                             "blocks": [{"type": "stored_block", "block_hash": h, "tokens": [], "cache_level": 0,
                                         "priority": 35}]}}, SRC, 3.0 + i * 1e-3))
            model.apply(make("kv_event", {"event_id": 4 + 2 * i, "data": {"type": "updated", "block_hash": h,
                             "cache_level": {"old_value": 0, "new_value": 1}}}, SRC, 3.0 + i * 1e-3))
            if i % 500 == 0:
                model.snapshot()
        model.snapshot()
        done.set()

    thread = threading.Thread(target=fold)
    thread.start()
    seen: list[float] = []
    try:
        for _ in range(100):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
                assert resp.status == 200
                text = resp.read().decode()
            found = re.search(r'^kvtop_kv_offloaded_blocks_total\{[^}]*\} ([0-9.e+]+)$', text, re.M)
            assert found is not None
            seen.append(float(found[1]))
        thread.join(60)
    finally:
        exporter.stop()
    assert done.is_set()
    assert seen == sorted(seen) and seen[0] >= 1.0


@pytest.mark.slow
def test_a_session_with_an_exporter_publishes_what_it_folds() -> None:
    """compose.add_sinks sets Session.publish_s when --prometheus-port is given: the session publishes every
    publish_s while it runs and once at the end, so a scrape from the HTTP thread sees the fold's figures."""
    import asyncio

    from kvtop.compose import add_sinks
    from kvtop.session import Session
    from kvtop.settings import Settings

    session = Session(source=SRC)
    settings = Settings()
    settings.prometheus_port = 0
    settings.refresh = 0.25
    add_sinks(session, settings)
    assert session.publish_s == 1.0  # the refresh, but at most once a second
    session.publish_s = 0.05  # quicker, for the test
    exporter = PrometheusExporter(lambda: session.model, port=0)
    port = exporter.start()
    seen: list[str] = []

    async def producer() -> None:
        _feed(session.model, exporter)  # folded, not through emit: only the session's publishing shows it
        await asyncio.sleep(0.3)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            seen.append(resp.read().decode())

    session.add_producer("feed", producer)
    try:
        asyncio.run(session.run(duration_s=2.0, until_producers_done=("feed",)))
    finally:
        exporter.stop()  # the session stopped its own exporter (add_sinks') as it ended
    assert session.model.published is not None
    labels = 'host="gpu-07",rank="0",run="prom"'
    assert f'kvtop_kv_offloaded_blocks_total{{{labels}}} 1.0' in seen[0]


def _handler_threads() -> int:
    import threading

    return sum(1 for t in threading.enumerate() if "process_request_thread" in t.name)


def _wait(cond, deadline_s: float = 30.0) -> bool:  # type: ignore[no-untyped-def]
    import time

    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        if cond():
            return True
        time.sleep(0.05)
    return bool(cond())


@pytest.mark.slow
def test_idle_connections_are_closed_after_the_timeout_and_bounded_in_number() -> None:
    # prometheus_client's start_http_server kept one thread per idle TCP connection for ever. Now a connection that
    # sends nothing is closed after timeout_s, scrapes answer meanwhile, and at most max_connections are served.
    import socket

    model = TierModel()
    exporter = PrometheusExporter(lambda: model, port=0, source=SRC, timeout_s=1.0, max_connections=8)
    assert PrometheusExporter(lambda: model).timeout_s == 10.0
    _feed(model, exporter)
    model.snapshot()
    port = exporter.start()
    idle: list[socket.socket] = []
    try:
        base = _handler_threads()
        for _ in range(6):
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=30))
        assert _wait(lambda: _handler_threads() - base == 6), _handler_threads() - base
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:  # 7 of 8 slots
            assert "kvtop_kv_capacity_blocks" in resp.read().decode()
        # The server closes each idle connection (the client reads EOF) and its thread ends.
        for s in idle:
            assert s.recv(1) == b""
        assert _wait(lambda: _handler_threads() - base == 0), _handler_threads() - base
        for s in idle:
            s.close()
        idle = [socket.create_connection(("127.0.0.1", port), timeout=30) for _ in range(20)]
        assert _wait(lambda: _handler_threads() - base == 8), _handler_threads() - base
        # 12 past the bound are closed unread at once (no thread); the 8 served time out after 1 s.
        assert _wait(lambda: _handler_threads() - base == 0), _handler_threads() - base
        assert max(0, _handler_threads() - base) == 0
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as resp:
            assert resp.status == 200
    finally:
        for s in idle:
            s.close()
        exporter.stop()
