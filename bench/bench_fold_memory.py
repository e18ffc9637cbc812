"""Memory of the stream fold when stored blocks are never removed (issue 26: ~90 B a block without limit, 2.8M
blocks -> 280 MB in 30 s): peak RSS of one process folding ``--blocks`` distinct GPU BlockStored hashes (100 a
batch, none removed), against another kvtop in the same run.

    python bench/bench_fold_memory.py [--blocks 3000000] [--against DIR]

Each tree in a fresh interpreter; ``--against DIR``: a directory holding another ``kvtop`` package
(``git archive 80ba13f kvtop | tar -x -C DIR``). Prints peak RSS, the live blocks kept, and the fold's time.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r'''
import resource, sys, time
sys.path.insert(0, sys.argv[1])
from kvtop.records import Record, SourceId
from kvtop.tiers import TierModel
src = SourceId("h", 0, "t")
base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
m = TierModel()
blocks = int(sys.argv[2])
t = time.perf_counter()
for i in range(blocks // 100):
    ev = {"type": "BlockStored", "block_hashes": list(range((1 << 40) + i * 100, (1 << 40) + i * 100 + 100)),
          "parent_block_hash": None, "block_size": 16, "medium": "GPU"}
    m.apply(Record(kind="kv_batch", data={"seq": i, "ts": 1.0, "rank": 0, "topic": "", "events": [ev]},
                   source=src, time=1764430000.0 + i * 1e-4))
took = time.perf_counter() - t
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
s = m.summary()["stream"]
print(f"{sys.argv[1]}: {blocks:,} blocks stored, {len(m.stream_fold.live['gpu']):,} kept, "
      f"{s.get('forgotten_blocks', {}).get('gpu', 0):,} forgotten; peak RSS {peak / 1024:,.0f} MiB "
      f"({(peak - base) / 1024:,.0f} MiB over the interpreter's), {took:.1f} s")
'''


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--blocks", type=int, default=3_000_000)
    p.add_argument("--against", type=Path, default=None)
    a = p.parse_args()
    for root in [ROOT] + ([a.against.resolve()] if a.against else []):
        subprocess.run([sys.executable, "-c", CHILD, str(root), str(a.blocks)], check=True)


if __name__ == "__main__":
    main()
