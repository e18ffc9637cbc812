"""JSONL recorder: every record as one line (runs of KV events of one source as one ``kv_events`` line, see
kvtop/compact.py), flushed at least once a second, valid line by line after any death.

Why the file survives SIGKILL, SIGTERM or a crash with whole lines only: lines are buffered in memory and handed
to the kernel with ``os.write`` of whole lines, never a partial one from Python's side (a short write is
finished by the next call before anything else is written). A process killed between two writes leaves only
whole lines; the kernel keeps what it was given even if the process dies a microsecond later (no fsync: a
*machine* crash may lose the page cache, a process crash never does). So a death loses at most what was
buffered: under one second, since a background thread flushes every second (and ``write`` flushes once the
buffer passes 1 MiB, so a burst never grows it without bound).

SIGINT raises KeyboardInterrupt, so ``with Recorder(...)`` / :meth:`close` flush everything. An un-closed
recorder is flushed at interpreter exit. SIGTERM's default action ends the process without either: that is the
"loses at most the last second" case.

Cost: ``encode`` of a 1 KB iteration-stats dict is ~10 us; the write itself is amortised over a second of lines.
"""

from __future__ import annotations

import atexit
import json
import os
import threading
import weakref
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from kvtop.compact import BATCH_KIND, pack_event
from kvtop.problems import Problems
from kvtop.records import MAX_LINE_BYTES, SCHEMA_VERSION, Record, SourceId, encode, json_default

FLUSH_INTERVAL_S = 1.0
FLUSH_BYTES = 1 << 20  # 1 MiB: ~1,000 stats dicts; a burst of events is written out well before a second
BATCH_BYTES = 256 << 10  # a batch line of KV events ends here (~1,000 stored blocks), far under the readers' 8 MiB

_open: weakref.WeakSet[Recorder] = weakref.WeakSet()


def _flush_all_at_exit() -> None:
    for rec in list(_open):
        try:
            rec.close()
        except Exception:
            pass


atexit.register(_flush_all_at_exit)


