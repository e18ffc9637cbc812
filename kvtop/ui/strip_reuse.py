"""Every use of Textual's private names in the dashboard, behind one version check and an off switch.

The line model (kvtop/ui/panel.py, LinePanel) draws on Textual's public Line API alone. What is here makes a busy
refresh cheaper where the Textual is one it is tested on (``strip_cache_enabled``: 7.0 to 8.x, and
KVTOP_UI_STRIP_CACHE=0 switches it off): StripReuse, the mixin Panel takes only then, hands the compositor a clean
panel's last strips again (Widget._set_dirty tells it when they went stale) and sends changed rows straight to the
screen's set of widgets to repaint; RowStrip and seed_crop make a changed row's strip and its crop without Strip's
seven caches. tests/test_layers.py checks that no other file of kvtop/ui uses a private Textual name;
tests/ui/test_ui_repaint.py that the screen is the same with it off.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rich.cells import cell_len
from rich.segment import Segment
from rich.style import Style as RichStyle
from textual.cache import FIFOCache
from textual.geometry import Region
from textual.strip import Strip
from textual.widget import Widget


def seed_crop(strip: Strip, segments: list[Segment], end: int) -> None:
    """Put ``strip.crop(0, end)`` in the strip's crop cache, made as Strip.crop makes it (the same segments, the
    one cut by the same ``split_cells``) but from the segments in hand: Textual crops every row whose marked
    region stops short of the row's end before writing it, and its general crop (a walk that splits the first
    segment too) cost more than the bytes it saves. Where a Textual's Strip has no such cache, nothing is put."""
    cache = getattr(strip, "_crop_cache", None)  # may lack: Strip's private cache, in any other Textual
    if cache is None:
        return
    out: list[Segment] = []
    pos = 0
    for segment in segments:
        text = segment.text
        end_pos = pos + (len(text) if text.isascii() else cell_len(text))
        if end_pos < end:
            out.append(segment)
            pos = end_pos
        else:
            out.append(segment.split_cells(end - pos)[0])
            break
    cache[(0, end)] = ROW_STRIP(out, end)


# A Strip makes seven caches when it is made (Textual 7.0 to 8.x: FIFOCaches for divide, crop, style, filter, line
# length, crop-and-extend and offsets). A changed row's strip (``Panel._framed``) and its crop are made ~33 times a
# busy refresh and use two of them (the compositor divides the row, the writer crops it), so RowStrip makes each
# cache when it is first asked for: 2.8% of a refresh's instructions (callgrind, bench/bench_ui_refresh.py).
# Strip's private slot names: used only where Strip's slots are exactly these (and with the strip reuse's version
# check and off switch); anything else, and a changed row is a plain Strip.
STRIP_CACHES: dict[str, int] = {"_divide_cache": 4, "_crop_cache": 16, "_style_cache": 16, "_filter_cache": 4,
                                "_line_length_cache": 4, "_crop_extend_cache": 4, "_offsets_cache": 4}
STRIP_SLOTS = frozenset({"_segments", "_cell_length", "_render_cache", "_link_ids", "_cell_count", *STRIP_CACHES})


class RowStrip(Strip):
    """A Strip, the same in every way but when its caches are made (on first use, not all seven in __init__)."""

    __slots__ = ()

    def __init__(self, segments: list[Segment], cell_length: int) -> None:  # not super().__init__: it makes them all
        self._segments = segments   # the caller's new list, never changed after (Strip copies whatever it is given)
        self._cell_length = cell_length
        self._render_cache = None
        self._link_ids = None
        self._cell_count = None

    def __getattr__(self, name: str) -> Any:
        # Only for a slot not set yet: a cache, made now with Strip's own size for it.
        size = STRIP_CACHES.get(name)
        if size is None:
            raise AttributeError(name)
        cache: FIFOCache[Any, Any] = FIFOCache(size)
        setattr(self, name, cache)
        return cache


def row_strip_fits() -> bool:
    slots = getattr(Strip, "__slots__", ())  # may lack: a Strip without slots, in any other Textual
    return set(slots) == STRIP_SLOTS and Strip.__init__.__code__.co_argcount == 3



