"""A session: the producers of one kvtop run, the fold they feed, and the sinks that read it.

One direction of flow (design.md): engines -> sources -> records -> TierModel -> sinks. ``Session.emit`` is the
single point every record goes through: it is folded into the TierModel of its source (and the aggregate) and
handed to every sink (recorder, MQTT publisher, Prometheus). ``Session.run`` runs the producers as asyncio
tasks on whatever loop it is given (Textual's for the dashboard, ``asyncio.run`` for headless), so the UI never
owns the data and headless modes need no UI at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Awaitable, Callable
from typing import Any

from kvtop.records import Record, SourceId, make
from kvtop.tiers import TierModel
from kvtop.tiers.whatif import WhatIf

Sink = Callable[[Record], None]
LOG_LINES = 500  # the event log keeps the newest 500 lines; older ones are dropped, never queued


class Session:
    def __init__(self, *, source: SourceId | None = None, warmup_requests: int = 0,
                 meta: dict[str, Any] | None = None):
        self.source = source or SourceId.local()
        self.warmup_requests = warmup_requests
        self.model = TierModel(warmup_requests=warmup_requests)
        self.models: dict[str, TierModel] = {}
        # Live what-if (2x and 4x host cache) for the session's own source: folded beside the TierModel.
        self.whatif = WhatIf()
        self.meta: dict[str, Any] = dict(meta or {})
        self.started_at = time.time()
        self.log: deque[tuple[float, str, str]] = deque(maxlen=LOG_LINES)
        self.status: dict[str, str] = {}
        self.sinks: list[Sink] = []
        self.records = 0
        self.driver: Any = None
        self._producers: list[tuple[str, Callable[[], Awaitable[None]]]] = []
        self._stoppers: list[Callable[[], None]] = []
        self._closers: list[Callable[[], None]] = []
        self._stop: asyncio.Event | None = None  # created on the running loop in run()
        self._stopped = False

    # ------------------------------------------------------------------------------------------ records

    def emit(self, record: Record) -> None:
        """Fold one record and fan it out. Never raises: a sink that fails is logged and kept."""
        self.records += 1
        if record.kind == "meta":
            self.meta.update(record.data)
        key = record.source.key()
        model = self.models.get(key)
        if model is None:
            # The session's own source, or else the first source heard from, is folded into self.model.
            taken = any(m is self.model for m in self.models.values())
            if not taken and (key == self.source.key() or not self.models):
                model = self.model
            else:
                model = TierModel(warmup_requests=self.warmup_requests)
            self.models[key] = model
        model.apply(record)
        if model is self.model:
            try:
                if record.kind == "kv_event":
                    self.whatif.apply_kv_event(record.data)
                elif record.kind == "stats":
                    self.whatif.apply_stats(record.data)
            except Exception as exc:  # the estimate is a nicety: bad data there never stops the fold
                self.note("warn", f"what-if skipped a record: {exc}")
        for sink in self.sinks:
            try:
                sink(record)
            except Exception as exc:  # a broken sink must not stop the fold or the other sinks
                self.note("error", f"sink {getattr(sink, '__qualname__', sink)} failed: {exc}")

    def what_if(self) -> dict[str, Any]:
        est = self.whatif.estimate()
        return {k: est.get(k) for k in ("host_x2_hit_rate", "host_x4_hit_rate", "hit_rate",
                                        "host_capacity_blocks")}

    def note(self, level: str, text: str) -> None:
        self.log.append((time.time(), level, text))

    def on_source_error(self, name: str, message: str) -> None:
        self.status[name] = "error"
        self.note("warn", f"{name}: {message}")

    def on_source_status(self, name: str, message: str) -> None:
        """A source's state changed ("connected", "reconnected after 3.2 s", "offline"): shown, not an error."""
        self.status[name] = message
        self.note("info", f"{name}: {message}")

    # ------------------------------------------------------------------------------------------ wiring

    def add_sink(self, sink: Sink, close: Callable[[], None] | None = None) -> None:
        self.sinks.append(sink)
        if close is not None:
            self._closers.append(close)

    def add_producer(self, name: str, run: Callable[[], Awaitable[None]], stop: Callable[[], None] | None = None
                     ) -> None:
        self._producers.append((name, run))
        if stop is not None:
            self._stoppers.append(stop)

    def add_closer(self, close: Callable[[], None]) -> None:
        self._closers.append(close)

    def add_sampler(self, name: str, sample: Callable[[], list[Record]], interval_s: float) -> None:
        """A blocking sampler (NVML, psutil) run in a thread, re-armed only after the last sample finished."""

        async def loop() -> None:
            while not self._stopped:
                try:
                    for rec in await asyncio.to_thread(sample):
                        self.emit(rec)
                    self.status[name] = "ok"
                except Exception as exc:  # samplers report, back off, and go on
                    self.on_source_error(name, str(exc))
                    await self._sleep(5.0)
                await self._sleep(interval_s)

        self.add_producer(name, loop)

    @property
    def requests_in_flight(self) -> int:
        return int(getattr(self.driver, "in_flight", 0) or 0)

    def reset_window(self) -> None:
        for model in {id(m): m for m in [self.model, *self.models.values()]}.values():
            reset = getattr(model, "reset_window", None)
            if reset is not None:
                reset()
        self.note("info", "window reset")

    # ------------------------------------------------------------------------------------------ run

    async def _sleep(self, seconds: float) -> None:
        if self._stop is None:
            await asyncio.sleep(seconds)
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stop.wait(), timeout=seconds)

    async def run(self, duration_s: float | None = None, until_producers_done: tuple[str, ...] = ()) -> None:
        """Run every producer until ``stop()``, ``duration_s``, or the named producers have all finished."""
        self._stop = asyncio.Event()
        if self._stopped:
            self._stop.set()
        self.started_at = time.time()
        if isinstance(self.meta.get("engine"), str):  # a driven run describes its engine; an attach waits to hear
            self.emit(make("meta", dict(self.meta), self.source))
        tasks: dict[asyncio.Task[None], str] = {}
        for name, producer in self._producers:
            tasks[asyncio.ensure_future(self._guard(name, producer))] = name
        watched = {t for t, n in tasks.items() if n in until_producers_done}
        stop_task = asyncio.ensure_future(self._stop.wait())
        try:
            waiting = {stop_task, *watched} if watched else {stop_task}
            timeout = duration_s
            deadline = None if duration_s is None else time.monotonic() + duration_s
            while True:
                done, _ = await asyncio.wait(waiting, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                if stop_task in done or not done:
                    break
                waiting -= done
                if watched and not (waiting & watched):
                    break
                if deadline is not None:
                    timeout = max(0.0, deadline - time.monotonic())
        finally:
            self.stop()
            stop_task.cancel()
            for task in tasks:
                if not task.done():
                    task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            for close in self._closers:
                try:
                    close()
                except Exception as exc:
                    self.note("error", f"closing failed: {exc}")

    async def _guard(self, name: str, producer: Callable[[], Awaitable[None]]) -> None:
        self.status[name] = "ok"
        try:
            await producer()
            self.status[name] = "done"
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a producer that dies is reported on screen; the others go on
            self.status[name] = "failed"
            self.note("error", f"{name} stopped: {type(exc).__name__}: {exc}")

    def stop(self) -> None:
        self._stopped = True
        if self._stop is not None:
            self._stop.set()
        for stop in self._stoppers:
            try:
                stop()
            except Exception as exc:
                self.note("error", f"stopping failed: {exc}")
