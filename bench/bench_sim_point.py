"""Instructions of one host size's timed replay alone (``kvtop sim --trace``'s ``offline.run_trace``), the first N
requests of a trace, for a tree: the figure each step of the 2026-12-03 18:55 UTC journal entry was measured by
(deterministic under callgrind where the machine is loaded; ``bench_sim_replay.py`` counts the whole command).

    python bench/bench_sim_point.py --tree /tmp/simspeed-base --trace conversation_trace.jsonl --limit 400
    python bench/bench_sim_point.py --tree . --trace conversation_trace.jsonl --limit 400

The run's settings are the command's (``kvtop sim --trace FILE --tokens-per-block 32 --host-cache 64GB``, read
through its own argument parsing, which is why the CLI runs first with the replay stubbed); then the 64 GB point
is replayed in a child under ``valgrind --tool=callgrind`` and its instruction count printed.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any


def child(tree: str, trace: str, limit: int, host: str) -> None:
    sys.path.insert(0, tree)
    from kvtop import cli
    from kvtop.engines.sim import offline

    captured: list[tuple[Any, Any]] = []
    real = offline.run_trace

    def capture(requests: Any, cfg: Any) -> dict[str, Any]:
        captured.append((requests, cfg))
        return {"host_cache_bytes": cfg.host_cache_bytes, "primary_blocks": cfg.primary_blocks,
                "secondary_blocks": cfg.secondary_blocks, "requests": 0, "failed": 0, "reused_blocks": 0,
                "missed_blocks": 0, "cache_hit_rate": 0.0, "offloaded_blocks": 0, "onboarded_blocks": 0,
                "reused_tokens": 0, "input_tokens": 0, "ttft_p50_s": None, "ttft_p99_s": None,
                "simulated_seconds": 0.0, "busy_seconds": 0.0, "iterations": 0, "paused": 0, "max_scheduled": 0,
                "wall_seconds": 0.0, "failures": []}

    offline.run_trace = capture  # type: ignore[assignment]
    args = ["sim", "--trace", trace, "--tokens-per-block", "32", "--host-cache", host, "--jobs", "1", "--json",
            "--limit", str(limit)]
    with contextlib.redirect_stdout(io.StringIO()):
        cli.main(args)
    requests, cfg = captured[-1]  # the size asked for (the command replays its 0 point first)
    result = real(requests, cfg)
    print({k: result[k] for k in ("requests", "iterations", "offloaded_blocks", "reused_blocks")})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tree", required=True, help="a checkout of kvtop (kvtop/ at its top)")
    ap.add_argument("--trace", required=True)
    ap.add_argument("--limit", type=int, default=400)
    ap.add_argument("--host-cache", default="64GB")
    ap.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    tree, trace = str(Path(a.tree).resolve()), str(Path(a.trace).resolve())
    if a.child:
        child(tree, trace, a.limit, a.host_cache)
        return
    env = dict(os.environ, PYTHONHASHSEED="0")
    cmd = ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable, __file__, "--tree", tree,
           "--trace", trace, "--limit", str(a.limit), "--host-cache", a.host_cache, "--child"]
    run = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
    m = re.search(r"Collected : (\d+)", run.stderr)
    print(run.stdout.strip())
    print(f"{tree}: {int(m.group(1)) if m else 'no count'}{' instructions' if m else ''}")


if __name__ == "__main__":
    main()
