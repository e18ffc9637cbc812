"""``kvtop attach zmq://``: a real pyzmq publisher on 127.0.0.1 (tests/kv_publisher.py, written from the documented
format) into kvtop's subscriber, its replay client and the fold; and the vllm:// URL with a real HTTP server."""

from __future__ import annotations

import asyncio
import http.server
import json
import subprocess
import sys
import threading
import time

import pytest
from kv_publisher import Publisher, removed, stored

from kvtop.compose import build_attach_session
from kvtop.settings import SettingsError
from kvtop.sources.kv_events_zmq import GATHER_S, ZmqUrlError, parse_stream_url


async def _until(cond, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError("timed out")
        await asyncio.sleep(0.02)


async def _attached(url: str, *pubs: Publisher):
    session = build_attach_session(url, command="attach", run="t")
    task = asyncio.ensure_future(session.run())
    src = session.zmq_source
    # the SUB socket joins asynchronously (ZMQ's slow joiner): wait until each publisher has its subscription
    for pub in pubs:
        await asyncio.to_thread(pub.wait_subscribed)
    return session, task, src


async def _stop(session, task) -> None:
    session.stop()
    await asyncio.wait_for(task, 5)


def _model(session):
    (model,) = [m for k, m in session.models.items()]
    return model


async def test_live_stream_folds_per_tier_with_maps_and_arrays():
    pub = Publisher(replay=False)
    try:
        session, task, src = await _attached(pub.url, pub)
        pub.send([stored([1, 2, 3, 4])])                                  # seq 0: kvtop sees from the start
        pub.send([stored([1, 2], medium="CPU", array=True)])              # legacy positional form
        pub.send([removed([3, 4])])
        await _until(lambda: session.records >= 4)                        # meta + 3 batches
        m = _model(session)
        assert (m.gpu.cached_blocks, m.host.cached_blocks) == (2, 2)
        assert (m.moves.offloaded_blocks, m.moves.evicted_gpu_blocks) == (2, 2)
        s = m.summary()["stream"]
        assert s["since_attach"] is False and s["batches"] == 3 and s["lost_batches"] == 0
        assert list(session.models) == [f"127.0.0.1:{pub.port}/0/t"]
        assert m.meta["engine"] == "vllm-format" and m.meta["tokens_per_block"] == 16
        await _stop(session, task)
    finally:
        pub.close()


async def test_a_busy_stream_is_read_in_gathered_wake_ups_not_one_per_message():
    # A busy engine sends a batch every few ms (vLLM at 10,000 events/s: 200 a second). Each wake-up of the reader
    # costs the event loop's round (epoll, futures, a timer): the messages that come within GATHER_S of the first
    # are read at that one wake-up, and every batch is still folded, in order.
    pub = Publisher(replay=False)
    try:
        session, task, src = await _attached(pub.url, pub)
        n = 100

        def send_all() -> float:
            t0 = time.monotonic()
            for i in range(n):
                pub.send([stored([i])])
                time.sleep(0.002)
            return time.monotonic() - t0

        took = await asyncio.to_thread(send_all)
        await _until(lambda: bool(session.models) and _model(session).summary()["stream"]["batches"] == n)
        s = _model(session).summary()["stream"]
        assert s["lost_batches"] == 0 and _model(session).gpu.cached_blocks == n
        wakeups = src.ranks[0].wakeups
        # at most one wake-up per GATHER_S while the batches came (and the descriptor's first, and the reads after
        # the last batch came), far fewer than batches
        assert wakeups <= took / GATHER_S + 4 and wakeups <= n // 4, (wakeups, took)
        await _stop(session, task)
    finally:
        pub.close()


async def test_gap_is_filled_from_replay_with_a_dealer_socket():
    pub = Publisher()
    try:
        session, task, src = await _attached(pub.url, pub)
        pub.send([stored([1])])
        for h in (2, 3, 4):
            pub.send([stored([h])], drop=True)                            # lost on the way, kept for replay
        pub.send([stored([5])])
        await _until(lambda: _model(session).summary()["stream"]["batches"] == 5 if session.models else False)
        m = _model(session)
        s = m.summary()["stream"]
        # every batch of the answer came back (a REQ socket would have had only the first)
        assert s["replayed_batches"] == 3 and s["lost_batches"] == 0 and m.gpu.cached_blocks == 5
        assert src.stats()[0]["gaps"] == 1 and src.stats()[0]["lost"] == 0 and pub.replay_requests == 1
        await _stop(session, task)
    finally:
        pub.close()


async def test_late_attacher_rebuilds_from_replay_when_the_buffer_has_seq_0():
    pub = Publisher()
    try:
        for h in range(10):
            pub.send([stored([h])], drop=True)                            # before kvtop attached
        session, task, src = await _attached(pub.url, pub)
        pub.send([removed([0])])
        await _until(lambda: bool(session.models) and _model(session).summary()["stream"]["batches"] == 11)
        m = _model(session)
        assert m.summary()["stream"]["since_attach"] is False and m.gpu.cached_blocks == 9
        assert m.summary()["stream"]["unknown_removals"] == 0
        await _stop(session, task)
    finally:
        pub.close()


async def test_late_attacher_without_replay_says_since_attach_and_counts_gaps():
    pub = Publisher(replay=False)
    try:
        for h in range(10):
            pub.send([stored([h])], drop=True)
        session, task, src = await _attached(pub.url, pub)
        pub.send([removed([0]), stored([100])])                          # seq 10
        pub.send([stored([101])], drop=True)                              # seq 11: lost, no replay
        pub.send([stored([102])])                                         # seq 12
        await _until(lambda: bool(session.models) and _model(session).summary()["stream"]["batches"] == 2)
        s = _model(session).summary()
        assert s["stream"]["since_attach"] is True and s["stream"]["lost_batches"] == 1
        assert s["stream"]["unknown_removals"] == 1 and s["tiers"]["gpu"]["cached_blocks"] == 2
        assert s["tiers"]["gpu"]["cached_approximate"] is True
        assert any("since attach" in text for _, _, text in session.log)
        gap = session.problems.get("zmq.gap")
        assert gap is not None and gap.count == 1 and gap.lost and "seq 11..11" in gap.message
        await _stop(session, task)
    finally:
        pub.close()


async def test_bad_messages_are_counted_and_the_stream_goes_on():
    pub = Publisher(replay=False)
    try:
        session, task, src = await _attached(pub.url, pub)
        pub.send_raw([b"kv-events", (0).to_bytes(8, "big"), b"\xc1not msgpack"])
        pub.send_raw([b"kv-events", b"\x00"])                             # 2 frames, not an 8-byte seq
        pub.send_raw([b"kv-events", (0).to_bytes(8, "big"), b"\x93\x01\x02\x03"])  # [1, 2, 3]: events not a list
        pub.send([stored([7]), {"type": "Bogus"}])
        await _until(lambda: bool(session.models) and _model(session).summary()["stream"]["batches"] == 1)
        assert src.bad == 3 and src.stats()[0]["received"] == 1
        m = _model(session)
        assert m.gpu.cached_blocks == 1 and m.summary()["stream"]["bad_events"] == 1
        assert session.status[f"zmq tcp://127.0.0.1:{pub.port}"] == "error"
        assert any("not msgpack" in text for _, _, text in session.log)
        # every mode reads the problems registry: 3 bad messages and 1 bad event, lost data (exit status 4)
        assert session.problems.count("zmq.bad_message") == 3 and session.problems.count("zmq.bad_event") == 1
        assert session.problems.lost_data
        await _stop(session, task)
    finally:
        pub.close()


async def test_restarted_publisher_is_noticed():
    pub = Publisher(replay=False)
    try:
        session, task, src = await _attached(pub.url, pub)
        pub.send([stored([1, 2])])
        pub.send([stored([3])])
        await _until(lambda: bool(session.models) and _model(session).summary()["stream"]["batches"] == 2)
        pub.send([stored([9])], seq=0)                                    # a new engine process
        await _until(lambda: _model(session).summary()["stream"]["batches"] == 3)
        m = _model(session)
        assert m.summary()["stream"]["publisher_restarts"] == 1 and m.gpu.cached_blocks == 1
        assert src.stats()[0]["restarts"] == 1
        await _stop(session, task)
    finally:
        pub.close()


async def test_data_parallel_ranks_are_separate_sources():
    pubs = [Publisher(replay=False) for _ in range(2)]
    try:
        session, task, src = await _attached(f"zmq://127.0.0.1:{pubs[0].port}", pubs[0])
        assert len(src.ranks) == 1
        await _stop(session, task)
    finally:
        for p in pubs:
            p.close()
    # ranks=N subscribes to consecutive ports; the batch's dp rank names the source
    url = parse_stream_url("zmq://10.0.0.1:5557?ranks=4&replay=5600")
    assert url.events == tuple(f"tcp://10.0.0.1:{5557 + r}" for r in range(4))
    assert url.replay == tuple(f"tcp://10.0.0.1:{5600 + r}" for r in range(4))
    pub = Publisher(replay=False)
    try:
        session, task, src = await _attached(pub.url, pub)
        pub.send([stored([1])], rank=0)
        pub.send([stored([2, 3])], rank=3)
        await _until(lambda: len(session.models) == 2)
        await _until(lambda: sum(m.summary()["stream"]["batches"] for m in session.models.values()) == 2)
        cached = {k: m.gpu.cached_blocks for k, m in session.models.items()}
        assert cached == {f"127.0.0.1:{pub.port}/0/t": 1, f"127.0.0.1:{pub.port}/3/t": 2}
        await _stop(session, task)
    finally:
        pub.close()


@pytest.mark.parametrize("url,match", [
    ("zmq://host", "no port"),
    ("zmq://host:5557?bogus=1", "unknown option 'bogus'"),
    ("zmq://host:5557?replay=udp://x:1", "replay"),
    ("zmq://host:5557?ranks=0", "ranks"),
    ("zmq://host:5557?metrics=ftp://x", "metrics"),
    ("zmq://host:5557?events=tcp://x:1", "events="),
])
def test_bad_urls_say_what_to_write(url, match):
    with pytest.raises(ZmqUrlError, match=match):
        parse_stream_url(url)
    with pytest.raises(SettingsError, match=match):
        build_attach_session(url, command="attach")


class _Engine(http.server.BaseHTTPRequestHandler):
    """A vLLM-like HTTP server: /metrics text, /server_info with the publisher's config (SGLang-style)."""

    metrics = ""
    info: dict = {}

    def do_GET(self):  # noqa: N802
        if self.path == "/metrics":
            body, ctype = self.metrics.encode(), "text/plain"
        elif self.path == "/server_info":
            body, ctype = json.dumps(self.info).encode(), "application/json"
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def engine_http():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Engine)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    yield server
    server.shutdown()
    server.server_close()


