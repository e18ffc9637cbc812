"""The dashboard's two tables as the keys see them: the sources table (shown with 2+ sources, or at 200x60) and the
requests view (R, in the panels' place).

``Tables`` says which one the table keys act on, keeps its sort, filter and cursor (kvtop/ui/table.py's
TableState, in the FleetView and RequestsView of kvtop/ui/state.py), reads the sources' rows (at most every
``FleetView.refresh_s``, kvtop/ui/views.py fleet_row) and makes the data each table's panel is shown (rows filtered
and sorted, the cursor located). It touches no widget: KvtopApp (kvtop/ui/app.py) keeps the bindings, posts the
messages, and shows what this makes.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from kvtop.fleet import source_status
from kvtop.session import SessionView
from kvtop.tiers import TierModel, TierSnapshot
from kvtop.tiers.state import RequestRow
from kvtop.ui import format as fmt
from kvtop.ui.panels.requests_table import RequestsData, RequestsTable
from kvtop.ui.panels.sources import FleetData, SourcesPanel
from kvtop.ui.state import FleetView, RequestsView
from kvtop.ui.table import TableState, arrange, cursor_index
from kvtop.ui.views import fleet_data, fleet_row


class Tables:
    """The sources table (``fleet``) and the requests view (``req_view``): sort (o, O, a click on a header),
    filter (/), cursor (j, k, a click), open (Enter), and what each shows."""

    __slots__ = ("fleet", "req_view")

    def __init__(self, fleet: FleetView, req_view: RequestsView):
        self.fleet = fleet
        self.req_view = req_view

    def active(self) -> str | None:
        """The table the table keys act on: the requests view while it is shown, else the sources table while it
        is shown, else None."""
        if self.req_view.shown:
            return "requests"
        return "sources" if self.fleet.shown and self.fleet.rows_all else None

    def spec(self, table: str) -> tuple[TableState, type[SourcesPanel] | type[RequestsTable], list[Any]]:
        """A table's state, its panel's class (columns, sort values, filter text) and its rows as shown."""
        if table == "requests":
            return self.req_view.table, RequestsTable, self.req_view.arranged
        return self.fleet.table, SourcesPanel, self.fleet.arranged

    def own_row(self, table: str) -> str | None:
        """The row the cursor falls back to: the source the big panels show (the requests view: none)."""
        if table == "sources" and self.fleet.rows_all:
            return self.fleet.rows_all[self.fleet.selected % len(self.fleet.rows_all)].key
        return None

    # -- what a key does to a table's state

    def sort_next(self, table: str) -> TableState:
        """o: sorted by the next column."""
        state, panel, _ = self.spec(table)
        state.sort_next(panel.SORT_ORDER, panel.TEXT_COLUMNS)
        return state

    def sort_reverse(self, table: str) -> TableState:
        """O: the sort reversed (sorted by the first column if it was not sorted)."""
        state, panel, _ = self.spec(table)
        if state.sort is None:
            state.sort_next(panel.SORT_ORDER, panel.TEXT_COLUMNS)
        state.reverse()
        return state

    def sort_by(self, table: str, column: str) -> TableState:
        """A click on a column's header."""
        state, panel, _ = self.spec(table)
        state.sort_by(column, panel.TEXT_COLUMNS)
        return state

    def move_cursor(self, table: str, step: int) -> bool:
        """j, k: the cursor ``step`` rows down (up), within the rows shown; False with no row."""
        state, _, rows = self.spec(table)
        if not rows:
            return False
        keys = [r.key for r in rows]
        at = cursor_index(keys, state, self.own_row(table))
        state.cursor = keys[min(max(at + step, 0), len(keys) - 1)]
        return True

    def cursor_key(self, table: str) -> str | None:
        """The key of the row under the cursor (Enter opens it), None with no row."""
        state, _, rows = self.spec(table)
        if not rows:
            return None
        return str(rows[cursor_index([r.key for r in rows], state, self.own_row(table))].key)

    def set_filter(self, text: str) -> str | None:
        """The shown table filtered by ``text``: the table, if that changed its filter (else None)."""
        table = self.active()
        if table is None:
            return None
        state = self.spec(table)[0]
        if state.filter == text:
            return None
        state.filter = text
        return table

    def request_said(self, key: str) -> tuple[str, bool] | None:
        """Enter on a request: its whole row as a sentence, and whether it failed; None if it is not shown."""
        row = next((r for r in self.req_view.arranged if r.key == key), None)
        if row is None:
            return None
        said = (f"request {fmt.clean(row.key, 64)}: {row.state}, prompt {fmt.count(row.prompt_tokens)} tokens, "
                f"reused {fmt.count(row.reused_blocks)} blocks (GPU {fmt.count(row.gpu_blocks)}, host "
                f"{fmt.count(row.host_blocks)}, disk {fmt.count(row.disk_blocks)}), TTFT {fmt.seconds_ms(row.ttft_s)}"
                f", e2e {fmt.seconds_ms(row.e2e_s)}, priority {fmt.count(row.priority)}")
        if row.error:
            said += f"; error: {fmt.clean(row.error, 600)}"
        return said, row.state == "failed"

    # -- the sources table

    def read_fleet(self, sources: Sequence[tuple[str, TierModel]], status: Mapping[str, str], index: int,
                   t: float) -> bool:
        """The sources' rows (``sources`` with data, the one the big panels show at ``index``), read whole at most
        every ``refresh_s`` of ``t`` (time.monotonic()) unless the source set, the selection or a status changed;
        True when the table is to be shown again."""
        fleet = self.fleet
        selected = index % len(sources)
        statuses = tuple(source_status(k, status) for k, _ in sources)
        key = (tuple(k for k, _ in sources), selected, statuses)
        cache = fleet.rows
        if key == fleet.key and t - fleet.read_at < fleet.refresh_s:
            # Between full reads only the selected row follows its model, at the refresh rate, so that it agrees
            # with the big panels that show the same source.
            k, model = sources[selected]
            if fleet_row(cache, k, model, statuses[selected]) is not fleet.rows_all[selected]:
                fleet.rows_all = [cache[k][2] for k, _ in sources]
                return True
            return False
        fleet.key, fleet.read_at = key, t
        fleet.rows_all = [fleet_row(cache, k, model, st) for (k, model), st in zip(sources, statuses)]
        fleet.selected = selected
        return True

    def fleet_data(self, top: bool = False) -> FleetData | None:
        """The sources table from the rows last read: filtered and sorted as the table is (kvtop/ui/table.py),
        the source the big panels show and the cursor located in it (``top``: sorted afresh, the cursor to the
        top); None before any row was read."""
        rows = self.fleet.rows_all
        if not rows:
            return None
        state = self.fleet.table
        shown = self.fleet.arranged = arrange(rows, state, SourcesPanel.SORT_VALUES, SourcesPanel.row_text)
        keys = [r.key for r in shown]
        own = rows[self.fleet.selected % len(rows)].key
        if top:   # sorted afresh: the top of the table is what is wanted (the highest hit rate...), as it changes
            state.cursor = None
        cursor = cursor_index(keys, state, own)
        selected = next((i for i, r in enumerate(shown) if r.key == own), -1)
        return fleet_data(shown, rows, selected, cursor, state)

    # -- the requests view

    def requests_data(self, snap: TierSnapshot, view: SessionView | None, key: str, top: bool = False
                      ) -> RequestsData:
        """The requests view from ``snap``: the engine's in flight (or the workload driver's, ``view``'s), then the
        finished newest first, filtered and sorted (kvtop/ui/table.py); ``key``: the source's name."""
        req = snap.requests
        running, recent = req.running, req.recent
        flight = view.requests_in_flight if view is not None else {}
        if flight:   # the workload driver's own requests in flight (their ids are those their records will have)
            running = tuple(RequestRow(str(k), "running", None, prompt, None, None, None, None, None, None, None,
                                       prio, None) for k, (_t, prompt, prio) in sorted(flight.items()))
        rv = self.req_view
        if running != rv.seen[0] or recent is not rv.seen[1]:
            rv.seen = (running, recent)
            rv.rows_all = [*running, *reversed(recent)]
        rows = rv.rows_all
        state = rv.table
        shown = rv.arranged = arrange(rows, state, RequestsTable.SORT_VALUES, RequestsTable.row_text)
        if top:
            state.cursor = None
        in_flight = view.in_flight if view is not None and view.in_flight is not None else req.in_flight
        note = ""
        if not running and in_flight:
            note = (f"{fmt.count(in_flight)} in flight, not listed: the engine sends no per-request stats "
                    "(TensorRT-LLM: enable_iter_req_stats)")
        return RequestsData(tuple(shown), cursor_index([r.key for r in shown], state), state.sort, state.descending,
                            state.filter, len(rows), fmt.clean(key, 40), note)


__all__ = ["Tables"]
