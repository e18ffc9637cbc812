"""MQTT transport against a real broker (mosquitto, else amqtt; see conftest.py): URLs, round trip into a
TierModel, retained meta, last will, broker restart, malformed payloads, a down broker, credentials."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from typing import Any

import pytest

from kvtop.records import Record, SourceId, make
from kvtop.sinks.mqtt import MqttPublisher, strip_tokens
from kvtop.sources.mqtt import (
    MqttSubscriber,
    MqttUrlError,
    parse_mqtt_url,
    parse_topic,
    topic_for,
)
from kvtop.tiers import TierModel

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SECRET = "s3cret-pw-91"


async def wait_for(cond: Callable[[], bool], timeout: float = 5.0, step: float = 0.02) -> float:
    """Wait until ``cond()``; returns the seconds it took. Fails the test on timeout."""
    t0 = time.monotonic()
    while not cond():
        if time.monotonic() - t0 > timeout:
            raise AssertionError(f"condition not met within {timeout} s")
        await asyncio.sleep(step)
    return time.monotonic() - t0


class Statuses:
    def __init__(self) -> None:
        self.items: list[tuple[float, str, str]] = []

    def __call__(self, name: str, message: str) -> None:
        self.items.append((time.monotonic(), name, message))

    def has(self, name: str, text: str) -> bool:
        return any(n == name and text in m for _, n, m in self.items)

    def text(self) -> str:
        return "\n".join(f"{n}: {m}" for _, n, m in self.items)


def stats(i: int, src: SourceId) -> Record:
    return make("stats", {"iter": i, "kvCacheStats": {"maxNumBlocks": 100, "freeNumBlocks": 100 - i % 50,
                                                       "usedNumBlocks": i % 50, "tokensPerBlock": 32}}, src)


# ---------------------------------------------------------------------------------------------- no broker needed

def test_url_parsing() -> None:
    u = parse_mqtt_url("mqtt://broker.lab:1999/site/a", env={})
    assert (u.host, u.port, u.prefix, u.tls, u.username) == ("broker.lab", 1999, "site/a", False, None)
    assert u.topic_filter() == "site/a/kvtop/v1/#"
    u = parse_mqtt_url("mqtts://kv@broker.lab/", env={})
    assert (u.port, u.tls, u.username, u.prefix) == (8883, True, "kv", "")
    assert u.topic_filter("ab") == "kvtop/v1/ab/#"
    assert "tls_context" in u.client_kwargs()
    assert parse_mqtt_url("mqtt://h", env={}).port == 1883
    for bad, says in (("http://h/x", "mqtt:// or mqtts://"), ("mqtt:///x", "host is missing"),
                      ("mqtt://h:99999/x", "port"), ("mqtt://h/a+b", "may not contain"),
                      ("mqtt://h/x?foo=1", "unknown URL parameter")):
        with pytest.raises(MqttUrlError, match=says):
            parse_mqtt_url(bad, env={})


def test_password_in_url_rejected_without_echoing_it() -> None:
    with pytest.raises(MqttUrlError) as err:
        parse_mqtt_url(f"mqtt://kv:{SECRET}@h/x", env={})
    text = str(err.value)
    assert SECRET not in text
    assert "KVTOP_MQTT_PASSWORD" in text and "--mqtt-password-file" in text and "kv:***@h" in text


def test_password_from_env_or_file(tmp_path: Any) -> None:
    u = parse_mqtt_url("mqtt://kv@h/x", env={"KVTOP_MQTT_PASSWORD": SECRET})
    assert u.password == SECRET and u.password_origin == "KVTOP_MQTT_PASSWORD"
    assert SECRET not in repr(u) and SECRET not in u.display()
    pw = tmp_path / "pw"
    pw.write_text(SECRET + "\n")
    u = parse_mqtt_url("mqtt://kv@h/x", password_file=pw, env={"KVTOP_MQTT_PASSWORD": "other"})
    assert u.password == SECRET and u.password_origin == f"file {pw}"  # the file, given explicitly, wins
    with pytest.raises(MqttUrlError, match="cannot read"):
        parse_mqtt_url("mqtt://kv@h/x", password_file=tmp_path / "missing", env={})
    with pytest.raises(MqttUrlError, match="names no user"):
        parse_mqtt_url("mqtt://h/x", env={"KVTOP_MQTT_PASSWORD": SECRET})


def test_topics_round_trip() -> None:
    src = SourceId("gpu-07.lab", 3, "ab/host+10g#")
    topic = topic_for("site/a", src, "kv_event")
    assert topic == "site/a/kvtop/v1/ab_host_10g_/gpu-07.lab:3/kv_event"
    parts = parse_topic("site/a", topic)
    assert parts is not None and parts.kind == "kv_event" and parts.key == "gpu-07.lab/3/ab_host_10g_"
    assert parse_topic("site/a", "site/a/other/v1/r/s/k") is None


def test_strip_tokens_keeps_what_the_fold_needs() -> None:
    ev = {"event_id": 1, "data": {"type": "stored", "parent_hash": None, "blocks": [
        {"type": "stored_block", "block_hash": 2**64 - 1, "cache_level": 0, "priority": 35,
         "tokens": [{"type": "unique_token", "token_id": 7, "token_extra_id": 0}] * 32}]}, "window_size": 4096}
    rec = make("kv_event", ev, SourceId("h", 0, "r"))
    slim = strip_tokens(rec)
    block = slim.data["data"]["blocks"][0]
    assert block["tokens"] == [] and block["num_tokens"] == 32 and block["block_hash"] == 2**64 - 1
    assert rec.data["data"]["blocks"][0]["token_ids"] == [7] * 32  # the original is untouched (the recorder keeps it)
    # a token list that is not all plain stays TensorRT-LLM's dicts; stripped the same way
    ev["data"]["blocks"][0]["tokens"][3] = {"type": "unique_token", "token_id": 7, "token_extra_id": 5}
    rec = make("kv_event", ev, SourceId("h", 0, "r"))
    assert len(rec.data["data"]["blocks"][0]["tokens"]) == 32
    block = strip_tokens(rec).data["data"]["blocks"][0]
    assert block["tokens"] == [] and block["num_tokens"] == 32 and "token_ids" not in block


async def test_publisher_with_broker_down_never_blocks_and_counts_drops() -> None:
    from conftest import free_port

    statuses = Statuses()
    pub = MqttPublisher(f"mqtt://127.0.0.1:{free_port()}/x", SourceId("h", 0, "down"), max_queue=1000,
                        on_status=statuses)
    task = asyncio.ensure_future(pub.run())
    await asyncio.sleep(0.1)
    src = SourceId("h", 0, "down")
    recs = [stats(i, src) for i in range(20_000)]
    t0 = time.perf_counter()
    for rec in recs:
        pub.publish(rec)
    per_call_us = (time.perf_counter() - t0) / len(recs) * 1e6
    assert per_call_us < 20, f"publish() took {per_call_us:.1f} us per record"  # ~1 us measured
    assert pub.queued == 1000 and pub.dropped == 19_000
    assert [r.data["iter"] for r in (pub._queue[0], pub._queue[-1])] == [19_000, 19_999]  # the newest kept
    await wait_for(lambda: statuses.has("mqtt-publish", "disconnected"), 3.0)
    assert "Connection refused" in statuses.text() or "refused" in statuses.text().lower()
    pub.stop()
    await asyncio.wait_for(task, 3.0)


# ---------------------------------------------------------------------------------------------- real broker

@pytest.mark.mqtt
async def test_round_trip_folds_to_the_same_tier_model(mqtt_broker: Any) -> None:
    from kvtop.engines.sim import KvCacheConfig, SamplingParams, SimLLM
    from kvtop.sources.poller import EnginePoller

    url = mqtt_broker.url("lab")
    src = SourceId("node-1", 0, "rt")
    local, remote = TierModel(), TierModel()
    received: list[Record] = []

    def on_remote(rec: Record) -> None:
        received.append(rec)
        remote.apply(rec)

    sub = MqttSubscriber(url, on_remote)
    sub_task = asyncio.ensure_future(sub.run())
    await wait_for(lambda: sub.connected)
    pub = MqttPublisher(url, src)
    pub_task = asyncio.ensure_future(pub.run())

    def sink(rec: Record) -> None:
        local.apply(rec)
        pub.publish(rec)

    # 4,096 tokens (128 blocks): the eight users' 600-token tails of the third turn (150 blocks) overflow it. (At
    # 8,192 they overflowed only while all eight computed the shared 1,600-token system prompt at once; TensorRT-LLM's
    # scheduler lets one compute it and the others reuse it an iteration later, beneficialToSkip.)
    llm = SimLLM("Qwen/Qwen3-8B", kv_cache_config=KvCacheConfig(host_cache_size=2 * 2**30, max_tokens=4096,
                                                                 event_buffer_max_size=4096),
                 enable_iter_perf_stats=True, speed=0)
    try:
        meta = make("meta", llm.describe(), src)
        sink(meta)
        poller = EnginePoller(llm, src, 0.05, sink)
        poll_task = asyncio.ensure_future(poller.run())
        system = list(range(1000, 2600))
        for turn in range(3):
            outs = [llm.generate_async(system + [40_000 + 1000 * u + t for t in range(200 * (turn + 1))],
                                       SamplingParams(max_tokens=16)) for u in range(8)]
            await asyncio.gather(*(o.aresult() for o in outs))
        llm.wait_idle()
        await asyncio.sleep(0.3)
        poller.stop()
        await poll_task
        await poller.poll_once()
        await wait_for(lambda: pub.queued == 0 and len(received) == pub.published, 5.0)
    finally:
        llm.shutdown()
    assert pub.dropped == 0 and sub.malformed == 0
    kinds = {r.kind for r in received}
    assert {"meta", "stats", "kv_event"} <= kinds
    # The same fold on both sides of the broker (token ids stripped on the wire change nothing it reads).
    ls, rs = local.summary(), remote.summary()
    assert ls["moves"]["offloaded_blocks"] > 0, "workload should overflow the GPU pool into host memory"
    for key in ("tiers", "moves", "hit_rate"):
        assert rs[key] == ls[key], key
    # One source sends at most ~10 kv_event messages a second however many events its engine makes.
    assert pub.messages < pub.published
    pub.stop()
    sub.stop()
    await asyncio.gather(pub_task, sub_task)


@pytest.mark.mqtt
async def test_retained_meta_and_status_reach_a_late_subscriber(mqtt_broker: Any) -> None:
    url = mqtt_broker.url("lab")
    src = SourceId("node-2", 1, "late")
    pub = MqttPublisher(url, src)
    pub_task = asyncio.ensure_future(pub.run())
    pub.publish(make("meta", {"engine": "sim", "model": "Qwen/Qwen3-8B", "primary_blocks": 256}, src))
    pub.publish(stats(1, src))  # QoS 0 and not retained: a late subscriber does not get it
    await wait_for(lambda: pub.published == 2)
    await asyncio.sleep(0.2)

    got: list[Record] = []
    statuses = Statuses()
    sub = MqttSubscriber(url, got.append, on_status=statuses)
    sub_task = asyncio.ensure_future(sub.run())
    await wait_for(lambda: any(r.kind == "meta" for r in got))
    assert [r.kind for r in got] == ["meta"]
    assert got[0].source == src and got[0].data["primary_blocks"] == 256
    await wait_for(lambda: sub.sources.get(src.key()) == "online")
    pub.stop()
    await pub_task
    await wait_for(lambda: sub.sources.get(src.key()) == "offline")  # a clean stop says offline too
    sub.stop()
    await sub_task


_CHILD = textwrap.dedent("""
    import asyncio, sys
    from kvtop.records import SourceId, make
    from kvtop.sinks.mqtt import MqttPublisher

    async def main():
        src = SourceId("child", 0, "lwt")
        pub = MqttPublisher(sys.argv[1], src)
        pub.publish(make("meta", {"engine": "sim"}, src))
        task = asyncio.ensure_future(pub.run())
        while pub.published < 1:
            await asyncio.sleep(0.01)
        print("ready", flush=True)
        i = 0
        while True:
            pub.publish(make("stats", {"iter": i}, src))
            i += 1
            await asyncio.sleep(0.05)

    asyncio.run(main())
