"""Attach to an engine's KV event stream over ZMQ (vLLM, SGLang, TensorRT-LLM's streaming path, Dynamo's mocker).

URLs (``kvtop attach URL``)::

    zmq://HOST:PORT[?replay=tcp://HOST:PORT|PORT][&topic=T][&ranks=N][&metrics=http://HOST:PORT/metrics]...
    vllm://HOST:PORT[?events=tcp://HOST:5557][&replay=...][&ranks=N][&metrics=...]
    sglang://HOST:PORT[?events=...][&replay=...]

``zmq://`` is the publisher itself. ``vllm://`` and ``sglang://`` name the engine's HTTP server: kvtop scrapes its
``/metrics`` and asks ``/server_info`` where the publisher is (SGLang advertises it; vLLM only in dev mode, else
``tcp://HOST:5557``, vLLM's default, or ``events=``). ``metrics=`` adds more pages (Dynamo's frontend, KVBM's
``:6880/metrics``); ``ranks=N`` subscribes to N data-parallel ranks on consecutive ports (vLLM's and SGLang's
``base port + rank``; replay ports likewise).

The subscriber (pyzmq, asyncio) connects a SUB socket to each rank's publisher (the engine binds: vLLM does for
``tcp://*:…``; a SUB that binds to a connecting PUB received nothing on this machine, shared/engines-kv-events.md
7.1). The reader is woken by the SUB socket's descriptor; while messages come, it reads what came every ``GATHER_S``
(0.1 s) all at once (a busy engine sends a batch every few ms: a wake-up each cost as much as folding it). Each
message is decoded (kvtop/sources/kv_wire.py) into one ``kv_batch`` record; a message that is not a batch is counted
(``bad``), reported once per 5 s through ``on_error`` and skipped: never fatal.

Sequence gaps: ``seq`` is per publisher. A gap (messages dropped by ZMQ's high-water mark, a slow joiner's first
messages) is filled from the replay endpoint when there is one: a DEALER socket sends ``[b"", start seq]`` and
reads every buffered batch back until the end marker (seq -1). (A REQ socket gets only the first batch of the
answer: vLLM PR #45177 switched vLLM's own test to DEALER for this.) On the first message, kvtop asks replay for
everything from seq 0: if the engine's buffer (10,000 steps by default) still holds it, the fold starts exact
instead of "since attach".

A replay never stalls the stream (issue 26: a dead or silent replay port cost the rank 1 s per gap, a dripping
one kept it in its replay loop for hours). It runs in a task of its own, with a total deadline
(``REPLAY_DEADLINE_S``) and ``REPLAY_IDLE_S`` of silence at most; the SUB socket keeps being read, and the live
batches that come meanwhile wait behind it (the fold needs seq order: a replayed batch folded after later ones
would read as a publisher restart) and are folded, with what the replay brought, in seq order when it ends
however it ends, the run's end included. What neither brought is lost (``zmq.gap``, exit status 4). A replay that
did not complete is a ``zmq.replay`` problem, and gaps of the next ``REPLAY_BACKOFF_S`` (doubling to 60 s) are
counted lost without asking. An answer is read to ``REPLAY_MAX`` batches and ``REPLAY_MAX_BYTES`` at most.

Lag: how far behind its publisher a live batch is folded. It came late (its engine time's offset from kvtop's
clock, less that offset when kvtop last had nothing more queued: a flood it cannot keep up with), and it may have
waited behind a replay. A ``kv_batch`` record that lagged carries ``lag_s`` (and ``behind``: the batches held
after it); the fold shows the most of the last 10 s (dashboard header, ``stream`` section of the summary). A run
that ends 1 s or more behind counts the messages it never read (``zmq.unread``, lost).

Memory: a message over ``MAX_MESSAGE_BYTES`` (8 MiB, as MQTT's payload limit) is refused unread (a bad message,
lost; the batch is a seq gap): it costs its size while it is received, never the ~5x that unpacking it took (one
113 MB message cost 613 MB). Not ZMQ's own ``MAXMSGSIZE``: libzmq 4.3 aborts the process (``Assertion failed:
!_more (src/fq.cpp:80)``, 2 runs in 12 of tests/sources/test_zmq_replay.py's 9 MB message) when it refuses the last
frame of a multipart message whose first frames it has queued. What kvtop has not read yet waits in ZMQ's queue, at most
``RCVHWM`` (10,000) messages: past that ZMQ drops, and the drops are seq gaps, counted lost. (ZMQ bounds a queue in
messages, not bytes: a vLLM step's batch is 1-20 KB, so ~10-200 MB at most; at 100,000, as before, a flood of 9 KB
batches it could not keep up with grew kvtop to 592 MB in 25 s and on, now 143 MB: bench/JOURNAL.md, "A flood".) The
fold's live blocks are bounded apart (kvtop/tiers/stream.py ``LIVE_CAP``). A socket monitor counts the publisher's
disconnects (``zmq.disconnected``) and connects again.

Sequence numbers are checked: a seq of 2^63 or more is negative on the wire (a bad message); one more than
``MAX_SEQ_JUMP`` past the last is not this publisher's sequence (a bad message, not a gap of 2^64 batches),
unless ``RESYNC_AFTER`` consecutive ones go on from it (then followed as a new start, ``zmq.seq_jump``); a seq
going back is a publisher restart (``zmq.restart``, the fold starts again).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from kvtop.problems import Problems
from kvtop.records import Record, SourceId, make
from kvtop.sources.kv_wire import Batch, WireError, decode_frames
from kvtop.stopsignal import StopSignal
from kvtop.textsafe import clean

Sink = Callable[[Record], None]
Callback = Callable[[str, str], None]

DEFAULT_EVENTS_PORT = 5557  # vLLM's and SGLang's default endpoint tcp://*:5557
REPLAY_IDLE_S = 1.0   # a replay answer that falls silent this long is over (the end marker was lost)
REPLAY_MAX = 20_000   # batches read from one replay answer at most (vLLM buffers 10,000 by default)
REPLAY_SAY_S = 1.0    # a replay that holds live batches this long is said in the stream's status
REPLAY_MAX_BYTES = 256 << 20  # bytes read from one replay answer at most (20,000 batches of 8 MiB would be 160 GB)
REPLAY_DEADLINE_S = 3.0  # a replay is over this long after it was asked for, whatever is still to come
REPLAY_BACKOFF_S = 5.0   # after a replay that failed: gaps are lost without asking this long (doubling, to 60 s)
REPLAY_BACKOFF_MAX_S = 60.0
HOLD_MAX = 50_000     # live batches held behind a running replay at most: more ends the replay at once
MAX_MESSAGE_BYTES = 8 << 20  # a larger message is refused unread (as MQTT's payload limit: 8 MiB)
MAX_SEQ_JUMP = 1 << 24  # a seq this far past the last is not this publisher's (46 h of drops at 100 batches/s)
RESYNC_AFTER = 3      # ... unless this many consecutive seqs go on from it: a new start, followed
POLL_S = 0.25         # the receive loop wakes this often to notice a stop
GATHER_S = 0.1        # while messages come, the receive loop reads what came every this long, all at once
READ_BURST = 64       # messages read at one wake-up at most, before the loop's other tasks run
RCVHWM = 10_000       # messages a SUB queues before ZMQ drops (the bound of its queue, module docstring)
ERROR_REPORT_S = 5.0
_EVENT_DISCONNECTED = 0x0200  # zmq.EVENT_DISCONNECTED
_EVENTS, _POLLIN = 15, 1      # zmq.EVENTS, zmq.POLLIN
QUEUE_LAG_MIN_S = 0.25  # a live batch that came this far behind its publisher carries its lag in its record
UNREAD_LAG_S = 1.0    # messages still queued at the end of a run this far behind are data never read (lost)
_END = (1 << 64) - 1  # the replay end marker: (-1).to_bytes(8, "big", signed=True)


def _receive(recv: Callable[..., Any]) -> list[bytes] | None:
    """The next message queued on a socket (its frames), or None when none is. Frames read as zmq.Frame, whose
    ``more`` is set by the read: pyzmq's recv_multipart asks ZMQ_RCVMORE for each frame (an option lookup through
    an enum each time; 6 -> 3.5 us a 3-frame message on the dev box, with ZMQ_EVENTS asked each message before)."""
    import zmq

    try:
        frame = recv(zmq.NOBLOCK, copy=False)
    except zmq.Again:
        return None
    frames = [frame.bytes]
    while frame.more:
        frame = recv(zmq.NOBLOCK, copy=False)
        frames.append(frame.bytes)
    return frames


class ZmqUrlError(ValueError):
    """A stream URL kvtop cannot use; the message says what to write."""


@dataclass(frozen=True)
class StreamUrl:
    scheme: str                 # zmq | vllm | sglang
    host: str
    port: int
    events: tuple[str, ...]     # one tcp:// endpoint per rank
    replay: tuple[str | None, ...]
    topic: str = ""
    metrics: tuple[str, ...] = ()
    http: str | None = None     # the engine's HTTP server (vllm:// and sglang://)

    def display(self) -> str:
        return f"{self.scheme}://{self.host}:{self.port}"


def _port(text: str, what: str) -> int:
    try:
        port = int(text)
    except ValueError:
        raise ZmqUrlError(f"{what}: expected a port number, got {text!r}") from None
    if not 0 < port < 65536:
        raise ZmqUrlError(f"{what}: port must be 1-65535, got {port}")
    return port


def _endpoint(text: str, host: str, what: str) -> tuple[str, int]:
    """``tcp://h:p`` or a bare port (on the URL's host) -> (host, port)."""
    if text.isdigit():
        return host, _port(text, what)
    parts = urlsplit(text)
    if parts.scheme != "tcp" or not parts.hostname or parts.port is None:
        raise ZmqUrlError(f"{what}: expected tcp://HOST:PORT or a port, got {text!r}")
    return parts.hostname, parts.port


