"""MQTT publisher: sends records to a broker without ever making the engine wait.

Conventions (topics, URL, credentials) are in :mod:`kvtop.mqtt_wire`. What this side adds:

- :meth:`MqttPublisher.publish` is the sink: O(1), never blocks, never raises for the network. Records go into
  a bounded queue (``max_queue``); when it is full (broker slow or down) the *oldest* record is dropped and
  counted in ``dropped`` (the newest state is what a dashboard needs; the fold flags the event-id gap).
- A sender task sends in rounds, at most one message per (source, kind) per round and at most one round every
  ``min_interval_s`` (0.1 s): so a source sends at most ~10 ``kv_event`` messages a second however many events
  its engine makes, and the poller's bursts (every 0.25 s) go out at once, in one message per kind.
- QoS 1 for ``meta`` and ``request`` (rare, and worth a retry), QoS 0 for ``stats``/``gpu``/``host``/``kv_event``
  (high rate; the next sample supersedes a lost one). ``meta`` is retained and never dropped: the latest per
  source is kept aside and re-sent on every (re)connect, so a broker restarted without persistence learns it
  again.
- The connection carries a last will: ``.../status`` = ``offline`` (retained, QoS 1); ``online`` is published
  on connect and ``offline`` again on a clean stop (a clean disconnect does not fire the will).
- Reconnects with backoff (0.25 s doubling to 2 s), reporting once per streak through ``on_status``.
- Token ids are left out of ``stored`` events by default (``include_tokens=False``): they are the user's
  prompts, which do not belong on a shared broker, and they are ~95% of an event's bytes (a 32-token block's
  token list is ~1.8 KB of JSON, its hash and levels ~100 B). ``num_tokens`` keeps their count. Recordings
  (:mod:`kvtop.sinks.recorder`) keep events verbatim.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections import deque
from typing import Any

from kvtop.mqtt_wire import (
    BACKOFF_MAX_S,
    OFFLINE,
    ONLINE,
    STATUS,
    MqttUrl,
    StatusCallback,
    keep_connected,
    new_client_id,
    parse_mqtt_url,
    topic_for,
)
from kvtop.problems import Problems
from kvtop.records import Record, SourceId, encode, encode_batch
from kvtop.stopsignal import StopSignal

QOS = {"meta": 1, "request": 1, "stats": 0, "gpu": 0, "host": 0, "kv_event": 0}
# 10,000 records is ~9 s of a busy engine (an iteration-stats dict every ~10 ms plus ~1,000 events/s): a broker
# blip of a few seconds loses nothing, a long outage costs at most ~15 MB of queued records.
MAX_QUEUE = 10_000
MIN_INTERVAL_S = 0.1  # one round of messages per 0.1 s at most: <= ~10 messages/s per source and kind
# A burst is split into messages of at most 2,000 records: ~300 KB of events without token ids (~150 B each),
# far under mosquitto's default limit (the protocol's 256 MB), and small enough that one message never holds
# the subscriber's loop for long (~10 ms to decode).
MAX_BATCH = 2_000
PUBLISH_TIMEOUT_S = 10.0  # a publish the broker does not take within 10 s means the connection is dead
GOODBYE_TIMEOUT_S = 1.0  # what a clean stop may spend flushing and saying "offline"
DROP_REPORT_S = 5.0  # drops are reported at most every 5 s (a slow broker would otherwise get a line per round)

log = logging.getLogger("kvtop.mqtt")


def strip_tokens(record: Record) -> Record:
    """A ``stored`` kv_event without its token ids (``num_tokens`` keeps the count); other records as they are."""
    if record.kind != "kv_event":
        return record
    data = record.data.get("data")
    if not isinstance(data, dict) or data.get("type") != "stored":
        return record
    blocks = data.get("blocks")
    if not isinstance(blocks, list):
        return record
    slim = []
    for b in blocks:
        if isinstance(b, dict) and isinstance(b.get("token_ids"), list) and b["token_ids"] and "tokens" not in b:
            # plain tokens as a reader gives them (their ids, kvtop/compact.py read_event): the same slim block
            slim.append({**{k: v for k, v in b.items() if k != "token_ids"}, "tokens": [],
                         "num_tokens": len(b["token_ids"])})
            continue
        tokens = b.get("tokens") if isinstance(b, dict) else None
        slim.append({**b, "tokens": [], "num_tokens": len(tokens)} if isinstance(tokens, list) and tokens else b)
    event = {**record.data, "data": {**data, "blocks": slim}}
    return Record(kind=record.kind, data=event, source=record.source, time=record.time, v=record.v)


class MqttPublisher:
    """Publishes records to ``url`` as ``source`` (whose status and last will it carries).

    Use: ``pub.publish`` as a sink, ``await pub.run()`` as a task, ``pub.stop()`` to end it (then ``run``
    flushes for up to 1 s, says "offline", and returns). Records of other sources are published under their
    own topics; the status topic and last will are this publisher's ``source`` only.
    """

    def __init__(
        self,
        url: str | MqttUrl,
        source: SourceId | None = None,
        *,
        password_file: str | os.PathLike[str] | None = None,
        on_status: StatusCallback | None = None,
        max_queue: int = MAX_QUEUE,
        min_interval_s: float = MIN_INTERVAL_S,
        max_batch: int = MAX_BATCH,
        include_tokens: bool = False,
        problems: Problems | None = None,
        logger: logging.Logger | None = None,
    ):
        self.url = url if isinstance(url, MqttUrl) else parse_mqtt_url(url, password_file=password_file)
        self.problems = problems  # connection losses and drops are reported there
        self.source = source or SourceId.local()
        self.on_status = on_status
        if max_queue < 1:
            raise ValueError(f"max_queue must be >= 1, got {max_queue}")
        self.max_queue = max_queue
        self.min_interval_s = min_interval_s
        self.max_batch = max_batch
        self.include_tokens = include_tokens
        self.logger = logger or log
        self.connected = False
        self.connects = 0
        self.published = 0  # records sent
        self.messages = 0  # MQTT messages sent
        self.dropped = 0  # records dropped because the queue was full
        self.last_error: str | None = None
        self._queue: deque[Record] = deque()
        self._metas: dict[SourceId, Record] = {}
        self._metas_dirty: set[SourceId] = set()
        self._topics: dict[tuple[SourceId, str], str] = {}
        self._stop = StopSignal()
        self._wake: asyncio.Event | None = None  # a record or meta to send (an event of the run's loop)
        self._dropped_reported = 0
        self._dropped_reported_at = 0.0

    # ------------------------------------------------------------------------------------------ the sink

    def publish(self, record: Record) -> None:
        """Queue one record; O(1), never blocks. Safe from any thread."""
        if record.kind == "meta":
            self._metas[record.source] = record
            self._metas_dirty.add(record.source)
        else:
            if len(self._queue) >= self.max_queue:
                self._queue.popleft()
                self.dropped += 1
                if self.dropped - self._dropped_reported >= 1000 or self._dropped_reported == 0:
                    self._report_drops()  # while the broker is down nothing else reports them
            self._queue.append(record)
        self._poke()

    __call__ = publish

    def _poke(self) -> None:
        wake = self._wake
        if wake is None or wake.is_set():
            return
        self._stop.set(wake)

    @property
    def queued(self) -> int:
        return len(self._queue)

    # ------------------------------------------------------------------------------------------ lifecycle

    def stop(self) -> None:
        """Ask :meth:`run` to flush, say "offline" and return. Safe from any thread."""
        self._stop.stop(self._wake)

    async def run(self) -> None:
        import aiomqtt  # here, not at import time: kvtop's import stays light

        stop_event = self._stop.bind()
        self._wake = asyncio.Event()
        if self._queue or self._metas_dirty:
            self._wake.set()
        status_topic = topic_for(self.url.prefix, self.source, STATUS)

        def client() -> Any:
            return aiomqtt.Client(identifier=new_client_id("pub"), logger=self.logger,
                                  will=aiomqtt.Will(status_topic, OFFLINE, qos=1, retain=True),
                                  **self.url.client_kwargs())

        async def session(client: Any) -> None:
            self.connected = True
            self.connects += 1
            self._status(f"connected to {self.url.display()}")
            if self.problems is not None:
                self.problems.resolve("mqtt-publish.connection", f"connected to {self.url.display()}")
            try:
                await client.publish(status_topic, ONLINE, qos=1, retain=True, timeout=PUBLISH_TIMEOUT_S)
                self._metas_dirty.update(self._metas)  # the broker may have lost its retained messages
                try:
                    await self._connected(client)
                finally:
                    if self._stop.requested:
                        await self._goodbye(client, status_topic)
            finally:
                self.connected = False

        def lost(message: str) -> None:
            self.last_error = message
            self._status(f"{message}; retrying (every {BACKOFF_MAX_S:g} s at most), keeping the newest "
                         f"{self.max_queue:,} records meanwhile")
            if self.problems is not None:
                self.problems.report("mqtt-publish.connection", f"{message}; records are queued (the newest "
                                     f"{self.max_queue:,}) until it is back")

        try:
            await keep_connected(self.url, client, session, stopped=lambda: self._stop.requested,
                                 stop_event=stop_event, lost=lost)
        finally:
            self._report_drops(force=True)

    async def _goodbye(self, client: Any, status_topic: str) -> None:
        # Best effort, bounded: what is queued, then "offline" (a clean disconnect does not fire the will).
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(self._send_round(client), timeout=GOODBYE_TIMEOUT_S)
        with contextlib.suppress(Exception, asyncio.CancelledError):
            await asyncio.wait_for(client.publish(status_topic, OFFLINE, qos=1, retain=True),
                                   timeout=GOODBYE_TIMEOUT_S)

    async def _connected(self, client: Any) -> None:
        """Send until stopped (returns) or the connection drops (raises MqttError)."""

        async def watch_connection() -> None:
            # A publisher subscribes to nothing, so this waits until the connection drops and then raises
            # MqttError: the only public way aiomqtt tells it. Without it an idle publisher (nothing queued)
            # would notice a dead broker only at its next publish.
            async for _ in client.messages:
                pass

        watcher = asyncio.ensure_future(watch_connection())
        sender = asyncio.ensure_future(self._send_loop(client))
        try:
            await asyncio.wait({watcher, sender}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (sender, watcher):
                if not task.done():
                    task.cancel()
            results = await asyncio.gather(sender, watcher, return_exceptions=True)
        for res in results:
            if isinstance(res, Exception):
                raise res

    async def _send_loop(self, client: Any) -> None:
        assert self._wake is not None
        while not self._stop.requested:
            await self._wake.wait()
            self._wake.clear()
            if self._stop.requested:
                return
            started = time.monotonic()
            await self._send_round(client)
            self._report_drops()
            rest = self.min_interval_s - (time.monotonic() - started)
            if rest > 0:
                await asyncio.sleep(rest)

    async def _send_round(self, client: Any) -> None:
        for src in list(self._metas_dirty):
            self._metas_dirty.discard(src)
            meta = self._metas[src]
            await client.publish(self._topic(src, "meta"), encode(meta), qos=1, retain=True,
                                 timeout=PUBLISH_TIMEOUT_S)
            self.messages += 1
            self.published += 1
        if not self._queue:
            return
        groups: dict[tuple[SourceId, str], list[Record]] = {}
        q = self._queue
        while q:  # popleft per record: publish() may append from another thread meanwhile
            rec = q.popleft()
            groups.setdefault((rec.source, rec.kind), []).append(rec)
        unsent = sum(len(recs) for recs in groups.values())
        try:
            for (src, kind), recs in groups.items():
                for i in range(0, len(recs), self.max_batch):
                    chunk = recs[i:i + self.max_batch]
                    await client.publish(self._topic(src, kind), self._payload(chunk), qos=QOS.get(kind, 0),
                                         timeout=PUBLISH_TIMEOUT_S)
                    self.messages += 1
                    self.published += len(chunk)
                    unsent -= len(chunk)
        finally:
            self.dropped += unsent  # taken from the queue but lost with the connection: counted, never silent

    def _payload(self, records: list[Record]) -> str:
        if not self.include_tokens:
            records = [strip_tokens(r) for r in records]
        return encode(records[0]) if len(records) == 1 else encode_batch(records)

    def _topic(self, source: SourceId, kind: str) -> str:
        key = (source, kind)
        topic = self._topics.get(key)
        if topic is None:
            topic = self._topics[key] = topic_for(self.url.prefix, source, kind)
        return topic

    def _report_drops(self, force: bool = False) -> None:
        now = time.monotonic()
        if self.dropped != self._dropped_reported and (force or now - self._dropped_reported_at >= DROP_REPORT_S):
            if self.problems is not None:
                self.problems.report("mqtt-publish.dropped", f"{self.dropped:,} record(s) dropped: the broker was "
                                     "slower than the engine, or down", count=self.dropped - self._dropped_reported,
                                     lost=True)
            self._dropped_reported_at = now
            self._status(f"dropped {self.dropped - self._dropped_reported:,} record(s) (total {self.dropped:,}): "
                         f"the broker was slower than the engine or down")
            self._dropped_reported = self.dropped

    def _status(self, message: str) -> None:
        self.logger.info("mqtt-publish: %s", message)
        if self.on_status is not None:
            with contextlib.suppress(Exception):
                self.on_status("mqtt-publish", message)


def publisher_from_url(url: str, source: SourceId | None = None, *,
                       password_file: str | os.PathLike[str] | None = None,
                       on_status: StatusCallback | None = None, include_tokens: bool = False,
                       problems: Problems | None = None) -> MqttPublisher:
    """What ``--publish mqtt://...`` calls. Raises :class:`kvtop.mqtt_wire.MqttUrlError` for a bad URL."""
    return MqttPublisher(parse_mqtt_url(url, password_file=password_file), source, on_status=on_status,
                         include_tokens=include_tokens, problems=problems)


__all__ = ["MqttPublisher", "publisher_from_url", "strip_tokens", "QOS"]
