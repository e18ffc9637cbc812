"""Recordings folded into runs, for ``kvtop report``: each recording read with ``kvtop.records.read_jsonl`` (bad
lines kept with their numbers), folded with ``TierModel`` (the same fold the dashboard shows) and the live what-if,
sampled at every iteration-stats record (:class:`RunData`); a recording of several runs is folded apart
(:func:`load_runs`). kvtop/report/charts.py draws them, kvtop/report/report.py compares them and writes the page."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvtop.records import Record, RecordError, read_jsonl
from kvtop.tiers import TierModel
from kvtop.tiers.requests import prefix_source
from kvtop.tiers.whatif import WhatIf

__all__ = ["GIB", "PREFIX_SOURCES", "RunData", "Sample", "TierPoint", "host_size", "load_run", "load_runs",
           "percentile"]


GIB = 1 << 30
# Samples kept per run (one per stats record up to here, then every 2nd, 4th... and always the last): a chart is
# 1,000 px wide, and a sample a stats record held 803 MB for a 2 GB recording (kvtop replay: 34 MB).
MAX_SAMPLES = 4096


@dataclass(frozen=True)
class TierPoint:
    """One tier's blocks at one instant (``None`` = unknown)."""

    capacity: int | None
    in_use: int | None
    cached: int | None


@dataclass
class Sample:
    """The fold's state at one instant (seconds since the run's first record)."""

    t: float
    # every tier the fold had at that instant (TierModel.tiers: GPU, host, then disk where there is one), in order
    tiers: dict[str, TierPoint]
    # host and disk in use together, where TensorRT-LLM's V2 stats report only their sum (TierModel.cold)
    cold_in_use: int | None
    hits: int
    lookups: int
    host_hits: int
    offloaded: int
    onboarded: int
    evicted_gpu: int
    evicted_host: int


@dataclass
class RunData:
    """One recording, folded."""

    path: Path
    name: str
    records: int = 0
    bad_lines: list[tuple[int | None, str]] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    samples: list[Sample] = field(default_factory=list)
    ttfts: list[float] = field(default_factory=list)
    e2es: list[float] = field(default_factory=list)
    # TTFT by where the request's prefix came from: "gpu_hit", "host_hit", "miss" (PREFIX_SOURCES)
    ttft_by_source: dict[str, list[float]] = field(default_factory=dict)
    summary: dict[str, Any] = field(default_factory=dict)
    what_if: dict[str, Any] = field(default_factory=dict)
    duration_s: float = 0.0
    bytes_per_block: int | None = None

    @property
    def charted(self) -> bool:
        return bool(self.samples) or bool(self.ttfts)


# The classes the report draws (kvtop.tiers.requests.prefix_source also knows "disk_hit": no engine's request
# record says it yet)
PREFIX_SOURCES = (("gpu_hit", "GPU hit"), ("host_hit", "host hit"), ("miss", "miss"))


