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
import contextlib
import math
import os
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

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




# ------------------------------------------------------------------------------------------------ the player

# The speeds + and - step through during a replay (0: as fast as it can, past the last).
SPEEDS = (0.25, 0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 0.0)
SEEK_S = 5.0   # left / right
STEP_S = 1.0   # one step while paused
TAIL_READ = (64 << 10, 1 << 20, MAX_LINE_BYTES + 1)  # bytes read off the end of a recording for its last time


def recording_end(path: str | os.PathLike[str]) -> float | None:
    """The time of the last whole record of ``path`` (its last line that parses; a recorder's batch line by its
    last event), read off the end of the file without reading the rest; None if none is found there."""
    import json

    try:
        with open(path, "rb") as fh:
            size = fh.seek(0, os.SEEK_END)
            for n in TAIL_READ:
                fh.seek(max(0, size - n))
                chunk = fh.read(n)
                lines = chunk.split(b"\n")
                if size > n:
                    lines = lines[1:]   # the first is cut
                for raw in reversed(lines):
                    if not raw.strip():
                        continue
                    try:
                        obj = json.loads(raw)
                        data = obj.get("data")
                        times = data.get("times") if isinstance(data, dict) else None
                        t = max(times) if isinstance(times, list) and times else obj["time"]
                        return float(t) if isinstance(t, int | float) and math.isfinite(t) else None
                    except (ValueError, TypeError, KeyError, AttributeError):
                        continue
                if size <= n:
                    return None
    except OSError:
        return None
    return None


def speed_text(speed: float) -> str:
    """x4, x0.25, max (0: as fast as it can)."""
    return "max" if speed == 0 else f"x{speed:g}"


