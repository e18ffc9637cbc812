"""A timed host-cache sweep (a full engine replay per size) in one process against ``--jobs N`` forked replays,
alternated, the outputs checked equal:

    KVTOP_TRACE=/work/wt/shared/traces/mooncake_synthetic_trace.jsonl nice -n 5 \\
        python bench/bench_sweep_jobs.py --jobs 2 --repeat 2

Wall and user + system CPU of the whole command (the children's CPU included: ``os.wait4`` of the parent counts
the children it waited for). The outputs are compared without the per-row and total wall seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_sim import TRACE  # noqa: E402  (this directory is on sys.path when a script here runs)


def run(cmd: list[str]) -> tuple[float, float, dict]:
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=ROOT, env=dict(os.environ, PYTHONPATH=str(ROOT)), stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL)
    out = proc.stdout.read() if proc.stdout else b""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if status != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({status})")
    doc = json.loads(out)
    for r in doc["runs"]:
        r.pop("wall_seconds", None)
    return wall, usage.ru_utime + usage.ru_stime, doc


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--host-cache", default="8GB,16GB,32GB,64GB")
    a = ap.parse_args()
    base = [sys.executable, "-m", "kvtop", "sim", "--trace", str(TRACE), "--host-cache", a.host_cache, "--json"]
    rows = {"--jobs 1 (one process)": [*base, "--jobs", "1"], f"--jobs {a.jobs}": [*base, "--jobs", str(a.jobs)]}
    walls: dict[str, list[float]] = {k: [] for k in rows}
    cpus: dict[str, list[float]] = {k: [] for k in rows}
    docs: dict[str, dict] = {}
    print(f"load at start {os.getloadavg()}, CPUs for this process {len(os.sched_getaffinity(0))}", flush=True)
    for _ in range(a.repeat):
        for name, cmd in rows.items():
            wall, cpu, docs[name] = run(cmd)
            walls[name].append(wall)
            cpus[name].append(cpu)
    print(f"load at end {os.getloadavg()}")
    first, second = docs.values()
    print("outputs the same:", first == second)
    print("| command | wall s, best | wall s, median | CPU s, best | all walls, s |")
    print("|---|---:|---:|---:|---|")
    for name in rows:
        print(f"| kvtop sim --host-cache {a.host_cache} {name} | {min(walls[name]):.2f} | "
              f"{statistics.median(walls[name]):.2f} | {min(cpus[name]):.2f} | "
              f"{', '.join(f'{w:.2f}' for w in walls[name])} |")


if __name__ == "__main__":
    main()
