"""The cost model against TensorRT-LLM's published throughput and against TTFT measured on an H200.

    python bench/bench_cost.py                      # every published row, full request counts (tens of minutes)
    python bench/bench_cost.py --scale 0.1          # a tenth of the requests (at least 4 batches' worth)
    python bench/bench_cost.py --only 8B --gpu H200 # a subset
    python bench/bench_cost.py --ttft               # the single-request TTFT rows only (a second)
    python bench/bench_cost.py --vllm               # the vLLM CPU-offloading blog's ratios, 10,000 requests (2.5 min)
    python bench/bench_cost.py --vllm --vllm-requests 2000   # the same, fewer requests (shorter)

Throughput: each row of bench/data/trtllm_perf_overview.json (Llama-3.1-8B FP8 on H200/H100/GH200 TP1,
Llama-3.3-70B FP8 on H200 TP1 and H100/H200 TP2; TensorRT-LLM v0.21 and v1.0 docs) replayed the way trtllm-bench
ran it: every request queued at t=0 with exactly ISL random prompt tokens and OSL output tokens, FP8 weights and
FP8 KV cache, max_batch_size and max_num_tokens from trtllm-bench's heuristic (`trtllm_bench_settings`), the KV
pool at free_gpu_memory_fraction 0.95, 32-token blocks, GUARANTEED_NO_EVICT, through kvtop's own engine loop
(SimEngineCore: the block manager and the cost model). Throughput = output tokens / simulated time, as
trtllm-bench's "Total Output Throughput".

TTFT: single requests (miss, GPU hit, host hit) of Llama-3.1-8B and Qwen3-8B in bf16, the cost model against
bench/results/h200-cost-2026-12-02-ttft-*-compiled.json (bench/ttft_probe.py --compile on the H200: every layer, its
norms, RoPE and SwiGLU fused by torch.compile, captured in a CUDA graph, GPU-hit attention through SDPA's lower-right
causal bias; per-block pinned copies), the unfused probe (`*-2026-12-01-*-lr.json`) beside it.

Writes bench/results/cost-bench-<date>.json and prints markdown tables.
"""

from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import platform
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvtop.engines.gpus import GpuProfile, resolve_gpu  # noqa: E402
from kvtop.engines.models import ModelShape, resolve_model  # noqa: E402
from kvtop.engines.sim.block_manager import BlockManager, TokenRuns  # noqa: E402
from kvtop.engines.sim.core import SimEngineCore, SimRequest  # noqa: E402
from kvtop.engines.sim.cost import CostModel  # noqa: E402
from kvtop.engines.sizing import primary_blocks  # noqa: E402

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "trtllm_perf_overview.json"
TOKENS_PER_BLOCK = 32
KV_FRACTION = 0.95
GIB = 1024**3


def trtllm_bench_settings(model: ModelShape, gpu: GpuProfile, tp: int, isl: int, osl: int,
                          fraction: float = KV_FRACTION) -> tuple[int, int]:
    """(max_batch_size, max_num_tokens) as trtllm-bench picks them when none are given.

    The arithmetic of tensorrt_llm/bench/build/tuning.py (calc_engine_setting, finetune_setting), restated: KV
    bytes per token from the KV dtype (1 byte for FP8) with at least one KV head per rank; the "engine" as
    parameters x weight bytes (1 for FP8, every parameter); (total NVML memory x GPUs - engine) x fraction shared
    by requests of ISL + OSL tokens; the batch size capped at 4096 and rounded up (to 32s under 256, 128s under
    1,024, else 256s, at least 64); tokens = batch x (1 + ISL / OSL) capped at 32,768, rounded up (256s under
    4,096, at least 2,048; 512s under 8,192; else 1,024s). Chunked prefill is off in trtllm-bench by default, so
    max_num_tokens becomes at least ISL + max_batch_size (tensorrt_llm/bench/benchmark/utils/general.py).
    """
    kv_heads = max(tp, model.num_kv_heads)
    per_token_gib = 2 * model.num_layers * kv_heads * model.head_dim * model.kv_bytes / GIB
    engine_gib = model.num_params * model.linear_weight_bytes / GIB
    available = gpu.memory_bytes / GIB * tp - engine_gib
    max_requests = available * fraction / (per_token_gib * (isl + osl))
    raw_bs = min(max_requests, 4096)
    raw_tokens = min(raw_bs * (1 + isl / osl), 32768)
    if raw_bs < 256:
        bs = max(64, 32 * math.ceil(raw_bs / 32))
    elif raw_bs < 1024:
        bs = 128 * math.ceil(raw_bs / 128)
    else:
        bs = 256 * math.ceil(raw_bs / 256)
    if raw_tokens < 4096:
        tokens = max(2048, 256 * math.ceil(raw_tokens / 256))
    elif raw_tokens < 8192:
        tokens = 512 * math.ceil(raw_tokens / 512)
    else:
        tokens = 1024 * math.ceil(raw_tokens / 1024)
    return bs, max(tokens, isl + bs)


