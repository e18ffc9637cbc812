"""Where ``Session.emit`` spends its time, per record kind and per stage, this tree beside another in one run.

    python bench/bench_emit.py --recording /tmp/kvtop-bench/busy-scale1-40s.jsonl --baseline /tmp/base-e1b
    python bench/bench_emit.py --recording FILE --baseline DIR --callgrind     # instruction counts instead

Stages, each over the whole recording (decoded first, not timed), from a fresh object each round, CPU time
(``time.process_time``), best of ``--rounds``, the trees alternated round by round in child processes so that a busy
shared machine slows both alike:

- ``emit``: ``Session.emit`` (what ``kvtop replay`` calls per record: fold, live what-if, bookkeeping);
- ``model``: ``TierModel.apply`` alone; ``whatif``: ``WhatIf.apply_kv_event`` / ``apply_stats`` alone;
- ``replay``: ``replay_into(path, session.emit, speed=0)``: reading and decoding the lines too, with the replay
  loop's own steps (its generator, the pacing, the sink call) on top of ``decode`` + ``emit``;
- ``loop`` / ``loop_many``: the replay loop alone (``replay_into`` over records decoded beforehand, every one due,
  into a sink that does nothing: one call a record / one a batch where the tree has ``sink_many``);
  ``paced_emit``: the same loop into the session, as ``kvtop replay`` runs it (``emit_many`` where there is one);
- per kind: each ``emit`` call timed with ``process_time_ns`` less the timer's own (median) cost: a timer
  distorts a 1 us call less than a profiler does, but still: read these as shares, the stage totals as the figures.

``--callgrind``: the same stages under ``valgrind --tool=callgrind``, as instructions a record: the child marks
the stage's start and end with ``os.getppid()``, where callgrind dumps its counts (``--dump-before=getppid``), so
start-up and decoding are left out (PYTHONHASHSEED=0). Slow (~1 min a stage and tree) but steady on a shared
machine, where CPU time moves by 10-20% between runs.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUSY = ROOT / "tests" / "data" / "busy.jsonl"

_CHILD = r"""
import asyncio, gc, json, sys, time
from collections import defaultdict
from kvtop.records import decode
from kvtop.session import Session
from kvtop.tiers import TierModel
from kvtop.tiers.whatif import WhatIf
import kvtop.session
path, stage, rounds = sys.argv[1], sys.argv[2], int(sys.argv[3])
assert kvtop.session.__file__.startswith(sys.argv[4]), (kvtop.session.__file__, sys.argv[4])
records = [decode(line) for line in open(path, "rb").read().splitlines()]

def whatif_step(w):
    kv, st = w.apply_kv_event, w.apply_stats
    def step(r):
        if r.kind == "kv_event":
            kv(r.data)
        elif r.kind == "stats":
            st(r.data)
    return step

def stage_run():
    if stage == "decode":
        return
    if stage == "replay":
        from kvtop.sources.replay import replay_into
        asyncio.run(replay_into(path, Session(meta={}).emit, 0.0))
        return
    if stage in ("loop", "loop_many", "paced_emit"):
        # the replay loop alone: its lines come decoded already (read_jsonl replaced), paced at a speed that
        # makes every record due at once (the pacing's arithmetic is run, no sleep is), into a sink that does
        # nothing ("loop": record by record; "loop_many": a batch a call, where the tree has sink_many), or
        # into the session ("paced_emit": as kvtop replay calls it)
        import inspect
        import kvtop.sources.replay as rp
        rp.read_jsonl = lambda *a, **k: iter(records)
        many = "sink_many" in inspect.signature(rp.replay_into).parameters
        if stage == "paced_emit":
            session = Session(meta={})
            extra = {"sink_many": session.emit_many} if many else {}
            asyncio.run(rp.replay_into(path, session.emit, 1e12, **extra))
        else:
            extra = {"sink_many": lambda batch: None} if many and stage == "loop_many" else {}
            asyncio.run(rp.replay_into(path, lambda r: None, 1e12, **extra))
        return
    step = {"emit": lambda: Session(meta={}).emit, "model": lambda: TierModel().apply,
            "whatif": lambda: whatif_step(WhatIf())}[stage]()
    for r in records:
        step(r)

if rounds == 0:  # one pass, for callgrind: getppid() marks the stage's ends (--dump-before=getppid)
    import os
    os.getppid()
    stage_run()
    os.getppid()
    sys.exit(0)
out = {"records": len(records), "best_s": float("inf")}
for _ in range(rounds):
    gc.collect()
    t = time.process_time()
    stage_run()
    out["best_s"] = min(out["best_s"], time.process_time() - t)
