"""What KvtopApp keeps between refreshes, one idea a class: pure (no Textual), so that kvtop/ui/app.py keeps only
the bindings, actions, timers and message handlers, and its state reads by name (``app.fleet.table``,
``app.timing.refresh_s``) rather than as ~50 loose attributes.

- ``Timing``: how often the screen refreshes (its timer), how long the run lasts, what the refreshes cost;
- ``Shown``: the snapshot the panels show and whether the next refresh must draw again;
- ``Kept``: what the view-model (kvtop/ui/views.py) made, kept until its key moves;
- ``Told``: what the event log has been told, so that each thing is said once;
- ``FleetView``: the sources: which one the big panels show, and the sources table;
- ``RequestsView``: the requests view (R) and its table;
- ``Layout``: what the screen's size decides (the sparklines' length);
- ``Themes``: the themes loaded and what went wrong loading them;
- ``Remembered``: the settings file the choices go to, and why the last one could not.

Mutable ones are ``@mutable(slots=True)`` (kvtop/values.py, a dataclass made without compiling code at import),
``Layout`` is ``@frozen`` (replaced whole when the size crosses a threshold).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import field
from typing import TYPE_CHECKING, Any

from kvtop.ui.table import TableState
from kvtop.values import frozen, mutable

if TYPE_CHECKING:   # types only: the module itself imports no Textual (the panels' modules do)
    from collections import deque

    from kvtop.fleet import FleetRow
    from kvtop.session import LogEntry
    from kvtop.tiers import TierModel, TierSnapshot
    from kvtop.tiers.state import RequestRow
    from kvtop.ui.panels.header import VerdictLine
    from kvtop.ui.panels.hit_rate import WhatIfData
    from kvtop.ui.views import BySource, Series


@mutable(slots=True)
class Timing:
    """The refresh's timing: every ``refresh_s`` (+ and - step it; ``timer`` is Textual's interval timer, set at
    mount), the run stopped after ``duration_s`` (None: never), and what the refreshes cost (the bench's figures:
    ``refreshes`` that read the model, the wall time of the last, and a probe called after each)."""

    refresh_s: float
    duration_s: float | None = None
    timer: Any = None
    refreshes: int = 0
    last_cost_s: float = 0.0
    # Called after each refresh with (monotonic time, model time shown, refresh cost in s): the bench's probe.
    on_refreshed: Callable[[float, float | None, float], None] | None = None


@mutable(slots=True)
class Shown:
    """What the panels show: the snapshot (its model time ``data_time``; ``paused_at``: the model time p froze),
    whether the next refresh draws even an unchanged snapshot (``force``: a key, a resize, a source changed), and
    the replay's fold restarts seen (ReplayPlayer.generation: a seek back drops what was shown)."""

    snapshot: TierSnapshot | None = None
    force: bool = True
    data_time: float | None = None
    paused_at: float | None = None
    replay_generation: int = 0


@mutable(slots=True)
class Kept:
    """What the view-model (kvtop/ui/views.py) made, kept between refreshes with the key it was made for: the
    sparklines' series once a history step, the verdict line and the TTFT-by-prefix rows once a second of data
    time, the size advice's curve once CURVE_EVERY_S of model time (its optimum once OPTIMUM_EVERY_S of wall time),
    each tier's sparkline points once a history step. A replay that sought back starts a new one."""

    hist_key: tuple[int, int | None] | None = None
    series: Series = ((), ())
    whatif_key: tuple[Any, ...] | None = None
    whatif: WhatIfData | None = None
    optimum_at: float | None = None  # time.monotonic() of the last read of the size advice's optimum
    verdict_key: tuple[Any, ...] | None = None
    verdict_lines: tuple[VerdictLine, ...] = ()
    by_source_key: tuple[Any, ...] | None = None
    by_source: BySource = ()
    tier_hist: dict[tuple[int, str], deque[float | None]] = field(default_factory=dict)
    tier_hist_step: dict[tuple[int, str], int] = field(default_factory=dict)


@mutable(slots=True)
class Told:
    """What the event log has been told, so that each thing is said once: the last of the session's log entries
    shown, the newest texts of that log (a status the session said itself is not said again), the value last seen
    of each watched figure or status (``seen``), the fold's record count and when it last moved (the stale badge),
    and why the session ended, once it has."""

    log_last: LogEntry | None = None
    session_said: dict[str, None] = field(default_factory=dict)   # at most SAID_KEPT, oldest first
    seen: dict[str, Any] = field(default_factory=dict)
    last_records: int = -1
    last_change_at: float | None = None
    finished: str | None = None


@mutable(slots=True)
class FleetView:
    """The sources: the one the big panels show (``index`` into the sources with data; a source once seen with data
    keeps it), and the sources table (shown with 2+ sources): its sort, filter and cursor, its rows read at most
    every ``refresh_s`` (each kept with the snapshot and status it was made from), in the session's order
    (``rows_all``) and as the table shows them (``arranged``: filtered, sorted)."""

    refresh_s: float
    index: int = 0
    with_data: dict[str, TierModel] = field(default_factory=dict)
    shown: bool = False
    table: TableState = field(default_factory=TableState)
    rows: dict[str, tuple[TierSnapshot, str | None, FleetRow]] = field(default_factory=dict)
    key: tuple[Any, ...] | None = None   # the source set, selection and statuses the rows were read for
    read_at: float = float("-inf")       # time.monotonic() of that read
    rows_all: list[FleetRow] = field(default_factory=list)
    arranged: list[FleetRow] = field(default_factory=list)
    selected: int = 0                    # the index in rows_all of the source the big panels show


@mutable(slots=True)
class RequestsView:
    """The requests view (R, in the panels' place): whether it is shown, its table's sort, filter and cursor, and
    its rows: the snapshot's (running, recent) they were made from, in flight then finished newest first
    (``rows_all``), and as the table shows them (``arranged``)."""

    shown: bool = False
    table: TableState = field(default_factory=TableState)
    seen: tuple[Any, Any] = ((), ())
    rows_all: list[RequestRow] = field(default_factory=list)
    arranged: list[RequestRow] = field(default_factory=list)


@frozen(slots=True)
class Layout:
    """What the screen's size decides beyond the stylesheet: the sparklines' points (the model's whole history at
    200x60, ``xl``, where the sources table also shows for one source)."""

    spark_points: int
    xl: bool = False


@mutable(slots=True)
class Themes:
    """The themes t cycles through (``names``), what could not be loaded (said in the log at mount), a theme loaded
    from a file (its name -> the path given, remembered as the path), the theme last remembered, and the theme's CSS
    variables as start-up gave the stylesheet (None once the first refresh_css has run)."""

    names: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    paths: dict[str, str] = field(default_factory=dict)
    seen: str | None = None
    startup_variables: dict[str, str] | None = None


@mutable(slots=True)
class Remembered:
    """The settings file the theme and layout choices are remembered in (kvtop.settings.remember_choices; None, a
    test's or an embedder's settings: nothing is), and why the last choice could not be (None: it was)."""

    config_file: str | None = None
    problem: str | None = None


__all__ = ["FleetView", "Kept", "Layout", "Remembered", "RequestsView", "Shown", "Themes", "Timing", "Told"]
