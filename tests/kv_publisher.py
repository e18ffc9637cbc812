"""A KV event publisher for tests, written from the documented wire format (not from any engine's code).

vLLM 0.33 ``vllm/distributed/kv_events.py`` / SGLang 0.5.23 ``sglang/srt/disaggregation/kv_events.py`` /
Dynamo ``docs/integrations/kv-events-custom-engines.md`` (shared/engines-kv-events.md section 1.1):

- live: a PUB socket sends ``[topic, seq (8 bytes big-endian), msgpack([ts, [events], dp_rank])]``;
- replay: a ROUTER socket answers ``[client, b"", start seq (8 bytes)]`` with ``[client, b"", topic, seq, payload]``
  for every buffered batch with ``seq >= start``, then ``[client, b"", b"", (-1) as 8 signed bytes, b""]``;
- events are maps with ``type`` (vLLM since PR #42892, SGLang) or positional arrays (older vLLM).

Both sockets bind 127.0.0.1 on free ports (the engines bind; kvtop connects).
"""

from __future__ import annotations

import threading
import time
from typing import Any

import msgpack
import zmq

from kvtop.records import Record, SourceId
from kvtop.sources.kv_wire import decode_payload

END_SEQ = (-1).to_bytes(8, "big", signed=True)


def stored(hashes: list[int], *, parent: int | None = None, medium: str | None = "GPU", block_size: int = 16,
           tokens: int = 16, array: bool = False, **extra: Any) -> Any:
    """A BlockStored event as vLLM 0.33 encodes it (fields without defaults always present, even as None)."""
    token_ids = list(range(1000, 1000 + tokens * len(hashes)))
    if array:
        return ["BlockStored", hashes, parent, token_ids, block_size, None, medium, None]
    ev = {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": parent, "token_ids": token_ids,
          "block_size": block_size, "lora_id": None, "medium": medium, "lora_name": None}
    ev.update(extra)
    return ev


def removed(hashes: list[int], *, medium: str | None = "GPU", array: bool = False, **extra: Any) -> Any:
    if array:
        return ["BlockRemoved", hashes, medium]
    ev = {"type": "BlockRemoved", "block_hashes": hashes, "medium": medium}
    ev.update(extra)
    return ev


def cleared(array: bool = False) -> Any:
    return ["AllBlocksCleared"] if array else {"type": "AllBlocksCleared"}


def payload(events: list[Any], rank: int | None = 0, ts: float | None = None) -> bytes:
    return msgpack.packb([time.time() if ts is None else ts, events, rank], use_bin_type=True)


class Publisher:
    """PUB on 127.0.0.1 (and a ROUTER replay endpoint serving the last ``buffer`` batches)."""

    def __init__(self, topic: bytes = b"kv-events", replay: bool = True, buffer: int = 10_000,
                 replay_drip_s: float = 0.0, replay_silent: bool = False, replay_delay_s: float = 0.0):
        """``replay_drip_s``: the replay endpoint sends one batch every this many seconds (a hostile or stuck
        engine); ``replay_silent``: it takes requests and never answers; ``replay_delay_s``: it answers with what
        it had when asked, this long after."""
        self.ctx = zmq.Context()
        # XPUB, not PUB: it sends the same frames and hands each new subscription over, so a test can wait for the
        # subscriber to have joined (wait_subscribed) instead of sleeping a guessed time for ZMQ's slow joiner
        # (fixed sleeps of 0.3-1.5 s lost the first batches when a loaded machine started kvtop late).
        self.pub = self.ctx.socket(zmq.XPUB)
        self.pub.setsockopt(zmq.LINGER, 0)
        self.pub.setsockopt(zmq.XPUB_VERBOSE, 1)  # every subscription, a reconnected subscriber's too
        self._subscribed = False
        self.port = self.pub.bind_to_random_port("tcp://127.0.0.1")
        self.topic = topic
        self.buffer: list[tuple[int, bytes]] = []
        self.buffer_max = buffer
        self.seq = 0
        self.replay_requests = 0
        self.replay_sent = 0  # batches the replay endpoint has sent
        self.replay_drip_s = replay_drip_s
        self.replay_silent = replay_silent
        self.replay_delay_s = replay_delay_s
        self.replay_port: int | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if replay:
            self.router = self.ctx.socket(zmq.ROUTER)
            self.router.setsockopt(zmq.LINGER, 0)
            self.replay_port = self.router.bind_to_random_port("tcp://127.0.0.1")
            self._thread = threading.Thread(target=self._serve, daemon=True)
            self._thread.start()

    @property
    def url(self) -> str:
        url = f"zmq://127.0.0.1:{self.port}"
        return url + (f"?replay=tcp://127.0.0.1:{self.replay_port}" if self.replay_port else "")

    def wait_subscribed(self, timeout: float = 30.0) -> None:
        """Block until a subscriber's subscription has reached this socket: batches sent after it are delivered."""
        if self._subscribed:
            return
        if not self.pub.poll(int(timeout * 1000), zmq.POLLIN):
            raise TimeoutError(f"no subscriber joined tcp://127.0.0.1:{self.port} within {timeout} s")
        self.pub.recv()
        self._subscribed = True

    def send(self, events: list[Any], *, rank: int | None = 0, drop: bool = False, seq: int | None = None,
             ts: float | None = None) -> int:
        """Publish one batch (``drop``: only into the replay buffer, as if ZMQ had dropped it on the way; ``ts``:
        the engine's time of the batch, else now)."""
        s = self.seq if seq is None else seq
        self.seq = s + 1
        body = payload(events, rank, ts)
        self._buffer(s, body)
        if not drop:
            self.pub.send_multipart([self.topic, s.to_bytes(8, "big"), body])
        return s

    def send_raw(self, frames: list[bytes]) -> None:
        self.pub.send_multipart(frames)

    def _buffer(self, seq: int, body: bytes) -> None:
        self.buffer.append((seq, body))
        del self.buffer[:-self.buffer_max]

    def _serve(self) -> None:
        poller = zmq.Poller()
        poller.register(self.router, zmq.POLLIN)
        while not self._stop.is_set():
            if not poller.poll(50):
                continue
            frames = self.router.recv_multipart()
            client, start = frames[0], int.from_bytes(frames[-1], "big")
            self.replay_requests += 1
            if self.replay_silent:
                continue
            buffered = list(self.buffer)
            if self.replay_delay_s and self._stop.wait(self.replay_delay_s):
                return
            for seq, body in buffered:
                if seq >= start:
                    if self.replay_drip_s and self._stop.wait(self.replay_drip_s):
                        return
                    self.router.send_multipart([client, b"", self.topic, seq.to_bytes(8, "big"), body])
                    self.replay_sent += 1
            self.router.send_multipart([client, b"", b"", END_SEQ, b""])

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=2)
        self.ctx.destroy(linger=0)


# A decoded batch as a kv_batch Record of one source (the tests that fold events without a socket).
SRC = SourceId("127.0.0.1:5557", 0, "t")


def batch(seq: int, events: list, t: float = 100.0, **extra) -> Record:
    b = decode_payload(payload(events))
    return Record(kind="kv_batch", data={**b.record_data(), "seq": seq, **extra}, source=SRC, time=t)
