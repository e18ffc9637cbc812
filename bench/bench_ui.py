"""The dashboard's own cost: CPU, memory and freshness with the screen refreshing 4 times a second.

    python bench/bench_ui.py                  # 60 s in a 120x40 tmux pane, on a busy full-scale recording
    python bench/bench_ui.py --hour           # also: memory over one simulated hour (headless, fast)
    python bench/bench_ui.py --json           # one JSON object instead of the table

How, and why this way (issue 4, "Cost"; nvitop's 7.3% of a core was measured the same way):

- The engine is not in the process: the dashboard replays a recording of a busy simulated run
  (``tests/data/make_busy_recording.py --scale 1``: a 1,024-block GPU pool, ~900 host blocks, 14 requests/s,
  ~800 records/s, made once and kept in /tmp), through ``python -m kvtop.ui.demo``, in a real pseudo-terminal
  (tmux, 120x40, TERM=xterm-256color), so every byte of every repaint is really written.
- CPU: the process's CPU time (psutil, from outside; all threads: Textual's input and writer threads too) over a
  60 s window that starts after 5 s of warm-up, and over the whole run start-up included. The replay's own work
  (reading, JSON decoding and validating records, the TierModel fold) is timed inside the process with
  ``time.thread_time`` around each burst and subtracted: what is left is the screen.
- Memory: RSS every 5 s over the window (psutil). Over one simulated hour (``--hour``): the same app, headless
  (Textual's test driver, every refresh painted), fed the committed 8 s recording 450 times over with times and
  event ids shifted, one refresh per 0.25 s of record time; RSS at every simulated 5 minutes.
- Freshness: at each refresh the app reports the model time it put on screen; the replay knows when that record
  was due on the wall clock. The newest figure's age at any moment is at most its age at the last refresh plus
  the time to the next refresh; the bench reports the worst, in refreshes.
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

WARMUP_S = 5.0


def _busy_recording(seconds: float) -> Path:
    out = Path(tempfile.gettempdir()) / "kvtop-bench" / f"busy-scale1-{seconds:.0f}s.jsonl"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, str(REPO / "tests" / "data" / "make_busy_recording.py"), "--scale", "1",
                        "--seconds", str(seconds), "--out", str(out)], check=True)
    return out


def _tmux(server: str, *args: str) -> str:
    return subprocess.run(["tmux", "-L", server, *args], capture_output=True, text=True, timeout=10).stdout


def measure_terminal(recording: Path, seconds: float, refresh: float) -> dict[str, Any]:
    if shutil.which("tmux") is None:
        raise SystemExit("bench_ui: needs tmux (apt-get install tmux)")
    server = f"kvtop-bench-{uuid.uuid4().hex[:8]}"
    bench_out = Path(tempfile.mkdtemp(prefix="kvtop-bench-")) / "ui.json"
    cmd = (f"cd {shlex.quote(str(REPO))} && exec {shlex.quote(sys.executable)} -m kvtop.ui.demo "
           f"{shlex.quote(str(recording))} --refresh {refresh} --bench-out {shlex.quote(str(bench_out))}")
    env = dict(os.environ, TERM="xterm-256color")
    subprocess.run(["tmux", "-L", server, "-f", "/dev/null", "new-session", "-d", "-s", "ui", "-x", "120", "-y",
                    "40", cmd], check=True, env=env, timeout=10)
    try:
        pid = int(_tmux(server, "display-message", "-p", "-t", "ui", "#{pane_pid}").strip())
        proc = psutil.Process(pid)
        started = proc.create_time()
        time.sleep(WARMUP_S)
        cpu0, wall0 = sum(proc.cpu_times()[:2]), time.time()
        rss = [proc.memory_info().rss]
        while time.time() - wall0 < seconds:
            time.sleep(min(5.0, seconds - (time.time() - wall0)))
            rss.append(proc.memory_info().rss)
        cpu1, wall1 = sum(proc.cpu_times()[:2]), time.time()
        screen = _tmux(server, "capture-pane", "-p", "-t", "ui")
        _tmux(server, "send-keys", "-t", "ui", "q")
        deadline = time.time() + 15
        while proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE and time.time() < deadline:
            time.sleep(0.05)
        total_wall = wall1 - started
    finally:
        subprocess.run(["tmux", "-L", server, "kill-server"], capture_output=True, timeout=10)
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
    worst = max(rows[i][1] + (rows[i + 1][0] - rows[i][0]) for i in range(len(rows) - 1) if rows[i][1] is not None)
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
        "age_s_worst_on_screen": worst, "age_worst_in_refreshes": worst / refresh,
        "screen_ok": "GPU tier" in screen and "1,024 blocks" in screen,
        "screen": screen,
    }


async def _hour(refresh: float, hours: float) -> dict[str, Any]:
    """Memory over simulated time: the committed recording, looped with shifted times and event ids."""
    from kvtop.records import Record, read_jsonl
    from kvtop.session import Session
    from kvtop.ui import app as app_module
    from kvtop.ui.app import build_app
    from kvtop.ui.testing import BUSY_RECORDING

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
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    recording = args.recording or _busy_recording(args.seconds + WARMUP_S + 15)
    result: dict[str, Any] = {
        "machine": f"{platform.node()}: {platform.processor() or platform.machine()}, {psutil.cpu_count()} CPUs, "
                   f"Python {platform.python_version()}, {platform.system()} {platform.release()}",
        "terminal": measure_terminal(recording, args.seconds, args.refresh),
    }
    if args.hour:
        result["hour"] = asyncio.run(_hour(args.refresh, 1.0))
    if args.json:
        print(json.dumps(result))
        return 0
    t = result["terminal"]
    print(result["machine"])
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
    print(f"newest figure's age: p50 {1000 * t['age_s_p50']:.0f} ms at refresh, worst on screen "
          f"{1000 * t['age_s_worst_on_screen']:.0f} ms = {t['age_worst_in_refreshes']:.2f} refreshes")
    print(f"RSS MiB: start {t['rss_mib_start']:.1f}  end {t['rss_mib_end']:.1f}  max {t['rss_mib_max']:.1f}")
    print(f"screen showed the tiers: {t['screen_ok']}")
    if "hour" in result:
        h = result["hour"]
        print(f"one simulated hour ({h['simulated_minutes']:.0f} min in {h['wall_s']:.0f} s): RSS MiB at 5 min "
              f"{h['rss_mib_at_5min']:.1f}, end {h['rss_mib_end']:.1f}, max {h['rss_mib_max']:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
