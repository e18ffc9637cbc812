"""TensorRT-LLM after 1.2: the newer iteration stats folded directly, the version told from the data.

- 1.3 with the V1 manager: ``kvCacheIterationStats`` per window (tensorrt_llm/executor/stats_serialization.py,
  ``kv_cache_iteration_stats_to_dict``). The simulator emits it with ``trtllm_version="1.3"``; from stats alone
  (no event stream) the host tier's size, free and in-use blocks and every offload and onboard are exact,
  checked against the simulator's own counters.
- The V2 manager: the pool-group, cold-pool-group and lifecycle views and ``kvCacheLevelTiers``
  (tensorrt_llm/_torch/pyexecutor/kv_cache_stats.py, ``append_kv_cache_iteration_stats``). The payload below is
  what that function writes for the ``_snapshot()`` of TensorRT-LLM's own unit test of kv_cache_stats.py
  (levels gpu/host/disk, two attention windows sharing pool group 0, an SSM lifecycle in pool group 1), worked out
  by hand from ``KVCacheV2IterationStatsSnapshot.build_report`` and checked against the values that test asserts
  (pool 0 used 12, cold max 18 / used 11, window 32 hit rate 0.75, lifecycle 0 full-by-level [2, 0, 0]).
"""

from __future__ import annotations

import asyncio
import copy
from typing import Any

import pytest
from trtllm_serve_fake import V2_STATS, pool_group

from kvtop.records import RecordError, make
from kvtop.tiers import TierModel


def test_v2_views_fold_into_three_tiers() -> None:
    m = TierModel()
    m.apply(make("meta", {"engine": "trtllm", "tokens_per_block": 32, "bytes_per_block": 4096, "disk_blocks": 11},
                 time=1.0))
    m.apply(make("stats", copy.deepcopy(V2_STATS), time=2.0))
    assert m.bad_records == 0, m.last_bad_reason
    assert m.stats_schema == "1.3+ V2"
    # GPU from the pool groups (the windows read 0 for a shared pool): 20 + 10 blocks, 8 + 6 free
    assert (m.gpu.capacity_blocks, m.gpu.free_blocks, m.gpu.in_use_blocks) == (30, 14, 16)
    assert [t.name for t in m.tiers] == ["gpu", "host", "disk"]
    # host + disk are one sum in the stats: the disk's configured 11 blocks leave 7 for the host; shares unknown
    assert (m.host.capacity_blocks, m.host.free_blocks, m.host.in_use_blocks) == (7, None, None)
    assert (m.disk is not None and m.disk.capacity_blocks) == 11
    cold = m.cold
    assert cold is not None and (cold.capacity_blocks, cold.in_use_blocks, cold.free_blocks) == (18, 11, 7)
    # reuse from the attention lifecycles: 3 + 2 of 8 lookups; the onboard from pool group 1
    assert (m.hit_rate.hits, m.hit_rate.lookups) == (5, 8)
    assert m.moves.onboarded_blocks == 1 and m.moves.source == "stats"
    assert m.hits_by_tier == {"gpu": 2, "host": 1, "disk": 0}
    s = m.summary()
    assert s["stats_schema"] == "1.3+ V2" and s["cold"]["capacity_blocks"] == 18
    assert s["tiers"]["disk"]["capacity_bytes"] == 11 * 4096 and s["quality"]["stats_schema"] == "1.3+ V2"


