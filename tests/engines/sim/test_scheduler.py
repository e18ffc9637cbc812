"""Capacity scheduler policies of the simulated engine (TensorRT-LLM's capacityScheduler.cpp): GUARANTEED_NO_EVICT
reserves every block a request needs to finish; MAX_UTILIZATION schedules what fits one step and pauses the last
started request when the pool runs out."""

from __future__ import annotations

from typing import Any

import pytest

from kvtop.engines.gpus import resolve_gpu
from kvtop.engines.models import resolve_model
from kvtop.engines.sim.block_manager import BlockManager
from kvtop.engines.sim.core import SimEngineCore, SimRequest

MODEL, GPU = resolve_model("Qwen/Qwen3-8B"), resolve_gpu("H200")


def run(policy: str, stats: list[dict[str, Any]] | None = None, max_input_len: int | None = None,
        trtllm_version: str = "1.2") -> tuple[SimEngineCore, list[SimRequest]]:
    """8 requests at t=0, 64-token prompts sharing nothing (4 blocks of 16 tokens), 100 tokens each, a 40-block
    GPU pool. To finish, a request needs ceil(164 / 16) = 11 blocks: GUARANTEED_NO_EVICT runs 40 // 11 = 3 at once.
    MAX_UTILIZATION starts all 8 (32 blocks), their first decode step takes a block each (64 % 16 == 0: 40),
    and at 80 tokens the pool is out: it pauses requests from the end of the list."""
    bm = BlockManager(40, 0, 16)
    core = SimEngineCore(MODEL, GPU, bm, max_batch_size=16, max_num_tokens=4096, enable_iter_req_stats=True,
                         capacity_scheduler_policy=policy, max_input_len=max_input_len,
                         trtllm_version=trtllm_version)
    done: list[SimRequest] = []
    for i in range(8):
        core.submit(SimRequest(i, [1000 * i + k for k in range(64)], 100, arrival_s=0.0, on_finish=done.append))
    while not core.idle():
        core.step()
        assert bm.num_free_blocks(0) >= 0
        for s in core.take_stats():
            if stats is not None:
                stats.append(s)
    return core, done


def test_guaranteed_no_evict_reserves_blocks_to_completion() -> None:
    core, done = run("GUARANTEED_NO_EVICT")
    assert core.max_scheduled == 3 and core.paused_total == 0
    assert core.completed == 8 and core.failed == 0
    assert core.bm.missed_blocks == 32 and core.bm.reused_blocks == 0  # each prompt computed once
    assert core.iteration == 300


def test_max_utilization_admits_more_and_pauses_when_blocks_run_out() -> None:
    stats: list[dict[str, Any]] = []
    core, done = run("MAX_UTILIZATION", stats)
    assert core.max_scheduled == 8  # all eight at once, against 3
    assert core.paused_total == 5 and sorted(r.paused_count for r in done) == [0, 0, 0, 1, 1, 1, 1, 1]
    assert core.completed == 8 and core.failed == 0
    # a paused request's prompt (its 64 tokens + what it generated) is looked up again on resumption: 7 of its
    # blocks were still cached, 32 more were recomputed
    assert core.bm.reused_blocks == 7 and core.bm.missed_blocks == 64
    assert core.iteration == 183 and core.now_s < run("GUARANTEED_NO_EVICT")[0].now_s
    # the pauses are in the iteration stats as TensorRT-LLM reports them
    assert sum(s["inflightBatchingStats"]["numPausedRequests"] for s in stats) == 5
    assert any(r["paused"] for s in stats for r in s["requestStats"])
    # outputs do not depend on the policy: every request generated its 100 tokens, the same ones
    by_id = {r.request_id: r.output_ids for r in run("GUARANTEED_NO_EVICT")[1]}
    assert all(len(r.output_ids) == 100 and r.output_ids == by_id[r.request_id] for r in done)


