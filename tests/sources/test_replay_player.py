"""The replay player (kvtop/sources/replay.py ReplayPlayer) without a screen: a seek back folds again from the
start and lands on the figures of a straight fold; the sinks (a recorder, a publisher) see every record once, and a
bad line is reported once, however often the fold is rebuilt; and a headless ``kvtop replay`` is a summary: as
fast as it can (the bar of issue 24: a 20 s recorded run, the same hits as the live run)."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from pathlib import Path

import pytest
from recordings import BUSY_RECORDING, REPO

from kvtop.compose import build_attach_session
from kvtop.records import Record, read_jsonl
from kvtop.sources.replay import ReplayPlayer, recording_end
from kvtop.tiers import TierModel

RECORDS: list[Record] = [r for r in read_jsonl(BUSY_RECORDING) if isinstance(r, Record)]
T0 = RECORDS[0].time


def hits(model: TierModel) -> tuple[int, int, int]:
    hr = model.snapshot().hit_rate
    return hr.hits, hr.lookups, model.records_applied


async def settle(player: ReplayPlayer) -> None:
    for _ in range(2000):
        await asyncio.sleep(0.005)
        if player._target is None and not player.seeking:
            return
    raise AssertionError("the seek never finished")


def test_the_recording_end_is_read_off_its_tail() -> None:
    assert recording_end(BUSY_RECORDING) == RECORDS[-1].time
    assert recording_end(REPO / "pyproject.toml") is None


async def test_seek_back_refolds_to_a_straight_fold_and_sinks_see_each_record_once() -> None:
    session = build_attach_session(str(BUSY_RECORDING), command="replay", speed=0.0, hold_at_end=True)
    sunk: list[Record] = []
    session.add_sink(sunk.append)
    player: ReplayPlayer = session.player
    task = asyncio.ensure_future(session.run())
    try:
        for _ in range(2000):
            await asyncio.sleep(0.005)
            if player.at_end:
                break
        assert player.at_end and len(sunk) == 3324
        whole = hits(session.model)
        player.toggle_pause()
        player.seek_to(2.0)
        await settle(player)
        first_two = [r for r in RECORDS if r.time - T0 <= 2.0]
        straight = TierModel()
        straight.apply_records(first_two)
        assert (player.generation, player.position_s, session.records) == (1, 2.0, len(first_two))
        assert hits(session.model) == hits(straight) and hits(straight)[0] < whole[0]
        player.seek_to(99.0)   # clamped to the end: 8.0 s
        await settle(player)
        assert player.at_end and player.position_s == pytest.approx(8.0, abs=1e-3)
        assert hits(session.model) == whole
        # the sinks had every record once, in file order, not again on the re-fold
        assert len(sunk) == 3324 and [r.time for r in sunk] == [r.time for r in RECORDS]
    finally:
        session.stop()
        await task


async def test_a_bad_line_is_reported_once_over_every_refold(tmp_path: Path) -> None:
    lines = BUSY_RECORDING.read_text().splitlines()[:600]
    lines.insert(300, '{"v": 1, "kind": "stats", "trunc')
    rec = tmp_path / "bad.jsonl"
    rec.write_text("\n".join(lines) + "\n")
    session = build_attach_session(str(rec), command="replay", speed=0.0, hold_at_end=True)
    player: ReplayPlayer = session.player
    task = asyncio.ensure_future(session.run())
    try:
        for _ in range(2000):
            await asyncio.sleep(0.005)
            if player.at_end:
                break
        player.toggle_pause()
        for target in (0.0, 99.0, 0.5, 99.0):
            player.seek_to(target)
            await settle(player)
        assert player.generation == 2 and session.records == 600
        bad = [p for p in session.problems.snapshot() if p.kind == "replay.bad_line"]
        assert len(bad) == 1 and bad[0].count == 1 and "line 301" in bad[0].message
    finally:
        session.stop()
        await task


def _kvtop(args: list[str], cwd: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kvtop", *args], cwd=cwd, capture_output=True, text=True,
                          timeout=timeout)


@pytest.mark.slow
def test_a_headless_replay_of_a_20s_run_is_a_summary_with_the_live_runs_hits(tmp_path: Path) -> None:
    """The bar (issue 24): a 20 s run recorded live (the simulator as fast as it goes, --speed 0), replayed
    headless without --speed: the same hits and lookups as the live run's summary, and done well before the
    recording's 20 s would have taken at x1 (15 s is a generous deadline; the figure is in
    bench/bench_replay_player.py and BENCHMARKS.md)."""
    rec = tmp_path / "run20.jsonl"
    live = _kvtop(["--headless", "--json", "--speed", "0", "--duration", "20", "--record", str(rec)], tmp_path, 120)
    assert live.returncode == 0, live.stderr
    recorded = [r for r in read_jsonl(rec) if isinstance(r, Record)]
    assert recorded[-1].time - recorded[0].time >= 19.0
    replay = _kvtop(["replay", str(rec), "--headless", "--json"], tmp_path, 15)
    assert replay.returncode == 0, replay.stderr
    live_hr, replay_hr = json.loads(live.stdout)["hit_rate"], json.loads(replay.stdout)["hit_rate"]
    assert live_hr["lookups"] > 1000
    assert (replay_hr["hits"], replay_hr["lookups"], replay_hr["host_hits"]) == \
        (live_hr["hits"], live_hr["lookups"], live_hr["host_hits"])
