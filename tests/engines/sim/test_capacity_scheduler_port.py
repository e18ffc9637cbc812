"""TensorRT-LLM's own capacity-scheduler tests, ported to kvtop's engine loop, and the cases they leave out.

The tables below are TensorRT-LLM's (cpp/tests/unit_tests/batch_manager/capacitySchedulerTest.cpp, each test named
where it is used): ``ExpectedState{itBegin, itEnd, activeIds, scheduledState}`` with ``RequestState{id,
maxNewTokens, promptLen, numGenTokensBegin, contextCurrentPosition}``. Its ``runTest`` drives the scheduler one
iteration at a time: a context finishes in one iteration and yields a token, a generation step adds one token,
paused requests are released (``removeSequence``) and ``pause``d (their generated tokens join the prompt), and
``maxInputLen`` is 1,000 (no cap). ``drive`` below runs kvtop's ``SimEngineCore`` the same way and reads the same
quantities back, so each table is asserted as it stands there, every iteration of it.

Not portable: the chunked tests (``setContextChunkSize`` gives each request its own chunk; kvtop chunks by the
iteration's token budget), the priority tests (kvtop keeps arrival order), draft tokens, cross attention, sink
tokens and disaggregated requests.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from kvtop.engines.gpus import resolve_gpu
from kvtop.engines.models import resolve_model
from kvtop.engines.sim.block_manager import BlockManager
from kvtop.engines.sim.core import MAX_UTILIZATION, SimEngineCore, SimRequest

MODEL, GPU = resolve_model("Qwen/Qwen3-8B"), resolve_gpu("H200")
MAX_UTIL, NO_EVICT = MAX_UTILIZATION, "GUARANTEED_NO_EVICT"
TPB = 10  # kvCacheTokensPerBlock in every test ported here


@dataclass(frozen=True)
class State:
    """ExpectedState: the active requests (in the active list's order) and the scheduled ones, each with its
    (maxNewTokens, promptLen, numGenTokensBegin, contextCurrentPosition) at ``it_begin``."""
    it_begin: int
    it_end: int
    active: tuple[int, ...]
    scheduled: dict[int, tuple[int, int, int, int]]


@dataclass
class Run:
    core: SimEngineCore
    requests: dict[int, SimRequest]
    # per iteration: active ids, scheduled ids, and each request's RequestState at the iteration's start
    active: list[tuple[int, ...]]
    scheduled: list[tuple[int, ...]]
    states: list[dict[int, tuple[int, int, int, int]]]
    paused: list[tuple[int, ...]]


def _request_state(r: SimRequest) -> tuple[int, int, int, int]:
    moved = r.num_prompt_tokens - r.prompt_len  # generated tokens a pause moved into the prompt
    return (r.max_tokens - moved, r.num_prompt_tokens, len(r.output_ids) - moved, r.context_done)


def drive(policy: str, kv_tokens: int, max_requests: int, prompts: list[list[int]], max_new: int, *,
          reuse: bool = False, max_tokens_per_seq: int = 90,
          arrive: dict[int, list[tuple[int, list[int]]]] | None = None) -> Run:
    """``runTest`` with kvtop's engine: a pool of ``kv_tokens / 10`` blocks of 10 tokens, ``maxNumRequests``
    requests at once, prompts of token ids; ``arrive`` maps an iteration to the (id, prompt) added before it (as
    ``addNewRequestsCb``). A scheduled request yields one token per iteration (no prompt here is chunked: the token
    budget is far above every batch), so the scheduled set is the set of requests that got a token."""
    bm = BlockManager(kv_tokens // TPB, 0, TPB, enable_block_reuse=reuse)
    core = SimEngineCore(MODEL, GPU, bm, max_batch_size=max_requests, max_num_tokens=8192,
                         max_seq_len=max_tokens_per_seq, capacity_scheduler_policy=policy,
                         enable_iter_perf_stats=False)
    got_token: list[int] = []
    requests: dict[int, SimRequest] = {}

    def submit(rid: int, prompt: list[int]) -> None:
        requests[rid] = SimRequest(rid, prompt, max_new, arrival_s=core.now_s,
                                   on_token=lambda r: got_token.append(r.request_id))
        core.submit(requests[rid])
        assert requests[rid].error is None, requests[rid].error

    for rid, prompt in enumerate(prompts):
        submit(rid, prompt)
    run = Run(core, requests, [], [], [], [])
    while not core.idle():
        for rid, prompt in (arrive or {}).get(core.iteration, []):
            submit(rid, prompt)
        live = [r for r in requests.values() if not r.finished]
        run.active.append(tuple(r.request_id for r in live))
        run.states.append({r.request_id: _request_state(r) for r in live})
        pauses = {r.request_id: r.paused_count for r in live}
        got_token.clear()
        core.step()
        run.scheduled.append(tuple(sorted(got_token)))
        run.paused.append(tuple(sorted(rid for rid, n in pauses.items() if requests[rid].paused_count > n)))
        assert bm.num_free_blocks(0) >= 0
    assert core.failed == 0
    return run


def check(run: Run, expected: list[State], iterations: int) -> None:
    """runTest's checks: every iteration of every range, the request states at each range's first iteration, and
    the number of iterations."""
    assert len(run.scheduled) == iterations
    for e in expected:
        for it in range(e.it_begin, e.it_end):
            assert run.active[it] == e.active, f"iteration {it}: active"
            assert run.scheduled[it] == tuple(sorted(e.scheduled)), f"iteration {it}: scheduled"
        got = {rid: run.states[e.it_begin][rid] for rid in e.scheduled}
        assert got == e.scheduled, f"iteration {e.it_begin}: request states"


def ones(n: int) -> list[int]:
    return [1] * n  # createRequest(promptLen, ...): a prompt of n tokens, all 1


def iota(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


# ---------------------------------------------------------------------------------------------------- no reuse

def test_simple_doesnt_fit_max_utilization() -> None:
    """capacitySchedulerTest.cpp ``SimpleDoesntFitMaxUtilization`` (sinkTokenLen 0): 10 blocks, two 10-token
    prompts, 80 new tokens each. At iteration 41 both hold 5 blocks (50 tokens) and request 0's next token needs a
    sixth: request 1, the last started, is paused and resumes at iteration 80 with its 41 generated tokens as
    prompt (51 tokens, 39 new), done at 119."""
    run = drive(MAX_UTIL, 100, 2, [ones(10), ones(10)], 80)
    check(run, [State(0, 41, (0, 1), {0: (80, 10, 0, 0), 1: (80, 10, 0, 0)}),
                State(41, 80, (0, 1), {0: (80, 10, 41, 10)}),
                State(80, 119, (1,), {1: (39, 51, 0, 0)})], 119)
    assert [it for it, p in enumerate(run.paused) if p] == [41] and run.paused[41] == (1,)
    assert run.core.paused_total == 1


def test_simple_doesnt_fit_guaranteed_completion() -> None:
    """``SimpleDoesntFitGuaranteedCompletion``: the same two requests under GUARANTEED_NO_EVICT: each needs 9
    blocks to finish, so they run one after the other, 160 iterations."""
    run = drive(NO_EVICT, 100, 2, [ones(10), ones(10)], 80)
    check(run, [State(0, 80, (0, 1), {0: (80, 10, 0, 0)}), State(80, 160, (1,), {1: (80, 10, 0, 0)})], 160)


def test_simple_doesnt_fit_adding_new_requests_max_utilization() -> None:
    """``SimpleDoesntFitAddingNewRequestsMaxUtilization`` (sinkTokenLen 0): two more requests join at iteration
    10. Out of blocks at 21 (requests 3 then 2 paused, the last started first), at 41 (request 1), at 90 (request
    2 again) and at 139 (request 3 again); 227 iterations."""
    run = drive(MAX_UTIL, 100, 4, [ones(10), ones(10)], 80, arrive={10: [(2, ones(10)), (3, ones(10))]})
    check(run, [State(0, 10, (0, 1), {0: (80, 10, 0, 0), 1: (80, 10, 0, 0)}),
                State(10, 21, (0, 1, 2, 3), {0: (80, 10, 10, 10), 1: (80, 10, 10, 10), 2: (80, 10, 0, 0),
                                             3: (80, 10, 0, 0)}),
                State(21, 41, (0, 1, 2, 3), {0: (80, 10, 21, 10), 1: (80, 10, 21, 10)}),
                State(41, 80, (0, 1, 2, 3), {0: (80, 10, 41, 10)}),
                State(80, 90, (1, 2, 3), {1: (39, 51, 0, 0), 2: (69, 21, 0, 0)}),
                State(90, 119, (1, 2, 3), {1: (39, 51, 10, 51)}),
                State(119, 139, (2, 3), {2: (59, 31, 0, 0), 3: (69, 21, 0, 0)}),
                State(139, 178, (2, 3), {2: (59, 31, 20, 31)}),
                State(178, 227, (3,), {3: (49, 41, 0, 0)})], 227)
    assert {it: p for it, p in enumerate(run.paused) if p} == {21: (2, 3), 41: (1,), 90: (2,), 139: (3,)}


def test_simple_doesnt_fit_adding_new_requests_guaranteed_completion() -> None:
    """``SimpleDoesntFitAddingNewRequestsGuaranteedCompletion``: one request at a time, 320 iterations."""
    run = drive(NO_EVICT, 100, 4, [ones(10), ones(10)], 80, arrive={10: [(2, ones(10)), (3, ones(10))]})
    check(run, [State(0, 10, (0, 1), {0: (80, 10, 0, 0)}),
                State(10, 80, (0, 1, 2, 3), {0: (80, 10, 10, 10)}),
                State(80, 160, (1, 2, 3), {1: (80, 10, 0, 0)}),
                State(160, 240, (2, 3), {2: (80, 10, 0, 0)}),
                State(240, 320, (3,), {3: (80, 10, 0, 0)})], 320)


@pytest.mark.parametrize("policy", [MAX_UTIL, NO_EVICT])
def test_simple_should_fit(policy: str) -> None:
    """``SimpleShouldFit``: 20 blocks, two requests of 9 blocks each run side by side, 80 iterations."""
    run = drive(policy, 200, 2, [ones(10), ones(10)], 80)
    check(run, [State(0, 80, (0, 1), {0: (80, 10, 0, 0), 1: (80, 10, 0, 0)})], 80)


def test_max_utilization_no_reuse_when_disabled() -> None:
    """``MaxUtilizationNoReuseWhenDisabled``: block reuse off, two equal 20-token prompts start together (nothing
    to wait for), 5 iterations, no block reused."""
    run = drive(MAX_UTIL, 100, 2, [iota(20), iota(20)], 5, max_tokens_per_seq=50)
    check(run, [State(0, 5, (0, 1), {0: (5, 20, 0, 0), 1: (5, 20, 0, 0)})], 5)
    assert run.core.bm.reused_blocks == 0


# ---------------------------------------------------------------------------------------------------- with reuse

@pytest.mark.parametrize("policy", [MAX_UTIL, NO_EVICT])
def test_delay_duplicate_request(policy: str) -> None:
    """``DelayDuplicateRequest``: three equal 21-token prompts; the first computes, the other two wait an
    iteration (beneficialToSkip) and reuse its 2 full blocks each: 3 iterations, 4 blocks reused."""
    run = drive(policy, 200, 3, [iota(21)] * 3, 2, reuse=True, max_tokens_per_seq=50)
    check(run, [State(0, 1, (0, 1, 2), {0: (2, 21, 0, 0)}),
                State(1, 2, (0, 1, 2), {0: (2, 21, 1, 21), 1: (2, 21, 0, 0), 2: (2, 21, 0, 0)}),
                State(2, 3, (1, 2), {1: (2, 21, 1, 21), 2: (2, 21, 1, 21)})], 3)
    assert run.core.bm.reused_blocks == 4


@pytest.mark.parametrize("policy", [MAX_UTIL, NO_EVICT])
def test_delay_five_requests_complicated(policy: str) -> None:
    """``DelayFiveRequestsComplicated``: two prompts of their own (11 and 21 tokens) and three sharing a system
    prompt (11, 21, 31 tokens). Requests 3 and 4 each wait one iteration more than the one before them (each
    one's first new block is the one the previous is computing); 82 iterations, 3 blocks reused."""
    prompts = [iota(11, 1), iota(21, 2), iota(11), iota(21), iota(31)]
    run = drive(policy, 1000, 5, prompts, 80, reuse=True, max_tokens_per_seq=150)
    check(run, [State(0, 1, (0, 1, 2, 3, 4), {0: (80, 11, 0, 0), 1: (80, 21, 0, 0), 2: (80, 11, 0, 0)}),
                State(1, 2, (0, 1, 2, 3, 4), {0: (80, 11, 1, 11), 1: (80, 21, 1, 21), 2: (80, 11, 1, 11),
                                              3: (80, 21, 0, 0)}),
                State(2, 80, (0, 1, 2, 3, 4), {0: (80, 11, 2, 11), 1: (80, 21, 2, 21), 2: (80, 11, 2, 11),
                                               3: (80, 21, 1, 21), 4: (80, 31, 0, 0)}),
                State(80, 81, (3, 4), {3: (80, 21, 79, 21), 4: (80, 31, 78, 31)}),
                State(81, 82, (4,), {4: (80, 31, 79, 31)})], 82)
    assert run.core.bm.reused_blocks == 3


@pytest.mark.parametrize("kv_tokens", [150, 50])
def test_max_utilization_delays_a_duplicate_and_reuses(kv_tokens: int) -> None:
    """``MaxUtilizationMultipleRequestsIncrementalReuse`` (150 tokens) and ``MaxUtilizationUnderMemoryPressure
    WithReuse`` (50 tokens, 5 blocks): two equal 20-token prompts, the second a step behind, reusing the first's
    stored block (its first 19 tokens: one full block); 6 iterations."""
    run = drive(MAX_UTIL, kv_tokens, 4 if kv_tokens == 150 else 2, [iota(20), iota(20)], 5, reuse=True,
                max_tokens_per_seq=50 if kv_tokens == 150 else 40)
    check(run, [State(0, 1, (0, 1), {0: (5, 20, 0, 0)}),
                State(1, 5, (0, 1), {0: (5, 20, 1, 20), 1: (5, 20, 0, 0)}),
                State(5, 6, (1,), {1: (5, 20, 4, 20)})], 6)
    assert run.core.bm.reused_blocks == 1


# ------------------------------------------------------------------ what capacitySchedulerTest.cpp does not cover
# Traced by hand through capacityScheduler.cpp (``MaxUtilizationScheduler::operator()``, ``beneficialToSkip``,
# ``GuaranteedNoEvictScheduler::impl``) and py_executor.py (``_fetch_new_requests``); the tree kvtop's block manager
# keeps is TensorRT-LLM's (tests/engines/sim/test_block_manager_golden.py). A = tokens 0-20, B = tokens 0-19 then its
# own 11, C = tokens 1000-1020: A and B share their first two blocks, C shares nothing.
A_PROMPT, B_PROMPT, C_PROMPT = iota(21), iota(20) + iota(10, 100) + [200], iota(21, 1000)


def test_a_request_that_pauses_another_is_skipped_on_its_retry() -> None:
    """MAX_UTILIZATION, 9 blocks, reuse on, 4 tokens each.

    Iteration 0: A registers its first new block and starts (3 blocks); B's first new block is that same one, so
    B is skipped (beneficialToSkip); C starts (3 blocks, 6 used). Iteration 1: the active list is [A, B, C] (B
    keeps its place before C). A needs no block. B's first two blocks are now in the tree (A stored 20 tokens), its
    first new block is its own third, which it registers; it needs 4 blocks and 3 are free, so C, the last started
    request after it, is paused (its 3 blocks count as free: 6). B is tried again without advancing, and
    ``beneficialToSkip`` finds its own block in the set: B is skipped, and only A runs. Iteration 2: B starts (2
    blocks reused, 2 new); C, resuming with 22 tokens, needs 3 of the 2 left and has no started request after it
    to pause. Iteration 3: C resumes and finds all 3 of its blocks (2 full, 1 partial) still cached.

    kvtop before this: the active list put every started request before the waiting ones ([A, C, B]), so at
    iteration 1 B found nothing after it to pause, nothing was paused, and B waited for A and C to finish: it
    started at iteration 4, 8 iterations in all instead of 6."""
    run = drive(MAX_UTIL, 90, 3, [A_PROMPT, B_PROMPT, C_PROMPT], 4, reuse=True)
    assert run.scheduled == [(0, 2), (0,), (0, 1), (0, 1, 2), (1, 2), (1, 2)]
    assert run.paused == [(), (2,), (), (), (), ()]
    assert run.active[:4] == [(0, 1, 2)] * 4
    a, b, c = (run.requests[i] for i in range(3))
    assert (a.first_iter, b.first_iter, c.first_iter) == (0, 2, 0)
    assert (a.last_iter, b.last_iter, c.last_iter) == (3, 5, 5)
    assert c.paused_count == 1 and c.num_prompt_tokens == 22  # its one token joined its prompt
    assert (b.reused_blocks, b.reused_tokens, b.missed_blocks) == (2, 20, 2)
    assert (c.reused_blocks, c.missed_blocks) == (3, 3)  # 3 computed at first, all 3 found on resumption
    assert run.states[3][2] == (3, 22, 0, 0)  # resumed: 3 tokens still to make, 22-token prompt


@pytest.mark.parametrize("policy", [MAX_UTIL, NO_EVICT])
def test_only_max_batch_size_requests_are_active(policy: str) -> None:
    """max_batch_size 2, A twice, then C, 90 blocks (room for all). TensorRT-LLM's executor fetches requests only
    up to max_num_active_requests active ones: [A, A'] are active, C is still in the queue. A starts, A' is
    skipped (it waits for A's blocks), so one request runs although two may: C is not there to take the slot. A'
    starts at iteration 1 with A's blocks; C is fetched when A finishes (iteration 3) and starts at 4. kvtop
    before: C was taken from the queue at once and started at iteration 0."""
    run = drive(policy, 900, 2, [A_PROMPT, A_PROMPT, C_PROMPT], 4, reuse=True)
    assert [r.first_iter for r in run.requests.values()] == [0, 1, 4]
    assert run.scheduled == [(0,), (0, 1), (0, 1), (0, 1), (1, 2), (2,), (2,), (2,)]
    assert run.requests[1].reused_blocks == 2


def test_needed_blocks_do_not_count_reuse_as_in_1_2() -> None:
    """``MaxUtilizationReuseReducesNeededBlocksOneStep`` tests what main added after 1.2 (PR #11490: reusable
    blocks taken off ``getNeededBlocksOneStep``): 6 blocks, two equal 30-token prompts, and there the second starts
    at iteration 1 needing 1 new block (3 less the 2 it reuses), 6 iterations. In 1.2, as in kvtop, it needs all 3
    while the first holds 3 and its first decode step takes a fourth: it waits until the first finishes
    (iteration 4) and starts at 5, finding 3 blocks (2 full, 1 partial) of the first's 34 stored tokens; 10
    iterations."""
    run = drive(MAX_UTIL, 60, 3, [iota(30), iota(30)], 5, reuse=True, max_tokens_per_seq=50)
    check(run, [State(0, 5, (0, 1), {0: (5, 30, 0, 0)}), State(5, 10, (1,), {1: (5, 30, 0, 0)})], 10)
    assert run.core.bm.reused_blocks == 3 and run.core.paused_total == 0


# ---------------------------------------------------------------------- the micro-batch scheduler (token budget)
# microBatchScheduler.cpp ``MicroBatchScheduler::operator()`` with chunked prefill (FIRST_COME_FIRST_SERVED, chunk
# unit = tokens_per_block), then ``addSequence`` only for the contexts it schedules and
# ``LlmRequest::setPrepopulatedPromptLen`` for what they find cached. In 1.2 a first chunk is charged its whole
# prompt (the lookup comes after scheduling; main subtracts the reusable tokens since PR #11637, Mar 2026:
# microBatchSchedulerTest.cpp ``ReusableTokensReduceComputeBudget``, whose first half is 1.2's behaviour).

def _engine(blocks: int, tpb: int, max_num_tokens: int) -> SimEngineCore:
    return SimEngineCore(MODEL, GPU, BlockManager(blocks, 0, tpb), max_batch_size=8, max_num_tokens=max_num_tokens,
                         max_seq_len=4096, enable_iter_perf_stats=True)


def test_a_first_chunk_is_charged_its_whole_prompt_however_much_is_cached() -> None:
    """4 prompts of 48 tokens (16-token blocks), each run once, then all 4 again at once with 64 tokens a batch.
    Each finds 47 tokens cached and computes 1, but the budget charges 48: the first gets 48, the second the 16
    left (a whole block), the other two nothing, so they are not scheduled, not even allocated, and run the next
    iteration. kvtop before: all four were admitted and, charged 1 token each, ran in one iteration."""
    core = _engine(64, 16, 64)
    prompts = [[1000 * i + k for k in range(48)] for i in range(4)]
    for i, p in enumerate(prompts):  # warm-up, one at a time
        core.submit(SimRequest(i, p, 1, arrival_s=core.now_s))
        while not core.idle():
            core.step()
    core.take_stats()
    again = [SimRequest(10 + i, p, 1, arrival_s=core.now_s) for i, p in enumerate(prompts)]
    for r in again:
        core.submit(r)
    first = core.iteration
    core.step()
    assert [core.bm.has_request(r.request_id) for r in again] == [False, False, False, False]  # 2 done, 2 not begun
    assert [r.finished for r in again] == [True, True, False, False]
    assert [r.first_iter for r in again[2:]] == [None, None]
    while not core.idle():
        core.step()
    assert [r.first_iter - first for r in again] == [0, 0, 1, 1]  # type: ignore[operator]
    assert [r.reused_tokens for r in again] == [47] * 4
    stats = core.take_stats()
    assert [(s["inflightBatchingStats"]["numContextRequests"], s["inflightBatchingStats"]["numCtxTokens"])
            for s in stats] == [(2, 2), (2, 2)]


def test_a_partial_chunk_is_whole_blocks_and_a_context_that_gets_none_waits_unallocated() -> None:
    """A 100-token prompt and a 20-token one, 16-token blocks, 40 tokens a batch. The first is charged 100 and
    gets 40 cut to 32 (2 blocks); the second would get the 8 left, cut to 0: it is not scheduled and holds no
    block. Then 32 again (68 left), then the last 36 (the rest of its prompt: not cut), which leaves 4 for the
    second: cut to 0 again. The second runs alone at iteration 3. kvtop before: 40, 40, then the first's last 20
    beside the second's 20, the second admitted (its 2 blocks allocated) at iteration 0."""
    core = _engine(64, 16, 40)
    a, b = SimRequest(0, list(range(100)), 2, arrival_s=0.0), SimRequest(1, list(range(500, 520)), 2, arrival_s=0.0)
    core.submit(a)
    core.submit(b)
    chunks = []
    while not core.idle():
        core.step()
        if core.iteration == 1:
            assert not core.bm.has_request(1) and b.first_iter is None
        chunks += [s["inflightBatchingStats"]["numCtxTokens"] for s in core.take_stats()]
    assert chunks[:4] == [32, 32, 36, 20]
    assert (a.first_iter, b.first_iter) == (0, 3)
    assert a.context_done == 100 and b.context_done == 20


@pytest.mark.parametrize(("blocks", "c_at_2"), [(20, 0), (21, 16)])
def test_no_evict_weighs_a_chunked_context_in_list_order(blocks: int, c_at_2: int) -> None:
    """GUARANTEED_NO_EVICT, 16-token blocks, 64 tokens a batch. A (96 tokens), B (A's first block + 24 of its own),
    C (160 tokens of its own) arrive together. Iteration 0: A starts, 64 tokens; B waits for A's first block
    (beneficialToSkip); C is admitted but the budget is spent, so it is not scheduled. Iteration 1: A's last 32, C's
    first 32 (B still waits: A's context is still running). Iteration 2: the list is [A, B, C]; A generates and
    reserves its last block; B and C are both pending (``GuaranteedNoEvictScheduler::impl``), in that order: B takes
    3 blocks, and with 20 blocks that leaves C's last one (it needs 11 to finish, holds 10) unavailable, so the pass
    ends at C and C's context waits an iteration with 23 tokens of budget left; with 21 blocks C goes on (16 tokens,
    the budget cut to a block). kvtop before (20 blocks): C was allocated at iteration 0, and every started request
    reserved first, so at iteration 2 C went on (63 tokens) and B started at 3."""
    core = _engine(blocks, 16, 64)
    a = SimRequest(0, list(range(96)), 2, arrival_s=0.0)
    b = SimRequest(1, list(range(16)) + list(range(5000, 5024)), 2, arrival_s=0.0)
    c = SimRequest(2, list(range(9000, 9160)), 2, arrival_s=0.0)
    for r in (a, b, c):
        core.submit(r)
    per_iteration = []
    while not core.idle():
        before = [r.context_done for r in (a, b, c)]
        core.step()
        per_iteration.append([r.context_done - n for r, n in zip((a, b, c), before)])
    assert per_iteration[:3] == [[64, 0, 0], [32, 0, 32], [0, 40, c_at_2]]  # B: 16 reused, 24 computed
    assert (a.first_iter, b.first_iter, c.first_iter) == (0, 2, 1)
    assert b.reused_tokens == 16 and c.context_done == 160


def test_iteration_stats_count_fetched_requests_as_active() -> None:
    """py_executor.py ``_get_init_iter_stats``: ``numActiveRequests`` is ``len(self.active_requests)`` (fetched,
    started or not), ``numNewActiveRequests`` the requests fetched this iteration, ``numQueuedRequests`` the request
    queue's size. 5 requests at t=0, max_batch_size 3, 8 blocks of 16 tokens: each needs 6 to finish, so one runs
    at a time. Iteration 0 fetches 3 (1 starts): 3 new, 3 active, 2 queued; then 3 active, 2 queued, none new,
    until the first finishes and a fourth is fetched. kvtop before: 1 new, 1 active, 4 queued (it counted only
    started requests as active)."""
    core = SimEngineCore(MODEL, GPU, BlockManager(8, 0, 16), max_batch_size=3, max_num_tokens=4096,
                         enable_iter_perf_stats=True)
    reqs = [SimRequest(i, [100 * i + k for k in range(64)], 20, arrival_s=0.0) for i in range(5)]
    for r in reqs:
        core.submit(r)
    while not core.idle():
        core.step()
    stats = core.take_stats()
    counts = [(s["numNewActiveRequests"], s["numActiveRequests"], s["numQueuedRequests"]) for s in stats]
    assert counts[:2] == [(3, 3, 2), (0, 3, 2)]
    assert counts[19:21] == [(0, 3, 2), (1, 3, 1)]  # request 0 finished at 19: request 3 fetched at 20
    assert sum(n for n, _, _ in counts) == 5 and max(a for _, a, _ in counts) == 3
    assert reqs[0].last_iter == 19 and reqs[1].first_iter == 20
