"""Attach to a trtllm-serve whose /metrics never finishes its answer (issue 26, "a slow server hangs an attach
forever"): a real HTTP server on 127.0.0.1 whose /version, /v1/models and /kv_cache_events answer at once, while
/metrics trickles (one byte at a time, in the status line or in the body) or sends chunks forever. Each of these
defeats a per-socket timeout; kvtop's total deadline cuts them, the other endpoints go on meanwhile, the stuck one
is a problem of its own, and the run ends on time (headless, dashboard and ``q``).

Also: a server that answers /version and /v1/models while every data endpoint answers HTML, HTTP 500 or cut JSON
is a run that exits non-zero, each endpoint's failure named."""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import shutil
import subprocess
import sys
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from kvtop.problems import EXIT_LOST_DATA, Problems
from kvtop.records import Record
from kvtop.sources.trtllm_serve import EVENTS, TrtllmServeSource

ROOT = Path(__file__).resolve().parents[2]
CREATED = [{"event_id": 0, "data": {"type": "created", "num_blocks_per_cache_level": [101256, 0]},
            "window_size": 4096}]


def _removed(first: int, n: int) -> list[dict[str, Any]]:
    return [{"event_id": i, "data": {"type": "removed", "block_hashes": [i]}, "window_size": 4096}
            for i in range(first, first + n)]


class SlowServe:
    """trtllm-serve's routes; ``metrics`` says how /metrics answers: "trickle" (headers, then one body byte every
    ``byte_s``), "status" (the status line itself one byte every ``byte_s``), "chunks" (chunked, a small chunk
    every ``byte_s``, forever), or a literal body (bytes). ``answers`` overrides other routes: path -> (status,
    body); ``redirects``: path -> the URL a 307 points to. /kv_cache_events gives the pool's "created" event
    first, then two events an answer."""

    def __init__(self, metrics: str | bytes = "trickle", byte_s: float = 0.2,
                 answers: dict[str, tuple[int, bytes]] | None = None, redirects: dict[str, str] | None = None) -> None:
        self.hits: dict[str, int] = {}
        self.closing = threading.Event()
        self.next_event = 0
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, code: int, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _drip(self, data: bytes) -> None:
                for i in range(len(data)):
                    if fake.closing.wait(byte_s):
                        return
                    self.wfile.write(data[i:i + 1])
                    self.wfile.flush()

            def _metrics(self) -> None:
                if isinstance(metrics, bytes):
                    return self._send(200, metrics)
                if metrics == "status":
                    return self._drip(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n" + b"X: y\r\n" * 1000)
                if metrics == "chunks":
                    self.send_response(200)
                    self.send_header("Transfer-Encoding", "chunked")
                    self.end_headers()
                    while not fake.closing.wait(byte_s):
                        self.wfile.write(b"2\r\n[1\r\n")
                        self.wfile.flush()
                    return None
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", "100000")
                self.end_headers()
                self.wfile.flush()
                return self._drip(b"[" + b" " * 99_998 + b"]")

            def _answer(self, method: str) -> None:
                path = self.path
                fake.hits[path] = fake.hits.get(path, 0) + 1
                try:
                    if redirects and path in redirects:
                        self.send_response(307)
                        self.send_header("Location", redirects[path])
                        self.send_header("Content-Length", "0")
                        self.end_headers()
                        return None
                    if answers and path in answers:
                        return self._send(*answers[path])
                    if path == "/metrics" and method == "GET":
                        return self._metrics()
                    if path == "/version":
                        return self._send(200, b'{"version": "1.2.0"}')
                    if path == "/v1/models":
                        return self._send(200, b'{"object": "list", "data": [{"id": "Qwen/Qwen3-8B"}]}')
                    if path == "/kv_cache_events" and method == "POST":
                        if fake.next_event == 0:
                            fake.next_event = 1
                            return self._send(200, json.dumps(CREATED).encode())
                        first, fake.next_event = fake.next_event, fake.next_event + 2
                        return self._send(200, json.dumps(_removed(first, 2)).encode())
                    if path == "/perf_metrics":
                        return self._send(200, b"[]")
                    return self._send(404, b'{"detail":"Not Found"}')
                except OSError:  # the client gave up on this answer (its deadline): fine
                    return None

            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                self._answer("GET")

            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self._answer("POST")

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.closing.set()
        self.server.shutdown()
        self.server.server_close()


def _http_threads() -> int:
    return sum(1 for t in threading.enumerate() if t.name == "kvtop-http" and t.is_alive())


@pytest.mark.slow
@pytest.mark.parametrize("how", ["trickle", "status", "chunks"])
async def test_a_stuck_metrics_endpoint_is_cut_at_its_deadline_and_holds_no_other(how: str) -> None:
    """A 1 s deadline; /metrics sends a byte (or a 5-byte chunk) every 0.2 s: a socket timeout never fires."""
    serve = SlowServe(how, byte_s=0.2)
    records: list[Record] = []
    problems = Problems()
    src = TrtllmServeSource(serve.url, interval_s=0.05, sink=records.append, timeout_s=1.0, problems=problems,
                            perf_metrics=False)
    task = asyncio.ensure_future(src.run())
    loop = asyncio.get_running_loop()
    try:
        deadline = loop.time() + 8.0
        while problems.get("trtllm-serve.metrics") is None and loop.time() < deadline:
            await asyncio.sleep(0.05)
        p = problems.get("trtllm-serve.metrics")
        assert p is not None, problems.to_json()
        assert "GET /metrics: no complete answer within 1 s" in p.message and p.lost and p.active
        # Meanwhile the events kept coming, one answer after another (the old single poll: one answer, then
        # nothing until /metrics ended).
        assert serve.hits.get("/kv_cache_events", 0) >= 5, serve.hits
        events = [r for r in records if r.kind == "kv_event"]
        assert len(events) >= 5 and src.endpoints[EVENTS].state == "ok"
        assert records[0].kind == "meta" and records[0].data["model"] == "Qwen/Qwen3-8B"
    finally:
        t0 = loop.time()
        src.stop()
        await asyncio.wait_for(task, 5.0)
        stopped_in = loop.time() - t0
        serve_threads_end = loop.time() + 5.0
        # The request still in flight was aborted (its socket shut down), not left to trickle on.
        while _http_threads() and loop.time() < serve_threads_end:
            await asyncio.sleep(0.05)
        left = _http_threads()
        serve.close()
    assert stopped_in < 1.0, stopped_in
    assert left == 0


def kvtop_cli(*args: str, timeout: float) -> tuple[subprocess.CompletedProcess[str], float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "kvtop", *args], capture_output=True, text=True, timeout=timeout,
                          env=env, cwd=ROOT)
    return proc, time.monotonic() - t0


