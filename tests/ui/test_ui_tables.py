"""Tables an operator can work with (issue 24, item 2): the sources table sorts by any column (o, O, a click on its
header), filters with / (Enter keeps, Escape clears), moves its cursor (j/k, a click) and opens a row (Enter, a
double click) into the big panels. Each flow through Textual's pilot, checked against the sources' own figures."""

from __future__ import annotations

import random
from typing import Any

import pytest
from recordings import Messages

from kvtop.records import SourceId, make
from kvtop.session import Session
from kvtop.ui.app import KvtopApp, build_app
from kvtop.ui.panels.sources import SourcesPanel
from kvtop.ui.panels.tier import TierPanel
from kvtop.ui.table import TableState, arrange, cursor_index

pytestmark = pytest.mark.usefixtures("frozen_ui_clock")  # tests/conftest.py

T0 = 1764430000.0
N = 12


class Settings:
    refresh = 0.25
    theme = "dark"
    duration = None


def _stats(it: int, free: int, reused: int, missed: int) -> dict[str, Any]:
    return {"iter": it, "numActiveRequests": 1, "numQueuedRequests": 0, "numCompletedRequests": 0,
            "kvCacheStats": {"maxNumBlocks": 100, "freeNumBlocks": free, "usedNumBlocks": 100 - free,
                             "tokensPerBlock": 32, "allocTotalBlocks": reused + missed, "allocNewBlocks": missed,
                             "reusedBlocks": reused, "missedBlocks": missed}}


def fleet(n: int = N, seed: int = 7) -> tuple[Session, dict[str, float | None]]:
    """``n`` sources named node-00 .. in arrival order, each with its own hit rate (hits / 100 lookups, shuffled;
    the last source looked nothing up: no hit rate) and its own GPU use (free blocks 99 - i)."""
    rates = list(range(5, 5 + 7 * n, 7))
    random.Random(seed).shuffle(rates)
    ids = [SourceId(f"node-{i:02d}", 0, "r") for i in range(n)]
    session = Session(source=ids[0])
    hit: dict[str, float | None] = {}
    for i, src in enumerate(ids):
        looked = i != n - 1
        session.emit(make("kv_event", {"event_id": 0, "data": {"type": "created",
                                                               "num_blocks_per_cache_level": [100, 50]},
                                       "window_size": 4096}, src, T0))
        reused = rates[i] if looked else 0
        session.emit(make("stats", _stats(0, 99 - i, 0, 0), src, T0))
        session.emit(make("stats", _stats(1, 99 - i, reused, 100 - reused if looked else 0), src, T0 + 2))
        hit[src.key()] = reused / 100 if looked else None
    return session, hit


def _panel(app: KvtopApp) -> SourcesPanel:
    return app.screen.query_one(SourcesPanel)


def _keys(app: KvtopApp) -> list[str]:
    return [r.key for r in _panel(app).data.rows]


def _shown_source(app: KvtopApp) -> str:
    return str(app.screen.query_one("#header").data.source_label).split(" ", 1)[1]


# ------------------------------------------------------------------------------------------------ pure rules

def test_arrange_sorts_unknown_last_either_way_and_keeps_ties_in_order() -> None:
    rows = [("a", 3), ("b", None), ("c", 5), ("d", 3), ("e", 1)]
    values = {"v": lambda r: r[1], "key": lambda r: r[0]}
    state = TableState()
    assert arrange(rows, state, values, lambda r: r[0]) == rows   # no sort: their own order
    state.sort_by("v")
    assert [r[0] for r in arrange(rows, state, values, lambda r: r[0])] == ["c", "a", "d", "e", "b"]
    state.sort_by("v")   # again: the other way, the unknown one still last, the tie still a before d
    assert [r[0] for r in arrange(rows, state, values, lambda r: r[0])] == ["e", "a", "d", "c", "b"]
    state.sort_by("key", text_columns=("key",))   # a name: A to Z first
    assert [r[0] for r in arrange(rows, state, values, lambda r: r[0])] == ["a", "b", "c", "d", "e"]
    state.filter = "  C "
    assert arrange(rows, state, values, lambda r: r[0].upper()) == [("c", 5)]


