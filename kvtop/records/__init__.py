"""Records: the one thing that crosses a process or machine boundary.

A record is a small envelope around a payload:

    {"v": 1, "kind": "stats", "source": {"host": "gpu-07", "rank": 0, "run": "ab-host10g"},
     "time": 1764430000.125, "data": {...}}

- ``kind`` is one of ``KINDS``. For ``stats`` and ``kv_event`` the ``data`` is the engine's own dict, verbatim
  (TensorRT-LLM's iteration-stats dict, or one serialized KV cache event), so extra fields of any engine
  version survive and a recording is a complete bug report; but for one thing: a stored block's plain tokens
  (``{"type": "unique_token", "token_id": n, "token_extra_id": 0}`` each) are held as their ids,
  ``"token_ids": [n, ...]`` (kvtop/compact.py ``read_event``: the same information, without ~1,000 dicts a
  busy stored event that nothing reads one by one).
- ``source`` names who produced it (host, rank, run); ``time`` is seconds since the epoch (float).
- ``v`` is the schema version; a reader rejects versions newer than it understands.

Decoding validates the envelope and the parts of ``data`` that the fold relies on, and raises
:class:`RecordError` naming the field and the problem. Callers (replay, MQTT, the HTTP attach) catch it, count
the bad input and go on: one bad line never ends a run.

Bounds (the record boundary is where one absurd value is stopped, so nothing behind it has to cope):
- every number anywhere in ``data`` is finite and of magnitude at most 2^64 (block hashes are 64-bit; 10**400
  would break a Prometheus scrape, 1e308 a screen's arithmetic);
- block counts (``*Block*`` keys of ``kvCacheStats`` / ``kvCacheIterationStats``, ``num_blocks_per_cache_level``,
  meta ``primary_blocks`` / ``secondary_blocks``) are at most 2^40 (``MAX_BLOCKS``: 2^40 blocks of the smallest
  KV block, ~100 KiB, is ~100 EiB, far past any machine);
- ``time`` is seconds since the epoch between 1970 and 2100 (``TIME_MAX``): a clock in milliseconds (1.7e12) is
  rejected, not taken as a date 50,000 years ahead that would stall a replay and a report;
- a line or payload is at most ``MAX_LINE_BYTES`` (8 MiB; ``read_jsonl(max_line_bytes=...)``): the largest real
  message, 2,000 events of a busy engine with token ids, is ~4 MB.
- the strings of the envelope (``source.host``, ``source.run``) and of kvtop's own kinds (``meta``, ``gpu``,
  ``host``, ``request``) are cleaned of control characters (:func:`kvtop.textsafe.clean_any`); an engine's
  ``stats`` and ``kv_event`` dicts stay verbatim (nothing in them is drawn).
"""

from __future__ import annotations

import json
import math
import os
import socket
import time as _time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvtop.compact import BATCH_KIND, read_event, read_form, unpack_event
from kvtop.lines import iter_lines as iter_lines  # re-exported: it lived here
from kvtop.textsafe import clean, clean_any

try:  # a JSON parser ~3x faster than the standard one on records; used only where it gives the same objects
    import orjson as _orjson
except ImportError:  # pragma: no cover - orjson is a dependency; a kvtop without it parses everything with json
    _orjson = None  # type: ignore[assignment]
try:  # typed JSON decoding (a stored event's token dicts straight to ids); used only where it gives json's objects
    import msgspec as _msgspec
except ImportError:  # pragma: no cover - msgspec is a dependency; without it those lines go through orjson
    _msgspec = None  # type: ignore[assignment]

SCHEMA_VERSION = 1
# kv_batch: one message of the engines' common KV event stream (vLLM, SGLang, Dynamo; kvtop/kv_stream.py);
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
_EVENT_TYPES = ("created", "stored", "removed", "updated")

MAX_BLOCKS = 1 << 40       # no pool holds more blocks (see the module docstring)
MAX_MAGNITUDE = 1 << 64    # no number anywhere in a record is larger (64-bit hashes are just below)
TIME_MAX = 4102444800.0    # 2100-01-01 UTC: a later "time" is a clock in ms or us, not seconds
MAX_LINE_BYTES = 8 << 20   # 8 MiB per line or payload (see the module docstring)
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


@dataclass(frozen=True)
class SourceId:
    """Who produced a record: a host, a rank on it, and a run name."""

    host: str = ""
    rank: int = 0
    run: str = ""

    def key(self) -> str:
        """A short stable name, used in MQTT topics and dashboard rows (``host/rank/run``)."""
        # Kept on the instance (not a field: equality, hashing and repr stay the three fields'): the session asks
        # for it once a record, and decode hands out one SourceId per source (_SOURCE_CACHE).
        key = self.__dict__.get("_key")
        if key is None:
            key = f"{self.host or '-'}/{self.rank}/{self.run or '-'}"
            object.__setattr__(self, "_key", key)
        return key

    def to_json(self) -> dict[str, Any]:
        return {"host": self.host, "rank": self.rank, "run": self.run}

    @classmethod
    def local(cls, run: str = "", rank: int = 0) -> SourceId:
        return cls(host=socket.gethostname(), rank=rank, run=run or f"run-{os.getpid()}")


@dataclass(frozen=True)
class Record:
    kind: str
    data: dict[str, Any]
    source: SourceId = field(default_factory=SourceId)
    time: float = 0.0
    v: int = SCHEMA_VERSION

    def to_json(self) -> dict[str, Any]:
        return {"v": self.v, "kind": self.kind, "source": self.source.to_json(), "time": self.time,
                "data": self.data}


_object_new = object.__new__


