"""kvtop/engines/trtllm.py: kvtop settings mapped onto TensorRT-LLM 1.2's ``LLM`` and ``KvCacheConfig``, checked
with a recording stand-in for the ``tensorrt_llm`` module (TensorRT-LLM cannot run here), and the engine choice:
``--engine trtllm`` without TensorRT-LLM fails at once, ``--engine auto`` falls back to the simulator with a reason.

The stand-ins accept exactly TensorRT-LLM 1.2's keyword names and reject any other, as its pydantic models do
(``StrictBaseModel``, ``extra="forbid"``). Field lists from ``tensorrt_llm/llmapi/llm_args.py`` in NVIDIA/TensorRT-LLM,
the 1.1/1.2-era file (``class KvCacheConfig(StrictBaseModel, PybindMirror)`` with ``tokens_per_block`` and without
1.3's ``use_kv_cache_manager_v2``/``max_util_for_resume``); ``mamba_ssm_cache_dtype`` is in that file too, so it is
listed although kvtop never sets it. ``enable_iter_perf_stats`` is a ``TorchLlmArgs`` field, ``return_perf_metrics``,
``max_batch_size``, ``max_num_tokens``, ``kv_cache_config`` and ``model`` are ``BaseLlmArgs`` fields.
``SamplingParams`` fields from ``tensorrt_llm/sampling_params.py`` (the ones kvtop could plausibly pass).
"""

from __future__ import annotations

import enum
import os
import subprocess
import sys
import time
import types
from pathlib import Path
from typing import Any

import pytest

from kvtop import runner
from kvtop.commands.run import build_parser, cli_values
from kvtop.engines import trtllm
from kvtop.settings import Settings, load_settings
from kvtop.workload.scenarios import RetentionSpec

KV_CACHE_CONFIG_FIELDS_1_2 = frozenset({
    "enable_block_reuse", "max_tokens", "max_attention_window", "sink_token_length", "free_gpu_memory_fraction",
    "host_cache_size", "onboard_blocks", "cross_kv_cache_fraction", "secondary_offload_min_priority",
    "event_buffer_max_size", "attention_dp_events_gather_period_ms", "enable_partial_reuse", "copy_on_partial_reuse",
    "use_uvm", "max_gpu_total_bytes", "dtype", "mamba_ssm_cache_dtype", "tokens_per_block",
})
# The LLM's own arguments (a subset of TorchLlmArgs/BaseLlmArgs: what kvtop may pass)
LLM_FIELDS_1_2 = frozenset({
    "model", "tokenizer", "kv_cache_config", "max_batch_size", "max_num_tokens", "max_seq_len", "max_input_len",
    "enable_iter_perf_stats", "enable_iter_req_stats", "return_perf_metrics", "tensor_parallel_size", "backend",
    "scheduler_config",
})
# SchedulerConfig (llm_args.py, ``class SchedulerConfig(StrictBaseModel, PybindMirror)``) and the
# CapacitySchedulerPolicy StrEnum's members
SCHEDULER_CONFIG_FIELDS = frozenset({"capacity_scheduler_policy", "context_chunking_policy", "dynamic_batch_config"})
CAPACITY_SCHEDULER_POLICIES = ("MAX_UTILIZATION", "GUARANTEED_NO_EVICT", "STATIC_BATCH")
SAMPLING_FIELDS = frozenset({
    "end_id", "pad_id", "max_tokens", "n", "best_of", "top_k", "top_p", "seed", "temperature", "min_tokens",
    "logprobs", "return_perf_metrics", "ignore_eos", "detokenize", "stop", "stop_token_ids",
})


# KvCacheConfig on TensorRT-LLM's main (llm_args.py at 0004396720054fd8e205cbf616f21f0b57c6b412, the 1.3+ line):
# 1.2's fields less ``onboard_blocks`` (onboarding is always on there), plus the disk tier and the V2 manager's.
KV_CACHE_CONFIG_FIELDS_MAIN = (KV_CACHE_CONFIG_FIELDS_1_2 - {"onboard_blocks"}) | frozenset({
    "disk_cache_size", "disk_cache_path", "kv_events_config", "iteration_stats_interval",
    "mamba_ssm_stochastic_rounding", "mamba_ssm_philox_rounds", "mamba_state_cache_interval", "mamba_state_config",
    "use_kv_cache_manager_v2", "enable_swa_scratch_reuse", "kv_cache_event_hash_algo", "max_util_for_resume",
    "enable_kv_pool_rebalance", "kv_pool_rebalance_min_sampled_kv_caches", "kv_pool_rebalance_cooldown_secs",
    "kv_pool_rebalance_target_ratio_update_interval", "kv_pool_rebalance_ratio_threshold",
    "kv_pool_rebalance_moving_average_decay", "kv_pool_rebalance_check_interval", "disk_prefetch_num_reqs",
    "fp8_context_mla_kv_len_cap", "pool_ratio", "avg_seq_len", "block_reuse_config",
})
# Defaults kvtop may read back (llm_args.py): what an unset field reads as on the pydantic model.
KV_CACHE_CONFIG_DEFAULTS = {"dtype": "auto", "tokens_per_block": 32, "host_cache_size": None,
                            "disk_cache_size": None, "enable_block_reuse": True}
