"""``kvtop agent``: a real agent process attached to a real ZMQ publisher, publishing through a real broker
(mosquitto in CI) to a dashboard-side session whose fleet table shows the agent's sources."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time
from collections import Counter
from typing import Any

import pytest
from kv_publisher import Publisher, removed, stored

from kvtop.agent import Agent, summary_data
from kvtop.compose import build_attach_session
from kvtop.fleet import aggregate, source_row, source_status
from kvtop.records import Record, SourceId, decode, encode
from kvtop.tiers import TierModel


def test_summary_round_trips_into_a_remote_tier_model():
    """What the agent folds is what the dashboard shows: gauges as they are, totals diffed into its own rates."""
    from kv_publisher import batch

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
    from sim_runs import fold_simulated, unique_prompts

    local, _ = fold_simulated(unique_prompts(60, 2048), primary_blocks=1024, secondary_blocks=8192)
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
    from kv_publisher import batch

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
    from kv_publisher import batch

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
    from kv_publisher import batch

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


# ------------------------------------------------------------------------------------------ issue 24, item 4

def _sim_recording(path: Any, *, stretch: float = 1.0, n_requests: int = 30) -> list[Record]:
    """A simulated run with request records (TTFT, tokens) written to ``path``, its times ``stretch``-ed from the
    first record's (a replay at speed 1 then lasts ~0.4 s x stretch); returns the records as written."""
    from sim_runs import record_sim_run

    from kvtop.records import read_jsonl

    record_sim_run(path, n_requests=n_requests)
    records = [r for r in read_jsonl(path) if isinstance(r, Record)]
    t0 = records[0].time
    records = [Record(r.kind, r.data, r.source, t0 + (r.time - t0) * stretch) for r in records]
    with open(path, "w", encoding="utf-8") as fh:
        fh.writelines(encode(r) + "\n" for r in records)
    return records


def _fold(records: list[Record]) -> TierModel:
    m = TierModel()
    for r in records:
        m.apply(r)
    return m


class _Sent:
    """A publisher that keeps what it is handed (the agent's side of the wire, read back)."""

    def __init__(self) -> None:
        self.records: list[Record] = []

    def publish(self, record: Record) -> None:
        self.records.append(record)


def test_ttft_and_token_rates_travel_in_summaries_and_unknown_stays_unknown(tmp_path):
    from kv_publisher import batch

    local = _fold(_sim_recording(tmp_path / "run.jsonl"))
    req, rates = local.requests, local.rates
    assert req.ttft.count == 30 and req.ttft.p99_s > req.ttft.p50_s > 0 and rates.output_tokens_per_s > 0
    data = decode(encode(Record("summary", summary_data(local, 0, 0.5, "agent-x"), SourceId("h", 0, "r"), 1.0)))
    said = data.data
    assert said["ttft"]["count"] == 30
    assert said["ttft"]["p50_s"] == pytest.approx(req.ttft.p50_s, abs=1e-4)
    assert said["ttft"]["p99_s"] == pytest.approx(req.ttft.p99_s, abs=1e-4)
    for k in ("prompt_tokens_per_s", "output_tokens_per_s", "ctx_tokens_per_s", "gen_tokens_per_s"):
        assert said["rates"][k] == pytest.approx(getattr(rates, k), rel=1e-3), k
    # ...and the dashboard's model of that source shows them: requests panel, fleet row, --json
    remote = TierModel()
    remote.apply(data)
    assert remote.requests.ttft.p99_s == pytest.approx(req.ttft.p99_s, abs=1e-4)
    assert remote.rates.output_tokens_per_s == pytest.approx(rates.output_tokens_per_s, rel=1e-3)
    assert source_row("h/0/r", remote).ttft_p99_s == pytest.approx(
        (req.window_ttft if req.window_ttft.count else req.ttft).p99_s, abs=1e-4)
    assert remote.summary()["requests"]["ttft_ms"]["p50"] == pytest.approx(req.ttft.p50_s * 1000, abs=0.1)

    # A source with no requests and no stats (a ZMQ event stream): no TTFT, no token rates. null, never 0.
    events_only = TierModel()
    events_only.apply(batch(0, [stored([1, 2, 3, 4])], t=1.0))
    events_only.apply(batch(1, [stored([5])], t=2.0))
    assert events_only.rates.output_tokens_per_s == 0.0          # the local counters never moved...
    text = encode(Record("summary", summary_data(events_only, 0, 0.5, "a"), SourceId("h", 0, "r"), 2.0))
    said = json.loads(text)["data"]
    assert said["ttft"] is None
    assert [said["rates"][k] for k in ("prompt_tokens_per_s", "output_tokens_per_s", "ctx_tokens_per_s",
                                       "gen_tokens_per_s")] == [None] * 4     # ...but they say nothing
    remote = TierModel()
    remote.apply(decode(text))
    remote.apply(Record("summary", {**said, "seq": 1}, SourceId("h", 0, "r"), 3.0))
    rates = remote.rates
    assert rates.window_s and rates.output_tokens_per_s is None and rates.prompt_tokens_per_s is None
    assert remote.requests.ttft.p50_s is None and source_row("h/0/r", remote).ttft_p99_s is None
    # a summary's figures come from outside: a NaN or a negative TTFT is unknown, not a number
    remote.apply(Record("summary", {**said, "seq": 2, "ttft": {"p50_s": float("nan"), "p99_s": -1.0, "count": 3},
                                    "rates": {**said["rates"], "output_tokens_per_s": float("inf")}},
                        SourceId("h", 0, "r"), 4.0))
    assert (remote.requests.ttft.p50_s, remote.requests.ttft.p99_s, remote.requests.ttft.count) == (None, None, 3)
    assert remote.rates.output_tokens_per_s is None


