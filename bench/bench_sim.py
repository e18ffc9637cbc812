"""Simulator speed: BlockManager operations per second, and the synthetic Mooncake trace replay's wall time.

    python bench/bench_sim.py                  # ops/s (optimized vs the block manager before the speed work) + trace
    python bench/bench_sim.py --baseline-rev 842a6f7   # the same: the baseline is that commit's file, from git
    python bench/bench_sim.py --skip-trace     # ops/s only
    python bench/bench_sim.py --trace-limit 400

Block manager mixes (every one run on both implementations in this process, so the ratio is measured on the
same machine at the same moment; both must give identical counters, which is checked). The baseline is
kvtop/engines/sim/block_manager.py as it was at ``--baseline-rev`` (default 842a6f7, the commit before the speed
work), read with ``git show`` into a fresh module (bench/git_baseline.py); it needs a git checkout with that history:

- ``trace``: the first trace requests' prompts (512-token hash blocks, 32 tokens per block) each added, stored
  after prefill, extended by up to 64 generated tokens and removed, 4 at a time, into a GPU pool small enough that
  nearly every allocation evicts, with and without a host pool (with one, nearly every eviction offloads);
- ``chat``: short random prompts sharing a few system prefixes, 16 tokens per block, with retention priorities and
  durations on a third of them, events on (the live dashboard's case) and off.

"Operations" are block manager calls (add_sequence, store_context_blocks, add_token, remove_sequence); blocks/s
counts the blocks those calls allocated. The trace replay is ``python -m kvtop sim --trace FILE --host-cache 64GB
--json`` in a subprocess; its JSON is printed as is. ``--trace-baseline REV`` replays it a second time on a
temporary git worktree of REV (842a6f7: before the speed work) and checks that every field but the wall time is
identical.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kvtop.engines.sim import block_manager as optimized  # noqa: E402
from kvtop.engines.sim.block_manager import TokenRuns  # noqa: E402
from kvtop.engines.sim.retention import KvCacheRetentionConfig  # noqa: E402
from kvtop.workload.trace import read_trace  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from git_baseline import BASELINE_REV, BaselineMissing, module_at  # noqa: E402

# the project's shared/ beside the repository; KVTOP_TRACE for a copy elsewhere (the lent GPU host has no shared/)
TRACE = Path(os.environ.get("KVTOP_TRACE", ROOT.parent / "shared" / "traces" / "mooncake_synthetic_trace.jsonl"))


def _load_baseline(rev: str) -> Any:
    try:
        return module_at("sim_baseline_block_manager", rev)
    except BaselineMissing as exc:
        raise SystemExit(f"bench_sim: no baseline block manager: {exc}") from None


def trace_mix(bm_class: type, prompts: list[Any], host_blocks: int, events: int) -> dict[str, Any]:
    bm = bm_class(6000, host_blocks, 32, event_buffer_max_size=events)
    ops = 0
    live: list[int] = []
    t0 = time.process_time()
    for rid, prompt in enumerate(prompts):
        bm.add_sequence(rid, prompt)
        bm.store_context_blocks(rid)
        for k in range(64):
            bm.add_token(rid, (1 << 30) + rid * 64 + k)
        ops += 66
        live.append(rid)
        if len(live) == 4:
            bm.remove_sequence(live.pop(0), final_tokens=[(1 << 30) + 7])
            ops += 1
        if events:
            bm.take_events()
    for rid in live:
        bm.remove_sequence(rid)
        ops += 1
    seconds = time.process_time() - t0
    return {"seconds": seconds, "ops": ops, "blocks": bm.alloc_total_blocks, "offloaded": bm.offloaded_blocks,
            "reused": bm.reused_blocks, "missed": bm.missed_blocks}


def chat_mix(bm_class: type, events: int, requests: int = 3000) -> dict[str, Any]:
    rng = random.Random(7)
    clock = [0.0]
    bm = bm_class(512, 256, 16, event_buffer_max_size=events, clock_ms=lambda: clock[0])
    prefixes = [[rng.randrange(32_000) for _ in range(rng.randint(50, 400))] for _ in range(8)]
    TR = KvCacheRetentionConfig.TokenRangeRetentionConfig
    ops = 0
    live: list[int] = []
    t0 = time.process_time()
    for rid in range(requests):
        clock[0] += 5.0
        prompt = rng.choice(prefixes) + [rng.randrange(32_000) for _ in range(rng.randint(20, 300))]
        retention = (KvCacheRetentionConfig([TR(0, 256, rng.choice([20, 60, 90]), rng.choice([None, 500]))])
                     if rid % 3 == 0 else None)
        bm.add_sequence(rid, prompt, retention)
        bm.store_context_blocks(rid)
        for _ in range(rng.randint(1, 100)):
            bm.add_token(rid, rng.randrange(32_000))
            ops += 1
        ops += 2
        live.append(rid)
        if len(live) == 8:
            bm.remove_sequence(live.pop(rng.randrange(8)))
            ops += 1
        bm.refresh()
        if events:
            bm.take_events()
    for rid in live:
        bm.remove_sequence(rid)
        ops += 1
    seconds = time.process_time() - t0
    return {"seconds": seconds, "ops": ops, "blocks": bm.alloc_total_blocks, "offloaded": bm.offloaded_blocks,
            "reused": bm.reused_blocks, "missed": bm.missed_blocks}


def bench_block_manager(num_trace_requests: int, repeat: int, rev: str = BASELINE_REV) -> list[dict[str, Any]]:
    baseline = _load_baseline(rev)
    requests = list(read_trace(TRACE, limit=num_trace_requests)) if TRACE.exists() else []
    prompts = [r.prompt_ids() for r in requests]  # lists of ids
    runs = [TokenRuns(r.prompt_runs()) for r in requests]  # the same prompts as kvtop sim --trace hands them over
    mixes: list[tuple[str, Callable[[type], dict[str, Any]]]] = [
        ("chat, events off", lambda c: chat_mix(c, 0)),
        ("chat, events on (buffer 10k)", lambda c: chat_mix(c, 10_000)),
    ]
    if prompts:
        mixes = [
            ("trace, TokenRuns, GPU only", lambda c: trace_mix(c, runs, 0, 0)),
            ("trace, TokenRuns, host pool", lambda c: trace_mix(c, runs, 6000, 0)),
            ("trace, lists, host pool", lambda c: trace_mix(c, prompts, 6000, 0)),
            ("trace, lists, host pool, events on", lambda c: trace_mix(c, prompts, 6000, 10_000)),
        ] + mixes
    rows = []
    for name, run in mixes:
        best: dict[str, dict[str, Any]] = {}
        for label, module in (("optimized", optimized), ("baseline", baseline)):
            for _ in range(repeat):
                gc.collect()
                result = run(module.BlockManager)
                if label not in best or result["seconds"] < best[label]["seconds"]:
                    best[label] = result
        opt, base = best["optimized"], best["baseline"]
        counters = ("blocks", "offloaded", "reused", "missed")
        if any(opt[k] != base[k] for k in counters):
            raise SystemExit(f"{name}: counters differ: optimized {opt} vs baseline {base}")
        rows.append({
            "mix": name, "ops": opt["ops"], "blocks": opt["blocks"], "offloaded": opt["offloaded"],
            "optimized_ops_per_s": opt["ops"] / opt["seconds"], "baseline_ops_per_s": base["ops"] / base["seconds"],
            "optimized_blocks_per_s": opt["blocks"] / opt["seconds"],
            "baseline_blocks_per_s": base["blocks"] / base["seconds"],
            "speedup": base["seconds"] / opt["seconds"],
        })
    return rows


def bench_trace(limit: int | None, cwd: Path = ROOT, trace: Path = TRACE,
                prefix: Sequence[str] = ()) -> dict[str, Any]:
    """``kvtop sim --trace`` in a child process (run in ``cwd``, whose ``kvtop/`` it imports; ``prefix`` such as
    ``taskset -c 3`` in front): its JSON result and the process's wall time."""
    cmd = [*prefix, sys.executable, "-m", "kvtop", "sim", "--trace", str(trace), "--host-cache", "64GB", "--json"]
    if limit:
        cmd += ["--limit", str(limit)]
    t0 = time.perf_counter()
    out = subprocess.run(cmd, cwd=cwd, check=True, capture_output=True, text=True).stdout
    wall = time.perf_counter() - t0
    shown = [*prefix, "python", *cmd[len(prefix) + 1:]]
    return {"command": " ".join(shown), "process_wall_s": wall, "result": json.loads(out)}


