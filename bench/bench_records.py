"""What the record boundary costs: ``records.decode`` (JSON, envelope, bounds, cleaning) and ``Session.emit``
(fold, problems bookkeeping, stale clock) per record of a recording, in CPU time.

    python bench/bench_records.py                                   # tests/data/busy.jsonl, best of 9
    python bench/bench_records.py --baseline /tmp/kvtop-before      # the same, also for another kvtop tree
    python bench/bench_records.py --per-kind --baseline DIR         # decode per kind of line, trees alternated
    python bench/bench_records.py --callgrind --baseline DIR        # instructions a line per kind (load-proof)

``--baseline DIR``: a checkout (``git archive <commit> | tar -x -C DIR``) measured in a subprocess in the same
run, so the two figures share the machine's state. CPU time (``time.process_time``), not wall time: on a shared
machine the wall clock measures the neighbours.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BUSY = ROOT / "tests" / "data" / "busy.jsonl"

_MEASURE = r"""
import json, sys, time
from kvtop.records import decode
from kvtop.session import Session
lines = open(sys.argv[1], "rb").read().splitlines()
records = [decode(line) for line in lines]
best_decode = best_emit = float("inf")
for _ in range(int(sys.argv[2])):
    t = time.process_time()
    for line in lines:
        decode(line)
    best_decode = min(best_decode, time.process_time() - t)
    session = Session(meta={})
    t = time.process_time()
    for rec in records:
        session.emit(rec)
    best_emit = min(best_emit, time.process_time() - t)
print(json.dumps({"records": len(records), "decode_us": 1e6 * best_decode / len(lines),
                  "emit_us": 1e6 * best_emit / len(records)}))
"""


# One file of lines per kind (sys.argv[1:]): decode's CPU time a line, best of sys.argv[1] rounds, and orjson's
# alone; or (KVTOP_BENCH_CALLGRIND) each file's lines decoded once with callgrind's instrumentation on.
_MEASURE_KINDS = r"""
import json, os, subprocess, sys, time
from kvtop.records import decode
rounds, files = int(sys.argv[1]), sys.argv[2:]
try:
    import orjson
except ImportError:
    orjson = None
out = {}
for name in files:
    lines = open(name, "rb").read().splitlines()
    for line in lines:
        decode(line)   # caches (a source's SourceId) as in a long run
    if os.environ.get("KVTOP_BENCH_CALLGRIND"):
        subprocess.run(["callgrind_control", "-i", "on", str(os.getpid())], check=True, capture_output=True)
        for line in lines:
            decode(line)
        subprocess.run(["callgrind_control", "-i", "off", str(os.getpid())], check=True, capture_output=True)
        break
    best = best_orjson = float("inf")
    for _ in range(rounds):
        t = time.process_time()
        for line in lines:
            decode(line)
        best = min(best, time.process_time() - t)
        if orjson is not None:
            t = time.process_time()
            for line in lines:
                orjson.loads(line)
            best_orjson = min(best_orjson, time.process_time() - t)
    out[os.path.basename(name)] = {"lines": len(lines), "decode_us": 1e6 * best / len(lines),
                                   "orjson_us": 1e6 * best_orjson / len(lines)}
print(json.dumps(out))
"""


def kind_of(line: bytes) -> str:
    """A line's kind, a KV event's by its type (``removed``, ``stored``...), for the per-kind figures."""
    obj = json.loads(line)
    if obj.get("kind") == "kv_event":
        return str(obj["data"]["data"].get("type"))
    return str(obj.get("kind"))


def split_by_kind(recording: Path, folder: Path, sample: int) -> dict[str, Path]:
    """The recording's lines in one file per kind (at most ``sample`` lines each, the first ones)."""
    groups: dict[str, list[bytes]] = defaultdict(list)
    for line in recording.read_bytes().splitlines():
        if line.strip():
            group = groups[kind_of(line)]
            if len(group) < sample:
                group.append(line)
    files = {}
    for kind, lines in sorted(groups.items(), key=lambda kv: -len(kv[1])):
        files[kind] = folder / kind
        files[kind].write_bytes(b"\n".join(lines) + b"\n")
    return files


