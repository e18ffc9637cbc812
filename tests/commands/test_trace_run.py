"""A headless ``--scenario trace`` run ends when its trace has been answered (the summary printed, exit 0), or at
``--duration`` where that comes first, with the engine's every KV event folded (a last drain after the last
answer); the other scenarios run for ``--duration``."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest


def _trace(path: Path, n: int) -> None:
    # prompts of 2-3 hash blocks sharing their first, a request every 10 ms of trace time
    path.write_text("".join(json.dumps({"timestamp": 10 * i, "input_length": 1024 + 256 * (i % 3), "output_length": 4,
                                        "hash_ids": [0, 100 + i, 200 + i]}) + "\n" for i in range(n)))


@pytest.fixture
def isolated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    for name in [k for k in os.environ if k.startswith("KVTOP_")]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg"))
    return tmp_path


def _run(argv: list[str], monkeypatch: pytest.MonkeyPatch) -> tuple[int, float, Any]:
    from kvtop import runner
    from kvtop.commands import run as run_cmd

    built: list[Any] = []
    real = runner.build_session

    def build(settings: Any, **kw: Any) -> Any:
        built.append(real(settings, **kw))
        return built[-1]

    monkeypatch.setattr(runner, "build_session", build)
    t0 = time.monotonic()
    rc = run_cmd.main(argv)
    return rc, time.monotonic() - t0, built[0]


def test_a_headless_trace_run_ends_when_its_trace_is_answered(isolated: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    path = isolated / "trace.jsonl"
    _trace(path, 20)
    rc, elapsed, session = _run(["--engine", "sim", "--scenario", "trace", "--trace", str(path), "--speed", "0",
                                 "--trace-time-scale", "10", "--headless", "--json", "--duration", "120"],
                                monkeypatch)
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and elapsed < 100   # at the trace's end (~2 s here), not at --duration's 120 s
    assert (out["requests"]["completed"], out["requests"]["failed"]) == (20, 0)
    bm = session.driver.engine.block_manager
    # every event the engine made was taken and folded: the last answer's release too
    assert bm.buffered_events() == 0 and session.model.event_fold.next_event_id == bm._next_event_id > 20


def test_duration_ends_a_trace_run_first(isolated: Path, monkeypatch: pytest.MonkeyPatch,
                                         capsys: pytest.CaptureFixture[str]) -> None:
    path = isolated / "trace.jsonl"
    _trace(path, 400)   # 400 requests 10 ms apart: 4 s of arrivals, cut at 1 s
    rc, elapsed, _ = _run(["--engine", "sim", "--scenario", "trace", "--trace", str(path), "--speed", "0",
                           "--headless", "--json", "--duration", "1"], monkeypatch)
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and out["requests"]["completed"] < 400


def test_a_driven_simulator_run_collects_garbage_less_often(isolated: Path) -> None:
    """The simulator's driven session raises the collector's first threshold (700 by default: ~15,000 collections
    and ~120 full ones over a 3,000-request trace's events), never lowers one set higher."""
    import gc

    from kvtop import runner
    from kvtop.commands.run import build_parser, cli_values
    from kvtop.settings import load_settings

    was = gc.get_threshold()
    try:
        for start, want in ((700, runner.GC_GEN0_THRESHOLD), (10 * runner.GC_GEN0_THRESHOLD,
                                                               10 * runner.GC_GEN0_THRESHOLD)):
            gc.set_threshold(start, was[1], was[2])
            settings = load_settings(cli_values(build_parser().parse_args(["--engine", "sim", "--headless"])),
                                     config_path=None)
            session = runner.build_session(settings, sample_gpu=False)
            session.driver.engine.shutdown()
            assert gc.get_threshold() == (want, was[1], was[2])
    finally:
        gc.set_threshold(*was)
