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


async def replay(path: str | os.PathLike[str], speed: float = 1.0, *,
                 on_error: Callable[[RecordError], None] | None = None,
                 max_gap_s: float | None = None, max_line_bytes: int = MAX_LINE_BYTES) -> AsyncIterator[Record]:
    """Yield the records of ``path``. Raises ``OSError`` only if the file cannot be opened at all."""
    if speed < 0:
        raise ValueError(f"speed must be >= 0 (0 = as fast as possible), got {speed}")
    t0: float | None = None  # the recording's time of the pacing origin
    w0 = 0.0  # the wall (monotonic) time that origin maps to
    since_yield = 0
    for item in read_jsonl(path, max_line_bytes=max_line_bytes):
        if isinstance(item, RecordError):
            if on_error is not None:
                on_error(item)
            continue
        if speed > 0:
            now = time.monotonic()
            if t0 is None:
                t0, w0 = item.time, now
            delay = w0 + (item.time - t0) / speed - now
            if max_gap_s is not None and delay > max_gap_s:
                # Shift the origin so the idle stretch lasts max_gap_s and the pacing after it stays true.
                w0 -= delay - max_gap_s
                delay = max_gap_s
            if delay > 0:
                # Sleep at least 50 ms, then send everything that came due meanwhile in one burst: one wake-up per
                # burst instead of one per record (a busy recording holds ~1,000 records/s, and 1,000 wake-ups/s
                # cost a dashboard ~0.5% of a core). A record is never early, and at most 50 ms late.
                await asyncio.sleep(max(delay, BURST_S))
                since_yield = 0
        since_yield += 1
        if since_yield >= YIELD_EVERY:
            since_yield = 0
            await asyncio.sleep(0)
        yield item


async def replay_into(path: str | os.PathLike[str], sink: Callable[[Record], None], speed: float = 1.0, *,
                      on_error: Callable[[RecordError], None] | None = None,
                      max_gap_s: float | None = None, max_line_bytes: int = MAX_LINE_BYTES) -> int:
    """Replay ``path`` into ``sink`` (a producer for a session); returns the number of records replayed."""
    n = 0
    async for rec in replay(path, speed, on_error=on_error, max_gap_s=max_gap_s, max_line_bytes=max_line_bytes):
        sink(rec)
        n += 1
    return n


__all__ = ["replay", "replay_into"]
