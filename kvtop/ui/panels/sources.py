"""The sources table: every attached source side by side, and the fleet's aggregate."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from typing import Any, ClassVar

from kvtop.fleet import FleetRow
from kvtop.ui import format as fmt
from kvtop.ui.panel import (
    BLANK,
    S_DIM,
    S_FIG,
    S_WARN,
    Line,
    fit,
    fit_lines,
    line_of,
    padded,
    styled,
)
from kvtop.ui.panels.clickable import (
    ARROW,
    S_CURSOR,
    STATUS_STYLE,
    ClickableTable,
    header_cells,
)
from kvtop.values import frozen


@frozen
class FleetData:
    rows: tuple[FleetRow, ...]      # per source shown (filtered, sorted: kvtop/ui/table.py)
    total: FleetRow                 # the aggregate ("all"), over every source
    selected: int                   # the row the big panels show (-1: the filter hides it)
    cursor: int = -1                # the cursor's row (j/k, a click; Enter opens it), -1: none
    sort: str | None = None         # the column sorted by (SourcesPanel.COLUMNS' names, "key"), None: arrival
    descending: bool = True
    filter: str = ""                # the filter's text ("/"), "" for none
    of: int = 0                     # sources in all, before the filter (0: as many as rows)



class SourcesPanel(ClickableTable[FleetData]):
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
    SORT_VALUES: ClassVar[dict[str, Callable[[FleetRow], Any]]] = {
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
    def row_text(row: FleetRow) -> str:
        """What the filter looks in: the source's key and its status."""
        return f"{row.key} {row.status or ''}"

    def on_mount(self) -> None:
        super().on_mount()
        self.border_title = "Sources"
        self.border_subtitle = self.SUBTITLE

    def show(self, data: FleetData) -> bool:
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
    def _cell(row: FleetRow, what: str) -> tuple[str, str]:
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

    def _row(self, row: FleetRow, cols: list[tuple[str, int, str]], key_w: int, mark: str, key_style: str,
             status: tuple[str, str] | None = None, cursor: bool = False) -> Line:
        label = row.label  # the source's name (kvtop agent --run), else its key
        key = label if len(label) <= key_w else "…" + label[-(key_w - 1):]
        parts: list[Any] = [(mark, "bold $primary"), (key.ljust(key_w), key_style)]
        for _, w, what in cols:
            text, style = status if what == "status" and status is not None else self._cell(row, what)
            if what == "status":
                parts += [" ", (text.ljust(w - 1), style)]
            else:
                parts += [" ", (padded(text, w), style)]
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
            return fit(line_of((f"{n} sources ", "bold"), ("all hit ", S_DIM), (fmt.pct(t.hit_window, digits=0),
                                 S_FIG), ("/", S_DIM), (fmt.pct(t.hit_cumulative, digits=0), S_FIG),
                                 (" req/s ", S_DIM), (fmt.rate(t.requests_per_s), S_FIG),
                                 *([("  ▶", "bold $primary"), (sel.label, "bold")] if sel else [])), width)
        key_w = min(max([self.KEY_MIN, *(len(r.label) for r in d.rows)]), self.KEY_MAX)
        cols = self._columns(width, key_w, show_status=any(r.status for r in d.rows),
                             show_disk=any(r.has_disk for r in d.rows))
        head, spans = header_cells(cols, d.sort, d.descending, 2 + key_w)
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
        return fit_lines(lines, width, height)