""")


def spawn_child_publisher(url: str, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    proc = subprocess.Popen([sys.executable, "-c", _CHILD, url], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": ROOT, **(env or {})})
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.strip() == "ready", proc.stderr.read() if proc.stderr else line
    return proc


@pytest.mark.mqtt
async def test_last_will_marks_a_killed_publisher_offline(mqtt_broker: Any) -> None:
    url = mqtt_broker.url("lab")
    statuses = Statuses()
    got: list[Record] = []
    sub = MqttSubscriber(url, got.append, on_status=statuses)
    sub_task = asyncio.ensure_future(sub.run())
    key = SourceId("child", 0, "lwt").key()
    proc = await asyncio.to_thread(spawn_child_publisher, url)
    try:
        await wait_for(lambda: sub.sources.get(key) == "online", 5.0)
        await wait_for(lambda: any(r.kind == "stats" for r in got), 5.0)
        proc.send_signal(signal.SIGKILL)  # no goodbye: only the broker's last will can say it
        proc.wait(5)
        took = await wait_for(lambda: sub.sources.get(key) == "offline", 5.0)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
    assert took < 2.0  # the kernel closes the socket at once; the broker publishes the will on seeing it
    assert statuses.has(key, "offline")
    sub.stop()
    await sub_task


@pytest.mark.slow
@pytest.mark.mqtt
async def test_broker_restart_reconnects_within_5s_and_data_flows_again(mqtt_broker: Any) -> None:
    url = mqtt_broker.url("lab")
    src = SourceId("node-3", 0, "restart")
    statuses = Statuses()
    got: list[Record] = []
    sub = MqttSubscriber(url, got.append, on_status=statuses)
    pub = MqttPublisher(url, src, on_status=statuses)
    tasks = [asyncio.ensure_future(sub.run()), asyncio.ensure_future(pub.run())]
    pub.publish(make("meta", {"engine": "sim"}, src))
    i = 0

    async def feed(n: int) -> None:
        nonlocal i
        for _ in range(n):
            pub.publish(stats(i, src))
            i += 1
            await asyncio.sleep(0.02)

    await wait_for(lambda: sub.connected and pub.connected)
    await feed(10)
    await wait_for(lambda: sum(r.kind == "stats" for r in got) >= 10)

    await asyncio.to_thread(mqtt_broker.stop)
    await wait_for(lambda: not sub.connected and not pub.connected, 5.0)
    await feed(5)  # published into the publisher's queue while the broker is down
    await asyncio.sleep(1.0)  # a broker that stays away a while: the backoff grows meanwhile
    await asyncio.to_thread(mqtt_broker.start)
    up = time.monotonic()
    took_sub = await wait_for(lambda: sub.connected, 5.0)
    took_pub = await wait_for(lambda: pub.connected, 5.0)
    assert max(took_sub, took_pub) < 5.0
    assert sub.gaps and sub.gaps[-1] >= 1.0  # the gap is measured and reported
    assert statuses.has("mqtt", "reconnected") and statuses.has("mqtt", "disconnected")
    await feed(10)
    # Data flows again, and what was queued while the broker was down arrives too.
    await wait_for(lambda: {r.data["iter"] for r in got if r.kind == "stats"} == set(range(i)), 5.0)
    assert pub.dropped == 0
    assert time.monotonic() - up < 10
    pub.stop()
    sub.stop()
    await asyncio.gather(*tasks)


@pytest.mark.slow
@pytest.mark.mqtt
async def test_broker_down_at_start_is_retried(tmp_path: Any) -> None:
    from conftest import MqttBroker, _broker_available

    if _broker_available(os.environ.get("KVTOP_TEST_BROKER") or None):
        pytest.skip("no broker")
    broker = MqttBroker(tmp_path, os.environ.get("KVTOP_TEST_BROKER") or None)
    statuses = Statuses()
    sub = MqttSubscriber(broker.url("lab"), lambda r: None, on_status=statuses)
    task = asyncio.ensure_future(sub.run())
    try:
        await wait_for(lambda: statuses.has("mqtt", "disconnected"), 3.0)
        await asyncio.sleep(1.0)
        n_reports = len(statuses.items)
        assert n_reports == 1, statuses.text()  # reported once per streak, not on every retry
        await asyncio.to_thread(broker.start)
        took = await wait_for(lambda: sub.connected, 5.0)
        assert took < 2.5  # the backoff is capped at 2 s
        assert statuses.has("mqtt", "connected to")
    finally:
        sub.stop()
        await task
        broker.kill()


@pytest.mark.mqtt
async def test_malformed_payloads_are_counted_never_fatal(mqtt_broker: Any) -> None:
    import aiomqtt

    url = mqtt_broker.url("lab")
    errors = Statuses()
    got: list[Record] = []
    sub = MqttSubscriber(url, got.append, on_error=errors)
    task = asyncio.ensure_future(sub.run())
    await wait_for(lambda: sub.connected)
    good = make("stats", {"iter": 1}, SourceId("h", 0, "r"))
    base = "lab/kvtop/v1/r/h:0"
    async with aiomqtt.Client("127.0.0.1", mqtt_broker.port) as c:
        await c.publish(f"{base}/stats", b"{not json", qos=1)
        await c.publish(f"{base}/stats", b'{"v": 99, "kind": "stats", "time": 1, "data": {}}', qos=1)
        await c.publish(f"{base}/kv_event", b'{"v": 1, "kind": "kv_event", "time": 1, "data": {"event_id": 1}}',
                        qos=1)
        await c.publish(f"{base}/bogus", b"{}", qos=1)
        await c.publish(f"{base}/status", b"maybe", qos=1)
        await c.publish(f"{base}/stats", b"\xff\xfe", qos=1)
        from kvtop.records import encode
        await c.publish(f"{base}/stats", encode(good), qos=1)
    await wait_for(lambda: len(got) == 1)
    assert sub.malformed == 6, errors.text()
    assert "schema version 99" in errors.text() and "data.data: is missing" in errors.text()
    assert got[0].data == {"iter": 1}
    sub.stop()
    await task


@pytest.mark.mqtt
async def test_password_never_logged_nor_on_the_command_line(mqtt_broker_auth: Any, monkeypatch: Any,
                                                             caplog: Any) -> None:
    caplog.set_level(logging.DEBUG)  # paho and aiomqtt at their chattiest
    monkeypatch.setenv("KVTOP_MQTT_PASSWORD", SECRET)
    url = mqtt_broker_auth.url("lab", user="kv")
    statuses = Statuses()
    got: list[Record] = []
    sub = MqttSubscriber(url, got.append, on_status=statuses)
    sub_task = asyncio.ensure_future(sub.run())
    await wait_for(lambda: sub.connected, 5.0)
    # A publisher in another process, the password from its environment: not in its argv.
    proc = await asyncio.to_thread(spawn_child_publisher, url, {"KVTOP_MQTT_PASSWORD": SECRET})
    try:
        with open(f"/proc/{proc.pid}/cmdline", "rb") as fh:
            argv = fh.read()
        assert SECRET.encode() not in argv and b"kv@127.0.0.1" in argv
        await wait_for(lambda: any(r.kind == "stats" for r in got), 5.0)
    finally:
        proc.kill()
        _, child_err = proc.communicate(timeout=5)
    assert SECRET not in child_err
    # A wrong password: a clear message, still no secret anywhere.
    monkeypatch.setenv("KVTOP_MQTT_PASSWORD", "wrong-" + SECRET[::-1])
    bad = MqttSubscriber(url, lambda r: None, on_status=statuses)
    bad_task = asyncio.ensure_future(bad.run())
    await wait_for(lambda: statuses.has("mqtt", "not authori") or statuses.has("mqtt", "Not authori"), 5.0)
    assert "KVTOP_MQTT_PASSWORD" in statuses.text()
    bad.stop()
    sub.stop()
    await asyncio.gather(sub_task, bad_task)
    for text in (caplog.text, statuses.text(), repr(sub.url), sub.url.display(), " ".join(sys.argv)):
        assert SECRET not in text and SECRET[::-1] not in text


@pytest.mark.mqtt
async def test_records_iterator(mqtt_broker: Any) -> None:
    url = mqtt_broker.url("it")
    src = SourceId("h", 0, "iter")
    pub = MqttPublisher(url, src)
    pub_task = asyncio.ensure_future(pub.run())
    sub = MqttSubscriber(url)
    got: list[Record] = []

    async def consume() -> None:
        async with contextlib.aclosing(sub.records()) as records:
            async for rec in records:
                got.append(rec)
                if len(got) == 3:
                    break  # leaving the block closes the iterator, which stops the subscription

    consumer = asyncio.ensure_future(consume())
    await wait_for(lambda: sub.connected)
    for i in range(3):
        pub.publish(stats(i, src))
    await asyncio.wait_for(consumer, 5.0)
    assert [r.data["iter"] for r in got] == [0, 1, 2] and not sub.connected
    pub.stop()
    await pub_task
