"""What ``kvtop.watch(llm)`` costs a record on its thread: ``WatchHandle.emit`` (fold and sinks under the handle's
lock) over a recording, this tree beside another in one run.

    python bench/bench_watch_fold.py                              # against the commit before issue 25's watch
    python bench/bench_watch_fold.py --baseline-rev main --recording FILE --rounds 9

The records are decoded first (not timed); each round folds all of them into a fresh handle (no thread started, no
sink), CPU time (``time.process_time``), best of ``--rounds``; the trees alternate round by round in child
processes so that a busy shared machine slows both alike. The baseline tree is ``git archive REV`` unpacked into a
temporary directory. Issue 25 made the watch a kvtop.session.Session: since then it folds what every mode folds
per record (the live what-if, the stale clock, the time-jump check), which its own emit left out.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BASELINE_REV = "ec780e2"  # the watch with its own emit, sinks and sampler loop

CHILD = """
import json, sys, time
sys.path.insert(0, sys.argv[1])
from kvtop.records import SourceId, read_jsonl
from kvtop.watcher import WatchHandle
records = list(read_jsonl(sys.argv[2]))
handle = WatchHandle(SourceId.local(run="bench"))
t = time.process_time()
for r in records:
    handle.emit(r)
cpu = time.process_time() - t
print(json.dumps({"cpu_s": cpu, "records": len(records), "hits": handle.summary()["hit_rate"].get("hits")}))
"""


def one_round(tree: Path, recording: Path) -> dict[str, float]:
    out = subprocess.run([sys.executable, "-c", CHILD, str(tree), str(recording)], capture_output=True, text=True,
                         timeout=600, cwd=tree)
    if out.returncode != 0:
        raise SystemExit(f"{tree}: {out.stderr.strip()[-2000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recording", default=str(ROOT / "tests" / "data" / "busy.jsonl"))
    ap.add_argument("--baseline-rev", default=BASELINE_REV)
    ap.add_argument("--rounds", type=int, default=7)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        archive = subprocess.run(["git", "archive", a.baseline_rev, "kvtop"], cwd=ROOT, capture_output=True,
                                 timeout=120)
        if archive.returncode != 0:
            raise SystemExit(f"git archive {a.baseline_rev}: {archive.stderr.decode().strip()}")
        subprocess.run(["tar", "-x", "-C", str(base)], input=archive.stdout, check=True, timeout=120)
        best: dict[str, dict[str, float]] = {}
        for _ in range(a.rounds):
            for name, tree in (("this tree", ROOT), (a.baseline_rev, base)):
                got = one_round(tree, Path(a.recording).resolve())
                if name not in best or got["cpu_s"] < best[name]["cpu_s"]:
                    best[name] = got
    for name, got in best.items():
        print(f"{name:>12}: {got['records']:,} records, {1000 * got['cpu_s']:.1f} ms CPU "
              f"({1e6 * got['cpu_s'] / got['records']:.2f} us a record), hits {got['hits']:,}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
