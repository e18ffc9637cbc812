"""Memory of ``kvtop attach zmq://`` under a flood it cannot keep up with (issue 26, "ZMQ memory has no bound in
bytes"): peak RSS, RSS over time, what was folded, what it said, its exit status.

    python bench/bench_zmq_flood.py [--events-per-s 250000] [--seconds 30] [--against DIR]

A publisher in a process of its own (tests/kv_publisher.py's wire: vLLM 0.33's map form, topic, 8-byte seq,
msgpack ``[ts, events, rank]``) sends vLLM-shaped batches: each batch 25 BlockStored events (a chain of 4 blocks, 64
token ids) and 25 BlockRemoved events for the blocks stored 200 batches before (so the engine's live set stays at
~20,000 blocks, as a GPU pool would). ``--events-per-s`` counts those events (50 a batch). kvtop runs headless with
``--duration seconds + 2``; psutil reads its RSS every 0.25 s. ``--against DIR`` runs a second kvtop package (e.g.
``git archive 80ba13f kvtop | tar -x -C DIR``) after this tree's, in the same run.

Prints one JSON line per run: batches and events sent, the rate reached, kvtop's CPU seconds (``cpu_s``: user +
system, start-up included), peak RSS, RSS at 5 s steps, blocks folded (the summary's stored count) against those
sent, what kvtop counted unread or lost, its exit status.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
BLOCKS_PER_EVENT = 4
EVENTS_PER_BATCH = 50        # 25 stored + 25 removed
REMOVE_AFTER = 200           # batches a block lives


def publish(port_file: Path, events_per_s: int, seconds: float, done_file: Path) -> None:
    """The publisher process: bind, write the port, wait for the subscriber, send at the rate, write what it sent."""
    sys.path.insert(0, str(ROOT / "tests"))
    from kv_publisher import Publisher, removed, stored

    pub = Publisher(replay=False)
    port_file.write_text(str(pub.port))
    pub.wait_subscribed(60)
    rate = events_per_s / EVENTS_PER_BATCH
    half = EVENTS_PER_BATCH // 2
    start = time.monotonic()
    sent = 0
    while (elapsed := time.monotonic() - start) < seconds:
        due = int(elapsed * rate) + 1
        while sent < due:
            base = sent * half * BLOCKS_PER_EVENT
            events = [stored(list(range(base + i * BLOCKS_PER_EVENT, base + (i + 1) * BLOCKS_PER_EVENT)), tokens=16)
                      for i in range(half)]
            if sent >= REMOVE_AFTER:
                old = (sent - REMOVE_AFTER) * half * BLOCKS_PER_EVENT
                events += [removed(list(range(old + i * BLOCKS_PER_EVENT, old + (i + 1) * BLOCKS_PER_EVENT)))
                           for i in range(half)]
            pub.send(events)
            sent += 1
        time.sleep(0.0005)
    wall = time.monotonic() - start
    done_file.write_text(json.dumps({"batches": sent, "stored_blocks": sent * half * BLOCKS_PER_EVENT,
                                     "publish_s": round(wall, 2)}))
    time.sleep(3)   # keep the socket up while kvtop drains what is queued
    pub.close()


def run(tree: Path, events_per_s: int, seconds: float) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        port_file, done_file = Path(tmp) / "port", Path(tmp) / "done"
        pub = subprocess.Popen([sys.executable, __file__, "--publish", str(port_file), str(done_file),
                                "--events-per-s", str(events_per_s), "--seconds", str(seconds)])
        while not port_file.exists() or not port_file.read_text():
            time.sleep(0.05)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(tree), os.environ.get("PYTHONPATH")])))
        t0 = time.monotonic()
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        kv = subprocess.Popen([sys.executable, "-m", "kvtop", "attach", f"zmq://127.0.0.1:{port_file.read_text()}",
                               "--headless", "--json", "--duration", str(seconds + 2)],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, cwd=tmp)
        proc = psutil.Process(kv.pid)
        peak, steps, next_step = 0, [], 5.0
        while kv.poll() is None:
            try:
                rss = proc.memory_info().rss
            except psutil.Error:
                break
            peak = max(peak, rss)
            if time.monotonic() - t0 >= next_step:
                steps.append(round(rss / 2**20))
                next_step += 5.0
            time.sleep(0.25)
        out, err = kv.communicate()
        wall = time.monotonic() - t0
        # kvtop's own CPU (user + system, start-up included): the publisher is not waited for yet, so the only
        # child the counter took in since ``before`` is kvtop
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
        pub.wait(30)
        sent = json.loads(done_file.read_text())
    try:
        summary = json.loads(out.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        summary = {}
    stream = summary.get("stream") or {}
    problems = {p.get("kind"): p.get("count") for p in summary.get("problems", []) if isinstance(p, dict)}
    return {"tree": str(tree), "events_per_s": events_per_s,
            "sent_batches": sent["batches"], "reached_events_per_s": round(sent["batches"] * EVENTS_PER_BATCH
                                                                           / sent["publish_s"]),
            "peak_rss_mib": round(peak / 2**20), "rss_mib_every_5s": steps,
            "stored_sent": sent["stored_blocks"],
            "stored_folded": (stream.get("stored_blocks") or {}).get("gpu"),
            "lost_batches": stream.get("lost_batches"), "max_lag_s": stream.get("max_lag_s"),
            "problems": problems, "exit": kv.returncode, "wall_s": round(wall, 1), "cpu_s": round(cpu, 2),
            "stderr_tail": err.decode(errors="replace")[-300:]}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--events-per-s", type=int, default=250_000)
    p.add_argument("--seconds", type=float, default=30.0)
    p.add_argument("--against", type=Path, default=None, metavar="DIR")
    p.add_argument("--publish", nargs=2, type=Path, default=None, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.publish:
        publish(a.publish[0], a.events_per_s, a.seconds, a.publish[1])
        return
    print(json.dumps({"machine": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
                      "load": os.getloadavg()}))
    print(json.dumps(run(ROOT, a.events_per_s, a.seconds)), flush=True)
    if a.against is not None:
        print(json.dumps(run(a.against.resolve(), a.events_per_s, a.seconds)), flush=True)


if __name__ == "__main__":
    main()
