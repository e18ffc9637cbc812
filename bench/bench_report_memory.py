"""Peak memory of ``kvtop report`` on a large recording, against ``kvtop replay --headless`` of the same file
(issue 26: 803 MB for a 2 GB recording, where replay took 34 MB).

    python bench/bench_report_memory.py [--mb 200] [--against DIR] [--keep FILE]

Records a 10 s simulated run at full speed (``kvtop --headless --speed 0 --record``), tiles it to ``--mb`` MB (each
copy's times shifted past the one before, its meta line left out, so it stays one run of one source), then runs
``/usr/bin/time -v`` on ``kvtop report FILE -o DIR`` (this tree, and the tree in ``--against DIR``, e.g.
``git archive 3465b90 kvtop | tar -x -C DIR``) and on ``kvtop replay FILE --headless --speed 0``; prints the
maximum resident set size and the wall time of each.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _shift(obj: dict, dt: float) -> dict:
    obj["time"] = obj["time"] + dt
    data = obj.get("data")
    if obj.get("kind") == "kv_events" and isinstance(data, dict):
        data["times"] = [t + dt for t in data["times"]]
    return obj


def make_recording(path: Path, mb: int) -> None:
    base = path.with_suffix(".base.jsonl")
    subprocess.run([sys.executable, "-m", "kvtop", "--headless", "--duration", "10", "--speed", "0", "--record",
                    str(base)], check=False, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    lines = [json.loads(line) for line in base.read_bytes().splitlines() if line.strip()]
    times = [o["time"] for o in lines]
    span = max(times) - min(times) + 1.0
    with path.open("w") as out:
        k = 0
        while out.tell() < mb * 10**6:
            for o in lines:
                if k and o.get("kind") == "meta":
                    continue
                out.write(json.dumps(_shift(dict(o, data=json.loads(json.dumps(o.get("data")))), k * span),
                                     separators=(",", ":")) + "\n")
            k += 1
    base.unlink()


def peak(cmd: list[str], pythonpath: str) -> tuple[float, float]:
    proc = subprocess.run(["/usr/bin/time", "-v", *cmd], capture_output=True, text=True, cwd=pythonpath,
                          env={**os.environ, "PYTHONPATH": pythonpath})
    rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr)
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (?:(\d+):)?(\d+):([\d.]+)", proc.stderr)
    if rss is None or wall is None:
        raise SystemExit(f"{cmd}: {proc.stderr[-2000:]}")
    secs = int(wall.group(1) or 0) * 3600 + int(wall.group(2)) * 60 + float(wall.group(3))
    return int(rss.group(1)) / 1024, secs


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mb", type=int, default=200)
    ap.add_argument("--against", help="a directory holding another kvtop package")
    ap.add_argument("--keep", help="the tiled recording: made here if missing, reused if present")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        rec = Path(a.keep) if a.keep else Path(tmp) / "big.jsonl"
        if not rec.exists():
            make_recording(rec, a.mb)
        lines = sum(1 for _ in rec.open("rb"))
        print(f"recording: {rec.stat().st_size / 1e6:,.0f} MB, {lines:,} lines")
        trees = [("this tree", str(ROOT))] + ([("--against", a.against)] if a.against else [])
        for name, tree in trees:
            mb, s = peak([sys.executable, "-m", "kvtop", "report", str(rec), "-o", f"{tmp}/out"], tree)
            print(f"kvtop report ({name}): peak RSS {mb:,.0f} MB, {s:.1f} s")
        mb, s = peak([sys.executable, "-m", "kvtop", "replay", str(rec), "--headless", "--speed", "0"], str(ROOT))
        print(f"kvtop replay (this tree): peak RSS {mb:,.0f} MB, {s:.1f} s")


if __name__ == "__main__":
    main()
