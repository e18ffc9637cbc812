"""The distribution as it installs: its name on the registry (``kvtop`` there is another project), the command
``kvtop`` and ``python -m kvtop``, and every install hint naming the distribution that really installs kvtop."""

from __future__ import annotations

import email.parser
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import kvtop

REPO = Path(__file__).resolve().parents[1]


def _build_wheel(out: Path) -> Path:
    """The wheel as ``python -m build`` makes it, without build isolation (hatchling is in the test extra: no
    download; ~1 s on the dev box)."""
    pytest.importorskip("build", reason="build is in the test extra: pip install -e '.[test]'")
    pytest.importorskip("hatchling", reason="hatchling is in the test extra: pip install -e '.[test]'")
    done = subprocess.run([sys.executable, "-m", "build", "--wheel", "--no-isolation", "--outdir", str(out),
                           str(REPO)], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    wheels = list(out.glob("*.whl"))
    assert len(wheels) == 1, wheels
    return wheels[0]


def test_the_built_wheel_is_kvtop_monitor_with_the_kvtop_command(tmp_path: Path) -> None:
    wheel = _build_wheel(tmp_path)
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        info = next(n for n in names if n.endswith(".dist-info/METADATA"))
        meta = email.parser.Parser().parsestr(z.read(info).decode())
        entry_points = z.read(info.replace("METADATA", "entry_points.txt")).decode()
    assert meta["Name"] == kvtop.DISTRIBUTION == "kvtop-monitor"
    assert meta["Version"] == kvtop.__version__
    assert wheel.name.startswith("kvtop_monitor-")
    # the command is kvtop (and nothing else), run by kvtop.cli:main; `python -m kvtop` needs kvtop/__main__.py
    scripts = entry_points.split("[console_scripts]")[1].split("[")[0]
    assert [ln.replace(" ", "") for ln in scripts.strip().splitlines()] == ["kvtop=kvtop.cli:main"]
    assert "kvtop/__main__.py" in names and "kvtop/cli.py" in names
    # the report extra the install hints name is declared
    assert "report" in meta.get_all("Provides-Extra", [])


def test_python_dash_m_kvtop_says_which_kvtop_it_is() -> None:
    """Beside kvcached's `kvtop` command, `python -m kvtop` reaches this one, and --version names the
    distribution."""
    out = subprocess.run([sys.executable, "-m", "kvtop", "--version"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == f"kvtop {kvtop.__version__} (kvtop-monitor)"


# `pip install kvtop`, `pip install 'kvtop[report]'`, `pipx install kvtop`: the other project, or nothing
_WRONG_HINT = re.compile(r"pipx? install\s+['\"]?kvtop(?![-\w])")


def test_every_install_hint_names_the_real_distribution() -> None:
    files = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md")), *sorted((REPO / "kvtop").rglob("*.py")),
             *sorted((REPO / "examples").rglob("*.py"))]
    wrong = [f"{f.relative_to(REPO)}: {m.group(0)}" for f in files
             for m in _WRONG_HINT.finditer(f.read_text(encoding="utf-8"))]
    assert wrong == []
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert "pipx install kvtop-monitor" in readme and "python -m kvtop" in readme and "kvcached" in readme
