"""A session: the producers of one kvtop run, the fold they feed, and the sinks that read it.

One direction of flow (design.md): engines -> sources -> records -> TierModel -> sinks. ``Session.emit`` is the
single point every record goes through: it is folded into the TierModel of its source (and the aggregate) and
handed to every sink (recorder, MQTT publisher, Prometheus). ``Session.run`` runs the producers as asyncio
tasks on whatever loop it is given (Textual's for the dashboard, ``asyncio.run`` for headless), so the UI never
owns the data and headless modes need no UI at all.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import itertools
import time
from collections import deque
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import field
from types import MappingProxyType
from typing import Any, Protocol, runtime_checkable

from kvtop.fleet import STALE_INTERVALS, StaleClock
from kvtop.problems import Problem, Problems
from kvtop.records import Record, SourceId, make, trusted_record
from kvtop.textsafe import clean
from kvtop.tiers import TierModel
from kvtop.tiers.health import HEALTH_KINDS, tier_health
from kvtop.tiers.sizeadvice import SizeAdvice, advise
from kvtop.values import frozen

Sink = Callable[[Record], None]
# Tier-health alarms (kvtop/tiers/health.py): checked every 2 s, on the first 64 sources (a fleet's alarms are its
# agents' to raise; a snapshot each is ~0.2 ms)
HEALTH_EVERY_S = 2.0
HEALTH_MAX_SOURCES = 64
LOG_LINES = 500  # the event log keeps the newest 500 lines; older ones are dropped, never queued
# Sources a session keeps a TierModel for. A model is ~50 KB idle (more with a big reuse tree), so 4,096 sources
# are ~200 MB at most; a fleet of 1,000 engines fits, 10,000 fake source ids on a shared broker do not get in.
MAX_SOURCES = 4096
MAX_TIME_JUMP_S = 86400.0  # a record a day or more from its source's last one is flagged (record.time_jump)
LogEntry = tuple[float, str, str]  # (epoch seconds, level, text): a line of Session.log


def fold_repeats(lines: Iterable[str]) -> list[str]:
    """Lines with each run of equal ones said once, counted: ["a", "a", "a", "b"] -> ["a x3", "b"] (text outputs;
    the dashboard's event log folds its own, kvtop/ui/panels/events.py EventLog)."""
    out: list[str] = []
    last: str | None = None
    n = 0
    for line in itertools.chain(lines, (None,)):
        if line == last:
            n += 1
            continue
        if last is not None:
            out.append(last if n == 1 else f"{last} x{n}")
        last, n = line, 1
    return out


@frozen(slots=True)
class SessionView:
    """What a screen reads off a session at one refresh; kvtop/ui/app.py reads nothing else of it.

    Taken on the loop that runs the session (the dashboard's own), so it copies nothing that grows with the run:
    the mappings are read-only windows onto the session's live ones, the log is the session's bounded deque. The
    models are read through their snapshots (kvtop/tiers/snapshot.py), never field by field off the live fold.
    """

    model: TierModel                    # the session's own source's fold
    models: Mapping[str, TierModel]     # per source key (empty until a record came)
    meta: Mapping[str, Any]
    status: Mapping[str, str]           # per producer and per source: "ok", "done", "offline", "stale", ...
    producers: tuple[str, ...]          # the producers' names, in the order they were added
    log: Sequence[LogEntry]             # the newest LOG_LINES lines, oldest first
    problems: tuple[Problem, ...]       # the problems still going on (kvtop.problems), oldest kind first
    stale_sources: int                  # sources marked stale (nothing heard for STALE_INTERVALS intervals)
    in_flight: int | None               # the workload driver's requests in flight; None without a driver
    started_at: float | None            # epoch seconds the run started
    source_key: str | None              # the session's own source (SourceId.key()), None where it has none
    player: Any = None                  # a replay's player (kvtop.sources.replay.ReplayPlayer), None live
    # the workload driver's requests in flight, by id: (monotonic time submitted, prompt tokens, priority); a
    # read-only window onto the driver's own (the requests view reads it only while it is shown)
    requests_in_flight: Mapping[int, tuple[float, int, int | None]] = field(default_factory=dict)


@runtime_checkable
class DashboardSession(Protocol):
    """What the dashboard calls on a session: ``view()`` every refresh, ``tick()`` for housekeeping, ``run()`` and
    ``stop()`` for its lifecycle, ``reset_window()`` for the r key, ``what_if()`` for the 2x / 4x host estimate and
    ``size_advice()`` for the curve line (None: the session folds no estimate, the line is hidden). Session is one;
    ``for_dashboard`` makes one of anything with a Session's read side."""

    def view(self) -> SessionView: ...
    def run(self) -> Awaitable[None]: ...
    def stop(self) -> None: ...
    def tick(self, now: float | None = None) -> object: ...   # now: the dashboard's wall clock (its log times)
    def reset_window(self) -> None: ...
    def what_if(self) -> Mapping[str, Any] | None: ...
    def size_advice(self, optimum: bool = True) -> Mapping[str, Any] | None: ...


class Session:
    def __init__(self, *, source: SourceId | None = None, warmup_requests: int = 0,
                 meta: dict[str, Any] | None = None, max_sources: int = MAX_SOURCES,
                 stale_intervals: float = STALE_INTERVALS):
        self.source = source or SourceId.local()
        self.warmup_requests = warmup_requests
        self.model = TierModel(warmup_requests=warmup_requests)
        self.models: dict[str, TierModel] = {}
        # Live what-if (2x and 4x host cache) for the session's own source: folded beside the TierModel.
        # ...and the size advice (a hit-rate curve over host sizes), which feeds the what-if: one fold of each event.
        self.sizing = SizeAdvice()
        self.whatif = self.sizing.whatif
        self._last_optimum: dict[int, float | None] = {}  # host blocks -> the optimum last read (size_advice)
        self.meta: dict[str, Any] = dict(meta or {})
        self.started_at = time.time()
        self.log: deque[tuple[float, str, str]] = deque(maxlen=LOG_LINES)
        self.status: dict[str, str] = {}
        self.sinks: list[Sink] = []
        self.records = 0
        self.records_in = 0  # records from the run's sources (not the session's own meta): exit status 3 if 0
        # Everything that went wrong, for every mode (kvtop.problems); sources and sinks report into it.
        self.problems = Problems()
        self.max_sources = max_sources
        self.refused_sources = 0  # records of new sources past max_sources, dropped
        self._refused_keys: set[str] = set()  # up to 64 remembered, for the message
        self.stale = StaleClock(stale_intervals)  # when each source was last heard from
        # The source folded into self.model: the session's own, else the first that sent data (a record other than
        # meta): a retained meta of a source long gone is no view of the run (issue 26). None until then.
        self._own_key: str | None = None
        # Each kvtop agent (its source key) -> the sources its summaries name (TierModel.agent), kept as summaries
        # come: an agent's last will updates its sources' rows without walking every model (issue 26).
        self._agent_sources: dict[str, set[str]] = {}
        self._agent_of: dict[str, str] = {}
        self._own_meta = False
        self.recorder: Any = None   # the --record sink, when there is one (its counters go in the summary)
        self.publisher: Any = None  # the --publish sink, likewise
        self.driver: Any = None
        self.player: Any = None     # a replay's player (kvtop/sources/replay.py ReplayPlayer): the screen drives it
        self._running_proxy: tuple[dict[int, Any], Mapping[int, Any]] | None = None  # _running_view's
        self._producers: list[tuple[str, Callable[[], Awaitable[None]]]] = []
        self._stoppers: list[Callable[[], None]] = []
        self._closers: list[Callable[[], None]] = []
        self._stop: asyncio.Event | None = None  # created on the running loop in run()
        self._stopped = False
        # Readers on other threads (the Prometheus exporter) read each model's last published snapshot: while
        # one is attached, run() publishes every ``publish_s`` (and once at the end), on the loop that folds.
        self.publish_s: float | None = None
        self._health_due = 0.0   # monotonic time of the next tier-health check (tick)
        self._health_holding: set[str] = set()
        # per source: unknown labels and media already said (kvtop/tiers/stream.py StreamFold.unknown_seen)
        self._unknown_seen: dict[str, int] = {}
        self._unknown_labels_seen: dict[str, int] = {}
        self._unknown_media_seen: dict[str, int] = {}

    # ------------------------------------------------------------------------------------------ records

    def _time_jump(self, key: str, kind: str, t: float, last: float) -> None:
        """Said where a source's record is a day or more from its last (emit and emit_many both fold it)."""
        self.problems.report("record.time_jump", f"{clean(key, 80)}: a {kind} record at {t:.0f}"
                             f" is {abs(t - last) / 86400:,.1f} days from the one before "
                             f"({last:.0f}): a clock that jumped?")

    def emit(self, record: Record, *, to_sinks: bool = True) -> None:
        """Fold one record and fan it out: ``emit_many`` of one record (one copy of the steps). Never raises: a sink
        that fails is logged and kept. ``to_sinks=False``: the fold alone (a replay folding again what its sinks
        had: ``fold_many``)."""
        self._emit_all((record,), to_sinks)

    def emit_many(self, records: Iterable[Record], *, to_sinks: bool = True) -> None:
        """``emit`` each of ``records`` in turn (a replay's burst of due records): the same steps (one copy of them),
        with the session's parts looked up once a burst, not once a record."""
        self._emit_all(records, to_sinks)

    def _emit_all(self, records: Iterable[Record], to_sinks: bool) -> None:
        """What ``emit`` and ``emit_many`` do (positional: a call by keyword costs ``emit`` ~1% of its instructions,
        bench/JOURNAL.md "Session.emit as emit_many of one")."""
        models, stale, own, whatif = self.models, self.stale, self.model, self.whatif
        sinks = self.sinks if to_sinks else ()
        last_source: Any = None
        key = ""
        for record in records:
            source = record.source
            if source is not last_source:  # decode hands out one SourceId per source: its key, once a run
                key = source.key()
                last_source = source
            model = models.get(key)
            kind = record.kind
            if model is None or self._own_key is None:
                # A new source, or any while the session's own model is not taken yet (the first record with data
                # may take it). Taking a model before the counts and the meta below changes nothing they read: it
                # writes self.meta only where a source heard from by meta alone is taken by a record with data,
                # which adds no meta of its own.
                if model is None and len(models) >= self.max_sources:
                    self._refuse(key)
                    continue
                model = self._take_model(key, model, record)
            self.records += 1
            if self._own_meta:
                self._own_meta = False
            else:
                self.records_in += 1
            if kind == "meta":
                self.meta.update(record.data)
            if stale.enabled and stale.heard(key, kind):  # heard() does nothing while the clock is off
                self._unstale(key)
            bad = model.bad_records
            last, t = model.now, record.time
            if last is not None and t.__class__ is float and abs(t - last) > MAX_TIME_JUMP_S:  # decode makes floats
                # Legal times (1970-2100) but a day or more from this source's last: a clock stepped, or a writer
                # that mixes units. Folded (the fold never goes back in time), and said, since rates will be off.
                self._time_jump(key, kind, t, last)
            model.apply(record)
            if kind == "summary":
                self._index_agent(key, model.agent)
            if model.bad_records != bad:
                self.problems.report("record.bad", f"{clean(key, 80)}: {model.last_bad_reason}", lost=True)
            if model is own:
                try:
                    if kind == "kv_event":  # the what-if hands the size advice its part (hooks)
                        whatif.apply_kv_event(record.data)
                    elif kind == "stats":
                        whatif.apply_stats(record.data)
                except Exception as exc:  # the estimate is a nicety: bad data there never stops the fold
                    self.note("warn", f"what-if skipped a record: {exc}")
            for sink in sinks:
                try:
                    sink(record)
                except Exception as exc:  # a broken sink must not stop the fold or the other sinks
                    self.note("error", f"sink {getattr(sink, '__qualname__', sink)} failed: {exc}")

    def emit_kv_events(self, source: SourceId, t: float, events: list[dict[str, Any]]) -> None:
        """KV event dicts of one source at one time, in the form records carry them (``trusted_record``'s: kvtop's
        own simulator in this process, a poller's drain): what ``emit_many`` of their ``kv_event`` records does,
        folded as one batch, without a Record an event (the steps once a batch: the source's model, its counts and
        staleness). Their records go through ``emit_many`` where a sink takes them, where the source's model is not
        taken yet (a new source, a refused one), or where ``t`` is a day from the model's time (a jump said per
        record). Held equal to emit_many by tests/tiers/test_fold_golden.py::test_emit_kv_events_folds_as_emit_many.
        """
        if not events:
            return
        key = source.key()
        model = self.models.get(key)
        last = model.now if model is not None else None
        if (self.sinks or model is None or self._own_key is None or t.__class__ is not float
                or (last is not None and abs(t - last) > MAX_TIME_JUMP_S)):
            self._emit_all([trusted_record("kv_event", ev, source, t) for ev in events], True)
            return
        n = len(events)
        self.records += n
        if self._own_meta:
            self._own_meta = False
            n -= 1
        self.records_in += n
        stale = self.stale
        if stale.enabled and stale.heard(key, "kv_event"):
            self._unstale(key)
        bad = model.apply_kv_event_records(events, t)
        if bad is not None:
            for reason in bad:
                self.problems.report("record.bad", f"{clean(key, 80)}: {reason}", lost=True)
        if model is self.model:
            sizing = self.sizing
            if sizing.whatif is self.whatif:  # the what-if and the size advice, a drain at once
                sizing.apply_kv_events(events, self._whatif_skipped)
            else:
                whatif = self.whatif.apply_kv_event
                for ev in events:
                    try:
                        whatif(ev)
                    except Exception as exc:
                        self._whatif_skipped(exc)

    def _whatif_skipped(self, exc: Exception) -> None:
        # the estimate is a nicety: bad data there never stops the fold
        self.note("warn", f"what-if skipped a record: {exc}")

    def _refuse(self, key: str) -> None:
        """A record of a new source past ``max_sources``: dropped, counted and said."""
        self.refused_sources += 1
        if len(self._refused_keys) < 64:
            self._refused_keys.add(key)
        self.problems.report("source.refused", f"more than {self.max_sources:,} sources: records of new "
                             f"sources are dropped ({self.refused_sources:,} so far, e.g. {clean(key, 80)}); "
                             "raise --max-sources if the fleet is that large", lost=True)

    def _take_model(self, key: str, model: TierModel | None, record: Record) -> TierModel:
        """The model a record of ``key`` folds into while the session's own source is not taken, or the source is
        new: the session's own source, or else the first source with data, is folded into self.model (a source
        heard from by meta alone so far hands the meta it sent to self.model as it is taken); any other new source
        gets a model of its own."""
        if self._own_key is None and (key == self.source.key() or record.kind != "meta"):
            if model is not None:
                said = dict(model.meta)
                model = self.model
                if said:
                    self.model.apply(make("meta", said, record.source, record.time))
                    self.meta.update(said)
            else:
                model = self.model
            self._own_key = key
            self.models[key] = model
        elif model is None:
            model = TierModel(warmup_requests=self.warmup_requests)
            self.models[key] = model
        return model

    def fold_many(self, records: Iterable[Record]) -> None:
        """``emit_many`` without the sinks: records the sinks had once, folded again after ``reset_fold``."""
        self.emit_many(records, to_sinks=False)

    def reset_fold(self) -> None:
        """Forget what was folded, as before the first record: fresh models, size advice and counts (a replay that
        seeks back folds its recording again from the start, kvtop/sources/replay.py). The meta, log, problems,
        statuses and sinks stay: they are the run's, not the fold's."""
        self.model = TierModel(warmup_requests=self.warmup_requests)
        self.models = {}
        self.sizing = SizeAdvice()
        self.whatif = self.sizing.whatif
        self._last_optimum = {}
        self.records = 0
        self._own_key = None
        self._agent_sources = {}
        self._agent_of = {}

    def _index_agent(self, key: str, agent: str | None) -> None:
        """Keep ``_agent_sources`` as a summary of ``key`` is folded: the agent its model now names, else none."""
        was = self._agent_of.get(key)
        if was == agent:
            return
        if was is not None:
            keys = self._agent_sources[was]
            keys.discard(key)
            if not keys:
                del self._agent_sources[was]
            del self._agent_of[key]
        if agent is not None and agent != key:
            self._agent_sources.setdefault(agent, set()).add(key)
            self._agent_of[key] = agent

    def agent_sources(self, agent: str) -> frozenset[str]:
        """The sources whose summaries name ``agent`` (its source key) as theirs."""
        return frozenset(self._agent_sources.get(agent, ()))

    def publish(self) -> None:
        """Publish a snapshot of every model that changed (``TierModel.published``); on the folding thread."""
        for model in {id(m): m for m in [self.model, *self.models.values()]}.values():
            model.snapshot()

    async def _publishing(self) -> None:
        while not self._stopped and self.publish_s is not None:
            self.publish()
            await self._sleep(self.publish_s)

    def what_if(self) -> dict[str, Any]:
        # The ghost hits are added to the TierModel's own hits and lookups (warm-up excluded): "all" is then the
        # run's cumulative hit rate, one span and one definition.
        st = self.model.stats_fold
        est = self.whatif.estimate(st.hits, st.lookups)
        return {k: est.get(k) for k in ("host_x2_hit_rate", "host_x4_hit_rate", "hit_rate",
                                        "host_capacity_blocks")}

    def size_advice(self, optimum: bool = True) -> dict[str, Any]:
        """The JSON summary's ``size_advice``: the hit rate at host sizes 0 to 4x the pool (the pool's own point is
        the run's cumulative hit rate), the optimum beside each, and a recommendation (kvtop.tiers.sizeadvice).
        O(n log n) over what the fold keeps: read every few seconds, not every refresh."""
        st = self.model.stats_fold
        points = self.sizing.curve(st.hits, st.lookups, optimum=optimum)
        bpb = self.model.bytes_per_block
        last = self._last_optimum
        for p in points:
            p["host_bytes"] = p["host_blocks"] * bpb if bpb else None
            if optimum:
                last[p["host_blocks"]] = p["optimal_hit_rate"]
            else:  # the last optimum read (the dashboard reads it less often than the curve), never below the curve
                best = last.get(p["host_blocks"])
                p["optimal_hit_rate"] = None if best is None or p["hit_rate"] is None else max(best, p["hit_rate"])
        host = self.sizing.host_blocks()
        return {"host_blocks": host,
                "points": [{k: p[k] for k in ("host_blocks", "host_bytes", "hit_rate", "optimal_hit_rate")}
                           for p in points],
                "recommendation": self._with_ttft(advise(points, host, bpb)),
                "basis": "estimated from this run's KV events: below the host pool from each onboard's place in "
                         "the host queue, above it from the blocks the cache dropped (stack distances); the optimum "
                         "is Belady's MIN over the lookups the events reveal, at GPU + host blocks"}

    def _with_ttft(self, advice: dict[str, Any]) -> dict[str, Any]:
        """The advice's TTFT: its extra hits per request, each a block loaded instead of computed, at the verdict's
        prices (kvtop/tiers/verdict.py: a block's prefill less its load). A mean over requests, not a p50, and
        only where the verdict has both prices and the run has finished requests."""
        gain = advice.get("extra_hit_points")
        snap = self.model.snapshot()
        v = snap.verdict.get("host")
        done = snap.requests.completed
        if not gain or v is None or v.prefill_block_s is None or v.load_block_s is None or not done:
            return advice
        per_request = gain / 100.0 * snap.hit_rate.lookups / done   # extra hit blocks a request
        ms = -per_request * (v.prefill_block_s - v.load_block_s) * 1000.0
        return {**advice, "ttft_ms": round(ms, 1), "text": f"{advice['text']}; ~{ms:+,.0f} ms TTFT a request"}

    def note(self, level: str, text: str) -> None:
        self.log.append((time.time(), level, clean(text, 500)))

    def on_source_error(self, name: str, message: str) -> None:
        name = clean(name, 120)
        self.status[name] = "error"
        self.note("warn", f"{name}: {message}")

    def on_source_status(self, name: str, message: str) -> None:
        """A source's state changed ("connected", "reconnected after 3.2 s", "offline"): shown, not an error."""
        name = clean(name, 120)
        if (name not in self.status and len(self.status) >= self.max_sources + 64 and name not in self.models
                and name not in self._agent_sources):
            return  # status topics of sources past the cap: as refused as their records (an agent's are not)
        message = clean(message, 300)  # shown in the header and the sources table: from servers and brokers
        # Staleness is the data's age (StaleClock), never a status: a retained "online" (after an "offline" or
        # not) says nothing about whether the source still sends. A status makes a source offline, never fresh.
        if message == "online" and self.stale.is_stale(name):
            if self.status.get(name) != "stale":
                self.status[name] = "stale"
                self.note("info", f"{name}: online, but nothing heard for "
                                  f"{self.stale.silence(name, time.monotonic()):.0f} s: stale")
            return
        previous = self.status.get(name)
        self.status[name] = message
        if message != previous:
            # The same status again (a retained "online" delivered again when the subscriber reconnects, an agent
            # that reconnected) is no news: one line per change, not one per message (issue 24: "online x4").
            self.note("info", f"{name}: {message}")
        if message in ("online", "offline"):
            # A kvtop agent's last will covers its connection, not each source it summarizes: its sources'
            # rows follow its status (their summaries name it: kvtop/agent.py), stale ones stay stale.
            for key in self._agent_sources.get(name, ()):
                self.status[key] = "stale" if message == "online" and self.stale.is_stale(key) else message

    # ------------------------------------------------------------------------------------------ problems

    def tick(self, now: float | None = None, monotonic: float | None = None) -> list[str]:
        """Housekeeping every mode calls a few times a second: marks sources stale, and returns the problem
        lines due (also put into the event log). Headless prints them to stderr; the dashboard shows the log."""
        mono = time.monotonic() if monotonic is None else monotonic
        for key in self.stale.newly_stale(mono):
            if self.status.get(key) == "offline":
                continue  # its last will said so already: offline, not stale
            self.status[key] = "stale"
            self.problems.report("source.stale", f"{clean(key, 80)}: nothing heard for "
                                 f"{self.stale.silence(key, mono):.0f} s ({self.stale.intervals:g} intervals); "
                                 "left out of the fleet totals until it sends again")
        if mono >= self._health_due:
            self._health_due = mono + HEALTH_EVERY_S
            self._check_tier_health()
        self._check_unknown_labels()
        lines = self.problems.take_lines(now)
        for line in lines:
            self.log.append((time.time() if now is None else now, "warn", line))
        return lines

    def _check_unknown_labels(self) -> None:
        """A hit counter's tier label or an event's medium kvtop does not know (kvtop/tiers/stream.py): a problem,
        never a silent drop. Hits under an unknown label are still counted (their tier is "unknown"); events under
        an unknown medium are skipped, so those are lost data. Read here, off the folding path: an int per source."""
        for key, model in self.models.items():
            sf = model.stream_fold
            if sf is None:
                continue
            seen = sf.unknown_seen
            last = self._unknown_seen.get(key, 0)
            if seen == last:
                continue
            self._unknown_seen[key] = seen
            labels, media = sf.unknown_labels, sf.unknown_media
            if sum(labels.values()) > self._unknown_labels_seen.get(key, 0):
                n = sum(labels.values()) - self._unknown_labels_seen.get(key, 0)
                self._unknown_labels_seen[key] = sum(labels.values())
                self.problems.report("engine.unknown_label", f"{clean(key, 80)}: tier label(s) kvtop does not "
                                     f"know: {', '.join(sorted(labels)[:4])}; their hits are counted under "
                                     "\"unknown\" (docs/engines.md lists the labels read)", count=n)
            if sum(media.values()) > self._unknown_media_seen.get(key, 0):
                n = sum(media.values()) - self._unknown_media_seen.get(key, 0)
                self._unknown_media_seen[key] = sum(media.values())
                self.problems.report("engine.unknown_medium", f"{clean(key, 80)}: {n:,} event(s) under a medium "
                                     f"kvtop does not know ({', '.join(sorted(media)[:4])}) skipped",
                                     count=n, lost=True)

    def _check_tier_health(self) -> None:
        """Tier-health alarms (kvtop/tiers/health.py) as problems: reported while they hold, resolved after."""
        models = list(itertools.islice(self.models.items(), HEALTH_MAX_SOURCES))
        holding: dict[str, str] = {}
        for key, model in models:
            for kind, why in tier_health(model.snapshot()).items():
                holding.setdefault(kind, f"{clean(key, 80)}: {why}" if key and len(models) > 1 else why)
        for kind in HEALTH_KINDS:
            if kind in holding:
                if kind not in self._health_holding:
                    self.problems.report(kind, holding[kind])
            elif kind in self._health_holding:
                self.problems.resolve(kind)
        self._health_holding = set(holding)

    def _unstale(self, key: str) -> None:
        if self.status.get(key) == "stale":
            self.status[key] = "online"
            self.note("info", f"{key}: sending again")
        if not self.stale.stale_keys():
            self.problems.resolve("source.stale")

    def stale_sources(self) -> list[str]:
        return [k for k, v in self.status.items() if v == "stale"]

    # ------------------------------------------------------------------------------------------ wiring

    def add_sink(self, sink: Sink, close: Callable[[], None] | None = None) -> None:
        self.sinks.append(sink)
        if close is not None:
            self._closers.append(close)

    def add_producer(self, name: str, run: Callable[[], Awaitable[None]], stop: Callable[[], None] | None = None
                     ) -> None:
        self._producers.append((name, run))
        if stop is not None:
            self._stoppers.append(stop)

    def add_closer(self, close: Callable[[], None]) -> None:
        self._closers.append(close)

    def add_sampler(self, name: str, sample: Callable[[], list[Record]], interval_s: float) -> None:
        """A blocking sampler (NVML, psutil) run in a thread, re-armed only after the last sample finished."""

        async def loop() -> None:
            while not self._stopped:
                try:
                    for rec in await asyncio.to_thread(sample):
                        self.emit(rec)
                    self.status[name] = "ok"
                except Exception as exc:  # samplers report, back off, and go on
                    self.on_source_error(name, str(exc))
                    await self._sleep(5.0)
                await self._sleep(interval_s)

        self.add_producer(name, loop)

    @property
    def requests_in_flight(self) -> int:
        return int(getattr(self.driver, "in_flight", 0) or 0)

    @property
    def producer_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self._producers)

    def view(self) -> SessionView:
        """What a screen reads now (SessionView). On the session's loop; ~2 us plus the active problems' copy."""
        problems = self.problems
        return SessionView(
            model=self.model, models=MappingProxyType(self.models), meta=MappingProxyType(self.meta),
            status=MappingProxyType(self.status), producers=self.producer_names, log=self.log,
            # copied under the registry's lock only when there is something in it (a few kinds at most)
            problems=tuple(p for p in problems.snapshot() if p.active) if len(problems) else (),
            stale_sources=len(self.stale_sources()),
            in_flight=None if self.driver is None else self.requests_in_flight,
            started_at=self.started_at, source_key=self.source.key(), player=self.player,
            requests_in_flight=self._running_view())

    def _running_view(self) -> Mapping[int, tuple[float, int, int | None]]:
        running = getattr(self.driver, "running", None)
        if not isinstance(running, dict):
            return MappingProxyType({})
        view = self._running_proxy
        if view is None or view[0] is not running:
            view = self._running_proxy = (running, MappingProxyType(running))
        return view[1]

    def reset_window(self) -> None:
        for model in {id(m): m for m in [self.model, *self.models.values()]}.values():
            reset = getattr(model, "reset_window", None)
            if reset is not None:
                reset()
        self.note("info", "window reset")

    # ------------------------------------------------------------------------------------------ run

    async def _sleep(self, seconds: float) -> None:
        if self._stop is None:
            await asyncio.sleep(seconds)
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(self._stop.wait(), timeout=seconds)

    async def run(self, duration_s: float | None = None, until_producers_done: tuple[str, ...] = ()) -> None:
        """Run every producer until ``stop()``, ``duration_s``, or the named producers have all finished."""
        self._stop = asyncio.Event()
        if self._stopped:
            self._stop.set()
        self.started_at = time.time()
        if isinstance(self.meta.get("engine"), str):  # a driven run describes its engine; an attach waits to hear
            self._own_meta = True
            self.emit(make("meta", dict(self.meta), self.source))
        tasks: dict[asyncio.Task[None], str] = {}
        for name, producer in self._producers:
            tasks[asyncio.ensure_future(self._guard(name, producer))] = name
        if self.publish_s is not None:
            tasks[asyncio.ensure_future(self._guard("publish", self._publishing))] = "publish"
        watched = {t for t, n in tasks.items() if n in until_producers_done}
        stop_task = asyncio.ensure_future(self._stop.wait())
        try:
            waiting = {stop_task, *watched} if watched else {stop_task}
            timeout = duration_s
            deadline = None if duration_s is None else time.monotonic() + duration_s
            while True:
                done, _ = await asyncio.wait(waiting, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
                if stop_task in done or not done:
                    break
                waiting -= done
                if watched and not (waiting & watched):
                    break
                if deadline is not None:
                    timeout = max(0.0, deadline - time.monotonic())
        finally:
            self.stop()
            stop_task.cancel()
            for task in tasks:
                if not task.done():
                    task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self.publish_s is not None:
                self.publish()  # what the producers folded last, for a final scrape
            for close in self._closers:
                try:
                    close()
                except Exception as exc:
                    self.note("error", f"closing failed: {exc}")

    async def _guard(self, name: str, producer: Callable[[], Awaitable[None]]) -> None:
        self.status[name] = "ok"
        try:
            await producer()
            if self.status.get(name) in (None, "ok"):  # not over what the source said last ("disconnected ...")
                self.status[name] = "done"
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # a producer that dies is reported on screen; the others go on
            self.status[name] = "failed"
            self.note("error", f"{name} stopped: {type(exc).__name__}: {exc}")
            self.problems.report(f"{name}.failed", f"{name} stopped: {type(exc).__name__}: {exc}", lost=True)

    def stop(self) -> None:
        self._stopped = True
        if self._stop is not None:
            self._stop.set()
        for stop in self._stoppers:
            try:
                stop()
            except Exception as exc:
                self.note("error", f"stopping failed: {exc}")


def _takes_an_argument(fn: Callable[..., Any]) -> bool:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in params)