@pytest.mark.parametrize("version", ["1.2", "1.3"])
def test_a_paused_prompt_resumes_capped_at_max_input_len(version: str) -> None:
    """TensorRT-LLM 1.x (the emulated 1.2 and 1.3): MAX_UTILIZATION pauses with ``req.pause(self.max_input_len)``
    (py_executor.py ``_pause_requests``) and ``LlmRequest::pause`` keeps min(maxInputLen, prompt + generated)
    tokens as the prompt. Uncapped, the 5 paused requests resume with their 64 prompt tokens and the 17 to 97 they
    had generated; with max_input_len 72 every resumed prompt is 72 tokens, the generated tokens past it are
    decoded again, so the pool runs out again: 10 pauses (one request 3 times) and 282 iterations against 5 and
    183. The outputs are the same 100 tokens each (greedy decoding: a token dropped by the cap comes back)."""
    capped, done = run("MAX_UTILIZATION", max_input_len=72, trtllm_version=version)
    free, free_done = run("MAX_UTILIZATION", trtllm_version=version)
    assert sorted(r.num_prompt_tokens for r in free_done if r.paused_count) == [81, 81, 97, 129, 161]
    assert sorted((r.paused_count, r.num_prompt_tokens) for r in done if r.paused_count) == [
        (1, 72), (1, 72), (2, 72), (3, 72), (3, 72)]
    assert (capped.paused_total, capped.iteration) == (10, 282)
    assert (free.paused_total, free.iteration) == (5, 183)
    by_id = {r.request_id: r.output_ids for r in free_done}
    assert all(len(r.output_ids) == 100 and r.output_ids == by_id[r.request_id] for r in done)
    # a cap above every paused prompt changes nothing
    same, _ = run("MAX_UTILIZATION", max_input_len=164, trtllm_version=version)
    assert (same.paused_total, same.iteration, same.bm.reused_blocks, same.bm.missed_blocks) == (5, 183, 7, 64)


def test_simllm_caps_a_paused_prompt_at_its_max_input_len() -> None:
    """SimLLM takes TensorRT-LLM's ``max_input_len`` (default 1,024, as LlmArgs) down to the engine core."""
    from kvtop.engines.sim.llm import SimLLM

    with SimLLM("Qwen/Qwen3-0.6B", speed=0) as llm:   # shut down after: its engine thread would outlive the test
        assert llm._core.max_input_len == 1024
    with SimLLM("Qwen/Qwen3-0.6B", speed=0, max_input_len=72) as llm:
        assert llm._core.max_input_len == 72
    with pytest.raises(ValueError, match="max_input_len"):
        run("MAX_UTILIZATION", max_input_len=0)


def test_scheduling_remove_sequence_counts_blocks_no_one_else_holds() -> None:
    """``schedulingRemoveSequence``: a block shared by two requests becomes free only when both are released."""
    bm = BlockManager(20, 0, 4)
    shared = list(range(8))  # two full blocks
    bm.add_sequence("a", shared + [100, 101, 102])
    bm.store_context_blocks("a")
    assert bm.add_sequence("b", shared + [200, 201, 202]) == 8
    refs: dict[int, int] = {}
    assert bm.scheduling_remove_sequence("b", refs) == 1  # only its own third block
    assert bm.scheduling_remove_sequence("a", refs) == 3  # its own, and the two shared ones now
    assert bm.num_free_blocks(0) == 16  # a trial: nothing was released


def test_unknown_policy_is_rejected() -> None:
    with pytest.raises(ValueError, match="capacity_scheduler_policy"):
        SimEngineCore(MODEL, GPU, BlockManager(8, 0, 16), capacity_scheduler_policy="STATIC_BATCH")


# ---------------------------------------------------------------------------------------------- the LLM API surface

