"""How fast TierModel folds KV cache events, beside what ``json.loads`` of the same events costs.

The events come from kvtop's copy of TensorRT-LLM 1.2's block manager under a busy random workload with events
on: 32-token blocks, a GPU pool and a host pool under pressure, popular shared prefixes (so blocks are reused,
offloaded and onboarded), per-request retention priorities, decode blocks stored at release. They are kept as
JSON lines, as a recording or an HTTP/MQTT attach delivers them. One core, one process:

    python bench/bench_fold.py                 # ~200k events, 5 rounds, ~1 min on this machine
    python bench/bench_fold.py --events 50000 --rounds 3 --save /tmp/events.jsonl
    python bench/bench_fold.py --load /tmp/events.jsonl   # the same events again
    python bench/bench_fold.py --against 77a50a1 --pairs 5  # this tree's fold beside an older commit's, same events

Prints the event mix, then events/s for ``json.loads`` and for ``TierModel.apply_kv_event`` (best of the rounds,
each from a fresh model over the whole stream).

``--against REV`` then folds the same events with REV's kvtop (``git archive`` into a temporary directory) and with
this tree's, in alternating child processes (``--pairs`` of each, ``--rounds`` fresh models in each), so that
a busy shared machine slows both sides alike; it prints each side's best and median events per CPU second and
their ratio.
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kvtop.engines.sim.block_manager import BlockManager, NoFreeBlockError  # noqa: E402
from kvtop.engines.sim.retention import KvCacheRetentionConfig, TokenRangeRetentionConfig  # noqa: E402
from kvtop.tiers import TierModel  # noqa: E402

TPB = 32


def generate_events(n_events: int, seed: int = 7, primary: int = 4096, secondary: int = 4096) -> list[str]:
    """Run a busy workload on the block manager until it has emitted ``n_events`` events; return JSON lines."""
    rng = random.Random(seed)
    clock = [0.0]
    bm = BlockManager(primary, secondary, TPB, event_buffer_max_size=1 << 30, clock_ms=lambda: clock[0])
    # 256 shared prefixes (system prompts, documents) of 256..4096 tokens; popularity is Zipf-like, so a few are
    # hot and stay on the GPU while the tail is evicted, offloaded to host and onboarded back.
    prefixes = [[rng.randrange(150_000) for _ in range(rng.randrange(256, 4097))] for _ in range(256)]
    weights = [1.0 / (i + 1) for i in range(len(prefixes))]
    running: dict[int, list[int]] = {}  # request id -> [tokens still to generate]
    lines: list[str] = []
    mix: Counter[str] = Counter()
    rid = 0
    while len(lines) < n_events:
        clock[0] += 20.0
        bm.refresh()
        # Admit up to 8 new requests while the GPU pool can hold them to completion (GUARANTEED_NO_EVICT).
        for _ in range(rng.randrange(0, 9)):
            prefix = rng.choices(prefixes, weights)[0]
            prompt = prefix + [rng.randrange(150_000) for _ in range(rng.randrange(16, 1024))]
            max_tokens = rng.randrange(8, 256)
            need = -(-(len(prompt) + max_tokens) // TPB)
            reserved = sum(-(-(bm.num_tokens(r) + left[0]) // TPB) - bm.num_blocks(r) for r, left in running.items())
            if bm.num_free_blocks(0) - reserved < need or len(running) >= 64:
                break
            retention = None
            if rng.random() < 0.3:  # a third of the requests pin their prefix higher (system-prompt style)
                pinned = TokenRangeRetentionConfig(0, len(prefix), rng.choice([50, 80, 90]))
                retention = KvCacheRetentionConfig([pinned], decode_retention_priority=rng.choice([10, 35]))
            try:
                bm.add_sequence(rid, prompt, retention)
            except NoFreeBlockError:
                bm.remove_sequence(rid)
                continue
            bm.store_context_blocks(rid)
            running[rid] = [max_tokens]
            rid += 1
        for r in list(running):
            left = running[r]
            if left[0] == 0:
                bm.remove_sequence(r)
                del running[r]
                continue
            bm.add_token(r, rng.randrange(150_000))
            left[0] -= 1
        for ev in bm.take_events():
            mix[ev["data"]["type"]] += 1
            lines.append(json.dumps(ev, separators=(",", ":")))
    print(f"workload: {rid} requests, GPU {primary} + host {secondary} blocks of {TPB} tokens; "
          f"offloaded {bm.offloaded_blocks}, onboarded {bm.onboarded_blocks}, evicted {bm.evicted_blocks}, "
          f"reuse {bm.reused_blocks / max(1, bm.reused_blocks + bm.missed_blocks):.1%}")
    total = sum(mix.values())
    print("event mix: " + ", ".join(f"{k} {v / total:.1%}" for k, v in mix.most_common()))
    return lines[:n_events]


def bench(lines: list[str], rounds: int) -> dict[str, Any]:
    events = [json.loads(line) for line in lines]
    # The bench holds every parsed event (~6M objects for 200k events, most of them token dicts of stored events),
    # which a live consumer never does: it folds a batch and drops it. Freeze them out of the garbage collector so
    # that its full collections, triggered by the json.loads round's allocations, do not bill the fold for
    # walking the bench's own memory (that doubled the fold's time in a first measurement).
    gc.collect()
    gc.freeze()
    blocks = sum(len(e["data"].get("blocks", ())) + len(e["data"].get("block_hashes", ()))
                 + (e["data"]["type"] == "updated") for e in events)
    loads_s: list[float] = []
    fold_s: list[float] = []
    loads = json.loads
    for _ in range(rounds):
        gc.collect()
        t0 = time.perf_counter()
        for line in lines:
            loads(line)
        loads_s.append(time.perf_counter() - t0)

        model = TierModel()
        apply = model.apply_kv_event
        gc.collect()
        t0 = time.perf_counter()
        for ev in events:
            apply(ev)
        fold_s.append(time.perf_counter() - t0)
        assert model.bad_records == 0, model.last_bad_reason
        assert model.quality.unknown_hashes == 0
    n = len(events)
    return {
        "events": n, "blocks": blocks, "bytes": sum(len(x) for x in lines),
        "loads_eps": n / min(loads_s), "fold_eps": n / min(fold_s),
        "loads_eps_median": n / statistics.median(loads_s), "fold_eps_median": n / statistics.median(fold_s),
        "fold_blocks_per_s": blocks / min(fold_s),
    }


# One child of --against: fold the saved events ``rounds`` times with whichever kvtop is first on sys.path. CPU time
# of the process, not wall time: on a shared machine the time spent waiting for a core is not the fold's.
_CHILD = """
import gc, json, sys, time
sys.path.insert(0, sys.argv[1])
from kvtop.tiers import TierModel
events = [json.loads(line) for line in open(sys.argv[2])]
gc.collect()
gc.freeze()
best = []
for _ in range(int(sys.argv[3])):
    model = TierModel()
    apply = model.apply_kv_event
    gc.collect()
    t0 = time.process_time()
    for ev in events:
        apply(ev)
    best.append(time.process_time() - t0)
    assert model.bad_records == 0, model.last_bad_reason
