"""Simulated runs for tests, demos and benchmarks: workloads, a fast trace driver, and recordings.

- `zipf_prefix_workload` / `mooncake_workload`: request lists with reuse pressure.
- `simulate`: replays a request list through the simulator's engine loop (`SimEngineCore` over a
  `BlockManager`) as fast as possible, handing every iteration's stats and KV events to callbacks.
  Deterministic: the same inputs give the same hit counts, which is what the what-if validation needs.
- `record_sim_run`: drives `SimLLM(speed=0)` like a user script would and writes a recording (JSONL of
  records: `meta`, `stats`, `kv_event`, `request`) that `kvtop report` and replay read.
"""

from __future__ import annotations

import datetime as _dt
import json
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvtop.engines.gpus import GpuProfile, resolve_gpu
from kvtop.engines.models import ModelShape, resolve_model
from kvtop.engines.sim.block_manager import BlockManager
from kvtop.engines.sim.core import SimEngineCore, SimRequest, generated_token
from kvtop.records import Record, SourceId, encode, make

__all__ = [
    "WorkItem",
    "chat_workload",
    "fold_simulated",
    "mooncake_workload",
    "record_sim_run",
    "simulate",
    "zipf_prefix_workload",
]


@dataclass(frozen=True)
class WorkItem:
    """One request of a workload: when it arrives (s), its prompt token ids, how many tokens it generates."""

    arrival_s: float
    prompt: tuple[int, ...]
    max_tokens: int


def _zipf_weights(n: int, s: float) -> list[float]:
    return [1.0 / (rank ** s) for rank in range(1, n + 1)]


def zipf_prefix_workload(n_requests: int, n_prefixes: int, prefix_tokens: int, suffix_tokens: int = 32,
                         zipf_s: float = 1.0, max_tokens: int = 8, rate_per_s: float = 50.0,
                         seed: int = 0) -> list[WorkItem]:
    """Requests that share long prefixes: each picks one of `n_prefixes` prefixes of `prefix_tokens` tokens
    with Zipf(`zipf_s`) popularity and appends `suffix_tokens` tokens of its own; Poisson arrivals.

    Token ids: prefix p uses 1_000_000 * (p + 1) + i, suffixes 500_000_000 + a running count, so no two
    prefixes and no two suffixes share a block.
    """
    rng = random.Random(seed)
    weights = _zipf_weights(n_prefixes, zipf_s)
    order = list(range(n_prefixes))
    rng.shuffle(order)  # popularity not tied to the id
    items: list[WorkItem] = []
    t = 0.0
    next_suffix = 500_000_000
    for _ in range(n_requests):
        t += rng.expovariate(rate_per_s)
        p = order[rng.choices(range(n_prefixes), weights)[0]]
        prompt = [1_000_000 * (p + 1) + i for i in range(prefix_tokens)]
        prompt += range(next_suffix, next_suffix + suffix_tokens)
        next_suffix += suffix_tokens
        items.append(WorkItem(t, tuple(prompt), max_tokens))
    return items


def chat_workload(n_conversations: int, turns: int, system_tokens: int = 256, user_tokens: int = 64,
                  output_tokens: int = 32, n_system_prompts: int = 4, think_s: float = 5.0,
                  rate_per_s: float = 4.0, seed: int = 0) -> list[WorkItem]:
    """Multi-turn chats: each turn's prompt is the previous prompt + the previous answer + a new user message.

    The previous answer is what the simulator will generate (its greedy outputs are a function of the
    prompt), so turn t+1 reuses turn t's generated blocks, as a real chat does. Conversations share one of
    `n_system_prompts` system prompts, start as a Poisson process and wait `think_s` (exponential) between
    turns.
    """
    rng = random.Random(seed)
    items: list[WorkItem] = []
    start = 0.0
    next_user = 700_000_000
    for _ in range(n_conversations):
        start += rng.expovariate(rate_per_s)
        sys_id = rng.randrange(n_system_prompts)
        prompt = [2_000_000 * (sys_id + 1) + i for i in range(system_tokens)]
        t = start
        for _ in range(turns):
            prompt = prompt + list(range(next_user, next_user + user_tokens))
            next_user += user_tokens
            items.append(WorkItem(t, tuple(prompt), output_tokens))
            digest = hash(tuple(prompt))  # SimEngineCore.submit's digest: same prompt, same answer
            prompt = prompt + [generated_token(digest, i) for i in range(output_tokens)]
            t += rng.expovariate(1.0 / think_s)
    return items


