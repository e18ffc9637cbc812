"""The moves panel: blocks offloaded, onboarded and evicted per second."""

from __future__ import annotations

from typing import Any

from kvtop.tiers import Moves, Rates
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
)
from kvtop.ui.themes import tier_style
from kvtop.values import frozen


@frozen
class MovesData:
    rates: Rates
    moves: Moves
    history: tuple[tuple[float, ...], ...]  # (offload, onboard, evict GPU, evict host) per step
    known: bool = True              # False: moves come from KV events and none were seen (shown as "?", not 0)
    # why blocks left their tier since start, each count marked "engine" (its events say it) or "inferred"
    # (kvtop/tiers/departures.py describe); None: none left
    left: str | None = None


class MovesPanel(Panel[MovesData]):
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
            return fit(line, width)
        show_total = width >= 40
        base = 8 + 9 + 7 + (9 if show_total else 0)
        spark_w = width - base - 1
        lines: list[Line] = []
        # Two rows a move where the panel has them (200x60): its sparkline twice as tall
        tall = 2 if height >= 2 * len(self.ROWS) + 1 else 1
        disk = d.moves.disk
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
            parts: list[Any] = [(f"{verb:<8}", "bold"), *where, " " * pad, (padded(rate(rate_attr), 7), S_FIG)]
            chart: list[str] = []
            if spark_w >= 6 and d.known:
                chart = fmt.sparkrows([h[i] for h in d.history], spark_w, tall)
                parts += [" ", (chart[-1], style)]
            elif spark_w >= 6:
                parts += [" ", ("no events"[:spark_w].ljust(spark_w), S_DIM)]
            if show_total:
                parts.append((padded(fmt.count(getattr(d.moves, total_attr) if d.known else None), 9), S_DIM))
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
            lines.append(fit(line_of(("left    ", "bold"), (d.left, S_DIM)), width))
        return fit_lines(lines, width, height)
