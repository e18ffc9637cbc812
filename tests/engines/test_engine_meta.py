"""One meta builder for a real engine (kvtop/engines/meta.py): a driven run, ``kvtop.watch(llm)`` and ``kvtop attach
http://`` all learn the KV block's size, so GiB figures are known on real-engine-shaped data.

The engine is the recording stand-in for ``tensorrt_llm`` of tests/engines/test_trtllm_builder.py: its classes accept
only the keyword names TensorRT-LLM's pydantic models have (llm_args.py, cited there) and record every read of an
attribute the real class lacks (``unknown_reads``), so a misspelt or invented name fails these tests instead of
silently reading None. The served payloads are TensorRT-LLM's documented /metrics example (trtllm-kv.md 1.5).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

import pytest
import test_trtllm_builder as tb

import kvtop
from kvtop import runner
from kvtop.engines import trtllm
from kvtop.engines.meta import kv_dtype_bytes, meta_from_llm, real_engine_meta, shape_for
from kvtop.engines.models import resolve_model
from kvtop.records import make
from kvtop.tiers import TierModel

QWEN3_8B_PER_TOKEN = 2 * 36 * 8 * 128 * 2  # 147,456 bytes (anchors/h200-2026-11-29.json)


@pytest.fixture(autouse=True)
def _no_unknown_reads() -> Any:
    tb.unknown_reads.clear()
    yield
    assert {r for r in tb.unknown_reads if r.split(".")[-1] not in tb.PROBES} == set(), tb.unknown_reads


# ---------------------------------------------------------------------------------------------- the builder

def test_builder_gives_bytes_per_block_and_pools_in_blocks() -> None:
    meta = real_engine_meta(model="Qwen/Qwen3-8B", tokens_per_block=32, host_cache_bytes=10**10,
                            disk_cache_bytes=10**11, engine_version="1.3.0rc5")
    assert meta["bytes_per_block"] == QWEN3_8B_PER_TOKEN * 32 == 4_718_592
    assert meta["secondary_blocks"] == 10**10 // 4_718_592 == 2119
    assert meta["disk_blocks"] == 10**11 // 4_718_592 == 21192
    assert "meta_unknown" not in meta


def test_builder_without_tokens_per_block_leaves_bytes_per_token_for_the_stats() -> None:
    meta = real_engine_meta(model="/models/Qwen3-8B")  # a path on the server: its last part is a known name
    assert "bytes_per_block" not in meta and meta["kv_bytes_per_token"] == QWEN3_8B_PER_TOKEN
    m = TierModel()
    m.apply(make("meta", meta, time=1.0))
    assert m.bytes_per_block is None
    m.apply(make("stats", {"iter": 1, "kvCacheStats": {"maxNumBlocks": 100, "freeNumBlocks": 90,
                                                       "tokensPerBlock": 64}}, time=2.0))
    assert m.bytes_per_block == QWEN3_8B_PER_TOKEN * 64
    assert m.gpu.free_bytes == 90 * QWEN3_8B_PER_TOKEN * 64
    # 1.2's maxNumBlocks counts the host pool too: with no pool size known, the GPU's capacity stays unknown
    assert m.gpu.capacity_bytes is None


def test_kv_dtype_follows_kv_cache_config_dtype() -> None:
    shape = resolve_model("Qwen/Qwen3-8B")
    assert kv_dtype_bytes("auto", shape) == 2 and kv_dtype_bytes(None, shape) == 2
    assert kv_dtype_bytes("fp8", shape) == 1 and kv_dtype_bytes("float32", shape) == 4
    assert kv_dtype_bytes("nvfp4", shape) is None  # 4.5 bits: no whole bytes per element, so unknown
    meta = real_engine_meta(model="Qwen/Qwen3-8B", kv_dtype="fp8", tokens_per_block=32)
    assert meta["bytes_per_block"] == QWEN3_8B_PER_TOKEN // 2 * 32
    odd = real_engine_meta(model="Qwen/Qwen3-8B", kv_dtype="nvfp4", tokens_per_block=32)
    assert "bytes_per_block" not in odd and "nvfp4" in odd["meta_unknown"][0]


def test_unknown_model_is_named_not_guessed() -> None:
    meta = real_engine_meta(model="my-org/private-model", tokens_per_block=32)
    assert "bytes_per_block" not in meta
    assert "private-model" in meta["meta_unknown"][0]
    assert shape_for(None, "")[0] is None


# ---------------------------------------------------------------------------------------------- driven run

def test_driven_run_meta_from_the_llm_args(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mod = tb.stand_in()
    settings = tb.settings_from(["--host-cache", "10GB", "--tokens-per-block", "64", "--engine", "trtllm"],
                                tmp_path, monkeypatch)
    session = runner.build_session(settings, choice=runner.EngineChoice("trtllm", "test", mod), sample_gpu=False)
    assert session.meta["bytes_per_block"] == QWEN3_8B_PER_TOKEN * 64
    assert session.meta["secondary_blocks"] == 10**10 // (QWEN3_8B_PER_TOKEN * 64)
    m = TierModel()
    m.apply(make("meta", session.meta, time=1.0))
    assert m.host.capacity_bytes == session.meta["secondary_blocks"] * QWEN3_8B_PER_TOKEN * 64


def test_build_llm_on_main_leaves_out_onboard_blocks(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # KvCacheConfig on TensorRT-LLM's main has no onboard_blocks: passing it would be a pydantic error at startup.
    mod = tb.stand_in()
    mod.llmapi.KvCacheConfig.FIELDS = tb.KV_CACHE_CONFIG_FIELDS_MAIN
    mod.llmapi.KvCacheConfig.model_fields = dict.fromkeys(tb.KV_CACHE_CONFIG_FIELDS_MAIN)
    llm = trtllm.build_llm(tb.settings_from(["--host-cache", "1GB"], tmp_path, monkeypatch), mod)
    kv = llm.kwargs["kv_cache_config"].kwargs
    assert "onboard_blocks" not in kv and kv["host_cache_size"] == 10**9
    # ...and 1.2's keeps it
    mod12 = tb.stand_in()
    llm12 = trtllm.build_llm(tb.settings_from(["--host-cache", "1GB"], tmp_path, monkeypatch), mod12)
    assert llm12.kwargs["kv_cache_config"].kwargs["onboard_blocks"] is True


def test_meta_from_a_13_llm_with_a_disk_cache() -> None:
    mod = tb.stand_in()
    mod.llmapi.KvCacheConfig.FIELDS = tb.KV_CACHE_CONFIG_FIELDS_MAIN
    kvc = mod.llmapi.KvCacheConfig(dtype="fp8", tokens_per_block=32, host_cache_size=2**30,
                                   disk_cache_size=2**34, disk_cache_path="/nvme/kv",
                                   kv_cache_event_hash_algo="v2_sha256")
    llm = mod.LLM(model="Qwen/Qwen3-8B", kv_cache_config=kvc)
    meta = meta_from_llm(llm, engine_version="1.3.0rc5")
    bpb = QWEN3_8B_PER_TOKEN // 2 * 32
    assert (meta["bytes_per_block"], meta["kv_dtype"]) == (bpb, "fp8")
    assert meta["disk_blocks"] == 2**34 // bpb and meta["secondary_blocks"] == 2**30 // bpb
    assert meta["kv_cache_event_hash_algo"] == "v2_sha256"
    m = TierModel()
    m.apply(make("meta", meta, time=1.0))
    assert [t.name for t in m.tiers] == ["gpu", "host", "disk"]
    assert m.tiers[2].capacity_bytes == (2**34 // bpb) * bpb


# ---------------------------------------------------------------------------------------------- kvtop.watch

def test_watch_on_a_stand_in_llm_knows_gib() -> None:
    mod = tb.stand_in()
    stats = [{"iter": i, "numCompletedRequests": 0,
              "kvCacheStats": {"maxNumBlocks": 1000 + 200, "freeNumBlocks": 900, "usedNumBlocks": 300,
                               "tokensPerBlock": 64, "reusedBlocks": 0, "missedBlocks": 0}} for i in range(3)]

    class Llm(mod.LLM):  # type: ignore[misc,name-defined]
        ATTRS = mod.LLM.ATTRS | {"get_stats_async", "get_kv_cache_events_async"}

        async def get_stats_async(self, timeout: float = 2) -> Any:
            while stats:
                yield stats.pop(0)

        async def get_kv_cache_events_async(self, timeout: float = 2) -> Any:
            for e in ():
                yield e

    kvc = mod.llmapi.KvCacheConfig(tokens_per_block=64, host_cache_size=200 * QWEN3_8B_PER_TOKEN * 64)
    llm = Llm(model="Qwen/Qwen3-8B", kv_cache_config=kvc)
    handle = kvtop.watch(llm, interval_s=0.05, sample_memory=False)
    try:
        deadline = time.monotonic() + 10
        while handle.summary()["time"] is None or stats:
            assert time.monotonic() < deadline, handle.log
            time.sleep(0.05)
        time.sleep(0.1)
    finally:
        handle.stop()
    s = handle.summary()
    bpb = QWEN3_8B_PER_TOKEN * 64
    assert s["bytes_per_block"] == bpb
    assert s["tiers"]["host"]["capacity_bytes"] == 200 * bpb
    # 1.2's maxNumBlocks counts both pools: the GPU's 1000 follow from the host pool's 200
    assert s["tiers"]["gpu"]["capacity_bytes"] == 1000 * bpb
    assert s["tiers"]["gpu"]["free_bytes"] == 900 * bpb


def test_watch_meta_of_a_llm_whose_model_is_a_local_dir(tmp_path: Path) -> None:
    # A hub id the table does not know: TensorRT-LLM's loader resolved it into a local directory (_hf_model_dir).
    cfg = tmp_path / "config.json"
    cfg.write_text('{"num_hidden_layers": 4, "hidden_size": 256, "num_attention_heads": 4, "num_key_value_heads": 2,'
                   ' "intermediate_size": 512, "vocab_size": 1000, "torch_dtype": "bfloat16"}')
    mod = tb.stand_in()
    llm = mod.LLM(model="someone/tiny-private", kv_cache_config=mod.llmapi.KvCacheConfig(tokens_per_block=16))
    llm._hf_model_dir = str(tmp_path)
    from kvtop.compose import engine_meta

    meta = engine_meta(llm)
    assert meta["model"] == "someone/tiny-private"
    assert meta["bytes_per_block"] == 2 * 4 * 2 * 64 * 2 * 16


# ---------------------------------------------------------------------------------------------- attach http

def test_attach_http_knows_gib_from_the_model_id_and_the_stats() -> None:
    from trtllm_serve_fake import METRICS_EXAMPLE, FakeServe

    from kvtop.sources.trtllm_serve import TrtllmServeSource

    serve = FakeServe()
    try:
        serve.queues["/metrics"].append(METRICS_EXAMPLE)
        m = TierModel()
        src = TrtllmServeSource(serve.url, sink=m.apply, interval_s=0.05, perf_metrics=False)
        asyncio.run(src.poll_once())
    finally:
        serve.close()
    # /v1/models says Qwen/Qwen3-8B; the documented /metrics example says tokensPerBlock 32, 101256 blocks.
    assert m.meta["kv_bytes_per_token"] == QWEN3_8B_PER_TOKEN
    assert m.bytes_per_block == QWEN3_8B_PER_TOKEN * 32
    assert m.summary()["tiers"]["gpu"]["free_bytes"] == 101253 * QWEN3_8B_PER_TOKEN * 32


def test_attach_http_says_why_gib_stay_unknown() -> None:
    import json

    from trtllm_serve_fake import FakeServe

    from kvtop.sources.trtllm_serve import TrtllmServeSource

    serve = FakeServe()
    statuses: list[tuple[str, str]] = []
    try:
        serve.raw["/v1/models"] = json.dumps({"object": "list", "data": [{"id": "/srv/models/private-7b"}]}).encode()
        m = TierModel()
        src = TrtllmServeSource(serve.url, sink=m.apply, perf_metrics=False,
                                on_status=lambda n, msg: statuses.append((n, msg)))
        asyncio.run(src.poll_once())
    finally:
        serve.close()
    assert m.bytes_per_block is None
    assert any("private-7b" in msg and "GiB figures stay unknown" in msg for _, msg in statuses), statuses


# ---------------------------------------------------------------------------------------------- offloads to files

def _with_transfer_modes(mod: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """The stand-in's ``tensorrt_llm.bindings.executor.KvCacheTransferMode`` (DRAM, GDS, POSIX_DEBUG_FALLBACK, as in
    TensorRT-LLM's bindings test ``test_kv_cache_retention_config``), importable like the real package."""
    import enum
    import sys
    import types

    class KvCacheTransferMode(enum.Enum):
        DRAM = 0
        GDS = 1
        POSIX_DEBUG_FALLBACK = 2

    bindings = types.ModuleType("tensorrt_llm.bindings")
    executor = types.ModuleType("tensorrt_llm.bindings.executor")
    executor.KvCacheTransferMode = KvCacheTransferMode  # type: ignore[attr-defined]
    for name, m in (("tensorrt_llm", mod), ("tensorrt_llm.bindings", bindings),
                    ("tensorrt_llm.bindings.executor", executor), ("tensorrt_llm.llmapi", mod.llmapi)):
        monkeypatch.setitem(sys.modules, name, m)
    return KvCacheTransferMode


