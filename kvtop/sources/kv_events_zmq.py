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
7.1). Each message is decoded (kvtop/kv_stream.py) into one ``kv_batch`` record; a message that is not a batch is
counted (``bad``), reported once per 5 s through ``on_error`` and skipped: never fatal.

Sequence gaps: ``seq`` is per publisher. A gap (messages dropped by ZMQ's high-water mark, a slow joiner's first
messages) is filled from the replay endpoint when there is one: a DEALER socket sends ``[b"", start seq]`` and
reads every buffered batch back until the end marker (seq -1) or ``REPLAY_IDLE_S`` of silence. (A REQ socket gets
only the first batch of the answer: vLLM PR #45177 switched vLLM's own test to DEALER for this.) On the first
message, kvtop asks replay for everything from seq 0: if the engine's buffer (10,000 steps by default) still holds
it, the fold starts exact instead of "since attach". Whatever replay cannot fill is left as a gap the fold counts.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, urlsplit

from kvtop.kv_stream import Batch, WireError, decode_frames
from kvtop.problems import Problems
from kvtop.records import Record, SourceId, make
from kvtop.stopsignal import StopSignal
from kvtop.textsafe import clean

Sink = Callable[[Record], None]
Callback = Callable[[str, str], None]

DEFAULT_EVENTS_PORT = 5557  # vLLM's and SGLang's default endpoint tcp://*:5557
REPLAY_IDLE_S = 1.0   # a replay answer that falls silent this long is over (the end marker was lost)
REPLAY_MAX = 20_000   # batches read from one replay answer at most (vLLM buffers 10,000 by default)
POLL_S = 0.25         # the receive loop wakes this often to notice a stop
RCVHWM = 100_000      # messages a SUB queues before ZMQ drops: ~30-100 batches/s per GPU leaves minutes
ERROR_REPORT_S = 5.0
_END = (1 << 64) - 1  # the replay end marker: (-1).to_bytes(8, "big", signed=True)


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
    next_seq: int | None = None
    received: int = 0
    bad: int = 0
    gaps: int = 0
    filled: int = 0       # batches replay brought back
    lost: int = 0         # batches neither live nor replayed
    restarts: int = 0
    last_error: str | None = None
    meta_sent: set[int] = field(default_factory=set)


class ZmqKvEventSource:
    """Subscribes to every rank of ``url`` and emits ``kv_batch`` records (see the module doc)."""

    def __init__(self, url: StreamUrl, sink: Sink, *, run: str | None = None, engine: str | None = None,
                 on_status: Callback | None = None, on_error: Callback | None = None,
                 replay_idle_s: float = REPLAY_IDLE_S, problems: Problems | None = None):
        self.url = url
        self.sink = sink
        self.run_name = run or ""
        self.engine = engine or ("vllm-format" if url.scheme == "zmq" else url.scheme)
        self.on_status = on_status
        self.on_error = on_error
        self.replay_idle_s = replay_idle_s
        # Every mode reads it (kvtop/problems.py): bad messages and unfilled gaps are lost data (exit status 4)
        self.problems = problems
        self.ranks = [RankState(ep, rp, i) for i, (ep, rp) in enumerate(zip(url.events, url.replay))]
        self._stop = StopSignal()
        self._last_report = 0.0

    def source_for(self, rank: int) -> SourceId:
        """The source of a rank: ``HOST:PORT`` of the URL, the data-parallel rank, the run."""
        return SourceId(host=f"{self.url.host}:{self.url.port}", rank=rank, run=self.run_name)

    def stop(self) -> None:
        self._stop.stop()

    @property
    def bad(self) -> int:
        return sum(r.bad for r in self.ranks)

    async def run(self) -> None:
        import zmq
        import zmq.asyncio

        self._stop.bind()
        ctx = zmq.asyncio.Context()
        try:
            await asyncio.gather(*(self._run_rank(ctx, r) for r in self.ranks))
        finally:
            ctx.destroy(linger=0)

    async def _run_rank(self, ctx: Any, rs: RankState) -> None:
        import zmq

        sock = ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.RCVHWM, RCVHWM)
        sock.setsockopt(zmq.LINGER, 0)
        sock.setsockopt(zmq.SUBSCRIBE, self.url.topic.encode())
        sock.connect(rs.endpoint)
        self._status(rs, f"subscribed to {rs.endpoint}" + (f" (replay {rs.replay})" if rs.replay else ""))
        try:
            while not self._stop.requested:
                if not await sock.poll(int(POLL_S * 1000)):
                    continue
                frames = await sock.recv_multipart()
                await self._handle(ctx, rs, frames)
        finally:
            sock.close(linger=0)

    async def _handle(self, ctx: Any, rs: RankState, frames: list[bytes]) -> None:
        try:
            batch = decode_frames(frames)
        except WireError as exc:
            self._bad(rs, str(exc))
            return
        except Exception as exc:  # a message no rule above foresaw: counted like any bad one, never fatal
            self._bad(rs, f"{type(exc).__name__}: {exc}")
            return
        rs.received += 1
        if batch.bad_events:
            self._bad(rs, f"{batch.bad_events} bad events skipped (first: {batch.first_bad})", count=False,
                      kind="zmq.bad_event", n=batch.bad_events)
        expected = rs.next_seq
        if expected is None or batch.seq > expected:
            start = 0 if expected is None else expected
            if batch.seq > start:
                if expected is not None:
                    rs.gaps += 1
                got = await self._replay(ctx, rs, start, batch.seq) if rs.replay else 0
                if expected is not None:
                    missing = batch.seq - start - got
                    rs.lost += missing
                    if missing and self.problems is not None:
                        self.problems.report("zmq.gap", f"{rs.endpoint}: {missing:,} batch(es) of seq {start}.."
                                             f"{batch.seq - 1} lost" + (" (not in the replay buffer)" if rs.replay
                                                                         else " (no replay endpoint)"),
                                             count=missing, lost=True)
        elif batch.seq < expected:
            rs.restarts += 1
            self._status(rs, f"seq went back {expected - 1} -> {batch.seq}: publisher restarted")
        self._emit(rs, batch, replayed=False)

    async def _replay(self, ctx: Any, rs: RankState, start: int, upto: int) -> int:
        """Batches ``start <= seq < upto`` from the replay endpoint, emitted in order; how many came."""
        import zmq

        assert rs.replay is not None
        got: dict[int, Batch] = {}
        sock = ctx.socket(zmq.DEALER)
        sock.setsockopt(zmq.LINGER, 0)
        try:
            sock.connect(rs.replay)
            await sock.send_multipart([b"", start.to_bytes(8, "big")])
            for _ in range(REPLAY_MAX):
                if not await sock.poll(int(self.replay_idle_s * 1000)):
                    break
                frames = await sock.recv_multipart()
                while frames and frames[0] == b"":
                    frames = frames[1:]  # the ROUTER's empty delimiter (and the empty topic of some versions)
                if len(frames) >= 2 and len(frames[-2]) == 8 and int.from_bytes(frames[-2], "big") == _END:
                    break
                if len(frames) == 1 and len(frames[0]) == 8 and int.from_bytes(frames[0], "big") == _END:
                    break
                try:
                    batch = decode_frames(frames if len(frames) in (2, 3) else frames[-3:])
                except WireError as exc:
                    if len(frames) < 2 or len(frames[-2]) != 8:
                        break  # a terminal frame of a newer replay protocol: the answer is over
                    self._bad(rs, f"replay: {exc}")
                    continue
                if start <= batch.seq < upto:
                    got[batch.seq] = batch
        except Exception as exc:  # replay is a bonus: a failure leaves a gap the fold counts
            self._bad(rs, f"replay from {rs.replay} failed: {type(exc).__name__}: {exc}", count=False,
                      kind="zmq.replay", lost=False)
        finally:
            sock.close(linger=0)
        for seq in sorted(got):
            self._emit(rs, got[seq], replayed=True)
        rs.filled += len(got)
        if got and start == 0 and min(got) == 0:
            self._status(rs, f"replayed {len(got)} batches from seq 0: counts are exact")
        return len(got)

    def _emit(self, rs: RankState, batch: Batch, *, replayed: bool) -> None:
        rank = batch.rank if batch.rank is not None else rs.index
        source = self.source_for(rank)
        now = time.time()
        if rank not in rs.meta_sent:
            rs.meta_sent.add(rank)
            meta: dict[str, Any] = {"engine": self.engine, "attach": "zmq", "endpoint": rs.endpoint}
            size = next((e.get("block_size") for e in batch.events if e.get("block_size")), None)
            if isinstance(size, int):
                meta["tokens_per_block"] = size
            self.sink(make("meta", meta, source, now))
        if not replayed or rs.next_seq is None or batch.seq + 1 > rs.next_seq:
            rs.next_seq = batch.seq + 1  # a live batch sets it even backwards (a restarted publisher)
        self.sink(Record(kind="kv_batch", data=batch.record_data(replayed), source=source, time=now))

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
        return [{"endpoint": r.endpoint, "replay": r.replay, "received": r.received, "bad": r.bad, "gaps": r.gaps,
                 "replayed": r.filled, "lost": r.lost, "restarts": r.restarts, "last_error": r.last_error}
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