@pytest.mark.slow
async def test_vllm_url_finds_the_advertised_stream_and_scrapes_metrics(engine_http):
    from test_kv_stream import VLLM_METRICS

    pub = Publisher()
    try:
        _Engine.info = {"kv_events_config": json.dumps({"publisher": "zmq", "endpoint": f"tcp://*:{pub.port}",
                                                        "replay_endpoint": f"tcp://*:{pub.replay_port}",
                                                        "topic": "kv-events"})}
        _Engine.metrics = VLLM_METRICS.replace("{queries}", "0").replace("{device}", "0").replace("{host}", "0")
        port = engine_http.server_address[1]
        url = parse_stream_url(f"sglang://127.0.0.1:{port}",
                               discover=__import__("kvtop.sources.engine_metrics", fromlist=["x"]).discover_events)
        assert url.events == (f"tcp://127.0.0.1:{pub.port}",) and url.topic == "kv-events"
        assert url.replay == (f"tcp://127.0.0.1:{pub.replay_port}",)
        session, task, src = await _attached(f"vllm://127.0.0.1:{port}", pub)
        pub.send([stored([1, 2])])
        await _until(lambda: bool(session.models) and _model(session).gpu.capacity_blocks == 2048)
        _Engine.metrics = VLLM_METRICS.replace("{queries}", "320").replace("{device}", "160").replace("{host}", "0")
        await _until(lambda: _model(session).hit_rate.lookups == 20, timeout=10)
        m = _model(session)
        assert m.hit_rate.cumulative == pytest.approx(0.5) and m.gpu.cached_blocks == 2
        assert m.summary()["stream"]["metrics_engine"] == "vllm"
        await _stop(session, task)
    finally:
        pub.close()