def _new_record(kind: str, data: dict[str, Any], source: SourceId, time: float, v: int) -> Record:
    """``Record(kind, data, source, time, v)`` without the frozen dataclass's ``__init__`` (its five
    ``object.__setattr__`` calls: 0.69 -> 0.28 us a record, ~10% of decoding a removed event); the same instance,
    field for field (tests/test_records.py checks it against ``Record`` and its fields)."""
    rec = _object_new(Record)
    fields_ = rec.__dict__
    fields_["kind"] = kind
    fields_["data"] = data
    fields_["source"] = source
    fields_["time"] = time
    fields_["v"] = v
    return rec


def make(kind: str, data: dict[str, Any], source: SourceId | None = None, time: float | None = None) -> Record:
    """Build a record now (or at ``time``), validating it as a reader would, and as a reader gives it (a KV
    event in ``read_event``'s form: ``data`` is not changed, a new dict is made where that differs)."""
    if kind == "kv_event":
        data = read_form(data)
    _check_kind_data(kind, data)
    return Record(kind=kind, data=_own_data(kind, data), source=source or SourceId(),
                  time=_time.time() if time is None else _check_time(time))


# ---------------------------------------------------------------------------------------------- encoding

def json_default(obj: Any) -> Any:
    # Sets (rare in engine dicts) and other iterables become lists; anything else is named in the error.
    if isinstance(obj, (set, frozenset, tuple)):
        return list(obj)
    raise TypeError(f"not JSON-serializable: {type(obj).__name__}")


def encode(record: Record) -> str:
    """One record as one JSON line (no trailing newline). Hashes >= 2^63 stay exact: JSON ints are unbounded."""
    return json.dumps(record.to_json(), separators=(",", ":"), default=json_default, allow_nan=False)


def encode_batch(records: Iterable[Record]) -> str:
    """Several records as one JSON array (an MQTT payload may carry a batch)."""
    return "[" + ",".join(encode(r) for r in records) + "]"


# ---------------------------------------------------------------------------------------------- decoding

def _type_name(t: tuple[type, ...]) -> str:
    names = {int: "an integer", float: "a number", str: "a string", dict: "an object", bool: "true/false",
             list: "a list"}
    return " or ".join(names.get(x, x.__name__) for x in t)


def _describe(value: Any) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _check_type(path: str, value: Any, types: tuple[type, ...]) -> None:
    # bool is an int in Python; a JSON true where a count belongs is still wrong.
    if isinstance(value, bool) and bool not in types:
        raise RecordError(path, f"must be {_type_name(types)}, got {_describe(value)}")
    if not isinstance(value, types):
        raise RecordError(path, f"must be {_type_name(types)}, got {_describe(value)}")
    if isinstance(value, float) and not math.isfinite(value):
        raise RecordError(path, f"must be a finite number, got {value}")


def _bounded(value: Any, limit: int = MAX_MAGNITUDE) -> bool:
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
            elif (c is dict or c is list) and k != "tokens" and k != "token_ids" and not _bounded(v, limit):
                return False
        return True
    if cls is list:
        for v in value:
            c = v.__class__
            if c is int or c is float:
                if not -limit <= v <= limit:
                    return False
            elif (c is dict or c is list) and not _bounded(v, limit):
                return False
    return True


_EXACT_FLOAT = float(1 << 63)
# orjson nests up to 1,024 deep, json as deep as the recursion limit lets it (~995 at the top of a process, less
# deeper in the stack): a value nested past this is left to json to judge. A record nests ~6 deep.
_EXACT_DEPTH = 400


def _bounded_exact(value: Any, depth: int = 0) -> bool:
    """``_bounded(value)`` for a value orjson parsed, and no float in it of magnitude 2^63 or more: orjson reads
    an integer past 64 bits (which the standard parser keeps whole, and the bounds then refuse) as a float, so a
    float that large sends the line to the standard parser, whose objects then decide. Unlike ``_bounded`` it
    walks ``tokens`` too (a token id past 64 bits stays an integer, as the standard parser keeps it), and it is
    ``False`` past ``_EXACT_DEPTH`` levels. Its integers are not compared: orjson's are all within -2^63 ..
    2^64-1 (tests/test_records.py holds orjson to that), inside the bounds."""
    if depth > _EXACT_DEPTH:
        return False
    cls = value.__class__
    if cls is float:
        return -_EXACT_FLOAT < value < _EXACT_FLOAT
    if cls is dict:
        items: Any = value.values()
    elif cls is list:
        items = value
    else:
        return True   # an integer of orjson's is within -2^63 .. 2^64-1: inside the bounds
    for v in items:
        c = v.__class__
        if c is float:
            if not -_EXACT_FLOAT < v < _EXACT_FLOAT:
                return False
        elif (c is dict or c is list) and not _bounded_exact(v, depth + 1):
            return False
    return True


def _find_unbounded(path: str, value: Any, limit: int, what: str) -> None:
    """Raise RecordError naming the first number out of bounds (slow; only after _bounded said there is one)."""
    cls = value.__class__
    if cls is int or cls is float:
        if not -limit <= value <= limit:
            shown = _describe(value) if cls is float or abs(value) < 10 ** 30 else "a larger integer"
            raise RecordError(path, f"{what}, got {shown}")
    elif cls is dict:
        for k, v in value.items():
            if k != "tokens" and k != "token_ids":
                _find_unbounded(f"{path}.{k}", v, limit, what)
    elif cls is list:
        for i, v in enumerate(value):
            _find_unbounded(f"{path}[{i}]", v, limit, what)


def _check_bounds(path: str, value: Any, limit: int = MAX_MAGNITUDE,
                  what: str = "must be a finite number of magnitude at most 2^64") -> None:
    try:
        if _bounded(value, limit):
            return
        _find_unbounded(path, value, limit, what)
    except RecursionError:
        raise RecordError(path, "nested too deeply to be a record") from None
    raise RecordError(path, what)  # not reached: _find_unbounded raises for what _bounded refused


