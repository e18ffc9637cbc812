"""An accelerated engine loop for trace replays (``kvtop sim --trace``): ``SimEngineCore`` whose generation requests
cost nothing in an iteration where nothing happens to them.

- Reference: ``core.SimEngineCore`` (its ``step``, GUARANTEED_NO_EVICT, no iteration stats): every iteration it
  lists every generation request, feeds each its last token (``add_token``), appends the token it produces and
  sums the contexts its cost model reads.
- The test that holds them equal: tests/engines/sim/test_lazy_decode.py (``test_lazy_decode_is_the_engine_loop``:
  40 randomized workloads, tiny pools with and without a host tier, 1 to 64 tokens a block, prompts shared or not,
  events on and off, retention, submitted at once or fed as ``kvtop sim --trace`` feeds them: after every
  iteration the same clock, finished requests, block manager counters and events, and at the end every request's
  results and every block's state).
- The measurement that pays for it: bench/JOURNAL.md, "Lazy decode and the store's chain" (2026-12-03 18:55 UTC):
  the Mooncake conversation trace at 32 tokens a block, 64 GB host (4.1M generated tokens over 69k iterations,
  ~60 generation requests each), 4,156M -> 3,561M instructions for the 64 GB point's first 400 requests (-14.3%);
  on the H200 host its 64 GB point 19.48, 19.44 s -> 14.07, 13.74 s.

Between two events a generation request's iteration is arithmetic: its KV grows by a token, the token it produces
is ``generated_token(digest, position)``, and the cost model reads only how many generation requests there are
and the sum of their contexts (``CostModel.iteration_s_sum``). What changes shared state, and so must happen at its
iteration and in its order, is

- a crossing: the iteration whose fed token starts a new KV block (``addToken`` takes a free block, which may evict
  and offload): the request's tokens since it last met the block manager go in then, in one ``add_tokens`` call
  (the same blocks, counters and events as one ``add_token`` per iteration: only the last one allocates), in the
  order of the generation requests, as ``add_token_each`` would have reached them;
- its last iteration: its tokens are brought up to date, then ``remove_sequence`` in the reference's order.

Each generation request therefore has its crossings and its finish filed under the iterations they fall in
(known when its context completes: one crossing every ``tokens_per_block`` iterations), and the scheduler's
reservation (the blocks generation requests still need to finish) and the decode context sum are kept as
requests join and leave. Until a request's next event, its ``output_ids``, ``kv_tokens`` and ``last_token_s`` lag
(they are exact once it finishes or fails): so no per-token callback (``on_token``) and no iteration stats, which
read them every iteration; a replay reads a request when it finishes. Only GUARANTEED_NO_EVICT: MAX_UTILIZATION
pauses requests on a count of every running request's next step.
"""

from __future__ import annotations

from bisect import insort
from collections import deque
from collections.abc import Callable
from itertools import islice, repeat
from typing import Any

from kvtop.engines.sim.block_manager import NO_FREE_GPU_BLOCK, NoFreeBlockError
from kvtop.engines.sim.core import (
    GENERATED_TOKEN_BASE,
    GENERATED_TOKEN_MASK,
    GUARANTEED_NO_EVICT,
    SimEngineCore,
    SimRequest,
    by_order,
)

__all__ = ["LazyDecodeCore"]


def _produce(r: SimRequest, upto: int) -> None:
    """Append the tokens ``r`` generated up to ``len(r.output_ids) == upto``: ``generated_token`` for each position,
    the tuples made and hashed in C (the same ints: ``hash((digest, n))`` of the same tuples)."""
    out = r.output_ids
    n = len(out)
    if n < upto:
        out += [GENERATED_TOKEN_BASE | (h & GENERATED_TOKEN_MASK)
                for h in map(hash, zip(repeat(r.digest), range(n, upto)))]


