"""``kvtop sim --trace``: the README's sweep command on the shipped trace slice (tests/data/mooncake_slice.jsonl,
see its NOTICE), as a user runs it."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SLICE = ROOT / "tests" / "data" / "mooncake_slice.jsonl"


def readme_sweep_command() -> list[str]:
    """The README's ``kvtop sim --trace ... --host-cache 0,8GB,32GB,64GB`` line (run from the repository root)."""
    for line in (ROOT / "README.md").read_text().splitlines():
        if line.startswith("kvtop sim --trace") and "--host-cache 0,8GB,32GB,64GB" in line:
            args = shlex.split(line.split("#", 1)[0])[1:]
            assert ROOT / args[args.index("--trace") + 1] == SLICE, "the README's sweep must use the shipped trace"
            return args
    raise AssertionError("README.md has no `kvtop sim --trace ... --host-cache 0,8GB,32GB,64GB` line")


def run_kvtop(args: list[str], tmp: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVTOP_")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    env["XDG_CONFIG_HOME"] = str(tmp / "xdg")
    return subprocess.run([sys.executable, "-m", "kvtop", *args], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)


# (host bytes, host blocks, reused, missed, onboarded) per host size, Qwen3-8B on H200 (25,054 GPU blocks of 32
# tokens). Before the iterative freeChildren the 8 GB run died with RecursionError (exit 1, traceback).
SWEEP = [
    (0, 0, 2784, 225216, 0),
    (8_000_000_000, 1695, 3392, 224608, 608),
    (32_000_000_000, 6781, 4325, 223675, 1541),
    (64_000_000_000, 13563, 7760, 220240, 4976),
]


def test_readme_sweep_command_on_the_shipped_trace(tmp_path: Path) -> None:
    args = readme_sweep_command()
    done = run_kvtop(args, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("host")]
    assert len(rows) == 4, done.stdout
    for row, (_, blocks, reused, missed, onboarded) in zip(rows, SWEEP):
        m = re.search(r"\(\s*(\d+) blocks\): hit rate\s+([\d.]+)%\s+reused\s+(\d+)\s+missed\s+(\d+)\s+offloaded\s+"
                      r"(\d+)\s+onboarded\s+(\d+)", row)
        assert m is not None, row
        assert [int(m[1]), int(m[3]), int(m[4]), int(m[6])] == [blocks, reused, missed, onboarded]
        assert float(m[2]) == round(100 * reused / (reused + missed), 1)
    # the same sweep as JSON: every run complete, the hit rate growing with the host tier
    done = run_kvtop([*args, "--json"], tmp_path)
    assert done.returncode == 0, done.stderr
    runs = json.loads(done.stdout)["runs"]
    assert [(r["host_cache_bytes"], r["secondary_blocks"], r["reused_blocks"], r["missed_blocks"],
             r["onboarded_blocks"]) for r in runs] == SWEEP
    assert all(r["requests"] == 499 and r["failed"] == 0 for r in runs)
