"""Decoding and folding the engines' common KV event stream, one core: is one kvtop enough for one engine?

    python bench/bench_kv_stream.py [--seconds 3]
    python bench/bench_kv_stream.py --against DIR [--rounds 3]   # DIR: git archive REV kvtop | tar -x -C DIR

Two batch shapes, as vLLM 0.33 encodes them (shared/engines-kv-events.md 7.1, 8.2): a 16-block BlockStored with
256 token ids (~1.6 KB) and a 16-hash BlockRemoved. For each, in the same run:

- ``msgpack``: ``msgpack.unpackb`` alone: the floor any Python subscriber pays;
- ``decode``: kvtop's ``decode_frames`` (frames, envelope, every event checked and normalized, tokens counted);
- ``decode+fold``: that plus ``TierModel.apply`` of the ``kv_batch`` record (refcounted per-tier hash sets).

Stores and removes alternate over the same hashes in the fold, so its sets stay at a steady 16 blocks. Reports
batches/s and block hashes/s (best of 3 runs of ``--seconds`` each). ``--against DIR``: this tree and the ``kvtop``
package in DIR, each in a fresh interpreter, alternated ``--rounds`` times, the best of each printed at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import msgpack

ROOT = Path(__file__).resolve().parent.parent
KINDS = ("msgpack", "decode", "decode+fold")


def load(root: Path) -> tuple[Any, Any, Any, Any]:
    """decode_frames, Record, SourceId and TierModel of the kvtop package under ``root``."""
    sys.path.insert(0, str(root))
    try:
        from kvtop.sources.kv_wire import decode_frames
    except ImportError:  # a tree before issue 25's split: decoder and fold in one module
        from kvtop.kv_stream import decode_frames  # type: ignore[import-not-found, no-redef]
    from kvtop.records import Record, SourceId
    from kvtop.tiers import TierModel

    return decode_frames, Record, SourceId, TierModel


def frames(seq: int, events: list) -> list[bytes]:
    return [b"kv-events", seq.to_bytes(8, "big"), msgpack.packb([1764430000.0 + seq, events, 0])]


def run(kind: str, seconds: float, kvtop: tuple[Any, Any, Any, Any]) -> dict[str, float]:
    decode_frames, Record, SourceId, TierModel = kvtop
    hashes = [15760518052499183552 - i for i in range(16)]
    store = {"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": None,
             "token_ids": [151644 + i for i in range(256)], "block_size": 16, "lora_id": None, "medium": "GPU",
             "lora_name": None, "group_idx": 0, "kv_cache_spec_kind": "full_attention"}
    remove = {"type": "BlockRemoved", "block_hashes": hashes, "medium": "GPU", "group_idx": 0}
    msgs = [frames(i, [store if i % 2 == 0 else remove]) for i in range(2)]
    sizes = [len(m[2]) for m in msgs]
    src = SourceId("bench", 0, "b")
    best = 0.0
    for _ in range(3):
        m = TierModel()
        n = 0
        t0 = time.perf_counter()
        deadline = t0 + seconds
        while True:
            for _ in range(1000):
                f = msgs[n & 1]
                if kind == "msgpack":
                    msgpack.unpackb(f[2], raw=False, strict_map_key=False)
                else:
                    b = decode_frames(f)
                    if kind == "decode+fold":
                        data = b.record_data()
                        data["seq"] = n
                        m.apply(Record("kv_batch", data, src, 1000.0 + n * 1e-4))
                n += 1
            if time.perf_counter() > deadline:
                break
        best = max(best, n / (time.perf_counter() - t0))
    return {"batches_per_s": round(best), "hashes_per_s": round(best * 16), "store_bytes": sizes[0],
            "remove_bytes": sizes[1]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--against", type=Path, default=None, help="a directory holding another kvtop package")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)  # the tree a child measures
    a = ap.parse_args()
    if a.against is not None:
        compare([ROOT, a.against.resolve()], a.seconds, a.rounds)
        return
    kvtop = load(a.root)
    out: dict[str, Any] = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
                      f"Python {platform.python_version()}, msgpack {msgpack.version}",
           "batch": "alternating 16-block BlockStored (256 token ids) / 16-hash BlockRemoved, vLLM 0.33 shape"}
    for kind in KINDS:
        out[kind] = run(kind, a.seconds, kvtop)
        print(kind, out[kind], flush=True)
    print(json.dumps(out))


def compare(roots: list[Path], seconds: float, rounds: int) -> None:
    """Each tree in a fresh interpreter, alternated; the best batches/s of each kind per tree."""
    best: dict[str, dict[str, int]] = {str(r): dict.fromkeys(KINDS, 0) for r in roots}
    for i in range(rounds):
        for root in roots:
            res = subprocess.run([sys.executable, __file__, "--seconds", str(seconds), "--root", str(root)],
                                 check=True, capture_output=True, text=True)
            got = json.loads(res.stdout.strip().splitlines()[-1])
            for kind in KINDS:
                best[str(root)][kind] = max(best[str(root)][kind], got[kind]["batches_per_s"])
            print(f"round {i + 1} {root}: " + ", ".join(f"{k} {got[k]['batches_per_s']:,}" for k in KINDS),
                  flush=True)
    print(json.dumps({"best_batches_per_s": best}))


if __name__ == "__main__":
    main()