_BLOCKS_WHAT = f"a block count must be at most 2^40 ({MAX_BLOCKS:,})"
_BLOCK_LIMIT = MAX_BLOCKS


def _blocks_ok(part: Any) -> bool:
    """Numbers under keys naming blocks (``freeNumBlocks``, ``primaryMaxNumBlocks``, ...) are at most 2^40."""
    if part.__class__ is dict:
        for k, v in part.items():
            c = v.__class__
            if c is dict or c is list:
                if not _blocks_ok(v):
                    return False
            elif (c is int or c is float) and v > MAX_BLOCKS and "Block" in k:
                return False
    elif part.__class__ is list:
        return all(_blocks_ok(v) for v in part)
    return True


def _check_block_counts(path: str, part: Any) -> None:
    if _blocks_ok(part):
        return
    if part.__class__ is dict:
        for k, v in part.items():
            if v.__class__ is dict or v.__class__ is list:
                _check_block_counts(f"{path}.{k}", v)
            elif "Block" in str(k):
                _check_bounds(f"{path}.{k}", v, _BLOCK_LIMIT, _BLOCKS_WHAT)
    elif part.__class__ is list:
        for i, v in enumerate(part):
            _check_block_counts(f"{path}[{i}]", v)


def _check_event(path: str, ev: dict[str, Any]) -> None:
    data = ev["data"]
    etype = data.get("type")
    if etype not in _EVENT_TYPES:
        raise RecordError(f"{path}.data.type", f"must be one of {', '.join(_EVENT_TYPES)}, got {_describe(etype)}")
    if etype == "stored":
        blocks = data.get("blocks")
        if not isinstance(blocks, list):
            raise RecordError(f"{path}.data.blocks", f"must be a list, got {_describe(blocks)}")
        for i, b in enumerate(blocks):
            if not isinstance(b, dict):
                raise RecordError(f"{path}.data.blocks[{i}]", "must be an object")
            _check_type(f"{path}.data.blocks[{i}].block_hash", b.get("block_hash"), (int,))
    elif etype == "removed":
        hashes = data.get("block_hashes")
        if not isinstance(hashes, list):
            raise RecordError(f"{path}.data.block_hashes", f"must be a list, got {_describe(hashes)}")
        for i, h in enumerate(hashes):
            _check_type(f"{path}.data.block_hashes[{i}]", h, (int,))
    elif etype == "updated":
        _check_type(f"{path}.data.block_hash", data.get("block_hash"), (int,))
    elif etype == "created":
        levels = data.get("num_blocks_per_cache_level")
        if not isinstance(levels, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in levels):
            raise RecordError(f"{path}.data.num_blocks_per_cache_level",
                              f"must be a list of integers, got {_describe(levels)}")
        _check_bounds(f"{path}.data.num_blocks_per_cache_level", levels, _BLOCK_LIMIT, _BLOCKS_WHAT)


def _check_kind_data(kind: str, data: Any, bounded: bool = False) -> None:
    """``bounded``: the caller has checked every number of ``data`` (``_bounded_exact``, which implies the
    bounds below)."""
    if kind not in KINDS:
        raise RecordError("kind", f"must be one of {', '.join(KINDS)}, got {_describe(kind)}")
    if not isinstance(data, dict):
        raise RecordError("data", f"must be an object, got {_describe(data)}")
    for key, types in _REQUIRED[kind].items():
        if key not in data:
            raise RecordError(f"data.{key}", "is missing")
        _check_type(f"data.{key}", data[key], types)
    if not bounded:
        _check_bounds("data", data)
    if kind == "kv_event":
        _check_event("data", data)
    elif kind == "stats":
        kv = data.get("kvCacheStats")
        if kv is not None and not isinstance(kv, dict):
            raise RecordError("data.kvCacheStats", f"must be an object, got {_describe(kv)}")
        for key in ("kvCacheStats", "kvCacheIterationStats"):
            part = data.get(key)
            if part is not None:
                try:
                    _check_block_counts(f"data.{key}", part)
                except RecursionError:   # _blocks_ok takes two frames a level: ~500 levels, which json reads
                    raise RecordError(f"data.{key}", "nested too deeply to be a record") from None
    elif kind == "meta":
        for key in _META_BLOCKS:
            if data.get(key) is not None:
                _check_bounds(f"data.{key}", data[key], _BLOCK_LIMIT, _BLOCKS_WHAT)


def _check_time(t: Any) -> float:
    _check_type("time", t, _NUMBER)
    if not 0 <= t <= TIME_MAX:
        hint = " (milliseconds? kvtop records seconds since the epoch)" if TIME_MAX < t < TIME_MAX * 1e7 else ""
        shown = _describe(t) if abs(t) < 10 ** 30 else "an integer too large for a time"
        raise RecordError("time", f"must be seconds since the epoch between 1970 and 2100, got {shown}{hint}")
    return float(t)


def _own_data(kind: str, data: dict[str, Any]) -> dict[str, Any]:
    """kvtop's own kinds with their strings cleaned (they are drawn); an engine's dicts as they are."""
    if kind in _OWN_KINDS:
        return clean_any(data, STRING_LEN)  # type: ignore[no-any-return]
    return data


def from_obj(obj: Any) -> Record:
    """Validate a decoded JSON object as a record."""
    if obj.__class__ is dict:
        rec = _fast_record(obj)
        if rec is not None:
            return rec
    return _checked_record(obj)