def mooncake_workload(path: str | Path, limit: int | None = None, tokens_per_hash: int = 512,
                      max_input_tokens: int | None = None, max_tokens: int | None = None,
                      time_scale: float = 1.0) -> list[WorkItem]:
    """A Mooncake trace (`{"timestamp" ms, "input_length", "output_length", "hash_ids"}` per line) as requests.

    Hash id h at position j stands for tokens h * 512 + k, k = 0..511 (the last block only as far as
    `input_length` reaches). `tokens_per_hash` < 512 scales the trace down: each hash block becomes that many
    tokens (16 with 32-token KV blocks keeps the reuse structure and costs 1/32 of the hashing); lengths scale
    with it. Requests longer than `max_input_tokens` (after scaling) are cut to it; `max_tokens` caps outputs.
    """
    items: list[WorkItem] = []
    with Path(path).open(encoding="utf-8") as fh:
        for n, line in enumerate(fh):
            if limit is not None and n >= limit:
                break
            row = json.loads(line)
            hashes = row["hash_ids"]
            length = max(1, round(row["input_length"] * tokens_per_hash / 512))
            prompt: list[int] = []
            for h in hashes:
                prompt.extend(range(h * 512, h * 512 + tokens_per_hash))
            prompt = prompt[:length]
            if max_input_tokens is not None:
                prompt = prompt[:max_input_tokens]
            out = max(1, round(row["output_length"] * tokens_per_hash / 512))
            if max_tokens is not None:
                out = min(out, max_tokens)
            items.append(WorkItem(row["timestamp"] / 1000.0 * time_scale, tuple(prompt), out))
    return items


def simulate(items: Sequence[WorkItem], *, primary_blocks: int, secondary_blocks: int,
             model: str | ModelShape = "Qwen/Qwen3-0.6B", gpu: str | GpuProfile = "H200",
             tokens_per_block: int = 32, events: bool = False, max_num_tokens: int = 8192,
             max_batch_size: int = 256,
             on_events: Callable[[list[dict[str, Any]]], None] | None = None,
             on_stats: Callable[[list[dict[str, Any]]], None] | None = None) -> dict[str, Any]:
    """Replay `items` through the simulated engine loop as fast as possible.

    With `events`, KV events are produced (hashes computed) and handed to `on_events` after every iteration,
    before that iteration's stats go to `on_stats`. Returns the final counters: `hit_rate` (block-based, as
    kvCacheStats), `reused_blocks`, `missed_blocks`, `onboarded_blocks`, `offloaded_blocks`, `completed`,
    `failed`, `sim_time_s`.
    """
    shape = model if isinstance(model, ModelShape) else resolve_model(model)
    prof = gpu if isinstance(gpu, GpuProfile) else resolve_gpu(gpu)
    holder: dict[str, SimEngineCore] = {}
    bm = BlockManager(primary_blocks, secondary_blocks, tokens_per_block,
                      event_buffer_max_size=(1 << 30) if events else 0,
                      clock_ms=lambda: holder["core"].now_s * 1000.0)
    core = SimEngineCore(shape, prof, bm, max_batch_size=max_batch_size, max_num_tokens=max_num_tokens,
                         enable_iter_perf_stats=on_stats is not None, max_stats_len=1 << 20,
                         max_seq_len=1 << 30)
    holder["core"] = core
    for i, item in enumerate(sorted(items, key=lambda it: it.arrival_s)):
        core.submit(SimRequest(i, list(item.prompt), item.max_tokens, item.arrival_s))
    if on_events is not None and events:
        on_events(bm.take_events())  # the `created` event
    while not core.idle():
        if not core.has_runnable():
            nxt = core.next_arrival_s()
            if nxt is None:
                break
            core.now_s = max(core.now_s, nxt)
            continue
        core.step()
        if on_events is not None and events:
            on_events(bm.take_events())
        if on_stats is not None:
            on_stats(core.take_stats())
    reused, missed = bm.reused_blocks, bm.missed_blocks
    return {
        "hit_rate": reused / (reused + missed) if reused + missed else 0.0,
        "reused_blocks": reused,
        "missed_blocks": missed,
        "onboarded_blocks": bm.onboarded_blocks,
        "offloaded_blocks": bm.offloaded_blocks,
        "completed": core.completed,
        "failed": core.failed,
        "sim_time_s": core.now_s,
    }


