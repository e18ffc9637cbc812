"""What KvtopApp keeps between refreshes, one idea a class: pure (no Textual), so kvtop/ui/app.py keeps only the
bindings, actions, timers and message handlers."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:   # types only: the module itself imports no Textual (the panels' modules do)
    from collections import deque

    from kvtop.ui.panels.header import VerdictLine
    from kvtop.ui.panels.hit_rate import WhatIfData
    from kvtop.ui.views import BySource, Series


class Kept:
    """What the view-model (kvtop/ui/views.py) made, kept between refreshes with the key it was made for: the
    sparklines' series once a history step, the verdict line and the TTFT-by-prefix rows once a second of data
    time, the size advice's curve once CURVE_EVERY_S of model time (its optimum once OPTIMUM_EVERY_S of wall time),
    each tier's sparkline points once a history step. A replay that sought back starts a new one."""

    __slots__ = ("hist_key", "series", "whatif_key", "whatif", "optimum_at", "verdict_key", "verdict_lines",
                 "by_source_key", "by_source", "tier_hist", "tier_hist_step")

    def __init__(self) -> None:
        self.hist_key: tuple[int, int | None] | None = None
        self.series: Series = ((), ())
        self.whatif_key: tuple[Any, ...] | None = None
        self.whatif: WhatIfData | None = None
        self.optimum_at: float | None = None  # time.monotonic() of the last read of the size advice's optimum
        self.verdict_key: tuple[Any, ...] | None = None
        self.verdict_lines: tuple[VerdictLine, ...] = ()
        self.by_source_key: tuple[Any, ...] | None = None
        self.by_source: BySource = ()
        self.tier_hist: dict[tuple[int, str], deque[float | None]] = {}
        self.tier_hist_step: dict[tuple[int, str], int] = {}
