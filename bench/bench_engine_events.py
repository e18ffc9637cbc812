"""The simulator making its KV events, alone and deterministic: the engine of a driven trace run (``kvtop --engine
sim --scenario trace --trace FILE --speed 0``, built as kvtop builds it: its parser, settings, runner.build_session)
fed the trace's requests in one thread, as ``kvtop sim --trace`` feeds its engine (``offline.FEED_AHEAD`` queued,
arrival times on the simulated clock), with every iteration's events taken, as the driven path's poller takes them.

    head -1000 mooncake_synthetic_trace.jsonl > /tmp/m1000.jsonl
    python bench/bench_engine_events.py --trace /tmp/m1000.jsonl --baseline /tmp/base-4caeb59
    python bench/bench_engine_events.py --trace /tmp/m1000.jsonl --limit 150 --callgrind --baseline /tmp/base-4caeb59

For each tree (in a child process, ``PYTHONHASHSEED=0``): the CPU of the engine loop (steps and event takes; the
digest is kept out of it), the events' count and a digest of every event in order (sha256 of each iteration's events
as JSON, the block hashes, token ids and order included): two trees that make the same events print the same digest.
``--callgrind``: the child runs under ``valgrind --tool=callgrind`` and its instruction count is printed (stable on a
loaded machine, where CPU times are not).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import orjson


def child(tree: str, trace: str, limit: int) -> None:
    sys.path.insert(0, tree)
    from kvtop import runner
    from kvtop.commands.run import build_parser, cli_values
    from kvtop.engines.sim.core import SimRequest
    from kvtop.engines.sim.offline import FEED_AHEAD
    from kvtop.settings import load_settings

    ns = build_parser().parse_args(["--engine", "sim", "--scenario", "trace", "--trace", trace, "--speed", "0",
                                    "--trace-time-scale", "1000", "--headless", "--json"])
    settings = load_settings(cli_values(ns), config_path=None)
    session = runner.build_session(settings)
    driver = session.driver
    engine = driver.engine
    engine.shutdown()  # its thread: this process steps the engine's core itself
    core, bm = engine._core, engine.block_manager
    bm.take_events()  # "created"
    items = []
    while len(items) < limit:
        item = driver.scenario.next()
        if item is None:
            break
        items.append(item)
    items.reverse()
    digest = hashlib.sha256()
    events = 0
    digest_s = 0.0
    n = 0
    cpu0 = time.process_time()
    while items or not core.idle():
        while items and len(core.waiting) < FEED_AHEAD and items[-1].arrival_s <= core.now_s:
            item = items.pop()
            n += 1
            retention = (driver.retention_factory(item.retention)
                         if driver.retention_factory and not item.retention.is_default() else None)
            core.submit(SimRequest(n, item.prompt_ids, item.max_tokens, arrival_s=item.arrival_s,
                                   retention=retention))
        if core.has_runnable():
            core.step()
        elif items:
            core.now_s = max(core.now_s, items[-1].arrival_s)
        else:
            break
        taken = bm.take_events()
        if taken:
            t = time.process_time()
            events += len(taken)
            digest.update(orjson.dumps(taken))
            digest_s += time.process_time() - t
    cpu = time.process_time() - cpu0 - digest_s
    print(json.dumps({"requests": n, "completed": core.completed, "failed": core.failed,
                      "events": events, "dropped": bm.dropped_events,
                      "missed_blocks": bm.missed_blocks,
                      "digest": digest.hexdigest()[:16], "engine_cpu_s": round(cpu, 3)}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", required=True)
    ap.add_argument("--limit", type=int, default=1 << 30, help="requests of the trace (all by default)")
    ap.add_argument("--baseline", type=Path, help="a checkout of an earlier kvtop (kvtop/, themes/)")
    ap.add_argument("--tree", type=Path, default=Path(__file__).resolve().parent.parent)
    ap.add_argument("--callgrind", action="store_true")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    trace = str(Path(a.trace).resolve())
    if a.child:
        child(a.child, trace, a.limit)
        return
    trees = {"this tree": a.tree.resolve()}
    if a.baseline:
        trees[f"baseline {a.baseline}"] = a.baseline.resolve()
    print(f"python {sys.version.split()[0]}, load {os.getloadavg()}, trace {trace}, limit {a.limit}", flush=True)
    for name, tree in trees.items():
        cmd = [sys.executable, __file__, "--trace", trace, "--limit", str(a.limit), "--child", str(tree)]
        if a.callgrind:
            cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *cmd]
        run = subprocess.run(cmd, cwd=tree, env=dict(os.environ, PYTHONPATH=str(tree), PYTHONHASHSEED="0"),
                             capture_output=True, text=True)
        if run.returncode != 0:
            raise SystemExit(f"{name} failed:\n{run.stderr[-3000:]}")
        res = json.loads(run.stdout.strip().splitlines()[-1])
        m = re.search(r"Collected : (\d+)", run.stderr)
        count = f", {int(m.group(1)) / 1e6:,.1f}M instructions" if m else ""
        print(f"{name}: {res['requests']} requests ({res['completed']} completed, {res['failed']} failed), "
              f"{res['events']:,} events (dropped {res['dropped']}), digest {res['digest']}, "
              f"engine CPU {res['engine_cpu_s']:.2f} s{count}",
              flush=True)
    print(f"load at end {os.getloadavg()}")


if __name__ == "__main__":
    main()
