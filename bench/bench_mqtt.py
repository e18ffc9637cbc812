"""MQTT through a local mosquitto: latency from engine poll to the subscriber's TierModel, and one subscriber
keeping up with many sources.

    python bench/bench_mqtt.py                    # both parts (~1 minute)
    python bench/bench_mqtt.py --part latency     # engine poll -> TierModel.apply, p50/p99/max
    python bench/bench_mqtt.py --part fleet --sources 64 --rate 4 --duration 20

latency: a child process runs a SimLLM paced to the wall clock (speed 1) under a closed-loop workload, polled
    by kvtop's EnginePoller every 0.25 s into an MqttPublisher. Each record is stamped with the wall time of the
    poll that read it (EnginePoller's clock); the subscriber (this process) measures now - stamp right after
    TierModel.apply of that record. Same machine, same clock.
fleet: child processes run N sources (one MqttPublisher, one connection, its own last will each), each
    publishing every 1/rate s what a busy SimLLM's poller read in one 0.25 s poll (captured from a simulated
    Qwen3-8B on an H200 profile with a 2 GiB host pool: iteration stats and KV cache events, renumbered to keep
    event ids continuous). One subscriber (this process) decodes and folds every record into a TierModel per
    source. Reports received / expected, the subscriber's CPU (process time / wall), its latency, mosquitto's
    CPU, and the publishers' drops.

Needs mosquitto on PATH (apt-get install mosquitto).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from kvtop.records import Record, SourceId, make  # noqa: E402
from kvtop.sources.mqtt import MqttSubscriber  # noqa: E402
from kvtop.tiers import TierModel  # noqa: E402

# ---------------------------------------------------------------------------------------------- helpers

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_mosquitto(workdir: Path) -> tuple[subprocess.Popen[bytes], int]:
    if not shutil.which("mosquitto"):
        sys.exit("bench_mqtt: mosquitto is not on PATH (apt-get install mosquitto)")
    port = free_port()
    conf = workdir / "mosquitto.conf"
    conf.write_text(f"listener {port} 127.0.0.1\nallow_anonymous true\npersistence false\n"
                    "max_queued_messages 100000\n")
    proc = subprocess.Popen(["mosquitto", "-c", str(conf)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 10
    while True:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc, port
        if time.monotonic() > deadline:
            proc.kill()
            sys.exit("bench_mqtt: mosquitto did not start")
        time.sleep(0.02)


def child_env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}


async def children_ready(children: list[asyncio.subprocess.Process]) -> None:
    """Each child's first line: it is ready (all its sources connected) and waits for "go"."""
    for child in children:
        assert child.stdout is not None
        await child.stdout.readline()


async def go_and_collect(children: list[asyncio.subprocess.Process]) -> list[dict[str, Any]]:
    """Start every child at once ("go" on stdin), then each one's JSON result line, once it has exited."""
    for child in children:
        assert child.stdin is not None
        child.stdin.write(b"go\n")
        await child.stdin.drain()
    outs = []
    for child in children:
        assert child.stdout is not None
        outs.append(json.loads((await child.stdout.readline()).decode()))
        await child.wait()
    return outs


def pct(values: list[float], p: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(p / 100 * (len(s) - 1))))] if s else float("nan")


def cpu_seconds(pid: int) -> float:
    try:
        import psutil

        t = psutil.Process(pid).cpu_times()
        return float(t.user + t.system)
    except Exception:
        return float("nan")


class Fold:
    """The subscriber side: one TierModel per source, latency of every record after its apply."""

    def __init__(self) -> None:
        self.models: dict[SourceId, TierModel] = {}
        self.latencies: list[float] = []
        self.received = 0
        self.measuring = False

    def __call__(self, rec: Record) -> None:
        model = self.models.get(rec.source)
        if model is None:
            model = self.models[rec.source] = TierModel()
        model.apply(rec)
        self.received += 1
        if self.measuring and rec.kind != "meta":
            self.latencies.append(time.time() - rec.time)


# ---------------------------------------------------------------------------------------------- latency

