"""``kvtop report RUN.jsonl [RUN2.jsonl ...] -o DIR``: the comparison of recordings on the console, and charts with
a summary page in DIR (kvtop/report/: runs.py folds, charts.py draws, report.py compares and writes the page)."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from kvtop import DISTRIBUTION
from kvtop.report.charts import matplotlib_missing
from kvtop.report.report import (
    MAX_BAD_LINES_SHOWN,
    NotARecording,
    build_report,
    cell,
    delta_text,
    direction,
)
from kvtop.report.runs import PREFIX_SOURCES
from kvtop.textsafe import clean


def say(text: Any, file: Any = None) -> None:
    """print() for the console output of ``kvtop report``: run names, paths and reasons come from recordings,
    so each line is cleaned of control characters first (kvtop.textsafe)."""
    print(clean(text, None), file=file if file is not None else sys.stdout)


def main(argv: Sequence[str] | None = None) -> int:
    """`kvtop report RUN.jsonl [RUN2.jsonl ...] -o DIR [--warmup-requests N]`.

    Exit 0 when the report was written (bad lines are listed on stderr and in the page; without matplotlib the
    comparison is printed and the page written without charts, said on stderr), 2 on a missing file or a bad
    option, 3 (nothing written, one line) when a file holds no kvtop record: as ``kvtop replay`` of it (exit 1 is
    kvtop's own failure, kvtop.problems).
    """
    from kvtop.options import OptionParser
    from kvtop.problems import EXIT_NO_DATA

    ap = OptionParser(prog="kvtop report", description="the comparison, charts and a summary page from "
                      f"recordings (charts need matplotlib: pip install '{DISTRIBUTION}[report]')")
    ap.add_argument("recordings", nargs="+", help="JSONL recordings (kvtop --record / replay files)")
    ap.add_argument("-o", "--out", default="kvtop-report", help="output directory (default: kvtop-report)")
    ap.add_argument("--warmup-requests", type=int, default=0, help="leave the first N requests out of hit rates")
    a = ap.parse_args(list(sys.argv[1:] if argv is None else argv))
    missing = [p for p in a.recordings if not Path(p).is_file()]
    if missing:
        say(f"kvtop report: no such recording: {', '.join(missing)}", file=sys.stderr)
        return 2
    if Path(a.out).exists() and not Path(a.out).is_dir():
        say(f"kvtop report: -o {a.out}: exists and is not a directory (the report is a directory of "
               "charts and index.html)", file=sys.stderr)
        return 2
    no_plt = matplotlib_missing()
    try:
        result = build_report(a.recordings, a.out, a.warmup_requests, charts=no_plt is None)
    except NotARecording as exc:
        say(f"kvtop report: {exc}", file=sys.stderr)
        return EXIT_NO_DATA
    except RuntimeError as exc:
        say(f"kvtop report: {exc}", file=sys.stderr)
        return 2
    except OSError as exc:
        say(f"kvtop report: cannot write {a.out}: {exc.strerror or exc}", file=sys.stderr)
        return 2
    if no_plt:  # the comparison is text: printed and written without the charts
        say(f"{no_plt} (for the charts; the comparison and index.html are written without them)",
               file=sys.stderr)
    # Every line below carries strings from the recordings (run names, reasons): cleaned before the terminal.
    for path, bad in result["bad_lines"].items():
        say(f"kvtop report: {path}: {len(bad):,} bad line(s) skipped", file=sys.stderr)
        for line, why in bad[:MAX_BAD_LINES_SHOWN]:
            say(f"  line {line}: {why}", file=sys.stderr)
    # The answer first: one sentence per run against the baseline (the first run).
    for line in result["sentences"]:
        say(line)
    say("")
    for run in result["runs"]:
        say(f"{run['label']}: {cell(run['requests_completed'], 'int')} requests, hit rate "
               f"{cell(run['hit_rate'], 'pct')} (GPU {cell(run['gpu_hit_rate'], 'pct')}, host "
              f"{cell(run['host_hit_rate'], 'pct')}), TTFT p50 {cell(run['ttft_p50_s'], 'ms')}, "
              f"p99 {cell(run['ttft_p99_s'], 'ms')}"
            + (f"; {run['hit_rate_unknown_why'].removeprefix('hit rate unknown: ')}"
               if run.get("hit_rate_unknown_why") else ""))
    base = result["runs"][0] if result["runs"] else None
    for name, ds in result.get("deltas", {}).items():
        say(f"{name} against {base['name'] if base else '?'}:")
        for d in ds:
            way = direction(d)
            say(f"  {d['metric']:<15} {delta_text(d)}" + (f"  {way}" if way else ""))
    for run in result["runs"]:
        by = run.get("ttft_by_source") or {}
        say(f"{run['name']}: TTFT p50 by prefix source: " + ", ".join(
            f"{label} {cell((by.get(k) or {}).get('p50_s'), 'ms')} ({(by.get(k) or {}).get('requests', 0):,} req)"
            for k, label in PREFIX_SOURCES))
    say(f"wrote {Path(a.out) / 'index.html'}")
    return 0


__all__ = ["main", "say"]
