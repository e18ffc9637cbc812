"""The event log."""

from __future__ import annotations

import re
import time
from collections import deque
from typing import Any

from kvtop.ui.panel import (
    BLANK,
    S_DIM,
    Line,
    Panel,
    fit_lines,
    line_of,
    styled,
)
from kvtop.values import mutable


@mutable
class LogLine:
    time: float
    level: str
    text: str
    key: tuple[str, str]
    count: int = 1


LEVEL_STYLE = {"info": S_DIM, "warn": "$warning", "warning": "$warning", "error": "bold $error"}
LEVEL_MARK = {"info": "·", "warn": "▲", "warning": "▲", "error": "✖"}


class EventLog(Panel[None]):
    """The session's log, aggregated and rate-limited.

    Aggregated: a line whose text differs from one of the last ``RECENT`` lines only in its numbers ("request 12
    failed" / "request 13 failed") is folded into it as ``×N`` and moved to the bottom. Rate-limited: at most
    ``MAX_LINES_PER_S`` new lines per second reach the screen (a token bucket); the rest are counted into one
    "N more lines suppressed" line, so a source failing 1,000 times a second costs one repaint per refresh.
    """

    KEEP = 200
    RECENT = 8
    MAX_LINES_PER_S = 5.0
    BURST = 10.0
    _numbers = re.compile(r"\d+(?:\.\d+)?")

    def __init__(self, *, id: str | None = None, classes: str | None = None):
        super().__init__(id=id, classes=classes)
        self.lines: deque[LogLine] = deque(maxlen=self.KEEP)
        self.suppressed = 0
        self._tokens = self.BURST
        self._last_fill: float | None = None
        self._pending = False

    def on_mount(self) -> None:
        super().on_mount()
        self.border_title = "Events"

    def add(self, t: float, level: str, text: str) -> None:
        key = (level, self._numbers.sub("#", text))
        for line in list(self.lines)[-self.RECENT:]:
            if line.key == key:
                line.count += 1
                line.time = t
                line.text = text
                self.lines.remove(line)
                self.lines.append(line)
                self._changed()
                return
        if self._last_fill is not None:
            # max(0, ...): log times come from several clocks (the session's, the UI's); never refill backwards.
            self._tokens = min(self.BURST, self._tokens + max(t - self._last_fill, 0.0) * self.MAX_LINES_PER_S)
        self._last_fill = t if self._last_fill is None else max(t, self._last_fill)
        if self._tokens < 1.0 and level != "error" or self._tokens < -self.BURST:
            self.suppressed += 1
            self._changed()
            return
        self._tokens -= 1.0
        if self.suppressed:
            self.lines.append(LogLine(t, "warn", f"{self.suppressed} more lines suppressed (over "
                                                 f"{self.MAX_LINES_PER_S:.0f}/s)", ("warn", "#suppressed")))
            self.suppressed = 0
        self.lines.append(LogLine(t, level, text, key))
        self._changed()

    def _changed(self) -> None:
        # Many lines can arrive between two refreshes: rebuild once, after the current batch of messages.
        if not self._pending:
            self._pending = True
            self.call_later(self._flush)

    def _flush(self) -> None:
        self._pending = False
        self.update_lines()

    def build(self) -> Line | list[Line]:
        width, height = self.inner
        if height <= 0:
            return BLANK
        shown = list(self.lines)[-height:]
        out: list[Line] = []
        for line in shown:
            stamp = time.strftime("%H:%M:%S", time.localtime(line.time))
            style = LEVEL_STYLE.get(line.level, S_DIM)
            parts: list[Any] = [(stamp + " ", S_DIM), (LEVEL_MARK.get(line.level, "·") + " ", style),
                                (line.text, "" if line.level == "info" else style)]
            if line.count > 1:
                parts.append((f"  ×{line.count}", "bold"))
            out.append(line_of(*parts))
        if self.suppressed and len(out) < height + 1:
            out.append(styled(f"... {self.suppressed} lines suppressed", S_DIM))
            out = out[-height:]
        if not out:
            out = [styled("no events yet", S_DIM)]
        return fit_lines(out, width, height)
