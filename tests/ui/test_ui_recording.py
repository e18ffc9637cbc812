"""The UI's fixture recording: deterministic to write, and busy enough to show every tier movement."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from recordings import BUSY_RECORDING, REPO

from kvtop.records import RecordError, read_jsonl
from kvtop.tiers import TierModel

SCRIPT = REPO / "tests" / "data" / "make_busy_recording.py"


def test_the_script_writes_the_same_bytes_twice(tmp_path: Path) -> None:
    outs = []
    for name in ("a.jsonl", "b.jsonl"):
        out = tmp_path / name
        subprocess.run([sys.executable, str(SCRIPT), "--seconds", "1.5", "--out", str(out)], check=True,
                       capture_output=True, timeout=120)
        outs.append(out.read_bytes())
    assert outs[0] == outs[1] and len(outs[0]) > 10_000


def test_the_committed_recording_shows_every_movement() -> None:
    model = TierModel()
    bad = 0
    for rec in read_jsonl(BUSY_RECORDING):
        if isinstance(rec, RecordError):
            bad += 1
            continue
        model.apply(rec)
    assert bad == 0 and model.bad_records == 0
    assert (model.gpu.capacity_blocks, model.host.capacity_blocks) == (256, 227)
    m = model.moves
    assert m.offloaded_blocks > 0 and m.onboarded_blocks > 0
    assert m.evicted_gpu_blocks > 0 and m.evicted_host_blocks > 0
    assert model.hit_rate.host and model.hit_rate.host > 0
    assert model.requests.completed > 100
    assert set(model.cached_by_priority["gpu"]) >= {20, 35, 80}
