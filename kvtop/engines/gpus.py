"""GPU profiles: memory, achievable HBM bandwidth and FLOP rate, and the host link the KV cache tiers share.

Every rate here is *achievable*, not datasheet: the simulator's time must match what a real engine sees.
Where a figure was measured it says so; where it was derived from a datasheet it says how.

Sources:
- H200: one measured run, `anchors/h200-2026-11-29.json` (NVIDIA H200, PCIe Gen5 x16, driver 580.159.04,
  torch 2.11 cu130). Datasheet for comparison: HBM3e 4.8 TB/s, 989 dense BF16 TFLOP/s, PCIe Gen5 x16
  63 GB/s per direction in theory.
- H100 SXM and GH200: datasheet figures derated by the H200's measured/datasheet ratios (HBM 4,250 / 4,800
  = 0.885; BF16 GEMM 791 / 989 = 0.800), since they are the same Hopper die and HBM generation. The host
  link of the H100 is the same PCIe Gen5 x16 as the H200's, so it takes the H200's measured link.
- GH200 NVLink-C2C: 450 GB/s per direction in theory; one user measured 346 GB/s host->GPU. That measured
  figure is used for both directions (GPU->host was not measured).
- Memory sizes are the totals NVML / nvidia-smi report (143,771 MiB on an H200, 81,559 MiB on an H100 80GB
  HBM3, 97,871 MiB on a GH200 with 96 GB HBM3), as seen in many published nvidia-smi outputs. CUDA sees
  slightly less (torch reports 139.8 GiB total on an H200, i.e. about 0.6 GiB below NVML); `sizing.py`
  counts that gap in its runtime reserve.

A `kvtop calibrate` run measures a machine and writes a profile with `save_profile`; `load_profile` and
`resolve_gpu("path.json")` read it back. Raw measurements go in the profile's `measured` dict.
"""

from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvtop.engines.models import read_json_object

__all__ = [
    "BLOCK_COPY_LATENCY_US",
    "BUILTIN_GPUS",
    "LINKS",
    "GpuProfile",
    "known_gpu_names",
    "load_profile",
    "parse_link",
    "resolve_gpu",
    "save_profile",
]

_MIB = 1 << 20

# H200 anchor: pinned 1 GiB copies run at 55.28 GB/s host->GPU, but 64 scattered 4.5 MiB block copies (one
# Qwen3-8B block of 32 tokens each) at 53.06 GB/s. A 4.5 MiB block takes 85.36 us at 55.28 GB/s and
# 88.93 us at 53.06 GB/s: the 3.57 us difference is a fixed cost per copy (launch and DMA setup).
# Bandwidth + this latency reproduces both figures. TensorRT-LLM copies one block per cudaMemcpyAsync
# per pool; a pool holds all layers of a block contiguously, so one copy per block for uniform models.
BLOCK_COPY_LATENCY_US = round(4718592 / 53.0575309204285e3 - 4718592 / 55.277309668611736e3, 2)  # 3.57 us

# Achievable host<->GPU link rates, GB/s per direction, pinned memory.
LINKS: dict[str, float] = {
    # H200 anchor, pinned 1 GiB host->GPU: 55.28 GB/s (GPU->host 55.22), 88% of PCIe Gen5 x16's 63 GB/s.
    "pcie5": 55.28,
    # No measurement here: Gen4 x16 is 31.5 GB/s in theory; the Gen5 measured/theory ratio (0.877) gives 27.6.
    "pcie4": 27.6,
    # GH200 NVLink-C2C: one user measured 346 GB/s host->GPU (450 GB/s per direction in theory).
    "c2c": 346.0,
}


