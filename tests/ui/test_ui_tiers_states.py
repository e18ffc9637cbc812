"""The tier bars (one stacked bar per tier whose parts add up to the pool) and the header's three states
(paused, finished, stale), on the committed busy recording with the UI's clock under the test's control."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from recordings import FROZEN_NOW, session_from_recording, three_tier_session

from kvtop.occupancy import cells, occupancy
from kvtop.records import make
from kvtop.tiers import TierState
from kvtop.ui import app as app_module
from kvtop.ui.app import STALE_AFTER_S, build_app
from kvtop.ui.panels.header import HeaderBar
from kvtop.ui.panels.tier import TierPanel

pytestmark = pytest.mark.usefixtures("frozen_ui_clock")  # tests/conftest.py


class Settings:
    refresh = 0.25
    theme = "dark"
    duration = None


# ---------------------------------------------------------------------------------------------- the split

@given(cap=st.integers(1, 10_000), used=st.integers(0, 10_000), cached=st.integers(0, 10_000))
def test_the_three_parts_never_overlap_and_add_up_to_the_pool(cap: int, used: int, cached: int) -> None:
    used, cached = min(used, cap), min(cached, cap)
    o = occupancy(TierState("gpu", cap, used, cached, cap - used))
    assert o.in_use is not None and o.cached_idle is not None and o.empty is not None
    assert min(o.in_use, o.cached_idle, o.empty) >= 0
    assert o.in_use + o.cached_idle + o.empty == cap
    assert o.cached_idle + o.empty == o.free == cap - used          # TensorRT-LLM's "free"
    # The true idle count lies in [cached_idle, cached_idle + slack], whatever the overlap of held and cached.
    assert max(cached - used, 0) == o.cached_idle and o.cached_idle + o.slack == min(cached, cap - used)
    assert o.exact == (o.slack == 0)


def test_a_full_reuse_tree_splits_exactly() -> None:
    # The busy recording's GPU at its end: 256 blocks, 64 held, the tree covering 225 (TensorRT-LLM: free 192).
    o = occupancy(TierState("gpu", 256, 64, 225, 192))
    assert (o.in_use, o.cached_idle, o.empty, o.free, o.slack) == (64, 161, 31, 192, 31)
    full = occupancy(TierState("gpu", 256, 64, 256, 192))
    assert (full.in_use, full.cached_idle, full.empty, full.exact) == (64, 192, 0, True)
    host = occupancy(TierState("host", 227, 0, 200, 227))
    assert (host.in_use, host.cached_idle, host.empty, host.exact) == (0, 200, 27, True)


def test_unknown_stays_unknown() -> None:
    no_events = occupancy(TierState("gpu", 256, 64, None, 192))
    assert (no_events.in_use, no_events.cached_idle, no_events.empty) == (64, None, None)
    assert occupancy(TierState("host", None, None, None, None)).capacity is None


@given(parts=st.lists(st.integers(0, 1000), min_size=3, max_size=3), width=st.integers(3, 200))
def test_bar_cells_add_up_to_the_width(parts: list[int], width: int) -> None:
    total = sum(parts)
    out = cells(tuple(parts), total, width)
    if total == 0:
        assert out == (0, 0, 0)
        return
    assert sum(out) == width and min(out) >= 0
    for p, n in zip(parts, out):
        if p == 0:
            assert n == 0
        else:
            assert n >= 1   # a part that exists is seen (3 parts, >= 3 cells)


# ---------------------------------------------------------------------------------------------- tier panels

def _panel(app: Any, name: str) -> TierPanel:
    return app.screen.query_one(f"#tier-{name}", TierPanel)


async def test_tier_panels_show_one_bar_and_trtllms_free_beside_it() -> None:
    app = build_app(session_from_recording(), Settings(), run_session=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        gpu = _panel(app, "gpu").text()
        # The busy recording ends with 64 GPU blocks held, 225 in the reuse tree, TensorRT-LLM free 192.
        assert "25% in use" in gpu.splitlines()[0]
        assert "in use          64  25%" in gpu
        assert "cached idle    161  63%" in gpu
        assert "empty           31  12%" in gpu
        assert "┘ 192 75%" in gpu and "TensorRT-LLM's free" in gpu
        assert "reuse tree 225 blocks" in gpu
        host = _panel(app, "host").text()
        assert "100% cached" in host.splitlines()[0]
        assert "cached         227 100%" in host and "empty            0   0%" in host


async def test_at_80x24_the_host_headline_is_its_cached_share() -> None:
    app = build_app(session_from_recording(), Settings(), run_session=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        first = _panel(app, "host").text().splitlines()[0]
        assert first.rstrip().endswith("100% cached")
        assert " 0%" not in first
        gpu = _panel(app, "gpu").text()
        assert gpu.splitlines()[0].rstrip().endswith("25% in use")
        assert "┐ free" in gpu and "┘ 192" in gpu


async def test_a_third_tier_gets_its_own_panel() -> None:
    """A model whose ``tiers`` lists GPU, host and disk: three bars, the disk one under the host one."""
    session = three_tier_session()
    app = build_app(session, Settings(), run_session=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        panels = list(app.screen.query(TierPanel))
        assert [p.id for p in panels] == ["tier-gpu", "tier-host", "tier-disk"]
        text = panels[2].text()
        assert "40% cached" in text.splitlines()[0]
        assert panels[2].border_title == "disk tier · file / NVMe"


# ---------------------------------------------------------------------------------------------- states

class Clock:
    def __init__(self, t: float):
        self.t = t

    def __call__(self) -> float:
        return self.t


def _header(app: Any) -> Any:
    return app.screen.query_one(HeaderBar)


def _feed(session: Any, dt: float) -> None:
    last = session.model.now
    session.emit(make("stats", {"iter": 10**6 + int(last), "numActiveRequests": 1}, source=session.source,
                      time=last + dt))


async def test_pausing_over_a_running_engine_raises_no_stale_alarm(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock(FROZEN_NOW)
    monkeypatch.setattr(app_module, "wall_clock", clock)
    session = session_from_recording()
    app = build_app(session, Settings(), run_session=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.press("p")
        for _ in range(12):     # 12 s paused while the engine goes on sending a record a second
            clock.t += 1.0
            _feed(session, 1.0)
            app.refresh_view()
        await pilot.pause()
        d = _header(app).data
        assert d.paused and d.stale_s is None and d.finished is None
        text = _header(app).text()
        assert "PAUSED" in text and "no data" not in text and "engine goes on, +12 s" in text
        # The engine stops too: after STALE_AFTER_S without a record the alarm is real, paused or not.
        clock.t += STALE_AFTER_S + 3
        app.refresh_view()
        assert _header(app).data.stale_s == STALE_AFTER_S + 3


async def test_a_running_session_without_records_goes_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock(FROZEN_NOW)
    monkeypatch.setattr(app_module, "wall_clock", clock)
    app = build_app(session_from_recording(), Settings(), run_session=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        clock.t += 8
        app.refresh_view()
        await pilot.pause()
        assert _header(app).data.stale_s == 8.0
        assert " no data 8s " in _header(app).text() and "FINISHED" not in _header(app).text()


async def test_a_finished_replay_is_finished_not_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock(FROZEN_NOW)
    monkeypatch.setattr(app_module, "wall_clock", clock)
    session = session_from_recording()
    session.add_producer("replay", lambda: None)  # type: ignore[arg-type,return-value]
    session.status["replay"] = "done"
    app = build_app(session, Settings(), run_session=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        clock.t += 30
        app.refresh_view()
        await pilot.pause()
        d = _header(app).data
        assert d.finished == "replay finished" and d.stale_s is None
        text = _header(app).text()
        assert "FINISHED" in text and "replay finished" in text and "no data" not in text


@pytest.mark.slow
async def test_duration_reached_is_finished_not_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock(FROZEN_NOW)
    monkeypatch.setattr(app_module, "wall_clock", clock)

    class Short(Settings):
        duration = 0.3

    session = session_from_recording()
    app = build_app(session, Short(), run_session=True)   # no producers: run() waits for stop(), which --duration calls
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause(0.8)
        clock.t += 20
        app.refresh_view()
        await pilot.pause()
        d = _header(app).data
        assert d.finished == "--duration 0.3 s reached" and d.stale_s is None
        assert "no data" not in _header(app).text()


async def test_hiding_the_event_log_keeps_the_key_footer() -> None:
    from textual.widgets import Footer

    app = build_app(session_from_recording(), Settings(), run_session=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await pilot.press("e")
        await pilot.pause()
        footer = app.screen.query_one(Footer)
        widget, _ = app.screen.get_widget_at(2, 23)    # what the screen's last line shows
        assert widget is footer or footer in widget.ancestors


# ---------------------------------------------------------------------------------------------- failures

async def test_failed_requests_say_why_in_the_panel_the_log_and_the_help() -> None:
    from kvtop.ui.panels.events import EventLog
    from kvtop.ui.panels.help import HelpScreen
    from kvtop.ui.panels.requests import RequestPanel

    session = session_from_recording()
    last = session.model.now
    # An engine's error text with a screen-clearing escape and a clipboard write in it: shown without them.
    for i, err in enumerate(["prompt longer than max_seq_len (9000 > 8192)",
                             "out of KV blocks\x1b[2J\x1b]52;c;aGk=\x07 after 3 retries\n(request 7)"]):
        session.emit(make("request", {"request_id": 10_000 + i, "ok": False, "error": err, "prompt_tokens": 9000},
                          source=session.source, time=last + 0.1 * (i + 1)))
    app = build_app(session, Settings(), run_session=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        panel = app.screen.query_one(RequestPanel).text()
        assert "failed 2" in panel and "out of KV blocks after 3 retries (request 7)"[:20] in panel
        assert "\x1b" not in panel and "\x07" not in panel
        log = "\n".join(line.text for line in app.screen.query_one(EventLog).lines)
        assert "2 requests failed: out of KV blocks after 3 retries (request 7)" in log
        await pilot.press("question_mark")
        await pilot.pause()
        assert isinstance(app.screen, HelpScreen)
        help_text = str(app.screen.query_one("#help-text").render())
        assert "Last error (2 failed): out of KV blocks after 3 retries (request 7)" in help_text
        assert "\x1b" not in help_text


def test_clean_strips_escapes_and_controls() -> None:
    from kvtop.ui.format import clean

    assert clean("a\x1b[31mred\x1b[0m b\x1b]0;title\x07c\x00d\x7f\x9b2Je\tf\r\ng") == "ared bcde f  g"
    assert len(clean("x" * 1000, limit=50)) == 50


@pytest.mark.slow
async def test_200x60_uses_the_room() -> None:
    """200x60 uses its room for legibility, not for blank rows: three-row tier bars with their share in big digits,
    a tall hit-rate chart, two-row move sparklines, a wider memory bar; no panel of the two columns more than a
    third blank (the memory panel was 6 blank rows of 8, the per-priority one 8 of 11), the log 8 lines."""
    from kvtop.ui.panel import Panel
    from kvtop.ui.panels.events import EventLog
    from kvtop.ui.panels.hit_rate import HitRatePanel, big_figure
    from kvtop.ui.panels.memory import MemoryPanel
    from kvtop.ui.panels.priority import PriorityPanel
    from kvtop.ui.panels.sources import SourcesPanel

    app = build_app(session_from_recording(), Settings(), run_session=False)
    async with app.run_test(size=(200, 60)) as pilot:
        await pilot.pause()
        assert app.screen.has_class("-xl") and app.screen.has_class("-wide")
        assert app.layout.spark_points == 600
        assert app.screen.query_one(SourcesPanel).display              # the table, for one source
        assert app.screen.query_one(PriorityPanel).display
        assert app.screen.query_one(EventLog).region.height == 8
        prio = app.screen.query_one(PriorityPanel).text()
        assert "GiB GPU" in prio and "hit host" in prio
        # Priority 80: 136 GPU blocks of 4.5 MiB = 0.60 GiB, its requests' hits all from the GPU (72%).
        row80 = next(line for line in prio.splitlines() if line.strip().startswith("80"))
        assert "0.60" in row80 and row80.count("72%") == 2
        gpu = _panel(app, "gpu").text().splitlines()
        # the bar three rows thick, "25%" beside it in big digits, 90 cells wide or more
        for line, glyphs in zip(gpu[:3], big_figure("25%")):
            assert line.lstrip().startswith("█") and glyphs in line
            assert line.count("█") + line.count("▓") + line.count("░") >= 90
        assert "in use %" in _panel(app, "gpu").text() and "cached %" in _panel(app, "host").text()
        hit = app.screen.query_one(HitRatePanel).text().splitlines()
        assert "8s" in hit[-3] and sum(1 for line in hit if set(line.strip()) & set("▁▂▃▄▅▆▇█")) >= 4
        memory = app.screen.query_one(MemoryPanel).text()
        assert memory.count("█") + memory.count("░") >= 30
        for column in ("#left", "#right"):
            for panel in app.screen.query_one(column).query(Panel):
                if not panel.display:
                    continue
                lines = panel.text().splitlines()
                blank = sum(1 for line in lines if not line.strip())
                assert blank * 3 <= len(lines), (panel.id, blank, len(lines))
        await pilot.resize_terminal(120, 40)
        await pilot.pause()
        assert not app.screen.has_class("-xl") and app.layout.spark_points == 120
        assert not app.screen.query_one(SourcesPanel).display
        # the wide layout's one-row bar, its share beside it
        assert _panel(app, "gpu").text().splitlines()[0].rstrip().endswith("25% in use")


async def test_the_palettes_screenshot_goes_to_the_working_directory(tmp_path: Any, monkeypatch: pytest.MonkeyPatch
                                                                     ) -> None:
    from kvtop.ui.panels.events import EventLog

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path / "no-home"))   # no ~/Downloads anywhere
    app = build_app(session_from_recording(), Settings(), run_session=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert titles.count("Screenshot") == 1
        path = app.action_screenshot_here()
        await pilot.pause()
        assert path is not None and path.startswith(str(tmp_path)) and path.endswith(".svg")
        assert (tmp_path / path.split("/")[-1]).read_text().startswith("<svg")
        log = "\n".join(line.text for line in app.screen.query_one(EventLog).lines)
        assert f"screenshot saved: {path}" in log


@pytest.mark.slow
async def test_the_help_scrolls_where_it_is_taller_than_the_screen() -> None:
    app = build_app(session_from_recording(), Settings(), run_session=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await pilot.press("question_mark")
        await pilot.pause()
        scroll = app.screen.query_one("#help-scroll")
        assert app.screen.focused is scroll and scroll.max_scroll_y > 0
        await pilot.press("end")
        await pilot.pause()
        assert scroll.scroll_y == scroll.max_scroll_y     # the last lines can be reached


def test_a_small_share_is_never_shown_as_none() -> None:
    assert TierPanel._share(8, 6781) == "<1%" and TierPanel._share(0, 6781) == "0%"
    assert TierPanel._share(34, 6781) == "1%" and TierPanel._share(None, 10) == "?"


async def test_no_host_cache_says_so_in_a_small_panel() -> None:
    from recordings import BUSY_RECORDING, FROZEN_STARTED_AT

    from kvtop.records import SourceId, read_jsonl
    from kvtop.session import Session

    source = SourceId(host="sim", rank=0, run="busy")
    session = Session(source=source)
    session.emit(make("meta", {"engine": "sim", "model": "Qwen/Qwen3-8B", "tokens_per_block": 32,
                               "primary_blocks": 256, "secondary_blocks": 0, "bytes_per_block": 4718592},
                      source=source, time=FROZEN_STARTED_AT - 3600))
    for rec in read_jsonl(BUSY_RECORDING):
        if not isinstance(rec, Exception) and rec.kind == "stats":
            session.emit(rec)
    app = build_app(session, Settings(), run_session=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        host = _panel(app, "host")
        assert host.text().splitlines()[:2] == [" host: none (host_cache_size = 0)",
                                                " evicted GPU blocks are dropped"]
        assert host.region.height == 4 and _panel(app, "gpu").region.height == 6