# SourceId by (host, rank, run) as they came: a stream names a handful of sources, and cleaning two strings and
# building a frozen dataclass for every record cost ~1.3 us of ~6.5 (27,000 records of a busy recording).
_SOURCE_CACHE: dict[tuple[str, int, str], SourceId] = {}
_SOURCE_CACHE_MAX = 4096   # a stream of ever-new names cannot grow it without bound: it is emptied when full
_NO_SOURCE: dict[str, Any] = {}
_ENVELOPE_KEYS = frozenset({"v", "kind", "source", "time", "data"})
_SOURCE_KEYS = frozenset({"host", "rank", "run"})


def _fast_record(obj: dict[str, Any], parsed_fast: bool = False, bounded: bool = False) -> Record | None:
    """The record of ``obj`` when it has the common shape, checked as ``_checked_record`` checks it, in fewer
    Python-level steps; ``None`` for anything else (rarer shapes and every bad record), which
    ``_checked_record`` then judges and names. Every check of the full path is made here or by delegating to it:
    a record this accepts is one that path accepts, and the same Record comes out (tests/test_records.py checks
    that over hypothesis-generated records).

    ``parsed_fast``: ``obj`` came from orjson (``decode``): every number of ``data`` must then also pass
    ``_bounded_exact``, else ``None`` (the line is parsed again by the standard parser). The envelope's numbers
    need no more: ``v`` and ``rank`` must be integers (orjson's are exact), ``time`` at most ``TIME_MAX``; but
    the envelope and its source may hold no other key: orjson nests up to 1,024 deep, json ~995 (less deep in
    the stack), and a key the record does not keep could hold what json refuses.
    ``bounded``: the caller has found every number of ``data`` within the bounds (``_bounded``).

    Measured: 5.8 -> 4.1 us a record over 27,000 records of a busy recording (BENCHMARKS.md "An attached kvtop").
    """
    v = obj.get("v")
    if v.__class__ is not int or not 1 <= v <= SCHEMA_VERSION:
        return None
    t = obj.get("time")
    if (t.__class__ is not float and t.__class__ is not int) or not 0 <= t <= TIME_MAX:   # NaN fails the range
        return None
    src = obj.get("source", _NO_SOURCE)
    if src.__class__ is not dict:
        return None
    if parsed_fast and not (obj.keys() <= _ENVELOPE_KEYS and src.keys() <= _SOURCE_KEYS):
        return None
    host, rank, run = src.get("host", ""), src.get("rank", 0), src.get("run", "")
    if host.__class__ is not str or rank.__class__ is not int or run.__class__ is not str:
        return None
    key = (host, rank, run)
    source = _SOURCE_CACHE.get(key)
    if source is None:
        if not -MAX_MAGNITUDE <= rank <= MAX_MAGNITUDE:
            return None
        source = _new_source(key)
    data = obj.get("data")
    if data.__class__ is not dict:
        return None
    if parsed_fast:
        try:
            if not _bounded_exact(data):
                return None
        except RecursionError:
            return None
    kind = obj.get("kind")
    if kind == "kv_event":
        read_event(data)   # as _checked_record does first (in place, and a second call changes nothing)
        if not _fast_event_ok(data, parsed_fast or bounded):
            return None
    elif kind == "stats" or kind == "request" or kind == "gpu" or kind == "host":
        # The full checks of these kinds: their errors are the ones _checked_record would raise from here, as
        # everything before them in that path has passed.
        _check_kind_data(kind, data, parsed_fast)
    else:
        return None
    return _new_record(kind, _own_data(kind, data), source, float(t), v)


def _fast_event_ok(data: dict[str, Any], bounded: bool = False) -> bool:
    """``_check_kind_data("kv_event", data)`` would pass (a ``created`` event, rare, is left to it).
    ``bounded``: ``_bounded_exact(data)`` passed, which implies ``_bounded(data)``."""
    if data.get("event_id").__class__ is not int or "data" not in data:
        return False
    ev = data["data"]
    if ev.__class__ is not dict:
        return False
    if not bounded:
        try:
            if not _bounded(data):
                return False
        except RecursionError:
            return False
    etype = ev.get("type")
    if etype == "removed":
        hashes = ev.get("block_hashes")
        if hashes.__class__ is not list:
            return False
        for h in hashes:
            if h.__class__ is not int:
                return False
        return True
    if etype == "updated":
        return ev.get("block_hash").__class__ is int
    if etype == "stored":
        blocks = ev.get("blocks")
        if blocks.__class__ is not list:
            return False
        for b in blocks:
            if b.__class__ is not dict or b.get("block_hash").__class__ is not int:
                return False
        return True
    return False


def _checked_record(obj: Any) -> Record:
    """``from_obj`` step by step: every check in order, the first failure named."""
    if not isinstance(obj, dict):
        raise RecordError("record", f"must be a JSON object, got {_describe(obj)}")
    v = obj.get("v")
    if v is None:
        raise RecordError("v", "is missing (not a kvtop record?)")
    _check_type("v", v, (int,))
    if v > SCHEMA_VERSION or v < 1:
        raise RecordError("v", f"schema version {v} is not supported (this kvtop reads 1..{SCHEMA_VERSION})")
    kind = obj.get("kind")
    if kind is None:
        raise RecordError("kind", "is missing")
    t = obj.get("time")
    if t is None:
        raise RecordError("time", "is missing")
    seconds = _check_time(t)
    src = obj.get("source", {})
    if not isinstance(src, dict):
        raise RecordError("source", f"must be an object, got {_describe(src)}")
    host, rank, run = src.get("host", ""), src.get("rank", 0), src.get("run", "")
    _check_type("source.host", host, (str,))
    _check_type("source.rank", rank, (int,))
    _check_type("source.run", run, (str,))
    data = obj.get("data")
    if data is None:
        raise RecordError("data", "is missing")
    if kind == "kv_event":
        read_event(data)  # plain token dicts as ids, a recording's diff pairs as dicts (kvtop/compact.py)
    _check_kind_data(kind, data)
    if not -MAX_MAGNITUDE <= rank <= MAX_MAGNITUDE:
        raise RecordError("source.rank", "must be an integer of magnitude at most 2^64")
    source = SourceId(clean(host, STRING_LEN), rank, clean(run, STRING_LEN))
    return Record(kind=kind, data=_own_data(kind, data), source=source, time=seconds, v=v)