def make_hour_trace(path: Path, copies: int = 3) -> dict[str, int]:
    """The synthetic trace ``copies`` times over, one copy after the other: each copy's hash ids shifted past the
    previous copies' (so nothing is shared between copies, as in a different hour of traffic) and its timestamps
    past theirs. A stand-in for the one-hour production trace of the brief (12k requests, ~145M prompt tokens)."""
    lines = [json.loads(line) for line in TRACE.read_text().splitlines() if line.strip()]
    max_hash = max((h for r in lines for h in r["hash_ids"]), default=0) + 1
    span_ms = max(r["timestamp"] for r in lines) + 1_000
    requests = tokens = 0
    with path.open("w") as f:
        for k in range(copies):
            for r in lines:
                f.write(json.dumps({**r, "timestamp": r["timestamp"] + k * span_ms,
                                    "hash_ids": [h + k * max_hash for h in r["hash_ids"]]}) + "\n")
                requests += 1
                tokens += r["input_length"]
    return {"requests": requests, "prompt_tokens": tokens}


def bench_hour_trace() -> dict[str, Any]:
    """Replay the three-times-over trace in a child process; wall time and the child's peak RSS."""
    import resource

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "hour.jsonl"
        shape = make_hour_trace(path)
        run = bench_trace(None, trace=path)
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss  # KiB on Linux
    return {**shape, **run, "peak_rss_mib": peak_kib / 1024}


