"""The line model and the Panel base every panel of the dashboard (kvtop/ui/panels/) draws with.

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

from collections.abc import Sequence
from typing import Any, Generic, TypeVar, cast

from rich.cells import cell_len, set_cell_size
from rich.segment import Segment
from rich.style import Style as RichStyle
from textual.content import Content
from textual.geometry import Region
from textual.reactive import reactive
from textual.strip import Strip
from textual.style import Style as TextualStyle
from textual.widget import Widget

from kvtop.ui.strip_reuse import CACHE_RENDERS, StripReuse
from kvtop.ui.themes import tier_style

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



PART_CACHE = 4096  # a panel's kept parts (Panel._segments): its styles and the figures drawn lately, a few hundred


def padded(text: str, width: int, right: bool = True) -> str:
    if len(text) >= width:
        return text
    return text.rjust(width) if right else text.ljust(width)


def fit(ln: Line, width: int) -> Line:
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


def fit_lines(lines: Sequence[Line], width: int, height: int) -> list[Line]:
    return [fit(ln, width) for ln in lines[: max(height, 0)]]


D = TypeVar("D")  # the panel's data: a frozen value of its own module (kvtop/ui/panels/), made by kvtop/ui/views.py


class LinePanel(Widget, Generic[D]):
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
        self.data: D | None = None
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

    def show(self, data: D) -> bool:
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
        segments: list[Segment] = []
        append = segments.append
        length = 0
        for part in ln:
            made = cache.get(part)  # type: ignore[call-overload]
            if made is None:
                text, style = part
                rich = cache.get(style)
                if rich is None:
                    rich = cache[style] = self._resolve(style, frame, filters)
                made = cache[part] = (Segment(text, rich),  # type: ignore[index,assignment]
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
            rich = cast(RichStyle, segments[0].style)   # a filter keeps a styled segment styled
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


if CACHE_RENDERS:
    class Panel(StripReuse, LinePanel[D]):
        """A LinePanel that hands the compositor its last strips again while nothing changed
        (kvtop/ui/strip_reuse.py: on only for the Textual releases it is tested on, and with an off switch)."""
else:
    class Panel(LinePanel[D]):  # type: ignore[no-redef]
        """A LinePanel on Textual's public Line API alone (the strip reuse is off: kvtop/ui/strip_reuse.py)."""
