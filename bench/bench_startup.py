"""What an attached kvtop's start-up imports cost: the CPU of importing what ``kvtop replay`` imports before its
first screen, in a fresh interpreter each time, for one or more trees alternated.

    python bench/bench_startup.py                                  # this tree, 10 rounds
    python bench/bench_startup.py --baseline /tmp/base --rounds 15 # this tree and another checkout, alternated

Each sample is a fresh ``python -c`` whose own ``time.process_time()`` brackets the imports (interpreter start-up
itself, the same for every tree, is left out), so the figure is the imports alone: kvtop's modules and everything
they bring (Textual, asyncio, msgspec...). Compile the trees' bytecode first (``python -m compileall -q kvtop``),
or the first round includes compiling. bench/bench_attached.py measures the whole start-up up to the first screen
in a pseudo-terminal; this one isolates the imports, with less noise (no 20 ms polling, no terminal).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]

# What `kvtop replay FILE` imports before its first screen (kvtop/cli.py -> kvtop/attach.py -> runner, the replay
# source, kvtop/modes.py -> kvtop/ui/app.py); the module count is printed so that a tree importing more shows it.
PROBE = """
import sys, time, json
t = time.process_time()
import kvtop.cli, kvtop.attach, kvtop.runner, kvtop.sources.replay, kvtop.modes, kvtop.ui.app
print(json.dumps({"cpu_s": time.process_time() - t, "modules": len(sys.modules), "kvtop": kvtop.__file__}))
"""


def sample(tree: Path) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tree), *filter(None, [os.environ.get("PYTHONPATH")])])}
    # cwd=tree: `python -c` puts the working directory first on sys.path, ahead of PYTHONPATH, so a run from one
    # checkout would import that checkout's kvtop for every tree.
    out = subprocess.run([sys.executable, "-c", PROBE], env=env, cwd=tree, capture_output=True, text=True,
                         check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", action="append", default=[], metavar="DIR",
                    help="another checkout of kvtop, run alternately with this tree (repeatable)")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    trees = [REPO, *(Path(b).resolve() for b in a.baseline)]
    runs: dict[str, list[dict[str, Any]]] = {str(t): [] for t in trees}
    for _ in range(max(1, a.rounds)):
        for tree in trees:
            runs[str(tree)].append(sample(tree))
    result = {}
    for name, rows in runs.items():
        cpu = [r["cpu_s"] for r in rows]
        result[name] = {"best_s": round(min(cpu), 4), "median_s": round(statistics.median(cpu), 4),
                        "modules": rows[-1]["modules"], "imported": rows[-1]["kvtop"],
                        "runs_s": [round(c, 4) for c in cpu]}
    if a.json:
        print(json.dumps({"load_1m": round(os.getloadavg()[0], 2), "trees": result}, indent=1))
    else:
        for name, r in result.items():
            print(f"{name:40} imports best {r['best_s'] * 1e3:6.1f} ms  median {r['median_s'] * 1e3:6.1f} ms  "
                  f"{r['modules']} modules  ({len(r['runs_s'])} runs)")
        print(f"load {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
