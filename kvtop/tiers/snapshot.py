"""TierSnapshot: one immutable reading of a TierModel, what every reader on another thread (or later) is handed.

The fold (kvtop/tiers/model.py) changes with every record on the thread that owns it; a reader elsewhere (the
Prometheus exporter's HTTP thread, a ``kvtop.watch`` caller's thread) must never read it mid-record. The model
publishes a snapshot instead (``TierModel.snapshot()``, from the folding thread): built only when the model
changed since the last one (``TierModel.version``), and then handed out as it is, as often as it is asked for.
``TierModel.published`` is the last one: a plain attribute, so a reader on any thread takes it in one step.

Its fields are named as the model's own read-side properties (``tiers``, ``gpu``, ``moves``, ``hit_rate``...),
so a reader written against the model reads a snapshot unchanged. The ``--json`` summary (``summary()``) and the
history points are made from what the snapshot took, once, when first asked for (a dashboard takes a snapshot every
refresh and reads neither, or the history once per step); each summary() call returns a fresh copy, so a caller
that adds keys changes nobody else's.

Cost (the busy full-scale stream folded, every 240 records): 2.07 M instructions to take, under callgrind (4.56 M
when the summary and the history points were made with it, the latency percentiles twice: 557 us then on the dev
box), nothing to hand out again; a model that did not change costs a tuple comparison.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from dataclasses import field
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

from kvtop.tiers.capacity import cached_by_priority
from kvtop.tiers.state import GpuDevice, HistoryPoint, HitRate, HostMemory, Moves, Quality, Rates, Requests, TierState
from kvtop.tiers.summary import live_reads, summary_of
from kvtop.tiers.verdict import TierVerdict
from kvtop.tiers.window import Sample
from kvtop.values import frozen

if TYPE_CHECKING:
    from kvtop.tiers.model import TierModel

Version = tuple[int, int, int]  # (records handed in, bad records, window resets): any change moves one of them


@frozen(slots=True)
class TierSnapshot:
    version: Version
    now: float | None
    tiers: tuple[TierState, ...]  # GPU, host, then disk where there is one: what the sinks draw, in order
    gpu: TierState
    host: TierState
    disk: TierState | None
    cold: TierState | None
    moves: Moves
    hit_rate: HitRate
    rates: Rates
    requests: Requests
    quality: Quality
    counts_approximate: bool
    cached_approximate: bool
    tokens_per_block: int | None
    bytes_per_block: int | None
    gpus: Mapping[int, GpuDevice]
    host_memory: HostMemory | None
    gpu_error: str | None
    bad_records: int
    last_bad_reason: str | None
    records_applied: int
    stats_schema: str | None
    since_attach: bool
    agent: str | None
    meta: Mapping[str, Any]
    cached_by_priority: Mapping[str, Mapping[int | None, int]]
    hit_rate_by_priority: Mapping[int | None, float]
    hit_split_by_priority: Mapping[int | None, HitRate]
    window_s: float
    history_step_s: float
    history_samples: tuple[Sample, ...]  # the window's (time, counters) samples: the points are made on read
    verdict: Mapping[str, TierVerdict]   # per tier below the GPU: is it paying off (kvtop/tiers/verdict.py)
    # What the --json summary reads of the model besides the fields above (kvtop/tiers/summary.py live_reads):
    # the summary itself is made from both when first asked for (summary_data), not at every snapshot: the
    # dashboard takes one every refresh and never reads it (~115 us of a ~400 us snapshot on the busy stream).
    summary_reads: Mapping[str, Any]
    # The points once made (history()): a snapshot is taken every refresh of a busy dashboard, its sparklines read
    # the points once per history step (~80 us of a ~450 us snapshot on the busy full-scale stream, dev box).
    history_made: list[tuple[HistoryPoint, ...]] = field(default_factory=list, compare=False, repr=False)
    summary_made: list[Mapping[str, Any]] = field(default_factory=list, compare=False, repr=False)

    @property
    def summary_data(self) -> Mapping[str, Any]:
        """The ``--json`` summary as the model gave it when this snapshot was taken (read-only; summary() copies)."""
        made = self.summary_made
        if not made:   # two threads may both make it: the same summary either way, from immutable reads
            made.append(MappingProxyType(summary_of(self, self.summary_reads)))
        return made[0]

    def summary(self) -> dict[str, Any]:
        """The ``--json`` summary as the model gave it when this snapshot was taken (a copy: add keys freely)."""
        return copy.deepcopy(dict(self.summary_data))

    def history(self) -> list[HistoryPoint]:
        made = self.history_made
        if not made:   # two threads may both make them: the same points either way
            made.append(tuple(history_points(self.history_samples)))
        return list(made[0])

    def tier(self, name: str) -> TierState | None:
        return next((t for t in self.tiers if t.name == name), None)


def take(model: TierModel, version: Version) -> TierSnapshot:
    """Read everything a sink reads off ``model`` once (on the thread that folds into it)."""
    tiers = tuple(model.tiers)   # GPU, host, then disk where there is one (TierModel.tiers): each read once
    by_prio = cached_by_priority(model, tiers[0], tiers[1])   # model.cached_by_priority, the tiers not read again
    cold, moves, hit_rate, rates = model.cold, model.moves, model.hit_rate, model.rates
    requests, quality, split = model.requests, model.quality, model.hit_split_by_priority
    return TierSnapshot(
        version=version, now=model.now, tiers=tiers, gpu=tiers[0], host=tiers[1],
        disk=tiers[2] if len(tiers) > 2 else None, cold=cold, moves=moves, hit_rate=hit_rate, rates=rates,
        requests=requests, quality=quality, counts_approximate=model.counts_approximate,
        cached_approximate=model.cached_approximate, tokens_per_block=model.tokens_per_block,
        bytes_per_block=model.bytes_per_block, gpus=MappingProxyType(dict(model.gpus)),
        host_memory=model.host_memory, gpu_error=model.gpu_error, bad_records=model.bad_records,
        last_bad_reason=model.last_bad_reason, records_applied=model.records_applied,
        stats_schema=model.stats_schema, since_attach=model.since_attach, agent=model.agent,
        meta=MappingProxyType(copy.deepcopy(model.meta)),
        cached_by_priority=MappingProxyType({k: MappingProxyType(dict(v)) for k, v in by_prio.items()}),
        hit_rate_by_priority=MappingProxyType(dict(model.hit_rate_by_priority)),
        hit_split_by_priority=MappingProxyType(dict(split)), window_s=model.window_s,
        history_step_s=model.history_step_s,
        history_samples=tuple(model.history_samples()),
        verdict=MappingProxyType(model.verdict_of(tiers[1], tiers[2] if len(tiers) > 2 else None, moves)),
        summary_reads=MappingProxyType(live_reads(model)))


def history_points(samples: Sequence[Sample]) -> list[HistoryPoint]:
    """Rates per history step from the window's (time, counters) samples (TierModel.history and TierSnapshot's)."""
    out: list[HistoryPoint] = []
    for (t0, a), (t1, b) in zip(samples, samples[1:]):
        dt = t1 - t0
        if dt <= 0:
            continue
        d = [y - x for x, y in zip(a, b)]
        hit = d[0] / d[1] if d[1] > 0 else None
        host = min(max(d[2], 0), max(d[0], 0)) / d[1] if d[1] > 0 else None
        disk = (d[13] / dt, d[14] / dt, d[15] / dt) if len(d) > 15 else (0.0, 0.0, 0.0)
        out.append(HistoryPoint(t1, hit, host, d[3] / dt, d[4] / dt, d[5] / dt, d[6] / dt, d[7] / dt,
                                d[10] / dt, *disk))
    return out


def reading(model: Any) -> Any:
    """A snapshot to read: a TierModel's (taken now: call it on the model's folding thread); anything else (a
    snapshot already, a stand-in with the same fields) as it is."""
    if isinstance(model, TierSnapshot) or not callable(getattr(type(model), "snapshot", None)):
        return model
    return model.snapshot()


__all__ = ["TierSnapshot", "Version", "history_points", "reading", "take"]