@pytest.mark.slow
def test_headless_json_says_since_attach(tmp_path):
    pub = Publisher(replay=False)
    try:
        for h in range(3):
            pub.send([stored([h])], drop=True)

        def feed() -> None:
            pub.wait_subscribed()
            pub.send([stored([50, 51])])

        t = threading.Thread(target=feed)
        t.start()
        out = subprocess.run([sys.executable, "-m", "kvtop", "attach", pub.url, "--headless", "--json",
                              "--duration", "6"], capture_output=True, text=True, timeout=60)
        t.join()
    finally:
        pub.close()
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    text = json.dumps(summary)
    assert '"since_attach": true' in text and '"cached_blocks": 2' in text


async def test_dashboard_header_says_since_attach():
    from test_kv_stream import batch

    from kvtop.records import SourceId as Sid
    from kvtop.session import Session
    from kvtop.settings import Settings
    from kvtop.ui.app import build_app

    session = Session(source=Sid("127.0.0.1:5557", 0, "t"))
    session.emit(batch(4711, [stored([1, 2])], t=1764430000.0))
    app = build_app(session, Settings(), run_session=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert "counts since attach" in app.screen.query_one("#header").data.flags
    assert session.model.since_attach is True


def test_headless_text_says_since_attach():
    from test_kv_stream import batch

    from kvtop.run_summary import format_summary
    from kvtop.tiers import TierModel

    m = TierModel()
    m.apply(batch(4711, [stored([1, 2])]))
    m.apply(batch(4713, [removed([1])], t=101.0))
    text = format_summary(m.summary())
    assert "stream: 2 batches (seq 4711..4713), 1 lost, 0 replayed, 0 bad events; counts are SINCE ATTACH" in text


@pytest.mark.slow
def test_a_recording_of_the_stream_replays_to_the_same_state(tmp_path):
    """kv_batch records cross a process boundary: recorded by one kvtop, replayed by another, same fold."""
    pub = Publisher(replay=False)
    rec = tmp_path / "stream.jsonl"
    try:
        def feed() -> None:
            pub.wait_subscribed()
            pub.send([stored([1, 2, 3, 4])])
            pub.send([stored([1, 2], medium="CPU"), removed([3])])

        t = threading.Thread(target=feed)
        t.start()
        live = subprocess.run([sys.executable, "-m", "kvtop", "attach", pub.url, "--headless", "--json",
                               "--duration", "6", "--record", str(rec)], capture_output=True, text=True, timeout=60)
        t.join()
    finally:
        pub.close()
    assert live.returncode == 0, live.stderr
    again = subprocess.run([sys.executable, "-m", "kvtop", "replay", str(rec), "--speed", "0", "--headless",
                            "--json"], capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr
    a, b = json.loads(live.stdout), json.loads(again.stdout)
    kinds = [json.loads(line)["kind"] for line in rec.read_text().splitlines()]
    assert kinds.count("kv_batch") == 2
    for s in (a, b):
        text = json.dumps(s)
        assert '"offloaded_blocks": 2' in text and '"evicted_gpu_blocks": 1' in text, text[:2000]


async def test_a_dead_metrics_page_is_reported_and_the_stream_goes_on():
    from conftest import free_port

    pub = Publisher(replay=False)
    try:
        session, task, src = await _attached(f"{pub.url}?metrics=http://127.0.0.1:{free_port()}/metrics", pub)
        pub.send([stored([1])])
        await _until(lambda: bool(session.models) and _model(session).gpu.cached_blocks == 1)
        await _until(lambda: any("cannot connect" in text for _, _, text in session.log))
        assert session.status["zmq"] == "ok" and any(k.startswith("metrics http") and v == "error"
                                                     for k, v in session.status.items())
        p = session.problems.get("metrics.scrape")
        assert p is not None and not p.lost and "cannot connect" in p.message
        await _stop(session, task)
    finally:
        pub.close()