class PartialSession:
    """A DashboardSession made of an object that has only part of a Session's read side: a test's stand-in, an
    embedder's own session. It must have ``model`` (and ``run()`` / ``stop()`` to be run); every other part may be
    missing and then reads as absent (no sources table, no log, no problems, no what-if line). The one place that
    reads a session by ``getattr``: the dashboard reads the SessionView this builds, by type."""

    def __init__(self, session: Any):
        self.session = session
        # whether the stand-in's tick takes the dashboard's clock: told once, not by a signature read every refresh
        tick = getattr(session, "tick", None)  # may lack: see the class docstring
        self._tick_takes_now = callable(tick) and _takes_an_argument(tick)

    def view(self) -> SessionView:
        s = self.session
        # may lack (each getattr below): the object is anyone's; a Session has them all
        key = getattr(getattr(s, "source", None), "key", None)
        driver = getattr(s, "driver", None)
        stale = getattr(s, "stale_sources", None)
        problems = getattr(s, "problems", None)
        return SessionView(
            model=s.model, models=getattr(s, "models", None) or {}, meta=getattr(s, "meta", None) or {},
            status=getattr(s, "status", None) or {}, producers=(), log=getattr(s, "log", None) or (),
            problems=tuple(p for p in problems.snapshot() if p.active) if problems is not None else (),
            stale_sources=len(stale()) if callable(stale) else 0,
            in_flight=None if driver is None else int(getattr(s, "requests_in_flight", 0) or 0),
            started_at=getattr(s, "started_at", None),
            source_key=str(key()) if callable(key) else None)

    async def run(self) -> None:
        await self.session.run()

    def stop(self) -> None:
        self.session.stop()

    def tick(self, now: float | None = None) -> object:
        tick = getattr(self.session, "tick", None)  # may lack: see the class docstring
        if not callable(tick):
            return None
        if now is None or not self._tick_takes_now:   # a stand-in's tick() may take none
            return tick()
        return tick(now)

    def reset_window(self) -> None:
        reset = getattr(self.session, "reset_window", None)  # may lack
        if callable(reset):
            reset()

    def what_if(self) -> Mapping[str, Any] | None:
        what_if = getattr(self.session, "what_if", None)  # may lack: then no what-if line
        return what_if() if callable(what_if) else None

    def size_advice(self, optimum: bool = True) -> Mapping[str, Any] | None:
        size_advice = getattr(self.session, "size_advice", None)  # may lack: then no curve line
        return size_advice(optimum=optimum) if callable(size_advice) else None


def for_dashboard(session: Any) -> DashboardSession:
    """``session`` as the dashboard reads it: a Session (or any full DashboardSession) as it is, else wrapped."""
    return session if isinstance(session, DashboardSession) else PartialSession(session)
