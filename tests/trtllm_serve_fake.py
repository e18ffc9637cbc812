"""trtllm-serve for tests: its documented payloads and a stand-in server of its monitoring routes (stdlib HTTP,
in a thread, 127.0.0.1). Shared by the tests of the trtllm-serve source, the engine meta and the fleet."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

# trtllm-kv.md 1.5, verbatim from TensorRT-LLM's trtllm-serve docs, less its "..." line (not JSON).
METRICS_EXAMPLE = json.loads((Path(__file__).parent / "data" / "trtllm_serve_metrics_example.json").read_text())


class FakeServe:
    """trtllm-serve's monitoring routes. Each route serves its queued answers once, then its default forever
    (drain-once queues, like the real server). ``status[path]`` makes a route answer an HTTP error."""

    def __init__(self, port: int = 0) -> None:
        self.queues: dict[str, list[Any]] = {"/metrics": [], "/kv_cache_events": [], "/perf_metrics": []}
        self.status: dict[str, int] = {}
        self.hits: dict[str, int] = {}
        self.methods: dict[str, str] = {}
        self.raw: dict[str, bytes] = {}
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:  # keep pytest output clean
                pass

            def _answer(self, method: str) -> None:
                path = self.path
                fake.hits[path] = fake.hits.get(path, 0) + 1
                fake.methods[path] = method
                allowed = {"/metrics": "GET", "/perf_metrics": "GET", "/kv_cache_events": "POST",
                           "/version": "GET", "/v1/models": "GET", "/prometheus/metrics": "GET"}
                code = fake.status.get(path, 200)
                if path not in allowed or code == 404:
                    return self._send(404, b'{"detail":"Not Found"}')
                if allowed[path] != method:
                    return self._send(405, b'{"detail":"Method Not Allowed"}')
                if code != 200:
                    return self._send(code, b'{"detail":"boom"}')
                if path in fake.raw:
                    return self._send(200, fake.raw[path])
                if path == "/version":
                    return self._send(200, b'{"version": "1.2.0"}')
                if path == "/v1/models":
                    return self._send(200, json.dumps({"object": "list", "data": [
                        {"id": "Qwen/Qwen3-8B", "object": "model", "owned_by": "tensorrt_llm"}]}).encode())
                if path == "/prometheus/metrics":  # text, served from raw (above) when a test sets it
                    return self._send(404, b'{"detail":"Not Found"}')
                queue = fake.queues[path]
                body = queue.pop(0) if queue else []
                self._send(200, json.dumps(body).encode())

            def _send(self, code: int, body: bytes) -> None:
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802 (http.server's naming)
                self._answer("GET")

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                self.rfile.read(length)
                self._answer("POST")

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def zero_window(**kv: Any) -> dict[str, Any]:
    keys = ("primaryMaxNumBlocks", "primaryFreeNumBlocks", "primaryUsedNumBlocks", "primaryEvictableNumBlocks",
            "primaryPeakFreeNumBlocks", "primaryPeakUsedNumBlocks", "primaryPeakEvictableNumBlocks",
            "iterAllocTotalBlocks", "iterAllocNewBlocks", "iterReusedBlocks", "iterFullReusedBlocks",
            "iterPartialReusedBlocks", "iterMissedBlocks", "iterCacheHitRate", "iterGenAllocBlocks",
            "iterOnboardBlocks", "iterOnboardBytes", "iterOffloadBlocks", "iterOffloadBytes",
            "iterIntraDeviceCopyBlocks", "iterIntraDeviceCopyBytes", "iterHostDroppedBlocks", "iterHostDroppedBytes")
    out: dict[str, Any] = dict.fromkeys(keys, 0)
    out["iterCacheHitRate"] = 0.0
    out.update(kv)
    return out


def pool_group(pid: int, slot: int, windows: list[int], **kv: Any) -> dict[str, Any]:
    w = zero_window(**kv)
    for k in ("iterReusedBlocks", "iterFullReusedBlocks", "iterPartialReusedBlocks", "iterMissedBlocks",
              "iterCacheHitRate"):
        del w[k]  # KV_CACHE_ITERATION_STATS_POOL_GROUP_KEYS has no reuse keys
    return {"poolGroupId": pid, "slotSize": [slot], "windowSizes": windows, **w}


V2_STATS: dict[str, Any] = {
    "iter": 7, "numCompletedRequests": 0, "numActiveRequests": 2, "numQueuedRequests": 0,
    "kvCacheIterationStats": {
        "32": zero_window(iterAllocNewBlocks=2, iterReusedBlocks=3, iterMissedBlocks=1, iterCacheHitRate=0.75),
        "64": zero_window(iterAllocNewBlocks=4, iterReusedBlocks=2, iterMissedBlocks=2, iterCacheHitRate=0.5),
    },
    "iterSuspendedRequests": 2, "iterResumedRequests": 1, "iterDiskPrefetchBlocks": 7,
    "iterCachedTokensByLevel": [12, 8, 0], "kvCacheLevelTiers": ["gpu", "host", "disk"],
    "kvCacheIterationStatsByPoolGroup": {
        "0": pool_group(0, 4096, [32, 64], primaryMaxNumBlocks=20, primaryFreeNumBlocks=8, primaryUsedNumBlocks=12,
                   primaryEvictableNumBlocks=3, primaryPeakFreeNumBlocks=18, primaryPeakUsedNumBlocks=14,
                   primaryPeakEvictableNumBlocks=7, iterAllocNewBlocks=6),
        "1": pool_group(1, 2048, [], primaryMaxNumBlocks=10, primaryFreeNumBlocks=6, primaryUsedNumBlocks=4,
                   primaryEvictableNumBlocks=1, primaryPeakFreeNumBlocks=9, primaryPeakUsedNumBlocks=5,
                   primaryPeakEvictableNumBlocks=2, iterOnboardBlocks=1, iterOnboardBytes=2048),
    },
    "kvCacheIterationStatsByColdPoolGroup": {
        "0": {"coldPoolGroupId": 0, "slotSize": [4096], "windowSizes": [32, 64], "secondaryMaxNumBlocks": 18,
              "secondaryFreeNumBlocks": 7, "secondaryUsedNumBlocks": 11, "secondaryEvictableNumBlocks": 4,
              "secondaryPeakFreeNumBlocks": 14, "secondaryPeakUsedNumBlocks": 13,
              "secondaryPeakEvictableNumBlocks": 6},
    },
    "kvCacheIterationStatsByLifecycle": {
        "0": {"lifeCycleId": 0, "poolGroupId": 0, "windowSize": 32, "kind": "attention", "iterReusedBlocks": 3,
              "iterFullReusedBlocks": 0, "iterPartialReusedBlocks": 0, "iterMissedBlocks": 1,
              "iterCacheHitRate": 0.75, "iterFullReusedBlocksByLevel": [2, 0, 0],
              "iterPartialReusedBlocksByLevel": [0, 1, 0]},
        "1": {"lifeCycleId": 1, "poolGroupId": 0, "windowSize": 64, "kind": "attention", "iterReusedBlocks": 2,
              "iterFullReusedBlocks": 0, "iterPartialReusedBlocks": 0, "iterMissedBlocks": 2,
              "iterCacheHitRate": 0.5},
        "2": {"lifeCycleId": 2, "poolGroupId": 1, "windowSize": None, "kind": "ssm", "snapshotStats": {
            "iterSnapshotLookups": 5, "iterSnapshotHits": 3, "iterSnapshotMisses": 2, "iterSnapshotHitRate": 0.6,
            "iterReusedTokens": 24, "iterUnreusedTokens": 16, "iterAlignedSnapshotHits": 2,
            "iterUnalignedSnapshotHits": 1}},
    },
}
