"""The requests view: one row per request, in flight then finished."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar

from kvtop.tiers.state import RequestRow
from kvtop.ui import format as fmt
from kvtop.ui.panel import (
    BLANK,
    S_DIM,
    S_DISK,
    S_ERR,
    S_FIG,
    S_GPU,
    S_HOST,
    S_OK,
    Line,
    fit_lines,
    line_of,
    padded,
    styled,
)
from kvtop.ui.panels.clickable import (
    ARROW,
    S_CURSOR,
    ClickableTable,
    header_cells,
)
from kvtop.values import frozen


@frozen
class RequestsData:
    rows: tuple[RequestRow, ...]    # in flight, then finished newest first (arranged)
    cursor: int = -1
    sort: str | None = None
    descending: bool = True
    filter: str = ""
    of: int = 0                     # rows before the filter
    source: str = ""                # whose requests (the source the big panels show)
    note: str = ""                  # why no row is in flight where the engine says some are


class RequestsTable(ClickableTable[RequestsData]):
    """The requests view (R): recent and in-flight requests, one row each, sorted and filtered as the sources table
    is. Finished ones from the ``request`` records (the last RECENT_REQUESTS), in flight from the workload driver
    of a driven run, else from the engine's ``requestStats`` where it sends them (enable_iter_req_stats)."""

    TABLE = "requests"
    KEY_W = 10
    COLUMNS: ClassVar[tuple[tuple[str, int, str], ...]] = (
        ("state", 8, "state"), ("prompt", 7, "prompt"), ("reused", 7, "reused"), ("GPU", 6, "gpu"),
        ("host", 6, "host"), ("disk", 6, "disk"), ("TTFT", 9, "ttft"), ("e2e", 9, "e2e"), ("prio", 5, "priority"),
        ("error", 6, "error"))
    DROP = ("disk", "priority", "reused", "e2e", "host", "prompt", "gpu", "error")
    SORT_VALUES: ClassVar[dict[str, Callable[[RequestRow], Any]]] = {
        "key": lambda r: (0, int(r.key), "") if r.key.isdigit() else (1, 0, r.key), "state": lambda r: r.state,
        "prompt": lambda r: r.prompt_tokens, "reused": lambda r: r.reused_blocks, "gpu": lambda r: r.gpu_blocks,
        "host": lambda r: r.host_blocks, "disk": lambda r: r.disk_blocks, "ttft": lambda r: r.ttft_s,
        "e2e": lambda r: r.e2e_s, "priority": lambda r: r.priority, "error": lambda r: r.error}
    SORT_ORDER = ("ttft", "e2e", "reused", "host", "gpu", "disk", "prompt", "priority", "state", "error", "key")
    TEXT_COLUMNS = ("key", "state", "error")
    NAMES: ClassVar[dict[str, str]] = {"key": "request", **{what: h for h, _, what in COLUMNS}}

    @staticmethod
    def row_text(row: RequestRow) -> str:
        """What the filter looks in: the request's id, its state and its error."""
        return f"{row.key} {row.state} {row.error or ''}"

    def on_mount(self) -> None:
        super().on_mount()
        self.border_title = "Requests"
        self.border_subtitle = "R: back · o/O sort · / filter · j/k move · Enter: details"

    def show(self, data: RequestsData) -> bool:
        changed = super().show(data)
        if changed:
            title = f"Requests{' of ' + data.source if data.source else ''} · {fmt.count(data.of)}"
            if data.filter:
                title += f" · {fmt.count(len(data.rows))} match /{fmt.clean(data.filter, 30)}"
            if data.sort is not None:
                title += f" · by {self.NAMES.get(data.sort, data.sort)} {ARROW[data.descending]}"
            if self.border_title != title:
                self.border_title = title
            self._set_state("warn" if any(r.state == "failed" for r in data.rows) else "ok")
        return changed

    @staticmethod
    def _cell(row: RequestRow, what: str) -> tuple[str, str]:
        if what == "state":
            style = S_ERR if row.state == "failed" else S_DIM if row.state == "done" else S_OK
            return (row.state, style)
        if what in ("ttft", "e2e"):
            return (fmt.seconds_ms(getattr(row, f"{what}_s"), unknown="" if row.t is None else "?"), S_FIG)
        if what == "priority":
            return ("" if row.priority is None else str(row.priority), S_FIG)
        if what == "error":
            return (fmt.clean(row.error or "", 200), S_ERR)
        value = {"prompt": row.prompt_tokens, "reused": row.reused_blocks, "gpu": row.gpu_blocks,
                 "host": row.host_blocks, "disk": row.disk_blocks}[what]
        return (fmt.count(value), {"gpu": S_GPU, "host": S_HOST, "disk": S_DISK}.get(what, S_FIG))

    def build(self) -> Line | list[Line]:
        d: RequestsData | None = self.data
        width, height = self.inner
        if d is None or height <= 0:
            return BLANK
        key_w = self.KEY_W
        cols = list(self.COLUMNS)
        drop = list(self.DROP)
        while 2 + key_w + sum(w + 1 for _, w, _ in cols) > width and drop:
            what = drop.pop(0)
            cols = [c for c in cols if c[2] != what]
        head, spans = header_cells(cols, d.sort, d.descending, 2 + key_w)
        key_head = (ARROW[d.descending] if d.sort == "key" else " ") + " " + "request".ljust(key_w)
        lines: list[Line] = [line_of((key_head, "bold $primary" if d.sort == "key" else S_DIM), *head)]
        n = len(d.rows)
        room = max(height - 1, 0)
        start, stop = 0, n
        more = ""
        if n > room:
            shown = room - 1 if room > 1 else room
            start = self._top_row(d.cursor if d.cursor >= 0 else 0, shown, n)
            stop = start + shown
            more = f"… {n - shown:,} more requests (j/k: move)" if shown < room else ""
        rows_at: dict[int, str] = {}
        for i in range(start, stop):
            row = d.rows[i]
            key = row.key if len(row.key) <= key_w else "…" + row.key[-(key_w - 1):]
            parts: list[tuple[str, str]] = [("  ", ""), (key.ljust(key_w), "bold")]
            for _, w, what in cols:
                text, style = self._cell(row, what)
                parts += [(" ", ""), (text.ljust(w) if what in ("state", "error") else padded(text, w), style)]
            if i == d.cursor:
                parts = [(t, f"{st} {S_CURSOR}" if st else S_CURSOR) for t, st in parts]
            rows_at[len(lines)] = row.key
            lines.append(line_of(*parts))
        if not n:
            why = (f"no request matches /{fmt.clean(d.filter, 40)} (/ then Esc: clear)" if d.filter
                   else "no requests yet: finished ones come from request records (a driven run, a recording)")
            lines.append(styled("  " + why, S_DIM))
        if d.note and (not n or not d.filter):
            lines.append(styled("  " + d.note, S_DIM))
        if more:
            lines = lines[: height - 1] + [styled("  " + more, S_DIM)]
        self._clicks_at(0, [(0, 2 + key_w, "key"), *spans], rows_at)
        return fit_lines(lines, width, height)
