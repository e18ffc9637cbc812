"""Prometheus exporter: the TierModel's state as metrics, served over HTTP (127.0.0.1 unless told otherwise).

Metric names and meanings: ``docs/prometheus.md``. Two kinds of data:

- *State* (blocks per tier, hit rates, move totals) is read at scrape time by a custom collector from each
  TierModel's last published snapshot (kvtop/tiers/snapshot.py), so records cost nothing extra here and a scrape
  never reads a model that another thread is folding into.
- *Observations* (request latencies) need every sample: :meth:`PrometheusExporter.observe` (the sink) feeds
  request records into histograms and counts records by kind. GPU and host memory come from the model too
  (it keeps the latest ``gpu``/``host`` sample per device).

A dedicated ``CollectorRegistry`` (never the global one): two exporters in one process (tests, ``kvtop.watch``
beside a kvtop run) do not collide, and the user's own process metrics are not mixed into kvtop's.
Labels ``host``, ``rank``, ``run`` name the source, so one Prometheus can scrape a fleet without relabelling.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from kvtop.records import Record, SourceId
from kvtop.tiers.requests import prefix_source

NAMESPACE = "kvtop"
LABELS = ("host", "rank", "run")
TIERS = ("gpu", "host")
BLOCK_STATES = ("capacity", "in_use", "cached", "free")
HIT_SCOPES = ("cumulative", "window", "gpu", "host", "disk")  # disk: only where the engine says it (else absent)
# the disk tier's moves (Moves.disk_*, issue 23 item 3): direction label -> the Moves field
DISK_MOVES = (("to_host", "disk_prefetched_blocks"), ("to_gpu", "disk_onboarded_blocks"),
              ("into_disk", "disk_offloaded_blocks"))
# TTFT from ~5 ms (a cached prompt on an H200) to a minute (a long prompt queued behind a full batch); e2e up
# to 5 minutes (long generations). 13 and 12 buckets: ~25 series per source, cheap for any Prometheus.
TTFT_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
E2E_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)
# A connection that sends nothing for this long is closed (a socket read timeout), and at most MAX_CONNECTIONS are
# served at once (one thread each); more are closed unread. prometheus_client's own server has neither: 500 idle
# TCP connections held 500 threads for ever.
CONNECTION_TIMEOUT_S = 10.0
MAX_CONNECTIONS = 64

ModelProvider = Callable[[], Any]  # () -> a TierModel, or a mapping of source key ("host/rank/run") -> TierModel


def _get(obj: Any, name: str) -> Any:
    if obj is None:
        return None
    if isinstance(obj, Mapping):
        return obj.get(name)
    return getattr(obj, name, None)


def _number(value: Any) -> float | None:
    """A sample value, or None (left out): not a number, or an integer too large for a float (10**400 would
    raise OverflowError inside the scrape and fail every metric of every source, not just this one)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    try:
        return float(value)
    except OverflowError:
        return None


def _first(*values: Any) -> Any:
    return next((v for v in values if v is not None), None)


_NOT_A_MODEL = object()


def _published(obj: Any) -> Any:
    """What a scrape reads of ``obj``: a TierModel's last published snapshot (None before the first), or the object
    itself when it is a snapshot already or a summary mapping."""
    published = getattr(obj, "published", _NOT_A_MODEL)
    return obj if published is _NOT_A_MODEL else published


def _labels(source: SourceId) -> list[str]:
    return [source.host, str(source.rank), source.run]


def _source_from_key(key: str) -> SourceId:
    host, _, rest = key.partition("/")
    rank, _, run = rest.partition("/")
    return SourceId(host=host, rank=int(rank) if rank.isdigit() and len(rank) < 20 else 0, run=run)


