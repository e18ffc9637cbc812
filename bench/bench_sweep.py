"""Host-cache sweeps on the Mooncake trace: kvtop's one-pass curve against kvcache-simulator, in one run.

    pip install kvcache-simulator            # the peer, from PyPI (bench only: not a kvtop dependency)
    nice -n 5 python bench/bench_sweep.py [--repeat 3] [--skip-slow]

Offline (the lent GPU host reaches no index): carry the peer's wheel (py3-none-any, no dependencies; ``pip download
--no-deps kvcache-simulator==0.1.3 -d .whl``) and pass ``--peer-wheels .whl``: it is installed into a folder of
its own under /tmp and run from there. Its C++ backend needs a ``c++`` compiler on PATH.

Every command runs as a subprocess from this script, so each figure includes what a user waits for (interpreter
start-up, reading the trace), and all are measured on the same machine in the same minutes, the peer's and
kvtop's runs interleaved round by round so that a change in the machine's load falls on both. kvtop's modules are
byte-compiled first (an installed kvtop has its .pyc; a checkout run with PYTHONDONTWRITEBYTECODE=1 compiles every
module on every start, ~20 ms). Rows:

- peer, cold: ``kvcache-simulator run --model qwen3-8b --block-size 512 --budgets-gib 8,16,32,64 --policies
  lru,optimal`` after deleting the binary it compiled (its cache in the temp folder), so the call compiles it;
- peer, warm: the same with the binary cached (best of ``--repeat``);
- kvtop one pass, 16 sizes: ``kvtop sim --one-pass --host-cache 0:64GB:16`` at 32 tokens a block (TensorRT-LLM's
  default) and at 512 (the trace's and the peer's block: the same number of block lookups as the peer), each with
  and without ``--belady`` (best of ``--repeat``);
- kvtop full replays without timing, ``--hit-rate-only --host-cache 8GB,16GB,32GB,64GB``, and with engine timing,
  the path every sweep took before (once each; ``--skip-slow`` leaves them out).

- with ``--baseline DIR`` (a checkout of an earlier kvtop, e.g. ``git worktree add --detach /tmp/base c82c581``):
  the four one-pass rows again from that tree, in the same rounds (its commands run in its folder: ``python -m``
  puts the working folder first on the path, so a run from this one would import this tree's kvtop).

Then kvtop's Belady's MIN in the peer's units (512-token blocks, one unit of room each, hits in tokens, the second
half of the requests measured) at the peer's four cache sizes, against the peer's ``optimal``.
"""

from __future__ import annotations

import argparse
import compileall
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
PEER_SITE = Path("/tmp/kvtop-bench-peer")


def timed(cmd: list[str], env: dict[str, str] | None = None, cwd: Path = ROOT) -> tuple[float, str]:
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({done.returncode}): {done.stderr.strip()[-500:]}")
    return wall, done.stdout


def load() -> str:
    one, five, fifteen = os.getloadavg()
    return f"{one:.2f} / {five:.2f} / {fifteen:.2f}"


def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def peer_command(wheels: Path | None) -> tuple[list[str], dict[str, str]]:
    """How to run the peer: from the carried wheels (installed under /tmp), else the installed console script."""
    env = dict(os.environ)
    if wheels is not None:
        subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--upgrade",
                        "--target", str(PEER_SITE), *map(str, sorted(wheels.glob("kvcache_simulator-*.whl")))],
                       check=True)
        env["PYTHONPATH"] = os.pathsep.join([str(PEER_SITE), *filter(None, [env.get("PYTHONPATH")])])
        return [sys.executable, "-m", "kvcache_sim"], env
    exe = shutil.which("kvcache-simulator")
    if exe is None:
        raise SystemExit("kvcache-simulator is not on PATH: pip install kvcache-simulator (or --peer-wheels DIR)")
    return [exe], env


