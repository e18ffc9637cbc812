"""kvtop's command line: ``kvtop SUBCOMMAND ...`` to ``kvtop.commands.SUBCOMMAND.main`` (``kvtop [options]`` to
kvtop.commands.run), and what every command's failure looks like: a bad option one line naming it and exit 2, an
interrupt 130, a closed pipe 141; nothing prints a traceback for bad input. The commands: kvtop/commands/."""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Sequence

from kvtop.options import UsageError
from kvtop.problems import EXIT_INTERRUPTED, EXIT_USAGE
from kvtop.settings import SettingsError

SUBCOMMANDS = ("sim", "attach", "replay", "agent", "estimate", "calibrate", "report", "run")


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    command = args[0] if args and args[0] in SUBCOMMANDS else "run"
    rest = args[1:] if args and args[0] in SUBCOMMANDS else args
    try:
        if command == "run" and args and not args[0].startswith("-"):
            # the driven run takes no positional argument: a first word is a command, misspelled or unknown
            raise UsageError(_unknown_command(args[0]))
        return _command(command)(rest)
    except (UsageError, SettingsError) as exc:
        from kvtop.textsafe import clean

        # an option's value may be a file name with an escape sequence in it (a trace's, a recording's); a
        # subcommand's parser names itself ("kvtop attach: ..."), once
        text = clean(str(exc), 2000)
        print(text if text.startswith("kvtop ") else f"kvtop: {text}", file=sys.stderr)
        return EXIT_USAGE
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return _broken_pipe()


def _command(name: str) -> Callable[[Sequence[str]], int]:
    """The command's ``main``, its module imported only when it runs (``kvtop sim`` loads no asyncio, no fold)."""
    if name == "sim":
        from kvtop.commands import sim
        return sim.main
    if name == "attach":
        from kvtop.commands import attach
        return attach.main
    if name == "replay":
        from kvtop.commands import replay
        return replay.main
    if name == "agent":
        from kvtop.commands import agent
        return agent.main
    if name == "estimate":
        from kvtop.commands import estimate
        return estimate.main
    if name == "calibrate":
        from kvtop.commands import calibrate
        return calibrate.main
    if name == "report":
        from kvtop.commands import report
        return report.main
    from kvtop.commands import run
    return run.main


def _unknown_command(word: str) -> str:
    from kvtop.suggest import did_you_mean
    from kvtop.textsafe import clean

    shown = clean(word, 80)
    hint = (f" (a recording? kvtop replay {shown})" if word.endswith(".jsonl")
            else did_you_mean(word, SUBCOMMANDS, quote=True))
    return f"unknown command {shown!r}{hint}; commands: {', '.join(SUBCOMMANDS)} (kvtop --help)"


EXIT_BROKEN_PIPE = 141  # 128 + SIGPIPE: what a shell reports for a program whose reader went away


def _broken_pipe() -> int:
    """``kvtop ... | head``: the reader left. One line, not a traceback (nor a second one at exit, when Python
    flushes stdout again: it is pointed at /dev/null first)."""
    import os

    with contextlib.suppress(OSError, ValueError):
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    with contextlib.suppress(OSError, ValueError):
        print("kvtop: output closed (broken pipe)", file=sys.stderr)
    return EXIT_BROKEN_PIPE


__all__ = ["EXIT_BROKEN_PIPE", "SUBCOMMANDS", "main"]
