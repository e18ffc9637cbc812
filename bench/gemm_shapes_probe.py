"""GEMM curves of other models' layers (bf16 and FP8), to check that calibrate's efficiency curves transfer.

    python bench/gemm_shapes_probe.py --out gemm_shapes.json     # on the GPU machine

For Llama-3.1-70B at tensor parallelism 1 and 2 (one GPU's shard) and Llama-3.1-8B: one layer's four GEMMs at the
token counts of kvtop.calibrate.GEMM_TOKENS, timed the way calibrate times them.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kvtop import calibrate as cal  # noqa: E402
from kvtop.engines.models import resolve_model  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="gemm_shapes.json")
    a = ap.parse_args()
    torch = cal._load_torch()
    dev = torch.device("cuda", 0)
    timer = cal._Timer(torch)
    out: dict[str, object] = {}
    for name, tp in (("meta-llama/Llama-3.1-70B-Instruct", 1), ("meta-llama/Llama-3.1-70B-Instruct", 2),
                     ("meta-llama/Llama-3.1-8B-Instruct", 1)):
        shapes = cal.layer_gemm_shapes(resolve_model(name), tp)
        for label, fp8, fast in (("bf16", False, False), ("fp8", True, False), ("fp8fast", True, True)):
            if fp8 and not cal._fp8_usable(torch, dev):
                continue
            cal._gemm_layer_s(torch, timer, shapes, 8192, fp8, dev, fast)
            rows = [[m, cal._gemm_layer_s(torch, timer, shapes, m, fp8, dev, fast)] for m in cal.GEMM_TOKENS]
            out[f"{name}|tp{tp}|{label}"] = {"shapes_KN": shapes, "tokens_s": rows}
            print(name, tp, label, [f"{m}:{t * 1e6:.0f}" for m, t in rows], flush=True)
        torch.cuda.empty_cache()
    Path(a.out).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
