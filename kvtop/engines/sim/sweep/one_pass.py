"""Every host size's hit rate from one replay at the largest (``kvtop sim --one-pass``; the package docstring gives
the argument): the accelerated replay records each onboard's distance in the host tier's queue, and
kvtop/stack_distance.py counts the smaller sizes' hits from those."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvtop.engines.inputs import TraceRequest
from kvtop.engines.sim.sweep.replay_accel import replay as _replay
from kvtop.stack_distance import NUMPY_FROM_ONBOARDS
from kvtop.stack_distance import host_hits_numpy as _host_hits_numpy
from kvtop.stack_distance import host_hits_python as _host_hits_python
from kvtop.stack_distance import no_gc as _no_gc


def host_curve(requests: Sequence[TraceRequest], primary_blocks: int, host_sizes: Sequence[int],
               tokens_per_block: int, vectorized: bool | None = None) -> list[dict[str, Any]]:
    """Hit rates for every host size (in blocks) from one replay at the largest (see the package docstring).

    ``vectorized``: count the sizes with numpy (None: when the replay onboarded more than ``NUMPY_FROM_ONBOARDS``
    blocks, where it pays for numpy's import); both ways give the same counts (tests/engines/sim/test_sim_sweep.py)."""
    sizes = sorted(set(int(h) for h in host_sizes))
    if not sizes or sizes[0] < 0:
        raise ValueError("host_sizes: expected block counts >= 0")
    largest = sizes[-1]
    with _no_gc():
        # replay_trace over the block manager, accelerated (replay_accel: the same counters and onboards, exactly)
        run = _replay(requests, primary_blocks, largest, tokens_per_block, record_onboards=True)
    replayed, skipped = run.replayed, run.skipped
    total = run.reused_blocks + run.missed_blocks
    gpu_hits = run.reused_blocks - run.onboarded_blocks
    smaller = [h for h in sizes if h < largest]
    if vectorized is None:
        vectorized = len(run.onboards) >= NUMPY_FROM_ONBOARDS
    counts = (_host_hits_numpy if vectorized else _host_hits_python)(run.onboards, run.request_starts, smaller)
    counts[largest] = run.onboarded_blocks
    out = []
    for h in sizes:
        host_hits = counts[h]
        reused = gpu_hits + host_hits
        out.append({"secondary_blocks": h, "requests": replayed, "failed": skipped, "reused_blocks": reused,
                    "missed_blocks": total - reused, "cache_hit_rate": reused / total if total else 0.0,
                    "onboarded_blocks": host_hits, "one_pass": h < largest})
    return out
