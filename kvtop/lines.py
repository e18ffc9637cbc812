"""Bounded line reading, shared by the recordings (kvtop.records) and the traces (kvtop.workload.trace).

Its own module so that reading a trace does not import kvtop.records, which brings msgspec and orjson with its
record types: ~17-25 ms of ``kvtop sim --trace ... --one-pass`` start-up, of a run of ~0.4 s (python -X importtime).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def iter_lines(fh: Any, max_bytes: int) -> Iterator[tuple[bytes | None, int]]:
    """(line, size) for each line of ``fh``; ``None`` for a line over ``max_bytes``, which is read past in
    1 MiB chunks and never held whole (a 1 GB file with no newline costs 1 MiB, not 1 GB)."""
    while True:
        raw = fh.readline(max_bytes + 1)
        if not raw:
            return
        if len(raw) <= max_bytes or raw.endswith(b"\n"):
            yield raw, len(raw)
            continue
        size = len(raw)
        while True:
            chunk = fh.readline(1 << 20)
            size += len(chunk)
            if not chunk or chunk.endswith(b"\n"):
                break
        yield None, size
