"""What kvtop costs a user, beside nvitop: whole-process CPU in a 120x40 pseudo-terminal, 30 s, start-up included.

    python bench/bench_attached.py                       # kvtop replay of a busy full-scale recording, and nvitop
    python bench/bench_attached.py --json --out r.json   # one JSON object (also written to --out)
    python bench/bench_attached.py --recording tests/data/busy.jsonl --seconds 10
    python bench/bench_attached.py --baseline /tmp/base --rounds 3 --recording FILE   # two trees alternated, + nvitop

How (issue 15, "Cost, as a user feels it"):

- Each program runs alone on a fresh pseudo-terminal of 120x40 (TERM=xterm-256color); a thread reads its output as
  fast as it comes and throws it away, as a terminal would. The programs run one after the other in one run of this
  script, on the same machine, so the figures compare.
- CPU: the process's user + system time (psutil, all threads) from its start to the end of the window, divided by
  the window: start-up is in it, as a user feels it. ``startup_cpu_s``: its CPU time when its first screen is out
  (the first time the output holds the header text of its first screen: ``up 0:00`` for kvtop, ``NVITOP`` for nvitop).
- kvtop: ``kvtop replay FILE --refresh 0.25`` of a busy recording at its recorded speed: reading, validating and
  folding every record and drawing the dashboard, all in that one process. The default recording is
  ``tests/data/make_busy_recording.py --scale 1`` for 40 s (~1,000 records/s, 62 MB; made once, kept in /tmp), so
  the stream lasts the whole window.
- nvitop: ``nvitop --interval 0.25`` (its monitor mode, refreshing every 0.25 s), when it is installed and NVML
  finds a GPU; otherwise the row says why it is missing.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import psutil

REPO = Path(__file__).resolve().parents[1]
SIZE = (120, 40)


def busy_recording(seconds: float) -> Path:
    out = Path(tempfile.gettempdir()) / "kvtop-bench" / f"busy-scale1-{seconds:.0f}s.jsonl"
    if not out.exists():
        out.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, str(REPO / "tests" / "data" / "make_busy_recording.py"), "--scale", "1",
                        "--seconds", str(seconds), "--out", str(out)], check=True,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    return out


class Terminal:
    """A program on a pseudo-terminal of ``SIZE``; its output is drained and counted, never parsed."""

    def __init__(self, argv: list[str], env: dict[str, str], cwd: Path | None = None):
        import fcntl
        import pty
        import struct
        import termios

        self.master, slave = pty.openpty()
        fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", SIZE[1], SIZE[0], 0, 0))
        self.started = time.monotonic()
        self.proc = subprocess.Popen(argv, stdin=slave, stdout=slave, stderr=slave, start_new_session=True, cwd=cwd,
                                     env={**env, "TERM": "xterm-256color", "COLUMNS": str(SIZE[0]),
                                          "LINES": str(SIZE[1])})
        os.close(slave)
        self.bytes = 0
        self.head = bytearray()  # the first 2 MB: enough to find the first screen's header and any error text
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
            self.bytes += len(chunk)
            if len(self.head) < 2_000_000:
                self.head += chunk
            self.tail += chunk
            del self.tail[:-100_000]

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(3)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(3)
        try:
            os.close(self.master)
        except OSError:
            pass


_ESCAPES = re.compile(rb"\x1b(\[[0-9;?]*[ -/]*[@-~]|[()][0-9A-Za-z]|[=>78])")  # CSI and the short ones


def _cpu(p: psutil.Process) -> float:
    t = p.cpu_times()
    return t.user + t.system


def measure(name: str, argv: list[str], marker: bytes, seconds: float, env: dict[str, str],
            cwd: Path | None = None) -> dict[str, Any]:
    term = Terminal(argv, env, cwd)
    proc = psutil.Process(term.proc.pid)
    startup_cpu = startup_wall = None
    cpu = 0.0
    rss = 0
    try:
        while True:
            now = time.monotonic() - term.started
            if term.proc.poll() is not None:
                break
            try:
                cpu = _cpu(proc)
                rss = max(rss, proc.memory_info().rss)
            except psutil.Error:
                break
            if startup_cpu is None and marker in _ESCAPES.sub(b"", bytes(term.head)):
                startup_cpu, startup_wall = cpu, now
            if now >= seconds:
                break
            time.sleep(0.02)
        alive = term.proc.poll() is None
    finally:
        term.close()
    wall = time.monotonic() - term.started
    out: dict[str, Any] = {
        "name": name, "command": shlex.join(argv), "window_s": round(min(wall, seconds), 2), "cpu_s": round(cpu, 3),
        "cpu_percent_of_a_core": round(100 * cpu / max(min(wall, seconds), 1e-9), 2),
        "startup_cpu_s": None if startup_cpu is None else round(startup_cpu, 3),
        "startup_wall_s": None if startup_wall is None else round(startup_wall, 2),
        "max_rss_mb": round(rss / 2**20, 1), "output_mb": round(term.bytes / 2**20, 2), "ran_to_the_end": alive,
    }
    if not alive or startup_cpu is None:
        out["error"] = term.tail.decode("utf-8", "replace")[-600:]
    return out


def attach_zmq(kvtop: list[str], rate: int, a: argparse.Namespace, env: dict[str, str], tree: Path,
               label: str) -> dict[str, Any]:
    """One ``kvtop attach zmq://`` in the pty, its publisher sending ``rate`` events/s from before kvtop starts to
    after the window ends."""
    with tempfile.TemporaryDirectory() as tmp:
        port_file, done_file = Path(tmp) / "port", Path(tmp) / "done"
        pub = subprocess.Popen([sys.executable, str(REPO / "bench" / "bench_zmq_flood.py"), "--publish",
                                str(port_file), str(done_file), "--events-per-s", str(rate),
                                "--seconds", str(a.seconds + 5)])
        try:
            while not port_file.exists() or not port_file.read_text():
                time.sleep(0.05)
            url = f"zmq://127.0.0.1:{port_file.read_text()}"
            row = measure(f"kvtop attach zmq:// {rate:,} events/s{label}",
                          [*kvtop, "attach", url, "--refresh", str(a.refresh)], b"up 0:00", a.seconds, env, cwd=tree)
        finally:
            pub.kill()
            pub.wait()
    return row


def nvitop_command(refresh: float) -> list[str] | None:
    exe = shutil.which("nvitop")
    if exe:
        return [exe, "--interval", str(refresh)]
    import importlib.util

    if importlib.util.find_spec("nvitop") is not None:  # installed without its script (pip --target)
        return [sys.executable, "-m", "nvitop", "--interval", str(refresh)]
    return None


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seconds", type=float, default=30.0, help="the window, start-up included (default 30)")
    ap.add_argument("--refresh", type=float, default=0.25)
    ap.add_argument("--recording", action="append", default=None,
                    help="a recording to replay (repeatable); default: a 40 s full-scale busy recording (made once, "
                         "~1,000 records/s) and the committed tests/data/busy.jsonl (8 s at ~400 records/s, then idle)")
    ap.add_argument("--zmq-rate", action="append", type=int, default=None, metavar="EVENTS_PER_S",
                    help="instead of replays: `kvtop attach zmq://` on a vLLM-shaped stream at this many KV events/s "
                         "(bench/bench_zmq_flood.py's publisher in a process of its own: map form, chains of 4 blocks "
                         "with 64 token ids, each stored block removed 200 batches later; repeatable)")
    ap.add_argument("--no-nvitop", action="store_true")
    ap.add_argument("--kvtop", default=None, help="the kvtop command (default: this Python's -m kvtop)")
    ap.add_argument("--baseline", default=None, metavar="DIR",
                    help="another checkout of kvtop (e.g. `git worktree add --detach /tmp/base REV`): its kvtop runs "
                         "too, alternately with this tree's, on the same recordings, in this run")
    ap.add_argument("--rounds", type=int, default=1,
                    help="run each program this many times, alternated; the summary gives each one's runs, best "
                         "and median (default 1)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--out", default=None, help="also write the JSON here")
    a = ap.parse_args(argv)

    recordings = ([Path(r).resolve() for r in a.recording] if a.recording else [] if a.zmq_rate
                  else [busy_recording(max(a.seconds + 10, 40)), REPO / "tests" / "data" / "busy.jsonl"])
    trees = [("", REPO)] + ([(" (baseline)", Path(a.baseline).resolve())] if a.baseline else [])
    kvtop = shlex.split(a.kvtop) if a.kvtop else [sys.executable, "-m", "kvtop"]
    nv = None if a.no_nvitop else nvitop_command(a.refresh)
    rows: list[dict[str, Any]] = []
    for _ in range(max(1, a.rounds)):
        for label, tree in trees:
            # the tree's kvtop first on the path, so each run imports the checkout it is named after; run in the
            # tree too, since `python -m` puts the working directory ahead of PYTHONPATH (run from a checkout, every
            # row imported that checkout: the baseline rows before this were the same tree as the others)
            path = [str(tree), *filter(None, [os.environ.get("PYTHONPATH")])]
            env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
            for rate in a.zmq_rate or []:
                rows.append({**attach_zmq(kvtop, rate, a, env, tree, label), "tree": str(tree)})
            for r in ([] if a.zmq_rate else recordings):
                row = measure(f"kvtop replay {r.name}{label}", [*kvtop, "replay", str(r), "--refresh", str(a.refresh)],
                              b"up 0:00", a.seconds, env, cwd=tree)
                rows.append({**row, "tree": str(tree)})
        if nv is not None:
            rows.append(measure("nvitop", nv, b"NVITOP", a.seconds, dict(os.environ)))
    if nv is None:
        rows.append({"name": "nvitop", "error": "not run: --no-nvitop" if a.no_nvitop else "nvitop not installed"})
    result = {
        "machine": {"host": platform.node(), "cpu": platform.processor() or platform.machine(),
                    "cores": os.cpu_count(), "python": platform.python_version(),
                    "load_1m": round(os.getloadavg()[0], 2)},
        "recordings": [] if a.zmq_rate else [{"path": str(r), "mb": round(r.stat().st_size / 2**20, 1)}
                                             for r in recordings],
        "zmq_rates": a.zmq_rate or [],
        "seconds": a.seconds, "refresh_s": a.refresh, "rows": rows, "summary": summary(rows),
    }
    if a.out:
        Path(a.out).write_text(json.dumps(result, indent=1))
    if a.json:
        print(json.dumps(result, indent=1))
    else:
        print(f"{a.seconds:.0f} s in a {SIZE[0]}x{SIZE[1]} pty, refresh {a.refresh} s, on {result['machine']}")
        for r in rows:
            if "cpu_s" in r:
                print(f"  {r['name']:36} {r['cpu_percent_of_a_core']:6.2f}% of a core  start-up "
                      f"{r['startup_cpu_s']} s CPU ({r['startup_wall_s']} s)  rss {r['max_rss_mb']} MB  "
                      f"out {r['output_mb']} MB" + (f"  ERROR {r['error'][-200:]!r}" if "error" in r else ""))
            else:
                print(f"  {r['name']:36} {r['error']}")
        if a.rounds > 1:
            for name, sm in result["summary"].items():
                print(f"  {name:36} runs {sm['runs']}  best {sm['best']}%  median {sm['median']}%")
    return 0


def summary(rows: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each program's runs (% of a core, in the order run), best and median; a run that failed is left out of
    its figures and counted."""
    import statistics

    by_name: dict[str, list[dict[str, Any]]] = {}
    for r in rows:
        if "cpu_s" in r:  # a program that did not run (no nvitop) has no figures to sum up
            by_name.setdefault(r["name"], []).append(r)
    out = {}
    for name, runs in by_name.items():
        ok = [r["cpu_percent_of_a_core"] for r in runs if "error" not in r]
        out[name] = {"runs": ok, "failed": len(runs) - len(ok),
                     "best": min(ok) if ok else None, "median": round(statistics.median(ok), 2) if ok else None,
                     "startup_cpu_s": [r.get("startup_cpu_s") for r in runs]}
    return out


if __name__ == "__main__":
    raise SystemExit(main())
