"""`kvtop calibrate`: measure this machine's GPU and host link into a GPU profile.

    kvtop calibrate --model Qwen/Qwen3-8B --out profile.json [--quick]
    kvtop calibrate --merge allreduce.json [--merge gemm-shapes.json] --profile profile.json --out tp.json

Needs PyTorch with CUDA and an NVIDIA GPU; without either it says which is missing and exits non-zero (2: no
PyTorch, 3: no usable GPU). Measures, with the same keys as `shared/anchors/h200-2026-11-29.json`:

- host<->GPU copy bandwidth, pinned and pageable host memory, at 2 MiB, the model's block size (4.5 MiB for
  Qwen3-8B at 32 tokens per block), 64 MiB and 1 GiB (256 MiB with --quick);
- 64 scattered block copies each way, one copy per block, as TensorRT-LLM onboards and offloads; the gap to
  the large-copy rate gives the fixed per-copy latency (3.57 us on the H200 anchor);
- HBM copy bandwidth (device-to-device, bytes read plus written), bf16 GEMM rate (two shapes);
- a prefill proxy for the model's shape: one transformer layer of it (QKV, causal SDPA attention with the
  model's KV heads, O, SwiGLU MLP, residual adds; random bf16 weights) over N tokens, timed and scaled to all
  layers. RMSNorm and RoPE are left out: TensorRT-LLM fuses them into neighbouring kernels, and unfused in
  plain PyTorch they added 0.7 ms a layer at 8,192 Qwen3-8B tokens (6.9 vs 6.2 ms) on the H200;
  against reloading those N tokens' KV from pinned memory; `prefill_efficiency` = the FLOPs / time / GEMM rate
  (a check on the cost model, which times the parts below instead);
- what the two-part cost model reads (`kvtop.engines.gpus.cost_rates_from_measured` turns these into the
  profile's `fp8_tflops`, `hbm_read_GBps`, `gemm_kernel_us`, `gemm_correction`, `attention_prefill_tflops`,
  `step_overhead_us`, `copy_duplex_penalty`): one layer's four GEMMs at 1 to 16,384 tokens in bf16 and, where the
  GPU has it (compute capability 8.9+, `torch._scaled_mm`), FP8 with exact and fast accumulation; decode
  attention over 1,024-16,384 context tokens as a KV read rate and causal prefill attention as a FLOP rate; the
  fixed per-step cost (4 small kernels a layer replayed from a CUDA graph, greedy sampling, the host round trip);
  onboard and offload block copies on two streams alone and at once, and a GEMM with a copy beside it.

Writes the profile with `kvtop.engines.gpus.save_profile`, so `resolve_gpu(path)` / `load_profile` read it
and the simulator, `estimate` and the dashboard take it wherever they take a GPU name (a profile written before
the cost-model fields existed gets them from its raw figures). On the H200 device machine (2026-12-01) the full
run took 11 s, PyTorch's start excluded; profiles/h200-calibrated-2026-12-01.json is its output.

Measured there: pinned 1 GiB copies 55.4 / 55.4 GB/s, 64 scattered 4 MiB blocks 53.1 / 53.3 GB/s, HBM copy
4,251 GB/s; one Llama-3.1-8B layer's GEMMs bf16 679 TFLOP/s and FP8 1,430 at 16,384 tokens (127 vs 79 us at one
token); decode attention 4,496 GB/s; prefill attention 629 TFLOP/s at 16,384 tokens; 159 us a step; onboard and
offload at once 1.135x the longer of the two. (2026-11-29, Qwen3-8B: bf16 GEMM 686 sustained against the anchor's
791 burst; prefill proxy 222 ms for 8,192 tokens, recompute/reload 10.2.)
"""

from __future__ import annotations

import datetime as _dt
import functools
import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from kvtop.engines.gpus import (
    COST_FIELDS,
    LINKS,
    GpuProfile,
    cost_rates_from_measured,
    merge_probe,
    resolve_gpu,
    save_profile,
)
from kvtop.engines.models import ModelShape, read_json_object, resolve_model
from kvtop.textsafe import clean

__all__ = ["CalibrationUnavailable", "calibrate", "merge_probes", "run_calibrate"]

_MIB = 1 << 20
EXIT_NO_TORCH = 2
EXIT_NO_GPU = 3


class CalibrationUnavailable(RuntimeError):
    """Calibration cannot run here (no PyTorch, no CUDA build, no visible GPU); `exit_code` says which."""

    def __init__(self, message: str, exit_code: int):
        super().__init__(message)
        self.exit_code = exit_code


