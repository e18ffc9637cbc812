"""The per-priority panel: cached blocks and hit rate by retention priority."""

from __future__ import annotations

import textwrap
from typing import Any

from kvtop.ui import format as fmt
from kvtop.ui.panel import (
    BLANK,
    S_DIM,
    S_FIG,
    S_GPU,
    S_HOST,
    Line,
    Panel,
    fit,
    fit_lines,
    line_of,
    padded,
    styled,
)
from kvtop.values import frozen


@frozen
class PriorityData:
    rows: tuple[tuple[int | None, int, int, float | None], ...]  # (priority, GPU blocks, host blocks, req hit rate)
    gpu_capacity: int | None
    host_capacity: int | None
    # Per row (same order): the requests' hit rate served by the GPU and by the host, where known; and the block
    # size for GiB. Shown where the panel is wide (200x60).
    split: tuple[tuple[float | None, float | None], ...] = ()
    bytes_per_block: int | None = None
    # blocks cached in any tier, where known: with no priority rows, "no cached blocks yet" is said only where
    # none are (a vLLM, SGLang or Dynamo stream caches blocks whose events carry no retention priority)
    cached: int | None = None


class PriorityPanel(Panel[PriorityData]):
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
            if not d.cached:
                return fit_lines([styled("no cached blocks yet", S_DIM)], width, height)
            why = f"no retention priorities in this engine's events ({fmt.count(d.cached)} blocks cached)"
            return fit_lines([styled(t, S_DIM) for t in textwrap.wrap(why, max(width, 1))], width, height)
        if height == 1:
            parts: list[Any] = [("prio ", "bold")]
            for prio, g, h, _ in d.rows:
                parts += [(f"{'?' if prio is None else prio}:", S_DIM), (f"{fmt.count(g + h)} ", S_FIG)]
            return fit(line_of(*parts), width)
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
            parts = [(f"{'?' if prio is None else prio:>5}", "bold"), "  ", (padded(fmt.count(g), 6), S_FIG), " "]
            if bar_w:
                n = fmt.cells(g, d.gpu_capacity, bar_w)
                parts += [("▮" * n, S_GPU), " " * (bar_w - n)]
            parts += ["  ", (padded(fmt.count(h), 6), S_FIG), " "]
            if bar_w:
                n = fmt.cells(h, d.host_capacity, bar_w)
                parts += [("▮" * n, S_HOST), " " * (bar_w - n)]
            parts.append((padded(fmt.pct(hit, unknown="", digits=0), 9), S_DIM))
            if detail:
                bpb = d.bytes_per_block
                gh, hh = d.split[i] if i < len(d.split) else (None, None)
                parts += [(padded(fmt.gib(g * bpb if bpb else None, "?"), 10), S_FIG),
                          (padded(fmt.gib(h * bpb if bpb else None, "?"), 10), S_FIG),
                          (padded(fmt.pct(gh, unknown="", digits=0), 10), S_GPU),
                          (padded(fmt.pct(hh, unknown="", digits=0), 10), S_HOST)]
            lines.append(line_of(*parts))
        return fit_lines(lines, width, height)