class LazyDecodeCore(SimEngineCore):
    """``SimEngineCore`` for a trace replay: GUARANTEED_NO_EVICT, no iteration stats, no per-token callbacks (see
    the module's docstring). The same clock, results, blocks and events, iteration by iteration."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if self.capacity_scheduler_policy != GUARANTEED_NO_EVICT:
            raise ValueError(f"LazyDecodeCore: only {GUARANTEED_NO_EVICT} (got {self.capacity_scheduler_policy})")
        if self.enable_iter_perf_stats:
            raise ValueError("LazyDecodeCore: iteration stats read every request every iteration; use SimEngineCore")
        self._gen: list[SimRequest] = []  # the generation requests, in submission order
        self._contexts: list[SimRequest] = []  # started requests, in order; those still in context are the chunked
        self._reserved = 0  # sum of blocks_to_completion - kv_blocks over the generation requests
        self._ctx_sum = 0   # sum of the generation requests' KV tokens (their contexts in the next iteration)
        self._crossings: dict[int, list[SimRequest]] = {}  # iteration -> requests whose fed token starts a block
        self._finishes: dict[int, list[SimRequest]] = {}   # iteration -> requests producing their last token
        self._transfers: dict[tuple[int, int], float] = {}  # (onboards, offloads) -> CostModel.transfers_s

    def submit(self, req: SimRequest) -> None:
        if req.on_token is not None:
            raise ValueError("LazyDecodeCore: a per-token callback reads every token as it comes; use SimEngineCore")
        super().submit(req)

    # -------------------------------------------------------------------------------- scheduling, kept sums

    def _start(self, started: list[SimRequest]) -> None:
        super()._start(started)
        if started:
            self._contexts = list(self._in_order(self._contexts, started))

    def _fetched(self) -> list[SimRequest]:
        """``SimEngineCore._fetched`` where every waiting request has arrived (a trace replay hands the engine only
        those): the head of the queue up to the room, without a step per request. The requests fetched before are a
        prefix of the queue (fetched in order; only fetched ones leave it, and those passed over go back to their
        places), so only the fetched ones past them are stamped."""
        waiting = self.waiting
        now = self.now_s
        if not waiting or waiting[-1].arrival_s > now:
            return super()._fetched()
        room = self.max_batch_size - len(self.running)
        fetched = list(islice(waiting, room)) if room > 0 else []
        i = len(fetched)
        while i and fetched[i - 1].fetched_s is None:
            i -= 1
        for req in fetched[i:]:
            req.fetched_s = now
            self._new_fetched.append(req)
        self._fetched_now = fetched
        return fetched

    def _contributed_context_blocks(self) -> set[Any] | None:
        bm = self.bm
        if not bm.enable_block_reuse:
            return None
        contributed = set()
        for req in self._contexts:  # the running requests in context, as the reference finds them in running
            block = bm.find_new_context_block(req.kv_prompt if req.kv_prompt is not None else req.prompt_ids)
            if block is not None:
                contributed.add(block)
        return contributed

    def _schedule(self) -> list[SimRequest]:
        """``_schedule_no_evict`` with the generation requests' reservation kept, not summed."""
        bm = self.bm
        available = bm.num_free_blocks(0) - self._reserved
        scheduled = self._gen[:]
        self._gen_first = len(scheduled)
        chunked = self._contexts = [r for r in self._contexts if r.stage == "CONTEXT_IN_PROGRESS"]
        contributed = self._contributed_context_blocks()
        self._blocked = None
        for req in self._in_order(chunked, self._fetched()):
            if req.stage == "QUEUED" and self._beneficial_to_skip(req, contributed):
                continue
            if len(scheduled) >= self.max_batch_size:
                break
            need = req.blocks_to_completion - req.kv_blocks
            if need > available:
                self._blocked = req
                break
            available -= need
            scheduled.append(req)
        return scheduled

    def _join(self, r: SimRequest, iteration: int) -> None:
        """A request whose context completed in ``iteration`` decodes from the next: file its events."""
        r.decode_iter = first = iteration + 1
        r.decode_out0 = out0 = len(r.output_ids)
        r.decode_kv0 = kv0 = r.kv_tokens
        r.decode_fed = out0 - 1  # the block manager holds every token but the last (the next one fed)
        last = first + r.max_tokens - 1 - out0
        self._finishes.setdefault(last, []).append(r)
        cross = first + (-kv0) % self.tpb
        if cross <= last:
            self._crossings.setdefault(cross, []).append(r)
        self._reserved += r.blocks_to_completion - r.kv_blocks
        self._ctx_sum += kv0
        gen = self._gen
        if gen and gen[-1].order > r.order:
            insort(gen, r, key=by_order)
        else:
            gen.append(r)

    def _leave(self, r: SimRequest) -> None:
        self._reserved -= r.blocks_to_completion - r.kv_blocks
        self._ctx_sum -= r.kv_tokens

    def _cross(self, crossing: list[SimRequest], iteration: int, last_now: float) -> list[SimRequest]:
        """The decode allocations of ``iteration``, in the generation requests' order; a request whose block is not
        there fails as in the reference (its blocks released before the next one's). Returns the failed ones."""
        if len(crossing) > 1:
            crossing.sort(key=by_order)
        bm = self.bm
        tpb = self.tpb
        failed: list[SimRequest] = []
        for r in crossing:
            k = iteration - r.decode_iter
            upto = r.decode_out0 + k  # the tokens it has; the last is fed now and starts a block
            _produce(r, upto)
            try:
                bm.add_tokens(r.request_id, r.output_ids[r.decode_fed:upto])
            except NoFreeBlockError:
                # add_token_each's caller: the request fails, the rest go on (the tokens before this one are in)
                r.kv_tokens = r.decode_kv0 + k
                r.last_token_s = last_now
                self._leave(r)
                last = r.decode_iter + r.max_tokens - 1 - r.decode_out0
                self._finishes[last] = [x for x in self._finishes[last] if x is not r]
                self._gen = [x for x in self._gen if x is not r]
                self.running[:] = [x for x in self.running if x is not r]
                bm.remove_sequence(r.request_id)
                self._fail(r, f"out of KV cache blocks during decode: {NO_FREE_GPU_BLOCK}")
                failed.append(r)
                continue
            r.decode_fed = upto
            r.kv_blocks += 1
            self._reserved -= 1
            nxt = iteration + tpb
            if nxt <= r.decode_iter + r.max_tokens - 1 - r.decode_out0:
                self._crossings.setdefault(nxt, []).append(r)
        return failed

    # -------------------------------------------------------------------------------- the iteration

    def step(self) -> list[SimRequest]:
        """``SimEngineCore.step``, the generation requests' work done at their events only."""
        if not self.has_runnable():
            return []
        bm = self.bm
        bm.refresh()
        moves_before = (bm.onboarded_blocks, bm.offloaded_blocks)
        self._paused_now = []
        self._new_fetched = []
        scheduled = self._schedule()
        if not scheduled:
            # the reference's safety net, as it is (no generation request runs here: they are always scheduled)
            head = self._blocked
            if head is None:
                raise RuntimeError(f"iteration {self.iteration}: nothing scheduled, nothing paused and no request "
                                   f"blocked ({len(self.running)} running, {len(self.waiting)} waiting)")
            need = f"{head.blocks_to_completion - head.kv_blocks} free KV cache blocks"
            if head.stage == "QUEUED":
                self.waiting = deque(r for r in self.waiting if r is not head)
            else:
                self.running[:] = [r for r in self.running if r is not head]
                if bm.has_request(head.request_id):
                    bm.remove_sequence(head.request_id)
            self._fail(head, f"needs {need}, the GPU pool has {bm.num_free_blocks(0)} free of {bm.primary_blocks}")
            return []
        gen, chunks = self._micro_batch(scheduled)
        n_gen = len(gen)
        self.max_scheduled = max(self.max_scheduled, n_gen + len(chunks))
        iteration = self.iteration
        crossing = self._crossings.pop(iteration, None)
        if crossing and self._cross(crossing, iteration, self.now_s):
            n_gen = len(self._gen)
        decode_sum = self._ctx_sum
        prefill_items = [(n, r.context_done) for r, n in chunks]
        onboards = bm.onboarded_blocks - moves_before[0]
        offloads = bm.offloaded_blocks - moves_before[1]
        dt = self.cost.iteration_s_sum(prefill_items, n_gen, decode_sum)
        if onboards or offloads:
            moved = self._transfers.get((onboards, offloads))
            if moved is None:  # the cost model's, once per pair of counts (offloads vary little: a prompt's blocks)
                moved = self._transfers[onboards, offloads] = self.cost.transfers_s(onboards, offloads, self.tpb)
            dt += moved
        self.now_s += dt
        self.busy_s += dt
        now = self.now_s
        self._ctx_sum = decode_sum + n_gen  # every generation request's KV grew by its fed token

        finished: list[SimRequest] = []
        joined: list[SimRequest] = []
        for r, n in chunks:
            r.context_done += n
            if r.context_done >= r.num_prompt_tokens:
                bm.store_context_blocks(r.request_id)
                r.stage = "GENERATION_IN_PROGRESS"
                self._emit_token(r, now)
                if len(r.output_ids) >= r.max_tokens:
                    finished.append(r)
                else:
                    joined.append(r)
        gen_done = self._finishes.pop(iteration, None)
        if gen_done:
            if len(gen_done) > 1:
                gen_done.sort(key=by_order)
            for r in gen_done:
                k = iteration - r.decode_iter
                _produce(r, r.decode_out0 + k + 1)
                bm.add_tokens(r.request_id, r.output_ids[r.decode_fed:r.decode_out0 + k])  # no block: not a crossing
                r.decode_fed = r.decode_out0 + k
                r.kv_tokens = r.decode_kv0 + k + 1
                r.last_token_s = now
                self._leave(r)
            finished += gen_done  # after the contexts that finished, as the reference finds them
        for r in finished:
            bm.remove_sequence(r.request_id, final_tokens=r.output_ids[-1:])
            r.stage = "GENERATION_COMPLETE"
            r.last_iter = iteration
            self.completed += 1
        if finished:
            done = {id(r) for r in finished}
            self.running[:] = [r for r in self.running if id(r) not in done]
            if gen_done:
                self._gen = [r for r in self._gen if id(r) not in done]
        for r in joined:
            self._join(r, iteration)
        bm.flush_events()
        self.iteration += 1
        for r in finished:
            on_finish: Callable[[SimRequest], None] | None = r.on_finish
            if on_finish:
                on_finish(r)
        return finished
