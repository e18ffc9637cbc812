"""Helpers for the UI's tests and bench (in tests/: not shipped in the wheel): a session folded from a recording,
and the frozen clock they use.

No Textual here: building the session is the data side; only ``build_app`` (called by the tests) brings the UI.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from kvtop.records import RecordError, SourceId, make, read_jsonl
from kvtop.session import Session

REPO = Path(__file__).resolve().parents[1]
BUSY_RECORDING = REPO / "tests" / "data" / "busy.jsonl"
# The frozen "now" of the UI tests: one hour and 83 s after the recording's first record (2025-11-29 15:26:40
# UTC), so the header's uptime reads 0:01:23 with ``started_at = FROZEN_STARTED_AT``.
FROZEN_STARTED_AT = 1764430000.0 + 3600
FROZEN_NOW = FROZEN_STARTED_AT + 83


def session_from_recording(path: str | os.PathLike[str] = BUSY_RECORDING, *, upto: float | None = None,
                           started_at: float = FROZEN_STARTED_AT) -> Session:
    """A Session with every record of ``path`` (or those within ``upto`` s of the first) folded in; not run."""
    session = Session(source=SourceId(host="sim", rank=0, run="busy"))
    t0: float | None = None
    for rec in read_jsonl(path):
        if isinstance(rec, RecordError):
            raise rec
        if t0 is None:
            t0 = rec.time
        if upto is not None and rec.time - t0 > upto:
            break
        session.emit(rec)
    session.started_at = started_at
    return session


class Messages:
    """A message hook (``app.run_test(message_hook=...)``) that keeps what the app posted, by type."""

    def __init__(self) -> None:
        self.seen: list[Any] = []

    def __call__(self, message: Any) -> None:
        self.seen.append(message)

    def of(self, kind: type) -> list[Any]:
        return [m for m in self.seen if isinstance(m, kind)]


def three_tier_session() -> Session:
    """The busy recording with a disk tier under the host: a model whose ``tiers`` lists GPU, host and a disk of
    1,000 blocks (400 cached), everything else the recording's own."""
    from kvtop.tiers import TierState

    session = session_from_recording()
    model = session.model
    disk = TierState("disk", 1000, 0, 400, 1000, 32, 4718592)

    class ThreeTiers:
        def __getattr__(self, name: str) -> Any:
            return getattr(model, name)

        @property
        def tiers(self) -> list[TierState]:
            return [model.gpu, model.host, disk]

    session.model = ThreeTiers()  # type: ignore[assignment]
    session.models = {}
    return session


# The fleet fixture: three sources from the busy recording, each a different stretch of it (the whole 8 s, the
# first 5 s, the first 3 s) moved in time so that all three end together, as live engines would.
FLEET_SOURCES = ((SourceId(host="node-a", rank=0, run="chat"), None),
                 (SourceId(host="node-b", rank=1, run="chat"), 5.0),
                 (SourceId(host="node-c", rank=0, run="batch"), 3.0))


def fleet_session(path: str | os.PathLike[str] = BUSY_RECORDING, *, started_at: float = FROZEN_STARTED_AT,
                  sources: tuple[tuple[SourceId, float | None], ...] = FLEET_SOURCES) -> Session:
    """A Session watching several sources (``FLEET_SOURCES``: the first is the session's own); not run."""
    records = []
    for rec in read_jsonl(path):
        if isinstance(rec, RecordError):
            raise rec
        records.append(rec)
    t0, t_end = records[0].time, records[-1].time
    session = Session(source=sources[0][0])
    for source, upto in sources:
        shift = 0.0 if upto is None else (t_end - t0) - upto
        for rec in records:
            if upto is not None and rec.time - t0 > upto:
                break
            session.emit(make(rec.kind, rec.data, source=source, time=rec.time + shift))
    session.started_at = started_at
    return session


def dashboard_screen(session: Any, size: tuple[int, int] = (120, 40)) -> str:
    """The dashboard over ``session`` (not run: what it folded already), refreshed once, as the text of its SVG
    screenshot: what the fuzz tests look through for control characters. Textual is imported here, on use."""
    import asyncio

    from kvtop.settings import Settings
    from kvtop.ui.app import build_app

    async def show() -> str:
        app = build_app(session, Settings(), run_session=False)
        async with app.run_test(size=size) as pilot:
            await pilot.pause()
            app.refresh_view()
            await pilot.pause()
            shot = app.export_screenshot()
        assert app.return_code in (None, 0)
        return str(shot)

    return asyncio.run(show())


__all__ = ["BUSY_RECORDING", "FLEET_SOURCES", "Messages", "FROZEN_NOW", "FROZEN_STARTED_AT", "REPO", "dashboard_screen",
           "fleet_session", "session_from_recording", "three_tier_session"]
