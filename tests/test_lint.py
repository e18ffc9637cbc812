"""Static checks as tests, so that CI (which runs the README's test command) runs them too.

ruff over the whole tree (the rules in pyproject.toml) and mypy over kvtop: the packages outside the dashboard, and
every module of the dashboard, which reads the session and the model by type (kvtop.session.SessionView,
kvtop.tiers.TierSnapshot) and hands each panel its own typed data (kvtop/ui/views.py). Both tools are
pinned in the test extra: a new release that adds a rule must not fail a build that changed nothing.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# CI runs ruff and mypy as steps of their own before the suite (.ci/run) and says so here, so they do not run twice
RAN_AS_CI_STEPS = os.environ.get("KVTOP_STATIC_CHECKS") == "ran"
static = pytest.mark.skipif(RAN_AS_CI_STEPS, reason="ruff and mypy ran as CI steps of their own (.ci/run)")


def _run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


@static
def test_ruff_finds_nothing() -> None:
    pytest.importorskip("ruff", reason="ruff is in the test extra: pip install -e '.[test]'")
    result = _run("ruff", "check", "--no-cache", ".")
    assert result.returncode == 0, result.stdout + result.stderr


@static
@pytest.mark.slow
def test_mypy_finds_nothing_outside_the_dashboard() -> None:
    pytest.importorskip("mypy", reason="mypy is in the test extra: pip install -e '.[test]'")
    result = _run("mypy", "kvtop", "--exclude", "kvtop/ui/")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Success: no issues found" in result.stdout


# The dashboard's modules that mypy checks: issue 15 typed what app.py reads, issue 25 each panel's data (once
# widgets.py was split into panel.py, strip_reuse.py and panels/, every module of kvtop/ui passes).
UI_TYPED = tuple(sorted(str(p.relative_to(ROOT)) for p in (ROOT / "kvtop" / "ui").rglob("*.py")))


@static
def test_mypy_finds_nothing_in_the_dashboards_typed_modules() -> None:
    pytest.importorskip("mypy", reason="mypy is in the test extra: pip install -e '.[test]'")
    result = _run("mypy", *UI_TYPED)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"Success: no issues found in {len(UI_TYPED)} source files" in result.stdout
