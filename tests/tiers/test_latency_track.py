"""The request fold's latency percentiles (kvtop/tiers/requests.py ``_LatencyTrack``) against the plain way of
reading them: sort every sample for the run's p50/p99 while they all fit, scan every sample for the window's.

The track keeps its samples sorted as they come and reads a window from the newest back (the dashboard reads
four of them at every refresh); these tests hold it to the plain answers, value for value, for samples in time
order and out of it (several sources' clocks), across the deque's size, and at windows that take none, some or
all of the samples."""

from __future__ import annotations

import math
import random

import pytest

from kvtop.tiers.requests import _LatencyTrack
from kvtop.tiers.state import Latency


def _plain_rank(values: list[float], p: float) -> float:
    return values[max(1, math.ceil(p / 100.0 * len(values))) - 1]


def _plain_window(samples: list[tuple[float, float]], maxlen: int, since: float) -> Latency:
    values = sorted(v for t, v in samples[-maxlen:] if t >= since)
    if not values:
        return Latency()
    return Latency(_plain_rank(values, 50), _plain_rank(values, 99), len(values))


def _plain_run(samples: list[tuple[float, float]], maxlen: int) -> Latency | None:
    """The run's percentiles while every sample fits (None past that: the histogram's, tested below)."""
    if not samples:
        return Latency()
    if len(samples) > maxlen:
        return None
    values = sorted(v for _, v in samples)
    return Latency(_plain_rank(values, 50), _plain_rank(values, 99), len(samples))


@pytest.mark.parametrize("in_order", [True, False])
@pytest.mark.parametrize("seed", range(6))
def test_percentiles_and_windows_are_the_plain_ones(seed: int, in_order: bool) -> None:
    rng = random.Random(seed)
    maxlen = rng.choice([1, 7, 64, 300])
    track = _LatencyTrack(maxlen)
    samples: list[tuple[float, float]] = []
    t = 1000.0
    for i in range(rng.randint(maxlen // 2, 3 * maxlen + 5)):
        t += rng.choice([0.0, 0.001, 0.05, 0.4])          # equal times too: a burst finishing together
        when = t if in_order else t - rng.uniform(0, 5)    # another source's clock a few seconds behind
        value = rng.choice([0.0, rng.lognormvariate(-2, 1), rng.uniform(0.01, 3.0)])
        track.add(when, value)
        samples.append((when, value))
        if i % 5 == 0:
            plain = _plain_run(samples, maxlen)
            if plain is not None:
                assert track.percentiles() == plain, (i, maxlen)
            for since in (t - 10.0, t - 1.0, t - 0.05, t, t + 1.0, -math.inf):
                assert track.window(since) == _plain_window(samples, maxlen, since), (i, since)


def test_past_the_deque_the_run_percentiles_are_the_histograms_within_half_a_percent() -> None:
    track = _LatencyTrack(50)
    values = [0.010 * (1.0 + (i % 97) / 10.0) for i in range(400)]
    for i, v in enumerate(values):
        track.add(float(i), v)
    got = track.percentiles()
    ordered = sorted(values)
    assert got.count == 400
    assert got.p50_s == pytest.approx(_plain_rank(ordered, 50), rel=0.005)
    assert got.p99_s == pytest.approx(_plain_rank(ordered, 99), rel=0.005)
    # the window still reads the newest 50 exactly
    assert track.window(390.0) == Latency(_plain_rank(sorted(values[390:]), 50),
                                          _plain_rank(sorted(values[390:]), 99), 10)


def test_one_sample_out_of_order_still_gives_the_window_of_every_sample_in_it() -> None:
    track = _LatencyTrack(16)
    for t, v in [(10.0, 1.0), (11.0, 2.0), (5.0, 9.0), (12.0, 3.0)]:
        track.add(t, v)
    # t=5 arrived after t=11: a read from the newest back must not stop there and drop it from a window it is in
    assert track.window(10.5) == Latency(2.0, 3.0, 2)
    assert track.window(4.0) == Latency(2.0, 9.0, 4)


@pytest.mark.parametrize("seed", range(8))
def test_windows_read_as_a_dashboard_reads_them_are_the_plain_ones(seed: int) -> None:
    # The dashboard reads a track's window once a refresh, its start moving forward (the kept window then only
    # drops what left it and adds what came), now and then back (a window reset: rebuilt); samples in time order
    # with equal times, across the deque's size, windows that take none, some or all, starts in the future.
    rng = random.Random(100 + seed)
    maxlen = rng.choice([1, 2, 7, 64, 300])
    track = _LatencyTrack(maxlen)
    samples: list[tuple[float, float]] = []
    t = since = 1000.0
    reads = 0
    for i in range(rng.randint(maxlen, 4 * maxlen + 20)):
        t += rng.choice([0.0, 0.0, 0.01, 0.3, 2.0])
        value = rng.choice([0.0, 1.0, rng.lognormvariate(-2, 1), rng.uniform(0.01, 3.0)])
        track.add(t, value)
        samples.append((t, value))
        if rng.random() < 0.5:
            step = rng.random()
            since = (since - rng.uniform(0, 30) if step < 0.1 else t + 0.5 if step < 0.15
                     else max(since, t - rng.choice([0.0, 0.5, 3.0, 20.0])))
            assert track.window(since) == _plain_window(samples, maxlen, since), (i, since, maxlen)
            reads += 1
    assert reads > 0
