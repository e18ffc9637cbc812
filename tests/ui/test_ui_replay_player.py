"""Pilot tests of the replay player (issue 24, item 1): p pauses the replay itself, seek, step and speed, driven
through the dashboard's keys on ``kvtop replay``'s own session (kvtop.compose.build_attach_session), with numbers;
and + / - changing the refresh interval of a live screen.

Positions are recording seconds since its first record; after a seek (or a step) the session has folded exactly
the records up to that position, and a seek back re-folds them from the start: the figures are what a fold of
those records alone gives."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import pytest
from recordings import BUSY_RECORDING, session_from_recording

from kvtop.compose import build_attach_session
from kvtop.records import Record, read_jsonl
from kvtop.tiers import TierModel
from kvtop.ui.app import DEFAULT_REFRESH_S, REFRESH_STEPS, KvtopApp, build_app
from kvtop.ui.panels.events import EventLog
from kvtop.ui.panels.header import HeaderBar

pytestmark = pytest.mark.usefixtures("frozen_ui_clock")  # tests/conftest.py


class Settings:
    refresh = 0.25
    theme = "dark"
    duration = None


RECORDS: list[Record] = [r for r in read_jsonl(BUSY_RECORDING) if isinstance(r, Record)]
T0 = RECORDS[0].time   # busy.jsonl: 3,324 records over 8.0 s


def upto(position_s: float) -> list[Record]:
    """The records a replay has folded at ``position_s``: those up to it (busy.jsonl is in time order)."""
    return [r for r in RECORDS if r.time - T0 <= position_s + 1e-9]


def hits_of(records: list[Record]) -> tuple[int, int]:
    model = TierModel()
    model.apply_records(records)
    hr = model.snapshot().hit_rate
    return hr.hits, hr.lookups


def shown_hits(app: KvtopApp) -> tuple[int, int]:
    app.refresh_view()
    hr = app.shown.snapshot.hit_rate if app.shown.snapshot is not None else None
    assert hr is not None
    return hr.hits, hr.lookups


async def until(pilot: Any, cond: Callable[[], bool], timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        await pilot.pause(0.02)


def settled(app: KvtopApp) -> Callable[[], bool]:
    """The replay has done what it was asked (a seek folds on the producer's task, a batch at a time)."""
    player = app.session.view().player
    return lambda: player._target is None and not player.seeking


def replay_app(speed: float = 1.0) -> tuple[KvtopApp, Any]:
    session = build_attach_session(str(BUSY_RECORDING), command="replay", speed=speed, hold_at_end=True)
    return build_app(session, Settings()), session


def badge(app: KvtopApp) -> str:
    app.refresh_view()
    data = app.screen.query_one(HeaderBar).data
    assert data.replay is not None
    return data.replay.text()


async def test_p_pauses_the_replay_itself_counts_stop_and_resume() -> None:
    app, session = replay_app(speed=1.0)
    player = session.player
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: session.records > 100)
        await pilot.press("p")
        assert player.paused and not app.paused   # the replay pauses; the screen stays live (steps show)
        records, position, model_time = session.records, player.position_s, session.model.now
        await pilot.pause(1.5)    # at x1, 1.5 s of a busy recording is ~600 records
        assert (session.records, player.position_s, session.model.now) == (records, position, model_time)
        assert records < len(RECORDS)
        assert badge(app).startswith(f"REPLAY 0:0{int(position)} / 0:08 x1")
        assert app.screen.query_one(HeaderBar).data.paused   # the PAUSED badge, beside the REPLAY one
        await pilot.press("p")
        assert not player.paused
        await until(pilot, lambda: session.records > records + 100)
        assert player.position_s > position
        log = [line.text for line in app.screen.query_one(EventLog).lines]
        assert any(t.startswith("replay paused at 0:0") for t in log) and any("replay playing" in t for t in log)
        await pilot.press("q")


async def test_seek_forward_back_home_and_end_fold_exactly_the_records_up_to_the_position() -> None:
    app, session = replay_app(speed=1.0)
    player = session.player
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: session.records > 0)
        await pilot.press("p")
        start = player.position_s
        await pilot.press("right")
        await until(pilot, settled(app))
        assert player.position_s == pytest.approx(start + 5.0)
        ahead = upto(start + 5.0)
        assert session.records == len(ahead) and player.generation == 0
        assert shown_hits(app) == hits_of(ahead)
        await pilot.press("left")   # back: the fold starts again from the first record
        await until(pilot, settled(app))
        assert player.position_s == pytest.approx(start) and player.generation == 1
        back = upto(start)
        assert session.records == len(back) < len(ahead)
        assert shown_hits(app) == hits_of(back)
        await pilot.press("end")
        await until(pilot, settled(app))
        assert (player.position_s, session.records, player.at_end) == (pytest.approx(8.0, abs=1e-3), 3324, True)
        assert shown_hits(app) == hits_of(RECORDS) and app.finished_reason() == "replay finished"
        assert badge(app).startswith("REPLAY 0:08 / 0:08")
        await pilot.press("home")
        await until(pilot, settled(app))
        assert (player.position_s, session.records, player.at_end) == (0.0, len(upto(0.0)), False)
        assert app.finished_reason() is None and player.generation == 2
        assert shown_hits(app) == hits_of(upto(0.0))
        await pilot.press("q")


