"""vLLM's and SGLang's tier labels across versions, and vLLM's newer event fields (issue 23, item 5).

Read from the released wheels (``pip download --no-deps``; their pure-Python modules only):

- vLLM 0.32.0, 0.33.0 and 0.34.0 ``vllm/v1/metrics/loggers.py``: ``vllm:prompt_tokens_cached_by_source`` (a
  Counter, so ``_total`` in the exposition) with labels ``model_name``, ``engine``, ``source``; every
  ``CacheHitSource`` (``vllm/v1/metrics/cache_hit_source.py``: device, host, p2p, disk, external_unspecified) is
  created at start, zero. 0.31.0 has no such metric. Builds of vLLM PR #56318 before it merged, and its test
  ``test_cached_prompt_tokens_are_exposed_by_physical_source``, used ``cpu`` (``{"device": 3, "cpu": 4}``);
  benchmark harnesses written against them check ``{"device", "cpu", "disk", "mixed", "external"}``.
- SGLang ``sglang:cached_tokens_total`` (``observe_one_finished_request``): 0.5.5-0.5.8
  sglang/srt/metrics/collector.py, no ``cache_source`` label; 0.5.9 (same file) to 0.5.19
  (sglang/srt/observability/metrics_collector.py): ``device``, ``host``, ``storage_<backend class>`` (the type name
  of the HiCache storage backend, ``unknown`` if none), and ``total`` for a request without a breakdown (in 0.5.9
  every request of a server without HiCache; 0.5.16 on always break it down); 0.5.20-0.5.23: ``storage``. Per
  request it is the breakdown or ``total``, never both.
- vLLM 0.33.0 ``vllm/distributed/kv_events.py`` ``BlockStored`` / ``BlockRemoved`` fields (0.34.0 adds
  ``lookahead_token_ids``); SGLang 0.5.23 ``sglang/srt/disaggregation/kv_events.py`` (``cache_salt``,
  ``session_id``).
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from kv_publisher import removed, stored
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

from kvtop.problems import EXIT_OK
from kvtop.records import Record, SourceId
from kvtop.session import Session
from kvtop.sources.kv_wire import decode_payload
from kvtop.tiers import TierModel

SRC = SourceId("127.0.0.1:8000", 0, "t")


def _metrics(text: str, t: float) -> Record:
    from kvtop.sources.engine_metrics import engine_of, parse_metrics

    samples = parse_metrics(text)
    return Record(kind="metrics", data={"engine": engine_of(samples), "url": "x", "samples": samples}, source=SRC,
                  time=t)


def vllm_page(cached: dict[str, int], *, queries: int, sources: tuple[str, ...] = (
        "device", "host", "p2p", "disk", "external_unspecified")) -> str:
    """vLLM's /metrics as loggers.py registers the series (one engine, index 0)."""
    reg = CollectorRegistry()
    Gauge("vllm:cache_config_info", "info", labelnames=["block_size", "num_gpu_blocks", "engine"],
          registry=reg).labels("16", "2048", "0").set(1)
    q = Counter("vllm:prefix_cache_queries", "q", labelnames=["model_name", "engine"], registry=reg)
    q.labels("m", "0").inc(queries)
    by = Counter("vllm:prompt_tokens_cached_by_source", "by source", labelnames=["model_name", "engine", "source"],
                 registry=reg)
    for src in sources:          # pre-created, zero, as loggers.py does for every CacheHitSource
        by.labels("m", "0", src)
    for src, n in cached.items():
        if n:
            by.labels("m", "0", src).inc(n)
    return generate_latest(reg).decode()


def test_vllm_033_sources_each_to_its_tier() -> None:
    m = TierModel()
    m.apply(_metrics(vllm_page({}, queries=0), 1.0))
    m.apply(_metrics(vllm_page({"device": 320, "host": 160, "disk": 64, "p2p": 32, "external_unspecified": 16},
                               queries=1600), 2.0))
    assert m.summary()["stream"]["hit_blocks_by_tier"] == {"gpu": 20, "host": 10, "disk": 4, "external": 3}
    hr = m.hit_rate
    assert (hr.hits, hr.lookups, hr.host_hits, hr.disk_hits, hr.external_hits) == (37, 100, 10, 4, 3)
    # each tier its share: GPU is the device's alone, p2p and external_unspecified are outside the engine
    assert (hr.gpu, hr.host, hr.disk, hr.external) == pytest.approx((0.20, 0.10, 0.04, 0.03))
    assert m.summary()["stream"]["unknown_labels"] == {}


