"""The simulator's clock: how long prefill, decode and host<->GPU block copies take.

A roofline over a model shape (`ModelShape`) and a GPU's achievable rates (`GpuProfile`):

    forward time = max(FLOPs / (bf16_tflops x prefill_efficiency), bytes moved in HBM / hbm_GBps)
    copy time    = blocks x (bytes per block / link GB/s + copy_latency_us)

FLOPs (see `ModelShape.prefill_flops_per_token`):
- 2 x matmul_params per token (QKV/O projections and MLP; embeddings excluded, a lookup costs nothing);
- 4 x layers x heads x head_dim per attended position (QK^T and P.V), causal, so a fresh prompt of n
  tokens spends that times n(n+1)/2; a chunk of n tokens after c cached ones, times n*c + n(n+1)/2;
- the LM head, 2 x vocab x hidden, once per request per iteration: TensorRT-LLM computes logits only for
  the last prompt token (no context logits by default), and one per decode step.
HBM bytes: every weight except the embedding table once per forward (the LM head in full), plus the KV
cache the attention reads (context before the new tokens) and writes (the new tokens).

The prefill efficiency (0.88) is calibrated on the H200 anchor: 8,192 tokens through 36 Qwen3-8B layers
took 191.4 ms. Counted as above (causal attention, no LM head, as that measurement had none) that is
1.336e14 FLOP, i.e. 698 TFLOP/s, 0.88 of the 791 TFLOP/s the same GPU reached on large GEMMs. Causal
counting is the consistent reading: counting full N^2 attention would need 802 TFLOP/s, more than the GEMM
rate. The anchor ran plain PyTorch layers (unfused norms, RoPE, activations; random weights); TensorRT-LLM
fuses those, so it is if anything faster, but it is the only end-to-end prefill measured on this GPU, and
calibrating to it keeps recompute-vs-reload ratios honest. Residuals against the other anchors: 2,048
tokens -4% (42.6 vs 44.2 ms); 512 tokens -36% (10.3 vs 16.2 ms), where plain PyTorch's per-kernel launch
cost (36 layers x ~20 small kernels) dominates; TensorRT-LLM's fused, CUDA-graphed kernels avoid most of
that, so no launch term is modelled beyond `iteration_overhead_s`.

Decode is HBM-bound: Qwen3-8B at batch 8 with 4,096 context each reads 15.1 GB of weights and 4.8 GB of KV
per step: 4.7 ms at 4,250 GB/s, against 0.2 ms of compute.

Host copies: bandwidth from the profile's large pinned copies plus a fixed per-block latency, which on the
H200 anchor reproduces both the 55.3 GB/s of 1 GiB copies and the 53.1 GB/s of 64 scattered 4.5 MiB blocks.
Reloading 8,192 Qwen3-8B tokens (256 blocks of 32) then takes 22.8 ms against the anchor's 21.8 ms for one
contiguous copy, and recompute/reload is 8.4 against the anchor's 8.8.

Durations only: whether a copy overlaps compute (TensorRT-LLM offloads on a side stream, and onboards before
the request's context step) is the engine loop's decision, not the cost model's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from kvtop.engines.gpus import GpuProfile
from kvtop.engines.models import ModelShape

__all__ = ["ITERATION_OVERHEAD_S", "PREFILL_EFFICIENCY", "CostModel"]

# Fraction of the GPU's achievable GEMM rate a whole forward pass reaches; calibrated on the H200 anchor
# (Qwen3-8B, 8,192 tokens: 698 / 791 TFLOP/s = 0.882). See the module docstring.
PREFILL_EFFICIENCY = 0.88

# Host-side cost of one engine iteration on top of device time (scheduling, sampling, bookkeeping).
# Assumed, not measured: TensorRT-LLM 1.x's PyTorch backend hides most host work behind the GPU with its
# overlap scheduler (on by default); 0.5 ms covers what is left. A calibration run should replace it.
ITERATION_OVERHEAD_S = 0.0005

# A prefill item is either a token count (a fresh prompt) or (new_tokens, context_tokens_before) for a
# chunk or a prompt whose first blocks were reused from the cache.
PrefillItem = int | tuple[int, int]


class CostModel:
    """Time, in seconds, of the work TensorRT-LLM does for a given model on a given GPU."""

    def __init__(self, model: ModelShape, gpu: GpuProfile, *, prefill_efficiency: float = PREFILL_EFFICIENCY,
                 iteration_overhead_s: float = ITERATION_OVERHEAD_S) -> None:
        if not 0 < prefill_efficiency <= 1:
            raise ValueError(f"prefill_efficiency must be in (0, 1], got {prefill_efficiency}")
        if iteration_overhead_s < 0:
            raise ValueError(f"iteration_overhead_s must be >= 0, got {iteration_overhead_s}")
        self.model = model
        self.gpu = gpu
        self.prefill_efficiency = prefill_efficiency
        self.iteration_overhead_s = iteration_overhead_s
        self._flop_rate = gpu.bf16_tflops * 1e12 * prefill_efficiency  # FLOP/s
        self._hbm_rate = gpu.hbm_GBps * 1e9  # bytes/s
        self._h2d_rate = gpu.h2d_GBps * 1e9
        self._d2h_rate = gpu.d2h_GBps * 1e9
        self._copy_latency_s = gpu.copy_latency_us * 1e-6
        # Per-iteration constants, computed once (ModelShape is frozen; its properties recompute on every read, and
        # iteration_s runs once per engine iteration with one term per running request).
        self._kv_bytes_per_token = model.kv_bytes_per_token
        self._attention_flops = model.attention_flops_per_context_token
        self._two_matmul_params = 2.0 * model.matmul_params
        self._decode_token_flops = 2.0 * model.matmul_params + self._lm_head_flops()  # as decode_step_s adds them
        self._weight_read_bytes = model.weight_read_bytes

    def __repr__(self) -> str:
        return f"CostModel({self.model.name!r}, {self.gpu.name!r}, efficiency={self.prefill_efficiency})"

    # --- sizes -----------------------------------------------------------------------------------------

    def kv_bytes_per_block(self, tokens_per_block: int) -> int:
        """Bytes of one KV block of this model (Qwen3-8B, 32 tokens: 4.5 MiB)."""
        return self.model.kv_bytes_per_block(tokens_per_block)

    # --- FLOPs and bytes -------------------------------------------------------------------------------

    def _lm_head_flops(self) -> int:
        return 2 * self.model.lm_head_params

    def prefill_flops(self, new_tokens: int, context_tokens_before: int = 0) -> float:
        """FLOPs of prefilling `new_tokens` after `context_tokens_before` cached ones, LM head included."""
        n, c = _check_counts(new_tokens, context_tokens_before)
        if n == 0:
            return 0.0
        m = self.model
        # Token i (1-based) of the chunk attends to c + i positions: sum = n*c + n(n+1)/2.
        attended = n * c + n * (n + 1) // 2
        matmul = 2.0 * m.matmul_params * n
        return matmul + m.attention_flops_per_context_token * attended + self._lm_head_flops()

    def _forward_s(self, flops: float, hbm_bytes: float) -> float:
        return max(flops / self._flop_rate, hbm_bytes / self._hbm_rate)

    # --- device times ----------------------------------------------------------------------------------

    def prefill_s(self, new_tokens: int, context_tokens_before: int = 0) -> float:
        """Device time to prefill one request's `new_tokens` after `context_tokens_before` cached tokens.

        Compute-bound for any realistic prompt: Qwen3-8B on the H200, 8,192 fresh tokens: 192 ms.
        """
        n, c = _check_counts(new_tokens, context_tokens_before)
        if n == 0:
            return 0.0
        kv = self.model.kv_bytes_per_token
        hbm_bytes = self.model.weight_read_bytes + kv * c + kv * n
        return self._forward_s(self.prefill_flops(n, c), hbm_bytes)

    def decode_step_s(self, batch_size: int, total_context_tokens: int) -> float:
        """Device time of one decode step for `batch_size` requests attending to `total_context_tokens`
        positions in all (the sum of their context lengths).

        HBM-bound: weights once plus every request's KV. Qwen3-8B on the H200, batch 8 x 4,096: 4.7 ms.
        """
        b, ctx = _check_counts(batch_size, total_context_tokens)
        if b == 0:
            return 0.0
        m = self.model
        per_token = 2.0 * m.matmul_params + self._lm_head_flops()
        flops = b * per_token + m.attention_flops_per_context_token * ctx
        hbm_bytes = m.weight_read_bytes + m.kv_bytes_per_token * (ctx + b)  # read the context, write b tokens
        return self._forward_s(flops, hbm_bytes)

    def iteration_s(self, prefill_tokens_list: Iterable[PrefillItem],
                    decode_contexts: Sequence[int]) -> float:
        """Time of one in-flight-batching iteration: prefill chunks and decode tokens in one forward pass.

        `prefill_tokens_list`: per context request, its new token count, or (new_tokens, context_before).
        `decode_contexts`: per generation request, the positions its new token attends to.
        All tokens share one pass over the weights, as TensorRT-LLM's mixed batches do; FLOPs add up, HBM
        traffic is the weights once plus every request's KV. Plus `iteration_overhead_s`. An empty
        iteration costs nothing.
        """
        items: list[tuple[int, int]] = []
        for item in prefill_tokens_list:
            if isinstance(item, tuple):
                if len(item) != 2:
                    raise ValueError(f"a prefill item is n or (n, context_before), got {item!r}")
                n, c = _check_counts(*item)
            else:
                n, c = _check_counts(item, 0)
            items.append((n, c))
        contexts = [_check_counts(ctx)[0] for ctx in decode_contexts]
        return self.iteration_s_unchecked(items, contexts)

    def iteration_s_unchecked(self, prefill_items: Sequence[tuple[int, int]], decode_contexts: Sequence[int]) -> float:
        """``iteration_s`` for arguments already known to be valid: (new_tokens, context_before) pairs and context
        lengths, all non-negative ints (the engine loop's own counts). Same arithmetic, in the same order, so the
        same float to the last bit; without the per-item checks, which were a third of its cost."""
        kv = self._kv_bytes_per_token
        attention = self._attention_flops
        two_matmul = self._two_matmul_params
        lm_head = self._lm_head_flops()
        flops = 0.0
        kv_bytes = 0
        requests = 0
        for n, c in prefill_items:
            if n == 0:
                continue
            # prefill_flops(n, c), term by term
            flops += two_matmul * n + attention * (n * c + n * (n + 1) // 2) + lm_head
            kv_bytes += kv * (c + n)
            requests += 1
        token_flops = self._decode_token_flops
        for ctx in decode_contexts:
            flops += token_flops + attention * ctx
        kv_bytes += kv * (sum(decode_contexts) + len(decode_contexts))  # sum of kv * (ctx + 1), in exact ints
        requests += len(decode_contexts)
        if requests == 0:
            return 0.0
        return self._forward_s(flops, self._weight_read_bytes + kv_bytes) + self.iteration_overhead_s

    # --- host <-> GPU copies ---------------------------------------------------------------------------

    def onboard_s(self, num_blocks: int, tokens_per_block: int) -> float:
        """Time to copy `num_blocks` blocks host->GPU (reuse of offloaded blocks), one copy per block.

        Qwen3-8B on the H200, 256 blocks of 32 tokens (8,192 tokens, 1.125 GiB): 22.8 ms (53.1 GB/s).
        """
        (n,) = _check_counts(num_blocks)
        return n * (self.kv_bytes_per_block(tokens_per_block) / self._h2d_rate + self._copy_latency_s)

    def offload_s(self, num_blocks: int, tokens_per_block: int) -> float:
        """Time to copy `num_blocks` blocks GPU->host (offload on eviction), one copy per block."""
        (n,) = _check_counts(num_blocks)
        return n * (self.kv_bytes_per_block(tokens_per_block) / self._d2h_rate + self._copy_latency_s)


def _check_counts(*counts: int) -> tuple[int, ...]:
    for value in counts:
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"token and block counts must be non-negative ints, got {value!r}")
    return counts
