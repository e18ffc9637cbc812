"""`kvtop report RUN.jsonl [RUN2.jsonl ...] -o DIR`: charts and one self-contained page from recordings.

Each recording is read with `kvtop.records.read_jsonl` (bad lines are reported with their numbers and the rest
is charted), folded with `TierModel` (the same fold the dashboard shows) and with the live what-if, sampled at
every iteration-stats record. Written into DIR:

- `occupancy.png`: blocks cached / in use per tier over time, against capacity;
- `hit_rate.png`: block hit rate per time bin, split by the tier that served the hit (stacked);
- `moves.png`: offloads, onboards and evictions per second;
- `ttft.png`: time-to-first-token distribution (histogram for one run, CDFs for several);
- `compare.png` (two runs or more): throughput, TTFT p50/p99 and hit rates side by side;
- `summary.json` and `index.html` (images embedded as base64, so the page is one file).

Each recording may hold several runs (``--record --append``, an attach of several engines): each is folded apart
(:func:`load_runs`). Runs are named by file ("x64", or "x64 #2" for the second run of a file) and labelled with their
host tier as asked for ("64 GB host", "no host cache"), never by the run ids their records carry.

The page's first screen, and the first lines on stdout, answer "how much do throughput and latency gain or lose when
part of the KV cache lives in host memory?" in one sentence per run against the first (the baseline): "with 64 GB
host (x64) against no host cache (x0): TTFT p50 -32.5%, output tok/s +13.0%, hit rate +18.6 pt; a host hit ... saves
150 ms against a miss (TTFT p50)". Then the same as a table (the pools first, a row per metric and a column per run,
changes green where better and red where worse; the GPU's and the host's shares of the hits are neither: a host tier
moves hits between them), TTFT split by where each request's prefix came from (a GPU hit, a host hit, a miss: the
request records' reused / host-hit blocks), then the runs' setup, a row per figure (it fits 1280 px: 25 columns
across did not). The comparison needs no matplotlib (the charts do: without it the page is written without them).
Colours are kvtop's colour code everywhere (kvtop/palette.py, the dashboard's: GPU blue, host orange, disk purple
where the run had a disk tier; a figure of no one tier, as the total hit rate, in black; runs in colours off those
three hues); sizes are GiB; labels
are placed so that none overlaps another, and lines are labelled where they end.
"""

from __future__ import annotations

import base64
import html
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvtop import DISTRIBUTION
from kvtop.palette import OTHER_TIER
from kvtop.palette import REPORT as TIER_PALETTE
from kvtop.records import Record, RecordError, read_jsonl
from kvtop.tiers import TierModel
from kvtop.tiers.requests import prefix_source
from kvtop.tiers.whatif import WhatIf

__all__ = ["DISK_COLOR", "GPU_COLOR", "HOST_COLOR", "TIER_COLORS", "NotARecording", "RunData", "TierPoint",
           "answer_sentences", "build_report", "deltas", "host_size", "load_run", "load_runs",
           "occupancy_series", "plot_sweep", "prefix_source"]

# The tier colours: kvtop's colour code (kvtop/palette.py), as the dashboard's light theme draws them (the page is
# white): GPU, host and disk one colour each, in every chart, as in every panel of the dashboard.
GPU_COLOR = TIER_PALETTE["gpu"].in_use      # GPU tier, everywhere
HOST_COLOR = TIER_PALETTE["host"].in_use    # host tier, everywhere
DISK_COLOR = TIER_PALETTE["disk"].in_use    # disk tier (TensorRT-LLM's disk cache), everywhere
TIER_COLORS = {"gpu": GPU_COLOR, "host": HOST_COLOR, "disk": DISK_COLOR}
OTHER_TIER_COLOR = TIER_PALETTE[OTHER_TIER].in_use  # a tier kvtop has no colour for: neutral, drawn, never dropped
MISS_COLOR = "#8c959f"    # a miss (recomputed): neither tier
TOTAL_COLOR = "black"     # a figure of no one tier (all hits, GPU + host)
GIB = 1 << 30
# Runs (the TTFT CDFs, the comparison's bars): hues at least 30 degrees off the three tiers' (no blue, orange or
# purple: a run's bar next to the hit split's must not read as a tier), or greys; tests/commands/test_report.py checks
# it.
RUN_COLORS = ("#222222", "#2ca02c", "#e377c2", "#7f7f7f", "#bcbd22", "#006d5b", "#c51b7d", "#66a61e")
MAX_BAD_LINES_SHOWN = 50
_BINS = 60  # time bins per chart: one per second of a one-minute run, coarser for longer ones
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


def _percentile(values: Sequence[float], p: float) -> float | None:
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
            "ttft_p50_s": _percentile(run.ttfts, 0.50),
            "ttft_p99_s": _percentile(run.ttfts, 0.99),
            "e2e_p50_s": _percentile(run.e2es, 0.50),
            "e2e_p99_s": _percentile(run.e2es, 0.99),
            "ttft_by_source": {k: {"requests": len(run.ttft_by_source.get(k, [])),
                                   "p50_s": _percentile(run.ttft_by_source.get(k, []), 0.50),
                                   "p99_s": _percentile(run.ttft_by_source.get(k, []), 0.99)}
                               for k, _ in PREFIX_SOURCES},
            "hit_rate": hr["cumulative"],
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


# ---------------------------------------------------------------------------------------------- deltas

