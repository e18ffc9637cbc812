"""The conformance corpus (issue 23, item 8): every folder tests/data/engines/<engine>/<version>/ holds what an engine
release sends (made by its own encoder where possible; tests/data/engines/README.md says where each came from) and
expect.json, the numbers the screen must show. Each folder goes through kvtop's real path, as ``kvtop attach``
takes it: a stdlib HTTP server on 127.0.0.1 serving trtllm-serve's routes (``/metrics``, ``/kv_cache_events``) or
a ZMQ publisher on 127.0.0.1 sending the frames; the attach session's source, decoder and fold; the ``--json``
summary and the headless text made from it. A new engine release is one new folder.

expect.json keys (each optional):

- ``summary``: ``{"dotted.path": value}`` read in the ``--json`` summary (``fleet.all.hits``,
  ``tiers.gpu.cached_blocks``, ``moves.left_inferred``, ``stream.stored_blocks``...): equal, exactly;
- ``text``: lines the headless text summary must contain;
- ``problems``: the problem kinds the run reports (``[]``: none), compared as a set;
- ``sources``: how many sources the session has.
"""

from __future__ import annotations

import asyncio
import base64
import json
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from kv_publisher import Publisher

from kvtop import run_summary
from kvtop.compose import build_attach_session

ROOT = Path(__file__).parent / "data" / "engines"
FOLDERS = sorted(p.parent for p in ROOT.glob("*/*/expect.json"))


class _Routes:
    """trtllm-serve's monitoring routes serving a folder's files once each, then empty lists (drain-once queues)."""

    def __init__(self, folder: Path) -> None:
        self.bodies: dict[str, list[Any]] = {}
        for route, name in (("/metrics", "metrics.json"), ("/kv_cache_events", "kv_cache_events.json")):
            path = folder / name
            self.bodies[route] = [json.loads(path.read_text())] if path.exists() else []
        version = json.loads((folder / "expect.json").read_text()).get("served_version", "1.2.0")
        routes = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _send(self, body: Any, code: int = 200) -> None:
                raw = json.dumps(body).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(raw)))
                self.end_headers()
                self.wfile.write(raw)

            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                if self.path == "/version":
                    return self._send({"version": version})
                if self.path == "/v1/models":
                    return self._send({"object": "list", "data": [{"id": "Qwen/Qwen3-8B", "object": "model"}]})
                if self.path == "/metrics":
                    queue = routes.bodies["/metrics"]
                    return self._send(queue.pop(0) if queue else [])
                return self._send({"detail": "Not Found"}, 404)

            def do_POST(self) -> None:  # noqa: N802
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path == "/kv_cache_events":
                    queue = routes.bodies["/kv_cache_events"]
                    return self._send(queue.pop(0) if queue else [])
                return self._send({"detail": "Not Found"}, 404)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def drained(self) -> bool:
        return not any(self.bodies.values())

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


async def _settle(session: Any, done: Any, timeout: float = 20.0) -> None:
    """Until ``done()`` and then no new record for 0.3 s (generous deadlines: this machine is shared)."""
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, "the source did not take the folder's payloads in time"
        await asyncio.sleep(0.02)
    seen, quiet = -1, time.monotonic()
    while time.monotonic() - quiet < 0.3:
        if session.records != seen:
            seen, quiet = session.records, time.monotonic()
        await asyncio.sleep(0.02)


async def _run_http(folder: Path) -> dict[str, Any]:
    routes = _Routes(folder)
    try:
        session = build_attach_session(routes.url, command="attach", run="corpus", interval_s=0.05)
        task = asyncio.ensure_future(session.run())
        await _settle(session, routes.drained)
        session.stop()
        await asyncio.wait_for(task, 10)
        return run_summary.summary(session) | {"_sources": len(session.models)}
    finally:
        routes.close()


async def _run_zmq(folder: Path) -> dict[str, Any]:
    spec = json.loads((folder / "frames.json").read_text())
    pub = Publisher(replay=False, topic=b"kv-events")
    try:
        session = build_attach_session(pub.url, command="attach", run="corpus")
        task = asyncio.ensure_future(session.run())
        await asyncio.to_thread(pub.wait_subscribed)
        frames = spec["frames"]
        for f in frames:
            pub.send_raw([f["topic"].encode(), f["seq"].to_bytes(8, "big"), base64.b64decode(f["payload_b64"])])
        src = session.zmq_source
        await _settle(session, lambda: sum(r.received + r.bad for r in src.ranks) >= len(frames))
        session.stop()
        await asyncio.wait_for(task, 10)
        return run_summary.summary(session) | {"_sources": len(session.models)}
    finally:
        pub.close()


def _at(obj: Any, path: str) -> Any:
    for part in path.split("."):
        if not isinstance(obj, dict) or part not in obj:
            raise AssertionError(f"{path}: no {part!r} in the summary")
        obj = obj[part]
    return obj


@pytest.fixture(params=FOLDERS, ids=[f"{p.parent.name}-{p.name}" for p in FOLDERS])
def folder(request: pytest.FixtureRequest) -> Iterator[Path]:
    yield request.param


def test_the_corpus_has_every_engine() -> None:
    """At least TensorRT-LLM 1.x and main, two vLLM releases, SGLang and Dynamo (issue 23, item 8)."""
    names = {f"{p.parent.name}/{p.name}" for p in FOLDERS}
    assert {"trtllm/1.2", "trtllm/1.3", "trtllm/main", "vllm/0.33.0", "vllm/0.11.0", "sglang/0.5.23",
            "dynamo/1.6.1"} <= names


async def test_folder_reads_as_the_engine_says(folder: Path) -> None:
    expect = json.loads((folder / "expect.json").read_text())
    summary = await (_run_zmq(folder) if (folder / "frames.json").exists() else _run_http(folder))
    wrong = []
    for path, want in expect.get("summary", {}).items():
        got = _at(summary, path)
        if got != want:
            wrong.append(f"{path}: {got!r}, expected {want!r}")
    text = run_summary.format_summary(summary)
    wrong += [f"text has no line with {line!r}" for line in expect.get("text", []) if line not in text]
    if "problems" in expect:
        kinds = {p["kind"] for p in summary["problems"]}
        if kinds != set(expect["problems"]):
            wrong.append(f"problems {sorted(kinds)}, expected {sorted(expect['problems'])}")
    if "sources" in expect and summary["_sources"] != expect["sources"]:
        wrong.append(f"{summary['_sources']} sources, expected {expect['sources']}")
    assert not wrong, f"{folder.relative_to(ROOT)}:\n" + "\n".join(wrong) + "\n\n" + text