def test_the_sort_key_steps_through_the_columns_then_back_to_arrival_order() -> None:
    state = TableState()
    seen = []
    for _ in range(4):
        state.sort_next(("hit", "ttft", "key"), text_columns=("key",))
        seen.append((state.sort, state.descending))
    assert seen == [("hit", True), ("ttft", True), ("key", False), (None, True)]
    assert state.to_text() == ""
    state.sort_by("ttft")
    state.reverse()
    assert state.to_text() == "ttft"
    other = TableState()
    assert other.from_text("-hit", ("hit",)) and (other.sort, other.descending) == ("hit", True)
    assert not other.from_text("nope", ("hit",)) and other.sort == "hit"


def test_the_cursor_stays_on_its_row_and_falls_back_when_it_is_filtered_out() -> None:
    state = TableState(cursor="b")
    assert cursor_index(["a", "b", "c"], state) == 1
    assert cursor_index(["c", "b", "a"], state) == 1
    assert cursor_index(["a", "c"], state, fallback="c") == 1
    assert cursor_index(["a", "c"], state) == 0
    assert cursor_index([], state) == -1
    assert cursor_index(["c", "b"], TableState(), fallback="b") == 0   # no cursor row: the top one


# ------------------------------------------------------------------------------------------------ the app

async def test_o_sorts_the_sources_by_hit_rate_highest_first_and_O_reverses() -> None:
    session, hit = fleet()
    hook = Messages()
    app = build_app(session, Settings(), run_session=False)
    async with app.run_test(size=(120, 40), message_hook=hook) as pilot:
        await pilot.pause()
        assert _keys(app) == [f"node-{i:02d}/0/r" for i in range(N)]   # arrival order until sorted
        await pilot.press("o")
        await pilot.pause()
        keys = _keys(app)
        known = sorted((k for k in hit if hit[k] is not None), key=lambda k: -hit[k])  # type: ignore[operator]
        assert keys == [*known, f"node-{N - 1:02d}/0/r"]     # highest first, no hit rate last
        assert keys[0] == max(known, key=lambda k: hit[k])  # type: ignore[arg-type,return-value]
        assert [r.hit_window for r in _panel(app).data.rows[:3]] == pytest.approx(
            [hit[k] for k in keys[:3]])
        lines = _panel(app).text().splitlines()
        assert "▼hit win" in lines[0]
        assert keys[0] in lines[1] and f"{100 * hit[keys[0]]:.1f}%" in lines[1]  # type: ignore[operator]
        assert "by hit win ▼" in str(_panel(app).border_title)
        await pilot.press("O")
        await pilot.pause()
        keys = _keys(app)
        assert keys == [*reversed(known), f"node-{N - 1:02d}/0/r"]
        assert "▲hit win" in _panel(app).text().splitlines()[0]
    assert [(m.column, m.descending) for m in hook.of(KvtopApp.TableSorted)] == [("hit_window", True),
                                                                                ("hit_window", False)]


