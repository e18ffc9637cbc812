"""The timed trace replay (``kvtop sim --trace``) on this tree against a baseline tree, in one run: the same
blocks, the same per-request results, then instructions (callgrind), CPU and wall time.

    git archive 80ba13f kvtop themes | tar -x -C /tmp/base-simspeed      # the baseline tree
    python bench/bench_sim_replay.py --baseline /tmp/base-simspeed --trace conversation_trace.jsonl \\
        --repeat 2 --callgrind-limit 1500

The point is the issue's: ``kvtop sim --trace FILE --tokens-per-block 32 --host-cache 64GB --json`` (Qwen3-8B on
H200 sizing, GUARANTEED_NO_EVICT); replayed as ``--host-cache 0,64GB --jobs 1`` (a timed point replays its no-tier
baseline too since the sweep verdict: both trees then do the same work) and timed by the 64 GB run's own
``wall_seconds``, in a child process per tree (``PYTHONPATH`` and the working
directory are the tree). Before any timing, each tree replays the trace once more in a child that digests

- the command's JSON (every field but ``wall_seconds``),
- every request's results (id, first and last token times, scheduled time and iteration, last iteration, blocks
  allocated / new / reused / missed / onboarded, generated tokens), in request order,
- the block manager at the end: each block's tier, key, parent, references, priority, duration, and every free
  queue's live entries in the order they would be taken, with every counter;

and the two digests must be equal (the run stops otherwise). Timing: the trees alternate ``--repeat`` times
(wall and the child's user + system CPU from ``os.wait4``); callgrind counts the instructions of the first
``--callgrind-limit`` requests (``--limit``), which repeat to the instruction on a loaded machine
(``PYTHONHASHSEED=0``).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import io
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def _sim_args(trace: str, limit: int | None) -> list[str]:
    # The 0 point beside 64 GB, in one process: since the sweep verdict (e6d56eb) a timed point replays the trace
    # without its tier too, so both trees replay both, and the figure is the 64 GB replay's own wall_seconds
    args = ["sim", "--trace", trace, "--tokens-per-block", "32", "--host-cache", "0,64GB", "--jobs", "1", "--json"]
    return [*args, "--limit", str(limit)] if limit else args


def child_digest(tree: str, trace: str, limit: int | None) -> None:
    """In a child: replay with the tree's kvtop, print one JSON line with the digests."""
    sys.path.insert(0, tree)
    from kvtop import cli
    from kvtop.engines.sim import offline

    managers: list[Any] = []
    requests: list[Any] = []

    class Manager(offline.BlockManager):  # type: ignore[misc,name-defined]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            managers.append(self)

    class Request(offline.SimRequest):  # type: ignore[misc,name-defined]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            requests.append(self)

    offline.BlockManager = Manager  # type: ignore[attr-defined]
    offline.SimRequest = Request  # type: ignore[attr-defined]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        rc = cli.main(_sim_args(trace, limit))
    if rc != 0:
        raise SystemExit(f"kvtop sim exited {rc}")
    result = json.loads(out.getvalue())
    for run in result["runs"]:
        run.pop("wall_seconds")
        run.pop("verdict", None)   # the sweep verdict (e6d56eb), which the baseline tree does not give
    h_result = hashlib.sha256(json.dumps(result, sort_keys=True).encode()).hexdigest()[:16]
    h = hashlib.sha256()
    for r in sorted(requests, key=lambda r: r.request_id):
        h.update(repr((r.request_id, r.first_token_s, r.last_token_s, r.scheduled_s, r.first_iter, r.last_iter,
                       r.alloc_total_blocks, r.alloc_new_blocks, r.reused_blocks, r.missed_blocks,
                       r.onboarded_blocks, r.reused_tokens, r.output_ids, r.error)).encode())
    h_requests = h.hexdigest()[:16]
    bm = managers[-1]   # the 64 GB point's (the 0 point's replays first)
    h = hashlib.sha256()
    for b in bm._blocks:
        h.update(repr((b.id, b.primary, b.key, b.prev.id if b.prev is not None else None, b.refs, b.priority,
                       b.duration_ms, b.offload_seq, b.qstamp != -1)).encode())
    policy = bm._policy
    for level in (0, 1):
        for prio, q in enumerate(policy.queues[level]):
            items = iter(q)
            live = [block.id for stamp, block in zip(items, items) if block.qstamp is stamp]
            h.update(repr((level, prio, live)).encode())
    counters = {k: v for k, v in vars(bm).items() if isinstance(v, (int, float, list)) and not k.startswith("_")}
    h.update(json.dumps(counters, sort_keys=True).encode())
    print(json.dumps({"result": h_result, "requests": h_requests, "block_manager": h.hexdigest()[:16],
                      "num_requests": len(requests)}))


