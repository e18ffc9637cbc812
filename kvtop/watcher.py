"""``kvtop.watch(llm)``: watch the KV cache tiers of an ``LLM`` your own script already drives (:func:`watch`
here, exported by the package as ``kvtop.watch``).

    handle = kvtop.watch(llm, publish="mqtt://broker/lab", record="run.jsonl", prometheus_port=9400)
    ...                       # your generate_async calls, unchanged
    print(handle.summary())   # the TierModel's summary, any time
    handle.stop()

It runs in a background thread with its own asyncio loop, so it works from a plain script, a notebook, or
beside your own loop, and never shares (or blocks) the loop your requests run on. There it polls the engine's
``get_stats_async`` / ``get_kv_cache_events_async`` (:class:`kvtop.sources.poller.EnginePoller`),
samples GPU and host memory once a second (in worker threads: NVML calls block), folds every record into a live
:class:`~kvtop.tiers.TierModel` and hands it to the sinks you asked for.

What the engine needs to report anything (TensorRT-LLM 1.x): ``enable_iter_perf_stats=True`` (PyTorch backend)
for stats, ``KvCacheConfig(event_buffer_max_size=N > 0, enable_block_reuse=True)`` for events. Polling drains
the engine's queues: do not poll them yourself while watching.

Errors in the settings (a bad broker URL, an unwritable file, a busy port) raise here, in your thread, before
anything starts. What happens later (broker down or back, an engine stream failing) never raises into your
script: it is kept in ``handle.log`` and passed to ``on_status(name, message)``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kvtop.records import Record, SourceId, make
from kvtop.sources.poller import EnginePoller
from kvtop.stopsignal import StopSignal

if TYPE_CHECKING:
    from kvtop.tiers import TierSnapshot

StatusCallback = Callable[[str, str], None]  # (name, message), like the sources' on_error / on_status
SAMPLE_S = 1.0  # GPU/host memory once a second: NVML's PCIe counters alone cost ~20 ms per GPU per sample
FINAL_POLL_S = 3.0  # at stop, one last drain of what the engine queued since the last poll, bounded
MAX_LOG = 200  # handle.log keeps the newest 200 lines


class WatchHandle:
    """A running watch. ``model`` is the live TierModel (updated on the watch thread: read it for a glance, or
    call :meth:`summary` for a consistent snapshot). ``stop()`` flushes everything and ends the thread."""

    def __init__(self, source: SourceId):
        self.source = source
        from kvtop.tiers import TierModel

        self.model = TierModel()
        self.records = 0
        self.log: deque[tuple[float, str, str]] = deque(maxlen=MAX_LOG)  # (time, name, message)
        self.publisher: Any = None
        self.recorder: Any = None
        self.exporter: Any = None
        self.prometheus_port: int | None = None
        self.lock = threading.Lock()  # held while a record is folded and fanned out
        self._thread: threading.Thread | None = None
        self._stop = StopSignal()
        self._started = threading.Event()
        self._sinks: list[Callable[[Record], None]] = []
        self._on_status: StatusCallback | None = None
        self.crashed: BaseException | None = None
        # What went wrong (kvtop.problems): a full disk under record=, records the broker never got. In
        # summary()["problems"]; a script can check handle.problems.lost_data.
        from kvtop.problems import Problems

        self.problems = Problems()

    # ------------------------------------------------------------------------------------------ reading

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    @property
    def snapshot(self) -> TierSnapshot | None:
        """The model's last published snapshot (immutable: read it from any thread), every ``interval_s``."""
        return self.model.published

    def summary(self) -> dict[str, Any]:
        """The summary of the model as it is now (a fresh snapshot, taken under the fold's lock)."""
        with self.lock:
            out = self.model.snapshot().summary()
        out["problems"] = self.problems.to_json()
        return out

    def publish(self) -> None:
        with self.lock:
            self.model.snapshot()

    # ------------------------------------------------------------------------------------------ records

    def emit(self, record: Record) -> None:
        with self.lock:
            self.records += 1
            self.model.apply(record)
            for sink in self._sinks:
                try:
                    sink(record)
                except Exception as exc:  # a failing sink (disk full) must not stop the fold or the others
                    self.note(getattr(sink, "__qualname__", "sink"), f"{type(exc).__name__}: {exc}")

    def note(self, name: str, message: str) -> None:
        """Keep one status line (a source failing, the broker lost or back) and pass it on."""
        self.log.append((time.time(), name, message))
        if self._on_status is not None:
            with contextlib.suppress(Exception):
                self._on_status(name, message)

    # ------------------------------------------------------------------------------------------ lifecycle

    def stop(self, timeout: float = 10.0) -> None:
        """Stop polling, drain once more, flush the recorder, say "offline" on MQTT, stop Prometheus. Idempotent."""
        self._stop.stop()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        if self.recorder is not None:
            self.recorder.close()
        if self.exporter is not None:
            self.exporter.stop()

    def __enter__(self) -> WatchHandle:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def watch(llm: Any, publish: str | None = None, record: str | os.PathLike[str] | None = None,
          prometheus_port: int | None = None, interval_s: float = 0.25, run: str | None = None, *,
          prometheus_addr: str = "127.0.0.1", mqtt_password_file: str | os.PathLike[str] | None = None,
          sample_memory: bool = True, on_status: StatusCallback | None = None) -> WatchHandle:
    """Start watching ``llm`` (a TensorRT-LLM ``LLM`` or anything with its surface, e.g. ``SimLLM``).

    ``publish``: an MQTT URL (``mqtt://[user@]host[:port]/prefix``; the password from ``KVTOP_MQTT_PASSWORD`` or
    ``mqtt_password_file``). ``record``: a JSONL file (appended). ``prometheus_port``: serve metrics on
    ``prometheus_addr`` (127.0.0.1) at this port (0: any free port, see ``handle.prometheus_port``).
    ``run`` names the run in records and topics (default ``run-<pid>``).
    """
    if interval_s <= 0:
        raise ValueError(f"interval_s must be > 0, got {interval_s}")
    source = SourceId.local(run=run or "")
    handle = WatchHandle(source)
    handle._on_status = on_status
    # Everything that can fail on a setting is built here, in the caller's thread, so it raises to the caller.
    publisher = None
    if publish:
        from kvtop.sinks.mqtt import publisher_from_url

        publisher = publisher_from_url(publish, source, password_file=mqtt_password_file, on_status=handle.note,
                                       problems=handle.problems)
        handle.publisher = publisher
        handle._sinks.append(publisher.publish)
    try:
        if record is not None:
            from kvtop.sinks.recorder import Recorder

            handle.recorder = Recorder(record, problems=handle.problems)
            handle._sinks.append(handle.recorder.write)
        if prometheus_port is not None:
            from kvtop.sinks.prometheus import PrometheusExporter

            handle.exporter = PrometheusExporter(lambda: handle.model, port=prometheus_port, addr=prometheus_addr,
                                                 source=source)
            handle.prometheus_port = handle.exporter.start()
            handle._sinks.append(handle.exporter.observe)
    except BaseException:
        if handle.recorder is not None:
            handle.recorder.close()
        raise

    thread = threading.Thread(target=_thread_main, args=(handle, llm, publisher, interval_s, sample_memory),
                              name="kvtop-watch", daemon=True)
    handle._thread = thread
    thread.start()
    handle._started.wait(5.0)
    return handle


