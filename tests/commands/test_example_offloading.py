"""examples/kv_cache_offloading.py on the simulator: TensorRT-LLM's offloading example (A, B, A, B; batch size 1;
256-token GPU cache of 16-token blocks) reuses nothing without a host cache and reuses A and B with one."""

from __future__ import annotations

import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "kv_cache_offloading.py"
PROMPT_BLOCKS = math.ceil(230 / 16)  # the example's prompts: 230 tokens in 16-token blocks


def run_example(*args: str) -> dict[str, float]:
    proc = subprocess.run([sys.executable, str(EXAMPLE), "--engine", "sim", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    out = proc.stdout
    reused = re.search(r"^reused blocks: (\d+)$", out, re.MULTILINE)
    hit = re.search(r"^cache hit rate: ([0-9.eE+-]+)$", out, re.MULTILINE)
    assert reused and hit, out
    progress = re.findall(r"^prompt ([AB]): reused blocks so far (\d+), missed (\d+)$", out, re.MULTILINE)
    assert [p[0] for p in progress] == ["A", "B", "A", "B"], out
    return {"reused": int(reused.group(1)), "hit": float(hit.group(1)),
            "final_reused": int(progress[-1][1]), "final_missed": int(progress[-1][2]),
            "first_missed": int(progress[0][2])}


@pytest.fixture(scope="module")
def without() -> dict[str, float]:
    return run_example()


@pytest.fixture(scope="module")
def with_offloading() -> dict[str, float]:
    return run_example("--enable_offloading")


def test_without_offloading_nothing_is_reused(without: dict[str, float]) -> None:
    assert without["reused"] == 0
    assert without["hit"] == 0.0
    # every prompt misses all of its blocks: B evicts A and A evicts B
    assert without["final_missed"] == 4 * PROMPT_BLOCKS
    assert without["first_missed"] == PROMPT_BLOCKS


def test_with_offloading_a_and_b_come_back_from_host(with_offloading: dict[str, float]) -> None:
    reused, hit = with_offloading["reused"], with_offloading["hit"]
    assert reused > 0 and hit > 0.0
    # only the second A and the second B can reuse, at most all of their blocks
    assert reused <= 2 * PROMPT_BLOCKS
    assert reused == with_offloading["final_reused"]
    assert hit == pytest.approx(reused / (reused + with_offloading["final_missed"]))
    assert with_offloading["first_missed"] == PROMPT_BLOCKS
