"""Validate the live what-if (kvtop/tiers/whatif.py) against real simulated runs.

For each workload and (GPU pool G, host pool H) in blocks: run the simulator with host H and KV events on,
feed its events and iteration stats to `WhatIf(H)`, then run the same workload again with host 2H and 4H and
compare the estimated hit rates with the actual ones. Prints a Markdown table (the "Live what-if" section of
BENCHMARKS.md).

    python bench/bench_whatif.py            # all workloads, ~5 min on a 2-core machine
    python bench/bench_whatif.py --quick    # no Mooncake, ~1 min
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))  # sim_runs.py: simulated runs for tests and benches, not shipped

from sim_runs import (  # noqa: E402
    WorkItem,
    chat_workload,
    mooncake_workload,
    simulate,
    zipf_prefix_workload,
)

from kvtop.tiers.whatif import WhatIf  # noqa: E402

TRACE = ROOT.parent / "shared" / "traces" / "mooncake_synthetic_trace.jsonl"


def validate(items: list[WorkItem], G: int, H: int, model: str = "Qwen/Qwen3-0.6B") -> dict[str, Any]:
    """One row: the run at H with its what-if, and the actual runs at 2H and 4H."""
    t0 = time.perf_counter()
    wi = WhatIf(H)
    base = simulate(items, primary_blocks=G, secondary_blocks=H, model=model, events=True,
                    on_events=lambda evs: [wi.apply_kv_event(e) for e in evs],
                    on_stats=lambda ss: [wi.apply_stats(s) for s in ss])
    est = wi.estimate()
    x2 = simulate(items, primary_blocks=G, secondary_blocks=2 * H, model=model)
    x4 = simulate(items, primary_blocks=G, secondary_blocks=4 * H, model=model)
    return {
        "G": G, "H": H, "hit_rate": base["hit_rate"], "whatif_hit_rate": est["hit_rate"],
        "est_x2": est["host_x2_hit_rate"], "actual_x2": x2["hit_rate"],
        "est_x4": est["host_x4_hit_rate"], "actual_x4": x4["hit_rate"],
        "requests": len(items), "failed": base["failed"], "seconds": time.perf_counter() - t0,
    }


def workloads(quick: bool) -> list[tuple[str, Callable[[], list[WorkItem]], list[tuple[int, int]]]]:
    out: list[tuple[str, Callable[[], list[WorkItem]], list[tuple[int, int]]]] = [
        ("zipf 0.8, 200 prefixes x 256 tok, 600 req",
         lambda: zipf_prefix_workload(600, 200, 256, 32, zipf_s=0.8, max_tokens=4, seed=1),
         [(64, 100), (64, 200), (128, 300)]),
        ("zipf 1.2, 500 prefixes x 512 tok, 800 req",
         lambda: zipf_prefix_workload(800, 500, 512, 32, zipf_s=1.2, max_tokens=4, seed=3),
         [(128, 200), (128, 600)]),
        ("chat, 300 conv x 6 turns, 4 system prompts",
         lambda: chat_workload(300, 6, output_tokens=32, seed=2),
         [(128, 200), (256, 400), (256, 800)]),
    ]
    if not quick and TRACE.is_file():
        out.append(("Mooncake synthetic, 3,993 req, 1 hash block = 32 tok",
                    lambda: mooncake_workload(TRACE, tokens_per_hash=32, max_tokens=8),
                    [(1024, 2000), (1024, 4000)]))
    return out


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.1f}%"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="skip the Mooncake trace")
    ap.add_argument("--json", metavar="FILE", help="also write the rows as JSON")
    args = ap.parse_args(argv)
    rows = []
    print("| workload | GPU blocks | host blocks H | hit rate at H | 2H estimated | 2H actual | error | "
          "4H estimated | 4H actual | error |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for name, make, sizes in workloads(args.quick):
        items = make()
        for G, H in sizes:
            r = validate(items, G, H)
            r["workload"] = name
            rows.append(r)
            e2 = 100 * (r["est_x2"] - r["actual_x2"])
            e4 = 100 * (r["est_x4"] - r["actual_x4"])
            print(f"| {name} | {G} | {H} | {_pct(r['hit_rate'])} | {_pct(r['est_x2'])} | {_pct(r['actual_x2'])} | "
                  f"{e2:+.1f} pt | {_pct(r['est_x4'])} | {_pct(r['actual_x4'])} | {e4:+.1f} pt |", flush=True)
    worst2 = max(abs(r["est_x2"] - r["actual_x2"]) for r in rows) * 100
    worst4 = max(abs(r["est_x4"] - r["actual_x4"]) for r in rows) * 100
    print(f"\nworst error: 2x {worst2:.1f} points, 4x {worst4:.1f} points over {len(rows)} runs")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n", encoding="utf-8")
    return 0 if worst2 <= 3.0 else 1


if __name__ == "__main__":
    raise SystemExit(main())
