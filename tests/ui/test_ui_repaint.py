"""The repaint economy of the dashboard (bench/JOURNAL.md, "Dashboard cost"): what it skips must never show on screen.

A screen that was updated refresh by refresh (only the changed lines repainted, the unchanged panels' strips handed
to the compositor again) must look exactly like a screen drawn once, fresh, from the same data.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from recordings import BUSY_RECORDING, FROZEN_STARTED_AT
from textual.geometry import Region

from kvtop.records import SourceId, read_jsonl
from kvtop.session import Session
from kvtop.ui import panel as panel_module
from kvtop.ui import strip_reuse, views
from kvtop.ui.app import KvtopApp, build_app
from kvtop.ui.panel import Panel
from kvtop.ui.panels import header as header_panel
from kvtop.ui.strip_reuse import strip_cache_enabled

pytestmark = pytest.mark.usefixtures("frozen_ui_clock")  # tests/conftest.py


class Settings:
    refresh = 0.25
    theme = "dark"
    duration = None


def _session() -> Session:
    session = Session(source=SourceId(host="sim", rank=0, run="busy"))
    session.started_at = FROZEN_STARTED_AT
    return session


def _screen(app: KvtopApp) -> str:
    """The whole screen as the compositor would draw it from scratch (every widget's render_lines)."""
    return app.export_screenshot()


async def _fresh_screen(session: Session, size: tuple[int, int]) -> str:
    app = build_app(session, Settings(), run_session=False)
    async with app.run_test(size=size) as pilot:
        await pilot.press("e")  # the log differs by the keys pressed: compared without it
        await pilot.pause()
        return _screen(app)


@pytest.mark.slow
@pytest.mark.parametrize("size", [(120, 40), (80, 24)])
async def test_a_screen_updated_refresh_by_refresh_matches_a_fresh_one(size: tuple[int, int],
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    # The size advice's curve is read once per 5 s of model time, its optimum once per 60 s of wall time: both
    # read at every refresh here, so that the last refresh shows what a fresh screen computes from the same data.
    monkeypatch.setattr(views, "CURVE_EVERY_S", 1e-6)
    monkeypatch.setattr(views, "OPTIMUM_EVERY_S", 0.0)
    records = list(read_jsonl(BUSY_RECORDING))
    session = _session()
    cut = len(records) // 3
    for r in records[:cut]:
        session.emit(r)
    app = build_app(session, Settings(), run_session=False)
    async with app.run_test(size=size) as pilot:
        await pilot.press("e")
        await pilot.pause()
        first = _screen(app)
        step = max((len(records) - cut) // 12, 1)
        for i in range(cut, len(records), step):
            for r in records[i:i + step]:
                session.emit(r)
            app.refresh_view()
            await pilot.pause()
            if i == cut + 5 * step:
                for _ in range(3):  # a round of themes half way: every strip restyled, then back to dark
                    await pilot.press("t")
                    await pilot.pause()
        live = _screen(app)
    assert live != first  # the data moved on...
    assert live == await _fresh_screen(session, size)  # ...and what was repainted adds up to the whole


@pytest.mark.skipif(not strip_reuse.CACHE_RENDERS, reason=f"strip reuse off: {strip_reuse.STRIP_CACHE_REASON}")
async def test_an_unchanged_panel_hands_the_compositor_its_last_strips() -> None:
    session = _session()
    records = list(read_jsonl(BUSY_RECORDING))
    for r in records:
        session.emit(r)
    app = build_app(session, Settings(), run_session=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        memory: Panel = app.screen.query_one("#memory", Panel)
        region: Any = memory.outer_size.region  # the compositor asks for the whole panel, border and all
        strips = memory.render_lines(region)
        assert memory.render_lines(region) is strips  # nothing changed: no restyling of 8 lines
        memory.refresh()
        again = memory.render_lines(region)
        assert again is not strips and again == strips  # marked dirty: rendered again, to the same
        memory.refresh(Region(0, 1, 10, 1))  # one content row marked, as update_lines does
        once_more = memory.render_lines(region)
        made = [y for y, (a, b) in enumerate(zip(again, once_more)) if a is not b]
        assert made == [2]  # that row alone is made again (under the top border)...
        assert once_more == again  # ...exactly as Textual drew it



@pytest.mark.parametrize(("version", "env", "on"), [
    ("8.2.8", {}, True), ("7.0.0", {}, True), ("8.99.1", {}, True),
    ("6.12.0", {}, False), ("9.0.0", {}, False), ("0.80.1", {}, False), ("main", {}, False),
    ("8.2.8", {"KVTOP_UI_STRIP_CACHE": "0"}, False), ("8.2.8", {"KVTOP_UI_STRIP_CACHE": "off"}, False),
    ("8.2.8", {"KVTOP_UI_STRIP_CACHE": "1"}, True),
])
def test_the_private_strip_reuse_is_on_only_where_tested_and_not_switched_off(version: str, env: dict[str, str],
                                                                              on: bool) -> None:
    enabled, why = strip_cache_enabled(version, env)
    assert enabled is on
    assert (version in why) or ("KVTOP_UI_STRIP_CACHE" in why)


@pytest.mark.slow
def test_with_the_strip_reuse_off_the_public_path_draws_the_same_screen() -> None:
    """The fallback (Textual's public Line API alone) is the path any untested Textual gets: the screen updated
    refresh by refresh must match a fresh one there too, and not a line of the private hook may be installed."""
    repo = Path(__file__).resolve().parents[2]
    env = {**os.environ, "KVTOP_UI_STRIP_CACHE": "0", "PYTHONPATH": str(repo)}
    probe = subprocess.run(
        [sys.executable, "-c", "from kvtop.ui.panel import Panel\nfrom kvtop.ui.strip_reuse import CACHE_RENDERS\n"
         "from kvtop.ui.strip_reuse import StripReuse\nfrom textual.widget import Widget\n"
         "print(CACHE_RENDERS, issubclass(Panel, StripReuse), Panel.render_lines is not Widget.render_lines)"],
        cwd=repo, env=env, capture_output=True, text=True, timeout=120)
    assert probe.stdout.split() == ["False", "False", "False"], probe.stderr
    out = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", f"{__file__}::"
         "test_a_screen_updated_refresh_by_refresh_matches_a_fresh_one",
         f"{__file__}::test_an_unchanged_panel_hands_the_compositor_its_last_strips",
         f"{__file__}::test_what_the_terminal_is_sent_adds_up_to_the_screen"],
        cwd=repo, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-2000:]
    assert "3 passed, 1 skipped" in out.stdout


def test_the_declared_textual_floor_is_the_one_ci_tests_and_the_reuse_starts_at() -> None:
    """pyproject.toml's textual>=X, the floor .ci/run runs the UI tests on, and the strip reuse's first release
    are one number: a floor moved in one place only would claim a range nothing tests."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+

    repo = Path(__file__).resolve().parents[2]
    deps = tomllib.loads((repo / "pyproject.toml").read_text())["project"]["dependencies"]
    floor = next(re.fullmatch(r"textual>=(\d+)\.(\d+)", d) for d in deps if d.startswith("textual"))
    assert floor is not None
    ci = re.search(r"^TEXTUAL_FLOOR=(\d+)\.(\d+)\.\d+$", (repo / ".ci" / "run").read_text(), re.M)
    assert ci is not None
    assert (int(floor[1]), int(floor[2])) == (int(ci[1]), int(ci[2])) == strip_reuse.STRIP_CACHE_TEXTUAL[0]


def test_the_version_check_reads_textuals_own_version() -> None:
    from importlib.metadata import version

    assert strip_reuse.installed_textual_version() == version("textual")
    assert strip_reuse.STRIP_CACHE_REASON.endswith(version("textual")) or not strip_reuse.CACHE_RENDERS


def _write(grid: list[list[Any]], y: int, x: int, strips: Any) -> None:
    """Strips written from cell (x, y) on, one cell at a time (what a terminal keeps of them)."""
    for strip in strips:
        for text, style, _ in strip:
            for ch in text:
                grid[y][x] = (ch, style)
                x += 1


@pytest.mark.slow
async def test_what_the_terminal_is_sent_adds_up_to_the_screen() -> None:
    """Rows are written only up to their last changed cell (update_lines' regions, the crops seeded in
    strip_reuse.seed_crop): a terminal that applied every update as sent must hold exactly the screen drawn fresh."""
    from textual._compositor import ChopsUpdate, Compositor, LayoutUpdate

    records = list(read_jsonl(BUSY_RECORDING))
    session = _session()
    cut = len(records) // 3
    for r in records[:cut]:
        session.emit(r)
    width, height = 120, 40
    grid: list[list[Any]] = [[(" ", None)] * width for _ in range(height)]
    sent = {"partial": 0, "cropped": 0}
    render_update = Compositor.render_update

    def apply(self: Compositor, *args: Any, **kwargs: Any) -> Any:
        update = render_update(self, *args, **kwargs)
        if isinstance(update, LayoutUpdate):
            for y, line in enumerate(update.strips, update.region.y):
                _write(grid, y, update.region.x, line)
        elif isinstance(update, ChopsUpdate):   # as ChopsUpdate.render_segments writes it
            sent["partial"] += 1
            for y, x1, x2 in update.spans:
                for end, (x, strip) in zip(update.chop_ends[y], update.chops[y].items()):
                    if strip is None or x > x2 or end <= x1:
                        continue
                    if not (x2 > x >= x1 and end <= x2):
                        strip = strip.crop(0, min(end, x2) - x)
                        sent["cropped"] += 1
                    _write(grid, y, x, [strip])
        return update

    app = build_app(session, Settings(), run_session=False)
    Compositor.render_update = apply  # type: ignore[method-assign]
    try:
        async with app.run_test(size=(width, height)) as pilot:
            await pilot.pause()
            step = max((len(records) - cut) // 40, 1)
            for i in range(cut, len(records), step):
                for r in records[i:i + step]:
                    session.emit(r)
                app.refresh_view()
                await pilot.pause()
            fresh = app.screen._compositor.render_strips()
    finally:
        Compositor.render_update = render_update  # type: ignore[method-assign]
    expected: list[list[Any]] = [[(" ", None)] * width for _ in range(height)]
    for y, strip in enumerate(fresh):
        _write(expected, y, 0, [strip])
    assert sent["partial"] > 20 and sent["cropped"] > 20  # rows were sent in part...
    assert grid == expected  # ...and what the terminal holds is the screen


def test_a_row_strip_is_a_strip_in_everything_but_when_it_makes_its_caches() -> None:
    """strip_reuse.RowStrip (a changed row's strip, its caches made on first use) against Textual's Strip made from the
    same segments: every read the compositor and the writer make, and the crops and divisions they keep."""
    from rich.console import Console
    from rich.segment import Segment
    from rich.style import Style
    from textual.strip import Strip

    if strip_reuse.CACHE_RENDERS:
        # this Textual takes the lean strip
        assert strip_reuse.row_strip_fits() and strip_reuse.ROW_STRIP is strip_reuse.RowStrip
    red, dim = Style(color="red", bold=True), Style(color="#808080", bgcolor="#101010")
    segments = [Segment("│", dim), Segment(" GPU ", red), Segment("██▌", red), Segment(" 12.3k", dim),
                Segment("  ", None), Segment("│", dim)]
    width = sum(s.cell_length for s in segments)
    lean, plain = strip_reuse.RowStrip(list(segments), width), Strip(list(segments), width)
    console = Console(color_system="truecolor", width=width)
    assert list(lean) == list(plain) and lean.cell_length == plain.cell_length == width and lean.text == plain.text
    assert lean.render(console) == plain.render(console)
    for cuts in ([3], [1, 9], [width], [4, 6, width]):
        assert [list(s) for s in lean.divide(cuts)] == [list(s) for s in plain.divide(cuts)]
        assert lean.divide(cuts) is lean.divide(cuts)  # kept, as Strip keeps them
    for start, end in ((0, 5), (2, 9), (0, width), (7, width)):
        assert list(lean.crop(start, end)) == list(plain.crop(start, end))
        assert lean.crop(start, end) is lean.crop(start, end)
    assert list(lean.apply_style(dim)) == list(plain.apply_style(dim))
    assert list(lean.extend_cell_length(width + 3, dim)) == list(plain.extend_cell_length(width + 3, dim))
    assert list(lean.crop_extend(1, width + 2, dim)) == list(plain.crop_extend(1, width + 2, dim))
    assert lean.link_ids == plain.link_ids
    strip_reuse.seed_crop(lean, list(segments), 8)  # the crop the writer asks for, seeded from the segments in hand
    assert list(lean.crop(0, 8)) == list(plain.crop(0, 8))
    with pytest.raises(AttributeError):
        lean.no_such_cache  # noqa: B018 - only Strip's own caches are made on demand


async def test_the_header_is_built_again_only_when_what_it_shows_changes() -> None:
    """A busy refresh's header data differ only by their clocks 3 refreshes in 4: same_header skips the build for
    those; wherever it says 'same', the header built from the new data is the one on screen."""
    import dataclasses
    import random

    session = _session()
    for r in list(read_jsonl(BUSY_RECORDING))[:400]:
        session.emit(r)
    app = build_app(session, Settings(), run_session=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        header = app.screen.query_one("#header", header_panel.HeaderBar)
        base = header.data
        assert isinstance(base, header_panel.HeaderData) and base.data_time is not None and base.uptime_s is not None
        rng = random.Random(15)
        skipped = built = 0
        for _ in range(300):
            t0 = rng.uniform(0, 5)
            data = dataclasses.replace(base, uptime_s=base.uptime_s + t0, data_time=base.data_time + t0,
                                       paused=rng.random() < 0.1)
            data = dataclasses.replace(data, paused_at=data.data_time - 1.3 if data.paused else None)
            header.show(data)
            shown = list(header._lines)
            header.update_lines(full=True)  # the same data drawn afresh
            assert header._lines == shown
            step = rng.choice([0.0, 0.1, 0.24, 0.26, 0.6, 1.0, 2.5])
            nxt = dataclasses.replace(data, uptime_s=data.uptime_s + step, data_time=data.data_time + step,
                                      paused_at=data.paused_at)
            if rng.random() < 0.2:
                nxt = dataclasses.replace(nxt, flags=("counts ≈",))
            changed = header.show(nxt)
            assert header.data is nxt
            skipped += not changed
            built += changed
            shown = list(header._lines)
            header.update_lines(full=True)
            assert header._lines == shown  # skipped or not, the screen holds what the new data draws
            assert header_panel.same_header(data, nxt) is (not changed)
        assert skipped > 50 and built > 50
        assert not header_panel.same_header(base, dataclasses.replace(base, data_time=base.data_time + 1.0))
        assert not header_panel.same_header(base, dataclasses.replace(base, uptime_s=None))
        assert not header_panel.same_header(base, dataclasses.replace(base, data_time=float("nan")))


@pytest.mark.slow
async def test_a_panels_kept_parts_emptied_as_it_draws_change_nothing_on_screen(monkeypatch: Any) -> None:
    """Panel._segments keeps each (text, style) part's segment with the resolved styles, and empties them all
    past PART_CACHE: kept a few parts at a time (emptied several times a row), the terminal still holds the
    screen drawn fresh."""
    monkeypatch.setattr(panel_module, "PART_CACHE", 5)
    await test_what_the_terminal_is_sent_adds_up_to_the_screen()
