"""The simulator's TensorRT-LLM 1.3-shaped ``kvCacheIterationStats``: per attention window, the pools' gauges and
this iteration's counters, as TensorRT-LLM's PyTorch executor adds them to each iteration-stats dict.

Shape: ``kv_cache_iteration_stats_to_dict`` in tensorrt_llm/executor/stats_serialization.py (NVIDIA/TensorRT-LLM at
548e49638e058bddbf0c7780d5ac5e460bf63c1f, PR #12413, the first release line with it): ``{"<window_size>": {...}}``
with ``primary``/``secondary`` ``{Max,Free,Used}NumBlocks`` and the ``iter*`` counters of blocks and bytes moved
during the iteration (KvCacheConfig.iteration_stats_interval = 1: every iteration). TensorRT-LLM 1.2 has none of
it; ``SimLLM(trtllm_version="1.3")`` (``kvtop run --trtllm-version 1.3``) emits it so both paths are exercised.

The counters are the block manager's own cumulative ones, diffed per iteration: every offload (also those of blocks
outside the reuse tree, which no event shows) and every onboard.
"""

from __future__ import annotations

from typing import Any

__all__ = ["STATS_VERSIONS", "IterationStatsV13"]

STATS_VERSIONS = ("1.2", "1.3")


class IterationStatsV13:
    """Diffs a :class:`~kvtop.engines.sim.block_manager.BlockManager`'s counters into one window's entry."""

    def __init__(self, bm: Any, bytes_per_block: int):
        self.bm = bm
        self.bytes_per_block = bytes_per_block
        self._last = self._counters()

    def _counters(self) -> tuple[int, ...]:
        bm = self.bm
        return (bm.alloc_total_blocks, bm.alloc_new_blocks, bm.reused_blocks, bm.missed_blocks,
                bm.onboarded_blocks, bm.offloaded_blocks)

    def take(self) -> dict[str, dict[str, Any]]:
        bm = self.bm
        cur = self._counters()
        alloc_total, alloc_new, reused, missed, onboard, offload = (c - p for c, p in zip(cur, self._last))
        self._last = cur
        p, s = bm.primary_blocks, bm.secondary_blocks
        free_p, free_s = bm.num_free_blocks(0), bm.num_free_blocks(1)
        bpb = self.bytes_per_block
        return {str(bm.window_size): {
            "primaryMaxNumBlocks": p, "primaryFreeNumBlocks": free_p, "primaryUsedNumBlocks": p - free_p,
            "secondaryMaxNumBlocks": s, "secondaryFreeNumBlocks": free_s, "secondaryUsedNumBlocks": s - free_s,
            "iterAllocTotalBlocks": alloc_total, "iterAllocNewBlocks": alloc_new,
            "iterReusedBlocks": reused,
            # the simulator does not tell full from partial reuse in its counters: all are counted as full
            "iterFullReusedBlocks": reused, "iterPartialReusedBlocks": 0,
            "iterMissedBlocks": missed,
            "iterCacheHitRate": reused / (reused + missed) if reused + missed else 0.0,
            "iterGenAllocBlocks": 0,
            "iterOnboardBlocks": onboard, "iterOnboardBytes": onboard * bpb,
            "iterOffloadBlocks": offload, "iterOffloadBytes": offload * bpb,
            "iterIntraDeviceCopyBlocks": 0, "iterIntraDeviceCopyBytes": 0,
            "iterTransferPinnedBlocks": 0, "iterTransferAlreadyPrimaryBlocks": 0,
            "iterTransferPrimaryBlockReservations": 0, "iterTransferOnboardedBlocks": 0,
            "iterTransferReservationFailures": 0, "iterTransferLeaseReleaseBlocks": 0,
        }}
