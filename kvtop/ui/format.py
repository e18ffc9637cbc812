"""Number formatting for the screen: pure functions, no Textual, so they are unit-tested on their own.

Every function takes ``None`` for "unknown" and says so ("?" in tight places, "unknown" where there is room):
an unknown count is never shown as 0. None of them raises for a number: NaN and infinities read as unknown,
and values past what the columns hold (records are bounded at 2^64, a fleet's sum may be more) as ">999G".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from kvtop.textsafe import clean as _textsafe_clean

UNKNOWN = "?"
GIB = 1 << 30
MIB = 1 << 20
KIB = 1 << 10

# Eight heights per cell: a sparkline row resolves 1/8 of its range.
SPARK_CHARS = "▁▂▃▄▅▆▇█"


HUGE = ">999G"


def _finite(n: int | float | None) -> float | None:
    """``n`` as a float, or None for None, NaN, an infinity or an integer too large for a float."""
    if n is None:
        return None
    try:
        v = float(n)
    except (OverflowError, TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def count(n: int | float | None, unknown: str = UNKNOWN) -> str:
    """A count, short: 987, 9,876, 98.8k, 987k, 9.88M. Fixed width at most 6 characters."""
    n = _finite(n)
    if n is None:
        return unknown
    a = abs(n)
    if a >= 999.5e9:
        return HUGE
    if a < 10_000:
        return f"{n:,.0f}"
    if a < 1_000_000:
        return f"{n / 1000:.1f}k" if a < 100_000 else f"{n / 1000:.0f}k"
    if a < 1_000_000_000:
        return f"{n / 1e6:.2f}M" if a < 10_000_000 else f"{n / 1e6:.1f}M" if a < 100_000_000 else f"{n / 1e6:.0f}M"
    return f"{n / 1e9:.2f}G"


def nbytes(n: int | float | None, unknown: str = UNKNOWN) -> str:
    """Bytes in binary units, 3 significant figures: 512 B, 4.50 MiB, 1.07 GiB, 141 GiB, 1.83 TiB."""
    n = _finite(n)
    if n is None:
        return unknown
    a = abs(n)
    if a >= 999.5 * (1 << 40):
        return ">999 TiB"
    for unit, scale in (("TiB", 1 << 40), ("GiB", GIB), ("MiB", MIB), ("KiB", KIB)):
        if a >= scale:
            v = n / scale
            return f"{v:.2f} {unit}" if abs(v) < 10 else f"{v:.1f} {unit}" if abs(v) < 100 else f"{v:.0f} {unit}"
    return f"{n:.0f} B"


def gib(n: int | float | None, unknown: str = UNKNOWN) -> str:
    """Bytes as GiB with two decimals (tier rows use one unit so columns line up)."""
    n = _finite(n)
    if n is None:
        return unknown
    v = n / GIB
    if abs(v) >= 1e9:
        return HUGE
    return f"{v:.2f}" if v < 100 else f"{v:.0f}"


def pct(fraction: float | None, unknown: str = UNKNOWN, digits: int = 1) -> str:
    """A fraction as a percentage: 0.4831 -> '48.3%'."""
    fraction = _finite(fraction)
    if fraction is None:
        return unknown
    if abs(fraction) >= 9.995:  # past 999%: no fraction kvtop shows gets here but by bad input
        return ">999%" if fraction > 0 else "<-999%"
    return f"{fraction * 100:.{digits}f}%"


def rate(per_s: float | None, unknown: str = UNKNOWN) -> str:
    """A per-second rate, 3 significant figures, at most 6 characters: 0, 4.12, 41.2, 412, 4.12k, 41.2k."""
    per_s = _finite(per_s)
    if per_s is None:
        return unknown
    a = abs(per_s)
    if a < 0.005:
        return "0"
    if a < 10:
        return f"{per_s:.2f}"
    if a < 100:
        return f"{per_s:.1f}"
    if a < 1_000:
        return f"{per_s:.0f}"
    if a < 10_000:
        return f"{per_s / 1000:.2f}k"
    return count(per_s)


def seconds_ms(s: float | None, unknown: str = UNKNOWN) -> str:
    """A latency: 8.7 ms, 412 ms, 1.23 s."""
    s = _finite(s)
    if s is None or s < 0:
        return unknown
    if s >= 9999.5:
        return ">9999 s"
    if s < 0.01:
        return f"{s * 1000:.1f} ms"
    if s < 1:
        return f"{s * 1000:.0f} ms"
    return f"{s:.2f} s" if s < 10 else f"{s:.1f} s"


def duration(s: float | None, unknown: str = UNKNOWN) -> str:
    """An uptime: 0:04:07, 27:04:07 (hours keep counting; a run of days is still readable)."""
    s = _finite(s)
    if s is None:
        return unknown
    if s >= 3.6e9:  # a million hours
        return ">999999h"
    s = max(0, int(s))
    return f"{s // 3600}:{s % 3600 // 60:02d}:{s % 60:02d}"


_SPARKS: dict[tuple[Any, ...], str] = {}  # the sparklines drawn lately, by (values shown, width, top)


def sparkline(values: Sequence[float | None], width: int, top: float | None = None) -> str:
    """The newest ``width`` values as a one-row sparkline; a gap (None) is a space, a missing start pads left.

    ``top`` fixes the scale (1.0 for hit rates, so 40% always looks like 40%); otherwise the largest value shown
    is the top. Zero is the lowest bar, so "nothing moved" reads as a flat floor, not as missing data.
    """
    if width <= 0:
        return ""
    # The history behind a sparkline moves once per history step (1 s), the screen refreshes 4 times a second,
    # and five sparklines are drawn at every busy refresh: the same ones are served again (hashing the tuple
    # costs a tenth of drawing it).
    shown = tuple(values)[-width:]
    key = (shown, width, top)
    line = _SPARKS.get(key)
    if line is None:
        if len(_SPARKS) >= 64:
            _SPARKS.clear()
        line = _SPARKS[key] = _sparkline(shown, width, top)
    return line


def _sparkline(shown: tuple[float | None, ...], width: int, top: float | None) -> str:
    tail = [_finite(v) for v in shown]  # NaN, inf: a gap
    known = [v for v in tail if v is not None]
    hi = top if top is not None else (max(known) if known else 0.0)
    chars = []
    for v in tail:
        if v is None:
            chars.append(" ")
        elif hi <= 0:
            chars.append(SPARK_CHARS[0])
        else:
            i = int(min(max(v / hi, 0.0), 1.0) * (len(SPARK_CHARS) - 1) + 0.5)
            chars.append(SPARK_CHARS[i])
    return " " * (width - len(chars)) + "".join(chars)


def sparkrows(values: Sequence[float | None], width: int, rows: int, top: float | None = None) -> list[str]:
    """``sparkline`` ``rows`` cells tall (top row first): each column resolves 1/(8 * rows) of its range, so a
    tall chart (200x60) shows what a one-row one rounds away. Zero is the bottom row's lowest bar; a gap is blank
    in every row."""
    if rows <= 1:
        return [sparkline(values, width, top)]
    if width <= 0:
        return [""] * rows
    tail = [_finite(v) for v in tuple(values)[-width:]]
    known = [v for v in tail if v is not None]
    hi = top if top is not None else (max(known) if known else 0.0)
    levels = rows * len(SPARK_CHARS)
    out = [[" "] * (width - len(tail)) for _ in range(rows)]
    for v in tail:
        # eighths of a cell filled, counted from the bottom row; at least one: zero is a floor, not a gap
        n = 0 if v is None else 1 if hi <= 0 else max(int(min(max(v / hi, 0.0), 1.0) * (levels - 1) + 0.5), 0) + 1
        for r in range(rows):
            fill = n - (rows - 1 - r) * len(SPARK_CHARS)   # this row's eighths (row 0 is the top)
            out[r].append(" " if v is None or fill <= 0 else SPARK_CHARS[min(fill, len(SPARK_CHARS)) - 1])
    return ["".join(r) for r in out]


def cells(part: int | None, whole: int | None, width: int) -> int:
    """How many of ``width`` cells ``part / whole`` fills, rounded to nearest, at least 1 when part > 0."""
    p, w = _finite(part), _finite(whole)
    if p is None or not w or width <= 0:
        return 0
    n = int(round(min(max(p / w, 0.0), 1.0) * width))
    return max(n, 1) if p > 0 else n


__all__ = ["GIB", "HUGE", "SPARK_CHARS", "UNKNOWN", "cells", "count", "duration", "gib", "nbytes", "pct", "rate",
           "seconds_ms", "sparkline"]



def clean(text: object, limit: int = 300) -> str:
    """Text from outside (an engine's error message, a source's name) made safe for a terminal: kvtop's one
    sanitizer (kvtop/textsafe.py: escape sequences, control and bidi characters removed, newlines and tabs as
    spaces), at most ``limit`` characters."""
    return _textsafe_clean(text, max_len=limit)