def _load_torch() -> Any:
    try:
        import torch
    except ImportError:
        raise CalibrationUnavailable(
            "PyTorch with CUDA is needed, and PyTorch is not installed here "
            "(pip install torch, a CUDA build, on the machine with the GPU)", EXIT_NO_TORCH) from None
    try:
        available = bool(torch.cuda.is_available()) and torch.cuda.device_count() > 0
    except Exception as exc:  # a broken driver raises here on some builds
        available = False
        why = f" ({type(exc).__name__}: {exc})"
    else:
        why = ""
    if not available:
        cuda = getattr(getattr(torch, "version", None), "cuda", None)
        build = f"a CUDA {cuda} build" if cuda else "a CPU-only build (no CUDA)"
        raise CalibrationUnavailable(
            f"an NVIDIA GPU is needed: PyTorch {getattr(torch, '__version__', '?')} is {build} and "
            f"sees no CUDA device{why}. Run it on the GPU machine; `kvtop estimate --gpu H200` works without one.",
            EXIT_NO_GPU)
    return torch


def _size_label(n: int) -> str:
    return f"{n / _MIB:g}MiB"


class _Timer:
    """Wall-clock timing of GPU work, synchronized on both ends; median of `batches` batches."""

    def __init__(self, torch: Any):
        self.torch = torch

    def seconds(self, fn: Callable[[], None], reps: int, batches: int = 3, warmup_s: float = 0.0) -> float:
        sync = self.torch.cuda.synchronize
        fn()  # warm-up: first-touch, cuBLAS/SDPA kernel selection
        sync()
        # Compute-bound work also needs the clocks up: an idle H200 sits at 345 MHz and takes a few hundred
        # ms of load to reach 1,980 MHz (seen on the device machine), which cost the first GEMMs ~10%.
        t_end = time.perf_counter() + warmup_s
        while time.perf_counter() < t_end:
            fn()
            sync()
        per = []
        for _ in range(batches):
            t0 = time.perf_counter()
            for _ in range(reps):
                fn()
            sync()
            per.append((time.perf_counter() - t0) / reps)
        return statistics.median(per)


def _copier(dst: Any, src: Any, non_blocking: bool) -> Callable[[], None]:
    def copy() -> None:
        dst.copy_(src, non_blocking=non_blocking)
    return copy