def test_vllm_labels_precreated_at_zero_add_no_share() -> None:
    """vLLM creates every source at 0 on every server: a server without disk or p2p shows GPU and host only."""
    m = TierModel()
    m.apply(_metrics(vllm_page({}, queries=0), 1.0))
    m.apply(_metrics(vllm_page({"device": 320, "host": 160}, queries=1600), 2.0))
    hr = m.hit_rate
    assert (hr.disk, hr.external, hr.window_disk, hr.window_external) == (None, None, None, None)
    assert (hr.gpu, hr.host) == pytest.approx((0.2, 0.1))


def test_vllm_pre_release_spellings_are_read() -> None:
    """cpu (the PR's own test: device 3, cpu 4), mixed and external (harnesses) are the host's and external's."""
    srcs = ("device", "cpu", "disk", "mixed", "external")
    m = TierModel()
    m.apply(_metrics(vllm_page({}, queries=0, sources=srcs), 1.0))
    m.apply(_metrics(vllm_page({"device": 48, "cpu": 64, "mixed": 16, "external": 32}, queries=320, sources=srcs),
                     2.0))
    assert m.summary()["stream"]["hit_blocks_by_tier"] == {"gpu": 3, "host": 4, "disk": 0, "external": 3}
    assert m.hit_rate.host_hits == 4 and m.summary()["stream"]["unknown_labels"] == {}


def test_an_unknown_label_is_a_problem_and_its_hits_still_count() -> None:
    session = Session(source=SourceId("kvtop", 0, "t"))
    srcs = ("device", "host", "nvme_tier")
    session.emit(_metrics(vllm_page({}, queries=0, sources=srcs), 1.0))
    session.emit(_metrics(vllm_page({"device": 160, "nvme_tier": 160}, queries=640, sources=srcs), 2.0))
    session.tick(2.0, 0.0)
    model = session.models[SRC.key()]
    stream = model.summary()["stream"]
    assert stream["unknown_labels"] == {'vllm:prompt_tokens_cached_by_source_total{source="nvme_tier"}': 2}
    assert stream["hit_blocks_by_tier"]["unknown"] == 10 and model.hit_rate.hits == 20   # counted, not dropped
    (p,) = [p for p in session.problems.to_json() if p["kind"] == "engine.unknown_label"]
    assert "nvme_tier" in p["message"] and p["count"] == 2 and not p["lost"]
    assert session.problems.exit_status(session.records_in) == EXIT_OK   # no data lost: the hits are counted
    session.emit(_metrics(vllm_page({"device": 320, "nvme_tier": 160}, queries=960, sources=srcs), 3.0))
    session.tick(3.0, 1.0)
    assert session.problems.count("engine.unknown_label") == 3   # said again with every scrape that has it


def test_an_unknown_medium_is_a_lost_data_problem() -> None:
    session = Session(source=SourceId("kvtop", 0, "t"))
    events = [stored([1, 2], medium="GPU"), stored([3], medium="HBM3E"), removed([1], medium="HBM3E")]
    batch = decode_payload(msgpack.packb([1.0, events, 0]), seq=0)
    session.emit(Record(kind="kv_batch", data=batch.record_data(), source=SRC, time=1.0))
    session.tick(1.0, 0.0)
    p = session.problems.get("engine.unknown_medium")
    assert p is not None and p.count == 2 and p.lost and "HBM3E" in p.message
    assert session.models[SRC.key()].gpu.cached_blocks == 2


def sglang_page(cached: dict[str | None, int], prompt: int) -> str:
    """SGLang's /metrics: cached_tokens_total by cache_source (None: the unlabelled counter of 0.5.5-0.5.8)."""
    reg = CollectorRegistry()
    Gauge("sglang:max_total_num_tokens", "cap", labelnames=["model_name", "tp_rank"],
          registry=reg).labels("m", "0").set(65536)
    Counter("sglang:prompt_tokens", "p", labelnames=["model_name", "tp_rank"], registry=reg).labels("m", "0").inc(
        prompt)
    if None in cached:
        c = Counter("sglang:cached_tokens", "c", labelnames=["model_name", "tp_rank"], registry=reg)
        c.labels("m", "0").inc(cached[None])
        return generate_latest(reg).decode()
    by = Counter("sglang:cached_tokens", "by source", labelnames=["model_name", "tp_rank", "cache_source"],
                 registry=reg)
    for src, n in cached.items():
        assert src is not None
        if n:   # a label value appears only at its first increment (report_cache_source: value > 0)
            by.labels("m", "0", src).inc(n)
            by.labels("m", "1", src).inc(n)   # every TP rank reports the same logical count: read tp_rank 0
    return generate_latest(reg).decode()


