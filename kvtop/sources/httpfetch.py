"""One HTTP request with a total deadline, for the sources that poll an engine's HTTP endpoints (trtllm-serve's
monitoring routes, vLLM's and SGLang's Prometheus ``/metrics``).

Why not ``urllib.request.urlopen(url, timeout=...)`` in ``asyncio.to_thread`` (what kvtop did before issue 26):

- urllib's ``timeout`` is per socket operation, so a server that sends one byte every 5 s (or chunks forever)
  keeps one request, and the poll waiting on it, alive for ever: the deadline here is for the whole request
  (connect, status line, headers, body).
- a thread of the event loop's default executor stuck in such a request is joined by ``asyncio.run`` (and
  Textual's app) at exit: ``kvtop attach`` then hung after its summary was due, until two Ctrl-C. Each request
  here runs in a daemon thread of its own, which nothing joins.
- when the deadline passes (or the awaiting task is cancelled), the request's socket is shut down from the
  waiting side: the thread's blocked read returns at once and the thread ends; it does not linger until the
  server stops trickling. A request never outlives its deadline by more than a read's wake-up.

The client is ``http.client`` (stdlib, no new dependency), talking to the host of the URL directly (no proxy from
the environment: these are monitoring endpoints on the engine's own network). Redirects (vLLM's mounted
Prometheus app answers ``/metrics`` with a 307 to ``/metrics/``) are followed, at most 3, within the same
deadline. An answer of 400 or more raises :class:`HttpStatusError`; a body over ``max_bytes`` raises
:class:`BodyTooLarge` as soon as it is over (memory stays bounded whatever the server sends).
"""

from __future__ import annotations

import asyncio
import http.client
import socket
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any
from urllib.parse import urljoin, urlsplit

__all__ = ["BodyTooLarge", "DeadlineExceeded", "HttpStatusError", "fetch", "fetch_blocking"]

MAX_REDIRECTS = 3
CHUNK = 1 << 16


class HttpStatusError(Exception):
    """The server answered with status >= 400 (or a redirect kvtop would not follow)."""

    def __init__(self, status: int, reason: str, *, text: str | None = None):
        super().__init__(text or f"HTTP {status} {reason}")
        self.status = status
        self.reason = reason


class DeadlineExceeded(Exception):
    """No complete answer within the deadline (a server that trickles, stalls, or never ends its body)."""

    def __init__(self, url: str, deadline_s: float, received: int, connected: bool = True):
        what = ("no connection" if not connected else "nothing received" if received <= 0
                else f"{received:,} byte(s) of the body received")
        super().__init__(f"no complete answer within {deadline_s:g} s ({what})")
        self.url = url
        self.deadline_s = deadline_s
        self.received = received
        self.connected = connected  # False: the connection itself was not made in time (a host that is down)


class BodyTooLarge(Exception):
    def __init__(self, max_bytes: int):
        super().__init__(f"answer larger than {max_bytes >> 20} MiB" if max_bytes >= 1 << 20
                         else f"answer larger than {max_bytes:,} bytes")
        self.max_bytes = max_bytes