class _StateCollector(Collector):
    def __init__(self, exporter: PrometheusExporter):
        self.exporter = exporter

    def describe(self) -> list[Metric]:
        return []  # unchecked collector: its series come and go with sources

    def collect(self) -> Iterator[Metric]:
        # A scrape runs on the HTTP server's thread while the models are folded on the event loop's: it reads
        # each model's last published snapshot (TierModel.published, immutable), never the live fold.
        yield from self._families()

    def _families(self) -> list[Metric]:
        models = self.exporter.models()
        g = {state: GaugeMetricFamily(f"{NAMESPACE}_kv_{state}_blocks", doc, labels=[*LABELS, "tier"])
             for state, doc in (
                 ("capacity", "KV cache blocks the tier's pool holds (its size)"),
                 ("in_use", "KV cache blocks held by running requests"),
                 ("cached", "KV cache blocks holding reusable KV (in the reuse tree)"),
                 ("free", "KV cache blocks held by no request, empty or cached-and-evictable (TensorRT-LLM's "
                          "freeNumBlocks, vLLM's free blocks)"))}
        hit = GaugeMetricFamily(f"{NAMESPACE}_kv_hit_ratio",
                                "Reused / (reused + missed) context blocks, warm-up excluded; scope: cumulative, "
                                "window (recent), gpu (hits served from GPU), host (hits onboarded from host)",
                                labels=[*LABELS, "scope"])
        moved = {name: CounterMetricFamily(f"{NAMESPACE}_kv_{name}_blocks", doc, labels=list(LABELS))
                 for name, doc in (("offloaded", "Blocks moved GPU -> host (offload on evict)"),
                                   ("onboarded", "Blocks moved host -> GPU (onboard on reuse)"))}
        disk_moved = CounterMetricFamily(f"{NAMESPACE}_kv_disk_moved_blocks",
                                         "Blocks the disk tier moved, where the engine has one: direction=to_host "
                                         "(a prefetch), to_gpu (an onboard from disk), into_disk (an offload to it)",
                                         labels=[*LABELS, "direction"])
        evicted = CounterMetricFamily(f"{NAMESPACE}_kv_evicted_blocks",
                                      "Cached blocks dropped from a tier (tier=gpu: dropped, not offloaded)",
                                      labels=[*LABELS, "tier"])
        left = CounterMetricFamily(f"{NAMESPACE}_kv_left_blocks",
                                   "Blocks that left a tier, by reason (evicted, offloaded, released, cleared); "
                                   "basis=engine where the engine's events say why, inferred where kvtop worked it "
                                   "out (vLLM's and SGLang's BlockRemoved carry no reason)",
                                   labels=[*LABELS, "tier", "reason", "basis"])
        approx = GaugeMetricFamily(f"{NAMESPACE}_kv_counts_approximate",
                                   "1 while block counts folded from events may be off (dropped events, attach "
                                   "mid-stream, unknown hashes)", labels=list(LABELS))
        dropped = CounterMetricFamily(f"{NAMESPACE}_kv_events_dropped",
                                      "KV cache events the engine dropped (event id gaps: event_buffer_max_size too "
                                      "small)", labels=list(LABELS))
        bad = CounterMetricFamily(f"{NAMESPACE}_bad_records", "Malformed records the fold skipped",
                                  labels=list(LABELS))
        block = GaugeMetricFamily(f"{NAMESPACE}_kv_block_bytes", "Bytes of one KV cache block (all layers)",
                                  labels=list(LABELS))
        gpu_mem = {k: GaugeMetricFamily(f"{NAMESPACE}_gpu_memory_{k}_bytes", doc,
                                        labels=[*LABELS, "gpu", "name"])
                   for k, doc in (("used", "GPU memory in use (NVML; v2 leaves out driver-reserved memory)"),
                                  ("total", "GPU memory in total (NVML)"),
                                  ("process", "GPU memory of the engine process and its children (NVML)"))}
        verdict = GaugeMetricFamily(f"{NAMESPACE}_tier_verdict_seconds",
                                    "Is a tier below the GPU paying off (kvtop/tiers/verdict.py): part=saved (prefill "
                                    "its hits saved), spent (its copies), net (saved - spent), seconds since start",
                                    labels=[*LABELS, "tier", "part"])
        says = GaugeMetricFamily(f"{NAMESPACE}_tier_verdict",
                                 "1 for what the verdict says of the tier (says: pays, costs, idle, none, unknown) "
                                 "and what it rests on (basis: measured, measured prefill, estimated, not priced)",
                                 labels=[*LABELS, "tier", "says", "basis"])
        host_mem = {k: GaugeMetricFamily(f"{NAMESPACE}_host_{k}_bytes", doc, labels=list(LABELS))
                    for k, doc in (("process_rss", "Engine process resident memory (includes the pinned KV pool)"),
                                   ("available", "System memory available (psutil)"),
                                   ("pinned_pool", "Pinned host KV pool size, as the engine reports it or from "
                                                   "blocks x bytes per block"))}
        for source, live in models:
            model = _published(live)
            if model is None:
                continue  # nothing published yet: absent, never a half-folded reading
            lv = _labels(source)
            # Every tier the model has (GPU, host, and disk where the engine has one), by TierState.name; a model
            # read from a summary dict (fleet) or an older one without .tiers falls back to the two named ones.
            tiers = _get(model, "tiers")
            if isinstance(tiers, Mapping):
                tier_list = [(name, t) for name, t in tiers.items()]
            elif isinstance(tiers, (list, tuple)):
                tier_list = [(str(_get(t, "name")), t) for t in tiers]
            else:
                tier_list = [(name, _get(model, name)) for name in TIERS]
            for tier, t in tier_list:
                for state in BLOCK_STATES:
                    v = _number(_get(t, f"{state}_blocks"))
                    if v is not None:  # unknown stays absent, never 0 (a host pool with no events)
                        g[state].add_metric([*lv, tier], v)
            hr = _get(model, "hit_rate")
            for scope in HIT_SCOPES:
                v = _number(_get(hr, scope))
                if v is not None:
                    hit.add_metric([*lv, scope], v)
            mv = _get(model, "moves")
            for name in ("offloaded", "onboarded"):
                v = _number(_get(mv, f"{name}_blocks"))
                if v is not None:
                    moved[name].add_metric(lv, v)
            if _get(mv, "disk") is True:
                for direction, field in DISK_MOVES:
                    v = _number(_get(mv, field))
                    if v is not None:
                        disk_moved.add_metric([*lv, direction], v)
            for tier in TIERS:
                v = _number(_get(mv, f"evicted_{tier}_blocks"))
                if v is not None:
                    evicted.add_metric([*lv, tier], v)
            for basis, attr in (("engine", "left_said"), ("inferred", "left_inferred")):
                per_tier = _get(mv, attr)
                if isinstance(per_tier, Mapping):
                    for tier, per in per_tier.items():
                        for reason, n in (per.items() if isinstance(per, Mapping) else ()):
                            v = _number(n)
                            if v is not None:
                                left.add_metric([*lv, str(tier), str(reason), basis], v)
            flag = _get(model, "counts_approximate")
            if isinstance(flag, bool):
                approx.add_metric(lv, 1.0 if flag else 0.0)
            v = _number(_get(_get(model, "quality"), "events_dropped"))
            if v is not None:
                dropped.add_metric(lv, v)
            v = _number(_get(model, "bad_records"))
            if v is not None:
                bad.add_metric(lv, v)
            v = _number(_get(model, "bytes_per_block"))
            if v is not None:
                block.add_metric(lv, v)
            for index, dev in sorted((_get(model, "gpus") or {}).items()):
                glv = [*lv, str(index), str(_get(dev, "name") or "")]
                for k, value in (("used", _get(dev, "memory_used_bytes")), ("total", _get(dev, "memory_total_bytes")),
                                 ("process", _get(_get(dev, "data"), "process_used_bytes"))):
                    v = _number(value)
                    if v is not None:
                        gpu_mem[k].add_metric(glv, v)
            verdicts = _get(model, "verdict")
            for tier, v in (verdicts.items() if isinstance(verdicts, Mapping) else ()):
                # a snapshot's TierVerdict, or its JSON (a fleet row read from an agent's summary)
                said, basis = _get(v, "says"), _get(v, "basis")
                if isinstance(said, str) and isinstance(basis, str):
                    says.add_metric([*lv, str(tier), said, basis.split(":", 1)[0]], 1.0)
                for part in ("saved", "spent", "net"):
                    x = _number(_get(v, f"{part}_s"))
                    if x is not None:
                        verdict.add_metric([*lv, str(tier), part], x)
            hm = _get(model, "host_memory")
            raw = _get(hm, "data")  # the host record verbatim: kvtop.sources.host's key names
            for k, value in (("process_rss", _first(_get(hm, "rss_bytes"), _get(raw, "process_rss_bytes"))),
                             ("available", _first(_get(hm, "available_bytes"), _get(raw, "system_available_bytes"))),
                             ("pinned_pool", _get(hm, "pinned_pool_bytes"))):
                v = _number(value)
                if v is not None:
                    host_mem[k].add_metric(lv, v)
        return [*g.values(), hit, *moved.values(), disk_moved, evicted, left, approx, dropped, bad, block,
                *gpu_mem.values(), *host_mem.values(), verdict, says]


