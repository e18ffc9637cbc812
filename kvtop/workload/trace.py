"""Mooncake-format traces: one request per line, prompt prefixes as hash ids over 512-token blocks.

``{"timestamp": ms, "input_length": tokens, "output_length": tokens, "hash_ids": [...]}`` (the FAST'25 Mooncake
trace release). Block hash ``h`` at any position stands for the tokens ``h*512 + k``, k = 0..511, the last block
cut to ``input_length``; so requests sharing their first k hash ids share their first k*512 prompt tokens, at any
tokens-per-block that divides 512. Generated tokens (>= 2^30) never collide with these (max hash id in the
public trace is 43,923, i.e. tokens below 2.3e7).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

from kvtop.engines.inputs import TRACE_BLOCK_TOKENS as TRACE_BLOCK_TOKENS  # re-exported: kvtop.engines.sim.sweep
from kvtop.engines.inputs import TraceRequest


class TraceError(ValueError):
    def __init__(self, path: str, line: int, problem: str):
        self.path, self.line, self.problem = path, line, problem
        super().__init__(f"{path}:{line}: {problem}")


def _field(obj: dict, key: str, path: str, line: int, minimum: int = 0) -> int:
    value = obj.get(key)
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise TraceError(path, line, f"'{key}' must be a number, got {value!r}")
    if value < minimum:
        raise TraceError(path, line, f"'{key}' must be >= {minimum}, got {value}")
    return int(value)


def parse_trace_line(text: str, path: str = "<trace>", line: int = 0) -> TraceRequest:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as exc:
        raise TraceError(path, line, f"not valid JSON ({exc.msg})") from None
    if not isinstance(obj, dict):
        raise TraceError(path, line, "expected a JSON object")
    hash_ids = obj.get("hash_ids")
    if not isinstance(hash_ids, list) or not all(isinstance(h, int) and not isinstance(h, bool) and h >= 0
                                                 for h in hash_ids):
        raise TraceError(path, line, "'hash_ids' must be a list of non-negative integers")
    ts = obj.get("timestamp", 0)
    if isinstance(ts, bool) or not isinstance(ts, (int, float)) or ts < 0:
        raise TraceError(path, line, f"'timestamp' must be a number of ms >= 0, got {ts!r}")
    return TraceRequest(line=line, timestamp_ms=float(ts), input_length=_field(obj, "input_length", path, line, 1),
                        output_length=_field(obj, "output_length", path, line, 1), hash_ids=tuple(hash_ids))


def read_trace(path: str | Path, errors: list[TraceError] | None = None,
               limit: int | None = None) -> Iterator[TraceRequest]:
    """Requests of a trace file. A malformed line raises :class:`TraceError` with its line number, unless an
    ``errors`` list is given: then it is appended there and skipped."""
    p = Path(path)
    with p.open("r", encoding="utf-8") as fh:
        count = 0
        for lineno, text in enumerate(fh, start=1):
            if not text.strip():
                continue
            try:
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
