"""The view-model: pure functions from what the session says and its model's snapshot to each panel's typed data
(kvtop/ui/panels/: one data class beside each panel).

Nothing here keeps state of its own or touches Textual: what is cached between refreshes (the sparklines' series
once per history step, the verdict once a second of data time...) is in the ``Kept`` the caller hands in
(kvtop/ui/state.py), and a clock or the session's size advice are handed in too, so that each step runs (and is
tested) without an App. KvtopApp (kvtop/ui/app.py) keeps the timers, calls these to make what each panel is shown,
and hands the log lines a change is worth to kvtop/ui/narration.py.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from kvtop.engine_words import (
    engine_label,
    hit_rate_unknown_why,
    is_trtllm,
    requests_unknown_why,
    size_curve_unknown_why,
)
from kvtop.fleet import FleetRow, combine, source_row
from kvtop.occupancy import occupancy
from kvtop.session import SessionView
from kvtop.sources.replay import ReplayPlayer
from kvtop.tiers import HistoryPoint, Quality, Rates, Requests, TierModel, TierSnapshot, TierState
from kvtop.tiers.departures import describe as describe_left
from kvtop.tiers.snapshot import reading
from kvtop.ui import format as fmt
from kvtop.ui.panels.header import HeaderData, VerdictLine, replay_badge
from kvtop.ui.panels.hit_rate import HitData, WhatIfData
from kvtop.ui.panels.memory import GpuMemoryRow, MemoryData
from kvtop.ui.panels.moves import MovesData
from kvtop.ui.panels.priority import PriorityData
from kvtop.ui.panels.requests import RequestData
from kvtop.ui.panels.sources import FleetData
from kvtop.ui.panels.tier import TierData, tier_label
from kvtop.ui.state import Kept
from kvtop.ui.table import TableState

SOURCE_LABELS = {"gpu_hit": "GPU", "host_hit": "host", "disk_hit": "disk", "miss": "miss"}  # the TTFT table's
CURVE_SIZES = (("0", 0.0), ("½", 0.5), ("1", 1.0), ("2", 2.0), ("4", 4.0))  # the line's sizes, x the host pool
LAG_SHOWN_S = 0.5        # the stream's live batches waited this long behind a replay: the header says so
CURVE_EVERY_S = 5.0      # the size advice's curve: read once per this much model time
OPTIMUM_EVERY_S = 60.0   # ...and its optimum at most once per this much wall time (47 ms at 100k lookups)

# The sparklines' series: the hit rate, and the moves per second (offload, onboard, evict GPU, evict host).
Series = tuple[tuple[float | None, ...], tuple[tuple[float, float, float, float], ...]]
# TTFT by where the prefix came from: (label, p50 s, p99 s, requests)
BySource = tuple[tuple[str, float | None, float | None, int], ...]


def words(value: Any) -> str | None:
    """A meta value the header shows as words: None stays None, anything else is text without control characters
    (a recording's meta is anyone's JSON: a model of -1 reached the line model as an int)."""
    return None if value is None else fmt.clean(str(value))


def tier_states(snap: TierSnapshot) -> list[TierState]:
    """A snapshot's tiers in order: GPU, host, then disk where the engine has one."""
    return list(snap.tiers) or [snap.gpu, snap.host]


def has_data(snap: TierSnapshot) -> bool:
    gpu = snap.gpu
    return (gpu.free_blocks is not None or gpu.cached_blocks is not None or bool(snap.gpus)
            or snap.host_memory is not None or snap.hit_rate.lookups > 0)


def changed(snap: TierSnapshot, shown: TierSnapshot | None) -> bool:
    """Whether ``snap`` differs from the one ``shown``. A TierModel hands out the same snapshot until it folds
    something, so identity says it; a look-alike model (not a TierModel: a test's) is read as it is, every time."""
    return snap is not shown or not isinstance(snap, TierSnapshot)


