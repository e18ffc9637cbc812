"""NVML source: one ``gpu`` record per GPU per sample, through nvidia-ml-py (``import pynvml``).

Habits taken from nvitop: every field is read on its own and a field that fails is ``None`` (never an
exception into the caller); memory is read with the newer ``nvmlDeviceGetMemoryInfo_v2`` (which splits out the
driver-reserved memory that v1 counts as "used") and falls back to v1 on drivers or bindings without it.

No NVIDIA driver is the normal case on laptops and CI, and the tested default path here: the first
:meth:`NvmlSource.sample` returns one record ``{"index": -1, "error": "no NVIDIA driver: ..."}``, later calls
return ``[]``, and init is retried at most every 60 s (a failed ``nvmlInit`` is a ``dlopen`` search of the
library path, 25 ms on the dev box; once a minute is enough to notice a driver loaded later).

:meth:`NvmlSource.sample` blocks (NVML is a C library; the PCIe counters alone take ~20 ms each, see below): run
it in a thread worker, one sample at a time. Measured on the H200 box (driver 580.159.04, bench/nvml_probe.py):
a whole one-GPU sample costs 43 us without the PCIe counters and 42 ms with them; nvmlInit takes 186 ms.

``gpu`` record data (``None`` where NVML could not say):
    index, name, uuid, memory_total_bytes, memory_used_bytes, memory_free_bytes, memory_reserved_bytes,
    memory_info_version ("v2" | "v1"), utilization_gpu_pct, utilization_memory_pct, pcie_tx_bytes_per_s,
    pcie_rx_bytes_per_s, process_used_bytes, compute_processes, temperature_c, power_w
and on failure: index (-1 for the whole library, else the GPU), error.
"""

from __future__ import annotations

import importlib
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kvtop.records import Record, SourceId, make

RETRY_INIT_S = 60.0
# Every key of a GPU's record besides index, name and uuid (an "error" key is added only on failure).
GPU_FIELDS = (
    "memory_total_bytes", "memory_used_bytes", "memory_free_bytes", "memory_reserved_bytes", "memory_info_version",
    "utilization_gpu_pct", "utilization_memory_pct", "pcie_tx_bytes_per_s", "pcie_rx_bytes_per_s",
    "process_used_bytes", "compute_processes", "temperature_c", "power_w",
)
# Descendant pids are re-listed at most this often: psutil walks /proc for it, 2.3 ms with 69 processes on the
# dev box, so tens of ms on a busy node; an engine's worker processes start once and live for the whole run.
PID_REFRESH_S = 10.0


@dataclass
class _Device:
    index: int
    handle: Any
    name: str | None
    uuid: str | None
    mem_v2: bool | None = None  # None: untried; False: v2 failed on first try, use v1 only


def _text(value: Any) -> str | None:
    # nvidia-ml-py returns str in recent versions and bytes in old ones.
    if value is None:
        return None
    if isinstance(value, bytes):
        return value.decode("utf-8", "replace")
    return str(value)


def _int(value: Any) -> int | None:
    try:
        return None if value is None else int(value)
    except (TypeError, ValueError):
        return None