print(json.dumps({"events": len(events), "seconds": best}))
"""


def against(rev: str, lines: list[str], pairs: int, rounds: int) -> None:
    with tempfile.TemporaryDirectory(prefix="kvtop-bench-fold-") as tmp:
        old = Path(tmp) / "tree"
        old.mkdir()
        archive = subprocess.run(["git", "archive", rev, "kvtop"], cwd=ROOT, capture_output=True, check=True)
        subprocess.run(["tar", "-x", "-C", str(old)], input=archive.stdout, check=True)
        events = Path(tmp) / "events.jsonl"
        events.write_text("\n".join(lines) + "\n")
        results: dict[str, list[float]] = {rev: [], "this tree": []}
        for _ in range(pairs):
            for name, tree in ((rev, old), ("this tree", ROOT)):
                out = subprocess.run([sys.executable, "-c", _CHILD, str(tree), str(events), str(rounds)],
                                     cwd=tmp, capture_output=True, text=True, check=True)
                results[name] += json.loads(out.stdout)["seconds"]
        n = len(lines)
        for name, secs in results.items():
            print(f"{name:>12}: best {n / min(secs):>10,.0f} events/CPU-s, "
                  f"median {n / statistics.median(secs):>10,.0f} ({len(secs)} folds in {pairs} processes)")
        ratio = min(results[rev]) / min(results["this tree"])
        print(f"this tree / {rev}: {ratio:.3f}x the events/s at the best, "
              f"{statistics.median(results[rev]) / statistics.median(results['this tree']):.3f}x at the median")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=200_000)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--save", type=Path, help="also write the events as JSON lines here")
    ap.add_argument("--load", type=Path, help="fold these JSON lines (a --save) instead of generating events")
    ap.add_argument("--against", metavar="REV", help="then fold the same events with REV's kvtop and this tree's")
    ap.add_argument("--pairs", type=int, default=5, help="--against: child processes per side, alternating")
    args = ap.parse_args()
    t0 = time.perf_counter()
    if args.load:
        lines = args.load.read_text().splitlines()
        print(f"loaded {len(lines)} events from {args.load}")
    else:
        lines = generate_events(args.events, args.seed)
        print(f"generated {len(lines)} events in {time.perf_counter() - t0:.1f} s")
    if args.save:
        args.save.write_text("\n".join(lines) + "\n")
    r = bench(lines, args.rounds)
    print(f"{r['events']} events, {r['blocks']} block entries, {r['bytes'] / r['events']:.0f} bytes/event as JSON")
    print(f"json.loads:               {r['loads_eps']:>12,.0f} events/s  (median {r['loads_eps_median']:,.0f})")
    print(f"TierModel.apply_kv_event: {r['fold_eps']:>12,.0f} events/s  (median {r['fold_eps_median']:,.0f}); "
          f"{r['fold_blocks_per_s']:,.0f} blocks/s")
    print(f"fold / json.loads time:   {r['loads_eps'] / r['fold_eps']:.2f}")
    if args.against:
        against(args.against, lines, args.pairs, args.rounds)


if __name__ == "__main__":
    main()
