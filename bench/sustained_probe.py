"""Sustained rates: one layer's GEMMs (bf16, FP8) and decode attention run back to back for seconds, as a busy
engine runs them, against the short bursts `kvtop calibrate` times. A GPU under continuous load draws more power
and may lower its clocks; the cost model's rates should be the sustained ones.

    python bench/sustained_probe.py --out sustained.json      # on the GPU machine, about a minute
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvtop import calibrate as cal  # noqa: E402
from kvtop.engines.models import resolve_model  # noqa: E402


def clocks() -> str:
    try:
        return subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem,power.draw,temperature.gpu",
                               "--format=csv,noheader"], capture_output=True, text=True, timeout=10).stdout.strip()
    except Exception as exc:  # no nvidia-smi: the rates still stand
        return f"unavailable: {exc}"


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="sustained.json")
    ap.add_argument("--seconds", type=float, default=8.0)
    a = ap.parse_args()
    torch = cal._load_torch()
    dev = torch.device("cuda", 0)
    model = resolve_model("meta-llama/Llama-3.1-8B-Instruct")
    shapes = cal.layer_gemm_shapes(model)
    out: dict[str, Any] = {"gpu": torch.cuda.get_device_name(dev), "torch": torch.__version__, "runs": []}
    bf16 = torch.bfloat16
    for label, fp8, fast, m in (("fp8fast", True, True, 8192), ("bf16", False, False, 8192),
                                ("fp8fast", True, True, 512), ("fp8fast", True, True, 64)):
        mp = m
        ops: list[Any] = []
        for k, n in shapes:
            x = torch.randn(mp, k, device=dev, dtype=bf16)
            w = torch.randn(n, k, device=dev, dtype=bf16) * 0.02
            if fp8:
                x8, w8 = x.to(torch.float8_e4m3fn), w.to(torch.float8_e4m3fn).t()
                one = torch.ones((), device=dev, dtype=torch.float32)
                ops.append(lambda x8=x8, w8=w8, one=one, fast=fast: torch._scaled_mm(x8, w8, one, one, out_dtype=bf16,
                                                                            use_fast_accum=fast))
            else:
                wt = w.t()
                ops.append(lambda x=x, wt=wt: x @ wt)
        flops = sum(2.0 * mp * k * n for k, n in shapes)
        per_window: list[list[float]] = []
        t_end = time.perf_counter() + a.seconds
        window_reps = max(4, int(0.25 / max(flops / 1.2e15, 2e-5)))
        while time.perf_counter() < t_end:
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(window_reps):
                for op in ops:
                    op()
            torch.cuda.synchronize()
            dt = (time.perf_counter() - t0) / window_reps
            per_window.append([round(time.perf_counter() - (t_end - a.seconds), 3), dt])
        first, last = per_window[0][1], per_window[-1][1]
        tail = sorted(t for _, t in per_window[len(per_window) // 2:])
        median_tail = tail[len(tail) // 2]
        row = {"kind": label, "tokens": m, "first_window_s": first, "last_window_s": last,
               "median_second_half_s": median_tail, "tflops_first": flops / first / 1e12,
               "tflops_sustained": flops / median_tail / 1e12, "windows": per_window, "clocks_after": clocks()}
        out["runs"].append(row)
        print(label, m, f"first {row['tflops_first']:.0f} TFLOP/s, sustained {row['tflops_sustained']:.0f}",
              row["clocks_after"], flush=True)
        del ops
        torch.cuda.empty_cache()
    # decode attention, sustained
    F = torch.nn.functional
    q = torch.randn(128, 32, 1, 128, device=dev, dtype=bf16)
    k = torch.randn(128, 8, 4096, 128, device=dev, dtype=bf16)
    v = torch.randn(128, 8, 4096, 128, device=dev, dtype=bf16)
    nbytes = 2 * 128 * 8 * 4096 * 128 * 2
    rates = []
    t_end = time.perf_counter() + a.seconds / 2
    while time.perf_counter() < t_end:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(100):
            F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
        torch.cuda.synchronize()
        rates.append(nbytes * 100 / (time.perf_counter() - t0) / 1e9)
    out["attention_decode_GBps_first"] = rates[0]
    out["attention_decode_GBps_sustained"] = sorted(rates[len(rates) // 2:])[len(rates[len(rates) // 2:]) // 2]
    print("attention", out["attention_decode_GBps_first"], out["attention_decode_GBps_sustained"], clocks())
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