# (label, summary key, kind, better): kind "rate" compares as a ratio; "seconds" too (lower is better); "share"
# (a hit rate) as percentage points and as a ratio. The shares of the GPU and of the host are "neutral": a host
# tier moves hits from one to the other (the GPU's share falls as the total rises), so only the total hit rate is
# better or worse.
DELTA_METRICS = (
    ("output tokens/s", "output_tokens_per_s", "rate", "higher"),
    ("requests/s", "requests_per_s", "rate", "higher"),
    ("TTFT p50", "ttft_p50_s", "seconds", "lower"),
    ("TTFT p99", "ttft_p99_s", "seconds", "lower"),
    ("e2e p50", "e2e_p50_s", "seconds", "lower"),
    ("e2e p99", "e2e_p99_s", "seconds", "lower"),
    ("hit rate", "hit_rate", "share", "higher"),
    ("hit from GPU", "gpu_hit_rate", "share", "neutral"),
    ("hit from host", "host_hit_rate", "share", "neutral"),
)


def deltas(base: dict[str, Any], other: dict[str, Any]) -> list[dict[str, Any]]:
    """``other`` against ``base`` (two run summaries), metric by metric: both values, the difference (for hit
    rates in percentage points) and the change in percent of the base; None where either is unknown."""
    out = []
    for label, key, kind, better in DELTA_METRICS:
        a, b = base.get(key), other.get(key)
        diff: float | None = None
        pct: float | None = None
        if isinstance(a, (int, float)) and isinstance(b, (int, float)):
            diff = b - a
            pct = 100.0 * diff / a if a else None
        out.append({"metric": label, "key": key, "kind": kind, "better": better, "base": a, "value": b,
                    "delta": diff, "delta_pct": pct})
    return out


def direction(d: dict[str, Any]) -> str | None:
    """"better", "worse", or None (no change, unknown, or a neutral share) for one of :func:`deltas`' rows."""
    if d["delta"] is None or d["delta"] == 0 or d["better"] not in ("higher", "lower"):
        return None
    return "better" if (d["delta"] > 0) == (d["better"] == "higher") else "worse"


def _ms(seconds: float) -> str:
    ms = 1000 * seconds
    return f"{ms:,.1f} ms" if abs(ms) < 10 else f"{ms:,.0f} ms"


def _class_gaps(summary: dict[str, Any]) -> str | None:
    """"a host hit costs 19 ms more than a GPU hit and saves 67 ms against a miss": TTFT p50 by prefix source."""
    by = summary.get("ttft_by_source") or {}
    p50 = {k: (by.get(k) or {}).get("p50_s") for k, _ in PREFIX_SOURCES}
    host, gpu, miss = p50["host_hit"], p50["gpu_hit"], p50["miss"]
    if host is None:
        if gpu is not None and miss is not None:
            return f"a GPU hit saves {_ms(miss - gpu)} against a miss (TTFT p50)"
        return None
    parts = []
    if gpu is not None:
        parts.append(f"costs {_ms(host - gpu)} more than a GPU hit" if host >= gpu
                     else f"is {_ms(gpu - host)} faster than a GPU hit")
    if miss is not None:
        parts.append(f"saves {_ms(miss - host)} against a miss" if miss >= host
                     else f"costs {_ms(host - miss)} more than a miss")
    return ("a host hit " + " and ".join(parts) + " (TTFT p50)") if parts else None


def answer_sentences(runs: Sequence[RunData]) -> list[str]:
    """The report's answer, one sentence per run against the first (the baseline): "with 64 GB host against no host
    cache: TTFT p50 -44.0%, output tok/s +24.0%, hit rate +30.1 pt; a host hit costs 19 ms more than a GPU hit and
    saves 67 ms against a miss (TTFT p50)". One run alone: its own figures. Plain text (the page escapes it)."""
    out: list[str] = []
    if not runs:
        return out
    if len(runs) == 1:
        r = runs[0].summary
        figures = [f"TTFT p50 {cell(r.get('ttft_p50_s'), 'ms')}",
                   f"output tok/s {cell(r.get('output_tokens_per_s'), 'num')}",
                   f"hit rate {cell(r.get('hit_rate'), 'pct')} (GPU {cell(r.get('gpu_hit_rate'), 'pct')}, host "
                   f"{cell(r.get('host_hit_rate'), 'pct')})"]
        gaps = _class_gaps(r)
        return [f"{r['label']}: " + ", ".join(figures) + (f"; {gaps}" if gaps else "")]
    base = runs[0].summary
    for run in runs[1:]:
        r = run.summary
        if r.get("host_size") != base.get("host_size"):
            head = f"with {r['host_size']} ({r['name']}) against {base['host_size']} ({base['name']})"
        else:
            head = f"{r['label']} against {base['name']}"
        ds = {d["key"]: d for d in deltas(base, r)}
        figures = []
        for key, label in (("ttft_p50_s", "TTFT p50"), ("output_tokens_per_s", "output tok/s")):
            pct = ds[key]["delta_pct"]
            if pct is not None:
                figures.append(f"{label} {_signed(pct, '%')}")
        if ds["hit_rate"]["delta"] is not None:
            figures.append(f"hit rate {_signed(100 * ds['hit_rate']['delta'], ' pt')}")
        gaps = _class_gaps(r)
        out.append(head + ": " + (", ".join(figures) or "no figures to compare") + (f"; {gaps}" if gaps else ""))
    return out


def _signed(v: float, unit: str) -> str:
    """``+12.3%``; a change that rounds to nothing is "+0.0", never "-0.0"."""
    r = round(v, 1)
    return f"{0.0 if r == 0 else r:+.1f}{unit}"


def delta_text(d: dict[str, Any]) -> str:
    """"+12.3% (1,234 -> 1,386 tok/s)" style, for the terminal and the page."""
    kind, a, b, diff, pct = d["kind"], d["base"], d["value"], d["delta"], d["delta_pct"]
    if diff is None:
        return "n/a"
    if kind == "share":
        return f"{_signed(100 * diff, ' pt')} ({100 * a:.1f}% -> {100 * b:.1f}%)"
    unit = (lambda v: f"{1000 * v:,.1f} ms") if kind == "seconds" else (lambda v: f"{v:,.1f}")
    rel = "n/a" if pct is None else _signed(pct, "%")
    return f"{rel} ({unit(a)} -> {unit(b)})"


