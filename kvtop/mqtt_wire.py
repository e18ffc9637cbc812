"""kvtop's MQTT wire conventions, shared by the subscriber (kvtop/sources/mqtt.py) and the publisher
(kvtop/sinks/mqtt.py, the agent): broker URLs, credentials, topics, and the reconnecting connection loop.

A module of its own so that a sink never imports a source (tests/test_layers.py).

Topics (under the URL's prefix, which may be empty or several levels)::

    <prefix>/kvtop/v1/<run>/<source>/<kind>     kind: meta | stats | kv_event | gpu | host | request
    <prefix>/kvtop/v1/<run>/<source>/status     "online" | "offline" (retained; "offline" is the last will)

``<source>`` is ``<host>:<rank>``; levels are made safe for MQTT (``/``, ``+``, ``#`` and NUL become ``_``).
Payloads are kvtop records (:func:`kvtop.records.encode`) or JSON arrays of them (``encode_batch``), so they are
versioned like a recording and decoded by the same code. ``meta`` is retained, so a dashboard that subscribes
late still learns what each source is.

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
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from kvtop.records import SourceId

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
        return join_topic(self.prefix, *TOPIC_ROOT, *((topic_level(run), "#") if run else ("#",)))

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
            raise MqttUrlError(f"--mqtt-password-file: cannot read {path}: {exc.strerror or exc}") from None
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
    if ca_file and not os.path.isfile(ca_file):
        raise MqttUrlError(f"{_redact(url)}: ?ca={ca_file}: no such file (a PEM file of the CA that signed the "
                           "broker's certificate)")
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


def redact_url(url: str) -> str:
    """``url`` with any password replaced by ``***`` (for messages and ``--show-settings``)."""
    return _redact(url)


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


def topic_level(text: str | None) -> str:
    """One topic level: never empty, never a wildcard or separator."""
    return (text or "-").translate(_UNSAFE)


def join_topic(*levels: str) -> str:
    return "/".join(lv for lv in levels if lv)


def source_level(source: SourceId) -> str:
    return topic_level(f"{source.host or '-'}:{source.rank}")


def topic_for(prefix: str, source: SourceId, kind: str) -> str:
    """``<prefix>/kvtop/v1/<run>/<host>:<rank>/<kind>``."""
    return join_topic(prefix, *TOPIC_ROOT, topic_level(source.run), source_level(source), kind)


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