def fold_statuses(sources: tuple[tuple[str, str], ...]) -> tuple[tuple[str, str], ...]:
    """The header's statuses with those that several names share said once: a fleet's agents all "online" read
    "4 agents online", not four badges that push everything else off the line (issue 24). In first-seen order."""
    by_status: dict[str, list[str]] = {}
    for name, st in sources:
        by_status.setdefault(st, []).append(name)
    out: list[tuple[str, str]] = []
    for st, names in by_status.items():
        if len(names) == 1:
            out.append((names[0], st))
        else:
            what = "agents" if all(n.startswith("agent-") for n in names) else "sources"
            out.append((f"{len(names):,} {what}", st))
    return tuple(out)


def header_flags(snap: TierSnapshot, q: Quality | None, view: SessionView) -> list[str]:
    """The header's warnings, most telling first: events dropped, approximate counts, bad records, a stream behind
    a replay, the host unknown, active problems, stale sources, iterations missing."""
    flags = []
    if q is None:
        pass
    elif q.events_dropped:
        flags.append(f"{q.events_dropped} events dropped")
    elif q.counts_approximate:
        # A late attacher to a vLLM/SGLang stream cannot know what was cached before: say so, not just "≈"
        flags.append("counts since attach" if snap.since_attach else "counts ≈")
    if snap.bad_records:
        flags.append(f"{snap.bad_records} bad records")
    # a snapshot's (a look-alike model, a test's or an embedder's, has no summary reads)
    stream = snap.summary_reads.get("stream") if isinstance(snap, TierSnapshot) else None
    if stream and stream.get("lag_s", 0) >= LAG_SHOWN_S:
        # live batches of the stream waited behind a replay (kvtop/sources/kv_events_zmq.py)
        n = stream.get("lag_batches", 0)
        flags.append(f"stream {stream['lag_s']:.1f} s behind" + (f" ({n:,} batches)" if n else ""))
    if q is not None and q.host_without_events:
        flags.append("host unknown")
    if active := view.problems:
        flags.append(f"{len(active)} problem{'s' if len(active) > 1 else ''}: {active[0].kind}")
    if n_stale := view.stale_sources:
        flags.append(f"{n_stale} source{'s' if n_stale > 1 else ''} stale")
    if q is not None and q.stats_iterations_missing:
        flags.append(f"{q.stats_iterations_missing} iterations missing")  # another reader of the stats queue
    return flags


def header_data(now: float, snap: TierSnapshot, q: Quality | None, view: SessionView, *, stale_s: float | None,
                finished: str | None, paused: bool, paused_at: float | None, sources: tuple[tuple[str, str], ...],
                source_label: str | None, verdict: tuple[VerdictLine, ...], refresh_s: float | None) -> HeaderData:
    """The header's data: the session's meta under the snapshot's, the run's state and the flags."""
    meta = dict(view.meta)
    meta.update(snap.meta)
    started = view.started_at
    player: ReplayPlayer | None = view.player
    simulated = bool(meta.get("simulated")) or meta.get("engine") == "sim"
    return HeaderData(
        engine=words(engine_label(meta.get("engine"))), engine_version=words(meta.get("engine_version")),
        model=words(meta.get("model")), gpu=words(meta.get("gpu")), simulated=simulated,
        sim_reason=words(meta.get("sim_reason")),
        tokens_per_block=snap.tokens_per_block or meta.get("tokens_per_block"),
        bytes_per_block=snap.bytes_per_block or meta.get("bytes_per_block"),
        uptime_s=None if started is None else now - float(started), data_time=snap.now,
        paused=paused or (player is not None and player.paused),
        stale_s=None if stale_s is None else float(int(stale_s)), flags=tuple(header_flags(snap, q, view)),
        finished=finished, paused_at=paused_at,
        sources=sources, source_label=source_label, stats_schema=None if q is None else q.stats_schema,
        verdict=verdict, replay=None if player is None else replay_badge(player), refresh_s=refresh_s)


def verdict_lines(snap: TierSnapshot) -> tuple[VerdictLine, ...]:
    """The verdict line's parts, from the snapshot (kvtop/tiers/verdict.py); a disk tier's follows the host's."""
    return tuple(VerdictLine(v.says, v.text(), v.basis.split(":", 1)[0], v.short_text(), t)
                 for t, v in snap.verdict.items())


