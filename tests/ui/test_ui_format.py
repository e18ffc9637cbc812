"""The screen's number formatting: unknown stays unknown, widths stay fixed, sparklines scale honestly."""

from __future__ import annotations

import pytest

from kvtop.ui import format as fmt


def test_unknown_is_never_zero() -> None:
    for f in (fmt.count, fmt.nbytes, fmt.gib, fmt.pct, fmt.rate, fmt.seconds_ms, fmt.duration):
        assert f(None) == "?"
        assert f(None, "unknown") == "unknown"


@pytest.mark.parametrize("n, text", [(0, "0"), (987, "987"), (9876, "9,876"), (98_765, "98.8k"),
                                     (987_654, "988k"), (9_876_543, "9.88M"), (98_765_432, "98.8M")])
def test_count(n: int, text: str) -> None:
    assert fmt.count(n) == text
    assert len(fmt.count(n)) <= 6


@pytest.mark.parametrize("n, text", [(512, "512 B"), (4_718_592, "4.50 MiB"), (1 << 30, "1.00 GiB"),
                                     (150_754_820_096, "140 GiB"), (4 << 40, "4.00 TiB")])
def test_nbytes(n: int, text: str) -> None:
    assert fmt.nbytes(n) == text


@pytest.mark.parametrize("v, text", [(0.0, "0"), (0.004, "0"), (1.874, "1.87"), (78.25, "78.2"), (912.9, "913"),
                                     (6898.0, "6.90k"), (41_234.0, "41.2k")])
def test_rate(v: float, text: str) -> None:
    assert fmt.rate(v) == text
    assert len(fmt.rate(v)) <= 6


def test_percent_latency_duration() -> None:
    assert fmt.pct(0.4831) == "48.3%"
    assert fmt.pct(float("nan")) == "?"
    assert fmt.seconds_ms(0.0087) == "8.7 ms"
    assert fmt.seconds_ms(0.2936) == "294 ms"
    assert fmt.seconds_ms(1.234) == "1.23 s"
    assert fmt.duration(83) == "0:01:23"
    assert fmt.duration(27 * 3600 + 247) == "27:04:07"


def test_sparkline_scale_gaps_and_padding() -> None:
    assert fmt.sparkline([0.0, 0.5, 1.0], 3, top=1.0) == "▁▅█"
    assert fmt.sparkline([0.2, 0.2], 2, top=1.0) == "▂▂"          # a fixed top: 20% looks like 20%
    assert fmt.sparkline([1.0, None, 2.0], 5) == "  ▅ █"          # padded left, a gap is a space
    assert fmt.sparkline([0.0, 0.0], 2) == "▁▁"                   # nothing moved: a flat floor
    assert fmt.sparkline(list(range(100)), 10) == fmt.sparkline(list(range(90, 100)), 10)  # newest only
    assert fmt.sparkline([1.0], 0) == ""


def test_cells() -> None:
    assert fmt.cells(1, 1000, 50) == 1          # anything at all shows at least one cell
    assert fmt.cells(0, 1000, 50) == 0
    assert fmt.cells(500, 1000, 50) == 25
    assert fmt.cells(2000, 1000, 50) == 50      # clamped
    assert fmt.cells(None, 1000, 50) == 0
    assert fmt.cells(5, 0, 50) == 0


def test_sparkrows_resolves_eighths_of_each_row() -> None:
    from kvtop.ui.format import sparkline, sparkrows

    # two rows: 16 eighths a column; 0 is the floor (one eighth), 0.5 fills the bottom row and one eighth above
    assert sparkrows([0.0, 0.5, 1.0, None], 5, 2, top=1.0) == ["  ▁█ ", " ▁██ "]
    # one row is the sparkline itself
    assert sparkrows([0.0, 0.5, 1.0], 3, 1, top=1.0) == [sparkline([0.0, 0.5, 1.0], 3, top=1.0)]
    # 0.3 of three rows: 8 of 24 eighths (0.3 of the 23 steps above the floor, rounded, and the floor): the bottom
    # row full, nothing above; 0.4 reaches the middle row
    assert [row[-1] for row in sparkrows([0.3], 1, 3, top=1.0)] == [" ", " ", "█"]
    assert [row[-1] for row in sparkrows([0.4], 1, 3, top=1.0)] == [" ", "▂", "█"]