# ---------------------------------------------------------------------------------------------- charts

def matplotlib_missing(command: str = "kvtop report") -> str | None:
    """The one line to say when the charts cannot be drawn (matplotlib is the `report` extra), or None. Asked
    before any work: ``kvtop sim --plot`` would otherwise run a whole sweep and fail at its end."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return f"{command} needs matplotlib: pip install '{DISTRIBUTION}[report]'"
    return None


def _plt() -> Any:
    missing = matplotlib_missing()
    if missing:
        raise RuntimeError(missing)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # text.parse_math off: run names are file names and user strings ("exp_$1_$2"), which mathtext would try
    # to typeset (and raise on); no label of the report is meant as math.
    plt.rcParams.update({"figure.dpi": 100, "axes.spines.top": False, "axes.spines.right": False,
                         "axes.grid": True, "grid.alpha": 0.3, "font.size": 10, "text.parse_math": False})
    return plt


def _end_label(ax: Any, xs: Sequence[float], ys: Sequence[float | None], text: str, color: str) -> None:
    """Queue `text` for the last point of a line; `_place_labels` writes them without overlaps, so the
    chart reads without a legend."""
    for x, y in zip(reversed(xs), reversed(ys)):
        if y is not None and not (isinstance(y, float) and math.isnan(y)):
            labels = ax.__dict__.setdefault("_kvtop_labels", [])
            labels.append((x, float(y), text, color))
            return


def _place_labels(ax: Any) -> None:
    """Write queued end labels to the right of the data, nudged apart vertically (>= 7% of the axis)."""
    labels = sorted(ax.__dict__.pop("_kvtop_labels", []), key=lambda item: item[1])
    if not labels:
        return
    x0, x1 = ax.get_xlim()
    ax.set_xlim(x0, x1 + (x1 - x0) * 0.22)  # room for the labels inside the axes
    y0, y1 = ax.get_ylim()
    gap = (y1 - y0) * 0.07
    placed: list[float] = []
    for _, y, _, _ in labels:
        # never on the axis line itself (a series that ends at 0 labelled its end across the x axis)
        placed.append(max(y, placed[-1] + gap) if placed else max(y, y0 + gap / 2))
    overflow = placed[-1] - (y1 - gap / 2)
    if overflow > 0:  # shift the stack down, but not below the axis
        placed = [max(p - overflow, y0 + gap * i) for i, p in enumerate(placed)]
    for (x, y, text, color), py in zip(labels, placed):
        ax.annotate(text, (x, y), xytext=(x1 + (x1 - x0) * 0.01, py), textcoords="data", color=color, fontsize=9,
                    va="center", ha="left", arrowprops={"arrowstyle": "-", "color": color, "lw": 0.5,
                                                         "alpha": 0.6})


def _bins(run: RunData) -> list[tuple[float, float, Sample, Sample]]:
    """(start, end, sample at start, sample at end) over about _BINS equal time bins."""
    if len(run.samples) < 2:
        return []
    # The largest time, not the last: records of several sources interleave, and one far ahead (a clock that
    # jumped) must widen the bins, never make the edge walk there one bin at a time (it hung on a 1e12 jump).
    total = max(s.t for s in run.samples)
    width = max(total / _BINS, 1e-6)
    out: list[tuple[float, float, Sample, Sample]] = []
    prev = run.samples[0]
    edge = width
    for s in run.samples[1:]:
        if s.t >= edge or s is run.samples[-1]:
            if s.t > prev.t:
                out.append((prev.t, s.t, prev, s))
            prev = s
            if edge <= s.t:
                edge = (math.floor(s.t / width) + 1) * width
    return out


def _run_tiers(run: RunData) -> list[str]:
    """Every tier any sample of the run had, in the fold's order (GPU, host, then disk)."""
    names: dict[str, None] = {}
    for s in run.samples:
        names.update(dict.fromkeys(s.tiers))
    return list(names)


def _tier_name(tier: str) -> str:
    """A tier as the charts name it: "GPU", "host", "disk" (the report's lower case, not the dashboard's "Host")."""
    return "GPU" if tier == "gpu" else tier


def occupancy_series(run: RunData) -> list[tuple[str, str, str, list[float], list[float | None]]]:
    """What the occupancy chart draws, in drawing order: (label, colour, line style, times, blocks) per series.

    Per tier the run had: its capacity (dotted) and cached blocks (solid); the GPU's in-use blocks too (dashed:
    only the GPU holds running requests' blocks). A tier is left out when it has no pool (capacity 0 or unknown
    throughout) or a series when it is unknown throughout (a disk tier's occupancy under TensorRT-LLM's V2
    stats); there, host and disk in use together (the one figure those stats give) is drawn in the disk colour.
    """
    xs = [s.t for s in run.samples]
    out: list[tuple[str, str, str, list[float], list[float | None]]] = []

    def add(label: str, color: str, style: str, ys: list[int | None]) -> None:
        if any(y is not None for y in ys):
            out.append((label, color, style, xs, [None if y is None else float(y) for y in ys]))

    for tier in _run_tiers(run):
        points = [s.tiers.get(tier) for s in run.samples]
        if tier != "gpu" and not any(p is not None and p.capacity for p in points):
            continue  # no pool of that tier: nothing to draw for it
        color, name = TIER_COLORS.get(tier, OTHER_TIER_COLOR), _tier_name(tier)
        add(f"{name} capacity", color, ":", [None if p is None else p.capacity for p in points])
        add(f"{name} cached", color, "-", [None if p is None else p.cached for p in points])
        if tier == "gpu":
            add("GPU in use", color, "--", [None if p is None else p.in_use for p in points])
    add("host+disk in use", DISK_COLOR, "-.", [s.cold_in_use for s in run.samples])
    return out


