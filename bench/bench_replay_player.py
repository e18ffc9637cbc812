"""The replay player (issue 24, item 1): how long a headless ``kvtop replay`` of a 20 s recorded run takes (the
bar: under 8 s, with the live run's hits), against ``--speed 1`` (what it did before: as recorded); and what a seek
costs on a long recording (a seek back re-folds from the start).

    python bench/bench_replay_player.py [--seconds 20] [--long-mb 100] [--keep DIR]

1. Records a ``--seconds`` run live (``kvtop --headless --json --speed 0 --duration N --record``), then times
   ``kvtop replay FILE --headless --json`` (as fast as it can, the default now) and ``--speed 1`` (the old default),
   and compares the hits and lookups of the three summaries.
2. Tiles the recording to ``--long-mb`` MB (bench_report_memory.make_recording: one run of one source, times shifted
   copy after copy) and, in this process, plays it into a session with a held ReplayPlayer at full speed, then
   times seeks: from the end back to the middle, to 10 s from the start, +5 s forward, and to the end from the
   start. Prints records re-folded and the wall time of each.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def kvtop(args: list[str]) -> tuple[dict, float, float]:
    """The JSON summary of ``kvtop ARGS``, its wall time and its CPU time (user + system)."""
    t0, c0 = time.perf_counter(), _children_cpu()
    proc = subprocess.run([sys.executable, "-m", "kvtop", *args], capture_output=True, text=True, cwd=ROOT)
    wall, cpu = time.perf_counter() - t0, _children_cpu() - c0
    if proc.returncode != 0:
        raise SystemExit(f"kvtop {' '.join(args)}: exit {proc.returncode}: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout), wall, cpu


def headless(rec: Path, seconds: int) -> None:
    live, live_wall, live_cpu = kvtop(["--headless", "--json", "--speed", "0", "--duration", str(seconds), "--record",
                             str(rec)])
    times = [json.loads(line)["time"] for line in rec.read_bytes().splitlines() if line.strip()]
    print(f"recorded: {len(times):,} lines over {max(times) - min(times):.1f} s ({rec.stat().st_size / 1e6:.1f} MB),"
          f" live run {live_wall:.1f} s")
    runs = [("live run", live, live_wall, live_cpu)]
    for _ in range(3):
        runs.append(("replay (default: as fast as it can)", *kvtop(["replay", str(rec), "--headless", "--json"])))
    runs.append(("replay --speed 1 (the old default)",
                 *kvtop(["replay", str(rec), "--headless", "--json", "--speed", "1"])))
    for name, s, wall, cpu in runs:
        hr = s["hit_rate"]
        print(f"  {name:38s} wall {wall:6.2f} s  cpu {cpu:5.2f} s   hits {hr['hits']:,} / lookups "
              f"{hr['lookups']:,}, host hits {hr['host_hits']:,}")


async def seeks(long_rec: Path) -> None:
    from kvtop.compose import build_attach_session

    session = build_attach_session(str(long_rec), command="replay", speed=0.0, hold_at_end=True, max_gap_s=None)
    player = session.player
    task = asyncio.ensure_future(session.run())

    async def settle() -> None:
        while player._target is not None or player.seeking:
            await asyncio.sleep(0.001)

    t0, c0 = time.perf_counter(), time.process_time()
    while not player.at_end:
        await asyncio.sleep(0.01)
    whole, whole_cpu = time.perf_counter() - t0, time.process_time() - c0
    n = player.records
    length = player.length_s
    print(f"long recording: {n:,} records over {length:.0f} s ({long_rec.stat().st_size / 1e6:.0f} MB); "
          f"played through at full speed in {whole:.2f} s, cpu {whole_cpu:.2f} s ({n / whole_cpu:,.0f} records per "
          "cpu second)")
    player.toggle_pause()
    for name, target in (("end -> middle (back: re-fold from the start)", length / 2),
                         ("middle -> 0:10 (back)", 10.0),
                         ("0:10 -> 0:15 (+5 s forward)", 15.0),
                         ("0:15 -> end (forward)", length)):
        before = player.records
        t0, c0 = time.perf_counter(), time.process_time()
        player.seek_to(target)
        await settle()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        back = player.generation
        folded = player.records - (0 if player.records < before else before)
        print(f"  {name:46s} wall {wall:7.3f} s  cpu {cpu:7.3f} s   {folded:,} records folded "
              f"(restarts so far: {back})")
    session.stop()
    await task


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seconds", type=int, default=20)
    p.add_argument("--long-mb", type=int, default=100)
    p.add_argument("--keep", default=None, help="keep the recordings in this directory")
    p.add_argument("--seeks-on", default=None, metavar="FILE", help="only the seeks, on this long recording")
    a = p.parse_args()
    if a.seeks_on:
        asyncio.run(seeks(Path(a.seeks_on)))
        return
    with tempfile.TemporaryDirectory() as tmp:
        where = Path(a.keep) if a.keep else Path(tmp)
        where.mkdir(parents=True, exist_ok=True)
        rec = where / f"run{a.seconds}.jsonl"
        rec.unlink(missing_ok=True)
        headless(rec, a.seconds)
        if a.long_mb:
            from bench_report_memory import make_recording

            long_rec = where / f"long{a.long_mb}.jsonl"
            make_recording(long_rec, a.long_mb)
            asyncio.run(seeks(long_rec))


if __name__ == "__main__":
    main()
