"""The simulated engine loop: in-flight batching over the block manager, timed by the cost model.

Synchronous and deterministic: ``step()`` runs one iteration the way TensorRT-LLM's PyTorch executor does
(refresh timed priorities, schedule, allocate, one forward pass, store context blocks, release finished
requests, record iteration stats, flush KV events), and advances the simulated clock by what that iteration
costs. ``SimLLM`` wraps it in TensorRT-LLM's ``LLM`` surface and paces it to the wall clock; trace replays drive
it directly, as fast as possible.

Scheduling follows one of TensorRT-LLM's capacity policies (``CapacitySchedulerPolicy``, capacityScheduler.cpp):

- GUARANTEED_NO_EVICT (the default): a waiting request starts only when the GPU pool's free blocks (idle cached
  blocks count as free), less the blocks that running requests still need to finish, cover every block it will
  need to finish (``getRemainingBlocksToCompletion``: ceil((prompt + max_tokens) / tokens_per_block)). Running
  requests always run.
- MAX_UTILIZATION: each iteration walks the active requests in arrival order and schedules each one whose next
  step fits (``getNeededBlocksOneStep``: the whole prompt's blocks for a request not started, one block when a
  decode step crosses a block boundary, else 0) in the free blocks counted at the start of scheduling. When one
  does not fit, the last started request (from the end of the list) is paused and its blocks that no other
  request holds count as free (``schedulingRemoveSequence``), and the same request is tried again. A paused
  request's KV is released for reuse (``removeSequence``), its generated tokens become part of its prompt
  (``LlmRequest::pause``), and it is scheduled again, prefill first, when its blocks fit: what is still cached
  is reused, the rest recomputed. So more requests run at once than GUARANTEED_NO_EVICT admits, at the cost of
  recomputation when the pool runs out. On resumption the paused prompt is capped at ``max_input_len`` as the
  emulated TensorRT-LLM caps it (``LlmRequest::pause(maxInputLen)``: 1.2 and 1.3, see ``PAUSE_CAPS_PROMPT``): the
  generated tokens past the cap are dropped and generated again (docs/trtllm-kv.md 9.2).

Both policies skip, for this iteration, a request about to start its first context chunk whose first block not
in the reuse tree is one that a request scheduled before it in this pass (or a chunked context still running) is
about to compute (``beneficialToSkip``, capacityScheduler.cpp): the next iteration it reuses those blocks instead
of computing them a second time. A request that arrives with others sharing its prefix waits one iteration and
hits (docs/trtllm-kv.md 9.1).

Both walk TensorRT-LLM's active request list: the requests its executor fetched, in submission order, started,
paused and not yet started ones interleaved, at most ``max_batch_size`` of them (py_executor.py
``_fetch_new_requests`` fetches only up to ``max_num_active_requests`` active ones); the rest wait in its queue. A
request passed over by ``beneficialToSkip`` keeps its place before later ones (docs/trtllm-kv.md 9.3). At most
``max_batch_size`` requests are scheduled at once, and one iteration computes at most ``max_num_tokens`` tokens,
shared as TensorRT-LLM's micro-batch scheduler shares them with ``enable_chunked_prefill`` (FIRST_COME_FIRST_SERVED,
chunks of whole blocks but a prompt's last): a context asks for the rest of its prompt, all of it at its first
chunk however much is cached (1.2 looks the prompt up only after scheduling), and a context that gets nothing is not
scheduled; a first chunk allocates all of the prompt's KV blocks, and only a scheduled one (docs/trtllm-kv.md 9.4).
"""


from __future__ import annotations

import datetime as _dt
from bisect import insort
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from kvtop.engines.gpus import GpuProfile
from kvtop.engines.models import ModelShape
from kvtop.engines.sim.accel import add_token_each
from kvtop.engines.sim.block_manager import NO_FREE_GPU_BLOCK, BlockManager, NoFreeBlockError, TokenRuns
from kvtop.engines.sim.cost import CostModel
from kvtop.engines.sim.iteration_stats import STATS_VERSIONS, IterationStatsV13
from kvtop.engines.sim.retention import KvCacheRetentionConfig

GUARANTEED_NO_EVICT = "GUARANTEED_NO_EVICT"
MAX_UTILIZATION = "MAX_UTILIZATION"
CAPACITY_SCHEDULER_POLICIES = (GUARANTEED_NO_EVICT, MAX_UTILIZATION)
# (tensorrt_llm/llmapi/llm_args.py CapacitySchedulerPolicy values; STATIC_BATCH is not simulated)

