"""MQTT: kvtop's wire conventions, and the subscriber that turns a broker's messages back into records.

Topics (under the URL's prefix, which may be empty or several levels)::

    <prefix>/kvtop/v1/<run>/<source>/<kind>     kind: meta | stats | kv_event | gpu | host | request
    <prefix>/kvtop/v1/<run>/<source>/status     "online" | "offline" (retained; "offline" is the last will)

``<source>`` is ``<host>:<rank>``; levels are made safe for MQTT (``/``, ``+``, ``#`` and NUL become ``_``).
Payloads are kvtop records (:func:`kvtop.records.encode`) or JSON arrays of them (``encode_batch``), so they are
versioned like a recording and decoded by the same code. ``meta`` is retained, so a dashboard that subscribes
late still learns what each source is.

The subscriber never raises into its consumer: a malformed payload is counted (``malformed``) and reported
through ``on_error``; a lost broker is reported through ``on_status`` ("disconnected"), retried with backoff,
and the gap is reported when it comes back ("reconnected after 3.2 s").

Credentials: a user may be in the URL; a password never is (it would sit in shell history and in every process
listing). It comes from ``KVTOP_MQTT_PASSWORD`` or a file (``--mqtt-password-file``), and is never logged: the
URL objects' ``repr`` leaves it out and kvtop's messages name only where it came from.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import ssl
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from kvtop.records import KINDS, Record, RecordError, SourceId, decode_payload
from kvtop.stopsignal import StopSignal

PASSWORD_ENV = "KVTOP_MQTT_PASSWORD"
TOPIC_ROOT = ("kvtop", "v1")
STATUS = "status"
ONLINE, OFFLINE = "online", "offline"
DEFAULT_PORTS = {"mqtt": 1883, "mqtts": 8883}

# Reconnect backoff: 0.25 s doubling to a 2 s cap. The cap is what keeps "reconnected within 5 s of a broker
# restart": the broker may come back just after a failed try, so the worst case is one cap (2 s) plus a connect
# (~1 ms on a LAN). A higher cap would save nothing measurable: a refused TCP connect costs ~50 us.
BACKOFF_FIRST_S = 0.25
BACKOFF_MAX_S = 2.0
# Keepalive: a broker that vanishes without closing the socket (a cable, a VM pause) is noticed after 1.5 x
# keepalive (paho's rule), ~22 s here; a restart on the same host closes the socket and is seen at once.
KEEPALIVE_S = 15

StatusCallback = Callable[[str, str], None]  # (name, message): "mqtt" or a source key, and what happened
ErrorCallback = Callable[[str, str], None]

log = logging.getLogger("kvtop.mqtt")


class MqttUrlError(ValueError):
    """A broker URL kvtop cannot use; the message says what to write instead (and never echoes a password)."""


@dataclass(frozen=True)
class MqttUrl:
    """A parsed ``mqtt://[user@]host[:port]/prefix`` (or ``mqtts://``). ``password`` stays out of ``repr``."""

    host: str
    port: int
    prefix: str = ""
    tls: bool = False
    username: str | None = None
    password: str | None = field(default=None, repr=False, compare=False)
    password_origin: str | None = None  # "KVTOP_MQTT_PASSWORD" or "file <path>": what messages may name
    ca_file: str | None = None  # mqtts only: a private CA (``?ca=/path/ca.pem``); default: the system's CAs

    def display(self) -> str:
        """The URL as it is safe to show and log (no password, ever)."""
        user = f"{self.username}@" if self.username else ""
        scheme = "mqtts" if self.tls else "mqtt"
        return f"{scheme}://{user}{self.host}:{self.port}/{self.prefix}"

    def topic_filter(self, run: str | None = None) -> str:
        """What a subscriber subscribes to: every kvtop topic under the prefix (or one run's)."""
        return join_topic(self.prefix, *TOPIC_ROOT, *((_level(run), "#") if run else ("#",)))

    def client_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``aiomqtt.Client`` (host, port, credentials, TLS)."""
        kwargs: dict[str, Any] = {"hostname": self.host, "port": self.port, "keepalive": KEEPALIVE_S}
        if self.username is not None:
            kwargs["username"] = self.username
            kwargs["password"] = self.password
        if self.tls:
            ctx = ssl.create_default_context(cafile=self.ca_file)
            kwargs["tls_context"] = ctx
        return kwargs


def resolve_password(password_file: str | os.PathLike[str] | None = None,
                     env: Mapping[str, str] | None = None) -> tuple[str | None, str | None]:
    """The broker password and where it came from: ``password_file`` if given, else ``KVTOP_MQTT_PASSWORD``.

    The file holds the password alone (one trailing newline is stripped, as ``echo pw > file`` writes one).
    """
    if password_file is not None:
        path = os.fspath(password_file)
        try:
            with open(path, encoding="utf-8") as fh:
                text = fh.read()
        except OSError as exc:
            raise MqttUrlError(f"--mqtt-password-file: cannot read {path}: {exc.strerror}") from None
        return text.rstrip("\r\n"), f"file {path}"
    env = os.environ if env is None else env
    value = env.get(PASSWORD_ENV)
    if value:
        return value, PASSWORD_ENV
    return None, None


def parse_mqtt_url(url: str, *, password_file: str | os.PathLike[str] | None = None,
                   env: Mapping[str, str] | None = None) -> MqttUrl:
    """Parse a broker URL; the password comes from ``password_file`` or ``KVTOP_MQTT_PASSWORD``.

    Raises :class:`MqttUrlError` for another scheme, a missing host, a bad port, or a password in the URL.
    """
    try:
        parts = urlsplit(url.strip())
        port_text = parts.port
    except ValueError:
        raise MqttUrlError(f"{_redact(url)}: not a valid broker URL (expected mqtt://[user@]host[:port]/prefix; "
                           "the port must be a number from 1 to 65535)") from None
    scheme = parts.scheme.lower()
    if scheme not in DEFAULT_PORTS:
        raise MqttUrlError(f"{_redact(url)}: the scheme must be mqtt:// or mqtts:// (TLS), got {scheme or 'none'}")
    if parts.password is not None:
        raise MqttUrlError(
            f"{_redact(url)}: a password in the URL would show in the process list and shell history; "
            f"put it in the {PASSWORD_ENV} environment variable or in a file given with --mqtt-password-file, "
            "and keep only the user in the URL (mqtt://user@host/prefix)")
    if not parts.hostname:
        raise MqttUrlError(f"{_redact(url)}: the broker host is missing (mqtt://host[:port]/prefix)")
    query = parse_qs(parts.query)
    unknown = sorted(set(query) - {"ca"})
    if unknown:
        raise MqttUrlError(f"{_redact(url)}: unknown URL parameter(s) {', '.join(unknown)} (known: ca)")
    ca_file = query["ca"][-1] if "ca" in query else None
    if ca_file and scheme != "mqtts":
        raise MqttUrlError(f"{_redact(url)}: ?ca= needs mqtts:// (TLS)")
    prefix = "/".join(p for p in unquote(parts.path).split("/") if p)
    if any(c in prefix for c in "+#\0"):
        raise MqttUrlError(f"{_redact(url)}: the topic prefix may not contain +, # or NUL")
    username = unquote(parts.username) if parts.username else None
    password, origin = resolve_password(password_file, env)
    if password is not None and username is None:
        # A password with no user cannot be sent (MQTT 3.1.1 requires the user flag with the password flag).
        raise MqttUrlError(f"{_redact(url)}: a broker password is set ({origin}) but the URL names no user; "
                           "write mqtt://USER@host/prefix")
    return MqttUrl(host=parts.hostname, port=port_text or DEFAULT_PORTS[scheme], prefix=prefix,
                   tls=scheme == "mqtts", username=username, password=password, password_origin=origin,
                   ca_file=ca_file)


def _redact(url: str) -> str:
    """The URL with any password replaced by ``***`` (for error messages)."""
    try:
        parts = urlsplit(url)
        if parts.password is None:
            return url
        netloc = parts.netloc.rsplit("@", 1)[1]
        return parts._replace(netloc=f"{parts.username}:***@{netloc}").geturl()
    except ValueError:
        return "the URL"


# ---------------------------------------------------------------------------------------------- topics

_UNSAFE = str.maketrans({"/": "_", "+": "_", "#": "_", "\0": "_"})


def _level(text: str | None) -> str:
    """One topic level: never empty, never a wildcard or separator."""
    return (text or "-").translate(_UNSAFE)


def join_topic(*levels: str) -> str:
    return "/".join(lv for lv in levels if lv)


def source_level(source: SourceId) -> str:
    return _level(f"{source.host or '-'}:{source.rank}")


def topic_for(prefix: str, source: SourceId, kind: str) -> str:
    """``<prefix>/kvtop/v1/<run>/<host>:<rank>/<kind>``."""
    return join_topic(prefix, *TOPIC_ROOT, _level(source.run), source_level(source), kind)


@dataclass(frozen=True)
class TopicParts:
    run: str
    source: str  # "<host>:<rank>"
    kind: str

    @property
    def key(self) -> str:
        """The source's key as :meth:`SourceId.key` spells it (``host/rank/run``), when the level parses."""
        host, _, rank = self.source.rpartition(":")
        return f"{host or '-'}/{rank or 0}/{self.run}"


