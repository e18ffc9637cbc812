"""``kvtop replay FILE [--speed X]``: a recording on the dashboard (pause, seek, speed) or headless (a summary, as
fast as it can); ``kvtop attach``'s command on a file (kvtop/commands/attach.py)."""

from __future__ import annotations

from collections.abc import Sequence

from kvtop.commands import attach


def main(argv: Sequence[str]) -> int:
    """``kvtop replay FILE [options]``."""
    return attach.run("replay", argv)


__all__ = ["main"]