# Attribute names kvtop reads that no TensorRT-LLM has, on purpose: ``describe`` tells the simulator apart, as do
# ``trusted_records`` (the poller: its dicts made into records unchecked), ``takes_token_runs`` (the driver),
# ``notify_drain_wanted`` (the poller: an engine that waits for its drains says so) and ``sim_time_s`` (kvtop.watch: a
# simulator's own clock, which its records are stamped with when it is not paced to the wall clock).
PROBES = frozenset({"describe", "trusted_records", "takes_token_runs", "notify_drain_wanted", "sim_time_s"})
unknown_reads: list[str] = []  # every read of an attribute the stand-in's TensorRT-LLM class does not have


class StrictRecorder:
    """Accepts exactly ``FIELDS`` as keywords (pydantic ``extra="forbid"``) and reads back as attributes; reading any
    other attribute is recorded in ``unknown_reads`` (and raises AttributeError, as on the real object)."""

    FIELDS: frozenset[str] = frozenset()
    DEFAULTS: dict[str, Any] = {}
    ATTRS: frozenset[str] = frozenset()  # attributes the real class has beyond its fields
    instances: list[StrictRecorder]

    def __init__(self, **kwargs: Any):
        unknown = set(kwargs) - self.FIELDS
        if unknown:
            # what pydantic says for extra="forbid" (pydantic.ValidationError is a ValueError)
            raise ValueError(f"{len(unknown)} validation error(s) for {type(self).__name__}: "
                             + "; ".join(f"{k}: Extra inputs are not permitted" for k in sorted(unknown)))
        self.kwargs = kwargs
        type(self).instances.append(self)

    def __getattr__(self, name: str) -> Any:  # only for names not set on the instance or its class
        if name.startswith("__") or name in ("kwargs",):
            raise AttributeError(name)
        if name in self.FIELDS:
            return self.kwargs.get(name, self.DEFAULTS.get(name))
        if name not in self.ATTRS:
            unknown_reads.append(f"{type(self).__name__}.{name}")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")


