"""Single-request TTFT on a real GPU, plain PyTorch: a miss, a GPU hit and a host hit, for one model shape.

    python bench/ttft_probe.py --model Qwen/Qwen3-8B --out ttft.json      # needs PyTorch + CUDA (the H200 machine)

What it runs (random bf16 weights, the model's real shape, every layer):
- miss: prefill of N prompt tokens through all layers (RMSNorm, fused QKV, RoPE, causal SDPA with the model's GQA,
  O, SwiGLU MLP, residuals; K and V written into a per-layer cache), final norm and LM head on the last token,
  greedy pick, the token back on the host. Timed from the first launch to the token on the host;
- GPU hit: the same request with its first R tokens' KV already in HBM (R = whole blocks of 32 tokens, at most
  N - 1, as TensorRT-LLM reuses them): only the N - R new tokens run, attending to all N;
- each also captured in one CUDA graph and replayed (`*_graph_s`): the GPU's own time without eager PyTorch's
  host launches (~25 a layer at ~20 us each make a 32-token step host-bound);
- host hit: the R tokens' KV copied host->GPU first, one cudaMemcpyAsync per 32-token block (all layers of a
  block contiguous, as a TensorRT-LLM pool lays them out), from pinned memory; then the GPU-hit step.

What differs from TensorRT-LLM: eager PyTorch (no CUDA graphs, unfused norms/RoPE/activations: ~15 kernels a layer),
SDPA (FlashAttention) instead of TensorRT-LLM's FMHA, bf16 KV; TensorRT-LLM also overlaps host work with the GPU.
Median of 5 after 2 warm-ups. Writes one JSON object.
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvtop.engines.models import ModelShape, resolve_model  # noqa: E402

TOKENS_PER_BLOCK = 32


def run(model: ModelShape, prompts: list[int], reps: int = 5, device: str = "cuda",
        compile_layers: bool = False, decode: bool = True) -> dict[str, Any]:
    import torch
    import torch.nn.functional as F

    dev = torch.device(device)
    cuda = dev.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    bf16 = torch.bfloat16
    h, hd = model.hidden_size, model.head_dim
    nh, nkv, inter, layers = model.num_attention_heads, model.num_kv_heads, model.intermediate_size, model.num_layers
    max_len = max(prompts)
    gen = torch.Generator(device=dev).manual_seed(0)

    def w(i: int, o: int) -> Any:
        return torch.randn(i, o, device=dev, dtype=bf16, generator=gen) * 0.02

    weights = []
    for _ in range(layers):
        weights.append((w(h, (nh + 2 * nkv) * hd), w(nh * hd, h), w(h, 2 * inter), w(inter, h),
                        torch.ones(h, device=dev, dtype=bf16), torch.ones(h, device=dev, dtype=bf16)))
    lm_head = w(h, model.vocab_size)
    embed = w(model.vocab_size, h)
    final_norm = torch.ones(h, device=dev, dtype=bf16)
    k_cache = [torch.zeros(1, nkv, max_len, hd, device=dev, dtype=bf16) for _ in range(layers)]
    v_cache = [torch.zeros(1, nkv, max_len, hd, device=dev, dtype=bf16) for _ in range(layers)]
    inv = 1.0 / (10000.0 ** (torch.arange(0, hd, 2, device=dev, dtype=torch.float32) / hd))
    ang = torch.outer(torch.arange(max_len, device=dev, dtype=torch.float32), inv)
    cos, sin = torch.cat([ang.cos(), ang.cos()], -1).to(bf16), torch.cat([ang.sin(), ang.sin()], -1).to(bf16)

    # How a GPU hit's new tokens attend to the cached context: lower-right causal (CausalBias) with native GQA where
    # this torch takes it, else with the KV heads expanded, else an explicit boolean mask (the slow path: about
    # 190 GB/s over an 8,192-token context on the H200, 2026-12-01).
    try:
        from torch.nn.attention.bias import causal_lower_right
    except ImportError:  # torch < 2.3
        causal_lower_right = None
    hit_attention = ["mask"]
    if causal_lower_right is not None:
        for mode in ("lower_right_gqa", "lower_right_expanded"):
            try:
                probe_q = torch.zeros(1, nh, 2, hd, device=dev, dtype=bf16)
                probe_k = torch.zeros(1, nkv, 6, hd, device=dev, dtype=bf16)
                if mode == "lower_right_gqa":
                    F.scaled_dot_product_attention(probe_q, probe_k, probe_k, attn_mask=causal_lower_right(2, 6),
                                                   enable_gqa=True)
                else:
                    rep = nh // nkv
                    wide = probe_k.repeat_interleave(rep, 1)
                    F.scaled_dot_product_attention(probe_q, wide, wide, attn_mask=causal_lower_right(2, 6))
                hit_attention[0] = mode
                break
            except Exception:  # this torch does not take that combination: try the next
                continue

    def rotate(x: Any, c: Any, s: Any) -> Any:  # x: (1, heads, n, hd); c, s: (n, hd)
        x1, x2 = x[..., : hd // 2], x[..., hd // 2:]
        return x * c + torch.cat([-x2, x1], -1) * s

    def pre_attention(x: Any, wqkv: Any, n1: Any, c: Any, s: Any) -> tuple[Any, Any, Any]:
        n = x.shape[0]
        q, k, v = (F.rms_norm(x, (h,), n1) @ wqkv).split([nh * hd, nkv * hd, nkv * hd], dim=-1)
        return (rotate(q.view(1, n, nh, hd).transpose(1, 2), c, s), rotate(k.view(1, n, nkv, hd).transpose(1, 2), c, s),
                v.view(1, n, nkv, hd).transpose(1, 2))

    def post_attention(x: Any, a: Any, wo: Any, wgu: Any, wd: Any, n2: Any) -> Any:
        n = x.shape[0]
        x = x + a.transpose(1, 2).reshape(n, nh * hd) @ wo
        g, u = (F.rms_norm(x, (h,), n2) @ wgu).split([inter, inter], dim=-1)
        return x + (F.silu(g) * u) @ wd

    if compile_layers:
        # TensorRT-LLM fuses the norms, RoPE and the SwiGLU into neighbouring kernels; torch.compile (Inductor)
        # fuses the same elementwise work into a few Triton kernels around the cuBLAS GEMMs: ~10 kernels a
        # layer instead of ~24. Attention and the KV-cache writes stay outside (SDPA, copies).
        import torch._dynamo
        torch._dynamo.config.cache_size_limit = 64  # one graph per prompt length, all layers share it
        pre_attention = torch.compile(pre_attention, dynamic=False)
        post_attention = torch.compile(post_attention, dynamic=False)

    def forward(ids: Any, start: int) -> int:
        return int(forward_device(ids, start).item())

    def forward_device(ids: Any, start: int) -> Any:
        n = ids.shape[0]
        x = embed[ids]
        mask: Any = None
        if start and n > 1:  # new tokens see all cached ones and the new ones before them
            if hit_attention[0] == "mask":
                mask = torch.ones(n, start + n, device=dev, dtype=torch.bool).tril(diagonal=start)
            else:  # lower-right causal: FlashAttention / memory-efficient kernels, no mask tensor to read
                mask = causal_lower_right(n, start + n)
        c, s = cos[start:start + n], sin[start:start + n]
        for li, (wqkv, wo, wgu, wd, n1, n2) in enumerate(weights):
            q, k, v = pre_attention(x, wqkv, n1, c, s)
            k_cache[li][:, :, start:start + n] = k
            v_cache[li][:, :, start:start + n] = v  # already (1, kv heads, n, head dim), as k
            kk, vv = k_cache[li][:, :, : start + n], v_cache[li][:, :, : start + n]
            if start == 0:
                a = F.scaled_dot_product_attention(q, kk, vv, is_causal=True, enable_gqa=True)
            elif hit_attention[0] == "lower_right_expanded":
                rep = nh // nkv
                a = F.scaled_dot_product_attention(q, kk.repeat_interleave(rep, 1), vv.repeat_interleave(rep, 1),
                                                   attn_mask=mask)
            else:
                a = F.scaled_dot_product_attention(q, kk, vv, attn_mask=mask, enable_gqa=True)
            x = post_attention(x, a, wo, wgu, wd, n2)
        logits = F.rms_norm(x[-1:], (h,), final_norm) @ lm_head
        return torch.argmax(logits, dim=-1)

    def graphed(ids: Any, start: int) -> Any:
        """The same forward captured in one CUDA graph: no per-kernel host launch, only the GPU's time (what
        TensorRT-LLM's fused, low-launch runtime approaches); replaying it and reading the token back."""
        side = torch.cuda.Stream(dev)
        side.wait_stream(torch.cuda.current_stream(dev))
        with torch.cuda.stream(side):
            forward_device(ids, start)
        torch.cuda.current_stream(dev).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            token = forward_device(ids, start)

        def replay() -> int:
            graph.replay()
            return int(token.item())
        return replay

    block_bytes = model.kv_bytes_per_block(TOKENS_PER_BLOCK)
    n_blocks_max = max_len // TOKENS_PER_BLOCK
    host_pool = torch.empty((n_blocks_max, block_bytes), dtype=torch.uint8, pin_memory=cuda)
    host_pool.fill_(1)
    gpu_pool = torch.empty((n_blocks_max, block_bytes), dtype=torch.uint8, device=dev)

    def onboard(blocks: int) -> None:
        for b in range(blocks):
            gpu_pool[b].copy_(host_pool[b], non_blocking=True)

    def timed(fn: Any) -> float:
        for _ in range(2):
            fn()
        sync()
        times = []
        for _ in range(reps):
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    out: dict[str, Any] = {"model": model.name, "gpu_name": torch.cuda.get_device_name(dev) if cuda else "cpu",
                           "torch": torch.__version__, "tokens_per_block": TOKENS_PER_BLOCK, "reps": reps,
                           "block_bytes": block_bytes, "hit_attention": hit_attention[0],
                           "compiled_layers": compile_layers, "rows": []}
    with torch.inference_mode():
        # clocks up before the first timing (an idle H200 sits at 345 MHz)
        a = torch.randn(8192 if cuda else 64, 8192 if cuda else 64, device=dev, dtype=bf16)
        t_end = time.perf_counter() + (0.5 if cuda else 0.0)
        while time.perf_counter() < t_end:
            a @ a
        sync()
        del a
        for n in prompts:
            ids = torch.randint(0, model.vocab_size, (n,), device=dev, generator=gen)
            reused = min((n - 1) // TOKENS_PER_BLOCK * TOKENS_PER_BLOCK, n - 1)
            blocks = reused // TOKENS_PER_BLOCK
            miss = timed(functools.partial(forward, ids, 0))
            forward(ids, 0)  # the cache holds this prompt's KV for the hit
            gpu_hit = timed(functools.partial(forward, ids[reused:], reused))
            copy = timed(functools.partial(onboard, blocks))

            def host_hit(ids: Any = ids, reused: int = reused, blocks: int = blocks) -> None:
                onboard(blocks)
                forward(ids[reused:], reused)

            host = timed(host_hit)
            row: dict[str, Any] = {
                   "prompt_tokens": n, "reused_tokens": reused, "onboard_blocks": blocks, "miss_s": miss,
                   "gpu_hit_s": gpu_hit, "onboard_s": copy, "host_hit_s": host,
                   "onboard_GBps": blocks * block_bytes / copy / 1e9 if copy else None}
            if cuda:
                try:
                    miss_g = graphed(ids, 0)
                    row["miss_graph_s"] = timed(miss_g)
                    del miss_g
                    forward(ids, 0)
                    hit_g = graphed(ids[reused:], reused)
                    row["gpu_hit_graph_s"] = timed(hit_g)

                    def host_hit_g(blocks: int = blocks, hit_g: Any = hit_g) -> None:
                        onboard(blocks)
                        hit_g()

                    row["host_hit_graph_s"] = timed(host_hit_g)
                    del hit_g
                except Exception as exc:  # a capture that fails leaves the eager figures standing
                    row["graph_error"] = f"{type(exc).__name__}: {exc}"
                torch.cuda.empty_cache()
            out["rows"].append(row)
            print(json.dumps(row), flush=True)
        if cuda and decode:
            out["decode_rows"] = decode_steps(torch, F, weights, lm_head, final_norm, model, dev, timed)
    return out


def decode_steps(torch: Any, F: Any, weights: list[Any], lm_head: Any, final_norm: Any, model: ModelShape,
                 dev: Any, timed: Any) -> list[dict[str, Any]]:
    """One decode step for B requests of L context tokens each, captured in a CUDA graph (as TensorRT-LLM's
    PyTorch backend graphs generation-only batches): every layer reads its weights once and each request's K and
    V; greedy tokens back on the host."""
    bf16 = torch.bfloat16
    h, hd = model.hidden_size, model.head_dim
    nh, nkv, inter = model.num_attention_heads, model.num_kv_heads, model.intermediate_size
    rows = []
    for batch, ctx in ((1, 2048), (64, 1024), (256, 2048)):
        try:
            kc = torch.randn(batch, nkv, ctx, hd, device=dev, dtype=bf16)
            vc = torch.randn(batch, nkv, ctx, hd, device=dev, dtype=bf16)
            x0 = torch.randn(batch, h, device=dev, dtype=bf16)

            def step(kc: Any = kc, vc: Any = vc, x0: Any = x0, batch: int = batch) -> Any:
                x = x0
                for wqkv, wo, wgu, wd, n1, n2 in weights:
                    y = F.rms_norm(x, (h,), n1)
                    q, _k, _v = (y @ wqkv).split([nh * hd, nkv * hd, nkv * hd], dim=-1)
                    a = F.scaled_dot_product_attention(q.view(batch, nh, 1, hd), kc, vc, enable_gqa=True)
                    x = x + a.reshape(batch, nh * hd) @ wo
                    g, u = (F.rms_norm(x, (h,), n2) @ wgu).split([inter, inter], dim=-1)
                    x = x + (F.silu(g) * u) @ wd
                return torch.argmax(F.rms_norm(x, (h,), final_norm) @ lm_head, dim=-1)

            side = torch.cuda.Stream(dev)
            side.wait_stream(torch.cuda.current_stream(dev))
            with torch.cuda.stream(side):
                step()
            torch.cuda.current_stream(dev).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                tokens = step()

            def replay(graph: Any = graph, tokens: Any = tokens) -> None:
                graph.replay()
                tokens.cpu()

            row: dict[str, Any] = {"batch": batch, "context": ctx, "step_graph_s": timed(replay)}
            del graph, kc, vc
            torch.cuda.empty_cache()
        except Exception as exc:
            row = {"batch": batch, "context": ctx, "error": f"{type(exc).__name__}: {exc}"}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="Qwen/Qwen3-8B")
    ap.add_argument("--prompts", default="512,2048,8192")
    ap.add_argument("--out", default="ttft.json")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu for a smoke test of the script itself")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--compile", action="store_true",
                    help="fuse each layer's norms, RoPE and SwiGLU with torch.compile, as TensorRT-LLM fuses them")
    ap.add_argument("--no-decode", action="store_true", help="skip the decode-step rows")
    a = ap.parse_args(argv)
    result = run(resolve_model(a.model), [int(x) for x in a.prompts.split(",")], a.reps, a.device, a.compile,
                 not a.no_decode)
    Path(a.out).write_text(json.dumps(result, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