@pytest.mark.slow
def test_headless_attach_to_a_trickling_metrics_ends_on_time_with_the_endpoint_named() -> None:
    """The issue's bar, shortened: --duration 6 (one 5 s deadline inside it) ends within 30 s of the duration,
    with its JSON summary, the stuck endpoint named on stderr and in ``problems``, and exit 4."""
    serve = SlowServe("trickle", byte_s=1.0)
    try:
        proc, took = kvtop_cli("attach", serve.url, "--headless", "--json", "--duration", "6", timeout=60)
    finally:
        serve.close()
    assert took < 6 + 30, took
    assert proc.returncode == EXIT_LOST_DATA, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    stuck = [p for p in summary["problems"] if p["kind"] == "trtllm-serve.metrics"]
    assert stuck and "GET /metrics: no complete answer within 5 s" in stuck[0]["message"], summary["problems"]
    assert any("trtllm-serve.metrics" in line and "no complete answer" in line
               for line in proc.stderr.splitlines()), proc.stderr
    # The other endpoints' data is there: the pool from the created event, every event folded.
    assert summary["tiers"]["gpu"]["capacity_blocks"] == 101256, summary
    assert summary["records"] >= 1 + 5  # meta + events


@pytest.mark.slow
def test_headless_attach_where_every_data_endpoint_fails_exits_non_zero_naming_each() -> None:
    """/version and /v1/models answer; /metrics is HTML, /kv_cache_events HTTP 500, /perf_metrics cut JSON."""
    serve = SlowServe(b"<html><body>hello</body></html>", answers={
        "/kv_cache_events": (500, b'{"detail": "Internal Server Error"}'),
        "/perf_metrics": (200, b'[{"request_id": 7, "perf_metr')})
    try:
        proc, _ = kvtop_cli("attach", serve.url, "--headless", "--json", "--duration", "2.5", timeout=60)
    finally:
        serve.close()
    assert proc.returncode != 0, proc.stderr
    assert proc.returncode == EXIT_LOST_DATA, proc.stderr
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    kinds = {p["kind"]: p["message"] for p in summary["problems"]}
    assert "GET /metrics: HTTP 200 not JSON" in kinds.get("trtllm-serve.metrics", ""), kinds
    assert "POST /kv_cache_events: HTTP 500" in kinds.get("trtllm-serve.kv_cache_events", ""), kinds
    assert "GET /perf_metrics: HTTP 200 not JSON" in kinds.get("trtllm-serve.perf_metrics", ""), kinds
    for kind in ("trtllm-serve.metrics", "trtllm-serve.kv_cache_events", "trtllm-serve.perf_metrics"):
        assert kind in proc.stderr, proc.stderr
    assert summary["model"] == "Qwen/Qwen3-8B"  # /v1/models answered: the meta record came, and only it