def _offset(host: str, port: int, ranks: int) -> tuple[str, ...]:
    return tuple(f"tcp://{host}:{port + r}" for r in range(ranks))


def parse_stream_url(url: str, *, discover: Callable[[str, str], dict[str, Any]] | None = None) -> StreamUrl:
    parts = urlsplit(url)
    scheme = parts.scheme.lower()
    if scheme not in ("zmq", "vllm", "sglang"):
        raise ZmqUrlError(f"expected zmq://, vllm:// or sglang://, got {url!r}")
    host = parts.hostname
    if not host:
        raise ZmqUrlError(f"{url!r}: no host (write {scheme}://HOST:PORT)")
    try:
        port = parts.port
    except ValueError:
        raise ZmqUrlError(f"{url!r}: bad port") from None
    query = parse_qs(parts.query, keep_blank_values=True)
    known = {"replay", "topic", "ranks", "metrics", "events"}
    unknown = sorted(set(query) - known)
    if unknown:
        raise ZmqUrlError(f"unknown option {unknown[0]!r} (known: {', '.join(sorted(known))})")
    ranks = 1
    if "ranks" in query:
        try:
            ranks = int(query["ranks"][-1])
        except ValueError:
            raise ZmqUrlError(f"ranks: expected a count, got {query['ranks'][-1]!r}") from None
        if not 1 <= ranks <= 1024:
            raise ZmqUrlError(f"ranks: must be 1-1024, got {ranks}")
    metrics = [m for m in query.get("metrics", []) if m]
    for m in metrics:
        if urlsplit(m).scheme not in ("http", "https"):
            raise ZmqUrlError(f"metrics: expected http://HOST:PORT/metrics, got {m!r}")
    topic = query.get("topic", [""])[-1]
    http: str | None = None
    advertised: dict[str, Any] = {}
    if scheme == "zmq":
        if port is None:
            raise ZmqUrlError(f"{url!r}: no port (write zmq://HOST:PORT, the publisher's port)")
        if "events" in query:
            raise ZmqUrlError("events= is for vllm:// and sglang://; a zmq:// URL is the publisher itself")
        ev_host, ev_port = host, port
    else:
        if port is None:
            port = 8000 if scheme == "vllm" else 30000  # vllm serve's and sglang's default HTTP ports
        http = f"http://{host}:{port}"
        metrics.insert(0, f"{http}/metrics")
        if "events" in query:
            ev_host, ev_port = _endpoint(query["events"][-1], host, "events")
        else:
            advertised = discover(http, host) if discover is not None else {}
            ev_host, ev_port = host, DEFAULT_EVENTS_PORT
            if isinstance(advertised.get("endpoint"), str):
                ev_host, ev_port = _endpoint(advertised["endpoint"], host, "advertised endpoint")
            if "ranks" not in query and isinstance(advertised.get("ranks"), int):
                ranks = advertised["ranks"]
            if not topic and isinstance(advertised.get("topic"), str):
                topic = advertised["topic"]
    replay_text = query.get("replay", [None])[-1] or advertised.get("replay")
    replay: tuple[str | None, ...] = (None,) * ranks
    if replay_text:
        r_host, r_port = _endpoint(replay_text, host, "replay")
        replay = _offset(r_host, r_port, ranks)
    return StreamUrl(scheme, host, port, _offset(ev_host, ev_port, ranks), replay, topic, tuple(metrics), http)


