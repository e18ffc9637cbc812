#!/bin/bash
# The timed trace replay of issue 22 ("Speed") on the H200 host: this tree against a baseline tree, both repeats,
# one command (bench/bench_sim_replay.py: digests first, then wall and CPU alternated; no callgrind there).
# The device receives the session's checkout, so what the command reads must be in it, in a folder git ignores,
# named in the run's carry (".venv-simcarry" matches .gitignore's ".venv*/"):
#   mkdir -p .venv-simcarry/base
#   git archive main kvtop themes | tar -x -C .venv-simcarry/base    # the baseline: main before the merge
#   (80ba13f until 2026-12-03 16:31 UTC; main at 2e8718e for lazy decode, bench/JOURNAL.md 18:55 UTC)
#   cp conversation_trace.jsonl .venv-simcarry/   # Mooncake FAST'25 traces/conversation_trace.jsonl (Apache 2.0)
# then run: bash bench/h200_sim_replay.sh   (carry [".venv-simcarry"]); pinned to one core (taskset -c 2).
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/kvtop-sim-replay-out}
CARRY=${CARRY:-.venv-simcarry}
mkdir -p "$OUT"
python3 -V; lscpu | grep -i "model name"; uptime
taskset -c 2 python3 bench/bench_sim_replay.py --baseline "$CARRY/base" --trace "$CARRY/conversation_trace.jsonl" \
    --repeat 2 2>&1 | tee "$OUT/sim_replay.txt"
