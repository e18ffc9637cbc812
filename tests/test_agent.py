"""``kvtop agent``: a real agent process attached to a real ZMQ publisher, publishing through a real broker
(mosquitto in CI) to a dashboard-side session whose fleet table shows the agent's sources."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections import Counter

import pytest
from kv_publisher import Publisher, removed, stored

from kvtop.agent import summary_data
from kvtop.attach import build_attach_session
from kvtop.fleet import aggregate, source_row, source_status
from kvtop.records import Record, SourceId, decode, encode
from kvtop.tiers import TierModel


def test_summary_round_trips_into_a_remote_tier_model():
    """What the agent folds is what the dashboard shows: gauges as they are, totals diffed into its own rates."""
    from test_kv_stream import batch

    local = TierModel()
    local.apply(batch(0, [stored([1, 2, 3, 4])], t=1.0))
    remote = TierModel()
    src = SourceId("node-7:5557", 0, "r")
    remote.apply(decode(encode(Record("summary", summary_data(local, 0, 0.5, "agent-x"), src, 1.0))))
    local.apply(batch(1, [stored([1, 2], medium="CPU"), removed([3])], t=2.0))
    local.apply(batch(2, [stored([5])], t=3.0))
    remote.apply(decode(encode(Record("summary", summary_data(local, 1, 0.5, "agent-x"), src, 3.0))))
    assert (remote.gpu.cached_blocks, remote.host.cached_blocks) == (4, 2)
    assert (remote.moves.offloaded_blocks, remote.moves.evicted_gpu_blocks) == (2, 1)
    assert remote.rates.offloaded_per_s == pytest.approx(1.0)  # 2 blocks over 2 s of the remote's own clock
    assert remote.quality.events_seen and not remote.quality.counts_approximate
    row = source_row("node-7:5557/0/r", remote)
    assert (row.gpu_cached, row.host_cached, row.offloaded_per_s) == (4, 2, pytest.approx(1.0))
    # a lost summary is counted; a total going back (agent restarted) is taken as the new delta
    remote.apply(Record("summary", summary_data(local, 5, 0.5, "agent-x"), src, 4.0))
    assert remote.summary()["stream"]["summaries_lost"] == 3
    fresh = summary_data(TierModel(), 0, 0.5, "agent-x")
    remote.apply(Record("summary", {**fresh, "totals": {**fresh["totals"], "offloaded": 1}}, src, 5.0))
    assert remote.moves.offloaded_blocks == 3


def test_the_agents_verdict_travels_checked():
    """A far dashboard shows the verdict of the agent, which saw the engine's iterations and requests; what a
    summary claims is checked (a says outside the five, a NaN, control characters in its words)."""
    from sim_runs import fold_simulated
    from test_verdict import _unique

    local, _ = fold_simulated(_unique(60, 2048), primary_blocks=1024, secondary_blocks=8192)
    said = local.verdict["host"]
    assert said.says == "idle" and said.spent_s
    remote = TierModel()
    src = SourceId("node-7:5557", 0, "r")
    data = summary_data(local, 0, 0.5, "agent-x")
    remote.apply(decode(encode(Record("summary", data, src, 1.0))))
    got = remote.verdict["host"]
    assert (got.says, got.stored_blocks) == ("idle", said.stored_blocks)
    assert got.spent_s == pytest.approx(said.spent_s, rel=1e-3) and got.basis == said.basis[:160]
    assert remote.summary()["verdict"]["host"]["says"] == "idle"

    hostile = {**data["verdict"]["host"], "says": "pays", "net_s": float("nan"), "basis": "\x1b[2Jmeasured\x07"}
    remote.apply(Record("summary", {**data, "seq": 1, "verdict": {"host": hostile}}, src, 2.0))
    got = remote.verdict["host"]
    assert (got.says, got.net_s, got.basis) == ("pays", None, "measured")
    remote.apply(Record("summary", {**data, "seq": 2, "verdict": {"host": {**hostile, "says": "great"}}}, src, 3.0))
    assert remote.verdict["host"].says != "great"   # not a verdict: the remote's own (from the totals) instead


def test_summary_is_small():
    from test_kv_stream import batch

    m = TierModel()
    m.apply(batch(0, [stored(list(range(1000)))], t=1.0))
    assert len(encode(Record("summary", summary_data(m, 0, 0.5, "a"), SourceId("h", 0, "r"), 1.0))) < 1500


@pytest.mark.slow
@pytest.mark.mqtt
@pytest.mark.parametrize("raw", [False, True])
async def test_agent_publishes_summaries_a_dashboard_shows_in_its_fleet_table(mqtt_broker, raw):
    pub = Publisher(replay=False)
    agent = None
    try:
        dash = build_attach_session(mqtt_broker.url("fleet"), command="attach")
        kinds: Counter[str] = Counter()
        dash.add_sink(lambda r: kinds.update([r.kind]))
        task = asyncio.ensure_future(dash.run())
        agent = subprocess.Popen([sys.executable, "-m", "kvtop", "agent", pub.url, "--mqtt",
                                  mqtt_broker.url("fleet"), "--run", "n7", "--interval", "0.25", "--duration", "6",
                                  "--json", *(["--raw"] if raw else [])],
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        key = f"127.0.0.1:{pub.port}/0/n7"
        deadline = time.monotonic() + 15
        sent = False
        while time.monotonic() < deadline:
            if not sent and dash.status.get(f"agent-{__import__('socket').gethostname()}/0/n7") == "online":
                await asyncio.to_thread(pub.wait_subscribed)  # the agent's SUB has joined
                pub.send([stored([1, 2, 3, 4])])
                pub.send([stored([1, 2], medium="CPU"), removed([3])])
                sent = True
            m = dash.models.get(key)
            if m is not None and m.gpu.cached_blocks == 3 and m.host.cached_blocks == 2 and (
                    m.summary()["stream"]["summaries"] >= 2):
                break
            await asyncio.sleep(0.1)
        m = dash.models[key]
        row = source_row(key, m, source_status(key, dash.status))
        assert (row.gpu_cached, row.host_cached) == (3, 2)
        assert (m.moves.offloaded_blocks, m.moves.evicted_gpu_blocks) == (2, 1)
        assert m.meta["engine"] == "vllm-format" and m.summary()["stream"]["summaries"] >= 1
        assert kinds["summary"] >= 1
        assert kinds["kv_batch"] == (2 if raw else 0)  # raw events only with --raw
        out, err = await asyncio.to_thread(agent.communicate, timeout=30)
        assert agent.returncode == 0, err
        result = json.loads(out)
        assert result["sources"] == [key] and result["summaries"] >= 2 and result["mqtt_dropped"] == 0
        deadline = time.monotonic() + 10
        agent_key = f"agent-{__import__('socket').gethostname()}/0/n7"
        while dash.status.get(agent_key) != "offline" and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert dash.status.get(agent_key) == "offline"
        # the agent's sources follow its status: their row says offline and the fleet's aggregate leaves them out
        assert m.agent == agent_key and source_status(key, dash.status) == "offline"
        assert aggregate(dash.models, dash.status)["sources"] == 0
        dash.stop()
        await asyncio.wait_for(task, 10)
    finally:
        if agent is not None and agent.poll() is None:
            agent.kill()
        pub.close()


def test_agent_bad_options_say_what_is_wrong():
    for argv, needle in ((["zmq://127.0.0.1:1"], "--mqtt"),
                         (["zmq://127.0.0.1:1", "--mqtt", "ftp://x"], "--mqtt"),
                         (["zmq://127.0.0.1:1", "--mqtt", "mqtt://127.0.0.1:1", "--interval", "0"], "--interval"),
                         (["zmq://nope", "--mqtt", "mqtt://127.0.0.1:1"], "no port")):
        out = subprocess.run([sys.executable, "-m", "kvtop", "agent", *argv], capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 2 and needle in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_raw_records_beside_summaries_are_not_counted_twice():
    from test_kv_stream import batch

    local = TierModel()
    remote = TierModel()
    src = SourceId("node-7:5557", 0, "r")
    for seq, t, events in ((0, 1.0, [stored([1, 2, 3, 4])]), (1, 2.0, [stored([1, 2], medium="CPU")])):
        b = batch(seq, events, t=t)
        local.apply(b)
        remote.apply(Record(b.kind, b.data, src, t))             # --raw: the record itself...
        remote.apply(Record("summary", summary_data(local, seq, 0.5, "a"), src, t))   # ...and the summary
    b = batch(2, [removed([3])], t=3.0)
    local.apply(b)
    remote.apply(Record(b.kind, b.data, src, 3.0))
    remote.apply(Record("summary", summary_data(local, 2, 0.5, "a"), src, 3.0))
    assert (remote.moves.offloaded_blocks, remote.moves.evicted_gpu_blocks) == (2, 1)
    assert (remote.gpu.cached_blocks, remote.host.cached_blocks) == (3, 2)
    assert remote.summary()["stream"]["raw_ignored"] == 2


def test_a_prometheus_scrape_of_a_dashboard_serves_the_agents_sources():
    """The fleet from summaries, for Prometheus: kvtop attach mqtt:// --prometheus-port exports each source."""
    from test_kv_stream import batch

    from kvtop.session import Session
    from kvtop.sinks.prometheus import PrometheusExporter

    session = Session(source=SourceId("dash", 0, ""))
    for n in range(3):
        local = TierModel()
        local.apply(batch(0, [stored(list(range(10 * (n + 1))))], t=1.0))
        session.emit(Record("summary", summary_data(local, 0, 0.5, f"agent-{n}/0/r"),
                            SourceId(f"node-{n}:5557", 0, "r"), 1.0))
    text = PrometheusExporter(lambda: session.models, port=0).render().decode()
    for n in range(3):
        line = f'kvtop_kv_cached_blocks{{host="node-{n}:5557",rank="0",run="r",tier="gpu"}} {10.0 * (n + 1)}'
        assert line in text, [x for x in text.splitlines() if "kvtop_kv_cached_blocks{" in x][:6]
