"""The dashboard's own cost: CPU, memory and freshness with the screen refreshing 4 times a second.

    python bench/bench_ui.py                  # 60 s in a 120x40 tmux pane, on a busy full-scale recording
    python bench/bench_ui.py --hour           # also: memory over one simulated hour (headless, fast)
    python bench/bench_ui.py --json           # one JSON object instead of the table

How, and why this way (issue 4, "Cost"; nvitop's 7.3% of a core was measured the same way):

- The engine is not in the process: the dashboard replays a recording of a busy simulated run
  (``tests/data/make_busy_recording.py --scale 1``: a 1,024-block GPU pool, ~900 host blocks, 14 requests/s,
  ~800 records/s, made once and kept in /tmp), through ``python tests/replay_demo.py``, in a real pseudo-terminal
  (tmux, 120x40, TERM=xterm-256color), so every byte of every repaint is really written.
- CPU: the process's CPU time (psutil, from outside; all threads: Textual's input and writer threads too) over a
  60 s window that starts after 5 s of warm-up, and over the whole run start-up included. The replay's own work
  (reading, JSON decoding and validating records, the TierModel fold) is timed inside the process with
  ``time.thread_time`` around each burst and subtracted: what is left is the screen.
- Memory: RSS every 5 s over the window (psutil). Over one simulated hour (``--hour``): the same app, headless
  (Textual's test driver, every refresh painted), fed the committed 8 s recording 450 times over with times and
  event ids shifted, one refresh per 0.25 s of record time; RSS at every simulated 5 minutes.
- Freshness: at each refresh the app reports the model time it put on screen; the replay knows when each record
  was due on the wall clock. Just before each refresh, the screen is behind the data by the time since the first
  record it does not show yet was due (see ``_staleness``); the bench reports the worst, in refreshes.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "tests"))  # recordings.py, replay_demo.py: test helpers, not shipped

WARMUP_S = 5.0


def _busy_recording(seconds: float) -> Path:
    out = Path(tempfile.gettempdir()) / "kvtop-bench" / f"busy-scale1-{seconds:.0f}s.jsonl"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, str(REPO / "tests" / "data" / "make_busy_recording.py"), "--scale", "1",
                        "--seconds", str(seconds), "--out", str(out)], check=True)
    return out


class Tmux:
    """The app in a tmux pane, 120x40 (the terminal users have)."""

    def __init__(self, cmd: str, size: tuple[int, int]):
        self.server = f"kvtop-bench-{uuid.uuid4().hex[:8]}"
        env = dict(os.environ, TERM="xterm-256color")
        subprocess.run(["tmux", "-L", self.server, "-f", "/dev/null", "new-session", "-d", "-s", "ui", "-x",
                        str(size[0]), "-y", str(size[1]), f"exec {cmd}"], check=True, env=env, timeout=10)
        self.pid = int(self._tmux("display-message", "-p", "-t", "ui", "#{pane_pid}").strip())

    def _tmux(self, *args: str) -> str:
        return subprocess.run(["tmux", "-L", self.server, *args], capture_output=True, text=True, timeout=10).stdout

    def screen(self) -> str:
        return self._tmux("capture-pane", "-p", "-t", "ui")

    def send(self, keys: str) -> None:
        self._tmux("send-keys", "-t", "ui", keys)

    def close(self) -> None:
        subprocess.run(["tmux", "-L", self.server, "kill-server"], capture_output=True, timeout=10)


class Pty:
    """The app on a bare pseudo-terminal (no tmux on the machine): its output is read and thrown away as fast as
    it comes, as a terminal would; the screen check looks for the labels in the raw output."""

    def __init__(self, cmd: str, size: tuple[int, int]):
        import fcntl
        import pty
        import struct
        import termios
        import threading

        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", size[1], size[0], 0, 0))
        env = dict(os.environ, TERM="xterm-256color", COLUMNS=str(size[0]), LINES=str(size[1]))
        self.proc = subprocess.Popen(["/bin/sh", "-c", f"exec {cmd}"], stdin=slave, stdout=slave, stderr=slave,
                                     env=env, start_new_session=True)
        os.close(slave)
        self.pid = self.proc.pid
        self.tail = bytearray()
        self._reader = threading.Thread(target=self._drain, daemon=True)
        self._reader.start()

    def _drain(self) -> None:
        while True:
            try:
                chunk = os.read(self.master, 65536)
            except OSError:
                return
            if not chunk:
                return
            self.tail += chunk
            del self.tail[:-400_000]

    def screen(self) -> str:
        return self.tail.decode("utf-8", "replace")

    def send(self, keys: str) -> None:
        os.write(self.master, keys.encode())

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            os.close(self.master)
        except OSError:
            pass


def _record_times(path: Path) -> list[float]:
    """Every record's time, without decoding the JSON (the envelope's ``"time":`` field)."""
    times = []
    with path.open("rb") as fh:
        for line in fh:
            i = line.find(b'"time":')
            if i >= 0:
                j = i + 7
                k = j
                while k < len(line) and line[k:k + 1] not in (b",", b"}"):
                    k += 1
                times.append(float(line[j:k]))
    return times


def _staleness(recording: Path, data: dict[str, Any], rows: list[list[Any]]) -> list[float]:
    """How far behind the data the screen was, just before each refresh (sorted).

    Between refreshes i and i+1 the screen shows the model as of record time d_i. The first record it does not
    show (the next record time after d_i) was due on the wall clock at u_i; until refresh i+1 replaces the screen,
    that record exists but is not shown, so the screen is ``t_{i+1} - u_i`` behind (0 if it was not due yet).
    A quiet stretch of the engine (no records) is not staleness: nothing newer existed.
    """
    import bisect

    times = sorted(_record_times(recording))
    t0, wall0, speed = data["t0"], data["wall0"], data["speed"] or 1.0
    lags = []
    for (*_r, d_i), (t_next, *_s) in zip(rows, rows[1:]):
        if d_i is None:
            continue
        k = bisect.bisect_right(times, d_i)
        if k >= len(times):
            lags.append(0.0)
            continue
        due = wall0 + (times[k] - t0) / speed
        lags.append(max(0.0, t_next - due))
    return sorted(lags)


def measure_terminal(recording: Path, seconds: float, refresh: float, use_pty: bool = False) -> dict[str, Any]:
    bench_out = Path(tempfile.mkdtemp(prefix="kvtop-bench-")) / "ui.json"
    # this checkout's kvtop first, then whatever the caller's PYTHONPATH holds (packages carried with --target)
    path = os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])])
    cmd = (f"env PYTHONPATH={shlex.quote(path)} {shlex.quote(sys.executable)} tests/replay_demo.py "
           f"{shlex.quote(str(recording))} --refresh {refresh} "
           f"--bench-out {shlex.quote(str(bench_out))}")
    os.chdir(REPO)
    kind = "pty" if use_pty or shutil.which("tmux") is None else "tmux"
    term: Tmux | Pty = Pty(cmd, (120, 40)) if kind == "pty" else Tmux(cmd, (120, 40))
    try:
        proc = psutil.Process(term.pid)
        started = proc.create_time()
        time.sleep(WARMUP_S)
        cpu0, wall0 = sum(proc.cpu_times()[:2]), time.time()
        rss = [proc.memory_info().rss]
        while time.time() - wall0 < seconds:
            time.sleep(min(5.0, seconds - (time.time() - wall0)))
            rss.append(proc.memory_info().rss)
        cpu1, wall1 = sum(proc.cpu_times()[:2]), time.time()
        screen = term.screen()
        term.send("q")
        deadline = time.time() + 15
        while proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE and time.time() < deadline:
            time.sleep(0.05)
        total_wall = wall1 - started
    finally:
        term.close()
    data = json.loads(bench_out.read_text())
    rows = data["refreshes"]
    # The window, from inside: refreshes whose monotonic time falls in it (the in-process clock differs from
    # time.time(), so the window is the last `seconds` of refreshes before the capture).
    t_end = rows[-1][0]
    win = [r for r in rows if r[0] >= t_end - seconds]
    replay_cpu = win[-1][4] - win[0][4]
    proc_cpu_inside = win[-1][3] - win[0][3]
    span = win[-1][0] - win[0][0]
    ages = [r[1] for r in rows if r[1] is not None]
    lags = _staleness(recording, data, rows)
    costs = sorted(r[2] for r in win)
    return {
        "recording": str(recording), "records_replayed": data["records"],
        "records_per_s": data["records"] / max(total_wall, 1e-9),
        "window_s": wall1 - wall0, "refresh_s": refresh, "refreshes_in_window": len(win),
        "cpu_pct_process": 100.0 * (cpu1 - cpu0) / (wall1 - wall0),
        "cpu_pct_process_inside": 100.0 * proc_cpu_inside / span,
        "cpu_pct_replay": 100.0 * replay_cpu / span,
        "cpu_pct_ui": 100.0 * (proc_cpu_inside - replay_cpu) / span,
        "cpu_pct_whole_run_with_startup": 100.0 * (data["process_cpu_s"]) / total_wall,
        "rss_mib_start": rss[0] / 2**20, "rss_mib_end": rss[-1] / 2**20, "rss_mib_max": max(rss) / 2**20,
        "refresh_cost_ms_p50": 1000 * costs[len(costs) // 2],
        "refresh_cost_ms_p99": 1000 * costs[int(len(costs) * 0.99)],
        "refresh_cost_ms_max": 1000 * costs[-1],
        "age_s_p50": statistics.median(ages), "age_s_max_at_refresh": max(ages),
        "stale_s_p99": lags[int(len(lags) * 0.99)], "stale_s_max": lags[-1],
        "stale_max_in_refreshes": lags[-1] / refresh,
        "terminal": f"{kind} 120x40, TERM=xterm-256color",
        "screen_ok": "GPU tier" in screen and "1,024 blocks" in screen,
        "screen": screen if kind == "tmux" else screen[-2000:],
    }


async def _hour(refresh: float, hours: float) -> dict[str, Any]:
    """Memory over simulated time: the committed recording, looped with shifted times and event ids."""
    from recordings import BUSY_RECORDING

    from kvtop.records import Record, read_jsonl
    from kvtop.session import Session
    from kvtop.ui import app as app_module
    from kvtop.ui.app import build_app

    records = [r for r in read_jsonl(BUSY_RECORDING) if isinstance(r, Record)]
    t0, t1 = records[0].time, records[-1].time
    lap_s = t1 - t0 + 0.1
    max_eid = max(r.data["event_id"] for r in records if r.kind == "kv_event") + 1
    session = Session()

    class Settings:
        theme = "dark"
        duration = None

    Settings.refresh = refresh  # type: ignore[attr-defined]
    now = [t0]
    app_module.wall_clock = lambda: now[0]
    app = build_app(session, Settings(), run_session=False)
    proc = psutil.Process()
    samples: list[tuple[float, float]] = []
    laps = int(hours * 3600 / lap_s) + 1
    started = time.perf_counter()
    async with app.run_test(size=(120, 40)) as pilot:
        next_refresh = t0
        next_sample = t0
        for lap in range(laps):
            shift = lap * lap_s
            for r in records:
                t = r.time + shift
                if r.kind == "kv_event":
                    data = dict(r.data, event_id=r.data["event_id"] + lap * max_eid)
                    r = Record(r.kind, data, r.source, t)
                elif r.kind == "meta" and lap:
                    continue
                else:
                    r = Record(r.kind, r.data, r.source, t)
                session.emit(r)
                if t >= next_refresh:
                    now[0] = t
                    app.refresh_view()
                    await pilot.pause()  # let the screen paint, as it would between refreshes
                    next_refresh = t + refresh
                if t >= next_sample:
                    samples.append(((t - t0) / 60.0, proc.memory_info().rss / 2**20))
                    next_sample = t + 300.0
        await pilot.press("q")
    elapsed = time.perf_counter() - started
    first_after_warmup = next(m for mins, m in samples if mins >= 5.0)
    return {"simulated_minutes": (laps * lap_s) / 60.0, "wall_s": elapsed,
            "rss_mib_at_5min": first_after_warmup, "rss_mib_end": samples[-1][1],
            "rss_mib_max": max(m for _, m in samples), "rss_samples": samples}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=60.0, help="measurement window (default 60)")
    ap.add_argument("--refresh", type=float, default=0.25, help="screen refresh, s (default 0.25: 4 per second)")
    ap.add_argument("--recording", type=Path, default=None, help="a recording to replay instead of the busy one")
    ap.add_argument("--hour", action="store_true", help="also measure memory over one simulated hour")
    ap.add_argument("--pty", action="store_true", help="a bare pseudo-terminal instead of tmux")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    recording = args.recording or _busy_recording(args.seconds + WARMUP_S + 15)
    result: dict[str, Any] = {
        "machine": f"{platform.node()}: {platform.processor() or platform.machine()}, {psutil.cpu_count()} CPUs, "
                   f"Python {platform.python_version()}, {platform.system()} {platform.release()}",
        "terminal": measure_terminal(recording, args.seconds, args.refresh, args.pty),
    }
    if args.hour:
        result["hour"] = asyncio.run(_hour(args.refresh, 1.0))
    if args.json:
        print(json.dumps(result))
        return 0
    t = result["terminal"]
    print(result["machine"])
    print(f"terminal: {t['terminal']}")
    print(f"replayed {t['records_replayed']} records ({t['records_per_s']:.0f}/s) from {t['recording']}")
    print(f"CPU, % of one core, {t['window_s']:.0f} s window after {WARMUP_S:.0f} s warm-up, refresh "
          f"{t['refresh_s']} s ({t['refreshes_in_window']} refreshes):")
    print(f"  process (psutil)           {t['cpu_pct_process']:6.2f}")
    print(f"  process (inside)           {t['cpu_pct_process_inside']:6.2f}")
    print(f"  replay + fold              {t['cpu_pct_replay']:6.2f}")
    print(f"  UI (process - replay)      {t['cpu_pct_ui']:6.2f}")
    print(f"  whole run, start-up incl.  {t['cpu_pct_whole_run_with_startup']:6.2f}  (replay included)")
    print(f"refresh cost ms: p50 {t['refresh_cost_ms_p50']:.2f}  p99 {t['refresh_cost_ms_p99']:.2f}  "
          f"max {t['refresh_cost_ms_max']:.2f}")
    print(f"newest record shown, age at refresh: p50 {1000 * t['age_s_p50']:.0f} ms, max "
          f"{1000 * t['age_s_max_at_refresh']:.0f} ms")
    print(f"screen behind the data: p99 {1000 * t['stale_s_p99']:.0f} ms, max {1000 * t['stale_s_max']:.0f} ms = "
          f"{t['stale_max_in_refreshes']:.2f} refreshes")
    print(f"RSS MiB: start {t['rss_mib_start']:.1f}  end {t['rss_mib_end']:.1f}  max {t['rss_mib_max']:.1f}")
    print(f"screen showed the tiers: {t['screen_ok']}")
    if "hour" in result:
        h = result["hour"]
        print(f"one simulated hour ({h['simulated_minutes']:.0f} min in {h['wall_s']:.0f} s): RSS MiB at 5 min "
              f"{h['rss_mib_at_5min']:.1f}, end {h['rss_mib_end']:.1f}, max {h['rss_mib_max']:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
