"""SimLLM: TensorRT-LLM's ``LLM`` surface over the simulated engine (llm.py, core.py, retention.py, tokenizer.py).

Shapes are TensorRT-LLM 1.2's (shared/trtllm-kv.md sections 1.3 and 2.2); numbers come from the pool sizing
rules (section 1.4 / sizing.py) and from the simulator's own cost model, compared with each other rather than
hard-coded.
"""

from __future__ import annotations

import asyncio
import re
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest

from kvtop.engines.sim import (
    KvCacheConfig,
    KvCacheRetentionConfig,
    RequestError,
    SamplingParams,
    SimLLM,
    TokenRangeRetentionConfig,
)
from kvtop.engines.sim.core import GENERATED_TOKEN_BASE
from kvtop.engines.sim.tokenizer import BuiltinTokenizer, load_tokenizer

R = KvCacheRetentionConfig
TR = KvCacheRetentionConfig.TokenRangeRetentionConfig

# Qwen3-8B's config.json: 36 layers, 8 KV heads, head_dim 128, bf16 -> 2 x 36 x 8 x 128 x 2 bytes per token.
QWEN3_8B_KV_BYTES_PER_TOKEN = 2 * 36 * 8 * 128 * 2  # 147,456

# shared/trtllm-kv.md 1.3: IterationStats JSON keys (jsonSerialization.cpp)
TOP_KEYS = {"timestamp", "iter", "iterLatencyMS", "newActiveRequestsQueueLatencyMS", "numNewActiveRequests",
            "numActiveRequests", "numQueuedRequests", "numCompletedRequests", "maxNumActiveRequests",
            "maxBatchSizeStatic", "maxBatchSizeTunerRecommended", "maxBatchSizeRuntime", "maxNumTokensStatic",
            "maxNumTokensTunerRecommended", "maxNumTokensRuntime", "gpuMemUsage", "cpuMemUsage", "pinnedMemUsage",
            "kvCacheStats", "staticBatchingStats", "inflightBatchingStats", "specDecodingStats"}
KV_KEYS = {"maxNumBlocks", "freeNumBlocks", "usedNumBlocks", "tokensPerBlock", "allocTotalBlocks", "allocNewBlocks",
           "reusedBlocks", "missedBlocks", "cacheHitRate"}
IFB_KEYS = {"numScheduledRequests", "numContextRequests", "numGenRequests", "numPausedRequests", "numCtxTokens",
            "microBatchId", "avgNumDecodedTokensPerIter"}
REQ_KEYS = {"id", "stage", "contextPrefillPosition", "numGeneratedTokens", "avgNumDecodedTokensPerIter", "scheduled",
            "paused", "disServingStats", "allocTotalBlocksPerRequest", "allocNewBlocksPerRequest",
            "reusedBlocksPerRequest", "missedBlocksPerRequest", "kvCacheHitRatePerRequest"}
STAGES = {"QUEUED", "CONTEXT_IN_PROGRESS", "GENERATION_IN_PROGRESS", "GENERATION_COMPLETE"}
TIMESTAMP = re.compile(r"^\d\d-\d\d-\d{4} \d\d:\d\d:\d\d\.\d{6}$")  # "04-07-2025 20:33:17.747028"


@pytest.fixture
def make_llm() -> Iterator[Any]:
    made: list[SimLLM] = []

    def make(**kw: Any) -> SimLLM:
        kw.setdefault("speed", 0)
        llm = SimLLM(kw.pop("model", "Qwen/Qwen3-8B"), **kw)
        made.append(llm)
        return llm

    yield make
    for llm in made:
        llm.shutdown()


def prompt(start: int, n: int) -> list[int]:
    return list(range(start, start + n))


def events_of(llm: SimLLM) -> list[dict[str, Any]]:
    return llm.get_kv_cache_events(timeout=0.2)


# ---------------------------------------------------------------------------------------------- generate