def per_kind(trees: list[tuple[str, Path]], recording: Path, rounds: int, sample: int) -> None:
    """decode's CPU time a line per kind for each tree, the trees alternated ``rounds`` times (best of all)."""
    with tempfile.TemporaryDirectory() as folder:
        files = split_by_kind(recording, Path(folder), sample)
        best: dict[str, dict[str, dict[str, float]]] = {name: {} for name, _ in trees}
        for _ in range(rounds):
            for name, tree in trees:
                run = subprocess.run([sys.executable, "-c", _MEASURE_KINDS, "3", *map(str, files.values())],
                                     capture_output=True, text=True, check=True, cwd=tree,
                                     env={**os.environ, "PYTHONPATH": str(tree)})
                for kind, r in json.loads(run.stdout).items():
                    old = best[name].get(kind)
                    if old is None or r["decode_us"] < old["decode_us"]:
                        best[name][kind] = r
        print(f"{'kind':>10} {'lines':>6}  " + "  ".join(f"{name:>10}" for name, _ in trees) + "   orjson.loads")
        for kind in files:
            first = best[trees[0][0]][kind]
            print(f"{kind:>10} {first['lines']:6}  " + "  ".join(f"{best[name][kind]['decode_us']:7.2f} us"
                                                                for name, _ in trees)
                  + f"   {first['orjson_us']:6.2f} us")


def callgrind(trees: list[tuple[str, Path]], recording: Path, sample: int) -> None:
    """Instructions a line per kind for each tree (``valgrind --tool=callgrind --instr-atstart=no``, counting
    only the decode loop: a figure the machine's other load does not move)."""
    with tempfile.TemporaryDirectory() as folder:
        files = split_by_kind(recording, Path(folder), sample)
        print(f"{'kind':>10} {'lines':>6}  " + "  ".join(f"{name:>14}" for name, _ in trees))
        for kind, path in files.items():
            counts = []
            for _, tree in trees:
                argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                        f"--callgrind-out-file={folder}/cg.out", sys.executable, "-c", _MEASURE_KINDS, "1", str(path)]
                run = subprocess.run(argv, capture_output=True, text=True, check=True, cwd=tree,
                                     env={**os.environ, "PYTHONPATH": str(tree), "KVTOP_BENCH_CALLGRIND": "1",
                                          "PYTHONHASHSEED": "0"})
                found = re.search(r"Collected : (\d+)", run.stderr)
                if found is None:
                    raise SystemExit(f"no instruction count from callgrind: {run.stderr[-500:]}")
                counts.append(int(found[1]))
            lines = len(path.read_bytes().splitlines())
            print(f"{kind:>10} {lines:6}  " + "  ".join(f"{c / lines:14,.0f}" for c in counts), flush=True)


def measure(tree: Path, recording: Path, rounds: int) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    out = subprocess.run([sys.executable, "-c", _MEASURE, str(recording), str(rounds)], capture_output=True,
                         text=True, check=True, env=env, cwd=tree)
    return json.loads(out.stdout)  # type: ignore[no-any-return]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--recording", type=Path, default=BUSY)
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--baseline", type=Path, default=None, help="another kvtop tree, measured in the same run")
    ap.add_argument("--per-kind", action="store_true", help="decode a line per kind of line, trees alternated")
    ap.add_argument("--callgrind", action="store_true", help="instructions a line per kind (valgrind; minutes)")
    ap.add_argument("--sample", type=int, default=2000, help="lines of each kind (--per-kind, --callgrind)")
    a = ap.parse_args()
    trees = [("this tree", ROOT)] + ([("baseline", a.baseline)] if a.baseline else [])
    started = time.time()
    if a.per_kind or a.callgrind:
        if a.per_kind:
            per_kind(trees, a.recording, a.rounds, a.sample)
        if a.callgrind:
            callgrind(trees, a.recording, min(a.sample, 500))
        print(f"({time.time() - started:.0f} s)")
        return
    for name, tree in trees:
        r = measure(tree, a.recording, a.rounds)
        print(f"{name:>10}: decode {r['decode_us']:6.1f} us/line, Session.emit {r['emit_us']:6.1f} us/record "
              f"({r['records']:,} records of {a.recording.name}, best of {a.rounds})")
    print(f"({time.time() - started:.0f} s)")


if __name__ == "__main__":
    main()
