"""The charts of ``kvtop report`` (matplotlib, the ``report`` extra): occupancy, hit rate, moves and TTFT per run, the
runs side by side, and ``kvtop sim --plot``'s sweep; in kvtop's colour code (kvtop/palette.py). The runs they draw are
kvtop/report/runs.py's."""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvtop import DISTRIBUTION
from kvtop.palette import OTHER_TIER
from kvtop.palette import REPORT as TIER_PALETTE
from kvtop.report.runs import GIB, PREFIX_SOURCES, RunData, Sample, percentile

__all__ = ["DISK_COLOR", "GPU_COLOR", "HOST_COLOR", "MISS_COLOR", "RUN_COLORS", "TIER_COLORS", "matplotlib_missing",
           "occupancy_series", "plot_compare", "plot_hit_rate", "plot_moves", "plot_occupancy", "plot_sweep",
           "plot_ttft", "pyplot"]


# The tier colours: kvtop's colour code (kvtop/palette.py), as the dashboard's light theme draws them (the page is
# white): GPU, host and disk one colour each, in every chart, as in every panel of the dashboard.
GPU_COLOR = TIER_PALETTE["gpu"].in_use      # GPU tier, everywhere
HOST_COLOR = TIER_PALETTE["host"].in_use    # host tier, everywhere
DISK_COLOR = TIER_PALETTE["disk"].in_use    # disk tier (TensorRT-LLM's disk cache), everywhere
TIER_COLORS = {"gpu": GPU_COLOR, "host": HOST_COLOR, "disk": DISK_COLOR}
OTHER_TIER_COLOR = TIER_PALETTE[OTHER_TIER].in_use  # a tier kvtop has no colour for: neutral, drawn, never dropped
MISS_COLOR = "#8c959f"    # a miss (recomputed): neither tier
TOTAL_COLOR = "black"     # a figure of no one tier (all hits, GPU + host)
# Runs (the TTFT CDFs, the comparison's bars): hues at least 30 degrees off the three tiers' (no blue, orange or
# purple: a run's bar next to the hit split's must not read as a tier), or greys; tests/commands/test_report.py checks
# it.
RUN_COLORS = ("#222222", "#2ca02c", "#e377c2", "#7f7f7f", "#bcbd22", "#006d5b", "#c51b7d", "#66a61e")
_BINS = 60  # time bins per chart: one per second of a one-minute run, coarser for longer ones


def matplotlib_missing(command: str = "kvtop report") -> str | None:
    """The one line to say when the charts cannot be drawn (matplotlib is the `report` extra), or None. Asked
    before any work: ``kvtop sim --plot`` would otherwise run a whole sweep and fail at its end."""
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return f"{command} needs matplotlib: pip install '{DISTRIBUTION}[report]'"
    return None


def pyplot() -> Any:
    """matplotlib's pyplot, headless (Agg), in the report's style; without matplotlib a RuntimeError that says what
    to install."""
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


def plot_occupancy(plt: Any, runs: Sequence[RunData], path: Path) -> None:
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


def plot_hit_rate(plt: Any, runs: Sequence[RunData], path: Path) -> None:
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


def plot_moves(plt: Any, runs: Sequence[RunData], path: Path) -> None:
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


def plot_ttft(plt: Any, runs: Sequence[RunData], path: Path) -> None:
    fig, ax = plt.subplots(figsize=(10, 4))
    with_data = [r for r in runs if r.ttfts]
    if len(with_data) == 1:
        run = with_data[0]
        ms = [1000 * t for t in run.ttfts]
        ax.hist(ms, bins=40, color=RUN_COLORS[0], alpha=0.8)
        for p, style in ((0.5, "--"), (0.99, ":")):
            v = percentile(ms, p)
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


def plot_compare(plt: Any, runs: Sequence[RunData], path: Path) -> None:
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
    plt = pyplot()
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