def fold_simulated(items: Sequence[WorkItem], *, primary_blocks: int, secondary_blocks: int,
                   model: str = "Qwen/Qwen3-8B", gpu: str = "H200", tokens_per_block: int = 32,
                   concurrency: int = 8) -> tuple[Any, dict[str, float]]:
    """Replay `items` closed loop (`concurrency` in flight, each next one submitted when one finishes, in list
    order) through the simulated engine loop, folding its meta, KV events, iteration stats and one `request`
    record per finished request (as the workload driver writes them) into a TierModel as they come, stamped with
    the simulated clock. Deterministic. Returns the model and the truth a verdict is held to: `makespan_s` (the
    simulated time the whole workload took) and `ttft_sum_s`.
    """
    from kvtop.tiers import TierModel

    shape, prof = resolve_model(model), resolve_gpu(gpu)
    holder: dict[str, SimEngineCore] = {}
    bm = BlockManager(primary_blocks, secondary_blocks, tokens_per_block, event_buffer_max_size=1 << 30,
                      clock_ms=lambda: holder["core"].now_s * 1000.0)
    core = SimEngineCore(shape, prof, bm, max_batch_size=256, max_num_tokens=8192, enable_iter_perf_stats=True,
                         max_stats_len=1 << 20, max_seq_len=1 << 30)
    holder["core"] = core
    source = SourceId(host="sim", rank=0, run="truth")
    m = TierModel()
    m.apply(make("meta", {"engine": "sim", "model": model, "gpu": gpu, "tokens_per_block": tokens_per_block,
                          "bytes_per_block": shape.kv_bytes_per_token * tokens_per_block,
                          "primary_blocks": primary_blocks, "secondary_blocks": secondary_blocks}, source, 0.0))
    pending = list(enumerate(items))
    running: list[SimRequest] = []
    ttft_sum = 0.0

    def submit() -> None:
        while pending and len(running) < concurrency:
            i, item = pending.pop(0)
            req = SimRequest(i, list(item.prompt), item.max_tokens, core.now_s)
            running.append(req)
            core.submit(req)

    submit()
    while running:
        core.step()
        t = core.now_s
        for ev in bm.take_events():
            m.apply(make("kv_event", ev, source, t))
        for st in core.take_stats():
            m.apply(make("stats", st, source, t))
        for req in [r for r in running if r.stage in ("GENERATION_COMPLETE", "FAILED")]:
            running.remove(req)
            ok = req.error is None and req.first_token_s is not None
            ttft = req.first_token_s - req.arrival_s if ok else None   # type: ignore[operator]
            ttft_sum += ttft or 0.0
            m.apply(make("request", {
                "request_id": req.request_id, "ok": ok, "ttft_s": ttft, "prompt_tokens": len(req.prompt_ids),
                "output_tokens": len(req.output_ids), "reused_blocks": req.reused_blocks,
                "host_hit_blocks": req.onboarded_blocks, "error": req.error}, source, t))
        submit()
    return m, {"makespan_s": core.now_s, "ttft_sum_s": ttft_sum}


# ---------------------------------------------------------------------------------------------- recordings

def _stats_time(stats: dict[str, Any], fallback: float) -> float:
    # TensorRT-LLM's "04-07-2025 20:33:17.747028" (local time); the simulator writes the same from its clock.
    text = stats.get("timestamp")
    if isinstance(text, str):
        try:
            return _dt.datetime.strptime(text, "%m-%d-%Y %H:%M:%S.%f").timestamp()
        except ValueError:
            pass
    return fallback