def test_simllm_takes_trtllm_scheduler_config() -> None:
    from kvtop.engines.sim import CapacitySchedulerPolicy, KvCacheConfig, SamplingParams, SchedulerConfig, SimLLM

    kvc = KvCacheConfig(max_tokens=40 * 16, tokens_per_block=16)
    with SimLLM(kv_cache_config=kvc, speed=0, max_batch_size=16,
                scheduler_config=SchedulerConfig(capacity_scheduler_policy=CapacitySchedulerPolicy.MAX_UTILIZATION)
                ) as llm:
        outs = llm.generate([[1000 * i + k for k in range(64)] for i in range(8)], SamplingParams(max_tokens=100))
        assert [len(o.outputs[0].token_ids) for o in outs] == [100] * 8
        assert llm.describe()["capacity_scheduler_policy"] == "MAX_UTILIZATION"
        assert llm._core.paused_total == 5 and llm._core.max_scheduled == 8  # as the core alone above
    assert SchedulerConfig(capacity_scheduler_policy="GUARANTEED_NO_EVICT").capacity_scheduler_policy is \
        CapacitySchedulerPolicy.GUARANTEED_NO_EVICT
    with pytest.raises(ValueError, match="STATIC_BATCH is not simulated"):
        SchedulerConfig(capacity_scheduler_policy=CapacitySchedulerPolicy.STATIC_BATCH)
    with pytest.raises(ValueError, match="capacity_scheduler_policy: must be one of"):
        SchedulerConfig(capacity_scheduler_policy="FIFO")


def test_transfer_mode_takes_trtllm_names_and_says_the_file_tier_is_not_modelled() -> None:
    from kvtop.engines.sim import KvCacheConfig, KvCacheRetentionConfig, KvCacheTransferMode, SamplingParams, SimLLM

    class PybindMode:  # what tensorrt_llm.bindings.executor.KvCacheTransferMode.GDS looks like: a name
        name = "GDS"

    TR = KvCacheRetentionConfig.TokenRangeRetentionConfig
    for mode in ("GDS", "gds", 1, KvCacheTransferMode.GDS, PybindMode()):
        assert KvCacheRetentionConfig([TR(0, None, 80)], transfer_mode=mode).transfer_mode is KvCacheTransferMode.GDS
    assert KvCacheRetentionConfig(transfer_mode="POSIX_DEBUG_FALLBACK").transfer_mode == 2
    with pytest.raises(ValueError, match="transfer_mode: must be one of DRAM, GDS, POSIX_DEBUG_FALLBACK"):
        KvCacheRetentionConfig(transfer_mode="NVME")
    # without a directory TensorRT-LLM falls back to DRAM: nothing to say
    assert KvCacheRetentionConfig(transfer_mode="GDS").not_modelled() is None
    file_tier = KvCacheRetentionConfig([TR(0, None, 80)], transfer_mode="GDS", directory="/mnt/nvme/kv")
    note = file_tier.not_modelled()
    assert note is not None and "GDS" in note and "/mnt/nvme/kv" in note and "not modelled" in note
    with SimLLM(kv_cache_config=KvCacheConfig(max_tokens=4096), speed=0) as llm:
        with pytest.warns(UserWarning, match="file tier's copy cost is not modelled"):
            llm.generate([1, 2, 3], SamplingParams(max_tokens=2), kv_cache_retention_config=file_tier)
        assert llm.describe()["not_modelled"] == [note]  # in the meta record: headless and JSON summaries


@pytest.mark.slow
def test_kvtop_sim_replays_a_trace_under_either_policy() -> None:
    """``kvtop sim --capacity-scheduler-policy``: the shipped trace slice on a 8,000-block GPU pool (8 GB host).
    GUARANTEED_NO_EVICT never pauses; MAX_UTILIZATION pauses 3 requests, which look their own blocks up again on
    resumption (hence more reuse), and finishes in fewer iterations. Requests that arrive while another computes
    their first new block wait for it (beneficialToSkip): 2,250 -> 2,586 blocks reused under GUARANTEED_NO_EVICT,
    4,818 -> 5,154 under MAX_UTILIZATION, and 3,659 -> 3,657 / 3,579 -> 3,578 iterations. Since the token budget is
    the micro-batch scheduler's (a context it leaves out is not allocated: docs/trtllm-kv.md 9.4), MAX_UTILIZATION
    pauses 3, not 4, and reuses 4,599 blocks, not 5,154."""
    import json

    from test_sim_sweep import SLICE, run_kvtop

    runs = {}
    for policy in ("GUARANTEED_NO_EVICT", "MAX_UTILIZATION"):
        done = run_kvtop(["sim", "--trace", str(SLICE), "--host-cache", "8GB", "--gpu-blocks", "8000",
                          "--capacity-scheduler-policy", policy, "--json"], SLICE.parent)
        assert done.returncode == 0, done.stderr
        runs[policy] = json.loads(done.stdout)["runs"][0]
    no_evict, max_util = runs["GUARANTEED_NO_EVICT"], runs["MAX_UTILIZATION"]
    assert (no_evict["requests"], no_evict["failed"], no_evict["paused"]) == (499, 0, 0)
    assert (max_util["requests"], max_util["failed"], max_util["paused"]) == (499, 0, 3)
    # simulated time: the cost model's (3,657 / 3,578 before the step's per-layer kernels and the decode KV read
    # rate by size, issue 12 part 2: Qwen3-8B's 36 layers, batches of a few requests); 3,645 -> 3,646 when the
    # schedulers began to walk the active list in submission order (tests/engines/sim/test_capacity_scheduler_port.py),
    # 3,647 with the micro-batch scheduler's token budget
    assert (no_evict["iterations"], max_util["iterations"]) == (3647, 3566)
    assert (no_evict["reused_blocks"], max_util["reused_blocks"]) == (2586, 4599)


