"""The built-in engine: TensorRT-LLM's KV cache manager and LLM API, simulated (see design.md).

The LLM API (``kvtop.engines.sim.llm``: asyncio, threads, the tokenizer) is imported on first use of one of its
names: ``kvtop sim --hit-rate-only`` needs the block manager alone, and importing the API took ~45 ms of its
~130 ms start-up on the dev box (asyncio ~35 of them). The block manager and the retention configs are imported
on first use too: the verdict's pricing (kvtop/tiers/verdict.py) needs ``kvtop.engines.sim.cost`` alone, on a
replay's first screen, and the block manager was 11 ms of the 24 that cost."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from kvtop.engines.sim.block_manager import BlockManager, NoFreeBlockError, block_key_hash
    from kvtop.engines.sim.llm import (
        CapacitySchedulerPolicy,
        CompletionOutput,
        KvCacheConfig,
        RequestError,
        RequestOutput,
        SamplingParams,
        SchedulerConfig,
        SimLLM,
    )
    from kvtop.engines.sim.retention import (
        KvCacheRetentionConfig,
        KvCacheTransferMode,
        TokenRangeRetentionConfig,
    )

_FROM_LLM = frozenset({"CapacitySchedulerPolicy", "CompletionOutput", "KvCacheConfig", "RequestError",
                       "RequestOutput", "SamplingParams", "SchedulerConfig", "SimLLM"})


_FROM_BLOCK_MANAGER = frozenset({"BlockManager", "NoFreeBlockError", "block_key_hash"})
_FROM_RETENTION = frozenset({"KvCacheRetentionConfig", "KvCacheTransferMode", "TokenRangeRetentionConfig"})


def __getattr__(name: str) -> Any:
    if name in _FROM_LLM:
        return getattr(importlib.import_module("kvtop.engines.sim.llm"), name)
    if name in _FROM_BLOCK_MANAGER:
        return getattr(importlib.import_module("kvtop.engines.sim.block_manager"), name)
    if name in _FROM_RETENTION:
        return getattr(importlib.import_module("kvtop.engines.sim.retention"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "BlockManager",
    "CapacitySchedulerPolicy",
    "CompletionOutput",
    "KvCacheConfig",
    "KvCacheRetentionConfig",
    "KvCacheTransferMode",
    "NoFreeBlockError",
    "RequestError",
    "RequestOutput",
    "SamplingParams",
    "SchedulerConfig",
    "SimLLM",
    "TokenRangeRetentionConfig",
    "block_key_hash",
]