def record_sim_run(path: str | Path, *, n_requests: int = 60, host_cache_size: int = 0,
                   max_tokens: int = 2048, tokens_per_block: int = 32, model: str = "Qwen/Qwen3-8B",
                   gpu: str = "H200", n_prefixes: int = 12, prefix_tokens: int = 256, suffix_tokens: int = 32,
                   output_tokens: int = 8, concurrency: int = 4, zipf_s: float = 1.0, seed: int = 0,
                   run: str | None = None) -> dict[str, Any]:
    """Drive `SimLLM(speed=0)` with a shared-prefix workload and write a recording to `path`.

    `host_cache_size` in bytes, `max_tokens` caps the GPU pool (KvCacheConfig.max_tokens). Requests run
    closed-loop with `concurrency` in flight; stats and KV events are polled after every completion and each
    dict is wrapped in a record stamped with the simulated clock (stats with their own timestamp). The file
    starts with a `meta` record (`llm.describe()`); every finished request adds a `request` record.
    Returns `{"records": n, "meta": ..., "hit_rate": ...}`.
    """
    from kvtop.engines.sim import KvCacheConfig, SamplingParams, SimLLM  # the engine thread only when used

    items = zipf_prefix_workload(n_requests, n_prefixes, prefix_tokens, suffix_tokens, zipf_s=zipf_s,
                                 max_tokens=output_tokens, seed=seed)
    source = SourceId(host="sim", rank=0, run=run or Path(path).stem)
    kvc = KvCacheConfig(host_cache_size=host_cache_size, event_buffer_max_size=1 << 16, max_tokens=max_tokens,
                        tokens_per_block=tokens_per_block)
    records: list[Record] = []
    llm = SimLLM(model, kv_cache_config=kvc, enable_iter_perf_stats=True, speed=0, gpu=gpu,
                 max_stats_len=1 << 20)
    epoch = llm._core.epoch_s
    try:
        meta = {**llm.describe(), "scenario": "zipf-prefix", "concurrency": concurrency}
        records.append(make("meta", meta, source, epoch))

        def drain() -> None:
            now = epoch + llm.sim_time_s
            for ev in llm.get_kv_cache_events(timeout=0):
                records.append(make("kv_event", ev, source, now))
            for st in llm.get_stats(timeout=0):
                records.append(make("stats", st, source, _stats_time(st, now)))

        sp = SamplingParams(max_tokens=output_tokens)
        pending = list(items)
        in_flight: list[Any] = []
        while pending or in_flight:
            while pending and len(in_flight) < concurrency:
                in_flight.append(llm.generate_async(list(pending.pop(0).prompt), sp))
            out = in_flight.pop(0)
            res = out.result(timeout=60)
            drain()
            m = res.outputs[0].request_perf_metrics or {}
            timing = m.get("timing_metrics", {})
            kvm = m.get("kv_cache_metrics", {})
            md = res.metrics_dict
            records.append(make("request", {
                "request_id": res.request_id, "ok": res.error is None, "ttft_s": md.get("ttft"),
                "e2e_s": md.get("e2e"), "prompt_tokens": len(res.prompt_token_ids),
                "output_tokens": len(res.outputs[0].token_ids), "reused_blocks": kvm.get("num_reused_blocks", 0),
                "onboarded_blocks": kvm.get("num_onboarded_blocks", 0),
            }, source, epoch + (timing.get("last_token_time") or llm.sim_time_s)))
        llm.wait_idle(10)
        drain()
        stats = llm.block_manager.kv_cache_stats()
    finally:
        llm.shutdown()
    records.sort(key=lambda r: r.time)  # polls lag the engine; keep the file in time order (stable)
    with Path(path).open("w", encoding="utf-8") as fh:
        for rec in records:
            fh.write(encode(rec) + "\n")
    return {"records": len(records), "meta": meta, "hit_rate": stats["cacheHitRate"]}


def unique_prompts(n: int, tokens: int, repeat_every: int = 0, seed: int = 0) -> list[WorkItem]:
    """`n` prompts of `tokens` tokens that share nothing, but every `repeat_every`-th repeats an earlier one (long
    evicted from the GPU: a host hit where the tier kept it)."""
    rng = random.Random(seed)
    items: list[WorkItem] = []
    prompts: list[tuple[int, ...]] = []
    for i in range(n):
        if repeat_every and i and i % repeat_every == 0:
            prompt = prompts[rng.randrange(len(prompts))]
        else:
            prompt = tuple(range(10_000_000 * (i + 1), 10_000_000 * (i + 1) + tokens))
            prompts.append(prompt)
        items.append(WorkItem(0.0, prompt, 8))
    return items
