"""The dashboard in a real terminal: tmux at 120x40, read the pane, press keys, quit, exit status 0.

Runs ``python tests/replay_demo.py`` on the committed busy recording (the replay at recorded speed, so the figures
move while the test reads them). A private tmux server (``-L``) keeps it away from anyone's own sessions.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from recordings import BUSY_RECORDING, REPO
from tmux_pane import Pane

pytestmark = [pytest.mark.tmux,
              pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")]


@pytest.fixture
def pane(tmp_path: Path) -> Iterator[tuple[Pane, Path]]:
    server = f"kvtop-test-{uuid.uuid4().hex[:8]}"
    status = tmp_path / "status"
    cmd = (f"cd {shlex.quote(str(REPO))} && {shlex.quote(sys.executable)} tests/replay_demo.py "
           f"{shlex.quote(str(BUSY_RECORDING))} --refresh 0.25; echo $? > {shlex.quote(str(status))}; sleep 60")
    # PYTHONPATH: this checkout's kvtop, whatever an installed one says (the script's own folder comes first)
    env = dict(os.environ, TERM="xterm-256color",
               PYTHONPATH=os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))
    subprocess.run(["tmux", "-L", server, "-f", "/dev/null", "new-session", "-d", "-s", "kvtop", "-x", "120",
                    "-y", "40", cmd], check=True, env=env, timeout=10)
    p = Pane(server, "kvtop")
    try:
        yield p, status
    finally:
        subprocess.run(["tmux", "-L", server, "kill-server"], capture_output=True, timeout=10)


@pytest.mark.slow
def test_dashboard_in_tmux(pane: tuple[Pane, Path]) -> None:
    p, status = pane
    # Tier labels and real numbers: the capacities come from the recording's created event.
    screen = p.wait_for(lambda t: "256 blocks" in t and "227 blocks" in t)
    for label in ("GPU tier", "host tier", "Hit rate", "Block moves", "Requests", "Memory", "─ Events", "SIM"):
        assert label in screen, label
    assert re.search(r"in use\s+\d+", screen) and re.search(r"cached\s+\d+", screen)
    assert "Qwen/Qwen3-8B" in screen and "32 tok/blk" in screen
    # The replay moves the figures: the data clock advances.
    first = re.search(r"data (\d\d:\d\d:\d\d)", screen)
    assert first
    p.wait_for(lambda t: (m := re.search(r"data (\d\d:\d\d:\d\d)", t)) is not None and m.group(1) != first.group(1))
    p.keys("p")
    p.wait_for(lambda t: "PAUSED" in t)
    p.keys("p")
    p.wait_for(lambda t: "PAUSED" not in t)
    p.keys("t")
    p.wait_for(lambda t: "theme: light" in t)
    p.keys("?")
    p.wait_for(lambda t: "what every number means" in t or "esc or ? closes this help" in t)
    p.keys("Escape")
    p.wait_for(lambda t: "esc or ? closes this help" not in t)
    p.keys("e")
    p.wait_for(lambda t: "─ Events" not in t)
    p.keys("r")
    p.keys("q")
    deadline = time.monotonic() + 15
    while not status.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert status.exists(), f"kvtop did not exit; last screen:\n{p.text()}"
    assert status.read_text().strip() == "0"


@pytest.mark.slow
def test_dashboard_in_tmux_follows_a_resize(pane: tuple[Pane, Path]) -> None:
    p, status = pane
    p.wait_for(lambda t: "256 blocks" in t)
    p.tmux("resize-window", "-t", "kvtop", "-x", "40", "-y", "12")
    screen = p.wait_for(lambda t: "q quit" in t and "GPU" in t)
    lines = screen.rstrip("\n").split("\n")
    assert len(lines) <= 12 and all(len(line) <= 40 for line in lines)
    assert "host" in screen and "hit" in screen
    p.tmux("resize-window", "-t", "kvtop", "-x", "120", "-y", "40")
    p.wait_for(lambda t: "GPU tier" in t and "Block moves" in t)
    p.keys("q")
    deadline = time.monotonic() + 15
    while not status.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert status.read_text().strip() == "0"
