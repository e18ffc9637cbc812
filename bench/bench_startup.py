"""What an attached kvtop's start-up costs, for one or more trees alternated: the imports of ``kvtop replay``, or the
whole process up to its first screen; as CPU time, or as instructions (callgrind: the same count run after run,
where CPU time on this shared machine varies by half).

    python bench/bench_startup.py                                       # imports, this tree, 10 rounds
    python bench/bench_startup.py --baseline /tmp/base --rounds 15      # and another checkout, alternated
    python bench/bench_startup.py --first-screen --baseline /tmp/base   # the process up to its first screen
    python bench/bench_startup.py --first-screen --callgrind --rounds 2 --baseline /tmp/base   # instructions

- imports (default): a fresh ``python -c`` whose own ``time.process_time()`` brackets the imports of what
  ``kvtop replay`` loads before its first screen (interpreter start-up left out): kvtop's modules and all they
  bring (Textual, asyncio, msgspec...).
- ``--first-screen``: ``kvtop replay tests/data/busy.jsonl --refresh 0.25`` in a 120x40 pseudo-terminal, stopped
  the moment its first screen holding the header text ``up 0:00`` is handed to Textual's writer thread (the mark
  bench/bench_attached.py waits for, without its 20 ms polling): the process's CPU (getrusage, interpreter start-up
  included) at that moment.
- ``--callgrind``: each sample under ``valgrind --tool=callgrind``; the figure is the instructions of the whole
  process (about 25 s a first-screen sample on the dev box).

Compile the trees' bytecode first (``python -m compileall -q kvtop``), or the figures include compiling. Each tree
runs in its own directory (``python -c`` puts the working directory ahead of PYTHONPATH).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench_attached import _ESCAPES, Terminal  # the same terminal (120x40) and the same first-screen mark

REPO = Path(__file__).resolve().parents[1]

# What `kvtop replay FILE` imports before its first screen (kvtop/cli.py -> kvtop/commands/attach.py -> compose, the
# replay source, kvtop/modes.py -> kvtop/ui/app.py; before issue 25: kvtop/attach.py -> runner); the module count is
# printed so that a tree importing more shows it.
IMPORTS = """
import importlib.util, sys, time, json
t = time.process_time()
import kvtop.cli, kvtop.sources.replay, kvtop.modes, kvtop.ui.app
if importlib.util.find_spec("kvtop.commands") is not None:
    import kvtop.commands.attach
else:  # a tree from before kvtop/commands/
    import kvtop.attach, kvtop.runner
print(json.dumps({"cpu_s": time.process_time() - t, "modules": len(sys.modules), "kvtop": kvtop.__file__}))
"""

# `kvtop replay ...` as `python -m kvtop` runs it, with Textual's writer watched for the first screen; the CPU and
# the module count go to $STARTUP_OUT, then the process ends at once (os._exit: nothing after the mark is counted).
FIRST_SCREEN = r"""
import json, os, re, resource, runpy, sys
import textual.drivers._writer_thread as writer
escapes = re.compile(os.environ["STARTUP_ESCAPES"])
written = []
write = writer.WriterThread.write
def watched(self, text):
    write(self, text)
    written.append(text)
    if "up 0:00" in escapes.sub("", "".join(written)):
        r = resource.getrusage(resource.RUSAGE_SELF)
        import kvtop
        with open(os.environ["STARTUP_OUT"], "w") as f:
            json.dump({"cpu_s": r.ru_utime + r.ru_stime, "modules": len(sys.modules), "kvtop": kvtop.__file__}, f)
        os._exit(0)