class Recorder:
    """Appends records to ``path`` as JSONL (``append=False`` truncates first). Thread-safe.

    ``write`` is the sink (also callable as ``recorder(record)``); ``close`` flushes and closes. Counters:
    ``records`` written (accepted), ``bytes`` handed to the kernel, ``flushes``, ``refused`` (records whose line
    would be over ``MAX_LINE_BYTES``, which every reader refuses: not written, a lost problem); ``error`` is the
    last write failure (disk full), never raised from ``write``.
    """

    def __init__(self, path: str | os.PathLike[str], *, append: bool = True,
                 flush_interval_s: float = FLUSH_INTERVAL_S, flush_bytes: int = FLUSH_BYTES,
                 problems: Problems | None = None):
        self.path = Path(path)
        self.problems = problems  # write failures are reported there ("recorder.write", lost data)
        flags = os.O_WRONLY | os.O_CREAT | (os.O_APPEND if append else os.O_TRUNC)
        self._fd: int | None = os.open(self.path, flags, 0o644)
        self.flush_interval_s = flush_interval_s
        self.flush_bytes = flush_bytes
        self.records = 0
        self.bytes = 0
        self.flushes = 0
        self.dropped_lines = 0  # only when writes fail (disk full) for more than 4 MiB of lines
        self.refused = 0  # records never written: their line would be over the readers' MAX_LINE_BYTES
        self.error: str | None = None  # the last write error (disk full...), reported, never raised by write()
        self._buf: list[bytes] = []
        self._batch_source: SourceId | None = None   # the KV events not yet in a line: their source,
        self._batch_times: list[str] = []              # times (JSON) and packed events (JSON)
        self._batch_events: list[str] = []
        self._batch_bytes = 0
        self._buf_bytes = 0
        self._pending = b""  # the unwritten tail of a short write: written first, so lines never interleave
        self._partial = b""  # the start of an unfinished line already in the file (after a short write)
        self._lock = threading.Lock()
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._flusher, name="kvtop-recorder", daemon=True)
        self._thread.start()
        _open.add(self)

    # ------------------------------------------------------------------------------------------ sink

    def write(self, record: Record) -> None:
        """Buffer one record (a KV event: into the current batch line). Raises only for a record that cannot be
        encoded (a caller's bug)."""
        if record.kind == "kv_event":
            # Consecutive KV events of one source share a line (one envelope, each event's own time), packed
            # and with compact token lists (kvtop/compact.py); read_jsonl gives them back one record each.
            text = json.dumps(pack_event(record.data), separators=(",", ":"), default=json_default, allow_nan=False)
            stamp = json.dumps(record.time, allow_nan=False)  # a NaN time raises here, as encode() does
            size = len(text) + len(stamp) + 2
            with self._lock:
                if self._fd is None:
                    raise ValueError(f"recorder for {self.path} is closed")
                # One event alone on its line: the envelope (under 1 KiB: source strings are bounded) and it.
                if size + 1024 + 2 * len(stamp) > MAX_LINE_BYTES:
                    self._refuse_locked(record, size)
                    return
                if self._batch_source is not None and (self._batch_source != record.source
                                                       or self._batch_bytes + size > BATCH_BYTES):
                    self._end_batch_locked()  # a large event never pushes a batch line past BATCH_BYTES + it
                self._batch_source = record.source
                self._batch_times.append(stamp)
                self._batch_events.append(text)
                self._batch_bytes += len(text) + len(stamp) + 2
                self.records += 1
                if self._batch_bytes >= BATCH_BYTES:
                    self._end_batch_locked()
                if self._buf_bytes >= self.flush_bytes:
                    self._flush_locked()
            return
        line = encode(record).encode("utf-8") + b"\n"
        with self._lock:
            if self._fd is None:
                raise ValueError(f"recorder for {self.path} is closed")
            if len(line) - 1 > MAX_LINE_BYTES:
                self._refuse_locked(record, len(line) - 1)
                return
            self._end_batch_locked()   # the events before this record stay before it
            self._buf.append(line)
            self._buf_bytes += len(line)
            self.records += 1
            if self._buf_bytes >= self.flush_bytes:
                self._flush_locked()

    __call__ = write

    def write_many(self, records: Iterable[Record]) -> None:
        for rec in records:
            self.write(rec)

    def flush(self) -> None:
        with self._lock:
            self._flush_locked()

    def close(self) -> None:
        """Flush and close; idempotent."""
        self._closed.set()
        with self._lock:
            if self._fd is None:
                return
            self._flush_locked()
            if self._pending:
                # The disk never freed up: what is still held is lost now. Said in lines, as the file counts them
                # (a line of KV events holds many records), so the run's last word is not "held back".
                lost = self._pending.count(b"\n")
                self.dropped_lines += lost
                self._pending = b""
                if self.problems is not None:
                    self.problems.report("recorder.write", f"{self.error}: {self.dropped_lines:,} line(s) never "
                                         f"written ({lost:,} still held at the end); the file ends on a whole "
                                         "line", count=max(1, lost), lost=True)
            os.close(self._fd)
            self._fd = None
        _open.discard(self)

    def __enter__(self) -> Recorder:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------------------------------ internals

    def _flusher(self) -> None:
        # A daemon: a forgotten recorder never keeps the interpreter alive (atexit flushes it instead).
        while not self._closed.wait(self.flush_interval_s):
            with self._lock:
                if self._fd is None:
                    return
                self._flush_locked()

    def _refuse_locked(self, record: Record, size: int) -> None:
        """A record whose line every reader would refuse (kvtop.records.MAX_LINE_BYTES) is not written: counted,
        reported as lost data; the lines around it are written as usual."""
        self.refused += 1
        if self.problems is not None:
            self.problems.report("recorder.too_large",
                                 f"{self.refused:,} record(s) not written to {self.path}: a {record.kind} record of "
                                 f"{size:,} bytes, over the {MAX_LINE_BYTES:,}-byte line limit that replay reads",
                                 lost=True)

    def _end_batch_locked(self) -> None:
        """The KV events gathered so far as one line in the buffer."""
        if not self._batch_events:
            return
        src = self._batch_source
        assert src is not None
        line = (f'{{"v":{SCHEMA_VERSION},"kind":"{BATCH_KIND}","source":'
                f'{json.dumps(src.to_json(), separators=(",", ":"))},"time":{self._batch_times[0]},'
                f'"data":{{"times":[{",".join(self._batch_times)}],"events":[{",".join(self._batch_events)}]}}}}\n'
                ).encode()
        self._batch_times, self._batch_events, self._batch_bytes = [], [], 0
        self._buf.append(line)
        self._buf_bytes += len(line)

    def _flush_locked(self) -> None:
        self._end_batch_locked()
        if self._fd is None or (not self._buf and not self._pending):
            return
        data = self._pending + b"".join(self._buf)
        self._buf.clear()
        self._buf_bytes = 0
        self._pending = b""
        view = memoryview(data)
        try:
            while view:
                n = os.write(self._fd, view)
                written = view[:n]
                view = view[n:]
                self.bytes += n
                # What of an unfinished line is in the file (a short write stops mid-line): a later failure
                # cuts it off again, so the file ends on a whole line even if the disk never frees up.
                nl = bytes(written[-1:]) == b"\n"
                if nl:
                    self._partial = b""
                else:
                    last = bytes(written).rfind(b"\n")
                    self._partial = bytes(written[last + 1:]) if last >= 0 else self._partial + bytes(written)
            if self.error is not None:
                self.error = None
                if self.problems is not None:
                    self.problems.resolve("recorder.write", f"writing {self.path} again")
        except OSError as exc:
            # Disk full or the file gone: keep the unwritten tail for the next flush, so a line already begun
            # is finished before any other (the file stays valid line by line if the disk frees up). Past
            # 4 MiB only that line's rest is kept and whole lines are dropped (counted): a dead disk must not
            # grow memory without bound.
            self.error = f"cannot write {self.path}: {exc.strerror or exc}"
            tail = bytes(view)
            if self._partial:
                try:
                    end = os.lseek(self._fd, 0, os.SEEK_END)
                    os.ftruncate(self._fd, end - len(self._partial))
                    self.bytes -= len(self._partial)
                    tail, self._partial = self._partial + tail, b""
                except OSError:
                    pass  # the line's rest stays first in line: finished before any other, if the disk frees
            dropped = 0
            if len(tail) > 4 * self.flush_bytes:
                end = tail.find(b"\n") + 1
                dropped = tail.count(b"\n", end)
                self.dropped_lines += dropped
                tail = tail[:end]
            self._pending = tail
            if self.problems is not None:
                held = tail.count(b"\n")
                self.problems.report("recorder.write", f"{self.error}: {held:,} line(s) held back, "
                                     f"{self.dropped_lines:,} dropped so far (the file stays valid line by line)",
                                     count=max(1, dropped), lost=True)
        self.flushes += 1


__all__ = ["Recorder", "FLUSH_INTERVAL_S"]
