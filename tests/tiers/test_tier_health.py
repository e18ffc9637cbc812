"""Tier-health alarms (kvtop/tiers/health.py): each named, with its numbers, from the state that causes it, and
carried as problems by the session (reported while they hold, resolved after)."""

from __future__ import annotations

from typing import Any

import pytest
from sim_runs import fold_simulated, zipf_prefix_workload

from kvtop.records import SourceId, make
from kvtop.session import HEALTH_EVERY_S, Session
from kvtop.tiers import TierModel
from kvtop.tiers.health import tier_health

SRC = SourceId(host="n", rank=0, run="r")


def _model(primary: int, secondary: int, model: str = "Qwen/Qwen3-8B", offloads: int = 0, onboards: int = 0,
           tpb: int = 32) -> TierModel:
    """A TensorRT-LLM 1.3-shaped run: its pools from meta, its moves from one iteration's kvCacheIterationStats."""
    m = TierModel()
    m.apply(make("meta", {"engine": "trtllm", "model": model, "gpu": "H200", "tokens_per_block": tpb,
                          "primary_blocks": primary, "secondary_blocks": secondary}, SRC, 1.0))
    m.apply(make("stats", {"iter": 1, "kvCacheStats": {"maxNumBlocks": primary + secondary, "freeNumBlocks": 10,
                                                        "tokensPerBlock": tpb, "reusedBlocks": 0,
                                                        "missedBlocks": 0},
                           "kvCacheIterationStats": {"0": {"iterOffloadBlocks": offloads,
                                                           "iterOnboardBlocks": onboards}}}, SRC, 2.0))
    return m


def test_a_host_pool_no_larger_than_the_gpu_pool() -> None:
    alarms = tier_health(_model(256, 200).snapshot())
    assert alarms["tier.host_not_larger"].startswith("host pool (200 blocks) no larger than the GPU pool (256)")
    assert "tier.host_not_larger" not in tier_health(_model(256, 257).snapshot())
    assert tier_health(_model(256, 0).snapshot()) == {}   # no host tier: nothing to say about one


def test_stores_with_no_loads_after_a_gpu_pool_of_them() -> None:
    alarms = tier_health(_model(256, 4096, offloads=300).snapshot())
    assert alarms["tier.host_idle"].startswith("host tier idle: 300 blocks stored, none loaded back (its copies cost")
    assert "tier.host_idle" not in tier_health(_model(256, 4096, offloads=255).snapshot())   # not yet a pool's worth
    assert "tier.host_idle" not in tier_health(_model(256, 4096, offloads=300, onboards=1).snapshot())


def test_a_load_that_costs_more_than_computing_the_block() -> None:
    """Qwen3-0.6B, 32-token blocks on the H200 profile: a block's prefill ~43 us, its load ~70 us (the per-block
    copy latency and 3.5 MiB at the link's rate); Qwen3-8B's block: ~626 us of prefill against ~89 us."""
    small = tier_health(_model(256, 4096, model="Qwen/Qwen3-0.6B", offloads=10, onboards=5).snapshot())
    assert small["tier.load_slower"].startswith("loading a block from the host (70 us) costs more than computing "
                                                "it again (43 us)")
    assert "tier.load_slower" not in tier_health(_model(256, 4096, offloads=10, onboards=5).snapshot())


@pytest.mark.slow
def test_host_evictions_with_room_on_the_simulator() -> None:
    """TensorRT-LLM's host FIFO evicts its front slot's block while onboards' empty slots ride behind it: the
    simulator (its port) does it, and the alarm says why, with the empty share it saw."""
    items = zipf_prefix_workload(250, 30, 2048, 64, zipf_s=0.8, max_tokens=16, seed=1)
    m, _ = fold_simulated(items, primary_blocks=1024, secondary_blocks=4096)
    snap = m.snapshot()
    # 4,974 offloads through a 4,096-block host, 3,328 of them onboarded: 286 evicted, 1,360 cached at the end
    assert snap.moves.evicted_host_blocks > 100 and snap.host.cached_blocks < 0.5 * 4096
    why = tier_health(snap)["tier.host_evictions"]
    assert "while the host pool has room" in why and "front slot" in why


def test_the_session_reports_and_resolves_them() -> None:
    s = Session(source=SRC)
    for r in (make("meta", {"engine": "trtllm", "model": "Qwen/Qwen3-8B", "gpu": "H200", "tokens_per_block": 32,
                            "primary_blocks": 256, "secondary_blocks": 100}, SRC, 1.0),):
        s.emit(r)
    s.tick(now=10.0, monotonic=100.0)
    items: dict[str, Any] = {p.kind: p for p in s.problems.snapshot() if p.active}
    assert "tier.host_not_larger" in items and not items["tier.host_not_larger"].lost
    s.emit(make("meta", {"engine": "trtllm", "secondary_blocks": 1000}, SRC, 2.0))
    s.tick(now=11.0, monotonic=100.0 + HEALTH_EVERY_S / 2)      # not due yet: still held
    assert "tier.host_not_larger" in {p.kind for p in s.problems.snapshot() if p.active}
    s.tick(now=12.0, monotonic=100.0 + HEALTH_EVERY_S)
    assert "tier.host_not_larger" not in {p.kind for p in s.problems.snapshot() if p.active}


def test_a_vllm_streams_alarms_give_no_tensorrt_llm_reasons() -> None:
    """A vLLM stream with /metrics (host pool of 64 blocks, GPU of 100): the alarm said TensorRT-LLM's reasons
    (offload-on-evict; the host queue's front slot, freeChildren) for an engine that has neither. Its words are
    neutral; a TensorRT-LLM run's keep them."""
    from kv_publisher import SRC, batch, removed, stored

    m = TierModel()
    m.apply(make("meta", {"engine": "vllm", "attach": "zmq", "endpoint": "tcp://127.0.0.1:5557"}, SRC, 1.0))
    m.apply(make("metrics", {"engine": "vllm", "url": "http://127.0.0.1:8000/metrics", "samples": [
        ["vllm:cache_config_info", {"block_size": "16", "num_gpu_blocks": "100"}, 1.0],
        ["vllm:kv_offload_config_info", {"cpu_num_chunks": "64"}, 1.0]]}, SRC, 1.0))
    m.apply(batch(0, [stored(list(range(1, 11)), medium="CPU")], t=2.0))
    for i in range(1, 20):   # host removals while most of the host pool is empty
        m.apply(batch(i, [stored([100 + i], medium="CPU"), removed([100 + i], medium="CPU")], t=2.0 + i))
    alarms = tier_health(m.snapshot())
    assert alarms["tier.host_not_larger"] == ("host pool (64 blocks) no larger than the GPU pool (100): it holds "
                                              "little the GPU pool does not hold too, so it can hardly add hits")
    assert alarms["tier.host_evictions"].endswith("empty): the engine's removals say no reason (the moves panel's "
                                                  "'left' line: what kvtop inferred)"), alarms["tier.host_evictions"]
    assert not any(w in " ".join(alarms.values()) for w in ("offload-on-evict", "freeChildren", "front slot"))
    trt = tier_health(_model(256, 200).snapshot())
    assert "offload-on-evict fills it with what the GPU just evicted" in trt["tier.host_not_larger"]
