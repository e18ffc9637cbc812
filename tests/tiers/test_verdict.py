"""The verdict (kvtop/tiers/verdict.py): is the host tier paying off, held to the truth the simulator gives.

The truth: the same workload, closed loop, through the simulated engine with and without the host tier
(tests/sim_runs.py ``fold_simulated``, deterministic); the tier's worth is the simulated time the whole workload
took without it less with it. The verdict only sees what a user's kvtop sees of the run with the tier (its
records, folded live), so it must say the same thing, by about the same number of seconds.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from sim_runs import WorkItem, fold_simulated, unique_prompts, zipf_prefix_workload

from kvtop.records import SourceId, make
from kvtop.tiers import TierModel
from kvtop.tiers.verdict import MIN_FIT_ITERATIONS, IterationFit, TierEvidence, decide

REPO = Path(__file__).resolve().parents[2]


def _with_and_without(items: list[WorkItem], host_blocks: int) -> tuple[Any, float]:
    with_tier, truth_with = fold_simulated(items, primary_blocks=1024, secondary_blocks=host_blocks)
    without, truth_without = fold_simulated(items, primary_blocks=1024, secondary_blocks=0)
    assert without.verdict["host"].says == "none"
    return with_tier.verdict["host"], truth_without["makespan_s"] - truth_with["makespan_s"]


@pytest.mark.slow
def test_verdict_pays_where_the_tier_shortens_the_run() -> None:
    """30 prompts of 2,048 tokens, Zipf-popular, over a 1,024-block GPU pool: the host keeps the evicted ones."""
    items = zipf_prefix_workload(250, 30, 2048, 64, zipf_s=0.8, max_tokens=16, seed=1)
    v, truth = _with_and_without(items, 8192)
    assert truth > 1.0                    # the tier took 1.7 s off a 5 s run
    assert v.says == "pays"
    assert v.net_s == pytest.approx(truth, rel=0.25)
    assert v.basis.startswith("measured prefill: prefill measured from")
    assert v.loaded_blocks > 1000 and v.hit_requests > 20
    assert v.ttft_p50_delta_s is not None and v.ttft_p50_delta_s < -0.01   # host hits faster than as misses
    assert v.net_s_per_min is not None and v.net_s_per_min > 0


@pytest.mark.slow
def test_verdict_costs_where_stores_are_almost_never_loaded_back() -> None:
    """Unique 2,048-token prompts, one in 40 a repeat: 15k blocks offloaded, 329 loaded back."""
    v, truth = _with_and_without(unique_prompts(250, 2048, repeat_every=40), 65536)
    assert truth < -0.5                   # the tier lengthened the run by 1.2 s
    assert v.says == "costs"
    assert v.loaded_blocks > 0
    assert v.stored_blocks > 40 * v.loaded_blocks
    assert v.net_s == pytest.approx(truth, rel=0.25)
    assert v.net_s_per_min is not None and v.net_s_per_min < 0
    assert "lost per minute" in v.text()


@pytest.mark.slow
def test_verdict_idle_where_nothing_comes_back() -> None:
    v, truth = _with_and_without(unique_prompts(250, 2048), 65536)
    assert v.says == "idle" and v.loaded_blocks == 0 and v.stored_blocks > 10_000
    assert truth < -0.5                   # idle is not free: its stores cost the run time
    assert v.spent_s == pytest.approx(-truth, rel=0.25)
    assert v.text().startswith("host tier: idle, ")


def test_iteration_fit_recovers_the_engine_prices() -> None:
    """Iteration times made from known prices, exactly: the fit gives them back; too few iterations, or prompt
    tokens that never vary, give no measurement."""
    fit = IterationFit()
    rng = random.Random(3)
    for _ in range(MIN_FIT_ITERATIONS + 10):
        ctx, gen, on, off = rng.randrange(0, 8192), rng.randrange(0, 64), rng.randrange(0, 40), rng.randrange(0, 40)
        fit.add(0.004 + 21.5e-6 * ctx + 60e-6 * gen + 90e-6 * on + 85e-6 * off, ctx, gen, on, off)
    coef = fit.solve()
    assert coef is not None
    assert coef["prefill_token"] == pytest.approx(21.5e-6, rel=1e-6)
    assert coef["onboard_block"] == pytest.approx(90e-6, rel=1e-6)
    assert coef["offload_block"] == pytest.approx(85e-6, rel=1e-6)
    assert coef["intercept"] == pytest.approx(0.004, rel=1e-6)

    few = IterationFit()
    for _ in range(MIN_FIT_ITERATIONS - 1):
        few.add(0.01, rng.randrange(1, 8192), 4)
    assert few.solve() is None
    flat = IterationFit()
    for _ in range(MIN_FIT_ITERATIONS + 5):
        flat.add(0.01 + rng.random() * 1e-3, 2048, rng.randrange(1, 9))
    assert flat.solve() is None           # no spread in prompt tokens: no prefill price
    assert "onboard_block" not in (coef_no_moves := _fit_without_moves()) and coef_no_moves["prefill_token"] > 0


def _fit_without_moves() -> dict[str, float]:
    fit = IterationFit()
    for i in range(MIN_FIT_ITERATIONS):
        fit.add(0.002 + 2e-5 * (i * 97 % 4096), i * 97 % 4096, 8)
    coef = fit.solve()
    assert coef is not None
    return coef


def test_says_none_unknown_and_the_cost_model_basis() -> None:
    ev = TierEvidence()
    none = decide("host", 0, 0, 0, ev, 0, None, 0, None, None, 32)
    assert (none.says, none.saved_s, none.net_s) == ("none", None, None)
    assert none.to_json()["says"] == "none" and none.text() == "no host tier"
    unknown = decide("host", 100, 50, 200, ev, 0, None, 0, None, None, 32, lambda: "no cost model for model x")
    assert unknown.says == "unknown" and "no cost model for model x" in unknown.basis

    # attached: no iteration times, a model kvtop knows: the cost model prices 50 loads and 200 stores
    m = TierModel()
    src = SourceId(host="n", rank=0, run="r")
    m.apply(make("meta", {"engine": "trtllm", "model": "Qwen/Qwen3-8B", "gpu": "NVIDIA H200",
                          "tokens_per_block": 32, "secondary_blocks": 1000, "primary_blocks": 100}, src, 1.0))
    m.apply(make("stats", {"iter": 1, "kvCacheStats": {"maxNumBlocks": 1100, "freeNumBlocks": 50,
                                                        "tokensPerBlock": 32, "reusedBlocks": 0,
                                                        "missedBlocks": 0},
                           "kvCacheIterationStats": {"0": {"iterOffloadBlocks": 200, "iterOnboardBlocks": 50}}},
                  src, 61.0))
    v = m.verdict["host"]
    assert (v.loaded_blocks, v.stored_blocks) == (50, 200)
    assert v.basis.startswith("estimated: ") and "cost model: Qwen/Qwen3-8B on the H200 profile" in v.basis
    # a 32-token block of Qwen3-8B: ~0.7 ms of prefill against ~90 us to load it; 4x as many stores
    assert 0.5e-3 * 50 < v.saved_s < 1.5e-3 * 50
    assert v.says == ("pays" if v.net_s > 0 else "costs")
    assert v.net_s_per_min == pytest.approx(v.net_s, rel=1e-9)   # a 60 s span


def test_ttft_by_prefix_source_classes_and_json() -> None:
    """Each finished request counted once, in its class (disk over host over GPU over miss), warm-up apart."""
    m = TierModel(warmup_requests=1)
    src = SourceId(host="n", rank=0, run="r")
    m.apply(make("meta", {"engine": "sim", "tokens_per_block": 32}, src, 0.0))
    rows = [(0.5, 4, 0, 0),      # warm-up: in no class
            (0.010, 4, 0, 0), (0.012, 6, 0, 0), (0.030, 5, 2, 0), (0.034, 5, 5, 0), (0.090, 0, 0, 0),
            (0.110, 0, 0, 0), (0.100, 0, 0, 0), (0.050, 6, 1, 2)]
    for i, (ttft, reused, host, disk) in enumerate(rows):
        m.apply(make("request", {"request_id": i, "ok": True, "ttft_s": ttft, "prompt_tokens": 256,
                                 "reused_blocks": reused, "host_hit_blocks": host, "disk_hit_blocks": disk},
                     src, 1.0 + i))
    m.apply(make("request", {"request_id": 99, "ok": False, "error": "x", "reused_blocks": 0}, src, 20.0))
    by = m.summary()["requests"]["ttft_ms_by_source"]
    assert set(by) == {"gpu_hit", "host_hit", "disk_hit", "miss"}
    assert (by["gpu_hit"]["count"], by["host_hit"]["count"], by["disk_hit"]["count"], by["miss"]["count"]) == \
        (2, 2, 1, 3)
    assert by["miss"]["p50"] == pytest.approx(100.0) and by["miss"]["p99"] == pytest.approx(110.0)
    assert by["gpu_hit"]["p50"] == pytest.approx(10.0) and by["host_hit"]["p99"] == pytest.approx(34.0)
    # now is t=20 (the failed request): the window [10, 20] holds none of them
    assert by["miss"]["window"] == {"count": 0, "p50": None, "p99": None}
    json.dumps(m.summary())                     # the whole summary stays JSON


@pytest.mark.slow
def test_headless_run_gives_the_three_classes_and_a_verdict() -> None:
    """The issue's bar, on the simulator as fast as it goes: all three classes with requests, host hits faster
    than misses at p50, the host tier pays; with --host-cache 0 it says none."""
    def run(host: str) -> dict[str, Any]:
        out = subprocess.run([sys.executable, "-m", "kvtop", "--engine", "sim", "--headless", "--json",
                              "--duration", "4", "--speed", "0", "--host-cache", host],
                             capture_output=True, text=True, timeout=180, cwd=REPO)
        return json.loads(out.stdout)

    s = run("64GB")
    by = s["requests"]["ttft_ms_by_source"]
    assert all(by[c]["count"] > 0 for c in ("gpu_hit", "host_hit", "miss")), by
    assert by["host_hit"]["p50"] < by["miss"]["p50"]
    host = s["verdict"]["host"]
    assert host["says"] == "pays", host
    assert host["net_s"] > 0 and host["saved_s"] > host["spent_s"]
    assert host["text"].startswith("host tier: pays, ")
    assert run("0")["verdict"]["host"]["says"] == "none"


def test_the_size_advice_says_its_ttft_at_the_verdicts_prices() -> None:
    """Its extra hits a request, each a block loaded instead of computed: 5 points more of 250 requests' lookups."""
    from kvtop.session import Session

    items = zipf_prefix_workload(250, 30, 2048, 64, zipf_s=0.8, max_tokens=16, seed=1)
    session = Session()
    session.model, _ = fold_simulated(items, primary_blocks=1024, secondary_blocks=8192)
    snap = session.model.snapshot()
    v = snap.verdict["host"]
    per_request = 0.05 * snap.hit_rate.lookups / snap.requests.completed   # ~3.3 blocks of ~68 a request
    advice = session._with_ttft({"text": "+1 GiB host: +5.0 pts hits", "extra_hit_points": 5.0, "ttft_ms": None})
    expected = -per_request * (v.prefill_block_s - v.load_block_s) * 1000   # ~-2 ms
    assert advice["ttft_ms"] == pytest.approx(expected, abs=0.06) and advice["ttft_ms"] < -1
    assert advice["text"] == f"+1 GiB host: +5.0 pts hits; ~{expected:+,.0f} ms TTFT a request"
    assert session._with_ttft({"text": "flat", "extra_hit_points": 0.0, "ttft_ms": None})["ttft_ms"] is None


