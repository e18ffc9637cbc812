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
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[3]
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
# With the capacity scheduler's beneficialToSkip (was 2784, 3392, 4325, 7760 reused without it); at 32 and 64 GB
# 6712 -> 6665 and 10080 -> 10064 reused with the micro-batch scheduler's token budget (docs/trtllm-kv.md 9.4).
SWEEP = [
    (0, 0, 5104, 222896, 0),
    (8_000_000_000, 1695, 5712, 222288, 608),
    (32_000_000_000, 6781, 6665, 221335, 1561),
    (64_000_000_000, 13563, 10064, 217936, 4960),
]


@pytest.mark.slow
def test_readme_sweep_command_on_the_shipped_trace(tmp_path: Path) -> None:
    args = readme_sweep_command()
    done = run_kvtop(args, tmp_path)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    rows = [line for line in done.stdout.splitlines() if line.startswith("host")]
    assert len(rows) == 4, done.stdout
    for row, (_, blocks, reused, missed, onboarded) in zip(rows, SWEEP):
        # counts carry thousands separators (1,695)
        m = re.search(r"\(\s*(\d+) blocks\): hit rate\s+([\d.]+)%\s+reused\s+(\d+)\s+missed\s+(\d+)\s+offloaded\s+"
                      r"(\d+)\s+onboarded\s+(\d+)", row.replace(",", ""))
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


# ---------------------------------------------------------------------------------------------- hit-rate-only sweeps

def _slice() -> list[Any]:
    from kvtop.workload.trace import read_trace

    return list(read_trace(SLICE))


@pytest.mark.slow
@pytest.mark.parametrize("gpu_blocks", [6000, 25054])
def test_one_pass_curve_matches_full_block_manager_replays(gpu_blocks: int) -> None:
    """The curve over 7 host sizes from one replay at the largest, against a full block-manager replay at each
    size: within 1 point (the issue's bar); on this trace every size comes out equal to the replay's count."""
    from kvtop.engines.sim.sweep import host_curve, replay_hit_rates

    requests = _slice()
    sizes = [0, 1000, 2000, 4000, 8000, 16000, 30000]
    curve = host_curve(requests, gpu_blocks, sizes, 32)
    assert [c["secondary_blocks"] for c in curve] == sizes
    worst = 0.0
    for point in curve:
        full = replay_hit_rates(requests, gpu_blocks, point["secondary_blocks"], 32)
        assert point["reused_blocks"] + point["missed_blocks"] == full["reused_blocks"] + full["missed_blocks"]
        worst = max(worst, abs(point["cache_hit_rate"] - full["cache_hit_rate"]))
        assert abs(point["cache_hit_rate"] - full["cache_hit_rate"]) < 0.01, (point, full)
    assert curve[-1]["one_pass"] is False and curve[-1]["reused_blocks"] == full["reused_blocks"]  # the replay
    assert worst < 0.0005  # what it is today: 0 on all 14 points
    rates = [c["cache_hit_rate"] for c in curve]
    assert rates == sorted(rates) and rates[-1] > rates[0] + 0.03  # the host tier matters in these workloads


def _random_trace(seed: int) -> list[Any]:
    """Requests over a few shared prefixes of 512-token trace blocks, random lengths: more reuse than Mooncake."""
    import random

    from kvtop.workload.trace import TraceRequest

    rng = random.Random(seed)
    prefixes = [[rng.randrange(1000) for _ in range(rng.randint(1, 6))] for _ in range(12)]
    out = []
    for i in range(300):
        ids = list(rng.choice(prefixes)) + [10_000 + i * 10 + k for k in range(rng.randint(0, 3))]
        length = len(ids) * 512 - rng.randrange(512)
        out.append(TraceRequest(i, float(i), length, rng.randint(1, 40), tuple(ids)))
    return out


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_one_pass_curve_on_random_prefix_workloads(seed: int) -> None:
    from kvtop.engines.sim.sweep import host_curve, replay_hit_rates

    requests = _random_trace(seed)
    sizes = [0, 16, 48, 96, 200, 400]
    for point in host_curve(requests, 160, sizes, 32):
        full = replay_hit_rates(requests, 160, point["secondary_blocks"], 32)
        assert abs(point["cache_hit_rate"] - full["cache_hit_rate"]) < 0.01, (seed, point, full)


