"""The real engine: TensorRT-LLM's ``LLM``, imported lazily and only here.

``tensorrt-llm`` is never a declared dependency: its PyPI package is a stub that fetches the real wheel from
NVIDIA's index, which breaks ordinary installs. Where the user has it, kvtop builds the LLM with what its
monitoring needs turned on: iteration stats (``enable_iter_perf_stats``, off by default on the PyTorch
backend), KV cache events (``event_buffer_max_size`` > 0 with ``enable_block_reuse``), and per-request perf
metrics (``return_perf_metrics``). Keyword names checked against TensorRT-LLM 1.2's
``tensorrt_llm/llmapi/llm_args.py`` (``KvCacheConfig``: enable_block_reuse, max_tokens, free_gpu_memory_fraction,
host_cache_size, onboard_blocks, secondary_offload_min_priority, event_buffer_max_size, tokens_per_block;
``TorchLlmArgs``: enable_iter_perf_stats; ``BaseLlmArgs``: return_perf_metrics, max_batch_size, max_num_tokens,
scheduler_config; ``SchedulerConfig``: capacity_scheduler_policy, a ``CapacitySchedulerPolicy``).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import shutil
from collections.abc import Mapping
from types import ModuleType
from typing import Any

from kvtop.engines.inputs import RetentionSpec

INSTALL_HINT = ("TensorRT-LLM is not importable here. Install it on a machine with an NVIDIA GPU, from NVIDIA's "
                "index: pip install tensorrt_llm --extra-index-url https://pypi.nvidia.com (or use NVIDIA's "
                "TensorRT-LLM container, nvcr.io/nvidia/tensorrt-llm/release). Without it, use --engine sim.")

# kvtop's own event buffer: one busy H200 emits a few thousand events/s and kvtop drains 4 times a second, so
# 16,384 holds about 4 s of events before TensorRT-LLM starts dropping the oldest.
EVENT_BUFFER_SIZE = 16384


class EngineUnavailable(RuntimeError):
    pass


def import_trtllm(module_name: str = "tensorrt_llm") -> ModuleType:
    try:
        return importlib.import_module(module_name)
    except Exception as exc:  # ImportError, or a broken install raising anything at import
        raise EngineUnavailable(f"{INSTALL_HINT} ({type(exc).__name__}: {exc})") from None


def gpu_visible() -> tuple[bool, str]:
    """Is an NVIDIA GPU visible to this process? Cheap checks only (no CUDA context)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES", None) in ("", "-1"):
        return False, "CUDA_VISIBLE_DEVICES hides every GPU"
    if os.path.exists("/dev/nvidia0") or os.path.exists("/dev/nvidiactl"):
        return True, "NVIDIA device nodes present"
    if shutil.which("nvidia-smi"):
        return True, "nvidia-smi present"
    return False, "no NVIDIA GPU visible"


def trtllm_available() -> tuple[bool, str]:
    """(usable, reason) for ``--engine auto``; the reason goes on the SIM badge."""
    ok_gpu, why = gpu_visible()
    if not ok_gpu:
        return False, why
    if importlib.util.find_spec("tensorrt_llm") is None:
        return False, "tensorrt_llm is not installed"
    return True, "TensorRT-LLM and a GPU are present"