def test_an_agent_names_its_sources_rows_by_its_run_name(tmp_path):
    from kvtop.session import Session

    records = _sim_recording(tmp_path / "run.jsonl", n_requests=8)
    session = Session(source=SourceId("agent-host", 0, "n7"))
    sent = _Sent()
    agent = Agent(session, sent, agent=SourceId("agent-host", 0, "n7"), name="n7")
    for r in records:
        session.emit(r)
    assert agent.publish_once(now=10.0) == 1
    metas = [r for r in sent.records if r.kind == "meta"]
    summaries = [r for r in sent.records if r.kind == "summary"]
    # published as the agent's run (the recording's own run was "run"), named n7
    assert [r.source for r in summaries] == [SourceId("sim", 0, "n7")] and agent.published_keys() == ["sim/0/n7"]
    assert metas[0].data["source_name"] == "n7"
    dash = Session(source=SourceId("dash", 0, ""))
    for r in sent.records:
        dash.emit(decode(encode(r)))
    row = source_row("sim/0/n7", dash.models["sim/0/n7"])
    assert (row.key, row.name, row.label) == ("sim/0/n7", "n7", "n7")
    assert row.to_json()["name"] == "n7"

    # a second source of the same agent (rank 1): both rows say which, after the agent's name
    session.emit(Record(records[1].kind, records[1].data, SourceId("sim", 1, "run"), records[1].time))
    sent.records.clear()
    agent.publish_once(now=11.0)
    names = {r.source.key(): r.data["source_name"] for r in sent.records if r.kind == "meta"}
    assert names == {"sim/0/n7": "n7/0", "sim/1/n7": "n7/1"}
    # a name from a broker is cleaned before a table shows it
    hostile = decode(encode(Record("meta", {"engine": "x", "source_name": "\x1b[31mred\x07"}, SourceId("h", 0, "r"))))
    m = TierModel()
    m.apply(hostile)
    assert source_row("h/0/r", m).label == "red"


def _dash(url: str) -> tuple[Any, Any]:
    dash = build_attach_session(url, command="attach")
    return dash, asyncio.ensure_future(dash.run())