def _loads(text: str | bytes, what: str = "json") -> Any:
    """json.loads that only ever raises RecordError (bad JSON, bad UTF-8, or nesting deep enough to recurse
    out: 100,000 nested brackets in one MQTT payload must not end a replay)."""
    try:
        return json.loads(text)
    except ValueError as exc:  # bad JSON, bad UTF-8, or an integer past Python's 4,300-digit limit
        raise RecordError(what, f"not valid JSON ({str(exc)[:200]})") from None
    except RecursionError:
        raise RecordError(what, "nested too deeply to be a record") from None


def _loads_exact(text: str | bytes) -> Any:
    """``_loads(text)``, through orjson when its objects are json's: every number within the bounds and no float
    of 2^63 or more (how orjson reads an integer past 64 bits), else (or when orjson refuses it) through json,
    so its errors too are json's. For a recording's batch lines and MQTT payloads, which are many records."""
    if _orjson is not None and text.__class__ is bytes:
        try:
            obj = _orjson.loads(text)
            if _bounded_exact(obj):
                return obj
        except Exception:  # orjson.JSONDecodeError, or nesting too deep for the walk: json judges
            pass
    return _loads(text)


def _check_size(text: str | bytes, limit: int, what: str) -> None:
    if len(text) > limit:
        raise RecordError(what, f"{len(text):,} bytes, more than the {limit:,}-byte limit")


def decode(text: str | bytes, max_bytes: int = MAX_LINE_BYTES) -> Record:
    """One JSON line to a record; :class:`RecordError` on anything malformed (or over ``max_bytes``)."""
    if len(text) > max_bytes:
        _check_size(text, max_bytes, "line")
    if _orjson is not None and text.__class__ is bytes:
        if b'"tokens"' not in text:   # _fast_safe, inline
            rec = _decode_fast(text)  # type: ignore[arg-type]
        else:
            rec = _decode_tokens_fast(text)  # type: ignore[arg-type]
        if rec is not None:
            return rec
    return from_obj(_loads(text))


def _fast_safe(raw: bytes) -> bool:
    """Whether ``_decode_fast`` is worth trying on ``raw`` (exactness does not rest on this: it walks every
    number). A stored event with its token dicts (~35 KB, ~1,000 tokens) goes to ``_decode_tokens_fast``
    instead: walking its tokens in Python for ``_bounded_exact`` costs what orjson saves (measured: 0.157 s for
    a busy recording's 540,000 tokens, against 0.117 s saved), a look at its bytes does not. A recording's
    ``token_ids`` lists are cheap to walk."""
    return b'"tokens"' not in raw


# Every digit as "0", other bytes as they are: a run of digits becomes a run of zeros that bytes.find (C speed,
# ~5 us for a 35 KB line) can look for.
_DIGITS_AS_ZERO = bytes.maketrans(b"0123456789", b"0" * 10)
_RUN_20 = b"0" * 20
_NEG_RUN_19 = b"-" + b"0" * 19
_U64_MAX = str((1 << 64) - 1).encode()   # b"18446744073709551615", 20 digits


def _ints_exact(raw: bytes) -> bool:
    """Whether orjson reads every integer of ``raw`` exactly: it keeps -2^63 .. 2^64-1 as integers and reads any
    other as a float (the standard parser keeps it whole). Looked for in the bytes, not in the parsed objects
    (walking a stored event's ~1,000 token dicts in Python costs what orjson saves): ``False`` where a run of
    digits could be such an integer, i.e. a run of 21 digits or more, one of 20 above ``2^64-1``, or one of 19 or
    more after a minus sign. Conservative: the run may be in a string or a float's digits, and a ``False`` only
    sends the line to the standard parser. A 64-bit block hash (~half of them have 20 digits) passes."""
    zeros = raw.translate(_DIGITS_AS_ZERO)
    if _NEG_RUN_19 in zeros:
        return False
    i = zeros.find(_RUN_20)
    while i >= 0:
        end = i + 20
        # the run starts at i (the search starts on a non-digit); 21 digits or more, or 20 above 2^64-1
        if zeros[end:end + 1] == b"0" or raw[i:end] > _U64_MAX:
            return False
        i = zeros.find(_RUN_20, end)
    return True


def _decode_tokens_fast(raw: bytes) -> Record | None:
    """A line ``_fast_safe`` leaves out (a stored event with its token dicts, ~35 KB): through msgspec's typed
    decoder (``_decode_stored_typed``: 0.13-0.18 ms a busy recording's line), else through orjson where that
    gives the standard parser's objects: every integer in reach of orjson's exact range (``_ints_exact``); NaN,
    a byte-order mark, a lone surrogate, 1e400 or nesting past 1,024 make orjson refuse; every number is then
    walked as ``_bounded_exact`` walks them. Any record off the fast paths is ``None``, and the standard path
    then judges and names it. (Without msgspec a busy line costs 0.64-0.90 ms this way, the plain tokens turned
    into ids in Python; the json path is no faster: BENCHMARKS.md "Stored events as token ids".)"""
    if _msgspec is not None:
        rec = _decode_stored_typed(raw)
        if rec is not None:
            return rec
    if not _ints_exact(raw):
        return None
    try:
        obj = _orjson.loads(raw)
    except Exception:  # orjson.JSONDecodeError: the standard parser judges
        return None
    if obj.__class__ is not dict:
        return None
    # every number walked, the tokens' too: a token list nested past json's depth must not pass (orjson nests
    # to 1,024); since msgspec's path takes plain tokens, this one is left the rarer lines
    return _fast_record(obj, parsed_fast=True)