def engine_child(url: str, duration: float) -> None:
    """A SimLLM in real time, a closed-loop workload, EnginePoller -> MqttPublisher."""
    from kvtop.engines.sim import KvCacheConfig, SamplingParams, SimLLM
    from kvtop.sinks.mqtt import MqttPublisher
    from kvtop.sources.poller import EnginePoller

    async def main() -> None:
        src = SourceId("engine", 0, "latency")
        llm = SimLLM("Qwen/Qwen3-8B", kv_cache_config=KvCacheConfig(host_cache_size=2 * 2**30, max_tokens=16384,
                                                                     event_buffer_max_size=16384),
                     enable_iter_perf_stats=True, speed=1.0)
        pub = MqttPublisher(url, src)
        pub.publish(make("meta", llm.describe(), src))
        tasks = [asyncio.ensure_future(pub.run())]
        poller = EnginePoller(llm, src, 0.25, pub.publish)
        tasks.append(asyncio.ensure_future(poller.run()))
        rnd = random.Random(1)
        prefixes = [[rnd.randrange(1000, 30000) for _ in range(1024)] for _ in range(16)]
        stop_at = time.monotonic() + duration

        async def user(u: int) -> None:
            while time.monotonic() < stop_at:
                prompt = prefixes[rnd.randrange(16)] + [rnd.randrange(1000, 30000)
                                                        for _ in range(rnd.randrange(64, 768))]
                await llm.generate_async(prompt, SamplingParams(max_tokens=rnd.randrange(16, 128))).aresult()

        print("ready", flush=True)
        await asyncio.gather(*(user(u) for u in range(16)))
        poller.stop()
        pub.stop()
        await asyncio.gather(*tasks)
        llm.shutdown()
        print(json.dumps({"published": pub.published, "dropped": pub.dropped, "messages": pub.messages}), flush=True)

    asyncio.run(main())


async def bench_latency(port: int, duration: float, mosquitto_pid: int) -> dict[str, Any]:
    url = f"mqtt://127.0.0.1:{port}/bench"
    fold = Fold()
    sub = MqttSubscriber(url, fold)
    task = asyncio.ensure_future(sub.run())
    while not sub.connected:
        await asyncio.sleep(0.01)
    child = await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--engine-child", url, "--duration", str(duration), stdout=subprocess.PIPE,
        env=child_env())
    assert child.stdout is not None
    await child.stdout.readline()  # ready
    await asyncio.sleep(1.0)  # warm-up: the first polls fill the pools
    fold.measuring = True
    cpu0, wall0, mcpu0 = time.process_time(), time.monotonic(), cpu_seconds(mosquitto_pid)
    out = json.loads((await child.stdout.readline()).decode())
    await child.wait()
    await asyncio.sleep(0.5)
    fold.measuring = False
    wall = time.monotonic() - wall0
    sub_cpu = time.process_time() - cpu0
    sub.stop()
    await task
    lat = fold.latencies
    return {"records": len(lat), "published": out["published"], "received": fold.received,
            "dropped": out["dropped"], "messages": out["messages"],
            "p50_ms": 1000 * pct(lat, 50), "p99_ms": 1000 * pct(lat, 99), "max_ms": 1000 * max(lat),
            "subscriber_cpu_pct": 100 * sub_cpu / wall,
            "mosquitto_cpu_pct": 100 * (cpu_seconds(mosquitto_pid) - mcpu0) / wall}


# ---------------------------------------------------------------------------------------------- fleet

def capture(path: Path, sim_seconds: float) -> dict[str, Any]:
    """What a busy engine's poller reads per 0.25 s poll: a SimLLM at speed 0, sliced by simulated time."""
    from kvtop.engines.sim import KvCacheConfig, SamplingParams, SimLLM

    llm = SimLLM("Qwen/Qwen3-8B", kv_cache_config=KvCacheConfig(host_cache_size=2 * 2**30, max_tokens=16384,
                                                                 event_buffer_max_size=1 << 20),
                 enable_iter_perf_stats=True, speed=0)
    rnd = random.Random(0)
    prefixes = [[rnd.randrange(1000, 30000) for _ in range(1024)] for _ in range(16)]
    polls: list[dict[str, list[Any]]] = []
    t_next = 0.25
    cur: dict[str, list[Any]] = {"stats": [], "events": []}
    inflight: list[Any] = []
    while llm.sim_time_s < sim_seconds:
        while len(inflight) < 24:
            prompt = prefixes[rnd.randrange(16)] + [rnd.randrange(1000, 30000) for _ in range(rnd.randrange(64, 768))]
            inflight.append(llm.generate_async(prompt, SamplingParams(max_tokens=rnd.randrange(16, 128))))
        time.sleep(0.002)
        inflight = [o for o in inflight if not o.finished]
        cur["stats"] += llm.get_stats(timeout=0)
        cur["events"] += llm.get_kv_cache_events(timeout=0)
        while llm.sim_time_s >= t_next:
            polls.append(cur)
            cur = {"stats": [], "events": []}
            t_next += 0.25
    llm.shutdown()
    data = {"meta": llm.describe(), "polls": polls[4:]}  # the first second is warm-up (pools filling)
    path.write_text(json.dumps(data))
    return data


