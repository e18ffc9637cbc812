"""What every fold of kvtop/tiers shares: the bad-input exception and its field checks, and the Ledger.

A fold raises ``Bad(field, problem)`` for malformed input before it changes anything; the composer
(kvtop/tiers/model.py) turns that into one counted bad record whose reason names the field. The checks accept what
TensorRT-LLM's JSON writers really emit (an integral float for a count, a signed 64-bit block hash) and nothing
else.

The ``Ledger`` is the part of the model every fold writes: "now" (never backwards; each new instant takes the rate
window's samples, kvtop/tiers/window.py), the records handed in and folded, and the bad ones. The event fold's hot
path (kvtop/tiers/events.py) updates it directly, so it is one small object with slots.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

from kvtop.tiers.window import RateWindow

U64 = 1 << 64
_I64_MIN = -(1 << 63)
MAX_PRIORITY = 100
UNKNOWN_PRIORITY = MAX_PRIORITY + 1   # bucket for blocks whose priority no event gave (verbatim fixtures omit it)


class Bad(Exception):
    """Malformed input: ``field`` is a dotted path into the record's data."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


def describe(value: Any) -> str:
    try:
        text = json.dumps(value, default=str)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def nonneg_count(value: Any, path: str) -> int | None:
    """A non-negative count (None stays None). Integral floats are accepted: some JSON writers emit 5.0."""
    if value is None:
        return None
    if value.__class__ is int and value >= 0:
        return int(value)
    if isinstance(value, float) and value.is_integer() and value >= 0:
        return int(value)
    raise Bad(path, f"must be a non-negative integer, got {describe(value)}")


def required_count(value: Any, path: str) -> int:
    n = nonneg_count(value, path)
    if n is None:
        raise Bad(path, "must be a non-negative integer, got null")
    return n


def nonneg_number(value: Any, path: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise Bad(path, f"must be a non-negative number, got {describe(value)}")
    return float(value)


def hash64(value: Any, path: str) -> int:
    """An unsigned 64-bit block hash; a signed 64-bit one (NVIDIA's gRPC converter wraps them) is unwrapped.

    TensorRT-LLM's V2 manager with ``kv_cache_event_hash_algo="v2_sha256"`` (the default "auto" there on 1.3's
    line, tensorrt_llm/runtime/kv_cache_hash.py) writes block hashes as the hex of a SHA-256 key
    (tensorrt_llm/serve/router_utils.py ``v2_sha256_block_hasher``): its first 8 bytes, big-endian, are the key,
    the same number ``v2_sha256_64`` sends (``truncate_sha256_hash_to_int64``).
    """
    if value.__class__ is str and len(value) >= 16:
        try:
            return int(value[:16], 16)
        except ValueError:
            pass
    if value.__class__ is not int or not _I64_MIN <= value < U64:
        raise Bad(path, f"must be a 64-bit integer block hash, got {describe(value)}")
    return value + U64 if value < 0 else value


def hash64_list(values: list[Any], path: str) -> list[int]:
    return [hash64(v, f"{path}[{i}]") for i, v in enumerate(values)]


# Cache levels and priorities: a number equal to a valid integer (1.0, or JSON true for 1) is taken as that integer,
# in the hot path (which compares by value) and here alike. Block hashes and event ids must be true integers.

def tier_level(value: Any, path: str) -> int:
    if isinstance(value, (int, float)) and value in (0, 1):
        return int(value)
    raise Bad(path, f"must be 0 (GPU) or 1 (host), got {describe(value)}")


def priority_in_range(value: Any, path: str) -> int:
    if isinstance(value, (int, float)) and 0 <= value <= MAX_PRIORITY and value == int(value):
        return int(value)
    raise Bad(path, f"must be an integer priority in [0, {MAX_PRIORITY}], got {describe(value)}")


class Ledger:
    """"Now" and the record counts, shared by the model and its folds (see the module docstring)."""

    __slots__ = ("now", "start", "touched", "applied", "bad_records", "last_bad_reason", "window", "counters")

    def __init__(self, window: RateWindow, counters: Callable[[], tuple[int, ...]]):
        self.now: float | None = None
        self.start: float | None = None  # the first record's time: the run's span is now - start
        self.touched = 0  # every record handed in, folded or not (a duplicate event still counts one)
        self.applied = 0  # records folded
        self.bad_records = 0
        self.last_bad_reason: str | None = None
        self.window = window
        self.counters = counters  # the model's cumulative counters, sampled by the window as time moves on

    def bad(self, field: str, problem: str) -> None:
        self.bad_records += 1
        self.last_bad_reason = f"{field}: {problem}"

    def tick(self, t: Any) -> bool:
        """Advance "now" (never backwards) and take rate samples. False (and a bad record) for a bad time."""
        if t.__class__ is not float and (isinstance(t, bool) or not isinstance(t, (int, float))):
            self.bad("time", f"must be a number, got {describe(t)}")
            return False
        if t.__class__ is not float and not -1e300 < t < 1e300:  # an int too large for a float (10**400)
            self.bad("time", "must be a finite number, got an integer too large for a float")
            return False
        if not math.isfinite(t):
            self.bad("time", f"must be a finite number, got {t}")
            return False
        t = float(t)
        last = self.now
        if last is not None and t <= last:
            return True
        self.now = t
        if last is None:
            self.start = t
            return True
        self.window.advance(last, t, self.counters)  # the rate samples due (kvtop/tiers/window.py)
        return True
