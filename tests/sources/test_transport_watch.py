"""kvtop.watch(llm): a background watcher on an LLM the user's own script drives (SimLLM here)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest

import kvtop
from kvtop.records import Record, read_jsonl
from kvtop.sources.replay import replay_into
from kvtop.tiers import TierModel

ROOT = Path(__file__).resolve().parents[2]


def make_llm(max_tokens: int = 4096) -> Any:
    from kvtop.engines.sim import KvCacheConfig, SimLLM

    return SimLLM("Qwen/Qwen3-8B", kv_cache_config=KvCacheConfig(host_cache_size=2**30, max_tokens=max_tokens,
                                                                  event_buffer_max_size=4096),
                  enable_iter_perf_stats=True, speed=0)


async def workload(llm: Any, users: int = 12) -> None:
    from kvtop.engines.sim import SamplingParams

    system = list(range(1000, 2000))
    outs = [llm.generate_async(system + [20_000 + 500 * u + t for t in range(400)], SamplingParams(max_tokens=8))
            for u in range(users)]
    await asyncio.gather(*(o.aresult() for o in outs))


@pytest.mark.slow
def test_watch_folds_records_serves_prometheus_and_stops_cleanly(tmp_path: Path) -> None:
    llm = make_llm()
    path = tmp_path / "watch.jsonl"
    threads_before = set(threading.enumerate())
    handle = kvtop.watch(llm, record=path, prometheus_port=0, interval_s=0.05, run="mine")
    try:
        assert handle.running and handle.prometheus_port
        asyncio.run(workload(llm))
        llm.wait_idle()
        time.sleep(0.3)
        with urllib.request.urlopen(f"http://127.0.0.1:{handle.prometheus_port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        assert 'kvtop_kv_capacity_blocks{' in text and 'run="mine"' in text
    finally:
        handle.stop()
        llm.shutdown()
    assert not handle.running and handle.crashed is None
    s = handle.summary()
    assert s["engine"] == "sim" and s["tiers"]["gpu"]["capacity_blocks"] == 128
    assert s["moves"]["offloaded_blocks"] > 0 and s["hit_rate"]["cumulative"] > 0
    # The recording is the same stream: replayed, it folds to the same state.
    lines = list(read_jsonl(path))
    assert all(isinstance(r, Record) for r in lines) and len(lines) == handle.records
    replayed = TierModel()
    asyncio.run(replay_into(path, replayed.apply, speed=0))
    for key in ("tiers", "moves", "hit_rate"):
        assert replayed.summary()[key] == s[key], key
    # Nothing left behind: the watch thread and the HTTP server are gone, the port is closed.
    time.sleep(0.1)
    left = {t for t in threading.enumerate() if t not in threads_before and t.is_alive()}
    assert not [t for t in left if t.name.startswith("kvtop")], left
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{handle.prometheus_port}/metrics", timeout=1)


def test_watch_drains_what_the_engine_queued_after_the_last_poll() -> None:
    llm = make_llm()
    handle = kvtop.watch(llm, interval_s=30.0, sample_memory=False)  # one poll at start, then none until stop
    try:
        time.sleep(0.2)
        asyncio.run(workload(llm, users=3))
        llm.wait_idle()
    finally:
        handle.stop()
        llm.shutdown()
    assert handle.summary()["hit_rate"]["lookups"] > 0  # all of it came from the drain at stop


def test_a_speed_0_simulator_is_watched_on_its_own_clock(tmp_path: Path) -> None:
    """SimLLM(speed=0) runs as fast as it can: its records are stamped with its own clock (as a driven ``--speed 0``
    run's are), so the recording's rates are the engine's, not this machine's; the meta record says which clock."""
    import datetime as dt

    from kvtop.engines.sim import SamplingParams

    llm = make_llm()
    path = tmp_path / "watch.jsonl"
    handle = kvtop.watch(llm, record=path, interval_s=0.05, sample_memory=False)
    wall0 = time.monotonic()
    try:
        async def long_answers() -> None:  # ~300 decode steps: seconds of simulated time, a fraction of that here
            outs = [llm.generate_async(list(range(5000 * u, 5000 * u + 600)), SamplingParams(max_tokens=300))
                    for u in range(4)]
            await asyncio.gather(*(o.aresult() for o in outs))
        asyncio.run(long_answers())
        llm.wait_idle()
        time.sleep(0.2)
    finally:
        handle.stop()
        llm.shutdown()
    wall = time.monotonic() - wall0
    records = [r for r in read_jsonl(path) if isinstance(r, Record)]
    assert [r.data.get("clock") for r in records if r.kind == "meta"] == ["simulated"]
    stats = [r for r in records if r.kind == "stats"]
    engine_stamps = [dt.datetime.strptime(r.data["timestamp"], "%m-%d-%Y %H:%M:%S.%f").timestamp() for r in stats]
    assert max(engine_stamps) - min(engine_stamps) > 1.0  # seconds of simulated time
    # A drain stamps what it took with the clock's value then: on the engine's clock, never before the engine's own
    # stamp of that iteration (a few ms: the watch starts after the engine). On the wall clock the last stats were
    # stamped a second or more before the simulated time they describe (all of it took ~0.3 s here).
    early = [round(stamp - r.time, 3) for r, stamp in zip(stats, engine_stamps) if r.time < stamp - 0.05]
    assert not early, (early[:5], len(early), len(stats), wall)


def test_bad_settings_raise_in_the_callers_thread_and_start_nothing(tmp_path: Path) -> None:
    from kvtop.sources.mqtt import MqttUrlError

    llm = make_llm()
    try:
        before = threading.active_count()
        with pytest.raises(MqttUrlError, match="KVTOP_MQTT_PASSWORD"):
            kvtop.watch(llm, publish="mqtt://me:hunter2@localhost/x")
        with pytest.raises(OSError):
            kvtop.watch(llm, record=tmp_path / "no" / "such" / "dir" / "x.jsonl")
        with pytest.raises(ValueError):
            kvtop.watch(llm, interval_s=0)
        assert threading.active_count() == before
    finally:
        llm.shutdown()


@pytest.mark.mqtt
def test_watch_publishes_to_mqtt(mqtt_broker: Any) -> None:
    from kvtop.sources.mqtt import MqttSubscriber

    got: list[Record] = []
    statuses: list[tuple[str, str]] = []

    async def scenario() -> None:
        sub = MqttSubscriber(mqtt_broker.url("lab"), got.append, on_status=lambda n, m: statuses.append((n, m)))
        task = asyncio.ensure_future(sub.run())
        while not sub.connected:
            await asyncio.sleep(0.02)
        llm = make_llm()
        handle = kvtop.watch(llm, publish=mqtt_broker.url("lab"), interval_s=0.05, run="pub", sample_memory=False)
        try:
            await workload(llm)
            llm.wait_idle()
            await asyncio.sleep(0.5)
        finally:
            await asyncio.to_thread(handle.stop)
            llm.shutdown()
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and sub.sources.get(handle.source.key()) != "offline":
            await asyncio.sleep(0.02)
        assert sub.sources.get(handle.source.key()) == "offline"
        assert handle.publisher.dropped == 0
        assert sub.records_received == handle.publisher.published == handle.records
        sub.stop()
        await task

    asyncio.run(scenario())
    assert {"meta", "stats", "kv_event"} <= {r.kind for r in got}


def test_import_kvtop_stays_light_and_watch_is_a_plain_function() -> None:
    code = (
        "import sys, types, kvtop\n"
        "heavy = [m for m in ('asyncio', 'prometheus_client', 'aiomqtt', 'paho', 'kvtop.tiers', 'kvtop.watcher',"
        " 'textual', 'pynvml') if m in sys.modules]\n"
        "assert not heavy, heavy\n"
        "from kvtop import watch, WatchHandle\n"
        "import kvtop.watcher\n"  # importing the module that holds it changes nothing
        "assert isinstance(kvtop.watch, types.FunctionType) and kvtop.watch is watch is kvtop.watcher.watch\n"
        "assert WatchHandle is kvtop.WatchHandle is kvtop.watcher.WatchHandle\n"
        "assert type(kvtop.watcher) is types.ModuleType\n"  # no module subclass that pretends to be callable
        "print('ok')\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr


def test_example_runs_on_the_simulator(tmp_path: Path) -> None:
    record = tmp_path / "rec" / "run.jsonl"
    record.parent.mkdir()
    out = subprocess.run([sys.executable, str(ROOT / "examples" / "watch_my_script.py"), "--record", str(record)],
                         capture_output=True, text=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)},
                         timeout=120)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout[:out.stdout.rindex("}") + 1])
    assert summary["moves"]["offloaded_blocks"] > 0 and summary["moves"]["onboarded_blocks"] > 0
    assert record.stat().st_size > 0
    assert f"recorded to {record}; replay it with: kvtop replay {record}" in out.stdout
