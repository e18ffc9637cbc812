"""The dashboard's widgets: one per panel, each a noun, each rendering only from the data it was last shown.

How a panel updates (the cost model behind the 3%-of-a-core budget): the app calls ``panel.show(data)`` every
refresh with a small frozen value (the TierModel's own dataclasses, tuples of numbers). The panel compares it
with the last one and calls ``refresh()`` only when it changed, so an idle engine costs no repaints at all and a
busy one repaints only the panels whose figures moved. ``build()`` makes the panel's lines from that data
and the panel's current size, so a resize re-lays text without a new data read, and theme colours are theme
variables (``$kv-gpu``...) resolved at paint time, so a theme change needs no rebuild either.

Where a panel is too small for its full form it drops detail in a fixed order (sparklines, then tokens and
GiB columns, then its border, through the screen's ``-medium`` / ``-compact`` classes) and never wraps.
"""

from __future__ import annotations

import math
import re
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import Any, ClassVar

from rich.cells import cell_len, set_cell_size
from rich.segment import Segment
from rich.style import Style as RichStyle
from textual import events
from textual.app import ComposeResult
from textual.cache import FIFOCache
from textual.containers import VerticalScroll
from textual.content import Content
from textual.geometry import Region
from textual.message import Message
from textual.reactive import reactive
from textual.screen import ModalScreen
from textual.strip import Strip
from textual.style import Style as TextualStyle
from textual.widget import Widget
from textual.widgets import Static

from kvtop.occupancy import cells as bar_cells
from kvtop.occupancy import occupancy
from kvtop.sources.replay import speed_text
from kvtop.ui import format as fmt
from kvtop.ui.themes import tier_glyph, tier_style
from kvtop.values import frozen, mutable

# Styles, as theme variables: themes/*.toml set them (kvtop/ui/themes.py fills in any a theme leaves out). A tier's
# colours are kvtop's colour code (kvtop/palette.py), drawn only through tier_style: GPU, host and disk keep one
# colour each in every panel, and in use / cached / empty are its shades and glyphs.
S_GPU = tier_style("gpu")
S_HOST = tier_style("host")
S_DISK = tier_style("disk")
S_FIG = "bold $kv-figure"
S_DIM = "$kv-dim"
S_SPARK = "$kv-spark"
S_WARN = "bold $warning"
S_ERR = "bold $error"
S_OK = "$success"

# A line is a tuple of (text, style) pairs: built with line_of(), compared as a tuple (so a line whose text or
# colours changed repaints, and one that did not is skipped), painted by Panel._segments. Building Textual Content
# objects instead cost 3x as much per refresh (Content.assemble, cell lengths, span bookkeeping).
Line = tuple[tuple[str, str], ...]
BLANK: Line = ()
_MARGIN: Line = ((" ", ""),)


def line_of(*parts: Any) -> Line:
    """A line from strings (unstyled), (text, style) pairs and other lines."""
    out: list[tuple[str, str]] = []
    for p in parts:
        if isinstance(p, str):
            if p:
                out.append((p, ""))
        elif p:
            if isinstance(p[0], tuple):
                out.extend(p)
            elif p[0]:
                out.append(p)
    return tuple(out)


def styled(text: str, style: str) -> Line:
    return ((text, style),) if text else BLANK


_WIDTHS: dict[str, int] = {}  # the cell width of each non-ASCII text drawn lately: bars, sparklines, arrows


def cells(ln: Line) -> int:
    # ASCII is one cell a character; rich's cell_len (a table lookup per character) only for the rest, once per text.
    n = 0
    for text, _ in ln:
        if text.isascii():
            n += len(text)
            continue
        w = _WIDTHS.get(text)
        if w is None:
            if len(_WIDTHS) >= 4096:
                _WIDTHS.clear()
            w = _WIDTHS[text] = cell_len(text)
        n += w
    return n


# A changed row is written up to its last changed cell only where at least this many cells are left unchanged
# after it: a shorter tail saves fewer bytes than the crop costs (a cut strip, one more region).
TAIL_CELLS = 16


def _changed_end(new: Line, old: Line) -> int:
    """The cell just past the last one that differs between two lines drawn left-aligned on the same blank."""
    end, was = cells(new), cells(old)
    if end != was:
        return max(end, was)   # shifted: everything up to the longer one's end may differ
    i, j = len(new), len(old)
    while i and j and new[i - 1] == old[j - 1]:   # the same tail of (text, style) parts, on the same cells
        i -= 1
        j -= 1
        text = new[i][0]
        end -= len(text) if text.isascii() else cell_len(text)
    return end


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
    cache[(0, end)] = _Row(out, end)


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

    def __init__(self, segments: list[Segment], cell_length: int) -> None:  # noqa: super().__init__ makes them all
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


def _row_strip_fits() -> bool:
    slots = getattr(Strip, "__slots__", ())  # may lack: a Strip without slots, in any other Textual
    return set(slots) == STRIP_SLOTS and Strip.__init__.__code__.co_argcount == 3


PART_CACHE = 4096  # a panel's kept parts (Panel._segments): its styles and the figures drawn lately, a few hundred


def _pad(text: str, width: int, right: bool = True) -> str:
    if len(text) >= width:
        return text
    return text.rjust(width) if right else text.ljust(width)


def _fit(ln: Line, width: int) -> Line:
    """Cut a line to the panel's width, with an ellipsis: a panel never wraps."""
    if cells(ln) <= width:
        return ln
    out: list[tuple[str, str]] = []
    room = max(width - 1, 0)
    style = ""
    for text, style in ln:
        n = cell_len(text)
        if n <= room:
            out.append((text, style))
            room -= n
            continue
        if room:
            out.append((set_cell_size(text, room), style))
        break
    out.append(("…", style))
    return tuple(out)


# Panel.render_lines hands the compositor a clean panel's last strips again. That needs to see every time Textual marks
# the panel dirty, which it does through Widget._set_dirty: a private method, so the reuse is on only for the Textual
# releases it is tested on (.ci/run runs the UI tests on the floor, 7.0.0, and on the pinned 8.2.8) and can be
# switched off (KVTOP_UI_STRIP_CACHE=0). Off, Panel keeps Textual's public Line API alone (render_line per line,
# refresh(*regions) per changed run of lines): the same screen (tests/test_ui_repaint.py runs both paths), at the
# cost of restyling unchanged panels that overlap a repaint (~a third of the compositor's time, see render_lines).
STRIP_CACHE_TEXTUAL = ((7, 0), (9, 0))  # [first, past-last) Textual (major, minor) the reuse is tested on
STRIP_CACHE_ENV = "KVTOP_UI_STRIP_CACHE"


def _textual_version() -> str | None:
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
        textual_version = _textual_version()
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


_CACHE_RENDERS, STRIP_CACHE_REASON = strip_cache_enabled()
# The strip a changed row is framed in (Panel._framed, seed_crop: both only on the strip reuse's path).
_Row: type[Strip] = RowStrip if _CACHE_RENDERS and _row_strip_fits() else Strip


def _lines(lines: Sequence[Line], width: int, height: int) -> list[Line]:
    return [_fit(ln, width) for ln in lines[: max(height, 0)]]