@dataclass
class RankState:
    endpoint: str
    replay: str | None
    index: int
    next_seq: int | None = None   # the seq the fold expects next (of the batches emitted so far)
    live_seq: int | None = None   # the last live batch taken in (emitted, or held behind a replay)
    received: int = 0
    bad: int = 0
    gaps: int = 0         # seq gaps seen in the live stream (filled or not)
    filled: int = 0       # batches replay brought back and the fold took
    lost: int = 0         # batches neither live nor replayed
    restarts: int = 0
    seq_jumps: int = 0    # implausible jumps the stream went on from (resynchronized)
    disconnects: int = 0  # the publisher's connection dropped (it went away, or ZMQ ended it)
    wakeups: int = 0      # times the receive loop woke to read the socket (its descriptor, its stop timer, GATHER_S)
    last_error: str | None = None
    meta_sent: set[int] = field(default_factory=set)
    # The replay in progress (one at a time per rank, in a task of its own) and the live batches held behind it
    # (batch, when it came, whether it resynchronizes the sequence, how far behind its publisher it came),
    # each with when it came and whether it resynchronizes the sequence.
    held: deque[tuple[Batch, float, bool, float]] = field(default_factory=deque)
    replay_task: asyncio.Task[str] | None = None
    replay_start: int = 0
    replay_got: dict[int, Batch] = field(default_factory=dict)
    replay_asked_at: float = 0.0
    replay_error: str = ""
    replay_cut: str = "stopped"   # why a replay task was cancelled
    replay_retry_at: float = 0.0  # monotonic: no replay asked before (after one that failed)
    replay_backoff_s: float = 0.0
    replay_said: bool = False     # a slow replay was said in the stream's status
    replays: int = 0
    replays_failed: int = 0
    gap_why: str = ""             # why the last replay left gaps (for the gap problem's message)
    # an implausible jump: the seq of the last batch skipped for it, and how many consecutive ones followed it
    jump_seq: int | None = None
    jump_run: int = 0
    max_lag_s: float = 0.0
    max_behind: int = 0
    ts_base: float | None = None  # the batches' engine-time offset from this clock when last caught up
    last_queue_lag: float = 0.0   # how far behind its publisher the last live batch came


