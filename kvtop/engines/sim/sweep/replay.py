"""The block manager's trace replay without timing (``kvtop sim --hit-rate-only``; the package docstring says what
it answers): ``BlockManager`` driven one request at a time, in trace order."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from kvtop.engines.inputs import TraceRequest
from kvtop.engines.sim.block_manager import BlockManager, TokenRuns
from kvtop.engines.sim.core import GENERATED_TOKEN_BASE
from kvtop.stack_distance import no_gc as _no_gc


def _blocks_of(tr: TraceRequest, tokens_per_block: int) -> int:
    return -(-(tr.input_length + tr.output_length) // tokens_per_block)


def replay_trace(bm: BlockManager, requests: Sequence[TraceRequest], after_add: Callable[[], None] | None = None
                 ) -> tuple[int, int]:
    """Drive ``bm`` through the trace one request at a time. Returns (replayed, skipped): a request needing more
    blocks than the GPU pool is skipped, as the engine rejects it."""
    tpb = bm.tokens_per_block
    primary = bm.primary_blocks
    skipped = 0
    add, store, add_tokens, remove = bm.add_sequence, bm.store_context_blocks, bm.add_tokens, bm.remove_sequence
    for rid, tr in enumerate(requests):
        if tr.input_length == 0 or tr.output_length <= 0 or _blocks_of(tr, tpb) > primary:
            skipped += 1
            continue
        prompt = TokenRuns(tr.prompt_runs())
        add(rid, prompt)
        if after_add is not None:
            after_add()
        store(rid)
        # add_token per generated token but the last, in one call. The engine generates hash((digest, position))
        # ids (core.generated_token); here every request generates the run GENERATED_TOKEN_BASE, +1, +2, ...
        # instead, and the block manager does exactly the same (tests/engines/sim/test_sim_sweep_fast.py holds it to the
        # engine's ids, per request): a generated id is never a prompt id, so a key holding one equals another key
        # only under the same parent block, where both requests' tokens so far are equal, so their prompts are
        # equal (a prompt id and a generated id never stand at the same place), and so are the engine's generated
        # ids; and a partial match stops at the first generated id either way. What it saves: an id per token by
        # hash (595k on the Mooncake trace), and a run's keys are cut in O(1) per block.
        out = tr.output_length
        add_tokens(rid, range(GENERATED_TOKEN_BASE, GENERATED_TOKEN_BASE + out - 1))
        remove(rid, final_tokens=(GENERATED_TOKEN_BASE + out - 1,))
    return len(requests) - skipped, skipped


def _counters(bm: BlockManager, host_blocks: int, replayed: int, skipped: int) -> dict[str, Any]:
    reused, missed = bm.reused_blocks, bm.missed_blocks
    return {
        "secondary_blocks": host_blocks,
        "requests": replayed,
        "failed": skipped,
        "reused_blocks": reused,
        "missed_blocks": missed,
        "cache_hit_rate": reused / (reused + missed) if reused > 0 else 0.0,
        "offloaded_blocks": bm.offloaded_blocks,
        "onboarded_blocks": bm.onboarded_blocks,
    }


def replay_hit_rates(requests: Sequence[TraceRequest], primary_blocks: int, host_blocks: int,
                     tokens_per_block: int) -> dict[str, Any]:
    """One full block-manager replay without timing (see the module docstring)."""
    with _no_gc():
        bm = BlockManager(primary_blocks, host_blocks, tokens_per_block)
        replayed, skipped = replay_trace(bm, requests)
        return _counters(bm, host_blocks, replayed, skipped)
