"""Fleet staleness comes from data age, never from a status message (issue 26): a source silent past its stale
limit stays out of the fleet totals whatever "offline"/"online" it (or its agent's last will) sends; a retained
phantom (meta, no data) is never the session's own model; an agent's status reaches its sources by an index."""

from __future__ import annotations

import time

from kv_publisher import batch, stored

from kvtop import run_summary
from kvtop.agent import summary_data
from kvtop.fleet import aggregate
from kvtop.records import Record, SourceId, make
from kvtop.session import Session
from kvtop.tiers import TierModel

T0 = 1_700_000_000.0
STATS = {"kvCacheStats": {"maxNumBlocks": 100, "freeNumBlocks": 60, "usedNumBlocks": 40}}


def _fleet(n: int) -> tuple[Session, list[SourceId]]:
    session = Session(meta={})
    session.stale.enabled, session.stale.min_s = True, 5.0
    sources = [SourceId(f"node-{i}", 0, "r") for i in range(n)]
    for src in sources:
        session.emit(make("meta", {"engine": "trtllm", "primary_blocks": 100, "secondary_blocks": 0}, src, T0))
    for i in range(3):
        for src in sources:
            session.emit(make("stats", {"iter": i, **STATS}, src, T0 + i))
    return session, sources


def test_a_silent_fleet_that_says_offline_then_online_stays_out_of_the_totals() -> None:
    session, sources = _fleet(1000)
    agg = aggregate(session.models, session.status)
    assert agg["sources"] == 1000 and agg["gpu_in_use"] == 40_000
    keys = [s.key() for s in sources]
    for key in keys[:400]:   # a last will before the stale limit...
        session.on_source_status(key, "offline")
    session.tick(monotonic=time.monotonic() + 40.0)  # 40 s after every source stopped
    for key in keys[400:700]:  # ...and after it
        session.on_source_status(key, "offline")
    for key in keys[:700]:   # then a retained "online" (a reconnect, a broker's replay)
        session.on_source_status(key, "online")
    for key in keys[700:]:   # a bare "online" to a stale source
        session.on_source_status(key, "online")
    agg = aggregate(session.models, session.status)
    assert agg["sources"] == 0, agg["sources"]
    assert len(session.stale_sources()) == 1000
    assert set(run_summary.summary(session)["sources"].values()) == {"stale"}
    # data, not a status, brings one back
    session.emit(make("stats", {"iter": 9, **STATS}, sources[5], T0 + 9))
    agg = aggregate(session.models, session.status)
    assert agg["sources"] == 1 and agg["gpu_in_use"] == 40 and agg["gpu_capacity"] == 100
    # a status can still make a fresh source offline
    session.on_source_status(keys[5], "offline")
    assert aggregate(session.models, session.status)["sources"] == 0


def _summaries(session: Session, agent: str, hosts: list[str], t: float = 1.0) -> None:
    for n, host in enumerate(hosts):
        local = TierModel()
        local.apply(batch(0, [stored(list(range(10 * (n + 1))))], t=t))
        session.emit(Record("summary", summary_data(local, 0, 0.5, agent), SourceId(host, 0, "r"), t))


def test_an_agents_last_will_then_online_leaves_its_stale_sources_stale() -> None:
    session = Session(source=SourceId("dash", 0, ""))
    session.stale.enabled = True
    _summaries(session, "agent-a/0/r", ["a1:5557", "a2:5557"])
    _summaries(session, "agent-b/0/r", ["b1:5557"])
    assert aggregate(session.models, session.status)["sources"] == 3
    session.tick(monotonic=time.monotonic() + 40.0)
    assert len(session.stale_sources()) == 3
    session.on_source_status("agent-a/0/r", "offline")
    assert session.status["a1:5557/0/r"] == "offline" and session.status["b1:5557/0/r"] == "stale"
    session.on_source_status("agent-a/0/r", "online")
    assert aggregate(session.models, session.status)["sources"] == 0
    assert sorted(session.stale_sources()) == ["a1:5557/0/r", "a2:5557/0/r", "b1:5557/0/r"]


def test_agents_are_indexed_to_the_sources_their_summaries_name() -> None:
    session = Session(source=SourceId("dash", 0, ""))
    _summaries(session, "agent-a/0/r", ["a1:5557", "a2:5557"])
    _summaries(session, "agent-b/0/r", ["b1:5557"])
    assert session.agent_sources("agent-a/0/r") == {"a1:5557/0/r", "a2:5557/0/r"}
    assert session.agent_sources("agent-b/0/r") == {"b1:5557/0/r"}
    _summaries(session, "agent-b/0/r", ["a2:5557"], t=2.0)  # a2 moved to agent b
    assert session.agent_sources("agent-a/0/r") == {"a1:5557/0/r"}
    assert session.agent_sources("agent-b/0/r") == {"b1:5557/0/r", "a2:5557/0/r"}
    session.on_source_status("agent-a/0/r", "offline")  # a's will: a1 only
    assert {k: session.status.get(k) for k in session.models} == {
        "a1:5557/0/r": "offline", "a2:5557/0/r": None, "b1:5557/0/r": None}
    session.on_source_status("agent-b/0/r", "offline")
    session.on_source_status("agent-a/0/r", "online")
    assert {k: session.status.get(k) for k in session.models} == {
        "a1:5557/0/r": "online", "a2:5557/0/r": "offline", "b1:5557/0/r": "offline"}
    assert session.agent_sources("agent-c/0/r") == frozenset()


def test_a_retained_phantom_is_not_the_sessions_model() -> None:
    """A retained meta of a source long gone comes first (as a broker hands it out): the session's own model,
    its JSON summary and the dashboard's first view are the first source with data, whose meta they carry."""
    session = Session(source=SourceId("mqtt://broker/lab", 0, ""), meta={})
    ghost, real, other = SourceId("ghost", 0, "r"), SourceId("real", 0, "r"), SourceId("other", 0, "r")
    session.emit(make("meta", {"engine": "trtllm", "model": "ghost-model", "primary_blocks": 7}, ghost, T0))
    session.emit(make("meta", {"engine": "trtllm", "model": "real-model", "primary_blocks": 100}, real, T0))
    session.emit_many([make("stats", {"iter": i, **STATS}, real, T0 + i) for i in range(3)])
    session.emit(make("stats", {"iter": 0, **STATS}, other, T0 + 3))
    assert session.models["real/0/r"] is session.model
    assert session.models["ghost/0/r"] is not session.model
    view = session.view()
    assert view.model is session.model
    out = run_summary.summary(session)
    assert out["model"] == "real-model"
    assert out["tiers"]["gpu"]["capacity_blocks"] == 100 and out["tiers"]["gpu"]["in_use_blocks"] == 40
    assert session.model.meta["primary_blocks"] == 100


def test_every_agents_will_reaches_its_sources_at_the_source_cap() -> None:
    """As many agents as sources, one source each, at the cap: the statuses of known agents and sources are never
    refused as "names past the cap" (there were 2,080 of 4,096 rows following their wills)."""
    session = Session(source=SourceId("dash", 0, ""), max_sources=200)
    for n in range(200):
        _summaries(session, f"agent-{n}/0/r", [f"node-{n}:5557"])
    assert len(session.models) == 200
    for state in ("offline", "online"):
        for n in range(200):
            session.on_source_status(f"agent-{n}/0/r", state)
        rows = [session.status.get(f"node-{n}:5557/0/r") for n in range(200)]
        assert rows.count(state) == 200, rows.count(state)
    session.on_source_status("stranger/0/r", "online")  # a name past the cap that is no source: still refused
    assert "stranger/0/r" not in session.status
