"""The built-in engine: TensorRT-LLM's KV cache manager and LLM API, simulated (see design.md)."""

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
from kvtop.engines.sim.retention import KvCacheRetentionConfig, KvCacheTransferMode, TokenRangeRetentionConfig

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
