"""The rate window (kvtop/tiers/window.py): which counter samples are kept, and which one a rate is taken from."""

from __future__ import annotations

from kvtop.tiers.window import RateWindow


def test_samples_come_one_per_step_and_rates_start_at_the_window_edge() -> None:
    w = RateWindow(window_s=10.0, history_step_s=1.0, history_len=5)
    calls = []

    def counters() -> tuple[int, ...]:
        calls.append(1)
        return (len(calls),)

    for i in range(1, 401):  # time moves 0.05 s at a time, for 20 s
        w.advance((i - 1) * 0.05, i * 0.05, counters)
    # fine: at least one per 0.1 s (window / 100), stamped with the instant before the one that moved time on,
    # so between 200 (one per two 0.05-s steps) and 400 over 20 s; coarse: one per second, the last 6 kept
    assert 200 <= len(w.fine) < 400 and len(w.coarse) == 6
    assert [round(t) for t, _ in w.coarse] == [14, 15, 16, 17, 18, 19]
    assert len(calls) <= len(w.fine) + 20  # counters are read only for a sample (a coarse one reuses the fine one)
    base = w.base(20.0)
    assert base is not None and 9.9 <= base[0] <= 10.0  # the newest sample at or before now - 10 s
    assert w.base(None) is None
    hist = w.history(20.0, lambda: (999,))
    assert hist[-1] == (20.0, (999,)) and len(hist) == 7  # now's counters appended: time moved past the last


def test_reset_keeps_the_history_and_restart_drops_both() -> None:
    w = RateWindow(window_s=10.0, history_step_s=1.0, history_len=5)
    for i in range(1, 50):
        w.advance(i - 1.0, float(i), lambda: (1, 2))
    w.reset(49.0, (5, 5))
    assert list(w.fine) == [(49.0, (5, 5))] and len(w.coarse) == 6
    w.restart(50.0, (7, 7))
    assert list(w.fine) == [(50.0, (7, 7))] and list(w.coarse) == [(50.0, (7, 7))]
    assert w.base(55.0) == (50.0, (7, 7))  # the only sample: the oldest
