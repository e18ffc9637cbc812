"""Why a block left its tier (issue 23, item 6; kvtop/tiers/departures.py): said where the engine's events say it
(TensorRT-LLM's event types, a BlockRemoved ``reason``, AllBlocksCleared), inferred where they do not (vLLM 0.33's
and SGLang 0.5.23's BlockRemoved), shown on the dashboard's moves panel, the text and JSON summaries and
Prometheus."""

from __future__ import annotations

from kv_publisher import cleared, payload, removed, stored
from prometheus_client.parser import text_string_to_metric_families

from kvtop.records import Record, SourceId
from kvtop.run_summary import format_summary
from kvtop.sinks.prometheus import PrometheusExporter
from kvtop.sources.kv_wire import decode_payload
from kvtop.tiers import TierModel
from kvtop.tiers.departures import describe, reason_of

SRC = SourceId("127.0.0.1:5557", 0, "t")


def _batch(seq: int, events: list, t: float = 100.0) -> Record:
    b = decode_payload(payload(events))
    return Record(kind="kv_batch", data={**b.record_data(), "seq": seq}, source=SRC, time=t)


def _trtllm(events: list[dict]) -> TierModel:
    m = TierModel()
    for i, data in enumerate(events):
        m.apply_kv_event({"event_id": i, "data": data, "window_size": 64}, t=100.0 + i)
    return m


def _block(h: int, level: int = 0) -> dict:
    return {"type": "stored_block", "block_hash": h, "tokens": [], "cache_level": level, "priority": 35}


def test_trtllm_events_say_why_by_their_type() -> None:
    """TensorRT-LLM 1.x (_utils.py KVCacheEventSerializer): ``updated`` cache_level 0 -> 1 is an offload, ``removed``
    an eviction from the tier the block is in; no event says "released" (a released block stays cached)."""
    m = _trtllm([
        {"type": "created", "num_blocks_per_cache_level": [4, 4]},
        {"type": "stored", "parent_hash": None, "blocks": [_block(1), _block(2), _block(3)]},
        {"type": "updated", "block_hash": 3, "cache_level": {"type": "event_diff", "new_value": 1, "old_value": 0},
         "priority": None},
        {"type": "removed", "block_hashes": [3]},      # from the host: evicted there
        {"type": "removed", "block_hashes": [2, 1]},   # from the GPU, never offloaded
        {"type": "removed", "block_hashes": [99]},     # a hash the fold never saw: tier unknown
    ])
    mv = m.moves
    assert mv.left_said == {"gpu": {"evicted": 2, "offloaded": 1}, "host": {"evicted": 1},
                            "unknown": {"evicted": 1}}
    assert mv.left_inferred == {}
    assert describe(mv.left_said, mv.left_inferred) == (
        "GPU evicted 2, offloaded 1 (engine) | host evicted 1 (engine) | unknown tier evicted 1 (engine)")


def test_vllm_removals_say_the_tier_not_why_so_kvtop_infers_it() -> None:
    """vLLM 0.33 (kv_events.py BlockRemoved{block_hashes, medium, ...}): a GPU block whose hash the CPU tier holds
    left as an offload, one no lower tier holds was evicted; the CPU copy's removal is an eviction from the host.
    AllBlocksCleared is said by the engine."""
    m = TierModel()
    m.apply(_batch(0, [stored([1, 2, 3], medium="GPU"), stored([1], medium="CPU"),
                       removed([1, 2], medium="GPU")]))
    m.apply(_batch(1, [removed([1], medium="CPU"), cleared()]))
    mv = m.moves
    assert mv.left_inferred == {"gpu": {"offloaded": 1, "evicted": 1}, "host": {"evicted": 1}}
    assert mv.left_said == {"gpu": {"cleared": 1}}  # block 3 was still on the GPU
    assert describe(mv.left_said, mv.left_inferred) == (
        "GPU cleared 1 (engine); evicted 1, offloaded 1 (inferred) | host evicted 1 (inferred)")
    summary = m.snapshot().summary()
    assert summary["moves"]["left_inferred"] == {"gpu": {"offloaded": 1, "evicted": 1}, "host": {"evicted": 1}}
    text = format_summary(summary)
    assert "left: GPU cleared 1 (engine); evicted 1, offloaded 1 (inferred) | host evicted 1 (inferred)" in text


def test_a_removal_reason_is_read_where_the_engine_sends_one() -> None:
    """sglang PR #39620 (open) proposes ``reason`` on BlockRemoved: read where present, mapped to kvtop's words,
    an unknown word kept as the engine spelt it (escape sequences stripped)."""
    m = TierModel()
    m.apply(_batch(0, [stored([1, 2, 3, 4], medium="GPU"), stored([2], medium="CPU_PINNED")]))
    m.apply(_batch(1, [removed([1], medium="GPU", reason="capacity_eviction"),
                       removed([2], medium="GPU", reason="demoted"),
                       removed([3], medium="GPU", reason="request_finished"),
                       removed([4], medium="GPU", reason="\x1b[31mweird")]))
    assert m.moves.left_said == {"gpu": {"evicted": 1, "offloaded": 1, "released": 1, "weird": 1}}
    assert m.moves.left_inferred == {}
    assert reason_of("") is None and reason_of(None) is None and reason_of(5) is None


def test_prometheus_has_the_reasons_with_their_basis() -> None:
    m = TierModel()
    m.apply(_batch(0, [stored([1, 2], medium="GPU"), stored([1], medium="CPU"), removed([1, 2], medium="GPU")]))
    m.snapshot()
    exporter = PrometheusExporter(lambda: {"a": m})
    text = exporter.render().decode()
    samples = {(s.labels["tier"], s.labels["reason"], s.labels["basis"]): s.value
               for f in text_string_to_metric_families(text) if f.name == "kvtop_kv_left_blocks"
               for s in f.samples if s.name.endswith("_total")}
    assert samples == {("gpu", "offloaded", "inferred"): 1.0, ("gpu", "evicted", "inferred"): 1.0}


def test_an_agent_summary_carries_the_reasons_to_a_remote_dashboard() -> None:
    """``kvtop agent`` sends its source's reasons in its summary (``left``); the dashboard that folds the summary
    shows them as the agent's fold had them, said and inferred apart; a summary without them shows none."""
    from kvtop.agent import summary_data

    m = TierModel()
    m.apply(_batch(0, [stored([1, 2], medium="GPU"), stored([1], medium="CPU"), removed([1, 2], medium="GPU"),
                       cleared()]))
    data = summary_data(m, seq=0, interval_s=1.0, agent="a")
    assert data["left"] == {"said": {"host": {"cleared": 1}},
                            "inferred": {"gpu": {"offloaded": 1, "evicted": 1}}}
    remote = TierModel()
    remote.apply(Record(kind="summary", data=data, source=SRC, time=100.0))
    assert remote.moves.left_said == {"host": {"cleared": 1}}
    assert remote.moves.left_inferred == {"gpu": {"offloaded": 1, "evicted": 1}}
    old = TierModel()
    old.apply(Record(kind="summary", data={k: v for k, v in data.items() if k != "left"}, source=SRC, time=100.0))
    assert (old.moves.left_said, old.moves.left_inferred) == ({}, {})
