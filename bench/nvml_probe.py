"""Probe NVML and psutil as kvtop's sources use them: one sample as JSON, and the cost of each call.

    python bench/nvml_probe.py [--pid PID] [--repeat 2000] [--device 0]

Prints one JSON object: the driver, one ``gpu`` sample per GPU and one ``host`` sample (record data, exactly
what NvmlSource / HostSource emit), and ``us_per_call``: microseconds per call of each NVML and psutil call
those sources make, on ``--device``. A call that fails shows its error instead of a time. Without an NVIDIA
driver it prints the "no NVIDIA driver" record and only the psutil costs.

The PCIe throughput counters are timed with fewer repeats: NVML samples each over a 20 ms window.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

import psutil  # noqa: E402

from kvtop.records import SourceId  # noqa: E402
from kvtop.sources.host import HostSource  # noqa: E402
from kvtop.sources.nvml import NvmlSource  # noqa: E402


def cost_us(fn: Callable[[], Any], repeat: int) -> float | str:
    """Mean microseconds per call after one warm-up call; the error text if the call fails."""
    try:
        fn()
    except Exception as exc:
        return f"error: {type(exc).__name__}: {exc}"
    t0 = time.perf_counter()
    for _ in range(repeat):
        fn()
    return round((time.perf_counter() - t0) / repeat * 1e6, 2)


def nvml_costs(nv: Any, device: int, repeat: int) -> dict[str, float | str]:
    h = nv.nvmlDeviceGetHandleByIndex(device)
    slow = max(3, repeat // 200)  # the 20 ms PCIe counters: 2000 calls would take 40 s
    calls: list[tuple[str, Callable[[], Any], int]] = [
        ("nvmlDeviceGetMemoryInfo_v2", lambda: nv.nvmlDeviceGetMemoryInfo(h, version=nv.nvmlMemory_v2), repeat),
        ("nvmlDeviceGetMemoryInfo_v1", lambda: nv.nvmlDeviceGetMemoryInfo(h), repeat),
        ("nvmlDeviceGetUtilizationRates", lambda: nv.nvmlDeviceGetUtilizationRates(h), repeat),
        ("nvmlDeviceGetComputeRunningProcesses", lambda: nv.nvmlDeviceGetComputeRunningProcesses(h), repeat),
        ("nvmlDeviceGetTemperature", lambda: nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU), repeat),
        ("nvmlDeviceGetPowerUsage", lambda: nv.nvmlDeviceGetPowerUsage(h), repeat),
        ("nvmlDeviceGetName", lambda: nv.nvmlDeviceGetName(h), repeat),
        ("nvmlDeviceGetUUID", lambda: nv.nvmlDeviceGetUUID(h), repeat),
        ("nvmlDeviceGetPcieThroughput_TX", lambda: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_TX_BYTES),
         slow),
        ("nvmlDeviceGetPcieThroughput_RX", lambda: nv.nvmlDeviceGetPcieThroughput(h, nv.NVML_PCIE_UTIL_RX_BYTES),
         slow),
    ]
    return {name: cost_us(fn, n) for name, fn, n in calls}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--pid", type=int, default=None, help="the engine's process (default: this one)")
    ap.add_argument("--repeat", type=int, default=2000, help="calls per timing (PCIe counters: /200)")
    ap.add_argument("--device", type=int, default=0, help="GPU whose calls are timed")
    args = ap.parse_args(argv)

    source = SourceId.local(run="nvml-probe")
    gpu = NvmlSource(pid=args.pid, source=source)
    host = HostSource(pid=args.pid, source=source)
    out: dict[str, Any] = {"pid": gpu.pid, "python": sys.version.split()[0], "psutil": psutil.__version__}
    t0 = time.perf_counter()
    first = gpu.sample()
    out["first_sample_ms_incl_init"] = round((time.perf_counter() - t0) * 1e3, 3)
    out["nvml_available"] = gpu.available
    out["driver"] = gpu.driver_version
    out["gpu"] = [r.data for r in first]
    out["host"] = [r.data for r in host.sample()]
    costs: dict[str, float | str] = {}
    if gpu.available:
        import pynvml

        out["nvidia_ml_py"] = getattr(pynvml, "__version__", None)
        costs.update(nvml_costs(pynvml, args.device, args.repeat))
        few = max(3, args.repeat // 200)
        costs["NvmlSource.sample_all_gpus_pcie_on"] = cost_us(gpu.sample, few)
        gpu.pcie = False
        costs["NvmlSource.sample_all_gpus_pcie_off"] = cost_us(gpu.sample, max(10, args.repeat // 20))
        gpu.close()
    proc = psutil.Process(host.pid)
    costs["psutil.Process.memory_info"] = cost_us(proc.memory_info, args.repeat)
    costs["psutil.Process.memory_full_info"] = cost_us(proc.memory_full_info, max(10, args.repeat // 10))
    costs["psutil.virtual_memory"] = cost_us(psutil.virtual_memory, args.repeat)
    costs["HostSource.sample"] = cost_us(host.sample, max(10, args.repeat // 10))
    out["us_per_call"] = costs
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
