"""The hit-rate panel, with the size advice's line."""

from __future__ import annotations

import textwrap
from typing import Any

from kvtop.tiers import HitRate
from kvtop.ui import format as fmt
from kvtop.ui.panel import (
    BLANK,
    S_DIM,
    S_DISK,
    S_FIG,
    S_GPU,
    S_HOST,
    S_SPARK,
    Line,
    Panel,
    cells,
    fit_lines,
    line_of,
    padded,
    styled,
)
from kvtop.values import frozen


@frozen
class WhatIfData:
    """The size-advice line's figures (kvtop.tiers.sizeadvice): the hit rate at host sizes 0, ½, 1, 2 and 4 times
    the host pool, the run's own at 1 (its cumulative rate: one span, one definition), with the optimum beside."""

    host_blocks: int | None                  # the host pool the multiples are of (0: no host cache)
    # (label, hit rate, optimal hit rate) per size, in size order; a figure None until known
    points: tuple[tuple[str, float | None, float | None], ...] = ()
    advice: str | None = None                # the recommendation in words
    unknown_why: str | None = None           # why no curve will come (a KV event stream), said instead of "?"s


@frozen
class HitData:
    hit: HitRate
    history: tuple[float | None, ...]   # hit rate per history step, oldest first
    window_s: float | None
    # Live what-if (kvtop.tiers.whatif); None hides the line (a session without the estimate, or another
    # source shown).
    what_if: WhatIfData | None = None
    # Why the hit rate is unknown and what gives it, where the source lacks the data (a KV event stream without
    # the engine's /metrics: kvtop/engine_words.py hit_rate_unknown_why); shown while nothing was looked up.
    unknown_why: str | None = None


# 3x3 box-drawing glyphs for the big hit-rate figure (the back of the room reads these, not the small digits).
GLYPHS: dict[str, tuple[str, str, str]] = {
    "0": ("┏━┓", "┃ ┃", "┗━┛"), "1": ("╺┓ ", " ┃ ", "╺┻╸"), "2": ("╺━┓", "┏━┛", "┗━╸"),
    "3": ("╺━┓", " ━┫", "╺━┛"), "4": ("╻ ╻", "┗━┫", "  ╹"), "5": ("┏━╸", "┗━┓", "╺━┛"),
    "6": ("┏━╸", "┣━┓", "┗━┛"), "7": ("╺━┓", "  ┃", "  ╹"), "8": ("┏━┓", "┣━┫", "┗━┛"),
    "9": ("┏━┓", "┗━┫", "╺━┛"), ".": (" ", " ", "•"), "%": (" ", " ", "%"), "-": ("   ", "╺━╸", "   "),
    " ": (" ", " ", " "), "<": ("  ", "╱ ", "╲ "), "?": ("╺━┓", " ┏┛", " ╹ "),
}


def big_figure(text: str) -> list[str]:
    """``text`` three lines tall in GLYPHS."""
    rows = ["", "", ""]
    for ch in text:
        glyph = GLYPHS.get(ch, GLYPHS[" "])
        for i in range(3):
            rows[i] += glyph[i]
    return rows


