"""Replay a recording on the dashboard: ``python tests/replay_demo.py FILE [--speed X] [--loop]``.

A stand-in for ``kvtop replay FILE`` (the CLI's) that the UI's terminal test and its cost bench use: it builds a
real ``kvtop.session.Session`` whose one producer reads the JSONL recording and emits each record when its time
comes (``--speed 2`` twice as fast; ``--speed 0`` all at once), and shows it with ``build_app``.

The recording is read line by line, never loaded whole: a busy minute at full scale is ~90 MB of JSON. Records
are emitted in bursts at most every 50 ms (20 wake-ups/s), enough for a 0.25 s refresh. The CPU the replay
itself spends (JSON decoding, validation, the fold) is measured with ``time.thread_time`` around each burst and
reported by ``--bench-out``, so the bench can tell the UI's cost apart from the replay's.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kvtop.records import Record, RecordError, SourceId, read_jsonl
from kvtop.session import Session

# Emit what is due, then sleep at least this long: 20 wake-ups a second. A record waits at most 50 ms (a fifth of a
# 0.25 s refresh) and the loop is not woken 100 times a second for nothing (10 ms bursts cost 0.5% of a core).
BURST_S = 0.05
YIELD_EVERY = 500       # at --speed 0, give the loop a turn every 500 records (input stays responsive)


def _records(path: Path, bad: list[str]) -> Iterator[Record]:
    for item in read_jsonl(path):
        if isinstance(item, RecordError):
            bad.append(str(item))  # read_jsonl's errors carry their line numbers
        else:
            yield item


class Replay:
    """The producer: ``await replay.run(session)`` emits the file's records paced by their times."""

    def __init__(self, path: str | os.PathLike[str], speed: float = 1.0, loop: bool = False):
        self.path = Path(path)
        if not self.path.is_file():
            raise FileNotFoundError(f"no such recording: {self.path}")
        if speed < 0:
            raise ValueError(f"--speed must be >= 0, got {speed}")
        self.speed = speed
        self.loop = loop
        self.emitted = 0
        self.bad: list[str] = []
        self.cpu_s = 0.0              # thread CPU spent decoding and folding (the replay's own cost)
        self.t0: float | None = None  # first record's time
        self.wall0: float | None = None
        self._stopped = False

    def due_wall(self, record_time: float) -> float | None:
        """The monotonic time at which a record of ``record_time`` was due (for staleness measurements)."""
        if self.t0 is None or self.wall0 is None or self.speed <= 0:
            return None
        return self.wall0 + (record_time - self.t0) / self.speed

    def stop(self) -> None:
        self._stopped = True

    async def run(self, session: Session) -> None:
        laps = 0
        while not self._stopped:
            await self._one_pass(session)
            laps += 1
            if not self.loop:
                break
            # Another lap: the fold sees the engine restart (event ids and counters start again), as it should.
            session.note("info", f"replay: lap {laps} done, starting again")
        if self.bad:
            session.note("warn", f"replay: {len(self.bad)} bad lines skipped (first: {self.bad[0]})")
        session.note("info", f"replay finished: {self.emitted} records from {self.path.name}")

    async def _one_pass(self, session: Session) -> None:
        it = _records(self.path, self.bad)
        self.wall0 = time.monotonic()
        self.t0 = None
        pending: Record | None = None
        while not self._stopped:
            cpu0 = time.thread_time()
            n = 0
            now = time.monotonic()
            wait = 0.0
            while True:
                rec = pending if pending is not None else next(it, None)
                pending = None
                if rec is None:
                    self.cpu_s += time.thread_time() - cpu0
                    return
                if self.t0 is None:
                    self.t0 = rec.time
                due = self.wall0 + (rec.time - self.t0) / self.speed if self.speed > 0 else now
                if due > now:
                    pending = rec
                    wait = due - now
                    break
                session.emit(rec)
                self.emitted += 1
                n += 1
                if self.speed <= 0 and n >= YIELD_EVERY:
                    break
            self.cpu_s += time.thread_time() - cpu0
            await asyncio.sleep(max(wait, BURST_S) if self.speed > 0 else 0)


def build_replay_session(path: str | os.PathLike[str], speed: float = 1.0, loop: bool = False
                         ) -> tuple[Session, Replay]:
    replay = Replay(path, speed, loop)
    session = Session(source=SourceId(host="replay", run=replay.path.stem))
    session.add_producer("replay", lambda: replay.run(session), stop=replay.stop)
    return session, replay


class _Settings:
    def __init__(self, refresh: float, theme: str, duration: float | None):
        self.refresh = refresh
        self.theme = theme
        self.duration = duration


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python tests/replay_demo.py", description="Replay a kvtop recording on the "
                                 "dashboard.")
    ap.add_argument("recording", help="a JSONL recording (e.g. tests/data/busy.jsonl)")
    ap.add_argument("--speed", type=float, default=1.0, help="replay speed (1 = as recorded, 0 = all at once)")
    ap.add_argument("--loop", action="store_true", help="start again at the end")
    ap.add_argument("--refresh", type=float, default=0.25, help="screen refresh interval, s (default 0.25)")
    ap.add_argument("--theme", default="dark", help="dark, light, high-contrast, or a theme .toml file")
    ap.add_argument("--duration", type=float, default=None, help="stop the replay after this many seconds")
    ap.add_argument("--bench-out", default=None, help="write the replay's and the screen's own figures (JSON) "
                                                      "here on exit")
    args = ap.parse_args(argv)
    try:
        session, replay = build_replay_session(args.recording, args.speed, args.loop)
    except (FileNotFoundError, ValueError) as exc:
        print(f"kvtop demo: {exc}", file=sys.stderr)
        return 2

    from kvtop.ui.app import build_app  # Textual is imported only once the arguments are good

    app = build_app(session, _Settings(args.refresh, args.theme, args.duration))
    refreshes: list[tuple[float, float | None, float, float, float]] = []
    if args.bench_out:
        # Per refresh: when, the model time shown, its cost, this process's CPU so far, the replay's CPU so far.
        app.timing.on_refreshed = lambda t, data_t, cost: refreshes.append(
            (t, data_t, cost, time.process_time(), replay.cpu_s))
    app.run()
    if args.bench_out:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        rows = []
        for t, data_t, cost, cpu, replay_cpu in refreshes:
            due = replay.due_wall(data_t) if data_t is not None else None
            rows.append([t, None if due is None else t - due, cost, cpu, replay_cpu, data_t])
        out: dict[str, Any] = {
            "records": replay.emitted, "bad": len(replay.bad), "replay_cpu_s": replay.cpu_s,
            "process_cpu_s": usage.ru_utime + usage.ru_stime, "max_rss_kib": usage.ru_maxrss,
            "refresh_s": args.refresh, "wall0": replay.wall0, "t0": replay.t0, "speed": replay.speed,
            # [monotonic t, age of the newest record shown (s), cost (s), CPU s, replay CPU s, model time shown]
            "refreshes": rows,
        }
        Path(args.bench_out).write_text(json.dumps(out))
    return app.return_code or 0


if __name__ == "__main__":
    raise SystemExit(main())