def test_v2_builds_before_the_cold_view_give_the_cold_gauges_from_the_pool_groups() -> None:
    """kv_cache_stats.py before kvCacheIterationStatsByColdPoolGroup existed: the pool-group view carries the
    secondary* gauges (TensorRT-LLM's collector.py reads them there then: host usage 11 of 18, 0.6). They were
    dropped and the cold tiers read unknown; now the same as the cold view gives."""
    old = copy.deepcopy(V2_STATS)
    cold = old.pop("kvCacheIterationStatsByColdPoolGroup")["0"]
    old["kvCacheIterationStatsByPoolGroup"]["0"].update(
        {k: v for k, v in cold.items() if k.startswith("secondary")})
    m = TierModel()
    m.apply(make("meta", {"engine": "trtllm", "tokens_per_block": 32, "bytes_per_block": 4096, "disk_blocks": 11},
                 time=1.0))
    m.apply(make("stats", old, time=2.0))
    assert m.bad_records == 0, m.last_bad_reason
    c = m.cold
    assert c is not None and (c.capacity_blocks, c.in_use_blocks, c.free_blocks) == (18, 11, 7)
    assert (m.gpu.capacity_blocks, m.gpu.free_blocks) == (30, 14)   # the GPU as with the cold view


def test_v2_disk_named_by_the_stats_alone() -> None:
    m = TierModel()
    m.apply(make("meta", {"engine": "trtllm", "secondary_blocks": 7}, time=1.0))
    m.apply(make("stats", copy.deepcopy(V2_STATS), time=2.0))
    disk = m.disk
    assert disk is not None and disk.capacity_blocks == 18 - 7  # the cold total less the host's pool
    assert [t.name for t in m.tiers] == ["gpu", "host", "disk"]


def test_v2_malformed_views_are_one_bad_record() -> None:
    m = TierModel()
    bad = copy.deepcopy(V2_STATS)
    bad["kvCacheIterationStatsByLifecycle"]["0"]["iterFullReusedBlocksByLevel"] = [2, -1, 0]
    m.apply(make("stats", bad, time=1.0))
    assert m.bad_records == 1
    assert "iterFullReusedBlocksByLevel[1]" in (m.last_bad_reason or "")
    assert m.gpu.capacity_blocks is None  # nothing of the bad record was folded
    m.apply(make("stats", {"iter": 8, "kvCacheLevelTiers": "gpu,host"}, time=2.0))
    assert m.bad_records == 1  # kvCacheLevelTiers is only read with the V2 views


def test_schema_is_told_from_the_data() -> None:
    m = TierModel()
    assert m.stats_schema is None
    m.apply(make("stats", {"iter": 1, "kvCacheStats": {"maxNumBlocks": 10, "freeNumBlocks": 10}}, time=1.0))
    assert m.stats_schema == "1.0-1.2"
    m.apply(make("stats", {"iter": 2, "kvCacheStats": {"maxNumBlocks": 10, "freeNumBlocks": 10},
                           "kvCacheIterationStats": {"64": {"primaryMaxNumBlocks": 8, "primaryFreeNumBlocks": 8,
                                                            "secondaryMaxNumBlocks": 2,
                                                            "secondaryFreeNumBlocks": 2}}}, time=2.0))
    assert m.stats_schema == "1.3" and m.host.capacity_blocks == 2
    # kvCacheIterationStats every N iterations: the rows between (kvCacheStats alone) keep the source's schema,
    # where the badge flickered between "stats 1.3" and nothing (issue 23, item 4)
    m.apply(make("stats", {"iter": 3, "kvCacheStats": {"maxNumBlocks": 10, "freeNumBlocks": 9}}, time=3.0))
    assert m.stats_schema == "1.3"


# ---------------------------------------------------------------------------------------------- the simulator

async def _drive(llm: Any, users: int = 24) -> None:
    from kvtop.engines.sim import SamplingParams

    system = list(range(1000, 2600))
    for rnd in range(3):  # the same users again: their earlier prompts come back from the host tier
        outs = [llm.generate_async(system + [30_000 + 700 * u + t for t in range(600)], SamplingParams(max_tokens=4))
                for u in range(users)]
        await asyncio.gather(*(o.aresult() for o in outs))
        del rnd