def tier_data(st: TierState, cold: TierState | None, history: tuple[float | None, ...], engine: Any = None
              ) -> TierData:
    """A tier's panel data, with the note its panel shows where its figures are missing or merged; ``engine``: the
    source's meta ``engine``, whose words the panel uses (kvtop/engine_words.py)."""
    trtllm = is_trtllm(engine)
    label, medium = tier_label(st.name)
    medium = st.medium or medium  # a host tier whose offloads go to files says so
    note = None
    if label != "GPU" and cold is not None and cold.capacity_blocks is not None:
        note = (f"host+disk together: {fmt.count(cold.in_use_blocks or 0)} of "
                f"{fmt.count(cold.capacity_blocks)} blocks in use (TensorRT-LLM's V2 stats do not split them)")
    elif st.capacity_blocks is None and (label != "GPU" or st.cached_blocks is not None):
        # the pool's size is what is missing, not the events (a vLLM stream without /metrics: its GPU panel said
        # "no KV events" over the 20,000 blocks the events had announced)
        note = f"{label} pool size unknown (no created event, meta or /metrics yet)"
    elif st.capacity_blocks and st.cached_blocks is not None and st.in_use_blocks is None \
            and st.free_blocks is None:
        # the events are there (their blocks are the reuse tree); what is missing is the tier's in-use count (a
        # vLLM host pool: /metrics gives its size, nothing its use): "no KV events" said the opposite
        note = f"{label} in use unknown (no usage count): cached vs empty unknown"
    elif label != "GPU":
        if st.capacity_blocks and st.cached_blocks is None:
            note = (f"no KV events: {label} occupancy unknown"
                    + (" (enable event_buffer_max_size)" if trtllm else ""))
    return TierData(label, medium, st, note, history, trtllm)


def sparkline_series(history: Sequence[HistoryPoint]) -> Series:
    """The sparklines' series from the history points shown: the hit rate, and the moves per second."""
    return (tuple(h.hit_rate for h in history), tuple(
        (h.offloaded_per_s, h.onboarded_per_s, h.evicted_gpu_per_s, h.evicted_host_per_s) for h in history))


def what_if_data(advice: Mapping[str, Any]) -> WhatIfData:
    """``Session.size_advice()``'s summary as the line's figures: the points at ``CURVE_SIZES`` (a figure the
    advice lacks reads "?")."""
    host = advice.get("host_blocks")
    host = host if isinstance(host, int) else None
    by_size = {p.get("host_blocks"): p for p in advice.get("points") or () if isinstance(p, dict)}
    points = []
    for label, f in CURVE_SIZES:
        p = by_size.get(round(f * host)) if host is not None else None
        points.append((label, None if p is None else p.get("hit_rate"),
                       None if p is None else p.get("optimal_hit_rate")))
    rec = advice.get("recommendation") or {}
    return WhatIfData(host, tuple(points), rec.get("text") if isinstance(rec, dict) else None)


def _stream(snap: TierSnapshot) -> Any:
    """The stream fold's summary a snapshot took (``StreamFold.to_json``), None for any other source, or for a
    stand-in model that is no snapshot (a test's: it has the snapshot's fields, not what it read besides)."""
    return snap.summary_reads.get("stream") if isinstance(snap, TierSnapshot) else None


def hit_data(snap: TierSnapshot, history: tuple[float | None, ...], what_if: WhatIfData | None) -> HitData:
    stream = _stream(snap)
    why = None if snap.hit_rate.lookups else hit_rate_unknown_why(snap.meta, stream)
    no_curve = size_curve_unknown_why(stream)
    if what_if is not None and no_curve and not any(p[1] is not None for p in what_if.points):
        what_if = WhatIfData(what_if.host_blocks, (), None, no_curve)   # a stream's curve never comes: why
    return HitData(snap.hit_rate, history, snap.window_s, what_if, why)