class ZmqKvEventSource:
    """Subscribes to every rank of ``url`` and emits ``kv_batch`` records (see the module doc)."""

    def __init__(self, url: StreamUrl, sink: Sink, *, run: str | None = None, engine: str | None = None,
                 on_status: Callback | None = None, on_error: Callback | None = None,
                 replay_idle_s: float = REPLAY_IDLE_S, replay_deadline_s: float = REPLAY_DEADLINE_S,
                 problems: Problems | None = None):
        self.url = url
        self.sink = sink
        self.run_name = run or ""
        self.engine = engine or ("vllm-format" if url.scheme == "zmq" else url.scheme)
        self.on_status = on_status
        self.on_error = on_error
        self.replay_idle_s = replay_idle_s
        self.replay_deadline_s = replay_deadline_s
        self.hold_max = HOLD_MAX
        self.gather_s = GATHER_S
        self.replay_max_bytes = REPLAY_MAX_BYTES
        # Every mode reads it (kvtop/problems.py): bad messages and unfilled gaps are lost data (exit status 4)
        self.problems = problems
        self.ranks = [RankState(ep, rp, i) for i, (ep, rp) in enumerate(zip(url.events, url.replay))]
        self._stop = StopSignal()
        self._last_report = 0.0
        self._ctx: Any = None
        self._sources: dict[int, SourceId] = {}

    def source_for(self, rank: int) -> SourceId:
        """The source of a rank: ``HOST:PORT`` of the URL, the data-parallel rank, the run (one instance per rank:
        the session computes a source's key once per instance)."""
        source = self._sources.get(rank)
        if source is None:
            source = SourceId(host=f"{self.url.host}:{self.url.port}", rank=rank, run=self.run_name)
            if len(self._sources) < 1024:
                self._sources[rank] = source
        return source

    def stop(self) -> None:
        self._stop.stop()

    @property
    def bad(self) -> int:
        return sum(r.bad for r in self.ranks)

    async def run(self) -> None:
        import zmq
        import zmq.asyncio

        self._stop.bind()
        ctx = self._ctx = zmq.asyncio.Context()
        try:
            await asyncio.gather(*(self._run_rank(ctx, r) for r in self.ranks))
        finally:
            # The run ends (stop, --duration, q): a replay still running is cut short, and what it brought and
            # every live batch held behind it are folded now, not thrown away.
            tasks = []
            for rs in self.ranks:
                task = rs.replay_task
                if task is not None:
                    self._finish_replay(rs, "stopped")
                    task.cancel()
                    tasks.append(task)
            if tasks:
                with contextlib.suppress(Exception, asyncio.CancelledError):
                    await asyncio.gather(*tasks, return_exceptions=True)
            ctx.destroy(linger=0)

    async def _run_rank(self, ctx: Any, rs: RankState) -> None:
        import zmq

        sock = ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.RCVHWM, RCVHWM)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, self.url.topic.encode())
        monitor = sock.get_monitor_socket(zmq.EVENT_DISCONNECTED | zmq.EVENT_HANDSHAKE_SUCCEEDED)
        sock.connect(rs.endpoint)
        self._status(rs, f"subscribed to {rs.endpoint}" + (f" (replay {rs.replay})" if rs.replay else ""))
        try:
            await asyncio.gather(self._read(ctx, rs, sock), self._watch(rs, sock, monitor))
        finally:
            try:
                self._unread(rs, sock)
            finally:
                monitor.close(linger=0)
                sock.close(linger=0)

    def _unread(self, rs: RankState, sock: Any) -> None:
        """The run ends: messages still queued while kvtop was behind the stream are data it never read (lost);
        counted (not decoded) for half a second at most. A message or two that just came is not lag."""
        import zmq

        if rs.last_queue_lag < UNREAD_LAG_S or not sock.getsockopt(_EVENTS) & _POLLIN:
            return
        raw: Any = zmq.Socket.shadow(sock.underlying)
        n = 0
        end = time.monotonic() + 0.5
        with contextlib.suppress(zmq.ZMQError):
            while time.monotonic() < end:
                raw.recv_multipart(zmq.NOBLOCK)
                n += 1
        more = "" if time.monotonic() < end else " or more"
        self._report(rs, "zmq.unread", f"kvtop was {rs.last_queue_lag:.1f} s behind the stream when the run ended: "
                     f"{n:,}{more} message(s) it had received were never read", n=n, lost=True)

    async def _read(self, ctx: Any, rs: RankState, sock: Any) -> None:
        import zmq

        # Woken by the socket's file descriptor (asyncio's reader callback), then read what is queued without
        # waiting, up to READ_BURST. An awaited poll a message cost ~80 us of zmq.asyncio's futures on the dev box,
        # as much as decoding and folding a 50-event batch (bench/bench_zmq_flood.py; BENCHMARKS.md "An attached
        # kvtop beside nvitop"). ZMQ's descriptor is edge-triggered: it says "look", not "a message is there", so
        # every wake-up reads until EAGAIN (_receive), and ZMQ_EVENTS is asked again before sleeping (not before
        # each read: it has ZMQ look at its command pipe, a system call, every time).
        # While messages come, the descriptor is not watched: the reader sleeps GATHER_S and reads what gathered
        # meanwhile, a wake-up per GATHER_S, not per message (a busy engine sends a batch every few ms, and a
        # wake-up cost as much as folding it; unwatched, as the descriptor stays readable until the socket is read
        # and every turn of the loop would call back). A read that finds nothing goes back to the descriptor.
        raw: Any = zmq.Socket.shadow(sock.underlying)
        recv = raw.recv
        loop = asyncio.get_running_loop()
        woken = asyncio.Event()
        fd = raw.getsockopt(zmq.FD)
        loop.add_reader(fd, woken.set)
        watching = True
        try:
            while not self._stop.requested:
                read = 0
                frames = _receive(recv)
                while frames is not None:
                    # the next one is read before this one is handled: none queued behind it is "caught up"
                    read += 1
                    following = _receive(recv) if read < READ_BURST else None
                    self._handle(ctx, rs, frames, following is None and read < READ_BURST)
                    if self._stop.requested:
                        if following is not None:   # read already: folded, not lost
                            self._handle(ctx, rs, following, False)
                        return
                    frames = following
                if read == READ_BURST:
                    await asyncio.sleep(0)   # the other ranks, the replay tasks and the dashboard get their turn
                    continue
                if read and self.gather_s > 0:
                    if watching:
                        loop.remove_reader(fd)
                        watching = False
                    await asyncio.sleep(self.gather_s)
                    rs.wakeups += 1
                    continue
                if not watching:
                    loop.add_reader(fd, woken.set)
                    watching = True
                woken.clear()
                if raw.getsockopt(_EVENTS) & _POLLIN:   # one came between the last read and the clear
                    continue
                wake = loop.call_later(POLL_S, woken.set)   # and at least this often, to notice a stop
                await woken.wait()
                wake.cancel()
                rs.wakeups += 1
        finally:
            if watching:
                with contextlib.suppress(Exception):
                    loop.remove_reader(fd)

    async def _watch(self, rs: RankState, sock: Any, monitor: Any) -> None:
        """The SUB socket's disconnects: a publisher gone, or a connection ZMQ ended (a protocol error, after which
        it does not reconnect by itself): kvtop connects again itself after either."""
        import zmq
        from zmq.utils.monitor import parse_monitor_message

        # Woken by a monitor event or by the stop, not every POLL_S: each wake-up of the process cost ~0.2 ms of
        # CPU on the dev box (bench/JOURNAL.md, "The ZMQ attach at 10,000 events/s, halved")
        stopping = None if self._stop.event is None else asyncio.ensure_future(self._stop.event.wait())
        try:
            while not self._stop.requested:
                if stopping is None:
                    if not await monitor.poll(int(POLL_S * 1000)):
                        continue
                else:
                    polling = asyncio.ensure_future(monitor.poll())
                    await asyncio.wait((polling, stopping), return_when=asyncio.FIRST_COMPLETED)
                    if not polling.done():   # stopped
                        polling.cancel()
                        with contextlib.suppress(asyncio.CancelledError):
                            await polling
                        continue
                    if not polling.result():
                        continue
                try:
                    event = parse_monitor_message(await monitor.recv_multipart())
                except Exception:  # a monitor frame this pyzmq cannot parse: nothing to count
                    continue
                if event.get("event") != _EVENT_DISCONNECTED:
                    if rs.disconnects:  # a handshake: connected again
                        self._status(rs, f"reconnected to {rs.endpoint}")
                    continue
                rs.disconnects += 1
                with contextlib.suppress(zmq.ZMQError):
                    sock.disconnect(rs.endpoint)
                sock.connect(rs.endpoint)
                message = (f"the connection to the publisher dropped ({rs.disconnects:,} so far): the publisher "
                           "went away or ZMQ ended the connection (what it missed shows as a seq gap); reconnecting")
                self._status(rs, f"disconnected: {message}")
                self._report(rs, "zmq.disconnected", message)
        finally:
            if stopping is not None:
                stopping.cancel()

    # ------------------------------------------------------------------------------------------ live batches

    def _handle(self, ctx: Any, rs: RankState, frames: list[bytes], caught_up: bool = True) -> None:
        """One live message. Never waits: a replay runs in its own task, live batches wait behind it (in order,
        at most ``replay_deadline_s``), and the SUB socket keeps being read. ``caught_up``: no other message was
        queued behind this one."""
        size = sum(map(len, frames))
        if size > MAX_MESSAGE_BYTES:   # refused unread: unpacking one cost ~5x its size (the module docstring)
            self._bad(rs, f"a message of {size:,} bytes, over {MAX_MESSAGE_BYTES >> 20} MiB: refused unread "
                          "(its batch is a seq gap)")
            return
        try:
            batch = decode_frames(frames)
        except WireError as exc:
            self._bad(rs, str(exc))
            return
        except Exception as exc:  # a message no rule above foresaw: counted like any bad one, never fatal
            self._bad(rs, f"{type(exc).__name__}: {exc}")
            return
        resync = False
        last = rs.live_seq
        if last is not None and batch.seq - last > MAX_SEQ_JUMP:
            # 2^64-1 once, or a publisher that is not this one: no engine drops 16M batches to a connected
            # subscriber. Skipped as a bad message; if the stream goes on from there (RESYNC_AFTER in a row), it
            # is followed: a new start whose batches in between are unknown.
            rs.jump_run = rs.jump_run + 1 if rs.jump_seq is not None and batch.seq == rs.jump_seq + 1 else 1
            rs.jump_seq = batch.seq
            if rs.jump_run < RESYNC_AFTER:
                self._bad(rs, f"seq jumped from {last:,} to {batch.seq:,}, more than {MAX_SEQ_JUMP:,} batches "
                              "ahead: not this publisher's sequence, skipped")
                return
            resync = True
        if rs.jump_run:
            rs.jump_seq, rs.jump_run = None, 0
        rs.received += 1
        if batch.bad_events:
            self._bad(rs, f"{batch.bad_events} bad events skipped (first: {batch.first_bad})", count=False,
                      kind="zmq.bad_event", n=batch.bad_events)
        if last is not None and batch.seq > last + 1 and not resync:
            rs.gaps += 1
        rs.live_seq = batch.seq
        wall = time.time()
        # How far behind its publisher this batch came: its engine time's offset from this clock, less the offset
        # when kvtop last had nothing more queued (caught up: network and clock skew only). A flood kvtop cannot
        # keep up with never catches up, and the lag grows; an engine clock that steps is rebased at the next lull.
        queue_lag = 0.0
        ts = batch.ts
        if ts is not None:
            off = wall - ts
            base = rs.ts_base
            if base is None or caught_up or off < base:
                rs.ts_base = off
            else:
                queue_lag = off - base
        rs.last_queue_lag = queue_lag
        if rs.replay_task is not None:
            rs.held.append((batch, time.monotonic(), resync, queue_lag))
            if len(rs.held) >= self.hold_max and not rs.replay_task.done():
                rs.replay_cut = "overflow"
                rs.replay_task.cancel()
            return
        expected = rs.next_seq
        start = 0 if expected is None else expected
        if (rs.replay is not None and not resync and batch.seq > start
                and (expected is None or batch.seq > expected)):
            now = time.monotonic()
            if now >= rs.replay_retry_at:
                self._start_replay(ctx, rs, start, deque([(batch, now, False, queue_lag)]), now)
                return
        if batch.seq == expected:  # the common case: next in order
            self._emit(rs, batch, replayed=False, queue_lag=queue_lag, wall=wall)
        else:
            self._step(rs, batch, replayed=False, why="", resync=resync, queue_lag=queue_lag, wall=wall)

    def _step(self, rs: RankState, batch: Batch, *, replayed: bool, why: str, resync: bool = False,
              received_at: float | None = None, behind: int = 0, queue_lag: float = 0.0,
              wall: float | None = None) -> None:
        """Emit ``batch`` as the next in seq order: a gap before it is lost, a seq going back a restart."""
        expected = rs.next_seq
        if resync:
            rs.seq_jumps += 1
            self._report(rs, "zmq.seq_jump", f"seq jumped from {expected or 0:,} to {batch.seq:,} and the stream "
                         "went on from there: followed as a new start (what came in between is unknown)", lost=True)
        elif expected is not None and batch.seq > expected:
            missing = batch.seq - expected
            rs.lost += missing
            if not why:
                why = "no replay endpoint" if rs.replay is None else (
                    "replay not asked: the last one failed, next try in "
                    f"{max(0.0, rs.replay_retry_at - time.monotonic()):.0f} s")
            self._report(rs, "zmq.gap", f"{missing:,} batch(es) of seq {expected}..{batch.seq - 1} lost ({why})",
                         n=missing, lost=True)
        elif expected is not None and batch.seq < expected:
            rs.restarts += 1
            message = f"seq went back {expected - 1:,} -> {batch.seq:,}: publisher restarted, the fold starts again"
            self._status(rs, message)
            self._report(rs, "zmq.restart", message)
        self._emit(rs, batch, replayed=replayed, resync=resync, received_at=received_at, behind=behind,
                   queue_lag=queue_lag, wall=wall)

    # ------------------------------------------------------------------------------------------ replay

    def _start_replay(self, ctx: Any, rs: RankState, start: int, held: deque[tuple[Batch, float, bool, float]],
                      now: float) -> None:
        rs.replays += 1
        rs.replay_start = start
        rs.replay_got = {}
        rs.replay_error = ""
        rs.replay_cut = "stopped"
        rs.replay_asked_at = now
        rs.replay_said = False
        rs.held = held
        task = asyncio.ensure_future(self._replay(ctx, rs, start))
        rs.replay_task = task
        task.add_done_callback(lambda t: self._replay_done(rs, t))

    def _replay_done(self, rs: RankState, task: asyncio.Task[str]) -> None:
        if rs.replay_task is not task:
            return  # merged already (the run ended)
        if task.cancelled():
            outcome = rs.replay_cut
        elif task.exception() is not None:
            rs.replay_error = f"{type(task.exception()).__name__}: {task.exception()}"
            outcome = "failed"
        else:
            outcome = task.result()
        try:
            self._finish_replay(rs, outcome)
        except Exception as exc:  # a callback's exception would only reach asyncio's log: said, never lost silently
            self._report(rs, "zmq.replay", f"folding a replay's batches failed: {type(exc).__name__}: {exc}",
                         lost=True)

    async def _replay(self, ctx: Any, rs: RankState, start: int) -> str:
        """Ask for every batch from ``start``; collect them into ``rs.replay_got`` until the end marker, the
        deadline, or ``replay_idle_s`` of silence. Returns how it ended: complete, silent, timeout, full, failed."""
        import zmq

        assert rs.replay is not None
        # The deadline counts from when the oldest batch held behind it came (a replay asked again for a gap that
        # opened meanwhile has what is left of the first one's): no live batch waits longer than that
        loop = asyncio.get_running_loop()
        oldest = rs.held[0][1] if rs.held else time.monotonic()
        deadline = loop.time() + max(0.0, oldest + self.replay_deadline_s - time.monotonic())
        got = rs.replay_got
        size = 0
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.connect(rs.replay)
            await asyncio.wait_for(sock.send_multipart([b"", start.to_bytes(8, "big")]),
                                   max(0.001, deadline - loop.time()))
            heard = loop.time()  # the last frame (or the request)
            while len(got) < REPLAY_MAX and size < self.replay_max_bytes:
                now = loop.time()
                left = deadline - now
                if left <= 0:
                    return "timeout"
                quiet = self.replay_idle_s - (now - heard)
                if quiet <= 0:
                    return "silent"
                if not rs.replay_said and rs.held and time.monotonic() - rs.held[0][1] >= REPLAY_SAY_S:
                    # A slow replay is said where the stream's status shows (the header, the sources table)
                    rs.replay_said = True
                    self._status(rs, f"replay from seq {start:,}: {len(rs.held):,} live batch(es) wait behind it "
                                     f"({self.replay_deadline_s:g} s at most)")
                if not await sock.poll(max(1, int(min(quiet, left, POLL_S) * 1000))):
                    continue
                heard = loop.time()
                frames = await sock.recv_multipart()
                one = sum(map(len, frames))
                size += one
                if one > MAX_MESSAGE_BYTES:   # refused unread, as a live one is
                    self._bad(rs, f"replay: a message of {one:,} bytes, over {MAX_MESSAGE_BYTES >> 20} MiB: refused "
                                  "unread")
                    continue
                while frames and frames[0] == b"":
                    frames = frames[1:]  # the ROUTER's empty delimiter (and the empty topic of some versions)
                if len(frames) >= 2 and len(frames[-2]) == 8 and int.from_bytes(frames[-2], "big") == _END:
                    return "complete"
                if len(frames) == 1 and len(frames[0]) == 8 and int.from_bytes(frames[0], "big") == _END:
                    return "complete"
                try:
                    batch = decode_frames(frames if len(frames) in (2, 3) else frames[-3:])
                except WireError as exc:
                    if len(frames) < 2 or len(frames[-2]) != 8:
                        return "complete"  # a terminal frame of a newer replay protocol: the answer is over
                    self._bad(rs, f"replay: {exc}")
                    continue
                if batch.seq >= start:
                    got[batch.seq] = batch
            return "full"
        except asyncio.TimeoutError:
            return "timeout"
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # replay is a bonus: a failure leaves a gap the fold counts
            rs.replay_error = f"{type(exc).__name__}: {exc}"
            return "failed"
        finally:
            sock.close(linger=0)

    def _finish_replay(self, rs: RankState, outcome: str) -> None:
        """The replay is over (answered, silent, out of time, failed, cut short): fold what it brought and the
        live batches held behind it, in seq order; what neither has is lost."""
        now = time.monotonic()
        got, held = rs.replay_got, rs.held
        rs.replay_task, rs.replay_got, rs.held = None, {}, deque()
        took = now - rs.replay_asked_at
        if outcome in ("complete", "full"):
            rs.replay_backoff_s = 0.0
            why = "not in the replay buffer"
            if rs.replay_said:
                self._status(rs, f"replay from seq {rs.replay_start:,} done: {len(got):,} batch(es) in {took:.1f} s")
        else:
            rs.replays_failed += 1
            rs.replay_backoff_s = min(max(REPLAY_BACKOFF_S, 2 * rs.replay_backoff_s), REPLAY_BACKOFF_MAX_S)
            rs.replay_retry_at = now + rs.replay_backoff_s
            what = {"timeout": f"ran past its {self.replay_deadline_s:g} s deadline",
                    "silent": f"fell silent after {len(got):,} batch(es) without its end marker" if got
                    else f"did not answer ({self.replay_idle_s:g} s of silence)",
                    "failed": f"failed: {rs.replay_error}",
                    "overflow": f"was given up: {len(held):,} live batches waited behind it",
                    "stopped": "was cut short by the end of the run"}.get(outcome, outcome)
            why = f"replay {what.split(':')[0]}"
            if outcome != "stopped":
                message = (f"replay from {rs.replay} (seq {rs.replay_start:,} on) {what}; {len(got):,} batch(es) "
                           f"came back in {took:.1f} s; the gaps it did not fill are counted lost, and gaps of the "
                           f"next {rs.replay_backoff_s:g} s too, without asking")
                self._report(rs, "zmq.replay", message)
                self._status(rs, message)
        keys = sorted(got)
        i, n = 0, len(keys)
        # The answer holds what the publisher had when it answered: a gap among the held batches past its last
        # batch opened later, and is asked for again (a complete answer only, and only past this one's start)
        cover = keys[-1] if keys else rs.replay_start - 1
        again = outcome == "complete" and self._ctx is not None and not self._stop.requested
        initial = rs.next_seq is None
        filled = 0
        last_seq = -1
        for j, (batch, received_at, resync, queue_lag) in enumerate(held):
            if resync or batch.seq < last_seq:
                i = n  # a new start or a restart: the replayed batches are of the sequence before it
                again = False
            last_seq = batch.seq
            while i < n and keys[i] < batch.seq:
                s = keys[i]
                i += 1
                if rs.next_seq is None or s >= rs.next_seq:
                    self._step(rs, got[s], replayed=True, why=why)
                    filled += 1
            expected = rs.next_seq
            if (again and expected is not None and cover < expected < batch.seq and expected > rs.replay_start
                    and now - received_at < self.replay_deadline_s - self.replay_idle_s / 4):
                rs.filled += filled
                rest = deque(held)
                for _ in range(j):
                    rest.popleft()
                self._start_replay(self._ctx, rs, expected, rest, now)
                return
            late = expected is not None and cover < expected < batch.seq and outcome == "complete"
            self._step(rs, batch, replayed=False, resync=resync, received_at=received_at,
                       why="dropped after the replay's answer, with no time left to ask again" if late else why,
                       behind=len(held) - j - 1, queue_lag=queue_lag)
        rs.filled += filled
        if initial and filled and keys[0] == 0:
            self._status(rs, f"replayed {filled} batches from seq 0: counts are exact")

    # ------------------------------------------------------------------------------------------ records

    def _emit(self, rs: RankState, batch: Batch, *, replayed: bool, resync: bool = False,
              received_at: float | None = None, behind: int = 0, queue_lag: float = 0.0,
              wall: float | None = None) -> None:
        rank = batch.rank if batch.rank is not None else rs.index
        source = self.source_for(rank)
        now = time.time() if wall is None else wall
        if rank not in rs.meta_sent:
            rs.meta_sent.add(rank)
            meta: dict[str, Any] = {"engine": self.engine, "attach": "zmq", "endpoint": rs.endpoint}
            size = next((e.get("block_size") for e in batch.events if e.get("block_size")), None)
            if isinstance(size, int):
                meta["tokens_per_block"] = size
            self.sink(make("meta", meta, source, now))
        rs.next_seq = batch.seq + 1
        data = batch.record_data(replayed)
        if resync:
            data["resync"] = True
        if received_at is not None or queue_lag >= QUEUE_LAG_MIN_S:
            # The lag: how far behind its publisher this live batch came (queue_lag, see _handle), plus how long it
            # waited behind a replay; and how many more wait after it
            waited = 0.0 if received_at is None else time.monotonic() - received_at
            lag = round(max(0.0, waited + queue_lag), 3)
            data["lag_s"] = lag
            data["behind"] = behind
            rs.max_lag_s = max(rs.max_lag_s, lag)
            rs.max_behind = max(rs.max_behind, behind)
        self.sink(Record(kind="kv_batch", data=data, source=source, time=now))

    def _report(self, rs: RankState, kind: str, message: str, *, n: int = 1, lost: bool = False) -> None:
        if self.problems is not None:
            self.problems.report(kind, f"{rs.endpoint}: {message}", count=n, lost=lost)

    def _bad(self, rs: RankState, message: str, count: bool = True, *, kind: str = "zmq.bad_message",
             n: int = 1, lost: bool = True) -> None:
        if count:
            rs.bad += 1
        message = clean(message, 300)
        rs.last_error = message
        if self.problems is not None:
            self.problems.report(kind, f"{rs.endpoint}: {message}", count=n, lost=lost)
        now = time.monotonic()
        if self.on_error is not None and now - self._last_report >= ERROR_REPORT_S:
            self._last_report = now
            total = f" ({rs.bad} bad messages so far)" if rs.bad else ""
            self.on_error(f"zmq {rs.endpoint}", message + total)

    def _status(self, rs: RankState, message: str) -> None:
        if self.on_status is not None:
            self.on_status(f"zmq {rs.endpoint}", message)

    def stats(self) -> list[dict[str, Any]]:
        now = time.monotonic()
        return [{"endpoint": r.endpoint, "replay": r.replay, "received": r.received, "bad": r.bad, "gaps": r.gaps,
                 "replayed": r.filled, "lost": r.lost, "restarts": r.restarts, "seq_jumps": r.seq_jumps,
                 "disconnects": r.disconnects,
                 "replays": r.replays, "replays_failed": r.replays_failed,
                 "behind": len(r.held), "behind_s": round(now - r.held[0][1], 3) if r.held else 0.0,
                 "max_lag_s": r.max_lag_s, "max_behind": r.max_behind, "last_error": r.last_error}
                for r in self.ranks]