def _plot_occupancy(plt: Any, runs: Sequence[RunData], path: Path) -> None:
    fig, axes = plt.subplots(len(runs), 1, figsize=(10, 3.2 * len(runs)), squeeze=False, sharex=False)
    for ax, run in zip(axes[:, 0], runs):
        for label, color, style, xs, ys in occupancy_series(run):
            thin = label == "GPU in use"  # jumps every iteration: thin, so it does not hide the cached line
            ax.plot(xs, [math.nan if y is None else y for y in ys], style, color=color, lw=0.8 if thin else 1.8,
                    alpha=0.6 if thin else 1.0)
            _end_label(ax, xs, ys, label, color)
        ax.set_title(f"{run.name}: KV cache blocks per tier")
        ax.set_xlabel("time since start (s)")
        ax.set_ylabel("blocks")
        if run.bytes_per_block:
            bpb = run.bytes_per_block
            sec = ax.secondary_yaxis("right", functions=(lambda b, k=bpb: b * k / 2**30,
                                                          lambda g, k=bpb: g * 2**30 / k))
            sec.set_ylabel("GiB")
        ax.set_ylim(bottom=0, top=max(1.0, ax.get_ylim()[1] * 1.08))
        _place_labels(ax)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _plot_hit_rate(plt: Any, runs: Sequence[RunData], path: Path) -> None:
    fig, axes = plt.subplots(len(runs), 1, figsize=(10, 3.0 * len(runs)), squeeze=False)
    for ax, run in zip(axes[:, 0], runs):
        mids, widths, gpu, host = [], [], [], []
        for a, b, s0, s1 in _bins(run):
            lookups = s1.lookups - s0.lookups
            if lookups <= 0:
                continue
            hh = s1.host_hits - s0.host_hits
            mids.append((a + b) / 2)
            widths.append((b - a) * 0.9)
            host.append(100.0 * hh / lookups)
            gpu.append(100.0 * (s1.hits - s0.hits - hh) / lookups)
        if mids:
            # bars, not a line: each value is a count over its bin
            ax.bar(mids, gpu, widths, color=GPU_COLOR)
            ax.bar(mids, host, widths, bottom=gpu, color=HOST_COLOR)
            total = [g + h for g, h in zip(gpu, host)]
            mean_gpu = sum(gpu) / len(gpu)
            _end_label(ax, mids, [mean_gpu] * len(mids), "served from GPU", GPU_COLOR)
            if any(host):
                _end_label(ax, mids, [mean_gpu + sum(host) / len(host)] * len(mids), "served from host", HOST_COLOR)
            cum = run.summary.get("hit_rate")
            if cum is not None:
                # over the data only: a line across the whole axes ran through its own label
                ax.plot([mids[0] - widths[0] / 2, mids[-1] + widths[-1] / 2], [100 * cum] * 2, color="black",
                        lw=0.8, ls="--")
                _end_label(ax, mids, [100 * cum] * len(mids), f"all hits, whole run: {100 * cum:.1f}%", "black")
            ax.set_ylim(0, max(100.0, max(total) + 5))
        else:
            ax.text(0.5, 0.5, "no block lookups recorded", transform=ax.transAxes, ha="center")
        _place_labels(ax)
        ax.set_title(f"{run.name}: block hit rate per time bin, by serving tier")
        ax.set_xlabel("time since start (s)")
        ax.set_ylabel("hit rate (% of block lookups)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _plot_moves(plt: Any, runs: Sequence[RunData], path: Path) -> None:
    fig, axes = plt.subplots(len(runs), 1, figsize=(10, 3.0 * len(runs)), squeeze=False)
    for ax, run in zip(axes[:, 0], runs):
        bins = _bins(run)
        mids = [(a + b) / 2 for a, b, _, _ in bins]
        drawn = False
        for attr, label, color, style in (
                ("offloaded", "offload GPU->host", HOST_COLOR, "-"),
                ("onboarded", "onboard host->GPU", GPU_COLOR, "-"),
                ("evicted_gpu", "evicted from GPU", GPU_COLOR, ":"),
                ("evicted_host", "evicted from host", HOST_COLOR, ":")):
            ys = [(getattr(s1, attr) - getattr(s0, attr)) / (b - a) for a, b, s0, s1 in bins]
            if not ys or not any(ys):
                continue
            ax.plot(mids, ys, style, color=color, lw=1.6)
            _end_label(ax, mids, ys, label, color)
            drawn = True
        if not drawn:
            ax.text(0.5, 0.5, "no block moves recorded", transform=ax.transAxes, ha="center")
        ax.set_title(f"{run.name}: block moves")
        ax.set_xlabel("time since start (s)")
        ax.set_ylabel("blocks per second")
        ax.set_ylim(bottom=0)
        _place_labels(ax)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _plot_ttft(plt: Any, runs: Sequence[RunData], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(10, 4))
    with_data = [r for r in runs if r.ttfts]
    if len(with_data) == 1:
        run = with_data[0]
        ms = [1000 * t for t in run.ttfts]
        ax.hist(ms, bins=40, color=RUN_COLORS[0], alpha=0.8)
        for p, style in ((0.5, "--"), (0.99, ":")):
            v = _percentile(ms, p)
            if v is not None:
                ax.axvline(v, color="black", ls=style, lw=1)
                ax.annotate(f"p{int(p * 100)} {v:.1f} ms", (v, 1), xycoords=("data", "axes fraction"),
                            xytext=(3, -12), textcoords="offset points", fontsize=9)
        ax.set_ylabel("requests")
        ax.set_title(f"{run.name}: time to first token ({len(ms):,} requests)")
    elif with_data:
        for i, run in enumerate(with_data):
            ms = sorted(1000 * t for t in run.ttfts)
            ys = [100.0 * (k + 1) / len(ms) for k in range(len(ms))]
            color = RUN_COLORS[i % len(RUN_COLORS)]
            ax.step(ms, ys, where="post", color=color, lw=1.6)
            # At each run's p50, placed by _place_labels so that two runs' names never overlap.
            mid = len(ms) // 2
            _end_label(ax, ms[: mid + 1], ys[: mid + 1], run.name, color)
        _place_labels(ax)
        ax.set_ylabel("requests with TTFT <= x (%)")
        ax.set_title("time to first token, cumulative distribution per run")
    else:
        ax.text(0.5, 0.5, "no request records with a TTFT", transform=ax.transAxes, ha="center")
    ax.set_xlabel("time to first token (ms)")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _bar_values(ax: Any, rects: Any, values: Sequence[float | None], fmt: str) -> None:
    """One value over each bar, inside the axes: one line each, centred on its bar, so neighbours never meet
    (the chart is sized for the bars to be wider than their labels)."""
    for rect, v in zip(rects, values):
        ax.annotate("n/a" if v is None else fmt.format(v), (rect.get_x() + rect.get_width() / 2,
                    rect.get_y() + rect.get_height()), xytext=(0, 2), textcoords="offset points",
                    ha="center", va="bottom", fontsize=8)


def _plot_compare(plt: Any, runs: Sequence[RunData], path: Path) -> None:
    names = [r.name for r in runs]
    colors = [RUN_COLORS[i % len(RUN_COLORS)] for i in range(len(runs))]
    fig, axes = plt.subplots(1, 4, figsize=(16, 4.4))
    xs = list(range(len(runs)))

    ax = axes[0]
    tps = [r.summary.get("output_tokens_per_s") for r in runs]
    _bar_values(ax, ax.bar(xs, [0.0 if v is None else v for v in tps], color=colors, width=0.6), tps, "{:,.0f}")
    ax.set_title("throughput (output tokens/s)")
    ax.set_ylim(0, max([v or 0 for v in tps] + [1]) * 1.18)
    ax.set_xticks(xs)
    ax.set_xticklabels(names, rotation=15, ha="right")

    # TTFT p50 and p99 per run: groups of two bars, the percentile named on the axis (not over the bars), each
    # tick in its run's colour. Not the run's name under every bar: two 16-character run ids ("multi-turn-18573")
    # under 0.4-wide bars overlapped; the first panel names the runs in the same colours.
    ax = axes[1]
    width = 0.4
    ticks, labels = [], []
    top = 0.0
    for off, key, hatch in ((-width / 2, "ttft_p50_s", ""), (width / 2, "ttft_p99_s", "//")):
        ms = [None if r.summary.get(key) is None else 1000 * r.summary[key] for r in runs]
        top = max([top] + [v or 0 for v in ms])
        rects = ax.bar([x + off for x in xs], [0 if v is None else v for v in ms], width * 0.95, color=colors,
                       hatch=hatch, edgecolor="white")
        _bar_values(ax, rects, ms, "{:.3g}")
        ticks += [x + off for x in xs]
        labels += [key[5:8] for _ in names]
    ax.set_xticks(ticks)
    ax.set_xticklabels(labels, fontsize=8)
    for tick, c in zip(ax.get_xticklabels(), colors + colors):
        tick.set_color(c)
    ax.set_ylim(0, max(top, 1e-3) * 1.18)
    ax.set_title("TTFT (ms): p50 solid, p99 hatched")

    # TTFT p50 by where the prefix came from: one group per source, one bar per run.
    ax = axes[2]
    n = max(len(runs), 1)
    width = 0.8 / n
    top = 0.0
    for i, run in enumerate(runs):
        by = run.summary.get("ttft_by_source") or {}
        ms = [None if (by.get(k) or {}).get("p50_s") is None else 1000 * by[k]["p50_s"] for k, _ in PREFIX_SOURCES]
        top = max([top] + [v or 0 for v in ms])
        rects = ax.bar([g + (i - (n - 1) / 2) * width for g in range(len(PREFIX_SOURCES))],
                       [0 if v is None else v for v in ms], width * 0.95, color=colors[i])
        _bar_values(ax, rects, ms, "{:.3g}")
    ax.set_xticks(range(len(PREFIX_SOURCES)))
    ax.set_xticklabels([label for _, label in PREFIX_SOURCES])
    for tick, c in zip(ax.get_xticklabels(), (GPU_COLOR, HOST_COLOR, MISS_COLOR)):
        tick.set_color(c)
    ax.set_ylim(0, max(top, 1e-3) * 1.18)
    ax.set_title("TTFT p50 (ms) by prefix source")

    ax = axes[3]
    gpu = [100 * (r.summary.get("gpu_hit_rate") or 0) for r in runs]
    host = [100 * (r.summary.get("host_hit_rate") or 0) for r in runs]
    ax.bar(xs, gpu, color=GPU_COLOR, width=0.6)
    ax.bar(xs, host, bottom=gpu, color=HOST_COLOR, width=0.6)
    for x, g, h in zip(xs, gpu, host):
        # Inside a segment only where it is tall enough for its two lines (12% of the axis), else nothing:
        # the total above the bar and the page's table carry the figure.
        if g > 12:
            ax.text(x, g / 2, f"GPU\n{g:.1f}%", ha="center", va="center", color="white", fontsize=8)
        if h > 12:
            ax.text(x, g + h / 2, f"host\n{h:.1f}%", ha="center", va="center", color="white", fontsize=8)
        ax.text(x, g + h + 1, f"{g + h:.1f}%", ha="center", va="bottom", fontsize=8)
    ax.set_title("block hit rate, by serving tier (%)")
    ax.set_ylim(0, 112)
    ax.set_xticks(xs)
    ax.set_xticklabels(names, rotation=15, ha="right")
    for a in (axes[0], axes[3]):
        for tick, c in zip(a.get_xticklabels(), colors):
            tick.set_color(c)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def plot_sweep(runs: Sequence[dict[str, Any]], path: str | Path) -> None:
    """Hit rate against host cache size (`kvtop sim --host-cache 0,2GB,8GB --plot FILE.png`).

    `runs`: dicts with `host_cache_bytes` and `cache_hit_rate` (0..1); `onboarded_blocks` and
    `reused_blocks`, when present, split each point's hit rate into the share served from host.
    """
    plt = _plt()
    pts = sorted((float(r["host_cache_bytes"]), float(r["cache_hit_rate"]), r) for r in runs)
    fig, ax = plt.subplots(figsize=(8, 4.5))
    xs = [p[0] / GIB for p in pts]
    ys = [100 * p[1] for p in pts]
    ax.plot(xs, ys, "o-", color=TOTAL_COLOR, lw=1.8)
    every = max(1, -(-len(xs) // 8))  # at most 8 labels: a 16-size curve labelled at every point is unreadable
    for i, (x, y) in enumerate(zip(xs, ys)):
        if i % every == 0 or i == len(xs) - 1:
            ax.annotate(f"{y:.1f}%", (x, y), xytext=(0, 6), textcoords="offset points", ha="center", fontsize=9)
    gpu_only = []
    for (_, rate, r), x in zip(pts, xs):
        lookups = (r.get("reused_blocks") or 0) + (r.get("missed_blocks") or 0)
        onboarded = r.get("onboarded_blocks")
        if lookups and isinstance(onboarded, int):
            gpu_only.append((x, 100 * (rate - onboarded / lookups)))
    if len(gpu_only) == len(xs) and xs:
        ax.plot(xs, [g for _, g in gpu_only], "s--", color=GPU_COLOR, lw=1.2)
        _end_label(ax, xs, [g for _, g in gpu_only], "served from GPU", GPU_COLOR)
        _end_label(ax, xs, ys, "all hits (GPU + host)", TOTAL_COLOR)
    optimum = [100 * float(p[2]["belady_hit_rate"]) for p in pts if p[2].get("belady_hit_rate") is not None]
    if len(optimum) == len(xs) and xs:
        # the offline bound (kvtop sim --belady): how far TensorRT-LLM's policy is from any policy's best
        ax.plot(xs, optimum, "^:", color="0.35", lw=1.4)
        _end_label(ax, xs, optimum, "optimal (Belady, offline)", "0.35")
        if len(gpu_only) != len(xs):
            _end_label(ax, xs, ys, "TensorRT-LLM's policy (simulated)", TOTAL_COLOR)
        ys = ys + optimum
    ax.set_xlabel("host cache size (GiB)")
    ax.set_ylabel("block hit rate (% of lookups)")
    ax.set_title("hit rate against host cache size")
    ax.set_ylim(0, max(100.0, max(ys, default=0) + 8))
    _place_labels(ax)
    fig.tight_layout()
    fig.savefig(str(path))
    plt.close(fig)


# ---------------------------------------------------------------------------------------------- page

def cell(v: Any, kind: str) -> str:
    if v is None:
        return "n/a"
    if kind == "pct":
        return f"{100 * v:.1f}%"
    if kind == "ms":
        return f"{1000 * v:.1f} ms"
    if kind == "num":
        return f"{v:,.1f}"
    if kind == "int":
        return f"{v:,}"
    if kind == "gib":
        return f"{v / GIB:.2f} GiB"
    return html.escape(str(v))


# The runs' table, one row per figure and one column per run (25 columns across were cut off at 1280 px).
_TABLE = (
    ("file", "path", "str"), ("recorded as", "run_name", "str"), ("engine", "engine", "str"),
    ("scenario", "scenario", "str"), ("concurrency", "concurrency", "str"),
    ("GPU pool", "gpu_pool_bytes", "gib"), ("GPU blocks", "gpu_blocks", "int"),
    ("host pool", "host_pool_bytes", "gib"), ("host blocks", "host_blocks", "int"),
    ("requests", "requests_completed", "int"),
    ("failed", "requests_failed", "int"), ("duration s", "duration_s", "num"),
    ("requests/s", "requests_per_s", "num"), ("output tok/s", "output_tokens_per_s", "num"),
    ("TTFT p50", "ttft_p50_s", "ms"), ("TTFT p99", "ttft_p99_s", "ms"), ("e2e p50", "e2e_p50_s", "ms"),
    ("e2e p99", "e2e_p99_s", "ms"), ("hit rate", "hit_rate", "pct"),
    ("from GPU", "gpu_hit_rate", "pct"), ("from host", "host_hit_rate", "pct"),
    ("offloaded", "offloaded_blocks", "int"), ("onboarded", "onboarded_blocks", "int"),
    ("what-if host x2", "wi2", "pct"), ("what-if host x4", "wi4", "pct"), ("bad lines", "bad_lines", "int"),
)


def _answer(runs: Sequence[RunData]) -> list[str]:
    """The first screen: the answer in sentences, each run against the first (pools first, then the figures, rows
    by metric and a column per run), then TTFT by prefix source."""
    parts: list[str] = ["<div class='answer'>"]
    parts += [f"<p>{html.escape(line)}</p>" for line in answer_sentences(runs)]
    parts.append("</div>")
    if len(runs) >= 2:
        base = runs[0]
        parts.append(f"<h2>Each run against the first: {html.escape(base.summary['label'])}</h2>"
                     "<table><tr><th>metric</th>"
                     f"<th>{html.escape(base.summary['label'])}</th>")
        for r in runs[1:]:
            parts.append(f"<th>{html.escape(r.summary['label'])}</th><th>change</th>")
        parts.append("</tr>")
        for label, key in (("host pool", "host_pool_bytes"), ("GPU pool", "gpu_pool_bytes")):
            parts.append(f"<tr><td>{label}</td><td>{cell(base.summary.get(key), 'gib')}</td>")
            parts += [f"<td>{cell(r.summary.get(key), 'gib')}</td><td></td>" for r in runs[1:]]
            parts.append("</tr>")
        rows = [deltas(base.summary, r.summary) for r in runs[1:]]
        for i, (label, key, kind, better) in enumerate(DELTA_METRICS):
            fmt = {"rate": "num", "seconds": "ms", "share": "pct"}[kind]
            note = "share of lookups" if better == "neutral" else f"{better} is better"
            parts.append(f"<tr><td>{html.escape(label)} <small>({note})</small></td>"
                         f"<td>{cell(base.summary.get(key), fmt)}</td>")
            for r, ds in zip(runs[1:], rows):
                d = ds[i]
                way = direction(d)
                cls = " class='good'" if way == "better" else " class='bad'" if way == "worse" else ""
                change = ("n/a" if d["delta"] is None else
                          _signed(100 * d["delta"], " pt") if kind == "share" else
                          "n/a" if d["delta_pct"] is None else _signed(d["delta_pct"], "%"))
                parts.append(f"<td>{cell(r.summary.get(key), fmt)}</td><td{cls}>{change}</td>")
            parts.append("</tr>")
        parts.append("</table>")
    parts.append("<h2>TTFT by where the prefix came from</h2><p>Each finished request by its prompt's reused "
                 "blocks: <span class='gpu'>GPU hit</span> (reused, all from the GPU), <span class='host'>host "
                 "hit</span> (some onboarded from host memory), <span class='miss'>miss</span> (nothing reused)."
                 "</p><table><tr><th>run</th>")
    for _, label in PREFIX_SOURCES:
        parts.append(f"<th>{label}: requests</th><th>p50</th><th>p99</th>")
    parts.append("</tr>")
    for r in runs:
        by = r.summary.get("ttft_by_source") or {}
        parts.append(f"<tr><td>{html.escape(r.summary['label'])}</td>")
        for k, _ in PREFIX_SOURCES:
            b = by.get(k) or {}
            parts.append(f"<td>{cell(b.get('requests'), 'int')}</td><td>{cell(b.get('p50_s'), 'ms')}</td>"
                         f"<td>{cell(b.get('p99_s'), 'ms')}</td>")
        parts.append("</tr>")
    parts.append("</table>")
    return parts


def _page(runs: Sequence[RunData], images: dict[str, Path], note: str | None = None) -> str:
    css = ("body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}"
           "table{border-collapse:collapse;font-size:13px}th,td{border:1px solid #ccc;padding:4px 8px;"
           "text-align:right}th{background:#f3f3f3}td:first-child,th:first-child{text-align:left}"
           "img{max-width:100%;border:1px solid #eee;margin:0.5em 0}.bad{color:#cf222e}.good{color:#1a7f37}"
           ".answer p{font-size:17px;margin:0.4em 0}.answer{border-left:4px solid #888;padding-left:0.8em}"
           f".gpu{{color:{GPU_COLOR};font-weight:bold}}.host{{color:{HOST_COLOR};font-weight:bold}}"
           f".miss{{color:{MISS_COLOR};font-weight:bold}}")
    # A disk tier (TensorRT-LLM's disk cache) is named, and gets its row, only where a run had one.
    disk = any(r.summary.get("disk_blocks") is not None for r in runs)
    tiers = ("<span class='gpu'>GPU (HBM)</span>, <span class='host'>host (pinned DRAM)</span> and disk "
             "(TensorRT-LLM's disk cache)" if disk else
             "<span class='gpu'>GPU (HBM)</span> and <span class='host'>host (pinned DRAM)</span>")
    parts = ["<!DOCTYPE html><html><head><meta charset='utf-8'><title>kvtop report</title>",
             f"<style>{css}</style></head><body>", "<h1>kvtop report</h1>"]
    parts += _answer(runs)
    parts.append(f"<p>Tiers: {tiers}, in these colours in every chart. Hit rates are block-based (TensorRT-LLM's "
                 "reusedBlocks / (reused + missed)); changes in <span class='good'>green</span> are better, in "
                 "<span class='bad'>red</span> worse (the GPU's and the host's shares of the hits are neither: a "
                 "host tier moves hits between them; the total is what counts); the what-if rows estimate the hit "
                 "rate with a 2x / 4x larger host cache from the run's own evictions. Sizes in GiB "
                 "(2<sup>30</sup> bytes).</p>")
    if note:
        parts.append(f"<p class='bad'>{html.escape(note)}</p>")
    table = list(_TABLE)
    if disk:
        table.insert(9, ("disk blocks", "disk_blocks", "int"))
    parts.append("<h2>Runs</h2><table><tr><th>run</th>")
    parts += [f"<th>{html.escape(r.summary['label'])}</th>" for r in runs]
    parts.append("</tr>")
    shown = []
    for run in runs:
        s = dict(run.summary)
        s["wi2"] = s["what_if"].get("host_x2_hit_rate")
        s["wi4"] = s["what_if"].get("host_x4_hit_rate")
        s["path"] = run.path.name
        shown.append(s)
    for head, key, kind in table:
        parts.append(f"<tr><td>{html.escape(head)}</td>" + "".join(f"<td>{cell(s.get(key), kind)}</td>"
                                                                   for s in shown) + "</tr>")
    parts.append("</table>")
    for run in runs:
        meta = ", ".join(f"{k}={v}" for k, v in run.meta.items() if v is not None and k in (
            "engine_version", "model", "gpu", "tokens_per_block", "primary_blocks", "secondary_blocks",
            "disk_blocks"))
        parts.append(f"<p><b>{html.escape(run.name)}</b> ({html.escape(str(run.path))}, {run.records:,} records"
                     f"{'; ' + html.escape(meta) if meta else ''})</p>")
        if run.bad_lines:
            parts.append(f"<p class='bad'>{len(run.bad_lines):,} bad line(s) skipped:</p><ul class='bad'>")
            for line, why in run.bad_lines[:MAX_BAD_LINES_SHOWN]:
                parts.append(f"<li>line {line}: {html.escape(why)}</li>")
            if len(run.bad_lines) > MAX_BAD_LINES_SHOWN:
                parts.append(f"<li>... and {len(run.bad_lines) - MAX_BAD_LINES_SHOWN:,} more</li>")
            parts.append("</ul>")
    captions = {
        "compare": "Runs side by side: throughput, time to first token (p50 solid, p99 hatched), hit rate by tier.",
        "occupancy": "Blocks per tier over time: cached (reusable) and in use (held by running requests), "
                     "against the pool's capacity." + (
                         " Host and disk in use together where TensorRT-LLM's V2 stats give only their sum."
                         if any(s.cold_in_use is not None for r in runs for s in r.samples) else ""),
        "hit_rate": "Share of block lookups served from the GPU tier and from the host tier, per time bin; the "
                    "rest were misses (recomputed).",
        "moves": "Block moves per second: offloads to host, onboards back to GPU, evictions from each tier.",
        "ttft": "Time to first token as each request saw it.",
    }
    for key in ("compare", "occupancy", "hit_rate", "moves", "ttft"):
        if key in images:
            data = base64.b64encode(images[key].read_bytes()).decode("ascii")
            parts.append(f"<h2>{key.replace('_', ' ')}</h2><p>{html.escape(captions[key])}</p>"
                         f"<img alt='{key}' src='data:image/png;base64,{data}'>")
    parts.append("</body></html>")
    return "\n".join(parts)


def build_report(paths: Sequence[str | Path], out_dir: str | Path, warmup_requests: int = 0,
                 charts: bool = True) -> dict[str, Any]:
    """Fold every recording (each run of it apart: :func:`load_runs`), write the charts, `summary.json` and
    `index.html` into `out_dir`. ``charts=False`` writes the page and the summary without charts (no matplotlib).

    Returns `{"runs": [summary per run], "sentences": [...], "files": [paths written], "bad_lines": {path: [(line,
    why)]}}`. Raises FileNotFoundError for a missing recording, RuntimeError for charts without matplotlib,
    NotARecording (nothing written) where a file holds no kvtop record at all.
    """
    plt = _plt() if charts else None
    out = Path(out_dir)
    runs = [r for p in paths for r in load_runs(p, warmup_requests)]
    not_recordings = _not_recordings(paths, runs)
    if not_recordings:  # before anything is written: a report of a log file would read as a run with no data
        raise NotARecording(not_recordings)
    out.mkdir(parents=True, exist_ok=True)
    seen: dict[str, int] = {}
    for r in runs:  # two recordings of one file name in two directories: tell them apart by path
        seen[r.name] = seen.get(r.name, 0) + 1
    for r in runs:
        if seen[r.name] > 1:
            r.name = f"{r.name} ({r.path})"
            r.summary["name"] = r.name
            r.summary["label"] = f"{r.name} ({r.summary['host_size']})"
    charted = [r for r in runs if r.charted]
    images: dict[str, Path] = {}
    if charted and plt is not None:
        plotters = [("occupancy", _plot_occupancy), ("hit_rate", _plot_hit_rate), ("moves", _plot_moves),
                    ("ttft", _plot_ttft)]
        if len(charted) > 1:
            plotters.insert(0, ("compare", _plot_compare))
        for key, fn in plotters:
            path = out / f"{key}.png"
            fn(plt, charted, path)
            images[key] = path
    sentences = answer_sentences(runs)
    summary = {"runs": [r.summary for r in runs],
               "sentences": sentences,
               "deltas": {r.name: deltas(runs[0].summary, r.summary) for r in runs[1:]},
               "baseline": runs[0].name if runs else None,
               "bad_lines": {str(r.path): r.bad_lines for r in runs if r.bad_lines}}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n", encoding="utf-8")
    note = None if charts else f"No charts: {matplotlib_missing()}."
    (out / "index.html").write_text(_page(runs, images, note), encoding="utf-8")
    files = [str(p) for p in images.values()] + [str(out / "summary.json"), str(out / "index.html")]
    return {**summary, "files": files}


class NotARecording(ValueError):
    """Files that hold not one kvtop record (a log, a typo'd path to another file, an empty file), named with what
    was found in them instead; ``kvtop report`` exits 3 (kvtop.problems.EXIT_NO_DATA), as ``kvtop replay`` does."""


def _not_recordings(paths: Sequence[str | Path], runs: list[RunData]) -> str:
    """"" where every file gave records; else one line naming each that gave none and why."""
    said = []
    for p in dict.fromkeys(Path(p) for p in paths):
        of = [r for r in runs if r.path == p]
        if any(r.records for r in of):
            continue
        bad = [line for r in of for line in r.bad_lines]
        if bad:
            line, why = bad[0]
            said.append(f"{p} ({len(bad):,} line{'' if len(bad) == 1 else 's'}, none a kvtop record; line {line}: "
                        f"{why})")
        else:
            said.append(f"{p} (empty)")
    if not said:
        return ""
    return ("not a kvtop recording: " if len(said) == 1 else "not kvtop recordings: ") + ", ".join(said)
