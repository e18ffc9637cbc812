"""kvtop replay / attach FILE: the same session and summary on a recording (issue 5)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kvtop import cli

BUSY = Path(__file__).parents[1] / "data" / "busy.jsonl"


def _summary(capsys: pytest.CaptureFixture[str], argv: list[str], status: int = 0) -> dict:
    assert cli.main(argv) == status
    return json.loads(capsys.readouterr().out)


def test_replay_headless_folds_the_recording(capsys: pytest.CaptureFixture[str]) -> None:
    s = _summary(capsys, ["replay", str(BUSY), "--speed", "0", "--headless", "--json"])
    assert s["engine"] == "sim"  # the recording's own meta names its engine; the attach adds none of its own
    gpu, host = s["tiers"]["gpu"], s["tiers"]["host"]
    assert (gpu["capacity_blocks"], host["capacity_blocks"]) == (256, 227)
    assert gpu["in_use_blocks"] + gpu["free_blocks"] == 256
    assert s["requests"]["completed"] > 100 and s["moves"]["offloaded_blocks"] > 0
    assert 0 < s["hit_rate"]["cumulative"] < 1


def test_attach_file_equals_replay_and_survives_bad_lines(tmp_path: Path,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    good = _summary(capsys, ["replay", str(BUSY), "--speed", "0", "--headless", "--json"])
    damaged = tmp_path / "damaged.jsonl"
    shutil.copy(BUSY, damaged)
    with damaged.open("a") as fh:
        fh.write('{"v": 1, "kind": "stats", "time": "noon"}\n{"truncated": ')  # a bad line, then a cut one
    # The bad lines are data lost: exit status 4, and counted in the summary's problems.
    s = _summary(capsys, ["attach", str(damaged), "--speed", "0", "--headless", "--json"], status=4)
    assert s["tiers"] == good["tiers"] and s["moves"] == good["moves"]
    assert s["requests"]["completed"] == good["requests"]["completed"]
    # besides the bad lines, the busy recording's host pool (227 blocks) under its GPU pool (256): a tier alarm
    assert sorted((p["kind"], p["count"], p["lost"]) for p in s["problems"]) == \
        [("replay.bad_line", 2, True), ("tier.host_not_larger", 1, False)]
    assert [p["kind"] for p in good["problems"]] == ["tier.host_not_larger"] and good["records"] == 3324


def test_replay_of_a_missing_file_is_one_line(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    assert cli.main(["replay", str(tmp_path / "nope.jsonl"), "--headless"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no such recording" in err[0]


def test_replay_of_a_fleet_sums_sources_in_the_summary(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Three nodes' streams in one recording: one TierModel each, and the aggregate row the dashboard shows."""
    single = _summary(capsys, ["replay", str(BUSY), "--speed", "0", "--headless", "--json"])
    fleet = tmp_path / "fleet.jsonl"
    lines = BUSY.read_text().splitlines()
    with fleet.open("w") as out:
        for node in ("node-a", "node-b", "node-c"):
            for line in lines:
                rec = json.loads(line)
                rec["source"] = {"host": node, "rank": 0, "run": "chat"}
                out.write(json.dumps(rec) + "\n")
    s = _summary(capsys, ["replay", str(fleet), "--speed", "0", "--headless", "--json"])
    rows = {r["key"]: r for r in s["fleet"]["sources"]}
    assert sorted(rows) == ["node-a/0/chat", "node-b/0/chat", "node-c/0/chat"]
    total = s["fleet"]["all"]
    assert total["gpu_capacity"] == 3 * single["tiers"]["gpu"]["capacity_blocks"]
    assert total["host_cached"] == 3 * single["tiers"]["host"]["cached_blocks"]
    assert total["hits"] == 3 * single["hit_rate"]["hits"]
    assert total["hit_cumulative"] == pytest.approx(single["hit_rate"]["cumulative"])  # a ratio of sums