@pytest.mark.slow
@pytest.mark.tmux
@pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")
def test_dashboard_shows_the_other_endpoints_while_metrics_is_stuck_and_q_exits(tmp_path: Path) -> None:
    """In a real terminal: the pool from /kv_cache_events on screen while /metrics trickles, the stuck endpoint
    among the problems, and q ends the process at once (it hung in the executor's exit join)."""
    serve = SlowServe("trickle", byte_s=1.0)
    server = f"kvtop-test-{uuid.uuid4().hex[:8]}"
    status = tmp_path / "status"
    cmd = (f"cd {shlex.quote(str(ROOT))} && {shlex.quote(sys.executable)} -m kvtop attach {serve.url} "
           f"--refresh 0.25; echo $? > {shlex.quote(str(status))}; sleep 60")
    env = dict(os.environ, TERM="xterm-256color", PYTHONPATH=str(ROOT))

    def tmux(*args: str) -> str:
        return subprocess.run(["tmux", "-L", server, *args], capture_output=True, text=True, timeout=10).stdout

    def wait_for(what: str, timeout: float) -> str:
        end = time.monotonic() + timeout
        text = ""
        while time.monotonic() < end:
            text = tmux("capture-pane", "-p", "-t", "kvtop")
            if what in text:
                return text
            time.sleep(0.1)
        raise AssertionError(f"the pane never showed {what!r}; last screen:\n{text}")

    subprocess.run(["tmux", "-L", server, "-f", "/dev/null", "new-session", "-d", "-s", "kvtop", "-x", "120",
                    "-y", "40", cmd], check=True, env=env, timeout=10)
    try:
        wait_for("101k blocks", 20.0)  # the GPU pool, from the events, while /metrics has not answered once
        wait_for("trtllm-serve.metrics", 15.0)  # the 5 s deadline passed: the stuck endpoint is a problem
        tmux("send-keys", "-t", "kvtop", "q")
        end = time.monotonic() + 10.0
        while not status.exists() and time.monotonic() < end:
            time.sleep(0.1)
        assert status.exists(), "kvtop did not exit after q:\n" + tmux("capture-pane", "-p", "-t", "kvtop")
        assert status.read_text().strip() == str(EXIT_LOST_DATA)
    finally:
        subprocess.run(["tmux", "-L", server, "kill-server"], capture_output=True, timeout=10)
        serve.close()


@pytest.mark.slow
async def test_an_engine_metrics_scrape_has_a_total_deadline_and_follows_a_redirect(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """vLLM's and SGLang's Prometheus page (kvtop/sources/engine_metrics.py) goes through the same deadline: a
    page that trickles is a ``metrics.scrape`` problem after 1 s, not a scrape that never ends; vLLM's mounted
    Prometheus app answers /metrics with a 307 to /metrics/, which is followed."""
    from kvtop.records import SourceId
    from kvtop.sources import engine_metrics

    monkeypatch.setattr(engine_metrics, "HTTP_TIMEOUT_S", 1.0)
    page = b'# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine="0"} 3.0\n'
    serve = SlowServe("trickle", byte_s=0.2, answers={"/page/": (200, page)})
    moved = SlowServe(b"", redirects={"/metrics": f"{serve.url}/page/"})
    records: list[Record] = []
    problems = Problems()
    poller = engine_metrics.MetricsPoller([], records.append, lambda rank: SourceId("h", rank, "r"),
                                          problems=problems)
    try:
        assert await asyncio.wait_for(poller.poll_once(f"{moved.url}/metrics"), 5.0) is True
        assert records and ["vllm:num_requests_running", {"engine": "0"}, 3.0] in records[0].data["samples"]
        t0 = time.monotonic()
        assert await asyncio.wait_for(poller.poll_once(f"{serve.url}/metrics"), 5.0) is False
        took = time.monotonic() - t0
    finally:
        serve.close()
        moved.close()
    p = problems.get("metrics.scrape")
    assert p is not None and "no complete answer within 1 s" in p.message, problems.to_json()
    assert took < 3.0, took