def test_max_utilization_keeps_paused_requests_within_the_batch() -> None:
    """A paused request keeps its place in the active list: the walk reaches new requests only after every
    earlier one was scheduled, so at most max_batch_size requests are ever active, paused ones included (as
    TensorRT-LLM's executor, which fetches new requests up to that many active ones)."""
    bm = BlockManager(24, 0, 16)
    core = SimEngineCore(MODEL, GPU, bm, max_batch_size=4, max_num_tokens=4096,
                         capacity_scheduler_policy="MAX_UTILIZATION")
    for i in range(8):
        core.submit(SimRequest(i, [1000 * i + k for k in range(64)], 100, arrival_s=0.0))
    most_active = 0
    while not core.idle():
        core.step()
        most_active = max(most_active, len(core.running))
    assert core.completed == 8 and core.paused_total > 0
    assert most_active == 4


@pytest.mark.slow
def test_headless_summary_names_the_scheduler(tmp_path: Any) -> None:
    """``--capacity-scheduler-policy`` reaches the simulator and the headless summary (text and JSON)."""
    import json

    from test_sim_sweep import run_kvtop

    args = ["--engine", "sim", "--headless", "--duration", "0.5", "--speed", "0", "--gpu-cache", "4096",
            "--scenario", "ab", "--concurrency", "1", "--max-tokens", "4", "--capacity-scheduler-policy",
            "MAX_UTILIZATION"]
    done = run_kvtop([*args, "--json"], tmp_path)
    assert done.returncode == 0, done.stderr
    s = json.loads(done.stdout)
    assert s["capacity_scheduler_policy"] == "MAX_UTILIZATION" and s["not_modelled"] == []
    done = run_kvtop(args, tmp_path)
    assert done.returncode == 0 and "scheduler MAX_UTILIZATION" in done.stdout.splitlines()[0]


# beneficialToSkip (TensorRT-LLM cpp/tensorrt_llm/batch_manager/capacityScheduler.cpp: beneficialToSkip,
# oneManagerBeneficialToSkip, prefillWithChunkedContextsAlreadyExecuting; the block is WindowBlockManager::
# findNewContextBlock in kvCacheManager.cpp). Prompts of 80 tokens, 16-token blocks: a 64-token shared prefix is
# 4 full blocks, each request's own 16 tokens a fifth.
PREFIX = list(range(64))


def _prompt(own: int, prefix: list[int] = PREFIX) -> list[int]:
    return prefix + [10_000 + 100 * own + k for k in range(16)]


def _first_iterations(policy: str, prompts: list[list[int]], arrivals: list[float] | None = None,
                      max_num_tokens: int = 4096) -> tuple[SimEngineCore, list[SimRequest]]:
    bm = BlockManager(200, 0, 16)
    core = SimEngineCore(MODEL, GPU, bm, max_batch_size=16, max_num_tokens=max_num_tokens,
                         capacity_scheduler_policy=policy)
    reqs = [SimRequest(i, p, 4, arrival_s=(arrivals or [0.0] * len(prompts))[i]) for i, p in enumerate(prompts)]
    for r in reqs:
        core.submit(r)
    while not core.idle():
        if not core.has_runnable():  # idle until the next arrival, as the trace replay does (offline.py)
            core.now_s = max(core.now_s, core.next_arrival_s() or 0.0)
        core.step()
    return core, reqs


