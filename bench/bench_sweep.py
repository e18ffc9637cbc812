"""Host-cache sweeps on the Mooncake trace: kvtop's one-pass curve against kvcache-simulator, in one run.

    pip install kvcache-simulator            # the peer, from PyPI (bench only: not a kvtop dependency)
    python bench/bench_sweep.py [--repeat 3] [--skip-slow]

Every command runs as a subprocess from this script, one after the other, so each figure includes what a user
waits for (interpreter start-up, reading the trace) and all were measured on the same machine in the same minutes:

- peer: ``kvcache-simulator run --model qwen3-8b --block-size 512 --budgets-gib 8,16,32,64 --policies lru,optimal``
  (its C++ backend; the first call compiles it, timed on its own as "cold" when no binary was cached);
- kvtop one-pass: ``kvtop sim --one-pass --host-cache 0:64GB:16`` with and without ``--belady``;
- kvtop full replays without timing: ``kvtop sim --hit-rate-only --host-cache 8GB,16GB,32GB,64GB`` (--skip-slow
  leaves it out, and the next);
- kvtop with engine timing, the path every sweep took before: ``kvtop sim --host-cache 8GB,16GB,32GB,64GB``.

Then, in this process, kvtop's Belady's MIN in the peer's units (512-token blocks, one unit of room each, hits
counted in tokens, the second half of the requests measured) at the peer's four cache sizes, against the peer's
``optimal``: the same algorithm must give the same figures. Best of ``--repeat`` runs for the fast commands.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench_sim import TRACE  # noqa: E402  (this directory is on sys.path when a script here runs)

PEER_BUDGETS_GIB = "8,16,32,64"


def timed(cmd: list[str], env: dict[str, str] | None = None) -> tuple[float, str]:
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return wall, done.stdout


def best(cmd: list[str], repeat: int, env: dict[str, str] | None = None) -> tuple[float, str]:
    runs = [timed(cmd, env) for _ in range(repeat)]
    return min(w for w, _ in runs), runs[-1][1]


def peer_binary_cached() -> bool:
    try:
        from kvcache_sim import cpp_backend
    except ImportError:
        raise SystemExit("kvcache-simulator is not installed: pip install kvcache-simulator") from None
    path = cpp_backend._build_path_for_source(cpp_backend._cpp_source_path())
    return path.exists()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-slow", action="store_true", help="leave out the full replays (with and without timing)")
    a = ap.parse_args()
    if not TRACE.exists():
        raise SystemExit(f"trace not found: {TRACE} (set KVTOP_TRACE)")
    peer_exe = shutil.which("kvcache-simulator")
    if peer_exe is None:
        raise SystemExit("kvcache-simulator is not on PATH: pip install kvcache-simulator")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]))
    kvtop = [sys.executable, "-m", "kvtop", "sim", "--trace", str(TRACE), "--json"]
    peer = [peer_exe, "run", "--trace", str(TRACE), "--model", "qwen3-8b", "--block-size", "512", "--budgets-gib",
            PEER_BUDGETS_GIB, "--policies", "lru,optimal", "--no-progress", "--format", "json"]
    rows: list[tuple[str, int, float]] = []

    if not peer_binary_cached():
        wall, _ = timed(peer)
        rows.append(("kvcache-simulator, cold (compiles its C++ backend first)", 4, wall))
    wall, out = best(peer, a.repeat)
    peer_json = json.loads(out)
    rows.append(("kvcache-simulator (C++ backend), LRU + optimal", 4, wall))

    wall, out = best(kvtop + ["--host-cache", "0:64GB:16", "--one-pass", "--belady"], a.repeat, env)
    one_pass = json.loads(out)
    rows.append(("kvtop sim --one-pass --belady", 16, wall))
    wall, _ = best(kvtop + ["--host-cache", "0:64GB:16", "--one-pass"], a.repeat, env)
    rows.append(("kvtop sim --one-pass", 16, wall))
    full_hit: dict[str, Any] | None = None
    timed_runs: dict[str, Any] | None = None
    if not a.skip_slow:
        wall, out = timed(kvtop + ["--host-cache", "8GB,16GB,32GB,64GB", "--hit-rate-only"], env)
        full_hit = json.loads(out)
        rows.append(("kvtop sim --hit-rate-only (a full replay per size)", 4, wall))
        wall, out = timed(kvtop + ["--host-cache", "8GB,16GB,32GB,64GB"], env)
        timed_runs = json.loads(out)
        rows.append(("kvtop sim (engine timing, a full replay per size)", 4, wall))

    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}; load average {os.getloadavg()[0]:.2f} at the end")
    print(f"trace: {TRACE.name}\n")
    print("| command | host sizes | wall s | s per size |")
    print("|---|---:|---:|---:|")
    for name, sizes, wall in rows:
        print(f"| {name} | {sizes} | {wall:.2f} | {wall / sizes:.2f} |")

    print("\nkvtop, Qwen3-8B on H200 sizing (GPU pool "
          f"{one_pass['runs'][0]['primary_blocks']} blocks of 32 tokens), every request counted:\n")
    print("| host cache | host blocks | hit rate (one pass) | full replay | optimal (Belady) |")
    print("|---:|---:|---:|---:|---:|")
    full_by_bytes = {r["host_cache_bytes"]: r for r in (full_hit or {}).get("runs", [])}
    for r in one_pass["runs"]:
        full = full_by_bytes.get(r["host_cache_bytes"])
        print(f"| {r['host_cache_bytes'] / 1e9:.1f} GB | {r['secondary_blocks']} | {100 * r['cache_hit_rate']:.2f}% | "
              + (f"{100 * full['cache_hit_rate']:.2f}%" if full else "") + f" | {100 * r['belady_hit_rate']:.2f}% |")
    if full_hit is not None:
        # the one-pass curve at the full replays' sizes: not on the 16-size grid, so from a second one-pass call
        wall, out = timed(kvtop + ["--host-cache", "8GB,16GB,32GB,64GB", "--one-pass"], env)
        by_bytes = {r["host_cache_bytes"]: r for r in json.loads(out)["runs"]}
        worst = max(abs(by_bytes[b]["cache_hit_rate"] - r["cache_hit_rate"]) for b, r in full_by_bytes.items())
        print(f"\none pass against full replays at 8/16/32/64 GB: worst difference {100 * worst:.4f} points")
    if timed_runs is not None:
        print("with engine timing (requests side by side): "
              + ", ".join(f"{r['host_cache_bytes'] / 1e9:.0f} GB {100 * r['cache_hit_rate']:.2f}%"
                          for r in timed_runs["runs"]))

    from kvtop.engines.sim.sweep import belady_curve
    from kvtop.workload.trace import read_trace

    requests = list(read_trace(TRACE))
    points = peer_json["points"]
    mine = belady_curve(requests, [p["cacheBlocks"] for p in points], 512,
                        measure_from=peer_json["metadata"]["warmupRequests"], as_peer=True)
    print("\npeer's units (one cache of 512-token blocks, second half of the requests measured):\n")
    print("| budget | cache blocks | peer LRU | peer optimal | kvtop Belady, peer's units |")
    print("|---:|---:|---:|---:|---:|")
    for p, m in zip(points, mine):
        res = p["results"]
        print(f"| {p['gib']:.0f} GiB | {p['cacheBlocks']} | {100 * res['lru']['hitRate']:.3f}% | "
              f"{100 * res['optimal']['hitRate']:.3f}% | {100 * m:.3f}% |")


if __name__ == "__main__":
    main()