def simulate_throughput(model: ModelShape, gpu: GpuProfile, tp: int, isl: int, osl: int,
                        requests: int) -> dict[str, Any]:
    """Output tokens/s of `requests` ISL/OSL requests queued at t=0, through kvtop's engine loop."""
    bs, max_tokens = trtllm_bench_settings(model, gpu, tp, isl, osl)
    blocks = primary_blocks(model, gpu, TOKENS_PER_BLOCK, free_gpu_memory_fraction=KV_FRACTION,
                            tensor_parallel_size=tp, max_num_tokens=max_tokens)
    bm = BlockManager(blocks, 0, TOKENS_PER_BLOCK)
    core = SimEngineCore(model, gpu, bm, max_batch_size=bs, max_num_tokens=max_tokens, max_seq_len=isl + osl,
                         enable_iter_perf_stats=False, tensor_parallel_size=tp)
    for rid in range(requests):
        # distinct token ranges: random prompts share no block, as prepare_dataset's random ids do not
        core.submit(SimRequest(rid, TokenRuns([(1 + rid * (isl + 1), isl)]), osl, arrival_s=0.0))  # type: ignore[arg-type]
    wall = time.perf_counter()
    peak = 0
    while not core.idle():
        core.step()
        peak = max(peak, len(core.running))
    wall = time.perf_counter() - wall
    if core.failed:
        raise RuntimeError(f"{core.failed} requests failed")
    return {"max_batch_size": bs, "max_num_tokens": max_tokens, "gpu_blocks": blocks, "peak_running": peak,
            "sim_s": core.now_s, "output_tok_s": requests * osl / core.now_s, "iterations": core.iteration,
            "wall_s": wall}


def throughput_rows(scale: float, only: str | None, gpus: list[str] | None) -> list[dict[str, Any]]:
    data = json.loads(DATA.read_text())
    counts = data["method"]["num_requests"]
    rows = []
    for table in data["rows"]:
        if only and only.lower() not in table["model"].lower():
            continue
        model = resolve_model(table["model"])
        for gpu_name, cells in table["gpus"].items():
            if gpus and gpu_name not in gpus:
                continue
            gpu = resolve_gpu(gpu_name)
            for seq, published in cells.items():
                isl, osl = (int(x) for x in seq.split("/"))
                n = counts[seq]
                bs, _ = trtllm_bench_settings(model, gpu, table["tp"], isl, osl)
                n_run = n if scale >= 1 else max(min(n, 4 * bs), int(n * scale))
                result = simulate_throughput(model, gpu, table["tp"], isl, osl, n_run)
                row = {"source": table["source"], "model": table["model"], "gpu": gpu_name, "tp": table["tp"],
                       "isl": isl, "osl": osl, "requests": n_run, "published_requests": n,
                       "published_tok_s": published, **result,
                       "ratio": result["output_tok_s"] / published}
                rows.append(row)
                print(f"{table['source']:5} {table['model'].split('/')[-1]:28} {gpu_name:5} TP{table['tp']} "
                      f"{seq:>10}: sim {result['output_tok_s']:9,.0f}  published {published:9,.0f}  "
                      f"{row['ratio']:.2f}x  (bs {bs}, {n_run} req, {result['wall_s']:.1f} s)", flush=True)
    return rows


# The single-request probes (bench/ttft_probe.py on the H200, each captured in a CUDA graph): `-lr` ran every layer
# as plain PyTorch ops (~24 kernels a layer: unfused norms, RoPE as ten elementwise kernels, SwiGLU), `-compiled`
# (2026-12-02, `--compile`) the same layers with the norms, RoPE and SwiGLU fused by torch.compile around the
# cuBLAS GEMMs and SDPA, as TensorRT-LLM fuses them into its attention preprocessing and neighbouring kernels. The
# rows compare with the fused probe; the unfused one stays beside it, and its decode steps (which have none of that
# work) are the decode rows.
TTFT_PROBES = (("meta-llama/Llama-3.1-8B-Instruct", "h200-cost-2026-12-01-ttft-llama31-8b-lr.json",
                "h200-cost-2026-12-02-ttft-llama31-8b-compiled.json"),
               ("Qwen/Qwen3-8B", "h200-cost-2026-12-01-ttft-qwen3-8b-lr.json",
                "h200-cost-2026-12-02-ttft-qwen3-8b-compiled.json"))
