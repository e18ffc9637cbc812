"""A fleet through summaries: N simulated ``kvtop agent``s at R Hz through a local mosquitto into one dashboard
subscriber (kvtop's own data path: MqttSubscriber -> Session.emit -> a TierModel per source).

    python bench/bench_fleet.py                                  # 1,000 sources at 2 Hz for 30 s
    python bench/bench_fleet.py --sources 200 --rate 2 --duration 10

Publishers: child processes, each running its share of the agents, one MQTT connection per agent (its own last
will and retained status, as real agents have), each publishing what ``kvtop agent`` publishes: a retained meta,
then every 1/R s a ``summary`` record built by ``kvtop.agent.summary_data`` from a TierModel that folded a real
KV event stream (a vLLM-format batch of stores, offloads and evictions per round), so the payload is the real size
and shape (encoded once, stamped per message: the agents' CPU is not this machine's). Sources are out of step
(random phase), as real nodes are.

Subscriber (this process): ``kvtop attach mqtt://`` minus the screen: the same Session and subscriber. Every record
is timed after its fold (now - the agent's stamp; same machine, same clock) and every source's ``seq`` is checked,
so "lost" is exact. Once a second it also computes the fleet table's rows and aggregate over all sources
(kvtop.fleet, what the dashboard's sources panel reads every FLEET_REFRESH_S = 1 s), timed separately.

Reports: received / expected, lost, p50/p99/max latency, the subscriber's CPU (process time / wall: the fold alone
and the fleet table alone), mosquitto's CPU. Needs mosquitto on PATH.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

from bench_mqtt import (  # noqa: E402
    child_env,
    children_ready,
    cpu_seconds,
    go_and_collect,
    pct,
    start_mosquitto,
)

from kvtop.records import Record, SourceId  # noqa: E402


def _stream_model() -> Any:
    """A TierModel that folded a real-shaped stream: its summary is what an agent of a busy engine sends."""
    import msgpack

    from kvtop.sources.kv_wire import decode_frames
    from kvtop.tiers import TierModel

    m = TierModel()
    for seq in range(200):
        hashes = list(range(seq * 16, seq * 16 + 16))
        events = [{"type": "BlockStored", "block_hashes": hashes, "parent_block_hash": None,
                   "token_ids": list(range(256)), "block_size": 16, "lora_id": None, "medium": "GPU",
                   "lora_name": None},
                  {"type": "BlockStored", "block_hashes": hashes[:8], "parent_block_hash": None, "token_ids": [],
                   "block_size": 16, "lora_id": None, "medium": "CPU", "lora_name": None},
                  {"type": "BlockRemoved", "block_hashes": hashes[:4], "medium": "GPU"}]
        b = decode_frames([b"kv", seq.to_bytes(8, "big"), msgpack.packb([time.time(), events, 0])])
        m.apply(Record("kv_batch", b.record_data(), SourceId("x", 0, "r"), 1000.0 + seq))
    return m


def fleet_child(url: str, first: int, count: int, rate: float, duration: float) -> None:
    """``count`` agents, one MQTT connection each (its own client id and last will, as real agents have).

    The payload is what ``kvtop agent`` publishes (``summary_data`` of a folded stream, encoded as kvtop encodes a
    record), made once and stamped per message (seq, time, growing totals) by string substitution: the agents'
    own CPU belongs to 1,000 other machines, not to this bench's two cores, which the subscriber needs."""
    import aiomqtt

    from kvtop.agent import summary_data

    # The agents stand in for 1,000 other machines: on this one they must not take the subscriber's CPU.
    os.nice(19 - os.nice(0))
    from kvtop.records import encode
    from kvtop.sources.mqtt import OFFLINE, ONLINE, STATUS, parse_mqtt_url, topic_for

    murl = parse_mqtt_url(url)
    model = _stream_model()
    base = summary_data(model, 0, 1.0 / rate, "agent-bench")
    marks = {"offloaded": -1111111, "evicted_gpu": -2222222, "lookups": -3333333, "hits": -4444444}

    async def main() -> None:
        period = 1.0 / rate
        ready = asyncio.Event()
        go = asyncio.Event()
        connected = [0]
        sent = [0] * count

        async def agent(k: int) -> None:
            i = first + k
            src = SourceId(f"node-{i // 8:04d}:5557", i % 8, "fleet")
            me = SourceId(f"agent-{i:04d}", 0, "fleet")
            status = topic_for(murl.prefix, me, STATUS)
            topic = topic_for(murl.prefix, src, "summary")
            rnd = random.Random(i)
            template = encode(Record("summary", {**base, "seq": -5555555, "totals": {**base["totals"], **marks}},
                                     src, -6666666.0))
            async with aiomqtt.Client(murl.host, murl.port, identifier=f"bench-agent-{i}",
                                      will=aiomqtt.Will(status, OFFLINE, qos=1, retain=True)) as client:
                await client.publish(status, ONLINE, qos=1, retain=True)
                await client.publish(topic_for(murl.prefix, src, "meta"), encode(Record(
                    "meta", {"engine": "vllm", "agent": me.key()}, src, time.time())), qos=1, retain=True)
                connected[0] += 1
                if connected[0] == count:
                    ready.set()
                await go.wait()
                start = time.monotonic()
                t = start + rnd.random() * period
                seq = 0
                totals = {key: base["totals"][key] for key in marks}
                while t < start + duration:
                    await asyncio.sleep(max(0.0, t - time.monotonic()))
                    payload = template.replace("-5555555", str(seq), 1).replace("-6666666.0", repr(time.time()), 1)
                    for key, mark in marks.items():
                        totals[key] += rnd.randrange(50, 150)
                        payload = payload.replace(str(mark), str(totals[key]), 1)
                    await client.publish(topic, payload, qos=0)
                    seq += 1
                    sent[k] += 1
                    t += period
                await asyncio.sleep(1.0)
                await client.publish(status, OFFLINE, qos=1, retain=True)

        tasks = [asyncio.ensure_future(agent(k)) for k in range(count)]
        await ready.wait()
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)  # "go"
        cpu0 = time.process_time()
        go.set()
        await asyncio.gather(*tasks)
        print(json.dumps({"sent": sum(sent), "dropped": 0, "messages": sum(sent),
                          "cpu_s": time.process_time() - cpu0}), flush=True)

    asyncio.run(main())


