#!/bin/bash
# One device run for the cost model (issue 12 part 2): calibrate, TTFT probes, GEMM shape curves, into $OUT.
# From the repository root (or a copy of it):  OUT=/tmp/out bash bench/h200_cost_run.sh
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/kvtop-cost-out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv
python3 -c 'import torch; print(torch.__version__, torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))'
python3 -m kvtop.calibrate --model meta-llama/Llama-3.1-8B-Instruct --out "$OUT/h200-calibrated.json" 2>&1 | tee "$OUT/calibrate.log"
python3 bench/ttft_probe.py --model Qwen/Qwen3-8B --out "$OUT/ttft-qwen3-8b.json" 2>&1 | tee "$OUT/ttft.log"
python3 bench/ttft_probe.py --model meta-llama/Llama-3.1-8B-Instruct --out "$OUT/ttft-llama31-8b.json" 2>&1 | tee -a "$OUT/ttft.log"
python3 bench/gemm_shapes_probe.py --out "$OUT/gemm-shapes.json" 2>&1 | tee "$OUT/gemm.log"
ls -la "$OUT"