@dataclass(frozen=True)
class GpuProfile:
    """One GPU as the simulator's cost model and pool sizing see it. Rates are achievable, not datasheet."""

    name: str
    memory_bytes: int
    """Total GPU memory as NVML reports it."""
    hbm_GBps: float
    """Achievable HBM bandwidth, GB/s (1e9 bytes/s), bytes read plus bytes written."""
    bf16_tflops: float
    """Achievable dense BF16 matmul rate, TFLOP/s (large GEMMs)."""
    h2d_GBps: float
    """Achievable host->GPU rate over the link, pinned host memory, large copies, GB/s."""
    d2h_GBps: float
    """Achievable GPU->host rate over the link, pinned host memory, large copies, GB/s."""
    link_name: str
    """"pcie5", "pcie4", "c2c", or "custom"."""
    source: str
    """Where these numbers come from, in words."""
    copy_latency_us: float = BLOCK_COPY_LATENCY_US
    """Fixed cost of one host<->GPU block copy on top of bytes / bandwidth, microseconds."""
    measured: dict[str, Any] = field(default_factory=dict, compare=False, hash=False)
    """Raw measured figures behind the profile (calibration output), verbatim."""

    def __post_init__(self) -> None:
        if not isinstance(self.memory_bytes, int) or self.memory_bytes <= 0:
            raise ValueError(f"GpuProfile {self.name!r}: memory_bytes must be a positive int, "
                             f"got {self.memory_bytes!r}")
        for name in ("hbm_GBps", "bf16_tflops", "h2d_GBps", "d2h_GBps"):
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise ValueError(f"GpuProfile {self.name!r}: {name} must be a positive number, got {value!r}")
        if not self.copy_latency_us >= 0:
            raise ValueError(f"GpuProfile {self.name!r}: copy_latency_us must be >= 0, "
                             f"got {self.copy_latency_us!r}")

    def with_link(self, link: str | float) -> GpuProfile:
        """This GPU with another host link (a preset name or GB/s), e.g. an H200 profile over "pcie4"."""
        gbps = parse_link(link)
        name = str(link).strip().lower() if str(link).strip().lower() in LINKS else "custom"
        return dataclasses.replace(self, h2d_GBps=gbps, d2h_GBps=gbps, link_name=name,
                                   source=f"{self.source}; host link replaced by {link} ({gbps:g} GB/s)")

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready dict of every field."""
        return dataclasses.asdict(self)


# Ratios measured on the H200 anchor against its datasheet, used to derate other Hopper parts.
_H200_HBM_GBPS = 4250.321883738074  # hbm_copy_GBps_read_plus_write
_H200_BF16_TFLOPS = (796.0737734484912 + 786.4560084891509) / 2  # two GEMM shapes: 791.3
_HBM_DERATE = _H200_HBM_GBPS / 4800.0  # 0.885 of the 4.8 TB/s datasheet
_BF16_DERATE = _H200_BF16_TFLOPS / 989.0  # 0.800 of the 989 TFLOP/s dense datasheet

_H200 = GpuProfile(
    name="H200",
    memory_bytes=143771 * _MIB,  # 150,754,820,096 bytes: NVML total of an H200 (141 GB HBM3e part)
    hbm_GBps=round(_H200_HBM_GBPS, 1),
    bf16_tflops=round(_H200_BF16_TFLOPS, 1),
    h2d_GBps=55.28,  # pinned 1 GiB; scattered 4.5 MiB blocks reach 53.06 via copy_latency_us
    d2h_GBps=55.22,
    link_name="pcie5",
    source="measured: anchors/h200-2026-11-29.json (NVIDIA H200, PCIe Gen5 x16, driver 580.159.04, "
           "torch 2.11 cu130); memory: NVML total 143,771 MiB",
    measured={
        "h2d_GBps_1024MiB_pinned": 55.277309668611736,
        "d2h_GBps_1024MiB_pinned": 55.22140562362914,
        "h2d_GBps_4.5MiB_pinned": 50.343462772730504,
        "d2h_GBps_4.5MiB_pinned": 51.89371841101882,
        "onboard_64x4.5MiB_blocks_GBps": 53.0575309204285,
        "hbm_copy_GBps_read_plus_write": 4250.321883738074,
        "bf16_gemm_TFLOPs_8192x8192x8192": 796.0737734484912,
        "bf16_gemm_TFLOPs_4096x12288x4096": 786.4560084891509,
        "recompute_s_per_8192_tokens_36_layers": 0.19135757160186767,
        "reload_s_per_8192_tokens_pinned": 0.021809999465942382,
        "pcie_gen_width": [5, 16],
    },
)

_H100 = GpuProfile(
    name="H100",
    memory_bytes=81559 * _MIB,  # 85,520,809,984 bytes: NVML total of an H100 80GB HBM3 (SXM)
    hbm_GBps=round(3350.0 * _HBM_DERATE, 1),  # 3.35 TB/s datasheet x 0.885 = 2,966
    bf16_tflops=round(989.0 * _BF16_DERATE, 1),  # same 989 datasheet as the H200, so the same 791
    h2d_GBps=55.28,  # PCIe Gen5 x16, like the H200: its measured link
    d2h_GBps=55.22,
    link_name="pcie5",
    source="derived: H100 SXM datasheet (80 GB HBM3 3.35 TB/s, 989 dense BF16 TFLOP/s) x the H200 anchor's "
           "measured/datasheet ratios (HBM 0.885, BF16 0.800); PCIe Gen5 x16 link as measured on the H200; "
           "memory: NVML total 81,559 MiB",
)

_GH200 = GpuProfile(
    name="GH200",
    memory_bytes=97871 * _MIB,  # 102,625,181,696 bytes: NVML total of the 96 GB HBM3 GH200
    hbm_GBps=round(4000.0 * _HBM_DERATE, 1),  # 4.0 TB/s datasheet (96 GB HBM3 variant) x 0.885 = 3,542
    bf16_tflops=round(989.0 * _BF16_DERATE, 1),  # same H100 die: 989 datasheet x 0.800
    h2d_GBps=LINKS["c2c"],  # 346 GB/s measured host->GPU by one user; 450 in theory
    d2h_GBps=LINKS["c2c"],  # not measured: assumed equal to host->GPU
    link_name="c2c",
    source="derived: GH200 96GB HBM3 (the 144GB HBM3e variant differs) datasheet 4.0 TB/s, 989 dense BF16 "
           "TFLOP/s x the H200 anchor's ratios (HBM 0.885, BF16 0.800); NVLink-C2C 346 GB/s host->GPU as "
           "one user measured (450 in theory), GPU->host assumed equal; memory: NVML total 97,871 MiB",
)

BUILTIN_GPUS: dict[str, GpuProfile] = {p.name: p for p in (_H200, _H100, _GH200)}

# Other spellings people and NVML use, folded by _gpu_key.
_GPU_ALIASES: dict[str, str] = {
    "h200sxm": "H200", "h200141gbhbm3e": "H200", "h200141gb": "H200",
    "h100sxm": "H100", "h10080gbhbm3": "H100", "h10080gb": "H100", "h100sxm580gb": "H100",
    "gh20096gb": "GH200", "gh200480gb": "GH200", "gh200120gb": "GH200", "gh20096gbhbm3": "GH200",
}


def _gpu_key(name: str) -> str:
    # "NVIDIA H100 80GB HBM3" (the NVML name) -> "h10080gbhbm3"; "h200" -> "h200".
    key = re.sub(r"[^a-z0-9]", "", name.lower())
    return key.removeprefix("nvidia")


def known_gpu_names() -> list[str]:
    """Names of the built-in profiles."""
    return list(BUILTIN_GPUS)


def resolve_gpu(name: str | Path) -> GpuProfile:
    """A built-in profile by name (case-insensitive; NVML names like "NVIDIA H200" work), or a profile JSON
    file written by `save_profile` / `kvtop calibrate`. Unknown names raise ValueError listing the known."""
    text = str(name).strip()
    if text.endswith(".json") or Path(text).expanduser().is_file():
        return load_profile(text)
    key = _gpu_key(text)
    for profile_name in BUILTIN_GPUS:
        if key == profile_name.lower():
            return BUILTIN_GPUS[profile_name]
    if key in _GPU_ALIASES:
        return BUILTIN_GPUS[_GPU_ALIASES[key]]
    raise ValueError(f"unknown GPU {text!r}; known GPUs: {', '.join(known_gpu_names())}, "
                     "or a profile .json file from `kvtop calibrate`")


_PROFILE_VERSION = 1
_REQUIRED = ("name", "memory_bytes", "hbm_GBps", "bf16_tflops", "h2d_GBps", "d2h_GBps", "link_name", "source")


def save_profile(profile: GpuProfile, path: str | Path) -> None:
    """Write a profile as JSON (with a format version), readable by `load_profile`."""
    data = {"kvtop_gpu_profile": _PROFILE_VERSION, **profile.to_dict()}
    Path(path).expanduser().write_text(json.dumps(data, indent=1, sort_keys=False) + "\n", encoding="utf-8")


def load_profile(path: str | Path) -> GpuProfile:
    """Read a profile JSON written by `save_profile`. Missing or wrong fields raise ValueError naming them."""
    p = Path(path).expanduser()
    data = read_json_object(p, f"GPU profile {p}")
    version = data.get("kvtop_gpu_profile", _PROFILE_VERSION)
    if version != _PROFILE_VERSION:
        raise ValueError(f"GPU profile {p}: format version {version!r}, this kvtop reads {_PROFILE_VERSION}")
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise ValueError(f"GPU profile {p}: missing field(s) {', '.join(missing)}")
    measured = data.get("measured", {})
    if not isinstance(measured, dict):
        raise ValueError(f"GPU profile {p}: 'measured' must be an object")
    kwargs: dict[str, Any] = {k: data[k] for k in _REQUIRED}
    if "copy_latency_us" in data:
        kwargs["copy_latency_us"] = float(data["copy_latency_us"])
    try:
        kwargs["memory_bytes"] = int(kwargs["memory_bytes"])
        for k in ("hbm_GBps", "bf16_tflops", "h2d_GBps", "d2h_GBps"):
            kwargs[k] = float(kwargs[k])
    except (TypeError, ValueError) as exc:
        raise ValueError(f"GPU profile {p}: non-numeric rate or size: {exc}") from exc
    return GpuProfile(**kwargs, measured=measured)


def parse_link(spec: str | float) -> float:
    """Host link rate in GB/s from a preset name ("pcie5", "pcie4", "c2c") or a number ("32", "32GB/s")."""
    if isinstance(spec, (int, float)) and not isinstance(spec, bool):
        value = float(spec)
    else:
        text = str(spec).strip().lower()
        if text in LINKS:
            return LINKS[text]
        number = re.fullmatch(r"([0-9]*\.?[0-9]+)\s*(gb/s|gbps|gb)?", text)
        if number is None:
            raise ValueError(f"bad link {spec!r}: use one of {', '.join(LINKS)} "
                             "or a rate in GB/s such as '32'")
        value = float(number.group(1))
    if not value > 0:
        raise ValueError(f"bad link {spec!r}: the rate must be positive GB/s")
    return value
