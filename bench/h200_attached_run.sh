#!/bin/bash
# One device run for issue 15 (an attached kvtop beside nvitop), into $OUT. From the repository root, with the
# wheels carried in .whl (textual, rich and theirs, orjson, msgspec, nvitop: the lent machine has no index) and a
# baseline tree in .base (`git archive REV kvtop themes | tar -x -C .base`: with its themes, or its screen is not
# the same one, ~54M instructions less at start-up and no theme restyle, and the comparison favours it):
#     OUT=/tmp/out bash bench/h200_attached_run.sh [rounds]
# Steps: install the wheels into /tmp/site, byte-compile kvtop, the baseline and the wheels (as an install has
# them: an uncompiled start-up costs ~0.5 s more), make the busy full-scale recording, then in one run
#   1. bench_attached: this tree and the baseline alternated, nvitop between them, 30 s each, 120x40 pty;
#   2. bench_ui --pty: the dashboard's own share against the replay's;
#   3. bench_ui_refresh: a refresh headless, this tree then the baseline.
# Nothing heavy (torch) runs before it: a GPU job just before inflated one baseline by 20%.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/kvtop-attached-out}
ROUNDS=${1:-3}
mkdir -p "$OUT" /tmp/kvtop-bench
[ -d .base/kvtop ] && [ -d .base/themes ] || { echo "h200_attached_run: .base needs kvtop/ and themes/" >&2; exit 2; }
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:$PWD
python3 -m compileall -q kvtop .base /tmp/site
python3 - <<'EOF'
import platform, os, textual, importlib.metadata as m
print(platform.python_version(), platform.machine(), os.cpu_count(), "cores; load", os.getloadavg(),
      "textual", m.version("textual"), "nvitop", m.version("nvitop"))
EOF
REC=/tmp/kvtop-bench/busy-scale1-40s.jsonl
[ -s "$REC" ] || python3 tests/data/make_busy_recording.py --scale 1 --seconds 40 --out "$REC"
python3 bench/bench_attached.py --baseline .base --rounds "$ROUNDS" --recording "$REC" --out "$OUT/attached.json"
python3 bench/bench_ui.py --pty --seconds 30 --recording "$REC" --json > "$OUT/ui-share.json"
cat "$OUT/ui-share.json"
python3 bench/bench_ui_refresh.py --rounds 2 --recording "$REC" --json > "$OUT/refresh-this.json"
python3 bench/bench_ui_refresh.py --rounds 2 --recording "$REC" --tree .base --json > "$OUT/refresh-base.json"
tail -c 600 "$OUT/refresh-this.json"; echo; tail -c 600 "$OUT/refresh-base.json"; echo
ls -la "$OUT"
