"""The simulator's clock: how long prefill, decode and host<->GPU block copies take.

Two parts, timed separately and added, as the kernels run one after another in a layer:

    iteration = layers x (GEMMs(T) + attention + elementwise + all-reduce) + LM head(R) + step overhead
    copies    = max(onboard, offload) + duplex penalty x min(onboard, offload)      (own CUDA streams, at once)

T is every token the iteration computes (prefill chunks + one per decode request), R the requests that produce a
token (the LM head runs on the last prompt token only: no context logits by default).

- GEMMs: one layer's four (fused QKV, O, gate+up, down, each sharded `tensor_parallel_size` ways) per GEMM
  max(FLOPs / peak, (weights + bf16 activations) / HBM read rate) + a fixed kernel time, times a correction
  measured by `kvtop calibrate` at 1 to 16,384 tokens: the curve measured for this layer's own shapes where the
  profile has one (`GpuProfile.gemm_shape_correction`: the H200's has Llama-3.1/3.3-70B at tp 1 and 2, timed on
  the same machine), else the calibrated model's (`gemm_correction`, Llama-3.1-8B). FP8 checkpoints run FP8
  GEMMs at the measured FP8 rate (H200: 1,430 TFLOP/s, 2.1x bf16's 679 at 16,384 tokens, 1.6x at decode sizes,
  where both stream weights: not an assumed 2x) and read one byte a weight; the LM head stays bf16.
- Attention: decode reads each request's K and V (the KV dtype's bytes: FP8 halves them) at the decode-attention
  read rate measured for a call reading that many bytes (H200: 3,067 GB/s at 67 MB, 4,170 at 537 MB, 4,496 at
  2.1 GB; one call a layer for the batch) + one kernel's fixed time; prefill computes 4 x heads x head_dim FLOPs per
  attended position (causal: a fresh prompt of n tokens attends n(n+1)/2) at the measured FlashAttention rate for
  its length (H200: 244 TFLOP/s at 1,024 tokens, 521 at 4,096, 629 at 16,384), and reads its cached context.
- Elementwise: norms and the SwiGLU product move (4 x hidden + 3 x intermediate) x 2 bytes a token a layer.
- All-reduce, with tensor parallelism: two a layer (after O and down), each from the profile's all-reduce curve
  for the tensor-parallel size (time by message bytes: bench/allreduce_probe.py's output via `kvtop calibrate
  --merge`; the built-in Hopper curve is PUBLISHED, H100 TensorRT-LLM-style custom all-reduce, 2 KiB-4 MiB), past
  its largest size the NVLink bus rate (assumed 360 GB/s); without a curve a fixed latency + 2(tp-1)/tp x the
  bf16 activations over that rate.
- Step overhead: 159 us on the H200 for Llama-3.1-8B (128 graphed small kernels, 4 a layer, 113 us; greedy sampling
  and the host round trip 46 us), measured; the small kernels' 3.54 us a layer is paid for every layer (80-layer
  Llama-3.3-70B: 329 us); plus 7 us per running request (TensorRT-LLM's sampler and request bookkeeping), the one
  figure fitted rather than measured: to v1.0's published Llama-3.1-8B FP8 H200 table (GpuProfile.request_step_us).
- Compute-bound GEMMs run at the sustained rate of a GPU at its power limit: 0.888 of the burst for FP8, 0.938
  for bf16 on the H200 (bench/sustained_probe.py).

Checked on the H200 against plain-PyTorch steps captured in CUDA graphs (bench/results/h200-cost-2026-12-01-*,
Llama-3.1-8B bf16): decode batch 1 x 2,048 context 5.09 ms measured, batch 64 x 1,024 7.19 ms, batch 256 x 2,048
23.3 ms; bench/JOURNAL.md "Cost model" has the model's figures beside them and beside TensorRT-LLM's published
throughput tables.

Host copies: bandwidth from the profile's large pinned copies plus a fixed per-block latency, which on the H200
reproduces both the 55.3 GB/s of 1 GiB copies and the 53.1 GB/s of 64 scattered 4.5 MiB blocks. Onboarding and
offloading run on their own CUDA streams (TensorRT-LLM's KVCacheTransferManager: mOnboardManager and
mOffloadManager; syncTransfers makes the compute stream wait for both before the forward pass), so they overlap
each other but not the forward pass: 64 4 MiB blocks each way took 5.02 and 5.01 ms alone, 5.69 ms at once
(calibrate's copy-overlap figures), hence max + 0.135 x min.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence

from kvtop.engines.gpus import BUILTIN_GPUS, GpuProfile, gemm_layer_model_s
from kvtop.engines.models import ModelShape

__all__ = ["CostModel"]

_H200 = BUILTIN_GPUS["H200"]

# A prefill item is either a token count (a fresh prompt) or (new_tokens, context_tokens_before) for a
# chunk or a prompt whose first blocks were reused from the cache.
PrefillItem = int | tuple[int, int]


def _curve(points: Sequence[Sequence[float]]) -> tuple[list[float], list[float]]:
    pts = sorted((math.log(max(float(x), 1.0)), float(y)) for x, y in points)
    return [p[0] for p in pts], [p[1] for p in pts]


def _interp(xs: list[float], ys: list[float], x: float) -> float:
    """Linear in log x between measured points, flat beyond them."""
    if not xs:
        return 1.0
    lx = math.log(max(x, 1.0))
    if lx <= xs[0]:
        return ys[0]
    if lx >= xs[-1]:
        return ys[-1]
    i = bisect.bisect_right(xs, lx)
    x0, x1, y0, y1 = xs[i - 1], xs[i], ys[i - 1], ys[i]
    return y0 + (y1 - y0) * (lx - x0) / (x1 - x0)


class CostModel:
    """Time, in seconds, of the work TensorRT-LLM does for a given model on a given GPU (one tensor-parallel rank;
    all ranks run in lockstep)."""

    def __init__(self, model: ModelShape, gpu: GpuProfile, *, tensor_parallel_size: int = 1,
                 iteration_overhead_s: float | None = None) -> None:
        if not isinstance(tensor_parallel_size, int) or tensor_parallel_size <= 0:
            raise ValueError(f"tensor_parallel_size must be a positive int, got {tensor_parallel_size!r}")
        if model.num_kv_heads % tensor_parallel_size and tensor_parallel_size % model.num_kv_heads:
            raise ValueError(f"tensor_parallel_size {tensor_parallel_size} does not divide {model.name}'s "
                             f"{model.num_kv_heads} KV heads")
        if iteration_overhead_s is not None and iteration_overhead_s < 0:
            raise ValueError(f"iteration_overhead_s must be >= 0, got {iteration_overhead_s}")
        self.model = model
        self.gpu = gpu
        tp = self.tp = tensor_parallel_size
        h200 = _H200
        if iteration_overhead_s is None:
            step_us = gpu.step_overhead_us if gpu.step_overhead_us is not None else (h200.step_overhead_us or 0.0)
            # the measured step's small kernels are per layer (4 a layer, graphed): a deeper model pays them for
            # each extra layer; sampling and the host round trip are once a step
            layer_us, layers = ((gpu.step_layer_us, gpu.step_layers) if gpu.step_overhead_us is not None
                                else (h200.step_layer_us, h200.step_layers))
            if layer_us is not None and layers:
                step_us += layer_us * (model.num_layers - layers)
            iteration_overhead_s = max(0.0, step_us) * 1e-6
        self.iteration_overhead_s = iteration_overhead_s
        self._read_rate = (gpu.hbm_read_GBps or (h200.hbm_read_GBps or 4496.4) * gpu.hbm_GBps / h200.hbm_GBps) * 1e9
        self._hbm_rate = gpu.hbm_GBps * 1e9
        # decode attention's read rate by the bytes a call reads (one call a layer for the whole batch); another
        # GPU without its own curve takes the H200's scaled by the two peaks
        decode_curve = gpu.attention_decode_GBps or [
            [b, r * self._read_rate / ((h200.hbm_read_GBps or 4496.4) * 1e9)] for b, r in h200.attention_decode_GBps]
        self._decode_rate = _curve(decode_curve) if decode_curve else None
        self._kernel_us = gpu.gemm_kernel_us if gpu.gemm_kernel_us is not None else (h200.gemm_kernel_us or 0.0)
        self._h2d_rate = gpu.h2d_GBps * 1e9
        self._d2h_rate = gpu.d2h_GBps * 1e9
        self._copy_latency_s = gpu.copy_latency_us * 1e-6
        penalty = gpu.copy_duplex_penalty
        self._duplex = penalty if penalty is not None else (h200.copy_duplex_penalty or 0.0)
        fp8 = model.weight_quant == "fp8"
        fp8_rate = gpu.fp8_tflops if gpu.fp8_tflops is not None else None
        # An FP8 checkpoint on a GPU without FP8 GEMMs would be dequantized to bf16 GEMMs: bf16's rate, FP8 bytes.
        gemm_key = "fp8" if fp8 and fp8_rate else "bf16"
        sustained = (gpu.gemm_sustained or h200.gemm_sustained).get(gemm_key, 1.0)
        self._gemm_tflops = (fp8_rate if (fp8 and fp8_rate) else gpu.bf16_tflops) * sustained
        bf16_sustained = (gpu.gemm_sustained or h200.gemm_sustained).get("bf16", 1.0)
        self._lm_tflops = gpu.bf16_tflops * bf16_sustained
        rs = gpu.request_step_us if gpu.request_step_us is not None else (h200.request_step_us or 0.0)
        self.request_step_s = rs * 1e-6
        h, hd = model.hidden_size, model.head_dim
        nh, nkv, inter = model.num_attention_heads, model.num_kv_heads, model.intermediate_size
        self._shapes = [(h, (nh + 2 * nkv) * hd // tp), (nh * hd // tp, h), (h, 2 * inter // tp), (inter // tp, h)]
        corrections = gpu.gemm_correction or h200.gemm_correction
        self._corr = _curve(corrections.get(gemm_key, [[1, 1.0]]))
        self.gemm_curve = "calibrated model's layer"
        # this layer's own shapes measured (one rank's shard): its curve, not the calibrated model's
        shape_curves = gpu.gemm_shape_correction if gpu.gemm_correction else h200.gemm_shape_correction
        for entry in shape_curves:
            if entry.get("dtype") == gemm_key and [tuple(x) for x in entry.get("shapes_KN", [])] == self._shapes:
                self._corr = _curve(entry["correction"])
                self.gemm_curve = "measured for these shapes"
                break
        self._corr_bf16 = _curve(corrections.get("bf16", [[1, 1.0]]))
        self._att = _curve(gpu.attention_prefill_tflops or h200.attention_prefill_tflops or [[1, 600.0]])
        self._wbytes = float(model.linear_weight_bytes)
        self._lm_shape = [(h, model.vocab_size // tp)]
        self._layers = model.num_layers
        kv_heads_rank = max(1, nkv // tp)
        self._kv_bytes_per_token = model.kv_bytes_per_token  # all layers, all ranks (what a block holds)
        self._kv_layer_rank = 2 * kv_heads_rank * hd * model.kv_bytes  # one layer, one rank
        self._att_flops_layer = 4 * max(1, nh // tp) * hd  # per attended position, one layer, one rank
        self._elementwise_bytes = (4 * h + 3 * inter // tp) * model.dtype_bytes
        self._ar_bytes_per_token = h * model.dtype_bytes  # one bf16 activation row
        self._ar_curve: tuple[list[float], list[float]] | None = None
        if tp > 1:
            ar_rate = (gpu.allreduce_GBps or h200.allreduce_GBps or 360.0) * 1e9
            ar_lat = (gpu.allreduce_latency_us if gpu.allreduce_latency_us is not None
                      else (h200.allreduce_latency_us or 0.0)) * 1e-6
            self._ar_lat = 2 * ar_lat
            # a bus rate: each rank moves 2(tp-1)/tp of the message
            self._ar_msg_rate = ar_rate * tp / (2 * (tp - 1))
            self._ar_per_token = 2 * self._ar_bytes_per_token / self._ar_msg_rate
            curve = (gpu.allreduce_curve if gpu.allreduce_curve else h200.allreduce_curve).get(str(tp))
            if curve:
                pts = sorted((float(b), float(us) * 1e-6) for b, us in curve)
                self._ar_curve = ([b for b, _ in pts], [t for _, t in pts])
                self._ar_lat = 0.0
                self._ar_per_token = 0.0
        else:
            self._ar_lat = 0.0
            self._ar_per_token = 0.0
            self._ar_msg_rate = 0.0
        self._ar_memo: dict[int, float] = {}
        self._gemm_memo: dict[int, float] = {}
        self._lm_memo: dict[int, float] = {}

    def __repr__(self) -> str:
        return f"CostModel({self.model.name!r}, {self.gpu.name!r}, tp={self.tp})"

    # --- sizes -----------------------------------------------------------------------------------------

    def kv_bytes_per_block(self, tokens_per_block: int) -> int:
        """Bytes of one KV block of this model (Qwen3-8B bf16, 32 tokens: 4.5 MiB), all ranks together."""
        return self.model.kv_bytes_per_block(tokens_per_block)

    # --- FLOPs -----------------------------------------------------------------------------------------

    def prefill_flops(self, new_tokens: int, context_tokens_before: int = 0) -> float:
        """FLOPs of prefilling `new_tokens` after `context_tokens_before` cached ones, LM head included, all ranks."""
        n, c = _check_counts(new_tokens, context_tokens_before)
        if n == 0:
            return 0.0
        m = self.model
        attended = n * c + n * (n + 1) // 2  # token i (1-based) of the chunk attends to c + i positions
        return 2.0 * m.matmul_params * n + m.attention_flops_per_context_token * attended + 2.0 * m.lm_head_params

    # --- parts -----------------------------------------------------------------------------------------

    def gemm_layer_s(self, tokens: int) -> float:
        """One layer's GEMMs at `tokens` rows (one rank), calibrated."""
        t = self._gemm_memo.get(tokens)
        if t is None:
            base = gemm_layer_model_s(self._shapes, tokens, self._gemm_tflops, self._read_rate / 1e9, self._wbytes,
                                      self._kernel_us)
            t = self._gemm_memo[tokens] = base * _interp(*self._corr, tokens)
        return t

    def lm_head_s(self, rows: int) -> float:
        """The bf16 LM head for `rows` requests (one rank's vocabulary shard)."""
        t = self._lm_memo.get(rows)
        if t is None:
            base = gemm_layer_model_s(self._lm_shape, rows, self._lm_tflops, self._read_rate / 1e9,
                                      float(self.model.dtype_bytes), self._kernel_us)
            t = self._lm_memo[rows] = base * _interp(*self._corr_bf16, rows)
        return t

    def allreduce_s(self, tokens: int) -> float:
        """One all-reduce of `tokens` bf16 activation rows (a layer runs two). From the profile's curve for this
        tensor-parallel size (linear in bytes between its sizes, flat below the smallest, the bus rate
        `allreduce_GBps` past the largest), else `allreduce_latency_us` + bytes at that rate; 0 without tensor
        parallelism. Llama-3.3-70B TP2 on the H200, 64 tokens (1 MiB): 7.9 us."""
        if self.tp == 1 or tokens <= 0:
            return 0.0
        t = self._ar_memo.get(tokens)
        if t is None:
            nbytes = float(tokens * self._ar_bytes_per_token)
            if self._ar_curve is None:
                t = self._ar_lat / 2 + nbytes / self._ar_msg_rate
            else:
                xs, ys = self._ar_curve
                if nbytes <= xs[0]:
                    t = ys[0]
                elif nbytes >= xs[-1]:
                    t = ys[-1] + (nbytes - xs[-1]) / self._ar_msg_rate
                else:
                    i = bisect.bisect_right(xs, nbytes)
                    t = ys[i - 1] + (ys[i] - ys[i - 1]) * (nbytes - xs[i - 1]) / (xs[i] - xs[i - 1])
            self._ar_memo[tokens] = t
        return t

    def _prefill_attention_layer_s(self, n: int, c: int) -> float:
        flops = self._att_flops_layer * (n * c + n * (n + 1) // 2)
        rate = _interp(*self._att, n + c) * 1e12
        return flops / rate + self._kv_layer_rank * c / self._read_rate

    # --- device times ----------------------------------------------------------------------------------

    def prefill_s(self, new_tokens: int, context_tokens_before: int = 0) -> float:
        """Device time to prefill one request's `new_tokens` after `context_tokens_before` cached tokens, LM head
        included (no step overhead). Llama-3.1-8B bf16 on the H200, 8,192 fresh tokens: about 190 ms."""
        n, c = _check_counts(new_tokens, context_tokens_before)
        if n == 0:
            return 0.0
        return self._device_s([(n, c)], [])

    def decode_step_s(self, batch_size: int, total_context_tokens: int) -> float:
        """Device time of one decode step for `batch_size` requests attending to `total_context_tokens`
        positions in all (no step overhead). Llama-3.1-8B bf16 on the H200, batch 64 x 1,024: about 6.9 ms."""
        b, ctx = _check_counts(batch_size, total_context_tokens)
        if b == 0:
            return 0.0
        share, extra = divmod(ctx, b)
        return self._device_s([], [share + (1 if i < extra else 0) for i in range(b)])

    def _device_s(self, prefill_items: Sequence[tuple[int, int]], decode_contexts: Sequence[int]) -> float:
        return self._device_s_sum(prefill_items, len(decode_contexts), sum(decode_contexts))

    def _device_s_sum(self, prefill_items: Sequence[tuple[int, int]], d: int, decode_context_sum: int) -> float:
        """``_device_s`` with the decode requests given as their count and the sum of their contexts: all the
        decode term reads of them (the same arithmetic, so the same float)."""
        tokens = 0
        requests = 0
        attention = 0.0
        for n, c in prefill_items:
            if n == 0:
                continue
            tokens += n
            requests += 1
            attention += self._prefill_attention_layer_s(n, c)
        if prefill_items and requests:
            attention += self._kernel_us * 1e-6
        if d:
            tokens += d
            requests += d
            # read every request's context and write its new token
            kv_bytes = self._kv_layer_rank * (decode_context_sum + d)
            rate = _interp(*self._decode_rate, kv_bytes) * 1e9 if self._decode_rate else self._read_rate
            attention += kv_bytes / rate + self._kernel_us * 1e-6
        if requests == 0:
            return 0.0
        per_layer = (self.gemm_layer_s(tokens) + attention + tokens * self._elementwise_bytes / self._hbm_rate
                     + 2 * self.allreduce_s(tokens))
        return self._layers * per_layer + self.lm_head_s(requests)

    def device_s(self, prefill_items: Sequence[tuple[int, int]], decode_contexts: Sequence[int]) -> float:
        """The GPU's part of an iteration (no step overhead, no per-request engine work): what a CUDA-graphed
        plain-PyTorch step measures."""
        return self._device_s(prefill_items, decode_contexts)

    def iteration_s(self, prefill_tokens_list: Iterable[PrefillItem],
                    decode_contexts: Sequence[int]) -> float:
        """Time of one in-flight-batching iteration: prefill chunks and decode tokens in one forward pass.

        `prefill_tokens_list`: per context request, its new token count, or (new_tokens, context_before).
        `decode_contexts`: per generation request, the positions its new token attends to.
        All tokens share each layer's GEMMs (one pass over the weights), attention is per request, plus
        `iteration_overhead_s` and `request_step_s` per request. An empty iteration costs nothing.
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
        lengths, all non-negative ints (the engine loop's own counts), without the per-item checks."""
        return self.iteration_s_sum(prefill_items, len(decode_contexts), sum(decode_contexts))

    def iteration_s_sum(self, prefill_items: Sequence[tuple[int, int]], num_decode: int,
                        decode_context_sum: int) -> float:
        """``iteration_s_unchecked`` with the decode requests given as their count and the sum of their contexts
        (what the decode term reads of them): the same float. The trace replay's engine keeps the sum as requests
        join and leave instead of listing every generation request every iteration (kvtop.engines.sim.decode_accel).
        """
        device = self._device_s_sum(prefill_items, num_decode, decode_context_sum)
        if not device:
            return 0.0
        requests = num_decode + sum(1 for n, _ in prefill_items if n)
        return device + self.iteration_overhead_s + requests * self.request_step_s

    # --- host <-> GPU copies ---------------------------------------------------------------------------

    def onboard_s(self, num_blocks: int, tokens_per_block: int) -> float:
        """Time to copy `num_blocks` blocks host->GPU (reuse of offloaded blocks), one copy per block.

        Qwen3-8B on the H200, 256 blocks of 32 tokens (8,192 tokens, 1.125 GiB): 22.8 ms (53.1 GB/s).
        """
        (n,) = _check_counts(num_blocks)
        return n * (self.kv_bytes_per_block(tokens_per_block) / self.tp / self._h2d_rate + self._copy_latency_s)

    def offload_s(self, num_blocks: int, tokens_per_block: int) -> float:
        """Time to copy `num_blocks` blocks GPU->host (offload on eviction), one copy per block."""
        (n,) = _check_counts(num_blocks)
        return n * (self.kv_bytes_per_block(tokens_per_block) / self.tp / self._d2h_rate + self._copy_latency_s)

    def transfers_s(self, onboard_blocks: int, offload_blocks: int, tokens_per_block: int) -> float:
        """An iteration's onboards and offloads, issued on their own CUDA streams, as the forward pass waits for
        them: max(onboard, offload) + duplex penalty x min(onboard, offload). On the H200 a host hit that evicts as
        many blocks as it onboards takes 1.135x the onboard alone, not 2x. Each tensor-parallel rank copies its
        own share of a block over its own link."""
        on = self.onboard_s(onboard_blocks, tokens_per_block)
        off = self.offload_s(offload_blocks, tokens_per_block)
        return max(on, off) + self._duplex * min(on, off)


def _check_counts(*counts: int) -> tuple[int, ...]:
    for value in counts:
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ValueError(f"token and block counts must be non-negative ints, got {value!r}")
    return counts