def _run(version: str) -> tuple[TierModel, Any]:
    from kvtop.engines.sim import KvCacheConfig, SimLLM

    llm = SimLLM("Qwen/Qwen3-8B", kv_cache_config=KvCacheConfig(host_cache_size=3 * 2**30, max_tokens=8192,
                                                                 event_buffer_max_size=0),
                 enable_iter_perf_stats=True, speed=0, trtllm_version=version)
    try:
        asyncio.run(_drive(llm))
        m = TierModel()
        m.apply(make("meta", {k: v for k, v in llm.describe().items()
                              if k not in ("primary_blocks", "secondary_blocks")}, time=0.0))
        for i, st in enumerate(llm.get_stats(timeout=0)):
            m.apply(make("stats", st, time=1.0 + i))
        return m, llm
    finally:
        llm.shutdown()


def test_13_stats_alone_give_exact_host_counts() -> None:
    m, llm = _run("1.3")
    bm = llm.block_manager
    assert m.bad_records == 0, m.last_bad_reason
    assert m.stats_schema == "1.3"
    assert bm.offloaded_blocks > 100 and bm.onboarded_blocks > 10  # the run moved blocks both ways
    host = m.host
    # No events, no pool sizes in meta: all from the stats, equal to the simulator's truth.
    assert host.capacity_blocks == bm.secondary_blocks
    assert host.free_blocks == bm.num_free_blocks(1)
    assert host.in_use_blocks == bm.secondary_blocks - bm.num_free_blocks(1)
    assert m.gpu.capacity_blocks == bm.primary_blocks and m.gpu.free_blocks == bm.num_free_blocks(0)
    assert (m.moves.offloaded_blocks, m.moves.onboarded_blocks) == (bm.offloaded_blocks, bm.onboarded_blocks)
    assert m.moves.source == "stats"
    assert m.quality.host_without_events is False
    assert m.summary()["engine_version"] == "TensorRT-LLM 1.3 (simulated by kvtop)"


def test_12_stats_alone_leave_the_host_unknown() -> None:
    m, llm = _run("1.2")
    assert m.stats_schema == "1.0-1.2"
    assert m.host.free_blocks is None and m.host.in_use_blocks is None
    assert m.moves.offloaded_blocks == 0 and m.moves.source == "events"  # no events: moves unseen
    # the pool's size is known (meta's host_cache_bytes / bytes_per_block), its occupancy is not: said so
    assert m.host.capacity_blocks == llm.block_manager.secondary_blocks
    assert m.quality.host_without_events is True


def test_sim_refuses_an_unknown_version() -> None:
    from kvtop.engines.sim import SimLLM

    with pytest.raises(ValueError, match="trtllm_version"):
        SimLLM("Qwen/Qwen3-8B", trtllm_version="1.4", speed=0)


# ---------------------------------------------------------------------------------------------- three tiers

def _three_tier_recording(path: Any) -> None:
    """A run of a V2-manager engine with a disk cache: meta (as the meta builder writes it for
    ``KvCacheConfig(host_cache_size=..., disk_cache_size=...)``) and five iterations of V2 stats."""
    from kvtop.engines.meta import real_engine_meta
    from kvtop.records import SourceId, encode

    src = SourceId(host="node-a", rank=0, run="disk")
    bpb = 147456 * 32
    meta = real_engine_meta(model="Qwen/Qwen3-8B", tokens_per_block=32, host_cache_bytes=7 * bpb,
                            disk_cache_bytes=11 * bpb, engine_version="1.3.0rc5")
    lines = [encode(make("meta", meta, src, 1000.0))]
    for i in range(5):
        st = copy.deepcopy(V2_STATS)
        st["iter"] = 7 + i
        st["kvCacheIterationStatsByColdPoolGroup"]["0"]["secondaryFreeNumBlocks"] = 7 - i
        st["kvCacheIterationStatsByColdPoolGroup"]["0"]["secondaryUsedNumBlocks"] = 11 + i
        lines.append(encode(make("stats", st, src, 1001.0 + i)))
    path.write_text("\n".join(lines) + "\n")