class PrometheusExporter:
    """Serves the model(s) from ``model`` (a callable) and the records given to :meth:`observe`.

    ``model()`` returns the live TierModel, or a mapping ``{source key: TierModel}`` for several sources; a scrape
    reads what each last published (``TierModel.snapshot()``, called by the folding side: ``Session.publish_s``,
    ``kvtop.watch``'s thread, or :meth:`publish`). With one model, its labels are ``source`` (or the first record's
    source). ``port=0`` binds a free port (:attr:`port` tells which once started).
    """

    def __init__(self, model: ModelProvider, *, port: int = 9400, addr: str = "127.0.0.1",
                 source: SourceId | None = None, registry: CollectorRegistry | None = None,
                 timeout_s: float = CONNECTION_TIMEOUT_S, max_connections: int = MAX_CONNECTIONS):
        self._model = model
        self.timeout_s = timeout_s
        self.max_connections = max_connections
        self.requested_port = port
        self.addr = addr
        self.source = source
        self.registry = registry or CollectorRegistry(auto_describe=False)
        self.port: int | None = None
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.ttft = Histogram(f"{NAMESPACE}_request_ttft_seconds", "Time to first token of finished requests",
                              LABELS, buckets=TTFT_BUCKETS, registry=self.registry)
        self.ttft_by_prefix = Histogram(f"{NAMESPACE}_request_ttft_by_prefix_seconds",
                                        "Time to first token of finished requests by where the prefix came from "
                                        "(prefix_source: gpu_hit, host_hit, disk_hit, miss)",
                                        [*LABELS, "prefix_source"], buckets=TTFT_BUCKETS, registry=self.registry)
        self.e2e = Histogram(f"{NAMESPACE}_request_e2e_seconds", "Arrival to last token of finished requests",
                             LABELS, buckets=E2E_BUCKETS, registry=self.registry)
        self.requests = Counter(f"{NAMESPACE}_requests", "Finished requests by outcome (ok, failed)",
                                [*LABELS, "outcome"], registry=self.registry)
        self.records = Counter(f"{NAMESPACE}_records", "Records received by kind", [*LABELS, "kind"],
                               registry=self.registry)
        self.registry.register(_StateCollector(self))

    # ------------------------------------------------------------------------------------------ the sink

    def observe(self, record: Record) -> None:
        """Take the observations a record carries (request latencies). O(1); never raises for data."""
        src = record.source
        if self.source is None:
            self.source = src
        lv = _labels(src)
        self.records.labels(*lv, record.kind).inc()
        data = record.data
        if record.kind == "request":
            self.requests.labels(*lv, "ok" if data.get("ok") else "failed").inc()
            if data.get("ok"):
                for hist, key in ((self.ttft, "ttft_s"), (self.e2e, "e2e_s")):
                    v = _number(data.get(key))
                    if v is not None and v >= 0:
                        hist.labels(*lv).observe(v)
                ttft, source = _number(data.get("ttft_s")), prefix_source(data)
                if ttft is not None and ttft >= 0 and source is not None:
                    self.ttft_by_prefix.labels(*lv, source).observe(ttft)

    __call__ = observe

    def models(self) -> list[tuple[SourceId, Any]]:
        got = self._model()
        if got is None:
            return []
        if isinstance(got, Mapping):
            return [(_source_from_key(k), m) for k, m in got.items()]
        return [(self.source or SourceId(), got)]

    # ------------------------------------------------------------------------------------------ serving

    def start(self) -> int:
        """Serve ``/metrics`` on ``addr:port`` in a daemon thread; returns the bound port. Each connection is
        served on its own thread, closed after ``timeout_s`` without data; at most ``max_connections`` at once."""
        if self._server is not None:
            return int(self.port or 0)
        server = _serve(self.addr, self.requested_port, self.registry, self.timeout_s, self.max_connections)
        thread = threading.Thread(target=server.serve_forever, name="kvtop-prometheus", daemon=True)
        thread.start()
        self._server, self._thread = server, thread
        self.port = int(server.server_port)
        return self.port

    def stop(self) -> None:
        server, self._server = self._server, None
        if server is not None:
            server.shutdown()
            server.server_close()

    def publish(self) -> None:
        """Publish every model's snapshot now: on the folding thread only (tests, one-thread tools)."""
        for _source, model in self.models():
            snapshot = getattr(model, "snapshot", None)
            if callable(snapshot):
                snapshot()

    def render(self) -> bytes:
        """The exposition text, as a scrape would get it, of the models as they are now: call it on the folding
        thread (tests, ``--headless`` dumps); it publishes first."""
        from prometheus_client import generate_latest

        self.publish()
        return generate_latest(self.registry)


