"""Recording size: bytes per second of a recorded run, written verbatim (kvtop before the compact token lists)
and compact (kvtop/compact.py, what the recorder writes now), from the same records in the same run.

    python bench/bench_recording.py [--duration 20] [--scenario multi-turn]

Records a default simulated run (`kvtop --headless --duration S --record FILE`, the dashboard's own defaults:
Qwen3-8B on an H200 profile, 32 GB host cache, multi-turn chats at concurrency 8, paced to the wall clock), then
writes its records both ways and prints MB/s for each, the share of each record kind, and checks that both
files fold to the same TierModel summary.
"""

from __future__ import annotations

import argparse
import collections
import json
import subprocess
import sys
import tempfile
from pathlib import Path

from kvtop.records import encode, read_jsonl
from kvtop.sinks.recorder import Recorder
from kvtop.tiers import TierModel


def fold(path: Path) -> dict[str, object]:
    model = TierModel()
    for rec in read_jsonl(path):
        model.apply(rec)  # type: ignore[arg-type]
    return model.summary()


def kinds(path: Path) -> dict[str, int]:
    out: collections.Counter[str] = collections.Counter()
    for line in path.read_bytes().splitlines():
        out[json.loads(line)["kind"]] += len(line) + 1
    return dict(out)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--duration", type=float, default=20.0)
    ap.add_argument("--scenario", default="multi-turn")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        live = Path(d) / "live.jsonl"
        subprocess.run([sys.executable, "-m", "kvtop", "--engine", "sim", "--headless", "--json", "--duration",
                        str(a.duration), "--scenario", a.scenario, "--record", str(live)], check=True,
                       stdout=subprocess.DEVNULL)
        records = [r for r in read_jsonl(live)]
        times = [r.time for r in records]  # type: ignore[union-attr]
        span = max(times) - min(times)
        verbatim, compact = Path(d) / "verbatim.jsonl", Path(d) / "compact.jsonl"
        with verbatim.open("w", encoding="utf-8") as fh:
            for r in records:
                fh.write(encode(r) + "\n")  # type: ignore[arg-type]
        with Recorder(compact, append=False) as rec:
            for r in records:
                rec.write(r)  # type: ignore[arg-type]
        same = fold(verbatim) == fold(compact)
        out = {"duration_s": round(span, 2), "records": len(records), "folds_identically": same}
        for name, path in (("verbatim", verbatim), ("compact", compact)):
            size = path.stat().st_size
            out[name] = {"bytes": size, "MB_per_s": round(size / span / 1e6, 3),
                         "by_kind_pct": {k: round(100 * v / size, 1) for k, v in sorted(kinds(path).items())}}
        out["ratio"] = round(out["verbatim"]["bytes"] / out["compact"]["bytes"], 2)  # type: ignore[index]
        print(json.dumps(out, indent=1))
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
