"""A kvtop module as it was at an older commit, read from git history into a fresh module (not a copy in the tree).

bench/bench_sim.py measures the block manager against the one before the speed work, and
tests/engines/sim/test_block_manager_golden.py checks the optimized one gives that one's logs. Both used to read a
601-line frozen copy kept in bench/; ``git show REV:kvtop/engines/sim/block_manager.py`` gives the same text (the copy
was 842a6f7's file with a two-line header), so the copy is gone and the history is the baseline (issue 15).

The module is executed as its own top-level module: its ``from kvtop...`` imports resolve against today's tree
(842a6f7's block manager imports only kvtop.engines.sim.retention's priorities and KvCacheRetentionConfig, as the
copy did).
"""

from __future__ import annotations

import linecache
import subprocess
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# The commit before the simulator speed work (730b3cd and the block-key commits after it): its block manager is
# TensorRT-LLM 1.2's step for step, in plain Python (recursive freeChildren, list keys, no lazy queue deletion).
BASELINE_REV = "842a6f7"
BLOCK_MANAGER = "kvtop/engines/sim/block_manager.py"


class BaselineMissing(RuntimeError):
    """No git, not a git checkout, or a history without ``rev`` (a shallow clone, a source tarball)."""


def source_at(rev: str = BASELINE_REV, path: str = BLOCK_MANAGER, repo: Path = ROOT) -> str:
    try:
        out = subprocess.run(["git", "show", f"{rev}:{path}"], cwd=repo, capture_output=True, text=True,
                             timeout=60)
    except (OSError, subprocess.SubprocessError) as exc:
        raise BaselineMissing(f"git show {rev}:{path}: {exc}") from exc
    if out.returncode != 0:
        raise BaselineMissing(f"git show {rev}:{path}: {out.stderr.strip() or f'exit {out.returncode}'}")
    return out.stdout


def module_at(name: str, rev: str = BASELINE_REV, path: str = BLOCK_MANAGER, repo: Path = ROOT) -> types.ModuleType:
    """``path`` at ``rev`` as a new module called ``name`` (each call a fresh one, so that a patch applied to one
    never reaches another). Raises BaselineMissing where the history is not there."""
    text = source_at(rev, path, repo)
    filename = f"<git {rev}:{path}>"
    # tracebacks and inspect show the old lines
    linecache.cache[filename] = (len(text), None, text.splitlines(keepends=True), filename)
    module = types.ModuleType(name)
    module.__file__ = filename
    # registered while it runs: dataclasses and typing look their module up in sys.modules
    previous = sys.modules.get(name)
    sys.modules[name] = module
    try:
        exec(compile(text, filename, "exec"), module.__dict__)
    finally:
        if previous is None:
            del sys.modules[name]
        else:
            sys.modules[name] = previous
    return module


__all__ = ["BASELINE_REV", "BLOCK_MANAGER", "BaselineMissing", "module_at", "source_at"]
