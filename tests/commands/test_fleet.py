"""kvtop.fleet: the sources table's rows and its aggregate, on hand-made TensorRT-LLM 1.2 records whose sums are
worked out here by hand."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from kvtop.fleet import FleetRow, aggregate, combine, source_row, source_status
from kvtop.records import SourceId, make
from kvtop.session import Session
from kvtop.tiers import TierModel

T0 = 1764430000.0
A = SourceId(host="node-a", rank=0, run="chat")
B = SourceId(host="node-b", rank=1, run="chat")
C = SourceId(host="node-c", rank=0, run="batch")


def stats(it: int, free: int, reused: int, missed: int, maximum: int) -> dict[str, Any]:
    """A TensorRT-LLM 1.2 ``get_stats`` entry, reduced to what the fold reads."""
    return {"iter": it, "numActiveRequests": 1, "numQueuedRequests": 0, "numCompletedRequests": 0,
            "kvCacheStats": {"maxNumBlocks": maximum, "freeNumBlocks": free, "usedNumBlocks": maximum - free,
                             "tokensPerBlock": 32, "allocTotalBlocks": reused + missed, "allocNewBlocks": missed,
                             "reusedBlocks": reused, "missedBlocks": missed}}


def created(gpu: int, host: int) -> dict[str, Any]:
    return {"event_id": 0, "data": {"type": "created", "num_blocks_per_cache_level": [gpu, host]},
            "window_size": 4096}


def request(rid: int, ttft: float) -> dict[str, Any]:
    return {"request_id": rid, "ok": True, "prompt_tokens": 320, "output_tokens": 16, "ttft_s": ttft,
            "e2e_s": ttft + 0.1}


def emit_fleet(session: Session) -> None:
    """Three sources over 2 s. Hits / lookups since start: A 30/40, B 10/100, C 5/10; over the window (the 2 s
    after the first records): A 20/20, B 10/50, C 0/0. Requests: A two (TTFT 0.1, 0.2 s), B one (0.5 s)."""
    session.emit(make("kv_event", created(100, 50), A, T0))
    session.emit(make("stats", stats(0, 80, 10, 10, 150), A, T0))
    session.emit(make("kv_event", created(200, 0), B, T0))
    session.emit(make("stats", stats(0, 190, 0, 50, 200), B, T0))
    session.emit(make("stats", stats(0, 20, 5, 5, 64), C, T0))  # stats only: no events, host unknown
    session.emit(make("request", request(1, 0.1), A, T0 + 1))
    session.emit(make("request", request(2, 0.2), A, T0 + 1))
    session.emit(make("request", request(3, 0.5), B, T0 + 1))
    session.emit(make("stats", stats(1, 60, 30, 10, 150), A, T0 + 2))
    session.emit(make("stats", stats(1, 150, 10, 90, 200), B, T0 + 2))
    session.emit(make("stats", stats(1, 20, 5, 5, 64), C, T0 + 2))


@pytest.fixture
def session() -> Session:
    s = Session(source=A)
    emit_fleet(s)
    return s


def test_rows_read_each_source(session: Session) -> None:
    a = source_row("node-a/0/chat", session.models["node-a/0/chat"], "online")
    assert (a.gpu_capacity, a.gpu_in_use, a.host_capacity) == (100, 40, 50)
    assert (a.hits, a.lookups) == (30, 40)
    assert a.hit_cumulative == pytest.approx(0.75)
    assert a.hit_window == pytest.approx(1.0)           # 20 of 20 since the window's base at T0
    assert a.requests_per_s == pytest.approx(1.0)       # 2 requests over 2 s
    assert a.ttft_p99_s == pytest.approx(0.2, abs=0.01)
    assert a.status == "online"
    c = source_row("node-c/0/batch", session.models["node-c/0/batch"])
    assert c.host_cached is None and c.gpu_cached is None       # no KV events: unknown, not 0
    assert c.offloaded_per_s is None and c.ttft_p99_s is None   # moves from events, none seen; no requests


def test_aggregate_sums_blocks_and_rates_and_divides_total_hits_by_total_lookups(session: Session) -> None:
    models = {k: m for k, m in session.models.items() if k != "node-c/0/batch"}
    agg = aggregate(models)
    assert agg["sources"] == 2
    assert agg["gpu_capacity"] == 300 and agg["gpu_in_use"] == 40 + 50
    assert agg["host_capacity"] == 50
    assert (agg["hits"], agg["lookups"]) == (40, 140)
    # Total hits / total lookups, not the mean of 0.75 and 0.1 (0.425).
    assert agg["hit_cumulative"] == pytest.approx(40 / 140)
    # Window: (10 + 5) hits/s over (10 + 25) lookups/s, not the mean of 1.0 and 0.2 (0.6).
    assert agg["hit_window"] == pytest.approx(15 / 35)
    assert agg["requests_per_s"] == pytest.approx(1.5)
    assert agg["offloaded_per_s"] == 0 and agg["onboarded_per_s"] == 0
    # TTFT p99: the largest of the sources' p99s (B's single 0.5 s request).
    assert agg["ttft_p99_s"] == pytest.approx(0.5, abs=0.01)


def test_a_figure_unknown_for_one_source_is_unknown_for_all(session: Session) -> None:
    agg = aggregate(session.models)
    assert agg["sources"] == 3
    assert agg["host_cached"] is None and agg["gpu_cached"] is None
    assert agg["offloaded_per_s"] is None
    # C's maxNumBlocks (1.2: GPU + host) does not say how it splits: its GPU capacity, and so the fleet's, is "?".
    assert agg["gpu_capacity"] is None
    assert (agg["hits"], agg["lookups"]) == (45, 150)
    assert agg["ttft_p99_s"] == pytest.approx(0.5, abs=0.01)    # C has no requests: the max of the others


def test_offline_sources_keep_their_row_but_leave_the_aggregate(session: Session) -> None:
    session.status.update({"node-a/0/chat": "online", "node-b/1/chat": "offline"})
    agg = aggregate(session.models, session.status)
    assert agg["sources"] == 2
    assert (agg["hits"], agg["lookups"]) == (35, 50)            # A and C
    row = source_row("node-b/1/chat", session.models["node-b/1/chat"],
                     source_status("node-b/1/chat", session.status))
    assert row.status == "offline" and row.hits == 10


def test_source_status() -> None:
    status = {"node-a/0/chat": "online", "node-b/1/chat": "offline", "mqtt": "connected to mqtt://broker"}
    assert source_status("node-a/0/chat", status) == "online"
    assert source_status("node-z/0/x", status) is None
    assert source_status("node-a/0/chat", None) is None
    status["mqtt"] = "disconnected: connection refused; retrying (every 5 s)"
    assert source_status("node-a/0/chat", status) == "disconnected"
    assert source_status("node-b/1/chat", status) == "offline"  # its last will stands


def test_combine_of_nothing_is_unknown() -> None:
    total = combine([])
    assert total.sources == 0 and total.hit_cumulative is None and total.gpu_in_use is None
    assert total.ttft_p99_s is None


def test_rows_are_json() -> None:
    row = source_row("x", TierModel())
    assert isinstance(row, FleetRow)
    assert row.to_json()["key"] == "x" and row.to_json()["gpu_capacity"] is None


# ---------------------------------------------------------------------------------------------- a disk tier

D = SourceId(host="node-d", rank=0, run="disk")


def emit_disk_source(session: Session) -> None:
    """A V2-manager engine with a disk cache of 11 blocks (meta as the meta builder writes it for
    ``KvCacheConfig(host_cache_size=7 blocks, disk_cache_size=11 blocks)``) and one iteration of the V2 stats
    (tests/tiers/test_trtllm13_stats.py's payload: GPU pool 20 + 10 blocks, 16 in use; host + disk 11 of 18 in use)."""
    from trtllm_serve_fake import V2_STATS

    from kvtop.engines.meta import real_engine_meta

    bpb = 147456 * 32
    session.emit(make("meta", real_engine_meta(model="Qwen/Qwen3-8B", tokens_per_block=32, host_cache_bytes=7 * bpb,
                                               disk_cache_bytes=11 * bpb, engine_version="1.3.0rc5"), D, T0))
    session.emit(make("stats", V2_STATS, D, T0 + 1))


def test_a_disk_tier_is_summed_where_a_source_has_one(session: Session) -> None:
    emit_disk_source(session)
    a = source_row("node-a/0/chat", session.models["node-a/0/chat"])
    d = source_row("node-d/0/disk", session.models["node-d/0/disk"])
    assert not a.has_disk and "disk_capacity" not in a.to_json()
    assert d.has_disk and (d.disk_capacity, d.disk_cached) == (11, None)  # V2 stats: host + disk one sum
    assert (d.gpu_capacity, d.gpu_in_use, d.host_capacity) == (30, 16, 7)
    agg = aggregate({k: session.models[k] for k in ("node-a/0/chat", "node-d/0/disk")})
    assert agg["sources"] == 2
    # A has no disk tier: it holds 0 disk blocks, so the fleet's disk is D's 11; D's occupancy unknown: "?"
    assert agg["disk_capacity"] == 11 and agg["disk_cached"] is None
    assert agg["gpu_capacity"] == 100 + 30 and agg["host_capacity"] == 50 + 7
    # known disk occupancy adds up (a vLLM STORAGE / SGLang DISK tier has one): 3 + 4 cached of 10 + 20, A none
    d1, d2 = replace(d, disk_cached=3, disk_capacity=10), replace(d, key="e", disk_cached=4, disk_capacity=20)
    total = combine([a, d1, d2])
    assert (total.has_disk, total.disk_cached, total.disk_capacity) == (True, 7, 30)
    # an offline source's disk leaves the aggregate with the rest of it
    total = combine([a, d1, replace(d2, status="offline")])
    assert (total.disk_cached, total.disk_capacity, total.sources) == (3, 10, 2)
    assert not combine([a, replace(d1, status="stale")]).has_disk


def test_a_two_tier_fleets_rows_and_aggregate_have_no_disk_figures(session: Session) -> None:
    agg = aggregate(session.models)
    assert not any(k.startswith("disk") or k == "has_disk" for k in agg)
    assert list(agg) == [f for f in FleetRow.__dataclass_fields__ if not f.startswith(("disk", "has_disk"))]


async def test_the_sources_table_shows_a_disk_column_only_with_a_disk_tier(session: Session) -> None:
    from kvtop.ui.app import build_app
    from kvtop.ui.panels.sources import SourcesPanel

    class Settings:
        refresh = 0.25
        theme = "dark"
        duration = None

    async def table(s: Session) -> list[str]:
        app = build_app(s, Settings(), run_session=False)
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            return app.screen.query_one(SourcesPanel).text().splitlines()

    lines = await table(session)
    assert "disk" not in lines[0] and "host cch/cap" in lines[0]
    emit_disk_source(session)
    lines = await table(session)
    header = lines[0]
    assert header.index("host cch/cap") < header.index("disk cch/cap") < header.index("hit win")
    col = slice(header.index("disk cch/cap") - 1, header.index("disk cch/cap") + 12)
    cells = {ln[2:].split()[0]: ln[col].strip() for ln in lines[1:] if ln.strip()}
    assert cells["node-a/0/chat"] == "-" and cells["node-c/0/batch"] == "-"  # no disk tier: not "?"
    assert cells["node-d/0/disk"] == "?/11"
    assert cells["all"] == "?/11"


def test_a_disk_tier_reaches_the_fleet_through_agent_summaries(session: Session) -> None:
    """The fleet path of the README (``kvtop agent`` on each node, one dashboard on the summaries): the disk tier
    travels in the summary's ``tiers`` and lands in the source's row and in the aggregate."""
    from kvtop.agent import summary_data

    emit_disk_source(session)
    fleet = Session(source=A)
    for src in (A, D):
        fleet.emit(make("summary", summary_data(session.models[src.key()], 1, 0.5, "kvtop-agent"), src, T0 + 3))
    rows = {k: source_row(k, m) for k, m in fleet.models.items()}
    assert set(rows) == {"node-a/0/chat", "node-d/0/disk"}
    assert not rows["node-a/0/chat"].has_disk
    assert rows["node-d/0/disk"].has_disk and rows["node-d/0/disk"].disk_capacity == 11
    agg = aggregate(fleet.models)
    assert (agg["disk_capacity"], agg["disk_cached"]) == (11, None) and agg["host_capacity"] == 50 + 7
