"""Recordings write token lists compactly (kvtop/compact.py) and every reader gives them in one form (plain
tokens as ids): an old recording (verbatim TensorRT-LLM token dicts) and the same records written by today's
recorder read and fold identically."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from hypothesis import given
from hypothesis import strategies as st
from recordings import BUSY_RECORDING

from kvtop.compact import compact_event, expand_event
from kvtop.records import Record, RecordError, read_jsonl
from kvtop.sinks.recorder import Recorder
from kvtop.tiers import TierModel
from kvtop.tiers.whatif import WhatIf


def _fold(path: Path) -> tuple[dict[str, Any], dict[str, Any], list[Record]]:
    model, whatif = TierModel(), WhatIf()
    records = []
    for rec in read_jsonl(path):
        assert not isinstance(rec, RecordError), rec
        records.append(rec)
        model.apply(rec)
        whatif.apply(rec)
    return model.summary(), whatif.estimate(), records


def test_an_old_recording_and_its_compact_copy_fold_identically(tmp_path: Path) -> None:
    old_summary, old_whatif, old_records = _fold(BUSY_RECORDING)
    new = tmp_path / "busy-compact.jsonl"
    with Recorder(new, append=False) as rec:
        for r in old_records:
            rec.write(r)
    new_summary, new_whatif, new_records = _fold(new)
    assert new_summary == old_summary
    assert new_whatif == old_whatif
    # Record by record, the reader hands the fold the same dicts from both.
    assert [(r.kind, r.source, r.time, r.data) for r in new_records] == \
        [(r.kind, r.source, r.time, r.data) for r in old_records]
    # ... from a smaller file: the KV events (32-token blocks, every token a dict) to under 1/3.5, the whole
    # busy recording (which is mostly stats: 1,768 of them, 1,419 events) to under 60% (4.85 MB -> 2.63 MB)
    def event_bytes(path: Path) -> int:
        return sum(len(ln) for ln in path.read_bytes().splitlines() if b'"kind":"kv_event"' in ln)

    assert event_bytes(new) < event_bytes(BUSY_RECORDING) / 3.5   # 2.99 MB -> 0.77 MB
    old_size, new_size = BUSY_RECORDING.stat().st_size, new.stat().st_size
    assert new_size < 0.6 * old_size, (old_size, new_size)
    lines = new.read_text().splitlines()
    line = next(ln for ln in lines if '"stored"' in ln)
    assert '"token_ids":[' in line and "unique_token" not in line
    # Runs of events share a line: fewer lines than records, and no offload written as a dict any more.
    assert len(lines) < 0.7 * len(old_records) and '"type":"updated"' not in new.read_text()


_token = st.fixed_dictionaries({"type": st.just("unique_token"), "token_id": st.integers(0, 2**31),
                                "token_extra_id": st.just(0)})
_odd_token = st.one_of(
    st.fixed_dictionaries({"type": st.just("unique_token"), "token_id": st.integers(0, 9),
                           "token_extra_id": st.integers(1, 5)}),                   # a multimodal extra id
    st.fixed_dictionaries({"type": st.just("other"), "token_id": st.integers(0, 9),
                           "token_extra_id": st.just(0)}),
    st.integers())                                                                    # not a dict at all
_block = st.fixed_dictionaries({
    "type": st.just("stored_block"), "block_hash": st.integers(-(2**63), 2**64 - 1),
    "tokens": st.one_of(st.lists(_token, max_size=8), st.lists(st.one_of(_token, _odd_token), max_size=8)),
    "cache_level": st.integers(0, 1), "priority": st.integers(0, 100)})
_event = st.fixed_dictionaries({"event_id": st.integers(0, 10**6), "window_size": st.integers(1, 10**5),
                                "data": st.fixed_dictionaries({"type": st.just("stored"),
                                                               "parent_hash": st.one_of(st.none(), st.integers()),
                                                               "blocks": st.lists(_block, max_size=4)})})


@given(_event)
def test_compact_then_expand_gives_the_event_back(event: dict[str, Any]) -> None:
    before = copy.deepcopy(event)
    small = compact_event(event)
    assert event == before                                     # the engine's dict is not touched
    back = expand_event(json.loads(json.dumps(small)))         # through JSON, as a recording goes
    assert back == before
    for b_small, b in zip(small["data"]["blocks"], before["data"]["blocks"]):
        plain = all(isinstance(t, dict) and t.get("type") == "unique_token" and t.get("token_extra_id") == 0
                    for t in b["tokens"])
        assert ("token_ids" in b_small) == plain               # only plain token lists are compacted


_diff = st.one_of(st.none(), st.fixed_dictionaries({"type": st.just("event_diff"), "new_value": st.integers(),
                                                    "old_value": st.integers()}),
                  st.fixed_dictionaries({"type": st.just("event_diff"), "new_value": st.text(max_size=2),
                                         "old_value": st.integers()}))


@given(h=st.integers(0, 2**64 - 1), level=_diff, prio=_diff)
def test_updated_events_round_trip(h: int, level: Any, prio: Any) -> None:
    ev = {"event_id": 9, "data": {"type": "updated", "block_hash": h, "cache_level": level, "priority": prio},
          "window_size": 4096}
    before = copy.deepcopy(ev)
    small = compact_event(ev)
    assert ev == before
    assert expand_event(json.loads(json.dumps(small))) == before
    if isinstance(level, dict) and isinstance(level["new_value"], int):
        assert small["data"]["cache_level_diff"] == [level["old_value"], level["new_value"]]


def test_other_events_pass_as_they_are() -> None:
    for ev in ({"event_id": 3, "data": {"type": "removed", "block_hashes": [1, 2]}},
               {"event_id": 0, "data": {"type": "created", "num_blocks_per_cache_level": [8, 4]}}):
        assert compact_event(ev) is ev and expand_event(copy.deepcopy(ev)) == ev



def _updated(eid: int, h: int, old: int, new: int) -> dict[str, Any]:
    return {"event_id": eid, "data": {"type": "updated", "block_hash": h,
                                      "cache_level": {"type": "event_diff", "new_value": new, "old_value": old},
                                      "priority": None}, "window_size": 4096}


@given(eid=st.integers(0, 2**40), h=st.integers(-(2**63), 2**64 - 1), old=st.integers(0, 1), new=st.integers(0, 1))
def test_offloads_and_onboards_pack_to_five_numbers(eid: int, h: int, old: int, new: int) -> None:
    from kvtop.compact import pack_event, read_event, unpack_event

    ev = _updated(eid, h, old, new)
    packed = pack_event(copy.deepcopy(ev))
    assert packed == [eid, h, old, new, 4096]
    assert unpack_event(json.loads(json.dumps(packed))) == ev
    with_prio = copy.deepcopy(ev)
    with_prio["data"]["priority"] = {"type": "event_diff", "new_value": 80, "old_value": 35}
    assert isinstance(pack_event(with_prio), dict)           # anything else stays a dict
    assert read_event(unpack_event(json.loads(json.dumps(pack_event(with_prio))))) == with_prio


def test_a_bad_event_in_a_batch_line_is_one_error_and_the_rest_is_kept(tmp_path: Path) -> None:
    from kvtop.records import SourceId, make

    src, other = SourceId(host="a", rank=0, run="r"), SourceId(host="b", rank=1, run="r")
    path = tmp_path / "run.jsonl"
    with Recorder(path, append=False) as rec:
        for i in range(4):
            rec.write(make("kv_event", _updated(i, 100 + i, 0, 1), src, 10.0 + i / 8))
        rec.write(make("kv_event", _updated(9, 200, 1, 0), other, 11.0))   # another source: a new line
        rec.write(make("stats", {"iter": 1}, src, 11.5))
        rec.write(make("kv_event", _updated(10, 300, 0, 1), src, 12.0))
    lines = path.read_text().splitlines()
    assert [json.loads(ln)["kind"] for ln in lines] == ["kv_events", "kv_events", "stats", "kv_events"]
    got = [r for r in read_jsonl(path)]
    assert [(r.source.host, r.time, r.data["event_id"] if r.kind == "kv_event" else None) for r in got] == \
        [("a", 10.0, 0), ("a", 10.125, 1), ("a", 10.25, 2), ("a", 10.375, 3), ("b", 11.0, 9), ("a", 11.5, None),
         ("a", 12.0, 10)]
    first = json.loads(lines[0])
    first["data"]["events"][2] = [1, 2]                     # a packed event cut short
    lines[0] = json.dumps(first)
    path.write_text("\n".join(lines) + "\n")
    got = [r for r in read_jsonl(path)]
    errors = [r for r in got if isinstance(r, RecordError)]
    assert len(errors) == 1 and errors[0].line == 1 and errors[0].field.startswith("events[2]")
    assert sum(1 for r in got if not isinstance(r, RecordError)) == 6


def test_a_batch_never_writes_what_json_cannot_read(tmp_path: Path) -> None:
    import pytest

    from kvtop.records import Record, SourceId

    rec = Recorder(tmp_path / "x.jsonl", append=False)
    with pytest.raises(ValueError):
        rec.write(Record(kind="kv_event", data=_updated(1, 2, 0, 1), source=SourceId(), time=float("nan")))
    rec.close()
    assert all(not isinstance(r, RecordError) for r in read_jsonl(tmp_path / "x.jsonl"))


@given(_event)
def test_read_form_is_read_event_without_touching_the_engines_dict(event: dict[str, Any]) -> None:
    """records.make hands an engine's event to the fold as a reader would give it (read_form), and leaves the
    engine's dict as it was; the same form comes back from a line of it, verbatim or compact."""
    from kvtop.compact import read_event, read_form

    before = copy.deepcopy(event)
    got = read_form(event)
    assert event == before
    assert got == read_event(copy.deepcopy(event)) == read_event(json.loads(json.dumps(compact_event(event))))
    for b_got, b in zip(got["data"]["blocks"], before["data"]["blocks"]):
        if "token_ids" in b_got:
            assert "tokens" not in b_got and b_got["token_ids"] == [t["token_id"] for t in b["tokens"]]