def percentile(values: Sequence[float], p: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    # nearest-rank: p99 of 100 values is the 99th, not an interpolation past the data
    k = max(0, min(len(s) - 1, math.ceil(p * len(s)) - 1))
    return s[k]


class _Fold:
    """One run's records folded: the TierModel (as the dashboard folds them), the live what-if, the requests."""

    def __init__(self, path: Path, name: str, warmup_requests: int):
        self.run = RunData(path=path, name=name)
        self.model = TierModel(warmup_requests=warmup_requests)
        self.whatif = WhatIf(None)
        self.t0: float | None = None
        self.last_t = 0.0
        self.output_tokens = 0
        self.completed = 0
        self.failed = 0
        self.had_meta = False
        self.sources: dict[str, None] = {}  # the sources its records came from, in order (host/rank/run)
        self.run_names: dict[str, None] = {}
        self.stats_seen = 0
        self.stride = 1  # every stride-th stats record's sample is kept (doubles when 2 x MAX_SAMPLES are kept)
        self.tail: Sample | None = None  # the newest sample, when not kept: appended at the end

    def apply(self, rec: Record) -> None:
        run, model = self.run, self.model
        run.records += 1
        if rec.source.run:
            self.run_names[rec.source.run] = None
        self.sources[rec.source.key()] = None
        if self.t0 is None:
            self.t0 = rec.time
        self.last_t = max(self.last_t, rec.time)
        model.apply(rec)
        self.whatif.apply(rec)
        if rec.kind == "stats":
            hr, mv, cold = model.hit_rate, model.moves, model.cold
            sample = Sample(
                rec.time - self.t0, {t.name: TierPoint(t.capacity_blocks, t.in_use_blocks, t.cached_blocks)
                                     for t in model.tiers},
                None if cold is None else cold.in_use_blocks, hr.hits, hr.lookups, hr.host_hits,
                mv.offloaded_blocks, mv.onboarded_blocks, mv.evicted_gpu_blocks, mv.evicted_host_blocks)
            self.stats_seen += 1
            if (self.stats_seen - 1) % self.stride:
                self.tail = sample
            else:
                run.samples.append(sample)
                self.tail = None
                if len(run.samples) >= 2 * MAX_SAMPLES:  # every other one: those at multiples of the new stride
                    run.samples = run.samples[::2]
                    self.stride *= 2
        elif rec.kind == "meta":
            self.had_meta = True
            run.meta = dict(rec.data)
        elif rec.kind == "request":
            d = rec.data
            if d.get("ok") is True:
                self.completed += 1
                ttft = d.get("ttft_s")
                if isinstance(ttft, (int, float)) and not isinstance(ttft, bool) and ttft >= 0:
                    run.ttfts.append(float(ttft))
                    where = prefix_source(d)
                    if where is not None:
                        run.ttft_by_source.setdefault(where, []).append(float(ttft))
                e2e = d.get("e2e_s")
                if isinstance(e2e, (int, float)) and not isinstance(e2e, bool) and e2e >= 0:
                    run.e2es.append(float(e2e))
                out = d.get("output_tokens")
                if isinstance(out, int) and not isinstance(out, bool):
                    self.output_tokens += out
            else:
                self.failed += 1

    def finish(self) -> RunData:
        run, model, whatif = self.run, self.model, self.whatif
        completed, output_tokens = self.completed, self.output_tokens
        if self.tail is not None:
            run.samples.append(self.tail)  # the run's end stays on the charts
            self.tail = None
        run.duration_s = (self.last_t - self.t0) if self.t0 is not None else 0.0
        run.bytes_per_block = model.bytes_per_block
        if whatif.host_capacity_blocks is None and isinstance(run.meta.get("secondary_blocks"), int):
            whatif._set_capacity(run.meta["secondary_blocks"])
        run.what_if = whatif.estimate()
        s = model.summary()
        hr = s["hit_rate"]
        bpb = run.bytes_per_block
        gpu_blocks, host_blocks = s["tiers"]["gpu"]["capacity_blocks"], s["tiers"]["host"]["capacity_blocks"]
        run.summary = {
            "name": run.name,
            "path": str(run.path),
            # what the records call it (generated names such as "multi-turn-18573"): shown in the setup table only
            "run_name": ", ".join(self.run_names) or None,
            "sources": list(self.sources),
            "records": run.records,
            "bad_lines": len(run.bad_lines),
            "engine": run.meta.get("engine_version") or run.meta.get("engine"),
            "model": s.get("model"),
            "gpu": s.get("gpu"),
            "scenario": run.meta.get("scenario"),
            "concurrency": run.meta.get("concurrency"),
            "rate": run.meta.get("rate"),
            "host_cache_bytes": run.meta.get("host_cache_bytes"),
            "gpu_pool_bytes": gpu_blocks * bpb if isinstance(gpu_blocks, int) and bpb else None,
            "host_pool_bytes": host_blocks * bpb if isinstance(host_blocks, int) and bpb else None,
            "gpu_blocks": s["tiers"]["gpu"]["capacity_blocks"],
            "host_blocks": s["tiers"]["host"]["capacity_blocks"],
            "disk_blocks": (s["tiers"].get("disk") or {}).get("capacity_blocks"),
            # every tier the run had (GPU, host, disk where there was one), in order, with its size
            "tiers": {name: {"capacity_blocks": t["capacity_blocks"], "capacity_bytes": t["capacity_bytes"]}
                      for name, t in s["tiers"].items()},
            "stats_schema": s.get("stats_schema"),
            "duration_s": run.duration_s,
            "requests_completed": completed,
            "requests_failed": self.failed,
            "requests_per_s": completed / run.duration_s if run.duration_s > 0 else None,
            "output_tokens_per_s": output_tokens / run.duration_s if run.duration_s > 0 else None,
            "ttft_p50_s": percentile(run.ttfts, 0.50),
            "ttft_p99_s": percentile(run.ttfts, 0.99),
            "e2e_p50_s": percentile(run.e2es, 0.50),
            "e2e_p99_s": percentile(run.e2es, 0.99),
            "ttft_by_source": {k: {"requests": len(run.ttft_by_source.get(k, [])),
                                   "p50_s": percentile(run.ttft_by_source.get(k, []), 0.50),
                                   "p99_s": percentile(run.ttft_by_source.get(k, []), 0.99)}
                               for k, _ in PREFIX_SOURCES},
            "hit_rate": hr["cumulative"],
            # why the run's hit rate is unknown, where its source lacked the data (a KV event stream recorded
            # without the engine's /metrics), else None
            "hit_rate_unknown_why": hr.get("unknown_why"),
            "gpu_hit_rate": hr["gpu"],
            "host_hit_rate": hr["host"],
            "offloaded_blocks": s["moves"]["offloaded_blocks"],
            "onboarded_blocks": s["moves"]["onboarded_blocks"],
            "what_if": {k: run.what_if.get(k) for k in ("host_x2_hit_rate", "host_x4_hit_rate")},
            "counts_approximate": s["quality"]["counts_approximate"],
            "fold_bad_records": s["bad_records"],
        }
        run.summary["host_size"] = host_size(run.summary)
        run.summary["label"] = f"{run.name} ({run.summary['host_size']})"
        return run


def host_size(summary: dict[str, Any]) -> str:
    """The run's host tier in words, as it was asked for: "64 GB host" (``--host-cache 64GB``), "no host cache",
    else the pool the engine reported ("0.28 GiB host")."""
    asked, blocks, pool = summary.get("host_cache_bytes"), summary.get("host_blocks"), summary.get("host_pool_bytes")
    if asked == 0 or (asked is None and blocks == 0):
        return "no host cache"
    if isinstance(asked, int) and not isinstance(asked, bool) and asked > 0:
        if asked % 10**9 == 0:
            return f"{asked // 10**9:,} GB host"
        if asked % GIB == 0:
            return f"{asked // GIB:,} GiB host"
        return f"{asked / GIB:.2f} GiB host"
    if isinstance(pool, (int, float)) and pool > 0:
        return f"{pool / GIB:.2f} GiB host"
    if isinstance(blocks, int) and blocks > 0:
        return f"{blocks:,} host blocks"
    return "host cache unknown"


def load_run(path: str | Path, warmup_requests: int = 0) -> RunData:
    """Read and fold one recording as one run (whatever its sources); bad lines are collected in `bad_lines`, never
    raised. :func:`load_runs` splits a recording of several runs."""
    p = Path(path)
    fold = _Fold(p, p.stem, warmup_requests)
    for item in read_jsonl(p):
        if isinstance(item, RecordError):
            fold.run.bad_lines.append((item.line, f"{item.field}: {item.problem}"))
            continue
        fold.apply(item)
    return fold.finish()


def load_runs(path: str | Path, warmup_requests: int = 0) -> list[RunData]:
    """Read one recording and fold each run in it apart: a run is one source's records (host, rank, run name:
    ``kvtop --record --append`` of two runs, an attach of several engines), and a source's second ``meta`` record
    starts another run (a session sends its meta once: a second one is a new session under the same name). One run
    is named after the file ("x64"), several "x64 #1", "x64 #2"... in the order they start; the file's bad lines
    go with its first run. Folded together, two runs' pools and hits were summed into one that never existed."""
    p = Path(path)
    folds: list[_Fold] = []
    by_source: dict[str, _Fold] = {}
    bad: list[tuple[int | None, str]] = []
    for item in read_jsonl(p):
        if isinstance(item, RecordError):
            bad.append((item.line, f"{item.field}: {item.problem}"))
            continue
        key = item.source.key()
        fold = by_source.get(key)
        if fold is None or (item.kind == "meta" and fold.had_meta):
            fold = by_source[key] = _Fold(p, p.stem, warmup_requests)
            folds.append(fold)
        fold.apply(item)
    if not folds:
        folds.append(_Fold(p, p.stem, warmup_requests))
    folds[0].run.bad_lines = bad
    if len(folds) > 1:
        for i, fold in enumerate(folds, 1):
            fold.run.name = f"{p.stem} #{i}"
    return [fold.finish() for fold in folds]
