"""A pane of a private tmux server (``-L``) for the tests that drive kvtop's screen in a real terminal."""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable


class Pane:
    def __init__(self, server: str, session: str):
        self.server = server
        self.session = session

    def tmux(self, *args: str) -> str:
        out = subprocess.run(["tmux", "-L", self.server, *args], capture_output=True, text=True, timeout=10)
        return out.stdout

    def text(self) -> str:
        return self.tmux("capture-pane", "-p", "-t", self.session)

    def keys(self, *keys: str) -> None:
        self.tmux("send-keys", "-t", self.session, *keys)

    def wait_for(self, what: Callable[[str], bool], timeout: float = 15.0) -> str:
        deadline = time.monotonic() + timeout
        text = ""
        while time.monotonic() < deadline:
            text = self.text()
            if what(text):
                return text
            time.sleep(0.1)
        raise AssertionError(f"pane never showed what was expected; last screen:\n{text}")