def test_belady_on_a_hand_checked_trace() -> None:
    """Requests [1], [2], [1], [2] with room for one 512-token block: MIN keeps block 1 (used again at request 2)
    and does not insert block 2 (used later than 1): 1 hit in 4 lookups. LRU keeps the last one: 0 hits."""
    from kvtop.engines.sim.sweep import belady_curve
    from kvtop.workload.trace import TraceRequest

    requests = [TraceRequest(i, float(i), 512, 1, (h,)) for i, h in enumerate([1, 2, 1, 2])]
    assert belady_curve(requests, [0, 1, 2], 512) == [0.0, 0.25, 0.5]
    assert belady_curve(requests, [1], 32) == [0.0]  # 16 KV blocks of 32 tokens each: one KV block is no room
    assert belady_curve(requests, [16], 32) == [0.25]


def test_belady_bounds_the_simulated_policy() -> None:
    from kvtop.engines.sim.sweep import belady_curve, host_curve

    requests = _slice()
    sizes = [0, 4000, 16000, 30000]
    curve = host_curve(requests, 6000, sizes, 32)
    optimum = belady_curve(requests, [6000 + h for h in sizes], 32)
    assert optimum == sorted(optimum)
    assert all(o >= c["cache_hit_rate"] + 0.05 for o, c in zip(optimum, curve))
    assert round(100 * optimum[0], 2) == 11.46 and round(100 * curve[0]["cache_hit_rate"], 2) == 1.02


@pytest.mark.slow
def test_sim_one_pass_belady_json(tmp_path: Path) -> None:
    done = run_kvtop(["sim", "--trace", str(SLICE), "--host-cache", "0:64GB:16", "--one-pass", "--belady", "--json",
                      "--gpu-blocks", "6000", "--plot", str(tmp_path / "sweep.png")], tmp_path)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout)
    runs = out["runs"]
    assert out["mode"] == "one-pass" and len(runs) == 16
    assert runs[0]["host_cache_bytes"] == 0 and runs[-1]["host_cache_bytes"] == 64_000_000_000
    assert all(r["belady_hit_rate"] >= r["cache_hit_rate"] for r in runs)
    assert [r["one_pass"] for r in runs] == [True] * 15 + [False]
    assert (tmp_path / "sweep.png").stat().st_size > 10_000
    # the same sizes as full replays without timing: the same figures
    done = run_kvtop(["sim", "--trace", str(SLICE), "--host-cache", "0,32GB,64GB", "--hit-rate-only", "--json",
                      "--gpu-blocks", "6000"], tmp_path)
    full = {r["host_cache_bytes"]: r for r in json.loads(done.stdout)["runs"]}
    for r in runs:
        if r["host_cache_bytes"] in full:
            assert r["reused_blocks"] == full[r["host_cache_bytes"]]["reused_blocks"]


@pytest.mark.slow
def test_sim_host_cache_range_rejects_bad_input(tmp_path: Path) -> None:
    for bad, needle in (("0:64GB:x", "whole N"), ("0:64GB:1", "N >= 2"), ("64GB:0:4", "STOP >= START")):
        done = run_kvtop(["sim", "--trace", str(SLICE), "--host-cache", bad, "--one-pass"], tmp_path)
        assert done.returncode == 2 and needle in done.stderr and len(done.stderr.strip().splitlines()) == 1, bad
    # a hash id the trace format allows (< 2^64) whose token ids do not fit in 64 bits: one line naming the line
    big = tmp_path / "big.jsonl"
    big.write_text('{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1, 18446744073709551615]}\n')
    for mode in ("--one-pass", "--hit-rate-only"):
        done = run_kvtop(["sim", "--trace", str(big), "--host-cache", "0,8GB", mode], tmp_path)
        assert done.returncode == 2 and "64 bits" in done.stderr and len(done.stderr.strip().splitlines()) == 1, (
            mode, done.stderr)
    done = run_kvtop(["sim", "--trace", str(big), "--host-cache", "0,8GB", "--one-pass"], tmp_path)
    assert "trace line 1: hash id 18446744073709551615" in done.stderr
