"""TensorRT-LLM's KV cache offloading example, with the numbers printed instead of grepped from debug logs.

Prompts A, B, A, B through an LLM with batch size 1, a GPU KV cache of 256 tokens in 16-token blocks, and, with
--enable_offloading, a 1 GB host cache (as in TensorRT-LLM's examples/llm-api/llm_kv_cache_offloading.py).
Each prompt plus its answer needs the whole GPU pool (230 + 16 tokens = 16 blocks), so B evicts A:
- without a host cache A's blocks are dropped, and its return reuses nothing;
- with one they are offloaded to host memory and onboarded when A returns: reused.

Runs on TensorRT-LLM when it imports, otherwise on kvtop's simulator of it (say --engine to choose). The
prompts are token ids, so both engines see exactly the same 230 tokens. It ends by printing
``reused blocks: N`` and ``cache hit rate: X`` from the engine's own iteration stats.

    python examples/kv_cache_offloading.py                      # reused blocks: 0
    python examples/kv_cache_offloading.py --enable_offloading  # reused blocks: > 0
"""

from __future__ import annotations

import argparse
import importlib.util
import random
from typing import Any

MODEL = "TinyLlama/TinyLlama-1.1B-Chat-v1.0"
KV_CACHE_MAX_TOKENS = 256
TOKENS_PER_BLOCK = 16
HOST_CACHE_BYTES = 1024**3
PROMPT_TOKENS = 230   # with 16 output tokens: 246 tokens, 16 blocks, the whole GPU pool
OUTPUT_TOKENS = 16


def prompts() -> tuple[list[int], list[int]]:
    rng = random.Random(2025)  # TinyLlama's vocabulary has 32,000 ids
    return [rng.randrange(1, 32000) for _ in range(PROMPT_TOKENS)], [rng.randrange(1, 32000)
                                                                     for _ in range(PROMPT_TOKENS)]


def build_llm(engine: str, offloading: bool) -> tuple[Any, Any]:
    kv_args = dict(enable_block_reuse=True, max_tokens=KV_CACHE_MAX_TOKENS, tokens_per_block=TOKENS_PER_BLOCK,
                   host_cache_size=HOST_CACHE_BYTES if offloading else 0)
    if engine == "trtllm":
        from tensorrt_llm import LLM, SamplingParams
        from tensorrt_llm.llmapi import KvCacheConfig

        llm = LLM(model=MODEL, max_batch_size=1, max_seq_len=256, kv_cache_config=KvCacheConfig(**kv_args),
                  enable_iter_perf_stats=True)
    else:
        from kvtop.engines.sim import KvCacheConfig, SamplingParams, SimLLM

        llm = SimLLM(MODEL, max_batch_size=1, max_seq_len=256, kv_cache_config=KvCacheConfig(**kv_args),
                     enable_iter_perf_stats=True, speed=0)
    return llm, SamplingParams(max_tokens=OUTPUT_TOKENS)


def run(engine: str, offloading: bool) -> dict[str, Any]:
    llm, sampling = build_llm(engine, offloading)
    prompt_a, prompt_b = prompts()
    last: dict[str, Any] = {}
    try:
        for name, prompt in (("A", prompt_a), ("B", prompt_b), ("A", prompt_a), ("B", prompt_b)):
            llm.generate(prompt, sampling)
            for stats in llm.get_stats(timeout=2):
                last = stats if isinstance(stats, dict) else __import__("json").loads(stats)
            kv = last.get("kvCacheStats", {})
            print(f"prompt {name}: reused blocks so far {kv.get('reusedBlocks', '?')}, missed "
                  f"{kv.get('missedBlocks', '?')}")
    finally:
        llm.shutdown()
    return last.get("kvCacheStats", {})


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--enable_offloading", action="store_true", help="give the KV cache a 1 GB host tier")
    p.add_argument("--engine", choices=("auto", "trtllm", "sim"), default="auto")
    a = p.parse_args(argv)
    engine = a.engine
    if engine == "auto":
        engine = "trtllm" if importlib.util.find_spec("tensorrt_llm") is not None else "sim"
    print(f"engine: {engine} ({'TensorRT-LLM' if engine == 'trtllm' else 'kvtop simulator of TensorRT-LLM 1.2'}),"
          f" offloading {'on' if a.enable_offloading else 'off'}")
    kv = run(engine, a.enable_offloading)
    print(f"reused blocks: {kv.get('reusedBlocks', 0)}")
    print(f"cache hit rate: {kv.get('cacheHitRate', 0.0)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
