"""The driven path's fold alone: what a session's main thread does with a driven trace run's drains, this tree
beside a baseline tree, on the same drains, in one run.

    head -1000 mooncake_synthetic_trace.jsonl > /tmp/m1000.jsonl
    python bench/bench_driven_fold.py --trace /tmp/m1000.jsonl --capture /tmp/drains-m1000.pickle
    python bench/bench_driven_fold.py --drains /tmp/drains-m1000.pickle --baseline /tmp/base-4caeb59
    python bench/bench_driven_fold.py --drains /tmp/drains-m1000.pickle --baseline DIR --callgrind

``--capture``: a driven run (``kvtop --engine sim --scenario trace --trace FILE --speed 0 --trace-time-scale 1000``,
built as bench_driven_trace.py builds it) with every call the session gets from its producers kept in order
(``emit``, ``emit_many``, ``emit_kv_events``: the driver's request records, the poller's stats and its KV event
drains) and pickled.

``--drains``: each tree folds them into a fresh Session (the same calls, in order), in child processes alternated
tree by tree (``--pairs``), CPU time (``time.process_time``) best of them; both children print a digest of what
they folded (the model's counts and quality, the what-if's estimate, the size advice's curve), which must be equal
(the trees fold the same). ``--callgrind``: instructions of the fold instead (valgrind; the child marks the fold's
start and end with ``os.getppid()``, where callgrind dumps its counts), steady on a shared machine.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import pickle
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


def capture(trace: str, out: str, cap: float) -> None:
    sys.path.insert(0, str(ROOT))
    from kvtop import runner
    from kvtop.commands.run import build_parser, cli_values
    from kvtop.session import Session
    from kvtop.settings import load_settings

    calls: list[tuple[Any, ...]] = []
    emit, emit_many, emit_kv_events = Session.emit, Session.emit_many, Session.emit_kv_events

    def k_emit(self: Session, record: Any, *, to_sinks: bool = True) -> None:
        calls.append(("one", record))
        emit(self, record, to_sinks=to_sinks)

    def k_many(self: Session, records: Any, *, to_sinks: bool = True) -> None:
        records = list(records)
        calls.append(("many", records))
        emit_many(self, records, to_sinks=to_sinks)

    def k_events(self: Session, source: Any, t: float, events: list[Any]) -> None:
        calls.append(("events", source, t, events))
        emit_kv_events(self, source, t, events)

    Session.emit, Session.emit_many, Session.emit_kv_events = k_emit, k_many, k_events  # type: ignore[method-assign]
    expected = sum(1 for line in Path(trace).read_text().splitlines() if line.strip())
    ns = build_parser().parse_args(["--engine", "sim", "--scenario", "trace", "--trace", trace, "--speed", "0",
                                    "--trace-time-scale", "1000", "--headless", "--json"])
    session = runner.build_session(load_settings(cli_values(ns), config_path=None))
    driver = session.driver
    d_emit = driver.emit
    answered = [0]

    def counted(record: Any) -> None:
        d_emit(record)
        answered[0] += 1
        if answered[0] >= expected:
            session.stop()

    driver.emit = counted
    asyncio.run(session.run(duration_s=cap))
    with open(out, "wb") as f:
        pickle.dump({"source": session.source, "warmup": session.warmup_requests, "calls": calls}, f)
    n = sum(len(c[3]) for c in calls if c[0] == "events")
    print(f"{len(calls):,} calls, {n:,} KV events in drains, {answered[0]} of {expected} answered -> {out}")


def digest(session: Any) -> str:
    """What the fold holds, as text: equal for two trees that fold the same."""
    m = session.model
    snap = m.snapshot()
    curve = session.sizing.curve() if hasattr(session.sizing, "curve") else None
    state = {"records": session.records, "snapshot": repr(snap), "whatif": session.whatif.estimate(),
             "curve": repr(curve)}
    return hashlib.sha256(json.dumps(state, sort_keys=True, default=repr).encode()).hexdigest()[:16]


def child(tree: str, drains: str, rounds: int) -> None:
    sys.path.insert(0, tree)
    from kvtop.session import Session

    with open(drains, "rb") as f:
        saved = pickle.load(f)
    best = None
    for _ in range(max(1, rounds)):
        session = Session(source=saved["source"], warmup_requests=saved["warmup"])
        emit, emit_many, emit_kv_events = session.emit, session.emit_many, session.emit_kv_events
        calls = saved["calls"]
        if rounds == 0:
            os.getppid()  # callgrind: the fold starts (--dump-before=getppid)
        t0 = time.process_time()
        for call in calls:
            what = call[0]
            if what == "events":
                emit_kv_events(call[1], call[2], call[3])
            elif what == "many":
                emit_many(call[1])
            else:
                emit(call[1])
        cpu = time.process_time() - t0
        if rounds == 0:
            os.getppid()  # callgrind: the fold ends
        best = cpu if best is None else min(best, cpu)
    print(json.dumps({"cpu_s": best, "digest": digest(session)}))


def _env(tree: Path) -> dict[str, str]:
    return dict(os.environ, PYTHONPATH=str(tree), PYTHONHASHSEED="0")


def cpu_of(tree: Path, drains: str, rounds: int) -> dict[str, Any]:
    out = subprocess.run([sys.executable, __file__, "--drains", drains, "--child", str(tree), "--rounds",
                          str(rounds)], capture_output=True, text=True, check=True, env=_env(tree), cwd=tree)
    return json.loads(out.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def instructions_of(tree: Path, drains: str) -> tuple[int, str]:
    with tempfile.TemporaryDirectory() as tmp:
        out_file = Path(tmp) / "cg.out"
        out = subprocess.run(["valgrind", "--tool=callgrind", "--dump-before=getppid",
                              f"--callgrind-out-file={out_file}", sys.executable, __file__, "--drains", drains,
                              "--child", str(tree), "--rounds", "0"],
                             capture_output=True, text=True, check=True, env=_env(tree), cwd=tree)
        text = Path(f"{out_file}.2").read_text(errors="replace")  # .1: start-up and unpickling; .2: the fold
    m = re.search(r"^summary:\s+(\d+)", text, re.M) or re.search(r"^totals:\s+(\d+)", text, re.M)
    assert m, "no callgrind summary"
    return int(m.group(1)), json.loads(out.stdout.strip().splitlines()[-1])["digest"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", help="a trace to capture the drains of (with --capture)")
    ap.add_argument("--capture", help="where to pickle the drains")
    ap.add_argument("--cap", type=float, default=300.0)
    ap.add_argument("--drains", help="drains captured before: fold them")
    ap.add_argument("--baseline", type=Path, help="a checkout of an earlier kvtop (kvtop/, themes/)")
    ap.add_argument("--pairs", type=int, default=3, help="child processes per tree, alternated")
    ap.add_argument("--rounds", type=int, default=2, help="fresh sessions per child (best of them)")
    ap.add_argument("--callgrind", action="store_true", help="instructions (valgrind) instead of CPU time")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.capture:
        if not a.trace:
            raise SystemExit("--capture needs --trace")
        capture(str(Path(a.trace).resolve()), a.capture, a.cap)
        return
    if not a.drains:
        raise SystemExit("give --trace and --capture, or --drains")
    drains = str(Path(a.drains).resolve())
    if a.child:
        child(a.child, drains, a.rounds)
        return
    trees = [("this tree", ROOT)] + ([("baseline", a.baseline.resolve())] if a.baseline else [])
    print(f"python {sys.version.split()[0]}, load {os.getloadavg()}, drains {drains}", flush=True)
    if a.callgrind:
        for name, tree in trees:
            n, dig = instructions_of(tree, drains)
            print(f"{name}: fold {n:,} instructions, digest {dig}", flush=True)
        return
    results: dict[str, list[float]] = {name: [] for name, _ in trees}
    digests: dict[str, str] = {}
    for _ in range(a.pairs):
        for name, tree in trees:
            res = cpu_of(tree, drains, a.rounds)
            results[name].append(res["cpu_s"])
            digests[name] = res["digest"]
    for name, _ in trees:
        cpus = sorted(results[name])
        print(f"{name}: fold CPU best {cpus[0]:.3f} s, median {cpus[len(cpus) // 2]:.3f} s, digest {digests[name]}")
    print(f"load at end {os.getloadavg()}")


if __name__ == "__main__":
    main()
