"""Engine poller: drains an engine's iteration stats and KV cache events into records.

Any engine with TensorRT-LLM's ``LLM`` surface works (the real one, ``SimLLM``, an HTTP proxy):

- ``get_stats_async(timeout=...)`` and ``get_kv_cache_events_async(timeout=...)``: async iterables of dicts
  (TensorRT-LLM 1.x documents JSON strings for stats, so strings are parsed too);
- or, when an async method is missing, ``get_stats(timeout=...)`` / ``get_kv_cache_events(timeout=...)``,
  which block and return a list: they run in a thread.

Each poll drains both streams concurrently, emits one ``stats`` or ``kv_event`` record per item to the sink as it
arrives (or, from an engine whose drain hands its items over as one list, ``take_batch``: kvtop's simulator, the
drain's records to ``sink_many`` in one call), and the next poll is armed only after the last one finished
(dolphie's habit): a slow engine makes polls rarer, never piles them up. An engine that waits for its
drains (kvtop's simulator at speed 0) says so through ``notify_drain_wanted(callback)``, and the next poll starts at
once instead of after the interval. A stream that fails is reported through
``on_error(source_name, message)`` once per streak and backs off on its own (interval x 2^failures, capped at 5 s)
while the other stream goes on.
Nothing an engine does raises into the consumer; an exception raised by the *sink* is the consumer's own bug
and propagates out of :meth:`EnginePoller.poll_once` / :meth:`EnginePoller.run`.

What TensorRT-LLM 1.x actually does (``tensorrt_llm/executor/result.py``, ``IterationResult``), and why the
knobs below exist:

- ``get_stats_async`` returns one long-lived ``IterationResult``; its iteration ends only after ``timeout``
  seconds with no new item. So ``timeout`` is the price of every drain (the default 2 s would make a 0.25 s
  poll take 2.25 s): kvtop passes 0.05 s. Under load (a decode iteration every ~10 ms on an H200) items keep
  coming faster than that and the drain would never end, so a drain stops after ``max_poll_s`` and the next
  poll continues where it left off (breaking between items loses nothing).
- After a drain times out the result latches ``_done`` until the next ``generate_async`` calls
  ``mark_undone()``: stats of long-running requests would then be invisible until someone submits a new
  prompt. The poller calls the public ``mark_undone()`` before each drain when the result has one.
- If the ``LLM`` was built outside a running event loop its async queue is ``None`` and the async iteration
  fails an assertion; the poller then switches that stream to the blocking method in a thread.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from kvtop.records import Record, RecordError, SourceId, make, parse_engine_dict, trusted_record
from kvtop.stopsignal import StopSignal

Sink = Callable[[Record], None]
SinkMany = Callable[[list[Record]], None]
SinkEvents = Callable[[SourceId, float, list[Any]], None]
ErrorCallback = Callable[[str, str], None]

MAX_BACKOFF_S = 5.0
BUSY_POLL_ITEMS = 1024  # a poll that drained this many items is followed by the next one at once


@dataclass
class PollResult:
    """What one poll did: records emitted per kind, malformed items skipped, streams that failed."""

    stats: int = 0
    kv_events: int = 0
    bad: int = 0
    failed: list[str] = field(default_factory=list)


class _SinkFailed(Exception):
    """Carries an exception raised by the sink past the poller's own error handling."""

    def __init__(self, error: BaseException):
        super().__init__(str(error))
        self.error = error


@dataclass
class _Stream:
    what: str  # "stats" | "kv_events": used in source names and messages
    kind: str  # the record kind it produces
    async_name: str
    sync_name: str
    name: str = ""  # "<poller name>.<what>", set by the poller
    enabled: bool = True
    use_sync: bool = False
    failures: int = 0  # consecutive
    due: float = 0.0  # monotonic time before which the stream is not polled (backoff)
    reported: str | None = None  # the message last reported in the current failure streak
    thread: asyncio.Future[Any] | None = None  # a blocking call still running from an earlier poll
    bad: int = 0
    bad_reason: str = ""


