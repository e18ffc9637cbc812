"""MQTT: the subscriber that turns a broker's messages back into records.

The wire conventions (topics, URLs, credentials, reconnecting) are in :mod:`kvtop.mqtt_wire`, shared with the
publisher (kvtop/sinks/mqtt.py); the names are re-exported here for the callers that import them from this module.

The subscriber never raises into its consumer: a malformed payload is counted (``malformed``) and reported
through ``on_error``; a lost broker is reported through ``on_status`` ("disconnected"), retried with backoff,
and the gap is reported when it comes back ("reconnected after 3.2 s").
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from kvtop.mqtt_wire import (
    BACKOFF_MAX_S,
    OFFLINE,
    ONLINE,
    PASSWORD_ENV,
    STATUS,
    ErrorCallback,
    MqttUrl,
    MqttUrlError,
    StatusCallback,
    TopicParts,
    describe_error,
    keep_connected,
    log,
    new_client_id,
    parse_mqtt_url,
    parse_topic,
    resolve_password,
    source_level,
    topic_for,
    topic_level,
)
from kvtop.problems import Problems
from kvtop.records import KINDS, MAX_LINE_BYTES, Record, RecordError, decode_payload
from kvtop.stopsignal import StopSignal
from kvtop.textsafe import clean

# ---------------------------------------------------------------------------------------------- subscriber

class MqttSubscriber:
    """Subscribes to ``<prefix>/kvtop/v1/#`` (or one run) and hands every decoded record to ``sink``.

    Interface as :class:`kvtop.sources.poller.EnginePoller`: ``await run()`` until :meth:`stop`; or iterate
    :meth:`records`. ``on_status(name, message)``: ``name`` is ``"mqtt"`` for the broker connection
    ("connected", "disconnected: ...", "reconnected after 3.2 s") and a source key (``host/rank/run``) for a
    source's retained status ("online"/"offline"). ``on_error(name, message)``: malformed payloads.
    """

    def __init__(
        self,
        url: str | MqttUrl,
        sink: Callable[[Record], None] | None = None,
        *,
        run: str | None = None,
        password_file: str | os.PathLike[str] | None = None,
        on_status: StatusCallback | None = None,
        on_error: ErrorCallback | None = None,
        max_queued_messages: int = 10_000,
        max_payload_bytes: int = MAX_LINE_BYTES,
        problems: Problems | None = None,
        logger: logging.Logger | None = None,
    ):
        self.url = url if isinstance(url, MqttUrl) else parse_mqtt_url(url, password_file=password_file)
        self.problems = problems  # connection, malformed, overflow and mismatch problems are reported there
        self.max_payload_bytes = max_payload_bytes
        self.sink = sink
        self.run_filter = run
        self.on_status = on_status
        self.on_error = on_error
        # aiomqtt's incoming queue is unbounded by default. A message is a batch (a busy source's 0.25 s of
        # events is ~400 records, ~130 KB), so 10,000 messages is up to ~1 GB: 20 s of backlog from 64 busy
        # sources (515 messages/s) before aiomqtt discards (and logs) new ones, instead of growing forever.
        self.max_queued_messages = max_queued_messages
        self.logger = logger or log
        self.connected = False
        self.messages = 0
        self.records_received = 0
        self.malformed = 0
        self.last_malformed: str | None = None
        self.overflowed = 0  # messages dropped because the incoming queue was full (the consumer fell behind)
        self.mismatched = 0  # records whose source is not the one their topic names: dropped
        self.connects = 0
        self.gaps: list[float] = []  # seconds without a broker, one per reconnect
        self.sources: dict[str, str] = {}  # source key -> "online" | "offline"
        self._stop = StopSignal()

    # ------------------------------------------------------------------------------------------ lifecycle

    def stop(self) -> None:
        """Ask :meth:`run` to return. Safe from the loop's thread or any other thread, before or during run."""
        self._stop.stop()

    async def records(self) -> AsyncIterator[Record]:
        """Every record, as an async iterator (runs :meth:`run` underneath; ends after :meth:`stop`).

        Leaving a loop early stops the subscription when the iterator is closed: use
        ``async with contextlib.aclosing(sub.records()) as it`` (or call :meth:`stop`).
        """
        queue: asyncio.Queue[Record | None] = asyncio.Queue()
        self.sink = queue.put_nowait
        task = asyncio.ensure_future(self.run())
        task.add_done_callback(lambda _t: queue.put_nowait(None))
        try:
            while True:
                rec = await queue.get()
                if rec is None:
                    break
                yield rec
        finally:
            self.stop()
            if not task.done():
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    async def run(self) -> None:
        import aiomqtt  # here, not at import: `import kvtop.sources.mqtt` for URL checks stays light

        stop_event = self._stop.bind()
        if self._stop.requested:
            return
        first_try = time.monotonic()
        lost_at: float | None = None  # monotonic time a connection that was up dropped; None otherwise

        owner = self

        class CountingQueue(asyncio.Queue):  # type: ignore[type-arg]
            """aiomqtt's queue, but full means: drop the oldest message and count it (aiomqtt would log one
            warning line per message dropped, and drop the newest)."""

            def put_nowait(self, item: Any) -> None:
                if self.full():
                    with contextlib.suppress(asyncio.QueueEmpty):
                        self.get_nowait()
                    owner._overflow()
                super().put_nowait(item)

        def client() -> Any:
            return aiomqtt.Client(identifier=new_client_id("sub"), logger=self.logger,
                                  max_queued_incoming_messages=self.max_queued_messages, queue_type=CountingQueue,
                                  **self.url.client_kwargs())

        async def session(client: Any) -> None:
            nonlocal lost_at
            await client.subscribe(self.url.topic_filter(self.run_filter), qos=1)
            self.connected = True
            self.connects += 1
            if lost_at is not None:
                gap = time.monotonic() - lost_at
                self.gaps.append(gap)
                self._status("mqtt", f"reconnected to {self.url.display()} after {gap:.1f} s")
                if self.problems is not None:
                    self.problems.resolve("mqtt.connection", f"reconnected after {gap:.1f} s")
            else:
                waited = time.monotonic() - first_try
                self._status("mqtt", f"connected to {self.url.display()}"
                             + (f" (after {waited:.1f} s of retries)" if waited >= 1.0 else ""))
                if self.problems is not None:
                    self.problems.resolve("mqtt.connection", f"connected after {waited:.1f} s")
            lost_at = None
            try:
                await self._consume(client)
            except aiomqtt.MqttError:
                lost_at = time.monotonic()
                raise
            finally:
                self.connected = False

        def lost(message: str) -> None:
            self._status("mqtt", f"{message}; retrying (every {BACKOFF_MAX_S:g} s at most)")
            self._problem("mqtt.connection", message)

        try:
            await keep_connected(self.url, client, session, stopped=lambda: self._stop.requested,
                                 stop_event=stop_event, lost=lost)
        except (OSError, ssl.SSLError, ValueError) as exc:  # a TLS context that cannot be built: ?ca= unreadable
            message = f"cannot connect to {self.url.display()}: {describe_error(exc)}"
            self._status("mqtt", message)
            self._problem("mqtt.connection", message)
            raise

    async def _consume(self, client: Any) -> None:
        """Handle messages until the connection drops (raises MqttError) or :meth:`stop` (returns)."""
        stop_event = self._stop.event
        assert stop_event is not None

        async def pump() -> None:
            async for message in client.messages:
                self._handle(str(message.topic), message.payload)

        # One task for the whole connection (not one per message: ~25 us each at 500 messages/s adds up).
        task = asyncio.ensure_future(pump())
        stop_wait = asyncio.ensure_future(stop_event.wait())
        try:
            await asyncio.wait({task, stop_wait}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stop_wait.cancel()
            if not task.done():
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task  # re-raises MqttError (connection lost) or a sink's exception

    # ------------------------------------------------------------------------------------------ messages

    def _handle(self, topic: str, payload: Any) -> None:
        self.messages += 1
        parts = parse_topic(self.url.prefix, topic)
        if parts is None:
            self._malformed(topic, "not a kvtop topic (expected <prefix>/kvtop/v1/<run>/<source>/<kind>)")
            return
        if parts.kind == STATUS:
            state = _text(payload)
            if state not in (ONLINE, OFFLINE):
                self._malformed(topic, f"status must be {ONLINE!r} or {OFFLINE!r}")
                return
            if self.sources.get(parts.key) != state:
                self.sources[parts.key] = state
                self._status(parts.key, state)
            return
        if parts.kind not in KINDS:
            self._malformed(topic, f"unknown kind {parts.kind!r} (known: {', '.join(KINDS)})")
            return
        if not payload:  # an empty retained message clears a topic (someone cleaning up): not an error
            return
        try:
            records = decode_payload(payload if isinstance(payload, (bytes, str)) else bytes(payload),
                                     self.max_payload_bytes)
        except RecordError as exc:
            self._malformed(topic, str(exc))
            return
        except (TypeError, ValueError) as exc:  # a payload type aiomqtt may give that is not bytes
            self._malformed(topic, f"unreadable payload ({exc})")
            return
        # A record speaks for the source its topic names, nothing else: one node must not write into another's
        # row (a broker's ACLs are per topic, so the topic is what can be trusted).
        kept = [r for r in records if topic_level(r.source.run) == parts.run and source_level(r.source) == parts.source
                and r.kind == parts.kind]
        if len(kept) != len(records):
            bad = len(records) - len(kept)
            self.mismatched += bad
            wrong = next(r for r in records if r not in kept)
            self._problem("mqtt.source_mismatch", f"{bad} record(s) on {topic} claim another source or kind "
                          f"({wrong.source.key()} {wrong.kind}); dropped ({self.mismatched:,} so far)", count=bad)
        self.records_received += len(kept)
        if self.sink is not None:
            for rec in kept:
                self.sink(rec)  # a sink's exception is the consumer's bug: it propagates

    def _malformed(self, topic: str, problem: str) -> None:
        self.malformed += 1
        self.last_malformed = clean(f"{topic}: {problem}", 500)
        self._problem("mqtt.malformed", f"malformed message #{self.malformed} on {topic}: {problem}", lost=True)
        if self.on_error is not None:
            with contextlib.suppress(Exception):
                self.on_error("mqtt", f"malformed message #{self.malformed} on {topic}: {problem}")

    def _overflow(self) -> None:
        self.overflowed += 1
        self._problem("mqtt.queue_overflow", f"{self.overflowed:,} message(s) dropped: they arrived faster than "
                      f"kvtop folds them (queue of {self.max_queued_messages:,} full)", lost=True)

    def _problem(self, kind: str, message: str, *, count: int = 1, lost: bool = False) -> None:
        if self.problems is not None:
            self.problems.report(kind, message, count=count, lost=lost)

    def _status(self, name: str, message: str) -> None:
        self.logger.info("%s: %s", name, message)
        if self.on_status is not None:
            with contextlib.suppress(Exception):  # a broken callback must not stop the subscription
                self.on_status(name, message)


def _text(payload: Any) -> str | None:
    if isinstance(payload, (bytes, bytearray)):
        try:
            return bytes(payload).decode("utf-8").strip()
        except UnicodeDecodeError:
            return None
    return payload.strip() if isinstance(payload, str) else None


def subscriber_from_url(url: str, sink: Callable[[Record], None] | None = None, *,
                        password_file: str | os.PathLike[str] | None = None, run: str | None = None,
                        on_status: StatusCallback | None = None,
                        on_error: ErrorCallback | None = None, problems: Problems | None = None) -> MqttSubscriber:
    """What ``kvtop attach mqtt://...`` calls. Raises :class:`MqttUrlError` for a URL it cannot use."""
    return MqttSubscriber(parse_mqtt_url(url, password_file=password_file), sink, run=run, on_status=on_status,
                          on_error=on_error, problems=problems)


__all__ = [
    "MqttSubscriber", "MqttUrl", "MqttUrlError", "PASSWORD_ENV", "TopicParts", "parse_mqtt_url", "parse_topic",
    "resolve_password", "subscriber_from_url", "topic_for",
]