async def bench(port: int, sources: int, rate: float, duration: float, procs: int, broker_pid: int
                ) -> dict[str, Any]:
    from kvtop.compose import build_attach_session
    from kvtop.fleet import combine, source_row, source_status

    url = f"mqtt://127.0.0.1:{port}/bench"
    session = build_attach_session(url, command="attach")
    lat: list[float] = []
    last_seq: dict[str, int] = {}
    state = {"received": 0, "lost": 0, "measuring": False, "table_s": 0.0, "tables": 0}

    def timing(rec: Record) -> None:  # a sink: runs after the record's fold
        if rec.kind != "summary":
            return
        if state["measuring"]:
            lat.append(time.time() - rec.time)
        state["received"] += 1
        key = rec.source.key()
        seq = rec.data.get("seq", 0)
        prev = last_seq.get(key)
        if prev is not None and seq > prev + 1:
            state["lost"] += seq - prev - 1
        last_seq[key] = seq

    session.add_sink(timing)
    task = asyncio.ensure_future(session.run())

    async def table() -> None:
        while True:
            await asyncio.sleep(1.0)
            if not state["measuring"]:
                continue
            t0 = time.process_time()
            rows = [source_row(k, m, source_status(k, session.status)) for k, m in list(session.models.items())]
            combine(rows)
            state["table_s"] += time.process_time() - t0
            state["tables"] += 1

    table_task = asyncio.ensure_future(table())
    await asyncio.sleep(0.5)
    per = [sources // procs + (1 if i < sources % procs else 0) for i in range(procs)]
    children = []
    first = 0
    for n in per:
        child = await asyncio.create_subprocess_exec(
            sys.executable, __file__, "--child", url, str(first), str(n), str(rate), str(duration),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=child_env())
        children.append(child)
        first += n
    await children_ready(children)
    await asyncio.sleep(1.0)
    base = state["received"]
    state["measuring"] = True
    cpu0, wall0, mcpu0 = time.process_time(), time.monotonic(), cpu_seconds(broker_pid)
    outs = await go_and_collect(children)
    sent = sum(o["sent"] for o in outs)
    publishers_cpu = sum(o["cpu_s"] for o in outs)
    deadline = time.monotonic() + 10
    while state["received"] - base < sent and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    wall = time.monotonic() - wall0
    cpu = time.process_time() - cpu0
    state["measuring"] = False
    table_task.cancel()
    session.stop()
    await asyncio.wait_for(task, 10)
    received = state["received"] - base
    keys = [k for k in session.models if k.endswith("/fleet")]
    return {"sources": sources, "rate_hz": rate, "duration_s": duration, "publisher_procs": procs,
            "sent": sent, "received": received, "lost_by_seq": state["lost"],
            "dropped_by_publishers": sum(o["dropped"] for o in outs),
            "sources_seen": len(keys), "payload_bytes": None,
            "p50_ms": 1000 * pct(lat, 50), "p99_ms": 1000 * pct(lat, 99), "max_ms": 1000 * max(lat) if lat else None,
            "subscriber_cpu_pct": 100 * cpu / wall,
            "fleet_table_cpu_pct": 100 * state["table_s"] / wall,
            "fleet_table_ms_per_refresh": 1000 * state["table_s"] / max(1, state["tables"]),
            "mosquitto_cpu_pct": 100 * (cpu_seconds(broker_pid) - mcpu0) / wall,
            "publishers_cpu_pct": 100 * publishers_cpu / wall, "wall_s": wall,
            "subscriber_us_per_message": 1e6 * cpu / max(1, received)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sources", type=int, default=1000)
    ap.add_argument("--rate", type=float, default=2.0)
    ap.add_argument("--duration", type=float, default=30.0)
    ap.add_argument("--procs", type=int, default=4)
    ap.add_argument("--out", default=None, help="also write the result JSON here")
    ap.add_argument("--child", nargs=5)
    args = ap.parse_args()
    if args.child:
        url, first, count, rate, duration = args.child
        fleet_child(url, int(first), int(count), float(rate), float(duration))
        return
    from kvtop.agent import summary_data
    from kvtop.records import encode

    size = len(encode(Record("summary", summary_data(_stream_model(), 0, 0.5, "agent-bench"),
                             SourceId("node-0000:5557", 0, "fleet"), time.time())))
    workdir = Path(tempfile.mkdtemp(prefix="kvtop-bench-fleet-"))
    broker, port = start_mosquitto(workdir)
    version = subprocess.run(["mosquitto", "-h"], capture_output=True, text=True).stdout.splitlines()[0]
    try:
        result = asyncio.run(bench(port, args.sources, args.rate, args.duration, args.procs, broker.pid))
    finally:
        broker.terminate()
        broker.wait(5)
    result["payload_bytes"] = size
    try:
        load = os.getloadavg()
    except OSError:
        load = None
    out = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
                      f"Python {platform.python_version()}", "broker": version, "loadavg_after": load,
           "fleet": result}
    text = json.dumps(out, indent=1)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
