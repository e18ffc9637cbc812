"""The stream fold's cost of saying why a block left (issue 23, item 6): instructions, not seconds.

    valgrind --tool=callgrind python bench/bench_departures.py N        # N = 200, then 2200: the difference is
                                                                         # 2,000 batches, start-up cancelled out

Each batch is 4 vLLM-shaped events folded through ``TierModel.apply`` (a ``kv_batch`` record, decoded already):
a 16-block GPU BlockStored, an 8-block CPU BlockStored (the host copies of the first 8), a 16-hash GPU
BlockRemoved (8 offloaded: the host holds them; 8 evicted), an 8-hash CPU BlockRemoved. The removals are where
kvtop works out why: a set intersection per removal event with a live lower tier, nothing per hash. ``--stores``
folds the two stores alone (the part the change does not touch).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kvtop.records import Record, SourceId  # noqa: E402
from kvtop.tiers import TierModel  # noqa: E402


def main(argv: list[str]) -> None:
    n = int(argv[0]) if argv and argv[0].isdigit() else 2200
    stores_only = "--stores" in argv
    src = SourceId("bench", 0, "t")
    hashes = list(range(1000, 1016))
    st = {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": None, "block_size": 16,
          "medium": "GPU", "num_tokens": 256}
    host = {"type": "BlockStored", "block_hashes": hashes[:8], "parent_block_hash": None, "block_size": 16,
            "medium": "CPU", "num_tokens": 128}
    rm = {"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU"}
    rmh = {"type": "BlockRemoved", "block_hashes": hashes[:8], "medium": "CPU"}
    events = [st, host] if stores_only else [st, host, rm, rmh]
    m = TierModel()
    recs = [Record(kind="kv_batch", data={"seq": i, "ts": 1.0, "rank": 0, "topic": "", "events": events},
                   source=src, time=100.0 + i * 1e-4) for i in range(n)]
    t0 = time.perf_counter()
    for r in recs:
        m.apply(r)
    dt = time.perf_counter() - t0
    print(f"{n:,} batches in {dt:.3f} s; left: {getattr(m.moves, 'left_inferred', '(no reasons in this version)')}")


if __name__ == "__main__":
    main(sys.argv[1:])
