"""Simulator A/B: the full synthetic trace replayed by several revisions at once, each pinned to its own core.

On a shared machine one replay's wall time moves by +-20% with the neighbours' load, more than one optimisation
step saves. Running the revisions side by side, each on its own core, exposes them to the same load, and the best
of several runs per revision is compared. Each revision's ``kvtop/`` is taken with ``git archive`` (no worktree,
nothing in this checkout changes); ``WORKTREE`` stands for this checkout's files as they are, and a directory
holding a ``kvtop/`` for that copy (for a machine without this repository's history).

    python bench/bench_sim_ab.py 7a6fa92 HEAD WORKTREE --runs 6
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import statistics
import subprocess
import tarfile
import tempfile
import threading
from pathlib import Path

from bench_sim import ROOT, TRACE, bench_trace  # this directory is on sys.path when a script here runs


def export(rev: str, into: Path) -> None:
    """``kvtop/`` of ``rev`` (or of this checkout for WORKTREE) into ``into``."""
    source = ROOT if rev == "WORKTREE" else Path(rev) if (Path(rev) / "kvtop").is_dir() else None
    if source is not None:
        shutil.copytree(source / "kvtop", into / "kvtop", ignore=shutil.ignore_patterns("__pycache__"))
        return
    archive = subprocess.run(["git", "archive", rev, "kvtop"], cwd=ROOT, check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        if hasattr(tarfile, "data_filter"):  # Python >= 3.11.4 / 3.10.12: refuse links and paths out of ``into``
            tar.extractall(into, filter="data")
        else:
            tar.extractall(into)  # git archive of this repository's own tree


def replay(tree: Path, core: int | None, limit: int | None) -> float:
    prefix = ["taskset", "-c", str(core)] if core is not None else []
    return float(bench_trace(limit, cwd=tree, prefix=prefix)["result"]["runs"][0]["wall_seconds"])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("revs", nargs="+", help="git revisions, WORKTREE for this checkout as it is, or directories "
                                           "holding a kvtop/")
    p.add_argument("--runs", type=int, default=6, help="replays per revision (the best is compared)")
    p.add_argument("--limit", type=int, default=None, help="replay only the first N trace requests")
    p.add_argument("--serial", action="store_true", help="one replay at a time, alternating (a machine with few cores)")
    a = p.parse_args()
    if not TRACE.exists():
        raise SystemExit(f"trace not found: {TRACE} (set KVTOP_TRACE)")
    cores = sorted(os.sched_getaffinity(0))
    if not a.serial and len(cores) < 2 * len(a.revs):
        raise SystemExit(f"{len(a.revs)} revisions side by side want {2 * len(a.revs)} cores (every other one), "
                         f"this process has {len(cores)}: use --serial")
    times: dict[str, list[float]] = {rev: [] for rev in a.revs}
    with tempfile.TemporaryDirectory() as tmp:
        trees = {rev: Path(tmp) / f"rev{i}" for i, rev in enumerate(a.revs)}
        for rev, tree in trees.items():
            export(rev, tree)
        if a.serial:
            for _ in range(a.runs):
                for rev in a.revs:
                    times[rev].append(replay(trees[rev], None, a.limit))
        else:
            def run_all(rev: str, core: int) -> None:
                for _ in range(a.runs):
                    times[rev].append(replay(trees[rev], core, a.limit))

            # every other core: neighbouring logical cores may be SMT siblings
            threads = [threading.Thread(target=run_all, args=(rev, cores[2 * i + 1])) for i, rev in enumerate(a.revs)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
    base = min(times[a.revs[0]])
    for rev in a.revs:
        ts = times[rev]
        print(f"{rev:>12}: best {min(ts):6.2f} s  median {statistics.median(ts):6.2f} s  "
              f"({base / min(ts):.2f}x the first)  all {' '.join(f'{t:.2f}' for t in ts)}")


if __name__ == "__main__":
    main()