# Whether the emulated TensorRT-LLM caps a paused request's prompt at max_input_len when it resumes. Both emulated
# versions do: the PyTorch executor's V1 path calls ``req.pause(self.max_input_len)`` (py_executor.py
# ``_pause_requests``, 1.x, and main's V1 path still does), whose C++ ``LlmRequest::pause(maxInputLen)``
# (cpp/include/tensorrt_llm/batch_manager/llmRequest.h) sets ``newPromptLen = min(maxInputLen, mPromptLen +
# getMaxNumGeneratedTokens())``. Only main's KV cache manager V2 recompute pause is uncapped
# (``_UNBOUNDED_PAUSE_MAX_INPUT_LEN``, PR #15252, Jun 2026), and kvtop does not emulate V2.
PAUSE_CAPS_PROMPT = {"1.2": True, "1.3": True}

GENERATED_TOKEN_BASE = 1 << 30  # generated ids live in [2^30, 2^31): never a tokenizer id nor a trace token
GENERATED_TOKEN_MASK = GENERATED_TOKEN_BASE - 1


def by_order(req: SimRequest) -> int:
    return req.order


def generated_token(prompt_digest: int, position: int) -> int:
    """Deterministic output: the same prompt always generates the same tokens (greedy decoding)."""
    return GENERATED_TOKEN_BASE | (hash((prompt_digest, position)) & GENERATED_TOKEN_MASK)


@dataclass
class SimRequest:
    request_id: int
    prompt_ids: list[int]
    max_tokens: int
    arrival_s: float
    retention: KvCacheRetentionConfig | None = None
    on_token: Callable[[SimRequest], None] | None = None      # called on the engine's side after each token
    on_finish: Callable[[SimRequest], None] | None = None
    # filled in by the engine
    digest: int = 0
    stage: str = "QUEUED"
    scheduled_s: float | None = None
    fetched_s: float | None = None   # when the executor first took it into its active list (_fetched)
    first_token_s: float | None = None
    last_token_s: float | None = None
    first_iter: int | None = None
    last_iter: int | None = None
    context_done: int = 0            # prompt tokens whose KV exists (reused + prefilled so far)
    reused_tokens: int = 0
    output_ids: list[int] = field(default_factory=list)
    alloc_total_blocks: int = 0
    alloc_new_blocks: int = 0
    reused_blocks: int = 0
    missed_blocks: int = 0
    onboarded_blocks: int = 0        # reused blocks that came from the host tier (host hits)
    error: str | None = None
    # The engine's own bookkeeping, set by submit() and kept up to date by step(): prompt length, blocks needed to
    # finish, and the block manager's view of the request (tokens with KV, blocks held). Mirrored here so that an
    # iteration reads attributes instead of calling into the block manager once per running request.
    num_prompt_tokens: int = field(default=0, repr=False, compare=False)
    blocks_to_completion: int = field(default=0, repr=False, compare=False)
    kv_tokens: int = field(default=0, repr=False, compare=False)
    kv_blocks: int = field(default=0, repr=False, compare=False)
    # MAX_UTILIZATION: times this request was paused; its prompt for the block manager on resumption (the prompt
    # and the tokens generated before the pause), None while it was never paused
    paused_count: int = 0
    kv_prompt: Any = field(default=None, repr=False, compare=False)
    # Submission order: TensorRT-LLM's active request list is kept in the order requests were fetched (FIFO), and
    # both capacity schedulers walk it in that order, started, paused and not yet started requests interleaved.
    order: int = field(default=0, repr=False, compare=False)
    # kvtop.engines.sim.decode_accel's generation state (its engine only): the first decode iteration, and the
    # generated tokens and KV tokens at its start; tokens output_ids[:decode_fed] are in the block manager
    decode_iter: int = field(default=0, repr=False, compare=False)
    decode_out0: int = field(default=0, repr=False, compare=False)
    decode_kv0: int = field(default=0, repr=False, compare=False)
    decode_fed: int = field(default=0, repr=False, compare=False)

    @property
    def prompt_len(self) -> int:
        return len(self.prompt_ids)

    @property
    def finished(self) -> bool:
        return self.stage in ("GENERATION_COMPLETE", "FAILED")