class ReplayPlayer:
    """A recording played into a session as a player plays a file: pause, step, seek and speed, on its own clock.

    ``run()`` is the session's producer. Records go to ``emit_many`` (``Session.emit_many``) when their time comes,
    paced as ``replay_batches`` paces them (``speed`` 0: as fast as it can); the commands (``toggle_pause``,
    ``step``, ``seek``, ``seek_to``, ``faster``, ``slower``) take effect at once, from the same event loop.

    Position is recording time since its first record. Seeking forward folds the records up to the target as fast
    as it can; seeking back calls ``restart`` (the session forgets its fold: ``Session.reset_fold``), reads the file
    again from its start and folds up to the target. Every record reaches the sinks once: the ones a seek back
    folds again go to ``refold_many`` (the fold alone: ``Session.fold_many``), and a bad line is reported once.

    ``hold_at_end``: at the recording's end the player waits for a seek (the dashboard) instead of returning (a
    headless summary). ``generation`` counts the restarts, so that a reader of the fold knows it was rebuilt.
    """

    def __init__(self, path: str | os.PathLike[str], emit_many: Callable[[list[Record]], None], *,
                 speed: float = 1.0, on_error: Callable[[RecordError], None] | None = None,
                 max_gap_s: float | None = None, max_line_bytes: int = MAX_LINE_BYTES,
                 restart: Callable[[], None] | None = None,
                 refold_many: Callable[[list[Record]], None] | None = None,
                 on_end: Callable[[int], None] | None = None, hold_at_end: bool = False,
                 clock: Callable[[], float] = time.monotonic):
        if speed < 0 or speed != speed:
            raise ValueError(f"speed must be >= 0 (0 = as fast as possible), got {speed}")
        self.path = path
        self.speed = float(speed)
        self.max_gap_s = max_gap_s
        self.max_line_bytes = max_line_bytes
        self.hold_at_end = hold_at_end
        self._emit_many = emit_many
        self._refold_many = refold_many if refold_many is not None else emit_many
        self._restart_fold = restart
        self._on_error = on_error
        self._on_end = on_end
        self.clock = clock   # the pacing's clock (a test's may be set)
        self.paused = False
        self.at_end = False
        self.seeking = False
        self.generation = 0          # restarts of the fold (seeks back)
        self.records = 0             # records folded since the fold's start (the position's)
        self.first_time: float | None = None   # the recording's first record's time: position 0
        self._last_time = recording_end(path)  # the recording's end, read off its tail (None: not found there)
        self._pos = 0.0              # recording seconds up to which every record was handed over
        self._target: float | None = None      # a seek asked for, not yet done
        self._anchor: tuple[float, float] | None = None  # (recording time, clock time) the pacing runs from
        self._items: Any = None      # the file's reader (read_jsonl)
        self._index = 0              # items (records and bad lines) read by this pass over the file
        self._high_water = 0         # items any pass read: those below it reached the sinks (or on_error) once
        self._pending: Record | None = None   # read, not yet due
        self._pending_index = 0
        self._wake = asyncio.Event()
        self._stopped = False

    # -- what a screen shows

    @property
    def length_s(self) -> float | None:
        """The recording's length: its last record's time less its first (None before the first is read)."""
        if self.first_time is None or self._last_time is None:
            return None
        return max(0.0, self._last_time - self.first_time)

    @property
    def position_s(self) -> float:
        """Where the replay is, in recording seconds since its first record (a seek asked for: its target)."""
        if self._target is not None:
            return self._target
        pos = self._pos
        if self.paused or self.at_end or self.speed == 0 or self._anchor is None or self.first_time is None:
            return pos
        ta, wa = self._anchor
        paced = ta + (self.clock() - wa) * self.speed - self.first_time
        if self._pending is not None:   # never past the next record: it is on its way
            paced = min(paced, self._pending.time - self.first_time)
        return max(pos, paced)

    # -- commands (from the screen, on the loop that runs ``run``)

    def toggle_pause(self) -> bool:
        """Pause or play; returns whether it is paused now."""
        if self.paused:
            self.paused = False
            self._anchor = None   # the pacing starts again from where it stands
        else:
            self._pos = self.position_s
            self.paused = True
        self._wake.set()
        return self.paused

    def seek_to(self, target_s: float) -> float:
        """Go to ``target_s`` recording seconds (clamped to the recording); returns the target."""
        length = self.length_s
        target = max(0.0, float(target_s))
        if length is not None:
            target = min(target, length)
        self._target = target
        self._wake.set()
        return target

    def seek(self, delta_s: float) -> float:
        return self.seek_to(self.position_s + delta_s)

    def step(self, delta_s: float = STEP_S) -> float:
        """Pause (if playing) and go ``delta_s`` on."""
        if not self.paused:
            self.toggle_pause()
        return self.seek(delta_s)

    def set_speed(self, speed: float) -> float:
        if speed < 0 or speed != speed:
            raise ValueError(f"speed must be >= 0 (0 = as fast as possible), got {speed}")
        if not self.paused:
            self._pos = self.position_s
        self.speed = float(speed)
        self._anchor = None
        self._wake.set()
        return self.speed

    def faster(self) -> float:
        """The next speed up SPEEDS (x64 -> as fast as it can, which stays)."""
        ladder = [s for s in SPEEDS if s > 0]
        if self.speed == 0:
            return self.speed
        up = [s for s in ladder if s > self.speed]
        return self.set_speed(up[0] if up else 0.0)

    def slower(self) -> float:
        ladder = [s for s in SPEEDS if s > 0]
        if self.speed == 0:
            return self.set_speed(ladder[-1])
        down = [s for s in ladder if s < self.speed]
        return self.set_speed(down[-1] if down else ladder[0])

    def stop(self) -> None:
        self._stopped = True
        self._wake.set()

    # -- the producer

    def _open(self) -> None:
        self._items = iter(read_jsonl(self.path, max_line_bytes=self.max_line_bytes))
        self._index = 0
        self._pending = None

    def _admit(self, item: Record | RecordError) -> None:
        """An item just read off the file: a record becomes the pending one; a bad line is reported (once over
        all passes)."""
        index = self._index
        self._index += 1
        if isinstance(item, RecordError):
            if index >= self._high_water:
                self._high_water = index + 1
                if self._on_error is not None:
                    self._on_error(item)
            return
        if self.first_time is None:
            self.first_time = item.time
        if self._last_time is None or item.time > self._last_time:
            self._last_time = item.time
        self._pending, self._pending_index = item, index

    def _peek(self) -> Record | None:
        """The next record of the file (read, not handed over), None at its end."""
        while self._pending is None:
            item = next(self._items, None)
            if item is None:
                return None
            self._admit(item)
        return self._pending

    def _hand_over(self, batch: list[Record], first_index: int) -> None:
        """Fold ``batch`` (read from item ``first_index`` on): what an earlier pass handed the sinks, to the fold
        alone."""
        old = min(len(batch), max(0, self._high_water - first_index))
        if old:
            self._refold_many(batch[:old])
        if old < len(batch):
            self._emit_many(batch[old:] if old else batch)
        self._high_water = max(self._high_water, first_index + len(batch))
        self.records += len(batch)

    def _take(self, limit_time: float | None, batch_max: int) -> tuple[list[Record], int]:
        """Up to ``batch_max`` records in file order whose time is at most ``limit_time`` (None: any), stopping at
        the first that is later; with the index of the first. The loop keeps a record it reads without a call
        of ``_peek`` each (a bad line or the file's end goes through it): the player at full speed costs ~8% more
        CPU than ``replay_into`` (3.57-3.67 s against 3.32-3.37 s for the 240,267 records of a 20 s run, the fold
        and the decoding most of it; BENCHMARKS.md)."""
        batch: list[Record] = []
        rec = self._peek()
        if rec is None:
            return batch, 0
        first = self._pending_index
        limit = math.inf if limit_time is None else limit_time
        items = self._items
        top = -math.inf
        while len(batch) < batch_max:
            t = rec.time
            if t > limit:
                break   # it stays the pending one
            batch.append(rec)
            if t > top:
                top = t
            self._pending = None
            item = next(items, None)
            if item is None:
                break
            if item.__class__ is RecordError or isinstance(item, RecordError):
                self._admit(item)
                nxt = self._peek()
                if nxt is None:
                    break
                rec = nxt
                continue
            self._pending, self._pending_index = item, self._index   # _admit's bookkeeping, for a record
            self._index += 1
            rec = item
        if batch and self.first_time is not None:
            if self._last_time is None or top > self._last_time:
                self._last_time = top
            if top - self.first_time > self._pos:
                self._pos = top - self.first_time
        return batch, first

    async def _go(self, target: float) -> None:
        """Fold up to ``target`` recording seconds as fast as it can (from the start again if it is behind)."""
        self.seeking = True
        try:
            if target < self._pos:
                if self._restart_fold is not None:
                    self._restart_fold()
                self.generation += 1
                self.records = 0
                self._pos = 0.0
                self._open()
            if self._peek() is not None and self.first_time is not None:
                limit = self.first_time + target
                while self._target == target and not self._stopped:
                    batch, first = self._take(limit, YIELD_EVERY)
                    if not batch:
                        break
                    self._hand_over(batch, first)
                    await asyncio.sleep(0)   # keys and the screen go on while a long seek folds
            if self._target == target:   # not overtaken by another seek meanwhile
                self._target = None
                self.at_end = self._peek() is None
                self._pos = max(target, self.length_s or 0.0) if self.at_end else target
        finally:
            self.seeking = self._target is not None
        self._anchor = None

    async def _wait(self, timeout: float | None) -> None:
        """Until a command comes (or ``timeout`` seconds)."""
        if timeout is None:
            await self._wake.wait()
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout)

    async def run(self) -> int:
        """Play until the end (``hold_at_end``: until stopped); returns the records folded. Raises ``OSError`` only
        if the file cannot be opened at all."""
        self._open()
        ended = False
        while not self._stopped:
            self._wake.clear()
            if self._target is not None:
                await self._go(self._target)
                continue
            rec = self._peek()
            if rec is None:
                if not ended:   # once each time the end is reached
                    ended = self.at_end = True
                    if self.first_time is not None:
                        self._pos = max(self._pos, self.length_s or 0.0)
                    if self._on_end is not None:
                        self._on_end(self.records)
                if not self.hold_at_end:
                    break
                await self._wait(None)
                continue
            self.at_end = False
            ended = False
            if self.paused:
                await self._wait(None)
                continue
            if self.speed == 0:
                batch, first = self._take(None, YIELD_EVERY)
                self._hand_over(batch, first)
                await asyncio.sleep(0)
                continue
            now = self.clock()
            if self._anchor is None:
                self._anchor = ((self.first_time or rec.time) + self._pos, now)
            ta, wa = self._anchor
            delay = wa + (rec.time - ta) / self.speed - now
            if delay > 0:
                if self.max_gap_s is not None and delay > self.max_gap_s:
                    # the idle stretch lasts max_gap_s; the pacing after it stays true
                    wa -= delay - self.max_gap_s
                    self._anchor = (ta, wa)
                    delay = self.max_gap_s
                await self._wait(max(delay, BURST_S))
                continue
            # everything due by now, in batches
            limit = ta + (now - wa) * self.speed
            batch, first = self._take(limit, BATCH_MAX)
            self._hand_over(batch, first)
            if len(batch) >= BATCH_MAX:
                await asyncio.sleep(0)
        return self.records


__all__ = ["SEEK_S", "SPEEDS", "STEP_S", "ReplayPlayer", "recording_end", "replay", "replay_batches", "replay_into",
           "speed_text"]
