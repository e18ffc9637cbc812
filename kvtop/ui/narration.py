"""The event log's narration: what the session's log and its model's snapshots are worth saying, each thing once.

``Narrator`` is handed what a refresh read (the ``SessionView``, the snapshot, its quality) and says each line
through the callable it was made with, ``say(time, level, text)`` (time None: now, the caller's clock). What it has
said is in its ``Told`` (kvtop/ui/state.py). Pure: no Textual, no clock of its own, so that a sequence of snapshots
in gives the log lines out without an App (tests/ui/test_ui_narration.py); KvtopApp (kvtop/ui/app.py) calls it
from its refresh and writes the lines to the event log panel.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from kvtop.session import LogEntry, SessionView
from kvtop.tiers import Quality, Requests, TierModel, TierSnapshot
from kvtop.ui import format as fmt
from kvtop.ui.state import Told

STALE_AFTER_S = 5.0      # no record for this long: the header says so (an engine with no requests is quiet too)
SAID_KEPT = 256          # texts of the session's log remembered, so that a status it said is not said twice

# say(time, level, text): a line for the event log; time None: now
Say = Callable[[float | None, str, str], None]


class Narrator:
    """What the event log is told: the session's own log lines, and the changes of the figures and statuses a
    refresh reads, each said once (``told``: what has been)."""

    __slots__ = ("say", "told")

    def __init__(self, say: Say, told: Told | None = None):
        self.say = say
        self.told = told if told is not None else Told()

    def ended(self, reason: str, *, first: bool = True) -> None:
        """The session ended for ``reason`` (``first``: unless it had already ended for another)."""
        told = self.told
        told.finished = (told.finished or reason) if first else reason

    def finished_reason(self, view: SessionView) -> str | None:
        """Why no more data will come, or None while the session runs: its run ended (``--duration``, an
        error, the producers done), or every producer it reported on has finished (a replay that reached its end:
        the session itself waits for q)."""
        if self.told.finished is not None:
            return self.told.finished
        if view.player is not None and view.player.at_end:
            return "replay finished"   # the player waits at the end for a seek back: its producer goes on
        status = view.status
        producers = list(view.producers) or list(status)
        states = [status.get(n) for n in producers]
        if states and all(st in ("done", "failed") for st in states):
            if "replay" in producers and status.get("replay") == "done":
                return "replay finished"
            return "producers finished" if all(st == "done" for st in states) else "producers stopped"
        return None

    # -- freshness: when a record last arrived, and the stale badge

    def idle(self, now: float) -> None:
        """A refresh that found nothing new: the stale badge counts from the first one."""
        if self.told.last_change_at is None:
            self.told.last_change_at = now

    def freshness(self, now: float, snap: TierSnapshot) -> None:
        """When a record last arrived (the fold's count of them moved): what the stale badge measures."""
        told = self.told
        records = snap.records_applied + snap.bad_records
        if records != told.last_records or told.last_change_at is None:
            if told.seen.get("stale") and told.last_records >= 0:
                self.say(None, "info", "data flowing again")
            told.seen["stale"] = False
            told.last_records = records
            told.last_change_at = now

    def stale(self, now: float, view: SessionView) -> tuple[float | None, str | None]:
        """(how long no record has come, None while they come or none is due; why the session finished, None while
        it runs): the header's badges. A replay paused or seeking is not stale."""
        told = self.told
        stale = None
        finished = self.finished_reason(view)
        player = view.player
        held = player is not None and (player.paused or player.seeking)   # no records come: none are due
        if (finished is None and not held and told.last_change_at is not None
                and now - told.last_change_at >= STALE_AFTER_S):
            stale = now - told.last_change_at
            if not told.seen.get("stale"):
                told.seen["stale"] = True
                self.say(None, "warn", f"no new data for {STALE_AFTER_S:.0f} s")
        return stale, finished

    # -- the model's figures and the statuses

    def model(self, now: float, snap: TierSnapshot, q: Quality, status: Mapping[str, Any]) -> None:
        """Data freshness and quality changes, turned into log lines once each."""
        self.freshness(now, snap)
        self._on_increase("dropped", q.events_dropped, "warn",
                          lambda n: f"{n} KV events dropped (event buffer overflowed): counts are approximate "
                                    "from here on; raise event_buffer_max_size")
        self._on_increase("bad", snap.bad_records, "warn", lambda n: f"bad record: {snap.last_bad_reason}")
        self._on_increase("restarts", q.stats_restarts + q.event_restarts, "warn",
                          lambda n: "engine restarted: counters went backwards; totals continue")
        self._on_change("gpu_error", snap.gpu_error, "info", lambda v: f"GPU memory: {v}")
        self._on_change("host_without_events", q.host_without_events, "warn",
                        lambda v: "host pool without KV events: host occupancy unknown" if v else None)
        said = self.told.session_said
        for name, st in list(status.items()):
            # "done" is said by the producer itself (e.g. "replay finished"); "ok" only after a problem.
            bad = st in ("offline", "failed", "error") or str(st).startswith("disconnected")
            def line(v: Any, n: str = name) -> str | None:
                text = f"{n}: {v}"
                return None if text in said else text  # the session's log said it already

            self._on_change(f"status:{name}", None if st == "done" else st, "warn" if bad else "info", line)

    def failures(self, live: TierModel, req: Requests) -> None:
        """A failure reaches the event log with its reason (the panel keeps only the last one; the log the story).
        Keyed by the live model, which lives as long as its source: a snapshot's id changes with every record
        (a key per snapshot logged one failure again and again, and grew without bound)."""
        self._on_increase(f"failed:{id(live)}", req.failed, "error",
                          lambda n: f"{n} request{'s' * (n > 1)} failed: {fmt.clean(req.last_error or '?')}")

    def _on_increase(self, key: str, value: int, level: str, text: Callable[[int], str]) -> None:
        old = self.told.seen.get(key, 0)
        if value > old:
            self.say(None, level, text(value - old))
        self.told.seen[key] = value

    def _on_change(self, key: str, value: Any, level: str, text: Callable[[Any], str | None]) -> None:
        seen = self.told.seen
        if key in seen and seen[key] == value:
            return
        first = key not in seen
        seen[key] = value
        if value in (None, False) or (first and value == "ok"):
            return
        line = text(value)
        if line:
            self.say(None, level, line)

    # -- the session's own log

    def session_log(self, view: SessionView) -> None:
        """New entries of the session's log (a bounded deque of (time, level, text)) into the event log."""
        log = view.log
        if not log:
            return
        told = self.told
        last = log[-1]
        if last is told.log_last:
            return
        new: list[LogEntry] = []
        for entry in reversed(log):  # newest first, back to the last one shown: O(new entries)
            if entry is told.log_last:
                break
            new.append(entry)
        told.log_last = last
        said = told.session_said
        for entry in reversed(new):
            try:
                t, level, text = entry
            except (TypeError, ValueError):  # a stand-in session's log of bare strings: said now
                when, level, text = None, "info", str(entry)
            else:
                when = float(t)
            self.say(when, str(level), str(text))
            said.pop(str(text), None)
            said[str(text)] = None
            if len(said) > SAID_KEPT:
                del said[next(iter(said))]


__all__ = ["SAID_KEPT", "STALE_AFTER_S", "Narrator", "Say"]
