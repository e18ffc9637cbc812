"""kvtop report on driven runs whose simulator is not paced to the wall clock (``--speed 0``): the rates are the
simulator's, not this machine's.

At ``--speed 0`` the simulator runs as fast as it can; records stamped with the wall clock made the report's
rates a measure of how fast this machine simulated: a 64 GB host read -37% output tok/s against no host cache, where
the simulator's own clock (its iteration stats' ``timestamp``) said +40%, and +5% at ``--speed 1``.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from kvtop.records import RecordError, read_jsonl
from kvtop.report.report import answer_sentences, load_runs


def _driven(tmp: Path, host: str, path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVTOP_")}
    env["XDG_CONFIG_HOME"] = str(tmp / "xdg")
    done = subprocess.run([sys.executable, "-m", "kvtop", "--engine", "sim", "--headless", "--json", "--duration", "4",
                           "--speed", "0", "--host-cache", host, "--seed", "3", "--record", str(path)],
                          cwd=tmp, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _sim_clock_rate(path: Path) -> float:
    """Output tokens per second of the simulator's own clock: the completed requests' tokens over the span of its
    iteration stats' ``timestamp`` (written by the simulator from its clock, whatever the records are stamped
    with)."""
    stamps, tokens = [], 0
    for rec in read_jsonl(path):
        if isinstance(rec, RecordError):
            continue
        if rec.kind == "stats" and rec.data.get("timestamp"):
            stamps.append(dt.datetime.strptime(rec.data["timestamp"], "%m-%d-%Y %H:%M:%S.%f").timestamp())
        elif rec.kind == "request" and rec.data.get("ok"):
            tokens += rec.data.get("output_tokens") or 0
    assert len(stamps) > 10 and tokens > 0
    return tokens / (max(stamps) - min(stamps))


@pytest.mark.slow
def test_a_speed_0_runs_report_rates_are_the_simulators_own(tmp_path: Path) -> None:
    rates, truth = {}, {}
    for host in ("0", "64GB"):
        path = tmp_path / f"host-{host}.jsonl"
        summary = _driven(tmp_path, host, path)
        (run,) = load_runs(path)
        rates[host], truth[host] = run.summary["output_tokens_per_s"], _sim_clock_rate(path)
        # the same rate as the simulator's clock gives it (within what the stats' span leaves out at either end)
        assert rates[host] == pytest.approx(truth[host], rel=0.15), (host, rates[host], truth[host])
        # the run spans tens of simulated seconds, not the 4 s this machine took
        assert run.duration_s > 8, run.duration_s
        assert summary["requests"]["completed"] > 0
    # the host tier's gain in the report points where the simulator's clock says
    assert (rates["64GB"] > rates["0"]) == (truth["64GB"] > truth["0"]), (rates, truth)
    runs = [load_runs(tmp_path / "host-0.jsonl")[0], load_runs(tmp_path / "host-64GB.jsonl")[0]]
    sentence = answer_sentences(runs)[0]
    sign = "+" if truth["64GB"] > truth["0"] else "-"
    assert f"output tok/s {sign}" in sentence, sentence