# Panel.render_lines hands the compositor a clean panel's last strips again. That needs to see every time Textual marks
# the panel dirty, which it does through Widget._set_dirty: a private method, so the reuse is on only for the Textual
# releases it is tested on (.ci/run runs the UI tests on the floor, 7.0.0, and on the pinned 8.2.8) and can be
# switched off (KVTOP_UI_STRIP_CACHE=0). Off, Panel keeps Textual's public Line API alone (render_line per line,
# refresh(*regions) per changed run of lines): the same screen (tests/ui/test_ui_repaint.py runs both paths), at the
STRIP_CACHE_TEXTUAL = ((7, 0), (9, 0))  # [first, past-last) Textual (major, minor) the reuse is tested on
STRIP_CACHE_ENV = "KVTOP_UI_STRIP_CACHE"


def installed_textual_version() -> str | None:
    """Textual's installed version, from its dist-info folder's name beside the package (~1 ms), else from
    importlib.metadata (which scans every installed distribution: 39 ms of start-up on the dev box)."""
    import textual

    here = Path(textual.__file__).resolve().parents[1]
    for info in here.glob("textual-*.dist-info"):
        return info.name[len("textual-"):-len(".dist-info")]
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("textual")
    except PackageNotFoundError:
        return None


def strip_cache_enabled(textual_version: str | None = None, environ: Any = None) -> tuple[bool, str]:
    """Whether Panel reuses its last strips (Textual's private ``Widget._set_dirty``), and why (for the log)."""
    import os

    env = os.environ if environ is None else environ
    if str(env.get(STRIP_CACHE_ENV, "1")).strip().lower() in ("0", "false", "no", "off"):
        return False, f"{STRIP_CACHE_ENV}={env.get(STRIP_CACHE_ENV)}"
    if textual_version is None:
        textual_version = installed_textual_version()
        if textual_version is None:
            return False, "Textual's version is unknown"
    match = re.match(r"(\d+)\.(\d+)", textual_version)
    if match is None:
        return False, f"Textual {textual_version}: not a version kvtop can read"
    first, past = STRIP_CACHE_TEXTUAL
    if not first <= (int(match[1]), int(match[2])) < past:
        return False, f"Textual {textual_version} is outside {first[0]}.{first[1]} to {past[0]}.x, where it is tested"
    if not callable(getattr(Widget, "_set_dirty", None)):  # may lack: a private hook, gone in any release
        return False, f"Textual {textual_version} has no Widget._set_dirty"
    return True, f"Textual {textual_version}"


CACHE_RENDERS, STRIP_CACHE_REASON = strip_cache_enabled()
# The strip a changed row is framed in (Panel._framed, seed_crop: both only on the strip reuse's path).
ROW_STRIP: type[Strip] = RowStrip if CACHE_RENDERS and row_strip_fits() else Strip


