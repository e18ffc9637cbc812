"""`kvtop estimate`: reload cached KV from host, or recompute it? The arithmetic, shown.

For one model on one GPU (and host link), per token and for a whole prompt:

- bytes per token of KV (2 x layers x KV heads x head_dim x dtype bytes);
- time to *reload* the cached part of a prompt from pinned host memory (one copy per block, as TensorRT-LLM's
  onboarding does: bytes / link rate + a fixed per-copy latency), against *recomputing* it in prefill
  (FLOPs / achievable FLOP rate), against reading it from HBM (what a GPU hit costs the attention);
- time to first token for a GPU hit, a host hit and a miss (the cost model the simulator uses);
- the host link bandwidth at which reload and recompute cost the same;
- what one decode step would cost if the requests' active KV had to stream from host every step (an
  offloaded-attention design) instead of living in HBM;
- with `--tensor-parallel-size N`, all of it per GPU as the simulator counts it: each GPU holds 1/N of the weights
  and of every token's KV (its KV heads), so its KV pool (sized as TensorRT-LLM sizes it,
  `kvtop.engines.sizing.gpu_pool`) grows by what its weights shrink, each GPU copies its share of a block over its
  own link, and every layer's two all-reduces are timed (`kvtop.engines.sim.cost.CostModel`, the simulator's).

Checked against the measured H200 anchors (`shared/anchors/h200-2026-11-29.json`, Qwen3-8B, 8,192 tokens):

| figure | anchor | estimate | off by |
|---|---|---|---|
| reload 8,192 tokens over pinned PCIe Gen5 | 21.81 ms | 22.77 ms | +4.4% |
| recompute 8,192 tokens (36 layers) | 191.4 ms | 214.8 ms | +12.3% |
| recompute / reload | 8.77 | 9.44 | +7.6% |

Why it differs:
- Reload: the anchor timed *one contiguous* 1.125 GiB copy (55.3 GB/s). TensorRT-LLM onboards block by block
  (256 copies of 4.5 MiB for 8,192 tokens at 32 tokens per block), and each copy pays a fixed ~3.6 us of launch
  and DMA setup; the estimate counts that (the anchor's 64 scattered 4.5 MiB blocks ran at 53.1 GB/s), so it
  is ~1 ms slower than the contiguous copy. At 2 MiB blocks the gap would be larger (46.6 GB/s measured).
- Recompute: the cost model's GEMM and attention rates are `kvtop calibrate`'s (2026-12-01), at the sustained
  rate of a GPU at its 700 W limit (0.938 of the burst for bf16): the anchor's 191 ms was a burst on a cool GPU
  (its 8192^3 GEMM ran at 791 TFLOP/s against 679 sustained); calibrate's own proxy of this prefill took 222 ms.
  Plain PyTorch (the anchor) leaves norms, RoPE and activations unfused; TensorRT-LLM fuses them.
- The estimate's recompute includes the LM head on the last token (0.3 ms), as a prefill runs it.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any

from kvtop.engines.gpus import GpuProfile, resolve_gpu
from kvtop.engines.models import ModelShape, resolve_model
from kvtop.engines.sim.cost import CostModel
from kvtop.engines.sizing import DEFAULT_FREE_GPU_MEMORY_FRACTION, format_bytes, gpu_pool
from kvtop.textsafe import clean, clean_lines

__all__ = ["ESTIMATE_DEFAULTS", "estimate", "render_estimate", "run_estimate"]

DEFAULT_TOKENS_PER_BLOCK = 32  # KvCacheConfig.tokens_per_block default in TensorRT-LLM 1.2


def _resolve(model: str | ModelShape, gpu: str | GpuProfile, link: str | float | None) -> tuple[ModelShape,
                                                                                                GpuProfile]:
    shape = model if isinstance(model, ModelShape) else resolve_model(model)
    profile = gpu if isinstance(gpu, GpuProfile) else resolve_gpu(gpu)
    if link is not None:
        profile = profile.with_link(link)
    return shape, profile


def estimate(model: str | ModelShape, gpu: str | GpuProfile, link: str | float | None = None,
             prompt_tokens: int = 8192, cached_tokens: int | None = None, batch: int = 1,
             tokens_per_block: int = DEFAULT_TOKENS_PER_BLOCK, kv_cache_dtype: str = "auto",
             tensor_parallel_size: int = 1,
             free_gpu_memory_fraction: float = DEFAULT_FREE_GPU_MEMORY_FRACTION) -> dict[str, Any]:
    """Reload vs recompute vs HBM for `cached_tokens` of a `prompt_tokens` prompt, and TTFT/decode figures.

    `cached_tokens` (default: the whole prompt) is the prefix whose KV exists somewhere; `batch` requests of
    this shape arrive together (they share the link and one forward pass). Times in seconds, rates in GB/s
    (1e9 bytes/s) and TFLOP/s. The flat keys `kv_bytes_per_token`, `reload_s`, `recompute_s`,
    `recompute_over_reload`, `breakeven_link_GBps` are a stable JSON surface; the rest is detail.
    `kv_cache_dtype` is KvCacheConfig.dtype: "auto" keeps the checkpoint's KV dtype, "fp8" halves a bf16 model's.
    `tensor_parallel_size` splits the model over that many GPUs (LLM(tensor_parallel_size=...)): times are the
    simulator's cost model at that size, byte counts of the copies and the HBM read are one GPU's share, and
    `memory_per_gpu` is one GPU's split (weights, runtime, KV pool at `free_gpu_memory_fraction`).
    """
    if not isinstance(prompt_tokens, int) or prompt_tokens <= 0:
        raise ValueError(f"prompt_tokens must be a positive int, got {prompt_tokens!r}")
    if cached_tokens is None:
        cached_tokens = prompt_tokens
    if not isinstance(cached_tokens, int) or not 0 <= cached_tokens <= prompt_tokens:
        raise ValueError(f"cached_tokens must be an int in [0, prompt_tokens={prompt_tokens}], got {cached_tokens!r}")
    if not isinstance(batch, int) or batch <= 0:
        raise ValueError(f"batch must be a positive int, got {batch!r}")
    shape, prof = _resolve(model, gpu, link)
    shape = shape.with_kv_cache_dtype(kv_cache_dtype)
    tp = tensor_parallel_size
    # The simulator's two calls for this config (kvtop sim, kvtop.engines.sim.core): its pool and its cost model.
    pool = gpu_pool(shape, prof, tokens_per_block, free_gpu_memory_fraction=free_gpu_memory_fraction,
                    tensor_parallel_size=tp)
    cost = CostModel(shape, prof, tensor_parallel_size=tp)
    tpb = tokens_per_block

    kv_tok = shape.kv_bytes_per_token
    gemm_tflops = prof.fp8_tflops if (shape.weight_quant == "fp8" and prof.fp8_tflops) else prof.bf16_tflops
    hbm_rate = prof.hbm_GBps * 1e9
    latency_s = prof.copy_latency_us * 1e-6

    c = cached_tokens
    blocks = math.ceil(c / tpb)  # onboarding copies whole blocks, a partly filled last one too
    kv_bytes = c * kv_tok * batch
    kv_bytes_gpu = kv_bytes / tp  # one GPU's KV heads
    # FLOPs of the cached tokens' prefill, causal (token i sees i positions), without the LM head: the rate shown.
    attn_positions = c * (c + 1) // 2
    flops_one = 2.0 * shape.matmul_params * c + shape.attention_flops_per_context_token * attn_positions
    flops = flops_one * batch
    # The cost model's prefill of the cached tokens: GEMMs, attention, elementwise work and the LM head, timed apart
    # and added (kvtop.engines.sim.cost), for `batch` such prompts in one forward pass.
    recompute_s = cost.device_s([(c, 0)] * batch, []) if c else 0.0
    # One copy per block, each GPU its share of the block over its own link, as the simulator onboards.
    reload_s = cost.onboard_s(blocks * batch, tpb) if c else 0.0
    hbm_read_s = kv_bytes_gpu / hbm_rate
    ratio = recompute_s / reload_s if reload_s > 0 else None
    # Break-even: bytes / L + copies x latency = recompute  =>  L = bytes / (recompute - copies x latency).
    # Block copies move whole blocks, so the bytes are blocks x block bytes (one GPU's share of each).
    link_bytes = blocks * batch * kv_tok * tpb / tp
    slack = recompute_s - blocks * batch * latency_s
    breakeven = link_bytes / slack / 1e9 if c and slack > 0 else None

    # TTFT (cost model, LM head included). TensorRT-LLM reuses at most prompt-1 tokens: the last prompt
    # token is always computed, so that it yields logits.
    reuse = min(c, prompt_tokens - 1)
    new = prompt_tokens - reuse
    overhead = cost.iteration_overhead_s
    ttft_gpu = cost.iteration_s([(new, reuse)] * batch, [])
    ttft_host = ttft_gpu + cost.onboard_s(math.ceil(reuse / tpb) * batch, tpb)
    ttft_miss = cost.iteration_s([prompt_tokens] * batch, [])

    # Decode: each request attends to its prompt (the active KV). From HBM: the cost model's decode step.
    # From host: the same step, but the KV bytes cross the link instead, at best hidden behind the rest of the
    # step (GEMMs, weights from HBM, all-reduces): the longer of the two, one GPU's share of the KV on its link.
    ctx_total = prompt_tokens * batch
    device_hbm = cost.decode_step_s(batch, ctx_total)
    step_hbm = device_hbm + overhead
    kv_active = kv_tok * (ctx_total + batch)
    step_host = max(device_hbm, kv_active / tp / (prof.h2d_GBps * 1e9)) + overhead

    per_tok_flops = flops_one / c if c else 0.0
    return {
        "model": shape.name,
        "gpu": prof.name,
        "link": prof.link_name,
        "prompt_tokens": prompt_tokens,
        "cached_tokens": c,
        "batch": batch,
        "tokens_per_block": tpb,
        "tensor_parallel_size": tp,
        "kv_bytes_per_token": kv_tok,
        "kv_bytes_per_block": kv_tok * tpb,
        "kv_bytes": kv_bytes,
        "blocks": blocks * batch,
        "flops_per_token": per_tok_flops,
        "recompute_flops": flops,
        "rates": {
            "link_h2d_GBps": prof.h2d_GBps,
            "copy_latency_us": prof.copy_latency_us,
            "hbm_GBps": prof.hbm_GBps,
            "bf16_tflops": prof.bf16_tflops,
            "gemm_dtype": "fp8" if shape.weight_quant == "fp8" and prof.fp8_tflops else "bf16",
            "gemm_tflops": gemm_tflops,
            "prefill_tflops": flops / tp / recompute_s / 1e12 if recompute_s else 0.0,  # per GPU
        },
        "memory_per_gpu": {
            "gpu_bytes": pool.gpu_bytes,
            "weight_bytes": pool.weight_bytes,
            "runtime_bytes": pool.runtime_bytes,
            "free_gpu_memory_fraction": pool.free_gpu_memory_fraction,
            "fits": pool.fits,
            "kv_pool_bytes": pool.kv_pool_bytes,
            "kv_bytes_per_token": pool.kv_bytes_per_token,
            "kv_tokens": pool.tokens,
            "kv_blocks": pool.blocks,
        },
        "reload_s": reload_s,
        "recompute_s": recompute_s,
        "hbm_read_s": hbm_read_s,
        "recompute_over_reload": ratio,
        "breakeven_link_GBps": breakeven,
        "per_token": {
            "reload_s": reload_s / (c * batch) if c else 0.0,
            "recompute_s": recompute_s / (c * batch) if c else 0.0,
            "hbm_read_s": kv_tok / tp / hbm_rate,
        },
        "ttft_s": {"gpu_hit": ttft_gpu, "host_hit": ttft_host, "miss": ttft_miss},
        "decode": {
            "context_tokens_per_request": prompt_tokens,
            "active_kv_bytes": kv_active,
            "step_s_kv_in_hbm": step_hbm,
            "step_s_kv_from_host": step_host,
            "tokens_per_s_kv_in_hbm": batch / step_hbm,
            "tokens_per_s_kv_from_host": batch / step_host,
            "slowdown": step_host / step_hbm,
        },
    }


def _ms(s: float) -> str:
    if s >= 1.0:
        return f"{s:,.2f} s"
    if s >= 1e-3:
        return f"{s * 1e3:,.2f} ms"
    return f"{s * 1e6:,.2f} us"


def render_estimate(e: dict[str, Any]) -> str:
    """The estimate as text, with the arithmetic behind each figure."""
    r = e["rates"]
    c, b, tpb = e["cached_tokens"], e["batch"], e["tokens_per_block"]
    kv = e["kv_bytes_per_token"]
    tp = e["tensor_parallel_size"]
    on = f"{tp} x {e['gpu']}, tensor parallel" if tp > 1 else e["gpu"]
    m = e["memory_per_gpu"]
    per_gpu = " per GPU" if tp > 1 else ""
    if m["fits"]:
        pool = (f"KV pool {format_bytes(m['kv_pool_bytes'])} ({m['free_gpu_memory_fraction']:g} of the rest) = "
                f"{m['kv_tokens']:,} tokens, {m['kv_blocks']:,} blocks of {tpb}")
    else:
        pool = "no room for a KV cache: the model does not fit"
    lines = [
        f"{e['model']} on {on} ({e['link']} link), prompt {e['prompt_tokens']:,} tokens, "
        f"cached {c:,}, batch {b}",
        "",
        f"Memory{per_gpu}",
        f"  {format_bytes(m['gpu_bytes'])} = weights {format_bytes(m['weight_bytes'])} + runtime "
        f"{format_bytes(m['runtime_bytes'])} + {pool}",
        "",
        "Rates used",
        f"  host->GPU link   {r['link_h2d_GBps']:.2f} GB/s pinned, + {r['copy_latency_us']:.2f} us per block copy",
        f"  HBM              {r['hbm_GBps']:,.0f} GB/s (read + write)",
        f"  prefill          {r['gemm_tflops']:.1f} TFLOP/s {r['gemm_dtype']} GEMM peak; GEMMs, attention and "
        f"elementwise work timed apart{', all-reduces beside them' if tp > 1 else ''}: "
        f"{r['prefill_tflops']:.1f} TFLOP/s{per_gpu} on the whole prefill",
        "",
        "Per token",
        f"  KV bytes         {kv:,} B ({format_bytes(kv)}); block of {tpb} = {format_bytes(e['kv_bytes_per_block'])}"
        + (f"; {format_bytes(m['kv_bytes_per_token'])} a token per GPU" if tp > 1 else ""),
        f"  FLOPs            {e['flops_per_token'] / 1e9:.2f} GFLOP (2 x matmul params + attention over ~c/2 "
        "positions)",
        f"  reload           {_ms(e['per_token']['reload_s'])}",
        f"  recompute        {_ms(e['per_token']['recompute_s'])}",
        f"  read from HBM    {_ms(e['per_token']['hbm_read_s'])}",
        "",
        f"Whole cached prefix ({c:,} tokens x {b}, {format_bytes(e['kv_bytes'])}, {e['blocks']:,} blocks)",
        f"  reload from host {_ms(e['reload_s'])}  = {e['blocks']:,} x ({format_bytes(e['kv_bytes_per_block'] / tp)} / "
        f"{r['link_h2d_GBps']:.2f} GB/s + {r['copy_latency_us']:.2f} us)",
        f"  recompute        {_ms(e['recompute_s'])}  = {e['recompute_flops'] / tp / 1e12:.1f} TFLOP / "
        f"{r['prefill_tflops']:.1f} TFLOP/s",
        f"  read from HBM    {_ms(e['hbm_read_s'])}  = {format_bytes(e['kv_bytes'] / tp)} / {r['hbm_GBps']:,.0f} GB/s",
    ]
    ratio = e["recompute_over_reload"]
    if ratio is not None:
        lines.append(f"  recompute / reload = {ratio:.1f}x: "
                     + ("reloading from host wins" if ratio > 1 else "recomputing wins"))
    be = e["breakeven_link_GBps"]
    lines.append("  break-even link   " + (f"{be:.2f} GB/s (slower links should recompute)" if be is not None
                                          else "none: recompute is cheaper than the copies' fixed latency"))
    t = e["ttft_s"]
    d = e["decode"]
    lines += [
        "",
        "Time to first token",
        f"  GPU hit          {_ms(t['gpu_hit'])}",
        f"  host hit         {_ms(t['host_hit'])}  (GPU hit + onboarding)",
        f"  miss             {_ms(t['miss'])}  (full prefill)",
        "",
        f"Decode, {b} request(s) x {d['context_tokens_per_request']:,} tokens of active KV "
        f"({format_bytes(d['active_kv_bytes'])})",
        f"  KV in HBM        {_ms(d['step_s_kv_in_hbm'])} per step, {d['tokens_per_s_kv_in_hbm']:,.0f} tokens/s",
        f"  KV from host     {_ms(d['step_s_kv_from_host'])} per step, {d['tokens_per_s_kv_from_host']:,.0f} tokens/s"
        f"  ({d['slowdown']:.1f}x slower: every step moves the KV over the link)",
    ]
    return "\n".join(lines)


ESTIMATE_DEFAULTS = {"tokens_per_block": DEFAULT_TOKENS_PER_BLOCK}


def run_estimate(model: str, gpu: str, link: str | None = None, prompt_tokens: int = 8192,
                 cached_tokens: int | None = None, batch: int = 1, as_json: bool = False,
                 tokens_per_block: int = DEFAULT_TOKENS_PER_BLOCK, kv_cache_dtype: str = "auto",
                 tensor_parallel_size: int = 1,
                 free_gpu_memory_fraction: float = DEFAULT_FREE_GPU_MEMORY_FRACTION) -> int:
    """Print the estimate (text or JSON). Returns the exit code (2 on a bad argument)."""
    try:
        result = estimate(model, gpu, link, prompt_tokens, cached_tokens, batch, tokens_per_block, kv_cache_dtype,
                          tensor_parallel_size, free_gpu_memory_fraction)
    except ValueError as exc:
        print(f"kvtop estimate: {clean(str(exc), 2000)}", file=sys.stderr)  # a path may hold an escape sequence
        return 2
    # JSON escapes control characters itself; the text has the model's and the GPU profile's names in it
    print(json.dumps(result, indent=1) if as_json else clean_lines(render_estimate(result)))
    return 0