def attach_stream(session: Any, target: str, *, run: str | None = None, interval_s: float = 1.0) -> None:
    """Wire ``target`` (a ``zmq://``, ``vllm://`` or ``sglang://`` URL) into ``session``: the stream, and the metrics
    pages beside it. Raises :class:`ZmqUrlError` for a URL kvtop cannot use."""
    from kvtop.sources.engine_metrics import MetricsPoller, discover_events

    url = parse_stream_url(target, discover=discover_events)
    problems = getattr(session, "problems", None)
    src = ZmqKvEventSource(url, session.emit, run=run, on_status=session.on_source_status,
                           on_error=session.on_source_error, problems=problems)
    session.meta["attached_to"] = url.display()
    session.meta["stream"] = {"events": list(url.events), "replay": [r for r in url.replay if r],
                              "metrics": list(url.metrics)}
    session.add_producer("zmq", src.run, src.stop)
    if url.metrics:
        poller = MetricsPoller(list(url.metrics), session.emit, src.source_for, ranks=len(url.events),
                               interval_s=interval_s, on_status=session.on_source_status,
                               on_error=session.on_source_error, problems=problems)
        session.add_producer("metrics", poller.run, poller.stop)
    session.note("info", f"{url.display()}: an engine announces nothing it cached before kvtop attached; block "
                         "counts are since attach unless replay reaches seq 0")
    session.zmq_source = src  # for the headless summary's per-endpoint counts
