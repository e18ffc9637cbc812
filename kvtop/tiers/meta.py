"""The meta fold: what the engine and the machine are, from ``meta`` (engine, model, block size, pool sizes, kept
as sent plus the checked numbers), ``gpu`` (one NVML sample per device) and ``host`` (the engine process's and
the system's memory) records.

Knows no other fold; the model reads the block size and the pool sizes from ``meta`` (kvtop/tiers/model.py).
"""

from __future__ import annotations

from typing import Any

from kvtop.tiers.common import Bad, describe, nonneg_count
from kvtop.tiers.state import GpuDevice, HostMemory

_MAX_GPUS = 64  # gpu records keep one entry per device index; more than this is a malformed stream


class MetaFold:
    """``meta``, ``gpu`` and ``host`` records -> the engine's description and memory samples."""

    def __init__(self) -> None:
        self.meta: dict[str, Any] = {}
        self.gpus: dict[int, GpuDevice] = {}
        self.gpu_error: str | None = None
        self.host_memory: HostMemory | None = None

    def apply_meta(self, data: dict[str, Any]) -> None:
        checked: dict[str, Any] = {}
        for key in ("bytes_per_block", "tokens_per_block", "primary_blocks", "secondary_blocks", "disk_blocks",
                    "kv_bytes_per_token", "host_cache_bytes", "disk_cache_bytes"):
            if key in data:
                checked[key] = nonneg_count(data[key], key)
        for key in ("engine", "engine_version", "model", "gpu"):
            v = data.get(key)
            if v is not None and not isinstance(v, str):
                raise Bad(key, f"must be a string, got {describe(v)}")
        self.meta.update(data)
        self.meta.update(checked)

    def apply_gpu(self, data: dict[str, Any], t: float) -> None:
        idx = data.get("index")
        if idx.__class__ is not int:
            raise Bad("index", f"must be an integer, got {describe(idx)}")
        err = data.get("error")
        if err is not None:
            self.gpu_error = str(err)
            if idx < 0:
                return  # a source-level "no NVIDIA driver" record, not a device
        if not 0 <= idx < _MAX_GPUS:
            raise Bad("index", f"must be in [0, {_MAX_GPUS}), got {idx}")
        name = data.get("name")
        if name is not None and not isinstance(name, str):
            raise Bad("name", f"must be a string, got {describe(name)}")
        used = nonneg_count(data.get("memory_used_bytes"), "memory_used_bytes")
        total = nonneg_count(data.get("memory_total_bytes"), "memory_total_bytes")
        self.gpus[idx] = GpuDevice(idx, name, used, total, t, dict(data))

    def apply_host(self, data: dict[str, Any], t: float) -> None:
        # kvtop's host source writes process_rss_bytes / system_available_bytes / system_total_bytes; the short
        # names are accepted too.
        values: dict[str, int | None] = {}
        for short, long in (("rss_bytes", "process_rss_bytes"), ("available_bytes", "system_available_bytes"),
                            ("total_bytes", "system_total_bytes"), ("pinned_pool_bytes", "pinned_pool_bytes")):
            v = nonneg_count(data.get(short), short)
            values[short] = v if v is not None else nonneg_count(data.get(long), long)
        self.host_memory = HostMemory(values["rss_bytes"], values["available_bytes"], values["pinned_pool_bytes"], t,
                                    dict(data), values["total_bytes"])
