"""``kvtop sim``'s timed sweep says, per host size, whether the tier paid against the same trace without it
(``verdict = {"says", "net_s", "basis"}``), in the JSON and on the text rows: "pays" where the host's hits shorten
the engine's work, "costs" where offloading blocks that almost never come back lengthens it, "idle" where nothing
comes back, "none" without a tier; the 0 point is replayed where the sweep has none."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kvtop.commands.sim import sweep_verdict

REPO = Path(__file__).resolve().parents[2]


def _write(path: Path, requests: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in requests))
    return path


def _shared_prefixes(seed: int, count: int = 600) -> list[dict[str, Any]]:
    """40 shared prefixes of 1-6 trace blocks under a short tail each: much reuse, more than a small GPU keeps."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(1000) for _ in range(rng.randint(1, 6))] for _ in range(40)]
    out = []
    for i in range(count):
        ids = list(rng.choice(prefixes)) + [10_000 + i * 10 + k for k in range(rng.randint(0, 3))]
        out.append({"timestamp": i, "input_length": len(ids) * 512 - rng.randrange(512),
                    "output_length": rng.randint(1, 40), "hash_ids": ids})
    return out


def _little_reuse(seed: int, count: int = 800, repeat: float = 0.03) -> list[dict[str, Any]]:
    """Prompts of 4-16 trace blocks of their own, ``repeat`` of them an earlier prompt again: nearly every block
    evicted from the GPU is offloaded, and few are ever loaded back."""
    rng = random.Random(seed)
    out: list[dict[str, Any]] = []
    next_id = 100_000
    for i in range(count):
        if out and rng.random() < repeat:
            old = rng.choice(out[-200:])
            ids, length = old["hash_ids"], old["input_length"]
        else:
            n = rng.randint(4, 16)
            ids = list(range(next_id, next_id + n))
            next_id += n
            length = n * 512 - rng.randrange(512)
        out.append({"timestamp": i * 50, "input_length": length, "output_length": rng.randint(8, 64),
                    "hash_ids": ids})
    return out


def _sim(trace: Path, *args: str, json_out: bool = True) -> Any:
    cmd = [sys.executable, "-m", "kvtop", "sim", "--trace", str(trace), "--jobs", "1", *args]
    out = subprocess.run(cmd + (["--json"] if json_out else []), cwd=REPO, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout) if json_out else out.stdout


def _by_host(runs: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {r["secondary_blocks"]: r for r in runs}


def test_a_tier_that_offloads_what_never_comes_back_costs(tmp_path: Path) -> None:
    """A held-out trace (seed 12; the workload was tuned on seed 7, and seed 11 repeats only prompts still on the
    GPU): 3% of prompts repeat, a 64 GB host takes every evicted block and gives back ~0.5% of them. The run with
    the tier is longer (108.1 against 100.2 s busy), and the verdict says so, by that many seconds; the sweep has no
    0 point, so one is replayed first and says "none"."""
    trace = _write(tmp_path / "little_reuse.jsonl", _little_reuse(12))
    out = _sim(trace, "--host-cache", "64GB")
    assert len(out["runs"]) == 1  # the sizes asked for; the 0 point replayed for the verdicts is the baseline
    none, tier = out["baseline"], out["runs"][0]
    assert none["secondary_blocks"] == 0
    assert none["verdict"] == {"says": "none", "net_s": None, "basis": "no host tier"}
    assert tier["onboarded_blocks"] > 0 and tier["offloaded_blocks"] > 50 * tier["onboarded_blocks"]
    assert tier["simulated_seconds"] > none["simulated_seconds"] + 1.0  # the truth: the tier lengthened the run
    v = tier["verdict"]
    assert v["says"] == "costs"
    assert v["net_s"] == none["busy_seconds"] - tier["busy_seconds"] < -1.0
    assert "without the host tier" in v["basis"]


@pytest.mark.slow
def test_a_tier_whose_hits_save_prefill_pays_and_a_small_one_costs(tmp_path: Path) -> None:
    """Shared prefixes, a 400-block GPU: a 4,000-block host serves 19k+ blocks back and the run is shorter
    (pays); a 400-block host serves 3k back but offloads 40k (costs). Text rows say the same."""
    trace = _write(tmp_path / "shared.jsonl", _shared_prefixes(5))
    runs = _by_host(_sim(trace, "--gpu-blocks", "400", "--host-blocks", "4000,400,0")["runs"])
    big, small, none = runs[4000], runs[400], runs[0]
    assert big["simulated_seconds"] < none["simulated_seconds"] - 1.0 < small["simulated_seconds"]
    assert big["verdict"]["says"] == "pays" and big["verdict"]["net_s"] > 1.0
    assert small["verdict"]["says"] == "costs" and small["verdict"]["net_s"] < 0
    assert none["verdict"]["says"] == "none"
    text = _sim(trace, "--gpu-blocks", "400", "--host-blocks", "4000,400,0", json_out=False)
    rows = [line for line in text.splitlines() if line.startswith("host")]
    assert f"tier: pays {big['verdict']['net_s']:+.1f} s" in rows[0]  # the sweep's order; 0 replayed first
    assert f"tier: costs {small['verdict']['net_s']:+.1f} s" in rows[1]
    assert rows[2].endswith("tier: none (the baseline of the verdicts)")


def test_a_tier_nothing_comes_back_from_is_idle(tmp_path: Path) -> None:
    trace = _write(tmp_path / "unique.jsonl", _little_reuse(3, count=300, repeat=0.0))
    none, tier = _sim(trace, "--host-cache", "0,32GB")["runs"]
    assert tier["onboarded_blocks"] == 0 and tier["offloaded_blocks"] > 0
    assert tier["verdict"]["says"] == "idle" and tier["verdict"]["net_s"] <= 0
    assert none["verdict"]["says"] == "none"


def test_sweep_verdict_rules() -> None:
    base = {"secondary_blocks": 0, "busy_seconds": 10.0, "onboarded_blocks": 0}
    assert sweep_verdict(base, base)["says"] == "none"
    run = {"secondary_blocks": 5, "busy_seconds": 9.5, "onboarded_blocks": 3}
    assert sweep_verdict(run, base) == {"says": "pays", "net_s": 0.5, "basis": sweep_verdict(run, base)["basis"]}
    assert sweep_verdict({**run, "busy_seconds": 10.25}, base)["net_s"] == -0.25
    assert sweep_verdict({**run, "busy_seconds": 10.25}, base)["says"] == "costs"
    assert sweep_verdict({**run, "onboarded_blocks": 0}, base)["says"] == "idle"
    assert sweep_verdict(run, None)["says"] is None
