"""The size advice's cost on the dashboard: its fold per record, and its curve per refresh (kvtop/tiers/sizeadvice.py).

    python bench/bench_size_advice.py                 # the busy full-scale recording, 60 s (made once, kept in /tmp)
    python bench/bench_size_advice.py --seconds 120   # longer: the optimum's window of lookups fills up
    python bench/bench_size_advice.py --json

- Fold: every record of the busy recording (``tests/data/make_busy_recording.py --scale 1``, as bench/bench_ui.py
  makes it) through ``Session.emit``, this tree's session (the size advice feeding the what-if) against the same
  session with the what-if alone (what main folded), alternated, CPU time, best of ``--rounds``.
- Reads, at a quarter, half, three quarters and the end of the recording: ``session.size_advice(optimum=False)``
  (the curve: what the dashboard reads once per 5 s of model time), ``size_advice(optimum=True)`` (with Belady's
  MIN: at most once per 60 s of wall time), and ``session.what_if()`` (the x2 / x4 estimate main read once per
  model second), best of ``--repeat`` each.
- Per refresh (4 a second): the curve's cost / 20 + the optimum's / 240, against main's what-if read / 4.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))
sys.path.insert(0, str(REPO / "tests"))

from bench_ui import _busy_recording  # noqa: E402

from kvtop.records import RecordError, SourceId, read_jsonl  # noqa: E402
from kvtop.session import Session  # noqa: E402

REFRESH_S = 0.25


def _fold(records: list[Any], whatif_only: bool) -> tuple[float, Session]:
    session = Session(source=SourceId(host="sim", rank=0, run="busy"))
    if whatif_only:  # the what-if's hooks into the size advice taken off: main's fold
        session.whatif.on_level = session.whatif.on_removed = session.whatif.on_stored = None
    t0 = time.process_time()
    for rec in records:
        session.emit(rec)
    return time.process_time() - t0, session


def _best(fn: Any, repeat: int) -> float:
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--repeat", type=int, default=7)
    p.add_argument("--json", action="store_true")
    a = p.parse_args(argv)
    path = _busy_recording(a.seconds)
    records = []
    for rec in read_jsonl(path):
        if isinstance(rec, RecordError):
            raise rec
        records.append(rec)
    n = len(records)
    fold = {"size advice + what-if (this tree)": [], "what-if alone (main)": []}
    for _ in range(a.rounds):
        for label, only in (("size advice + what-if (this tree)", False), ("what-if alone (main)", True)):
            fold[label].append(_fold(records, only)[0])
    reads = []
    for frac in (0.25, 0.5, 0.75, 1.0):
        _, session = _fold(records[:int(n * frac)], False)
        sa = session.sizing
        row = {"at": frac, "onboards": len(sa._onboards), "lookups": len(sa._refs),
               "curve_ms": 1e3 * _best(lambda s=session: s.size_advice(optimum=False), a.repeat),
               "optimum_ms": 1e3 * _best(lambda s=session: s.size_advice(optimum=True), a.repeat),
               "what_if_ms": 1e3 * _best(lambda s=session: s.what_if(), a.repeat)}
        # amortised per refresh: the curve every 5 s of model time (20 refreshes), the optimum every 60 s (240)
        row["per_refresh_ms"] = row["curve_ms"] / (5 / REFRESH_S) + row["optimum_ms"] / (60 / REFRESH_S)
        row["main_per_refresh_ms"] = row["what_if_ms"] / (1 / REFRESH_S)
        reads.append(row)
    out = {"recording": str(path), "records": n, "python": platform.python_version(),
           "fold_us_per_record": {k: 1e6 * min(v) / n for k, v in fold.items()}, "reads": reads}
    if a.json:
        print(json.dumps(out))
        return 0
    print(f"{path.name}: {n:,} records, Python {out['python']}, best of {a.rounds} folds, {a.repeat} reads")
    for k, v in out["fold_us_per_record"].items():
        print(f"  fold {k:<36} {v:6.2f} us a record")
    print("  at    onboards  lookups   curve ms  +optimum ms  what_if ms  per refresh ms (main's)")
    for r in reads:
        print(f"  {r['at']:4.2f} {r['onboards']:9,} {r['lookups']:8,} {r['curve_ms']:10.2f} {r['optimum_ms']:12.2f}"
              f" {r['what_if_ms']:11.3f} {r['per_refresh_ms']:9.3f} ({r['main_per_refresh_ms']:.3f})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