class StripReuse(Widget):
    """The strip reuse, mixed into Panel (kvtop/ui/panel.py) only where ``strip_cache_enabled()``: every override of
    a Textual private method and every read of a Textual private name the dashboard makes is here.

    It reads the LinePanel's own line model (``_segments``, ``_line``) and keeps its state in the attributes below,
    which LinePanel makes (and empties on a restyle)."""

    _rendered: tuple[Region, tuple[Any, ...], list[Strip]] | None
    _dirty_rows: set[int]
    _frame: tuple[Any, ...] | None
    _row_ends: dict[int, int]
    _filtered_styles: dict[str | None, RichStyle]
    _screen: Any
    _segments: Callable[..., tuple[list[Segment], int]]
    _line: Callable[[int], Any]

    def _repaint(self, regions: list[Region]) -> None:
        # Changed rows straight to the screen's set of widgets to repaint, as the screen's own Update handler puts
        # them there: Widget.refresh would mark the rows the same way, then clear the panel's layout and style caches
        # (nothing in them changed: a row's text is not its size or its styles) and wake the panel's own message pump
        # only to post an Update message to the screen, one per panel and refresh (~5 a busy refresh). Until the
        # panel was drawn once (the screen's compositor has it), and where a Textual has no such set, Textual's way.
        screen = self._screen
        dirty = getattr(screen, "_dirty_widgets", None)  # may lack: Screen's private set, in any other Textual
        if self._rendered is None or screen is None or not isinstance(dirty, set):
            self.refresh(*regions)
            return
        self._set_dirty(*regions)
        dirty.add(self)
        screen.check_idle()

    def _set_dirty(self, *regions: Region) -> None:
        # Textual's one way of marking a widget's lines for repainting (a refresh, a resize, a restyle, a theme).
        # Regions (content rows) come from update_lines' refresh: only those rows of the last strips are stale;
        # anything else (no region) makes them all stale.
        if regions and self._rendered is not None:
            rows = self._dirty_rows
            for region in regions:
                rows.update(range(region.y, region.bottom))
        else:
            self._rendered = None
            self._frame = None
        super()._set_dirty(*regions)

    def render_lines(self, crop: Region) -> list[Strip]:
        """The panel's strips, border and all: the last ones again while nothing marked the panel dirty, and only
        the changed content rows made afresh when update_lines marked some.

        Textual's compositor renders every widget that overlaps the bounding box of a repaint, and a busy refresh
        changes lines in most panels, so each refresh visited every panel on the screen, restyling (from cache,
        but line by line, with the colour filter) the unchanged panels as well: a third of the compositor's time.
        A changed row is framed here (``_framed``: the border cells Textual drew, around the row's strip, through
        the app's colour filters), not through Textual's general line styling (border, padding, tint, opacity,
        outline and hatch, looked up per line): that path is kept for full repaints, and for any panel whose rows
        it did not draw exactly as ``_framed`` does (checked on every full repaint, in ``_learn_frame``).
        """
        filters = tuple(self.app.get_line_filters())
        rendered = self._rendered
        if rendered is not None and rendered[0] == crop and rendered[1] == filters:
            rows = self._dirty_rows
            if not rows:
                return rendered[2]
            frame = self._frame
            if frame is not None:
                strips = rendered[2].copy()
                top, height = frame[0], frame[1]
                ends = self._row_ends
                for row in rows:
                    if 0 <= row < height:
                        strips[row + top] = self._framed(row, filters, frame, ends.get(row))
                rows.clear()
                ends.clear()
                self._rendered = (crop, filters, strips)
                return strips
        strips = super().render_lines(crop)
        self._dirty_rows.clear()
        self._row_ends.clear()
        self._rendered = (crop, filters, strips)
        self._frame = self._learn_frame(crop, filters, strips)
        return strips

    def _framed(self, row: int, filters: tuple[Any, ...], frame: tuple[Any, ...], end: int | None = None) -> Strip:
        """Content row ``row`` as the compositor wants it: the border cells around the row's segments, in styles
        already through the app's colour filters (resolved once per style string, as for ``render_line``).
        ``end``: the cells of the row update_lines marked, from the left border (the changed part)."""
        _top, _height, left, right, _background, width = frame
        segments, _ = self._segments(self._line(row), self._filtered_styles, frame, filters)
        if left is not None:
            segments.insert(0, left)
            segments.append(right)
        strip = ROW_STRIP(segments, width)
        if end is not None and end < width:
            seed_crop(strip, segments, end)
        return strip

    def _learn_frame(self, crop: Region, filters: tuple[Any, ...], strips: list[Strip]) -> tuple[Any, ...] | None:
        """The border cells of the rows Textual just drew, if ``_framed`` makes every content row exactly as it
        did (same segments, same styles); None keeps Textual's path for this panel until its next restyle."""
        size = self.outer_size
        if crop != size.region or len(strips) != size.height:
            return None
        top = self.content_region.y - self.region.y
        height = self.content_size.height
        if height <= 0 or top < 0 or top + height > len(strips):
            return None
        background = self.background_colors[1]
        first = list(strips[top])
        inner = len(list(self.render_line(0)))
        left: Segment | None
        right: Segment | None
        if len(first) == inner + 2:
            left, right = first[0], first[-1]
        elif len(first) == inner:
            left = right = None
        else:
            return None
        frame = (top, height, left, right, background, size.width)
        self._filtered_styles.clear()
        for row in range(height):
            if list(self._framed(row, filters, frame)) != list(strips[top + row]):
                return None
        return frame
