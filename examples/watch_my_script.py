"""Watch the KV cache tiers of your own TensorRT-LLM script with one line: ``kvtop.watch(llm)``.

Runs on TensorRT-LLM when it is importable, else on kvtop's built-in simulator (same API, no GPU needed):

    python examples/watch_my_script.py                            # records into a new temporary directory
    python examples/watch_my_script.py --record run.jsonl         # ...or where you say
    KVTOP_PUBLISH=mqtt://localhost/lab python examples/watch_my_script.py   # and `kvtop attach mqtt://localhost/lab`

The recording is never written into the directory it is run from (a checkout of kvtop stays clean).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import tempfile
from pathlib import Path

import kvtop

try:  # the real engine, where it is installed
    from tensorrt_llm import LLM, SamplingParams
    from tensorrt_llm.llmapi import KvCacheConfig

    def make_llm() -> LLM:
        return LLM("Qwen/Qwen3-8B", enable_iter_perf_stats=True,  # stats on the PyTorch backend
                   kv_cache_config=KvCacheConfig(host_cache_size=8 * 2**30, event_buffer_max_size=1024))
except ImportError:  # kvtop's simulator: TensorRT-LLM's LLM surface, no GPU
    from kvtop.engines.sim import KvCacheConfig, SamplingParams, SimLLM

    def make_llm() -> SimLLM:  # type: ignore[misc]
        # A small GPU pool (8,192 tokens = 256 blocks) so the workload below overflows it into host memory.
        return SimLLM("Qwen/Qwen3-8B", enable_iter_perf_stats=True, speed=0,
                      kv_cache_config=KvCacheConfig(host_cache_size=8 * 2**30, event_buffer_max_size=1024,
                                                    max_tokens=8192))


async def my_workload(llm) -> None:
    # 8 users who share a 2,000-token system prompt, 4 growing turns each: prefix reuse, and (once the GPU
    # pool is full) offload to host and onboard back.
    system = list(range(1000, 3000))
    for turn in range(4):
        outs = [llm.generate_async(system + [50_000 + 1_000 * u + t for t in range(300 * (turn + 1))],
                                   SamplingParams(max_tokens=32)) for u in range(8)]
        await asyncio.gather(*(o.aresult() for o in outs))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--record", default=None, metavar="FILE",
                   help="write the recording here (default: watch_my_script.jsonl in a new temporary directory)")
    a = p.parse_args(argv)
    record = Path(a.record) if a.record else Path(tempfile.mkdtemp(prefix="kvtop-example-")) / "watch_my_script.jsonl"
    llm = make_llm()
    handle = kvtop.watch(llm, publish=os.environ.get("KVTOP_PUBLISH"), record=str(record))
    try:
        asyncio.run(my_workload(llm))
    finally:
        handle.stop()  # drains the engine once more, flushes the recording, says "offline" on MQTT
        llm.shutdown()
    s = handle.summary()
    print(json.dumps({"tiers": s["tiers"], "hit_rate": s["hit_rate"]["cumulative"], "moves": s["moves"]}, indent=1))
    print(f"recorded to {record}; replay it with: kvtop replay {record}")


if __name__ == "__main__":
    main()
