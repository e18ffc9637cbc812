"""A ZMQ KV event stream with sequence gaps against replay endpoints that do not help (issue 26, High): how much of
the live stream ``kvtop attach zmq://...?replay=...`` folds, what it counts lost, its exit status, how long it runs.

    python bench/bench_zmq_replay.py [--seconds 6] [--rate 100] [--drop-every 3]

A real publisher on 127.0.0.1 (tests/kv_publisher.py: XPUB + ROUTER, from the documented wire format) sends
``--rate`` batches/s of 2 blocks each for ``--seconds``; every ``--drop-every``-th batch goes only into its replay
buffer (as if ZMQ had dropped it). kvtop runs headless with ``--duration seconds + 3``. Cases, in the same run:

- ``no gaps``: nothing dropped (the reference: the stream's own rate);
- ``dead port``: gaps, nothing listens on the replay port;
- ``silent router``: gaps, a ROUTER that takes requests and never answers;
- ``drip 0.9 s``: gaps, a ROUTER that sends one batch every 0.9 s;
- ``working replay``: gaps, a ROUTER that answers at once;
- ``flood``: no gaps, ``--flood-rate`` batches/s (what one kvtop folds, and the lag it shows when it cannot).

``--against DIR`` runs each case a second time with another kvtop (the code before, say). Prints one JSON line per
case: live batches sent and folded, blocks folded / published live, lost and replayed
batches, the most lag, exit status, wall time.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from kv_publisher import Publisher, stored  # noqa: E402


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def case(name: str, seconds: float, rate: int, drop_every: int, root: Path = ROOT) -> dict:
    replay = name not in ("dead port", "no gaps", "flood")
    pub = Publisher(replay=replay, replay_silent=name == "silent router",
                    replay_drip_s=0.9 if name.startswith("drip") else 0.0)
    url = f"zmq://127.0.0.1:{pub.port}?replay=tcp://127.0.0.1:{pub.replay_port if replay else free_port()}"
    sent = {"live": 0, "dropped": 0}

    def feed() -> None:
        pub.wait_subscribed()
        i = 0
        start = time.monotonic()
        while time.monotonic() - start < seconds:
            due = int((time.monotonic() - start) * rate)
            while i < due:
                drop = name not in ("no gaps", "flood") and i % drop_every == drop_every - 1
                pub.send([stored([i, i + 1_000_000_000])], drop=drop)
                sent["dropped" if drop else "live"] += 1
                i += 1
            time.sleep(0.01)

    t = threading.Thread(target=feed)
    t.start()
    t0 = time.monotonic()
    try:
        out = subprocess.run([sys.executable, "-m", "kvtop", "attach", url, "--headless", "--json",
                              "--duration", str(seconds + 3)], capture_output=True, text=True, timeout=600,
                             cwd=root)
    finally:
        t.join()
        pub.close()
    wall = time.monotonic() - t0
    try:
        s = json.loads(out.stdout)
    except ValueError:
        return {"case": name, "exit": out.returncode, "wall_s": round(wall, 1), "stderr": out.stderr[-300:]}
    st = s.get("stream") or {}
    live_blocks = 2 * sent["live"]
    replayed = st.get("replayed_batches", 0)
    return {"case": name, "kvtop": root.name, "live_sent": sent["live"], "dropped": sent["dropped"],
            "live_folded": st.get("batches", 0) - replayed,
            "blocks_folded_pct": round(100 * (st.get("stored_blocks", {}).get("gpu", 0) - 2 * replayed)
                                       / max(1, live_blocks), 1),
            "lost": st.get("lost_batches"), "replayed": replayed, "max_lag_s": st.get("max_lag_s"),
            "problems": {p["kind"]: p["count"] for p in s.get("problems") or []},
            "exit": out.returncode, "wall_s": round(wall, 1)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seconds", type=float, default=6.0)
    p.add_argument("--rate", type=int, default=100)
    p.add_argument("--drop-every", type=int, default=3)
    p.add_argument("--flood-rate", type=int, default=20_000)
    p.add_argument("--cases", default="no gaps,dead port,silent router,drip 0.9 s,working replay,flood")
    p.add_argument("--against", type=Path, default=None, metavar="DIR",
                   help="also run each case with the kvtop package in DIR (e.g. `git archive 80ba13f kvtop | tar -x "
                        "-C DIR`), alternated with this tree's")
    a = p.parse_args()
    print(json.dumps({"machine": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
                      "seconds": a.seconds, "rate": a.rate, "drop_every": a.drop_every}))
    for name in a.cases.split(","):
        rate = a.flood_rate if name == "flood" else a.rate
        print(json.dumps(case(name, a.seconds, rate, a.drop_every)), flush=True)
        if a.against is not None:
            print(json.dumps(case(name, a.seconds, rate, a.drop_every, a.against.resolve())), flush=True)


if __name__ == "__main__":
    main()
