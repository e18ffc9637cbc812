"""Mooncake-format traces: one request per line, prompt prefixes as hash ids over 512-token blocks.

``{"timestamp": ms, "input_length": tokens, "output_length": tokens, "hash_ids": [...]}`` (the FAST'25 Mooncake
trace release). Block hash ``h`` at any position stands for the tokens ``h*512 + k``, k = 0..511, the last block
cut to ``input_length``; so requests sharing their first k hash ids share their first k*512 prompt tokens, at any
tokens-per-block that divides 512. Generated tokens (>= 2^30) never collide with these (max hash id in the
public trace is 43,923, i.e. tokens below 2.3e7).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeGuard

from kvtop.engines.inputs import TRACE_BLOCK_TOKENS as TRACE_BLOCK_TOKENS  # re-exported: kvtop.engines.sim.sweep
from kvtop.engines.inputs import TraceRequest
from kvtop.lines import iter_lines

# Bounds, so one bad line cannot make a run hang or fill memory: a prompt or an output of more than 2^24 tokens
# (16.7M; the longest contexts are ~1-2M) and a timestamp past 2^50 ms (35,000 years) are bad lines, as is a
# line longer than 8 MiB (the public trace's longest is ~4 KB).
MAX_TOKENS = 1 << 24
MAX_TIMESTAMP_MS = float(1 << 50)
MAX_LINE_BYTES = 8 << 20


class TraceError(ValueError):
    def __init__(self, path: str, line: int, problem: str):
        self.path, self.line, self.problem = path, line, problem
        super().__init__(f"{path}:{line}: {problem}")


def _field(obj: dict, key: str, path: str, line: int, minimum: int = 0) -> int:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise TraceError(path, line, f"'{key}' must be a number, got {_short(value)}")
    if value < minimum:
        raise TraceError(path, line, f"'{key}' must be >= {minimum}, got {_short(value)}")
    if value > MAX_TOKENS:
        raise TraceError(path, line, f"'{key}' must be at most {MAX_TOKENS:,} tokens, got {_short(value)}")
    return int(value)


def _short(value: object) -> str:
    text = repr(value) if not isinstance(value, int) or abs(value) < 10 ** 30 else "a larger integer"
    return text if len(text) <= 40 else text[:37] + "..."


_INTS_ONLY = frozenset({int})


def _hash_ids_ok(hash_ids: object) -> TypeGuard[list[int]]:
    """A list of non-negative 64-bit integers (bools are not), checked in C: json gives exact types, so "an int
    and not a bool" is "of type int". A generator over the ids was 7% of ``kvtop sim --one-pass`` at 512 tokens
    a block (125k ids in the Mooncake trace)."""
    if not isinstance(hash_ids, list):
        return False
    return not hash_ids or (set(map(type, hash_ids)) <= _INTS_ONLY and min(hash_ids) >= 0 and max(hash_ids) < 1 << 64)


def parse_trace_line(text: str, path: str = "<trace>", line: int = 0) -> TraceRequest:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(path, line, f"not valid JSON ({exc.msg})") from None
    except (ValueError, RecursionError):  # an integer past 4,300 digits; nesting too deep
        raise TraceError(path, line, "not a trace line (a number too long, or nested too deeply)") from None
    if not isinstance(obj, dict):
        raise TraceError(path, line, "expected a JSON object")
    hash_ids = obj.get("hash_ids")
    if not _hash_ids_ok(hash_ids):
        raise TraceError(path, line, "'hash_ids' must be a list of non-negative 64-bit integers")
    ts = obj.get("timestamp", 0)
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or not 0 <= ts <= MAX_TIMESTAMP_MS:
        raise TraceError(path, line, f"'timestamp' must be a number of ms from 0 to 2^50, got {_short(ts)}")
    return TraceRequest(line=line, timestamp_ms=float(ts), input_length=_field(obj, "input_length", path, line, 1),
                        output_length=_field(obj, "output_length", path, line, 1), hash_ids=tuple(hash_ids))


# The keys of a Mooncake line. A line with these alone, every value an int or a list of ints, is read with orjson:
# orjson gives ints below 2^64 exactly and json's last-wins on a repeated key, and such a line holds nothing where
# the two parsers differ (an integer past 64 bits is a float in orjson, one past 4,300 digits an error in json;
# NaN, lone surrogates and nesting depth only the one accepts). Anything else, or anything orjson refuses, goes
# through json.loads and the checks above, so every error reads as before. json.loads was 11.8 ms of the 3,993
# lines of the synthetic Mooncake trace, orjson on the bytes 3.5 ms.
_PLAIN_KEYS = frozenset({"timestamp", "input_length", "output_length", "hash_ids"})


def _parse_plain_line(raw: bytes, loads: Callable[[bytes], object], line: int) -> TraceRequest | None:
    """The request of a plain Mooncake line, as :func:`parse_trace_line` gives it; ``None`` when the line is not
    plain or not valid (the caller then reads it through json, with its errors)."""
    try:
        obj = loads(raw)
    except Exception:  # orjson.JSONDecodeError, or anything else: json decides, and words the error
        return None
    if type(obj) is not dict or not obj.keys() <= _PLAIN_KEYS:
        return None
    ts = obj.get("timestamp", 0)
    input_length = obj.get("input_length")
    output_length = obj.get("output_length")
    hash_ids = obj.get("hash_ids")
    if (type(ts) is not int or type(input_length) is not int or type(output_length) is not int
            or not 0 <= ts <= MAX_TIMESTAMP_MS or not 1 <= input_length <= MAX_TOKENS
            or not 1 <= output_length <= MAX_TOKENS or not _hash_ids_ok(hash_ids)):
        return None
    return TraceRequest(line=line, timestamp_ms=float(ts), input_length=input_length, output_length=output_length,
                        hash_ids=tuple(hash_ids))


def read_trace(path: str | Path, errors: list[TraceError] | None = None,
               limit: int | None = None) -> Iterator[TraceRequest]:
    """Requests of a trace file. A malformed line raises :class:`TraceError` with its line number, unless an
    ``errors`` list is given: then it is appended there and skipped."""
    try:
        from orjson import loads as orjson_loads
    except ImportError:  # pragma: no cover - orjson is a dependency; without it every line goes through json
        orjson_loads = None  # type: ignore[assignment]

    p = Path(path)
    with p.open("rb") as fh:
        count = 0
        for lineno, (raw, size) in enumerate(iter_lines(fh, MAX_LINE_BYTES), start=1):
            try:
                if raw is None:
                    raise TraceError(str(p), lineno, f"{size:,} bytes, more than the {MAX_LINE_BYTES:,}-byte limit")
                req = None if orjson_loads is None else _parse_plain_line(raw, orjson_loads, lineno)
                if req is None:
                    try:
                        text = raw.decode("utf-8")
                    except UnicodeDecodeError:
                        raise TraceError(str(p), lineno, "not UTF-8 text (is this a trace? one JSON object per line)"
                                         ) from None
                    if not text.strip():
                        continue
                    req = parse_trace_line(text, str(p), lineno)
            except TraceError as exc:
                if errors is None:
                    raise
                errors.append(exc)
                continue
            yield req
            count += 1
            if limit is not None and count >= limit:
                return
