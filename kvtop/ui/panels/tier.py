"""A tier's panel (GPU, host, disk): its blocks in use, cached and free."""

from __future__ import annotations

from typing import Any

from kvtop.occupancy import cells as bar_cells
from kvtop.occupancy import occupancy
from kvtop.tiers import TierState
from kvtop.ui import format as fmt
from kvtop.ui.panel import (
    BLANK,
    S_DIM,
    S_FIG,
    S_WARN,
    Line,
    Panel,
    cells,
    fit_lines,
    line_of,
    padded,
    styled,
)
from kvtop.ui.panels.hit_rate import big_figure
from kvtop.ui.themes import tier_glyph, tier_style
from kvtop.values import frozen


@frozen
class TierData:
    label: str                 # "GPU" / "host" / "disk"
    medium: str                # "HBM" / "pinned DRAM"
    state: TierState
    note: str | None = None    # why a tier is unknown or absent, in words
    history: tuple[float | None, ...] = ()  # the headline share per history step (200x60 only)
    # TensorRT-LLM's words apply (its "free", offload-on-evict, host_cache_size): the source is TensorRT-LLM or its
    # simulator (kvtop/engine_words.py); for vLLM, SGLang, Dynamo the panel's words are neutral
    trtllm: bool = True


# A tier's name (TierState.name) -> its label and medium on screen; a tier kvtop does not know keeps its own name.
TIER_LABELS: dict[str, tuple[str, str]] = {"gpu": ("GPU", "HBM"), "host": ("host", "pinned DRAM"),
                                           "disk": ("disk", "file / NVMe")}


def tier_label(name: str) -> tuple[str, str]:
    return TIER_LABELS.get(name.lower(), (name, ""))


class TierPanel(Panel[TierData]):
    """One tier as one stacked bar, in use | cached and idle | empty, whose parts never overlap and add up to the
    pool (kvtop.occupancy), with the exact counts beside it.

    TensorRT-LLM's own counts overlap (a running request holds blocks that are also cached; its "free" counts the
    cached-and-idle blocks): its "free" is shown as what it is, cached idle + empty (the bracket beside those two
    rows), and the help says so. The headline is the number that moves: the GPU's share in use (its cached share
    sits near 100% on any busy engine), the host's share cached (nothing stays in use on the host in 1.0-1.2).
    """

    GPU_HINT = "TensorRT-LLM's free = cached idle + empty"
    HOST_HINT = "offloaded on GPU eviction, kept for reuse"
    # Another engine's (vLLM, SGLang, Dynamo): "free" as kvtop counts it, and the host holding copies of GPU blocks
    # (vLLM's offloading connector and SGLang's HiCache store the copy before the GPU block goes, not on eviction)
    GPU_HINT_ANY = "free = cached idle + empty"
    HOST_HINT_ANY = "copies of GPU blocks, kept for reuse"

    def on_mount(self) -> None:
        super().on_mount()
        self._title()

    def on_resize(self) -> None:
        super().on_resize()
        self._title()   # the subtitle's detail follows the width

    def show(self, data: TierData) -> bool:
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
            left = st.free_blocks or 0   # known: checked above
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
        d = self.data
        assert d is not None   # drawn only once shown
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
        d = self.data
        assert d is not None   # drawn only once shown
        o = occupancy(d.state)
        cap = o.capacity
        if d.label == "GPU":
            part, word = o.in_use, "in use" if not short else "use"
        else:
            part, word = o.cached_idle, "cached"
        return line_of((padded(self._share(part, cap), 4), S_FIG), (f" {word}", S_DIM))

    def _bar(self, width: int) -> Line:
        """The stacked bar: in use | cached idle | empty, cells adding up to ``width``. Unknown parts are drawn
        dotted: with no KV events the GPU's free blocks cannot be split into cached and empty."""
        d = self.data
        assert d is not None   # drawn only once shown
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
            lines = [line_of((f"{d.label}: ", "bold"),
                             (d.note or ("none (host_cache_size = 0)" if d.trtllm else "none"), S_DIM))]
            if d.label == "host" and not d.note:
                lines.append(styled("evicted GPU blocks are dropped", S_DIM))
            return fit_lines(lines, width, height)
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
            return fit_lines([line1, line_of(*parts[:-1])], width, height)

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
                     (padded("?" if unknown else fmt.count(blocks), 6), S_DIM if unknown else S_FIG),
                     (padded(self._share(blocks, cap), 5), S_DIM)]
            if show_gib:
                parts.append(padded(fmt.gib(st.bytes(blocks), "?"), 7))
            if show_tokens:
                parts.append((padded(fmt.count(st.tokens(blocks), "?"), 9), S_DIM))
            # "≈" once, on the cached row (empty is the rest of "free", so it is as approximate).
            parts.append((" ≈", S_WARN) if i == 1 and approx and not unknown else "  ")
            if i == 1 and d.label == "GPU":
                # TensorRT-LLM's "free" is these two rows together: a bracket says so.
                parts += [(" ┐ ", S_DIM), ("TensorRT-LLM's free" if width >= 60 and d.trtllm else "free", S_DIM)]
            elif i == 2 and d.label == "GPU":
                parts += [(" ┘ ", S_DIM), (fmt.count(free), S_FIG),
                          (f" {fmt.pct(free / cap if cap and free is not None else None, digits=0)}"
                           if width >= 60 else "", S_DIM)]
            lines.append(line_of(*parts))
        noted = False   # the note said once: here, or as the hint below
        if o.cached_idle is None and height > len(lines):
            why = d.note or "no KV events: cached vs empty unknown"
            noted = d.note is not None
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
            note = None if noted else d.note
            hint = note or ((self.GPU_HINT if d.trtllm else self.GPU_HINT_ANY) if d.label == "GPU"
                            else self.HOST_HINT if d.trtllm else self.HOST_HINT_ANY)
            lines.append(styled(hint, S_WARN if note else S_DIM))
        if d.history and len(lines) < height - 1:
            # 200x60: the headline share over time, one cell a step, on a fixed 0-100% scale, as tall as the
            # panel's rows left (six at 200x60, two with a disk tier), the label and span on its bottom row.
            spark_w = max(width - 16, 1)
            spark_rows = min(height - len(lines) - 1, 6)
            label = f"{'in use' if d.label == 'GPU' else 'cached'} % "
            chart = fmt.sparkrows(d.history, spark_w, spark_rows, top=1.0)
            lines.append(BLANK)
            lines += [line_of((" " * len(label), ""), (row, tier_style(d.label))) for row in chart[:-1]]
            lines.append(line_of((label, S_DIM), (chart[-1], tier_style(d.label)),
                                 (f" {min(len(d.history), spark_w):>3}s", S_DIM)))
        return fit_lines(lines, width, height)

    THICK_FROM = 12   # content rows from which the bar is three rows thick, its share in big digits (200x60)

    def _thick_bar(self, width: int) -> list[Line]:
        """The bar three rows thick, the headline share beside it in GLYPHS (the back of the room reads it), the
        word under what it counts on the middle row."""
        d = self.data
        assert d is not None   # drawn only once shown
        o = occupancy(d.state)
        part = o.in_use if d.label == "GPU" else o.cached_idle
        big = [row.rjust(10) for row in big_figure(self._share(part, o.capacity))]  # "100%" is 10 cells
        word = " in use" if d.label == "GPU" else " cached"
        bar = self._bar(max(width - len(big[0]) - len(word) - 1, 1))
        return [line_of(bar, " ", (b, S_FIG), (word if i == 1 else " " * len(word), S_DIM)) for i, b in enumerate(big)]