def parse_topic(prefix: str, topic: str) -> TopicParts | None:
    """The run, source and kind of a kvtop topic under ``prefix``; ``None`` for anything else."""
    levels = topic.split("/")
    skip = len(prefix.split("/")) if prefix else 0
    rest = levels[skip:]
    if len(rest) != 5 or tuple(rest[:2]) != TOPIC_ROOT:
        return None
    return TopicParts(rest[2], rest[3], rest[4])


def new_client_id(role: str) -> str:
    # 23 characters at most: the MQTT 3.1.1 limit every broker must accept ("kvtop-sub-" + 12 hex = 22).
    return f"kvtop-{role[:3]}-{uuid.uuid4().hex[:12]}"


def describe_error(exc: BaseException) -> str:
    text = str(exc) or type(exc).__name__
    if "not authori" in text.lower() or "bad user name or password" in text.lower():
        text += " (check the user in the URL and the password in KVTOP_MQTT_PASSWORD or --mqtt-password-file)"
    return text


async def keep_connected(url: MqttUrl, client: Callable[[], Any], session: Callable[[Any], Awaitable[None]], *,
                         stopped: Callable[[], bool], stop_event: asyncio.Event, lost: Callable[[str], None]) -> None:
    """Connect, run ``session(client)`` while connected, reconnect when the broker is lost, until ``stopped()``.

    Both ends use it. ``session`` returns when asked to stop and raises ``MqttError`` when the connection drops.
    ``lost(message)`` is called once per streak of failures (a broker down for a minute is one message, not 30).
    Backoff 0.25 s doubling to 2 s (see ``BACKOFF_MAX_S``), cut short by ``stop_event``.
    """
    import aiomqtt

    backoff = BACKOFF_FIRST_S
    reported: str | None = None
    while not stopped():
        try:
            async with client() as connection:
                backoff, reported = BACKOFF_FIRST_S, None
                await session(connection)
        except aiomqtt.MqttError as exc:
            message = f"disconnected from {url.display()}: {describe_error(exc)}"
            if message != reported:
                reported = message
                lost(message)
        if stopped():
            break
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(stop_event.wait(), timeout=backoff)
        backoff = min(backoff * 2, BACKOFF_MAX_S)


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
        logger: logging.Logger | None = None,
    ):
        self.url = url if isinstance(url, MqttUrl) else parse_mqtt_url(url, password_file=password_file)
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

        def client() -> Any:
            return aiomqtt.Client(identifier=new_client_id("sub"), logger=self.logger,
                                  max_queued_incoming_messages=self.max_queued_messages, **self.url.client_kwargs())

        async def session(client: Any) -> None:
            nonlocal lost_at
            await client.subscribe(self.url.topic_filter(self.run_filter), qos=1)
            self.connected = True
            self.connects += 1
            if lost_at is not None:
                gap = time.monotonic() - lost_at
                self.gaps.append(gap)
                self._status("mqtt", f"reconnected to {self.url.display()} after {gap:.1f} s")
            else:
                waited = time.monotonic() - first_try
                self._status("mqtt", f"connected to {self.url.display()}"
                             + (f" (after {waited:.1f} s of retries)" if waited >= 1.0 else ""))
            lost_at = None
            try:
                await self._consume(client)
            except aiomqtt.MqttError:
                lost_at = time.monotonic()
                raise
            finally:
                self.connected = False

        await keep_connected(self.url, client, session, stopped=lambda: self._stop.requested, stop_event=stop_event,
                             lost=lambda message: self._status("mqtt", f"{message}; retrying (every "
                                                                       f"{BACKOFF_MAX_S:g} s at most)"))

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
            records = decode_payload(payload if isinstance(payload, (bytes, str)) else bytes(payload))
        except RecordError as exc:
            self._malformed(topic, str(exc))
            return
        except (TypeError, ValueError) as exc:  # a payload type aiomqtt may give that is not bytes
            self._malformed(topic, f"unreadable payload ({exc})")
            return
        self.records_received += len(records)
        if self.sink is not None:
            for rec in records:
                self.sink(rec)  # a sink's exception is the consumer's bug: it propagates

    def _malformed(self, topic: str, problem: str) -> None:
        self.malformed += 1
        self.last_malformed = f"{topic}: {problem}"
        if self.on_error is not None:
            with contextlib.suppress(Exception):
                self.on_error("mqtt", f"malformed message #{self.malformed} on {topic}: {problem}")

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
                        on_error: ErrorCallback | None = None) -> MqttSubscriber:
    """What ``kvtop attach mqtt://...`` calls. Raises :class:`MqttUrlError` for a URL it cannot use."""
    return MqttSubscriber(parse_mqtt_url(url, password_file=password_file), sink, run=run, on_status=on_status,
                          on_error=on_error)


__all__ = [
    "MqttSubscriber", "MqttUrl", "MqttUrlError", "PASSWORD_ENV", "TopicParts", "parse_mqtt_url", "parse_topic",
    "resolve_password", "subscriber_from_url", "topic_for",
]
