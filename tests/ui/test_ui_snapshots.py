"""Snapshots of the screen: each theme at 200x60, 120x40, 80x24 and 40x12, on the committed busy recording, time
frozen: kvtop's colour code (GPU, host and disk one colour each, kvtop/palette.py) in all three themes.

Regenerate after a deliberate change with ``pytest tests/ui/test_ui_snapshots.py --snapshot-update`` and look at
every SVG in ``tests/ui/__snapshots__/test_ui_snapshots/`` before committing them.
"""

from __future__ import annotations

import pytest

pytest.importorskip("pytest_textual_snapshot", reason="pip install pytest-textual-snapshot==1.1.0")

from recordings import (  # noqa: E402
    BUSY_RECORDING,
    FROZEN_NOW,
    FROZEN_STARTED_AT,
    fleet_session,
    session_from_recording,
)
from textual.pilot import Pilot  # noqa: E402

from kvtop.records import SourceId, make, read_jsonl  # noqa: E402
from kvtop.session import Session  # noqa: E402
from kvtop.ui.app import build_app  # noqa: E402

SIZES = {"200x60": (200, 60), "120x40": (120, 40), "80x24": (80, 24), "40x12": (40, 12)}
THEMES = ("dark", "light", "high-contrast")


pytestmark = pytest.mark.usefixtures("frozen_ui_clock")  # tests/conftest.py


class Settings:
    refresh = 0.25
    duration = None

    def __init__(self, theme: str):
        self.theme = theme


def _session() -> Session:
    session = session_from_recording(BUSY_RECORDING)
    # Two session log lines, one repeated: the event log shows its aggregation. Times are fixed, not time.time().
    session.log.append((FROZEN_NOW - 20, "info", "nvml: no NVIDIA driver: NVML library (libnvidia-ml.so.1) not found"))
    for i in range(3):
        session.log.append((FROZEN_NOW - 10 + i, "warn", f"request {100 + i} failed: prompt longer than max_seq_len"))
    return session


@pytest.mark.slow
@pytest.mark.parametrize("theme", THEMES)
@pytest.mark.parametrize("size", list(SIZES))
def test_dashboard(snap_compare, theme: str, size: str) -> None:
    app = build_app(_session(), Settings(theme), run_session=False)
    assert snap_compare(app, terminal_size=SIZES[size])


def test_help(snap_compare) -> None:
    app = build_app(_session(), Settings("dark"), run_session=False)
    assert snap_compare(app, press=["question_mark"], terminal_size=(120, 40))


def test_paused_with_the_log_hidden(snap_compare) -> None:
    app = build_app(_session(), Settings("high-contrast"), run_session=False)
    assert snap_compare(app, press=["p", "e"], terminal_size=(80, 24))


def test_unknown_host_tier(snap_compare) -> None:
    """A host pool with stats but no KV events: host occupancy reads "unknown", never 0."""
    source = SourceId(host="sim", rank=0, run="busy")
    session = Session(source=source)
    session.emit(make("meta", {"engine": "sim", "engine_version": "TensorRT-LLM 1.2 (simulated by kvtop)",
                               "model": "Qwen/Qwen3-8B", "gpu": "H200", "simulated": True,
                               "sim_reason": "no GPU: built-in simulator", "tokens_per_block": 32,
                               "primary_blocks": 256, "secondary_blocks": 227, "bytes_per_block": 4718592},
                      source=source, time=FROZEN_STARTED_AT - 3600))
    for rec in read_jsonl(BUSY_RECORDING):
        if not isinstance(rec, Exception) and rec.kind == "stats":
            session.emit(rec)
    session.started_at = FROZEN_STARTED_AT

    async def settle(pilot: Pilot) -> None:
        await pilot.pause()

    app = build_app(session, Settings("dark"), run_session=False)
    assert snap_compare(app, terminal_size=(80, 24), run_before=settle)


@pytest.mark.slow
@pytest.mark.parametrize("size", list(SIZES))
def test_fleet(snap_compare, size: str) -> None:
    """Three sources (one offline, left out of the aggregate), the second picked with `s`: the sources table."""
    session = fleet_session()
    session.status.update({"node-a/0/chat": "online", "node-b/1/chat": "online", "node-c/0/batch": "offline"})
    app = build_app(session, Settings("dark"), run_session=False)
    assert snap_compare(app, press=["s"], terminal_size=SIZES[size])


def test_stale(snap_compare, monkeypatch: pytest.MonkeyPatch) -> None:
    """A running session whose records stopped 8 s ago: the amber "no data 8s" alarm (the only one of the three
    states that is an alarm)."""
    from kvtop.ui import app as app_module

    async def later(pilot: Pilot) -> None:
        await pilot.pause()
        monkeypatch.setattr(app_module, "wall_clock", lambda: FROZEN_NOW + 8)
        pilot.app.refresh_view()
        await pilot.pause()

    app = build_app(_session(), Settings("dark"), run_session=False)
    assert snap_compare(app, terminal_size=(120, 40), run_before=later)


def test_finished(snap_compare, monkeypatch: pytest.MonkeyPatch) -> None:
    """A replay that reached its end, 30 s later: FINISHED with its reason, final figures, no stale alarm."""
    from kvtop.ui import app as app_module

    session = _session()
    session.add_producer("replay", lambda: None)  # type: ignore[arg-type,return-value]
    session.status["replay"] = "done"

    async def later(pilot: Pilot) -> None:
        await pilot.pause()
        monkeypatch.setattr(app_module, "wall_clock", lambda: FROZEN_NOW + 30)
        pilot.app.refresh_view()
        await pilot.pause()

    app = build_app(session, Settings("dark"), run_session=False)
    assert snap_compare(app, terminal_size=(80, 24), run_before=later)


@pytest.mark.slow
def test_paused(snap_compare) -> None:
    """Paused over a running engine: PAUSED (not an alarm colour), the frozen time, the key footer."""
    app = build_app(_session(), Settings("dark"), run_session=False)
    assert snap_compare(app, press=["p"], terminal_size=(120, 40))


@pytest.mark.parametrize("size", ["120x40", "80x24"])
def test_requests_view(snap_compare, size: str) -> None:
    """R: the busy run's recent requests, sorted by TTFT (o), the slowest first."""
    app = build_app(_session(), Settings("dark"), run_session=False)
    assert snap_compare(app, press=["R", "o"], terminal_size=SIZES[size])


def test_fleet_sorted_and_filtered(snap_compare) -> None:
    """The sources table sorted by hit rate (o) and filtered to the chat run (/chat Enter)."""
    app = build_app(fleet_session(), Settings("dark"), run_session=False)
    assert snap_compare(app, press=["o", "slash", *"chat", "enter"], terminal_size=SIZES["120x40"])
