"""A drain folded at once (TierModel.apply_kv_event_records -> EventFold.apply_drain, SizeAdvice.apply_kv_events:
what Session.emit_kv_events folds a driven run's drains with) leaves the fold as the same events one by one
(``TierModel.apply`` of each event's record, ``SizeAdvice.apply_kv_event`` of each), after every drain: every
attribute of the model, its event fold and ledger, the what-if and its ghost list, the size advice, their curve and
estimate, the bad records' reasons and the what-if's errors, in order.

The streams are the simulator's block manager's (a host pool under pressure, so blocks are offloaded, onboarded,
evicted and ghosted), cut into drains of random sizes at random times, with random damage: duplicate, lost and
backwards ids, ranks and windows, events as strings, bad and unknown hashes, levels and priorities, removals of many
blocks or of no list, stores under an unhashable parent (the what-if raises when that block is dropped), a second
``created`` event (a new ghost list), low priorities (blocks no host would keep), non-float drain times."""

from __future__ import annotations

import copy
import json
import random
from collections import deque
from typing import Any

import pytest

from kvtop.engines.sim import sweep
from kvtop.engines.sim.block_manager import BlockManager
from kvtop.records import Record, SourceId
from kvtop.tiers import TierModel
from kvtop.tiers.sizeadvice import SizeAdvice
from kvtop.tiers.whatif import WhatIf
from kvtop.workload.trace import TraceRequest

SRC = SourceId(host="drain")
PRIMARY, HOST, TPB = 96, 120, 16


def _stream(seed: int) -> list[dict[str, Any]]:
    """The events of 160 requests over shared prefixes through the block manager (drained in the driven path's
    form: tokens as ``token_ids``)."""
    rng = random.Random(seed)
    prefixes = [[rng.randrange(500) for _ in range(rng.randint(1, 5))] for _ in range(24)]
    requests = []
    for i in range(160):
        ids = list(rng.choice(prefixes)) + [10_000 + i * 10 + k for k in range(rng.randint(0, 2))]
        requests.append(TraceRequest(i, float(i), len(ids) * 128 - rng.randrange(128), rng.randint(1, 40),
                                     tuple(ids)))
    bm = BlockManager(PRIMARY, HOST, TPB, event_buffer_max_size=1 << 30, event_token_ids=True)
    events: list[dict[str, Any]] = []
    sweep.replay_trace(bm, requests, after_add=lambda: events.extend(bm.take_events()))
    events.extend(bm.take_events())
    return events


