"""Helpers for the report's chart tests (tests/commands/test_report.py, tests/tiers/test_trtllm13_stats.py): the figures
a plot function draws, kept open to be read, and the check that no two of a figure's texts overlap as drawn."""

from __future__ import annotations

from typing import Any


class CapturedPyplot:
    """Stands in for pyplot to a plot function: everything is pyplot's own, except that ``close(fig)`` keeps the
    figure in ``closed`` (the function closes each figure after saving it) so a test can read what was drawn."""

    def __init__(self, plt: Any) -> None:
        self._plt = plt
        self.closed: list[Any] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self._plt, name)

    def close(self, fig: Any) -> None:
        self.closed.append(fig)


def assert_no_texts_overlap(fig: Any, what: str = "") -> None:
    """Every visible, non-blank text of ``fig`` (titles, tick labels, values over bars, end labels), as drawn: no
    two boxes intersect. The text itself only: an annotation's leader line may cross others (it is thin and points
    at its data)."""
    import matplotlib.text

    renderer = fig.canvas.get_renderer()
    boxes = [(t.get_text(), matplotlib.text.Text.get_window_extent(t, renderer))
             for t in fig.findobj(matplotlib.text.Text) if t.get_visible() and t.get_text().strip()]
    prefix = f"{what}: " if what else ""
    for i, (ta, a) in enumerate(boxes):
        for tb, b in boxes[i + 1:]:
            assert not a.overlaps(b), f"{prefix}{ta!r} overlaps {tb!r}"