def bench_trace_at(rev: str, limit: int | None) -> dict[str, Any]:
    """The same replay on a temporary worktree of ``rev``."""
    with tempfile.TemporaryDirectory() as tmp:
        tree = Path(tmp) / "tree"
        subprocess.run(["git", "worktree", "add", "--detach", "-q", str(tree), rev], cwd=ROOT, check=True)
        try:
            return bench_trace(limit, cwd=tree)
        finally:
            subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, check=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--trace-requests", type=int, default=150, help="trace prompts for the block manager mixes")
    p.add_argument("--repeat", type=int, default=3, help="runs per mix and implementation; the best is kept")
    p.add_argument("--baseline-rev", metavar="REV", default=BASELINE_REV,
                   help=f"the block manager the mixes compare against, from git (default {BASELINE_REV}: before "
                        "the speed work)")
    p.add_argument("--skip-trace", action="store_true", help="no full trace replay")
    p.add_argument("--trace-limit", type=int, default=None, help="replay only the first N trace requests")
    p.add_argument("--trace-baseline", metavar="REV", default=None,
                   help="also replay on a worktree of REV (842a6f7: before the speed work) and compare")
    p.add_argument("--hour", action="store_true",
                   help="only the one-hour stand-in: the trace 3 times over (12k requests, 184M prompt tokens)")
    a = p.parse_args()
    import platform

    if a.hour:
        hour = bench_hour_trace()
        run = hour["result"]["runs"][0]
        print(f"one-hour stand-in: {hour['requests']} requests, {hour['prompt_tokens']:,} prompt tokens; "
              f"wall_seconds {run['wall_seconds']:.1f} (process {hour['process_wall_s']:.1f} s), "
              f"peak RSS {hour['peak_rss_mib']:.0f} MiB; offloaded {run['offloaded_blocks']:,}, "
              f"onboarded {run['onboarded_blocks']:,}, hit rate {run['cache_hit_rate']:.4f}")
        return

    print(f"python {platform.python_version()}, processor {platform.processor() or platform.machine()!r}")
    print(f"{'mix':40} {'ops':>8} {'blocks':>8} {'ops/s':>10} {'base ops/s':>10} {'blocks/s':>10} "
          f"{'base blk/s':>10} {'speedup':>7}")
    for row in bench_block_manager(a.trace_requests, a.repeat, a.baseline_rev):
        print(f"{row['mix']:40} {row['ops']:>8} {row['blocks']:>8} {row['optimized_ops_per_s']:>10.0f} "
              f"{row['baseline_ops_per_s']:>10.0f} {row['optimized_blocks_per_s']:>10.0f} "
              f"{row['baseline_blocks_per_s']:>10.0f} {row['speedup']:>6.2f}x")
    if not a.skip_trace and TRACE.exists():
        trace = bench_trace(a.trace_limit)
        run = trace["result"]["runs"][0]
        print(f"\n$ {trace['command']}")
        print(json.dumps(trace["result"]))
        print(f"trace replay: {run['requests']} requests, wall_seconds {run['wall_seconds']:.2f} "
              f"(process {trace['process_wall_s']:.2f} s incl. start-up and trace parsing)")
        if a.trace_baseline:
            base = bench_trace_at(a.trace_baseline, a.trace_limit)
            base_run = base["result"]["runs"][0]
            print(f"\n$ (worktree of {a.trace_baseline}) {base['command']}")
            print(json.dumps(base["result"]))
            differ = {k: (v, run.get(k)) for k, v in base_run.items() if k != "wall_seconds" and v != run.get(k)}
            print(f"baseline {a.trace_baseline}: wall_seconds {base_run['wall_seconds']:.2f}; speedup "
                  f"{base_run['wall_seconds'] / run['wall_seconds']:.2f}x; other fields "
                  f"{'identical' if not differ else f'DIFFER: {differ}'}")
            if differ:
                raise SystemExit(1)


if __name__ == "__main__":
    main()