class _Request:
    """One request in its own daemon thread; ``abort`` (any thread) shuts its socket down."""

    def __init__(self, method: str, url: str, deadline_s: float, max_bytes: int, headers: Mapping[str, str]):
        self.method = method
        self.url = url
        self.deadline_s = deadline_s
        self.max_bytes = max_bytes
        self.headers = dict(headers)
        self.received = 0  # body bytes so far (read by the waiting side for its message)
        self.connected = False
        self.body: bytes | None = None
        self.error: BaseException | None = None
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._aborted = False
        self._deadline = 0.0

    def start(self, done: Callable[[], None]) -> None:
        self._deadline = time.monotonic() + self.deadline_s

        def work() -> None:
            try:
                self.body = self._run()
            except BaseException as exc:  # handed to the waiting side, which raises it there
                self.error = exc
            finally:
                done()

        threading.Thread(target=work, name="kvtop-http", daemon=True).start()

    def abort(self) -> None:
        with self._lock:
            self._aborted = True
            sock = self._sock
        if sock is not None:
            _shutdown(sock)

    def _watch(self, sock: socket.socket | None) -> None:
        with self._lock:
            self._sock = sock
            aborted = self._aborted
        if aborted and sock is not None:
            _shutdown(sock)

    def _remaining(self) -> float:
        left = self._deadline - time.monotonic()
        if left <= 0 or self._aborted:
            raise DeadlineExceeded(self.url, self.deadline_s, self.received, self.connected)
        return left

    def _run(self) -> bytes:
        url, method = self.url, self.method
        for _ in range(MAX_REDIRECTS + 1):
            status, reason, location, body = self._once(method, url)
            if status in (301, 302, 303, 307, 308) and location:
                url = urljoin(url, location)
                if urlsplit(url).scheme not in ("http", "https"):
                    raise HttpStatusError(status, f"{reason} (to {url[:200]})")
                method = "GET" if status == 303 else method
                continue
            if status >= 300:
                raise HttpStatusError(status, reason)
            return body
        raise HttpStatusError(status, f"{reason} (more than {MAX_REDIRECTS} redirects)")

    def _once(self, method: str, url: str) -> tuple[int, str, str | None, bytes]:
        parts = urlsplit(url)
        cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        conn = cls(parts.hostname or "", parts.port, timeout=self._remaining())

        def connect(address: tuple[str, int], timeout: Any = None, source_address: Any = None) -> socket.socket:
            sock = socket.create_connection(address, timeout, source_address)
            self._watch(sock)
            return sock

        conn._create_connection = connect  # type: ignore[attr-defined]  # see http.client: the hook it calls
        path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        try:
            conn.connect()
            self.connected = True
            self._watch(conn.sock)  # for https: the TLS socket that wraps it
            conn.request(method, path, body=b"" if method == "POST" else None,
                         headers={"User-Agent": "kvtop", **self.headers})
            resp = conn.getresponse()
            if resp.status >= 300:
                resp.read(CHUNK)  # a short error page; never waited on past the deadline either
                return resp.status, str(resp.reason), resp.getheader("Location"), b""
            chunks: list[bytes] = []
            self.received = 0
            while True:
                if conn.sock is not None:
                    conn.sock.settimeout(self._remaining())
                chunk = resp.read1(min(CHUNK, self.max_bytes + 1 - self.received))
                if not chunk:
                    break
                chunks.append(chunk)
                self.received += len(chunk)
                if self.received > self.max_bytes:
                    raise BodyTooLarge(self.max_bytes)
            return resp.status, str(resp.reason), None, b"".join(chunks)
        except (OSError, http.client.HTTPException):
            if self._aborted or time.monotonic() >= self._deadline:
                raise DeadlineExceeded(self.url, self.deadline_s, self.received, self.connected) from None
            raise
        finally:
            self._watch(None)
            conn.close()


def _shutdown(sock: socket.socket) -> None:
    # The plain socket's shutdown, also for a TLS socket (its own would try to talk TLS from this thread): the
    # reading thread's recv returns at once; that thread closes the socket itself.
    try:
        socket.socket.shutdown(sock, socket.SHUT_RDWR)
    except OSError:
        pass


async def fetch(method: str, url: str, *, deadline_s: float, max_bytes: int,
                headers: Mapping[str, str] | None = None) -> bytes:
    """The body of ``method url``, or an exception: :class:`DeadlineExceeded` after ``deadline_s`` in all,
    :class:`HttpStatusError`, :class:`BodyTooLarge`, ``OSError`` (cannot connect) or ``http.client.HTTPException``
    (not an HTTP answer). Cancelling the caller aborts the request; nothing waits for its thread."""
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    req = _Request(method, url, deadline_s, max_bytes, headers or {})

    def finished() -> None:
        try:
            loop.call_soon_threadsafe(done.set)
        except RuntimeError:  # the loop is closed: the run ended and nobody waits for this answer any more
            pass

    req.start(finished)
    try:
        await asyncio.wait_for(done.wait(), timeout=deadline_s)
    except asyncio.TimeoutError:
        req.abort()
        raise DeadlineExceeded(url, deadline_s, req.received, req.connected) from None
    except BaseException:  # cancelled: the request goes with it
        req.abort()
        raise
    if req.error is not None:
        raise req.error
    assert req.body is not None
    return req.body


def fetch_blocking(method: str, url: str, *, deadline_s: float, max_bytes: int,
                   headers: Mapping[str, str] | None = None) -> bytes:
    """:func:`fetch` for a caller without an event loop (the same deadline, the same daemon thread)."""
    done = threading.Event()
    req = _Request(method, url, deadline_s, max_bytes, headers or {})
    req.start(done.set)
    if not done.wait(deadline_s):
        req.abort()
        raise DeadlineExceeded(url, deadline_s, req.received, req.connected)
    if req.error is not None:
        raise req.error
    assert req.body is not None
    return req.body