def peer_binary(env: dict[str, str]) -> Path:
    """The binary the peer's C++ backend compiles once and caches (kvcache_sim.cpp_backend)."""
    code = ("from kvcache_sim import cpp_backend as c; "
            "print(c._build_path_for_source(c._cpp_source_path()))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--skip-slow", action="store_true", help="leave out the full replays (with and without timing)")
    ap.add_argument("--peer-wheels", type=Path, default=None,
                    help="a folder holding kvcache_simulator-*.whl, for a machine with no package index")
    ap.add_argument("--baseline", type=Path, default=None,
                    help="a checkout of an earlier kvtop whose one-pass rows run in the same rounds")
    a = ap.parse_args()
    if not TRACE.exists():
        raise SystemExit(f"trace not found: {TRACE} (set KVTOP_TRACE)")
    sim = None if a.baseline is None else a.baseline / "kvtop" / "engines" / "sim"
    if sim is not None and not ((sim / "sweep.py").is_file() or (sim / "sweep" / "__init__.py").is_file()):
        raise SystemExit(f"--baseline {a.baseline}: not a kvtop checkout with the one-pass sweep "
                         "(kvtop/engines/sim/sweep/ or sweep.py missing)")
    load_start = load()
    peer_cmd, peer_env = peer_command(a.peer_wheels)
    if shutil.which("c++") is None:
        raise SystemExit("the peer's C++ backend needs a c++ compiler on PATH")
    compileall.compile_dir(str(ROOT / "kvtop"), quiet=1)

    def env_for(tree: Path) -> dict[str, str]:
        return dict(os.environ, PYTHONPATH=os.pathsep.join([str(tree), *filter(None, [os.environ.get("PYTHONPATH")])]))

    env = env_for(ROOT)
    kvtop = [sys.executable, "-m", "kvtop", "sim", "--trace", str(TRACE), "--json"]
    peer = [*peer_cmd, "run", "--trace", str(TRACE), "--model", "qwen3-8b", "--block-size", "512", "--budgets-gib",
            PEER_BUDGETS_GIB, "--policies", "lru,optimal", "--no-progress", "--format", "json"]
    one_pass = [*kvtop, "--host-cache", "0:64GB:16", "--one-pass"]
    kvtop_rows = {
        "`kvtop sim --one-pass --host-cache 0:64GB:16`, 32 tokens a block": one_pass,
        "`... --belady`, 32 tokens a block": [*one_pass, "--belady"],
        "`... --tokens-per-block 512` (the peer's block)": [*one_pass, "--tokens-per-block", "512"],
        "`... --tokens-per-block 512 --belady`": [*one_pass, "--tokens-per-block", "512", "--belady"],
    }
    fast: dict[str, tuple[list[str], dict[str, str], int, Path]] = {
        "kvcache-simulator (C++ backend, binary cached), LRU + optimal, 8/16/32/64 GiB": (peer, peer_env, 4, ROOT)}
    for name, cmd in kvtop_rows.items():
        fast[name] = (cmd, env, 16, ROOT)
    if a.baseline is not None:
        base = a.baseline.resolve()
        compileall.compile_dir(str(base / "kvtop"), quiet=1)
        rev = subprocess.run(["git", "-C", str(base), "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                             check=False).stdout.strip() or base.name
        for name, cmd in kvtop_rows.items():
            fast[f"baseline {rev}: {name}"] = (cmd, env_for(base), 16, base)

    binary = peer_binary(peer_env)
    binary.unlink(missing_ok=True)  # the peer's own cache: the next call compiles it again
    cold, peer_out = timed(peer, peer_env)
    walls: dict[str, list[float]] = {name: [] for name in fast}
    outs: dict[str, str] = {}
    for _ in range(a.repeat):  # round by round: each round runs every command once
        for name, (cmd, cmd_env, _, cwd) in fast.items():
            wall, outs[name] = timed(cmd, cmd_env, cwd)
            walls[name].append(wall)
    rows: list[tuple[str, int, float]] = [
        ("kvcache-simulator, cold (compiles its C++ backend first), LRU + optimal, 8/16/32/64 GiB", 4, cold)]
    rows += [(name, sizes, min(walls[name])) for name, (_, _, sizes, _) in fast.items()]
    full_hit: dict[str, Any] | None = None
    timed_runs: dict[str, Any] | None = None
    if not a.skip_slow:
        wall, out = timed([*kvtop, "--host-cache", "8GB,16GB,32GB,64GB", "--hit-rate-only"], env)
        full_hit = json.loads(out)
        rows.append(("`kvtop sim --hit-rate-only --host-cache 8GB,16GB,32GB,64GB` (a full replay per size)", 4,
                     wall))
        wall, out = timed([*kvtop, "--host-cache", "8GB,16GB,32GB,64GB"], env)
        timed_runs = json.loads(out)
        rows.append(("`kvtop sim --host-cache 8GB,16GB,32GB,64GB` (engine timing, a full replay per size)", 4,
                     wall))
    load_end = load()

    print(f"machine: {cpu_name()}, {os.cpu_count()} cores, Python {platform.python_version()}; load average "
          f"(1/5/15 min) {load_start} at the start, {load_end} at the end")
    print(f"trace: {TRACE.name}; best of {a.repeat} but the cold row and the full replays (one run each)\n")
    print("| command | host sizes | wall s | s per size | all runs, s |")
    print("|---|---:|---:|---:|---|")
    for name, sizes, wall in rows:
        runs = ", ".join(f"{w:.2f}" for w in walls.get(name, [wall]))
        print(f"| {name} | {sizes} | {wall:.2f} | {wall / sizes:.3f} | {runs} |")

    curve = json.loads(outs["`... --belady`, 32 tokens a block"])
    curve512 = json.loads(outs["`... --tokens-per-block 512 --belady`"])
    for name in kvtop_rows:  # the same curve from the baseline tree, point by point
        base_name = next((n for n in outs if n.startswith("baseline ") and n.endswith(name)), None)
        if base_name is not None:
            mine, theirs = json.loads(outs[name])["runs"], json.loads(outs[base_name])["runs"]
            keys = ("secondary_blocks", "reused_blocks", "missed_blocks", "cache_hit_rate", "onboarded_blocks",
                    "belady_hit_rate")
            same = [{k: r.get(k) for k in keys} for r in mine] == [{k: r.get(k) for k in keys} for r in theirs]
            print(f"curve of {name}: {'the same as' if same else 'DIFFERENT from'} the baseline's, point by point")
    print("\nkvtop, Qwen3-8B on H200 sizing, every request counted, one request at a time: GPU pool "
          f"{curve['runs'][0]['primary_blocks']} blocks of 32 tokens / {curve512['runs'][0]['primary_blocks']} of "
          "512\n")
    print("| host cache | hit rate, 32 (one pass) | full replay, 32 | optimal (Belady), 32 | hit rate, 512 | "
          "optimal, 512 |")
    print("|---:|---:|---:|---:|---:|---:|")
    full_by_bytes = {r["host_cache_bytes"]: r for r in (full_hit or {}).get("runs", [])}
    for r, r512 in zip(curve["runs"], curve512["runs"]):
        full = full_by_bytes.get(r["host_cache_bytes"])
        print(f"| {r['host_cache_bytes'] / 1e9:.1f} GB | {100 * r['cache_hit_rate']:.2f}% | "
              + (f"{100 * full['cache_hit_rate']:.2f}%" if full else "") + f" | {100 * r['belady_hit_rate']:.2f}% | "
              f"{100 * r512['cache_hit_rate']:.2f}% | {100 * r512['belady_hit_rate']:.2f}% |")
    if full_hit is not None:
        # the one-pass curve at the full replays' sizes: not on the 16-size grid, so from a second one-pass call
        _, out = timed([*kvtop, "--host-cache", "8GB,16GB,32GB,64GB", "--one-pass"], env)
        by_bytes = {r["host_cache_bytes"]: r for r in json.loads(out)["runs"]}
        worst = max(abs(by_bytes[b]["cache_hit_rate"] - r["cache_hit_rate"]) for b, r in full_by_bytes.items())
        print(f"\none pass against full replays at 8/16/32/64 GB (32 tokens a block): worst difference "
              f"{100 * worst:.4f} points")
    if timed_runs is not None:
        print("with engine timing (requests side by side): "
              + ", ".join(f"{r['host_cache_bytes'] / 1e9:.0f} GB {100 * r['cache_hit_rate']:.2f}%"
                          for r in timed_runs["runs"]))

    from kvtop.engines.sim.sweep import belady_curve
    from kvtop.workload.trace import read_trace

    peer_json = json.loads(peer_out)
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