def _env(tree: Path) -> dict[str, str]:
    # the tree first, then what the caller's PYTHONPATH had (the lent machine's carried wheels: orjson, msgspec)
    path = os.pathsep.join(p for p in (str(tree), os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, PYTHONPATH=path, PYTHONHASHSEED="0")


def timed(tree: Path, trace: str) -> tuple[float, float, float]:
    """Wall and CPU seconds of the whole command (both points, start-up and trace parsing included), and the
    64 GB point's own replay (its ``wall_seconds``)."""
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "kvtop", *_sim_args(trace, None)], cwd=tree, env=_env(tree),
                            stdout=subprocess.PIPE)
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if status != 0:
        raise SystemExit(f"{tree}: kvtop sim failed ({status})")
    point = json.loads(out)["runs"][-1]["wall_seconds"]
    return wall, usage.ru_utime + usage.ru_stime, point


def instructions(tree: Path, trace: str, limit: int) -> int:
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, "-m", "kvtop",
           *_sim_args(trace, limit)]
    err = subprocess.run(cmd, cwd=tree, env=_env(tree), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                         text=True, check=True).stderr
    m = re.search(r"Collected : (\d+)", err)
    if m is None:
        raise SystemExit(f"no callgrind count in: {err[-500:]}")
    return int(m.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--baseline", type=Path, required=True, help="a checkout of an earlier kvtop (kvtop/, themes/)")
    ap.add_argument("--trace", required=True)
    ap.add_argument("--repeat", type=int, default=2, help="timed replays per tree, alternated")
    ap.add_argument("--callgrind-limit", type=int, default=0, help="instructions over the first N requests (0: no)")
    ap.add_argument("--digest-limit", type=int, default=None, help="digest only the first N requests")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    trace = str(Path(a.trace).resolve())
    if a.child:
        child_digest(a.child, trace, a.digest_limit)
        return
    trees = {"this tree": ROOT, f"baseline {a.baseline}": a.baseline.resolve()}
    print(f"python {sys.version.split()[0]}, load {os.getloadavg()}, trace {trace}", flush=True)
    digests = {}
    for name, tree in trees.items():
        cmd = [sys.executable, __file__, "--baseline", str(a.baseline), "--trace", trace, "--child", str(tree)]
        if a.digest_limit:
            cmd += ["--digest-limit", str(a.digest_limit)]
        digests[name] = json.loads(subprocess.run(cmd, env=_env(tree), capture_output=True, text=True,
                                                  check=True).stdout.splitlines()[-1])
        print(f"{name}: digests {digests[name]}", flush=True)
    same = len({json.dumps(d, sort_keys=True) for d in digests.values()}) == 1
    print("digests equal:", same, flush=True)
    if not same:
        raise SystemExit(1)
    if a.callgrind_limit:
        for name, tree in trees.items():
            print(f"{name}: callgrind, first {a.callgrind_limit} requests: "
                  f"{instructions(tree, trace, a.callgrind_limit):,} instructions", flush=True)
    walls: dict[str, list[float]] = {k: [] for k in trees}
    cpus: dict[str, list[float]] = {k: [] for k in trees}
    points: dict[str, list[float]] = {k: [] for k in trees}
    for _ in range(a.repeat):
        for name, tree in trees.items():
            wall, cpu, point = timed(tree, trace)
            walls[name].append(wall)
            cpus[name].append(cpu)
            points[name].append(point)
            print(f"{name}: wall {wall:.2f} s, CPU {cpu:.2f} s (both points), 64 GB point {point:.2f} s", flush=True)
    print(f"load at end {os.getloadavg()}")
    print("| tree | 64 GB point s, each | whole command wall s, each | CPU s, each |")
    print("|---|---|---|---|")
    for name in trees if a.repeat else ():
        print(f"| {name} | {', '.join(f'{p:.2f}' for p in points[name])} | "
              f"{', '.join(f'{w:.2f}' for w in walls[name])} | {', '.join(f'{c:.2f}' for c in cpus[name])} |")


if __name__ == "__main__":
    main()