def build_llm(settings: Any, trtllm: ModuleType | None = None) -> Any:
    """Build ``tensorrt_llm.LLM`` from kvtop settings (``trtllm`` may be a stand-in module for tests)."""
    mod = trtllm or import_trtllm()
    llmapi = getattr(mod, "llmapi", None) or import_trtllm(mod.__name__ + ".llmapi")
    kv_kwargs: dict[str, Any] = {
        "enable_block_reuse": True,
        "host_cache_size": int(settings.host_cache),
        "onboard_blocks": True,
        "secondary_offload_min_priority": int(settings.secondary_offload_min_priority),
        "event_buffer_max_size": EVENT_BUFFER_SIZE,
        "tokens_per_block": int(settings.tokens_per_block),
    }
    kv_dtype = str(getattr(settings, "kv_cache_dtype", "auto") or "auto")
    if kv_dtype != "auto":
        kv_kwargs["dtype"] = kv_dtype  # KvCacheConfig.dtype (llm_args.py): "auto" keeps the checkpoint's
    if settings.gpu_cache_tokens:
        kv_kwargs["max_tokens"] = int(settings.gpu_cache_tokens)
    else:
        kv_kwargs["free_gpu_memory_fraction"] = float(settings.gpu_cache_fraction)
    # ``onboard_blocks`` is gone from KvCacheConfig on TensorRT-LLM's main (1.3+: llm_args.py at 0004396, onboarding
    # is always on there) and its pydantic model forbids unknown names, so it is passed only where the class has it
    # (``model_fields``, pydantic v2's field table). Every other name stays: a release without it should say so.
    fields = getattr(llmapi.KvCacheConfig, "model_fields", None)
    if isinstance(fields, Mapping) and "onboard_blocks" not in fields:
        del kv_kwargs["onboard_blocks"]
    disk = int(getattr(settings, "disk_cache", 0) or 0)
    if disk > 0:
        # The disk tier is the V2 manager's (llm_args.py: "Only used by KV cache manager v2 in the PyTorch
        # backend"), so asking for one asks for that manager too.
        if isinstance(fields, Mapping) and "disk_cache_size" not in fields:
            raise ValueError("--disk-cache needs TensorRT-LLM 1.3 or later: this KvCacheConfig has no disk_cache_size")
        if not settings.disk_cache_path:
            raise ValueError("--disk-cache needs --disk-cache-path DIR (an existing directory)")
        kv_kwargs.update(disk_cache_size=disk, disk_cache_path=str(settings.disk_cache_path),
                         use_kv_cache_manager_v2=True)
    kv_cache_config = llmapi.KvCacheConfig(**kv_kwargs)
    # SchedulerConfig(capacity_scheduler_policy=CapacitySchedulerPolicy.X): llm_args.py's StrEnum, by name
    scheduler_config = llmapi.SchedulerConfig(capacity_scheduler_policy=getattr(
        llmapi.CapacitySchedulerPolicy, str(settings.capacity_scheduler_policy)))
    extra: dict[str, Any] = {}
    tp = int(getattr(settings, "tensor_parallel_size", 1) or 1)
    if tp > 1:
        extra["tensor_parallel_size"] = tp  # LLM's own argument (llm_args.py BaseLlmArgs)
    return mod.LLM(model=settings.model, kv_cache_config=kv_cache_config, scheduler_config=scheduler_config,
                   max_batch_size=int(settings.max_batch_size), max_num_tokens=int(settings.max_num_tokens),
                   enable_iter_perf_stats=True, return_perf_metrics=True, **extra)


def transfer_mode(module: ModuleType, name: str) -> Any:
    """TensorRT-LLM's ``KvCacheTransferMode.<name>`` (DRAM, GDS, POSIX_DEBUG_FALLBACK): the binding lives in
    ``tensorrt_llm.bindings.executor`` (tests/unittest/bindings test it as ``trtllm.KvCacheTransferMode.GDS``);
    ``module`` is ``tensorrt_llm.llmapi``, whose package holds the bindings."""
    enum = getattr(module, "KvCacheTransferMode", None)
    if enum is None:
        root = module.__name__.rsplit(".", 1)[0]
        enum = import_trtllm(root + ".bindings.executor").KvCacheTransferMode
    return getattr(enum, name)


def retention_factory(module: ModuleType, mode: str = "DRAM", directory: str | None = None) -> Any:
    """Turn kvtop's engine-neutral RetentionSpec into the engine's own ``KvCacheRetentionConfig``.

    ``mode`` other than DRAM (GDS, POSIX_DEBUG_FALLBACK) sends this run's offloads to files in ``directory``
    (``kvCacheTransferManager.cpp`` ``copyBlock``: ``{directory}/block_{id}_pool_{n}.bin``) instead of the pinned
    host pool: the secondary tier's blocks then live on disk.
    """
    cls = module.KvCacheRetentionConfig
    extra: tuple[Any, ...] = () if mode == "DRAM" else (transfer_mode(module, mode), directory)

    def make(spec: RetentionSpec) -> Any:
        ranges = [cls.TokenRangeRetentionConfig(start, end, prio, dur) for start, end, prio, dur in spec.ranges]
        return cls(ranges, spec.decode_priority, spec.decode_duration_ms, *extra)

    return make


def sampling_factory(module: ModuleType) -> Any:
    def make(max_tokens: int) -> Any:
        # ignore_eos keeps output lengths what the scenario asked for, so runs compare like with like
        return module.SamplingParams(max_tokens=max_tokens, ignore_eos=True, return_perf_metrics=True)

    return make
