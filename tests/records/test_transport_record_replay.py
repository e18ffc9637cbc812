"""Recorder and replay: a killed recorder leaves a file valid line by line, losing at most the last second;
replay paces by record times, reports bad lines with their numbers and skips them."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

from kvtop.records import Record, RecordError, SourceId, decode, encode, make, read_jsonl
from kvtop.sinks.recorder import Recorder
from kvtop.sources.replay import replay, replay_into
from kvtop.tiers import TierModel

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SRC = SourceId("h", 0, "rec")

# Writes ~5,000 records/s, stamping each with the wall time it was handed to the recorder, and reports
# readiness once the first flush is on disk.
_CHILD = textwrap.dedent("""
    import sys, time
    from kvtop.records import SourceId, make
    from kvtop.sinks.recorder import Recorder

    rec = Recorder(sys.argv[1], append=False)
    src = SourceId("h", 0, "rec")
    i = 0
    announced = False
    while True:
        rec.write(make("stats", {"iter": i, "pad": "x" * 300}, src, time.time()))
        i += 1
        if not announced and rec.flushes > 0:
            print("ready", flush=True)
            announced = True
        time.sleep(0.0002)
""")


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_killed_recorder_leaves_whole_lines_and_loses_at_most_a_second(tmp_path: Path, sig: int) -> None:
    path = tmp_path / "run.jsonl"
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, str(path)], stdout=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": ROOT})
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready"
    time.sleep(1.7)  # mid-interval: a flush has happened, the next one has not
    killed_at = time.time()
    proc.send_signal(sig)
    proc.wait(10)
    raw = path.read_bytes()
    assert raw.endswith(b"\n"), "a partial line was written"
    records = []
    for line in raw.splitlines():
        records.append(decode(line))  # every line decodes (raises with the line's content otherwise)
    iters = [r.data["iter"] for r in records]
    assert iters == list(range(len(iters))), "lines lost or reordered in the middle"
    lost_s = killed_at - records[-1].time
    assert lost_s <= 1.0 + 0.25, f"the last {lost_s:.2f} s were lost (flush every 1 s)"  # 0.25 s: scheduling slack
    assert len(records) > 1000


def test_recorder_flushes_each_second_without_new_writes(tmp_path: Path) -> None:
    path = tmp_path / "idle.jsonl"
    rec = Recorder(path, flush_interval_s=0.2)
    rec.write(make("meta", {"engine": "sim"}, SRC, 1.0))
    assert path.read_bytes() == b""  # buffered
    deadline = time.monotonic() + 2.0
    while not path.read_bytes() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert decode(path.read_bytes()).kind == "meta"
    rec.close()
    rec.close()  # idempotent
    with pytest.raises(ValueError, match="closed"):
        rec.write(make("meta", {"engine": "sim"}, SRC, 1.0))


def test_recorder_flushes_big_bursts_at_once_and_on_close(tmp_path: Path) -> None:
    path = tmp_path / "burst.jsonl"
    with Recorder(path, flush_bytes=64 * 1024) as rec:
        for i in range(2000):
            rec.write(make("stats", {"iter": i, "pad": "y" * 100}, SRC, float(i)))
        assert path.stat().st_size > 0  # past 64 KiB it wrote without waiting for the timer
    assert [r.data["iter"] for r in read_jsonl(path)] == list(range(2000))  # type: ignore[union-attr]


def _write_recording(path: Path, times: list[float]) -> None:
    with path.open("w") as fh:
        for i, t in enumerate(times):
            fh.write(encode(make("stats", {"iter": i}, SRC, t)) + "\n")


async def test_replay_skips_and_reports_bad_lines_with_their_numbers(tmp_path: Path) -> None:
    path = tmp_path / "bad.jsonl"
    good = [encode(make("stats", {"iter": i}, SRC, 100.0 + i)) for i in range(4)]
    lines = [good[0], "{not json", good[1], "", json.dumps({"v": 1, "kind": "kv_event", "time": 1,
                                                              "data": {"event_id": 3}}), good[2], good[3][:40]]
    path.write_text("\n".join(lines))  # the last line is truncated, as a crash mid-write would leave it
    errors: list[RecordError] = []
    got = [r async for r in replay(path, speed=0, on_error=errors.append)]
    assert [r.data["iter"] for r in got] == [0, 1, 2]
    assert [e.line for e in errors] == [2, 5, 7]
    assert "line 5: data.data: is missing" == str(errors[1])


async def test_replay_paces_by_record_time(tmp_path: Path) -> None:
    path = tmp_path / "paced.jsonl"
    _write_recording(path, [1000.0 + 0.1 * i for i in range(11)])  # 1 s of recording
    t0 = time.monotonic()
    stamps = []
    async for _ in replay(path, speed=4.0):
        stamps.append(time.monotonic() - t0)
    assert 0.24 <= stamps[-1] < 0.5  # 1 s at 4x
    assert all(b >= a for a, b in zip(stamps, stamps[1:]))
    t0 = time.monotonic()
    assert len([r async for r in replay(path, speed=0)]) == 11
    assert time.monotonic() - t0 < 0.2  # speed 0: as fast as possible


async def test_replay_caps_idle_gaps_and_never_waits_on_time_going_backwards(tmp_path: Path) -> None:
    path = tmp_path / "gap.jsonl"
    _write_recording(path, [0.0, 3600.0, 3599.0, 3600.08])  # an hour of nothing, then a step back
    t0 = time.monotonic()
    got = [r async for r in replay(path, speed=1.0, max_gap_s=0.1)]
    took = time.monotonic() - t0
    assert len(got) == 4
    assert 0.17 <= took < 0.45  # 0.1 s (the capped hour) + 0.08 s (pacing after it); the step back not waited


async def test_recording_replays_into_the_same_tier_model(tmp_path: Path) -> None:
    """Record and replay are one mechanism: a SimLLM run recorded, replayed, folds to the same state."""
    from kvtop.engines.sim import KvCacheConfig, SamplingParams, SimLLM
    from kvtop.sources.poller import EnginePoller

    path = tmp_path / "sim.jsonl"
    live = TierModel()
    rec = Recorder(path)

    def sink(r: Record) -> None:
        live.apply(r)
        rec.write(r)

    llm = SimLLM("Qwen/Qwen3-8B", kv_cache_config=KvCacheConfig(host_cache_size=2**30, max_tokens=4096,
                                                                 event_buffer_max_size=4096),
                 enable_iter_perf_stats=True, speed=0)
    try:
        sink(make("meta", llm.describe(), SRC))
        poller = EnginePoller(llm, SRC, 0.05, sink)
        for u in range(12):
            await llm.generate_async(list(range(500)) + [9000 + 100 * u + t for t in range(100)],
                                     SamplingParams(max_tokens=8)).aresult()
        llm.wait_idle()
        await poller.poll_once()
        await poller.poll_once()
    finally:
        llm.shutdown()
        rec.close()
    replayed = TierModel()
    n = await replay_into(path, replayed.apply, speed=0)
    assert n == rec.records
    for key in ("tiers", "moves", "hit_rate"):
        assert replayed.summary()[key] == live.summary()[key], key


def test_recorder_survives_a_failing_disk(tmp_path: Path, monkeypatch: Any) -> None:
    path = tmp_path / "full.jsonl"
    rec = Recorder(path)
    real_write = os.write
    calls = {"n": 0}

    def flaky(fd: int, data: Any) -> int:
        calls["n"] += 1
        if calls["n"] == 1:
            return real_write(fd, bytes(data)[:25])  # a short write: half a line
        if calls["n"] == 2:
            raise OSError(28, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", flaky)
    rec.write(make("stats", {"iter": 0}, SRC, 1.0))
    rec.write(make("stats", {"iter": 1}, SRC, 2.0))
    rec.flush()  # short write, then ENOSPC: the rest is kept
    assert rec.error is not None and "No space" in rec.error
    rec.write(make("stats", {"iter": 2}, SRC, 3.0))
    rec.close()  # the disk is back: the half line is finished first
    assert [r.data["iter"] for r in read_jsonl(path)] == [0, 1, 2]  # type: ignore[union-attr]


def test_replay_rejects_negative_speed(tmp_path: Path) -> None:
    path = tmp_path / "x.jsonl"
    path.write_text("")

    async def consume() -> None:
        async for _ in replay(path, speed=-1):
            pass

    with pytest.raises(ValueError, match="speed"):
        asyncio.run(consume())


def test_a_record_over_the_line_limit_is_not_written_and_named_and_the_rest_replays(tmp_path: Path) -> None:
    # A vLLM stored event carrying a 9 MB lora_name (and a stats dict as large) made a line over the 8 MiB that
    # read_jsonl (replay, report) refuses: kvtop wrote what it could not read back. Now such a record is not
    # written, counted as lost ("recorder.too_large"), and every other record comes back.
    from kvtop.problems import Problems
    from kvtop.records import MAX_LINE_BYTES

    big = "L" * (9 * 10**6)

    def stored(i: int, lora: Any = None) -> Record:
        return make("kv_event", {"event_id": i, "window_size": 4096, "data": {
            "type": "stored", "parent_hash": None, "lora_name": lora,
            "blocks": [{"type": "stored_block", "block_hash": 100 + i, "tokens": [], "cache_level": 0,
                        "priority": 35}]}}, SRC, 1.0 + i)

    records = [make("meta", {"engine": "vllm", "primary_blocks": 100, "tokens_per_block": 16}, SRC, 1.0),
               *[stored(i) for i in range(5)], stored(5, big), *[stored(i) for i in range(6, 10)],
               make("stats", {"iter": 1, "note": big}, SRC, 20.0),
               make("stats", {"iter": 2, "kvCacheStats": {"maxNumBlocks": 100, "freeNumBlocks": 90}}, SRC, 21.0)]
    problems = Problems()
    path = tmp_path / "run.jsonl"
    with Recorder(path, problems=problems) as rec:
        for r in records:
            rec.write(r)
    back = list(read_jsonl(path))
    assert [x for x in back if isinstance(x, RecordError)] == []
    assert max(len(line) for line in path.read_bytes().splitlines()) <= MAX_LINE_BYTES
    kept = [r for i, r in enumerate(records) if i not in (6, 11)]
    assert [(r.kind, r.time) for r in back] == [(r.kind, r.time) for r in kept]  # type: ignore[union-attr]
    assert [r.data["event_id"] for r in back if r.kind == "kv_event"] == [0, 1, 2, 3, 4, 6, 7, 8, 9]  # type: ignore
    assert rec.refused == 2 and rec.records == len(kept)
    problem = next(p for p in problems.to_json() if p["kind"] == "recorder.too_large")
    assert problem["count"] == 2 and problem["lost"] and "line limit" in problem["message"]
