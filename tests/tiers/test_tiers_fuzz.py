"""Fuzzing the fold: random and mutated TensorRT-LLM 1.2 dicts never raise out of ``apply*``, never drive a count
negative, and a malformed field is counted in ``bad_records`` with a reason that names it."""

from __future__ import annotations

import copy
import json
import math
import random
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtop.engines.sim.block_manager import BlockManager
from kvtop.engines.sim.retention import KvCacheRetentionConfig, TokenRangeRetentionConfig
from kvtop.records import KINDS, Record
from kvtop.tiers import TierModel

U64 = 1 << 64
SETTINGS = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
# Random streams are costlier to generate (recursive JSON junk): fewer examples, ~5 s each on a quiet core.
STREAM_SETTINGS = settings(SETTINGS, max_examples=120)


def _corpus() -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Real 1.2-shaped events and stats from the block manager: offloads, onboards, evictions, priorities."""
    rng = random.Random(0)
    bm = BlockManager(12, 6, 4, event_buffer_max_size=1 << 20, clock_ms=lambda: 0.0)
    stats = []
    prefixes = [[rng.randrange(100) for _ in range(rng.randrange(4, 20))] for _ in range(4)]
    for i in range(60):
        prompt = rng.choice(prefixes) + [rng.randrange(6) for _ in range(rng.randrange(1, 8))]
        cfg = KvCacheRetentionConfig([TokenRangeRetentionConfig(0, None, rng.randrange(101))])
        bm.add_sequence(i, prompt, cfg if rng.random() < 0.5 else None)
        bm.store_context_blocks(i)
        bm.add_token(i, 1)
        bm.remove_sequence(i)
        stats.append({"iter": i, "numCompletedRequests": 1, "numActiveRequests": 0, "numQueuedRequests": 0,
                      "gpuMemUsage": 1 << 30, "pinnedMemUsage": 0, "kvCacheStats": bm.kv_cache_stats(),
                      "inflightBatchingStats": {"numCtxTokens": len(prompt), "numGenRequests": 1}})
    return bm.take_events(), stats


EVENTS, STATS = _corpus()
TYPES = {t: [e for e in EVENTS if e["data"]["type"] == t] for t in ("created", "stored", "removed", "updated")}
assert all(TYPES.values()), {t: len(v) for t, v in TYPES.items()}

# JSON-ish junk, and values that look right but are not.
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=True) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=10)
hashes = st.one_of(st.integers(0, U64 - 1), st.integers(-(2**63), -1), st.sampled_from([0, 2**63, U64 - 1]))


def check_invariants(m: TierModel) -> None:
    """Nothing negative, everything readable and JSON-able, whatever came in."""
    for tier in (m.gpu, m.host):
        for v in (tier.capacity_blocks, tier.in_use_blocks, tier.cached_blocks, tier.free_blocks):
            assert v is None or v >= 0, tier
    mv = m.moves
    assert min(mv.offloaded_blocks, mv.onboarded_blocks, mv.evicted_gpu_blocks, mv.evicted_host_blocks) >= 0
    for per in m.cached_by_priority.values():
        assert all(n > 0 for n in per.values()), per
    for pool in m.event_fold.pools.values():
        assert min(pool.prio) >= 0
    hr = m.hit_rate
    for rate in (hr.cumulative, hr.gpu, hr.host, hr.window):
        assert rate is None or (math.isfinite(rate) and -1e-9 <= rate <= 1 + 1e-9), hr
    json.dumps(m.summary(), allow_nan=False)


# ------------------------------------------------------------------------------------------------ random input

def random_event() -> st.SearchStrategy[Any]:
    data = st.fixed_dictionaries(
        {"type": st.sampled_from(["created", "stored", "removed", "updated", "teleported"]) | json_values},
        optional={
            "blocks": st.lists(st.fixed_dictionaries(
                {"block_hash": hashes | json_values},
                optional={"cache_level": st.sampled_from([0, 1, None]) | json_values,
                          "priority": st.integers(-5, 110) | json_values}), max_size=4) | json_values,
            "parent_hash": hashes | st.none() | json_values,
            "block_hashes": st.lists(hashes | json_values, max_size=4) | json_values,
            "block_hash": hashes | json_values,
            "cache_level": st.fixed_dictionaries({"new_value": st.sampled_from([0, 1]) | json_values},
                                                 optional={"old_value": st.sampled_from([0, 1]) | json_values})
                           | st.none() | json_values,
            "priority": st.fixed_dictionaries({"new_value": st.integers(-5, 110) | json_values}) | st.none(),
            "num_blocks_per_cache_level": st.lists(st.integers(-3, 10**6) | json_values, max_size=3) | json_values,
        })
    return st.one_of(
        st.fixed_dictionaries({"event_id": st.integers(0, 50) | json_values, "data": data},
                              optional={"window_size": st.sampled_from([None, 256, 4096]) | json_values,
                                        "attention_dp_rank": st.sampled_from([None, 0, 1]) | json_values}),
        json_values, st.text(max_size=40))


@pytest.mark.slow
@STREAM_SETTINGS
@given(st.lists(random_event(), max_size=30))
def test_random_events_never_raise(events: list[Any]) -> None:
    m = TierModel()
    for i, e in enumerate(events):
        m.apply_kv_event(e, t=float(i))
    check_invariants(m)


stats_fields = st.dictionaries(
    st.sampled_from(["maxNumBlocks", "freeNumBlocks", "usedNumBlocks", "tokensPerBlock", "allocTotalBlocks",
                     "allocNewBlocks", "reusedBlocks", "missedBlocks", "cacheHitRate"]),
    st.integers(-5, 10**7) | st.floats(allow_nan=True) | json_values, max_size=9)
random_stats = st.one_of(
    st.fixed_dictionaries({}, optional={
        "iter": st.integers(-1, 10**6) | json_values, "numCompletedRequests": st.integers(0, 5) | json_values,
        "numActiveRequests": st.integers(0, 5) | json_values, "kvCacheStats": stats_fields | json_values,
        "kvCacheIterationStats": st.dictionaries(st.text(max_size=4), stats_fields | json_values, max_size=2)
                                 | json_values,
        "inflightBatchingStats": st.dictionaries(st.sampled_from(["numCtxTokens", "numGenRequests"]),
                                                 st.integers(-2, 100) | json_values) | json_values}),
    json_values, st.text(max_size=30), st.binary(max_size=20))


@pytest.mark.slow
@STREAM_SETTINGS
@given(st.lists(random_stats, max_size=20))
def test_random_stats_never_raise(stats: list[Any]) -> None:
    m = TierModel(warmup_requests=2)
    for i, s in enumerate(stats):
        m.apply_stats(s, t=float(i))
        m.apply_stats(json.dumps(s, default=str) if not isinstance(s, bytes) else s)
    check_invariants(m)


@pytest.mark.slow
@STREAM_SETTINGS
@given(st.lists(st.tuples(st.sampled_from([*KINDS, "junk"]), json_values, json_values), max_size=20))
def test_random_records_never_raise(records: list[tuple[str, Any, Any]]) -> None:
    m = TierModel()
    for kind, data, t in records:
        m.apply(Record(kind, data, time=t))  # type: ignore[arg-type]
    m.apply("not a record")  # type: ignore[arg-type]
    check_invariants(m)


# ------------------------------------------------------------------------------------------------ mutated input

def _paths(obj: Any, prefix: str = "") -> list[str]:
    out = []
    if isinstance(obj, dict):
        for k, v in obj.items():
            p = f"{prefix}.{k}" if prefix else k
            out.append(p)
            out += _paths(v, p)
    elif isinstance(obj, list):
        for i, v in enumerate(obj[:3]):
            p = f"{prefix}[{i}]"
            out.append(p)
            out += _paths(v, p)
    return out


def _set(obj: Any, path: str, value: Any, delete: bool = False) -> None:
    parts = path.replace("[", ".[").split(".")
    for part in parts[:-1]:
        obj = obj[int(part[1:-1])] if part.startswith("[") else obj[part]
    last = parts[-1]
    key: Any = int(last[1:-1]) if last.startswith("[") else last
    if delete:
        del obj[key]
    else:
        obj[key] = value


@pytest.mark.slow
@STREAM_SETTINGS
@given(st.sampled_from(range(len(EVENTS))), st.data())
def test_mutated_events_never_raise(start: int, data: st.DataObject) -> None:
    m = TierModel()
    stream = copy.deepcopy(EVENTS[: start + 1])
    target = stream[-1]
    paths = _paths(target)
    for _ in range(data.draw(st.integers(1, 3))):
        path = data.draw(st.sampled_from(paths))
        try:
            _set(target, path, data.draw(json_values), delete=data.draw(st.booleans()))
        except (KeyError, IndexError, TypeError):
            pass  # a path under a part already replaced
    for i, e in enumerate(stream):
        m.apply_kv_event(e, t=float(i))
    check_invariants(m)
    m.apply_kv_events(copy.deepcopy(EVENTS))  # and the fold goes on
    check_invariants(m)


# Each mutation: an event type, the field, a value no reading of TensorRT-LLM's dicts accepts (None = delete the
# key), and the path the reason must start with.
NOT_INT = [-1, 1.5, "7", [1], {"a": 1}, True, float("nan")]
NOT_HASH = [-(2**63) - 1, U64, 1.5, "123", [1], None, True]
NOT_LEVEL = [2, -1, 0.5, "1", [0], {}]
NOT_PRIORITY = [101, -1, 3.5, "35", [35], {}, float("inf")]
NOT_LIST = [5, "abc", {"x": 1}, None, 1.5]
MUTATIONS: list[tuple[str, str, list[Any]]] = [
    ("stored", "event_id", [*NOT_INT, None]),
    ("stored", "data", [5, "x", [1], None]),
    ("stored", "data.type", ["teleported", 3, None, ["stored"]]),
    ("stored", "data.blocks", NOT_LIST),
    ("stored", "data.blocks[0]", [5, "x", [1], None]),
    ("stored", "data.blocks[0].block_hash", NOT_HASH),
    ("stored", "data.blocks[0].cache_level", NOT_LEVEL),
    ("stored", "data.blocks[0].priority", NOT_PRIORITY),
    ("stored", "data.parent_hash", [h for h in NOT_HASH if h is not None]),
    ("stored", "window_size", [-1, 1.5, "256", [256]]),
    ("removed", "data.block_hashes", NOT_LIST),
    ("removed", "data.block_hashes[0]", NOT_HASH),
    ("updated", "data.block_hash", NOT_HASH),
    ("updated", "data.cache_level", [5, "x", [1]]),
    ("updated", "data.cache_level.new_value", [*NOT_LEVEL, None]),
    ("updated", "data.cache_level.old_value", NOT_LEVEL),
    ("created", "data.num_blocks_per_cache_level", [*NOT_LIST, [], [1, 2, 3]]),
    ("created", "data.num_blocks_per_cache_level[0]", [v for v in NOT_INT if v is not True] + [True, None]),
]


@SETTINGS
@given(st.sampled_from(MUTATIONS), st.data())
def test_a_malformed_field_is_a_bad_record_named_by_its_path(mutation: tuple[str, str, list[Any]],
                                                             data: st.DataObject) -> None:
    etype, path, junk = mutation
    ev = copy.deepcopy(data.draw(st.sampled_from(TYPES[etype])))
    if etype == "updated" and "cache_level" in path and ev["data"]["cache_level"] is None:
        ev["data"]["cache_level"] = {"type": "event_diff", "new_value": 1, "old_value": 0}
    if etype == "updated" and "cache_level" in path:
        ev["data"]["priority"] = None
    value = data.draw(st.sampled_from(junk))
    # None deletes a key (a missing field); in a list it stays a null element.
    _set(ev, path, value, delete=value is None and not path.endswith(("parent_hash", "]")))
    m = TierModel()
    m.apply_kv_event(ev)
    assert m.bad_records == 1, (path, value, m.summary()["quality"])
    reason = m.last_bad_reason or ""
    # The reason names the field, or (for a value of the wrong container type) the field that holds it.
    parent = path.rsplit(".", 1)[0] if "." in path else path
    assert reason.startswith(path + ":") or reason.startswith(path.split("[")[0] + ":") \
        or reason.startswith(parent + ":"), (path, value, reason)
    check_invariants(m)


STATS_FIELDS = ["kvCacheStats.maxNumBlocks", "kvCacheStats.freeNumBlocks", "kvCacheStats.reusedBlocks",
                "kvCacheStats.missedBlocks", "kvCacheStats.tokensPerBlock", "iter", "numCompletedRequests",
                "numActiveRequests", "gpuMemUsage", "inflightBatchingStats.numCtxTokens"]


@SETTINGS
@given(st.sampled_from(STATS), st.sampled_from(STATS_FIELDS), st.sampled_from([-1, 1.5, "9", [1], {}, True]))
def test_a_malformed_stats_field_is_a_bad_record_named_by_its_path(stats: dict[str, Any], path: str,
                                                                   value: Any) -> None:
    s = copy.deepcopy(stats)
    _set(s, path, value)
    m = TierModel()
    m.apply_stats(s)
    assert m.bad_records == 1 and (m.last_bad_reason or "").startswith(f"stats.{path}:"), m.last_bad_reason
    assert m.gpu.free_blocks is None and m.hit_rate.lookups == 0  # nothing of a bad record is applied
