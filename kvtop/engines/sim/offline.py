"""Trace replay on the simulator, as fast as possible (``kvtop sim --trace``): what-if sweeps over host caches.

Requests are handed to the engine core at their (scaled) arrival times on the simulated clock, a few at a time,
so a trace of thousands of 15k-token prompts never holds more than a handful of prompts in memory. The engine
runs without iteration stats or KV events: only the block manager's counters are read at the end.

Prompts go to the engine as ``TokenRuns`` (one run of consecutive ids per 512-token hash block), which the block
manager cuts into the same keys as the equal token lists without creating 61M int objects for the synthetic
trace. The cyclic garbage collector is paused during a replay: the replay makes no reference cycles worth
collecting, and its collections walked every live key and block again and again (13% of the replay).
"""

from __future__ import annotations

import gc
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from kvtop.engines.gpus import GpuProfile
from kvtop.engines.inputs import TraceRequest
from kvtop.engines.models import ModelShape
from kvtop.engines.sim.block_manager import BlockManager, TokenRuns
from kvtop.engines.sim.core import GUARANTEED_NO_EVICT, SimEngineCore, SimRequest
from kvtop.engines.sim.decode_accel import LazyDecodeCore

FEED_AHEAD = 16  # requests queued in the core beyond the running batch: enough to fill any batch slot


@dataclass
class TraceRunConfig:
    model: ModelShape
    gpu: GpuProfile
    tokens_per_block: int
    primary_blocks: int
    secondary_blocks: int
    host_cache_bytes: int
    max_batch_size: int = 256
    max_num_tokens: int = 8192
    max_seq_len: int = 1 << 20  # traces carry prompts longer than a model's nominal window; do not reject them
    time_scale: float = 1.0
    capacity_scheduler_policy: str = "GUARANTEED_NO_EVICT"  # or MAX_UTILIZATION (core.py)
    tensor_parallel_size: int = 1


def _percentile(sorted_values: list[float], q: float) -> float | None:
    if not sorted_values:
        return None
    i = min(len(sorted_values) - 1, max(0, int(round(q * (len(sorted_values) - 1)))))
    return sorted_values[i]


def run_trace(requests: Iterable[TraceRequest], cfg: TraceRunConfig) -> dict[str, Any]:
    gc_was_enabled = gc.isenabled()
    gc.disable()
    try:
        return _run_trace(requests, cfg)
    finally:
        if gc_was_enabled:
            gc.enable()


def _run_trace(requests: Iterable[TraceRequest], cfg: TraceRunConfig) -> dict[str, Any]:
    wall0 = time.perf_counter()
    bm = BlockManager(cfg.primary_blocks, cfg.secondary_blocks, cfg.tokens_per_block)
    # generation requests touched only at their events (decode_accel: the same results); MAX_UTILIZATION's pauses
    # read every running request every iteration, so it runs on the reference loop
    engine = LazyDecodeCore if cfg.capacity_scheduler_policy == GUARANTEED_NO_EVICT else SimEngineCore
    core = engine(cfg.model, cfg.gpu, bm, max_batch_size=cfg.max_batch_size,
                  max_num_tokens=cfg.max_num_tokens, max_seq_len=cfg.max_seq_len,
                  enable_iter_perf_stats=False, capacity_scheduler_policy=cfg.capacity_scheduler_policy,
                  tensor_parallel_size=cfg.tensor_parallel_size)
    pending = deque(requests)
    ttfts: list[float] = []
    failures: list[str] = []

    def done(r: SimRequest) -> None:
        if r.error is None and r.first_token_s is not None:
            ttfts.append(r.first_token_s - r.arrival_s)
        elif r.error is not None and len(failures) < 20:
            failures.append(r.error)

    n = 0
    while pending or not core.idle():
        while pending and len(core.waiting) < FEED_AHEAD and \
                pending[0].timestamp_ms / 1000.0 / cfg.time_scale <= core.now_s:
            tr = pending.popleft()
            n += 1
            core.submit(SimRequest(n, TokenRuns(tr.prompt_runs()), tr.output_length,  # type: ignore[arg-type]
                                   arrival_s=tr.timestamp_ms / 1000.0 / cfg.time_scale, on_finish=done))
        if core.has_runnable():
            core.step()
        elif pending:
            core.now_s = max(core.now_s, pending[0].timestamp_ms / 1000.0 / cfg.time_scale)
        else:
            break
    ttfts.sort()
    reused, missed = bm.reused_blocks, bm.missed_blocks
    return {
        "host_cache_bytes": cfg.host_cache_bytes,
        "primary_blocks": cfg.primary_blocks,
        "secondary_blocks": cfg.secondary_blocks,
        "requests": core.completed,
        "failed": core.failed,
        "reused_blocks": reused,
        "missed_blocks": missed,
        "cache_hit_rate": reused / (reused + missed) if reused > 0 else 0.0,
        "offloaded_blocks": bm.offloaded_blocks,
        "onboarded_blocks": bm.onboarded_blocks,
        "reused_tokens": bm.reused_tokens,
        "input_tokens": bm.total_input_tokens,
        "ttft_p50_s": _percentile(ttfts, 0.5),
        "ttft_p99_s": _percentile(ttfts, 0.99),
        "simulated_seconds": core.now_s,
        "busy_seconds": core.busy_s,
        "iterations": core.iteration,
        "paused": core.paused_total,
        "max_scheduled": core.max_scheduled,
        "wall_seconds": time.perf_counter() - wall0,
        "failures": failures,
    }