def _serve(addr: str, port: int, registry: CollectorRegistry, timeout_s: float, max_connections: int) -> Any:
    """prometheus_client's WSGI app on a threading server whose connections time out and are bounded in number."""
    import socket
    from wsgiref.simple_server import WSGIRequestHandler, make_server

    from prometheus_client.exposition import ThreadingWSGIServer, make_wsgi_app

    class Handler(WSGIRequestHandler):
        timeout = timeout_s  # StreamRequestHandler.setup: socket.settimeout; a silent peer's read ends there

        def handle(self) -> None:
            try:
                super().handle()
            except OSError:  # the timeout, or a peer gone: the connection is closed, nothing to print
                self.close_connection = True

        def log_message(self, format: str, *args: Any) -> None:
            pass

    slots = threading.BoundedSemaphore(max_connections)

    class Server(ThreadingWSGIServer):
        address_family = socket.AF_INET6 if ":" in addr else socket.AF_INET
        request_queue_size = 128  # listen backlog (socketserver's 5 made a 6th client wait a second to connect)

        def process_request(self, request: Any, client_address: Any) -> None:
            if not slots.acquire(blocking=False):
                self.shutdown_request(request)  # all slots taken: closed unread, no thread
                return
            try:
                super().process_request(request, client_address)
            except BaseException:
                slots.release()
                raise

        def process_request_thread(self, request: Any, client_address: Any) -> None:
            try:
                super().process_request_thread(request, client_address)
            finally:
                slots.release()

    return make_server(addr, port, make_wsgi_app(registry), Server, handler_class=Handler)


__all__ = ["PrometheusExporter", "TTFT_BUCKETS", "E2E_BUCKETS"]
