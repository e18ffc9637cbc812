"""KV cache pool sizes as TensorRT-LLM (1.x, PyTorch backend) computes them, and byte-size parsing.

Primary (GPU) pool. TensorRT-LLM's `KvCacheCreator` (`tensorrt_llm/_torch/pyexecutor/_util.py`) loads the
weights, runs a dry run of dummy context requests totalling `max_num_tokens` (default 8,192), measures the
peak (torch peak + memory outside torch: CUDA context, CUDA graphs, NCCL), then `_cal_max_memory`:

    kv_memory  = (total_gpu_memory - peak_memory + kv_bytes_of_the_dry_run) x free_gpu_memory_fraction
    kv_memory  = min(kv_memory, max_tokens x kv_bytes_per_token)          if the user set max_tokens
    max_tokens = int(kv_memory // kv_bytes_per_token)

and the C++ `BaseKVCacheManager::calculateMaxNumBlocks` (`cpp/tensorrt_llm/batch_manager/kvCacheManager.cpp`)
turns that into blocks: `maxTokens = min(floor(kv_memory / bytes_per_token), max_tokens)`, then
`blocksInPrimaryPool = ceilDiv(maxTokens, tokensPerBlock)`: rounded *up* (the older Python path,
`KVCacheManager.calculate_max_num_blocks`, also uses `math.ceil(max_tokens / tokens_per_block)`).
So `max_tokens=256` with 32-token blocks gives 8 blocks, `max_tokens=100` gives 4.

Here `peak_memory` is not measured but estimated: weights + `runtime_reserve_bytes(model)` (documented
below). Pass `other_bytes` to use a measured figure instead.

Secondary (host) pool: `blocks_in_secondary_pool = int(host_cache_size / cache_bytes_per_token /
tokens_per_block)` in `resource_manager.py` (the C++ path floors the same quotient): rounded *down*.
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

from kvtop.engines.gpus import GpuProfile
from kvtop.engines.models import ModelShape
from kvtop.values import frozen

__all__ = [
    "DEFAULT_FREE_GPU_MEMORY_FRACTION",
    "DEFAULT_MAX_NUM_TOKENS",
    "GpuPool",
    "RUNTIME_OVERHEAD_BYTES",
    "activation_bytes",
    "format_bytes",
    "gpu_pool",
    "parse_size",
    "size_text",
    "primary_blocks",
    "runtime_reserve_bytes",
    "secondary_blocks",
]

# KvCacheConfig.free_gpu_memory_fraction default (None in ~1.0 meant the C++ default, also 0.9).
DEFAULT_FREE_GPU_MEMORY_FRACTION = 0.9

# BaseLlmArgs.max_num_tokens default: the dry run that measures the activation peak pushes this many tokens.
DEFAULT_MAX_NUM_TOKENS = 8192

# Memory the KV cache cannot have besides weights and activations. An estimate, not a measurement:
# - 0.6 GiB the driver keeps from CUDA: NVML reports 143,771 MiB on an H200, torch sees 139.80 GiB total;
# - about 0.5 GiB of CUDA context per process on Hopper (assumed);
# - about 0.9 GiB of cuBLAS/attention workspaces and CUDA-graph pools for the decode batch sizes (assumed).
# TensorRT-LLM measures all of this in its dry run; a `kvtop calibrate` run or `other_bytes` should
# replace it.
RUNTIME_OVERHEAD_BYTES = 2 << 30


def activation_bytes(model: ModelShape, max_num_tokens: int = DEFAULT_MAX_NUM_TOKENS) -> int:
    """Estimated activation peak of TensorRT-LLM's dry run: `max_num_tokens` tokens through one layer.

    Per token, the largest live set is inside the MLP: the gate and up projections (2 x intermediate)
    and their SwiGLU product (1 x intermediate), while the residual stream, the normed input and the
    attention output (about 4 x hidden) are still held. Qwen3-8B, 8,192 tokens: 872 MB. Logits are only
    computed for each dummy request's last token, so the LM head adds nothing worth counting.
    """
    per_token = 4 * model.hidden_size + 3 * model.intermediate_size
    return max_num_tokens * per_token * model.dtype_bytes


def runtime_reserve_bytes(model: ModelShape, max_num_tokens: int = DEFAULT_MAX_NUM_TOKENS) -> int:
    """GPU memory left out of the KV cache besides the weights: activations + RUNTIME_OVERHEAD_BYTES."""
    return activation_bytes(model, max_num_tokens) + RUNTIME_OVERHEAD_BYTES


@frozen(slots=True)  # kvtop.values: no code compiled at import (~1 ms as @dataclass)
class GpuPool:
    """One GPU's memory as TensorRT-LLM splits it (:func:`gpu_pool`); every figure is per GPU (per tensor-parallel
    rank: all ranks hold the same). ``blocks`` is what :func:`primary_blocks` returns; ``fits`` is False where the
    weights and the runtime leave no memory for the KV cache (``blocks`` is 0 then)."""

    tensor_parallel_size: int
    gpu_bytes: int
    weight_bytes: int  # this rank's shard: ceil(weights / tp)
    runtime_bytes: int  # activations of the dry run + RUNTIME_OVERHEAD_BYTES, or other_bytes
    free_gpu_memory_fraction: float
    kv_bytes_per_token: int  # this rank's share of a token's KV (its KV heads)
    kv_pool_bytes: int  # (gpu - weights - runtime) x fraction, floored; 0 where it does not fit
    tokens: int  # whole tokens in the pool, capped by max_tokens
    blocks: int

    @property
    def fits(self) -> bool:
        return self.gpu_bytes - self.weight_bytes - self.runtime_bytes > 0


def gpu_pool(model: ModelShape, gpu: GpuProfile, tokens_per_block: int, max_tokens: int | None = None,
             free_gpu_memory_fraction: float | None = DEFAULT_FREE_GPU_MEMORY_FRACTION,
             other_bytes: int | None = None, tensor_parallel_size: int = 1,
             max_num_tokens: int = DEFAULT_MAX_NUM_TOKENS) -> GpuPool:
    """How TensorRT-LLM sizes the GPU pool (see the module docstring), each part shown: :func:`primary_blocks`'s
    arithmetic, for ``kvtop estimate`` to print and the simulator to use (one computation). Raises ValueError on a
    bad argument, not when the model does not fit (``fits`` says so)."""
    if not isinstance(tensor_parallel_size, int) or tensor_parallel_size <= 0:
        raise ValueError(f"tensor_parallel_size must be a positive int, got {tensor_parallel_size!r}")
    tp = tensor_parallel_size
    if not isinstance(tokens_per_block, int) or tokens_per_block <= 0:
        raise ValueError(f"tokens_per_block must be a positive int, got {tokens_per_block!r}")
    fraction = free_gpu_memory_fraction
    if fraction is None:
        fraction = DEFAULT_FREE_GPU_MEMORY_FRACTION
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"free_gpu_memory_fraction must be between 0 and 1, got {fraction}")
    if max_tokens is not None and (not isinstance(max_tokens, int) or max_tokens < 0):
        raise ValueError(f"max_tokens must be a non-negative int or None, got {max_tokens!r}")
    reserve = runtime_reserve_bytes(model, max_num_tokens) if other_bytes is None else other_bytes
    if reserve < 0:
        raise ValueError(f"other_bytes must be >= 0, got {other_bytes}")
    weights = -(-model.weight_bytes // tp)
    free = gpu.memory_bytes - weights - reserve
    kv_per_token_rank = model.kv_bytes_per_token // min(tp, model.num_kv_heads)
    pool = int(free * fraction) if free > 0 else 0
    tokens = int((free * fraction) // kv_per_token_rank) if free > 0 else 0
    if max_tokens is not None:
        tokens = min(tokens, max_tokens)
    blocks = math.ceil(tokens / tokens_per_block) if tokens > 0 else 0
    return GpuPool(tp, gpu.memory_bytes, weights, reserve, fraction, kv_per_token_rank, pool, tokens, blocks)


def primary_blocks(model: ModelShape, gpu: GpuProfile, tokens_per_block: int, max_tokens: int | None = None,
                   free_gpu_memory_fraction: float | None = DEFAULT_FREE_GPU_MEMORY_FRACTION,
                   other_bytes: int | None = None, tensor_parallel_size: int = 1,
                   max_num_tokens: int = DEFAULT_MAX_NUM_TOKENS) -> int:
    """Blocks in the GPU pool, as TensorRT-LLM sizes it (see the module docstring).

    `free_gpu_memory_fraction` of the memory left after the weights (their real bytes: FP8 linear layers, bf16
    embeddings and LM head) and `other_bytes` (default: `runtime_reserve_bytes(model, max_num_tokens)`), in
    whole tokens, capped by `max_tokens` when given (TensorRT-LLM takes the lesser), then rounded up to whole
    blocks. With tensor parallelism each rank holds 1/tp of the weights and of every token's KV (its KV heads),
    and every rank's pool has the same block count. Qwen3-8B on an H200 at the defaults: about 25,000 blocks of
    32 tokens; Llama-3.1-8B FP8 with an FP8 KV cache: about 60,000. Raises ValueError when the model does not fit.
    """
    pool = gpu_pool(model, gpu, tokens_per_block, max_tokens, free_gpu_memory_fraction, other_bytes,
                    tensor_parallel_size, max_num_tokens)
    if not pool.fits:
        tp = pool.tensor_parallel_size
        per = f" per GPU at tensor parallelism {tp}" if tp > 1 else ""
        raise ValueError(
            f"{model.name} does not fit on {gpu.name}: weights {format_bytes(pool.weight_bytes)}{per} + runtime "
            f"{format_bytes(pool.runtime_bytes)} >= GPU memory {format_bytes(gpu.memory_bytes)}")
    return pool.blocks


def secondary_blocks(model: ModelShape, tokens_per_block: int, host_cache_bytes: int) -> int:
    """Blocks in the host pool for `host_cache_bytes` of `host_cache_size`, exactly as TensorRT-LLM's
    `resource_manager.py`: int(host_cache_size / kv_bytes_per_token / tokens_per_block).
    10 GB on Qwen3-8B with 32-token blocks: int(10e9 / 147456 / 32) = 2,119."""
    if not isinstance(tokens_per_block, int) or tokens_per_block <= 0:
        raise ValueError(f"tokens_per_block must be a positive int, got {tokens_per_block!r}")
    if host_cache_bytes < 0:
        raise ValueError(f"host_cache_bytes must be >= 0, got {host_cache_bytes}")
    return max(0, int(host_cache_bytes / model.kv_bytes_per_token / tokens_per_block))


# Decimal units are powers of 1000 (GB = 1e9, as TensorRT-LLM users write host_cache_size=10e9);
# binary units powers of 1024 (GiB = 2**30, as nvidia-smi and torch report memory).
_UNITS: dict[str, int] = {
    "": 1, "b": 1,
    "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_SIZE_RE = re.compile(r"\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*", re.IGNORECASE)


def parse_size(text: str | int) -> int:
    """Bytes from "10GB" (1e10), "512MiB", "1.5GiB", "1073741824", "10e9" or "0". Case-insensitive.

    Fractions of a byte are dropped ("0.1KiB" is 102). Ambiguous single letters ("10G") and negative or
    malformed sizes raise ValueError saying what is accepted.
    """
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 0:
            raise ValueError(f"size must be >= 0 bytes, got {text}")
        return text
    if not isinstance(text, str):
        raise ValueError(f"size must be a string like '10GB', got {text!r}")
    accepted = ("use a number of bytes or a unit: B, KB, MB, GB, TB (powers of 1000) "
                "or KiB, MiB, GiB, TiB (powers of 1024)")
    match = _SIZE_RE.fullmatch(text)
    if match is None:
        raise ValueError(f"bad size {text!r}: {accepted}")
    number, unit = match.group(1), match.group(2).lower()
    if unit not in _UNITS:
        if unit in ("k", "m", "g", "t"):
            raise ValueError(f"ambiguous size {text!r}: write {unit.upper()}B (powers of 1000) or "
                             f"{unit.upper()}iB (powers of 1024)")
        raise ValueError(f"bad size unit {match.group(2)!r} in {text!r}: {accepted}")
    try:
        value = Decimal(number) * _UNITS[unit]  # Decimal: "1.5GiB" is exactly 1,610,612,736
    except InvalidOperation as exc:  # pragma: no cover - the regex only admits valid decimals
        raise ValueError(f"bad size {text!r}: {accepted}") from exc
    return int(value)


def size_text(n: int) -> str:
    """A size as a person writes it, exactly, so that :func:`parse_size` reads it back (``--help``'s defaults,
    ``--show-settings``): the largest unit that divides it, decimal or binary (32e9 -> "32 GB", 2**33 -> "8 GiB",
    1.5 GiB -> "1536 MiB"); 0 -> "0"; a size no unit divides, in bytes ("1234567 B"). No thousands separators:
    parse_size would not take them back."""
    if n == 0:
        return "0"
    for unit, size in (("TiB", 2**40), ("TB", 10**12), ("GiB", 2**30), ("GB", 10**9), ("MiB", 2**20),
                       ("MB", 10**6), ("KiB", 2**10), ("kB", 10**3)):
        if n % size == 0:
            return f"{n // size} {unit}"
    return f"{n} B"


def format_bytes(n: int | float, binary: bool = True) -> str:
    """Human size with 3 significant digits: 4718592 -> "4.50 MiB"; binary=False: 1e10 -> "10.0 GB"."""
    if n < 0:
        return "-" + format_bytes(-n, binary)
    base = 1024 if binary else 1000
    suffixes = ("KiB", "MiB", "GiB", "TiB", "PiB") if binary else ("kB", "MB", "GB", "TB", "PB")
    if n < base:
        return f"{int(n)} B"
    value = float(n) / base
    index = 0
    while value >= base and index < len(suffixes) - 1:
        value /= base
        index += 1
    suffix = suffixes[index]
    if value >= 100:
        return f"{value:.0f} {suffix}"
    if value >= 10:
        return f"{value:.1f} {suffix}"
    return f"{value:.2f} {suffix}"
