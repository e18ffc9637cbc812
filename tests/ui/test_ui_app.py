"""Pilot tests: every key and flow of the dashboard, asserted on state and on the messages each action posts."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from recordings import BUSY_RECORDING, FROZEN_NOW, Messages, fleet_session, session_from_recording
from replay_demo import build_replay_session
from textual.command import CommandPalette

from kvtop.records import SourceId, make, read_jsonl
from kvtop.session import Session
from kvtop.tiers import TierModel
from kvtop.ui.app import KvtopApp, build_app, layout_for
from kvtop.ui.panel import Panel
from kvtop.ui.panels.events import EventLog
from kvtop.ui.panels.help import HelpScreen
from kvtop.ui.panels.hit_rate import HitRatePanel
from kvtop.ui.panels.priority import PriorityPanel
from kvtop.ui.panels.sources import SourcesPanel
from kvtop.ui.panels.tier import TierPanel

pytestmark = pytest.mark.usefixtures("frozen_ui_clock")  # tests/conftest.py


class Settings:
    refresh = 0.25
    theme = "dark"
    duration = None


def _records() -> list[Any]:
    return [r for r in read_jsonl(BUSY_RECORDING)]


def _gpu_panel(app: KvtopApp) -> TierPanel:
    return app.screen.query_one("#tier-gpu", TierPanel)


async def test_build_app_reads_refresh_and_theme_from_settings() -> None:
    class Light(Settings):
        theme = "light"
        refresh = 0.5

    app = build_app(session_from_recording(), Light(), run_session=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert app.theme == "light"
        assert app.timing.refresh_s == 0.5
        assert {"dark", "light", "high-contrast"} <= set(app.themes.names)


async def test_q_quits_with_status_0_and_stops_the_session() -> None:
    session = session_from_recording()
    stopped: list[bool] = []
    session.add_producer("idle", lambda: asyncio.Event().wait(), stop=lambda: stopped.append(True))
    app = build_app(session, Settings())
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.press("q")
        await pilot.pause()
    assert app.return_code == 0
    assert stopped and session._stopped
    assert app._session_worker is not None and app._session_worker.is_finished


async def test_p_pauses_updates_and_resumes() -> None:
    records = _records()
    half = len(records) // 2
    session = Session(source=SourceId(host="sim", rank=0, run="busy"))
    for r in records[:half]:
        session.emit(r)
    hook = Messages()
    app = build_app(session, Settings(), run_session=False)
    async with app.run_test(size=(120, 40), message_hook=hook) as pilot:
        app.refresh_view()
        before = _gpu_panel(app).data
        shown_at = app.shown.data_time
        await pilot.press("p")
        assert app.paused
        for r in records[half:]:
            session.emit(r)
        assert session.model.gpu != before.state  # the fold went on...
        app.refresh_view()
        await pilot.pause()
        assert _gpu_panel(app).data == before      # ...and the screen did not
        assert app.shown.data_time == shown_at
        assert app.screen.query_one("#header").data.paused
        await pilot.press("p")
        await pilot.pause()
        assert not app.paused
        assert _gpu_panel(app).data.state == session.model.gpu
        assert app.shown.data_time == session.model.now
    assert [m.paused for m in hook.of(KvtopApp.PauseToggled)] == [True, False]


async def test_r_resets_the_window() -> None:
    session = session_from_recording()
    calls: list[bool] = []
    original = session.reset_window
    session.reset_window = lambda: (calls.append(True), original())  # type: ignore[method-assign]
    hook = Messages()
    app = build_app(session, Settings(), run_session=False)
    async with app.run_test(size=(120, 40), message_hook=hook) as pilot:
        moves = app.screen.query_one("#moves")
        assert moves.data.rates.window_s is not None
        await pilot.press("r")
        await pilot.pause()
        assert calls == [True]
        assert moves.data.rates.window_s is None   # the window starts afresh: no rate until time passes
        log = app.screen.query_one(EventLog)
        app.refresh_view()
        assert any("window reset" in line.text for line in log.lines)
    assert len(hook.of(KvtopApp.WindowReset)) == 1


async def test_t_cycles_the_themes() -> None:
    hook = Messages()
    app = build_app(session_from_recording(), Settings(), run_session=False)
    async with app.run_test(size=(120, 40), message_hook=hook) as pilot:
        seen = [app.theme]
        for _ in range(3):
            await pilot.press("t")
            seen.append(app.theme)
    assert seen == ["dark", "light", "high-contrast", "dark"]
    assert [m.theme for m in hook.of(KvtopApp.ThemeCycled)] == ["light", "high-contrast", "dark"]


async def test_e_toggles_the_event_log() -> None:
    hook = Messages()
    app = build_app(session_from_recording(), Settings(), run_session=False)
    async with app.run_test(size=(120, 40), message_hook=hook) as pilot:
        log = app.screen.query_one(EventLog)
        assert log.display
        await pilot.press("e")
        await pilot.pause()
        assert not log.display
        await pilot.press("e")
        await pilot.pause()
        assert log.display
    assert [m.shown for m in hook.of(KvtopApp.EventsToggled)] == [False, True]


@pytest.mark.slow
async def test_question_mark_shows_help_and_escape_closes_it() -> None:
    hook = Messages()
    app = build_app(session_from_recording(), Settings(), run_session=False)
    async with app.run_test(size=(120, 40), message_hook=hook) as pilot:
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("escape")
        await pilot.pause()
        assert not isinstance(app.screen, HelpScreen)
        await pilot.press("question_mark")
        await pilot.pause()
        await pilot.press("question_mark")
        await pilot.pause()
        assert not isinstance(app.screen, HelpScreen)
    assert len(hook.of(KvtopApp.HelpShown)) == 2


@pytest.mark.slow
async def test_command_palette_runs_the_same_actions() -> None:
    session = session_from_recording()
    calls: list[bool] = []
    session.reset_window = lambda: calls.append(True)  # type: ignore[method-assign]
    app = build_app(session, Settings(), run_session=False)
    async with app.run_test(size=(120, 40)) as pilot:
        titles = [c.title for c in app.get_system_commands(app.screen)]
        for title in ("Pause / resume", "Reset window", "Next theme", "Event log", "Help", "Quit"):
            assert title in titles
        await pilot.press("ctrl+p")
        await pilot.pause()
        assert isinstance(app.screen, CommandPalette)
        await pilot.press(*"reset window")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await pilot.pause(0.1)
        assert calls == [True]


async def test_layout_follows_resizes() -> None:
    assert (layout_for(120, 40), layout_for(80, 24), layout_for(40, 12)) == ("wide", "medium", "compact")
    app = build_app(session_from_recording(), Settings(), run_session=False)
    async with app.run_test(size=(120, 40)) as pilot:
        screen = app.screen
        assert screen.has_class("-wide")
        await pilot.resize_terminal(80, 24)
        await pilot.pause()
        assert screen.has_class("-medium") and not screen.has_class("-wide")
        await pilot.resize_terminal(40, 12)
        await pilot.pause()
        assert screen.has_class("-compact")
        # Whole at 40x12: every panel still shown is inside the screen, none cut by its edge.
        for panel in screen.query("TierPanel, HitRatePanel, MovesPanel, RequestPanel"):
            region = panel.region
            assert region.height >= 1 and region.bottom <= 12 and region.right <= 40, panel
        await pilot.resize_terminal(120, 40)
        await pilot.pause()
        assert screen.has_class("-wide")


async def test_a_live_replay_fills_the_screen_and_quits_cleanly() -> None:
    session, replay = build_replay_session(BUSY_RECORDING, speed=0)
    app = build_app(session, Settings())
    async with app.run_test(size=(120, 40)) as pilot:
        for _ in range(200):
            await pilot.pause(0.05)
            if session.status.get("replay") == "done":
                break
        assert session.status.get("replay") == "done"
        app.refresh_view()
        gpu = _gpu_panel(app).data.state
        assert (gpu.capacity_blocks, app.screen.query_one("#tier-host").data.state.capacity_blocks) == (256, 227)
        assert replay.emitted == 3324
        assert app.timing.last_cost_s < 0.05   # a refresh never holds the loop long (typically ~1 ms)
        log = app.screen.query_one(EventLog)
        assert any("replay finished: 3324 records" in line.text for line in log.lines)
        await pilot.press("q")
        await pilot.pause()
    assert app.return_code == 0


async def test_unknown_host_occupancy_shows_as_unknown_never_zero() -> None:
    """Stats and a host pool but no KV events (event_buffer_max_size = 0): host occupancy is unknown."""
    source = SourceId(host="sim", rank=0, run="busy")
    session = Session(source=source)
    session.emit(make("meta", {"engine": "sim", "model": "Qwen/Qwen3-8B", "tokens_per_block": 32,
                               "primary_blocks": 256, "secondary_blocks": 227, "bytes_per_block": 4718592},
                      source=source, time=1764430000.0))
    for r in _records():
        if r.kind == "stats":
            session.emit(r)
    app = build_app(session, Settings(), run_session=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        host = app.screen.query_one("#tier-host", TierPanel)
        text = host.render().plain
        assert "unknown" in text
        assert host.has_class("-unknown")
        assert "host unknown" in app.screen.query_one("#header").data.flags
        assert session.model.host.cached_blocks is None


async def test_tier_panels_toggle_ok_and_warn() -> None:
    model = TierModel()
    model.apply(make("kv_event", {"event_id": 0, "data": {"type": "created", "num_blocks_per_cache_level": [100, 0]}},
                     time=1.0))
    stats = {"iter": 0, "kvCacheStats": {"maxNumBlocks": 100, "freeNumBlocks": 50, "usedNumBlocks": 50,
                                         "tokensPerBlock": 32, "reusedBlocks": 0, "missedBlocks": 0}}
    model.apply(make("stats", stats, time=2.0))
    session = Session()
    session.model = model
    app = build_app(session, Settings(), run_session=False)
    async with app.run_test(size=(120, 40)) as pilot:
        gpu = _gpu_panel(app)
        assert gpu.has_class("-ok") and not gpu.has_class("-warn")
        stats["kvCacheStats"] = dict(stats["kvCacheStats"], freeNumBlocks=5, usedNumBlocks=95)  # type: ignore
        stats["iter"] = 1
        model.apply(make("stats", stats, time=3.0))
        app.refresh_view()
        await pilot.pause()
        assert gpu.has_class("-warn") and not gpu.has_class("-ok")


async def test_event_log_aggregates_and_rate_limits() -> None:
    app = build_app(session_from_recording(), Settings(), run_session=False)
    async with app.run_test(size=(120, 40)):
        log = app.screen.query_one(EventLog)
        log.lines.clear()
        log._last_fill = None
        for i in range(1000):
            log.add(100.0 + i * 0.001, "warn", f"request {i} failed: out of blocks")
        assert len(log.lines) == 1 and log.lines[0].count == 1000          # one line, ×1000
        for i in range(100):                                                # 100 different lines in 0.1 s
            log.add(200.0 + i * 0.001, "info", f"source{chr(65 + i % 26)}{chr(65 + i // 26)} said hello")
        assert log.suppressed > 0 and len(log.lines) <= 1 + EventLog.BURST + 1
        log.add(300.0, "info", "much later")                               # the bucket refilled
        texts = [line.text for line in log.lines]
        assert any("more lines suppressed" in t for t in texts) and texts[-1] == "much later"


async def test_session_log_feeds_the_event_log_once() -> None:
    session = session_from_recording()
    app = build_app(session, Settings(), run_session=False)
    async with app.run_test(size=(120, 40)):
        log = app.screen.query_one(EventLog)
        session.note("warn", "nvml: no NVIDIA driver")
        app.refresh_view()
        app.refresh_view()
        assert sum("no NVIDIA driver" in line.text and line.count == 1 for line in log.lines) == 1


async def test_several_sources_and_the_s_key() -> None:
    session = session_from_recording()
    other = SourceId(host="node-b", rank=0, run="busy")
    for r in _records()[:1500]:
        session.emit(make(r.kind, r.data, source=other, time=r.time))
    hook = Messages()
    app = build_app(session, Settings(), run_session=False)
    async with app.run_test(size=(120, 40), message_hook=hook) as pilot:
        header = app.screen.query_one("#header")
        assert header.data.source_label.startswith("1/2")
        first = _gpu_panel(app).data
        await pilot.press("s")
        await pilot.pause()
        assert header.data.source_label.startswith("2/2 node-b")
        assert _gpu_panel(app).data != first
    assert [m.source for m in hook.of(KvtopApp.SourceChanged)] == ["node-b/0/busy"]


# ---------------------------------------------------------------------------------------------- fleet view

FLEET_KEYS = ["node-a/0/chat", "node-b/1/chat", "node-c/0/batch"]


def _sources_panel(app: KvtopApp) -> SourcesPanel:
    return app.screen.query_one(SourcesPanel)


async def test_one_source_shows_no_sources_table() -> None:
    app = build_app(session_from_recording(), Settings(), run_session=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert not app.screen.has_class("-fleet")
        assert not _sources_panel(app).display
        assert app.screen.query_one(PriorityPanel).display


async def test_three_sources_show_the_table_and_its_aggregate_row() -> None:
    session = fleet_session()
    app = build_app(session, Settings(), run_session=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert app.screen.has_class("-fleet")
        panel = _sources_panel(app)
        assert panel.display and not app.screen.query_one(PriorityPanel).display
        d = panel.data
        assert [r.key for r in d.rows] == FLEET_KEYS and d.selected == 0
        models = [session.models[k] for k in FLEET_KEYS]
        total = d.total
        # The aggregate from the models themselves: sums of blocks and rates; total hits / total lookups.
        assert total.sources == 3
        assert total.gpu_in_use == sum(m.gpu.in_use_blocks for m in models)
        assert total.gpu_capacity == 3 * 256
        assert total.host_cached == sum(m.host.cached_blocks for m in models)
        hits, lookups = sum(m.hit_rate.hits for m in models), sum(m.hit_rate.lookups for m in models)
        assert (total.hits, total.lookups) == (hits, lookups)
        assert total.hit_cumulative == pytest.approx(hits / lookups)
        assert total.hit_cumulative != pytest.approx(sum(m.hit_rate.cumulative for m in models) / 3, abs=1e-4)
        assert total.requests_per_s == pytest.approx(sum(m.rates.requests_per_s for m in models))
        assert total.offloaded_per_s == pytest.approx(sum(m.rates.offloaded_per_s for m in models))
        assert total.ttft_p99_s == max(r.ttft_p99_s for r in d.rows)
        text = panel.text()
        lines = text.splitlines()
        assert "TTFT p99" in lines[0] and "GPU use/cch/cap" in lines[0]
        assert lines[1].startswith(" ▶ node-a/0/chat")
        all_line = next(ln for ln in lines if ln.startswith(" Σ all"))
        assert f"{total.gpu_in_use}/{total.gpu_cached}/768" in all_line
        assert f"{total.hit_cumulative * 100:.1f}%" in all_line
        assert "max of the sources'" in panel.border_subtitle


async def test_s_picks_the_source_and_highlights_its_row() -> None:
    session = fleet_session()
    hook = Messages()
    app = build_app(session, Settings(), run_session=False)
    async with app.run_test(size=(120, 40), message_hook=hook) as pilot:
        await pilot.pause()
        for i, key in enumerate(FLEET_KEYS[1:] + FLEET_KEYS[:1], start=1):
            await pilot.press("s")
            await pilot.pause()
            panel = _sources_panel(app)
            assert panel.data.selected == i % 3
            marked = [ln for ln in panel.text().splitlines() if ln.startswith(" ▶")]
            assert len(marked) == 1 and marked[0].startswith(f" ▶ {key}")
            gpu = session.models[key].gpu
            assert _gpu_panel(app).data.state == gpu  # the big panels show the selected source
            assert app.screen.query_one("#header").data.source_label.endswith(key)
    assert [m.source for m in hook.of(KvtopApp.SourceChanged)] == FLEET_KEYS[1:] + FLEET_KEYS[:1]


async def test_source_statuses_go_to_the_table_and_offline_ones_leave_the_aggregate() -> None:
    session = fleet_session()
    session.status.update({"node-a/0/chat": "online", "node-b/1/chat": "online", "node-c/0/batch": "offline"})
    app = build_app(session, Settings(), run_session=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        d = _sources_panel(app).data
        assert [r.status for r in d.rows] == ["online", "online", "offline"]
        assert d.total.sources == 2
        assert d.total.hits == sum(session.models[k].hit_rate.hits for k in FLEET_KEYS[:2])
        assert _sources_panel(app).has_class("-warn")
        assert "2 of 3" in _sources_panel(app).text()
        # Per-source statuses are in the table, not badges in the header.
        assert app.screen.query_one("#header").data.sources == ()
        # The MQTT link going down marks every source that was not offline "disconnected".
        session.status["mqtt"] = "disconnected: connection refused; retrying (every 5 s)"
        app.refresh_view()
        await pilot.pause()
        assert [r.status for r in _sources_panel(app).data.rows] == ["disconnected", "disconnected", "offline"]


async def test_an_agents_sources_are_named_and_a_status_the_session_said_is_said_once() -> None:
    """kvtop agent --run NAME: the row says NAME (its meta's source_name), not the source's key; a status that
    came through the session's log ("agent-a/0/chat: online") is one line of the event log, not two (x2)."""
    session = fleet_session()
    meta = dict(session.models["node-b/1/chat"].meta)
    session.emit(make("meta", {**meta, "source_name": "beta"}, source=SourceId("node-b", 1, "chat"),
                      time=FROZEN_NOW))
    session.on_source_status("agent-a/0/chat", "online")
    session.on_source_status("agent-a/0/chat", "online")   # said again (a retained one, a reconnect): no news
    app = build_app(session, Settings(), run_session=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        rows = _sources_panel(app).data.rows
        assert [r.label for r in rows] == ["node-a/0/chat", "beta", "node-c/0/batch"]
        text = _sources_panel(app).text()
        assert "beta" in text and "node-b/1/chat" not in text
        log = app.screen.query_one(EventLog)
        said = [line for line in log.lines if line.text == "agent-a/0/chat: online"]
        assert [line.count for line in said] == [1]
        session.on_source_status("agent-a/0/chat", "offline")
        app.refresh_view()
        await pilot.pause()
        said = [line for line in log.lines if line.text == "agent-a/0/chat: offline"]
        assert [line.count for line in said] == [1]


async def test_the_header_says_a_status_many_agents_share_once() -> None:
    session = fleet_session()
    session.on_source_status("mqtt", "connected to mqtt://127.0.0.1:1883/lab")
    for name in ("agent-a/0/alpha", "agent-b/0/beta", "agent-c/0/gamma", "agent-d/0/delta"):
        session.on_source_status(name, "online")
    session.on_source_status("agent-d/0/delta", "offline")
    app = build_app(session, Settings(), run_session=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert app.screen.query_one("#header").data.sources == (
            ("mqtt", "connected to mqtt://127.0.0.1:1883/lab"), ("3 agents", "online"),
            ("agent-d/0/delta", "offline"))


@pytest.mark.slow
async def test_the_sources_table_follows_new_records_at_most_once_a_second() -> None:
    session = fleet_session()
    app = build_app(session, Settings(), run_session=False)
    # The full reads' period, long enough that the steps below always fall within one, as a second did not on a
    # loaded machine (the test failed twice at load 5-6); set to 0 below to see a full read.
    app.fleet.refresh_s = 3600.0
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        before = _sources_panel(app).data
        rec = next(r for r in _records() if r.kind == "request")
        for i, source in enumerate((SourceId("node-b", 1, "chat"), SourceId("node-a", 0, "chat"))):
            key = source.key()
            session.emit(make("request", dict(rec.data, request_id=10_000 + i), source=source,
                              time=session.models[key].now + 0.5))
        app.refresh_view()
        mid = _sources_panel(app).data
        # Within the second only the selected source's row (node-a, the one the big panels show) follows.
        assert mid.rows[1] is before.rows[1] and mid.rows[2] is before.rows[2]
        assert mid.rows[0].requests_per_s != before.rows[0].requests_per_s
        app.fleet.refresh_s = 0.0
        app.refresh_view()
        after = _sources_panel(app).data
        assert after.rows[1] != before.rows[1]
        assert after.rows[2] is before.rows[2]  # a source that folded nothing is not read again


@pytest.mark.parametrize("size", [(80, 24), (40, 12)])
async def test_the_fleet_view_keeps_small_screens_whole(size: tuple[int, int]) -> None:
    app = build_app(fleet_session(), Settings(), run_session=False)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        panel = _sources_panel(app)
        assert panel.display and panel.region.bottom <= size[1]
        text = panel.text()
        if size == (40, 12):
            assert text.strip().startswith("3 sources") and panel.region.height == 1
        else:
            assert "▶ node-a/0/chat" in text and "Σ all" in text
        # Every panel that is shown lies within the screen, none overlapping another.
        shown = [w for w in app.screen.query(Panel) if w.display and w.region.height]
        for w in shown:
            assert w.region.right <= size[0] and w.region.bottom <= size[1], w
        for i, w in enumerate(shown):
            for v in shown[i + 1:]:
                assert not w.region.overlaps(v.region), (w, v)


# ---------------------------------------------------------------------------------------------- what-if

def _hit_text(app: KvtopApp) -> str:
    return app.screen.query_one(HitRatePanel).text()


def _curve_line(advice: dict[str, Any], with_optimum: bool) -> str:
    by = {p["host_blocks"]: p for p in advice["points"]}
    h = advice["host_blocks"]
    rates = " ".join(f"{by[round(f * h)]['hit_rate'] * 100:.0f}" for f in (0, 0.5, 1, 2, 4))
    line = f"host×0 ½ 1 2 4: {rates}%"
    return line + (f" opt {by[h]['optimal_hit_rate'] * 100:.0f}" if with_optimum else "")


async def test_what_if_line_shows_the_sessions_estimate() -> None:
    """The line is the size advice's curve: the hit rate at 0, ½, 1, 2 and 4 times the host pool, the run's own
    (cumulative) at 1, and the optimum at the pool's size where the line has room (120x40)."""
    session = session_from_recording()
    advice = session.size_advice()
    at = {p["host_blocks"]: p for p in advice["points"]}
    assert at[advice["host_blocks"]]["hit_rate"] == session.model.hit_rate.cumulative
    app = build_app(session, Settings(), run_session=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert _curve_line(advice, with_optimum=True) in _hit_text(app)
        rates = [p["hit_rate"] for p in advice["points"]]
        assert rates == sorted(rates) and rates[-1] > rates[0]


async def test_what_if_line_reads_what_the_session_says() -> None:
    session = session_from_recording()
    known = {"host_blocks": 200, "points": [
        {"host_blocks": h, "hit_rate": r, "optimal_hit_rate": o}
        for h, r, o in [(0, 0.31, 0.5), (100, 0.35, 0.52), (200, 0.41, 0.6), (400, 0.523, 0.66), (800, 0.6149, 0.7)]],
        "recommendation": {"text": "+1 GiB host: +11.3 pts hits"}}
    answers = iter([{"host_blocks": 200, "points": [{"host_blocks": 200, "hit_rate": None,
                                                     "optimal_hit_rate": None}]}, known])
    session.size_advice = lambda optimum=True: next(answers)  # type: ignore[method-assign]
    app = build_app(session, Settings(), run_session=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        assert "host×0 ½ 1 2 4: ? ? ? ? ?%" in _hit_text(app)  # unknown until known, never 0%
        # The curve is read again once the model's clock has moved on by its step (5 s).
        last = session.model.now
        session.emit(make("stats", {"iter": 10**6, "numActiveRequests": 0}, source=session.source, time=last + 5.5))
        app.refresh_view()
        await pilot.pause()
        assert "host×0 ½ 1 2 4: 31 35 41 52 61%" in _hit_text(app)


async def test_what_if_with_no_host_cache_says_what_twice_zero_means() -> None:
    """Host cache 0: a curve in multiples of it would be of nothing (an x2 estimate once read above the actual hit
    rate, from another span); the line says so instead of showing a figure."""
    session = session_from_recording()
    session.size_advice = lambda optimum=True: {  # type: ignore[method-assign]
        "host_blocks": 0, "points": [{"host_blocks": 0, "hit_rate": 0.31, "optimal_hit_rate": 0.4}]}
    app = build_app(session, Settings(), run_session=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        text = _hit_text(app)
        assert "what-if no host cache: x2 of 0 is 0" in text
        assert "host×" not in text


async def test_what_if_only_for_the_sessions_own_source() -> None:
    app = build_app(fleet_session(), Settings(), run_session=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert "host×0 ½ 1 2 4:" in _hit_text(app)
        await pilot.press("s")
        await pilot.pause()
        assert "host×" not in _hit_text(app)


class StandInSession:
    """Only what the screen reads: a model and no ``what_if``."""

    def __init__(self, model: TierModel):
        self.model = model
        self.models = {"x/0/y": model}
        self.meta: dict[str, Any] = {}
        self.log: list[Any] = []
        self.status: dict[str, str] = {}
        self.started_at = FROZEN_NOW - 10

    async def run(self) -> None:
        return None

    def stop(self) -> None:
        return None


async def test_no_what_if_line_without_the_estimate() -> None:
    model = TierModel()
    for r in _records()[:800]:
        model.apply(r)
    app = build_app(StandInSession(model), Settings(), run_session=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        text = _hit_text(app)
        assert "what-if" not in text and "host×" not in text and "total" in text


# ---------------------------------------------------------------------------------------------- what it reads

async def test_one_failed_request_is_logged_once_however_often_the_screen_refreshes() -> None:
    """The failure's log key was the snapshot's id, new with every record: one failure was logged again at each
    refresh that drew a new snapshot (2 lines in 5 refreshes, varying with id reuse) and the keys grew without end."""
    session = session_from_recording()
    last = session.model.now
    session.emit(make("request", {"request_id": 99_999, "ok": False, "error": "out of blocks", "prompt_tokens": 9000},
                      source=session.source, time=last + 0.1))
    app = build_app(session, Settings(), run_session=False)
    async with app.run_test(size=(120, 40)):
        for i in range(20):
            session.emit(make("stats", {"iter": 10**6 + i, "numActiveRequests": 0}, source=session.source,
                              time=last + 0.2 + i))
            app.refresh_view()
        failed = [(line.text, line.count) for line in app.screen.query_one(EventLog).lines if "failed" in line.text]
        assert failed == [("1 request failed: out of blocks", 1)]
        assert app.timing.refreshes >= 20


async def test_a_refresh_with_nothing_folded_draws_no_panel_again() -> None:
    """The model's snapshot is the cache: the same snapshot means nothing changed (no version tuple kept beside)."""
    session = session_from_recording()
    app = build_app(session, Settings(), run_session=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        drawn, data = app.timing.refreshes, _gpu_panel(app).data
        for _ in range(3):
            app.refresh_view()
        assert app.timing.refreshes == drawn and _gpu_panel(app).data is data
        session.emit(make("stats", {"iter": 10**6, "numActiveRequests": 0}, source=session.source,
                          time=session.model.now + 1.0))
        app.refresh_view()
        assert app.timing.refreshes == drawn + 1
        assert app.shown.data_time == session.model.now


async def test_the_header_and_requests_show_what_the_sessions_view_says() -> None:
    """Problems, stale sources and the driver's in-flight count reach the screen through SessionView."""
    session = session_from_recording()

    class Driver:
        in_flight = 5

    session.driver = Driver()
    session.problems.report("record.bad", "line 3: not JSON", lost=True)
    session.status.update({"node-b/0/x": "stale", "node-c/0/x": "stale"})
    app = build_app(session, Settings(), run_session=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        flags = app.screen.query_one("#header").data.flags
        # the busy recording's host pool (227 blocks) is smaller than its GPU pool (256): a tier-health alarm
        # (kvtop/tiers/health.py), reported at the first refresh, the newest of the two problems
        assert "2 problems: tier.host_not_larger" in flags and "2 sources stale" in flags
        assert {p.kind for p in session.view().problems} == {"record.bad", "tier.host_not_larger"}
        assert app.screen.query_one("#requests").data.in_flight == 5
        session.driver = None   # no driver: the fold's own count of requests in flight
        session.emit(make("stats", {"iter": 10**6, "numActiveRequests": 0}, source=session.source,
                          time=session.model.now + 1.0))
        app.refresh_view()
        assert app.screen.query_one("#requests").data.in_flight == session.model.requests.in_flight