class Panel(Widget):
    """A panel that repaints only the lines whose text or style changed.

    Why line by line (measured, 120x40, dev box): re-rendering a whole bordered panel costs 1-4.7 ms in Textual
    (content to strips, then border, padding and colour filters on every line), so repainting all nine panels
    four times a second would cost 8% of a core on its own. A busy engine changes ~20 lines of the screen per
    refresh; ``show()`` builds the panel's lines (``build()``, ~0.1-0.4 ms), diffs them against the last ones,
    and marks only the changed lines dirty, so Textual restyles and rewrites just those (Textual's Line API:
    ``render_line`` serves each line from a per-line strip cache).

    ``state`` is the panel's health at a glance; its watcher toggles the ``-ok`` / ``-warn`` / ``-unknown`` CSS
    classes that the stylesheet colours (the border, through the theme's ``$success`` / ``$warning``).
    """

    DEFAULT_CSS = """
    Panel { height: auto; }
    """
    # repaint=False: the class change below restyles the panel, which repaints it; a second repaint is waste.
    state: reactive[str] = reactive("ok", repaint=False)

    def __init__(self, *, id: str | None = None, classes: str | None = None):
        super().__init__(id=id, classes=classes)
        self.data: Any = None
        self._lines: list[Line] = []
        self._strips: dict[int, Strip] = {}
        self._rich_styles: dict[str | None, RichStyle] = {}
        self._built_size: tuple[int, int] = (0, 0)
        self._inner: tuple[int, int] | None = None
        self._content_width = 0
        self._row_x = 0          # a panel row, border to border, in content coordinates (update_lines' regions)
        self._row_width = 0
        self._filtered_styles: dict[str | None, RichStyle] = {}
        self._rendered: tuple[Region, tuple[Any, ...], list[Strip]] | None = None
        self._dirty_rows: set[int] = set()
        self._frame: tuple[Any, ...] | None = None  # (top, height, left cell, right cell, background, width)
        self._screen: Any = None  # the screen the panel is on (DOMNode.screen walks up the tree each call)
        self._row_ends: dict[int, int] = {}  # changed row -> cells of it to write, from the left border

    def watch_state(self, old: str, new: str) -> None:
        self.remove_class(f"-{old}", update=False)  # one restyle for the swap, not two
        self.add_class(f"-{new}")

    def on_mount(self) -> None:
        self.add_class(f"-{self.state}")

    def _set_state(self, state: str) -> None:
        # Only a change goes through the reactive (a set of the same value still runs its checks, 4 a refresh).
        if state != self.state:
            self.state = state

    def show(self, data: Any) -> bool:
        """Show new data; returns True when it differed (and the changed lines were marked for repaint)."""
        if data == self.data:
            return False
        self.data = data
        self.update_lines()
        return True

    def build(self) -> Line | list[Line]:
        """The panel's lines for its current data and size (``self.inner``)."""
        return BLANK

    def render(self) -> Content:
        """All lines as one Content (for tests and tools; the screen itself paints line by line)."""
        return Content("\n").join([Content.assemble(*ln) for ln in self._build_lines(*self.inner)])

    def text(self) -> str:
        """The panel's text as shown (tests read it)."""
        return "\n".join("".join(t for t, _ in ln) for ln in self._build_lines(*self.inner))

    def _build_lines(self, width: int, height: int) -> list[Line]:
        out = self.build()
        lines = out[:height] if isinstance(out, list) else [out]
        if len(lines) < height:
            lines += [BLANK] * (height - len(lines))
        # The one-cell margins are drawn here, not with CSS padding: Textual pads every line it restyles, and that
        # was a quarter of the cost of a repainted line (measured: 400 us -> 300 us a line on the dev box).
        return [_MARGIN + ln for ln in lines]

    def update_lines(self, full: bool = False) -> None:
        width, height = self.inner
        if width <= 0 or height <= 0:
            return
        lines = self._build_lines(width, height)
        old = self._lines
        if full or (width, height) != self._built_size or len(lines) != len(old):
            self._lines, self._built_size = lines, (width, height)
            self._strips.clear()
            self.refresh()
            return
        self._lines = lines
        # A region per changed row, from the left border to the last cell that changed: Textual writes a row from
        # the panel's left edge, and stops where the region does, so the unchanged tail of a row (a third of the
        # bytes of the rows a busy refresh rewrites: labels, padding, the right border) is not sent again.
        # Rows next to each other that end at the same cell share one region.
        regions: list[Region] = []
        row_x = self._row_x
        run_start = run_end = -1
        len_run = 0
        for y in range(height):
            new, was = lines[y], old[y]
            if new == was:
                continue
            self._strips.pop(y, None)
            end = _changed_end(new, was) - row_x
            if not 0 < end <= self._row_width - TAIL_CELLS:
                end = self._row_width
            self._row_ends[y] = end
            if run_end == end and run_start + len_run == y:
                len_run += 1
                regions[-1] = Region(row_x, run_start, end, len_run)
                continue
            run_start, run_end, len_run = y, end, 1
            regions.append(Region(row_x, y, end, 1))
        if regions:
            self._repaint(regions)

    def _repaint(self, regions: list[Region]) -> None:
        """Mark content ``regions`` for repainting (Textual's public refresh; see the cached path below)."""
        self.refresh(*regions)

    def on_resize(self) -> None:
        self._inner = None
        self.update_lines(full=True)

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._inner = None
        # Colours come from the theme: a new theme (or a new class) restyles every line.
        self._strips.clear()
        self._rich_styles.clear()
        self._filtered_styles.clear()
        self._rendered = None
        self._frame = None

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
        strip = _Row(segments, width)
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

    def render_line(self, y: int) -> Strip:
        strip = self._strips.get(y)
        if strip is None:
            segments, length = self._segments(self._line(y), self._rich_styles)
            strip = self._strips[y] = Strip(segments, length)
        return strip

    def _line(self, y: int) -> Line:
        width, height = self.inner
        if (width, height) != self._built_size:
            self._lines, self._built_size = self._build_lines(width, height), (width, height)
            self._strips.clear()
        return self._lines[y] if y < len(self._lines) else BLANK

    def _segments(self, ln: Line, cache: dict[str | None, RichStyle], frame: tuple[Any, ...] | None = None,
                  filters: tuple[Any, ...] = ()) -> tuple[list[Segment], int]:
        """One line's segments, each style string resolved once per theme (``$kv-figure bold`` through the
        stylesheet's variables, on the panel's own background). Textual's general path (Content to strips)
        measured 0.85 ms a line; this is ~15 us.

        The line is padded to the content width here, with the blank style Textual would pad it with: a
        shorter strip makes Textual copy it into a new padded one on every repaint (``adjust_cell_length``,
        13% of the dashboard's CPU in a profile of the busy replay)."""
        # Each (text, style) part's segment and width are kept with the styles (the part tuple is the key; a
        # style's key is its string): a busy refresh's ~20 changed rows are mostly the same labels, units and
        # blanks around a few new figures, and the parts seen before are neither measured nor made again.
        if len(cache) > PART_CACHE:
            cache.clear()   # styles too: resolved again on first use (~15 a panel)
        segments = []
        append = segments.append
        length = 0
        for part in ln:
            made = cache.get(part)  # type: ignore[call-overload]
            if made is None:
                text, style = part
                rich = cache.get(style)
                if rich is None:
                    rich = cache[style] = self._resolve(style, frame, filters)
                made = cache[part] = (Segment(text, rich),  # type: ignore[index]
                                      len(text) if text.isascii() else cell_len(text))
            append(made[0])
            length += made[1]
        pad = self._content_width - length
        if pad > 0:
            blank = cache.get(None)
            if blank is None:
                blank = cache[None] = self._resolve(None, frame, filters)
            segments.append(Segment(" " * pad, blank))
            length += pad
        return segments, length

    def _resolve(self, style: str | None, frame: tuple[Any, ...] | None, filters: tuple[Any, ...]) -> RichStyle:
        """A style string as a rich style on this panel (None: the blank that pads a line), and with a frame,
        through the app's line filters as Textual filters each segment (``_learn_frame`` checks it did)."""
        if style is None:
            base_background, background = self.background_colors
            rich = TextualStyle(background=base_background + background).rich_style
        else:
            base = self.visual_style
            rich = (base + self.app.stylesheet.parse_style(style) if style else base).rich_style
        if frame is not None:
            segments = [Segment(" ", rich)]
            for line_filter in filters:
                segments = line_filter.apply(segments, frame[4])
            rich = segments[0].style
        return rich

    @property
    def inner(self) -> tuple[int, int]:
        """The width and height lines are built for (inside the border, less the two one-cell margins)."""
        # content_size recomputes the gutter from the styles on every call (~45 us); the size only changes on a
        # resize or a style change, both of which clear this.
        inner = self._inner
        if inner is None:
            size = self.content_size
            inner = self._inner = (max(size.width - 2, 0), size.height)
            self._content_width = size.width
            self._row_x = self.region.x - self.content_region.x
            self._row_width = self.outer_size.width
            self._screen = self.screen if self.is_mounted else None
        return inner


def _repaint_direct(self: Panel, regions: list[Region]) -> None:
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


if _CACHE_RENDERS:
    Panel._repaint = _repaint_direct  # type: ignore[method-assign]
else:
    # Off: not a line of the private hook is installed; Textual's own render_lines and _set_dirty run as they are.
    del Panel._set_dirty, Panel.render_lines, Panel._framed, Panel._learn_frame


# ------------------------------------------------------------------------------------------------ header

@frozen
class ReplayBadge:
    """A replay's place, as the header's REPLAY badge shows it: whole seconds, so that it is drawn again once a
    second, not at every refresh."""

    position_s: int
    length_s: int | None
    speed: float
    paused: bool = False
    seeking: bool = False

    def text(self) -> str:
        """REPLAY 0:12 / 0:30 x4 (seeking: while a seek folds its way there)."""
        length = "?" if self.length_s is None else replay_clock(self.length_s)
        return (f"REPLAY {replay_clock(self.position_s)} / {length} {speed_text(self.speed)}"
                + (" seeking" if self.seeking else ""))


def replay_clock(s: float) -> str:
    """0:12, 12:05, 1:02:03: a position in a recording."""
    n = max(0, int(s))
    h, rest = divmod(n, 3600)
    return f"{h}:{rest // 60:02d}:{rest % 60:02d}" if h else f"{rest // 60}:{rest % 60:02d}"


def replay_badge(player: Any) -> ReplayBadge:
    """The badge of a ReplayPlayer (kvtop/sources/replay.py) now."""
    length = player.length_s
    return ReplayBadge(int(player.position_s), None if length is None else round(length),
                       player.speed, player.paused, player.seeking)


@frozen
class HeaderData:
    engine: str | None
    engine_version: str | None
    model: str | None
    gpu: str | None
    simulated: bool
    sim_reason: str | None
    tokens_per_block: int | None
    bytes_per_block: int | None
    uptime_s: float | None
    data_time: float | None
    paused: bool
    stale_s: float | None          # seconds since the last record, once it is past STALE_AFTER_S
    flags: tuple[str, ...]         # data-quality notes, short ("≈ counts", "events dropped 12")
    sources: tuple[tuple[str, str], ...]  # (name, status) for the ones that are not "ok"/"done"
    source_label: str | None       # "2/3 host/0/run" when several sources are attached
    finished: str | None = None    # why no more data comes ("replay finished", "--duration 30 s reached")
    paused_at: float | None = None  # paused: the data time of the frozen figures
    stats_schema: str | None = None  # which TensorRT-LLM's stats the numbers come from: 1.0-1.2, 1.3, 1.3+ V2
    # the verdict per tier below the GPU (kvtop/tiers/verdict.py): its own line under the header
    verdict: tuple[VerdictLine, ...] = ()
    replay: ReplayBadge | None = None   # a replay's place and speed (its own clock), None live
    refresh_s: float | None = None      # the refresh interval, where + / - moved it off the default


@frozen
class VerdictLine:
    says: str        # pays | costs | idle | none | unknown
    text: str        # "host tier: pays, -38 ms TTFT p50 on 31% of requests, 4.1 s of prefill saved per minute"
    basis: str       # "measured", "measured prefill", "estimated", "not priced": what the figures rest on
    short: str       # "host: pays, -38 ms TTFT p50 on 31%, +4.1 s/min": where the line is narrow
    tier: str = ""   # the tier it is about ("host", "disk"): its name in the text is drawn in the tier's colour


# Between the header's parts (model │ GPU │ engine): a rule, not spaces, so that "Qwen3-8B  up" never reads as one.
_SEP = (" │ ", S_DIM)

_VERDICT_STYLE = {"pays": "bold $success", "costs": "bold $error", "idle": "bold $warning"}


def verdict_line(verdicts: tuple[VerdictLine, ...], width: int) -> Line:
    """The answer in one line: each tier's verdict in words, coloured by what it says, with what it rests on
    (a presenter points at it; "estimated" says the figures are the cost model's, not the engine's). The longest
    form that fits: the sentence, else the short form with its basis, else the short form alone (cut to fit)."""
    def build(text: Callable[[VerdictLine], str], basis: bool, head: str) -> Line:
        parts: list[Any] = [(head, "bold $primary")] if head else []
        for i, v in enumerate(verdicts):
            if i:
                parts.append(("  ·  ", S_DIM))
            said, style = text(v), _VERDICT_STYLE.get(v.says, S_DIM)
            name, colon, rest = said.partition(":")
            if v.tier and colon and name.split()[0].lower() == v.tier.lower():
                # "host tier: pays, ...": the tier's name in its colour, what it says in the verdict's
                parts += [(name, tier_style(v.tier, bold=True)), (colon + rest, style)]
            else:
                parts.append((said, style))
            if basis and v.says != "none":
                parts.append((f" ({v.basis})", S_DIM))
        return line_of(*parts)

    ln = build(lambda v: v.text, True, "verdict ")
    for text, basis, head in ((lambda v: v.short, True, "verdict "), (lambda v: v.short, True, ""),
                              (lambda v: v.short, False, "")):
        if cells(ln) <= width:
            break
        ln = build(text, basis, head)
    return _fit(ln, width)


# The header's fields other than its two clocks: equal in two HeaderData, and both clocks on the same second, the
# header draws the same two lines (build shows the uptime in whole seconds, the data time to the second).
_HEADER_STEADY = tuple(f.name for f in fields(HeaderData) if f.name not in ("uptime_s", "data_time"))


def _shown_second(t: float | None) -> Any:
    """The second a clock reads on screen: fmt.duration shows int(s) (0 under one), time.localtime the floor."""
    if t is None:
        return None
    if not math.isfinite(t):
        return t   # no second; NaN never equals itself, so such data is drawn afresh
    return math.floor(t)


def same_header(a: HeaderData, b: HeaderData) -> bool:
    """Whether ``a`` and ``b`` draw the same header: the busy refresh's data differ by their clocks alone 3
    refreshes in 4 (both move a quarter of a second), and the header was built and compared whole for them."""
    if a.paused_at is not None or b.paused_at is not None:
        return a == b   # paused, the header shows how far the engine went on, rounded: every change is drawn
    if _shown_second(a.data_time) != _shown_second(b.data_time):
        return False
    ua, ub = a.uptime_s, b.uptime_s
    if (ua is None) != (ub is None) or (ua is not None and fmt.duration(ua) != fmt.duration(ub)):
        return False
    return all(getattr(a, name) == getattr(b, name) for name in _HEADER_STEADY)


