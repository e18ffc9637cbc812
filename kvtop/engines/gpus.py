"""GPU profiles: memory, achievable HBM bandwidth and FLOP rate, and the host link the KV cache tiers share.

Every rate here is *achievable*, not datasheet: the simulator's time must match what a real engine sees.
Where a figure was measured it says so; where it was derived from a datasheet it says how.

Sources:
- H200: one measured run, `anchors/h200-2026-11-29.json` (NVIDIA H200, PCIe Gen5 x16, driver 580.159.04,
  torch 2.11 cu130). Datasheet for comparison: HBM3e 4.8 TB/s, 989 dense BF16 TFLOP/s, PCIe Gen5 x16
  63 GB/s per direction in theory.
- The cost model's rates (GEMM curves bf16 and FP8, attention, step overhead, copy overlap, sustained-load
  factors): `kvtop calibrate` and bench/sustained_probe.py on the H200 device machine, 2026-12-01
  (profiles/h200-calibrated-2026-12-01.json, bench/results/h200-cost-2026-12-01-*.json); the bf16 GEMM rate is
  that run's sustained 679 TFLOP/s (the anchor's 791 was a burst).
- H100 SXM and GH200: the H200's compute rates (the same Hopper die and clocks) and its HBM figures scaled by
  the datasheet ratio (copy 4,250 / 4,800 = 0.885, streaming read 4,496 / 4,800 = 0.937). The host link of the
  H100 is the same PCIe Gen5 x16 as the H200's, so it takes the H200's measured link.
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
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvtop.engines.models import read_json_object
from kvtop.suggest import did_you_mean

__all__ = [
    "BLOCK_COPY_LATENCY_US",
    "BUILTIN_GPUS",
    "COST_FIELDS",
    "LINKS",
    "GpuProfile",
    "cost_rates_from_measured",
    "allreduce_curve_from_probe",
    "gemm_correction_curve",
    "gemm_layer_model_s",
    "gemm_shape_corrections",
    "known_gpu_names",
    "load_profile",
    "merge_probe",
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
    # --- the two-part cost model's rates (kvtop.engines.sim.cost); None: the H200's measured value (Hopper) ---
    fp8_tflops: float | None = None
    """Dense FP8 GEMM rate, TFLOP/s, measured (one layer's GEMMs at 16,384 tokens), or None: no FP8 GEMMs."""
    hbm_read_GBps: float | None = None
    """HBM read rate of a streaming kernel (decode attention reading KV), GB/s: weights and KV reads use it."""
    gemm_kernel_us: float | None = None
    """Fixed time of one GEMM kernel on top of its roofline (tail, launch inside a graph), microseconds."""
    gemm_correction: dict[str, list[list[float]]] = field(default_factory=dict, compare=False, hash=False)
    """Per GEMM dtype ("bf16", "fp8"): [tokens, measured / modelled time] of one calibrated layer, which the cost
    model interpolates (log tokens) to correct its GEMM roofline near the compute/memory knee."""
    attention_prefill_tflops: list[list[float]] = field(default_factory=list, compare=False, hash=False)
    """[new tokens, TFLOP/s] of causal prefill attention (FlashAttention via SDPA), interpolated on log tokens."""
    step_overhead_us: float | None = None
    """Fixed cost of one engine iteration: graphed small kernels (norms, RoPE, activations) + sampling + host
    round trip, microseconds."""
    copy_duplex_penalty: float | None = None
    """Onboard and offload on their own CUDA streams at once take max(on, off) + this x min(on, off)."""
    allreduce_GBps: float | None = None
    """All-reduce bus rate between tensor-parallel GPUs (NVLink), GB/s; None: Hopper SXM's assumed figure."""
    allreduce_latency_us: float | None = None
    """Fixed cost of one all-reduce, microseconds."""
    gemm_sustained: dict[str, float] = field(default_factory=dict, compare=False, hash=False)
    """Per GEMM dtype: compute-bound GEMMs' rate under seconds of continuous load over calibrate's short bursts
    (a busy GPU sits at its power limit and lowers its clocks)."""
    request_step_us: float | None = None
    """Engine work per running request per iteration that the GPU does not hide (TensorRT-LLM's sampler and request
    bookkeeping), microseconds. Not measurable without TensorRT-LLM: fitted (see the built-in H200's note)."""
    step_layer_us: float | None = None
    """The per-layer part of `step_overhead_us` (the graphed small kernels, 4 a layer), microseconds a layer: a model
    with more layers than the calibrated one (`step_layers`) pays it for each extra layer."""
    step_layers: int | None = None
    """Layers of the model `step_overhead_us` was measured for."""
    gemm_shape_correction: list[dict[str, Any]] = field(default_factory=list, compare=False, hash=False)
    """Per measured GEMM shape set: {"shapes_KN": one layer's four (K, N), "dtype": "bf16" | "fp8", "correction":
    [tokens, measured / modelled]}. A model whose layer (one rank's shard) has exactly these shapes uses this curve;
    any other falls back to `gemm_correction` (the calibrated model's)."""
    attention_decode_GBps: list[list[float]] = field(default_factory=list, compare=False, hash=False)
    """[KV bytes one decode-attention call reads, GB/s] measured (calibrate: 16 x 1,024 to 32 x 16,384 contexts),
    interpolated on log bytes, flat beyond: a small batch's KV read runs below `hbm_read_GBps` (its peak)."""
    allreduce_curve: dict[str, list[list[float]]] = field(default_factory=dict, compare=False, hash=False)
    """Per tensor-parallel size ("2", "4", ...): [message bytes, microseconds] of one all-reduce, interpolated
    linearly in bytes; past the largest size, its last segment's rate. Where a size has none, `allreduce_latency_us`
    + bytes over `allreduce_GBps`."""

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


COST_FIELDS = ("fp8_tflops", "hbm_read_GBps", "gemm_kernel_us", "gemm_correction", "attention_prefill_tflops",
                "step_overhead_us", "copy_duplex_penalty", "allreduce_GBps", "allreduce_latency_us", "gemm_sustained",
                "request_step_us", "step_layer_us", "step_layers", "gemm_shape_correction", "allreduce_curve",
                "attention_decode_GBps")


def gemm_layer_model_s(shapes: list[tuple[int, int]] | list[list[int]], tokens: int, tflops: float,
                       read_GBps: float, weight_bytes: float, kernel_us: float) -> float:
    """One layer's GEMMs at `tokens` rows, uncorrected: per GEMM, max(FLOPs / peak, (weights + bf16 activations
    in and out) / HBM read rate) + a fixed kernel time. The cost model multiplies this by the calibrated
    correction at `tokens`."""
    total = 0.0
    for k, n in shapes:
        flops = 2.0 * tokens * k * n
        nbytes = k * n * weight_bytes + 2.0 * tokens * (k + n)
        total += max(flops / (tflops * 1e12), nbytes / (read_GBps * 1e9)) + kernel_us * 1e-6
    return total


def cost_rates_from_measured(measured: dict[str, Any]) -> dict[str, Any]:
    """The cost model's rates from a `kvtop calibrate` run's raw figures (its `measured` dict). Keys it cannot
    find are left out (the H200's values stand in). How each is read:

    - hbm_read_GBps: the decode-attention KV read rate (a pure streaming read; the copy rate counts read + write);
    - per GEMM dtype, from one layer's four GEMMs timed at 1 to 16,384 tokens: the peak from the largest count,
      the fixed kernel time from the smallest (time - weight bytes / read rate, per GEMM), then a correction per
      token count = measured / modelled. FP8 takes the faster of exact and fast accumulation at each count;
    - attention_prefill_tflops, step_overhead_us: as measured; copy_duplex_penalty from 64 blocks each way alone
      and at once.
    """
    out: dict[str, Any] = {}
    read = measured.get("attention_decode_GBps")
    shapes = measured.get("gemm_layer_shapes_KN")
    if isinstance(read, (int, float)) and read > 0:
        out["hbm_read_GBps"] = round(float(read), 1)
    decode = measured.get("attention_decode_batch_ctx_s_GBps")
    if isinstance(decode, list) and decode:
        # [batch, context, seconds, GB/s]: the bytes one call read are its rate x its time
        out["attention_decode_GBps"] = sorted([int(round(float(gbps) * float(t) * 1e9)), round(float(gbps), 1)]
                                              for _b, _c, t, gbps in decode)
    curves: dict[str, dict[int, float]] = {}
    for key, label in (("gemm_layer_s_bf16", "bf16"), ("gemm_layer_s_fp8", "fp8"), ("gemm_layer_s_fp8fast", "fp8")):
        rows = measured.get(key)
        if isinstance(rows, list) and rows:
            curve = curves.setdefault(label, {})
            for m, t in rows:
                curve[int(m)] = min(float(t), curve.get(int(m), float("inf")))
    if "hbm_read_GBps" in out and isinstance(shapes, list) and curves:
        correction: dict[str, list[list[float]]] = {}
        kernel_us = []
        for label, curve in curves.items():
            wbytes = 1.0 if label == "fp8" else 2.0
            big = max(curve)
            peak = sum(2.0 * big * k * n for k, n in shapes) / curve[big] / 1e12
            small = min(curve)
            stream = gemm_layer_model_s(shapes, small, peak, out["hbm_read_GBps"], wbytes, 0.0)
            kus = max(0.0, (curve[small] - stream) / len(shapes) * 1e6)
            kernel_us.append(kus)
            correction[label] = gemm_correction_curve(shapes, curve, wbytes, peak, out["hbm_read_GBps"], kus)
            if label == "fp8":
                out["fp8_tflops"] = round(peak, 1)
            else:
                out["bf16_tflops"] = round(peak, 1)  # the peak the bf16 correction is relative to
        out["gemm_kernel_us"] = round(sum(kernel_us) / len(kernel_us), 2)
        out["gemm_correction"] = correction
    att = measured.get("attention_prefill_tokens_s_tflops")
    if isinstance(att, list) and att:
        out["attention_prefill_tflops"] = [[int(n), round(float(tf), 1)] for n, _t, tf in att]
    step = measured.get("step_overhead_s")
    if isinstance(step, (int, float)) and step > 0:
        out["step_overhead_us"] = round(step * 1e6, 1)
        kernels, graph_s = measured.get("small_kernels_per_step"), measured.get("graph_small_kernels_s")
        # calibrate graphs 4 small kernels a layer (norms, RoPE, activation, residual adds); their time scales with
        # the layer count, the sampling and host round trip do not
        if isinstance(kernels, int) and kernels >= 4 and isinstance(graph_s, (int, float)) and 0 < graph_s <= step:
            out["step_layers"] = kernels // 4
            out["step_layer_us"] = round(graph_s * 1e6 / (kernels // 4), 3)
    probe = measured.get("gemm_shapes_probe")
    rates = ("hbm_read_GBps", "gemm_kernel_us", "bf16_tflops")
    if isinstance(probe, dict) and all(k in out for k in rates):
        out["gemm_shape_correction"] = gemm_shape_corrections(
            probe, hbm_read_GBps=out["hbm_read_GBps"], bf16_tflops=out["bf16_tflops"],
            fp8_tflops=out.get("fp8_tflops"), gemm_kernel_us=out["gemm_kernel_us"])
    for key, ar in measured.items():
        if str(key).startswith("allreduce_probe") and isinstance(ar, dict):
            size, ar_curve = allreduce_curve_from_probe(ar)
            out.setdefault("allreduce_curve", {})[size] = ar_curve
    on, off, both = (measured.get(k) for k in ("overlap_onboard_s", "overlap_offload_s", "overlap_both_s"))
    if all(isinstance(v, (int, float)) and v > 0 for v in (on, off, both)):
        assert isinstance(on, (int, float)) and isinstance(off, (int, float)) and isinstance(both, (int, float))
        out["copy_duplex_penalty"] = round(max(0.0, (both - max(on, off)) / min(on, off)), 3)
    return out


def gemm_correction_curve(shapes: Sequence[Sequence[int]], times: dict[int, float], weight_bytes: float,
                          peak_tflops: float, read_GBps: float, kernel_us: float) -> list[list[float]]:
    """[tokens, measured / modelled] of one layer's GEMMs timed at each token count (`times`: tokens -> seconds),
    against `gemm_layer_model_s` at these rates (the cost model multiplies its roofline by it)."""
    pairs = [(int(k), int(n)) for k, n in shapes]
    return [[m, round(times[m] / gemm_layer_model_s(pairs, m, peak_tflops, read_GBps, weight_bytes, kernel_us), 4)]
            for m in sorted(times)]


def gemm_shape_corrections(probe: dict[str, Any], *, hbm_read_GBps: float, bf16_tflops: float,
                           fp8_tflops: float | None, gemm_kernel_us: float) -> list[dict[str, Any]]:
    """`GpuProfile.gemm_shape_correction` from bench/gemm_shapes_probe.py's output ({"model|tpN|bf16" / "|fp8" /
    "|fp8fast": {"shapes_KN", "tokens_s"}}), relative to a profile's own rates (the ones its cost model's roofline
    uses). FP8 takes the faster of exact and fast accumulation at each count, as `cost_rates_from_measured` does.
    A malformed entry raises ValueError naming it."""
    grouped: dict[tuple[tuple[tuple[int, int], ...], str], dict[int, float]] = {}
    for key, entry in probe.items():
        label = str(key).rsplit("|", 1)[-1]
        if label not in ("bf16", "fp8", "fp8fast"):
            continue  # other keys (metadata) are not curves
        try:
            shapes = tuple((int(k), int(n)) for k, n in entry["shapes_KN"])
            rows = [(int(m), float(t)) for m, t in entry["tokens_s"]]
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"GEMM shapes probe entry {key!r}: needs shapes_KN [[K, N], ...] and tokens_s "
                             f"[[tokens, seconds], ...] ({exc})") from exc
        if len(shapes) != 4 or not rows or any(m <= 0 or not t > 0 for m, t in rows):
            raise ValueError(f"GEMM shapes probe entry {key!r}: four (K, N) shapes and positive tokens/seconds")
        dtype = "bf16" if label == "bf16" else "fp8"
        curve = grouped.setdefault((shapes, dtype), {})
        for m, t in rows:
            curve[m] = min(t, curve.get(m, float("inf")))
    out = []
    for (shapes, dtype), times in grouped.items():
        if dtype == "fp8" and not fp8_tflops:
            continue
        peak = fp8_tflops if dtype == "fp8" else bf16_tflops
        assert peak is not None
        out.append({"shapes_KN": [list(s) for s in shapes], "dtype": dtype,
                    "correction": gemm_correction_curve(shapes, times, 1.0 if dtype == "fp8" else 2.0, peak,
                                                        hbm_read_GBps, gemm_kernel_us)})
    return out


def allreduce_curve_from_probe(probe: dict[str, Any]) -> tuple[str, list[list[float]]]:
    """(tensor-parallel size, [[bytes, us], ...]) from bench/allreduce_probe.py's output: per message size the
    fastest of its graphed NCCL and symmetric-memory one-shot / two-shot all-reduces (one kernel each, launched as
    TensorRT-LLM launches its own: from a graph or back to back), the eager NCCL figure only where none of those
    ran. A malformed probe raises ValueError naming what is wrong."""
    world = probe.get("world_size")
    rows = probe.get("rows")
    if not isinstance(world, int) or isinstance(world, bool) or world < 2:
        raise ValueError(f"all-reduce probe: world_size must be an int >= 2, got {world!r}")
    if not isinstance(rows, list) or not rows:
        raise ValueError("all-reduce probe: no rows")
    curve: dict[int, float] = {}
    for i, row in enumerate(rows):
        if not isinstance(row, dict):
            raise ValueError(f"all-reduce probe row {i}: not an object")
        nbytes = row.get("bytes")
        times = [row.get(k) for k in ("graph_us", "symm_one_shot_us", "symm_two_shot_us")]
        good = [float(t) for t in times if isinstance(t, (int, float)) and not isinstance(t, bool) and t > 0]
        eager = row.get("eager_us")
        if not good and isinstance(eager, (int, float)) and not isinstance(eager, bool) and eager > 0:
            good = [float(eager)]
        if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes <= 0 or not good:
            raise ValueError(f"all-reduce probe row {i}: needs positive int bytes and a positive time in us")
        curve[nbytes] = min(good)
    return str(world), [[b, round(curve[b], 3)] for b in sorted(curve)]


def merge_probe(profile: GpuProfile, probe: dict[str, Any], source: str) -> GpuProfile:
    """`profile` with one probe's output added: bench/allreduce_probe.py's (an all-reduce curve for its
    tensor-parallel size) or bench/gemm_shapes_probe.py's (per-shape GEMM corrections). The raw output is kept in
    `measured`; the curves already there for other sizes or shapes stay. Unknown or malformed: ValueError."""
    if "world_size" in probe and "rows" in probe:
        size, curve = allreduce_curve_from_probe(probe)
        return dataclasses.replace(
            profile, allreduce_curve={**profile.allreduce_curve, size: curve},
            measured={**profile.measured, f"allreduce_probe_tp{size}": probe},
            source=f"{profile.source}; all-reduce tp{size} from {source}")
    if any("|" in str(k) for k in probe):
        if profile.hbm_read_GBps is None or profile.gemm_kernel_us is None:
            raise ValueError(f"{source}: the profile has no calibrated GEMM rates to correct against "
                             "(run kvtop calibrate first)")
        added = gemm_shape_corrections(probe, hbm_read_GBps=profile.hbm_read_GBps, bf16_tflops=profile.bf16_tflops,
                                       fp8_tflops=profile.fp8_tflops, gemm_kernel_us=profile.gemm_kernel_us)
        keys = {(json.dumps(e["shapes_KN"]), e["dtype"]) for e in added}
        kept = [e for e in profile.gemm_shape_correction if (json.dumps(e["shapes_KN"]), e["dtype"]) not in keys]
        return dataclasses.replace(profile, gemm_shape_correction=kept + added,
                                   measured={**profile.measured, "gemm_shapes_probe": probe},
                                   source=f"{profile.source}; per-shape GEMM curves from {source}")
    raise ValueError(f"{source}: neither an all-reduce probe (world_size, rows) nor a GEMM shapes probe "
                     "('model|tpN|dtype' keys)")


# Ratios measured on the H200 anchor against its datasheet, used to derate other Hopper parts.
_H200_HBM_GBPS = 4250.321883738074  # hbm_copy_GBps_read_plus_write
_HBM_DERATE = _H200_HBM_GBPS / 4800.0  # 0.885 of the 4.8 TB/s datasheet

# The two-part cost model's rates, measured by `kvtop calibrate` on the H200 device machine on 2026-12-01
# (profiles/h200-calibrated-2026-12-01.json, Llama-3.1-8B's layer shapes; cost_rates_from_measured of its
# `measured`, which a test checks): FP8 GEMMs (torch._scaled_mm, fast accumulation) at 1,430 TFLOP/s against bf16's
# 679 on the same layer at 16,384 tokens (2.1x), and 1.6x at decode sizes, where both stream weights; decode
# attention reads KV at 4,496 GB/s; the fixed step cost is 159 us (128 graphed small kernels 113 us, sampling and
# the host round trip 46 us); onboard and offload at once take 1.135x the longer of the two.
_H200_COST: dict[str, Any] = {
    "fp8_tflops": 1430.5,
    "hbm_read_GBps": 4496.4,
    "gemm_kernel_us": 7.52,
    "gemm_correction": {
        "bf16": [[1, 1.0], [16, 0.9829], [64, 1.0593], [128, 1.1585], [256, 0.9959], [512, 0.8575], [1024, 0.8486],
                 [2048, 0.854], [4096, 0.8548], [8192, 0.9591], [16384, 0.9972]],
        "fp8": [[1, 1.0], [16, 0.9741], [64, 1.0275], [128, 1.0942], [256, 1.0995], [512, 0.9376], [1024, 0.9229],
                [2048, 0.9396], [4096, 0.9381], [8192, 0.9812], [16384, 0.9939]],
    },
    "attention_prefill_tflops": [[1024, 244.1], [4096, 520.5], [16384, 629.1]],
    # decode attention's KV read rate by bytes a call reads (16 x 1,024, 64 x 2,048, 128 x 4,096, 32 x 16,384 bf16
    # contexts of Llama-3.1-8B's 8 KV heads): 3,067 GB/s at 67 MB, 4,170 at 537 MB, 4,468-4,496 at 2.1 GB
    "attention_decode_GBps": [[67108864, 3066.8], [536870912, 4169.6], [2147483648, 4468.3], [2147483648, 4496.4]],
    "step_overhead_us": 159.1,
    # of which the 128 graphed small kernels (4 a layer x 32 layers) took 113.2 us: 3.536 us a layer, paid again for
    # each layer a deeper model has (Llama-3.3-70B's 80: 159.1 + 48 x 3.536 = 328.8 us)
    "step_layer_us": 3.536,
    "step_layers": 32,
    # One Llama-3.1-70B layer's GEMMs, one rank's shard at tp 1 and 2, timed on the same H200 the same way
    # (bench/gemm_shapes_probe.py -> bench/results/h200-cost-2026-12-01-gemm-shapes.json; gemm_shape_corrections
    # of its 70B entries, which a test checks): the 8B-derived curve gave 0.87-1.08x of these measured times
    # (burst against burst), mostly too fast: FP8 0.89-0.92x at 8,192-16,384 tokens (the 70B layer ran at
    # 1,324 TFLOP/s where the 8B one reached 1,430), 0.93-0.99x at 1-128 tokens (weight streaming).
    "gemm_shape_correction": [
        {"shapes_KN": [[8192, 10240], [8192, 8192], [8192, 57344], [28672, 8192]], "dtype": "bf16",
         "correction": [[1, 1.0742], [16, 1.0449], [64, 1.1049], [128, 1.1491], [256, 0.9604], [512, 0.885],
                        [1024, 0.8773], [2048, 0.8624], [4096, 0.9819], [8192, 0.9981], [16384, 0.9978]]},
        {"shapes_KN": [[8192, 10240], [8192, 8192], [8192, 57344], [28672, 8192]], "dtype": "fp8",
         "correction": [[1, 1.0729], [16, 1.0133], [64, 1.0851], [128, 1.1266], [256, 1.0206], [512, 0.9781],
                        [1024, 0.9631], [2048, 0.9707], [4096, 0.979], [8192, 1.0811], [16384, 1.0785]]},
        {"shapes_KN": [[8192, 5120], [4096, 8192], [8192, 28672], [14336, 8192]], "dtype": "bf16",
         "correction": [[1, 1.0471], [16, 1.0367], [64, 1.1117], [128, 1.1511], [256, 0.9844], [512, 0.8858],
                        [1024, 0.87], [2048, 0.8573], [4096, 0.9431], [8192, 0.9933], [16384, 0.9972]]},
        {"shapes_KN": [[8192, 5120], [4096, 8192], [8192, 28672], [14336, 8192]], "dtype": "fp8",
         "correction": [[1, 1.0218], [16, 0.9876], [64, 1.0353], [128, 1.1046], [256, 1.0901], [512, 1.0329],
                        [1024, 1.0231], [2048, 0.9904], [4096, 1.0234], [8192, 1.0971], [16384, 1.0771]]},
    ],
    "copy_duplex_penalty": 0.135,
    # All-reduce: PUBLISHED, not measured here (one GPU; bench/allreduce_probe.py is the probe for a multi-GPU run,
    # merged with `kvtop calibrate --merge`). sglang PR #2904 (https://github.com/sgl-project/sglang/pull/2904,
    # "unit test performance in H100 (without cuda graph)", sgl-kernel/tests/test_trt_reduce.py): TensorRT-LLM's
    # custom all-reduce kernel as sglang adapted it, on H100 SXM GPUs over NVLink, per call, at 512 to 1,048,576
    # float32 values (2 KiB to 4 MiB; the test's tensors are float32), tp 2 / 4 / 8. The H200 has the same NVLink 4.
    # Cross-check: vLLM PR #24111 (https://github.com/vllm-project/vllm/pull/24111), H100 TP2, bf16 (32, 8192) =
    # 0.5 MB: 7 us in vLLM's one-stage custom all-reduce (this curve: 6.0 us there).
    "allreduce_curve": {
        "2": [[2048, 3.7], [16384, 3.9], [131072, 4.5], [1048576, 7.9], [2097152, 12.5], [4194304, 19.9]],
        "4": [[2048, 4.8], [16384, 3.7], [131072, 4.8], [1048576, 13.9], [2097152, 20.2], [4194304, 31.1]],
        "8": [[2048, 5.9], [16384, 5.7], [131072, 7.8], [1048576, 16.7], [2097152, 22.1], [4194304, 33.8]],
    },
    # Past 4 MiB (prefill chunks: 256+ tokens of a 8,192-wide model) and for other sizes: ASSUMED, not measured:
    # NVLink 4 is 450 GB/s per direction in theory; nccl-tests all-reduce bus bandwidth is commonly reported at
    # ~360 GB/s for large messages on Hopper SXM; 8 us fixed where no curve covers the tensor-parallel size.
    "allreduce_GBps": 360.0,
    "allreduce_latency_us": 8.0,
    # bench/results/h200-cost-2026-12-01-sustained.json (bench/sustained_probe.py): one Llama-3.1-8B layer's GEMMs at
    # 8,192 tokens back to back for 8 s ran at 1,410-1,425 MHz at the 700 W limit: FP8 2.79 ms against calibrate's
    # 2.48 ms burst (0.888), bf16 5.42 against 5.08 ms (0.938); at 64 tokens (weight streaming) no slower.
    "gemm_sustained": {"bf16": 0.938, "fp8": 0.888},
    # Not measured (it needs TensorRT-LLM itself): TensorRT-LLM's per-request work each iteration that the GPU does
    # not hide (sampler, request bookkeeping in its PyTorch backend). Fitted to ONE published table, v1.0's
    # Llama-3.1-8B FP8 on H200 (kvtop/published 0.98-1.07 over its rows at 7 us, 1.00-1.20 at 0), and checked on
    # every other row (H100, GH200, 70B at TP1 and TP2, v0.21): bench/JOURNAL.md "Cost model".
    "request_step_us": 7.0,
}
_HBM_READ_DERATE = _H200_COST["hbm_read_GBps"] / 4800.0  # 0.937 of the datasheet


def _hopper_cost(hbm_datasheet_GBps: float) -> dict[str, Any]:
    read = round(hbm_datasheet_GBps * _HBM_READ_DERATE, 1)
    scale = read / _H200_COST["hbm_read_GBps"]
    return {**_H200_COST, "hbm_read_GBps": read,
            "attention_decode_GBps": [[b, round(r * scale, 1)] for b, r in _H200_COST["attention_decode_GBps"]]}


# Sustained bf16 GEMM rate: one Llama-3.1-8B layer's GEMMs at 16,384 tokens, 2026-12-01 (the rate the GEMM
# corrections above are relative to). The 2026-11-29 anchor's 791 was a short burst on a cool GPU; sustained
# batches ran at 686 on the 11-29 calibration and 679 here.
_H200_SUSTAINED_BF16_TFLOPS = 678.8

_H200 = GpuProfile(
    name="H200",
    memory_bytes=143771 * _MIB,  # 150,754,820,096 bytes: NVML total of an H200 (141 GB HBM3e part)
    hbm_GBps=round(_H200_HBM_GBPS, 1),
    bf16_tflops=_H200_SUSTAINED_BF16_TFLOPS,
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
    **_H200_COST,
)

_H100 = GpuProfile(
    name="H100",
    memory_bytes=81559 * _MIB,  # 85,520,809,984 bytes: NVML total of an H100 80GB HBM3 (SXM)
    hbm_GBps=round(3350.0 * _HBM_DERATE, 1),  # 3.35 TB/s datasheet x 0.885 = 2,966
    bf16_tflops=_H200_SUSTAINED_BF16_TFLOPS,  # same die and clocks as the H200
    h2d_GBps=55.28,  # PCIe Gen5 x16, like the H200: its measured link
    d2h_GBps=55.22,
    link_name="pcie5",
    source="derived: H100 SXM datasheet (80 GB HBM3 3.35 TB/s) x the H200's measured/datasheet HBM ratios "
           "(copy 0.885, read 0.937), the H200's measured GEMM rates (same die); PCIe Gen5 x16 link as measured on "
           "the H200; "
           "memory: NVML total 81,559 MiB; FP8, attention, step and copy-overlap rates the H200's (same die)",
    **_hopper_cost(3350.0),
)

_GH200 = GpuProfile(
    name="GH200",
    memory_bytes=97871 * _MIB,  # 102,625,181,696 bytes: NVML total of the 96 GB HBM3 GH200
    hbm_GBps=round(4000.0 * _HBM_DERATE, 1),  # 4.0 TB/s datasheet (96 GB HBM3 variant) x 0.885 = 3,542
    bf16_tflops=_H200_SUSTAINED_BF16_TFLOPS,  # same H100 die
    h2d_GBps=LINKS["c2c"],  # 346 GB/s measured host->GPU by one user; 450 in theory
    d2h_GBps=LINKS["c2c"],  # not measured: assumed equal to host->GPU
    link_name="c2c",
    source="derived: GH200 96GB HBM3 (the 144GB HBM3e variant differs) datasheet 4.0 TB/s x the H200's "
           "HBM ratios (copy 0.885, read 0.937), the H200's measured GEMM rates; NVLink-C2C 346 GB/s host->GPU as "
           "one user measured (450 in theory), GPU->host assumed equal; memory: NVML total 97,871 MiB; FP8, "
           "attention, step and copy-overlap rates the H200's (same die)",
    **_hopper_cost(4000.0),
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
    near = did_you_mean(text, known_gpu_names(), fold=str.lower)
    raise ValueError(f"unknown GPU {text!r}{near}; known GPUs: {', '.join(known_gpu_names())}, "
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
    # The cost model's rates: as written, else derived from the raw measurements (profiles from before they were
    # fields), else the H200's (GpuProfile's None).
    derived = cost_rates_from_measured(measured)
    if "gemm_correction" not in data and "bf16_tflops" in derived:
        kwargs["bf16_tflops"] = derived["bf16_tflops"]  # the corrections are relative to this peak
    for key in COST_FIELDS:
        value = data.get(key, derived.get(key))
        if value is not None:
            kwargs[key] = value
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
