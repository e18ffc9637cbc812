"""The cost model against TensorRT-LLM's published throughput and against TTFT measured on an H200.

    python bench/bench_cost.py                      # every published row, full request counts (tens of minutes)
    python bench/bench_cost.py --scale 0.1          # a tenth of the requests (at least 4 batches' worth)
    python bench/bench_cost.py --only 8B --gpu H200 # a subset
    python bench/bench_cost.py --ttft               # the single-request TTFT rows only (a second)

Throughput: each row of bench/data/trtllm_perf_overview.json (Llama-3.1-8B FP8 on H200/H100/GH200 TP1,
Llama-3.3-70B FP8 on H200 TP1 and H100/H200 TP2; TensorRT-LLM v0.21 and v1.0 docs) replayed the way trtllm-bench
ran it: every request queued at t=0 with exactly ISL random prompt tokens and OSL output tokens, FP8 weights and
FP8 KV cache, max_batch_size and max_num_tokens from trtllm-bench's heuristic (`trtllm_bench_settings`), the KV
pool at free_gpu_memory_fraction 0.95, 32-token blocks, GUARANTEED_NO_EVICT, through kvtop's own engine loop
(SimEngineCore: the block manager and the cost model). Throughput = output tokens / simulated time, as
trtllm-bench's "Total Output Throughput".

TTFT: single requests (miss, GPU hit, host hit) of Llama-3.1-8B and Qwen3-8B in bf16, the cost model against
bench/results/h200-cost-2026-12-01-ttft-*-lr.json (bench/ttft_probe.py on the H200: plain PyTorch, every layer,
captured in a CUDA graph, GPU-hit attention through SDPA's lower-right causal bias; per-block pinned copies).

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


def ttft_rows() -> list[dict[str, Any]]:
    rows = []
    gpu = resolve_gpu("H200")
    for model_name, path in (("meta-llama/Llama-3.1-8B-Instruct", "h200-cost-2026-12-01-ttft-llama31-8b-lr.json"),
                             ("Qwen/Qwen3-8B", "h200-cost-2026-12-01-ttft-qwen3-8b-lr.json")):
        measured = json.loads((HERE / "results" / path).read_text())
        cost = CostModel(resolve_model(model_name), gpu)
        for m in measured["rows"]:
            n, reused, blocks = m["prompt_tokens"], m["reused_tokens"], m["onboard_blocks"]
            # what a graphed plain-PyTorch step measures: the GPU's time + the step overhead (graph, sampling, host
            # round trip); TensorRT-LLM's per-request engine work has no counterpart there
            over = cost.iteration_overhead_s
            miss = cost.device_s([(n, 0)], []) + over
            hit = cost.device_s([(n - reused, reused)], []) + over
            host = hit + cost.transfers_s(blocks, 0, TOKENS_PER_BLOCK)
            for kind, sim, meas in (("miss", miss, m["miss_graph_s"]), ("GPU hit", hit, m["gpu_hit_graph_s"]),
                                    ("host hit", host, m["host_hit_graph_s"]),
                                    ("onboard alone", cost.onboard_s(blocks, TOKENS_PER_BLOCK), m["onboard_s"])):
                rows.append({"model": model_name, "prompt_tokens": n, "kind": kind, "sim_s": sim, "measured_s": meas,
                             "eager_s": m.get({"miss": "miss_s", "GPU hit": "gpu_hit_s",
                                               "host hit": "host_hit_s"}.get(kind, "onboard_s")),
                             "ratio": sim / meas})
        for d in measured.get("decode_rows", []):
            sim = cost.device_s([], [d["context"]] * d["batch"]) + cost.iteration_overhead_s
            rows.append({"model": model_name, "prompt_tokens": d["context"], "kind": f"decode step x{d['batch']}",
                         "sim_s": sim, "measured_s": d["step_graph_s"], "eager_s": None,
                         "ratio": sim / d["step_graph_s"]})
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
        out += ["| model | tokens | what | measured (graphed) | measured (eager) | kvtop | kvtop / measured |",
                "|---|---:|---|---:|---:|---:|---:|"]
        for r in ttft:
            eager = f"{r['eager_s'] * 1e3:.2f} ms" if r["eager_s"] else ""
            out.append(f"| {r['model'].split('/')[-1]} | {r['prompt_tokens']:,} | {r['kind']} | "
                       f"{r['measured_s'] * 1e3:.2f} ms | {eager} | {r['sim_s'] * 1e3:.2f} ms | {r['ratio']:.2f} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scale", type=float, default=1.0, help="fraction of the published request counts")
    ap.add_argument("--only", default=None, help="substring of the model name (8B, 70B)")
    ap.add_argument("--gpu", action="append", help="H200, H100, GH200 (repeatable)")
    ap.add_argument("--ttft", action="store_true", help="the TTFT rows only")
    ap.add_argument("--out", default=None, help="JSON results (default bench/results/cost-bench-<date>.json)")
    a = ap.parse_args()
    ttft = ttft_rows()
    rows = [] if a.ttft else throughput_rows(a.scale, a.only, a.gpu)
    print(markdown(rows, ttft))
    out = Path(a.out) if a.out else HERE / "results" / f"cost-bench-{_dt.date.today().isoformat()}.json"
    out.write_text(json.dumps({"command": " ".join(sys.argv), "machine": platform.processor() or platform.machine(),
                               "python": platform.python_version(), "scale": a.scale, "throughput": rows,
                               "ttft": ttft}, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