def _agent(url: str, source: str, name: str, *extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "kvtop", "agent", source, "--mqtt", url, "--run", name,
                             "--interval", "0.25", "--json", *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.slow
@pytest.mark.mqtt
async def test_agents_replaying_a_recording_stop_at_its_end_named_and_with_their_last_summary(mqtt_broker, tmp_path):
    """Two agents replay one recording (~1.2 s) as alpha and beta: two rows named so, each agent ends by itself at
    the recording's end, and its last summary holds the whole recording before it says offline."""
    import socket

    path = tmp_path / "run.jsonl"
    local = _fold(_sim_recording(path, stretch=3.0))
    url = mqtt_broker.url("names")
    dash, task = _dash(url)
    agents: list[subprocess.Popen[str]] = []
    try:
        await asyncio.sleep(0.5)  # the dashboard subscribed: it hears every status from the first
        agents = [_agent(url, str(path), name) for name in ("alpha", "beta")]
        results = []
        for agent in agents:   # no --duration: the recording's end ends them
            out, err = await asyncio.to_thread(agent.communicate, timeout=60)
            assert agent.returncode == 0, err
            results.append(json.loads(out))
        assert [r["sources"] for r in results] == [["sim/0/alpha"], ["sim/0/beta"]]
        keys = ["sim/0/alpha", "sim/0/beta"]
        agent_keys = [f"agent-{socket.gethostname()}/0/{n}" for n in ("alpha", "beta")]
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not (
                all(dash.status.get(k) == "offline" for k in agent_keys)
                and all(k in dash.models and dash.models[k].requests.completed == 30 for k in keys)):
            await asyncio.sleep(0.1)
        rows = [source_row(k, dash.models[k], source_status(k, dash.status)) for k in keys]
        assert [(r.label, r.status) for r in rows] == [("alpha", "offline"), ("beta", "offline")]
        for k, row in zip(keys, rows):
            m = dash.models[k]
            # the last summary came after the replay's last record: the whole recording, as folded here
            assert (m.requests.completed, m.hit_rate.hits, m.hit_rate.lookups) == (
                30, local.hit_rate.hits, local.hit_rate.lookups)
            assert m.requests.ttft.p99_s == pytest.approx(local.requests.ttft.p99_s, abs=1e-4)
            assert m.requests.ttft.p50_s == pytest.approx(local.requests.ttft.p50_s, abs=1e-4)
            assert m.rates.output_tokens_per_s is not None and row.ttft_p99_s is not None
        # each agent's "online" and "offline" said once in the dashboard's log
        lines = [text for _, _, text in dash.log]
        for a in agent_keys:
            assert lines.count(f"{a}: online") == 1 and lines.count(f"{a}: offline") == 1, lines
        dash.stop()
        await asyncio.wait_for(task, 10)
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()


@pytest.mark.slow
@pytest.mark.mqtt
async def test_agent_honours_duration_and_sigterm_with_its_last_summary(mqtt_broker, tmp_path):
    import signal
    import socket

    path = tmp_path / "long.jsonl"
    _sim_recording(path, stretch=60.0)   # ~23 s of replay at speed 1
    url = mqtt_broker.url("ends")
    dash, task = _dash(url)
    agent = None
    try:
        await asyncio.sleep(0.5)
        started = time.monotonic()
        agent = _agent(url, str(path), "short", "--duration", "1.5")
        out, err = await asyncio.to_thread(agent.communicate, timeout=60)
        assert agent.returncode == 0, err
        assert time.monotonic() - started < 20      # --duration, not the recording's ~23 s
        assert json.loads(out)["summaries"] >= 2

        agent = _agent(url, str(path), "termed")
        agent_key = f"agent-{socket.gethostname()}/0/termed"
        deadline = time.monotonic() + 20
        while dash.models.get("sim/0/termed") is None and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert dash.models.get("sim/0/termed") is not None
        agent.send_signal(signal.SIGTERM)
        out, err = await asyncio.to_thread(agent.communicate, timeout=30)
        assert agent.returncode == 143, err       # terminated, after its account on stdout
        result = json.loads(out)
        assert result["sources"] == ["sim/0/termed"] and result["summaries"] >= 1
        deadline = time.monotonic() + 10
        while dash.status.get(agent_key) != "offline" and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
        assert dash.status.get(agent_key) == "offline"
        assert source_row("sim/0/termed", dash.models["sim/0/termed"],
                          source_status("sim/0/termed", dash.status)).label == "termed"
        dash.stop()
        await asyncio.wait_for(task, 10)
    finally:
        if agent is not None and agent.poll() is None:
            agent.kill()


def test_repeated_lines_fold():
    from kvtop.session import Session, fold_repeats

    assert fold_repeats(["online", "online", "online", "online", "offline", "online"]) == [
        "online x4", "offline", "online"]
    assert fold_repeats([]) == []
    # A status said again (a retained "online" delivered again after a reconnect) is no new line.
    s = Session(source=SourceId("dash", 0, ""))
    for _ in range(4):
        s.on_source_status("agent-a/0/x", "online")
    s.on_source_status("agent-a/0/x", "offline")
    s.on_source_status("agent-a/0/x", "online")
    assert [text for _, _, text in s.log] == ["agent-a/0/x: online", "agent-a/0/x: offline", "agent-a/0/x: online"]


def test_summaries_a_dead_broker_never_took_are_lost_and_said(tmp_path):
    """The recording ends while the broker cannot be reached: what the agent could not send is data lost (exit
    status 4, a problem naming it), not a clean run."""
    import socket

    path = tmp_path / "run.jsonl"
    _sim_recording(path, n_requests=8)
    with socket.socket() as s:   # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = subprocess.run([sys.executable, "-m", "kvtop", "agent", str(path), "--mqtt", f"mqtt://127.0.0.1:{port}/x",
                          "--run", "n1", "--json"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 4, out.stderr
    result = json.loads(out.stdout)
    assert result["mqtt_published"] == 0 and result["mqtt_unsent"] == result["summaries"] >= 1
    assert "mqtt-publish.unsent" in [p["kind"] for p in result["problems"]]
    assert "never reached" in out.stderr and "Traceback" not in out.stderr
