"""How a session is shown: the dashboard, or headless (problems on stderr as they happen, a summary at the end).

Every command that ends in a session (``kvtop``, ``kvtop attach``, ``kvtop replay``) hands it to one of these, so
the exit statuses and the problem lines are the same everywhere. A module of its own, below kvtop/commands/,
so that no command imports another for it (tests/test_layers.py: no import cycles).
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import json
import signal
import sys
import threading
from typing import Any

YOUNG_GC_THRESHOLD = 10_000   # the dashboard's first-generation collection threshold (Python's default: 700)


def headless_wanted(settings: Any, stdout: Any = None) -> bool:
    """Whether a run goes without the screen: --headless, --json (a summary for a program: the dashboard has none to
    give), or no terminal on stdout (``kvtop ... > log``, a pipe, a CI job), where the dashboard would write its
    escape sequences into the file and never print a summary. Said once on stderr when only the terminal decided."""
    if settings.headless or settings.json:
        return True
    out = sys.stdout if stdout is None else stdout
    try:
        tty = out.isatty()
    except (AttributeError, ValueError):  # closed or not a file
        tty = False
    if not tty:
        print("kvtop: stdout is not a terminal: running headless (--headless), summary at the end", file=sys.stderr,
              flush=True)
    return not tty


def run_dashboard(session: Any, settings: Any) -> int:
    """The dashboard until q (0, or 3 / 4 as a headless run) or Ctrl-C (130); a crash inside it is Textual's
    traceback and status 1."""
    from kvtop.compose import finish_problems

    # The garbage collector and what start-up leaves behind (measured, dev box, the busy replay for 30 s): importing
    # Textual and building the app make ~37,000 objects and no garbage, yet trigger ~90 collections (~14 ms of
    # CPU); and every full collection of the run then walks them again (4 in 30 s, 70 -> 22 ms with them frozen).
    # So none while the app is built, and what it built frozen (gc.freeze: never collected, never walked) for the
    # run; a cycle made during the run is collected as before.
    from kvtop.ui.themes import theme_problem

    problem = theme_problem(settings.theme) if settings is not None and settings.theme else None
    if problem is not None:
        from kvtop.settings import SettingsError

        raise SettingsError("--theme", problem)   # exit 2, one line, before the screen takes the terminal
    collecting = gc.isenabled()
    gc.disable()
    try:
        from kvtop.ui.app import build_app

        app = build_app(session, settings, config_file=getattr(settings, "config_file", None))
        gc.freeze()
    finally:
        if collecting:
            gc.enable()
    # A young collection every 10,000 objects, not 700: a stored event's ~1,000 token dicts, alive only until they
    # are folded, set off one or two collections a line (~22 a second on a busy stream) that found no garbage and
    # moved the dicts a generation up; the collector's CPU over the 30 s run 0.075 -> 0.020 s (dev box).
    threshold = gc.get_threshold()
    gc.set_threshold(YOUNG_GC_THRESHOLD, *threshold[1:])
    try:
        app.run()
    finally:
        gc.set_threshold(*threshold)
        gc.unfreeze()
    finish_problems(session)
    # The screen is gone: what went wrong stays visible in the shell, one line per kind.
    print_problems([f"{p.kind} x{p.count:,}: {p.message}" for p in session.problems.snapshot()])
    code = app.return_code
    # q after a run that never got data (or lost some) is still that run's status: 3 or 4, as headless.
    return int(code) if code else session.problems.exit_status(session.records_in)


def run_headless(session: Any, duration_s: float, as_json: bool) -> int:
    return run_headless_until(session, duration_s, as_json)


PROBLEM_LINES_S = 0.25  # how often a headless run prints the problem lines that came due


def print_problems(lines: list[str]) -> None:
    for line in lines:
        print(f"kvtop: {line}", file=sys.stderr, flush=True)


async def run_reporting(session: Any, duration_s: float | None, until_done: tuple[str, ...],
                         terminated: list[int] | None = None) -> None:
    """``session.run`` with its problems printed to stderr as they happen (rate-limited by the registry).

    SIGTERM (``timeout``, ``kill``, a container stopping) stops the session as the end of its duration would, so
    the caller still prints the summary; each one is appended to ``terminated``. (Its default action ended the
    process on the spot, with no summary at all.) Only where the loop runs in the main thread: elsewhere signals
    are not this loop's to take."""

    async def pump() -> None:
        while True:
            await asyncio.sleep(PROBLEM_LINES_S)
            print_problems(session.tick())

    def on_sigterm() -> None:
        if terminated is not None:
            terminated.append(signal.SIGTERM)
        session.stop()

    loop = asyncio.get_running_loop()
    handled = False
    if terminated is not None and threading.current_thread() is threading.main_thread():
        with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):  # no signals here (Windows)
            loop.add_signal_handler(signal.SIGTERM, on_sigterm)
            handled = True
    task = asyncio.ensure_future(pump())
    try:
        await session.run(duration_s=duration_s, until_producers_done=until_done)
    finally:
        task.cancel()
        if handled:
            loop.remove_signal_handler(signal.SIGTERM)


def run_headless_until(session: Any, duration_s: float | None, as_json: bool,
                       until_done: tuple[str, ...] = ()) -> int:
    """Run without a screen until the duration ends (or the named producers finish), then print a summary.

    Problems go to stderr as they happen and into the summary; the exit status says whether the run got data
    and lost none (kvtop.problems: 0, 3 no data, 4 lost data, 130 interrupted by SIGINT, 143 by SIGTERM). Either
    signal ends the run with its summary; a SIGTERM while the summary is being made is held until it is printed.
    """
    from kvtop.compose import finish_problems
    from kvtop.problems import EXIT_INTERRUPTED, EXIT_TERMINATED
    from kvtop.run_summary import format_summary, summary

    interrupted = False
    terminated: list[int] = []
    try:
        asyncio.run(run_reporting(session, duration_s, until_done, terminated))
    except KeyboardInterrupt:
        interrupted = True
        session.stop()
    held = _hold_sigterm(terminated)
    try:
        finish_problems(session)
        print_problems(session.tick())
        print_problems(session.problems.take_lines(final=True))
        said = summary(session)
        print(json.dumps(said) if as_json else format_summary(said), flush=True)
    finally:
        if held is not None:
            signal.signal(signal.SIGTERM, held)
    if interrupted:
        return EXIT_INTERRUPTED
    return EXIT_TERMINATED if terminated else session.problems.exit_status(session.records_in)


def _hold_sigterm(terminated: list[int]) -> Any:
    """From the end of the run until the summary is out, a SIGTERM is noted in ``terminated`` instead of ending
    the process; returns the handler to put back (None where signals cannot be set: not the main thread)."""
    if threading.current_thread() is not threading.main_thread():
        return None
    try:
        held = signal.signal(signal.SIGTERM, lambda signum, frame: terminated.append(signum))
    except (ValueError, OSError):
        return None
    return held if held is not None else signal.SIG_DFL  # None: a handler not set from Python


__all__ = ["headless_wanted", "print_problems", "run_dashboard", "run_headless", "run_headless_until", "run_reporting"]