TTFT_KEYS = {"miss": "miss_graph_s", "GPU hit": "gpu_hit_graph_s", "host hit": "host_hit_graph_s",
             "onboard alone": "onboard_s"}


def ttft_rows() -> list[dict[str, Any]]:
    rows = []
    gpu = resolve_gpu("H200")
    for model_name, unfused_path, fused_path in TTFT_PROBES:
        unfused = json.loads((HERE / "results" / unfused_path).read_text())
        fused = json.loads((HERE / "results" / fused_path).read_text())
        unfused_by_prompt = {m["prompt_tokens"]: m for m in unfused["rows"]}
        cost = CostModel(resolve_model(model_name), gpu)
        for m in fused["rows"]:
            n, reused, blocks = m["prompt_tokens"], m["reused_tokens"], m["onboard_blocks"]
            plain = unfused_by_prompt.get(n, {})
            # what a graphed plain-PyTorch step measures: the GPU's time + the step overhead (graph, sampling, host
            # round trip); TensorRT-LLM's per-request engine work has no counterpart there
            over = cost.iteration_overhead_s
            miss = cost.device_s([(n, 0)], []) + over
            hit = cost.device_s([(n - reused, reused)], []) + over
            host = hit + cost.transfers_s(blocks, 0, TOKENS_PER_BLOCK)
            for kind, sim in (("miss", miss), ("GPU hit", hit), ("host hit", host),
                              ("onboard alone", cost.onboard_s(blocks, TOKENS_PER_BLOCK))):
                meas = m[TTFT_KEYS[kind]]
                rows.append({"model": model_name, "prompt_tokens": n, "kind": kind, "sim_s": sim, "measured_s": meas,
                             "unfused_s": plain.get(TTFT_KEYS[kind]), "ratio": sim / meas})
        for d in unfused.get("decode_rows", []):
            sim = cost.device_s([], [d["context"]] * d["batch"]) + cost.iteration_overhead_s
            rows.append({"model": model_name, "prompt_tokens": d["context"], "kind": f"decode step x{d['batch']}",
                         "sim_s": sim, "measured_s": d["step_graph_s"], "unfused_s": None,
                         "ratio": sim / d["step_graph_s"]})
    return rows


# vLLM's CPU-offloading blog (Or Ozeri, Danny Harnik, 2026-01-08,
# blog.vllm.ai/2026/01/08/kv-offloading-connector.html; its text is _posts/2026-01-08-kv-offloading-connector.md
# of vllm-project/vllm-project.github.io):
# Llama-3.1-8B-Instruct on an NVIDIA H100 80GB HBM3, a batch of 10,000 unique 512-token prefill requests, GPU prefix
# caching off, 16-token GPU and CPU blocks, throughput at CPU hit rates 0-100% (the figures themselves are in an
# image, Figure 2). What its text states: "the throughput increases by up to X9" with the CPU hit rate, "even though
# TTFT for this prompt size only decreased by X2" (Figure 1: single-request TTFT, CPU load against recompute). A
# vLLM figure, used here to check kvtop's host-hit copy cost (per-block copies at the link's rate, onboard and
# offload on their own streams), not TensorRT-LLM's.
VLLM_BLOG = "blog.vllm.ai/2026/01/08/kv-offloading-connector.html"
VLLM_BLOCK = 16
VLLM_PROMPT = 512