def _copy_bandwidth(torch: Any, timer: _Timer, sizes: Sequence[int], dev: Any, budget_bytes: int,
                    log: Callable[[str], None]) -> dict[str, float]:
    out: dict[str, float] = {}
    for n in sizes:
        gpu = torch.empty(n, dtype=torch.uint8, device=dev)
        for kind in ("pinned", "pageable"):
            host = torch.empty(n, dtype=torch.uint8, pin_memory=(kind == "pinned"))
            host.fill_(1)  # touch every page: first-touch faults are not link time
            # Pageable copies run at 7-15 GB/s (anchor): fewer reps keep a 1 GiB size near 1 s in all.
            reps = max(2, min(50, budget_bytes // n // (4 if kind == "pageable" else 1)))
            nb = kind == "pinned"
            h2d = timer.seconds(_copier(gpu, host, nb), reps)
            d2h = timer.seconds(_copier(host, gpu, nb), reps)
            label = _size_label(n)
            out[f"h2d_GBps_{label}_{kind}"] = n / h2d / 1e9
            out[f"d2h_GBps_{label}_{kind}"] = n / d2h / 1e9
            log(f"  {label:>9} {kind:8}  host->GPU {out[f'h2d_GBps_{label}_{kind}']:6.1f} GB/s   "
                f"GPU->host {out[f'd2h_GBps_{label}_{kind}']:6.1f} GB/s")
            del host
        del gpu
    return out


def _scattered_blocks(torch: Any, timer: _Timer, block_bytes: int, dev: Any, n_blocks: int = 64) -> dict[str, float]:
    """`n_blocks` single-block copies between random slots of a pinned host pool and a GPU pool, each way."""
    gen = torch.Generator().manual_seed(0)
    pool = 2 * n_blocks
    host = torch.empty((pool, block_bytes), dtype=torch.uint8, pin_memory=True)
    host.fill_(1)
    gpu = torch.empty((pool, block_bytes), dtype=torch.uint8, device=dev)
    src = torch.randperm(pool, generator=gen)[:n_blocks].tolist()
    dst = torch.randperm(pool, generator=gen)[:n_blocks].tolist()

    def onboard() -> None:
        for s, d in zip(src, dst):
            gpu[d].copy_(host[s], non_blocking=True)

    def offload() -> None:
        for s, d in zip(src, dst):
            host[s].copy_(gpu[d], non_blocking=True)

    label = f"{n_blocks}x{_size_label(block_bytes)}"
    total = n_blocks * block_bytes
    out = {f"onboard_{label}_blocks_GBps": total / timer.seconds(onboard, 5) / 1e9,
           f"offload_{label}_blocks_GBps": total / timer.seconds(offload, 5) / 1e9}
    return out


def _hbm(torch: Any, timer: _Timer, n: int, dev: Any) -> float:
    a = torch.empty(n, dtype=torch.uint8, device=dev)
    b = torch.empty(n, dtype=torch.uint8, device=dev)
    a.fill_(1)
    t = timer.seconds(lambda: b.copy_(a), 10)
    return 2 * n / t / 1e9  # each byte read once and written once


def _gemm_tflops(torch: Any, timer: _Timer, m: int, n: int, k: int, dev: Any) -> float:
    a = torch.randn(m, k, device=dev, dtype=torch.bfloat16)
    b = torch.randn(k, n, device=dev, dtype=torch.bfloat16)
    # 8192^3 is 1.1 TFLOP (~1.4 ms): 40 reps make a 50 ms batch, long against launch and sync costs.
    t = timer.seconds(lambda: torch.matmul(a, b), 40, warmup_s=0.5)
    return 2.0 * m * n * k / t / 1e12


def _prefill_layer_s(torch: Any, timer: _Timer, model: ModelShape, tokens: int, dev: Any) -> float:
    """Seconds for `tokens` fresh prompt tokens through one layer shaped like `model` (random weights).

    Attention runs both ways, SDPA's native GQA and KV heads expanded to all query heads, and the faster
    counts: which SDPA kernel takes the native path depends on the torch build, and an engine runs a
    GQA-native kernel either way.
    """
    F = torch.nn.functional
    bf16 = torch.bfloat16
    h, hd = model.hidden_size, model.head_dim
    nh, nkv, inter = model.num_attention_heads, model.num_kv_heads, model.intermediate_size

    def w(i: int, o: int) -> Any:
        return torch.randn(i, o, device=dev, dtype=bf16) * 0.02

    w_qkv, w_o = w(h, (nh + 2 * nkv) * hd), w(nh * hd, h)
    w_gu, w_down = w(h, 2 * inter), w(inter, h)
    x0 = torch.randn(tokens, h, device=dev, dtype=bf16)
    try:
        F.scaled_dot_product_attention(torch.zeros(1, 2, 4, 8, device=dev, dtype=bf16),
                                       torch.zeros(1, 1, 4, 8, device=dev, dtype=bf16),
                                       torch.zeros(1, 1, 4, 8, device=dev, dtype=bf16), is_causal=True,
                                       enable_gqa=True)
        gqa = True
    except TypeError:  # torch < 2.5: no enable_gqa, expand the KV heads instead
        gqa = False

    def layer(native: bool) -> None:
        x = x0
        qkv = x @ w_qkv
        q, k, v = qkv.split([nh * hd, nkv * hd, nkv * hd], dim=-1)
        q = q.view(1, tokens, nh, hd).transpose(1, 2)
        k = k.view(1, tokens, nkv, hd).transpose(1, 2)
        v = v.view(1, tokens, nkv, hd).transpose(1, 2)
        if native:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            rep = nh // nkv
            a = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1),
                                               is_causal=True)
        x = x + a.transpose(1, 2).reshape(tokens, nh * hd) @ w_o
        g, u = (x @ w_gu).split([inter, inter], dim=-1)
        x = x + (F.silu(g) * u) @ w_down

    with torch.inference_mode():
        times = []
        for native in ((True, False) if gqa else (False,)):
            times.append(timer.seconds(functools.partial(layer, native), 5, warmup_s=0.2))
        return min(times)


def _fp8_usable(torch: Any, dev: Any) -> bool:
    """FP8 GEMMs need compute capability 8.9+ (Ada, Hopper) and a torch with float8 types and _scaled_mm."""
    try:
        return (tuple(torch.cuda.get_device_capability(dev)) >= (8, 9) and hasattr(torch, "float8_e4m3fn")
                and hasattr(torch, "_scaled_mm"))
    except Exception:
        return False