def moves_data(snap: TierSnapshot, rates: Rates, history: tuple[tuple[float, float, float, float], ...],
               q: Quality) -> MovesData:
    moves = snap.moves
    return MovesData(rates, moves, history, known=moves.source != "events" or q.events_seen,
                     left=describe_left(moves.left_said, moves.left_inferred))


def ttft_by_source(req: Requests, windowed: bool) -> BySource:
    """TTFT by prefix source over the same span as the TTFT row (the window while it has requests)."""
    rows = ((SOURCE_LABELS.get(source, source), whole if not windowed else win)
            for source, whole, win in req.ttft_by_source)
    return tuple((label, lat.p50_s, lat.p99_s, lat.count) for label, lat in rows if lat.count)


def requests_data(req: Requests, rates: Rates, in_flight: int | None, by_source: BySource,
                  snap: TierSnapshot | None = None) -> RequestData:
    """The requests panel's data: the window's latencies while it has requests, the run's otherwise; where the
    source has no requests to count (``snap``'s KV event stream), why, instead of zeros."""
    windowed = req.window_ttft.count > 0
    ttft = req.window_ttft if windowed else req.ttft
    e2e = req.window_e2e if req.window_e2e.count > 0 else req.e2e
    stream = _stream(snap) if snap is not None and in_flight is None else None
    return RequestData(in_flight, req.completed, req.failed, rates.requests_per_s, rates.output_tokens_per_s,
                       rates.prompt_tokens_per_s, ttft.p50_s, ttft.p99_s, e2e.p50_s, e2e.p99_s, windowed,
                       req.last_error, by_source, requests_unknown_why(stream, req.completed, req.failed))


def priority_data(snap: TierSnapshot, gpu: TierState, host: TierState) -> PriorityData:
    by = snap.cached_by_priority
    hit = snap.hit_rate_by_priority
    gpu_by, host_by = by.get("gpu", {}), by.get("host", {})
    order = sorted(set(gpu_by) | set(host_by), key=lambda p: -1 if p is None else p, reverse=True)
    rows = tuple((p, gpu_by.get(p, 0), host_by.get(p, 0), hit.get(p)) for p in order)
    split_by = snap.hit_split_by_priority
    split = tuple((s.gpu, s.host) if (s := split_by.get(p)) is not None else (None, None) for p in order)
    cached = sum(t.cached_blocks or 0 for t in tier_states(snap))
    return PriorityData(rows, gpu.capacity_blocks, host.capacity_blocks, split, gpu.bytes_per_block, cached)


def memory_data(snap: TierSnapshot, host: TierState, view: SessionView) -> MemoryData:
    gpus = tuple(GpuMemoryRow(g.index, g.name, g.memory_used_bytes, g.memory_total_bytes,
                              g.data.get("utilization_gpu_pct")) for _, g in sorted(snap.gpus.items()))
    hm = snap.host_memory
    rss = pinned = avail = total = None
    if hm is not None:
        data = hm.data or {}
        # The host source names them process_rss_bytes / system_available_bytes; take either spelling.
        rss = hm.rss_bytes if hm.rss_bytes is not None else data.get("process_rss_bytes")
        avail = hm.available_bytes if hm.available_bytes is not None else data.get("system_available_bytes")
        pinned = hm.pinned_pool_bytes
        total = data.get("system_total_bytes")
    meta = {**view.meta, **snap.meta}
    # The simulator's pools are no memory of this machine's: the panel says so ("simulated")
    simulated = bool(meta.get("simulated")) or meta.get("engine") == "sim"
    return MemoryData(gpus, snap.gpu_error, rss, pinned, avail, total, simulated, host.capacity_blocks,
                      attached="attached_to" in view.meta)


def fleet_data(shown: Sequence[FleetRow], rows: Sequence[FleetRow], selected: int, cursor: int,
               state: TableState) -> FleetData:
    """The sources table's data: the rows shown (filtered and sorted), the aggregate over every source."""
    return FleetData(tuple(shown), combine(rows), selected, cursor, state.sort, state.descending, state.filter,
                     len(rows))