def test_generate_returns_tokens_text_and_metrics(make_llm: Any) -> None:
    llm = make_llm(kv_cache_config=KvCacheConfig(max_tokens=4096), return_perf_metrics=True)
    out = llm.generate(prompt(1, 100), SamplingParams(max_tokens=7))
    comp = out.outputs[0]
    assert len(comp.token_ids) == 7 and comp.length == 7
    assert all(t >= GENERATED_TOKEN_BASE for t in comp.token_ids)  # never a prompt/tokenizer id
    assert comp.text == llm.tokenizer.decode(comp.token_ids) and comp.text
    assert comp.finish_reason == "length"
    assert out.prompt is None and out.prompt_token_ids == prompt(1, 100)
    t = comp.request_perf_metrics["timing_metrics"]
    assert t["arrival_time"] <= t["first_scheduled_time"] <= t["first_token_time"] <= t["last_token_time"]
    kv = comp.request_perf_metrics["kv_cache_metrics"]
    assert kv["num_missed_blocks"] == -(-100 // 32) and kv["num_reused_blocks"] == 0
    m = out.metrics_dict
    assert m["ttft"] == pytest.approx(t["first_token_time"] - t["arrival_time"])
    assert m["e2e"] == pytest.approx(t["last_token_time"] - t["arrival_time"])
    assert m["tpot"] == pytest.approx((m["e2e"] - m["ttft"]) / 6)


def test_generate_batch_and_retention_list(make_llm: Any) -> None:
    llm = make_llm(kv_cache_config=KvCacheConfig(max_tokens=4096))
    outs = llm.generate([prompt(1, 40), prompt(500, 40)], SamplingParams(max_tokens=3),
                        kv_cache_retention_config=[R([TR(0, None, 80)]), None])
    assert isinstance(outs, list) and len(outs) == 2
    assert outs[0].prompt_token_ids == prompt(1, 40) and outs[1].prompt_token_ids == prompt(500, 40)
    assert outs[0].outputs[0].token_ids != outs[1].outputs[0].token_ids


def test_identical_prompts_give_identical_outputs_across_engines(make_llm: Any) -> None:
    p = prompt(1000, 300)
    a = make_llm(kv_cache_config=KvCacheConfig(max_tokens=4096))
    b = make_llm(kv_cache_config=KvCacheConfig(max_tokens=8192, tokens_per_block=16))
    sp = SamplingParams(max_tokens=12)
    first = a.generate(p, sp).outputs[0]
    again = a.generate(p, sp).outputs[0]   # served from the cache this time
    other = b.generate(p, sp).outputs[0]
    assert first.token_ids == again.token_ids == other.token_ids
    assert first.text == again.text == other.text
    assert a.generate(prompt(1001, 300), sp).outputs[0].token_ids != first.token_ids


def test_text_prompts_use_the_deterministic_tokenizer(make_llm: Any) -> None:
    llm = make_llm(kv_cache_config=KvCacheConfig(max_tokens=4096, tokens_per_block=16), return_perf_metrics=True)
    text = "The quick brown fox jumps over the lazy dog, " * 8
    ids = llm.tokenizer.encode(text)
    # word-level pieces keep their leading space: every repetition after the first has the same 10 ids
    assert len(ids) == 80 and ids[10:20] == ids[20:30] == ids[70:80] and ids[0] != ids[10]
    sp = SamplingParams(max_tokens=4)
    by_text = llm.generate(text, sp)
    by_ids = llm.generate(ids, sp)
    by_dict = llm.generate_async({"prompt_token_ids": ids}, sp).result(timeout=10)
    by_prompt_dict = llm.generate_async({"prompt": text}, sp).result(timeout=10)
    assert by_text.prompt == text and by_prompt_dict.prompt == text and by_ids.prompt is None
    assert by_text.prompt_token_ids == by_ids.prompt_token_ids == ids
    outs = {tuple(o.outputs[0].token_ids) for o in (by_text, by_ids, by_dict, by_prompt_dict)}
    assert len(outs) == 1
    # a shared text prefix is a shared id prefix, so it is reused
    longer = llm.generate(text + "and then some more words follow here", sp)
    assert longer.outputs[0].request_perf_metrics["kv_cache_metrics"]["num_reused_blocks"] >= 80 // 16 - 1
    with pytest.raises(TypeError):
        llm.generate_async(3.14)


def test_builtin_tokenizer() -> None:
    tok = BuiltinTokenizer(32000)
    ids = tok.encode("Hello, world! Hello world.")
    assert ids == BuiltinTokenizer(32000).encode("Hello, world! Hello world.")
    # pieces: "Hello" "," " world" "!" " Hello" " world" "."
    assert len(ids) == 7 and ids[2] == ids[5] and ids[0] != ids[4]
    assert all(1 <= t < 32000 for t in ids)
    assert tok.decode([5, 6]) == BuiltinTokenizer(10).decode([5, 6])
    assert tok.decode([5, 6]) != tok.decode([6, 5])
    assert tok.encode("") == []
    with pytest.raises(ValueError):
        BuiltinTokenizer(1)
    assert isinstance(load_tokenizer("nope/model", 1000, prefer_hf=False), BuiltinTokenizer)


async def test_generate_async_await_aresult_and_stream(make_llm: Any) -> None:
    llm = make_llm(kv_cache_config=KvCacheConfig(max_tokens=4096))
    sp = SamplingParams(max_tokens=5)
    r1 = await llm.generate_async(prompt(1, 64), sp)
    r2 = await llm.generate_async(prompt(1, 64), sp).aresult()
    assert r1.outputs[0].token_ids == r2.outputs[0].token_ids and len(r1.outputs[0].token_ids) == 5
    assert r1.finished and r2.finished


async def _stream_lengths(llm: SimLLM, n: int) -> tuple[list[int], list[bool], Any]:
    out = llm.generate_async(prompt(1, 64), SamplingParams(max_tokens=n), streaming=True)
    lengths, finished = [], []
    async for part in out:
        lengths.append(len(part.outputs[0].token_ids))
        finished.append(part.finished)
    return lengths, finished, out


async def test_streaming_yields_growing_partial_outputs(make_llm: Any) -> None:
    # paced to the wall clock so that tokens arrive one by one (about 4 ms of decode each on the H200 model)
    llm = make_llm(kv_cache_config=KvCacheConfig(max_tokens=4096), speed=1.0)
    lengths, finished, out = await _stream_lengths(llm, 24)
    assert len(lengths) >= 3
    assert lengths == sorted(lengths) and lengths[0] >= 1 and lengths[-1] == 24
    assert finished[-1] and not finished[0]
    final = await out.aresult()
    again = await llm.generate_async(prompt(1, 64), SamplingParams(max_tokens=24))
    assert final.outputs[0].token_ids == again.outputs[0].token_ids


async def test_streaming_yields_no_step_without_new_tokens(make_llm: Any) -> None:
    llm = make_llm(kv_cache_config=KvCacheConfig(max_tokens=4096), speed=1.0)
    lengths, finished, _ = await _stream_lengths(llm, 24)
    assert len(set(lengths)) == len(lengths), lengths  # every step carries at least one new token


async def test_streaming_after_a_stalled_loop_sends_no_step_twice(make_llm: Any) -> None:
    # The loop blocks after the first step while the engine thread finishes the request (24 tokens at ~4 ms
    # each on the H200 model: ~0.1 s, well inside the 0.5 s stall); the per-token wake-ups queued meanwhile
    # must not yield the finished request's tokens before the final response yields them again (this is what
    # made the test above fail under load: lengths [.., 24, 24]).
    llm = make_llm(kv_cache_config=KvCacheConfig(max_tokens=4096), speed=1.0)
    out = llm.generate_async(prompt(1, 64), SamplingParams(max_tokens=24), streaming=True)
    lengths, finished = [], []
    async for part in out:
        lengths.append(len(part.outputs[0].token_ids))
        finished.append(part.finished)
        if len(lengths) == 1:
            time.sleep(0.5)
    assert len(set(lengths)) == len(lengths), lengths
    assert lengths[-1] == 24 and finished[-1] and not any(finished[:-1]), (lengths, finished)


# ---------------------------------------------------------------------------------------------- pool sizing

def test_pool_sizing_as_tensorrt_llm() -> None:
    kvc = KvCacheConfig(max_tokens=256, tokens_per_block=16, host_cache_size=2**30)
    with SimLLM("Qwen/Qwen3-8B", kv_cache_config=kvc, gpu="H200", speed=0) as llm:
        assert llm.primary_blocks == 256 // 16 == 16
        assert llm.secondary_blocks == int(2**30 / QWEN3_8B_KV_BYTES_PER_TOKEN / 16)  # 455
        assert llm.bytes_per_block == QWEN3_8B_KV_BYTES_PER_TOKEN * 16
        assert llm.describe()["secondary_blocks"] == llm.secondary_blocks
    # ceil to whole blocks: 100 tokens in 32-token blocks is 4 blocks; no host cache, no secondary pool
    with SimLLM(kv_cache_config=KvCacheConfig(max_tokens=100), speed=0) as llm:
        assert (llm.primary_blocks, llm.secondary_blocks) == (4, 0)
    # from the fraction: a smaller fraction of the same GPU gives proportionally fewer blocks
    with SimLLM(kv_cache_config=KvCacheConfig(free_gpu_memory_fraction=0.9), speed=0) as big, \
            SimLLM(kv_cache_config=KvCacheConfig(free_gpu_memory_fraction=0.45), speed=0) as half:
        assert big.primary_blocks > 10_000
        assert half.primary_blocks == pytest.approx(big.primary_blocks / 2, abs=2)


def test_kv_cache_config_rejects_bad_values_and_unknown_names() -> None:
    with pytest.raises(ValueError, match="free_gpu_memory_fraction"):
        KvCacheConfig(free_gpu_memory_fraction=1.5)
    with pytest.raises(ValueError, match="tokens_per_block"):
        KvCacheConfig(tokens_per_block=0)
    with pytest.raises(ValueError, match="host_cache_size"):
        KvCacheConfig(host_cache_size=-1)
    with pytest.raises(TypeError):
        KvCacheConfig(host_cache_bytes=10)  # type: ignore[call-arg]
    with pytest.raises(TypeError, match="enable_magic"):
        SimLLM(speed=0, enable_magic=True)
    with pytest.raises(ValueError, match="speed"):
        SimLLM(speed=-1)


# ---------------------------------------------------------------------------------------------- stats

def test_stats_are_1_2_shaped_and_drained_once(make_llm: Any) -> None:
    kvc = KvCacheConfig(max_tokens=1024, tokens_per_block=16, host_cache_size=2**30)
    llm = make_llm(kv_cache_config=kvc, enable_iter_perf_stats=True, max_batch_size=4, max_num_tokens=2048)
    llm.generate(prompt(1, 100), SamplingParams(max_tokens=5))
    llm.generate(prompt(1, 100), SamplingParams(max_tokens=5))
    stats = llm.get_stats(timeout=1)
    assert len(stats) == 10  # one record per iteration: 1 context + 4 decode iterations per request
    assert [s["iter"] for s in stats] == list(range(10))
    for s in stats:
        assert TOP_KEYS <= set(s), TOP_KEYS - set(s)
        assert "requestStats" not in s
        assert set(s["kvCacheStats"]) == KV_KEYS
        assert set(s["inflightBatchingStats"]) == IFB_KEYS
        assert s["staticBatchingStats"] is None and s["specDecodingStats"] is None
        assert TIMESTAMP.match(s["timestamp"])
        assert s["cpuMemUsage"] == 0 and s["pinnedMemUsage"] == 0  # PyTorch backend: always 0 (1.2)
        assert s["maxBatchSizeStatic"] == 4 and s["maxNumTokensStatic"] == 2048
        kv = s["kvCacheStats"]
        # 1.2: maxNumBlocks counts both pools, freeNumBlocks only the primary one, used = max - free
        assert kv["maxNumBlocks"] == llm.primary_blocks + llm.secondary_blocks == 64 + 455
        assert 0 <= kv["freeNumBlocks"] <= llm.primary_blocks
        assert kv["usedNumBlocks"] == kv["maxNumBlocks"] - kv["freeNumBlocks"]
        assert kv["tokensPerBlock"] == 16
        r, m = kv["reusedBlocks"], kv["missedBlocks"]
        assert kv["cacheHitRate"] == pytest.approx(r / (r + m) if r else 0.0)
    last = stats[-1]["kvCacheStats"]
    assert (last["reusedBlocks"], last["missedBlocks"]) == (7, 7)  # 100 tokens = 7 blocks, then all 7 reused
    assert [s["inflightBatchingStats"]["numCtxTokens"] for s in stats[:5]] == [100, 0, 0, 0, 0]
    # drain-once
    assert llm.get_stats(timeout=0.05) == []


def test_request_stats_when_enabled(make_llm: Any) -> None:
    llm = make_llm(kv_cache_config=KvCacheConfig(max_tokens=1024), enable_iter_perf_stats=True,
                   enable_iter_req_stats=True)
    llm.generate(prompt(1, 100), SamplingParams(max_tokens=3))
    stats = llm.get_stats(timeout=1)
    assert len(stats) == 3
    for s in stats:
        assert len(s["requestStats"]) == 1
        rs = s["requestStats"][0]
        assert set(rs) == REQ_KEYS and rs["stage"] in STAGES
    stages = [s["requestStats"][0]["stage"] for s in stats]
    assert stages[-1] == "GENERATION_COMPLETE"
    assert [s["requestStats"][0]["numGeneratedTokens"] for s in stats] == [1, 2, 3]


def test_no_stats_without_enable_iter_perf_stats(make_llm: Any) -> None:
    llm = make_llm(kv_cache_config=KvCacheConfig(max_tokens=1024, event_buffer_max_size=64))
    llm.generate(prompt(1, 100), SamplingParams(max_tokens=3))
    assert llm.get_stats(timeout=0.05) == []
    assert llm.get_kv_cache_events(timeout=0.5)  # events still flow


def test_no_events_without_event_buffer(make_llm: Any) -> None:
    llm = make_llm(kv_cache_config=KvCacheConfig(max_tokens=1024, event_buffer_max_size=0),
                   enable_iter_perf_stats=True)
    llm.generate(prompt(1, 100), SamplingParams(max_tokens=3))
    assert llm.get_kv_cache_events(timeout=0.05) == []
    assert llm.get_stats(timeout=0.5)


async def test_async_stats_and_events_drain_once(make_llm: Any) -> None:
    llm = make_llm(kv_cache_config=KvCacheConfig(max_tokens=1024, event_buffer_max_size=64),
                   enable_iter_perf_stats=True)
    await llm.generate_async(prompt(1, 100), SamplingParams(max_tokens=4))
    stats = [s async for s in llm.get_stats_async(timeout=1)]
    events = [e async for e in llm.get_kv_cache_events_async(timeout=1)]
    assert len(stats) == 4 and all(TOP_KEYS <= set(s) for s in stats)
    assert events[0]["data"]["type"] == "created"
    assert [e["event_id"] for e in events] == list(range(len(events)))
    t0 = time.monotonic()
    assert [s async for s in llm.get_stats_async(timeout=0.1)] == []
    assert [e async for e in llm.get_kv_cache_events_async(timeout=0.1)] == []
    assert time.monotonic() - t0 >= 0.15  # each waited its timeout for more before ending


# ---------------------------------------------------------------------------------------------- events

def _check_stored_block(b: dict[str, Any], tpb: int) -> None:
    assert set(b) == {"type", "block_hash", "tokens", "cache_level", "priority"}
    assert b["type"] == "stored_block" and 0 <= b["block_hash"] < 2**64
    assert 1 <= len(b["tokens"]) <= tpb
    for t in b["tokens"]:
        assert t == {"type": "unique_token", "token_id": t["token_id"], "token_extra_id": 0}


def test_events_created_stored_removed_shape(make_llm: Any) -> None:
    # TensorRT-LLM's offloading example without a host: A (230 tokens) then B evicts A entirely.
    kvc = KvCacheConfig(max_tokens=256, tokens_per_block=16, event_buffer_max_size=1000)
    llm = make_llm(kv_cache_config=kvc, max_batch_size=1)
    a, b = prompt(1, 230), prompt(5000, 230)
    llm.generate(a, SamplingParams(max_tokens=16))
    llm.generate(b, SamplingParams(max_tokens=16))
    events = events_of(llm)
    assert events[0]["event_id"] == 0
    assert events[0]["data"] == {"type": "created", "num_blocks_per_cache_level": [16, 0]}
    assert [e["event_id"] for e in events] == list(range(len(events)))
    assert all(set(e) >= {"event_id", "data", "window_size"} for e in events)
    assert sum(e["data"]["type"] == "created" for e in events) == 1
    stored = [e["data"] for e in events if e["data"]["type"] == "stored"]
    # the root block of A: parent None, first tokens are A's
    root = stored[0]
    assert root["parent_hash"] is None
    assert [t["token_id"] for t in root["blocks"][0]["tokens"]] == a[:16]
    known: set[int] = set()
    for ev in stored:
        assert ev["parent_hash"] is None or ev["parent_hash"] in known  # chained to an earlier stored block
        for blk in ev["blocks"]:
            _check_stored_block(blk, 16)
            assert blk["cache_level"] == 0 and blk["priority"] == 35
            known.add(blk["block_hash"])
    # consecutive removals are coalesced: never two removed events in a row
    types = [e["data"]["type"] for e in events]
    assert all(not (x == y == "removed") for x, y in zip(types, types[1:]))
    removed = [h for e in events if e["data"]["type"] == "removed" for h in e["data"]["block_hashes"]]
    a_hashes = {blk["block_hash"] for ev in stored if [t["token_id"] for t in ev["blocks"][0]["tokens"]][0] in a
                for blk in ev["blocks"]}
    assert a_hashes and a_hashes <= set(removed)  # with no host tier, all of A is dropped for B
    assert max(len(e["data"]["block_hashes"]) for e in events if e["data"]["type"] == "removed") > 1


def test_events_updated_cache_level_on_offload_and_onboard(make_llm: Any) -> None:
    kvc = KvCacheConfig(max_tokens=256, tokens_per_block=16, host_cache_size=2**30, event_buffer_max_size=1000)
    llm = make_llm(kv_cache_config=kvc, max_batch_size=1)
    a, b = prompt(1, 230), prompt(5000, 230)
    for p in (a, b, a):
        llm.generate(p, SamplingParams(max_tokens=16))
    events = events_of(llm)
    assert events[0]["data"] == {"type": "created", "num_blocks_per_cache_level": [16, llm.secondary_blocks]}
    updated = [e["data"] for e in events if e["data"]["type"] == "updated"]
    diffs = [(u["cache_level"]["old_value"], u["cache_level"]["new_value"]) for u in updated if u["cache_level"]]
    for u in updated:
        if u["cache_level"] is not None:
            assert u["cache_level"]["type"] == "event_diff"
    offloads = [u["block_hash"] for u in updated if u["cache_level"] and u["cache_level"]["new_value"] == 1]
    onboards = [u["block_hash"] for u in updated if u["cache_level"] and u["cache_level"]["new_value"] == 0]
    assert set(diffs) == {(0, 1), (1, 0)}
    assert offloads and onboards
    assert set(onboards) <= set(offloads)  # only blocks that went to host come back


def test_retention_ranges_set_per_block_priorities(make_llm: Any) -> None:
    llm = make_llm(kv_cache_config=KvCacheConfig(max_tokens=4096, tokens_per_block=32, event_buffer_max_size=100))
    cfg = R([TR(64, None, 10), TR(0, 64, 90)], decode_retention_priority=60)  # given out of order on purpose
    llm.generate(prompt(1, 160), SamplingParams(max_tokens=2), kv_cache_retention_config=cfg)
    stored = [e["data"] for e in events_of(llm) if e["data"]["type"] == "stored"]
    blocks = [blk for ev in stored for blk in ev["blocks"]]
    prompt_blocks = [blk for blk in blocks if blk["tokens"][0]["token_id"] < GENERATED_TOKEN_BASE]
    gen_blocks = [blk for blk in blocks if blk["tokens"][0]["token_id"] >= GENERATED_TOKEN_BASE]
    by_start = {blk["tokens"][0]["token_id"]: blk["priority"] for blk in prompt_blocks}
    assert by_start == {1: 90, 33: 90, 65: 10, 97: 10, 129: 10}
    assert gen_blocks and all(blk["priority"] == 60 for blk in gen_blocks)


def test_retention_per_block_mapping() -> None:
    cfg = R([TR(0, 64, 90, timedelta(seconds=2)), TR(100, None, 20)])
    assert cfg.per_block(32, 200) == [(90, 2000), (90, 2000), (None, None), (None, None), (20, None),
                                      (20, None), (20, None)]
    assert len(cfg.per_block(32, 161)) == 6  # ceil(161 / 32)
    assert R([]).per_block(16, 40) == [(None, None)] * 3
    assert TR(0, 10, 50, 1500).duration_ms == 1500
    assert R([], decode_retention_priority=80, decode_duration_ms=timedelta(milliseconds=250)).decode_duration_ms \
        == 250


@pytest.mark.parametrize(
    "build",
    [
        lambda: R([TR(0, 100, 50), TR(50, 150, 60)]),          # overlapping
        lambda: R([TR(10, 20, 50), TR(0, 11, 60)]),            # overlapping, given out of order
        lambda: R([TR(0, None, 50), TR(100, 200, 60)]),        # only the last range may be open
        lambda: TR(0, 10, 101),
        lambda: TR(0, 10, -1),
        lambda: TR(0, 10, True),
        lambda: TR(10, 10, 50),                                # token_end <= token_start
        lambda: TR(10, 5, 50),
        lambda: TR(-1, 5, 50),
        lambda: TR(0, 5, 50, -3),
        lambda: R([], decode_retention_priority=101),
        lambda: R([], decode_retention_priority=-5),
        lambda: R([], decode_duration_ms=-1),
    ],
)
def test_invalid_retention_raises_value_error(build: Any) -> None:
    with pytest.raises(ValueError):
        build()


def test_retention_boundaries_are_valid() -> None:
    cfg = R([TR(0, 10, 0), TR(10, 20, 100), TR(20, None, 35)])  # touching ranges, priorities 0 and 100
    assert [r.priority for r in cfg.token_range_retention_configs] == [0, 100, 35]
    assert TokenRangeRetentionConfig is TR


# ---------------------------------------------------------------------------------------------- batching

def test_in_flight_batching_respects_max_batch_size(make_llm: Any) -> None:
    llm = make_llm(kv_cache_config=KvCacheConfig(max_tokens=65536), max_batch_size=3,
                   enable_iter_perf_stats=True, enable_iter_req_stats=True)
    outs = [llm.generate_async(prompt(1000 * i, 200), SamplingParams(max_tokens=20)) for i in range(10)]
    for o in outs:
        o.result(timeout=20)
    stats = llm.get_stats(timeout=1)
    running = [sum(r["stage"] in ("CONTEXT_IN_PROGRESS", "GENERATION_IN_PROGRESS", "GENERATION_COMPLETE")
                   for r in s["requestStats"]) for s in stats]
    assert max(running) == 3  # reached, never exceeded
    assert max(s["numActiveRequests"] for s in stats) == 3
    assert max(s["numQueuedRequests"] for s in stats) > 0
    assert sum(s["numCompletedRequests"] for s in stats) == 10
    assert sum(s["numNewActiveRequests"] for s in stats) == 10


def test_in_flight_batching_respects_max_num_tokens(make_llm: Any) -> None:
    llm = make_llm(kv_cache_config=KvCacheConfig(max_tokens=65536), max_num_tokens=512,
                   enable_iter_perf_stats=True)
    outs = [llm.generate_async(prompt(10_000 * (i + 1), 1500), SamplingParams(max_tokens=6)) for i in range(3)]
    for o in outs:
        o.result(timeout=20)
    stats = llm.get_stats(timeout=1)
    ifb = [s["inflightBatchingStats"] for s in stats]
    for x in ifb:
        assert x["numCtxTokens"] + x["numGenRequests"] <= 512
    assert max(x["numCtxTokens"] for x in ifb) == 512  # long prompts are prefilled in chunks
    assert sum(x["numCtxTokens"] for x in ifb) == 3 * 1500  # every prompt token computed once, no reuse


def test_request_too_long_fails_with_a_reason_and_engine_goes_on(make_llm: Any) -> None:
    llm = make_llm(kv_cache_config=KvCacheConfig(max_tokens=256, tokens_per_block=16), max_seq_len=200)
    with pytest.raises(RequestError) as info:
        llm.generate(prompt(1, 195), SamplingParams(max_tokens=8))
    msg = str(info.value)
    assert "max_seq_len" in msg and "195" in msg and "200" in msg
    ok = llm.generate(prompt(1, 100), SamplingParams(max_tokens=8))
    assert len(ok.outputs[0].token_ids) == 8


def test_request_too_big_for_the_pool_fails_and_engine_goes_on(make_llm: Any) -> None:
    llm = make_llm(kv_cache_config=KvCacheConfig(max_tokens=256, tokens_per_block=16))
    bad = llm.generate_async(prompt(1, 300), SamplingParams(max_tokens=4))
    good = llm.generate_async(prompt(1000, 100), SamplingParams(max_tokens=4))
    with pytest.raises(RequestError) as info:
        bad.result(timeout=10)
    msg = str(info.value)
    assert "19" in msg and "16" in msg and "block" in msg  # ceil(304 / 16) = 19 blocks needed, 16 in the pool
    assert bad.outputs[0].finish_reason == "error"
    assert len(good.result(timeout=10).outputs[0].token_ids) == 4


async def test_failed_request_raises_from_aresult(make_llm: Any) -> None:
    llm = make_llm(kv_cache_config=KvCacheConfig(max_tokens=256, tokens_per_block=16))
    with pytest.raises(RequestError, match="max_tokens"):
        await llm.generate_async(prompt(1, 10), SamplingParams(max_tokens=0))
    with pytest.raises(RequestError, match="empty"):
        await llm.generate_async([], SamplingParams(max_tokens=2))
    assert len((await llm.generate_async(prompt(1, 10), SamplingParams(max_tokens=2))).outputs[0].token_ids) == 2


# ---------------------------------------------------------------------------------------------- time

def _e2e(out: Any) -> float:
    return float(out.metrics_dict["e2e"])


def test_speed_1_paces_simulated_time_to_the_wall_clock(make_llm: Any) -> None:
    p, sp = prompt(1, 8000), SamplingParams(max_tokens=40)  # ~0.19 s prefill + 39 decode steps on H200
    fast = make_llm(kv_cache_config=KvCacheConfig(max_tokens=16384), speed=0)
    t0 = time.monotonic()
    x = _e2e(fast.generate(p, sp))
    fast_wall = time.monotonic() - t0
    assert 0.2 < x < 0.6
    assert fast_wall < x / 2  # as fast as possible: far quicker than simulated time
    paced = make_llm(kv_cache_config=KvCacheConfig(max_tokens=16384), speed=1.0)
    t0 = time.monotonic()
    out = paced.generate(p, sp)
    wall = time.monotonic() - t0
    paced_e2e = _e2e(out)
    # the same work; a starved engine thread (a loaded machine) can only make the paced run later, never earlier
    assert 0.95 * x <= paced_e2e <= 1.5 * x
    assert 0.7 * paced_e2e <= wall <= paced_e2e + 0.4


def test_ttft_gpu_hit_lt_host_hit_lt_miss(make_llm: Any) -> None:
    a, b = prompt(1, 8000), prompt(100_000, 8000)
    sp = SamplingParams(max_tokens=4)
    # pool of 288 blocks of 32 tokens: A (250 blocks) then B forces most of A out of the GPU
    gpu_only = make_llm(kv_cache_config=KvCacheConfig(max_tokens=9216))
    miss = gpu_only.generate(a, sp).metrics_dict["ttft"]
    gpu_hit_out = gpu_only.generate(a, sp)
    gpu_hit = gpu_hit_out.metrics_dict["ttft"]
    assert gpu_hit_out.outputs[0].request_perf_metrics["kv_cache_metrics"]["num_reused_blocks"] == 250

    host = make_llm(kv_cache_config=KvCacheConfig(max_tokens=9216, host_cache_size=10 * 10**9))
    assert host.generate(a, sp).metrics_dict["ttft"] == pytest.approx(miss)
    host.generate(b, sp)
    back = host.generate(a, sp)
    kv = back.outputs[0].request_perf_metrics["kv_cache_metrics"]
    assert kv["num_reused_blocks"] == 250 and kv["num_onboarded_blocks"] > 200  # served mostly from host
    host_hit = back.metrics_dict["ttft"]
    assert gpu_hit < host_hit < miss
    assert miss / gpu_hit > 10  # an 8k prefill dwarfs one reused-prompt iteration


# ---------------------------------------------------------------------------------------------- lifecycle

def test_shutdown_fails_pending_requests_and_joins_the_thread() -> None:
    before = set(threading.enumerate())
    llm = SimLLM(kv_cache_config=KvCacheConfig(max_tokens=65536), max_batch_size=1, speed=1.0)
    engine_threads = set(threading.enumerate()) - before
    assert len(engine_threads) == 1
    (thread,) = engine_threads
    running = llm.generate_async(prompt(1, 8000), SamplingParams(max_tokens=5000))  # ~20 s of simulated time
    queued = llm.generate_async(prompt(9000, 100), SamplingParams(max_tokens=5))
    time.sleep(0.05)
    t0 = time.monotonic()
    llm.shutdown()
    assert time.monotonic() - t0 < 3
    assert not thread.is_alive()
    for out in (running, queued):
        with pytest.raises(RequestError, match="shut down"):
            out.result(timeout=1)
    with pytest.raises(RuntimeError):
        llm.generate_async(prompt(1, 10))
    llm.shutdown()  # idempotent


def test_context_manager_shuts_down() -> None:
    before = set(threading.enumerate())
    with SimLLM(kv_cache_config=KvCacheConfig(max_tokens=1024), speed=0) as llm:
        (thread,) = set(threading.enumerate()) - before
        assert len(llm.generate(prompt(1, 10), SamplingParams(max_tokens=2)).outputs[0].token_ids) == 2
    assert not thread.is_alive()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_engine_survives_a_closed_waiting_loop() -> None:
    llm = SimLLM(kv_cache_config=KvCacheConfig(max_tokens=16384), speed=1.0)
    try:
        async def give_up() -> None:
            out = llm.generate_async(list(range(1, 200)), SamplingParams(max_tokens=40))  # ~0.2 s at speed 1
            with pytest.raises(asyncio.TimeoutError):
                await asyncio.wait_for(out.aresult(), timeout=0.02)

        asyncio.run(give_up())  # the loop closes while its waiter is still registered
        time.sleep(0.4)         # the request finishes now
        later = llm.generate_async(list(range(5000, 5100)), SamplingParams(max_tokens=2))
        assert len(later.result(timeout=1.5).outputs[0].token_ids) == 2
    finally:
        llm.shutdown()


def _events_through_a_slow_reader(pace: bool) -> tuple[int, int, int]:
    """40 prompts of 2,000 tokens at speed 0, a GPU pool of two of them and a host tier, so that every block
    allocated offloads one (an event each), into a 256-event buffer read every 20 ms by another thread: (events
    dropped by the engine, events the reader got, events the engine made)."""
    llm = SimLLM(kv_cache_config=KvCacheConfig(event_buffer_max_size=256, max_tokens=4096, host_cache_size=1 << 30),
                 speed=0, pace_to_event_drains=pace)
    taken: list[dict[str, Any]] = []
    stop = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            taken.extend(llm.get_kv_cache_events(timeout=0))
            time.sleep(0.02)

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        outs = [llm.generate_async(list(range(i * 10_000, i * 10_000 + 2000)), SamplingParams(max_tokens=4))
                for i in range(40)]
        for out in outs:
            out.result()
    finally:
        stop.set()
        thread.join()
    taken.extend(llm.get_kv_cache_events(timeout=0))
    made = llm.block_manager._next_event_id
    llm.shutdown()
    return llm.block_manager.dropped_events, len(taken), made


def test_paced_engine_loses_no_events_to_a_reader_that_keeps_reading() -> None:
    """pace_to_event_drains (kvtop's driven session): at speed 0 the engine waits for its events to be taken, so a
    reader slower than the engine gets every one; unpaced (TensorRT-LLM's way), a full buffer drops the oldest."""
    dropped, got, made = _events_through_a_slow_reader(pace=True)
    assert dropped == 0 and got == made and made > 4 * 256
    dropped, got, made = _events_through_a_slow_reader(pace=False)
    assert dropped > 0 and got == made - dropped


def test_paced_engine_loses_no_stats_to_a_reader_that_keeps_reading() -> None:
    """pace_to_event_drains waits for the iteration stats too once they are read: their queue keeps max_stats_len
    (the oldest dropped), and an engine flat out ran more steps between two drains than that (a driven trace run's
    stats_iterations_missing); unpaced, iterations go missing."""
    def iterations(pace: bool) -> tuple[list[int], int]:
        llm = SimLLM(kv_cache_config=KvCacheConfig(event_buffer_max_size=1 << 16, max_tokens=8192), speed=0,
                     enable_iter_perf_stats=True, max_stats_len=16, pace_to_event_drains=pace, max_batch_size=2)
        got: list[int] = []
        stop = threading.Event()

        def reader() -> None:
            while not stop.is_set():
                got.extend(s["iter"] for s in llm.get_stats(timeout=0))
                llm.get_kv_cache_events(timeout=0)
                time.sleep(0.005)

        thread = threading.Thread(target=reader)
        thread.start()
        try:
            for out in [llm.generate_async(list(range(i * 1000, i * 1000 + 100)), SamplingParams(max_tokens=60))
                        for i in range(20)]:
                out.result()
        finally:
            stop.set()
            thread.join()
        got.extend(s["iter"] for s in llm.get_stats(timeout=0))
        made = llm._core.iteration
        llm.shutdown()
        return got, made

    got, made = iterations(pace=True)
    assert made > 4 * 16 and got == list(range(got[0], got[0] + made))
    got, made = iterations(pace=False)
    assert len(got) < made


def test_a_paced_engine_wakes_its_poller_when_it_waits_for_a_drain() -> None:
    """notify_drain_wanted: kvtop's poller drains as soon as the paced engine waits for its events to be taken, not
    at its next interval (an hour here: before, each wait ran out its bound, EVENT_DRAIN_WAIT_S, and the events
    behind it dropped; a driven trace run spent a third of its wall time so, neither thread running)."""
    from kvtop.records import SourceId
    from kvtop.sources.poller import EnginePoller

    async def run() -> tuple[int, int, int, int]:
        llm = SimLLM(kv_cache_config=KvCacheConfig(event_buffer_max_size=256, max_tokens=4096,
                                                   host_cache_size=1 << 30),
                     speed=0, pace_to_event_drains=True)
        got: list[Any] = []
        poller = EnginePoller(llm, SourceId(host="test", rank=0, run="t"), interval_s=3600.0, sink=got.append)
        task = asyncio.ensure_future(poller.run())
        try:
            outs = [llm.generate_async(list(range(i * 10_000, i * 10_000 + 2000)), SamplingParams(max_tokens=4))
                    for i in range(12)]
            await asyncio.wait_for(asyncio.gather(*(o.aresult() for o in outs)), timeout=60)
            polls = poller.polls
        finally:
            await poller.final_poll()
            await task
            llm.shutdown()
        events = sum(1 for r in got if r.kind == "kv_event")
        return llm.block_manager.dropped_events, events, llm.block_manager._next_event_id, polls

    dropped, events, made, polls = asyncio.run(run())
    assert dropped == 0 and events == made and made > 4 * 256
    assert polls > made // 256  # a drain at every wait, each of at most a full buffer


def test_a_paced_engine_whose_reader_stops_reading_goes_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """A reader told that the engine waits (notify_drain_wanted) that never drains again, its callback failing
    even: each wait stays bounded (EVENT_DRAIN_WAIT_S, made short here), the engine answers every request and drops
    the events nobody took, as TensorRT-LLM's buffer does."""
    import kvtop.engines.sim.llm as llm_module

    monkeypatch.setattr(llm_module, "EVENT_DRAIN_WAIT_S", 0.01)
    llm = SimLLM(kv_cache_config=KvCacheConfig(event_buffer_max_size=64, max_tokens=4096, host_cache_size=1 << 30),
                 speed=0, pace_to_event_drains=True)
    told = []

    def wanted() -> None:
        told.append(threading.current_thread().name)
        raise RuntimeError("a reader gone")

    llm.notify_drain_wanted(wanted)
    try:
        llm.get_kv_cache_events(timeout=0)  # read once (the created event), then never again
        outs = [llm.generate_async(list(range(i * 10_000, i * 10_000 + 1000)), SamplingParams(max_tokens=4))
                for i in range(8)]
        assert all(len(o.result(timeout=60).outputs[0].token_ids) == 4 for o in outs)
    finally:
        llm.shutdown()
    assert told and set(told) == {"kvtop-simllm"} and llm.block_manager.dropped_events > 0


def test_stored_events_as_token_ids() -> None:
    """kv_event_token_ids: a stored block's tokens as kvtop.compact's "token_ids", the same event otherwise."""
    from kvtop.compact import read_form

    events = {}
    for compact in (False, True):
        with SimLLM(kv_cache_config=KvCacheConfig(event_buffer_max_size=1024), speed=0,
                    kv_event_token_ids=compact) as llm:
            llm.generate(list(range(100, 180)), SamplingParams(max_tokens=2))
            events[compact] = [e for e in llm.get_kv_cache_events(timeout=0.5) if e["data"]["type"] == "stored"]
    assert events[True] and events[True][0]["data"]["blocks"][0]["token_ids"] == list(range(100, 132))
    assert [read_form(e) for e in events[False]] == events[True]


def test_trusted_records_are_what_make_gives() -> None:
    """kvtop's driven session (kv_event_token_ids) says its dicts are trusted: records.trusted_record, which skips
    make's checks and read_form, gives make's record for every stat and event of a run that offloads, onboards,
    evicts, retains and stores (a trace prompt as TokenRuns too); without token ids the engine is not trusted."""
    from kvtop.compact import read_form
    from kvtop.engines.sim.block_manager import TokenRuns
    from kvtop.records import SourceId, make, trusted_record

    src = SourceId(host="h", rank=0, run="r")
    kvc = KvCacheConfig(max_tokens=256, tokens_per_block=16, host_cache_size=20 << 20, event_buffer_max_size=10_000)
    with SimLLM(kv_cache_config=kvc, speed=0, max_batch_size=1, enable_iter_perf_stats=True,
                kv_event_token_ids=True) as llm:
        assert llm.trusted_records is True
        a, b = prompt(1, 230), prompt(5000, 230)
        for p in (a, b, a, TokenRuns([(5000, 100), (90_000, 40)])):
            llm.generate(p, SamplingParams(max_tokens=16), kv_cache_retention_config=R([TR(0, 32, 80)]))
        events, stats = llm.get_kv_cache_events(timeout=0.5), llm.get_stats(timeout=0.5)
    assert {e["data"]["type"] for e in events} == {"created", "stored", "removed", "updated"} and stats
    for kind, items in (("kv_event", events), ("stats", stats)):
        for item in items:
            assert read_form(item) is item   # nothing for make to change
            made, trusted = make(kind, item, src, 1764430000.5), trusted_record(kind, item, src, 1764430000.5)
            assert trusted == made and repr(trusted) == repr(made)
    with SimLLM(kv_cache_config=kvc, speed=0) as llm:
        assert llm.trusted_records is False   # TensorRT-LLM's token dicts: make puts them in read form
