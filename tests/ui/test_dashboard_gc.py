"""The dashboard's start-up leaves the garbage collector nothing to walk (kvtop/modes.py, run_dashboard): the
app is built with collection off, what start-up made is frozen for the run, collection is on during the run
(young collections every 10,000 objects), and all of it is undone after the run. The cost it saves is in
bench/JOURNAL.md ("An attached kvtop beside nvitop")."""

from __future__ import annotations

import gc
from typing import Any

import pytest

from kvtop import modes
from kvtop.session import Session


class _FakeApp:
    return_code = 0

    def __init__(self, seen: dict[str, Any]):
        self.seen = seen

    def run(self) -> None:
        self.seen["frozen_during_run"] = gc.get_freeze_count()
        self.seen["collecting_during_run"] = gc.isenabled()
        self.seen["threshold_during_run"] = gc.get_threshold()


def test_the_dashboard_runs_with_start_up_frozen_and_collection_on(monkeypatch: pytest.MonkeyPatch) -> None:
    import kvtop.ui.app as ui_app

    seen: dict[str, Any] = {}

    def build_app(session: Any, settings: Any, **_: Any) -> _FakeApp:
        seen["collecting_while_built"] = gc.isenabled()
        return _FakeApp(seen)

    monkeypatch.setattr(ui_app, "build_app", build_app)
    assert gc.isenabled() and gc.get_freeze_count() == 0
    assert modes.run_dashboard(Session(meta={}), None) in (0, 3)
    assert seen["collecting_while_built"] is False
    # every object alive when the app was built (this test process: > 10,000, the modules among them)
    assert seen["frozen_during_run"] > 10_000
    assert seen["collecting_during_run"] is True
    before = gc.get_threshold()
    assert seen["threshold_during_run"] == (modes.YOUNG_GC_THRESHOLD, *before[1:]) == (10_000, *before[1:])
    assert gc.get_freeze_count() == 0 and gc.isenabled() and gc.get_threshold() == before


def test_a_failing_build_leaves_collection_as_it_was(monkeypatch: pytest.MonkeyPatch) -> None:
    import kvtop.ui.app as ui_app

    def build_app(session: Any, settings: Any, **_: Any) -> Any:
        raise RuntimeError("no screen")

    monkeypatch.setattr(ui_app, "build_app", build_app)
    with pytest.raises(RuntimeError):
        modes.run_dashboard(Session(meta={}), None)
    assert gc.isenabled() and gc.get_freeze_count() == 0