def stand_in() -> types.ModuleType:
    """A fresh recording ``tensorrt_llm`` module with ``LLM``, ``SamplingParams`` and ``llmapi``."""
    mod = types.ModuleType("tensorrt_llm")
    llmapi = types.ModuleType("tensorrt_llm.llmapi")

    class KvCacheConfig(StrictRecorder):
        FIELDS = KV_CACHE_CONFIG_FIELDS_1_2
        DEFAULTS = KV_CACHE_CONFIG_DEFAULTS
        # A name a newer release has reads as missing here, as on a real 1.2 (kvtop reads those defensively);
        # a name no release has is recorded.
        ATTRS = KV_CACHE_CONFIG_FIELDS_MAIN
        instances: list[StrictRecorder] = []
        # pydantic v2's class attribute listing the fields (build_llm reads it to leave out what a release lacks)
        model_fields = dict.fromkeys(KV_CACHE_CONFIG_FIELDS_1_2)

    class LlmArgs(StrictRecorder):  # TorchLlmArgs: what LLM.args is
        FIELDS = LLM_FIELDS_1_2
        instances: list[StrictRecorder] = []

    class LLM(StrictRecorder):
        FIELDS = LLM_FIELDS_1_2
        instances: list[StrictRecorder] = []
        ATTRS = frozenset({"args", "_hf_model_dir", "shut_down"})  # llm.py: BaseLLM's, and the stand-in's own

        def __init__(self, model: Any = None, **kwargs: Any):
            if model is None:
                raise TypeError("LLM() missing 1 required argument: 'model'")
            super().__init__(model=model, **kwargs)
            self.args = LlmArgs(model=model, **kwargs)
            self._hf_model_dir = None  # the model loader's checkpoint directory; None for a built-in name here
            self.shut_down = False

        def shutdown(self) -> None:
            self.shut_down = True

    class SamplingParams(StrictRecorder):
        FIELDS = SAMPLING_FIELDS
        instances: list[StrictRecorder] = []

    class SchedulerConfig(StrictRecorder):
        FIELDS = SCHEDULER_CONFIG_FIELDS
        instances: list[StrictRecorder] = []

    CapacitySchedulerPolicy = enum.Enum("CapacitySchedulerPolicy",  # type: ignore[misc]
                                        {name: name for name in CAPACITY_SCHEDULER_POLICIES}, type=str)

    class TokenRange:
        def __init__(self, token_start: int, token_end: int | None, priority: int, duration_ms: Any = None):
            self.args = (token_start, token_end, priority, duration_ms)

    class KvCacheRetentionConfig:
        TokenRangeRetentionConfig = TokenRange

        def __init__(self, token_range_retention_configs: list[Any], decode_retention_priority: int = 35,
                     decode_duration_ms: Any = None, transfer_mode: Any = None, directory: Any = None):
            self.ranges = token_range_retention_configs
            self.decode_retention_priority = decode_retention_priority
            self.decode_duration_ms = decode_duration_ms

    llmapi.KvCacheConfig = KvCacheConfig
    llmapi.SchedulerConfig = SchedulerConfig
    llmapi.CapacitySchedulerPolicy = CapacitySchedulerPolicy
    llmapi.KvCacheRetentionConfig = KvCacheRetentionConfig
    llmapi.LLM = LLM
    llmapi.SamplingParams = SamplingParams
    mod.LLM = LLM
    mod.SamplingParams = SamplingParams
    mod.llmapi = llmapi
    mod.__version__ = "1.2.0"
    return mod


