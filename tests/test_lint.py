"""Static checks as tests, so that CI (which runs the README's test command) runs them too.

ruff over the whole tree (the rules in pyproject.toml) and mypy over the packages outside the dashboard (kvtop/ui is
Textual-typed code whose widget generics mypy cannot follow without noise). Both tools are pinned in the test extra:
a new release that adds a rule must not fail a build that changed nothing.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_finds_nothing() -> None:
    pytest.importorskip("ruff", reason="ruff is in the test extra: pip install -e '.[test]'")
    result = _run("ruff", "check", "--no-cache", ".")
    assert result.returncode == 0, result.stdout + result.stderr


def test_mypy_finds_nothing_outside_the_dashboard() -> None:
    pytest.importorskip("mypy", reason="mypy is in the test extra: pip install -e '.[test]'")
    result = _run("mypy", "kvtop", "--exclude", "kvtop/ui/")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success: no issues found" in result.stdout