def fleet_child(url: str, capture_path: str, first: int, count: int, rate: float, duration: float,
                stats_per_s: float, events_per_s: float) -> None:
    """``count`` sources, one MqttPublisher each, on one event loop."""
    from kvtop.sinks.mqtt import MqttPublisher

    data = json.loads(Path(capture_path).read_text())
    stats = [s for p in data["polls"] for s in p["stats"]]
    events = [e for p in data["polls"] for e in p["events"]]

    async def main() -> None:
        pubs = []
        for i in range(first, first + count):
            src = SourceId(f"node-{i:02d}", 0, "fleet")
            pub = MqttPublisher(url, src)
            pub.publish(make("meta", dict(data["meta"]), src))
            pubs.append(pub)
        tasks = [asyncio.ensure_future(p.run()) for p in pubs]
        while not all(p.connected for p in pubs):
            await asyncio.sleep(0.01)
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)  # "go"
        period = 1.0 / rate
        start = time.monotonic()
        generated = [0] * count

        async def source(k: int) -> None:
            pub = pubs[k]
            src = pub.source
            rnd = random.Random(first + k)
            si, ei = rnd.randrange(len(stats)), rnd.randrange(len(events))  # each source at its own place
            event_id = 0
            s_owed = e_owed = 0.0
            t = start + rnd.random() * period  # sources are not in step, as real nodes are not
            while t < start + duration:
                await asyncio.sleep(max(0.0, t - time.monotonic()))
                now = time.time()  # the "poll" time: what the subscriber's latency is measured from
                s_owed += stats_per_s * period
                e_owed += events_per_s * period
                for _ in range(int(s_owed)):
                    pub.publish(Record("stats", stats[si % len(stats)], src, now))
                    si += 1
                for _ in range(int(e_owed)):
                    # Renumbered: event ids stay continuous when the capture wraps around.
                    pub.publish(Record("kv_event", {**events[ei % len(events)], "event_id": event_id}, src, now))
                    ei += 1
                    event_id += 1
                generated[k] += int(s_owed) + int(e_owed)
                s_owed -= int(s_owed)
                e_owed -= int(e_owed)
                t += period

        await asyncio.gather(*(source(k) for k in range(count)))
        await asyncio.sleep(1.0)  # let the last round go out
        for p in pubs:
            p.stop()
        await asyncio.gather(*tasks)
        print(json.dumps({"generated": sum(generated), "published": sum(p.published for p in pubs) - count,
                          "dropped": sum(p.dropped for p in pubs), "messages": sum(p.messages for p in pubs)}),
              flush=True)

    asyncio.run(main())