def _damaged(events: list[dict[str, Any]], rng: random.Random) -> list[Any]:
    """The stream with one in ~12 events damaged (or an event added or lost)."""
    out: list[Any] = []
    known: list[int] = []
    for ev in events:
        ev = copy.deepcopy(ev)
        data = ev["data"]
        if data["type"] == "stored":
            known.extend(b["block_hash"] for b in data["blocks"])
        if rng.random() > 0.08:
            out.append(ev)
            continue
        what = rng.randrange(23)
        if what == 0:
            out += [ev, copy.deepcopy(ev)]                      # the same id again
        elif what == 1:
            continue                                            # lost: a gap
        elif what == 2:
            ev["event_id"] = max(0, ev["event_id"] - rng.randint(2, 50))  # backwards: a restart
            out.append(ev)
        elif what == 3:
            ev["attention_dp_rank"] = rng.choice([0, 1, -1, "x", None])
            out.append(ev)
        elif what == 4:
            ev["window_size"] = rng.choice([None, 7, -3, "w"])
            out.append(ev)
        elif what == 5:
            out.append(json.dumps(ev))                          # a JSON string
        elif what == 6:
            ev["event_id"] = rng.choice(["7", None, -1, 2.5])
            out.append(ev)
        elif what == 7:
            data["type"] = rng.choice(["bogus", None, 3])
            out.append(ev)
        elif what == 8:
            out.append(rng.choice([None, 5, [], {"event_id": ev["event_id"]}, {"data": 4, "event_id": 1}]))
        elif what == 9:
            out.append({"event_id": ev["event_id"], "data": {"type": "updated", "block_hash": rng.choice(
                known or [1]), "cache_level": rng.choice([{"new_value": 1, "old_value": 0},
                                                          {"new_value": 0, "old_value": 1}, {"new_value": 2},
                                                          {"new_value": True}, {"new_value": "1"}, {"old_value": 0},
                                                          [1], None, {"new_value": 1, "old_value": 1}]),
                "priority": rng.choice([None, None, {"new_value": 10, "old_value": 35}, {"new_value": "high"},
                                        5])}, "window_size": ev.get("window_size")})
        elif what == 10:
            out.append({"event_id": ev["event_id"], "data": {"type": "updated", "block_hash": rng.choice(
                [rng.getrandbits(64), -5, [1, 2], "h", 2 ** 70]), "cache_level": {"new_value": 1, "old_value": 0}},
                "window_size": ev.get("window_size")})
        elif what == 11:
            out.append({"event_id": ev["event_id"], "data": {"type": "removed", "block_hashes": rng.choice([
                rng.sample(known, min(len(known), 3)), 5, "abc", (known[-1],) if known else (1,), [-1], [[1]],
                [known[0], "x"] if known else [], [rng.getrandbits(64)], None])},
                "window_size": ev.get("window_size")})
        elif what == 12 and data["type"] == "stored" and data["blocks"]:
            for b in data["blocks"]:
                b["priority"] = rng.choice([10, 20, 35, 90])    # below 30: no host would keep it
            out.append(ev)
        elif what == 13 and data["type"] == "stored":
            data["parent_hash"] = [1, 2]                        # unhashable: the what-if raises on its drop
            out.append(ev)
        elif what == 14 and data["type"] == "stored":
            data["blocks"] = rng.choice([5, None, [{"block_hash": "x"}], [3]])
            out.append(ev)
        elif what == 15:
            out.append({"event_id": 0, "data": {"type": "created", "num_blocks_per_cache_level": rng.choice(
                [[PRIMARY, HOST], [PRIMARY, HOST * 2], [PRIMARY], [-1, 3], "x"])}, "window_size": ev.get(
                "window_size")})
        elif what == 16 and data["type"] == "updated":
            data["cache_level"]["old_value"] = 1 - data["cache_level"]["new_value"] \
                if rng.random() < 0.5 else data["cache_level"]["new_value"]
            out.append(ev)
        elif what == 17 and data["type"] == "updated":
            data["block_hash"] = rng.choice([True, 3.0, -(2 ** 63)])
            out.append(ev)
        elif what == 18 and data["type"] == "removed":
            data["block_hashes"] = data["block_hashes"] * 2  # the same block twice
            out.append(ev)
        elif what == 19:
            ev["event_id"] = float(ev["event_id"])
            out.append(ev)
        elif what == 20 and data["type"] == "removed" and known:
            data["block_hashes"] = [known[rng.randrange(len(known))]]  # maybe a block already gone, or a parent
            out.append(ev)
        elif what == 21 and known:
            h = known[-1]  # a GPU block's priority lowered, then the block dropped: no host would have kept it
            out += [ev, {"event_id": ev["event_id"] + 1, "data": {"type": "updated", "block_hash": h,
                                                                   "priority": {"new_value": 10, "old_value": 35}}},
                    {"event_id": ev["event_id"] + 2, "data": {"type": "removed", "block_hashes": [h]}}]
        else:
            out.append(ev)
    return out


def _dump(obj: Any, seen: set[int] | None = None) -> Any:
    """Everything an object holds, in order (a dict's order too: the ghost list's is its drop order)."""
    seen = set() if seen is None else seen
    if obj is None or isinstance(obj, (bool, int, str, bytes)):
        return obj
    if isinstance(obj, float):
        return repr(obj)  # nan equal to nan
    if isinstance(obj, dict):
        return ["dict", [(_dump(k, seen), _dump(v, seen)) for k, v in obj.items()]]
    if isinstance(obj, (list, tuple, deque)):
        return [type(obj).__name__, [_dump(x, seen) for x in obj]]
    if isinstance(obj, (set, frozenset)):
        return ["set", sorted(repr(x) for x in obj)]
    if callable(obj) and not hasattr(obj, "__slots__") and not hasattr(obj, "__dict__") or hasattr(obj, "__func__"):
        return ["callable", getattr(obj, "__qualname__", repr(obj))]
    if callable(obj) and getattr(obj, "__name__", None) == "<lambda>":
        return ["lambda"]
    if id(obj) in seen:
        return ["seen", type(obj).__name__]
    seen.add(id(obj))
    fields = dict(vars(obj)) if hasattr(obj, "__dict__") else {}
    for cls in type(obj).__mro__:
        for name in getattr(cls, "__slots__", ()):
            if hasattr(obj, name):
                fields[name] = getattr(obj, name)
    return [type(obj).__name__, [(k, _dump(v, seen)) for k, v in sorted(fields.items())]]


