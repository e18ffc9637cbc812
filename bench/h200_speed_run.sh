#!/bin/bash
# Issue 22's two speed figures on the H200 host in one device run, this tree against a baseline tree:
#   1. the timed replay (bench/bench_sim_replay.py: digests of both trees first, then the 64 GB point's wall and CPU,
#      trees alternated), pinned to one core (taskset -c 2);
#   2. the driven path over the first 3,000 requests (bench/bench_driven_trace.py: `kvtop sim --trace` and the
#      headless `kvtop --engine sim --scenario trace --speed 0` run, for each tree), on cores 4-5 (the engine and
#      the fold are two threads).
# What the command reads must be in the checkout, in a folder git ignores, named in the run's carry:
#   mkdir -p .venv-simcarry/base && git archive BASE kvtop themes | tar -x -C .venv-simcarry/base
#   cp conversation_trace.jsonl .venv-simcarry/      # Mooncake FAST'25 traces/conversation_trace.jsonl
#   head -3000 ../shared/traces/mooncake_synthetic_trace.jsonl > .venv-simcarry/m3000.jsonl
# and the wheels in .whl (the lent machine has no index). Run: OUT=... bash bench/h200_speed_run.sh
# (carry [".venv-simcarry", ".whl"]).
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/kvtop-speed-out}
CARRY=${CARRY:-.venv-simcarry}
REPEAT=${REPEAT:-2}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site
python3 -m compileall -q kvtop "$CARRY/base" /tmp/site
python3 -V; lscpu | grep -i "model name"; uptime
taskset -c 2 python3 bench/bench_sim_replay.py --baseline "$CARRY/base" --trace "$CARRY/conversation_trace.jsonl" \
    --repeat "$REPEAT" 2>&1 | tee "$OUT/sim_replay.txt"
taskset -c 4,5 python3 bench/bench_driven_trace.py --trace "$CARRY/m3000.jsonl" --baseline "$CARRY/base" \
    --cap 300 2>&1 | tee "$OUT/driven.txt"
uptime