writer.WriterThread.write = watched
sys.argv = ["kvtop", *sys.argv[1:]]
runpy.run_module("kvtop", run_name="__main__")
"""


def _env(tree: Path, **extra: str) -> dict[str, str]:
    path = os.pathsep.join([str(tree), *filter(None, [os.environ.get("PYTHONPATH")])])
    return {**os.environ, "PYTHONPATH": path, **extra}


def _callgrind_total(path: Path) -> int:
    for line in path.read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise RuntimeError(f"{path}: no instruction total (did valgrind run?)")


def sample(tree: Path, first_screen: bool, callgrind: bool, work: Path) -> dict[str, Any]:
    prefix = []
    cg_out = work / "callgrind.out"
    if callgrind:
        prefix = ["valgrind", "--tool=callgrind", f"--callgrind-out-file={cg_out}"]
    if not first_screen:
        out = subprocess.run([*prefix, sys.executable, "-c", IMPORTS], env=_env(tree), cwd=tree, capture_output=True,
                             text=True, check=True)
        row = json.loads(out.stdout.strip().splitlines()[-1])
    else:
        if not any((tree / d).is_dir() for d in ("themes", "kvtop/_themes")):
            # without its shipped themes kvtop falls back to textual-dark: no theme switch, no restyle (~90M
            # instructions less), not the same first screen
            raise SystemExit(f"{tree}: no themes/ (nor kvtop/_themes): copy the tree's themes/ beside its kvtop/")
        result = work / "first-screen.json"
        result.unlink(missing_ok=True)
        # the one recording for every tree (a --baseline tree may be kvtop/ alone)
        term = Terminal([*prefix, sys.executable, "-c", FIRST_SCREEN, "replay",
                         str(REPO / "tests" / "data" / "busy.jsonl"), "--refresh", "0.25"],
                        _env(tree, STARTUP_OUT=str(result), STARTUP_ESCAPES=_ESCAPES.pattern.decode()), cwd=tree)
        try:
            term.proc.wait(600 if callgrind else 60)
        except subprocess.TimeoutExpired:
            pass
        finally:
            term.close()
        if not result.exists():
            raise RuntimeError(f"{tree}: no first screen (exit {term.proc.returncode}): "
                               f"{term.tail.decode('utf-8', 'replace')[-600:]!r}")
        row = json.loads(result.read_text())
    if callgrind:
        row["instructions"] = _callgrind_total(cg_out)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", action="append", default=[], metavar="DIR",
                    help="another checkout of kvtop, run alternately with this tree (repeatable)")
    ap.add_argument("--rounds", type=int, default=10)
    ap.add_argument("--first-screen", action="store_true",
                    help="the whole process up to its first screen, not the imports alone")
    ap.add_argument("--callgrind", action="store_true", help="count instructions under valgrind's callgrind")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    if a.callgrind and shutil.which("valgrind") is None:
        ap.error("--callgrind needs valgrind on the PATH")
    trees = [REPO, *(Path(b).resolve() for b in a.baseline)]
    runs: dict[str, list[dict[str, Any]]] = {str(t): [] for t in trees}
    with tempfile.TemporaryDirectory(prefix="kvtop-startup-") as tmp:
        for _ in range(max(1, a.rounds)):
            for tree in trees:
                runs[str(tree)].append(sample(tree, a.first_screen, a.callgrind, Path(tmp)))
    key = "instructions" if a.callgrind else "cpu_s"
    result = {}
    for name, rows in runs.items():
        values = [r[key] for r in rows]
        result[name] = {"best": min(values), "median": statistics.median(values), "runs": values,
                        "modules": rows[-1]["modules"], "imported": rows[-1]["kvtop"]}
    what = "first screen" if a.first_screen else "imports"
    if a.json:
        print(json.dumps({"measure": f"{what}, {key}", "load_1m": round(os.getloadavg()[0], 2), "trees": result},
                         indent=1))
        return 0
    for name, r in result.items():
        if a.callgrind:
            figures = f"best {r['best'] / 1e6:8.1f}M  median {r['median'] / 1e6:8.1f}M instructions"
        else:
            figures = f"best {r['best'] * 1e3:6.1f} ms  median {r['median'] * 1e3:6.1f} ms CPU"
        print(f"{name:36} {what}: {figures}  {r['modules']} modules  ({len(r['runs'])} runs)")
    print(f"load {os.getloadavg()[0]:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