if stage == "emit":  # shares per kind
    kinds = ["kv." + r.data["data"]["type"] if r.kind == "kv_event" and isinstance(r.data.get("data"), dict)
             else r.kind for r in records]
    pc = time.process_time_ns  # CPU time: on a loaded machine a wall clock counts the neighbours' turns too
    cal = sorted(-pc() + pc() for _ in range(10001))[5000]  # the timer's own cost, its median
    best = {}
    for _ in range(rounds):
        emit = Session(meta={}).emit
        acc = defaultdict(int)
        for r, k in zip(records, kinds):
            t0 = pc()
            emit(r)
            acc[k] += pc() - t0 - cal
        for k, v in acc.items():
            best[k] = min(best.get(k, float("inf")), v)
    count = defaultdict(int)
    for k in kinds:
        count[k] += 1
    out["kinds"] = {k: {"n": count[k], "us": best[k] / 1e3 / count[k]} for k in count}
print(json.dumps(out))
"""

STAGES = ("emit", "model", "whatif", "paced_emit", "loop", "loop_many", "replay")


def _env(tree: Path) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(tree), "PYTHONHASHSEED": "0"}


def cpu(tree: Path, recording: Path, stage: str, rounds: int) -> dict:
    out = subprocess.run([sys.executable, "-c", _CHILD, str(recording), stage, str(rounds), str(tree)],
                         capture_output=True, text=True, check=True, env=_env(tree), cwd=tree)
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def instructions(tree: Path, recording: Path, stage: str) -> int:
    """The stage's instructions alone: callgrind dumps its counts at each getppid() the child calls around it."""
    with tempfile.TemporaryDirectory() as tmp:
        out_file = Path(tmp) / "cg.out"
        subprocess.run(["valgrind", "--tool=callgrind", "--dump-before=getppid", f"--callgrind-out-file={out_file}",
                        sys.executable, "-c", _CHILD, str(recording), stage, "0", str(tree)],
                       capture_output=True, text=True, check=True, env=_env(tree), cwd=tree)
        text = Path(f"{out_file}.2").read_text(errors="replace")  # .1: start-up and decode; .2: the stage
    m = re.search(r"^summary:\s+(\d+)", text, re.M) or re.search(r"^totals:\s+(\d+)", text, re.M)
    assert m, "no callgrind summary"
    return int(m.group(1))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recording", type=Path, default=BUSY)
    ap.add_argument("--rounds", type=int, default=5, help="CPU time: best of this many, per tree and stage")
    ap.add_argument("--pairs", type=int, default=3, help="CPU time: child processes per tree, alternated")
    ap.add_argument("--baseline", type=Path, default=None, help="another kvtop tree, measured in the same run")
    ap.add_argument("--stages", default=",".join(STAGES))
    ap.add_argument("--callgrind", action="store_true", help="instructions (valgrind) instead of CPU time")
    a = ap.parse_args()
    trees = [("this tree", ROOT)] + ([("baseline", a.baseline.resolve())] if a.baseline else [])
    stages = [s for s in a.stages.split(",") if s]
    n = sum(1 for _ in open(a.recording, "rb"))
    if a.callgrind:
        for stage in stages:
            row = []
            for name, tree in trees:
                row.append(f"{name} {instructions(tree, a.recording, stage) / n:,.0f}")
            print(f"{stage:>7}: instructions a record ({n:,} lines): " + ", ".join(row), flush=True)
        return
    results: dict[str, dict[str, dict]] = {name: {} for name, _ in trees}
    for _ in range(a.pairs):
        for stage in stages:
            for name, tree in trees:
                r = cpu(tree, a.recording, stage, a.rounds)
                old = results[name].get(stage)
                if old is None or r["best_s"] < old["best_s"]:
                    results[name][stage] = r
    for stage in stages:
        row = ", ".join(f"{name} {1e6 * results[name][stage]['best_s'] / n:6.2f}" for name, _ in trees)
        print(f"{stage:>7}: us a record, best of {a.pairs}x{a.rounds} ({n:,} lines): {row}")
    if "emit" in stages:
        print("Session.emit per kind (us a record, timed one by one: shares):")
        kinds = results[trees[0][0]]["emit"]["kinds"]
        for k in sorted(kinds, key=lambda k: -kinds[k]["n"] * kinds[k]["us"]):
            row = ", ".join(f"{name} {results[name]['emit']['kinds'].get(k, {}).get('us', float('nan')):7.2f}"
                            for name, _ in trees)
            print(f"  {k:>12} x{kinds[k]['n']:>6,}: {row}")


if __name__ == "__main__":
    main()