def test_gds_offloads_go_to_files_and_the_host_tier_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvtop.workload.scenarios import RetentionSpec

    mod = tb.stand_in()
    mode = _with_transfer_modes(mod, monkeypatch)
    seen: list[tuple[Any, Any]] = []

    class Retention(mod.llmapi.KvCacheRetentionConfig):  # type: ignore[misc,name-defined]
        def __init__(self, ranges: Any, prio: int = 35, dur: Any = None, transfer_mode: Any = None,
                     directory: Any = None):
            super().__init__(ranges, prio, dur, transfer_mode, directory)
            seen.append((transfer_mode, directory))

    mod.llmapi.KvCacheRetentionConfig = Retention
    make_cfg = trtllm.retention_factory(mod.llmapi, "GDS", str(tmp_path))
    make_cfg(RetentionSpec([(0, None, 80, None)], 35, None))
    assert seen == [(mode.GDS, str(tmp_path))]
    trtllm.retention_factory(mod.llmapi)(RetentionSpec([], 35, None))
    assert seen[-1] == (None, None)  # DRAM: TensorRT-LLM's own default, nothing passed

    settings = tb.settings_from(["--engine", "trtllm", "--offload-transfer-mode", "POSIX_DEBUG_FALLBACK",
                                 "--offload-directory", str(tmp_path)], tmp_path, monkeypatch)
    session = runner.build_session(settings, choice=runner.EngineChoice("trtllm", "test", mod), sample_gpu=False)
    assert session.meta["secondary_medium"] == "files via POSIX"
    m = TierModel()
    m.apply(make("meta", session.meta, time=1.0))
    assert m.host.medium == "files via POSIX" and m.summary()["tiers"]["host"]["medium"] == "files via POSIX"