async def test_clicking_a_header_sorts_by_it_and_again_reverses() -> None:
    session, _ = fleet()
    app = build_app(session, Settings(), run_session=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        panel = _panel(app)
        header = panel.text().splitlines()[0]
        x = header.index("GPU use/cch/cap")
        # the panel's region: its border (1 cell) then each line as text() has it (margin included)
        await pilot.click(SourcesPanel, offset=(1 + x + 2, 1))
        await pilot.pause()
        gpu = [r.gpu_in_use for r in panel.data.rows]
        assert gpu == sorted(gpu, reverse=True) and gpu[0] == 1 + N - 1   # node-11 uses 12 blocks
        await pilot.click(SourcesPanel, offset=(1 + x + 2, 1))
        await pilot.pause()
        assert [r.gpu_in_use for r in panel.data.rows] == sorted(gpu)
        await pilot.click(SourcesPanel, offset=(3, 1))   # "source": by name
        await pilot.pause()
        assert _keys(app) == sorted(_keys(app)) and panel.data.sort == "key"


async def test_slash_filters_to_one_source_and_enter_opens_it() -> None:
    session, _ = fleet()
    hook = Messages()
    app = build_app(session, Settings(), run_session=False)
    async with app.run_test(size=(120, 40), message_hook=hook) as pilot:
        await pilot.pause()
        assert _shown_source(app) == "node-00/0/r"
        await pilot.press("slash", *"de-07", "enter")
        await pilot.pause()
        assert _keys(app) == ["node-07/0/r"]
        assert "1 of 12 · /de-07" in str(_panel(app).border_title)
        assert not app.screen.query_one("#filter").display     # the line went; the keys are the dashboard's
        await pilot.press("enter")
        await pilot.pause()
        assert _shown_source(app) == "node-07/0/r"
        gpu = app.screen.query_one("#tier-gpu", TierPanel).data.state
        assert gpu == session.models["node-07/0/r"].gpu and gpu.in_use_blocks == 8
        assert _panel(app).data.selected == 0
        await pilot.press("slash", "escape")
        await pilot.pause()
        assert len(_keys(app)) == N and _panel(app).data.filter == ""
        await pilot.press("slash", *"zzz", "enter")
        await pilot.pause()
        assert _keys(app) == [] and "no source matches /zzz" in _panel(app).text()
    assert [m.text for m in hook.of(KvtopApp.TableFiltered)] == ["de-07", "", "zzz"]
    assert [m.source for m in hook.of(KvtopApp.SourceChanged)] == ["node-07/0/r"]


async def test_j_k_move_the_cursor_and_enter_opens_its_row() -> None:
    session, _ = fleet()
    app = build_app(session, Settings(), run_session=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert _panel(app).data.cursor == 0
        await pilot.press("j", "j", "j", "k")
        await pilot.pause()
        assert _panel(app).data.cursor == 2
        assert _shown_source(app) == "node-00/0/r"   # moving is not opening
        await pilot.press("enter")
        await pilot.pause()
        assert _shown_source(app) == "node-02/0/r"
        assert app.screen.query_one("#tier-gpu", TierPanel).data.state.in_use_blocks == 3
        # sorted afresh, the cursor goes to the top row; the source shown keeps its mark wherever it went
        await pilot.press("o")
        await pilot.pause()
        d = _panel(app).data
        assert d.cursor == 0 and d.rows[d.selected].key == "node-02/0/r"
        for _ in range(N + 3):   # past the end: it stops on the last row
            await pilot.press("j")
        await pilot.pause()
        d = _panel(app).data
        assert d.cursor == N - 1 and d.rows[-1].hit_window is None


async def test_a_click_selects_a_row_and_a_double_click_opens_it() -> None:
    session, _ = fleet()
    app = build_app(session, Settings(), run_session=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        lines = _panel(app).text().splitlines()
        y = next(i for i, ln in enumerate(lines) if "node-03/0/r" in ln)
        await pilot.click(SourcesPanel, offset=(6, 1 + y))
        await pilot.pause()
        d = _panel(app).data
        assert d.rows[d.cursor].key == "node-03/0/r" and _shown_source(app) == "node-00/0/r"
        await pilot.click(SourcesPanel, offset=(6, 1 + y), times=2)
        await pilot.pause()
        assert _shown_source(app) == "node-03/0/r"


async def test_s_steps_down_the_table_as_it_is_sorted() -> None:
    session, hit = fleet()
    app = build_app(session, Settings(), run_session=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.press("o")
        await pilot.pause()
        order = _keys(app)
        await pilot.press("s")
        await pilot.pause()
        # node-00 (the one shown) is somewhere down the sorted table: s shows the row after it
        assert _shown_source(app) == order[order.index("node-00/0/r") + 1]


async def test_table_keys_without_a_table_say_so() -> None:
    from recordings import session_from_recording

    app = build_app(session_from_recording(), Settings(), run_session=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.press("o", "slash", "j", "enter")
        await pilot.pause()
        assert sum("no table on screen" in str(n.message) for n in app._notifications) == 2   # o and /
        assert not app.screen.query_one("#filter").display


async def test_a_table_sorted_before_its_figures_came_keeps_the_cursor_on_its_top_row() -> None:
    """Sorted by hit rate while no source had one yet (the first second of a fleet), the top row was just the first
    source; when the figures came the cursor must be on the new top row (the highest), not follow that source down."""
    ids = [SourceId(f"node-{i:02d}", 0, "r") for i in range(N)]
    session = Session(source=ids[0])
    for src in ids:
        session.emit(make("stats", _stats(0, 90, 0, 0), src, T0))
    app = build_app(session, Settings(), run_session=False)
    app.fleet.refresh_s = 0.0
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.press("o")
        await pilot.pause()
        assert all(r.hit_window is None for r in _panel(app).data.rows)
        for i, src in enumerate(ids):
            session.emit(make("stats", _stats(1, 90, 10 + 7 * i, 90 - 7 * i), src, T0 + 2))
        app.refresh_view()
        await pilot.pause()
        d = _panel(app).data
        assert d.rows[0].key == f"node-{N - 1:02d}/0/r" and d.cursor == 0
        assert f"node-{N - 1:02d}/0/r" in _panel(app).text().splitlines()[1]


# ------------------------------------------------------------------------------------------------ requests view

def _request(i: int) -> dict[str, Any]:
    """Request i: TTFT (37 i mod 101) ms, 2 + i % 5 reused blocks of which i % 3 from the host; every 10th failed."""
    if i % 10 == 9:
        return {"request_id": i, "ok": False, "prompt_tokens": 100 + i, "priority": 20,
                "error": f"TimeoutError: request {i} took too long\x1b[2J"}
    return {"request_id": i, "ok": True, "prompt_tokens": 100 + i, "output_tokens": 8,
            "ttft_s": (37 * i % 101) / 1000, "e2e_s": 0.5 + i / 100, "reused_blocks": 2 + i % 5,
            "host_hit_blocks": i % 3, "priority": 35 if i % 2 else 80}


def requests_session(n: int = 40) -> Session:
    src = SourceId("node-a", 0, "r")
    session = Session(source=src)
    session.emit(make("stats", _stats(0, 90, 0, 0), src, T0))
    for i in range(n):
        session.emit(make("request", _request(i), src, T0 + 1 + i * 0.1))
    running = [{"id": 900 + k, "stage": stage, "reusedBlocksPerRequest": 3, "numGeneratedTokens": k}
               for k, stage in enumerate(("CONTEXT_IN_PROGRESS", "GENERATION_IN_PROGRESS", "GENERATION_COMPLETE"))]
    session.emit(make("stats", {**_stats(1, 90, 0, 0), "requestStats": running}, src, T0 + 6))
    return session


def test_the_snapshot_carries_recent_and_in_flight_requests() -> None:
    from kvtop.tiers import TierModel
    from kvtop.tiers.requests import RECENT_REQUESTS

    session = requests_session()
    req = session.model.snapshot().requests
    assert [r.key for r in req.running] == ["900", "901"]          # the completed one is left to its record
    assert [r.state for r in req.running] == ["prefill", "decode"] and req.running[0].reused_blocks == 3
    assert len(req.recent) == 40 and req.recent[-1].key == "39"
    seven = next(r for r in req.recent if r.key == "7")
    assert (seven.reused_blocks, seven.host_blocks, seven.gpu_blocks, seven.disk_blocks) == (4, 1, 3, 0)
    assert seven.ttft_s == pytest.approx(0.057) and seven.priority == 35 and seven.state == "done"
    nine = next(r for r in req.recent if r.key == "9")
    assert nine.state == "failed" and nine.error.startswith("TimeoutError") and nine.ttft_s is None
    # bounded: the newest RECENT_REQUESTS
    m = TierModel()
    for i in range(RECENT_REQUESTS + 10):
        m.apply(make("request", _request(i), SourceId("a", 0, "r"), T0 + i))
    recent = m.snapshot().requests.recent
    assert len(recent) == RECENT_REQUESTS and recent[0].key == "10" and recent[-1].key == str(RECENT_REQUESTS + 9)
    # a bad requestStats is a bad record that names what was wrong, and changes nothing
    m.apply(make("stats", {"iter": 1, "requestStats": [{"id": None, "stage": "QUEUED"}]}, SourceId("a", 0, "r"),
                 T0 + 1000))
    snap = m.snapshot()
    assert snap.bad_records == 1 and "requestStats[0].id" in snap.last_bad_reason and snap.requests.running == ()


async def test_R_shows_the_requests_in_flight_then_newest_first_and_back() -> None:
    hook = Messages()
    app = build_app(requests_session(), Settings(), run_session=False)
    async with app.run_test(size=(120, 40), message_hook=hook) as pilot:
        await pilot.pause()
        await pilot.press("R")
        await pilot.pause()
        from kvtop.ui.panels.requests_table import RequestsTable

        table = app.screen.query_one(RequestsTable)
        assert app.screen.has_class("-reqs") and table.display
        assert not app.screen.query_one("#left").display
        assert [r.key for r in table.data.rows][:5] == ["900", "901", "39", "38", "37"]
        lines = table.text().splitlines()
        assert lines[0].split()[:4] == ["request", "state", "prompt", "reused"]
        row = next(ln for ln in lines if ln.split()[0] == "37").split()
        # id, state, prompt, reused, GPU, host, disk, TTFT, e2e, priority: 2 + 37 % 5 reused, 37 % 3 from the host
        assert row == ["37", "done", "137", "4", "3", "1", "0", "56", "ms", "870", "ms", "35"]
        failed = next(ln for ln in lines if ln.split()[0] == "39")
        assert "failed" in failed and "TimeoutError: request 39" in failed and "\x1b" not in failed
        assert next(ln for ln in lines if ln.split()[0] == "900").split()[:4] == ["900", "prefill", "?", "3"]
        await pilot.press("R")
        await pilot.pause()
        assert not app.screen.has_class("-reqs") and app.screen.query_one("#left").display
    assert [m.shown for m in hook.of(KvtopApp.RequestsToggled)] == [True, False]


async def test_the_requests_view_sorts_filters_and_opens_a_row() -> None:
    from kvtop.ui.panels.requests_table import RequestsTable

    app = build_app(requests_session(), Settings(), run_session=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.press("R", "o")
        await pilot.pause()
        table = app.screen.query_one(RequestsTable)
        rows = table.data.rows
        ttfts = [(37 * i % 101) / 1000 for i in range(40) if i % 10 != 9]
        assert rows[0].ttft_s == pytest.approx(max(ttfts)) and rows[0].key == str(
            max((i for i in range(40) if i % 10 != 9), key=lambda i: 37 * i % 101))
        assert [r.ttft_s for r in rows[:len(ttfts)]] == pytest.approx(sorted(ttfts, reverse=True))
        assert all(r.ttft_s is None for r in rows[len(ttfts):])   # failed and in flight: no TTFT, last
        assert "by TTFT ▼" in str(table.border_title)
        # a click on the "host" header: most host blocks first
        header = table.text().splitlines()[0]
        await pilot.click(RequestsTable, offset=(1 + header.index("host") + 1, 1))
        await pilot.pause()
        assert table.data.sort == "host" and table.data.rows[0].host_blocks == 2
        await pilot.press("slash", *"timeout", "enter")
        await pilot.pause()
        assert [r.key for r in table.data.rows] == ["39", "29", "19", "9"]   # no host figure: newest first
        await pilot.press("j", "enter")
        await pilot.pause()
        said = [str(n.message) for n in app._notifications]
        assert any(s.startswith("request 29: failed") and "TimeoutError: request 29" in s for s in said)


# ------------------------------------------------------------------------------------------------ remembered

class FileSettings(Settings):
    def __init__(self, path: Any) -> None:
        self.config_file = str(path)


async def test_the_theme_and_layout_chosen_are_remembered_in_the_settings_file(tmp_path: Any) -> None:
    import tomllib

    from kvtop.settings import load_settings

    path = tmp_path / "kvtop" / "kvtop.toml"
    path.parent.mkdir()
    path.write_text("# my settings\nrefresh = 0.5  # half a second\nmodel = \"Qwen/Qwen3-8B\"\n\n[ui]\nmine = 3\n")
    session, hit = fleet()
    app = build_app(session, FileSettings(path), run_session=False, config_file=str(path))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.press("t", "e", "o", "O", "R", "o")
        await pilot.pause()
        assert app.remembered.problem is None
    data = tomllib.loads(path.read_text())
    assert data == {"refresh": 0.5, "model": "Qwen/Qwen3-8B", "theme": "light",
                    "ui": {"mine": 3, "events": False, "view": "requests", "sources_sort": "hit_window",
                           "requests_sort": "-ttft"}}
    assert path.read_text().startswith("# my settings\nrefresh = 0.5  # half a second\n")   # lines kept
    assert load_settings(config_path=path, environ={}).theme == "light"   # the [ui] table is the dashboard's
    # ...and the next dashboard opens as this one was left
    again = build_app(session, FileSettings(path), run_session=False, config_file=str(path))
    async with again.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert again.screen.has_class("-reqs") and not again.show_events
        assert (again.fleet.table.sort, again.fleet.table.descending) == ("hit_window", False)
        assert (again.req_view.table.sort, again.req_view.table.descending) == ("ttft", True)
        await pilot.press("R")
        await pilot.pause()
        lowest = min((k for k in hit if hit[k] is not None), key=lambda k: hit[k])  # type: ignore[arg-type,return-value]
        assert _keys(again)[0] == lowest


async def test_a_settings_file_that_cannot_be_written_is_said_and_the_dashboard_goes_on(tmp_path: Any) -> None:
    blocker = tmp_path / "config"
    blocker.write_text("a file where the config folder should be")
    path = blocker / "kvtop" / "kvtop.toml"   # its folder cannot be made (as root too)
    app = build_app(fleet()[0], FileSettings(path), run_session=False, config_file=str(path))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.press("e", "e", "o")
        await pilot.pause()
        assert app.remembered.problem is not None and "cannot save to" in app.remembered.problem
        log = [ln.text for ln in app.screen.query_one("#events").lines]
        assert any(t.startswith("not remembered: settings file: cannot save to") for t in log)
        toasts = [str(n.message) for n in app._notifications if "cannot remember" in str(n.message)]
        assert len(toasts) == 1   # one toast per reason, however often it fails
        assert app.show_events and app.fleet.table.sort == "hit_window"   # the choices themselves took effect
    assert blocker.read_text().startswith("a file where")
    # a missing config folder is made
    deep = tmp_path / "new" / "kvtop" / "kvtop.toml"
    app = build_app(fleet()[0], FileSettings(deep), run_session=False, config_file=str(deep))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await pilot.press("R")
        await pilot.pause()
    assert 'view = "requests"' in deep.read_text()


async def test_choices_the_dashboard_cannot_use_are_said_and_the_rest_used(tmp_path: Any) -> None:
    path = tmp_path / "kvtop.toml"
    path.write_text('refresh = 0.5\n[ui]\nview = "sideways"\nsources_sort = "-nope"\nevents = false\n')
    app = build_app(fleet()[0], FileSettings(path), run_session=False, config_file=str(path))
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        log = [ln.text for ln in app.screen.query_one("#events").lines]
        assert any("[ui] view = 'sideways' (dashboard or requests): ignored" in t for t in log)
        assert any("[ui] sources_sort = '-nope'" in t for t in log)
        assert not app.show_events and not app.screen.has_class("-reqs") and app.fleet.table.sort is None


async def test_the_palette_has_the_requests_view_and_the_tables_commands() -> None:
    from textual.command import CommandPalette

    app = build_app(fleet()[0], Settings(), run_session=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        titles = [c.title for c in app.get_system_commands(app.screen)]
        assert {"Requests view", "Sort table", "Filter table"} <= set(titles)
        await pilot.press("ctrl+p")
        await pilot.pause()
        assert isinstance(app.screen, CommandPalette)
        await pilot.press(*"requests view")
        await pilot.pause(0.3)
        await pilot.press("enter")
        await pilot.pause(0.1)
        assert app.req_view.shown and app.screen.has_class("-reqs")


@pytest.mark.slow
async def test_a_driven_runs_requests_view_lists_its_requests_in_flight_then_done() -> None:
    """kvtop's own run (the simulator, driven at 4 in flight): the view lists the driver's requests in flight (its
    ids, its prompt lengths) above the finished ones, and a request leaves the first list for the second."""
    import asyncio
    import time

    from kvtop import runner
    from kvtop.settings import load_settings
    from kvtop.ui.panels.requests_table import RequestsTable

    settings = load_settings({"engine": "sim", "concurrency": "4", "duration": "60"}, environ={})
    session = runner.build_session(settings, sample_gpu=False)
    app = build_app(session, Settings())
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.press("R")
        table = app.screen.query_one(RequestsTable)
        deadline = time.monotonic() + 60
        seen_running: set[str] = set()
        while time.monotonic() < deadline:
            await asyncio.sleep(0.25)
            rows = table.data.rows if table.data is not None else ()
            running = [r for r in rows if r.state == "running"]
            done = {r.key for r in rows if r.state == "done"}
            driver = session.driver.running
            for r in running:
                seen_running.add(r.key)
                if int(r.key) in driver:   # the table is a refresh old: a request may have finished since
                    assert r.prompt_tokens == driver[int(r.key)][1]
            assert not {r.key for r in running} & done
            if len(done) >= 8 and seen_running & done:
                break
        else:
            raise AssertionError(f"no request went from in flight to done: {seen_running}, {table.text()}")
        assert 1 <= len([r for r in table.data.rows if r.state == "running"]) <= 4
        assert table.data.rows[0].state == "running"   # in flight first
        await pilot.press("q")


async def test_small_screens_keep_the_tables_sort_and_filter_in_view() -> None:
    """80x24 draws the sources table without its title: the filter is in the key's header; 40x12 keeps the
    requests view's sorted column whole."""
    from recordings import fleet_session, session_from_recording

    from kvtop.ui.panels.requests_table import RequestsTable

    app = build_app(fleet_session(), Settings(), run_session=False)
    async with app.run_test(size=(80, 24)) as pilot:
        await pilot.pause()
        await pilot.press("slash", *"chat", "enter")
        await pilot.pause()
        header = _panel(app).text().splitlines()[0]
        assert header.split()[0] == "/chat" and len(_panel(app).data.rows) == 2
    app = build_app(session_from_recording(), Settings(), run_session=False)
    async with app.run_test(size=(40, 12)) as pilot:
        await pilot.pause()
        await pilot.press("R", "o")
        await pilot.pause()
        header = app.screen.query_one(RequestsTable).text().splitlines()[0]
        assert "▼TTFT" in header and "…" not in header and len(header) <= 40