def layer_gemm_shapes(model: ModelShape, tp: int = 1) -> list[tuple[int, int]]:
    """(K, N) of the four GEMMs of one decoder layer, as TensorRT-LLM fuses them (QKV, O, gate+up, down), sharded
    `tp` ways (column-parallel QKV and gate+up split N, row-parallel O and down split K)."""
    h, hd = model.hidden_size, model.head_dim
    nh, nkv, inter = model.num_attention_heads, model.num_kv_heads, model.intermediate_size
    return [(h, (nh + 2 * nkv) * hd // tp), (nh * hd // tp, h), (h, 2 * inter // tp), (inter // tp, h)]


GEMM_TOKENS = (1, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192, 16384)


def _gemm_layer_s(torch: Any, timer: _Timer, shapes: Sequence[tuple[int, int]], m: int, fp8: bool,
                  dev: Any, fast_accum: bool = False) -> float:
    """Seconds for one layer's GEMMs at `m` tokens (bf16, or FP8 inputs with bf16 output via torch._scaled_mm,
    per-tensor scales, as a ModelOpt FP8 checkpoint runs on Hopper). _scaled_mm wants dims that are multiples of 16,
    so `m` is padded up to 16, as CUDA-graph padding does for small decode batches."""
    bf16 = torch.bfloat16
    mp = max(16, -(-m // 16) * 16) if fp8 else m
    ops: list[Callable[[], None]] = []
    for k, n in shapes:
        a = torch.randn(mp, k, device=dev, dtype=bf16)
        w = torch.randn(n, k, device=dev, dtype=bf16) * 0.02
        if fp8:
            a8 = a.to(torch.float8_e4m3fn)
            w8 = w.to(torch.float8_e4m3fn).t()  # (K, N), column-major: what _scaled_mm's second operand must be
            one = torch.ones((), device=dev, dtype=torch.float32)
            ops.append(functools.partial(torch._scaled_mm, a8, w8, one, one, out_dtype=bf16,
                                         use_fast_accum=fast_accum))
        else:
            wt = w.t()
            ops.append(functools.partial(torch.matmul, a, wt))

    def layer() -> None:
        for op in ops:
            op()

    flops = sum(2.0 * mp * k * n for k, n in shapes)
    reps = max(3, min(200, int(2e11 / max(flops, 1.0))))  # batches of ~0.3 ms or more at 700 TFLOP/s
    return timer.seconds(layer, reps)


def _gemm_curves(torch: Any, timer: _Timer, model: ModelShape, dev: Any, hbm_GBps: float, quick: bool,
                 say: Callable[[str], None]) -> dict[str, Any]:
    """One layer's GEMMs at decode and prefill token counts, bf16 and (where the GPU has it) FP8."""
    shapes = layer_gemm_shapes(model)
    tokens = GEMM_TOKENS[::2] if quick else GEMM_TOKENS
    out: dict[str, Any] = {"gemm_layer_shapes_KN": [list(s) for s in shapes]}
    # FP8 both ways: exact accumulation (torch's default) and fast accumulation (what FP8 GEMMs on Hopper commonly
    # run with); the cost model takes the faster.
    kinds = [("bf16", False, False)]
    if _fp8_usable(torch, dev):
        kinds += [("fp8", True, False), ("fp8fast", True, True)]
    for label, fp8, fast in kinds:
        # warm the clocks once per kind: the first GEMMs after idle run at a fraction of the clock
        _gemm_layer_s(torch, _Timer(torch), shapes, 8192, fp8, dev, fast)
        times = {m: _gemm_layer_s(torch, timer, shapes, m, fp8, dev, fast) for m in tokens}
        flops_big = sum(2.0 * tokens[-1] * k * n for k, n in shapes)
        peak = flops_big / times[tokens[-1]] / 1e12
        out[f"gemm_layer_s_{label}"] = [[m, times[m]] for m in tokens]
        out[f"{label}_gemm_layer_tflops_at_{tokens[-1]}"] = peak
        say(f"  {label} layer GEMMs: " + ", ".join(f"{m}:{times[m] * 1e6:.0f}us" for m in tokens)
            + f"  ({peak:.0f} TFLOP/s at {tokens[-1]} tokens)")
    if f"fp8_gemm_layer_tflops_at_{tokens[-1]}" not in out:
        out["fp8_unavailable"] = "no FP8 GEMM here (needs compute capability 8.9+ and torch._scaled_mm)"
    return out


def _attention(torch: Any, timer: _Timer, model: ModelShape, dev: Any, quick: bool,
               say: Callable[[str], None]) -> dict[str, Any]:
    """SDPA attention of one layer: decode (one query per request over its context, GQA) as a KV read rate, and
    causal prefill as a FLOP rate. bf16 KV: SDPA has no FP8 KV path; TensorRT-LLM's FP8-KV kernels read half
    the bytes at (the cost model assumes) the same rate."""
    F = torch.nn.functional
    bf16 = torch.bfloat16
    nh, nkv, hd = model.num_attention_heads, model.num_kv_heads, model.head_dim
    out: dict[str, Any] = {}
    decode = []
    with torch.inference_mode():
        for batch, ctx in (((64, 2048),) if quick else ((16, 1024), (64, 2048), (128, 4096), (32, 16384))):
            q = torch.randn(batch, nh, 1, hd, device=dev, dtype=bf16)
            k = torch.randn(batch, nkv, ctx, hd, device=dev, dtype=bf16)
            v = torch.randn(batch, nkv, ctx, hd, device=dev, dtype=bf16)
            t = timer.seconds(functools.partial(F.scaled_dot_product_attention, q, k, v, enable_gqa=True), 20)
            gbps = 2 * batch * nkv * ctx * hd * 2 / t / 1e9
            decode.append([batch, ctx, t, gbps])
            del q, k, v
        prefill = []
        for n in ((4096,) if quick else (1024, 4096, 16384)):
            q = torch.randn(1, nh, n, hd, device=dev, dtype=bf16)
            k = torch.randn(1, nkv, n, hd, device=dev, dtype=bf16)
            v = torch.randn(1, nkv, n, hd, device=dev, dtype=bf16)
            t = timer.seconds(functools.partial(F.scaled_dot_product_attention, q, k, v, is_causal=True,
                                                enable_gqa=True), 5)
            tflops = 4.0 * nh * hd * (n * (n + 1) / 2) / t / 1e12
            prefill.append([n, t, tflops])
            del q, k, v
    out["attention_decode_batch_ctx_s_GBps"] = decode
    out["attention_prefill_tokens_s_tflops"] = prefill
    out["attention_decode_GBps"] = max(row[3] for row in decode)
    out["attention_prefill_tflops"] = prefill[-1][2]
    say(f"  attention: decode KV read {out['attention_decode_GBps']:,.0f} GB/s, causal prefill "
        f"{out['attention_prefill_tflops']:.0f} TFLOP/s at {prefill[-1][0]} tokens")
    return out


def _step_overhead(torch: Any, timer: _Timer, model: ModelShape, dev: Any,
                   say: Callable[[str], None]) -> dict[str, Any]:
    """What a decode step costs besides its GEMMs and attention: the small kernels between them (norms, RoPE,
    activation, residual adds: 4 a layer, as TensorRT-LLM fuses them), replayed from one CUDA graph as
    TensorRT-LLM's PyTorch backend does, plus greedy sampling of one token and the host round trip that hands
    it back."""
    layers = model.num_layers
    x = torch.zeros(model.hidden_size, device=dev, dtype=torch.bfloat16)
    n_small = 4 * layers
    stream = torch.cuda.Stream(dev)
    stream.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(stream):
        for _ in range(3):
            x.add_(1.0)
    torch.cuda.current_stream(dev).wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(n_small):
            x.add_(1.0)
    logits = torch.randn(1, model.vocab_size, device=dev, dtype=torch.bfloat16)
    logits_b = torch.randn(256, model.vocab_size, device=dev, dtype=torch.bfloat16)
    graph_s = timer.seconds(graph.replay, 50)
    sample_s = timer.seconds(lambda: torch.argmax(logits, dim=-1).cpu(), 50)
    sample_256_s = timer.seconds(lambda: torch.argmax(logits_b, dim=-1).cpu(), 50)

    def step() -> None:
        graph.replay()
        torch.argmax(logits, dim=-1).cpu()

    step_s = timer.seconds(step, 50)
    out = {"small_kernels_per_step": n_small, "graph_small_kernels_s": graph_s,
           "graph_us_per_kernel": graph_s / n_small * 1e6, "sample_1_roundtrip_s": sample_s,
           "sample_256_roundtrip_s": sample_256_s, "step_overhead_s": step_s}
    say(f"  per-step overhead {step_s * 1e6:.0f} us ({n_small} graphed small kernels {graph_s * 1e6:.0f} us, "
        f"sampling + host round trip {sample_s * 1e6:.0f} us; batch 256 {sample_256_s * 1e6:.0f} us)")
    return out


def _copy_overlap(torch: Any, timer: _Timer, block_bytes: int, dev: Any, say: Callable[[str], None],
                  n_blocks: int = 64) -> dict[str, Any]:
    """Do onboard (host->GPU) and offload (GPU->host) block copies on separate streams overlap, as TensorRT-LLM
    issues them, and does a copy slow a GEMM running beside it? Times each alone and both together."""
    pool = 2 * n_blocks
    host = torch.empty((pool, block_bytes), dtype=torch.uint8, pin_memory=True)
    host.fill_(1)
    gpu = torch.empty((pool, block_bytes), dtype=torch.uint8, device=dev)
    s_on, s_off = torch.cuda.Stream(dev), torch.cuda.Stream(dev)

    def onboard() -> None:
        with torch.cuda.stream(s_on):
            for i in range(n_blocks):
                gpu[i].copy_(host[i], non_blocking=True)

    def offload() -> None:
        with torch.cuda.stream(s_off):
            for i in range(n_blocks):
                host[n_blocks + i].copy_(gpu[n_blocks + i], non_blocking=True)

    def both() -> None:
        onboard()
        offload()

    a = torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16)

    def gemm() -> None:
        torch.matmul(a, a)

    def gemm_and_copy() -> None:
        onboard()
        for _ in range(4):
            gemm()

    on_s, off_s, both_s = timer.seconds(onboard, 5), timer.seconds(offload, 5), timer.seconds(both, 5)
    def gemm4() -> None:
        for _ in range(4):
            gemm()

    gemm4_s = timer.seconds(gemm4, 5)
    gemm_copy_s = timer.seconds(gemm_and_copy, 5)
    out = {"overlap_onboard_s": on_s, "overlap_offload_s": off_s, "overlap_both_s": both_s,
           "overlap_both_over_sum": both_s / (on_s + off_s), "overlap_both_over_max": both_s / max(on_s, off_s),
           "overlap_gemm4_s": gemm4_s, "overlap_gemm4_with_onboard_s": gemm_copy_s,
           "overlap_blocks": n_blocks, "overlap_block_bytes": block_bytes}
    say(f"  {n_blocks} blocks each way: onboard {on_s * 1e3:.2f} ms, offload {off_s * 1e3:.2f} ms, both at once "
        f"{both_s * 1e3:.2f} ms ({out['overlap_both_over_max']:.2f}x the longer); 4 GEMMs {gemm4_s * 1e3:.2f} ms, "
        f"with an onboard beside them {gemm_copy_s * 1e3:.2f} ms")
    return out


def _causal_prefill_flops(model: ModelShape, n: int) -> float:
    # As the cost model counts a fresh prompt, without the LM head (the proxy has none).
    return 2.0 * model.matmul_params * n + model.attention_flops_per_context_token * (n * (n + 1) // 2)


def _nvml_facts(index: int) -> dict[str, Any]:
    facts: dict[str, Any] = {}
    try:
        import pynvml

        pynvml.nvmlInit()
        try:
            handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            facts["nvml_memory_total_bytes"] = int(pynvml.nvmlDeviceGetMemoryInfo(handle).total)
            facts["nvml_driver"] = pynvml.nvmlSystemGetDriverVersion()
            try:
                facts["pcie_gen_width"] = [pynvml.nvmlDeviceGetCurrPcieLinkGeneration(handle),
                                           pynvml.nvmlDeviceGetCurrPcieLinkWidth(handle)]
                facts["pcie_max_gen_width"] = [pynvml.nvmlDeviceGetMaxPcieLinkGeneration(handle),
                                               pynvml.nvmlDeviceGetMaxPcieLinkWidth(handle)]
            except pynvml.NVMLError:
                pass
        finally:
            pynvml.nvmlShutdown()
    except Exception:  # no NVML: torch's figures stand in
        pass
    for key, value in list(facts.items()):
        if isinstance(value, bytes):
            facts[key] = value.decode()
    return facts


def calibrate(model: str | ModelShape = "Qwen/Qwen3-8B", quick: bool = False, device: int = 0,
              tokens_per_block: int = 32, log: Callable[[str], None] | None = None) -> GpuProfile:
    """Measure GPU `device` and return its profile. Raises CalibrationUnavailable without torch or a GPU."""
    say = log or (lambda _msg: None)
    shape = model if isinstance(model, ModelShape) else resolve_model(model)
    torch = _load_torch()
    started = time.perf_counter()
    dev = torch.device("cuda", device)
    torch.cuda.set_device(dev)
    props = torch.cuda.get_device_properties(dev)
    name = torch.cuda.get_device_name(dev)
    timer = _Timer(torch)
    measured: dict[str, Any] = {"gpu_name": name, "torch": torch.__version__, "model": shape.name,
                                "tokens_per_block": tokens_per_block, "quick": quick,
                                "torch_memory_total_bytes": int(props.total_memory),
                                "date": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")}
    measured.update(_nvml_facts(device))
    block = shape.kv_bytes_per_block(tokens_per_block)
    big = (256 if quick else 1024) * _MIB
    say(f"calibrating {name} for {shape.name} ({'quick' if quick else 'full'}), block {_size_label(block)}")

    say("host<->GPU copies:")
    sizes = sorted({2 * _MIB, block, 64 * _MIB, big})
    measured.update(_copy_bandwidth(torch, timer, sizes, dev, (512 if quick else 2048) * _MIB, say))
    scattered = _scattered_blocks(torch, timer, block, dev)
    measured.update(scattered)
    say("  " + ", ".join(f"{k} {v:.1f}" for k, v in scattered.items()))

    hbm = _hbm(torch, timer, big, dev)
    measured["hbm_copy_GBps_read_plus_write"] = hbm
    say(f"HBM copy {hbm:,.0f} GB/s (read + write)")
    gemms = {}
    for m, n, k in ((8192, 8192, 8192), (4096, 12288, 4096)):
        gemms[f"bf16_gemm_TFLOPs_{m}x{n}x{k}"] = _gemm_tflops(torch, timer, m, n, k, dev)
    measured.update(gemms)
    bf16 = statistics.mean(gemms.values())
    say("bf16 GEMM " + ", ".join(f"{k.split('_')[-1]} {v:.0f}" for k, v in gemms.items()) + " TFLOP/s")

    say(f"prefill proxy ({shape.num_layers} layers of {shape.name}, random weights) vs reload from pinned:")
    kv_tok = shape.kv_bytes_per_token
    efficiency = None
    for n in ((2048,) if quick else (512, 2048, 8192)):
        layer_s = _prefill_layer_s(torch, timer, shape, n, dev)
        recompute = layer_s * shape.num_layers
        nbytes = n * kv_tok
        host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=True)
        host.fill_(1)
        gpu = torch.empty(nbytes, dtype=torch.uint8, device=dev)
        reload = timer.seconds(_copier(gpu, host, True), 5)
        del host, gpu
        measured[f"recompute_s_per_{n}_tokens_{shape.num_layers}_layers"] = recompute
        measured[f"reload_s_per_{n}_tokens_pinned"] = reload
        measured[f"recompute_over_reload_{n}"] = recompute / reload
        efficiency = _causal_prefill_flops(shape, n) / recompute / (bf16 * 1e12)
        say(f"  {n:>5} tokens: recompute {recompute * 1e3:8.2f} ms, reload {reload * 1e3:7.2f} ms, "
            f"ratio {recompute / reload:5.1f}, {efficiency:.2f} of the GEMM rate")
    # The longest prompt measured sets the efficiency: short ones are dominated by launch overhead that
    # TensorRT-LLM's fused, graphed kernels do not pay (anchor: 512 tokens ran 36% over the roofline).
    measured["prefill_efficiency"] = min(1.0, efficiency) if efficiency else None

    # What the two-part cost model reads (kvtop.engines.sim.cost): GEMM curves by token count and dtype, attention
    # rates, the fixed per-step cost, copy overlap. Each part is optional: one that fails is recorded and skipped.
    say("cost model parts:")
    parts: list[tuple[str, Callable[[], dict[str, Any]]]] = [
        ("gemm", lambda: _gemm_curves(torch, timer, shape, dev, hbm, quick, say)),
        ("attention", lambda: _attention(torch, timer, shape, dev, quick, say)),
        ("step", lambda: _step_overhead(torch, timer, shape, dev, say)),
        ("overlap", lambda: _copy_overlap(torch, timer, block, dev, say)),
    ]
    for part, run in parts:
        try:
            measured.update(run())
        except Exception as exc:  # one part failing (an old torch without _scaled_mm) keeps the rest
            measured[f"{part}_error"] = f"{type(exc).__name__}: {exc}"
            say(f"  {part}: failed: {type(exc).__name__}: {exc}")
        torch.cuda.empty_cache()

    h2d = measured[f"h2d_GBps_{_size_label(big)}_pinned"]
    d2h = measured[f"d2h_GBps_{_size_label(big)}_pinned"]
    onboard = scattered[f"onboard_64x{_size_label(block)}_blocks_GBps"]
    # Same fit as gpus.BLOCK_COPY_LATENCY_US: a block copy takes bytes / large-copy rate + a fixed latency.
    latency_us = max(0.0, (block / (onboard * 1e9) - block / (h2d * 1e9)) * 1e6)
    gen = (measured.get("pcie_gen_width") or [None])[0]
    if h2d > 2 * LINKS["pcie5"]:
        link = "c2c"  # no PCIe link reaches 110 GB/s; NVLink-C2C does (346 GB/s measured by one user)
    elif gen in (4, 5):
        link = f"pcie{gen}"
    else:
        link = "custom"
    short = name.removeprefix("NVIDIA ").strip() or name
    memory = measured.get("nvml_memory_total_bytes") or int(props.total_memory)
    measured["calibrate_seconds"] = time.perf_counter() - started
    rates = cost_rates_from_measured(measured)
    # the GEMM corrections are relative to the sustained one-layer rate, when it was measured
    bf16 = rates.get("bf16_tflops", bf16)
    return GpuProfile(
        name=short, memory_bytes=int(memory), hbm_GBps=round(hbm, 1), bf16_tflops=round(bf16, 1),
        h2d_GBps=round(h2d, 2), d2h_GBps=round(d2h, 2), link_name=link,
        source=(f"measured: kvtop calibrate on {name}, {measured['date']}, torch {torch.__version__}, driver "
                f"{measured.get('nvml_driver', '?')}, prefill proxy shaped like {shape.name}"
                f"{' (quick)' if quick else ''}"),
        copy_latency_us=round(latency_us, 2), measured=measured,
        **{k: v for k, v in rates.items() if k in COST_FIELDS})


def run_calibrate(model: str = "Qwen/Qwen3-8B", out: str | Path = "gpu-profile.json", quick: bool = False,
                  device: int = 0, tokens_per_block: int = 32) -> int:
    """Calibrate, write the profile to `out`, print progress. Returns the exit code: 0, 2 (no PyTorch), 3 (no
    GPU), 1 (a measurement failed)."""
    try:
        profile = calibrate(model, quick, device, tokens_per_block, log=lambda m: print(m, flush=True))
    except CalibrationUnavailable as exc:
        print(f"kvtop calibrate: {clean(str(exc), 2000)}", file=sys.stderr)
        return exc.exit_code
    except ValueError as exc:  # an unknown model
        print(f"kvtop calibrate: {clean(str(exc), 2000)}", file=sys.stderr)
        return 2
    except Exception as exc:  # CUDA out of memory, a driver error: say what, do not write half a profile
        print(f"kvtop calibrate: measurement failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        return 1
    save_profile(profile, out)
    print(f"wrote {out}: {profile.name}, HBM {profile.hbm_GBps:,.0f} GB/s, bf16 {profile.bf16_tflops:.0f} TFLOP/s, "
          f"link {profile.link_name} {profile.h2d_GBps:.1f}/{profile.d2h_GBps:.1f} GB/s, copy latency "
          f"{profile.copy_latency_us:.2f} us, prefill efficiency {profile.measured.get('prefill_efficiency'):.2f} "
          f"({profile.measured['calibrate_seconds']:.0f} s)")
    if not math.isclose(profile.h2d_GBps, 0.0):
        print(f"use it: kvtop estimate --gpu {out}   |   kvtop sim --gpu {out} ...")
    return 0


def merge_probes(files: Sequence[str], profile: str, out: str | Path) -> int:
    """`kvtop calibrate --merge FILE... --profile P --out OUT`: a multi-GPU probe's curve (all-reduce time by
    message size) or per-shape GEMM curves added to a profile, no GPU needed. 0, or 2 with one line on stderr
    naming what was wrong (nothing written)."""
    try:
        prof = resolve_gpu(profile)
        for name in files:
            probe = read_json_object(Path(name), f"probe {name}")
            prof = merge_probe(prof, probe, str(name))
    except (OSError, ValueError) as exc:
        print(f"kvtop calibrate: {clean(str(exc), 2000)}", file=sys.stderr)
        return 2
    save_profile(prof, out)
    print(f"wrote {out}: {prof.name} with {', '.join(files)}")
    return 0

