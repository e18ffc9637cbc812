"""read_trace's orjson path (plain Mooncake lines) against its json path, line for line and error for error.

The json path is the reference: with orjson made unimportable, read_trace reads every line through json.loads and
parse_trace_line. The trace mixes plain lines (orjson's) with every kind of line where orjson and json could part:
a hash id of 2^64 (a float in orjson, an int in json), 2^64 - 1 (an int in both), an unknown key nested 1,000 deep
(json's recursion limit, not orjson's), NaN, a lone surrogate, a float timestamp, a repeated key, out-of-bounds
fields, bad JSON, bad UTF-8, a BOM and blank lines.
"""

from __future__ import annotations

import sys
from pathlib import Path

import orjson
import pytest

from kvtop.workload import trace as trace_mod
from kvtop.workload.trace import TraceError, read_trace

PLAIN = [
    b'{"timestamp": 0, "input_length": 1500, "output_length": 6, "hash_ids": [0, 1, 2]}',
    b'{"hash_ids": [7, 18446744073709551615], "output_length": 2, "input_length": 1024, "timestamp": 1250}',
    b'{"input_length": 1, "output_length": 1, "hash_ids": []}',  # no timestamp: 0
    b'{"timestamp": 5, "timestamp": 9, "input_length": 600, "output_length": 3, "hash_ids": [4, 5]}',  # last wins
    b'  {"timestamp": 1125899906842624, "input_length": 16777216, "output_length": 16777216, "hash_ids": [3]}\r',
]
NOT_PLAIN = [
    b'{"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [18446744073709551616]}',  # 2^64
    b'{"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [1, -1]}',
    b'{"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [true]}',
    b'{"x": ' + b"[" * 1000 + b"]" * 1000 + b', "input_length": 512, "output_length": 1, "hash_ids": [1]}',
    b'{"x": ' + b"[" * 990 + b"]" * 990 + b', "input_length": 512, "output_length": 1, "hash_ids": [1]}',
    b'{"timestamp": NaN, "input_length": 512, "output_length": 1, "hash_ids": [1]}',
    b'{"note": "\\ud800", "input_length": 512, "output_length": 1, "hash_ids": [1]}',
    b'{"timestamp": 12.5, "input_length": 512, "output_length": 1, "hash_ids": [1]}',
    b'{"timestamp": 1125899906842625, "input_length": 512, "output_length": 1, "hash_ids": [1]}',  # 2^50 + 1
    b'{"timestamp": 0, "input_length": 0, "output_length": 1, "hash_ids": [1]}',
    b'{"timestamp": 0, "input_length": 512, "output_length": 16777217, "hash_ids": [1]}',
    b'{"timestamp": 0, "input_length": 512.0, "output_length": 1, "hash_ids": [1]}',
    b'{"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [1], "session": "a"}',
    b'{"timestamp": 0, "input_length": 512, "output_length": 1}',
    b'{"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [1]',  # cut short
    b'[1, 2]',
    b'{"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [1]} trailing',
    b'\xef\xbb\xbf{"timestamp": 0, "input_length": 512, "output_length": 1, "hash_ids": [1]}',
    b'{"note": "\xff", "input_length": 512, "output_length": 1, "hash_ids": [1]}',
    b"",
    b"   \t",
]


def _write(tmp_path: Path) -> Path:
    lines = [line for pair in zip(PLAIN * 5, NOT_PLAIN) for line in pair] + PLAIN
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    return path


def _read(path: Path, *, limit: int | None = None) -> tuple[list, list[str]]:
    errors: list[TraceError] = []
    requests = list(read_trace(path, errors=errors, limit=limit))
    return requests, [f"{type(e).__name__} {e} {e.line} {e.problem!r}" for e in errors]


def test_orjson_path_reads_as_the_json_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path)
    fast = _read(path)
    fast_limited = _read(path, limit=7)
    monkeypatch.setitem(sys.modules, "orjson", None)  # `from orjson import loads` raises ImportError
    reference = _read(path)
    assert fast == reference
    assert fast_limited == _read(path, limit=7)
    requests, errors = reference
    # 21 pairs and the 5 plain lines again; of the others json reads four (990 deep, a float timestamp, a float
    # input_length, an unknown key) and skips the two blank lines
    assert len(requests) == 21 + 5 + 4
    assert len(errors) == len(NOT_PLAIN) - 4 - 2 == 15
    assert any("64-bit" in e for e in errors) and any("nested too deeply" in e for e in errors)
    assert requests[1].hash_ids == (7, 2**64 - 1) and requests[1].timestamp_ms == 1250.0
    assert type(requests[1].timestamp_ms) is float and all(type(h) is int for r in requests for h in r.hash_ids)


def test_plain_lines_take_the_orjson_path_and_the_others_do_not() -> None:
    """Without this the test above would pass with the fast path never taken."""
    for number, line in enumerate(PLAIN, start=1):
        request = trace_mod._parse_plain_line(line, orjson.loads, number)
        assert request == trace_mod.parse_trace_line(line.decode(), "<trace>", number)
    for line in NOT_PLAIN:
        assert trace_mod._parse_plain_line(line, orjson.loads, 1) is None, line[:60]


def test_reading_a_trace_does_not_import_the_records() -> None:
    import subprocess

    code = ("import sys; from kvtop.workload.trace import read_trace; "
            "list(read_trace(sys.argv[1])); print('kvtop.records' in sys.modules, 'msgspec' in sys.modules)")
    trace = Path(__file__).resolve().parents[3] / "shared" / "traces" / "mooncake_synthetic_trace.jsonl"
    if not trace.exists():
        pytest.skip("the shared Mooncake trace is not here")
    out = subprocess.run([sys.executable, "-c", code, str(trace)], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "False"]
