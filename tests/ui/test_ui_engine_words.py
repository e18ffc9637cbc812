"""The screen speaks the source's engine: a vLLM stream's screen names no TensorRT-LLM field or setting (its "free",
freeNumBlocks, host_cache_size, event_buffer_max_size, offload-on-evict), where a TensorRT-LLM source's still does;
and a figure a stream cannot give says why and what gives it (the hit rate: the engine's /metrics).

The vLLM source is real: a ZMQ publisher on 127.0.0.1 (tests/kv_publisher.py, the wire as vLLM 0.33 sends it), the
attach session as ``kvtop attach zmq://`` builds it, the dashboard running it; read at 80x24, 120x40 and 200x60,
with the help open too.
"""

from __future__ import annotations

import asyncio
import html
import re
import time
from typing import Any

import pytest
from kv_publisher import Publisher, removed, stored
from recordings import session_from_recording

from kvtop import run_summary
from kvtop.compose import build_attach_session
from kvtop.ui.app import build_app
from kvtop.ui.panels.hit_rate import HitRatePanel
from kvtop.ui.panels.memory import MemoryPanel
from kvtop.ui.panels.requests import RequestPanel

pytestmark = pytest.mark.usefixtures("frozen_ui_clock")  # tests/conftest.py

SIZES = ((80, 24), (120, 40), (200, 60))
# TensorRT-LLM's name, and its fields and settings the screen used to say whatever the engine
TRTLLM_WORDS = re.compile(r"TensorRT|trtllm|freeNumBlocks|host_cache_size|event_buffer_max_size|freeChildren|"
                          r"offload-on-evict|offloaded on GPU eviction|secondary_offload_min_priority")


class Settings:
    refresh = 0.1
    theme = "dark"
    duration = None


