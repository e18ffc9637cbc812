"""The KV events of a driven trace run (``kvtop --engine sim --scenario trace --trace FILE --speed 0
--trace-time-scale 1000 --headless --json``, built as bench_driven_trace.py builds it), checked and digested, for
this tree and a baseline tree:

    python bench/check_driven_events.py --trace /tmp/m1000.jsonl --baseline /tmp/base-4caeb59

Every event the engine hands the session (``take_events``, wrapped) is counted and digested in order (sha256 of its
JSON), and every stored block's hash is recomputed here from its token ids and parent with TensorRT-LLM's
``BlockKeyHasher::hash`` written out plainly (not the tree's code): a mismatch is counted and the first is printed.
The driven run's engine thread takes requests as the driver hands them over, so two runs of one tree may batch
differently; the digest of the events says whether they did (equal digests: the same events, hashes and order),
and the check of every hash holds either way. Each tree runs twice (``--repeat``) to show which of the two it is.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

U32 = (1 << 32) - 1
U64 = (1 << 64) - 1


def plain_hash(tokens: list[int], parent_hash: int) -> int:
    """BlockKeyHasher::hash for plain token ids (no extra ids, no LoRA), one C++ statement a line."""
    seed = (len(tokens) ^ ((parent_hash * 0xBF58476D1CE4E5B9) & U64)) & U64
    for token in tokens:
        a = token & U32
        a = ((((a >> 16) ^ a) & U32) * 0x45D9F3B) & U32
        a = ((((a >> 16) ^ a) & U32) * 0x45D9F3B) & U32
        a = ((a >> 16) ^ a) & U32
        seed ^= (((a + 0x9E3779B9) & U32) + ((seed << 6) & U64) + (seed >> 2)) & U64
    return seed


def child(tree: str, trace: str, cap: float) -> None:
    sys.path.insert(0, tree)
    import orjson

    from kvtop import runner
    from kvtop.commands.run import build_parser, cli_values
    from kvtop.settings import load_settings

    expected = sum(1 for line in Path(trace).read_text().splitlines() if line.strip())
    ns = build_parser().parse_args(["--engine", "sim", "--scenario", "trace", "--trace", trace, "--speed", "0",
                                    "--trace-time-scale", "1000", "--headless", "--json"])
    settings = load_settings(cli_values(ns), config_path=None)
    session = runner.build_session(settings)
    driver = session.driver
    bm = driver.engine.block_manager
    take = bm.take_events
    digest = hashlib.sha256()
    state: dict[str, Any] = {"events": 0, "stored_blocks": 0, "mismatches": 0, "first_mismatch": None}
    lock = threading.Lock()

    def checked_take() -> list[dict[str, Any]]:
        events = take()
        with lock:
            state["events"] += len(events)
            for event in events:
                digest.update(orjson.dumps(event))
                data = event["data"]
                if data["type"] != "stored":
                    continue
                parent = data["parent_hash"] or 0
                for block in data["blocks"]:
                    tokens = block["token_ids"] if "token_ids" in block else [t["token_id"] for t in block["tokens"]]
                    state["stored_blocks"] += 1
                    if block["block_hash"] != plain_hash(tokens, parent):
                        state["mismatches"] += 1
                        if state["first_mismatch"] is None:
                            state["first_mismatch"] = {"event_id": event["event_id"], "parent": parent,
                                                       "hash": block["block_hash"]}
                    parent = block["block_hash"]
        return events

    bm.take_events = checked_take  # type: ignore[method-assign]
    answered = [0]
    emit = driver.emit

    def counted(record: object) -> None:
        emit(record)
        answered[0] += 1
        if answered[0] >= expected:
            session.stop()

    driver.emit = counted
    t0 = time.perf_counter()
    asyncio.run(session.run(duration_s=cap))
    with lock:
        print(json.dumps({"answered": answered[0], "expected": expected, "wall_s": round(time.perf_counter() - t0, 2),
                          "digest": digest.hexdigest()[:16], **state}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--trace", required=True)
    ap.add_argument("--baseline", type=Path, help="a checkout of an earlier kvtop (kvtop/, themes/)")
    ap.add_argument("--cap", type=float, default=600.0, help="seconds a driven run may take at most")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--child", help=argparse.SUPPRESS)
    a = ap.parse_args()
    trace = str(Path(a.trace).resolve())
    if a.child:
        child(a.child, trace, a.cap)
        return
    trees = {"this tree": Path(__file__).resolve().parent.parent}
    if a.baseline:
        trees[f"baseline {a.baseline}"] = a.baseline.resolve()
    failed = False
    for name, tree in trees.items():
        for _ in range(a.repeat):
            run = subprocess.run([sys.executable, __file__, "--trace", trace, "--cap", str(a.cap), "--child",
                                  str(tree)], cwd=tree, env=dict(os.environ, PYTHONPATH=str(tree)),
                                 capture_output=True, text=True)
            if run.returncode != 0:
                raise SystemExit(f"{name} failed:\n{run.stderr[-3000:]}")
            res = json.loads(run.stdout.strip().splitlines()[-1])
            failed |= res["mismatches"] > 0 or res["answered"] < res["expected"]
            print(f"{name}: {res['answered']} of {res['expected']} answered in {res['wall_s']} s, {res['events']:,} "
                  f"events, digest {res['digest']}; {res['stored_blocks']:,} stored blocks' hashes checked, "
                  f"{res['mismatches']} wrong{'' if not res['first_mismatch'] else ' ' + str(res['first_mismatch'])}",
                  flush=True)
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
