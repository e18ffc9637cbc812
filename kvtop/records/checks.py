"""The one spec of a record: what a valid envelope and a valid ``data`` of each kind are, every error named.

Each check raises :class:`RecordError` naming the field (a dotted path, ``"data.kvCacheStats.freeNumBlocks"``) and
the problem; nothing else escapes (no KeyError, TypeError, OverflowError, RecursionError). ``checked_record`` is
the whole of it, step by step, the first failure named; it is the reference that every faster path of
kvtop/records/fast.py is held to (tests/records/test_records.py), and what judges and names every record those paths
leave.

Bounds (the record boundary is where one absurd value is stopped, so nothing behind it has to cope):
- every number anywhere in ``data`` is finite and of magnitude at most 2^64 (block hashes are 64-bit; 10**400
  would break a Prometheus scrape, 1e308 a screen's arithmetic);
- block counts (``*Block*`` keys of ``kvCacheStats`` / ``kvCacheIterationStats``, ``num_blocks_per_cache_level``,
  meta ``primary_blocks`` / ``secondary_blocks``) are at most 2^40 (``MAX_BLOCKS``: 2^40 blocks of the smallest
  KV block, ~100 KiB, is ~100 EiB, far past any machine);
- ``time`` is seconds since the epoch between 1970 and 2100 (``TIME_MAX``): a clock in milliseconds (1.7e12) is
  rejected, not taken as a date 50,000 years ahead that would stall a replay and a report;
- the strings of the envelope (``source.host``, ``source.run``) and of kvtop's own kinds (``meta``, ``gpu``,
  ``host``, ``request``) are cleaned of control characters (:func:`kvtop.textsafe.clean_any`); an engine's
  ``stats`` and ``kv_event`` dicts stay verbatim (nothing in them is drawn).

A kv_event here is the record's shape (``event_id``, ``data.type`` and the one list or hash each type needs):
what every reader may rely on. The event fold's own value rules (a hash as 64 bits, a cache level 0 or 1, a
priority in 0..100) are the fold's (kvtop/tiers/events.py ``_diagnose_event``).
"""

from __future__ import annotations

import json
import math
from typing import Any

from kvtop.compact import read_event
from kvtop.records.record import SCHEMA_VERSION, Record, SourceId
from kvtop.textsafe import clean, clean_any

# kv_batch: one message of the engines' common KV event stream (vLLM, SGLang, Dynamo; kvtop/sources/kv_wire.py);
# metrics: an engine's Prometheus samples, verbatim; summary: another kvtop's fold of a source (kvtop agent).
KINDS = ("meta", "stats", "kv_event", "gpu", "host", "request", "kv_batch", "metrics", "summary")

# Required keys of each kind's data, with the type each must have. Only what the fold depends on is
# required; everything else is carried verbatim.
_NUMBER = (int, float)
_REQUIRED: dict[str, dict[str, tuple[type, ...]]] = {
    "meta": {"engine": (str,)},
    "stats": {},  # an iteration-stats dict; checked leniently below (kvCacheStats must be a dict if present)
    "kv_event": {"event_id": (int,), "data": (dict,)},
    "gpu": {"index": (int,)},
    "host": {},
    "request": {"request_id": (int, str), "ok": (bool,)},
    "kv_batch": {"seq": (int,), "events": (list,)},
    "metrics": {"engine": (str,), "samples": (list,)},
    "summary": {"tiers": (dict,)},
}
EVENT_TYPES = ("created", "stored", "removed", "updated")

MAX_BLOCKS = 1 << 40       # no pool holds more blocks (see the docstring above)
MAX_MAGNITUDE = 1 << 64    # no number anywhere in a record is larger (64-bit hashes are just below)
TIME_MAX = 4102444800.0    # 2100-01-01 UTC: a later "time" is a clock in ms or us, not seconds
STRING_LEN = 1000          # strings of kvtop's own kinds are cut here (a model name is < 100 characters)
_OWN_KINDS = frozenset({"meta", "gpu", "host", "request"})
_META_BLOCKS = ("primary_blocks", "secondary_blocks", "disk_blocks")


class RecordError(ValueError):
    """A record (or a line or payload meant to be one) is malformed.

    ``field`` is a dotted path to what was wrong (``"data.kvCacheStats.freeNumBlocks"``), ``problem`` says
    what was wrong with it, ``line`` is the 1-based line number when read from a file.
    """

    def __init__(self, field: str, problem: str, line: int | None = None):
        self.field = field
        self.problem = problem
        self.line = line
        where = f"line {line}: " if line is not None else ""
        super().__init__(f"{where}{field}: {problem}")

    def at_line(self, line: int) -> RecordError:
        return RecordError(self.field, self.problem, line)


def _type_name(t: tuple[type, ...]) -> str:
    names = {int: "an integer", float: "a number", str: "a string", dict: "an object", bool: "true/false",
             list: "a list"}
    return " or ".join(names.get(x, x.__name__) for x in t)


