"""What the record boundary costs: ``records.decode`` (JSON, envelope, bounds, cleaning) and ``Session.emit``
(fold, problems bookkeeping, stale clock) per record of a recording, in CPU time.

    python bench/bench_records.py                                   # tests/data/busy.jsonl, best of 9
    python bench/bench_records.py --baseline /tmp/kvtop-before      # the same, also for another kvtop tree

``--baseline DIR``: a checkout (``git archive <commit> | tar -x -C DIR``) measured in a subprocess in the same
run, so the two figures share the machine's state. CPU time (``time.process_time``), not wall time: on a shared
machine the wall clock measures the neighbours.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUSY = ROOT / "tests" / "data" / "busy.jsonl"

_MEASURE = r"""
import json, sys, time
from kvtop.records import decode
from kvtop.session import Session
lines = open(sys.argv[1], "rb").read().splitlines()
records = [decode(line) for line in lines]
best_decode = best_emit = float("inf")
for _ in range(int(sys.argv[2])):
    t = time.process_time()
    for line in lines:
        decode(line)
    best_decode = min(best_decode, time.process_time() - t)
    session = Session(meta={})
    t = time.process_time()
    for rec in records:
        session.emit(rec)
    best_emit = min(best_emit, time.process_time() - t)
print(json.dumps({"records": len(records), "decode_us": 1e6 * best_decode / len(lines),
                  "emit_us": 1e6 * best_emit / len(records)}))
"""


def measure(tree: Path, recording: Path, rounds: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", _MEASURE, str(recording), str(rounds)], capture_output=True,
                         text=True, check=True, env=env, cwd=tree)
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recording", type=Path, default=BUSY)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--baseline", type=Path, default=None, help="another kvtop tree, measured in the same run")
    a = ap.parse_args()
    trees = [("this tree", ROOT)] + ([("baseline", a.baseline)] if a.baseline else [])
    started = time.time()
    for name, tree in trees:
        r = measure(tree, a.recording, a.rounds)
        print(f"{name:>10}: decode {r['decode_us']:6.1f} us/line, Session.emit {r['emit_us']:6.1f} us/record "
              f"({r['records']:,} records of {a.recording.name}, best of {a.rounds})")
    print(f"({time.time() - started:.0f} s)")


if __name__ == "__main__":
    main()
