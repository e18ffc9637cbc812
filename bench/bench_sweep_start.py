"""The 512-token one-pass sweep with the optimum, end to end: wall and CPU of the whole command, this tree against
a baseline tree and the warm peer (kvcache-simulator), alternated round by round.

    PATH=/work/venv/bin:$PATH KVTOP_TRACE=/work/wt/shared/traces/mooncake_synthetic_trace.jsonl nice -n 5 \\
        python bench/bench_sweep_start.py --baseline /tmp/base-sweepstart --repeat 15

The command is the issue's: ``kvtop sim --trace T --one-pass --tokens-per-block 512 --belady --host-cache
0:64GB:16`` (text output). CPU is the child's user + system time (``os.wait4``). Each round runs the three in turn,
so load falls on all alike; best and median of ``--repeat``. The two trees' outputs are checked equal but for the
line that reports the run's seconds.
"""

from __future__ import annotations

import argparse
import compileall
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_sim import TRACE  # noqa: E402  (this directory is on sys.path when a script here runs)


def run(cmd: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float, str]:
    """``cwd`` is the tree: ``python -m kvtop`` imports kvtop from the working directory before PYTHONPATH."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    out = proc.stdout.read() if proc.stdout else b""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if status != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({status})")
    return wall, usage.ru_utime + usage.ru_stime, out.decode()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", type=Path, required=True, help="a checkout of an earlier kvtop (kvtop/, themes/)")
    ap.add_argument("--repeat", type=int, default=15)
    ap.add_argument("--jobs-one", action="store_true", help="also run this tree with --jobs 1 (no fork)")
    a = ap.parse_args()
    peer_exe = shutil.which("kvcache-simulator")
    if peer_exe is None:
        raise SystemExit("kvcache-simulator is not on PATH: pip install kvcache-simulator")
    base = a.baseline.resolve()
    for tree in (ROOT, base):
        compileall.compile_dir(str(tree / "kvtop"), quiet=1)
    kvtop = [sys.executable, "-m", "kvtop", "sim", "--trace", str(TRACE), "--one-pass", "--tokens-per-block", "512",
             "--belady", "--host-cache", "0:64GB:16"]
    peer = [peer_exe, "run", "--trace", str(TRACE), "--model", "qwen3-8b", "--block-size", "512", "--budgets-gib",
            "8,16,32,64", "--policies", "lru,optimal", "--no-progress", "--format", "json"]
    rows = {"kvcache-simulator (binary cached), LRU + optimal, 4 sizes": (peer, dict(os.environ), ROOT),
            "this tree: kvtop sim --one-pass --tokens-per-block 512 --belady, 16 sizes":
                (kvtop, dict(os.environ, PYTHONPATH=str(ROOT)), ROOT)}
    if a.jobs_one:  # the optimum after the replay, in one process (the default forks where there are 2+ CPUs)
        rows["this tree, --jobs 1 (one process)"] = ([*kvtop, "--jobs", "1"], dict(os.environ, PYTHONPATH=str(ROOT)),
                                                     ROOT)
    rows[f"baseline {base}: the same"] = (kvtop, dict(os.environ, PYTHONPATH=str(base)), base)
    run(peer, dict(os.environ), ROOT)  # compiles the peer's binary if it is not cached
    walls: dict[str, list[float]] = {k: [] for k in rows}
    cpus: dict[str, list[float]] = {k: [] for k in rows}
    outs: dict[str, str] = {}
    print(f"load at start {os.getloadavg()}, CPUs for this process {len(os.sched_getaffinity(0))}", flush=True)
    for _ in range(a.repeat):
        for name, (cmd, env, cwd) in rows.items():
            wall, cpu, out = run(cmd, env, cwd)
            walls[name].append(wall)
            cpus[name].append(cpu)
            outs[name] = out
    print(f"load at end {os.getloadavg()}")
    texts = ["\n".join(ln for ln in outs[k].splitlines() if not ln.startswith("one-pass:")) for k in list(rows)[1:]]
    print("outputs the same:", all(t == texts[0] for t in texts))
    print("| command | wall s, best | wall s, median | CPU s, best | CPU s, median |")
    print("|---|---:|---:|---:|---:|")
    for name in rows:
        print(f"| {name} | {min(walls[name]):.3f} | {statistics.median(walls[name]):.3f} | {min(cpus[name]):.3f} "
              f"| {statistics.median(cpus[name]):.3f} |")


if __name__ == "__main__":
    main()