class SimEngineCore:
    def __init__(self, model: ModelShape, gpu: GpuProfile, block_manager: BlockManager, *,
                 max_batch_size: int = 2048, max_num_tokens: int = 8192, max_seq_len: int = 40960,
                 enable_iter_perf_stats: bool = True, enable_iter_req_stats: bool = False,
                 max_stats_len: int = 1000, gpu_mem_usage_bytes: int = 0, epoch_s: float = 0.0,
                 trtllm_version: str = "1.2", capacity_scheduler_policy: str = GUARANTEED_NO_EVICT,
                 tensor_parallel_size: int = 1, max_input_len: int | None = None):
        """``max_input_len``: the cap a paused request's prompt gets on resumption where the emulated version caps it
        (``PAUSE_CAPS_PROMPT``); None = none (a trace replay sets none: its prompts run past TensorRT-LLM's
        default of 1,024, which the PyTorch backend admits, as it checks only ``max_seq_len``)."""
        if capacity_scheduler_policy not in CAPACITY_SCHEDULER_POLICIES:
            raise ValueError(f"capacity_scheduler_policy: must be one of {', '.join(CAPACITY_SCHEDULER_POLICIES)}, "
                             f"got {capacity_scheduler_policy!r}")
        if max_batch_size <= 0:
            raise ValueError(f"max_batch_size: must be > 0, got {max_batch_size}")
        if max_num_tokens <= 0:
            raise ValueError(f"max_num_tokens: must be > 0, got {max_num_tokens}")
        if max_num_tokens < block_manager.tokens_per_block:
            # a chunk that is not the rest of its prompt is a whole number of blocks: below one block, a prompt
            # longer than the budget could never be scheduled
            raise ValueError(f"max_num_tokens ({max_num_tokens}) must be at least tokens_per_block "
                             f"({block_manager.tokens_per_block})")
        self.model = model
        self.gpu = gpu
        self.bm = block_manager
        self.cost = CostModel(model, gpu, tensor_parallel_size=tensor_parallel_size)
        self.tpb = block_manager.tokens_per_block
        self.max_batch_size = max_batch_size
        self.max_num_tokens = max_num_tokens
        self.max_seq_len = max_seq_len
        self.enable_iter_perf_stats = enable_iter_perf_stats
        self.enable_iter_req_stats = enable_iter_req_stats
        self.stats: deque[dict[str, Any]] = deque(maxlen=max_stats_len)  # drain-once, oldest dropped
        self.gpu_mem_usage_bytes = gpu_mem_usage_bytes
        self.epoch_s = epoch_s  # wall-clock time of simulated time 0, for the stats' timestamp strings
        # 1.3 adds kvCacheIterationStats to every stats dict (iteration_stats.py says where the shape comes from)
        if trtllm_version not in STATS_VERSIONS:
            raise ValueError(f"trtllm_version: must be one of {', '.join(STATS_VERSIONS)}, got {trtllm_version!r}")
        self.trtllm_version = trtllm_version
        if max_input_len is not None and max_input_len <= 0:
            raise ValueError(f"max_input_len: must be > 0, got {max_input_len}")
        self.max_input_len = max_input_len
        self._pause_cap = max_input_len if PAUSE_CAPS_PROMPT[trtllm_version] else None
        self._kv_iter = (IterationStatsV13(block_manager, model.kv_bytes_per_block(self.tpb))
                         if trtllm_version == "1.3" else None)
        self.now_s = 0.0
        self.iteration = 0
        self.waiting: deque[SimRequest] = deque()
        self.running: list[SimRequest] = []  # started (and, MAX_UTILIZATION, paused) requests, in submission order
        self._submitted = 0
        self.completed = 0
        self.failed = 0
        self.busy_s = 0.0
        self.capacity_scheduler_policy = capacity_scheduler_policy
        self.paused_total = 0       # pauses so far (MAX_UTILIZATION)
        self.max_scheduled = 0      # the most requests scheduled in one iteration
        self._paused_now: list[SimRequest] = []  # paused in the current iteration (for its stats)
        self._blocked: SimRequest | None = None  # the request that ended the last scheduling pass, not fitting
        self._fetched_now: list[SimRequest] = []  # this iteration's fetched requests not started before it
        self._new_fetched: list[SimRequest] = []  # ...of which fetched for the first time (numNewActiveRequests)
        # How many of the scheduled requests, from the first, are the generation requests (all of them), where the
        # capacity scheduler put them first (GUARANTEED_NO_EVICT); None: mixed in (MAX_UTILIZATION)
        self._gen_first: int | None = None

    # ------------------------------------------------------------------------------------------ intake

    def blocks_to_completion(self, req: SimRequest) -> int:
        return -(-(req.prompt_len + req.max_tokens) // self.tpb)

    def submit(self, req: SimRequest) -> None:
        """Queue a request; one that can never run fails at once with a reason (as TensorRT-LLM rejects it)."""
        prompt = req.prompt_ids
        if isinstance(prompt, TokenRuns):
            # A trace prompt (kvtop sim --trace): the digest of its runs, which are maximal, so equal prompts still
            # get equal digests and equal outputs. Hashing a tuple of its ids instead would create every id as an
            # int: 61M of them in the synthetic trace, 3.5 s of a 16 s replay. No counter can tell the difference:
            # generated ids (>= 2^30) never equal trace prompt ids (< 2^30), so a key holding generated ids only
            # ever meets an equal key under the same tree node, which takes an identical prompt, whose digest is
            # the same either way. (SimLLM's list prompts keep the tuple digest: their outputs are visible.)
            req.digest = hash(prompt.runs)
        else:
            req.digest = hash(tuple(prompt))
        req.num_prompt_tokens = len(prompt)
        req.blocks_to_completion = self.blocks_to_completion(req)
        self._submitted += 1
        req.order = self._submitted
        problem = None
        if req.prompt_len == 0:
            problem = "the prompt is empty"
        elif req.max_tokens <= 0:
            problem = f"max_tokens must be > 0, got {req.max_tokens}"
        elif req.prompt_len + req.max_tokens > self.max_seq_len:
            problem = (f"prompt length ({req.prompt_len}) + max_tokens ({req.max_tokens}) exceeds max_seq_len "
                       f"({self.max_seq_len})")
        elif self.blocks_to_completion(req) > self.bm.primary_blocks:
            problem = (f"the request needs {self.blocks_to_completion(req)} KV cache blocks but the GPU pool has "
                       f"{self.bm.primary_blocks}")
        if problem:
            self._fail(req, problem)
            return
        self.waiting.append(req)

    def _fail(self, req: SimRequest, reason: str) -> None:
        req.error = reason
        req.stage = "FAILED"
        self.failed += 1
        if req.on_finish:
            req.on_finish(req)

    # ------------------------------------------------------------------------------------------ loop

    def has_runnable(self) -> bool:
        return bool(self.running) or bool(self.waiting and self.waiting[0].arrival_s <= self.now_s)

    def next_arrival_s(self) -> float | None:
        return self.waiting[0].arrival_s if self.waiting else None

    def idle(self) -> bool:
        return not self.running and not self.waiting

    def _admit(self, req: SimRequest) -> None:
        """``addSequence`` for a request scheduled for its first context chunk (new, or resumed after a pause)."""
        bm = self.bm
        before = (bm.alloc_total_blocks, bm.alloc_new_blocks, bm.reused_blocks, bm.missed_blocks,
                  bm.onboarded_blocks)
        prompt = req.kv_prompt if req.kv_prompt is not None else req.prompt_ids
        reused = bm.add_sequence(req.request_id, prompt, req.retention)
        # per-request counters add up over resumptions (a resumed request looks its prompt up again)
        req.alloc_total_blocks += bm.alloc_total_blocks - before[0]
        req.alloc_new_blocks += bm.alloc_new_blocks - before[1]
        req.reused_blocks += bm.reused_blocks - before[2]
        req.missed_blocks += bm.missed_blocks - before[3]
        req.onboarded_blocks += bm.onboarded_blocks - before[4]
        if req.kv_prompt is None:
            req.reused_tokens = reused
            req.scheduled_s = self.now_s
            req.first_iter = self.iteration
        req.kv_tokens = req.num_prompt_tokens
        req.kv_blocks = bm.num_blocks(req.request_id)
        req.context_done = reused
        req.stage = "CONTEXT_IN_PROGRESS"

    def _schedule(self) -> list[SimRequest]:
        """The capacity scheduler's fitting requests, in the active list's order (paused ones already paused)."""
        self._gen_first = None
        if self.capacity_scheduler_policy == MAX_UTILIZATION:
            return self._schedule_max_utilization()
        return self._schedule_no_evict()

    def _micro_batch(self, fitting: list[SimRequest]) -> tuple[list[SimRequest], list[tuple[SimRequest, int]]]:
        """``MicroBatchScheduler::operator()`` with chunked prefill (FIRST_COME_FIRST_SERVED, chunk unit = a block),
        then ``addSequence`` for the contexts it schedules: (generation requests, [(context, tokens to compute)]).

        Every generation request takes one token of ``max_num_tokens``. A context asks for what is left of its
        prompt (all of it before its first chunk: the reuse lookup happens after scheduling, so 1.2 charges a
        request the whole prompt whatever is cached); when they do not all fit, each in turn gets what is left of
        the budget, cut down to whole blocks unless it is the rest of its prompt. A context that gets 0 is not
        scheduled: a first chunk is then not allocated at all (TensorRT-LLM allocates KV only for the scheduled
        batch, ``prepare_resources``) and tries again next iteration. A first chunk that finds tokens cached starts
        after them and stops at a block boundary within its chunk (``LlmRequest::setPrepopulatedPromptLen``)."""
        n_gen = self._gen_first
        if n_gen is not None:  # GUARANTEED_NO_EVICT put every generation request first: cut, not sorted
            gen = fitting[:n_gen]
            contexts = fitting[n_gen:]
        else:
            gen = []
            contexts = []
            for r in fitting:
                if r.stage == "GENERATION_IN_PROGRESS":
                    gen.append(r)
                else:
                    contexts.append(r)
        capacity = max(self.max_num_tokens - len(gen), 0)
        asked = [r.num_prompt_tokens - r.context_done for r in contexts]  # context_done: 0 before the first chunk
        if sum(asked) <= capacity:
            sizes = asked
        else:
            tpb = self.tpb
            sizes = []
            for want in asked:
                size = min(want, capacity)
                if size != want:
                    size = size // tpb * tpb
                sizes.append(size)
                capacity -= size
        chunks: list[tuple[SimRequest, int]] = []
        new: list[SimRequest] = []
        for r, size in zip(contexts, sizes):
            if size <= 0:
                continue
            if r.stage == "QUEUED":
                new.append(r)
            chunks.append((r, size))
        self._start(new)
        out: list[tuple[SimRequest, int]] = []
        for r, size in chunks:
            if r.stage != "CONTEXT_IN_PROGRESS":  # new, or resumed after a pause: addSequence
                try:
                    self._admit(r)
                except NoFreeBlockError as exc:
                    # The capacity scheduler counted these blocks free, so this is a safety net (TensorRT-LLM
                    # would throw): the request fails, the run goes on.
                    self.bm.remove_sequence(r.request_id)
                    self.running[:] = [x for x in self.running if x is not r]  # in place: step() holds the list
                    self._fail(r, f"out of KV cache blocks at allocation: {exc}")
                    continue
                cached = r.context_done
                if cached and cached + size < r.num_prompt_tokens:
                    size = (cached + size) // self.tpb * self.tpb - cached
                else:
                    size = min(size, r.num_prompt_tokens - cached)
            out.append((r, size))
        return gen, out

    def _fetched(self) -> list[SimRequest]:
        """The arrived requests not yet started that TensorRT-LLM's executor has in its active list: it fetches new
        requests, in order, only up to ``max_num_active_requests`` (``max_batch_size``) active ones, started and
        paused included (py_executor.py ``_fetch_new_requests``: ``total_max_num_active_requests -
        total_num_active_requests``). Since it fetches in order and only started requests leave the queue, they are
        the head of ``waiting``."""
        room = self.max_batch_size - len(self.running)
        fetched: list[SimRequest] = []
        now = self.now_s
        if room > 0:
            for req in self.waiting:
                if req.arrival_s > now or len(fetched) >= room:
                    break
                fetched.append(req)
                if req.fetched_s is None:
                    req.fetched_s = now
                    self._new_fetched.append(req)
        self._fetched_now = fetched
        return fetched

    @staticmethod
    def _in_order(started: list[SimRequest], fetched: list[SimRequest]) -> list[SimRequest]:
        """Merge two lists that are each in submission order (Timsort merges the two runs in linear time)."""
        if not started:
            return fetched
        if not fetched or started[-1].order < fetched[0].order:
            return started + fetched
        return sorted(started + fetched, key=by_order)

    def _start(self, started: list[SimRequest]) -> None:
        """Move requests that start this iteration from ``waiting`` to ``running``, keeping submission order: a
        request passed over (``beneficialToSkip``) starts after later ones did and goes back to its place."""
        if not started:
            return
        gone = {id(r) for r in started}
        waiting = self.waiting
        head: list[SimRequest] = []
        while gone and waiting:  # the started requests are among the fetched ones: the head of the queue
            req = waiting.popleft()
            if id(req) in gone:
                gone.discard(id(req))
            else:
                head.append(req)
        waiting.extendleft(reversed(head))
        running = self.running
        for req in started:  # in order themselves
            if running and running[-1].order > req.order:
                insort(running, req, key=by_order)
            else:
                running.append(req)

    def _needed_blocks_one_step(self, req: SimRequest) -> int:
        """``getNeededBlocksOneStep`` for beam width 1 and no draft tokens."""
        if req.stage in ("QUEUED", "PAUSED"):  # context init, first chunk: every block of the prompt
            return -(-req.num_prompt_tokens // self.tpb)
        if req.stage == "GENERATION_IN_PROGRESS":  # addToken allocates when the tokens with KV fill their blocks
            return 1 if req.kv_tokens % self.tpb == 0 else 0
        return 0  # a context past its first chunk: its blocks were all allocated at the first

    def _contributed_context_blocks(self) -> set[Any] | None:
        """``prefillWithChunkedContextsAlreadyExecuting``: the first new block of every chunked context still
        running (past its first chunk), which later requests would rather reuse than compute; None where block
        reuse is off (``beneficialToSkip`` is then never true)."""
        bm = self.bm
        if not bm.enable_block_reuse:
            return None
        contributed = set()
        for req in self.running:
            if req.stage == "CONTEXT_IN_PROGRESS":
                block = bm.find_new_context_block(req.kv_prompt if req.kv_prompt is not None else req.prompt_ids)
                if block is not None:
                    contributed.add(block)
        return contributed

    def _beneficial_to_skip(self, req: SimRequest, contributed: set[Any] | None) -> bool:
        """``beneficialToSkip`` for a request about to start its first context chunk (new, or resumed after a
        pause): True when its first block not in the reuse tree is one another request already contributes in
        this scheduling pass; otherwise its own first new block is added to ``contributed`` (whether or not it
        is scheduled after this: TensorRT-LLM adds it before the capacity check)."""
        if contributed is None or req.stage not in ("QUEUED", "PAUSED"):
            return False
        block = self.bm.find_new_context_block(req.kv_prompt if req.kv_prompt is not None else req.prompt_ids)
        if block is None:
            return False
        if block in contributed:
            return True
        contributed.add(block)
        return False

    def _schedule_max_utilization(self) -> list[SimRequest]:
        """MAX_UTILIZATION (``MaxUtilizationScheduler::operator()``), then the pauses it decided: the requests that
        fit this iteration, in the active list's order."""
        bm = self.bm
        # the active list in TensorRT-LLM's order: started, paused and fetched requests as they were submitted
        active = self._in_order(self.running, self._fetched())
        contributed = self._contributed_context_blocks()
        free = bm.num_free_blocks(0)  # startScheduling
        scheduling_refs: dict[int, int] = {}
        scheduled: list[SimRequest] = []
        paused: list[SimRequest] = []
        self._blocked = None
        used = 0
        end = len(active)
        i = 0
        while i < end:
            req = active[i]
            # Checked on every visit, as TensorRT-LLM does: a request that did not fit, and so paused a started one,
            # added its own first new block on the first visit, so the retry skips it (capacityScheduler.cpp).
            if self._beneficial_to_skip(req, contributed):
                i += 1
                continue
            need = self._needed_blocks_one_step(req)
            if len(scheduled) < self.max_batch_size and used + need <= free:
                used += need
                scheduled.append(req)
                i += 1
                continue
            # pause the last started request (a context past its first chunk, or one generating) at or after i
            j = end - 1
            while j >= i and active[j].stage not in ("CONTEXT_IN_PROGRESS", "GENERATION_IN_PROGRESS"):
                j -= 1
            if j < i:
                self._blocked = req
                break
            free += bm.scheduling_remove_sequence(active[j].request_id, scheduling_refs)
            paused.append(active[j])
            end = j
        for req in paused:
            self._pause(req)
        return scheduled

    def _pause(self, req: SimRequest) -> None:
        """``LlmRequest::pause`` + ``terminateRequest(pause=true)``: release the KV (stored for reuse), move the
        generated tokens into the prompt, back to context init."""
        out = req.output_ids
        self.bm.remove_sequence(req.request_id, final_tokens=out[-1:])
        base = req.prompt_ids
        cap = self._pause_cap
        if cap is not None and len(base) + len(out) > cap:
            # LlmRequest::pause(maxInputLen): the prompt becomes the first min(maxInputLen, prompt + generated)
            # tokens; the generated ones past it are dropped and decoded again (mMaxNewTokens grows by as many). A
            # prompt that alone is longer than the cap loses its tail too (its remaining length is then not
            # modelled: kvtop still stops at max_tokens generated tokens).
            del out[max(0, cap - len(base)):]
            if len(base) > cap:
                base = list(base[:cap])  # a TokenRuns slice is a list too
        if isinstance(base, TokenRuns):
            req.kv_prompt = TokenRuns([*base.runs, *((t, 1) for t in out)])
        else:
            req.kv_prompt = [*base, *out]
        req.num_prompt_tokens = len(req.kv_prompt)
        req.kv_tokens = req.kv_blocks = req.context_done = 0
        req.stage = "PAUSED"
        req.paused_count += 1
        self.paused_total += 1
        self._paused_now.append(req)

    def _schedule_no_evict(self) -> list[SimRequest]:
        """GUARANTEED_NO_EVICT (``GuaranteedNoEvictScheduler::impl``): every generating request runs and reserves
        the blocks it still needs to finish; then the other active requests, in the active list's order (a chunked
        context still running among new ones), each start or go on while the blocks they need to finish fit, and
        the first that does not fit ends the pass."""
        bm = self.bm
        available = bm.num_free_blocks(0)
        scheduled: list[SimRequest] = []
        chunked: list[SimRequest] = []  # contexts past their first chunk: TensorRT-LLM's context-init requests
        for r in self.running:
            if r.stage == "GENERATION_IN_PROGRESS":
                scheduled.append(r)
                available -= r.blocks_to_completion - r.kv_blocks
            else:
                chunked.append(r)
        self._gen_first = len(scheduled)  # the generation requests, first (_micro_batch cuts them off)
        contributed = self._contributed_context_blocks()
        self._blocked = None
        for req in self._in_order(chunked, self._fetched()):
            # only a request about to start its first chunk can be skipped; it waits in its place for the next pass
            if req.stage == "QUEUED" and self._beneficial_to_skip(req, contributed):
                continue
            if len(scheduled) >= self.max_batch_size:
                break
            need = req.blocks_to_completion - req.kv_blocks  # getRemainingBlocksToCompletion
            if need > available:
                self._blocked = req
                break
            available -= need
            scheduled.append(req)
        return scheduled

    def step(self) -> list[SimRequest]:
        """One iteration. Returns the requests that finished in it. Does nothing when nothing can run."""
        if not self.has_runnable():
            return []
        bm = self.bm
        bm.refresh()
        moves_before = (bm.onboarded_blocks, bm.offloaded_blocks)
        self._paused_now = []
        self._new_fetched = []
        scheduled = self._schedule()
        if not scheduled and not self._paused_now:
            # Nothing runs and nothing was paused: the pass ended at a request whose blocks do not fit with nothing
            # left to free (submit() rejects what can never fit an empty pool, so this is a safety net; TensorRT-LLM
            # would wait forever). It fails with the numbers that say why. (Nothing scheduled but some paused:
            # the request that paused them was then skipped, beneficialToSkip; the pauses freed blocks and the
            # next iteration schedules again.)
            head = self._blocked
            if head is None:
                raise RuntimeError(f"iteration {self.iteration}: nothing scheduled, nothing paused and no request "
                                   f"blocked ({len(self.running)} running, {len(self.waiting)} waiting)")
            if self.capacity_scheduler_policy == MAX_UTILIZATION:
                need = f"{self._needed_blocks_one_step(head)} free KV cache blocks for its next step"
            else:
                need = f"{head.blocks_to_completion - head.kv_blocks} free KV cache blocks"
            if head.stage == "QUEUED":  # by identity: == would compare dataclasses field by field
                self.waiting = deque(r for r in self.waiting if r is not head)
            else:
                self.running = [r for r in self.running if r is not head]
                if bm.has_request(head.request_id):  # a chunked context holds its blocks; a paused one none
                    bm.remove_sequence(head.request_id)
            self._fail(head, f"needs {need}, the GPU pool has {bm.num_free_blocks(0)} free of {bm.primary_blocks}")
            return []
        # Token budget: every generation request takes one token; context chunks share the rest.
        gen, chunks = self._micro_batch(scheduled)
        running = self.running
        self.max_scheduled = max(self.max_scheduled, len(gen) + len(chunks))
        # addToken runs before the forward pass: room for the KV of the token being fed.
        tpb = self.tpb
        if gen:
            # add_token for each, in one call (accel.add_token_each): the block manager's work in the same order
            request_ids = [r.request_id for r in gen]
            fed = [r.output_ids[-1] for r in gen]
            i = add_token_each(bm, request_ids, fed)
            if i < len(gen):
                failed_in_decode: list[SimRequest] = []
                while i < len(gen):
                    # Admission reserves every block a request needs to finish, so this is a safety net;
                    # TensorRT-LLM would throw here too. The request fails, the run goes on.
                    r = gen[i]
                    failed_in_decode.append(r)
                    running.remove(r)
                    bm.remove_sequence(r.request_id)
                    self._fail(r, f"out of KV cache blocks during decode: {NO_FREE_GPU_BLOCK}")
                    i = add_token_each(bm, request_ids, fed, i + 1)
                for r in failed_in_decode:
                    gen.remove(r)
        decode_contexts: list[int] = []  # per generation request, the positions its new token attends to
        gen_done: list[SimRequest] = []  # generation requests whose token now is their last
        for r in gen:
            out = r.output_ids
            # add_token allocated a block iff the tokens with KV filled their last block (kv_blocks mirrors it)
            kv_tokens = r.kv_tokens  # = prompt + generated - 1: the positions the fed token attends to
            if kv_tokens % tpb == 0:
                r.kv_blocks += 1
            r.kv_tokens = kv_tokens + 1
            decode_contexts.append(kv_tokens)
            # the token this forward pass produces (_emit_token inlined; its time is set below, once known)
            n = len(out)
            out.append(GENERATED_TOKEN_BASE | (hash((r.digest, n)) & GENERATED_TOKEN_MASK))
            if n >= r.max_tokens - 1:
                gen_done.append(r)
        prefill_items = [(n, r.context_done) for r, n in chunks]
        onboards = bm.onboarded_blocks - moves_before[0]
        offloads = bm.offloaded_blocks - moves_before[1]
        # Copies run on their own streams, at once, and the forward pass waits for them (CostModel.transfers_s).
        dt = self.cost.iteration_s_unchecked(prefill_items, decode_contexts)
        if onboards or offloads:
            dt += self.cost.transfers_s(onboards, offloads, tpb)
        self.now_s += dt
        self.busy_s += dt
        now = self.now_s

        finished: list[SimRequest] = []
        num_ctx_tokens = sum(n for _, n in chunks)
        for r, n in chunks:
            r.context_done += n
            if r.context_done >= r.num_prompt_tokens:
                bm.store_context_blocks(r.request_id)
                r.stage = "GENERATION_IN_PROGRESS"
                self._emit_token(r, now)
                if len(r.output_ids) >= r.max_tokens:
                    finished.append(r)
        # the rest of _emit_token for the tokens appended above (595k in the synthetic trace)
        for r in gen:
            if r.first_token_s is None:
                r.first_token_s = now
            r.last_token_s = now
            if r.on_token:
                r.on_token(r)
        finished += gen_done  # after the contexts that finished, as they were found before
        for r in finished:
            bm.remove_sequence(r.request_id, final_tokens=r.output_ids[-1:])
            r.stage = "GENERATION_COMPLETE"
            r.last_iter = self.iteration
            self.completed += 1
        if finished:
            # by identity: list.remove would compare dataclasses field by field
            done = {id(r) for r in finished}
            running[:] = [r for r in running if id(r) not in done]
        if self.enable_iter_perf_stats:
            self.stats.append(self._iteration_stats(dt, chunks, gen, finished, num_ctx_tokens))
        bm.flush_events()
        self.iteration += 1
        for r in finished:
            if r.on_finish:
                r.on_finish(r)
        return finished

    def _emit_token(self, r: SimRequest, now: float) -> None:
        r.output_ids.append(generated_token(r.digest, len(r.output_ids)))
        if r.first_token_s is None:
            r.first_token_s = now
        r.last_token_s = now
        if r.on_token:
            r.on_token(r)

    # ------------------------------------------------------------------------------------------ stats

    def timestamp(self) -> str:
        # TensorRT-LLM's format: "04-07-2025 20:33:17.747028" (MM-DD-YYYY, local time of the engine)
        t = _dt.datetime.fromtimestamp(self.epoch_s + self.now_s)
        return t.strftime("%m-%d-%Y %H:%M:%S.%f")

    def _iteration_stats(self, dt: float, chunks: Sequence[tuple[SimRequest, int]], gen: Sequence[SimRequest],
                         finished: Sequence[SimRequest], num_ctx_tokens: int) -> dict[str, Any]:
        """One iteration-stats dict with TensorRT-LLM 1.2's keys (jsonSerialization.cpp, PyTorch backend)."""
        # TensorRT-LLM's executor counts a request active from when it fetches it into its active list, started
        # or not (py_executor.py _get_init_iter_stats: len(self.active_requests), the requests fetched this
        # iteration and their time in the queue), and queued while it is still in the request queue
        new = self._new_fetched
        queue_latency_ms = (sum((r.fetched_s or 0.0) - r.arrival_s for r in new) / len(new) * 1000.0
                            if new else 0.0)
        fetched_waiting = sum(1 for r in self._fetched_now if r.stage == "QUEUED")
        stats: dict[str, Any] = {
            "timestamp": self.timestamp(),
            "iter": self.iteration,
            "iterLatencyMS": dt * 1000.0,
            "newActiveRequestsQueueLatencyMS": queue_latency_ms,
            "numNewActiveRequests": len(new),
            "numActiveRequests": len(self.running) + len(finished) + fetched_waiting,
            "numQueuedRequests": len(self.waiting) - fetched_waiting,
            "numCompletedRequests": len(finished),
            "maxNumActiveRequests": self.max_batch_size,
            "maxBatchSizeStatic": self.max_batch_size,
            "maxBatchSizeTunerRecommended": 0,
            "maxBatchSizeRuntime": self.max_batch_size,
            "maxNumTokensStatic": self.max_num_tokens,
            "maxNumTokensTunerRecommended": 0,
            "maxNumTokensRuntime": self.max_num_tokens,
            "gpuMemUsage": self.gpu_mem_usage_bytes,
            # PyTorch's _update_iter_stats sets both to 0, even with a host cache (trtllm-kv.md 1.2)
            "cpuMemUsage": 0,
            "pinnedMemUsage": 0,
            "kvCacheStats": self.bm.kv_cache_stats(),
            "staticBatchingStats": None,
            "inflightBatchingStats": {
                "numScheduledRequests": len(chunks) + len(gen),
                "numContextRequests": len(chunks),
                "numGenRequests": len(gen),
                "numPausedRequests": len(self._paused_now),
                "numCtxTokens": num_ctx_tokens,
                "microBatchId": 0,
                "avgNumDecodedTokensPerIter": 1.0 if gen else 0.0,
            },
            "specDecodingStats": None,
        }
        if self._kv_iter is not None:
            stats["kvCacheIterationStats"] = self._kv_iter.take()
        if self.enable_iter_req_stats:
            stats["requestStats"] = [self._request_stats(r) for r in [*self.running, *finished]]
        return stats

    def _request_stats(self, r: SimRequest) -> dict[str, Any]:
        reused, missed = r.reused_blocks, r.missed_blocks
        return {
            "id": r.request_id,
            "stage": r.stage if r.stage != "FAILED" else "GENERATION_COMPLETE",
            "contextPrefillPosition": r.context_done,
            "numGeneratedTokens": len(r.output_ids),
            "avgNumDecodedTokensPerIter": 1.0,
            "scheduled": True,
            "paused": r.stage == "PAUSED",
            "disServingStats": None,
            "allocTotalBlocksPerRequest": r.alloc_total_blocks,
            "allocNewBlocksPerRequest": r.alloc_new_blocks,
            "reusedBlocksPerRequest": reused,
            "missedBlocksPerRequest": missed,
            "kvCacheHitRatePerRequest": reused / (reused + missed) if reused > 0 else 0.0,
        }

    def take_stats(self) -> list[dict[str, Any]]:
        out = list(self.stats)
        self.stats.clear()
        return out
