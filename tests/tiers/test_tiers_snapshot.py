"""TierSnapshot (kvtop/tiers/snapshot.py): one immutable reading of a TierModel, published when it changed."""

from __future__ import annotations

import dataclasses
import json

import pytest
from recordings import BUSY_RECORDING

from kvtop.records import Record, SourceId, make, read_jsonl
from kvtop.tiers import TierModel, TierSnapshot
from kvtop.tiers.snapshot import reading

SRC = SourceId("h", 0, "r")


def _busy() -> TierModel:
    m = TierModel()
    for rec in read_jsonl(BUSY_RECORDING):
        assert isinstance(rec, Record)
        m.apply(rec)
    return m


def test_a_snapshot_reads_as_the_model_does_and_stays_put_while_the_model_moves_on() -> None:
    m = _busy()
    snap = m.snapshot()
    assert m.published is snap
    assert snap.summary() == m.summary()  # the --json keys, tiers.gpu / tiers.host, exactly as the model gives them
    assert json.loads(json.dumps(snap.summary()))["tiers"]["gpu"]["capacity_blocks"] == 256
    assert (snap.gpu, snap.host, snap.tiers, snap.moves, snap.hit_rate, snap.requests) == (
        m.gpu, m.host, tuple(m.tiers), m.moves, m.hit_rate, m.requests)
    assert snap.history() == m.history() and snap.cached_by_priority == m.cached_by_priority
    offloaded = snap.moves.offloaded_blocks
    pool = next(iter(m.event_fold.pools.values()))
    block = next(h for h, c in pool.blocks.items() if c & 1 == 0)  # a GPU block the fold holds
    m.apply(make("kv_event", {"event_id": m.event_fold.next_event_id, "data": {
        "type": "updated", "block_hash": block, "cache_level": {"old_value": 0, "new_value": 1}}}, SRC, m.now))
    assert m.moves.offloaded_blocks == offloaded + 1
    assert snap.moves.offloaded_blocks == offloaded and m.published is snap  # published only when asked
    again = m.snapshot()
    assert again is not snap and again.moves.offloaded_blocks == offloaded + 1 and m.published is again


def test_a_snapshots_summary_is_the_models_at_every_point_of_a_busy_run() -> None:
    # take() builds the summary from the reads it took for the snapshot's own fields (one set of percentiles, not
    # two): it must still be exactly what the model's summary() says at that moment, record after record.
    m = TierModel()
    compared = 0
    for i, rec in enumerate(read_jsonl(BUSY_RECORDING)):
        assert isinstance(rec, Record)
        m.apply(rec)
        if i % 97 == 0:
            snap = m.snapshot()
            assert snap.summary() == m.summary(), f"after record {i}"
            assert snap.requests == m.requests and snap.tiers == tuple(m.tiers)
            compared += 1
    assert compared > 30 and m.snapshot().summary()["requests"]["completed"] > 0


def test_a_snapshots_summary_made_later_is_the_one_of_the_moment_it_was_taken() -> None:
    # The summary and the history points are made when first read, from what the snapshot took: a model that
    # folded on since must not leak into them. Two models fed the same records: one moves on, one stays.
    records = list(read_jsonl(BUSY_RECORDING))
    moving, still = TierModel(), TierModel()
    half = len(records) // 2
    for rec in records[:half]:
        assert isinstance(rec, Record)
        moving.apply(rec)
        still.apply(rec)
    snap = moving.snapshot()
    for rec in records[half:]:
        assert isinstance(rec, Record)
        moving.apply(rec)
    assert moving.summary() != still.summary()  # the model did move on...
    assert snap.summary() == still.summary() and snap.history() == still.history()  # ...the snapshot did not
    assert snap.summary_data["stream"] == still.summary()["stream"]


def test_an_unchanged_model_hands_out_the_same_snapshot_and_any_record_changes_it() -> None:
    m = _busy()
    first = m.snapshot()
    assert m.snapshot() is first  # nothing folded: no rebuild
    m.reset_window()
    after_reset = m.snapshot()
    assert after_reset is not first
    m.apply(make("kv_event", {"event_id": 0, "data": {"type": "updated", "block_hash": 1,
                                                      "cache_level": {"old_value": 0, "new_value": 1}}}, SRC, m.now))
    # an old event id: the fold only counts it (quality), and the snapshot must show that count too
    dup = m.snapshot()
    assert dup is not after_reset and dup.quality == m.quality
    m.apply(make("stats", {"kvCacheStats": {"freeNumBlocks": -1}}, SRC, (m.now or 0) + 1))  # refused: a bad record
    bad = m.snapshot()
    assert bad is not dup and bad.bad_records == dup.bad_records + 1


def test_a_snapshot_is_immutable_and_its_summary_a_copy() -> None:
    snap = _busy().snapshot()
    with pytest.raises(dataclasses.FrozenInstanceError):
        snap.now = 0.0  # type: ignore[misc]
    with pytest.raises(TypeError):
        snap.meta["engine"] = "x"  # type: ignore[index]
    with pytest.raises(TypeError):
        snap.gpus[9] = None  # type: ignore[index]
    assert not hasattr(snap, "__dict__")  # slots
    mine = snap.summary()
    mine["tiers"]["gpu"]["capacity_blocks"] = -1
    mine["extra"] = 1
    assert snap.summary()["tiers"]["gpu"]["capacity_blocks"] == 256 and "extra" not in snap.summary()


def test_reading_takes_a_models_snapshot_and_passes_anything_else_through() -> None:
    m = _busy()
    snap = reading(m)
    assert isinstance(snap, TierSnapshot) and snap is m.published
    assert reading(snap) is snap
    stand_in = object()
    assert reading(stand_in) is stand_in
