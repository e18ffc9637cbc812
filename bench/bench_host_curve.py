"""``sweep.host_curve`` alone (kvtop/engines/sim/sweep/one_pass.py: the LRU replay at the largest host size, then the
smaller sizes' counts), this tree against a baseline tree, in one process, alternated; or its instruction count
under callgrind.

    PYTHONHASHSEED=0 nice -n 5 /work/venv/bin/python bench/bench_host_curve.py --baseline /tmp/base-14d --repeat 9
    PYTHONHASHSEED=0 nice -n 5 /work/venv/bin/python bench/bench_host_curve.py --callgrind [--tree DIR]

The sizes are the ones ``kvtop sim --one-pass --host-cache 0:64GB:16`` asks for on the Mooncake trace (the default
model and GPU): 1,566 GPU blocks and 0..847 host blocks at 512 tokens a block, 25,054 and 0..13,563 at 32. Both
trees' kvtop are imported into this process (the baseline's modules first, kept under their own objects: every
kvtop name they use is bound at import), each curve is checked equal to the baseline's, and each round times both
(CPU seconds, ``time.process_time``), so load falls on both alike; best and median of ``--repeat``.

``--callgrind``: runs itself under ``valgrind --tool=callgrind`` twice per tree, once reading the trace only and
once reading it and running ``host_curve`` once, and prints the difference (the curve's instructions).
"""

from __future__ import annotations

import argparse
import importlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TRACE = Path(os.environ.get("KVTOP_TRACE", ROOT.parent / "shared" / "traces" / "mooncake_synthetic_trace.jsonl"))
# (tokens a block, GPU blocks, host sizes): what the CLI passes host_curve for --host-cache 0:64GB:16
CASES = {
    512: (1566, [0, 56, 113, 169, 226, 282, 339, 395, 452, 508, 565, 621, 678, 734, 791, 847]),
    32: (25054, [0, 904, 1808, 2712, 3616, 4521, 5425, 6329, 7233, 8138, 9042, 9946, 10850, 11754, 12659, 13563]),
}


def load_tree(tree: Path) -> tuple:
    """(read_trace, host_curve) of the kvtop under ``tree``, its modules then dropped from sys.modules."""
    for name in [m for m in sys.modules if m == "kvtop" or m.startswith("kvtop.")]:
        del sys.modules[name]
    sys.path.insert(0, str(tree))
    try:
        trace = importlib.import_module("kvtop.workload.trace")
        sweep = importlib.import_module("kvtop.engines.sim.sweep")
    finally:
        sys.path.remove(str(tree))
    if not str(sweep.__file__).startswith(str(tree)):
        raise SystemExit(f"imported {sweep.__file__}, not from {tree}")
    for name in [m for m in sys.modules if m == "kvtop" or m.startswith("kvtop.")]:
        del sys.modules[name]
    return trace.read_trace, sweep.host_curve


def inner(mode: str, tree: Path, tpb: int) -> None:
    """One callgrind run: read the trace, then (mode ``curve``) one host_curve."""
    read_trace, host_curve = load_tree(tree)
    requests = list(read_trace(TRACE))
    if mode == "curve":
        primary, sizes = CASES[tpb]
        host_curve(requests, primary, sizes, tpb)


def callgrind(trees: list[Path], tpb: int) -> None:
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        raise SystemExit("valgrind not found")
    env = dict(os.environ, PYTHONHASHSEED="0")
    counts: dict[tuple[str, str], int] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for tree in trees:
            for mode in ("read", "curve"):
                out = Path(tmp) / f"cg.{len(counts)}"
                done = subprocess.run([valgrind, "--tool=callgrind", f"--callgrind-out-file={out}", sys.executable,
                                       __file__, "--inner", mode, "--tree", str(tree), "--tokens-per-block", str(tpb)],
                                      env=env, capture_output=True, text=True, check=False)
                m = re.search(r"Collected : (\d+)", done.stderr)
                if done.returncode != 0 or m is None:
                    raise SystemExit(f"callgrind of {tree} {mode} failed:\n{done.stderr[-2000:]}")
                counts[(str(tree), mode)] = int(m.group(1))
    for tree in trees:
        read, curve = counts[(str(tree), "read")], counts[(str(tree), "curve")]
        print(f"{tree}: read {read / 1e6:,.1f}M, read + host_curve {curve / 1e6:,.1f}M, host_curve "
              f"{(curve - read) / 1e6:,.1f}M instructions ({tpb} tokens a block)")


def alternate(tree: Path, baseline: Path, tpb: int, repeat: int) -> None:
    import gc

    base_read, base_curve = load_tree(baseline)
    read_trace, host_curve = load_tree(tree)
    requests = list(read_trace(TRACE))
    primary, sizes = CASES[tpb]
    if host_curve(requests, primary, sizes, tpb) != base_curve(requests, primary, sizes, tpb):
        raise SystemExit("the two trees' curves differ")
    times: dict[str, list[float]] = {"tree": [], "base": []}
    for _ in range(repeat):
        for name, fn in (("tree", host_curve), ("base", base_curve)):
            gc.collect()
            t0 = time.process_time()
            fn(requests, primary, sizes, tpb)
            times[name].append(time.process_time() - t0)
    load = os.getloadavg()[0]
    for name, path in (("tree", tree), ("base", baseline)):
        t = times[name]
        print(f"{name} {path}: host_curve best {min(t):.4f} s CPU, median {statistics.median(t):.4f} "
              f"({repeat} runs, {tpb} tokens a block)")
    print(f"tree / base: best {min(times['tree']) / min(times['base']):.3f}, median "
          f"{statistics.median(times['tree']) / statistics.median(times['base']):.3f}; load average now {load:.2f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--tree", type=Path, default=ROOT)
    p.add_argument("--baseline", type=Path, default=None)
    p.add_argument("--repeat", type=int, default=9)
    p.add_argument("--tokens-per-block", type=int, default=512, choices=sorted(CASES))
    p.add_argument("--callgrind", action="store_true")
    p.add_argument("--inner", choices=("read", "curve"), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.inner:
        inner(a.inner, a.tree.resolve(), a.tokens_per_block)
    elif a.callgrind:
        callgrind([a.tree.resolve()] + ([a.baseline.resolve()] if a.baseline else []), a.tokens_per_block)
    else:
        if a.baseline is None:
            raise SystemExit("--baseline DIR: the tree to alternate with")
        alternate(a.tree.resolve(), a.baseline.resolve(), a.tokens_per_block, a.repeat)


if __name__ == "__main__":
    main()
