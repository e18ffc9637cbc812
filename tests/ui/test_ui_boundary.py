"""Only ``kvtop/ui/`` imports Textual or Rich: every other module of kvtop imports without them.

harlequin's habit: a fresh interpreter imports the data side and then looks at ``sys.modules``. A fresh one,
because this test process has imported Textual already (the UI tests).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

from recordings import REPO

PROBE = textwrap.dedent("""
    import importlib, json, pkgutil, sys
    import kvtop
    core = ["kvtop", "kvtop.tiers", "kvtop.session", "kvtop.engines.sim", "kvtop.records", "kvtop.settings",
            "kvtop.runner", "kvtop.cli", "kvtop.sources.poller", "kvtop.sources.nvml", "kvtop.sources.host",
            "kvtop.ui.format"]
    imported, skipped = [], {}
    for name in core:
        importlib.import_module(name)
        imported.append(name)
    # Then everything else outside kvtop.ui; a module whose optional dependency is missing here is skipped
    # (and named), not failed: that is the optional dependency's business, not this test's.
    for info in pkgutil.walk_packages(kvtop.__path__, "kvtop."):
        name = info.name
        if name.startswith("kvtop.ui") or name in imported or name == "kvtop.__main__":
            continue
        try:
            importlib.import_module(name)
            imported.append(name)
        except ImportError as exc:
            skipped[name] = str(exc)
    leaked = sorted(m for m in sys.modules if m.split(".")[0] in ("textual", "rich"))
    print(json.dumps({"imported": imported, "skipped": skipped, "leaked": leaked}))
""")


def test_nothing_outside_ui_imports_textual_or_rich() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    for name in ("kvtop.tiers", "kvtop.session", "kvtop.engines.sim", "kvtop.records"):
        assert name in result["imported"]
    assert result["leaked"] == [], f"imported by the data side: {result['leaked']}"


def test_the_ui_package_itself_does_import_textual() -> None:
    """The probe above would pass vacuously if it never saw Textual at all; the UI does bring it in."""
    out = subprocess.run([sys.executable, "-c", "import sys, kvtop.ui.app; print('textual' in sys.modules)"],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.stdout.strip() == "True", out.stderr