class HeaderBar(Panel):
    """Engine, version, model, SIM badge, block size, uptime; data freshness and quality badges."""

    def show(self, data: Any) -> bool:
        old = self.data
        if isinstance(old, HeaderData) and isinstance(data, HeaderData) and self._lines and same_header(old, data):
            self.data = data   # the newest figures, for readers; the lines on screen are what they would build
            return False
        return super().show(data)

    def build(self) -> Line | list[Line]:
        d: HeaderData | None = self.data
        width, height = self.inner
        if d is None:
            return line_of(("kvtop", "bold"), "  waiting for the engine...")
        engine = d.engine_version or d.engine or "engine ?"
        model = d.model or "model ?"
        badge: list[Any] = []
        if d.simulated:
            badge = [(" SIM ", "bold reverse $kv-sim-badge"), " "]
        # Three states, three looks: paused (the screen froze, the engine goes on), finished (no more data will
        # come, the figures are final) and stale (data should come and has not: the only alarm of the three).
        paused = [(" PAUSED ", "bold reverse $primary"), " "] if d.paused else []
        if d.finished:
            paused = [*paused, (" FINISHED ", "bold reverse $success"), " "]
        if d.replay is not None:   # where the replay is, by its own clock, and how fast it goes
            paused = [(f" {d.replay.text()} ", "bold reverse $accent"), " ", *paused]
        up = fmt.duration(d.uptime_s)
        clock = time.strftime("%H:%M:%S", time.localtime(d.data_time)) if d.data_time is not None else "--:--:--"
        block = []
        if d.tokens_per_block is not None:
            block.append(f"{d.tokens_per_block} tok/blk")
        if d.bytes_per_block is not None:
            block.append(f"{fmt.nbytes(d.bytes_per_block)}/blk")
        if d.stats_schema not in (None, "1.0-1.2"):  # 1.0-1.2 is what every count assumes unless said
            block.append(f"stats {d.stats_schema}")
        status: list[Any] = []
        state_long: list[Any] = []
        state_short: list[Any] = []
        if d.finished:
            state_short = [(d.finished, "$success"), " "]
            state_long = [(d.finished, "$success"), (" · final figures · q quits ", S_DIM)]
        elif d.replay is not None and d.replay.paused:
            state_short = [("p plays ", S_DIM)]
            state_long = [("replay paused · p plays · ←→ seek 5 s · . steps 1 s · +- speed ", S_DIM)]
        elif d.paused:
            frozen = time.strftime("%H:%M:%S", time.localtime(d.paused_at)) if d.paused_at is not None else "?"
            ahead = (d.data_time - d.paused_at if d.data_time is not None and d.paused_at is not None else None)
            state_short = [("frozen ", S_DIM), (frozen, "bold"), " "]
            state_long = [(f"frozen at {frozen}", S_DIM),
                          (f" · engine goes on, +{ahead:.0f} s" if ahead else " · engine goes on", S_DIM),
                          (" · p resumes ", S_DIM)]
        if d.stale_s is not None:
            status += [(f" no data {d.stale_s:.0f}s ", "bold reverse $warning"), " "]
        for name, st in d.sources:
            status += [(f" {name} {st} ", "bold reverse $error" if st in ("failed", "error", "disconnected")
                        else "reverse $warning"), " "]
        for flag in d.flags:
            status += [(f" {flag} ", "reverse $warning"), " "]
        # The verdict's line, where the header has a row for it (kvtop.tcss gives one in every layout).
        verdict = verdict_line(d.verdict, width) if d.verdict and height >= 2 else None
        if verdict is not None:
            height -= 1
        if height <= 1 or width < 60:
            # One line: pieces in order of importance, each added only while it fits whole, each after a separator.
            short_model = model.split("/")[-1]
            pieces: list[Line] = [line_of(("kvtop ", "bold $primary"), *paused, *badge, (short_model, S_FIG)),
                                     line_of(_SEP, ("up ", S_DIM), (up, S_FIG))]
            if status or state_short:
                pieces.append(line_of(_SEP, *state_short, *status))
            pieces += [line_of(_SEP, ("data ", S_DIM), (clock, "bold")),
                       line_of(_SEP, (d.gpu or "GPU ?", tier_style("gpu", bold=True)))]
            if block:
                pieces.append(line_of(_SEP, (" · ".join(block), S_DIM)))
            out = pieces[0]
            for piece in pieces[1:]:
                if cells(out) + cells(piece) <= width:
                    out = line_of(out, piece)
            return [_fit(out, width), verdict] if verdict is not None else _fit(out, width)
        # Model, GPU, engine and source, each after a separator (the GPU in its tier's colour).
        line1 = line_of(("kvtop ", "bold $primary"), *paused, *badge, (model, S_FIG), _SEP,
                         (d.gpu or "GPU ?", tier_style("gpu", bold=True)), _SEP, engine,
                         *([_SEP, (d.source_label, "bold")] if d.source_label else []))
        right = line_of(("data ", S_DIM), (clock, "bold"), _SEP, ("up ", S_DIM), (up, S_FIG),
                        *([_SEP, ("refresh ", S_DIM), (f"{d.refresh_s:g} s", S_FIG)]
                          if d.refresh_s is not None else []))
        # The state and the alarms first: where the line is cut, it is the simulator's reason that goes.
        line2_left: list[Any] = [*state_long, *status]
        line2_left += [(" · ".join(block) or "block size ?", "bold")]
        if d.simulated:
            line2_left += [_SEP, ("simulated: ", S_DIM), (d.sim_reason or "built-in simulator", "$kv-sim-badge")]
        line2_left.append("  ")
        line2 = line_of(*line2_left)
        gap = width - cells(line2) - cells(right)
        if gap >= 1:
            line2 = line_of(line2, " " * gap, right)
        else:
            line1_gap = width - cells(line1) - cells(right)
            if line1_gap >= 1:
                line1 = line_of(line1, " " * line1_gap, right)
        if verdict is not None:
            return _lines([line1, line2], width, height) + [verdict]
        return _lines([line1, line2], width, height)


# ------------------------------------------------------------------------------------------------ tiers

@frozen
class TierData:
    label: str                 # "GPU" / "host" / "disk"
    medium: str                # "HBM" / "pinned DRAM"
    state: Any                 # kvtop.tiers.TierState
    note: str | None = None    # why a tier is unknown or absent, in words
    history: tuple[float | None, ...] = ()  # the headline share per history step (200x60 only)


# A tier's name (TierState.name) -> its label and medium on screen; a tier kvtop does not know keeps its own name.
TIER_LABELS: dict[str, tuple[str, str]] = {"gpu": ("GPU", "HBM"), "host": ("host", "pinned DRAM"),
                                           "disk": ("disk", "file / NVMe")}


def tier_label(name: str) -> tuple[str, str]:
    return TIER_LABELS.get(name.lower(), (name, ""))