async def bench_fleet(port: int, sources: int, rate: float, duration: float, procs: int, capture_path: Path,
                      mosquitto_pid: int, stats_per_s: float, events_per_s: float) -> dict[str, Any]:
    url = f"mqtt://127.0.0.1:{port}/bench"
    fold = Fold()
    sub = MqttSubscriber(url, fold)
    task = asyncio.ensure_future(sub.run())
    while not sub.connected:
        await asyncio.sleep(0.01)
    per = [sources // procs + (1 if i < sources % procs else 0) for i in range(procs)]
    children = []
    first = 0
    for n in per:
        child = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--fleet-child", url, str(capture_path), str(first), str(n), str(rate),
            str(duration), str(stats_per_s), str(events_per_s), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            env=child_env())
        children.append(child)
        first += n
    await children_ready(children)
    await asyncio.sleep(0.5)
    base = fold.received  # the retained metas
    fold.measuring = True
    cpu0, wall0, mcpu0 = time.process_time(), time.monotonic(), cpu_seconds(mosquitto_pid)
    outs = await go_and_collect(children)
    generated = sum(o["generated"] for o in outs)
    deadline = time.monotonic() + 10
    while fold.received - base < generated and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    wall = time.monotonic() - wall0
    sub_cpu = time.process_time() - cpu0
    fold.measuring = False
    sub.stop()
    await task
    lat = fold.latencies
    received = fold.received - base
    return {"sources": sources, "rate_hz": rate, "duration_s": duration, "stats_per_s_per_source": stats_per_s,
            "events_per_s_per_source": events_per_s, "generated": generated,
            "received": received, "received_pct": 100 * received / generated if generated else 0.0,
            "dropped_by_publishers": sum(o["dropped"] for o in outs), "messages": sum(o["messages"] for o in outs),
            "records_per_s": received / duration, "messages_per_s": sum(o["messages"] for o in outs) / duration,
            "subscriber_cpu_pct": 100 * sub_cpu / wall, "subscriber_cpu_pct_active": 100 * sub_cpu / duration,
            "mosquitto_cpu_pct": 100 * (cpu_seconds(mosquitto_pid) - mcpu0) / wall,
            "p50_ms": 1000 * pct(lat, 50), "p99_ms": 1000 * pct(lat, 99), "max_ms": 1000 * max(lat) if lat else None,
            "malformed": sub.malformed}


# ---------------------------------------------------------------------------------------------- main

def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=("latency", "fleet", "all"), default="all")
    ap.add_argument("--duration", type=float, default=20.0, help="seconds per part (default 20)")
    ap.add_argument("--sources", type=int, default=64)
    ap.add_argument("--rate", type=float, default=4.0, help="publishes per source per second (default 4)")
    ap.add_argument("--procs", type=int, default=4, help="publisher processes for the fleet (default 4)")
    ap.add_argument("--capture-seconds", type=float, default=12.0, help="simulated seconds to capture (default 12)")
    ap.add_argument("--engine-child", metavar="URL")
    ap.add_argument("--stats-per-s", type=float, help="iteration stats per source per second (default: the "
                                                      "captured engine's, ~130)")
    ap.add_argument("--events-per-s", type=float, help="KV events per source per second (default: the captured "
                                                       "engine's, ~1,500)")
    ap.add_argument("--fleet-child", nargs=8)
    args = ap.parse_args()
    if args.engine_child:
        engine_child(args.engine_child, args.duration)
        return
    if args.fleet_child:
        url, cap, first, count, rate, duration, sps, eps = args.fleet_child
        fleet_child(url, cap, int(first), int(count), float(rate), float(duration), float(sps), float(eps))
        return

    workdir = Path(tempfile.mkdtemp(prefix="kvtop-bench-mqtt-"))
    broker, port = start_mosquitto(workdir)
    version = subprocess.run(["mosquitto", "-h"], capture_output=True, text=True).stdout.splitlines()[0]
    results: dict[str, Any] = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
                                          f"Python {platform.python_version()}", "broker": version}
    try:
        if args.part in ("latency", "all"):
            results["latency"] = asyncio.run(bench_latency(port, args.duration, broker.pid))
            print(json.dumps({"latency": results["latency"]}, indent=1), flush=True)
        if args.part in ("fleet", "all"):
            cap_path = workdir / "capture.json"
            t0 = time.monotonic()
            data = capture(cap_path, args.capture_seconds)
            polls = data["polls"]
            sim_s = 0.25 * len(polls)
            results["capture"] = {
                "sim_seconds": sim_s, "wall_seconds": time.monotonic() - t0,
                "stats_per_s": sum(len(p["stats"]) for p in polls) / sim_s,
                "events_per_s": sum(len(p["events"]) for p in polls) / sim_s}
            print(json.dumps({"capture": results["capture"]}, indent=1), flush=True)
            sps = args.stats_per_s if args.stats_per_s is not None else results["capture"]["stats_per_s"]
            eps = args.events_per_s if args.events_per_s is not None else results["capture"]["events_per_s"]
            results["fleet"] = asyncio.run(bench_fleet(port, args.sources, args.rate, args.duration, args.procs,
                                                       cap_path, broker.pid, sps, eps))
            print(json.dumps({"fleet": results["fleet"]}, indent=1), flush=True)
    finally:
        broker.terminate()
        broker.wait(5)
    print(json.dumps(results))


if __name__ == "__main__":
    main()