def _vllm_core(model: ModelShape, gpu: GpuProfile, max_tokens: int, max_seqs: int,
               requests: int, host_copies: int = 1) -> tuple[SimEngineCore, BlockManager]:
    """The blog's engine on kvtop: a host tier of ``host_copies`` times every prompt's blocks (500 GB of DRAM there
    holds 10,000 prompts of 66 MB many times over)."""
    blocks = primary_blocks(model, gpu, VLLM_BLOCK, free_gpu_memory_fraction=0.9, max_num_tokens=max_tokens)
    host = host_copies * requests * (VLLM_PROMPT // VLLM_BLOCK + 1)
    core_ref: list[SimEngineCore] = []
    bm = BlockManager(blocks, host, VLLM_BLOCK, clock_ms=lambda: core_ref[0].now_s * 1000.0)
    core = SimEngineCore(model, gpu, bm, max_batch_size=max_seqs, max_num_tokens=max_tokens,
                         max_seq_len=VLLM_PROMPT + 1, enable_iter_perf_stats=False)
    core_ref.append(core)
    return core, bm


def _run_pass(core: SimEngineCore, first_id: int, requests: int) -> float:
    start = core.now_s
    for i in range(requests):
        # one token out: a prefill request; distinct prompts share no block
        core.submit(SimRequest(first_id + i, TokenRuns([(1 + i * (VLLM_PROMPT + 1), VLLM_PROMPT)]), 1,  # type: ignore[arg-type]
                               arrival_s=start))
    while not core.idle():
        core.step()
    return core.now_s - start


def vllm_host_hit_rows(requests: int = 10_000) -> list[dict[str, Any]]:
    """kvtop's prefill throughput at 0% and 100% host (CPU) hits for the blog's setup, and the single-request
    TTFT of a host hit against a miss, beside the blog's stated ratios. kvtop runs its own engine loop
    (TensorRT-LLM's block manager and scheduler), not vLLM's; batch limits are vLLM's defaults on an H100
    (vllm/engine/arg_utils.py, EngineArgs.get_batch_defaults: 16,384 tokens and 1,024 sequences for the offline
    LLM class, 8,192 for `vllm serve`): both are run. Model: Llama-3.1-8B-Instruct in bf16 (the blog names no
    quantization), KV bf16: 2 MiB a 16-token block, the blog's 'new block size' for this model. The blog's 10,000
    requests by default: a first pass (every prompt a miss; it fills the host tier, and its time is the 0% row),
    then the same prompts again (the 100% row, where the host still has them).

    Two host sizes. Room for every prompt once is not enough for TensorRT-LLM to keep them: each block a pass
    allocates evicts a GPU block that is offloaded into the host's least recently used slot, and an onboard puts
    the slot it empties at the back of that queue (kvCacheManager.cpp ``onboardBlock``: ``releaseBlock(block)``),
    so once the host's empty slots are used the second pass overwrites the prompts it is about to read. Twice
    that room keeps every prompt."""
    model = resolve_model("meta-llama/Llama-3.1-8B-Instruct")
    gpu = resolve_gpu("H100")
    rows = []
    for label, max_tokens in (("LLM class", 16384), ("vllm serve", 8192)):
        for copies in (1, 2):
            core, bm = _vllm_core(model, gpu, max_tokens, 1024, requests, copies)
            miss_s = _run_pass(core, 0, requests)  # the 0% row, and it fills the host tier (the blog omits this)
            on0 = bm.onboarded_blocks
            hit_s = _run_pass(core, requests, requests)
            onboarded = bm.onboarded_blocks - on0
            if requests * (VLLM_PROMPT // VLLM_BLOCK) <= bm.primary_blocks:
                print(f"vLLM blog: {requests:,} prompts fit the GPU pool ({bm.primary_blocks:,} blocks): the second "
                      f"pass hits the GPU, not the host; the blog's 10,000 do not", flush=True)
            host = "every prompt once" if copies == 1 else "every prompt twice"
            rows.append({"what": f"throughput 100% / 0% host hits ({label}: {max_tokens:,} tokens, 1,024 seqs; "
                                 f"host room for {host})",
                         "kvtop": miss_s / hit_s, "published": 9.0, "published_words": "up to X9",
                         "kvtop_prefill_tok_s_miss": requests * VLLM_PROMPT / miss_s,
                         "kvtop_prefill_tok_s_host_hit": requests * VLLM_PROMPT / hit_s,
                         "onboarded_blocks_per_request": onboarded / requests, "requests": requests,
                         "gpu_blocks": bm.primary_blocks, "host_blocks": bm.secondary_blocks})
    cost = CostModel(model, gpu)
    # the cost model alone, every block of a 512-token prompt from the host, batches of 256: as vLLM runs it (the CPU
    # cache keeps its copy: nothing offloaded) and as TensorRT-LLM does (each onboard evicts a GPU block, offloaded)
    per = VLLM_PROMPT // VLLM_BLOCK
    miss_b = cost.iteration_s([(VLLM_PROMPT, 0)] * 256, [])
    hit_b = cost.iteration_s([(1, VLLM_PROMPT - 1)] * 256, [])
    for label, offload in (("onboard only, as vLLM keeps the CPU copy", 0), ("onboard + as many offloads", per * 256)):
        rows.append({"what": f"throughput 100% / 0% host hits, cost model alone ({label})",
                     "kvtop": miss_b / (hit_b + cost.transfers_s(per * 256, offload, VLLM_BLOCK)), "published": 9.0,
                     "published_words": "up to X9"})
    reused = (VLLM_PROMPT // VLLM_BLOCK - 1) * VLLM_BLOCK  # vLLM recomputes at least the last token: 31 blocks
    miss = cost.iteration_s([(VLLM_PROMPT, 0)], [])
    host = cost.iteration_s([(VLLM_PROMPT - reused, reused)], []) + cost.transfers_s(reused // VLLM_BLOCK, 0,
                                                                                     VLLM_BLOCK)
    rows.append({"what": "single-request TTFT, 512 tokens: miss / host hit", "kvtop": miss / host,
                 "published": 2.0, "published_words": "only decreased by X2", "kvtop_miss_ms": miss * 1e3,
                 "kvtop_host_hit_ms": host * 1e3})
    for r in rows:
        r["ratio"] = r["kvtop"] / r["published"]
        onboarded = (f", {r['onboarded_blocks_per_request']:.1f} of {VLLM_PROMPT // VLLM_BLOCK} blocks a request "
                     f"from the host" if "onboarded_blocks_per_request" in r else "")
        print(f"vLLM blog: {r['what']}: kvtop {r['kvtop']:.2f}x, the blog {r['published_words']} "
              f"({r['ratio']:.2f}){onboarded}", flush=True)
    return rows


def markdown(rows: list[dict[str, Any]], ttft: list[dict[str, Any]]) -> str:
    out = []
    if rows:
        out += ["| source | model | GPU | TP | ISL/OSL | requests | max batch / tokens | published tok/s | kvtop tok/s "
                "| kvtop / published |", "|---|---|---|---:|---|---:|---|---:|---:|---:|"]
        for r in rows:
            out.append(f"| {r['source']} | {r['model'].split('/')[-1]} | {r['gpu']} | {r['tp']} "
                       f"| {r['isl']}/{r['osl']} | {r['requests']:,} | {r['max_batch_size']} / {r['max_num_tokens']} | "
                       f"{r['published_tok_s']:,.0f} | {r['output_tok_s']:,.0f} | {r['ratio']:.2f} |")
        ratios = [r["ratio"] for r in rows]
        within = sum(1 for x in ratios if 0.75 <= x <= 1.25)
        out.append(f"\n{within} of {len(rows)} rows within 25%; kvtop/published from {min(ratios):.2f} to "
                   f"{max(ratios):.2f}, geometric mean {math.exp(sum(map(math.log, ratios)) / len(ratios)):.2f}.\n")
    if ttft:
        out += ["| model | tokens | what | measured, fused layers | measured, unfused | kvtop | kvtop / measured |",
                "|---|---:|---|---:|---:|---:|---:|"]
        for r in ttft:
            unfused = f"{r['unfused_s'] * 1e3:.2f} ms" if r["unfused_s"] else ""
            out.append(f"| {r['model'].split('/')[-1]} | {r['prompt_tokens']:,} | {r['kind']} | "
                       f"{r['measured_s'] * 1e3:.2f} ms | {unfused} | {r['sim_s'] * 1e3:.2f} ms | {r['ratio']:.2f} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of the published request counts")
    ap.add_argument("--only", default=None, help="substring of the model name (8B, 70B)")
    ap.add_argument("--gpu", action="append", help="H200, H100, GH200 (repeatable)")
    ap.add_argument("--ttft", action="store_true", help="the TTFT rows only")
    ap.add_argument("--vllm", action="store_true", help="the vLLM CPU-offloading blog rows only (2.5 min of CPU)")
    ap.add_argument("--vllm-requests", type=int, default=10_000,
                    help="requests in each pass of the vLLM blog replay (the blog's 10,000; fewer for a quick run)")
    ap.add_argument("--out", default=None, help="JSON results (default bench/results/cost-bench-<date>.json)")
    a = ap.parse_args()
    if a.vllm_requests <= 0:
        ap.error(f"--vllm-requests: must be > 0, got {a.vllm_requests}")
    ttft = [] if a.vllm else ttft_rows()
    vllm = [] if a.ttft else vllm_host_hit_rows(a.vllm_requests)
    rows = [] if (a.ttft or a.vllm) else throughput_rows(a.scale, a.only, a.gpu)
    print(markdown(rows, ttft))
    if vllm:
        print("\n| vLLM blog figure (text) | kvtop | kvtop / blog |\n|---|---:|---:|")
        for r in vllm:
            print(f"| {r['what']}: {r['published_words']} | {r['kvtop']:.2f}x | {r['ratio']:.2f} |")
    out = Path(a.out) if a.out else HERE / "results" / f"cost-bench-{_dt.date.today().isoformat()}.json"
    out.write_text(json.dumps({"command": " ".join(sys.argv), "machine": platform.processor() or platform.machine(),
                               "python": platform.python_version(), "scale": a.scale, "throughput": rows,
                               "ttft": ttft, "vllm_blog": {"source": VLLM_BLOG, "rows": vllm}}, indent=1) + "\n",
                          encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
