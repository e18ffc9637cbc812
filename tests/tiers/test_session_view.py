"""Session.view(): what the dashboard reads of a session, by type (kvtop/session.py SessionView), and the one
adapter that makes a view of an object with only part of a Session's read side (PartialSession)."""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import pytest
from recordings import FROZEN_STARTED_AT, session_from_recording

from kvtop.records import SourceId
from kvtop.session import DashboardSession, PartialSession, Session, SessionView, for_dashboard
from kvtop.tiers import TierModel


def test_a_sessions_view_says_what_the_screen_shows() -> None:
    session = session_from_recording()
    session.add_producer("replay", lambda: asyncio.sleep(0))
    session.add_producer("nvml", lambda: asyncio.sleep(0))
    session.status.update({"replay": "ok", "node-b/0/x": "stale", "node-c/0/x": "stale", "mqtt": "online"})
    session.problems.report("mqtt.connection", "refused")
    session.problems.report("record.bad", "line 3: not JSON", lost=True)
    session.problems.resolve("mqtt.connection")
    session.note("warn", "nvml: no NVIDIA driver")

    view = session.view()
    assert view.producers == ("replay", "nvml")          # was read off the private _producers list
    assert view.stale_sources == 2
    assert [p.kind for p in view.problems] == ["record.bad"]  # the resolved one is not active
    assert view.in_flight is None                          # no driver: the model's own count is shown
    assert view.started_at == FROZEN_STARTED_AT
    assert view.source_key == "sim/0/busy"
    assert view.model is session.model and view.models["sim/0/busy"] is session.model
    assert view.log[-1][1:] == ("warn", "nvml: no NVIDIA driver")
    assert view.meta["tokens_per_block"] == 32
    # Read-only windows onto the live state (no copy a refresh): a later status shows, a write is refused.
    session.status["nvml"] = "done"
    assert view.status["nvml"] == "done"
    with pytest.raises(TypeError):
        view.status["x"] = "ok"  # type: ignore[index]
    with pytest.raises(dataclasses.FrozenInstanceError):
        view.stale_sources = 0  # type: ignore[misc]


def test_a_driven_sessions_view_carries_the_drivers_in_flight_count() -> None:
    session = Session(source=SourceId(host="h", rank=0, run="r"))

    class Driver:
        in_flight = 7

    session.driver = Driver()
    assert session.view().in_flight == 7
    session.driver = None
    assert session.view().in_flight is None


def test_a_session_is_a_dashboard_session_and_is_not_wrapped() -> None:
    session = Session()
    assert isinstance(session, DashboardSession)
    assert for_dashboard(session) is session


class OnlyAModel:
    """A stand-in with a model and nothing else a Session has."""

    def __init__(self) -> None:
        self.model = TierModel()


def test_a_stand_in_reads_as_absent_where_it_lacks_a_part() -> None:
    stand_in = OnlyAModel()
    wrapped = for_dashboard(stand_in)
    assert isinstance(wrapped, PartialSession)
    view = wrapped.view()
    assert isinstance(view, SessionView)
    assert (view.model, dict(view.models), dict(view.meta), dict(view.status)) == (stand_in.model, {}, {}, {})
    assert (view.producers, tuple(view.log), view.problems, view.stale_sources) == ((), (), (), 0)
    assert (view.in_flight, view.started_at, view.source_key) == (None, None, None)
    assert wrapped.what_if() is None         # no estimate: the dashboard hides the what-if line
    assert wrapped.tick() is None
    wrapped.reset_window()                   # nothing to reset: a no-op, not an AttributeError


def test_a_stand_in_with_parts_has_them_read() -> None:
    calls: list[str] = []

    class Partial(OnlyAModel):
        status = {"replay": "done", "a/0/b": "stale"}
        started_at = 12.5
        source = SourceId(host="a", rank=0, run="b")

        def what_if(self) -> dict[str, Any]:
            return {"hit_rate": 0.4}

        def reset_window(self) -> None:
            calls.append("reset")

        def stale_sources(self) -> list[str]:
            return ["a/0/b"]

    wrapped = for_dashboard(Partial())
    view = wrapped.view()
    assert (view.status["replay"], view.started_at, view.source_key, view.stale_sources) == ("done", 12.5, "a/0/b", 1)
    assert wrapped.what_if() == {"hit_rate": 0.4}
    wrapped.reset_window()
    assert calls == ["reset"]