def _state(model: TierModel, sizing: SizeAdvice, reasons: list[Any], errors: list[str]) -> Any:
    return _dump({"model": model, "sizing": sizing, "curve": sizing.curve(400, 1000, optimum=False),
                  "estimate": sizing.whatif.estimate(), "summary": model.summary(), "reasons": reasons,
                  "errors": errors})


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_a_drain_folds_as_its_events_one_by_one(seed: int) -> None:
    rng = random.Random(seed)
    stream = _damaged(_stream(seed), rng)
    assert len(stream) > 3000
    warmup = 5 if seed == 2 else 0  # warming: the onboards count as warm-up host hits
    one = TierModel(warmup_requests=warmup), SizeAdvice(WhatIf(tokens_per_block=TPB), max_onboards=40)
    batch = TierModel(warmup_requests=warmup), SizeAdvice(WhatIf(tokens_per_block=TPB), max_onboards=40)
    one_reasons: list[Any] = []
    one_errors: list[str] = []
    batch_reasons: list[Any] = []
    batch_errors: list[str] = []
    t = 1000.0
    i = drains = 0
    while i < len(stream):
        n = rng.choice([1, 2, 5, 30, 200, 1000])
        events = stream[i:i + n]
        i += n
        t = rng.choice([t, t + rng.random(), t - 1.0, t + 0.25]) if rng.random() > 0.03 else rng.choice(
            [float("nan"), 3, float("inf")])
        model, sizing = one
        for ev in events:
            bad = model.bad_records
            model.apply(Record("kv_event", ev, SRC, t))
            if model.bad_records != bad:
                one_reasons.append(model.last_bad_reason)
            try:
                sizing.apply_kv_event(ev)
            except Exception as exc:
                one_errors.append(f"{type(exc).__name__}: {exc}")
        model, sizing = batch
        batch_reasons.extend(model.apply_kv_event_records(events, t) or ())  # type: ignore[arg-type]
        sizing.apply_kv_events(events, lambda exc: batch_errors.append(f"{type(exc).__name__}: {exc}"))
        assert _state(*batch, batch_reasons, batch_errors) == _state(*one, one_reasons, one_errors), (seed, drains)
        if not isinstance(t, float) or t != t or t == float("inf"):
            t = 1000.0 + i
        drains += 1
    # the streams reach what the drain's own loops hand on, and what they fold themselves
    model, sizing = one
    w = sizing.whatif
    assert model.bad_records > 20 and len(one_errors) > 0 and w.ghosted > 500 and w.dropped_low_priority > 0
    assert w.onboards > 20 and w.offloads > 200 and sizing.frozen_onboards > 0 and sum(model.event_fold.evicted) > 100
    assert w._ghosts._next > 2 * w._ghosts._size or w._ghosts._base == 0  # renumbered at least once
    assert model.event_fold.duplicates > 0 and model.event_fold.restarts > 0 and model.event_fold.dropped > 0


def test_a_drain_raises_where_its_events_one_by_one_do_when_no_one_takes_errors() -> None:
    """SizeAdvice.apply_kv_events without ``on_error``: the event that raises is raised, and the fold stands as it
    did one by one when that event raised (the events after it not folded)."""
    events = _stream(4)[:400]
    cut = next(i for i, ev in enumerate(events) if ev["data"]["type"] == "removed" and i > 100)
    bad = {"event_id": 10**6, "data": {"type": "removed", "block_hashes": 5}}
    batch, one = SizeAdvice(), SizeAdvice()
    with pytest.raises(TypeError):
        batch.apply_kv_events([*events[:cut], bad, *events[cut:]])
    for ev in events[:cut]:
        one.apply_kv_event(ev)
    with pytest.raises(TypeError):
        one.apply_kv_event(bad)
    assert _dump(batch) == _dump(one)
