"""The trace replay's engine loop (``kvtop.engines.sim.decode_accel.LazyDecodeCore``: generation requests touched
only at their block crossings and their last token) against the reference loop (``SimEngineCore``) it stands for:
iteration by iteration the same clock, the same finished requests, the same block manager counters and events;
at the end every request's results and every block's state."""

from __future__ import annotations

import random
from typing import Any

import pytest

from kvtop.engines.gpus import resolve_gpu
from kvtop.engines.models import resolve_model
from kvtop.engines.sim.block_manager import BlockManager, TokenRuns
from kvtop.engines.sim.core import MAX_UTILIZATION, SimEngineCore, SimRequest
from kvtop.engines.sim.decode_accel import LazyDecodeCore
from kvtop.engines.sim.retention import KvCacheRetentionConfig

MODEL = resolve_model("Qwen/Qwen3-8B")
GPU = resolve_gpu("H200")
TR = KvCacheRetentionConfig.TokenRangeRetentionConfig


def _result(r: SimRequest) -> tuple[Any, ...]:
    return (r.request_id, r.stage, r.error, r.output_ids, r.first_token_s, r.last_token_s, r.scheduled_s, r.fetched_s,
            r.first_iter, r.last_iter, r.reused_tokens, r.reused_blocks, r.missed_blocks, r.onboarded_blocks,
            r.alloc_total_blocks, r.alloc_new_blocks, r.kv_tokens, r.kv_blocks)


def _blocks(bm: BlockManager) -> list[tuple[Any, ...]]:
    return [(b.id, b.primary, b.key, b.hash, b.prev.id if b.prev is not None else None, b.refs, b.priority,
             b.duration_ms, b.offload_seq, b.qstamp != -1) for b in bm._blocks]


def _counters(bm: BlockManager) -> tuple[Any, ...]:
    return (bm.kv_cache_stats(), bm.num_free_blocks(0), bm.num_free_blocks(1), bm.offloaded_blocks,
            bm.silent_offloads, bm.onboarded_blocks, bm.evicted_blocks, bm.silent_detaches, bm.reused_tokens)


