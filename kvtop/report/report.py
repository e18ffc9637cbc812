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
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvtop.engine_words import is_trtllm
from kvtop.report.charts import (
    GPU_COLOR,
    HOST_COLOR,
    MISS_COLOR,
    matplotlib_missing,
    plot_compare,
    plot_hit_rate,
    plot_moves,
    plot_occupancy,
    plot_ttft,
    pyplot,
)
from kvtop.report.runs import GIB, PREFIX_SOURCES, RunData, load_runs

__all__ = ["NotARecording", "answer_sentences", "build_report", "deltas"]


MAX_BAD_LINES_SHOWN = 50


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
    # A disk tier (TensorRT-LLM's disk cache) is named, and gets its row, only where a run had one. TensorRT-LLM's
    # words only where every run is TensorRT-LLM's (or its simulator's): a vLLM recording's page named its fields.
    trtllm = all(is_trtllm(r.meta.get("engine")) for r in runs)
    disk = any(r.summary.get("disk_blocks") is not None for r in runs)
    tiers = ("<span class='gpu'>GPU (HBM)</span>, <span class='host'>host (pinned DRAM)</span> and disk "
             + ("(TensorRT-LLM's disk cache)" if trtllm else "(the engine's disk tier)") if disk else
             "<span class='gpu'>GPU (HBM)</span> and <span class='host'>host (pinned DRAM)</span>")
    lookups = ("TensorRT-LLM's reusedBlocks / (reused + missed)" if trtllm
               else "reused blocks / blocks looked up, as the engine counts them")
    parts = ["<!DOCTYPE html><html><head><meta charset='utf-8'><title>kvtop report</title>",
             f"<style>{css}</style></head><body>", "<h1>kvtop report</h1>"]
    parts += _answer(runs)
    parts.append(f"<p>Tiers: {tiers}, in these colours in every chart. Hit rates are block-based ({lookups}); "
                 "changes in <span class='good'>green</span> are better, in "
                 "<span class='bad'>red</span> worse (the GPU's and the host's shares of the hits are neither: a "
                 "host tier moves hits between them; the total is what counts); the what-if rows estimate the hit "
                 "rate with a 2x / 4x larger host cache from the run's own evictions. Sizes in GiB "
                 "(2<sup>30</sup> bytes).</p>")
    if note:
        parts.append(f"<p class='bad'>{html.escape(note)}</p>")
    for r in runs:   # a hit rate a run's source could not give: why, and what gives it
        if r.summary.get("hit_rate_unknown_why"):
            parts.append(f"<p>{html.escape(r.summary['label'])}: {html.escape(r.summary['hit_rate_unknown_why'])}"
                         "</p>")
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
    plt = pyplot() if charts else None
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
        plotters = [("occupancy", plot_occupancy), ("hit_rate", plot_hit_rate), ("moves", plot_moves),
                    ("ttft", plot_ttft)]
        if len(charted) > 1:
            plotters.insert(0, ("compare", plot_compare))
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
