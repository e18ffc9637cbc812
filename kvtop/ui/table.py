"""What a table on the dashboard is showing: its sort column and direction, its filter, and its cursor row.

Pure (no Textual): the sources table (kvtop.fleet.FleetRow per source) and the requests view
(kvtop.tiers.state.RequestRow per request) both keep one ``TableState`` in the app, which arranges the rows it is
handed (``arrange``) before a panel draws them, so the rules are the same in both and are tested with numbers.

- Sorting: a column's values, unknown (None) last whichever way it runs, so "highest hit rate first" never starts
  with the sources that have no hit rate yet. Equal values keep the rows' own order (the session's, a stable sort).
- A column's first direction is the one an operator wants first: figures highest first (the busiest source, the
  slowest request), names A to Z. Sorting by the column already sorted reverses it.
- Filtering: a case-insensitive substring of the row's text (a source's key and status; a request's id, state
  and error).
- The cursor is a row's key, not its position, so it stays on its row as the figures move the rows; a row the
  filter hides gives the cursor to the first row shown. A table sorted afresh has no cursor row: the cursor is on
  its first row, whichever that is as the figures change (sorted before every source had a hit rate, the top row
  was a source with none, and the cursor kept it as it sank).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from kvtop.values import mutable

R = TypeVar("R")


@mutable
class TableState:
    """One table's sort, filter and cursor (see the module docstring)."""

    sort: str | None = None       # the column sorted by (a panel's column name), None: the rows' own order
    descending: bool = True
    filter: str = ""
    cursor: str | None = None     # the key of the row the cursor is on, None: the first row

    def sort_by(self, column: str, text_columns: Sequence[str] = ()) -> None:
        """Sort by ``column``: in its first direction, or the other way when it is already the sort column."""
        if column == self.sort:
            self.descending = not self.descending
        else:
            self.sort, self.descending = column, column not in text_columns

    def sort_next(self, order: Sequence[str], text_columns: Sequence[str] = ()) -> None:
        """The next column of ``order`` (after the last: the rows' own order again), in its first direction."""
        if self.sort in order:
            i = order.index(self.sort) + 1
            self.sort = order[i] if i < len(order) else None
        else:
            self.sort = order[0] if order else None
        self.descending = self.sort not in text_columns

    def reverse(self) -> None:
        self.descending = not self.descending

    def to_text(self) -> str:
        """The sort as the settings file keeps it: ``-hit_window`` (descending), ``key`` (ascending), "" (none)."""
        if self.sort is None:
            return ""
        return ("-" if self.descending else "") + self.sort

    def from_text(self, text: str, columns: Sequence[str]) -> bool:
        """The sort from ``to_text``'s form; False (and nothing changed) for a column this table does not have."""
        name = text.removeprefix("-")
        if not text:
            self.sort = None
            return True
        if name not in columns:
            return False
        self.sort, self.descending = name, text.startswith("-")
        return True


def arrange(rows: Sequence[R], state: TableState, values: Mapping[str, Callable[[R], Any]],
            text: Callable[[R], str]) -> list[R]:
    """The rows as the table shows them: those whose ``text`` holds the filter, sorted by ``values[state.sort]``
    (unknown values last, equal ones in their own order)."""
    needle = state.filter.strip().lower()
    shown = [r for r in rows if needle in text(r).lower()] if needle else list(rows)
    value = values.get(state.sort) if state.sort is not None else None
    if value is None:
        return shown
    known: list[tuple[Any, R]] = []
    unknown: list[R] = []
    for r in shown:
        v = value(r)
        if v is None:
            unknown.append(r)
        else:
            known.append((v, r))
    # sorted on the value alone: equal values keep the rows' own order (reverse=True keeps it too)
    known.sort(key=lambda pair: pair[0], reverse=state.descending)
    return [r for _, r in known] + unknown


def cursor_index(keys: Sequence[str], state: TableState, fallback: str | None = None) -> int:
    """Where the cursor is among the rows shown (their ``keys``): no cursor (a table just sorted) is the first row,
    whatever row that is now; its own row; else, where the filter hides it, ``fallback``'s (the source the
    dashboard shows), else the first row; -1 when no row is shown."""
    if not keys:
        return -1
    if state.cursor is None:
        return 0
    for key in (state.cursor, fallback):
        if key is not None:
            try:
                return list(keys).index(key)
            except ValueError:
                pass
    return 0


__all__ = ["TableState", "arrange", "cursor_index"]
