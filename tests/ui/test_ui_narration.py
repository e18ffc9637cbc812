"""The event log's narration without an App (kvtop/ui/narration.py): a real session's views and its model's
snapshots in, the log lines out, each thing said once."""

from __future__ import annotations

from recordings import session_from_recording

from kvtop.records import Record, SourceId
from kvtop.tiers.snapshot import reading
from kvtop.ui.narration import STALE_AFTER_S, Narrator

BUSY = SourceId(host="sim", rank=0, run="busy")


def _narrator() -> tuple[Narrator, list[tuple[float | None, str, str]]]:
    lines: list[tuple[float | None, str, str]] = []
    return Narrator(lambda t, level, text: lines.append((t, level, text))), lines


def test_stale_then_flowing_again_and_bad_records_said_once_each() -> None:
    session = session_from_recording(upto=2.0)
    narrator, lines = _narrator()
    snap = reading(session.model)
    t0 = 1000.0
    narrator.model(t0, snap, snap.quality, session.view().status)
    assert lines == [] and narrator.stale(t0 + STALE_AFTER_S - 0.1, session.view()) == (None, None)
    # no record for STALE_AFTER_S: the header's badge counts the seconds, the log says it once
    assert narrator.stale(t0 + 6.5, session.view()) == (6.5, None)
    assert narrator.stale(t0 + 9.0, session.view()) == (9.0, None)
    assert lines == [(None, "warn", "no new data for 5 s")]
    # two bad records arrive: the data flows again, and the last one's reason is said
    for data in ({"iter": 1, "kvCacheStats": "x"}, '{"iter": 1, "kvCacheStats": '):
        session.emit(Record("stats", data, source=BUSY, time=(snap.now or 0.0) + 1))
    bad = reading(session.model)
    assert bad.bad_records == 2 and bad is not snap
    narrator.model(t0 + 10.0, bad, bad.quality, session.view().status)
    assert lines[1:] == [(None, "info", "data flowing again"),
                         (None, "warn", f"bad record: {bad.last_bad_reason}")]
    assert (bad.last_bad_reason or "").startswith("stats: not valid JSON")
    # the same figures again: nothing more; and the stale clock starts over from the records' arrival
    narrator.model(t0 + 11.0, bad, bad.quality, session.view().status)
    assert len(lines) == 3 and narrator.stale(t0 + 14.9, session.view()) == (None, None)


def test_a_status_is_said_once_and_not_after_the_session_said_it() -> None:
    session = session_from_recording(upto=2.0)
    narrator, lines = _narrator()
    snap = reading(session.model)
    session.status.update({"agent-1": "ok", "agent-2": "ok"})
    narrator.model(1.0, snap, snap.quality, session.view().status)
    assert lines == []   # "ok" first seen says nothing
    session.note("warn", "agent-2: disconnected (connection refused)")
    session.status.update({"agent-1": "offline", "agent-2": "disconnected (connection refused)"})
    view = session.view()
    narrator.session_log(view)
    narrator.model(2.0, snap, snap.quality, view.status)
    narrator.model(3.0, snap, snap.quality, view.status)
    t_said = view.log[-1][0]
    assert lines == [(t_said, "warn", "agent-2: disconnected (connection refused)"),   # the session's, its time
                     (None, "warn", "agent-1: offline")]                                # not agent-2's again
    session.status["agent-1"] = "ok"
    narrator.model(4.0, snap, snap.quality, session.view().status)
    assert lines[2:] == [(None, "info", "agent-1: ok")]   # ok after a problem is said


def test_why_the_session_finished_the_first_reason_kept_and_no_stale_badge_after() -> None:
    session = session_from_recording(upto=2.0)
    narrator, _ = _narrator()
    session.status.update({"sim": "done", "driver": "running"})
    assert narrator.finished_reason(session.view()) is None
    session.status["driver"] = "failed"
    assert narrator.finished_reason(session.view()) == "producers stopped"
    narrator.ended("session finished")
    narrator.ended("stopped: RuntimeError")
    assert narrator.finished_reason(session.view()) == "session finished"
    narrator.ended("--duration 3 s reached", first=False)
    narrator.idle(0.0)
    assert narrator.stale(100.0, session.view()) == (None, "--duration 3 s reached")
