"""The tables' shared part: a row cursor, clicks on rows and headers."""

from __future__ import annotations

from collections.abc import Sequence

from textual import events
from textual.message import Message

from kvtop.ui.panel import (
    S_DIM,
    S_ERR,
    S_OK,
    S_WARN,
    D,
    Panel,
    padded,
)

STATUS_STYLE = {"online": S_OK, "ok": S_OK, "offline": S_WARN, "disconnected": S_ERR, "error": S_ERR,
                "failed": S_ERR}
S_CURSOR = "reverse"   # the cursor's row (j/k, a click), over the row's own colours
ARROW = {True: "▼", False: "▲"}  # the sorted column's header: descending, ascending


class TableRowClicked(Message):
    """A table's row was clicked (``chain`` 2: a double click, which opens it)."""

    def __init__(self, table: str, key: str, chain: int = 1):
        super().__init__()
        self.table = table
        self.key = key
        self.chain = chain


class TableHeaderClicked(Message):
    """A table's column header was clicked: sort by it (again: the other way)."""

    def __init__(self, table: str, column: str):
        super().__init__()
        self.table = table
        self.column = column


class ClickableTable(Panel[D]):
    """A panel whose lines are a table: ``build`` notes where its header's columns and its rows are
    (``_clicks_at``), and a click there posts TableHeaderClicked or TableRowClicked for the app to act on."""

    TABLE = ""

    def __init__(self, *, id: str | None = None, classes: str | None = None):
        super().__init__(id=id, classes=classes)
        self._header_at: int | None = None                   # the header's line in build()'s lines
        self._columns_at: list[tuple[int, int, str]] = []    # (first cell, past-last cell, column) on that line
        self._rows_at: dict[int, str] = {}                   # line -> the row's key
        self._top = 0                                        # the first row in the window (_top_row)

    def _top_row(self, focus: int, shown: int, n: int) -> int:
        """The first row of the window of ``shown`` rows out of ``n``: the last one, moved only as far as it takes
        to keep the ``focus`` row (the cursor) in it, so that a click does not scroll the row clicked away."""
        top = self._top
        if focus < top:
            top = focus
        elif focus >= top + shown:
            top = focus - shown + 1
        self._top = top = min(max(top, 0), max(n - shown, 0))
        return top

    def _clicks_at(self, header: int | None, columns: list[tuple[int, int, str]], rows: dict[int, str]) -> None:
        self._header_at, self._columns_at, self._rows_at = header, columns, rows

    def on_click(self, event: events.Click) -> None:
        offset = event.get_content_offset(self)
        if offset is None:   # the border
            return
        x, y = offset.x - 1, offset.y   # the one-cell margin every line starts with (Panel._build_lines)
        if y == self._header_at:
            column = next((c for x0, x1, c in self._columns_at if x0 <= x < x1), None)
            if column is not None:
                self.post_message(TableHeaderClicked(self.TABLE, column))
        elif (key := self._rows_at.get(y)) is not None:
            chain = getattr(event, "chain", 1)  # may lack: a Click's chain (2: double) is Textual 0.86+
            self.post_message(TableRowClicked(self.TABLE, key, chain))


def header_cells(cols: Sequence[tuple[str, int, str]], sort: str | None, descending: bool, start: int
                  ) -> tuple[list[tuple[str, str]], list[tuple[int, int, str]]]:
    """A table's header parts after its first column (which ends at cell ``start``), each cell's span for
    clicks; the sorted column's separator is its arrow (so the columns keep their widths)."""
    parts: list[tuple[str, str]] = []
    spans: list[tuple[int, int, str]] = []
    x = start
    for h, w, what in cols:
        left = what in ("status", "state", "error")
        sep = " "
        if what == sort:   # the arrow beside the header's words, in its padding where there is room
            if len(h) < w - (what == "status"):
                h = h + ARROW[descending] if left else ARROW[descending] + h
            else:
                sep = ARROW[descending]
        text = h.ljust(w - 1) if what == "status" else h.ljust(w) if left else padded(h, w)
        parts.append((sep + text, "bold $primary" if what == sort else S_DIM))
        spans.append((x, x + 1 + len(text), what))
        x += 1 + len(text)
    return parts, spans