class TierPanel(Panel):
    """One tier as one stacked bar, in use | cached and idle | empty, whose parts never overlap and add up to the
    pool (kvtop.occupancy), with the exact counts beside it.

    TensorRT-LLM's own counts overlap (a running request holds blocks that are also cached; its "free" counts the
    cached-and-idle blocks): its "free" is shown as what it is, cached idle + empty (the bracket beside those two
    rows), and the help says so. The headline is the number that moves: the GPU's share in use (its cached share
    sits near 100% on any busy engine), the host's share cached (nothing stays in use on the host in 1.0-1.2).
    """

    GPU_HINT = "TensorRT-LLM's free = cached idle + empty"
    HOST_HINT = "offloaded on GPU eviction, kept for reuse"

    def on_mount(self) -> None:
        super().on_mount()
        self._title()

    def on_resize(self) -> None:
        super().on_resize()
        self._title()   # the subtitle's detail follows the width

    def show(self, data: Any) -> bool:
        changed = super().show(data)
        if changed:
            self._title()
            self._set_state(self._health())
            none = data.state.capacity_blocks == 0
            if self.has_class("-none") != none:   # a class change restyles: only when it changes
                self.set_class(none, "-none")
        return changed

    def _health(self) -> str:
        d: TierData | None = self.data
        if d is None or d.state.capacity_blocks is None or d.state.free_blocks is None:
            return "unknown"
        st = d.state
        if not st.capacity_blocks:
            return "ok"
        if d.label == "GPU":
            # Little of the pool left for new requests: admission will soon wait (GUARANTEED_NO_EVICT).
            left = st.free_blocks
        else:
            # Host blocks are never held for long, so "free" is always ~all of them; what matters is whether
            # the pool is full of cached blocks, where every new offload drops the oldest one.
            left = st.capacity_blocks - (st.in_use_blocks or 0) - (st.cached_blocks or 0)
        # Hysteresis (warn under 10% left, clear over 15%): a pool hovering at the line would otherwise flip the
        # class, and a class change restyles and repaints the whole panel, several times a second.
        limit = 0.15 if self.state == "warn" else 0.10
        return "warn" if left < limit * st.capacity_blocks else "ok"

    def _title(self) -> None:
        d: TierData | None = self.data
        if d is None:
            return
        st = d.state
        title = f"{d.label} tier · {d.medium}" if d.medium else f"{d.label} tier"
        if st.capacity_blocks is None:
            subtitle = "capacity unknown"
        elif st.capacity_blocks == 0:
            subtitle = "none"
        else:
            parts = [f"{fmt.count(st.capacity_blocks)} blocks"]
            tok = st.capacity_tokens
            # The border has room for the tokens from ~44 cells (80x24's 40-cell panels cut the GiB off)
            if tok is not None and self.size.width >= 44:
                parts.append(f"{fmt.count(tok)} tok")
            parts.append(fmt.gib(st.capacity_bytes, "?") + " GiB")
            subtitle = " · ".join(parts)
        # A title change repaints the whole panel (its border): only when it really changed.
        if self.border_title != title:
            self.border_title = title
        if self.border_subtitle != subtitle:
            self.border_subtitle = subtitle

    def _rows(self) -> tuple[tuple[str, str, int | None, str], ...]:
        """(name, style, blocks, glyph) for the three parts, in bar order: the tier's colour and its shades."""
        d: TierData = self.data
        o = occupancy(d.state)
        idle_name = "cached idle" if d.label == "GPU" else "cached"
        parts = (("in use", "in-use", o.in_use), (idle_name, "cached", o.cached_idle), ("empty", "empty", o.empty))
        return tuple((name, tier_style(d.label, state), blocks, tier_glyph(state)) for name, state, blocks in parts)

    @staticmethod
    def _share(part: int | None, whole: int | None) -> str:
        """A part of the pool in whole percent, "<1%" for a part that is there but rounds to 0 (8 blocks of a
        6,781-block host pool read "0%", as if none)."""
        if part is None or not whole:
            return "?"
        if 0 < part < 0.005 * whole:
            return "<1%"
        return fmt.pct(part / whole, digits=0)

    def _headline(self, short: bool = False) -> Line:
        """GPU: the share in use; other tiers: the share cached (what moves there)."""
        d: TierData = self.data
        o = occupancy(d.state)
        cap = o.capacity
        if d.label == "GPU":
            part, word = o.in_use, "in use" if not short else "use"
        else:
            part, word = o.cached_idle, "cached"
        return line_of((_pad(self._share(part, cap), 4), S_FIG), (f" {word}", S_DIM))

    def _bar(self, width: int) -> Line:
        """The stacked bar: in use | cached idle | empty, cells adding up to ``width``. Unknown parts are drawn
        dotted: with no KV events the GPU's free blocks cannot be split into cached and empty."""
        d: TierData = self.data
        o = occupancy(d.state)
        cap = o.capacity
        if cap is None or o.in_use is None:
            text = " unknown "
            side = max(width - len(text), 0)
            return line_of(("╌" * (side // 2), S_DIM), (text, S_DIM), ("╌" * (side - side // 2), S_DIM))
        rows = self._rows()
        if o.cached_idle is None or o.empty is None:
            # The rest, cached or empty, unknown: dashed, as the unknown bar is (░ is the empty blocks' glyph)
            used, rest = bar_cells((o.in_use, cap - o.in_use), cap, width)
            return line_of((rows[0][3] * used, rows[0][1]), ("╌" * rest, S_DIM))
        cut = bar_cells((o.in_use, o.cached_idle, o.empty), cap, width)
        return line_of(*((glyph * n, style) for n, (_, style, _, glyph) in zip(cut, rows)))

    def build(self) -> Line | list[Line]:
        d: TierData | None = self.data
        width, height = self.inner
        if d is None or width <= 0 or height <= 0:
            return BLANK
        st = d.state
        if st.capacity_blocks == 0:
            # Said in full within 36 cells (80x24): what "none" means for the blocks the GPU evicts.
            lines = [line_of((f"{d.label}: ", "bold"), (d.note or "none (host_cache_size = 0)", S_DIM))]
            if d.label == "host" and not d.note:
                lines.append(styled("evicted GPU blocks are dropped", S_DIM))
            return _lines(lines, width, height)
        o = occupancy(st)
        cap = o.capacity
        approx = st.cached_approximate or not o.exact
        rows = self._rows()
        if height <= 2:
            # Compact: "GPU ████████████ 25% use" / "use 64 · idle 161 · empty 31".
            label = f"{d.label:<4} "
            head = self._headline(short=True)
            bar_w = max(width - len(label) - cells(head) - 1, 1)
            line1 = line_of((label, "bold"), self._bar(bar_w), " ", head)
            short = {"in use": "use", "cached idle": "idle", "cached": "cached", "empty": "empty"}
            parts: list[Any] = []
            for name, style, blocks, glyph in rows:
                parts += [(glyph, style), f" {short[name]} ", (fmt.count(blocks), S_FIG),
                          ("≈" if approx and name.startswith("cached") and blocks is not None else "", S_WARN), "  "]
            return _lines([line1, line_of(*parts[:-1])], width, height)

        # The rows: name, blocks, %, GiB, tokens; columns drop right to left when narrow.
        show_tokens = width >= 60
        show_gib = width >= 44
        name_w = 12 if width >= 40 else 11
        if height >= self.THICK_FROM and width >= 60:
            lines = self._thick_bar(width)
        else:
            head = self._headline()
            lines = [line_of(self._bar(max(width - cells(head) - 1, 1)), " ", head)]
        if height >= 7:
            header = f"{'':{name_w + 2}}{'blocks':>6}{'%':>5}" + (f"{'GiB':>7}" if show_gib else "") + \
                     (f"{'tokens':>9}" if show_tokens else "")
            lines.append(styled(header, S_DIM))
        free = o.free
        for i, (name, style, blocks, glyph) in enumerate(rows):
            unknown = blocks is None
            parts = [(glyph, style), " ", (f"{name:<{name_w}}", "bold"),
                     (_pad("?" if unknown else fmt.count(blocks), 6), S_DIM if unknown else S_FIG),
                     (_pad(self._share(blocks, cap), 5), S_DIM)]
            if show_gib:
                parts.append(_pad(fmt.gib(st.bytes(blocks), "?"), 7))
            if show_tokens:
                parts.append((_pad(fmt.count(st.tokens(blocks), "?"), 9), S_DIM))
            # "≈" once, on the cached row (empty is the rest of "free", so it is as approximate).
            parts.append((" ≈", S_WARN) if i == 1 and approx and not unknown else "  ")
            if i == 1 and d.label == "GPU":
                # TensorRT-LLM's "free" is these two rows together: a bracket says so.
                parts += [(" ┐ ", S_DIM), ("free" if width < 60 else "TensorRT-LLM's free", S_DIM)]
            elif i == 2 and d.label == "GPU":
                parts += [(" ┘ ", S_DIM), (fmt.count(free), S_FIG),
                          (f" {fmt.pct(free / cap if cap and free is not None else None, digits=0)}"
                           if width >= 60 else "", S_DIM)]
            lines.append(line_of(*parts))
        if o.cached_idle is None and height > len(lines):
            why = d.note or "no KV events: cached vs empty unknown"
            lines.append(styled(why, S_WARN))
        if height >= 8 and len(lines) < height - 1:
            tree = st.cached_blocks
            if tree is not None:
                idle = o.cached_idle or 0
                lines.append(line_of(("reuse tree ", S_DIM), (fmt.count(tree), S_FIG),
                                     (" blocks (cached, idle or held)" if d.label == "GPU" else " blocks", S_DIM),
                                     *([(f" · idle {fmt.count(idle)}-{fmt.count(idle + o.slack)}", S_DIM)]
                                       if o.slack else [])))
        if len(lines) < height:
            hint = d.note or (self.GPU_HINT if d.label == "GPU" else self.HOST_HINT)
            lines.append(styled(hint, S_WARN if d.note else S_DIM))
        if d.history and len(lines) < height - 1:
            # 200x60: the headline share over time, one cell a step, on a fixed 0-100% scale, as tall as the
            # panel's rows left (six at 200x60, two with a disk tier), the label and span on its bottom row.
            spark_w = max(width - 16, 1)
            rows = min(height - len(lines) - 1, 6)
            label = f"{'in use' if d.label == 'GPU' else 'cached'} % "
            chart = fmt.sparkrows(d.history, spark_w, rows, top=1.0)
            lines.append(BLANK)
            lines += [line_of((" " * len(label), ""), (row, tier_style(d.label))) for row in chart[:-1]]
            lines.append(line_of((label, S_DIM), (chart[-1], tier_style(d.label)),
                                 (f" {min(len(d.history), spark_w):>3}s", S_DIM)))
        return _lines(lines, width, height)

    THICK_FROM = 12   # content rows from which the bar is three rows thick, its share in big digits (200x60)

    def _thick_bar(self, width: int) -> list[Line]:
        """The bar three rows thick, the headline share beside it in GLYPHS (the back of the room reads it), the
        word under what it counts on the middle row."""
        d: TierData = self.data
        o = occupancy(d.state)
        part = o.in_use if d.label == "GPU" else o.cached_idle
        big = [row.rjust(10) for row in big_figure(self._share(part, o.capacity))]  # "100%" is 10 cells
        word = " in use" if d.label == "GPU" else " cached"
        bar = self._bar(max(width - len(big[0]) - len(word) - 1, 1))
        return [line_of(bar, " ", (b, S_FIG), (word if i == 1 else " " * len(word), S_DIM)) for i, b in enumerate(big)]


# ------------------------------------------------------------------------------------------------ hit rate

@frozen
class WhatIfData:
    """The size-advice line's figures (kvtop.tiers.sizeadvice): the hit rate at host sizes 0, ½, 1, 2 and 4 times
    the host pool, the run's own at 1 (its cumulative rate: one span, one definition), with the optimum beside."""

    host_blocks: int | None                  # the host pool the multiples are of (0: no host cache)
    # (label, hit rate, optimal hit rate) per size, in size order; a figure None until known
    points: tuple[tuple[str, float | None, float | None], ...] = ()
    advice: str | None = None                # the recommendation in words


CURVE_SIZES = (("0", 0.0), ("½", 0.5), ("1", 1.0), ("2", 2.0), ("4", 4.0))  # the line's sizes, x the host pool


def what_if_data(advice: Mapping[str, Any]) -> WhatIfData:
    """``Session.size_advice()``'s summary as the line's figures: the points at ``CURVE_SIZES`` (a figure the
    advice lacks reads "?")."""
    host = advice.get("host_blocks")
    host = host if isinstance(host, int) else None
    by_size = {p.get("host_blocks"): p for p in advice.get("points") or () if isinstance(p, dict)}
    points = []
    for label, f in CURVE_SIZES:
        p = by_size.get(round(f * host)) if host is not None else None
        points.append((label, None if p is None else p.get("hit_rate"),
                       None if p is None else p.get("optimal_hit_rate")))
    rec = advice.get("recommendation") or {}
    return WhatIfData(host, tuple(points), rec.get("text") if isinstance(rec, dict) else None)


@frozen
class HitData:
    hit: Any                            # kvtop.tiers.HitRate
    history: tuple[float | None, ...]   # hit rate per history step, oldest first
    window_s: float | None
    # Live what-if (kvtop.tiers.whatif); None hides the line (a session without the estimate, or another
    # source shown).
    what_if: WhatIfData | None = None


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


class HitRatePanel(Panel):
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
        ext = getattr(h, "external", None) is not None or getattr(h, "window_external", None) is not None
        # With more than two shares the row may not fit: one-space gaps, then whole percents and the tiers'
        # initials (in their colours), rather than a row cut short (a 36-cell panel at 80x24 holds GPU, host,
        # disk as "G 30% h 0% d 20%")
        full = ("GPU", "host", "disk", "ext")
        Mode = tuple[str, tuple[str, ...], int]   # the gap, the tiers' names, the digits

        def row(label: str, total: float | None, gpu: float | None, host: float | None,
                on_disk: float | None = None, outside: float | None = None, mode: Mode = (gap, full, 1)) -> Line:
            sep, names, digits = mode
            parts: list[Any] = [(f"{label:<6}", S_DIM), (_pad(fmt.pct(total), 6), S_FIG)]
            for tier, value, style, shown in ((0, gpu, S_GPU, True), (1, host, S_HOST, True),
                                              (2, on_disk, S_DISK, disk), (3, outside, S_DIM, ext)):
                if shown:   # each tier's name and share in its colour (kvtop/palette.py)
                    parts += [sep, (names[tier], style), " ",
                              (_pad(fmt.pct(value, digits=digits), 4 + 2 * digits), style)]
            return line_of(*parts)

        mode: Mode = (gap, full, 1)
        if disk or ext:
            for candidate in ((gap, full, 1), (" ", full, 1), (" ", full, 0), (" ", ("G", "h", "d", "x"), 0)):
                mode = candidate
                if cells(row("total", h.cumulative, h.gpu, h.host, h.disk, getattr(h, "external", None),
                             mode)) <= width:
                    break

        if height == 1:
            tail = [" ", ("disk", S_DISK), " ", (fmt.pct(h.window_disk, digits=0), S_DISK)] if disk else []
            if ext:
                tail += [(" ext ", S_DIM), fmt.pct(h.window_external, digits=0)]
            return _lines([line_of(("hit ", "bold"), (fmt.pct(h.window), S_FIG), " ", ("GPU", S_GPU), " ",
                                    (fmt.pct(h.window_gpu, digits=0), S_GPU), " ", ("host", S_HOST), " ",
                                    (fmt.pct(h.window_host, digits=0), S_HOST), *tail, (" total ", S_DIM),
                                    fmt.pct(h.cumulative, digits=0))], width, height)
        lines: list[Line] = []
        if height >= 6:
            # Whole percent in the big figure: the back of the room needs 38%, and the row under it has 38.5%.
            # It also changes four times less often than a one-decimal figure, so three fewer lines repaint.
            big = big_figure(fmt.pct(h.window, unknown="--%", digits=0))
            label = [f"  over {win}", "  blocks reused /", "  blocks looked up"]
            lines += [line_of((b, S_FIG), (lab, S_DIM)) for b, lab in zip(big, label)]
        lines += [row(win, h.window, h.window_gpu, h.window_host, h.window_disk, getattr(h, "window_external", None),
                      mode),
                  row("total", h.cumulative, h.gpu, h.host, h.disk, getattr(h, "external", None), mode)]
        curve_lines: list[Line] = []
        if d.what_if is not None and height >= 3:
            # Before the sparkline: where the panel has one line to spare (80x24), the curve gets it.
            w = d.what_if
            if w.host_blocks == 0:
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
        return _lines(lines, width, height)


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


# ------------------------------------------------------------------------------------------------ moves

@frozen
class MovesData:
    rates: Any                      # kvtop.tiers.Rates
    moves: Any                      # kvtop.tiers.Moves
    history: tuple[tuple[float, ...], ...]  # (offload, onboard, evict GPU, evict host) per step
    known: bool = True              # False: moves come from KV events and none were seen (shown as "?", not 0)
    # why blocks left their tier since start, each count marked "engine" (its events say it) or "inferred"
    # (kvtop/tiers/departures.py describe); None: none left
    left: str | None = None


class MovesPanel(Panel):
    """Blocks moved per second over the window, totals since start, history per row."""

    # (verb, from tier, to tier, rate, total, sparkline style): a move's sparkline is in the colour of the tier
    # its blocks land in; an eviction's in the shade of the tier that dropped them (it dropped cached blocks).
    ROWS = (("offload", "GPU", "host", "offloaded_per_s", "offloaded_blocks", S_HOST),
            ("onboard", "host", "GPU", "onboarded_per_s", "onboarded_blocks", S_GPU),
            ("evict", "GPU", "", "evicted_gpu_per_s", "evicted_gpu_blocks", tier_style("gpu", "cached")),
            ("evict", "host", "", "evicted_host_per_s", "evicted_host_blocks", tier_style("host", "cached")))

    def on_mount(self) -> None:
        super().on_mount()
        self.border_title = "Block moves /s"

    def build(self) -> Line | list[Line]:
        d: MovesData | None = self.data
        width, height = self.inner
        if d is None:
            return BLANK
        def rate(attr: str) -> str:
            return fmt.rate(getattr(d.rates, attr) if d.known else None)

        if height == 1:
            line = line_of(("moves/s ", "bold"), ("off", S_HOST), " ", (rate("offloaded_per_s"), S_FIG),
                            " ", ("on", S_GPU), " ", (rate("onboarded_per_s"), S_FIG), (" ev ", S_DIM),
                            (rate("evicted_gpu_per_s"), S_FIG), "/", (rate("evicted_host_per_s"), S_FIG))
            return _fit(line, width)
        show_total = width >= 40
        base = 8 + 9 + 7 + (9 if show_total else 0)
        spark_w = width - base - 1
        lines: list[Line] = []
        # Two rows a move where the panel has them (200x60): its sparkline twice as tall
        tall = 2 if height >= 2 * len(self.ROWS) + 1 else 1
        disk = getattr(d.moves, "disk", False)
        for i, (verb, src, dst, rate_attr, total_attr, style) in enumerate(self.ROWS):
            if disk and height < 5 and i == 2:
                # 4 lines and a disk row to show (80x24): the two evict rows as one, without their sparklines
                lines.append(line_of(("evict   ", "bold"), ("GPU", S_GPU), " ", (rate("evicted_gpu_per_s"), S_FIG),
                                      "  ", ("host", S_HOST), " ", (rate("evicted_host_per_s"), S_FIG)))
                continue
            if disk and height < 5 and i == 3:
                continue
            where = [(src, tier_style(src))] + ([("→", S_DIM), (dst, tier_style(dst))] if dst else [])
            pad = 9 - len(src) - (len(dst) + 1 if dst else 0)
            parts: list[Any] = [(f"{verb:<8}", "bold"), *where, " " * pad, (_pad(rate(rate_attr), 7), S_FIG)]
            chart: list[str] = []
            if spark_w >= 6 and d.known:
                chart = fmt.sparkrows([h[i] for h in d.history], spark_w, tall)
                parts += [" ", (chart[-1], style)]
            elif spark_w >= 6:
                parts += [" ", ("no events"[:spark_w].ljust(spark_w), S_DIM)]
            if show_total:
                parts.append((_pad(fmt.count(getattr(d.moves, total_attr) if d.known else None), 9), S_DIM))
            # the chart's upper rows above the row of figures, aligned with its bottom row
            lines += [line_of((" " * (base - 9 * show_total + 1), ""), (row, style)) for row in chart[:-1]]
            lines.append(line_of(*parts))
        if disk:
            # the disk tier's moves (Moves.disk_*), one row: disk -> host (a prefetch), disk -> GPU, and into the
            # disk; before the link row, which a 5-line panel then has no room for
            lines.append(line_of(("disk    ", "bold"), ("→", S_DIM), ("host", S_HOST), " ",
                                  (rate("disk_prefetched_per_s"), S_FIG), ("  →", S_DIM), ("GPU", S_GPU), " ",
                                  (rate("disk_onboarded_per_s"), S_FIG), ("  in ", S_DIM),
                                  (rate("disk_offloaded_per_s"), S_FIG)))
        if height >= len(lines) + 1:
            r = d.rates
            lines.append(line_of(("link    ", "bold"), ("→", S_DIM), ("host", S_HOST), " ",
                                  (fmt.nbytes(r.offloaded_bytes_per_s) + "/s", S_FIG), ("  →", S_DIM),
                                  ("GPU", S_GPU), " ",
                                  (fmt.nbytes(r.onboarded_bytes_per_s) + "/s", S_FIG)))
        if height >= 6 and d.left:
            lines.append(_fit(line_of(("left    ", "bold"), (d.left, S_DIM)), width))
        return _lines(lines, width, height)


# ------------------------------------------------------------------------------------------------ priorities

@frozen
class PriorityData:
    rows: tuple[tuple[int | None, int, int, float | None], ...]  # (priority, GPU blocks, host blocks, req hit rate)
    gpu_capacity: int | None
    host_capacity: int | None
    # Per row (same order): the requests' hit rate served by the GPU and by the host, where known; and the block
    # size for GiB. Shown where the panel is wide (200x60).
    split: tuple[tuple[float | None, float | None], ...] = ()
    bytes_per_block: int | None = None


class PriorityPanel(Panel):
    """Cached blocks by retention priority in each tier, and the hit rate of requests sent at that priority."""

    def on_mount(self) -> None:
        super().on_mount()
        self.border_title = "Cached by priority"

    def build(self) -> Line | list[Line]:
        d: PriorityData | None = self.data
        width, height = self.inner
        if d is None:
            return BLANK
        if not d.rows:
            return _lines([styled("no cached blocks yet", S_DIM)], width, height)
        if height == 1:
            parts: list[Any] = [("prio ", "bold")]
            for prio, g, h, _ in d.rows:
                parts += [(f"{'?' if prio is None else prio}:", S_DIM), (f"{fmt.count(g + h)} ", S_FIG)]
            return _fit(line_of(*parts), width)
        detail = width >= 100 and bool(d.split)
        extra = 40 if detail else 0   # GiB GPU, GiB host, hit GPU, hit host
        bar_w = max((width - 34 - extra) // 2, 0)
        header = line_of((f"{'prio':>5}  ", S_DIM), (f"{'GPU':>6}", S_GPU), f" {'':{bar_w}}  ",
                         (f"{'host':>6}", S_HOST), (f" {'':{bar_w}} {'req hit':>8}", S_DIM))
        if detail:
            header = line_of(header, (f"{'GiB GPU':>10}", S_GPU), (f"{'GiB host':>10}", S_HOST),
                             (f"{'hit GPU':>10}", S_GPU), (f"{'hit host':>10}", S_HOST))
        lines = [header]
        for i, (prio, g, h, hit) in enumerate(d.rows[: max(height - 1, 0)]):
            parts = [(f"{'?' if prio is None else prio:>5}", "bold"), "  ", (_pad(fmt.count(g), 6), S_FIG), " "]
            if bar_w:
                n = fmt.cells(g, d.gpu_capacity, bar_w)
                parts += [("▮" * n, S_GPU), " " * (bar_w - n)]
            parts += ["  ", (_pad(fmt.count(h), 6), S_FIG), " "]
            if bar_w:
                n = fmt.cells(h, d.host_capacity, bar_w)
                parts += [("▮" * n, S_HOST), " " * (bar_w - n)]
            parts.append((_pad(fmt.pct(hit, unknown="", digits=0), 9), S_DIM))
            if detail:
                bpb = d.bytes_per_block
                gh, hh = d.split[i] if i < len(d.split) else (None, None)
                parts += [(_pad(fmt.gib(g * bpb if bpb else None, "?"), 10), S_FIG),
                          (_pad(fmt.gib(h * bpb if bpb else None, "?"), 10), S_FIG),
                          (_pad(fmt.pct(gh, unknown="", digits=0), 10), S_GPU),
                          (_pad(fmt.pct(hh, unknown="", digits=0), 10), S_HOST)]
            lines.append(line_of(*parts))
        return _lines(lines, width, height)


# ------------------------------------------------------------------------------------------------ sources

@frozen
class FleetData:
    rows: tuple[Any, ...]           # kvtop.fleet.FleetRow per source shown (filtered, sorted: kvtop/ui/table.py)
    total: Any                      # kvtop.fleet.FleetRow: the aggregate ("all"), over every source
    selected: int                   # the row the big panels show (-1: the filter hides it)
    cursor: int = -1                # the cursor's row (j/k, a click; Enter opens it), -1: none
    sort: str | None = None         # the column sorted by (SourcesPanel.COLUMNS' names, "key"), None: arrival
    descending: bool = True
    filter: str = ""                # the filter's text ("/"), "" for none
    of: int = 0                     # sources in all, before the filter (0: as many as rows)


STATUS_STYLE = {"online": S_OK, "ok": S_OK, "offline": S_WARN, "disconnected": S_ERR, "error": S_ERR,
                "failed": S_ERR}
S_CURSOR = "reverse"   # the cursor's row (j/k, a click), over the row's own colours
ARROW = {True: "▼", False: "▲"}  # the sorted column's header: descending, ascending


class TableRowClicked(Message):
    """A table's row was clicked (``chain`` 2: a double click, which opens it)."""

    def __init__(self, table: str, key: str, chain: int = 1):
        super().__init__()
        self.table = table
        self.key = key
        self.chain = chain


class TableHeaderClicked(Message):
    """A table's column header was clicked: sort by it (again: the other way)."""

    def __init__(self, table: str, column: str):
        super().__init__()
        self.table = table
        self.column = column


class ClickableTable(Panel):
    """A panel whose lines are a table: ``build`` notes where its header's columns and its rows are
    (``_clicks_at``), and a click there posts TableHeaderClicked or TableRowClicked for the app to act on."""

    TABLE = ""

    def __init__(self, *, id: str | None = None, classes: str | None = None):
        super().__init__(id=id, classes=classes)
        self._header_at: int | None = None                   # the header's line in build()'s lines
        self._columns_at: list[tuple[int, int, str]] = []    # (first cell, past-last cell, column) on that line
        self._rows_at: dict[int, str] = {}                   # line -> the row's key
        self._top = 0                                        # the first row in the window (_top_row)

    def _top_row(self, focus: int, shown: int, n: int) -> int:
        """The first row of the window of ``shown`` rows out of ``n``: the last one, moved only as far as it takes
        to keep the ``focus`` row (the cursor) in it, so that a click does not scroll the row clicked away."""
        top = self._top
        if focus < top:
            top = focus
        elif focus >= top + shown:
            top = focus - shown + 1
        self._top = top = min(max(top, 0), max(n - shown, 0))
        return top

    def _clicks_at(self, header: int | None, columns: list[tuple[int, int, str]], rows: dict[int, str]) -> None:
        self._header_at, self._columns_at, self._rows_at = header, columns, rows

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if offset is None:   # the border
            return
        x, y = offset.x - 1, offset.y   # the one-cell margin every line starts with (Panel._build_lines)
        if y == self._header_at:
            column = next((c for x0, x1, c in self._columns_at if x0 <= x < x1), None)
            if column is not None:
                self.post_message(TableHeaderClicked(self.TABLE, column))
        elif (key := self._rows_at.get(y)) is not None:
            self.post_message(TableRowClicked(self.TABLE, key, getattr(event, "chain", 1)))


def _header_cells(cols: Sequence[tuple[str, int, str]], sort: str | None, descending: bool, start: int
                  ) -> tuple[list[tuple[str, str]], list[tuple[int, int, str]]]:
    """A table's header parts after its first column (which ends at cell ``start``), each cell's span for
    clicks; the sorted column's separator is its arrow (so the columns keep their widths)."""
    parts: list[tuple[str, str]] = []
    spans: list[tuple[int, int, str]] = []
    x = start
    for h, w, what in cols:
        left = what in ("status", "state", "error")
        sep = " "
        if what == sort:   # the arrow beside the header's words, in its padding where there is room
            if len(h) < w - (what == "status"):
                h = h + ARROW[descending] if left else ARROW[descending] + h
            else:
                sep = ARROW[descending]
        text = h.ljust(w - 1) if what == "status" else h.ljust(w) if left else _pad(h, w)
        parts.append((sep + text, "bold $primary" if what == sort else S_DIM))
        spans.append((x, x + 1 + len(text), what))
        x += 1 + len(text)
    return parts, spans


class SourcesPanel(ClickableTable):
    """Every attached source side by side, one row each, and the fleet's aggregate row ("all").

    Shown only while two or more sources have sent data (the screen's ``-fleet`` class). Columns drop right to
    left by ``DROP`` order where the panel is narrow; the source the big panels show is marked ▶, the cursor's row
    (j/k, a click; Enter opens it) in reverse. The rows come sorted and filtered (kvtop/ui/table.py): the sorted
    column's header has its arrow, the title the filter. More sources than lines: a window of rows around the
    cursor, and how many are left out.
    """

    TABLE = "sources"
    # (header, width, cell) in display order; cells are read off a kvtop.fleet.FleetRow.
    COLUMNS: ClassVar[tuple[tuple[str, int, str], ...]] = (
        ("status", 12, "status"), ("GPU use/cch/cap", 17, "gpu"), ("host cch/cap", 13, "host"),
        ("hit win", 7, "hit_window"), ("all", 6, "hit_cumulative"), ("off/s", 7, "offloaded_per_s"),
        ("on/s", 6, "onboarded_per_s"), ("req/s", 6, "requests_per_s"), ("TTFT p99", 9, "ttft"))
    # A disk tier's column (TensorRT-LLM's disk cache), after the host's: only while some source has a disk tier,
    # so a two-tier fleet's table is what it was.
    DISK_COLUMN: ClassVar[tuple[str, int, str]] = ("disk cch/cap", 13, "disk")
    # Which columns go first when the panel is narrow (80x24 keeps source, GPU, host, hit and req/s).
    DROP = ("status", "ttft", "onboarded_per_s", "offloaded_per_s", "hit_cumulative", "requests_per_s", "disk",
            "host")
    KEY_MIN, KEY_MAX = 10, 24
    SUBTITLE = "all: sums · hit = hits / lookups · TTFT p99 = max of the sources'"
    # What each column sorts by (a FleetRow's figure; None is unknown and goes last), and the order the sort key
    # (o) steps through them: the hit rate first, so one key sorts a fleet by it.
    SORT_VALUES: ClassVar[dict[str, Callable[[Any], Any]]] = {
        "key": lambda r: r.key, "status": lambda r: r.status, "gpu": lambda r: r.gpu_in_use,
        "host": lambda r: r.host_cached, "disk": lambda r: r.disk_cached if r.has_disk else None,
        "hit_window": lambda r: r.hit_window, "hit_cumulative": lambda r: r.hit_cumulative,
        "offloaded_per_s": lambda r: r.offloaded_per_s, "onboarded_per_s": lambda r: r.onboarded_per_s,
        "requests_per_s": lambda r: r.requests_per_s, "ttft": lambda r: r.ttft_p99_s}
    SORT_ORDER = ("hit_window", "hit_cumulative", "ttft", "requests_per_s", "gpu", "host", "disk",
                  "offloaded_per_s", "onboarded_per_s", "status", "key")
    TEXT_COLUMNS = ("key", "status")
    NAMES: ClassVar[dict[str, str]] = {"key": "source", **{what: h for h, _, what in (*COLUMNS, DISK_COLUMN)}}

    @staticmethod
    def row_text(row: Any) -> str:
        """What the filter looks in: the source's key and its status."""
        return f"{row.key} {row.status or ''}"

    def on_mount(self) -> None:
        super().on_mount()
        self.border_title = "Sources"
        self.border_subtitle = self.SUBTITLE

    def show(self, data: Any) -> bool:
        changed = super().show(data)
        if changed:
            of = data.of or len(data.rows)
            title = f"Sources · {fmt.count(of)}"
            if data.filter:
                title = f"Sources · {fmt.count(len(data.rows))} of {fmt.count(of)} · /{fmt.clean(data.filter, 30)}"
            if data.sort is not None:
                title += f" · by {self.NAMES.get(data.sort, data.sort)} {ARROW[data.descending]}"
            if self.border_title != title:  # a title change repaints the whole panel: only when it changed
                self.border_title = title
            self._set_state("warn" if any(r.status in ("offline", "disconnected", "error", "failed")
                                          for r in data.rows) else "ok")
        return changed

    @staticmethod
    def _cell(row: Any, what: str) -> tuple[str, str]:
        if what == "status":
            return (row.status or "?", STATUS_STYLE.get(row.status or "", S_DIM))
        if what == "gpu":
            return (f"{fmt.count(row.gpu_in_use)}/{fmt.count(row.gpu_cached)}/{fmt.count(row.gpu_capacity)}",
                    S_FIG)
        if what == "host":
            return (f"{fmt.count(row.host_cached)}/{fmt.count(row.host_capacity)}", S_FIG)
        if what == "disk":
            if not row.has_disk:
                return ("-", S_DIM)  # this source has no disk tier (not unknown: "?" is for that)
            return (f"{fmt.count(row.disk_cached)}/{fmt.count(row.disk_capacity)}", S_FIG)
        if what in ("hit_window", "hit_cumulative"):
            return (fmt.pct(getattr(row, what)), S_FIG)
        if what == "ttft":
            return (fmt.seconds_ms(row.ttft_p99_s), S_FIG)
        return (fmt.rate(getattr(row, what)), S_FIG)

    def _columns(self, width: int, key_w: int, show_status: bool,
                 show_disk: bool = False) -> list[tuple[str, int, str]]:
        cols = [c for c in self.COLUMNS if show_status or c[2] != "status"]
        if show_disk:
            at = next((i + 1 for i, c in enumerate(cols) if c[2] == "host"), len(cols))
            cols.insert(at, self.DISK_COLUMN)
        drop = list(self.DROP)
        while cols and 2 + key_w + sum(w + 1 for _, w, _ in cols) > width and drop:
            what = drop.pop(0)
            cols = [c for c in cols if c[2] != what]
        return cols

    def _row(self, row: Any, cols: list[tuple[str, int, str]], key_w: int, mark: str, key_style: str,
             status: tuple[str, str] | None = None, cursor: bool = False) -> Line:
        label = row.label  # the source's name (kvtop agent --run), else its key
        key = label if len(label) <= key_w else "…" + label[-(key_w - 1):]
        parts: list[Any] = [(mark, "bold $primary"), (key.ljust(key_w), key_style)]
        for _, w, what in cols:
            text, style = status if what == "status" and status is not None else self._cell(row, what)
            if what == "status":
                parts += [" ", (text.ljust(w - 1), style)]
            else:
                parts += [" ", (_pad(text, w), style)]
        if cursor:
            parts = [(p, S_CURSOR) if isinstance(p, str) else (p[0], f"{p[1]} {S_CURSOR}" if p[1] else S_CURSOR)
                     for p in parts]
        return line_of(*parts)

    def build(self) -> Line | list[Line]:
        d: FleetData | None = self.data
        width, height = self.inner
        if d is None or height <= 0:
            return BLANK
        n = len(d.rows)
        t = d.total
        if height == 1:
            self._clicks_at(None, [], {})
            sel = d.rows[d.selected] if 0 <= d.selected < n else None
            return _fit(line_of((f"{n} sources ", "bold"), ("all hit ", S_DIM), (fmt.pct(t.hit_window, digits=0),
                                 S_FIG), ("/", S_DIM), (fmt.pct(t.hit_cumulative, digits=0), S_FIG),
                                 (" req/s ", S_DIM), (fmt.rate(t.requests_per_s), S_FIG),
                                 *([("  ▶", "bold $primary"), (sel.label, "bold")] if sel else [])), width)
        key_w = min(max([self.KEY_MIN, *(len(r.label) for r in d.rows)]), self.KEY_MAX)
        cols = self._columns(width, key_w, show_status=any(r.status for r in d.rows),
                             show_disk=any(r.has_disk for r in d.rows))
        head, spans = _header_cells(cols, d.sort, d.descending, 2 + key_w)
        # the filter where the title is not drawn (80x24 has the table without its border): in the key's header
        label = "source" if not d.filter else fmt.clean("/" + d.filter, key_w)
        key_head = (ARROW[d.descending] if d.sort == "key" else " ") + " " + label.ljust(key_w)
        header = line_of((key_head, "bold $primary" if d.sort == "key" else S_DIM), *head)
        room = max(height - 2, 0)  # the header and the "all" row
        start, stop = 0, n
        more = ""
        focus = d.cursor if 0 <= d.cursor < n else d.selected
        if n > room:
            # One line says how many are left out, where there are lines for more than the cursor's source.
            shown = room - 1 if room > 2 else room
            start = self._top_row(focus, shown, n)
            stop = start + shown
            more = f"… {n - shown:,} more sources (j/k: move)" if shown < room else ""
        lines: list[Line] = [header]
        rows_at: dict[int, str] = {}
        for i in range(start, stop):
            selected = i == d.selected
            rows_at[len(lines)] = d.rows[i].key
            lines.append(self._row(d.rows[i], cols, key_w, "▶ " if selected else "  ",
                                   "bold $primary" if selected else "bold", cursor=i == d.cursor))
        if not n and d.filter:
            lines.append(styled(f"  no source matches /{fmt.clean(d.filter, 40)} (/ then Enter: clear)", S_DIM))
        if more and room:
            lines.append(styled("  " + more, S_DIM))
        # Offline sources are left out of the aggregate: its status cell says how many it counts.
        of = d.of or n
        counted = ("", S_DIM) if t.sources == of else (f"{t.sources} of {of}", S_WARN)
        if t.sources != of and not any(what == "status" for _, _, what in cols):
            t = replace(t, key=f"all {t.sources}/{of}")  # no status column to say it in
        lines.append(self._row(t, cols, key_w, "Σ ", "bold", counted))
        self._clicks_at(0, [(0, 2 + key_w, "key"), *spans], rows_at)
        return _lines(lines, width, height)


# ------------------------------------------------------------------------------------------------ requests view

@frozen
class RequestsData:
    rows: tuple[Any, ...]           # kvtop.tiers.state.RequestRow: in flight, then finished newest first (arranged)
    cursor: int = -1
    sort: str | None = None
    descending: bool = True
    filter: str = ""
    of: int = 0                     # rows before the filter
    source: str = ""                # whose requests (the source the big panels show)
    note: str = ""                  # why no row is in flight where the engine says some are


class RequestsTable(ClickableTable):
    """The requests view (R): recent and in-flight requests, one row each, sorted and filtered as the sources table
    is. Finished ones from the ``request`` records (the last RECENT_REQUESTS), in flight from the workload driver
    of a driven run, else from the engine's ``requestStats`` where it sends them (enable_iter_req_stats)."""

    TABLE = "requests"
    KEY_W = 10
    COLUMNS: ClassVar[tuple[tuple[str, int, str], ...]] = (
        ("state", 8, "state"), ("prompt", 7, "prompt"), ("reused", 7, "reused"), ("GPU", 6, "gpu"),
        ("host", 6, "host"), ("disk", 6, "disk"), ("TTFT", 9, "ttft"), ("e2e", 9, "e2e"), ("prio", 5, "priority"),
        ("error", 6, "error"))
    DROP = ("disk", "priority", "reused", "e2e", "host", "prompt", "gpu", "error")
    SORT_VALUES: ClassVar[dict[str, Callable[[Any], Any]]] = {
        "key": lambda r: (0, int(r.key), "") if r.key.isdigit() else (1, 0, r.key), "state": lambda r: r.state,
        "prompt": lambda r: r.prompt_tokens, "reused": lambda r: r.reused_blocks, "gpu": lambda r: r.gpu_blocks,
        "host": lambda r: r.host_blocks, "disk": lambda r: r.disk_blocks, "ttft": lambda r: r.ttft_s,
        "e2e": lambda r: r.e2e_s, "priority": lambda r: r.priority, "error": lambda r: r.error}
    SORT_ORDER = ("ttft", "e2e", "reused", "host", "gpu", "disk", "prompt", "priority", "state", "error", "key")
    TEXT_COLUMNS = ("key", "state", "error")
    NAMES: ClassVar[dict[str, str]] = {"key": "request", **{what: h for h, _, what in COLUMNS}}

    @staticmethod
    def row_text(row: Any) -> str:
        """What the filter looks in: the request's id, its state and its error."""
        return f"{row.key} {row.state} {row.error or ''}"

    def on_mount(self) -> None:
        super().on_mount()
        self.border_title = "Requests"
        self.border_subtitle = "R: back · o/O sort · / filter · j/k move · Enter: details"

    def show(self, data: Any) -> bool:
        changed = super().show(data)
        if changed:
            title = f"Requests{' of ' + data.source if data.source else ''} · {fmt.count(data.of)}"
            if data.filter:
                title += f" · {fmt.count(len(data.rows))} match /{fmt.clean(data.filter, 30)}"
            if data.sort is not None:
                title += f" · by {self.NAMES.get(data.sort, data.sort)} {ARROW[data.descending]}"
            if self.border_title != title:
                self.border_title = title
            self._set_state("warn" if any(r.state == "failed" for r in data.rows) else "ok")
        return changed

    @staticmethod
    def _cell(row: Any, what: str) -> tuple[str, str]:
        if what == "state":
            style = S_ERR if row.state == "failed" else S_DIM if row.state == "done" else S_OK
            return (row.state, style)
        if what in ("ttft", "e2e"):
            return (fmt.seconds_ms(getattr(row, f"{what}_s"), unknown="" if row.t is None else "?"), S_FIG)
        if what == "priority":
            return ("" if row.priority is None else str(row.priority), S_FIG)
        if what == "error":
            return (fmt.clean(row.error or "", 200), S_ERR)
        value = {"prompt": row.prompt_tokens, "reused": row.reused_blocks, "gpu": row.gpu_blocks,
                 "host": row.host_blocks, "disk": row.disk_blocks}[what]
        return (fmt.count(value), {"gpu": S_GPU, "host": S_HOST, "disk": S_DISK}.get(what, S_FIG))

    def build(self) -> Line | list[Line]:
        d: RequestsData | None = self.data
        width, height = self.inner
        if d is None or height <= 0:
            return BLANK
        key_w = self.KEY_W
        cols = list(self.COLUMNS)
        drop = list(self.DROP)
        while 2 + key_w + sum(w + 1 for _, w, _ in cols) > width and drop:
            what = drop.pop(0)
            cols = [c for c in cols if c[2] != what]
        head, spans = _header_cells(cols, d.sort, d.descending, 2 + key_w)
        key_head = (ARROW[d.descending] if d.sort == "key" else " ") + " " + "request".ljust(key_w)
        lines: list[Line] = [line_of((key_head, "bold $primary" if d.sort == "key" else S_DIM), *head)]
        n = len(d.rows)
        room = max(height - 1, 0)
        start, stop = 0, n
        more = ""
        if n > room:
            shown = room - 1 if room > 1 else room
            start = self._top_row(d.cursor if d.cursor >= 0 else 0, shown, n)
            stop = start + shown
            more = f"… {n - shown:,} more requests (j/k: move)" if shown < room else ""
        rows_at: dict[int, str] = {}
        for i in range(start, stop):
            row = d.rows[i]
            key = row.key if len(row.key) <= key_w else "…" + row.key[-(key_w - 1):]
            parts: list[tuple[str, str]] = [("  ", ""), (key.ljust(key_w), "bold")]
            for _, w, what in cols:
                text, style = self._cell(row, what)
                parts += [(" ", ""), (text.ljust(w) if what in ("state", "error") else _pad(text, w), style)]
            if i == d.cursor:
                parts = [(t, f"{st} {S_CURSOR}" if st else S_CURSOR) for t, st in parts]
            rows_at[len(lines)] = row.key
            lines.append(line_of(*parts))
        if not n:
            why = (f"no request matches /{fmt.clean(d.filter, 40)} (/ then Esc: clear)" if d.filter
                   else "no requests yet: finished ones come from request records (a driven run, a recording)")
            lines.append(styled("  " + why, S_DIM))
        if d.note and (not n or not d.filter):
            lines.append(styled("  " + d.note, S_DIM))
        if more:
            lines = lines[: height - 1] + [styled("  " + more, S_DIM)]
        self._clicks_at(0, [(0, 2 + key_w, "key"), *spans], rows_at)
        return _lines(lines, width, height)


# ------------------------------------------------------------------------------------------------ requests

@frozen
class RequestData:
    in_flight: int | None
    completed: int
    failed: int
    requests_per_s: float | None
    output_tokens_per_s: float | None
    prompt_tokens_per_s: float | None
    ttft_p50: float | None
    ttft_p99: float | None
    e2e_p50: float | None
    e2e_p99: float | None
    latency_window: bool      # True: percentiles over the window; False: since start (window empty)
    last_error: str | None
    # TTFT by where the prefix came from: (label, p50 s, p99 s, requests), over the same span as the TTFT row
    by_source: tuple[tuple[str, float | None, float | None, int], ...] = ()


class RequestPanel(Panel):
    """In flight, done, failed, request and token rates, TTFT and end-to-end percentiles."""

    def on_mount(self) -> None:
        super().on_mount()
        self.border_title = "Requests"

    def show(self, data: Any) -> bool:
        changed = super().show(data)
        if changed:
            self._set_state("warn" if data.failed else "ok")
        return changed

    def build(self) -> Line | list[Line]:
        d: RequestData | None = self.data
        width, height = self.inner
        if d is None:
            return BLANK
        fail_style = S_ERR if d.failed else S_FIG
        if height == 1:
            return _fit(line_of(("req ", "bold"), (fmt.count(d.in_flight), S_FIG), (" in flight ", S_DIM),
                                 (fmt.rate(d.requests_per_s), S_FIG), ("/s ", S_DIM), ("TTFT ", S_DIM),
                                 (fmt.seconds_ms(d.ttft_p50), S_FIG)), width)
        span = "win" if d.latency_window else "all"
        w1, w2 = (5, 6) if width >= 44 else (0, 0)
        lines = [
            line_of(("in flight ", S_DIM), (_pad(fmt.count(d.in_flight), w1), S_FIG), ("  done ", S_DIM),
                     (_pad(fmt.count(d.completed), w2), S_FIG), ("  failed ", S_DIM),
                     (fmt.count(d.failed), fail_style)),
            line_of(("req/s ", S_DIM), (_pad(fmt.rate(d.requests_per_s), w1), S_FIG), ("  tok/s out ", S_DIM),
                     (fmt.rate(d.output_tokens_per_s), S_FIG), (" in ", S_DIM),
                     (fmt.rate(d.prompt_tokens_per_s), S_FIG)),
            line_of((f"TTFT {span} ", S_DIM), ("p50 ", S_DIM), (_pad(fmt.seconds_ms(d.ttft_p50), 7), S_FIG),
                     (" p99 ", S_DIM), (_pad(fmt.seconds_ms(d.ttft_p99), 7), S_FIG)),
            line_of((f"e2e  {span} ", S_DIM), ("p50 ", S_DIM), (_pad(fmt.seconds_ms(d.e2e_p50), 7), S_FIG),
                     (" p99 ", S_DIM), (_pad(fmt.seconds_ms(d.e2e_p99), 7), S_FIG)),
        ]
        if d.by_source and height >= 5:
            # TTFT by where the prefix came from, the verdict's evidence: a host hit against a miss, side by side,
            # each class's request count in its heading, then its p50/p99 in ms
            def ms(s: float | None) -> str:
                return "?" if s is None else f"{s * 1000:.1f}" if s < 0.0095 else f"{s * 1000:,.0f}"

            lines.append(line_of((f"TTFT {span} by ", S_DIM),
                                 *[(_pad(f"{label} {fmt.count(n)}", 10), S_DIM) for label, _, _, n in d.by_source]))
            lines.append(line_of(("p50/p99 ms ", S_DIM),
                                 *[(_pad(f"{ms(p50)}/{ms(p99)}", 10), S_FIG) for _, p50, p99, _ in d.by_source]))
        if d.failed and d.last_error:
            # Why they failed, not only how many: its own line where the panel has one to spare, else after the
            # count on the first line (cut to fit). The whole text is in the event log and the help (?).
            why = fmt.clean(d.last_error)
            if height >= 3:
                lines = [*lines[: height - 1], line_of(("last error ", S_DIM), (why, S_ERR))]
            else:
                lines[0] = line_of(lines[0], (" ✖ ", S_ERR), (why, S_ERR))
        return _lines(lines, width, height)


# ------------------------------------------------------------------------------------------------ memory

@frozen
class GpuMemoryRow:
    index: int
    name: str | None
    used: int | None
    total: int | None
    util_pct: int | None


@frozen
class MemoryData:
    gpus: tuple[GpuMemoryRow, ...]
    gpu_error: str | None
    rss: int | None
    pinned_pool: int | None
    available: int | None
    total: int | None
    simulated: bool = False        # the engine is kvtop's simulator: its pools are not this machine's memory
    host_blocks: int | None = None  # the host tier's pool in blocks: 0 is no host pool ("none"), None unknown


class MemoryPanel(Panel):
    """GPU memory per device (NVML) and host memory (the engine's RSS, its pinned KV pool, what is left)."""

    def on_mount(self) -> None:
        super().on_mount()
        self.border_title = "Memory"

    def show(self, data: Any) -> bool:
        changed = super().show(data)
        if changed:
            warn = any(g.used is not None and g.total and g.used > 0.95 * g.total for g in data.gpus)
            warn |= bool(data.available is not None and data.total and data.available < 0.05 * data.total)
            self._set_state("warn" if warn else "ok")
            # The simulator's GPU and pools are no memory of this machine's: the title says so
            title = "Memory · simulated" if data.simulated else "Memory"
            if self.border_title != title:  # a title change repaints the whole panel: only when it changed
                self.border_title = title
        return changed

    def build(self) -> Line | list[Line]:
        d: MemoryData | None = self.data
        width, height = self.inner
        if d is None:
            return BLANK
        lines: list[Line] = []
        gpu_rows = list(d.gpus)
        # No host tier: no pinned pool, said as "none" (not "0 B", nor "?" as if unknown)
        pool: Line = (("none", S_FIG),) if d.host_blocks == 0 else ((fmt.nbytes(d.pinned_pool), S_FIG),)
        host_lines = [line_of(("host", tier_style("host", bold=True)), " ", ("rss ", S_DIM), (fmt.nbytes(d.rss), S_FIG),
                               ("  KV pool ", S_DIM), pool),
                      line_of(("     ", ""), ("available ", S_DIM), (fmt.nbytes(d.available), S_FIG),
                               (f" of {fmt.nbytes(d.total)}", S_DIM))]
        if height < len(gpu_rows or [None]) + 2 or width >= 70:
            # One host line: both halves side by side (wide panel), or no room for two.
            avail = line_of(("  avail ", S_DIM), (fmt.nbytes(d.available), S_FIG))
            fits = cells(host_lines[0]) + cells(avail) <= width
            host_lines = [line_of(host_lines[0], avail) if fits else host_lines[0]]
        room = max(height - len(host_lines), 1)
        shown = gpu_rows if len(gpu_rows) <= room else gpu_rows[: room - 1]
        # The bar takes what the figures ("GPU0 19.2 GiB / 140 GiB", the share, the utilisation where it fits: 31
        # cells and 10) leave, up to 40 cells (200x60: 36, where it had 20)
        util_w = 10 if width >= 60 else 0
        bar_w = max(min(width - 31 - util_w, 40), 0)
        for g in shown:
            frac = g.used / g.total if g.used is not None and g.total else None
            n = fmt.cells(g.used, g.total, bar_w)
            parts: list[Any] = [(f"GPU{g.index}", tier_style("gpu", bold=True)), " ",
                                (f"{fmt.nbytes(g.used)} / {fmt.nbytes(g.total)} ", S_FIG)]
            if bar_w >= 4:
                parts += [(tier_glyph("in-use") * n, S_GPU),
                          (tier_glyph("empty") * (bar_w - n), tier_style("gpu", "empty")), " "]
            parts.append((_pad(fmt.pct(frac, digits=0), 4), S_DIM))
            if g.util_pct is not None and util_w:
                parts.append((f"  util {g.util_pct}%", S_DIM))
            lines.append(line_of(*parts))
        if len(gpu_rows) > len(shown):
            lines.append(styled(f"... {len(gpu_rows) - len(shown)} more GPUs", S_DIM))
        if not gpu_rows:
            lines.append(line_of(("GPU", tier_style("gpu", bold=True)), "  ",
                                 (d.gpu_error or "no NVML sample yet", S_DIM)))
        lines += host_lines
        return _lines(lines, width, height)


# ------------------------------------------------------------------------------------------------ event log

@mutable
class LogLine:
    time: float
    level: str
    text: str
    key: tuple[str, str]
    count: int = 1


LEVEL_STYLE = {"info": S_DIM, "warn": "$warning", "warning": "$warning", "error": "bold $error"}
LEVEL_MARK = {"info": "·", "warn": "▲", "warning": "▲", "error": "✖"}


class EventLog(Panel):
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
        return _lines(out, width, height)


class KeyHints(Static):
    """The footer of the compact layout: Textual's footer cuts keys off at 40 columns; this names the few
    that matter and points to the help, which lists the rest."""

    def __init__(self, *, id: str | None = None):
        super().__init__(Content.assemble(("q", "bold $primary"), " quit  ", ("p", "bold $primary"), " pause  ",
                                          ("?", "bold $primary"), " help  ", ("^p", "bold $primary"), " commands"),
                         id=id)


# ------------------------------------------------------------------------------------------------ help

HELP_TEXT = """\
[b $primary]kvtop[/]: where the KV cache blocks of the engine live, and how they move

[b]Keys[/]
  [b]q[/] quit          [b]p[/] pause / resume the screen (the engine goes on)
  [b]r[/] reset window  [b]t[/] next theme (dark, light, high-contrast)
  [b]e[/] event log     [b]s[/] next source (when several are attached)
  [b]+ -[/] refresh more / less often (0.1 to 5 s)
  [b]?[/] this help     [b]ctrl+p[/] commands (screenshot: into the working dir)
  [b]R[/] requests view: recent and in-flight requests, one row each

[b]Tables[/]  the sources table (2+ sources) and the requests view (R)
  [b]o[/] sort by the next column (sources: hit rate first; requests: TTFT)
  [b]O[/] the other way     [b]click a header[/] sort by it (again: reverse)
  [b]/[/] filter as you type (a name, status, id, error): [b]Enter[/] keeps, [b]Esc[/] clears
  [b]j[/] [b]k[/] cursor down, up   [b]click[/] a row: cursor   [b]Enter[/] or [b]double click[/]: open
    it (a source: the big panels show it; a request: its whole row)
  Theme, event log, requests view and sorts are remembered in the settings
  file (its \\[ui] table; ~/.config/kvtop/kvtop.toml, --config, KVTOP_CONFIG).

[b]Replay[/]  (kvtop replay FILE) the header's REPLAY badge: place / length, speed
  [b]p[/] pause / play the replay itself   [b]+ -[/] speed x0.25 .. x64, max
  [b]← →[/] seek 5 s back / on   [b]home end[/] start / end of the recording
  [b]. ,[/] step 1 s on / back (pauses); back re-folds from the start

[b]Tiers[/]  one bar per tier: parts that never overlap and fill the pool. Each
  tier keeps its colour in every panel: [b $kv-gpu]GPU[/], [b $kv-host]host[/], [b $kv-disk]disk[/]
  [$kv-gpu]█[/][$kv-host]█[/] [b]in use[/]      held by running requests
                 (TensorRT-LLM: capacity - freeNumBlocks)
  [$kv-gpu-cached]▓[/][$kv-host-cached]▓[/] [b]cached idle[/] reusable KV no request holds: evicted or
                 offloaded first
  [$kv-gpu-empty]░[/][$kv-host-empty]░[/] [b]empty[/]       no request holds it, nothing reusable in it
  TensorRT-LLM's [b]free[/] (freeNumBlocks) = cached idle + empty: the ┐┘
  bracket. Its [b]cached[/] (the reuse tree) also counts blocks requests
  hold: the "reuse tree" line.
  Headline: GPU % in use, host % cached.
  [$warning]≈[/] the split is an estimate (held blocks taken as cached first), or
    TensorRT-LLM 1.2 dropped a cached block silently (an upper bound).

[b]Hit rate[/]  reused prompt blocks / prompt blocks looked up, over the window
  and since start; GPU + host = total (a host hit: onboarded from host).
[b]Size[/]  "host×0 ½ 1 2 4: 38 38 39 42 42% opt 46": the hit rate with no host
  cache, half, this one (the run's own since start), 2x and 4x, estimated from
  the blocks it moved and dropped; opt: the best any policy could do here.
[b]Moves[/]  offload GPU→host on eviction, onboard host→GPU on reuse, evict:
  dropped from a tier. left: why blocks left each tier (evicted, offloaded,
  released, cleared), "(engine)" where its events say so, "(inferred)" where
  kvtop worked it out (vLLM's and SGLang's removals give no reason).
[b]Requests[/]  failed N: the last error is under the counts, in the event log
  and at the top of this help.
[b]Header[/]  PAUSED: the screen froze, the engine goes on. FINISHED: no more
  data will come (replay end, --duration). [$warning]no data 8s[/]: data should come.
[b]Sources[/]  (2+ attached) one row each, ▶ the one shown. [b]all[/]: sums of
  blocks and rates, hit = hits / lookups, TTFT p99 = max of the sources'.
"""
# On the help's border, so that it shows when the help is taller than the screen (at 120x40 since the replay's keys)
HELP_HINT = "↑↓ scroll · esc or ? closes this help"


class HelpScreen(ModalScreen[None]):
    """Keys and what every number means."""

    BINDINGS: ClassVar = [("escape", "dismiss", "Close"), ("question_mark", "dismiss", "Close"),
                          ("q", "dismiss", "Close")]
    DEFAULT_CSS = """
    HelpScreen { align: center middle; }
    HelpScreen > VerticalScroll {
        width: 82; max-width: 100%; height: auto; max-height: 100%;
        border: round $primary; background: $surface; padding: 0 1;
    }
    HelpScreen Static { width: 100%; height: auto; }
    """

    def __init__(self, last_error: str | None = None, failed: int = 0):
        super().__init__()
        self.last_error = last_error
        self.failed = failed

    def compose(self) -> ComposeResult:
        text = Content.from_markup(HELP_TEXT)
        if self.last_error:
            # The last failed request's error, whole (the panel cuts it to its width), first: stripped of
            # control characters, and put in as plain text, never as markup.
            text = Content.assemble(("Last error", "bold $error"), f" ({self.failed} failed): ",
                                    fmt.clean(self.last_error, limit=600), "\n\n", text)
        # Scrollable: at 80x24 the help is taller than the screen.
        with VerticalScroll(id="help-scroll"):
            yield Static(text, id="help-text")

    def on_mount(self) -> None:
        scroll = self.query_one("#help-scroll")
        scroll.border_subtitle = HELP_HINT
        scroll.focus()

    def action_dismiss(self, result: None = None) -> Any:
        return self.dismiss(result)


__all__ = ["EventLog", "KeyHints", "GpuMemoryRow",
           "HeaderBar", "HeaderData", "HelpScreen", "HitData",
           "HitRatePanel", "MemoryData", "MemoryPanel", "MovesData", "MovesPanel", "Panel", "PriorityData",
           "PriorityPanel", "RequestData", "RequestPanel", "FleetData", "SourcesPanel", "TierData", "TierPanel",
           "WhatIfData", "tier_label", "what_if_data", "ClickableTable", "TableHeaderClicked", "TableRowClicked",
           "RequestsData", "RequestsTable"]