class HitRatePanel(Panel[HitData]):
    """Hit rate over the window (big, when there is room), cumulative, split by the tier that served the hit,
    and its history as a sparkline."""

    def on_mount(self) -> None:
        super().on_mount()
        self.border_title = "Hit rate · blocks reused"

    def build(self) -> Line | list[Line]:
        d: HitData | None = self.data
        width, height = self.inner
        if d is None:
            return BLANK
        h = d.hit
        win = f"{d.window_s:.0f} s" if d.window_s else "window"
        gap = "  " if width >= 40 else " "

        # more shares where the engine says which tier served each hit: the disk's where it has a disk tier
        # (HitRate.disk), outside the engine's once any hit came from there (HitRate.external: p2p, a remote store)
        disk = h.disk is not None or h.window_disk is not None
        ext = h.external is not None or h.window_external is not None
        # With more than two shares the row may not fit: one-space gaps, then whole percents and the tiers'
        # initials (in their colours), rather than a row cut short (a 36-cell panel at 80x24 holds GPU, host,
        # disk as "G 30% h 0% d 20%")
        full = ("GPU", "host", "disk", "ext")
        Mode = tuple[str, tuple[str, ...], int]   # the gap, the tiers' names, the digits

        def row(label: str, total: float | None, gpu: float | None, host: float | None,
                on_disk: float | None = None, outside: float | None = None, mode: Mode = (gap, full, 1)) -> Line:
            sep, names, digits = mode
            parts: list[Any] = [(f"{label:<6}", S_DIM), (padded(fmt.pct(total), 6), S_FIG)]
            for tier, value, style, shown in ((0, gpu, S_GPU, True), (1, host, S_HOST, True),
                                              (2, on_disk, S_DISK, disk), (3, outside, S_DIM, ext)):
                if shown:   # each tier's name and share in its colour (kvtop/palette.py)
                    parts += [sep, (names[tier], style), " ",
                              (padded(fmt.pct(value, digits=digits), 4 + 2 * digits), style)]
            return line_of(*parts)

        mode: Mode = (gap, full, 1)
        if disk or ext:
            for candidate in ((gap, full, 1), (" ", full, 1), (" ", full, 0), (" ", ("G", "h", "d", "x"), 0)):
                mode = candidate
                if cells(row("total", h.cumulative, h.gpu, h.host, h.disk, h.external,
                             mode)) <= width:
                    break

        if height == 1:
            tail = [" ", ("disk", S_DISK), " ", (fmt.pct(h.window_disk, digits=0), S_DISK)] if disk else []
            if ext:
                tail += [(" ext ", S_DIM), fmt.pct(h.window_external, digits=0)]
            return fit_lines([line_of(("hit ", "bold"), (fmt.pct(h.window), S_FIG), " ", ("GPU", S_GPU), " ",
                                    (fmt.pct(h.window_gpu, digits=0), S_GPU), " ", ("host", S_HOST), " ",
                                    (fmt.pct(h.window_host, digits=0), S_HOST), *tail, (" total ", S_DIM),
                                    fmt.pct(h.cumulative, digits=0))], width, height)
        if d.unknown_why and not h.lookups:
            # No figure to show, the reason instead (where the sparkline and the what-if's "?"s would be): the
            # totals row, the window's where there is room, then the reason wrapped to the panel.
            why = [styled(text, S_DIM) for text in textwrap.wrap(d.unknown_why, max(width, 1),
                                                                 break_on_hyphens=False)]
            figures = [row(win, h.window, h.window_gpu, h.window_host, h.window_disk, h.window_external, mode),
                       row("total", h.cumulative, h.gpu, h.host, h.disk, h.external, mode)]
            # the rows of "?" go first where the reason needs their room (80x24: three rows, all of it reason)
            return fit_lines([*figures[max(len(why) + 2 - height, 0):], *why], width, height)
        lines: list[Line] = []
        if height >= 6:
            # Whole percent in the big figure: the back of the room needs 38%, and the row under it has 38.5%.
            # It also changes four times less often than a one-decimal figure, so three fewer lines repaint.
            big = big_figure(fmt.pct(h.window, unknown="--%", digits=0))
            label = [f"  over {win}", "  blocks reused /", "  blocks looked up"]
            lines += [line_of((b, S_FIG), (lab, S_DIM)) for b, lab in zip(big, label)]
        lines += [row(win, h.window, h.window_gpu, h.window_host, h.window_disk, h.window_external,
                      mode),
                  row("total", h.cumulative, h.gpu, h.host, h.disk, h.external, mode)]
        curve_lines: list[Line] = []
        if d.what_if is not None and height >= 3:
            # Before the sparkline: where the panel has one line to spare (80x24), the curve gets it.
            w = d.what_if
            if w.unknown_why:
                lines.append(line_of(("host×: ", S_DIM), (w.unknown_why, S_DIM)))
            elif w.host_blocks == 0:
                # Twice no host cache is still none: the curve has nothing to say, and says why.
                lines.append(line_of(("what-if ", S_DIM), ("no host cache: ", S_HOST),
                                     ("x2 of 0 is 0", S_DIM)))
            else:
                head, rates, best = _curve_rows(w, width)
                lines.append(line_of(*head, *rates, *best))
                if height >= len(lines) + 2 and any(p[2] is not None for p in w.points):
                    # Room below the sparkline (200x60): the optimum under each size, and the advice.
                    pad = sum(len(t) for t, _ in head)
                    curve_lines.append(line_of(("optimum".ljust(pad), S_DIM), *(
                        (f"{_whole_pct(p[2]):>3}", S_DIM) for p in w.points), ("%", S_DIM)))
                    if w.advice:
                        curve_lines.append(line_of((w.advice, S_DIM)))
        if height >= len(lines) + 1:
            # As tall as the rows left (200x60: the hit-rate panel takes the right column's rest), 8 at most.
            spark_w = max(width - 8, 1)
            rows = max(min(height - len(lines) - len(curve_lines), 8), 1)
            chart = fmt.sparkrows(d.history, spark_w, rows, top=1.0)
            lines += [styled(row, S_SPARK) for row in chart[:-1]]
            lines.append(line_of((chart[-1], S_SPARK), (f" {min(len(d.history), spark_w):>3}s", S_DIM)))
        lines += curve_lines
        return fit_lines(lines, width, height)


def _whole_pct(x: float | None) -> str:
    return "?" if x is None else f"{100 * x:.0f}"


def _curve_rows(w: WhatIfData, width: int) -> tuple[list[tuple[str, str]], list[tuple[str, str]],
                                                     list[tuple[str, str]]]:
    """The curve in one line: ``host×0 ½ 1 2 4: 38 38 39 42 42% opt 46`` (sizes as multiples of the host pool, the
    hit rate at each, the run's own at 1 bright; the optimum at the pool's size where the line has room: 38 cells
    at 80x24 hold it with two-digit rates)."""
    labels = " ".join(p[0] for p in w.points)
    head = [("host×", S_DIM), (labels + ":", S_HOST)]
    rates: list[tuple[str, str]] = []
    for label, rate, _ in w.points:
        rates.append((f" {_whole_pct(rate)}", S_FIG if label == "1" else S_DIM))
    rates.append(("%", S_DIM))
    here = next((p for p in w.points if p[0] == "1"), None)
    best: list[tuple[str, str]] = []
    if here is not None and here[2] is not None:
        best = [(" opt ", S_DIM), (_whole_pct(here[2]), S_FIG)]
        if sum(len(t) for t, _ in head + rates + best) > width:
            best = []
    return head, rates, best