@pytest.mark.slow
def test_a_three_tier_run_in_json_report_and_dashboard(tmp_path: Any) -> None:
    import json
    import subprocess
    import sys

    from kvtop.report.report import build_report

    rec = tmp_path / "disk.jsonl"
    _three_tier_recording(rec)
    bpb = 147456 * 32
    # JSON: kvtop replay --headless --json
    out = subprocess.run([sys.executable, "-m", "kvtop", "replay", str(rec), "--speed", "0", "--headless", "--json"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert list(summary["tiers"]) == ["gpu", "host", "disk"]
    assert summary["tiers"]["disk"]["capacity_bytes"] == 11 * bpb
    assert summary["tiers"]["host"]["capacity_blocks"] == 7
    assert summary["cold"]["in_use_blocks"] == 15 and summary["stats_schema"] == "1.3+ V2"
    # report: a disk column and the tiers of the run
    result = build_report([rec], tmp_path / "report")
    run = result["runs"][0]
    assert run["disk_blocks"] == 11 and list(run["tiers"]) == ["gpu", "host", "disk"]
    page = (tmp_path / "report" / "index.html").read_text()
    # a row of the runs table (a column per run)
    assert "<td>disk blocks</td>" in page and "and disk (TensorRT-LLM's disk cache)" in page


@pytest.mark.slow
def test_a_three_tier_run_charts_its_disk_tier(tmp_path: Any) -> None:
    """The report's occupancy chart draws every tier the run had: the disk's configured 11 blocks as its own
    series in the disk colour, and host + disk in use (11..15 of 18, the one figure V2 stats give) beside it."""
    pytest.importorskip("matplotlib")
    from charts import CapturedPyplot, assert_no_texts_overlap

    from kvtop.report import charts as report_charts
    from kvtop.report import runs
    from kvtop.report.report import build_report

    rec = tmp_path / "disk.jsonl"
    _three_tier_recording(rec)
    run = runs.load_run(rec)
    assert [list(s.tiers) for s in run.samples] == [["gpu", "host", "disk"]] * 5
    assert [s.tiers["disk"] for s in run.samples] == [runs.TierPoint(11, None, None)] * 5
    series = {label: (color, style, ys) for label, color, style, _, ys in report_charts.occupancy_series(run)}
    assert list(series) == ["GPU capacity", "GPU in use", "host capacity", "disk capacity", "host+disk in use"]
    assert series["disk capacity"] == (report_charts.DISK_COLOR, ":", [11.0] * 5)
    assert series["host+disk in use"] == (report_charts.DISK_COLOR, "-.", [11.0, 12.0, 13.0, 14.0, 15.0])
    assert series["host capacity"] == (report_charts.HOST_COLOR, ":", [7.0] * 5)
    assert series["GPU capacity"] == (report_charts.GPU_COLOR, ":", [30.0] * 5)
    assert len({report_charts.GPU_COLOR, report_charts.HOST_COLOR, report_charts.DISK_COLOR}) == 3

    # as drawn: every series a line of its colour, its end labelled, no two labels overlapping
    plt = report_charts.pyplot()
    capture = CapturedPyplot(plt)
    png = tmp_path / "occupancy.png"
    report_charts.plot_occupancy(capture, [run], png)
    fig = capture.closed[-1]
    ax = fig.axes[0]
    lines = [(line.get_color(), list(line.get_ydata())) for line in ax.get_lines()]
    disk = report_charts.DISK_COLOR
    assert (disk, [11.0] * 5) in lines and (disk, [11.0, 12.0, 13.0, 14.0, 15.0]) in lines
    assert {t.get_text() for t in ax.texts} == set(series)
    assert_no_texts_overlap(fig)
    plt.close(fig)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # and through build_report: the chart written, the page saying what the disk-coloured dash-dot line is
    build_report_out = build_report([rec], tmp_path / "report")
    assert str(tmp_path / "report" / "occupancy.png") in build_report_out["files"]
    assert (tmp_path / "report" / "occupancy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "Host and disk in use together" in (tmp_path / "report" / "index.html").read_text()


async def test_a_three_tier_run_on_the_dashboard(tmp_path: Any) -> None:
    from recordings import session_from_recording

    from kvtop.ui.app import build_app
    from kvtop.ui.panels.header import HeaderBar
    from kvtop.ui.panels.tier import TierPanel

    class Settings:
        refresh = 0.25
        theme = "dark"
        duration = None

    rec = tmp_path / "disk.jsonl"
    _three_tier_recording(rec)
    session = session_from_recording(rec, started_at=1000.0)
    app = build_app(session, Settings(), run_session=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        panels = list(app.screen.query(TierPanel))
        assert [p.id for p in panels] == ["tier-gpu", "tier-host", "tier-disk"]
        header = app.screen.query_one(HeaderBar).text()
        assert "stats 1.3+ V2" in header
        # the last record: cold used 11 + 4 of 18; said on the host and disk panels, not a made-up split
        for panel in panels[1:]:
            assert "host+disk together: 15 of 18 blocks in use" in panel.text()


# ---------------------------------------------------------------------------------------------- v2_sha256 hashes

def test_v2_sha256_hex_hashes_fold_like_their_64_bit_keys() -> None:
    """``kv_cache_event_hash_algo="v2_sha256"``: hashes are hex SHA-256 keys (router_utils.py); their first 8 bytes
    big-endian are what ``v2_sha256_64`` sends (kv_cache_hash.py ``truncate_sha256_hash_to_int64``)."""
    import hashlib

    keys = [hashlib.sha256(f"block {i}".encode()).digest() for i in range(3)]
    hexes = [k.hex() for k in keys]
    ints = [int.from_bytes(k[:8], "big", signed=False) for k in keys]

    def stream(h: list[Any]) -> list[dict[str, Any]]:
        return [
            {"event_id": 0, "data": {"type": "created", "num_blocks_per_cache_level": [10, 4]}, "window_size": 64},
            {"event_id": 1, "data": {"type": "stored", "parent_hash": None, "blocks": [
                {"type": "stored_block", "block_hash": h[0], "cache_level": 0, "priority": 35},
                {"type": "stored_block", "block_hash": h[1], "cache_level": 0, "priority": 35}]}, "window_size": 64},
            {"event_id": 2, "data": {"type": "stored", "parent_hash": h[1], "blocks": [
                {"type": "stored_block", "block_hash": h[2], "cache_level": 0, "priority": 35}]}, "window_size": 64},
            {"event_id": 3, "data": {"type": "updated", "block_hash": h[2],
                                     "cache_level": {"type": "event_diff", "old_value": 0, "new_value": 1}},
             "window_size": 64},
            {"event_id": 4, "data": {"type": "removed", "block_hashes": [h[2]]}, "window_size": 64},
        ]

    folds = []
    for h in (hexes, ints):
        m = TierModel()
        m.apply_kv_events(stream(h), 1.0)
        folds.append(m)
    a, b = folds
    assert a.bad_records == 0, a.last_bad_reason
    assert (a.gpu.cached_blocks, a.host.cached_blocks) == (b.gpu.cached_blocks, b.host.cached_blocks) == (2, 0)
    assert a.moves == b.moves and a.moves.offloaded_blocks == 1 and a.moves.evicted_host_blocks == 1
    assert a.quality.unknown_hashes == 0
    m = TierModel()
    m.apply_kv_event({"event_id": 0, "data": {"type": "removed", "block_hashes": ["not-a-hash"]}}, 1.0)
    assert m.bad_records == 1 and "block_hashes[0]" in (m.last_bad_reason or "")


def test_the_headless_text_summary_lists_the_disk_tier(tmp_path: Any) -> None:
    from kvtop.run_summary import format_summary

    m = TierModel()
    m.apply(make("meta", {"engine": "trtllm", "tokens_per_block": 32, "bytes_per_block": 4096, "disk_blocks": 11},
                 time=1.0))
    m.apply(make("stats", copy.deepcopy(V2_STATS), time=2.0))
    text = format_summary(m.summary())
    assert "disk: capacity 11 blocks, in use unknown" in text
    assert "host+disk together: capacity 18 blocks, in use 11, free 7" in text
    assert "stats: TensorRT-LLM 1.3+ V2" in text


def test_prometheus_exports_the_disk_tier() -> None:
    import urllib.request

    from kvtop.sinks.prometheus import PrometheusExporter

    m = TierModel()
    m.apply(make("meta", {"engine": "trtllm", "tokens_per_block": 32, "bytes_per_block": 4096, "disk_blocks": 11},
                 time=1.0))
    m.apply(make("stats", copy.deepcopy(V2_STATS), time=2.0))
    m.snapshot()  # published by the folding side: what a scrape on the HTTP thread reads
    exporter = PrometheusExporter(lambda: m, port=0)
    port = exporter.start()
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
    finally:
        exporter.stop()
    disk = [line for line in text.splitlines() if line.startswith("kvtop_kv_capacity_blocks") and 'tier="disk"' in line]
    assert len(disk) == 1 and disk[0].endswith(" 11.0")
    # occupancy the V2 stats cannot split stays absent, never 0
    assert not any(line.startswith("kvtop_kv_free_blocks") and 'tier="disk"' in line for line in text.splitlines())
    assert m.summary()["hit_rate"]["by_tier"] == {"gpu": 2 / 8, "host": 1 / 8, "disk": 0.0}


# ---------------------------------------------------------------------------------------------- bad input

_LEAVES = [(path, key) for path, key in (
    (("kvCacheIterationStatsByPoolGroup", "0"), "primaryFreeNumBlocks"),
    (("kvCacheIterationStatsByPoolGroup", "1"), "iterOnboardBlocks"),
    (("kvCacheIterationStatsByColdPoolGroup", "0"), "secondaryMaxNumBlocks"),
    (("kvCacheIterationStatsByLifecycle", "0"), "iterReusedBlocks"),
    (("kvCacheIterationStatsByLifecycle", "0"), "iterFullReusedBlocksByLevel"),
    (("kvCacheIterationStatsByLifecycle", "1"), "kind"),
    ((), "kvCacheLevelTiers"),
    ((), "kvCacheIterationStatsByColdPoolGroup"),
    (("kvCacheIterationStats", "32"), "iterMissedBlocks"),
)]


def _set(d: dict[str, Any], path: tuple[str, ...], key: str, value: Any) -> None:
    for p in path:
        d = d[p]
    d[key] = value


def test_any_value_in_any_v2_field_is_folded_or_one_bad_record() -> None:
    from hypothesis import given, settings
    from hypothesis import strategies as st

    values = st.one_of(st.none(), st.booleans(), st.integers(-5, 2**70), st.floats(allow_nan=True),
                       st.text(max_size=5), st.lists(st.integers(-2, 5), max_size=10),
                       st.dictionaries(st.text(max_size=3), st.integers(0, 5), max_size=3))

    @settings(max_examples=200, deadline=None)
    @given(st.sampled_from(range(len(_LEAVES))), values)
    def check(i: int, value: Any) -> None:
        d = copy.deepcopy(V2_STATS)
        _set(d, *_LEAVES[i], value)
        m = TierModel()
        try:
            rec = make("stats", d, time=1.0)
        except RecordError as exc:  # refused at the record boundary (kvtop/records.py bounds), naming the field
            assert exc.field.startswith("data.")
            return
        m.apply(rec)  # never raises
        if m.bad_records:
            assert m.bad_records == 1 and m.last_bad_reason
            assert m.gpu.capacity_blocks is None  # nothing of a bad record folded
        for t in [*m.tiers, m.cold]:
            if t is None:
                continue
            for n in (t.capacity_blocks, t.in_use_blocks, t.free_blocks):
                assert n is None or n >= 0
        assert m.hit_rate.hits <= m.hit_rate.lookups or m.hit_rate.lookups == 0

    check()


@pytest.mark.slow
def test_the_cli_flag_reaches_the_simulator() -> None:
    import json
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-m", "kvtop", "--engine", "sim", "--trtllm-version", "1.3", "--speed", "0",
                          "--headless", "--json", "--duration", "2", "--host-cache", "1GB"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    s = json.loads(out.stdout)
    assert s["stats_schema"] == "1.3" and s["engine_version"] == "TensorRT-LLM 1.3 (simulated by kvtop)"
    assert s["moves"]["source"] == "stats" and s["tiers"]["host"]["capacity_blocks"] > 0


def test_iterations_missing_from_any_stats_stream_are_counted_and_flagged() -> None:
    """kvtop.watch(llm) while the user's script also calls get_stats, or trtllm-serve's collector drains the
    queue: the fold counts the iterations it never saw (gaps in ``iter``) and the header says so."""
    m = TierModel()
    for i, it in enumerate([1, 2, 3, 7, 8, 12]):
        m.apply(make("stats", {"iter": it, "kvCacheStats": {"maxNumBlocks": 10, "freeNumBlocks": 10}},
                     time=1.0 + i))
    assert m.quality.stats_iterations_missing == 3 + 3
    m.apply(make("stats", {"iter": 0, "kvCacheStats": {"maxNumBlocks": 10, "freeNumBlocks": 10}}, time=9.0))
    assert m.quality.stats_iterations_missing == 6 and m.quality.stats_restarts == 1  # a restart is no gap
    assert m.summary()["quality"]["stats_iterations_missing"] == 6


async def test_the_header_flags_missing_iterations(tmp_path: Any) -> None:
    from recordings import session_from_recording

    from kvtop.records import SourceId, encode
    from kvtop.ui.app import build_app
    from kvtop.ui.panels.header import HeaderBar

    class Settings:
        refresh = 0.25
        theme = "dark"
        duration = None

    src = SourceId(host="node-a", rank=0, run="gaps")
    rec = tmp_path / "gaps.jsonl"
    rec.write_text("\n".join(encode(make("stats", {"iter": it, "kvCacheStats": {"maxNumBlocks": 10,
                                                                                "freeNumBlocks": 10}},
                                         src, 1000.0 + i)) for i, it in enumerate([1, 2, 9])) + "\n")
    app = build_app(session_from_recording(rec, started_at=1000.0), Settings(), run_session=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert "6 iterations missing" in app.screen.query_one(HeaderBar).text()


def _impossible(mutate: Any) -> TierModel:
    """V2_STATS changed by ``mutate``, folded after a good record: the model as it stands after both."""
    m = TierModel()
    d = copy.deepcopy(V2_STATS)
    mutate(d)
    d["iter"] = 8
    m.apply(make("stats", d, time=1.0))
    return m


def _pools(d: dict[str, Any]) -> dict[str, Any]:
    return d["kvCacheIterationStatsByPoolGroup"]


@pytest.mark.parametrize(("mutate", "field"), [
    # more free blocks than the pool group holds (20), in the GPU view and the cold one (18)
    (lambda d: _pools(d)["0"].update(primaryFreeNumBlocks=21), "ByPoolGroup.0.primaryFreeNumBlocks"),
    (lambda d: d["kvCacheIterationStatsByColdPoolGroup"]["0"].update(secondaryUsedNumBlocks=19),
     "ByColdPoolGroup.0.secondaryUsedNumBlocks"),
    # 2^40 offloads in one step: past pool group 1's 10 blocks, and past the cap where the view states no size
    (lambda d: _pools(d)["1"].update(iterOffloadBlocks=1 << 40), "ByPoolGroup.1.iterOffloadBlocks"),
    (lambda d: _pools(d)["1"].update(iterOnboardBlocks=11), "ByPoolGroup.1.iterOnboardBlocks"),
    (lambda d: d["kvCacheIterationStats"]["32"].update(iterOffloadBlocks=1 << 40),
     "kvCacheIterationStats.32.iterOffloadBlocks"),
    (lambda d: d["kvCacheIterationStatsByLifecycle"]["0"].update(iterReusedBlocks=1 << 40),
     "ByLifecycle.0.iterReusedBlocks"),
    # 20,000 pool groups (each possible alone) and their unbounded sum; 300 lifecycles
    (lambda d: d.__setitem__("kvCacheIterationStatsByPoolGroup", {
        str(i): pool_group(i, 4096, [32], primaryMaxNumBlocks=1 << 40, primaryFreeNumBlocks=1 << 40)
        for i in range(20_000)}), "kvCacheIterationStatsByPoolGroup"),
    (lambda d: d.__setitem__("kvCacheIterationStatsByPoolGroup", {
        str(i): pool_group(i, 4096, [32], primaryMaxNumBlocks=1 << 40, primaryFreeNumBlocks=1 << 40)
        for i in range(2)}), "kvCacheIterationStatsByPoolGroup.*.primaryMaxNumBlocks"),
    (lambda d: d["kvCacheIterationStatsByLifecycle"].update({
        str(i): dict(d["kvCacheIterationStatsByLifecycle"]["1"]) for i in range(3, 300)}),
     "kvCacheIterationStatsByLifecycle"),
])
def test_an_impossible_v2_record_is_one_bad_record(mutate: Any, field: str) -> None:
    m = _impossible(mutate)
    assert m.bad_records == 1, "an impossible record was folded"
    assert field in (m.last_bad_reason or ""), m.last_bad_reason
    # nothing of it folded: no capacity, no moves, no hits
    assert m.gpu.capacity_blocks is None and m.cold is None
    assert (m.moves.offloaded_blocks, m.moves.onboarded_blocks, m.hit_rate.lookups) == (0, 0, 0)
    # the next possible record folds as ever
    m.apply(make("stats", copy.deepcopy(V2_STATS) | {"iter": 9}, time=2.0))
    assert m.bad_records == 1 and m.gpu.capacity_blocks == 30 and m.moves.onboarded_blocks == 1


@pytest.mark.parametrize(("stats", "field"), [
    ({"iter": 1, "kvCacheIterationStats": {"64": {"primaryMaxNumBlocks": 8, "primaryFreeNumBlocks": 8,
                                                  "secondaryMaxNumBlocks": 2, "secondaryFreeNumBlocks": 3}}},
     "kvCacheIterationStats.64.secondaryFreeNumBlocks"),
    ({"iter": 1, "kvCacheIterationStats": {"64": {"primaryMaxNumBlocks": 8, "primaryFreeNumBlocks": 8,
                                                  "secondaryMaxNumBlocks": 2, "secondaryFreeNumBlocks": 2,
                                                  "iterHostDroppedBlocks": 3}}},
     "kvCacheIterationStats.64.iterHostDroppedBlocks"),
    ({"iter": 1, "kvCacheStats": {"maxNumBlocks": 10, "freeNumBlocks": 11}}, "kvCacheStats.freeNumBlocks"),
])
def test_an_impossible_13_or_12_record_is_one_bad_record(stats: dict[str, Any], field: str) -> None:
    m = TierModel()
    m.apply(make("stats", stats, time=1.0))
    assert m.bad_records == 1 and field in (m.last_bad_reason or ""), m.last_bad_reason
    assert m.gpu.capacity_blocks is None and m.host.capacity_blocks is None and m.moves.source == "events"