def _text(svg: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", svg)).replace("\xa0", " ")


async def _screens(app: Any, pilot: Any) -> dict[str, str]:
    """The whole screen at each size, and with the help open, as text."""
    out = {}
    for w, h in SIZES:
        await pilot.resize_terminal(w, h)
        await pilot.pause()
        app.refresh_view()
        await pilot.pause()
        out[f"{w}x{h}"] = _text(app.export_screenshot())
        out[f"{w}x{h} hit"] = app.screen.query_one(HitRatePanel).text()   # its lines, as the panel wraps them
        out[f"{w}x{h} requests"] = app.screen.query_one(RequestPanel).text()
        out[f"{w}x{h} memory"] = app.screen.query_one(MemoryPanel).text()
        await pilot.press("question_mark")
        await pilot.pause()
        out[f"{w}x{h} help"] = _text(app.export_screenshot())
        await pilot.press("escape")
        await pilot.pause()
    return out


async def _until(pilot: Any, done: Any, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout   # generous: this machine is shared
    while not done():
        assert time.monotonic() < deadline, what
        await pilot.pause(0.05)


@pytest.mark.slow
async def test_a_vllm_streams_screen_names_no_tensorrt_llm_field_and_says_what_gives_the_hit_rate() -> None:
    pub = Publisher(replay=False)
    try:
        session = build_attach_session(pub.url, command="attach", run="words")
        app = build_app(session, Settings())
        async with app.run_test(size=(120, 40)) as pilot:
            await asyncio.to_thread(pub.wait_subscribed)
            # GPU stores, a CPU copy of two of them (an offload), two GPU removals, one back on the GPU (an onboard)
            pub.send([stored([1, 2, 3, 4]), stored([5, 6, 7, 8], parent=4)])
            pub.send([stored([1, 2], medium="CPU")])
            pub.send([removed([1, 2])])
            pub.send([stored([1])])
            await _until(pilot, lambda: "reuse tree 7 blocks" in app.screen.query_one("#tier-gpu").text(),
                         "the stream's blocks did not reach the GPU panel")
            screens = await _screens(app, pilot)
            summary = run_summary.summary(session)
            session.stop()
    finally:
        pub.close()
    for name, text in screens.items():
        assert not TRTLLM_WORDS.search(text), (name, TRTLLM_WORDS.search(text), text)
        assert "vllm-format" not in text, (name, text)   # kvtop's key for the bare wire, not a word for a user
    # the header names what the source is: a stream whose engine the wire does not say
    assert "KV event stream (engine not named)" in screens["200x60"], screens["200x60"]
    for size in ("120x40", "200x60"):
        assert "┐ free" in screens[size] and "free = cached idle + empty" in screens[size], screens[size]
        assert "copies of GPU blocks, kept for reuse" in screens[size]
        assert "no retention priorities in this engine's events (9 blocks cached)" in screens[size]
    assert "free = cached idle + empty: the ┐┘ bracket" in screens["120x40 help"]
    # The hit rate: "?" said why and what gives it, at every size (80x24: the reason takes the panel's three rows)
    hint = "?metrics=http://127.0.0.1:8000/metrics"
    for size in ("80x24", "120x40", "200x60"):
        flat = " ".join(screens[f"{size} hit"].split())
        assert flat.startswith("hit rate unknown: KV events carry no lookups; add the engine's /metrics:") or \
            "? host ? hit rate unknown: KV events carry no lookups; add the engine's /metrics:" in flat, (size, flat)
    assert hint in "".join(screens["200x60 hit"].split()), screens["200x60 hit"]
    # ... and the headless text and the JSON summary say the same
    why = summary["hit_rate"]["unknown_why"]
    assert why == (f"hit rate unknown: KV events carry no lookups; add the engine's /metrics: "
                   f"zmq://127.0.0.1:{pub.port}{hint} (or vllm://127.0.0.1:8000)")
    text = run_summary.format_summary(summary)
    assert f"hit rate: unknown (GPU unknown, host unknown); KV events carry no lookups; add the engine's /metrics: " \
           f"zmq://127.0.0.1:{pub.port}{hint}" in text, text
    assert not TRTLLM_WORDS.search(text), text
    # No requests in a stream: the panel, the text and the JSON say so, not "done 0" as if none had been served
    for size in ("120x40", "200x60"):
        flat = " ".join(screens[f"{size} requests"].split())
        assert flat.startswith("requests unknown: KV events and the engine's /metrics as kvtop reads them count "
                               "blocks, not requests"), (size, flat)
        assert "done" not in flat
        # the memory panel: nothing sampled by an attach, said so (not "no NVML sample yet": none will come)
        memory = " ".join(screens[f"{size} memory"].split())
        assert memory.startswith("not measured: kvtop attach samples no GPU or host memory (a driven run or "
                                 "kvtop.watch does)"), (size, memory)
    assert summary["requests"]["unknown_why"].startswith("requests unknown: KV events")
    assert "requests: unknown; KV events and the engine's /metrics as kvtop reads them count blocks, not requests" \
        in text.splitlines()[1], text


@pytest.mark.slow
async def test_a_tensorrt_llm_sources_screen_still_names_its_fields() -> None:
    """The busy recording (kvtop's simulator of TensorRT-LLM): its "free" is TensorRT-LLM's freeNumBlocks, its
    host tier offload-on-evict, and the help says so; no hit-rate reason (its stats carry the lookups)."""
    session = session_from_recording()
    app = build_app(session, Settings(), run_session=False)
    async with app.run_test(size=(120, 40)) as pilot:
        screens = await _screens(app, pilot)
    for size in ("120x40", "200x60"):
        assert "TensorRT-LLM's free" in screens[size], screens[size]
        assert "offloaded on GPU eviction, kept for reuse" in screens[size]
    assert "TensorRT-LLM's free (freeNumBlocks) = cached idle + empty" in screens["120x40 help"]
    assert "capacity - freeNumBlocks" in screens["120x40 help"]
    assert not any("carry no lookups" in text for text in screens.values())
    said = run_summary.summary(session)
    assert said["hit_rate"]["unknown_why"] is None and said["requests"]["unknown_why"] is None
    assert all(" ".join(screens[f"{size} requests"].split()).startswith("in flight") for size in ("120x40", "200x60"))


class _VllmMetrics:
    """vLLM's /metrics on 127.0.0.1 (the names and labels vLLM 0.33 serves, docs/engines.md): a GPU pool of 2,000
    blocks of 16 tokens, a CPU pool of 1,000, 30% in use, lookups and hits by source growing each scrape."""

    def __init__(self) -> None:
        import threading
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        scrapes = [0]

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                scrapes[0] += 1
                n = scrapes[0]
                body = (
                    'vllm:cache_config_info{block_size="16",num_gpu_blocks="2000",engine="0"} 1.0\n'
                    'vllm:kv_offload_config_info{cpu_num_chunks="1000",engine="0"} 1.0\n'
                    'vllm:kv_cache_usage_perc{engine="0"} 0.3\n'
                    f'vllm:prefix_cache_queries_total{{engine="0"}} {n * 640}\n'
                    f'vllm:prompt_tokens_cached_by_source_total{{source="device",engine="0"}} {n * 200}\n'
                    f'vllm:prompt_tokens_cached_by_source_total{{source="host",engine="0"}} {n * 100}\n').encode()
                self.send_response(200)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/metrics"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.slow
async def test_a_vllm_stream_with_metrics_says_what_it_lacks_in_its_words() -> None:
    """The stream and vLLM's /metrics beside it (``zmq://...?metrics=``): capacities, hits and the GPU's use are
    known; the host pool's use is not (no usage count: the panel said "no KV events" over the blocks its events
    had announced), the size curve never comes from a stream (its line read "? ? ? ? ?%", the headless what-if a
    gain of 0 at x2 and x4 that nothing had estimated), and the alarm of a host pool no larger than the GPU's gives
    no TensorRT-LLM reason."""
    pub, metrics = Publisher(replay=False), _VllmMetrics()
    try:
        session = build_attach_session(f"{pub.url}?metrics={metrics.url}", command="attach", run="words")
        app = build_app(session, Settings())
        async with app.run_test(size=(120, 40)) as pilot:
            await asyncio.to_thread(pub.wait_subscribed)
            pub.send([stored([1, 2, 3, 4]), stored([1, 2], medium="CPU")])
            await _until(pilot, lambda: "reuse tree 2 blocks" in app.screen.query_one("#tier-host").text()
                         and re.search(r"total +\d", app.screen.query_one(HitRatePanel).text()) is not None,
                         "the stream's and /metrics' figures did not reach the panels")
            await _until(pilot, lambda: "tier.host_not_larger" in {p["kind"] for p in session.problems.to_json()},
                         "no alarm for a host pool smaller than the GPU's")
            screens = await _screens(app, pilot)
            host = app.screen.query_one("#tier-host").text()
            summary = run_summary.summary(session)
            session.stop()
    finally:
        pub.close()
        metrics.close()
    for name, text in screens.items():
        assert not TRTLLM_WORDS.search(text), (name, TRTLLM_WORDS.search(text), text)
    assert "host in use unknown (no usage count): cached vs empty unknown" in host and "no KV events" not in host
    for size in ("120x40", "200x60"):
        assert "host×: no curve: KV events carry no lookups" in screens[f"{size} hit"], screens[f"{size} hit"]
    text = run_summary.format_summary(summary)
    assert summary["what_if"]["host_x2_hit_rate"] is None and summary["what_if"]["host_x4_hit_rate"] is None
    assert "what if: no curve: KV events carry no lookups" in text.splitlines(), text
    assert "size advice: no curve: KV events carry no lookups" in text.splitlines(), text
    alarm = next(p["message"] for p in summary["problems"] if p["kind"] == "tier.host_not_larger")
    assert alarm.endswith("it holds little the GPU pool does not hold too, so it can hardly add hits"), alarm
    assert not TRTLLM_WORDS.search(text), text
