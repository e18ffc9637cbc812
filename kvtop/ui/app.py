"""The Textual dashboard: ``build_app(session, settings)`` is the one way to make it (the CLI and the tests).

The app owns no data. A session (``kvtop.session.Session``, or any object with its read side, wrapped once by
``kvtop.session.for_dashboard``) runs its producers as a worker on the app's event loop and folds every record into
its TierModel; the app reads it on a timer (``settings.refresh``, 0.25 s by default) and shows it.

What the screen reads, by type and nothing else:
- of the session, one ``SessionView`` per refresh (``session.view()``: meta, status per producer and source, the
  producers' names, the log, the active problems, the stale sources, the driver's requests in flight, started_at,
  its own source's key, the models), and it calls ``tick()``, ``run()``, ``stop()``, ``reset_window()`` and
  ``size_advice()`` (the hit-rate curve over host sizes; None hides it): ``kvtop.session.DashboardSession``;
- of each model, its ``TierSnapshot`` (kvtop/tiers/snapshot.py: ``reading(model)``), never the live fold. The
  snapshot is the cache: a model that folded nothing hands out the same snapshot (a tuple comparison), so "did
  anything change" is ``snapshot is shown``, and only a changed one is drawn again (~0.23 ms to take one).
With 2+ sources that have data, a sources table (kvtop.fleet: one row each and the aggregate) takes the
per-priority and memory panels' place.

The app keeps the bindings, actions, timers and message handlers; what it keeps between refreshes is in small typed
state objects, one idea each (kvtop/ui/state.py: ``timing``, ``shown``, ``fleet``, ``req_view``, ``layout``,
``themes``, ``remembered``, and its own ``_kept``); what each panel is shown is made by kvtop/ui/views.py (pure:
snapshot -> the panel's typed data), and drawn by the panel's own module in kvtop/ui/panels/ (on the line model of
kvtop/ui/panel.py); what the event log is told, by kvtop/ui/narration.py (``narrator``: each change said once); what
a table key does to the sources table or the requests view, by kvtop/ui/tables.py (``tables``).
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, ClassVar, Protocol

from textual import events
from textual.app import App, ComposeResult, SystemCommand
from textual.binding import Binding
from textual.containers import Vertical
from textual.message import Message
from textual.reactive import reactive
from textual.screen import Screen
from textual.widgets import Footer, Input
from textual.worker import Worker

from kvtop.engine_words import is_trtllm
from kvtop.session import DashboardSession, SessionView, for_dashboard
from kvtop.settings import SettingsError, remember_choices, ui_choices
from kvtop.sources.replay import SEEK_S, STEP_S, speed_text
from kvtop.tiers import Quality, Rates, TierModel, TierSnapshot, TierState
from kvtop.tiers.snapshot import reading
from kvtop.ui import format as fmt
from kvtop.ui.narration import STALE_AFTER_S, Narrator
from kvtop.ui.panels.clickable import TableHeaderClicked, TableRowClicked
from kvtop.ui.panels.events import EventLog
from kvtop.ui.panels.header import HeaderBar, HeaderData, replay_clock
from kvtop.ui.panels.help import HelpScreen, KeyHints
from kvtop.ui.panels.hit_rate import HitRatePanel
from kvtop.ui.panels.memory import MemoryPanel
from kvtop.ui.panels.moves import MovesPanel
from kvtop.ui.panels.priority import PriorityPanel
from kvtop.ui.panels.requests import RequestData, RequestPanel
from kvtop.ui.panels.requests_table import RequestsTable
from kvtop.ui.panels.sources import SourcesPanel
from kvtop.ui.panels.tier import TierPanel
from kvtop.ui.state import FleetView, Kept, Layout, Remembered, RequestsView, Shown, Themes, Timing
from kvtop.ui.table import TableState
from kvtop.ui.tables import Tables
from kvtop.ui.themes import (
    DEFAULT_THEME,
    PREFERRED_ORDER,
    VARIABLE_DEFAULTS,
    ThemeError,
    load_theme,
    load_themes,
    tier_variables,
)
from kvtop.ui.views import (
    changed,
    has_data,
    header_data,
    header_sources,
    hit_data,
    kept_requests,
    kept_series,
    kept_verdict,
    kept_what_if,
    memory_data,
    moves_data,
    own_key,
    priority_data,
    quality,
    source_label,
    tier_states,
    tiers_data,
)

# The clock the screen reads for uptime and log times. A module attribute so that tests freeze it (an autouse
# fixture), as harlequin freezes its clock for snapshots; nothing else in the UI reads the time of day.
wall_clock: Callable[[], float] = time.time

DEFAULT_REFRESH_S = 0.25
# + and - step the refresh interval through these (a live or attached run; a replay's + and - are its speed): 0.1 s
# is the floor (a refresh of a busy fleet costs ~1-5 ms; ten a second is still under 5% of a core), 5 s the ceiling
# (a slower screen looks stopped)
REFRESH_STEPS = (0.1, 0.25, 0.5, 1.0, 2.0, 5.0)
REPLAY_ACTIONS = frozenset({"seek_back", "seek_forward", "seek_home", "seek_end", "step", "step_back"})
SPARK_POINTS = 120       # history points kept for sparklines: 2 minutes at the model's 1 s step
XL_SPARK_POINTS = 600    # 200x60: the model's whole history (600 steps), the sparklines are ~170 cells wide
XL = (180, 50)           # from this size up the wide layout uses the room (200x60 is the reference)
WIDE = (110, 34)         # the full layout from this size up (120x40 is the reference)
COMPACT = (60, 20)       # below either: one- and two-line panels (40x12 must stay whole)
# The sources table reads every source's model (~0.15 ms each, the TTFT percentiles most of it): at most once a
# second, so 64 busy sources cost ~10 ms a second (1% of a core), not 40 ms at the 0.25 s refresh. A change of
# the source set, the selection or a status shows at once.
FLEET_REFRESH_S = 1.0


def layout_for(width: int, height: int) -> str:
    if width < COMPACT[0] or height < COMPACT[1]:
        return "compact"
    if width >= XL[0] and height >= XL[1]:
        return "xl"
    if width >= WIDE[0] and height >= WIDE[1]:
        return "wide"
    return "medium"


class ScreenSettings(Protocol):
    """What the screen reads of the settings (kvtop.settings.Settings has them all)."""

    @property
    def refresh(self) -> float: ...            # s between refreshes
    @property
    def theme(self) -> str: ...                # a theme's name or a .toml path
    @property
    def duration(self) -> float | None: ...    # s, then the session is stopped


class FilterInput(Input):
    """The filter's line (``/``): what is typed filters the table as it is typed; Enter keeps it, Escape clears it
    (either way the line goes and the keys are the dashboard's again)."""

    BINDINGS: ClassVar = [Binding("escape", "cancel", "Clear filter", show=False)]
    can_focus = False   # until it is opened: the keys are the dashboard's (a focused input would take them)

    class Closed(Message):
        def __init__(self, value: str, kept: bool):
            super().__init__()
            self.value = value
            self.kept = kept

    def action_cancel(self) -> None:
        self.post_message(self.Closed("", kept=False))

    def on_input_submitted(self, event: Input.Submitted) -> None:
        event.stop()
        self.post_message(self.Closed(event.value, kept=True))


class Column(Vertical):
    """A column of panels that its panels cover whole (#left, #right, the bottom dock): Textual paints it as blank
    lines without styling them (``BLANK``), since the compositor renders every widget under a repaint, and the
    columns' own lines, hidden under the panels, cost as much to style as a panel's."""

    BLANK = True


class DashboardScreen(Screen[None]):
    """The one screen. Its class (``-wide`` / ``-medium`` / ``-compact``) follows its size (kvtop.tcss)."""

    BLANK = True

    def compose(self) -> ComposeResult:
        # The layout's classes before the first layout, from the terminal's size: set at mount, they restyled and
        # laid out the whole screen a second time before its first frame.
        self._set_layout_classes(layout_for(self.app.size.width, self.app.size.height))
        yield HeaderBar(id="header")
        with Column(id="bottom"):  # docked widgets on one edge overlap: the log and the keys share one dock
            # Full width under both columns (its columns need ~110 cells); shown only with 2+ sources (-fleet).
            yield SourcesPanel(id="sources")
            yield FilterInput(placeholder="filter: type part of a name, Enter keeps it, Esc clears it",
                              id="filter", compact=True)
            yield EventLog(id="events")
            yield Footer(compact=True)
            yield KeyHints(id="keys")
        with Column(id="left"):
            yield TierPanel(id="tier-gpu")
            yield TierPanel(id="tier-host")
            yield PriorityPanel(id="priorities")
        with Column(id="right"):
            yield HitRatePanel(id="hit")
            yield MovesPanel(id="moves")
            yield RequestPanel(id="requests")
            yield MemoryPanel(id="memory")
        yield RequestsTable(id="requests-view")   # R: in both columns' place (the screen's -reqs class)

    def _set_layout_classes(self, mode: str) -> None:
        # -xl is the wide layout and more (kvtop.tcss): both classes, so every wide rule still applies.
        for name in ("wide", "medium", "compact", "xl"):
            self.set_class(name == mode or (name == "wide" and mode == "xl"), f"-{name}")

    def on_mount(self) -> None:
        self.apply_layout(self.size.width, self.size.height)
        app = self.app
        if isinstance(app, KvtopApp):
            app.dashboard_mounted(self)

    def on_resize(self, event: events.Resize) -> None:
        self.apply_layout(event.size.width, event.size.height)

    def apply_layout(self, width: int, height: int) -> None:
        mode = layout_for(width, height)
        self._set_layout_classes(mode)
        app = self.app
        if isinstance(app, KvtopApp):
            app.layout_changed(mode)


class KvtopApp(App[int]):
    """kvtop's dashboard. Build it with :func:`build_app`."""

    CSS_PATH = "kvtop.tcss"
    TITLE = "kvtop"
    ENABLE_COMMAND_PALETTE = True
    BINDINGS: ClassVar = [
        Binding("q", "quit", "Quit"),
        # Ctrl-C quits like q, with status 130 as a shell expects of an interrupt (Textual would only hint
        # "press ctrl+q"; priority: no focused widget may take it).
        Binding("ctrl+c", "interrupt", "Quit", show=False, priority=True),
        Binding("p", "pause", "Pause"),
        # + and -: a replay's speed, else the refresh interval; the replay's player keys (shown only in a replay)
        Binding("plus,equals_sign", "faster", "Faster", key_display="+", show=False),
        Binding("minus", "slower", "Slower", key_display="-", show=False),
        Binding("left", "seek_back", "-5s", key_display="←", show=False),
        Binding("right", "seek_forward", "+5s", key_display="→", show=False),
        Binding("home", "seek_home", "Start", show=False),
        Binding("end", "seek_end", "End", show=False),
        Binding("full_stop", "step", "Step", key_display=".", show=False),
        Binding("comma", "step_back", "Step back", key_display=",", show=False),
        Binding("r", "reset_window", "Reset"),
        Binding("t", "cycle_theme", "Theme"),
        Binding("e", "toggle_events", "Events"),
        Binding("s", "next_source", "Source"),
        # The tables (the sources table; the requests view with R): sort, filter, move, open. Not the arrows,
        # +/-, home/end or p: the replay player's.
        Binding("o", "sort_next", "Sort", show=False),
        Binding("O", "sort_reverse", "Reverse", show=False),
        Binding("slash", "filter", "Filter", key_display="/", show=False),
        Binding("j", "cursor(1)", "Down", show=False),
        Binding("k", "cursor(-1)", "Up", show=False),
        Binding("enter", "open_row", "Open", show=False),
        Binding("R", "toggle_requests", "Requests", show=False),
        Binding("question_mark", "help", "Help", key_display="?"),
    ]

    paused: reactive[bool] = reactive(False, init=False)
    show_events: reactive[bool] = reactive(True, init=False)

    # -- messages: what a key or command did, in the past tense (tests assert on them) --
    class PauseToggled(Message):
        def __init__(self, paused: bool):
            super().__init__()
            self.paused = paused

    class WindowReset(Message):
        pass

    class ThemeCycled(Message):
        def __init__(self, theme: str):
            super().__init__()
            self.theme = theme

    class EventsToggled(Message):
        def __init__(self, shown: bool):
            super().__init__()
            self.shown = shown

    class SourceChanged(Message):
        def __init__(self, source: str):
            super().__init__()
            self.source = source

    class HelpShown(Message):
        pass

    class ReplayChanged(Message):
        """A player key did this: ``what`` (pause, play, seek, step, speed) and where it leaves the replay."""

        def __init__(self, what: str, position_s: float, speed: float, paused: bool):
            super().__init__()
            self.what = what
            self.position_s = position_s
            self.speed = speed
            self.paused = paused

    class RefreshChanged(Message):
        def __init__(self, refresh_s: float):
            super().__init__()
            self.refresh_s = refresh_s

    class RequestsToggled(Message):
        def __init__(self, shown: bool):
            super().__init__()
            self.shown = shown

    class TableSorted(Message):
        def __init__(self, table: str, column: str | None, descending: bool):
            super().__init__()
            self.table = table
            self.column = column
            self.descending = descending

    class TableFiltered(Message):
        def __init__(self, table: str, text: str):
            super().__init__()
            self.table = table
            self.text = text

    def __init__(self, session: Any, settings: ScreenSettings | None = None, *, run_session: bool = True,
                 config_file: str | None = None):
        super().__init__()
        self.session: DashboardSession = for_dashboard(session)
        self.settings = settings
        self.run_session = run_session
        self.timing = Timing(
            float(settings.refresh if settings is not None and settings.refresh else DEFAULT_REFRESH_S),
            None if settings is None else settings.duration)
        # config_file: the settings file the theme and layout choices are remembered in
        # (kvtop.settings.remember_choices); None (a test's or an embedder's settings): nothing is remembered.
        self.remembered = Remembered(config_file)
        self.themes = Themes()
        self._register_themes(settings.theme if settings is not None and settings.theme else DEFAULT_THEME)
        self.shown = Shown()
        self._kept = Kept()   # what views.py made, kept between refreshes until its key moves
        self.narrator = Narrator(self._said)   # the event log's lines, each said once
        self.fleet = FleetView(FLEET_REFRESH_S)
        self.req_view = RequestsView()
        self.tables = Tables(self.fleet, self.req_view)   # the sources table's and the requests view's keys
        self.layout = Layout(SPARK_POINTS)
        self._session_worker: Worker[None] | None = None
        self._dashboard: DashboardScreen | None = None
        self._panels: dict[str, Any] = {}
        self._view: SessionView | None = None    # the session as the last refresh read it

    # ------------------------------------------------------------------------------------------ themes

    def _register_themes(self, wanted: str) -> None:
        themes, errors = load_themes()
        self.themes.errors = errors
        for theme in themes:
            self.register_theme(theme)
        self.themes.names = [t.name for t in themes]
        name = wanted
        if wanted.endswith(".toml") or "/" in wanted:
            try:
                theme = load_theme(Path(wanted).expanduser())
            except ThemeError as exc:
                self.themes.errors.append(str(exc))
                name = DEFAULT_THEME
            else:
                self.register_theme(theme)
                if theme.name not in self.themes.names:
                    self.themes.names.append(theme.name)
                name = theme.name
                self.themes.paths[name] = wanted
        if name not in self.available_themes:
            self.themes.errors.append(f"theme {wanted!r} not found (have {', '.join(self.themes.names)})")
            name = DEFAULT_THEME if DEFAULT_THEME in self.available_themes else "textual-dark"
        self.theme = name
        # The theme's variables go into the stylesheet now, while it holds no rules, so that the rules read them
        # when first parsed. Textual's theme watcher has also scheduled a refresh_css for the start: a reparse of
        # kvtop.tcss and App's CSS into a fresh stylesheet whose parse cache is then dropped, so that the screen's
        # registration parsed kvtop.tcss once more (51M instructions, ~4% of replay's first screen, for rules
        # the same as those the first parse makes): refresh_css skips it (below).
        self.themes.startup_variables = self.get_css_variables()
        self.stylesheet.set_variables(self.themes.startup_variables)

    def refresh_css(self, animate: bool = True) -> None:
        startup, self.themes.startup_variables = self.themes.startup_variables, None
        if startup is not None and not self.screen_stack and startup == self.get_css_variables():
            return  # the start's: the stylesheet has these variables and no screen has been styled yet
        super().refresh_css(animate)

    def get_css_variables(self) -> dict[str, str]:
        # kvtop's colour variables for themes that lack them (Textual's own, picked from the palette): each
        # falls back to the theme's own colour it names (VARIABLE_DEFAULTS), resolved here since a CSS
        # variable's default cannot refer to another variable.
        variables = super().get_css_variables()
        # The colour code (kvtop.palette): a theme that lacks it gets the one for its darkness, so that GPU, host
        # and disk keep their colours in any theme the palette offers.
        theme = self.get_theme(self.theme)
        for name, colour in tier_variables(self.theme, True if theme is None else theme.dark).items():
            variables.setdefault(name, colour)
        for name, ref in VARIABLE_DEFAULTS.items():
            if name not in variables:
                variables[name] = variables.get(ref.lstrip("$"), variables.get("foreground", "#e0e0e0"))
        self.theme_variables = variables
        return variables

    # ------------------------------------------------------------------------------------------ lifecycle

    def get_default_screen(self) -> Screen[Any]:
        return DashboardScreen(id="dashboard")

    def dashboard_mounted(self, screen: DashboardScreen) -> None:
        """Wire the panels and start the session and the refresh timer (the screen's widgets exist now)."""
        self._panels = {
            "header": screen.query_one(HeaderBar), "tiers": list(screen.query(TierPanel)),
            "prio": screen.query_one(PriorityPanel),
            "hit": screen.query_one(HitRatePanel), "moves": screen.query_one(MovesPanel),
            "requests": screen.query_one(RequestPanel), "memory": screen.query_one(MemoryPanel),
            "events": screen.query_one(EventLog), "sources": screen.query_one(SourcesPanel),
        }
        self._dashboard = screen
        view = self._view = self.session.view()
        self.narrator.session_log(view)  # the session's earlier lines first, so the log reads in time order
        for err in self.themes.errors:
            self.note("warn", err)
        self._restore_choices()
        self.themes.seen = self.theme
        with contextlib.suppress(AttributeError):   # t's theme, or one picked in the palette, is remembered
            self.theme_changed_signal.subscribe(self, self._theme_changed)
        meta = view.meta
        what = " ".join(str(x) for x in (meta.get("engine"), meta.get("model")) if x)
        self.note("info", f"kvtop dashboard{' on ' + what if what else ''}: refresh {self.timing.refresh_s:g} s, "
                          f"theme {self.theme} (? for help)")
        if self.run_session:
            self._session_worker = self.run_worker(self._run_session(), name="session", group="session",
                                                   exit_on_error=False)
            if self.timing.duration_s:
                self.set_timer(float(self.timing.duration_s), self._duration_reached, name="duration")
        self.refresh_view()
        self.timing.timer = self.set_interval(self.timing.refresh_s, self.refresh_view, name="refresh")


    def layout_changed(self, mode: str) -> None:
        """The screen's layout: 200x60 (xl) keeps the sparklines' whole history and shows the sources table
        even for one source."""
        xl = mode == "xl"
        points = XL_SPARK_POINTS if xl else SPARK_POINTS
        layout = Layout(points, xl)
        if layout != self.layout:
            self.layout = layout
            self._kept.hist_key = None
            self.fleet.key = None
            self.shown.force = True
            if self._panels:   # a resize, not the first layout (the panels are wired after it)
                self.refresh_view()

    async def _run_session(self) -> None:
        try:
            await self.session.run()
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the screen stays up to show what happened
            self.narrator.ended(f"stopped: {type(exc).__name__}")
            self.note("error", f"session stopped: {type(exc).__name__}: {exc}")
        else:
            self.narrator.ended("session finished")
            self.note("info", "session finished; the screen keeps its last figures (q quits)")
        self.refresh_view()

    def _duration_reached(self) -> None:
        self.narrator.ended(f"--duration {self.timing.duration_s:g} s reached", first=False)
        self.note("info", f"--duration {self.timing.duration_s} s reached")
        self.session.stop()

    def note(self, level: str, text: str) -> None:
        """A line in the event log from the UI itself (not the session's log)."""
        self._said(None, level, text)

    def _said(self, t: float | None, level: str, text: str) -> None:
        """A line in the event log at ``t`` (None: now): the narrator's and the UI's own."""
        events_panel = self._panels.get("events")
        if events_panel is not None:
            events_panel.add(wall_clock() if t is None else t, level, text)

    # ------------------------------------------------------------------------------------------ refresh

    def _sources(self) -> list[tuple[str, TierModel]]:
        """The attached sources that have sent data (a session's own meta record alone makes a model too)."""
        view = self._view if self._view is not None else self.session.view()
        models = view.models
        if len(models) <= 1:
            return [("", view.model)]
        active = [(k, m) for k, m in models.items() if self._has_data(k, m)]
        if len(active) == 1:
            return [("", active[0][1])]
        return active or [("", view.model)]

    def _has_data(self, key: str, model: TierModel) -> bool:
        # Each source's snapshot is read only until it has data, which it then keeps (block counts, lookups and
        # devices are never forgotten): 64 busy sources cost no snapshot each per refresh, only the shown one.
        if self.fleet.with_data.get(key) is model:
            return True
        if has_data(reading(model)):
            self.fleet.with_data[key] = model
            return True
        return False

    def current_model(self) -> tuple[str, TierModel]:
        sources = self._sources()
        return sources[self.fleet.index % len(sources)]

    def refresh_view(self) -> None:
        """Read the session and its model's snapshot, and show them. On the UI loop every ``refresh_s``; never
        blocks (no I/O)."""
        t0 = time.perf_counter()
        now = wall_clock()
        self.session.tick(now)  # stale sources, and the problem lines due, into the session's log
        view = self._view = self.session.view()
        self.narrator.session_log(view)
        player = view.player
        if player is not None and player.generation != self.shown.replay_generation:
            self.shown.replay_generation = player.generation
            self._fold_restarted()
        if self.paused:
            # The figures stay frozen; the header still knows whether records arrive (a paused screen over a
            # running engine is not stale), and whether the session finished meanwhile.
            key, live = self.current_model()
            snap = reading(live)
            self.narrator.freshness(now, snap)
            self._panels["header"].show(self._header(now, key, snap, quality(self.shown.snapshot)))
            return
        self._refresh_fleet(view)
        key, live = self.current_model()
        # One immutable reading of the fold (kvtop/tiers/snapshot.py) that every panel below reads; a model that
        # folded nothing since hands out the same one, which is how a refresh knows nothing changed.
        snap = reading(live)
        if not changed(snap, self.shown.snapshot) and not self.shown.force:
            # Nothing was folded since the last refresh: only the header's clock can have moved. An idle engine
            # then costs a header line a second, not a redraw of every panel four times a second.
            self.narrator.idle(now)
            self._panels["header"].show(self._header(now, key, snap, quality(self.shown.snapshot)))
            return
        self.shown.snapshot = snap
        self.shown.force = False
        q = snap.quality
        self.narrator.model(now, snap, q, view.status)
        self._panels["header"].show(self._header(now, key, snap, q))
        tiers = tier_states(snap)
        gpu, host = tiers[0], tiers[1] if len(tiers) > 1 else snap.host
        self._show_tiers(tiers, live, snap)
        hit_history, moves_history = kept_series(self._kept, live, snap, self.layout.spark_points)
        rates = snap.rates
        what_if = kept_what_if(self._kept, live, snap, view.model, self.session.size_advice, time.monotonic)
        self._panels["hit"].show(hit_data(snap, hit_history, what_if))
        self._panels["moves"].show(moves_data(snap, rates, moves_history, q))
        self._panels["requests"].show(self._requests(live, snap, rates, view))
        self._panels["prio"].show(priority_data(snap, gpu, host))
        self._panels["memory"].show(memory_data(snap, host, view))
        self._show_requests()
        self.shown.data_time = snap.now
        self.timing.refreshes += 1
        self.timing.last_cost_s = time.perf_counter() - t0
        if self.timing.on_refreshed is not None:
            self.timing.on_refreshed(time.monotonic(), snap.now, self.timing.last_cost_s)

    def _fold_restarted(self) -> None:
        """The replay sought back: the session's models are new ones, folded again from the recording's start.
        What the screen kept of the old ones (by identity) goes, so that nothing of a later position shows."""
        self.fleet.with_data.clear()
        self.fleet.rows.clear()
        self._kept = Kept()
        self.fleet.key = None
        self.shown.snapshot = None
        self.shown.force = True

    def _show_tiers(self, tiers: list[TierState], live: TierModel, snap: TierSnapshot) -> None:
        """A TierPanel per tier, in the model's order (GPU, host, then disk where the engine has one): a tier
        the screen has no panel for yet gets one, mounted under the last."""
        panels: list[TierPanel] = self._panels["tiers"]
        while len(panels) < len(tiers) and self._dashboard is not None:
            panel = TierPanel(id=f"tier-{tiers[len(panels)].name.lower()}")
            self._dashboard.query_one("#left").mount(panel, after=panels[-1])
            panels.append(panel)
            self._dashboard.set_class(len(panels) > 2, "-tiers3")
        data = tiers_data(self._kept, live, snap, tiers, XL_SPARK_POINTS, self.layout.spark_points, self.layout.xl)
        for panel, d in zip(panels, data):
            panel.show(d)

    def _refresh_fleet(self, view: SessionView) -> None:
        """The sources table: shown (the screen's ``-fleet`` class) while 2+ sources have data."""
        sources = self._sources()
        fleet = len(sources) > 1 or self.layout.xl   # 200x60 has room for the table even with one source
        if len(sources) == 1:
            sources = [(own_key(view), sources[0][1])]
        if fleet != self.fleet.shown:
            self.fleet.shown = fleet
            if self._dashboard is not None:
                self._dashboard.set_class(fleet, "-fleet")  # restyles the screen: only when it changes
            self.fleet.key = None
        if not fleet:
            return
        if self.tables.read_fleet(sources, view.status, self.fleet.index, time.monotonic()):
            self._show_fleet()

    def _show_fleet(self, top: bool = False) -> None:
        """The sources table from the rows last read (kvtop/ui/tables.py). Also on a sort, filter or cursor key,
        paused or not (the rows are those on screen; nothing is read)."""
        data = self.tables.fleet_data(top)
        if data is not None:
            self._panels["sources"].show(data)

    def finished_reason(self) -> str | None:
        """Why no more data will come, or None while the session runs (kvtop/ui/narration.py)."""
        return self.narrator.finished_reason(self._view if self._view is not None else self.session.view())

    def _header(self, now: float, key: str, snap: TierSnapshot, q: Quality | None) -> HeaderData:
        view = self._view if self._view is not None else self.session.view()
        stale, finished = self.narrator.stale(now, view)
        # Statuses of sources (their keys) are in the sources table's status column, not in the header.
        return header_data(now, snap, q, view, stale_s=stale, finished=finished, paused=self.paused,
                           paused_at=self.shown.paused_at if self.paused else None,
                           sources=header_sources(view, self.fleet.shown),
                           source_label=source_label(key, self.fleet.index, len(self._sources())),
                           verdict=kept_verdict(self._kept, snap),
                           refresh_s=None if self.timing.refresh_s == DEFAULT_REFRESH_S else self.timing.refresh_s)

    def _requests(self, live: TierModel, snap: TierSnapshot, rates: Rates, view: SessionView) -> RequestData:
        self.narrator.failures(live, snap.requests)
        return kept_requests(self._kept, snap, rates, view)

    # ------------------------------------------------------------------------------------------ actions

    def watch_paused(self, paused: bool) -> None:
        # Show the change with the keypress, not at the next timer tick (up to 0.25 s later): the PAUSED badge
        # on pause (a snapshot under load caught the screen before the tick), fresh figures on resume.
        if not paused:
            self.shown.force = True
        self.refresh_view()

    def watch_show_events(self, shown: bool) -> None:
        panel = self._panels.get("events")
        if panel is not None:
            panel.set_class(not shown, "-hidden")

    def action_pause(self) -> None:
        player = self._player()
        if player is not None:   # a replay pauses itself: no record comes until p again (step and seek still go)
            paused = player.toggle_pause()
            self._replay_changed("pause" if paused else "play")
            return
        if not self.paused:
            self.shown.paused_at = self.shown.data_time
        self.paused = not self.paused
        self.post_message(self.PauseToggled(self.paused))

    # -- the replay's player (kvtop/sources/replay.py ReplayPlayer) and the refresh interval

    def _player(self) -> Any:
        view = self._view if self._view is not None else self.session.view()
        return view.player

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # The player's keys exist only in a replay: live, they are not bound (a table may take the arrows).
        if action in REPLAY_ACTIONS:
            return self._player() is not None
        return True

    def _replay_changed(self, what: str) -> None:
        player = self._player()
        self.post_message(self.ReplayChanged(what, player.position_s, player.speed, player.paused))
        self.refresh_view()

    def action_faster(self) -> None:
        """+: a replay plays faster; else the screen refreshes more often (down to REFRESH_STEPS[0])."""
        player = self._player()
        if player is not None:
            player.faster()
            self._replay_changed("speed")
            return
        self.set_refresh(max([s for s in REFRESH_STEPS if s < self.timing.refresh_s] or [REFRESH_STEPS[0]]))

    def action_slower(self) -> None:
        """-: a replay plays slower; else the screen refreshes less often (up to REFRESH_STEPS[-1])."""
        player = self._player()
        if player is not None:
            player.slower()
            self._replay_changed("speed")
            return
        self.set_refresh(min([s for s in REFRESH_STEPS if s > self.timing.refresh_s] or [REFRESH_STEPS[-1]]))

    def set_refresh(self, refresh_s: float) -> None:
        """Refresh every ``refresh_s`` from now on (the timer is started again)."""
        if refresh_s == self.timing.refresh_s:
            edge = "fastest" if refresh_s <= REFRESH_STEPS[0] else "slowest"
            self.notify(f"refresh every {refresh_s:g} s: the {edge} ({REFRESH_STEPS[0]:g}-{REFRESH_STEPS[-1]:g} s)",
                        timeout=2)
            return
        self.timing.refresh_s = refresh_s
        if self.timing.timer is not None:
            self.timing.timer.stop()
            self.timing.timer = self.set_interval(refresh_s, self.refresh_view, name="refresh")
        self.post_message(self.RefreshChanged(refresh_s))
        self.refresh_view()

    def action_seek_back(self) -> None:
        self._player().seek(-SEEK_S)
        self._replay_changed("seek")

    def action_seek_forward(self) -> None:
        self._player().seek(SEEK_S)
        self._replay_changed("seek")

    def action_seek_home(self) -> None:
        self._player().seek_to(0.0)
        self._replay_changed("seek")

    def action_seek_end(self) -> None:
        player = self._player()
        player.seek_to(player.length_s if player.length_s is not None else math.inf)
        self._replay_changed("seek")

    def action_step(self) -> None:
        self._player().step(STEP_S)
        self._replay_changed("step")

    def action_step_back(self) -> None:
        self._player().step(-STEP_S)
        self._replay_changed("step")

    def action_reset_window(self) -> None:
        self.session.reset_window()
        self._kept.hist_key = None
        self.fleet.key = None
        self.shown.force = True
        self.post_message(self.WindowReset())
        self.refresh_view()

    # -- the choices remembered in the settings file --

    def _restore_choices(self) -> None:
        """The layout last chosen (the settings file's [ui] table): the event log, the requests view, the tables'
        sorts. What cannot be read or used is said in the log, and the rest is used."""
        if not self.remembered.config_file:
            return
        try:
            ui = ui_choices(self.remembered.config_file)
        except SettingsError as exc:
            self.note("warn", f"{exc}: the dashboard's last choices are not restored")
            return
        bad: list[str] = []
        events = ui.get("events")
        if isinstance(events, bool):
            self.show_events = events
        elif events is not None:
            bad.append(f"events = {fmt.clean(repr(events), 30)} (true or false)")
        view = ui.get("view")
        if view == "requests":
            self.action_toggle_requests(remember=False)
        elif view not in (None, "dashboard"):
            bad.append(f"view = {fmt.clean(repr(view), 30)} (dashboard or requests)")
        for table in ("sources", "requests"):
            text = ui.get(f"{table}_sort")
            if text is None:
                continue
            state, panel, _ = self.tables.spec(table)
            if not isinstance(text, str) or not state.from_text(text, tuple(panel.SORT_VALUES)):
                bad.append(f"{table}_sort = {fmt.clean(repr(text), 30)} (one of {', '.join(panel.SORT_VALUES)}, "
                           "- first for descending)")
        for what in bad:
            self.note("warn", f"settings file {self.remembered.config_file} [ui] {what}: ignored")

    def _theme_changed(self, _theme: Any) -> None:
        if self.theme != self.themes.seen:   # not the start's own theme, published late
            self.themes.seen = self.theme
            self._remember(theme=True)

    def _remember(self, theme: bool = False) -> None:
        """Remember the layout (and with ``theme``, the theme) in the settings file; a file or folder that cannot
        be written is said in the log and a toast (once per reason), and the dashboard goes on."""
        if not self.remembered.config_file or self._dashboard is None:
            return
        ui = {"events": bool(self.show_events), "view": "requests" if self.req_view.shown else "dashboard",
              "sources_sort": self.fleet.table.to_text(), "requests_sort": self.req_view.table.to_text()}
        settings = {"theme": self.themes.paths.get(self.theme, self.theme)} if theme else {}
        try:
            remember_choices(self.remembered.config_file, settings, ui)
        except SettingsError as exc:
            problem = str(exc)
            self.note("warn", f"not remembered: {problem}")
            if problem != self.remembered.problem:
                self.notify(f"kvtop cannot remember this choice: {problem}", severity="warning", timeout=8)
            self.remembered.problem = problem
        else:
            self.remembered.problem = None

    def action_cycle_theme(self) -> None:
        names = [n for n in PREFERRED_ORDER if n in self.themes.names] + \
                [n for n in self.themes.names if n not in PREFERRED_ORDER]
        if not names:
            return
        i = names.index(self.theme) + 1 if self.theme in names else 0
        self.theme = names[i % len(names)]
        self.post_message(self.ThemeCycled(self.theme))

    def action_toggle_events(self) -> None:
        self.show_events = not self.show_events
        self.post_message(self.EventsToggled(self.show_events))
        self._remember()

    def action_next_source(self) -> None:
        sources = self._sources()
        if len(sources) <= 1:
            self.notify("only one source is attached", timeout=2)
            return
        shown = self.fleet.arranged if self.fleet.shown else []
        if shown and len(shown) < len(sources) or self.fleet.table.sort is not None:
            # the next row down the table as it is sorted and filtered (the cursor goes with it)
            own = sources[self.fleet.index % len(sources)][0]
            keys = [r.key for r in shown]
            at = keys.index(own) + 1 if own in keys else 0
            if keys:
                self._show_source(keys[at % len(keys)])
            return
        self._select_source((self.fleet.index + 1) % len(sources))

    def _show_source(self, key: str) -> bool:
        """The big panels show source ``key`` (a row of the sources table); False if it is not attached."""
        index = next((i for i, (k, _) in enumerate(self._sources()) if k == key), None)
        if index is None:
            return False
        self._select_source(index)
        return True

    # -- the tables: sort (o, O, a click on a header), filter (/), cursor (j, k, a click), open (Enter); what
    # each key does to a table is kvtop/ui/tables.py's, here the messages and the widgets --

    def _no_table(self) -> None:
        self.notify("no table on screen: the sources table shows with 2+ sources, R shows the requests",
                    timeout=3)

    def _table_changed(self, table: str, top: bool = False) -> None:
        if table == "sources":
            self._show_fleet(top)
        else:
            self._show_requests(top)

    def action_sort_next(self) -> None:
        table = self.tables.active()
        if table is None:
            return self._no_table()
        self._sorted(table, self.tables.sort_next(table))

    def action_sort_reverse(self) -> None:
        table = self.tables.active()
        if table is None:
            return self._no_table()
        self._sorted(table, self.tables.sort_reverse(table))

    def _sorted(self, table: str, state: TableState) -> None:
        self._table_changed(table, top=True)
        self.post_message(self.TableSorted(table, state.sort, state.descending))
        self._remember()

    def on_table_header_clicked(self, message: TableHeaderClicked) -> None:
        self._sorted(message.table, self.tables.sort_by(message.table, message.column))

    def on_table_row_clicked(self, message: TableRowClicked) -> None:
        self.tables.spec(message.table)[0].cursor = message.key
        self._table_changed(message.table)
        if message.chain >= 2:
            self._open(message.table, message.key)

    def action_cursor(self, step: int) -> None:
        table = self.tables.active()
        # quietly: j, k and Enter are keys a hand hits by chance
        if table is not None and self.tables.move_cursor(table, step):
            self._table_changed(table)

    def action_open_row(self) -> None:
        table = self.tables.active()
        key = None if table is None else self.tables.cursor_key(table)
        if table is not None and key is not None:
            self._open(table, key)

    def _open(self, table: str, key: str) -> None:
        """Enter on a row: a source is shown in the big panels; a request's whole row is said in a toast."""
        if table == "sources":
            self._show_source(key)
            return
        said = self.tables.request_said(key)
        if said is not None:
            self.notify(said[0], severity="error" if said[1] else "information", timeout=10)

    def action_filter(self) -> None:
        table = self.tables.active()
        if table is None:
            return self._no_table()
        field = self.query_one(FilterInput)
        field.value = self.tables.spec(table)[0].filter
        field.display = True   # set on the widget, not by a class: the focus below needs it shown now
        field.can_focus = True
        # Focused now, not after the keys already queued (Widget.focus waits its turn): a name typed fast after
        # "/" (tmux send-keys, a paste) went to the dashboard's bindings and the filter got nothing.
        self.screen.set_focus(field)

    def on_input_changed(self, event: Input.Changed) -> None:
        if isinstance(event.input, FilterInput) and event.input.display:
            self._filter(event.value)

    def on_filter_input_closed(self, message: FilterInput.Closed) -> None:
        field = self.query_one(FilterInput)
        field.display = False
        self.screen.set_focus(None)
        field.can_focus = False
        self._filter(message.value)
        table = self.tables.active()
        if table is not None:
            self.post_message(self.TableFiltered(table, self.tables.spec(table)[0].filter))

    def _filter(self, text: str) -> None:
        table = self.tables.set_filter(text)
        if table is not None:
            self._table_changed(table)

    def action_toggle_requests(self, remember: bool = True) -> None:
        """R: the requests view in the place of the panels, or the panels again."""
        self.req_view.shown = not self.req_view.shown
        if self._dashboard is not None:
            self._dashboard.set_class(self.req_view.shown, "-reqs")
        if self.req_view.shown:
            self._show_requests()
        self.post_message(self.RequestsToggled(self.req_view.shown))
        if remember:
            self._remember()

    def _show_requests(self, top: bool = False) -> None:
        """The requests view from the shown snapshot (kvtop/ui/tables.py), while it is shown."""
        if not self.req_view.shown or self._dashboard is None:
            return
        snap = self.shown.snapshot if self.shown.snapshot is not None else reading(self.current_model()[1])
        view = self._view
        key = self.current_model()[0] or (own_key(view) if view is not None else "")
        self._dashboard.query_one(RequestsTable).show(self.tables.requests_data(snap, view, key, top))

    def _select_source(self, index: int) -> None:
        sources = self._sources()
        self.fleet.index = index
        self.fleet.table.cursor = sources[index][0]
        self._kept.hist_key = None
        self.fleet.key = None
        self.shown.force = True
        self.post_message(self.SourceChanged(sources[self.fleet.index][0]))
        self.refresh_view()

    def action_help(self) -> None:
        if isinstance(self.screen, HelpScreen):
            self.pop_screen()
            return
        # the requests on screen (the shown snapshot's), else the current model's now; its engine's words
        shown = self.shown.snapshot if self.shown.snapshot is not None else reading(self.current_model()[1])
        req = shown.requests
        self.push_screen(HelpScreen(req.last_error, req.failed, is_trtllm(shown.meta.get("engine"))))
        self.post_message(self.HelpShown())

    async def action_quit(self, return_code: int = 0) -> None:
        """Stop the session (engine, driver, pollers), give it 3 s to close cleanly, then exit with status 0."""
        with contextlib.suppress(Exception):
            self.session.stop()
        worker = self._session_worker
        if worker is not None and not worker.is_finished:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(worker.wait(), timeout=3.0)
        self.exit(return_code=return_code)

    async def action_interrupt(self) -> None:
        """Ctrl-C: as q, with exit status 130."""
        await self.action_quit(130)

    # -- message handlers: each action's message also lands in the event log --
    def on_kvtop_app_pause_toggled(self, message: PauseToggled) -> None:
        self.note("info", "screen paused (the engine goes on)" if message.paused else "screen resumed")

    def on_kvtop_app_replay_changed(self, message: ReplayChanged) -> None:
        where = replay_clock(message.position_s)
        self.note("info", {"pause": f"replay paused at {where}", "play": f"replay playing from {where}",
                           "seek": f"replay: to {where}", "step": f"replay: stepped to {where}",
                           "speed": f"replay speed {speed_text(message.speed)}"}.get(message.what, message.what))

    def on_kvtop_app_refresh_changed(self, message: RefreshChanged) -> None:
        self.note("info", f"refresh every {message.refresh_s:g} s (+/-: {REFRESH_STEPS[0]:g} to "
                          f"{REFRESH_STEPS[-1]:g} s)")

    def on_kvtop_app_theme_cycled(self, message: ThemeCycled) -> None:
        self.note("info", f"theme: {message.theme}")

    def on_kvtop_app_source_changed(self, message: SourceChanged) -> None:
        self.note("info", f"showing source {message.source}")

    def action_screenshot_here(self) -> str | None:
        """An SVG of the screen in the working directory; the path (or why it failed) goes to the log and a
        toast. Textual's own palette entry saves to ~/Downloads and says nothing when that folder is missing."""
        try:
            path = self.save_screenshot(path=str(Path.cwd()))
        except OSError as exc:
            self.note("error", f"screenshot not saved: {exc}")
            self.notify(f"screenshot not saved: {exc}", severity="error", timeout=6)
            return None
        self.note("info", f"screenshot saved: {path}")
        self.notify(f"screenshot saved: {path}", timeout=6)
        return path

    def get_system_commands(self, screen: Screen[Any]) -> Iterable[SystemCommand]:
        for command in super().get_system_commands(screen):
            if command.title != "Screenshot":   # ours below saves where the user is, and says where
                yield command
        yield SystemCommand("Screenshot", "Save an SVG of the screen in the working directory",
                            lambda: self.set_timer(0.1, self.action_screenshot_here))
        if self._player() is not None:
            yield SystemCommand("Pause / play the replay", "The replay stops handing records on; step and seek go",
                                self.action_pause)
        else:
            yield SystemCommand("Pause / resume", "Freeze the screen; the engine and the fold go on",
                                self.action_pause)
        yield SystemCommand("Reset window", "Start the rate and hit-rate window afresh", self.action_reset_window)
        yield SystemCommand("Next theme", "Cycle dark, light, high-contrast", self.action_cycle_theme)
        yield SystemCommand("Event log", "Show or hide the event log", self.action_toggle_events)
        yield SystemCommand("Help", "Keys and what each number means", self.action_help)
        yield SystemCommand("Requests view", "Recent and in-flight requests, one row each (R)",
                            self.action_toggle_requests)
        if self.tables.active() is not None:
            yield SystemCommand("Sort table", "Sort the table by its next column (o; O reverses)",
                                self.action_sort_next)
            yield SystemCommand("Filter table", "Show the rows that hold what you type (/)", self.action_filter)
        if len(self._sources()) > 1:
            yield SystemCommand("Next source", "Show the next attached source", self.action_next_source)


def build_app(session: Any, settings: ScreenSettings | None = None, *, run_session: bool = True,
              config_file: str | None = None) -> KvtopApp:
    """The dashboard for ``session`` (a Session, or any object with its read side: kvtop.session.for_dashboard).
    ``settings`` gives ``refresh`` (s), ``theme`` (a name or a .toml path) and ``duration`` (s, stops the
    session); ``run_session=False`` shows a session that is already folded without running its producers;
    ``config_file``: the settings file the screen's theme and layout choices are remembered in (None: not)."""
    return KvtopApp(session, settings, run_session=run_session, config_file=config_file)


__all__ = ["DEFAULT_REFRESH_S", "STALE_AFTER_S", "DashboardScreen", "KvtopApp", "ScreenSettings", "build_app",
           "layout_for", "wall_clock"]
