"""What the request fold's latency reads cost a dashboard refresh: TTFT and end-to-end percentiles since start
and over the 10 s window (four reads a refresh, kvtop/tiers/requests.py ``_LatencyTrack``), with 680, 4,096
(the deque's size) and 20,000 requests held, ~17 finishing a second as on the busy recording.

    python bench/bench_latency_reads.py                        # this tree
    python bench/bench_latency_reads.py --baseline /tmp/base   # and another checkout's requests.py, alternated

CPU (``time.process_time``) of 400 refreshes' reads, best of 2 alternated rounds, in microseconds a refresh.
"""

from __future__ import annotations

import argparse
import importlib.util
import random
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvtop.tiers import requests as this_tree  # noqa: E402


def reads_us(mod: Any, held: int, reps: int = 400) -> float:
    rng = random.Random(1)
    tracks = [mod._LatencyTrack(4096) for _ in range(2)]   # TTFT and end to end, as the fold keeps them
    t = 0.0
    for _ in range(held):
        t += 1 / 17
        for track in tracks:
            track.add(t, rng.lognormvariate(-2, 1))
    start = time.process_time()
    for _ in range(reps):
        for track in tracks:
            track.percentiles()
            track.window(t - 10.0)
    return (time.process_time() - start) / reps * 1e6


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--baseline", type=Path, default=None, help="a checkout whose kvtop/tiers/requests.py runs too")
    a = ap.parse_args()
    trees: list[tuple[str, Any]] = [("this tree", this_tree)]
    if a.baseline is not None:
        spec = importlib.util.spec_from_file_location("baseline_requests",
                                                      a.baseline / "kvtop" / "tiers" / "requests.py")
        assert spec is not None and spec.loader is not None
        baseline = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(baseline)
        trees.append(("baseline", baseline))
    for held in (680, 4096, 20000):
        best: dict[str, float] = {}
        for _ in range(2):
            for name, mod in trees:
                best[name] = min(best.get(name, float("inf")), reads_us(mod, held))
        print(f"{held:6,} requests held: " + ", ".join(f"{n} {us:7.1f} us a refresh" for n, us in best.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