if _msgspec is not None:
    from typing import Literal

    class _PlainToken(_msgspec.Struct, tag="unique_token", tag_field="type", forbid_unknown_fields=True,
                      gc=False):
        """A token dict that ``read_event`` turns into its id: exactly these three keys (msgspec refuses any
        other, a repeated "type", an extra id but 0, a token id not an integer, and a bool)."""
        token_id: int
        token_extra_id: Literal[0]

    # A stored event's line, each level's dicts their own type so that a token can be decoded as _PlainToken at
    # one place only, a block's list values (a dict's values are Any; a list at another level as the level
    # below it): line -> "data" (the event) -> "data" (stored) -> "blocks" -> a block -> "tokens".
    _Scalar = None | bool | int | float | str
    _Block = dict[str, _Scalar | list[_PlainToken] | dict[str, Any]]
    _Stored = dict[str, _Scalar | list[_Block] | dict[str, Any]]
    _Event = dict[str, _Scalar | list[Any] | _Stored]
    _STORED_LINE = _msgspec.json.Decoder(dict[str, _Scalar | list[Any] | _Event])



def _decode_stored_typed(raw: bytes) -> Record | None:
    """A stored event's line with its token dicts (~35 KB, ~1,000 tokens) decoded by msgspec into the dicts the
    standard parser and ``read_event`` give, its plain tokens straight to their ids (no token dict built: that
    was 94 us of orjson's 128 a line, and a byte check for wide integers 32 more). ``None`` for anything else,
    which the other paths then judge: a token not plain, any token-shaped list in another place, a key of the
    envelope or source that the fast path would not look at (msgspec and json may differ on one nested ~1,000
    deep), and all that msgspec refuses and json takes (NaN, a byte-order mark, lone surrogates, UTF-16).
    What msgspec takes, json takes alike: integers of any size up to the same 4,300 digits, floats correctly
    rounded, the last of repeated keys (tests/test_records.py compares them over hypothesis-made lines)."""
    try:
        obj: Any = _STORED_LINE.decode(raw)
    except Exception:   # msgspec.DecodeError or ValidationError, RecursionError: the other paths judge
        return None
    if not obj.keys() <= _ENVELOPE_KEYS or obj.get("kind") != "kv_event":   # only a kv_event is read_event's
        return None
    src = obj.get("source")
    if src is not None and (src.__class__ is not dict or not src.keys() <= _SOURCE_KEYS):
        return None
    event = obj.get("data")
    if event.__class__ is not dict:
        return None
    stored = event.get("data")
    if stored.__class__ is not dict or stored.get("type") != "stored":
        return None
    blocks = stored.get("blocks")
    if blocks.__class__ is not list:
        return None
    # Every value of the event, the stored data and its blocks a number within the bounds (_bounded), another
    # scalar, or a block's list (of plain tokens, by the decoder's type; any other list only empty): a dict or a
    # list anywhere else sends the line on (a token could have been decoded inside it, and json may refuse its
    # depth where msgspec takes it). TensorRT-LLM's stored events have nothing else. One pass, which also turns
    # the token lists into ids: a second walk over the blocks cost ~1 us a block.
    for key, value in event.items():
        if key != "data" and not _scalar_ok(value):
            return None
    for key, value in stored.items():
        if key != "blocks" and not _scalar_ok(value):
            return None
    for b in blocks:   # dicts, by the decoder's type
        for key, value in b.items():
            c = value.__class__
            if c is int or c is float:
                if not _NEG_MAGNITUDE <= value <= MAX_MAGNITUDE:
                    return None
            elif c is list:
                if value and key != "tokens":
                    return None
            elif c is dict:
                return None
        tokens = b.get("tokens")
        if tokens.__class__ is list:   # plain tokens only, by the decoder's type: read_event's ids
            if "token_ids" in b:
                return None
            del b["tokens"]
            b["token_ids"] = [t.token_id for t in tokens]
    return _fast_record(obj, bounded=True)


_NEG_MAGNITUDE = -MAX_MAGNITUDE


def _scalar_ok(value: Any) -> bool:
    """``value`` is no list or dict, and a number within the bounds (``_bounded``) if it is one."""
    c = value.__class__
    if c is int or c is float:
        return _NEG_MAGNITUDE <= value <= MAX_MAGNITUDE
    return c is not list and c is not dict


def _decode_fast(raw: bytes) -> Record | None:
    """The record of ``raw`` parsed by orjson, when that gives what the standard parser gives; else ``None``.

    orjson refuses what the standard parser takes (NaN and Infinity literals, lone surrogates, a byte-order
    mark, UTF-16, nesting past 1,024) and reads an integer past 64 bits as a float: any of those, and any
    record off the fast path, goes to ``json`` and ``from_obj`` as before, so errors are worded as before.
    Measured: 11.9 -> 4.1 us a line of JSON for a busy recording's 27,000 lines (BENCHMARKS.md).
    """
    try:
        obj = _orjson.loads(raw)
    except Exception:  # orjson.JSONDecodeError, or anything it cannot take: the standard parser judges
        return None
    if obj.__class__ is not dict:
        return None
    return _exact_record(obj)


# What orjson's objects spare a check: its integers are always within -2^63 .. 2^64-1 (inside the bounds), as it
# reads any other integer as a float, so only floats (of magnitude 2^63 or more: such an integer, or a number out
# of the bounds) and nesting (past _EXACT_DEPTH) can make them differ from the standard path's or fail its
# bounds. The walks below look at nothing else; tests/test_records.py holds them to _bounded_exact and the full
# path over hypothesis-made lines.
_NEG_EXACT_FLOAT = -_EXACT_FLOAT


