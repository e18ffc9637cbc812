"""The ZMQ source's own path a live message (decode, seq checks, the lag, the record), with a sink that does
nothing: what issue 26's replay and sequence work added to each message, against another kvtop in the same run.

    python bench/bench_zmq_source.py [--against DIR] [--rounds 3]

30,000 vLLM 0.33-shaped batches (a 16-block BlockStored with 256 token ids), in order, through
``ZmqKvEventSource._handle`` (no socket: the socket's cost is the same for both); best of 5 each, the two trees
alternated ``--rounds`` times, each in a fresh interpreter. ``--against DIR``: a directory holding another
``kvtop`` package (``git archive 80ba13f kvtop | tar -x -C DIR``).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r'''
import asyncio, inspect, sys, time
sys.path.insert(0, sys.argv[1])
import msgpack
from kvtop.sources import kv_events_zmq as z
url = z.parse_stream_url("zmq://127.0.0.1:5557")
ev = [{"type": "BlockStored", "block_hashes": list(range(16)), "parent_block_hash": None,
       "token_ids": list(range(256)), "block_size": 16, "lora_id": None, "medium": "GPU", "lora_name": None}]
N = 30000
frames = [[b"kv-events", i.to_bytes(8, "big"), msgpack.packb([time.time(), ev, 0])] for i in range(N)]
async def main():
    best = 1e9
    for _ in range(5):
        src = z.ZmqKvEventSource(url, lambda r: None)
        rs = src.ranks[0]
        t = time.perf_counter()
        if inspect.iscoroutinefunction(src._handle):  # before issue 26: a coroutine
            for f in frames:
                await src._handle(None, rs, f)
        else:
            for f in frames:
                src._handle(None, rs, f, True)
        best = min(best, time.perf_counter() - t)
    print(f"{sys.argv[1]}: {N / best:,.0f} messages/s, {best / N * 1e6:.2f} us a message")
asyncio.run(main())
'''


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--against", type=Path, default=None)
    p.add_argument("--rounds", type=int, default=3)
    a = p.parse_args()
    roots = [ROOT] + ([a.against.resolve()] if a.against else [])
    for _ in range(a.rounds):
        for root in roots:
            subprocess.run([sys.executable, "-c", CHILD, str(root)], check=True)


if __name__ == "__main__":
    main()