def describe(value: Any) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def check_type(path: str, value: Any, types: tuple[type, ...]) -> None:
    # bool is an int in Python; a JSON true where a count belongs is still wrong.
    if isinstance(value, bool) and bool not in types:
        raise RecordError(path, f"must be {_type_name(types)}, got {describe(value)}")
    if not isinstance(value, types):
        raise RecordError(path, f"must be {_type_name(types)}, got {describe(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise RecordError(path, f"must be a finite number, got {value}")


def within_bounds(value: Any, limit: int = MAX_MAGNITUDE) -> bool:
    """True if every number in ``value`` is finite with magnitude below ``limit`` (fast: no paths built).

    A stored block's ``tokens`` (and ``token_ids``, the same ids as ``read_event`` gives them) are skipped:
    nothing computes with token ids (they are compared, as keys), and walking 32 tokens per block would cost
    ~20x the rest of the check.
    """
    cls = value.__class__
    if cls is int or cls is float:
        return -limit <= value <= limit  # NaN fails both comparisons
    if cls is dict:
        for k, v in value.items():
            c = v.__class__
            if c is int or c is float:
                if not -limit <= v <= limit:
                    return False
            elif (c is dict or c is list) and k != "tokens" and k != "token_ids" and not within_bounds(v, limit):
                return False
        return True
    if cls is list:
        for v in value:
            c = v.__class__
            if c is int or c is float:
                if not -limit <= v <= limit:
                    return False
            elif (c is dict or c is list) and not within_bounds(v, limit):
                return False
    return True



def _find_unbounded(path: str, value: Any, limit: int, what: str) -> None:
    """Raise RecordError naming the first number out of bounds (slow; only after within_bounds said there is one)."""
    cls = value.__class__
    if cls is int or cls is float:
        if not -limit <= value <= limit:
            shown = describe(value) if cls is float or abs(value) < 10 ** 30 else "a larger integer"
            raise RecordError(path, f"{what}, got {shown}")
    elif cls is dict:
        for k, v in value.items():
            if k != "tokens" and k != "token_ids":
                _find_unbounded(f"{path}.{k}", v, limit, what)
    elif cls is list:
        for i, v in enumerate(value):
            _find_unbounded(f"{path}[{i}]", v, limit, what)


def check_bounds(path: str, value: Any, limit: int = MAX_MAGNITUDE,
                  what: str = "must be a finite number of magnitude at most 2^64") -> None:
    try:
        if within_bounds(value, limit):
            return
        _find_unbounded(path, value, limit, what)
    except RecursionError:
        raise RecordError(path, "nested too deeply to be a record") from None
    raise RecordError(path, what)  # not reached: _find_unbounded raises for what within_bounds refused


_BLOCKS_WHAT = f"a block count must be at most 2^40 ({MAX_BLOCKS:,})"


def blocks_ok(part: Any) -> bool:
    """Numbers under keys naming blocks (``freeNumBlocks``, ``primaryMaxNumBlocks``, ...) are at most 2^40."""
    if part.__class__ is dict:
        for k, v in part.items():
            c = v.__class__
            if c is dict or c is list:
                if not blocks_ok(v):
                    return False
            elif (c is int or c is float) and v > MAX_BLOCKS and "Block" in k:
                return False
    elif part.__class__ is list:
        return all(blocks_ok(v) for v in part)
    return True


def _check_block_counts(path: str, part: Any) -> None:
    if blocks_ok(part):
        return
    if part.__class__ is dict:
        for k, v in part.items():
            if v.__class__ is dict or v.__class__ is list:
                _check_block_counts(f"{path}.{k}", v)
            elif "Block" in str(k):
                check_bounds(f"{path}.{k}", v, MAX_BLOCKS, _BLOCKS_WHAT)
    elif part.__class__ is list:
        for i, v in enumerate(part):
            _check_block_counts(f"{path}[{i}]", v)


def check_event(path: str, ev: dict[str, Any]) -> None:
    data = ev["data"]
    etype = data.get("type")
    if etype not in EVENT_TYPES:
        raise RecordError(f"{path}.data.type", f"must be one of {', '.join(EVENT_TYPES)}, got {describe(etype)}")
    if etype == "stored":
        blocks = data.get("blocks")
        if not isinstance(blocks, list):
            raise RecordError(f"{path}.data.blocks", f"must be a list, got {describe(blocks)}")
        for i, b in enumerate(blocks):
            if not isinstance(b, dict):
                raise RecordError(f"{path}.data.blocks[{i}]", "must be an object")
            check_type(f"{path}.data.blocks[{i}].block_hash", b.get("block_hash"), (int,))
    elif etype == "removed":
        hashes = data.get("block_hashes")
        if not isinstance(hashes, list):
            raise RecordError(f"{path}.data.block_hashes", f"must be a list, got {describe(hashes)}")
        for i, h in enumerate(hashes):
            check_type(f"{path}.data.block_hashes[{i}]", h, (int,))
    elif etype == "updated":
        check_type(f"{path}.data.block_hash", data.get("block_hash"), (int,))
    elif etype == "created":
        levels = data.get("num_blocks_per_cache_level")
        if not isinstance(levels, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in levels):
            raise RecordError(f"{path}.data.num_blocks_per_cache_level",
                              f"must be a list of integers, got {describe(levels)}")
        check_bounds(f"{path}.data.num_blocks_per_cache_level", levels, MAX_BLOCKS, _BLOCKS_WHAT)


def check_kind_data(kind: str, data: Any, bounded: bool = False) -> None:
    """``bounded``: the caller has checked every number of ``data`` (fast.py ``bounded_exact``, which implies the
    bounds below)."""
    if kind not in KINDS:
        raise RecordError("kind", f"must be one of {', '.join(KINDS)}, got {describe(kind)}")
    if not isinstance(data, dict):
        raise RecordError("data", f"must be an object, got {describe(data)}")
    for key, types in _REQUIRED[kind].items():
        if key not in data:
            raise RecordError(f"data.{key}", "is missing")
        check_type(f"data.{key}", data[key], types)
    if not bounded:
        check_bounds("data", data)
    if kind == "kv_event":
        check_event("data", data)
    elif kind == "stats":
        kv = data.get("kvCacheStats")
        if kv is not None and not isinstance(kv, dict):
            raise RecordError("data.kvCacheStats", f"must be an object, got {describe(kv)}")
        for key in ("kvCacheStats", "kvCacheIterationStats"):
            part = data.get(key)
            if part is not None:
                try:
                    _check_block_counts(f"data.{key}", part)
                except RecursionError:   # blocks_ok takes two frames a level: ~500 levels, which json reads
                    raise RecordError(f"data.{key}", "nested too deeply to be a record") from None
    elif kind == "meta":
        for key in _META_BLOCKS:
            if data.get(key) is not None:
                check_bounds(f"data.{key}", data[key], MAX_BLOCKS, _BLOCKS_WHAT)


def check_time(t: Any) -> float:
    check_type("time", t, _NUMBER)
    if not 0 <= t <= TIME_MAX:
        hint = " (milliseconds? kvtop records seconds since the epoch)" if TIME_MAX < t < TIME_MAX * 1e7 else ""
        shown = describe(t) if abs(t) < 10 ** 30 else "an integer too large for a time"
        raise RecordError("time", f"must be seconds since the epoch between 1970 and 2100, got {shown}{hint}")
    return float(t)


def own_data(kind: str, data: dict[str, Any]) -> dict[str, Any]:
    """kvtop's own kinds with their strings cleaned (they are drawn); an engine's dicts as they are."""
    if kind in _OWN_KINDS:
        return clean_any(data, STRING_LEN)  # type: ignore[no-any-return]
    return data



def checked_record(obj: Any) -> Record:
    """``from_obj`` step by step: every check in order, the first failure named."""
    if not isinstance(obj, dict):
        raise RecordError("record", f"must be a JSON object, got {describe(obj)}")
    v = obj.get("v")
    if v is None:
        raise RecordError("v", "is missing (not a kvtop record?)")
    check_type("v", v, (int,))
    if v > SCHEMA_VERSION or v < 1:
        raise RecordError("v", f"schema version {v} is not supported (this kvtop reads 1..{SCHEMA_VERSION})")
    kind = obj.get("kind")
    if kind is None:
        raise RecordError("kind", "is missing")
    t = obj.get("time")
    if t is None:
        raise RecordError("time", "is missing")
    seconds = check_time(t)
    src = obj.get("source", {})
    if not isinstance(src, dict):
        raise RecordError("source", f"must be an object, got {describe(src)}")
    host, rank, run = src.get("host", ""), src.get("rank", 0), src.get("run", "")
    check_type("source.host", host, (str,))
    check_type("source.rank", rank, (int,))
    check_type("source.run", run, (str,))
    data = obj.get("data")
    if data is None:
        raise RecordError("data", "is missing")
    if kind == "kv_event":
        read_event(data)  # plain token dicts as ids, a recording's diff pairs as dicts (kvtop/compact.py)
    check_kind_data(kind, data)
    if not -MAX_MAGNITUDE <= rank <= MAX_MAGNITUDE:
        raise RecordError("source.rank", "must be an integer of magnitude at most 2^64")
    source = SourceId(clean(host, STRING_LEN), rank, clean(run, STRING_LEN))
    return Record(kind=kind, data=own_data(kind, data), source=source, time=seconds, v=v)


def loads(text: str | bytes, what: str = "json") -> Any:
    """json.loads that only ever raises RecordError (bad JSON, bad UTF-8, or nesting deep enough to recurse
    out: 100,000 nested brackets in one MQTT payload must not end a replay)."""
    try:
        return json.loads(text)
    except ValueError as exc:  # bad JSON, bad UTF-8, or an integer past Python's 4,300-digit limit
        raise RecordError(what, f"not valid JSON ({str(exc)[:200]})") from None
    except RecursionError:
        raise RecordError(what, "nested too deeply to be a record") from None
