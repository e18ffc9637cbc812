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

The package, a spec and its accelerators told apart (issue 25):
- here, the envelope: the format above, ``make``, ``encode``, and the readers (``decode``, ``decode_payload``,
  ``read_jsonl``), each trying an accelerator first and the spec for whatever it leaves;
- kvtop/records/record.py: the values, :class:`Record` and :class:`SourceId`;
- kvtop/records/checks.py: the one spec, every error named, with the bounds every number of ``data`` is held to
  (2^64 a number, 2^40 a block count, ``time`` between 1970 and 2100, strings of kvtop's own kinds cleaned);
- kvtop/records/fast.py: the orjson and msgspec paths, each held to checks.py by tests/records/test_records.py.

A line or payload is at most ``MAX_LINE_BYTES`` (8 MiB; ``read_jsonl(max_line_bytes=...)``): the largest real
message, 2,000 events of a busy engine with token ids, is ~4 MB.
"""

from __future__ import annotations

import json
import os
import time as _time
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from kvtop.compact import BATCH_KIND, read_form, unpack_event
from kvtop.lines import iter_lines as iter_lines  # re-exported: it lived here
from kvtop.records.checks import (
    KINDS,
    MAX_BLOCKS,
    MAX_MAGNITUDE,
    STRING_LEN,
    TIME_MAX,
    RecordError,
    check_kind_data,
    check_time,
    checked_record,
    describe,
    loads,
    own_data,
)
from kvtop.records.fast import decode_fast, decode_tokens_fast, fast_record, loads_exact, new_record
from kvtop.records.fast import orjson as _orjson  # decode's gate (None: every line through checks.py)
from kvtop.records.record import SCHEMA_VERSION, Record, SourceId

__all__ = ["KINDS", "MAX_BLOCKS", "MAX_LINE_BYTES", "MAX_MAGNITUDE", "SCHEMA_VERSION", "STRING_LEN", "TIME_MAX",
           "Record", "RecordError", "SourceId", "decode", "decode_payload", "encode", "encode_batch", "from_obj",
           "iter_lines", "json_default", "make", "parse_engine_dict", "read_jsonl", "trusted_record"]

MAX_LINE_BYTES = 8 << 20   # 8 MiB per line or payload (see the module docstring)


def make(kind: str, data: dict[str, Any], source: SourceId | None = None, time: float | None = None) -> Record:
    """Build a record now (or at ``time``), validating it as a reader would, and as a reader gives it (a KV
    event in ``read_event``'s form: ``data`` is not changed, a new dict is made where that differs)."""
    if kind == "kv_event":
        data = read_form(data)
    check_kind_data(kind, data)
    return Record(kind=kind, data=own_data(kind, data), source=source or SourceId(),
                  time=_time.time() if time is None else check_time(time))


def trusted_record(kind: str, data: dict[str, Any], source: SourceId, time: float) -> Record:
    """``make(kind, data, source, time)`` without its checks: for a stats or KV event dict that kvtop's own
    simulator made in this process, already in the form ``make`` gives (its events' tokens as ``token_ids``), at a
    float ``time`` of the clock (``SimLLM.trusted_records``, taken by kvtop/sources/poller.py). Every other source's
    dicts, an outside engine's above all, go through ``make``. A simulator's bug would still be seen: the fold
    counts and reports a record it cannot read (``record.bad``).

    Reference: make. Held equal by tests/engines/sim/test_simllm.py::test_trusted_records_are_what_make_gives (a
    driven run's every stat and event). Pays: ~4.7 of the ~12 us a record made and folded cost (bench/JOURNAL.md
    "The driven path's fold").
    """
    return new_record(kind, data, source, time, SCHEMA_VERSION)


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

def from_obj(obj: Any) -> Record:
    """Validate a decoded JSON object as a record."""
    if obj.__class__ is dict:
        rec = fast_record(obj)
        if rec is not None:
            return rec
    return checked_record(obj)


def _check_size(text: str | bytes, limit: int, what: str) -> None:
    if len(text) > limit:
        raise RecordError(what, f"{len(text):,} bytes, more than the {limit:,}-byte limit")


def decode(text: str | bytes, max_bytes: int = MAX_LINE_BYTES) -> Record:
    """One JSON line to a record; :class:`RecordError` on anything malformed (or over ``max_bytes``)."""
    if len(text) > max_bytes:
        _check_size(text, max_bytes, "line")
    if _orjson is not None and text.__class__ is bytes:
        if b'"tokens"' not in text:   # fast_safe, inline
            rec = decode_fast(text)  # type: ignore[arg-type]
        else:
            rec = decode_tokens_fast(text)  # type: ignore[arg-type]
        if rec is not None:
            return rec
    return from_obj(loads(text))


def decode_payload(payload: str | bytes, max_bytes: int = MAX_LINE_BYTES) -> list[Record]:
    """An MQTT (or HTTP) payload: one record, or a JSON array of records (at most ``max_bytes``).

    A bad element of a batch raises for the whole payload: the error names its index.
    """
    _check_size(payload, max_bytes, "payload")
    obj = loads_exact(payload)
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
        obj = loads_exact(raw)
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
        value = loads(value, what)
    if not isinstance(value, dict):
        raise RecordError(what, f"must be an object, got {describe(value)}")
    return value
