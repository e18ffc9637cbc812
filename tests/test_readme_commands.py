"""What the README says about commands is what they do: the attach-a-recording line's speed, the report's
matplotlib note, and no link that leaves the repository."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pytest

from kvtop import cli
from kvtop.commands import attach

REPO = Path(__file__).resolve().parents[1]
README = (REPO / "README.md").read_text(encoding="utf-8")


def test_the_readmes_attach_recording_line_replays_at_the_speed_it_says() -> None:
    line = next(ln for ln in README.splitlines() if ln.startswith("kvtop attach run.jsonl"))
    command, _, comment = line.partition("#")
    documented = re.search(r"--speed (\d+(?:\.\d+)?)", comment)
    assert documented, line
    args = command.split()[2:]   # after "kvtop attach"
    parsed = attach.parser("attach").parse_args(args)
    assert float(parsed.speed) == float(documented.group(1)), line
    # ... and the replay line it names parses to the same speed
    replay = re.search(r"kvtop replay (\S+) --speed (\d+(?:\.\d+)?)", comment)
    assert replay and float(attach.parser("replay").parse_args([replay.group(1), "--speed", replay.group(2)]
                                                                 ).speed) == float(parsed.speed)


def test_the_readme_links_nothing_outside_the_repository() -> None:
    for target in re.findall(r"\]\(([^)]+)\)", README) + re.findall(r"`(\.\./[^`]+)`", README):
        assert not target.startswith(("../", "/work/", "/")), target
        if "://" not in target:
            assert (REPO / target.split("#")[0]).exists(), target


def test_the_readme_says_report_and_plot_need_the_report_extra() -> None:
    for command in ("kvtop report", "--plot"):
        lines = [ln for ln in README.splitlines() if command in ln]
        assert lines, command
    assert "pip install 'kvtop-monitor[report]'" in README


# kvtop report without matplotlib prints its comparison and writes the page without charts (one line on stderr):
# tests/commands/test_report.py::test_without_matplotlib_the_comparison_still_prints.
@pytest.mark.parametrize("argv, first", [
    (["sim", "--trace", "tests/data/mooncake_slice.jsonl", "--host-cache", "0,8GB", "--plot", "x.png"],
     "kvtop: --plot: kvtop sim --plot needs matplotlib: pip install 'kvtop-monitor[report]'"),
])
def test_without_matplotlib_report_and_plot_say_so_in_one_line(argv: list[str], first: str,
                                                               monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)   # import matplotlib raises ImportError
    monkeypatch.chdir(REPO)
    rc = cli.main(argv)
    err = capsys.readouterr().err
    assert rc == 2
    assert err.strip() == first   # one line, and no sweep ran first (it would print per host size)