def test_hostile_meta_never_breaks_the_fold(tmp_path: Path) -> None:
    """A model named as a directory whose config.json is 100,000 arrays deep, a GPU profile file that is not one,
    a tensor-parallel size of -3: no price (the verdict says why), and the fold and its snapshot go on."""
    deep = tmp_path / "deep"
    deep.mkdir()
    (deep / "config.json").write_text("[" * 100_000 + "]" * 100_000)
    junk = tmp_path / "junk.json"
    junk.write_text('{"name": 5}')
    for meta in ({"model": str(deep)}, {"model": "Qwen/Qwen3-8B", "gpu": str(junk)},
                 {"model": "Qwen/Qwen3-8B", "gpu": "H200", "tensor_parallel_size": -3}):
        m = TierModel()
        src = SourceId(host="n", rank=0, run="r")
        m.apply(make("meta", {"engine": "trtllm", "tokens_per_block": 32, "secondary_blocks": 100,
                              "primary_blocks": 10, **meta}, src, 1.0))
        m.apply(make("stats", {"iter": 1, "kvCacheStats": {"maxNumBlocks": 110, "freeNumBlocks": 5,
                                                            "tokensPerBlock": 32, "reusedBlocks": 0,
                                                            "missedBlocks": 0},
                               "kvCacheIterationStats": {"0": {"iterOffloadBlocks": 20, "iterOnboardBlocks": 4}}},
                      src, 2.0))
        snap = m.snapshot()
        v = snap.verdict["host"]
        assert m.bad_records == 0
        if meta.get("tensor_parallel_size") == -3:
            assert v.says in ("pays", "costs")     # a bad tp is read as 1, as the engine's default
        else:
            assert v.says == "unknown" and v.basis.startswith("not priced: ")


def test_a_host_pool_of_unknown_size_that_stored_nothing_is_none_seen_not_idle() -> None:
    """A vLLM stream without CPU events or /metrics: nothing says there is a host pool. The verdict read "host
    tier: idle, 0 blocks stored, none loaded back (estimated)", as if there were one; "idle" is a tier that stores
    and gets nothing back. With something stored it is idle as before."""
    from kvtop.tiers.verdict import decide

    unseen = decide("host", -1, 0, 0, None, 0, None, 0, None, None, 16)
    assert (unseen.says, unseen.text(), unseen.short_text()) == (
        "none", "no host tier seen (its size unknown, nothing stored)", "no host tier seen")
    none = decide("host", 0, 0, 0, None, 0, None, 0, None, None, 16)
    assert (none.says, none.text()) == ("none", "no host tier")
    stored = decide("host", -1, 0, 12, None, 0, None, 0, None, None, 16)
    assert (stored.says, stored.text()) == ("idle", "host tier: idle, 12 blocks stored, none loaded back")