async def test_step_goes_one_second_on_or_back_and_pauses() -> None:
    app, session = replay_app(speed=1.0)
    player = session.player
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: session.records > 0)
        await pilot.press("full_stop")    # playing: a step pauses first
        await until(pilot, settled(app))
        assert player.paused
        first = player.position_s
        for n in (1, 2, 3):
            await pilot.press("full_stop")
            await until(pilot, settled(app))
            assert player.position_s == pytest.approx(first + n)
            assert session.records == len(upto(first + n))
        await pilot.press("comma")
        await until(pilot, settled(app))
        assert player.position_s == pytest.approx(first + 2) and session.records == len(upto(first + 2))
        assert shown_hits(app) == hits_of(upto(first + 2))
        await pilot.pause(0.5)
        assert session.records == len(upto(first + 2))   # still paused
        await pilot.press("q")


async def test_plus_and_minus_change_the_replay_speed_and_the_pace_follows() -> None:
    app, session = replay_app(speed=1.0)
    player = session.player
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: session.records > 0)
        await pilot.press("p")
        await pilot.press("plus", "plus")
        assert player.speed == 4.0 and " x4" in badge(app)
        await pilot.press("minus", "minus", "minus")
        assert player.speed == 0.5 and " x0.5" in badge(app)
        await pilot.press("minus", "minus")
        assert player.speed == 0.25    # the slowest
        await pilot.press(*["plus"] * 9)
        assert player.speed == 0 and " max" in badge(app)
        await pilot.press("minus", "minus")
        assert player.speed == 32.0
        await pilot.press("minus", "minus", "minus")
        assert player.speed == 4.0
        # x4 from the start: the fold's clock runs four times the wall's (measured around it, whatever the load)
        await pilot.press("home")
        await until(pilot, settled(app))
        before_play = time.monotonic()
        await pilot.press("p")
        playing = time.monotonic()
        await pilot.pause(0.6)
        before_pause = time.monotonic()
        await pilot.press("p")
        paused = time.monotonic()
        advanced = session.model.now - T0
        # it played at least from `playing` to `before_pause`, at most from `before_play` to `paused`; a record is
        # never early, and at most a burst (50 ms: 0.2 s of recording at x4) late
        at_least, at_most = before_pause - playing, paused - before_play
        assert 4 * at_least - 0.3 <= advanced <= 4 * at_most + 1e-6, (advanced, at_least, at_most)
        log = [line.text for line in app.screen.query_one(EventLog).lines]
        assert "replay speed x4" in log
        await pilot.press("q")


async def test_a_held_replay_waits_at_its_end_for_a_seek_back() -> None:
    app, session = replay_app(speed=0.0)
    player = session.player
    async with app.run_test(size=(120, 40)) as pilot:
        await until(pilot, lambda: player.at_end)
        assert session.records == 3324 and session.status.get("replay") == "ok"   # held, not done
        await pilot.press("p", "left")   # paused there (at max speed it would play on to the end at once)
        await until(pilot, settled(app))
        assert player.position_s == pytest.approx(3.0, abs=1e-3) and not player.at_end
        assert session.records == len(upto(3.0))
        await pilot.press("q")
    assert app.return_code == 0


async def test_plus_and_minus_change_the_refresh_interval_live_within_floor_and_ceiling() -> None:
    app = build_app(session_from_recording(), Settings(), run_session=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert app.timing.refresh_s == DEFAULT_REFRESH_S and app.screen.query_one(HeaderBar).data.refresh_s is None
        await pilot.press("minus")
        assert app.timing.refresh_s == 0.5 and app.timing.timer._interval == 0.5
        assert app.screen.query_one(HeaderBar).data.refresh_s == 0.5
        await pilot.press("minus", "minus", "minus", "minus")
        assert app.timing.refresh_s == REFRESH_STEPS[-1] == 5.0   # the ceiling
        await pilot.press(*["plus"] * 7)
        assert app.timing.refresh_s == REFRESH_STEPS[0] == 0.1 and app.timing.timer._interval == 0.1   # the floor
        log = [line.text for line in app.screen.query_one(EventLog).lines]
        assert log[-1] == "refresh every 0.1 s (+/-: 0.1 to 5 s)"
        # live, the player's keys are not bound: p still freezes the screen
        await pilot.press("p")
        assert app.paused
        await pilot.press("q")


async def test_player_keys_are_not_bound_without_a_replay() -> None:
    app = build_app(session_from_recording(), Settings(), run_session=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert app.session.view().player is None
        for action in ("seek_back", "seek_forward", "seek_home", "seek_end", "step", "step_back"):
            assert app.check_action(action, ()) is False
        await pilot.press("left", "right", "home", "end", "full_stop", "comma")   # nothing to drive: no error
        await asyncio.sleep(0)
        assert app.return_code is None
        await pilot.press("q")