def engine_meta(llm: Any) -> dict[str, Any]:
    """The ``meta`` record for an engine: its own ``describe()`` (SimLLM), else what a TensorRT-LLM ``LLM``'s
    ``args`` tell, through the one builder every real-engine path uses (:func:`kvtop.engines.meta.meta_from_llm`)."""
    describe = getattr(llm, "describe", None)
    if callable(describe):
        with contextlib.suppress(Exception):
            return dict(describe())
    from kvtop.engines.meta import meta_from_llm

    trt = sys.modules.get("tensorrt_llm")  # only if the user imported it: never import it here (seconds, GPU)
    version = getattr(trt, "__version__", None)
    return meta_from_llm(llm, engine_version=version if isinstance(version, str) else None)


# ---------------------------------------------------------------------------------------------- the thread

def _thread_main(handle: WatchHandle, llm: Any, publisher: Any, interval_s: float, sample_memory: bool) -> None:
    try:
        asyncio.run(_main(handle, llm, publisher, interval_s, sample_memory))
    except BaseException as exc:  # pragma: no cover - a bug of ours: keep it for the user, never kill their app
        handle.crashed = exc
        handle.note("watch", f"stopped: {type(exc).__name__}: {exc}")
    finally:
        handle._started.set()


async def _main(handle: WatchHandle, llm: Any, publisher: Any, interval_s: float, sample_memory: bool) -> None:
    stop = handle._stop.bind()
    handle._started.set()
    source = handle.source
    meta = engine_meta(llm)
    handle.emit(make("meta", meta, source))
    for why in meta.get("meta_unknown") or ():  # GiB figures stay unknown: say why once
        handle.note("watch", why)

    poller = EnginePoller(llm, source, interval_s, handle.emit, on_error=handle.note)
    tasks = [asyncio.ensure_future(poller.run())]
    if publisher is not None:
        tasks.append(asyncio.ensure_future(publisher.run()))
    if sample_memory:
        tasks.append(asyncio.ensure_future(_sample_memory(handle, stop, meta)))
    tasks.append(asyncio.ensure_future(_publishing(handle, stop, interval_s)))
    try:
        await stop.wait()
    finally:
        poller.stop()
        await asyncio.gather(tasks[0], return_exceptions=True)
        with contextlib.suppress(Exception):  # the last items the engine queued since the last poll
            await asyncio.wait_for(poller.poll_once(), timeout=FINAL_POLL_S)
        if publisher is not None:
            publisher.stop()  # flushes (<= 1 s) and publishes "offline"
        await asyncio.gather(*tasks[1:], return_exceptions=True)
        handle.publish()  # the last drain's records, for handle.snapshot and a last scrape