def _run(engine: type[SimEngineCore], seed: int, runs: bool, feed: bool = False) -> list[Any]:
    """A seeded workload on ``engine``, submitted at once or (``feed``) as ``kvtop sim --trace`` submits a trace:
    each request once it has arrived, at most 16 waiting."""
    rng = random.Random(f"lazy/{seed}")
    tpb = rng.choice([1, 2, 4, 8, 16, 32, 64])
    primary = rng.choice([4, 8, 16, 48]) * max(1, 64 // tpb)
    holder: list[SimEngineCore] = []
    bm = BlockManager(primary, rng.choice([0, 0, 3, primary // 2, primary * 2]), tpb,
                      event_buffer_max_size=rng.choice([0, 1 << 20]), clock_ms=lambda: holder[0].now_s * 1000.0)
    core = engine(MODEL, GPU, bm, max_batch_size=rng.choice([2, 4, 16, 64]),
                  max_num_tokens=rng.choice([64, 256, 8192]), max_seq_len=1 << 20, enable_iter_perf_stats=False)
    holder.append(core)
    finished: list[Any] = []
    prefixes = [[rng.randrange(40) for _ in range(rng.randint(0, 300))] for _ in range(3)]
    t = 0.0
    requests = []
    for rid in range(rng.choice([20, 60, 120])):
        t += rng.choice([0.0, 0.0, 0.001, 0.01, 0.1])
        prompt = list(rng.choice(prefixes)) + [rng.randrange(40) for _ in range(rng.randint(1, 150))]
        retention = (KvCacheRetentionConfig([TR(0, rng.choice([16, 64, None]), rng.choice([10, 50, 90]),
                                                rng.choice([None, 20]))], decode_retention_priority=60,
                                            decode_duration_ms=rng.choice([None, 5]))
                     if rng.random() < 0.2 else None)
        max_tokens = rng.choice([1, 2, 3, tpb, tpb + 1, 2 * tpb - 1, 17, 70, 200])
        ids: Any = TokenRuns([(t, 1) for t in prompt]) if runs else prompt
        req = SimRequest(rid, ids, max_tokens, arrival_s=t, retention=retention,
                         on_finish=lambda r: finished.append(_result(r)))
        requests.append(req)
    pending = list(requests)
    if not feed:
        for req in pending:
            core.submit(req)
        pending = []
    log: list[Any] = []
    for _ in range(20_000):
        while pending and len(core.waiting) < 16 and pending[0].arrival_s <= core.now_s:
            core.submit(pending.pop(0))
        if core.idle() and not pending:
            break
        if not core.has_runnable() and pending:
            core.now_s = max(core.now_s, pending[0].arrival_s)
            continue
        if core.has_runnable():
            done = core.step()
            log.append([core.iteration, core.now_s, core.busy_s, [r.request_id for r in done], _counters(bm),
                        bm.take_events(), len(core.running), len(core.waiting)])
        else:
            core.now_s = max(core.now_s, core.next_arrival_s() or core.now_s)
    assert core.idle() and not pending
    log.append(["end", finished, [_result(r) for r in requests], _blocks(bm), core.completed, core.failed,
                core.max_scheduled, core.iteration])
    return log


@pytest.mark.parametrize("seed", range(40))
def test_lazy_decode_is_the_engine_loop(seed: int) -> None:
    runs, feed = seed % 2 == 1, seed % 4 >= 2
    ref = _run(SimEngineCore, seed, runs, feed)
    lazy = _run(LazyDecodeCore, seed, runs, feed)
    for i, (a, b) in enumerate(zip(ref, lazy)):
        assert a == b, f"seed {seed}: differs at step {i}"
    assert len(ref) == len(lazy)


def test_the_workloads_cross_blocks_finish_together_and_offload() -> None:
    """What the equality above is worth: the workloads make several generation requests cross a block boundary
    in one iteration, several finish in one, blocks go to the host tier and come back."""
    crossings = finishes = offloaded = onboarded = 0
    real_cross = LazyDecodeCore._cross

    def cross(self: LazyDecodeCore, crossing: list[SimRequest], iteration: int, last_now: float) -> Any:
        nonlocal crossings
        crossings = max(crossings, len(crossing))
        return real_cross(self, crossing, iteration, last_now)

    LazyDecodeCore._cross = cross  # type: ignore[method-assign]
    try:
        for seed in range(40):
            log = _run(LazyDecodeCore, seed, seed % 2 == 1, seed % 4 >= 2)
            finishes = max([finishes, *(len(entry[3]) for entry in log[:-1])])
            offloaded += log[-2][4][3] if len(log) > 1 else 0
            onboarded += log[-2][4][5] if len(log) > 1 else 0
    finally:
        LazyDecodeCore._cross = real_cross  # type: ignore[method-assign]
    assert crossings >= 3 and finishes >= 3
    assert offloaded > 100 and onboarded > 10


def test_what_the_lazy_loop_cannot_do_is_refused() -> None:
    bm = BlockManager(16, 0, 4)
    with pytest.raises(ValueError, match="GUARANTEED_NO_EVICT"):
        LazyDecodeCore(MODEL, GPU, bm, enable_iter_perf_stats=False, capacity_scheduler_policy=MAX_UTILIZATION)
    with pytest.raises(ValueError, match="iteration stats"):
        LazyDecodeCore(MODEL, GPU, bm)
    core = LazyDecodeCore(MODEL, GPU, bm, enable_iter_perf_stats=False)
    with pytest.raises(ValueError, match="per-token callback"):
        core.submit(SimRequest(1, [1, 2, 3], 4, 0.0, on_token=lambda r: None))
