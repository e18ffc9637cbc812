"""``kvtop.watch(llm)``: watch the KV cache tiers of an ``LLM`` your own script already drives (:func:`watch`
here, exported by the package as ``kvtop.watch``).

    handle = kvtop.watch(llm, publish="mqtt://broker/lab", record="run.jsonl", prometheus_port=9400)
    ...                       # your generate_async calls, unchanged
    print(handle.summary())   # the TierModel's summary, any time
    handle.stop()

It is a :class:`kvtop.session.Session` run in a background thread with its own asyncio loop, so it works from a
plain script, a notebook, or beside your own loop, and never shares (or blocks) the loop your requests run on.
There it polls the engine's ``get_stats_async`` / ``get_kv_cache_events_async``
(:class:`kvtop.sources.poller.EnginePoller`), samples GPU and host memory once a second (in worker threads: NVML
calls block), folds every record into the session's live :class:`~kvtop.tiers.TierModel` and hands it to the sinks
you asked for: the same session, meta, samplers and sinks as ``kvtop``'s own modes (kvtop/compose.py).

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
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from kvtop import compose
from kvtop.records import Record, SourceId, make
from kvtop.session import Session
from kvtop.sources.poller import EnginePoller
from kvtop.stopsignal import StopSignal

if TYPE_CHECKING:
    from kvtop.tiers import TierModel, TierSnapshot

StatusCallback = Callable[[str, str], None]  # (name, message), like the sources' on_error / on_status
SAMPLE_S = 1.0  # GPU/host memory once a second: NVML's PCIe counters alone cost ~20 ms per GPU per sample
FINAL_POLL_S = 3.0  # at stop, one last drain of what the engine queued since the last poll, bounded
MAX_LOG = 200  # handle.log keeps the newest 200 lines


class WatchSession(Session):
    """The watch's Session: its fold is read from the caller's thread (``handle.summary()``, the exporter's
    scrapes), so every record is folded and every snapshot taken under ``lock``; its warnings and errors (a sink
    that failed, a sampler's) reach ``on_note`` as the handle's status lines."""

    def __init__(self, *, source: SourceId, lock: threading.Lock, on_note: StatusCallback):
        super().__init__(source=source)
        self.lock = lock
        self.on_note = on_note

    def emit(self, record: Record, *, to_sinks: bool = True) -> None:
        with self.lock:
            super().emit(record, to_sinks=to_sinks)

    def publish(self) -> None:
        with self.lock:
            super().publish()

    def note(self, level: str, text: str) -> None:
        super().note(level, text)
        if level in ("warn", "error"):
            self.on_note("watch", text)


class WatchHandle:
    """A running watch. ``model`` is the live TierModel (updated on the watch thread: read it for a glance, or
    call :meth:`summary` for a consistent snapshot). ``stop()`` flushes everything and ends the thread.
    ``session`` is the Session the thread runs."""

    def __init__(self, source: SourceId):
        self.source = source
        self.log: deque[tuple[float, str, str]] = deque(maxlen=MAX_LOG)  # (time, name, message)
        self.lock = threading.Lock()  # held while a record is folded and fanned out
        self.session = WatchSession(source=source, lock=self.lock, on_note=self.note)
        self.publisher: Any = None
        self.recorder: Any = None
        self.exporter: Any = None
        self.prometheus_port: int | None = None
        self._thread: threading.Thread | None = None
        self._stop = StopSignal()
        self._started = threading.Event()
        self._on_status: StatusCallback | None = None
        self.crashed: BaseException | None = None

    # ------------------------------------------------------------------------------------------ reading

    @property
    def model(self) -> TierModel:
        return self.session.model

    @property
    def records(self) -> int:
        """Records folded so far (the engine's meta among them)."""
        return self.session.records

    @property
    def problems(self) -> Any:
        """What went wrong (kvtop.problems): a full disk under record=, records the broker never got. In
        summary()["problems"]; a script can check handle.problems.lost_data."""
        return self.session.problems

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
        self.session.publish()

    # ------------------------------------------------------------------------------------------ records

    def emit(self, record: Record) -> None:
        self.session.emit(record)

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
    session = handle.session
    # Everything that can fail on a setting is built here, in the caller's thread, so it raises to the caller.
    # The sinks are closed by stop(), after the last drain, not when the session's run ends; the publisher runs
    # beside the session (it outlives it by the last drain and the "offline" it says after it).
    if publish:
        handle.publisher = compose.add_publisher(session, publish, password_file=mqtt_password_file,
                                                 on_status=handle.note, producer=False)
    try:
        if record is not None:
            handle.recorder = compose.add_recorder(session, record, close=False)
        if prometheus_port is not None:
            handle.exporter = compose.add_exporter(session, lambda: handle.model, prometheus_port, prometheus_addr,
                                                   source=source, close=False)
            handle.prometheus_port = handle.exporter.port
    except BaseException:
        if handle.recorder is not None:
            handle.recorder.close()
        raise
    session.publish_s = interval_s  # a snapshot every poll interval: what scrapes and handle.snapshot read

    thread = threading.Thread(target=_thread_main, args=(handle, llm, interval_s, sample_memory),
                              name="kvtop-watch", daemon=True)
    handle._thread = thread
    thread.start()
    handle._started.wait(5.0)
    return handle


# ---------------------------------------------------------------------------------------------- the thread

def _thread_main(handle: WatchHandle, llm: Any, interval_s: float, sample_memory: bool) -> None:
    try:
        asyncio.run(_main(handle, llm, interval_s, sample_memory))
    except BaseException as exc:  # pragma: no cover - a bug of ours: keep it for the user, never kill their app
        handle.crashed = exc
        handle.note("watch", f"stopped: {type(exc).__name__}: {exc}")
    finally:
        handle._started.set()


async def _main(handle: WatchHandle, llm: Any, interval_s: float, sample_memory: bool) -> None:
    stop = handle._stop.bind()
    handle._started.set()
    session, publisher = handle.session, handle.publisher
    meta = compose.engine_meta(llm)
    # A simulator not paced to the wall clock (SimLLM(speed=0)) stamps its records with its own clock, as a driven
    # run does: on the wall clock its rates were this machine's speed (compose.engine_clock)
    # (a simulator has a clock of its own; TensorRT-LLM's LLM does not)
    simulated = isinstance(getattr(llm, "sim_time_s", None), (int, float))
    clock = compose.engine_clock(llm, llm.speed) if simulated else None
    meta["clock"] = "simulated" if clock is not None else "wall"
    if isinstance(meta.get("engine"), str):
        session.meta.update(meta)  # the session's first record when it runs (Session.run)
    else:
        session.emit(make("meta", meta, session.source))
    for why in meta.get("meta_unknown") or ():  # GiB figures stay unknown: say why once
        handle.note("watch", why)
    if sample_memory:
        compose.add_machine_samplers(session, meta, SAMPLE_S, clock=clock)
    # The engine's poller runs beside the session, as the publisher does: at the end it is let finish its poll
    # (the session cancels its producers) and drains once more, into sinks still open.
    poller = EnginePoller(llm, session.source, interval_s, session.emit, on_error=handle.note,
                          clock=clock or time.time)
    polling = asyncio.ensure_future(poller.run())
    sending = asyncio.ensure_future(publisher.run()) if publisher is not None else None

    async def stop_when_told() -> None:
        await stop.wait()
        session.stop()

    stopping = asyncio.ensure_future(stop_when_told())
    try:
        await session.run()
    finally:
        stopping.cancel()
        poller.stop()
        await asyncio.gather(polling, stopping, return_exceptions=True)
        with contextlib.suppress(Exception):  # the last items the engine queued since the last poll
            await asyncio.wait_for(poller.poll_once(), timeout=FINAL_POLL_S)
        if publisher is not None and sending is not None:
            publisher.stop()  # flushes (<= 1 s) and publishes "offline"
            await asyncio.gather(sending, return_exceptions=True)
        handle.publish()  # the last drain's records, for handle.snapshot and a last scrape


__all__ = ["WatchHandle", "WatchSession", "watch"]