class NvmlSource:
    """Samples every GPU NVML can see.

    ``pid``: the engine's process; its GPU memory (plus that of its descendants: TensorRT-LLM's ``LLM`` runs
    its executor in MPI worker processes, which hold the GPU memory) is reported as ``process_used_bytes``.
    ``None`` means this process. NVML lists host pids, so inside a container without the host's pid namespace
    nothing matches and the field stays ``None`` (unknown, never 0).

    ``nvml``: the NVML binding module; ``None`` imports ``pynvml``. Tests pass a fake object here.
    ``pcie``: read the PCIe TX/RX counters. NVML samples each over a 20 ms window, so each call blocks for it
    (21 ms measured on the H200): 42 ms per GPU per sample, ~340 ms on an 8-GPU node, against 43 us per GPU for
    everything else. On by default (host<->GPU traffic is what the host tier costs); off for a fast sample.
    """

    def __init__(
        self,
        pid: int | None = None,
        source: SourceId | None = None,
        *,
        nvml: Any = None,
        pcie: bool = True,
        retry_s: float = RETRY_INIT_S,
        clock: Callable[[], float] = time.monotonic,
        wall_clock: Callable[[], float] = time.time,
    ):
        self.pid = os.getpid() if pid is None else pid
        self.source = source or SourceId()
        self.pcie = pcie
        self.retry_s = retry_s
        self._nvml_arg = nvml
        self._nv: Any = None
        self._clock = clock
        self._wall_clock = wall_clock
        self._ready = False
        self._last_try: float | None = None
        self._reported = False
        self.error: str | None = None
        self.driver_version: str | None = None
        self._devices: list[_Device] = []
        self._pids: set[int] = {self.pid}
        self._pids_at: float | None = None

    @property
    def available(self) -> bool:
        """True once NVML initialised (a driver is present)."""
        return self._ready

    # ---------------------------------------------------------------------------------------------- init

    def _try_init(self) -> None:
        self._last_try = self._clock()
        if self._nvml_arg is not None:
            nv = self._nvml_arg
        else:
            try:
                nv = importlib.import_module("pynvml")
            except ImportError as exc:
                self.error = f"no NVIDIA driver: nvidia-ml-py is not installed ({exc})"
                return
        try:
            nv.nvmlInit()
        except Exception as exc:
            self.error = self._init_message(nv, exc)
            return
        self._nv = nv
        try:
            count = int(nv.nvmlDeviceGetCount())
        except Exception as exc:
            self.error = f"NVML initialised but cannot count GPUs ({type(exc).__name__}: {exc})"
            self._shutdown()
            return
        devices = []
        for i in range(count):
            try:
                handle = nv.nvmlDeviceGetHandleByIndex(i)
            except Exception:
                handle = None  # that GPU's records will carry an error; the others still work
            # Name and UUID never change: read once, not every sample.
            devices.append(_Device(i, handle, _text(self._call("nvmlDeviceGetName", handle)),
                                   _text(self._call("nvmlDeviceGetUUID", handle))))
        self.driver_version = _text(self._call("nvmlSystemGetDriverVersion"))
        self._devices = devices
        self._ready = True
        self.error = None if count else "NVML found no GPUs"

    @staticmethod
    def _init_message(nv: Any, exc: Exception) -> str:
        not_found = getattr(nv, "NVMLError_LibraryNotFound", None)
        not_loaded = getattr(nv, "NVMLError_DriverNotLoaded", None)
        if isinstance(not_found, type) and isinstance(exc, not_found):
            return "no NVIDIA driver: NVML library (libnvidia-ml.so.1) not found"
        if isinstance(not_loaded, type) and isinstance(exc, not_loaded):
            return "no NVIDIA driver: the NVIDIA kernel driver is not loaded"
        return f"no NVIDIA driver: NVML init failed ({type(exc).__name__}: {exc})"

    def _shutdown(self) -> None:
        nv, self._nv, self._ready = self._nv, None, False
        if nv is not None:
            try:
                nv.nvmlShutdown()
            except Exception:
                pass

    def close(self) -> None:
        """Release NVML (``nvmlShutdown``). A later :meth:`sample` initialises it again."""
        self._shutdown()
        self._devices = []
        self._last_try = None

    # ---------------------------------------------------------------------------------------------- sample

    def sample(self) -> list[Record]:
        """One record per GPU; blocking. Never raises."""
        if not self._ready:
            if self._last_try is not None and self._clock() - self._last_try < self.retry_s:
                return []
            self._try_init()
            if not self._ready:
                if self._reported:
                    return []  # said once; silence until a driver shows up
                self._reported = True
                return [make("gpu", {"index": -1, "error": self.error}, self.source, self._wall_clock())]
        now = self._wall_clock()
        if not self._devices:
            if self._reported:
                return []
            self._reported = True
            return [make("gpu", {"index": -1, "error": self.error or "NVML found no GPUs"}, self.source, now)]
        pids = self._engine_pids()
        return [make("gpu", self._read(dev, pids), self.source, now) for dev in self._devices]

    def _call(self, fn: str, *args: Any, **kwargs: Any) -> Any:
        """One NVML call; ``None`` on any failure (NVMLError, a function the binding or driver lacks...)."""
        try:
            return getattr(self._nv, fn)(*args, **kwargs)
        except Exception:
            return None

    def _read(self, dev: _Device, pids: set[int]) -> dict[str, Any]:
        data: dict[str, Any] = {"index": dev.index, "name": dev.name, "uuid": dev.uuid}
        h = dev.handle
        if h is None:  # no handle: every field is unknown (and NVML is never handed a NULL handle)
            data.update(dict.fromkeys(GPU_FIELDS, None))
            data["error"] = f"nvmlDeviceGetHandleByIndex({dev.index}) failed"
            return data
        nv = self._nv
        data.update(self._memory(dev))
        util = self._call("nvmlDeviceGetUtilizationRates", h)
        data["utilization_gpu_pct"] = _int(getattr(util, "gpu", None))
        data["utilization_memory_pct"] = _int(getattr(util, "memory", None))
        if self.pcie:
            # NVML reports KB/s; nvitop reads it as KiB/s (x 1024), and so do we. A 20 ms window: noisy, not a mean.
            tx = _int(self._call("nvmlDeviceGetPcieThroughput", h, getattr(nv, "NVML_PCIE_UTIL_TX_BYTES", 0)))
            rx = _int(self._call("nvmlDeviceGetPcieThroughput", h, getattr(nv, "NVML_PCIE_UTIL_RX_BYTES", 1)))
            data["pcie_tx_bytes_per_s"] = None if tx is None else tx * 1024
            data["pcie_rx_bytes_per_s"] = None if rx is None else rx * 1024
        else:
            data["pcie_tx_bytes_per_s"] = data["pcie_rx_bytes_per_s"] = None
        # 11 us with no process, 37 us on the anchor run: cheap enough for every sample.
        procs = self._call("nvmlDeviceGetComputeRunningProcesses", h)
        data["process_used_bytes"] = self._process_memory(procs, pids)
        data["compute_processes"] = len(procs) if isinstance(procs, (list, tuple)) else None
        temp = self._call("nvmlDeviceGetTemperature", h, getattr(nv, "NVML_TEMPERATURE_GPU", 0))
        data["temperature_c"] = _int(temp)
        power_mw = _int(self._call("nvmlDeviceGetPowerUsage", h))
        data["power_w"] = None if power_mw is None else power_mw / 1000.0
        return data

    def _memory(self, dev: _Device) -> dict[str, Any]:
        nv = self._nv
        out: dict[str, Any] = {"memory_total_bytes": None, "memory_used_bytes": None, "memory_free_bytes": None,
                               "memory_reserved_bytes": None, "memory_info_version": None}
        v2 = getattr(nv, "nvmlMemory_v2", None)
        if v2 is not None and dev.mem_v2 is not False:
            mem = self._call("nvmlDeviceGetMemoryInfo", dev.handle, version=v2)
            if mem is not None:
                dev.mem_v2 = True
                out.update(memory_total_bytes=_int(getattr(mem, "total", None)),
                           memory_used_bytes=_int(getattr(mem, "used", None)),
                           memory_free_bytes=_int(getattr(mem, "free", None)),
                           memory_reserved_bytes=_int(getattr(mem, "reserved", None)),
                           memory_info_version="v2")
                return out
            if dev.mem_v2 is None:
                # Never worked on this driver/binding: stop paying a failing call (7-10 us each) every sample.
                # Once it has worked, a failure is transient and v2 is tried again next time.
                dev.mem_v2 = False
        mem = self._call("nvmlDeviceGetMemoryInfo", dev.handle)
        if mem is not None:
            # v1 "used" includes the driver-reserved memory that v2 splits out (615 MiB on the H200, driver 580).
            out.update(memory_total_bytes=_int(getattr(mem, "total", None)),
                       memory_used_bytes=_int(getattr(mem, "used", None)),
                       memory_free_bytes=_int(getattr(mem, "free", None)),
                       memory_info_version="v1")
        return out

    @staticmethod
    def _process_memory(procs: Any, pids: set[int]) -> int | None:
        if not isinstance(procs, (list, tuple)):
            return None
        total, seen = 0, False
        for p in procs:
            if getattr(p, "pid", None) in pids:
                used = _int(getattr(p, "usedGpuMemory", None))  # None under Windows WDDM
                if used is not None:
                    total += used
                    seen = True
        return total if seen else None

    def _engine_pids(self) -> set[int]:
        now = self._clock()
        if self._pids_at is not None and now - self._pids_at < PID_REFRESH_S:
            return self._pids
        self._pids_at = now
        pids = {self.pid}
        try:
            import psutil

            pids.update(c.pid for c in psutil.Process(self.pid).children(recursive=True))
        except Exception:
            pass  # process gone or not visible: match the pid alone
        self._pids = pids
        return pids