def test_file_offloads_need_a_directory_and_a_real_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mod = tb.stand_in()
    settings = tb.settings_from(["--engine", "trtllm", "--offload-transfer-mode", "GDS"], tmp_path, monkeypatch)
    with pytest.raises(runner.RunError, match="needs --offload-directory"):
        runner.build_session(settings, choice=runner.EngineChoice("trtllm", "test", mod), sample_gpu=False)
    settings = tb.settings_from(["--engine", "sim", "--offload-transfer-mode", "GDS", "--offload-directory",
                                 str(tmp_path)], tmp_path, monkeypatch)
    with pytest.raises(runner.RunError, match="simulator models DRAM"):
        runner.build_session(settings, choice=runner.EngineChoice("sim", "test"), sample_gpu=False)


def test_a_disk_cache_on_13_builds_the_v2_manager_and_a_disk_tier(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    mod = tb.stand_in()
    mod.llmapi.KvCacheConfig.FIELDS = tb.KV_CACHE_CONFIG_FIELDS_MAIN
    mod.llmapi.KvCacheConfig.model_fields = dict.fromkeys(tb.KV_CACHE_CONFIG_FIELDS_MAIN)
    settings = tb.settings_from(["--engine", "trtllm", "--host-cache", "10GB", "--disk-cache", "200GB",
                                 "--disk-cache-path", str(tmp_path)], tmp_path, monkeypatch)
    session = runner.build_session(settings, choice=runner.EngineChoice("trtllm", "test", mod), sample_gpu=False)
    kv = mod.llmapi.KvCacheConfig.instances[-1].kwargs
    assert (kv["disk_cache_size"], kv["disk_cache_path"], kv["use_kv_cache_manager_v2"]) == (
        200 * 10**9, str(tmp_path), True)
    bpb = QWEN3_8B_PER_TOKEN * 32
    assert session.meta["disk_blocks"] == 200 * 10**9 // bpb
    m = TierModel()
    m.apply(make("meta", session.meta, time=1.0))
    assert [t.name for t in m.tiers] == ["gpu", "host", "disk"]


def test_a_disk_cache_is_refused_where_it_cannot_be(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mod = tb.stand_in()  # 1.2: no disk_cache_size
    settings = tb.settings_from(["--engine", "trtllm", "--disk-cache", "1GB", "--disk-cache-path", str(tmp_path)],
                                tmp_path, monkeypatch)
    with pytest.raises(runner.RunError, match="TensorRT-LLM 1.3 or later"):
        runner.build_session(settings, choice=runner.EngineChoice("trtllm", "test", mod), sample_gpu=False)
    settings = tb.settings_from(["--engine", "trtllm", "--disk-cache", "1GB", "--disk-cache-path",
                                 str(tmp_path / "nope")], tmp_path, monkeypatch)
    with pytest.raises(runner.RunError, match="is not a directory"):
        runner.build_session(settings, choice=runner.EngineChoice("trtllm", "test", mod), sample_gpu=False)
    settings = tb.settings_from(["--engine", "sim", "--disk-cache", "1GB"], tmp_path, monkeypatch)
    with pytest.raises(runner.RunError, match="simulator has no disk tier"):
        runner.build_session(settings, choice=runner.EngineChoice("sim", "test"), sample_gpu=False)


def test_auto_kv_dtype_keeps_an_fp8_checkpoints_kv_quantization() -> None:
    # nvidia/Llama-3.1-8B-Instruct-FP8: a ModelOpt FP8 checkpoint, FP8 KV cache under KvCacheConfig(dtype="auto")
    meta = real_engine_meta(model="nvidia/Llama-3.1-8B-Instruct-FP8", kv_dtype="auto", tokens_per_block=32)
    assert meta["bytes_per_block"] == 2 * 32 * 8 * 128 * 1 * 32  # 32 layers, 8 KV heads, head_dim 128, 1 byte
    bf16 = real_engine_meta(model="nvidia/Llama-3.1-8B-Instruct-FP8", kv_dtype="bfloat16", tokens_per_block=32)
    assert bf16["bytes_per_block"] == 2 * meta["bytes_per_block"]
