"""Tier-health alarms: what is wrong with a tier below the GPU, named, from one snapshot.

Each alarm is a problem kind (kvtop/problems.py: the dashboard's header and event log, stderr when headless, the
JSON summary's ``problems``) and a sentence that says why, with the numbers. The session checks them every
couple of seconds and resolves one when it no longer holds. What each one means, in TensorRT-LLM's terms
(trtllm-kv.md 6.3; evictionPolicy.cpp, kvCacheManager.cpp):

- ``tier.host_idle``: blocks go to the host pool and none come back, after at least a GPU pool's worth of stores:
  the workload does not ask again for what the GPU evicts, and every store still costs a copy.
- ``tier.host_not_larger``: a host pool no larger than the GPU pool. Offload-on-evict fills it with the blocks the
  GPU evicted last; a block is on the host only after it left a GPU pool at least as large, so the host holds
  little the GPU would not have kept had the memory been there.
- ``tier.load_slower``: loading a block back costs more than computing it again (the verdict's prices: a slow link,
  tiny blocks, a small model); such a tier costs time on every hit.
- ``tier.host_evictions``: host blocks removed while a tenth or more of the host pool holds no cached block.
  TensorRT-LLM 1.2 does that by design: the host's free queue is a FIFO, an onboard swaps the GPU victim into the
  onboarded block's slot and puts it at the back, and an offload takes the *front* slot, evicting the block cached
  there while the empty slots ride the queue behind it (kvtop/tiers/whatif.py measured the empty share at
  onboards / offloads); and a block's cached descendants leave with it (``freeChildren``).
"""

from __future__ import annotations

from typing import Any

from kvtop.engine_words import is_trtllm

__all__ = ["HEALTH_KINDS", "tier_health"]

HEALTH_KINDS = ("tier.host_idle", "tier.host_not_larger", "tier.load_slower", "tier.host_evictions")
# host evictions with at least this share of the host pool free count as "with room" (a full pool evicts by design)
_ROOM_SHARE = 0.10


def tier_health(snap: Any) -> dict[str, str]:
    """The alarms that hold for ``snap`` (a TierSnapshot): {kind: why}."""
    out: dict[str, str] = {}
    host, gpu = snap.host, snap.gpu
    cap, gpu_cap = host.capacity_blocks, gpu.capacity_blocks
    if not cap or cap < 0:
        return out
    verdict = snap.verdict.get("host")
    moves = snap.moves
    if verdict is not None and verdict.says == "idle" and gpu_cap and moves.offloaded_blocks >= gpu_cap:
        cost = f" (its copies cost {verdict.spent_s:,.1f} s)" if verdict.spent_s else ""
        out["tier.host_idle"] = (f"host tier idle: {moves.offloaded_blocks:,} blocks stored, none loaded back"
                                 f"{cost}: the workload does not ask again for what the GPU evicts")
    trtllm = is_trtllm(snap.meta.get("engine"))   # TensorRT-LLM's reasons, else the words of any engine
    if gpu_cap and cap <= gpu_cap:
        out["tier.host_not_larger"] = (f"host pool ({cap:,} blocks) no larger than the GPU pool ({gpu_cap:,}): "
                                       + ("offload-on-evict fills it with what the GPU just evicted" if trtllm else
                                          "it holds little the GPU pool does not hold too")
                                       + ", so it can hardly add hits")
    if verdict is not None and verdict.load_block_s and verdict.prefill_block_s \
            and verdict.load_block_s > verdict.prefill_block_s:
        out["tier.load_slower"] = (f"loading a block from the host ({verdict.load_block_s * 1e6:,.0f} us) costs "
                                   f"more than computing it again ({verdict.prefill_block_s * 1e6:,.0f} us): "
                                   "every host hit costs time")
    rates = snap.rates
    # room: slots holding no cached block (a host block is "free" to TensorRT-LLM while cached, so free_blocks
    # would call a full pool empty); the cached count is an upper bound, so room is never overstated
    empty = None if host.cached_blocks is None else cap - host.cached_blocks
    if rates.window_s and rates.evicted_host_per_s and rates.evicted_host_per_s > 0 and empty is not None \
            and empty >= _ROOM_SHARE * cap:
        out["tier.host_evictions"] = (
            f"host blocks evicted ({rates.evicted_host_per_s:,.1f}/s) while the host pool has room ({empty:,} of "
            f"{cap:,} empty): " + (
                "an offload takes the host queue's front slot, evicting its block while the empty slots onboards "
                "left ride the queue behind it; a block's cached descendants also leave with it (freeChildren)"
                if trtllm else "the engine's removals say no reason (the moves panel's 'left' line: what kvtop "
                "inferred)"))
    return out