async def _publishing(handle: WatchHandle, stop: asyncio.Event, interval_s: float) -> None:
    """A snapshot every poll interval (only when the model changed): what the exporter's scrapes and
    ``handle.snapshot`` read from other threads."""
    while not stop.is_set():
        handle.publish()
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=interval_s)


async def _sample_memory(handle: WatchHandle, stop: asyncio.Event, meta: dict[str, Any]) -> None:
    samplers: list[Any] = []
    with contextlib.suppress(Exception):
        from kvtop.sources.host import HostSource

        host = HostSource(source=handle.source)
        if meta.get("host_cache_bytes"):  # the pinned pool is not measurable from /proc (see host.py)
            host.set_pinned_pool(int(meta["host_cache_bytes"]))
        samplers.append(host)
    with contextlib.suppress(Exception):
        from kvtop.sources.nvml import NvmlSource

        samplers.append(NvmlSource(source=handle.source))
    try:
        while not stop.is_set():
            for sampler in samplers:
                try:
                    for rec in await asyncio.to_thread(sampler.sample):
                        handle.emit(rec)
                except Exception as exc:  # samplers never raise by contract; a bug must not end the watch
                    handle.note(type(sampler).__name__, f"{type(exc).__name__}: {exc}")
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop.wait(), timeout=SAMPLE_S)
    finally:
        for sampler in samplers:
            close = getattr(sampler, "close", None)
            if callable(close):
                with contextlib.suppress(Exception):
                    close()


__all__ = ["WatchHandle", "watch", "engine_meta"]