def _exact_record(obj: dict[str, Any]) -> Record | None:
    """``_fast_record(obj, parsed_fast=True)`` for a dict orjson parsed, in fewer Python steps: the common kinds'
    ``data`` walked once (``_event_exact``, ``_stats_exact``) where ``_bounded_exact``, ``read_event`` and the
    kind's checks walked it three times. ``None`` for anything else, which the standard path then judges."""
    if not obj.keys() <= _ENVELOPE_KEYS:
        return None
    v = obj.get("v")
    if v.__class__ is not int or not 1 <= v <= SCHEMA_VERSION:
        return None
    t = obj.get("time")
    if (t.__class__ is not float and t.__class__ is not int) or not 0 <= t <= TIME_MAX:   # NaN fails the range
        return None
    src = obj.get("source", _NO_SOURCE)
    if src.__class__ is not dict or not src.keys() <= _SOURCE_KEYS:
        return None
    host, rank, run = src.get("host", ""), src.get("rank", 0), src.get("run", "")
    if host.__class__ is not str or rank.__class__ is not int or run.__class__ is not str:
        return None   # (before the cache: True or 1.0 would find the SourceId of rank 1)
    key = (host, rank, run)
    source = _SOURCE_CACHE.get(key)
    if source is None:
        source = _new_source(key)
    data = obj.get("data")
    if data.__class__ is not dict:
        return None
    kind = obj.get("kind")
    try:
        if kind == "kv_event":
            if not _event_exact(data):
                return None
        elif kind == "stats":
            if not _stats_exact(data):
                return None
        elif kind == "request" or kind == "gpu" or kind == "host":
            if not _bounded_exact(data):
                return None
            _check_kind_data(kind, data, True)   # its errors are the full path's from here (as in _fast_record)
            data = _own_data(kind, data)
        else:
            return None
    except RecursionError:   # a walk called near the stack's limit: the standard path judges
        return None
    return _new_record(kind, data, source, float(t), v)


def _new_source(key: tuple[str, int, str]) -> SourceId:
    """The SourceId of a (host, rank, run) not seen before, cached; its rank within the bounds (the caller's check,
    or orjson's integers, which always are)."""
    if len(_SOURCE_CACHE) >= _SOURCE_CACHE_MAX:
        _SOURCE_CACHE.clear()
    host, rank, run = key
    source = _SOURCE_CACHE[key] = SourceId(clean(host, STRING_LEN), rank, clean(run, STRING_LEN))
    return source


def _values_exact(values: Any, depth: int, skip: Any = None) -> bool:
    """``_bounded_exact`` of each of ``values`` (at ``depth``) but ``skip``, which the caller walks itself."""
    for v in values:
        c = v.__class__
        if c is float:
            if not _NEG_EXACT_FLOAT < v < _EXACT_FLOAT:
                return False
        elif (c is dict or c is list) and v is not skip and not _bounded_exact(v, depth):
            return False
    return True


def _ints_list_exact(values: list[Any], depth: int) -> bool:
    """``_bounded_exact(values, depth)`` for a list, at C speed where it holds only integers (and bools):
    ``sum`` is then an integer, where one float would make it a float and a string, None or a container raise
    (a stored block's ~32 token ids: 0.9 -> 0.2 us)."""
    try:
        if sum(values).__class__ is int:
            return True
    except TypeError:
        pass
    return _bounded_exact(values, depth)


def _event_exact(data: dict[str, Any]) -> bool:
    """For a kv_event's ``data`` orjson parsed: ``_bounded_exact(data)`` and, after ``read_event(data)`` (made
    here where it changes something), ``_fast_event_ok(data, True)``; one walk. A stored block with ``"tokens"``
    (its key escaped in the line, else the line went to ``_decode_tokens_fast``) is left to the standard path."""
    ev = data.get("data")
    if ev.__class__ is not dict or data.get("event_id").__class__ is not int:
        return False
    for v in data.values():   # _values_exact(data.values(), 1, ev), inline: most events have three
        c = v.__class__
        if c is float:
            if not _NEG_EXACT_FLOAT < v < _EXACT_FLOAT:
                return False
        elif (c is dict or c is list) and v is not ev and not _bounded_exact(v, 1):
            return False
    etype = ev.get("type")
    if etype == "updated":
        if ev.get("block_hash").__class__ is not int:
            return False
        for v in ev.values():   # _values_exact(ev.values(), 2), inline
            c = v.__class__
            if c is float:
                if not _NEG_EXACT_FLOAT < v < _EXACT_FLOAT:
                    return False
            elif (c is dict or c is list) and not _bounded_exact(v, 2):
                return False
        if "cache_level_diff" in ev or "priority_diff" in ev:
            read_event(data)   # a recording's [old, new] pairs as TensorRT-LLM's dicts
        return True
    if etype == "removed":
        hashes = ev.get("block_hashes")
        if hashes.__class__ is not list:
            return False
        for h in hashes:   # integers, so within the bounds (orjson's)
            if h.__class__ is not int:
                return False
        return _values_exact(ev.values(), 2, hashes)
    if etype == "stored":
        blocks = ev.get("blocks")
        if blocks.__class__ is not list or not _values_exact(ev.values(), 2, blocks):
            return False
        for b in blocks:
            if b.__class__ is not dict or b.get("block_hash").__class__ is not int or "tokens" in b:
                return False
            for v in b.values():
                c = v.__class__
                if c is float:
                    if not _NEG_EXACT_FLOAT < v < _EXACT_FLOAT:
                        return False
                elif c is list:
                    if not _ints_list_exact(v, 4):
                        return False
                elif c is dict and not _bounded_exact(v, 4):
                    return False
        return True
    return False   # created (one a run) and anything else: the standard path


