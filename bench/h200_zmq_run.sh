#!/bin/bash
# One device run for the ZMQ attach (issue 23 "Cost on a busy vLLM stream", issue 26 "ZMQ memory"), into $OUT.
# From the repository root, with the wheels carried in .whl (textual, rich and theirs, pyzmq, msgpack, psutil,
# orjson, msgspec, nvitop: the lent machine has no index) and a baseline tree in .venv-simcarry/base
# (`git archive REV kvtop themes | tar -x -C .venv-simcarry/base`):
#     OUT=/tmp/out bash bench/h200_zmq_run.sh [rounds]
#   1. bench_attached --zmq-rate 1000 --zmq-rate 10000: kvtop attach zmq:// in a 120x40 pty beside nvitop, 30 s each;
#   2. bench_zmq_flood at 10,000 events/s (headless: are the folded counts exact?) and at 250,000 events/s (peak RSS),
#      this tree, then the baseline.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/kvtop-zmq-out}
ROUNDS=${1:-2}
BASE=${BASE:-.venv-simcarry/base}
mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
export PATH=/tmp/site/bin:$PATH
python3 -m compileall -q kvtop "$BASE" /tmp/site
python3 -c 'import platform, os; print(platform.python_version(), os.cpu_count(), "cores; load", os.getloadavg())'
python3 bench/bench_attached.py --zmq-rate 1000 --zmq-rate 10000 --rounds "$ROUNDS" --baseline "$BASE" \
    --out "$OUT/attached-zmq.json"
python3 bench/bench_zmq_flood.py --events-per-s 10000 --seconds 20 --against "$BASE" | tee "$OUT/flood-10k.jsonl"
python3 bench/bench_zmq_flood.py --events-per-s 250000 --seconds 30 --against "$BASE" | tee "$OUT/flood-250k.jsonl"
