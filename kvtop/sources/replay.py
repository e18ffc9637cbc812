"""Replay a recording: the records of a JSONL file, paced by their own times.

``speed=1.0`` replays in real time, ``2.0`` twice as fast, ``0`` as fast as possible. Pacing follows record
times: record *i* is yielded ``(t_i - t_0) / speed`` seconds after the first. Records whose time goes backwards
(several sources interleaved, a clock step) are yielded at once, never waited for; ``max_gap_s`` caps a long
idle stretch (an overnight recording need not make you wait the night).

A bad line (truncated by a crash, edited by hand, from a newer kvtop) is handed to ``on_error`` as the
:class:`~kvtop.records.RecordError` naming its line number, and skipped: one bad line never ends a replay.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import AsyncIterator, Callable

from kvtop.records import MAX_LINE_BYTES, Record, RecordError, read_jsonl

# Yield to the event loop every 256 records at speed 0: a 1 GB recording must not freeze a dashboard that shares
# the loop (256 records decode in ~2 ms).
YIELD_EVERY = 256
BURST_S = 0.05
# Records that came due together are handed over in batches of at most this many (``replay_batches``): one
# generator step and one sink call a batch, not a record, and one clock reading a burst (the replay loop's own
# cost 0.49 -> 0.35 us a record, bench/bench_emit.py). A batch's first record waits for the rest of it to be read:
# 64 records decode in ~1 ms on the dev box.
BATCH_MAX = 64


async def replay_batches(path: str | os.PathLike[str], speed: float = 1.0, *,
                         on_error: Callable[[RecordError], None] | None = None, max_gap_s: float | None = None,
                         max_line_bytes: int = MAX_LINE_BYTES) -> AsyncIterator[list[Record]]:
    """The records of ``path`` in the lists that come due together, in order, each as soon as it is read whole
    (at most ``BATCH_MAX`` records, never one before it is due). Raises ``OSError`` only if the file cannot be
    opened at all."""
    if speed < 0:
        raise ValueError(f"speed must be >= 0 (0 = as fast as possible), got {speed}")
    clock = time.monotonic
    t0: float | None = None  # the recording's time of the pacing origin
    w0 = 0.0  # the wall (monotonic) time that origin maps to
    # A reading of the clock, never later than the real time: a record due by it is due now. Read afresh only for
    # a record that is not due by it (and after each sleep), so a burst costs one reading, not one a record.
    now = 0.0
    since_yield = 0
    batch: list[Record] = []
    for item in read_jsonl(path, max_line_bytes=max_line_bytes):
        if isinstance(item, RecordError):
            if batch:  # the records before the bad line are handed over before it is reported
                yield batch
                batch = []
            if on_error is not None:
                on_error(item)
            continue
        if speed > 0:
            if t0 is None:
                now = clock()
                t0, w0 = item.time, now
            delay = w0 + (item.time - t0) / speed - now
            if delay > 0:
                now = clock()
                delay = w0 + (item.time - t0) / speed - now
                if max_gap_s is not None and delay > max_gap_s:
                    # Shift the origin so the idle stretch lasts max_gap_s and the pacing after it stays true.
                    w0 -= delay - max_gap_s
                    delay = max_gap_s
                if delay > 0:
                    # Sleep at least 50 ms, then send everything that came due meanwhile in one burst: one wake-up
                    # per burst instead of one per record (a busy recording holds ~1,000 records/s, and 1,000
                    # wake-ups/s cost a dashboard ~0.5% of a core). A record is never early, and at most 50 ms
                    # late (plus the reading of the rest of its batch).
                    if batch:
                        yield batch
                        batch = []
                    await asyncio.sleep(max(delay, BURST_S))
                    now = clock()
                    since_yield = 0
        batch.append(item)
        since_yield += 1
        if since_yield >= YIELD_EVERY:
            since_yield = 0
            yield batch
            batch = []
            await asyncio.sleep(0)
        elif len(batch) >= BATCH_MAX:
            yield batch
            batch = []
    if batch:
        yield batch


async def replay(path: str | os.PathLike[str], speed: float = 1.0, *,
                 on_error: Callable[[RecordError], None] | None = None,
                 max_gap_s: float | None = None, max_line_bytes: int = MAX_LINE_BYTES) -> AsyncIterator[Record]:
    """Yield the records of ``path``, paced as ``replay_batches`` paces them. Raises ``OSError`` only if the file
    cannot be opened at all."""
    async for batch in replay_batches(path, speed, on_error=on_error, max_gap_s=max_gap_s,
                                      max_line_bytes=max_line_bytes):
        for item in batch:
            yield item


async def replay_into(path: str | os.PathLike[str], sink: Callable[[Record], None], speed: float = 1.0, *,
                      on_error: Callable[[RecordError], None] | None = None,
                      max_gap_s: float | None = None, max_line_bytes: int = MAX_LINE_BYTES,
                      sink_many: Callable[[list[Record]], None] | None = None) -> int:
    """Replay ``path`` into ``sink`` (a producer for a session); returns the number of records replayed.
    ``sink_many``: takes each batch of due records in one call instead (``Session.emit_many``), the same as
    ``sink`` on each of them in turn."""
    n = 0
    async for batch in replay_batches(path, speed, on_error=on_error, max_gap_s=max_gap_s,
                                      max_line_bytes=max_line_bytes):
        if sink_many is not None:
            sink_many(batch)
        else:
            for rec in batch:
                sink(rec)
        n += len(batch)
    return n


__all__ = ["replay", "replay_batches", "replay_into"]