@pytest.mark.parametrize("policy", ["GUARANTEED_NO_EVICT", "MAX_UTILIZATION"])
def test_a_request_waits_one_iteration_to_reuse_what_an_earlier_one_computes(policy: str) -> None:
    """Three requests arrive together, two sharing a 4-block prefix. TensorRT-LLM schedules the first, skips the
    second (its first new block, the prefix's first, is the one the first is about to compute) and schedules the
    third (another prefix); the next iteration the second reuses the first's 4 blocks. Before: both computed the
    prefix, 0 blocks reused."""
    other = [50_000 + k for k in range(64)]
    core, (a, b, c) = _first_iterations(policy, [_prompt(1), _prompt(2), _prompt(3, other)])
    assert (a.first_iter, b.first_iter, c.first_iter) == (0, 1, 0)
    assert (a.reused_tokens, b.reused_tokens, c.reused_tokens) == (0, 64, 0)
    assert (a.reused_blocks, b.reused_blocks, c.reused_blocks) == (0, 4, 0)
    assert core.bm.reused_blocks == 4


def test_only_the_first_new_block_counts() -> None:
    """With the prefix's 4 blocks in the tree, two requests whose first new blocks differ (their own 16 tokens)
    both start at once; two whose first new block is the one the first of them computes (its tokens 64-79, then
    tails of their own) wait. A context stores only the blocks of its first prompt_len - 1 tokens (the last token
    has no KV yet), so that 5th block reaches the tree when its first request finishes, not when its context does:
    the first waiting one starts the next iteration without it (64 tokens reused) and computes it again (the two
    waiting share it as their first new block, so the second waits once more), then stores it with its own
    context (96 tokens: 5 full blocks); the second reuses 80."""
    warm = _prompt(0)
    same_fifth = [_prompt(1) + [20_000 + k for k in range(16)], _prompt(1) + [30_000 + k for k in range(16)]]
    core, reqs = _first_iterations("GUARANTEED_NO_EVICT", [warm, _prompt(1), _prompt(2), *same_fifth],
                                   arrivals=[0.0, 1.0, 1.0, 1.0, 1.0])
    # the warm-up ran alone; the rest arrived after it finished and found its prefix
    assert reqs[0].first_iter == 0
    later = reqs[1:]
    first = min(r.first_iter for r in later)  # type: ignore[type-var]
    assert [r.first_iter - first for r in later] == [0, 0, 1, 2]  # type: ignore[operator]
    assert [r.reused_tokens for r in later] == [64, 64, 64, 80]


def test_a_chunked_context_still_running_holds_its_first_new_block() -> None:
    """A 2,048-token prompt prefilled in 512-token chunks (max_num_tokens 512): a request with the same first
    block arriving while its chunks run is skipped until the first has stored its blocks, then reuses them
    (prefillWithChunkedContextsAlreadyExecuting)."""
    long_prompt = list(range(2048))
    follower = long_prompt[:1024] + [90_000 + k for k in range(16)]
    core, (a, b) = _first_iterations("GUARANTEED_NO_EVICT", [long_prompt, follower], arrivals=[0.0, 1e-9],
                                     max_num_tokens=512)
    assert a.first_iter == 0
    assert b.first_iter == 4  # after a's 4 chunks (iterations 0-3) stored its 128 blocks
    assert b.reused_tokens == 1024


def test_no_skipping_without_block_reuse() -> None:
    """isEnableBlockReuse() false: beneficialToSkip never skips (there is nothing to reuse)."""
    bm = BlockManager(200, 0, 16, enable_block_reuse=False)
    core = SimEngineCore(MODEL, GPU, bm, max_batch_size=16, max_num_tokens=4096)
    reqs = [SimRequest(i, _prompt(i), 4, arrival_s=0.0) for i in range(3)]
    for r in reqs:
        core.submit(r)
    core.step()
    assert [r.first_iter for r in reqs] == [0, 0, 0]