@pytest.mark.parametrize(("version", "first", "second", "tiers"), [
    ("0.5.23 HiCache + L3", {"device": 64}, {"device": 704, "host": 128, "storage": 64},
     {"gpu": 10, "host": 2, "disk": 1}),
    ("0.5.9-0.5.19 HiCache + L3", {"device": 64}, {"device": 704, "host": 128, "storage_HiCacheFile": 64},
     {"gpu": 10, "host": 2, "disk": 1}),
    ("0.5.9 no HiCache", {"total": 64}, {"total": 896}, {"gpu": 13}),
    ("0.5.5-0.5.8", {None: 64}, {None: 896}, {"gpu": 13}),
    # both in one page (some requests without a breakdown): disjoint per request, each token counted once
    ("0.5.9 mixed", {"device": 64}, {"device": 384, "host": 128, "storage_MooncakeStore": 64, "total": 320},
     {"gpu": 10, "host": 2, "disk": 1}),
])
def test_sglang_cache_sources_across_versions(version: str, first: dict[str | None, int],
                                              second: dict[str | None, int], tiers: dict[str, int]) -> None:
    m = TierModel()
    m.apply(Record(kind="kv_batch", data={"seq": 0, "ts": 0.5, "rank": 0, "topic": "", "events": [
        {"type": "BlockStored", "block_hashes": [1], "medium": "GPU", "block_size": 64}]}, source=SRC, time=0.5))
    m.apply(_metrics(sglang_page(first, prompt=640), 1.0))
    m.apply(_metrics(sglang_page(second, prompt=6400), 2.0))
    by = m.summary()["stream"]["hit_blocks_by_tier"]
    assert {k: v for k, v in by.items() if v} == tiers, version
    # +5760 prompt tokens (90 blocks of 64), +832 cached (13): the GPU's 640 (10) by whatever label
    assert (m.hit_rate.hits, m.hit_rate.lookups) == (13, 90), version
    assert m.summary()["stream"]["unknown_labels"] == {}


def test_every_vllm_and_sglang_event_field_is_read_kept_or_dropped_on_purpose() -> None:
    """Each field of vLLM 0.33.0's BlockStored / BlockRemoved (and 0.34.0's lookahead_token_ids, SGLang 0.5.23's
    cache_salt and session_id) has a line in kvtop's table, and the record keeps exactly what it says."""
    from kvtop.sources.kv_wire import EVENT_FIELDS

    vllm_033 = ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name",
                "extra_keys", "group_idx", "kv_cache_spec_kind", "kv_cache_spec_sliding_window", "locality",
                "ownership", "session_id")
    assert set(vllm_033) | {"lookahead_token_ids", "cache_salt"} <= set(EVENT_FIELDS)
    ev: dict[str, Any] = stored([11, 12], medium="STORAGE", group_idx=1, kv_cache_spec_kind="sliding_window",
                                kv_cache_spec_sliding_window=4096, locality="REMOTE", ownership="kvcr",
                                session_id="user-42", lookahead_token_ids=[[7, 8], [9, 10]],
                                extra_keys=[None, ["salt"]], cache_salt="s3cret")
    again = stored([11], medium="STORAGE", group_idx=1, ownership="kvcr")
    gone = removed([12], medium="STORAGE", group_idx=1, locality="REMOTE", ownership="kvcr")
    batch = decode_payload(msgpack.packb([1.0, [ev, again, gone], 0]), seq=0)
    kept = batch.events[0]
    for field, why in EVENT_FIELDS.items():
        if field not in ev:
            continue
        if why.startswith("dropped"):
            assert field not in kept, field
        else:
            assert field in kept, field
    assert kept["num_tokens"] == 32 and kept["locality"] == "REMOTE" and kept["kv_cache_spec_kind"] == "sliding_window"
    m = TierModel()
    m.apply(Record(kind="kv_batch", data=batch.record_data(), source=SRC, time=1.0))
    # STORAGE is the disk, REMOTE or not; group 1's blocks are blocks of the same tier; kvcr's second announcement
    # of 11 is refcounted; 12 removed
    disk = m.disk
    assert disk is not None and disk.cached_blocks == 1
    assert m.summary()["stream"]["duplicates"] == 1 and m.moves.disk_offloaded_blocks == 2