def quality(shown: TierSnapshot | None) -> Quality | None:
    """The quality of the figures on screen (the shown snapshot's), None before the first draw."""
    return None if shown is None else shown.quality


def own_key(view: SessionView) -> str:
    """The one source's name in the sources table: what it is attached to, or its own key."""
    return fmt.clean(view.meta.get("attached_to") or view.source_key or "this run", limit=60)


def header_sources(view: SessionView, fleet_shown: bool) -> tuple[tuple[str, str], ...]:
    """The statuses the header shows: not those that are well, nor those of sources (their keys) while the
    sources table shows them in its status column."""
    models = view.models
    return fold_statuses(tuple((n, s) for n, s in view.status.items()
                               if s not in ("ok", "done") and not (fleet_shown and n in models)))


def source_label(key: str, index: int, count: int) -> str | None:
    """The header's "2/4 name" of the source the big panels show, None with one source."""
    return f"{index % count + 1}/{count} {key}" if count > 1 else None


def kept_verdict(kept: Kept, snap: TierSnapshot) -> tuple[VerdictLine, ...]:
    """The verdict line's parts, from the snapshot (kvtop/tiers/verdict.py). Before the first record there is
    nothing to say; a disk tier's verdict follows the host's. Its figures move with every record, so they are
    taken once a second of data time (or when what it says changes): the header is drawn again only when its
    clock moves, 1 refresh in 4 on a busy stream, and a verdict read every refresh made it 4 in 4 (+1.0M
    instructions a refresh, bench_ui_refresh.py --callgrind)."""
    if snap.now is None:
        return ()
    verdicts = snap.verdict
    key = (math.floor(snap.now), tuple((t, v.says) for t, v in verdicts.items()))
    if key != kept.verdict_key:
        kept.verdict_key = key
        kept.verdict_lines = verdict_lines(snap)
    return kept.verdict_lines


def kept_series(kept: Kept, live: TierModel, snap: TierSnapshot, spark_points: int) -> Series:
    """The sparklines' series: the hit rate, and the moves per second (offload, onboard, evict GPU, host)."""
    # The snapshot's history holds up to 600 samples; its points change once per history step, so the
    # sparklines' slice is cut again only when the model's clock has moved a step on (or another model is shown).
    step = snap.history_step_s or 1.0
    now = snap.now
    key = (id(live), None if now is None else int(now / step))
    if key != kept.hist_key:
        kept.hist_key = key
        hist = snap.history()[-spark_points - 1:]
        if len(hist) >= 2 and hist[-1].t - hist[-2].t < 0.5 * step:
            # A last step only a fraction of a second long turns one block into a spike of blocks/s.
            hist = hist[:-1]
        history = tuple(hist[-spark_points:])
        # The sparklines' series, made once per history step with the points (not at every refresh), so the
        # panels' data compare by identity while the step lasts.
        kept.series = sparkline_series(history)
    return kept.series


def tier_history(kept: Kept, live: TierModel, st: TierState, label: str, step: int | None, keep: int,
                 spark_points: int, xl: bool) -> tuple[float | None, ...]:
    """The tier's headline share (GPU in use, others cached) once per history step (``keep`` of them), for the
    200x60 layout's sparkline under each bar (``xl``: its last ``spark_points``); kept for every layout so that a
    resize shows the past, not a blank."""
    key = (id(live), label)
    hist = kept.tier_hist.get(key)
    if hist is None:
        hist = kept.tier_hist[key] = deque(maxlen=keep)
    if step is not None and kept.tier_hist_step.get(key) != step:
        kept.tier_hist_step[key] = step
        o = occupancy(st)
        part = o.in_use if label == "GPU" else o.cached_idle
        hist.append(part / o.capacity if part is not None and o.capacity else None)
    return tuple(hist)[-spark_points:] if xl else ()


