"""The problems registry: what went wrong in a run, counted, for every mode to read.

Sources and sinks *report* into one :class:`Problems` (the session's); every mode *reads* it: the dashboard
shows the active ones, a headless run prints :meth:`Problems.take_lines` to stderr as they happen and the JSON
summary carries :meth:`Problems.to_json`; the exit status comes from :meth:`Problems.exit_status`.

It is pure bookkeeping: no I/O, no clock of its own (every call may pass ``now``; the default is
``time.time()``), so it is tested with numbers. A lock makes it safe from the recorder's flush thread.

Rate limit: a kind's first report makes a line at once; later reports of the same kind within
``line_interval_s`` (5 s) are folded into the next line ("... (37 more in 5.0 s)"), so a broker down for a
minute, or 10,000 bad payloads, are a dozen lines, not 10,000. The registry keeps at most ``max_kinds`` (256)
kinds: a flood of distinct kinds (which would be a bug) is counted under ``problems.overflow``.

``lost``: the problem means data the run should have had is gone (a bad record skipped, a record dropped from
a full queue, a line the disk refused). Any lost problem makes the exit status :data:`EXIT_LOST_DATA`.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from kvtop.textsafe import clean
from kvtop.values import mutable

__all__ = ["EXIT_CRASH", "EXIT_INTERRUPTED", "EXIT_LOST_DATA", "EXIT_NO_DATA", "EXIT_OK", "EXIT_TERMINATED",
           "EXIT_USAGE", "Problem", "Problems", "exit_status"]

# Exit statuses of every kvtop command (README "Exit status").
EXIT_OK = 0
EXIT_CRASH = 1          # an unexpected error (a bug): the one case that still prints a traceback
EXIT_USAGE = 2          # a bad option or argument, one line naming it
EXIT_NO_DATA = 3        # the run ended without a single record from its sources
EXIT_LOST_DATA = 4      # the run got data but lost some: bad records skipped, records dropped, a write failed
EXIT_INTERRUPTED = 130  # SIGINT (Ctrl-C), as shells expect (128 + 2)
EXIT_TERMINATED = 143   # SIGTERM (``timeout``, ``kill``, a container's stop), after the summary (128 + 15)

LINE_INTERVAL_S = 5.0
MAX_KINDS = 256
MESSAGE_LEN = 300  # a message is cut here: a 1 MB error text from a server must not become a 1 MB line


@mutable
class Problem:
    """One kind of problem: how often, the last message, when first and last, and whether it still holds."""

    kind: str             # dotted: "mqtt.connection", "record.bad", "recorder.write", ...
    count: int
    message: str          # the last one (cleaned of control characters)
    first: float          # epoch seconds
    last: float
    lost: bool = False    # data was lost (sets the exit status)
    active: bool = True   # still going on (a reconnect resolves "mqtt.connection")
    # rate limiting: reports since the last line, and when that line was made
    unreported: int = 0
    lined_at: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "count": self.count, "message": self.message, "first": self.first,
                "last": self.last, "lost": self.lost, "active": self.active}


class Problems:
    """See the module docstring. ``report`` from anywhere; ``take_lines`` / ``snapshot`` / ``to_json`` to read."""

    def __init__(self, *, line_interval_s: float = LINE_INTERVAL_S, max_kinds: int = MAX_KINDS):
        self.line_interval_s = line_interval_s
        self.max_kinds = max_kinds
        self._items: dict[str, Problem] = {}
        self._lines: list[str] = []
        self._lock = threading.Lock()
        self.version = 0  # bumped on every change: a screen redraws only when it moved

    # ------------------------------------------------------------------------------------------ reporting

    def report(self, kind: str, message: str, *, count: int = 1, lost: bool = False,
               now: float | None = None) -> None:
        """``count`` more of ``kind``; ``message`` says what (the newest is kept)."""
        if count <= 0:
            return
        t = time.time() if now is None else now
        text = clean(message, MESSAGE_LEN)
        with self._lock:
            self.version += 1
            p = self._items.get(kind)
            if p is None:
                if len(self._items) >= self.max_kinds:
                    kind, text = "problems.overflow", f"more than {self.max_kinds} kinds of problem; last: {kind}"
                    p = self._items.get(kind)
                if p is None:
                    p = self._items[kind] = Problem(kind, 0, text, t, t, lost)
                    p.count, p.lined_at = count, t
                    self._lines.append(self._line(p, 0))
                    return
            p.count += count
            p.message = text
            p.last = t
            p.lost = p.lost or lost
            if not p.active:  # it came back: say so at once
                p.active = True
                p.lined_at = t
                self._lines.append(self._line(p, 0))
                return
            p.unreported += count
            self._due(p, t)

    def resolve(self, kind: str, message: str | None = None, *, now: float | None = None) -> None:
        """``kind`` no longer holds (a broker reconnected); it stays in the list, marked inactive."""
        with self._lock:
            p = self._items.get(kind)
            if p is None or not p.active:
                return
            self.version += 1
            p.active = False
            if p.unreported:
                self._lines.append(self._line(p, p.unreported))
                p.unreported = 0
            if message:
                self._lines.append(f"{kind}: {clean(message, MESSAGE_LEN)}")

    def _due(self, p: Problem, t: float) -> None:
        if p.unreported and t - p.lined_at >= self.line_interval_s:
            self._lines.append(self._line(p, p.unreported, t - p.lined_at))
            p.unreported = 0
            p.lined_at = t

    def _line(self, p: Problem, more: int, over_s: float = 0.0) -> str:
        if more <= 0:
            return f"{p.kind}: {p.message}"
        tail = f" in {over_s:.0f} s" if over_s >= 1 else ""
        return f"{p.kind}: {p.message} ({more:,} more{tail}, {p.count:,} in all)"

    # ------------------------------------------------------------------------------------------ reading

    def take_lines(self, now: float | None = None, *, final: bool = False) -> list[str]:
        """The lines due since the last call (for stderr), oldest first; ``final`` also flushes the folded ones."""
        t = time.time() if now is None else now
        with self._lock:
            for p in self._items.values():
                if final and p.unreported:
                    self._lines.append(self._line(p, p.unreported, t - p.lined_at))
                    p.unreported = 0
                    p.lined_at = t
                else:
                    self._due(p, t)
            lines, self._lines = self._lines, []
        return lines

    def snapshot(self) -> list[Problem]:
        """Every problem so far (copies), active ones first, then the most recent first."""
        with self._lock:
            items = [Problem(**vars(p)) for p in self._items.values()]
        return sorted(items, key=lambda p: (not p.active, -p.last))

    def get(self, kind: str) -> Problem | None:
        with self._lock:
            p = self._items.get(kind)
            return None if p is None else Problem(**vars(p))

    def count(self, kind: str) -> int:
        p = self.get(kind)
        return 0 if p is None else p.count

    def __len__(self) -> int:
        return len(self._items)

    @property
    def lost_data(self) -> bool:
        with self._lock:
            return any(p.lost for p in self._items.values())

    def to_json(self) -> list[dict[str, Any]]:
        return [p.to_json() for p in self.snapshot()]

    def exit_status(self, records: int) -> int:
        """The run's exit status: no data (3), lost data (4), else 0. ``records``: records the run folded."""
        return exit_status(records, self.lost_data)


def exit_status(records: int, lost: bool) -> int:
    if records <= 0:
        return EXIT_NO_DATA
    if lost:
        return EXIT_LOST_DATA
    return EXIT_OK