def _stats_exact(data: dict[str, Any]) -> bool:
    """For a stats ``data`` orjson parsed: ``_bounded_exact(data)`` and ``_check_kind_data("stats", data, True)``
    passes; one walk, the block counts of ``kvCacheStats`` / ``kvCacheIterationStats`` checked in it."""
    kv = data.get("kvCacheStats")
    if kv is not None and kv.__class__ is not dict:
        return False   # must be an object: the standard path names it
    for k, v in data.items():
        c = v.__class__
        if c is float:
            if not _NEG_EXACT_FLOAT < v < _EXACT_FLOAT:
                return False
        elif c is dict:
            if k == "kvCacheStats" or k == "kvCacheIterationStats":
                if not _block_counts_exact(v):
                    return False
            elif not _bounded_exact(v, 1):
                return False
        elif c is list and not (_bounded_exact(v, 1) and (k != "kvCacheIterationStats" or _blocks_ok(v))):
            return False
    return True


def _block_counts_exact(part: dict[str, Any]) -> bool:
    """``_bounded_exact(part, 1)`` and ``_blocks_ok(part)``, one walk (a block count is at most 2^40)."""
    for k, v in part.items():
        c = v.__class__
        if c is int:
            if v > _BLOCK_LIMIT and "Block" in k:
                return False
        elif c is float:
            if not _NEG_EXACT_FLOAT < v < _EXACT_FLOAT or (v > _BLOCK_LIMIT and "Block" in k):
                return False
        elif (c is dict or c is list) and not (_bounded_exact(v, 2) and _blocks_ok(v)):
            return False
    return True


def decode_payload(payload: str | bytes, max_bytes: int = MAX_LINE_BYTES) -> list[Record]:
    """An MQTT (or HTTP) payload: one record, or a JSON array of records (at most ``max_bytes``).

    A bad element of a batch raises for the whole payload: the error names its index.
    """
    _check_size(payload, max_bytes, "payload")
    obj = _loads_exact(payload)
    if isinstance(obj, list):
        out = []
        for i, item in enumerate(obj):
            try:
                out.append(from_obj(item))
            except RecordError as exc:
                raise RecordError(f"[{i}].{exc.field}", exc.problem) from None
        return out
    return [from_obj(obj)]


_READ_BUFFER = 1 << 20


def read_jsonl(path: str | os.PathLike[str], *, max_line_bytes: int = MAX_LINE_BYTES
               ) -> Iterator[Record | RecordError]:
    """Every line of a recording: a Record, or the RecordError for that line (with its number).

    Blank lines are skipped. A truncated last line (a crash mid-write) comes back as an error, never raises.
    A line longer than ``max_line_bytes`` is an error too, and costs no more memory than the limit.
    Raises ``OSError`` if the file cannot be opened (a directory, no permission).
    """
    # A 1 MiB buffer, not io's 8 KiB: a stored event with its tokens is ~35 KB, read in five pieces through the
    # default one; reading the 62 MB busy full-scale recording line by line took 39 -> 20 ms of CPU.
    with Path(path).open("rb", buffering=_READ_BUFFER) as fh:
        for lineno, (raw, size) in enumerate(iter_lines(fh, max_line_bytes), start=1):
            if raw is None:
                yield RecordError("line", f"{size:,} bytes, more than the {max_line_bytes:,}-byte limit", lineno)
                continue
            if not raw.strip():
                continue
            if _BATCH_MARK in raw[:80]:
                yield from _decode_batch(raw, lineno, max_line_bytes)
                continue
            try:
                yield decode(raw, max_line_bytes + 1)
            except RecordError as exc:
                yield exc.at_line(lineno)


# What a line of several KV events (kvtop/sinks/recorder.py, kvtop/compact.py) has near its start.
_BATCH_MARK = b'"' + BATCH_KIND.encode() + b'"'


def _decode_batch(raw: bytes, lineno: int, max_line_bytes: int) -> Iterator[Record | RecordError]:
    """A recorder's batch line (``{"v":1,"kind":"kv_events","source":..., "time": t0, "data": {"times": [...],
    "events": [...]}}``) as its ``kv_event`` records, each validated on its own: one bad event is one error
    (with the line's number), the others are kept."""
    try:
        obj = _loads_exact(raw)
        if not isinstance(obj, dict) or obj.get("kind") != BATCH_KIND:
            yield decode(raw, max_line_bytes + 1)   # the mark was in some other record's text
            return
        data = obj.get("data")
        times = data.get("times") if isinstance(data, dict) else None
        events = data.get("events") if isinstance(data, dict) else None
        if not isinstance(times, list) or not isinstance(events, list) or len(times) != len(events):
            raise RecordError("data", "a kv_events line needs lists 'times' and 'events' of one length")
    except RecordError as exc:
        yield exc.at_line(lineno)
        return
    envelope = {k: obj[k] for k in ("v", "source") if k in obj}
    for i, (t, ev) in enumerate(zip(times, events)):
        try:
            yield from_obj({**envelope, "kind": "kv_event", "time": t, "data": unpack_event(ev)})
        except RecordError as exc:
            yield RecordError(f"events[{i}].{exc.field}", exc.problem, lineno)


def parse_engine_dict(value: Any, what: str = "stats") -> dict[str, Any]:
    """Engine payloads may be dicts or JSON strings (TensorRT-LLM 1.x documents strings for get_stats)."""
    if isinstance(value, (str, bytes)):
        value = _loads(value, what)
    if not isinstance(value, dict):
        raise RecordError(what, f"must be an object, got {_describe(value)}")
    return value