def tiers_data(kept: Kept, live: TierModel, snap: TierSnapshot, tiers: Sequence[TierState], keep: int,
               spark_points: int, xl: bool) -> list[TierData]:
    """Each tier's panel data, in the model's order (GPU, host, then disk where the engine has one), with its
    sparkline's points (``tier_history``)."""
    step = None if snap.now is None else int(snap.now / (snap.history_step_s or 1.0))
    cold = snap.cold  # TensorRT-LLM's V2 manager: host and disk reported as one sum
    engine = snap.meta.get("engine")
    return [tier_data(st, cold, tier_history(kept, live, st, tier_label(st.name)[0], step, keep, spark_points, xl),
                      engine) for st in tiers]


def kept_what_if(kept: Kept, live: TierModel, snap: TierSnapshot, own: TierModel | None,
                 advise: Callable[..., Mapping[str, Any] | None], clock: Callable[[], float]) -> WhatIfData | None:
    """``advise(optimum=...)``'s curve (the session's size_advice: host sizes 0, ½, 1, 2, 4 times the pool; the
    run's own cumulative rate at 1) with the optimum, for the session's own source (``own``) only (folded from its
    records alone); None hides the line. The curve is O(n log n) over the onboards kept (1.2 ms on the 60 s busy
    recording): read at most once per ``CURVE_EVERY_S`` of model time; the optimum (Belady's MIN over up to 100k
    lookups: 47 ms there) at most once per ``OPTIMUM_EVERY_S`` of ``clock`` (wall) time, its last figures kept
    between."""
    if own is None or live is not own:
        return None
    key = (id(live), None if snap.now is None else int(snap.now // CURVE_EVERY_S))
    if key != kept.whatif_key:
        kept.whatif_key = key
        now = clock()
        optimum = kept.optimum_at is None or now - kept.optimum_at >= OPTIMUM_EVERY_S
        try:
            advice = advise(optimum=optimum)
            if optimum:
                kept.optimum_at = now
        except Exception:  # an estimate that fails shows "?", never takes the screen down
            advice = {}
        if advice is None:    # the session folds no estimate: no line
            kept.whatif = None
        else:
            kept.whatif = what_if_data(advice)
    return kept.whatif


def kept_requests(kept: Kept, snap: TierSnapshot, rates: Rates, view: SessionView) -> RequestData:
    """The requests panel's data, its TTFT by prefix source taken once a second of data time (``kept``)."""
    req = snap.requests
    in_flight = view.in_flight if view.in_flight is not None else req.in_flight  # the driver's, when one runs
    windowed = req.window_ttft.count > 0
    # TTFT by prefix source over the same span as the TTFT row (the window while it has requests), taken once
    # a second of data time as the verdict line is: its two rows drawn again at every refresh of a busy stream
    # were 0.40M instructions a refresh (bench_ui_refresh.py --callgrind, with and without them)
    key = (None if snap.now is None else math.floor(snap.now), windowed)
    if key != kept.by_source_key or not req.ttft_by_source:
        kept.by_source_key = key
        kept.by_source = ttft_by_source(req, windowed)
    return requests_data(req, rates, in_flight, kept.by_source, snap)


def fleet_row(rows: dict[str, tuple[TierSnapshot, str | None, FleetRow]], key: str, model: TierModel,
              status: str | None) -> FleetRow:
    """A source's row of the sources table, read again only when its model folded something since (a new
    snapshot) or its status changed; ``rows`` keeps each with the snapshot and status it was made from."""
    snap = reading(model)
    hit = rows.get(key)
    if hit is None or changed(snap, hit[0]) or hit[1] != status:
        hit = rows[key] = (snap, status, source_row(key, snap, status))
    return hit[2]


__all__ = ["CURVE_EVERY_S", "CURVE_SIZES", "OPTIMUM_EVERY_S", "SOURCE_LABELS", "changed", "fleet_data", "fleet_row",
           "fold_statuses", "has_data", "header_data", "header_flags", "header_sources", "hit_data", "kept_requests",
           "kept_series", "kept_verdict", "kept_what_if", "memory_data", "moves_data", "own_key", "priority_data",
           "quality", "requests_data", "source_label", "sparkline_series", "tier_data", "tier_history", "tier_states",
           "tiers_data", "ttft_by_source", "verdict_lines", "what_if_data", "words"]
