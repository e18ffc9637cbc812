"""The memory panel: GPU memory per device and the host's."""

from __future__ import annotations

import textwrap
from typing import Any

from kvtop.ui import format as fmt
from kvtop.ui.panel import (
    BLANK,
    S_DIM,
    S_FIG,
    S_GPU,
    Line,
    Panel,
    cells,
    fit_lines,
    line_of,
    padded,
    styled,
)
from kvtop.ui.themes import tier_glyph, tier_style
from kvtop.values import frozen


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
    attached: bool = False          # kvtop attach: it samples no memory of its own; the source's samples or none


# What an attach with no memory sample says, in place of "?"s and "no NVML sample yet" (none will come)
NOT_SAMPLED = "not measured: kvtop attach samples no GPU or host memory (a driven run or kvtop.watch does)"


class MemoryPanel(Panel[MemoryData]):
    """GPU memory per device (NVML) and host memory (the engine's RSS, its pinned KV pool, what is left)."""

    def on_mount(self) -> None:
        super().on_mount()
        self.border_title = "Memory"

    def show(self, data: MemoryData) -> bool:
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
        if d.attached and not gpu_rows and d.gpu_error is None and d.rss is None and d.available is None:
            return fit_lines([styled(t, S_DIM) for t in textwrap.wrap(NOT_SAMPLED, max(width, 1))], width, height)
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
            parts.append((padded(fmt.pct(frac, digits=0), 4), S_DIM))
            if g.util_pct is not None and util_w:
                parts.append((f"  util {g.util_pct}%", S_DIM))
            lines.append(line_of(*parts))
        if len(gpu_rows) > len(shown):
            lines.append(styled(f"... {len(gpu_rows) - len(shown)} more GPUs", S_DIM))
        if not gpu_rows:
            lines.append(line_of(("GPU", tier_style("gpu", bold=True)), "  ",
                                 (d.gpu_error or "no NVML sample yet", S_DIM)))
        lines += host_lines
        return fit_lines(lines, width, height)