def settings_from(argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Settings:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    return load_settings(cli_values(build_parser().parse_args(argv)), environ={})


def build(argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, dict[str, Any]]:
    mod = stand_in()
    llm = trtllm.build_llm(settings_from(argv, tmp_path, monkeypatch), mod)
    assert isinstance(llm, mod.LLM) and len(mod.llmapi.KvCacheConfig.instances) == 1
    kvc = mod.llmapi.KvCacheConfig.instances[0]
    assert llm.kwargs["kv_cache_config"] is kvc
    return llm, kvc.kwargs


# ---------------------------------------------------------------------------------------------- the stand-in

def test_stand_in_rejects_unknown_names_like_pydantic() -> None:
    mod = stand_in()
    with pytest.raises(ValueError, match="host_cache_bytes: Extra inputs are not permitted"):
        mod.llmapi.KvCacheConfig(host_cache_bytes=10)
    with pytest.raises(ValueError, match="enable_iter_stats"):
        mod.LLM(model="m", enable_iter_stats=True)
    mod.llmapi.KvCacheConfig(**{name: None for name in KV_CACHE_CONFIG_FIELDS_1_2})


def test_simulator_kv_cache_config_mirrors_1_2() -> None:
    from dataclasses import fields

    from kvtop.engines.sim import KvCacheConfig

    # the simulator's KvCacheConfig claims 1.2's fields: all of them but the Mamba SSM dtype
    assert {f.name for f in fields(KvCacheConfig)} == KV_CACHE_CONFIG_FIELDS_1_2 - {"mamba_ssm_cache_dtype"}


# ---------------------------------------------------------------------------------------------- build_llm

def test_build_llm_maps_options_onto_kv_cache_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    llm, kv = build(["--host-cache", "10GB", "--gpu-cache", "65536", "--tokens-per-block", "64",
                     "--secondary-offload-min-priority", "50", "--max-batch-size", "96", "--max-num-tokens", "4096",
                     "--model", "meta-llama/Llama-3.1-8B-Instruct"], tmp_path, monkeypatch)
    assert kv["host_cache_size"] == 10_000_000_000 and isinstance(kv["host_cache_size"], int)
    assert kv["max_tokens"] == 65536
    assert "free_gpu_memory_fraction" not in kv  # a token budget was given
    assert kv["tokens_per_block"] == 64
    assert kv["secondary_offload_min_priority"] == 50
    assert kv["event_buffer_max_size"] > 0 and kv["enable_block_reuse"] is True  # KV events need both
    assert kv["onboard_blocks"] is True  # offload to host needs onboarding on (mOnboardBlocks gate)
    a = llm.kwargs
    assert a["model"] == "meta-llama/Llama-3.1-8B-Instruct"
    assert a["max_batch_size"] == 96 and a["max_num_tokens"] == 4096
    assert a["enable_iter_perf_stats"] is True and a["return_perf_metrics"] is True


@pytest.mark.parametrize("policy", ["GUARANTEED_NO_EVICT", "MAX_UTILIZATION"])
def test_build_llm_maps_the_capacity_scheduler_policy(policy: str, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    mod = stand_in()
    llm = trtllm.build_llm(settings_from(["--capacity-scheduler-policy", policy], tmp_path, monkeypatch), mod)
    scheduler_config = llm.kwargs["scheduler_config"]
    assert scheduler_config is mod.llmapi.SchedulerConfig.instances[-1]
    assert scheduler_config.kwargs == {"capacity_scheduler_policy": mod.llmapi.CapacitySchedulerPolicy[policy]}
    assert llm.args.scheduler_config is scheduler_config  # what TensorRT-LLM resolved


def test_simulator_takes_the_same_scheduler_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    engine = runner.build_sim_engine(settings_from(["--capacity-scheduler-policy", "MAX_UTILIZATION", "--speed", "0"],
                                                   tmp_path, monkeypatch))
    try:
        assert engine.describe()["capacity_scheduler_policy"] == "MAX_UTILIZATION"
        assert engine._core.capacity_scheduler_policy == "MAX_UTILIZATION"
    finally:
        engine.shutdown()


def test_build_llm_with_a_fraction(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, kv = build(["--gpu-cache", "0.7", "--host-cache", "512MiB"], tmp_path, monkeypatch)
    assert kv["free_gpu_memory_fraction"] == 0.7
    assert "max_tokens" not in kv  # the demo's default token budget must not cap a fraction
    assert kv["host_cache_size"] == 512 * 2**20


def test_build_llm_defaults_and_no_host_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _, kv = build(["--host-cache", "0"], tmp_path, monkeypatch)
    d = Settings()
    assert kv["host_cache_size"] == 0
    assert kv["max_tokens"] == d.gpu_cache_tokens and kv["tokens_per_block"] == d.tokens_per_block
    assert kv["secondary_offload_min_priority"] == d.secondary_offload_min_priority == 30  # C++ default


def test_build_llm_imports_llmapi_when_not_an_attribute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mod = stand_in()
    llmapi = mod.llmapi
    del mod.llmapi
    monkeypatch.setitem(sys.modules, "tensorrt_llm", mod)
    monkeypatch.setitem(sys.modules, "tensorrt_llm.llmapi", llmapi)
    llm = trtllm.build_llm(settings_from([], tmp_path, monkeypatch), mod)
    assert llm.kwargs["kv_cache_config"] is llmapi.KvCacheConfig.instances[0]


def test_retention_and_sampling_factories() -> None:
    mod = stand_in()
    make = trtllm.retention_factory(mod.llmapi)
    cfg = make(RetentionSpec([(0, 2048, 90, None), (2048, None, 20, 5000)], decode_priority=10,
                             decode_duration_ms=1000))
    assert [r.args for r in cfg.ranges] == [(0, 2048, 90, None), (2048, None, 20, 5000)]
    assert (cfg.decode_retention_priority, cfg.decode_duration_ms) == (10, 1000)
    sp = trtllm.sampling_factory(mod)(64)
    assert sp.kwargs["max_tokens"] == 64 and sp.kwargs["ignore_eos"] is True
    assert sp.kwargs["return_perf_metrics"] is True


def test_build_session_with_a_stand_in_engine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mod = stand_in()
    settings = settings_from(["--host-cache", "10GB", "--tokens-per-block", "32", "--engine", "trtllm"],
                             tmp_path, monkeypatch)
    session = runner.build_session(settings, choice=runner.EngineChoice("trtllm", "test", mod), sample_gpu=False)
    assert session.meta["engine"] == "trtllm" and session.meta["simulated"] is False
    assert session.meta["sim_reason"] is None
    assert session.meta["engine_version"] == "1.2.0"
    # Qwen3-8B: 147,456 bytes per token; TensorRT-LLM's resource_manager.py floors the host pool
    assert session.meta["secondary_blocks"] == int(10**10 / 147456 / 32) == 2119
    assert session.meta["bytes_per_block"] == 147456 * 32
    assert len(mod.LLM.instances) == 1


def test_build_session_reports_a_rejected_keyword_as_run_error(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    mod = stand_in()
    mod.llmapi.KvCacheConfig.FIELDS = KV_CACHE_CONFIG_FIELDS_1_2 - {"tokens_per_block"}  # as in ~1.0
    settings = settings_from(["--engine", "trtllm"], tmp_path, monkeypatch)
    with pytest.raises(runner.RunError, match="tokens_per_block"):
        runner.build_session(settings, choice=runner.EngineChoice("trtllm", "test", mod), sample_gpu=False)


# ---------------------------------------------------------------------------------------------- engine choice

def test_import_trtllm_names_how_to_install() -> None:
    with pytest.raises(trtllm.EngineUnavailable) as info:
        trtllm.import_trtllm("tensorrt_llm_definitely_not_here")
    msg = str(info.value)
    assert "pip install tensorrt_llm" in msg and "pypi.nvidia.com" in msg and "--engine sim" in msg


def test_choose_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    assert runner.choose_engine(Settings(engine="sim")).kind == "sim"
    monkeypatch.setattr(trtllm, "gpu_visible", lambda: (False, "no NVIDIA GPU visible"))
    choice = runner.choose_engine(Settings(engine="auto"))
    assert (choice.kind, choice.reason) == ("sim", "no NVIDIA GPU visible")
    # a GPU but no TensorRT-LLM
    monkeypatch.setattr(trtllm, "gpu_visible", lambda: (True, "NVIDIA device nodes present"))
    monkeypatch.setattr(trtllm.importlib.util, "find_spec", lambda name: None)
    choice = runner.choose_engine(Settings(engine="auto"))
    assert choice.kind == "sim" and "tensorrt_llm" in choice.reason
    # both present: TensorRT-LLM is chosen
    mod = stand_in()
    monkeypatch.setattr(trtllm.importlib.util, "find_spec", lambda name: object())
    monkeypatch.setitem(sys.modules, "tensorrt_llm", mod)
    choice = runner.choose_engine(Settings(engine="auto"))
    assert choice.kind == "trtllm" and choice.module is mod


def test_gpu_visible_honours_cuda_visible_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert trtllm.gpu_visible()[0] is False
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    assert trtllm.gpu_visible() == (False, "CUDA_VISIBLE_DEVICES hides every GPU")


def _env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVTOP_")}
    env["XDG_CONFIG_HOME"] = str(tmp_path / "xdg")
    return env


def test_engine_trtllm_without_tensorrt_llm_fails_at_once(tmp_path: Path) -> None:
    assert trtllm.importlib.util.find_spec("tensorrt_llm") is None, "this test needs a machine without TensorRT-LLM"
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "kvtop", "--engine", "trtllm", "--headless", "--duration", "30"],
                          cwd=tmp_path, env=_env(tmp_path), capture_output=True, text=True, timeout=60)
    assert time.monotonic() - t0 < 10  # not after the 30 s run
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "pip install tensorrt_llm" in lines[0] and "pypi.nvidia.com" in lines[0]
    assert proc.stdout == ""


def test_kv_cache_dtype_and_tensor_parallel_size_reach_both_engines(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    # TensorRT-LLM: KvCacheConfig(dtype="fp8") and LLM(tensor_parallel_size=2), names from llm_args.py (1.2)
    llm, kv = build(["--kv-cache-dtype", "fp8", "--tensor-parallel-size", "2"], tmp_path, monkeypatch)
    assert kv["dtype"] == "fp8" and llm.kwargs["tensor_parallel_size"] == 2
    llm, kv = build([], tmp_path, monkeypatch)
    assert "dtype" not in kv and "tensor_parallel_size" not in llm.kwargs  # "auto" and 1: the engine's defaults
    # the simulator: an FP8 KV cache holds half the bytes a block, so about twice the blocks in the same memory
    argv = ["--model", "meta-llama/Llama-3.1-8B-Instruct", "--gpu-cache", "0.9", "--speed", "0"]
    base = runner.build_sim_engine(settings_from(argv, tmp_path, monkeypatch))
    fp8 = runner.build_sim_engine(settings_from(argv + ["--kv-cache-dtype", "fp8"], tmp_path, monkeypatch))
    try:
        assert fp8.bytes_per_block * 2 == base.bytes_per_block
        assert fp8.primary_blocks == pytest.approx(2 * base.primary_blocks, rel=0.001)
    finally:
        base.shutdown()
        fp8.shutdown()
    from kvtop.settings import SettingsError

    with pytest.raises(SettingsError, match="--kv-cache-dtype: must be one of auto, fp8, bfloat16, float16"):
        settings_from(["--kv-cache-dtype", "int4"], tmp_path, monkeypatch)