class EnginePoller:
    """Polls one engine at a fixed interval, a poll never overlapping the last.

    ``sink`` gets every record (called on the event loop, from the task running :meth:`run`). ``on_error``
    gets ``(source_name, message)`` for failing streams and skipped malformed items; source names are
    ``"<name>.stats"`` and ``"<name>.kv_events"``.
    """

    def __init__(
        self,
        engine: Any,
        source: SourceId,
        interval_s: float = 0.25,
        sink: Sink | None = None,
        *,
        on_error: ErrorCallback | None = None,
        name: str = "engine",
        timeout_s: float = 0.05,
        max_poll_s: float = 1.0,
        stall_s: float = 10.0,
        max_backoff_s: float = MAX_BACKOFF_S,
        clock: Callable[[], float] = time.time,
        sink_many: SinkMany | None = None,
        sink_events: SinkEvents | None = None,
    ):
        if sink is None:
            raise TypeError("EnginePoller needs a sink (a callable taking one Record)")
        if interval_s <= 0:
            raise ValueError(f"interval_s must be > 0, got {interval_s}")
        self.engine = engine
        self.source = source
        self.interval_s = interval_s
        self.sink = sink
        # A drain handed over whole (an engine whose drain has ``take_batch``: kvtop's simulator) goes to this in
        # one call, when given (Session.emit_many): one pass of the fold's lookups a batch, not a record
        self.sink_many = sink_many
        # kvtop's own simulator, in this process: its dicts are made into records without make's checks
        # (records.trusted_record); any other engine's are checked one by one
        self.trusted = getattr(engine, "trusted_records", False) is True
        # ...whose KV events then go to this as dicts, one drain a call (Session.emit_kv_events), when given
        self.sink_events = sink_events
        self.on_error = on_error
        self.name = name
        self.timeout_s = timeout_s
        self.max_poll_s = max_poll_s
        # A call that neither yields nor ends for this long is reported as stalled (TensorRT-LLM's own drains
        # end within timeout_s of the last item, so 10 s means something is wrong, e.g. a stuck RPC).
        self.stall_s = stall_s
        self.max_backoff_s = max_backoff_s
        self.clock = clock
        self.polls = 0
        self.errors = 0
        self.bad_items = 0
        self.last_error: str | None = None
        self.streams = (
            _Stream("stats", "stats", "get_stats_async", "get_stats", name=f"{name}.stats"),
            _Stream("kv_events", "kv_event", "get_kv_cache_events_async", "get_kv_cache_events",
                    name=f"{name}.kv_events"),
        )
        self._stop = StopSignal()
        self._poll_task: asyncio.Task[PollResult] | None = None
        self._wake: asyncio.Event | None = None  # run's wait between polls (its loop's)

    # ------------------------------------------------------------------------------------------ lifecycle

    async def run(self) -> None:
        """Poll until :meth:`stop` (or cancellation). Returns promptly after stop, even mid-poll."""
        stop_event = self._stop.bind()
        # The wait between polls ends early when set: by stop, or by an engine that waits for a drain (an engine
        # with ``notify_drain_wanted``: kvtop's simulator at speed 0, which waits for its events to be taken)
        wake = self._wake = asyncio.Event()
        if self._stop.requested:
            wake.set()
        notify = getattr(self.engine, "notify_drain_wanted", None)
        if not callable(notify):
            notify = None
        else:
            stop_signal = self._stop
            notify(lambda: stop_signal.set(wake))
        try:
            while not self._stop.requested:
                wake.clear()  # a drain wanted from here on, during the poll, is taken by the next one at once
                poll = self._poll_task = asyncio.ensure_future(self.poll_once())
                stop_wait = asyncio.ensure_future(stop_event.wait())
                try:
                    await asyncio.wait({poll, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    stop_wait.cancel()
                if not poll.done():  # stopped mid-poll: an engine call may wait up to stall_s; don't.
                    break
                done = poll.result()  # re-raises a sink's exception; engine failures never get here
                delay = self._next_delay()
                if done is not None and not done.failed and done.stats + done.kv_events >= BUSY_POLL_ITEMS:
                    # A busy engine: drain again at once. An interval between full drains capped what an engine
                    # could hand over (its buffer a quarter second), and kvtop's simulator at speed 0, which waits
                    # for its events to be taken, ran at that pace.
                    delay = 0.0
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(wake.wait(), timeout=delay)
        finally:
            if notify is not None:
                notify(None)
            task, self._poll_task = self._poll_task, None
            if task is not None and not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    def stop(self) -> None:
        """Ask :meth:`run` to return. Safe from the loop's thread or any other thread, before or during run."""
        self._stop.stop(self._wake)

    async def final_poll(self) -> PollResult:
        """The last poll: after the one in progress (if any) ends, one more, and :meth:`run` returns (a workload
        that has ended, a trace answered: what the engine still held is folded before the session stops). On the
        loop that runs :meth:`run`."""
        self._stop.stop(self._wake)
        task = self._poll_task
        if task is not None and not task.done():
            await asyncio.wait({task})
        return await self.poll_once()

    @property
    def stopped(self) -> bool:
        return self._stop.requested

    def _next_delay(self) -> float:
        # A healthy stream is due again at once, so the poll comes after one interval; when every stream is
        # backing off, sleep until the first is due (never less than one interval).
        now = time.monotonic()
        waits = [max(0.0, s.due - now) for s in self.streams if s.enabled]
        if not waits:
            return self.max_backoff_s
        return max(self.interval_s, min(waits))

    # ------------------------------------------------------------------------------------------ one poll

    async def poll_once(self) -> PollResult:
        """Drain every stream that is due, once. Never raises for engine failures (see ``on_error``)."""
        self.polls += 1
        result = PollResult()
        now = time.monotonic()
        due = [s for s in self.streams if s.enabled and s.due <= now]
        outcomes = await asyncio.gather(*(self._poll_stream(s, result) for s in due), return_exceptions=True)
        for st in due:
            if st.bad:
                self._report(st.name, f"{st.bad} malformed {st.what} item(s) skipped (last: {st.bad_reason})")
                st.bad, st.bad_reason = 0, ""
        for out in outcomes:
            if isinstance(out, _SinkFailed):
                raise out.error
            if isinstance(out, BaseException):  # CancelledError of a child: we are being cancelled
                raise out
        return result

    async def _poll_stream(self, st: _Stream, result: PollResult) -> None:
        try:
            await asyncio.wait_for(self._drain(st, result), timeout=self.stall_s)
        except _SinkFailed:
            raise
        except asyncio.TimeoutError:
            self._failed(st, f"no answer within {self.stall_s:g} s", result)
        except Exception as exc:  # any engine failure: report, back off, never raise into the consumer
            self._failed(st, f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__, result)
        else:
            if st.failures:
                st.failures, st.reported = 0, None
            st.due = 0.0

    def _failed(self, st: _Stream, message: str, result: PollResult) -> None:
        st.failures += 1
        self.errors += 1
        result.failed.append(st.name)
        # interval x 2^n: 0.25 s -> 0.5, 1, 2, 4, then 5 s forever (capped; 2^n is capped first, no overflow).
        st.due = time.monotonic() + min(self.interval_s * 2.0 ** min(st.failures, 32), self.max_backoff_s)
        if st.reported != message:  # once per streak (and again if the failure changes)
            st.reported = message
            self._report(st.name, message)

    def _report(self, name: str, message: str) -> None:
        self.last_error = f"{name}: {message}"
        if self.on_error is not None:
            try:
                self.on_error(name, message)
            except Exception:  # a broken error callback must not stop the polling either
                pass

    async def _drain(self, st: _Stream, result: PollResult) -> None:
        if not st.use_sync:
            method = getattr(self.engine, st.async_name, None)
            if callable(method):
                try:
                    await self._drain_async(st, method, result)
                    return
                except AssertionError as exc:
                    # TensorRT-LLM built outside an event loop: "The asyncio event loop was not present during
                    # initialization, so async operations are not available."
                    if not callable(getattr(self.engine, st.sync_name, None)):
                        raise
                    st.use_sync = True
                    self._report(st.name, f"{st.async_name} unusable ({exc}); polling {st.sync_name} in a thread")
        method = getattr(self.engine, st.sync_name, None)
        if not callable(method):
            # An engine without events (or without stats) at all: say so once and stop asking.
            st.enabled = False
            self._report(st.name, f"engine has neither {st.async_name} nor {st.sync_name}: {st.what} off")
            return
        await self._drain_thread(st, method, result)

    async def _drain_async(self, st: _Stream, method: Callable[..., Any], result: PollResult) -> None:
        items = method(timeout=self.timeout_s)
        if inspect.isawaitable(items):  # an engine whose method is a coroutine returning a list
            items = await items
        mark_undone = getattr(items, "mark_undone", None)
        if callable(mark_undone):
            mark_undone()
        take_batch = getattr(items, "take_batch", None)
        if callable(take_batch):  # kvtop's simulator: the drain as one list
            self._emit_batch(st, await take_batch(), result)
            return
        if not hasattr(items, "__aiter__"):
            for item in items or ():
                self._emit(st, item, result)
            return
        deadline = time.monotonic() + self.max_poll_s
        try:
            async for item in items:
                self._emit(st, item, result)
                if time.monotonic() >= deadline:
                    break  # between items: nothing is lost, the next poll goes on from here
        finally:
            if inspect.isasyncgen(items):
                await items.aclose()

    async def _drain_thread(self, st: _Stream, method: Callable[..., Any], result: PollResult) -> None:
        # A blocking call cannot be cancelled. If an earlier poll gave up on one (stall or stop), wait for that
        # same call instead of starting another: threads never pile up and its items are not lost.
        if st.thread is None:
            st.thread = asyncio.ensure_future(asyncio.to_thread(method, timeout=self.timeout_s))
        fut = st.thread
        try:
            items = await asyncio.shield(fut)
        finally:
            if fut.done():
                st.thread = None
        for item in items or ():
            self._emit(st, item, result)

    def _emit_batch(self, st: _Stream, items: list[Any], result: PollResult) -> None:
        """A whole drain: its records made (trusted, or each checked as ``_emit`` does) and handed to ``sink_many``
        in one call (or to ``sink`` one by one)."""
        if not items:
            return
        kind, source = st.kind, self.source
        if self.trusted and kind == "kv_event" and self.sink_events is not None:
            try:
                self.sink_events(source, self.clock(), items)
            except Exception as exc:
                raise _SinkFailed(exc) from exc
            result.kv_events += len(items)
            return
        if self.trusted:
            now = self.clock()
            records = [trusted_record(kind, item, source, now) for item in items]
        else:
            records = []
            for item in items:
                try:
                    records.append(make(kind, parse_engine_dict(item, st.what), source, self.clock()))
                except RecordError as exc:
                    st.bad += 1
                    st.bad_reason = str(exc)
                    self.bad_items += 1
                    result.bad += 1
        try:
            if self.sink_many is not None:
                self.sink_many(records)
            else:
                for record in records:
                    self.sink(record)
        except Exception as exc:
            raise _SinkFailed(exc) from exc
        if kind == "stats":
            result.stats += len(records)
        else:
            result.kv_events += len(records)

    def _emit(self, st: _Stream, item: Any, result: PollResult) -> None:
        try:
            data = parse_engine_dict(item, st.what)
            record = make(st.kind, data, self.source, self.clock())
        except RecordError as exc:
            st.bad += 1
            st.bad_reason = str(exc)
            self.bad_items += 1
            result.bad += 1
            return
        try:
            self.sink(record)
        except Exception as exc:
            raise _SinkFailed(exc) from exc
        if st.kind == "stats":
            result.stats += 1
        else:
            result.kv_events += 1
