"""The driven path over a trace: how long ``kvtop --engine sim --scenario trace --trace FILE --speed 0
--trace-time-scale 1000 --headless --json`` takes to answer every request of the trace, against ``kvtop sim
--trace FILE`` (the engine loop alone) on the same file, for this tree and a baseline tree, in one run.

    head -3000 mooncake_synthetic_trace.jsonl > /tmp/m3000.jsonl
    python bench/bench_driven_trace.py --trace /tmp/m3000.jsonl --baseline /tmp/base-simspeed --cap 300

Each tree's session is built as ``kvtop`` builds it (kvtop.cli's parser and settings, runner.build_session) in a
child process (a headless run of an older tree did not end when its trace did), with the workload driver's request
records counted on their way to the session (not through a sink: a sink takes every record, which the driven
path avoids making for KV events where none does), stopped at the trace's last answer: the figure is the wall time
from the session's start to the last answer (and the child's CPU, both threads), or ``--cap`` seconds when it does
not get there. ``kvtop sim`` is
timed as a whole command (start-up and trace parsing included).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def child(tree: str, trace: str, cap: float) -> None:
    sys.path.insert(0, tree)
    from kvtop import runner
    from kvtop.commands.run import build_parser, cli_values
    from kvtop.settings import load_settings

    expected = sum(1 for line in Path(trace).read_text().splitlines() if line.strip())
    ns = build_parser().parse_args(["--engine", "sim", "--scenario", "trace", "--trace", trace, "--speed", "0",
                                        "--trace-time-scale", "1000", "--headless", "--json"])
    settings = load_settings(cli_values(ns), config_path=None)
    session = runner.build_session(settings)
    answered = [0]
    last = [0.0]
    driver = session.driver
    emit = driver.emit

    def counted(record: object) -> None:
        # the driver's request records, counted on their way to the session: not a sink of the session's (a sink
        # takes every record, and the session makes a Record of each KV event only for sinks)
        emit(record)
        answered[0] += 1
        last[0] = time.perf_counter()
        if answered[0] >= expected:
            session.stop()

    driver.emit = counted
    cpu0 = time.process_time()
    t0 = time.perf_counter()
    asyncio.run(session.run(duration_s=cap))
    wall = time.perf_counter() - t0
    engine = session.driver.engine
    print(json.dumps({"answered": answered[0], "expected": expected, "wall_s": wall,
                      "to_last_answer_s": (last[0] - t0) if answered[0] >= expected else None,
                      "cpu_s": time.process_time() - cpu0, "records": session.records,
                      "dropped_events": engine.block_manager.dropped_events,
                      "problems": [f"{p.kind} x{p.count}" for p in session.problems.snapshot()]}))


def _env(tree: Path) -> dict[str, str]:
    """The tree first on the path, then what the caller had there (the H200 host's wheels are installed into a
    folder on PYTHONPATH: it has no index)."""
    path = os.pathsep.join(p for p in (str(tree), os.environ.get("PYTHONPATH", "")) if p)
    return dict(os.environ, PYTHONPATH=path)


def sim_command(tree: Path, trace: str) -> tuple[float, float]:
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "kvtop", "sim", "--trace", trace, "--json"], cwd=tree,
                            env=_env(tree), stdout=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    if status != 0:
        raise SystemExit(f"kvtop sim failed in {tree}")
    return time.perf_counter() - t0, usage.ru_utime + usage.ru_stime


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", required=True)
    ap.add_argument("--baseline", type=Path, help="a checkout of an earlier kvtop (kvtop/, themes/)")
    ap.add_argument("--cap", type=float, default=300.0, help="seconds a driven run may take at most")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    trace = str(Path(a.trace).resolve())
    if a.child:
        child(a.child, trace, a.cap)
        return
    trees = {"this tree": ROOT}
    if a.baseline:
        trees[f"baseline {a.baseline}"] = a.baseline.resolve()
    print(f"python {sys.version.split()[0]}, load {os.getloadavg()}, trace {trace}", flush=True)
    for name, tree in trees.items():
        wall, cpu = sim_command(tree, trace)
        print(f"{name}: kvtop sim --trace: wall {wall:.2f} s, CPU {cpu:.2f} s", flush=True)
        t0 = time.perf_counter()
        proc = subprocess.Popen([sys.executable, __file__, "--trace", trace, "--cap", str(a.cap), "--child",
                                 str(tree)], cwd=tree, env=_env(tree),
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        out = proc.stdout.read() if proc.stdout else ""
        _, status, usage = os.wait4(proc.pid, 0)
        res = json.loads(out.strip().splitlines()[-1])
        print(f"{name}: driven: {res['answered']} of {res['expected']} answered, last at "
              f"{res['to_last_answer_s'] if res['to_last_answer_s'] is None else round(res['to_last_answer_s'], 2)} s"
              f" (session {res['wall_s']:.2f} s, process {time.perf_counter() - t0:.2f} s, CPU "
              f"{usage.ru_utime + usage.ru_stime:.2f} s), {res['records']:,} records, engine dropped "
              f"{res['dropped_events']:,} KV events; problems {res['problems']}", flush=True)
    print(f"load at end {os.getloadavg()}")


if __name__ == "__main__":
    main()
