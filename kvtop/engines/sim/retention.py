"""TensorRT-LLM's KV cache retention configuration, with its names and its validation.

Mirrors ``tensorrt_llm.llmapi.KvCacheRetentionConfig`` (C++ ``executor::KvCacheRetentionConfig``,
``cpp/tensorrt_llm/executor/kvCacheRetentionConfig.cpp``): token ranges of the prompt get a priority (0..100) and
optionally a duration after which the priority lapses back to the default 35; generated (decode) blocks get
``decode_retention_priority`` / ``decode_duration_ms``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from enum import IntEnum

MIN_PRIORITY = 0
MAX_PRIORITY = 100
DEFAULT_PRIORITY = 35  # executor.h kDefaultRetentionPriority


class KvCacheTransferMode(IntEnum):
    """``tensorrt_llm.bindings.executor.KvCacheTransferMode`` (executor.h): where offloaded blocks go."""

    DRAM = 0
    GDS = 1
    POSIX_DEBUG_FALLBACK = 2


def parse_transfer_mode(value: object) -> KvCacheTransferMode:
    """TensorRT-LLM's names: the enum member (kvtop's or TensorRT-LLM's own, by its ``name``), its name as a string
    (``"GDS"``, case-insensitive), or its value."""
    if isinstance(value, KvCacheTransferMode):
        return value
    name = getattr(value, "name", None)
    if isinstance(name, str) and name.upper() in KvCacheTransferMode.__members__:  # TensorRT-LLM's pybind enum
        return KvCacheTransferMode[name.upper()]
    if isinstance(value, str) and value.strip().upper() in KvCacheTransferMode.__members__:
        return KvCacheTransferMode[value.strip().upper()]
    if isinstance(value, int) and not isinstance(value, bool) and value in KvCacheTransferMode._value2member_map_:
        return KvCacheTransferMode(value)
    raise ValueError(f"transfer_mode: must be one of {', '.join(KvCacheTransferMode.__members__)}, got {value!r}")


def _duration_ms(value: timedelta | int | float | None, what: str) -> int | None:
    if value is None:
        return None
    if isinstance(value, timedelta):
        ms = value.total_seconds() * 1000.0
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        ms = float(value)
    else:
        raise ValueError(f"{what}: must be a timedelta or milliseconds, got {value!r}")
    if ms < 0:
        raise ValueError(f"{what}: must not be negative, got {ms} ms")
    return int(ms)


def _check_priority(priority: int, what: str) -> int:
    if isinstance(priority, bool) or not isinstance(priority, int):
        raise ValueError(f"{what}: must be an integer in [{MIN_PRIORITY}, {MAX_PRIORITY}], got {priority!r}")
    if not MIN_PRIORITY <= priority <= MAX_PRIORITY:
        raise ValueError(f"{what}: must be in [{MIN_PRIORITY}, {MAX_PRIORITY}], got {priority}")
    return priority


@dataclass(frozen=True)
class TokenRangeRetentionConfig:
    """Prompt tokens ``[token_start, token_end)`` (``None`` = to the end) get ``priority`` for ``duration_ms``."""

    token_start: int
    token_end: int | None
    priority: int
    duration_ms: int | None = None

    def __init__(self, token_start: int, token_end: int | None, priority: int,
                 duration_ms: timedelta | int | None = None):
        if isinstance(token_start, bool) or not isinstance(token_start, int) or token_start < 0:
            raise ValueError(f"token_start: must be an integer >= 0, got {token_start!r}")
        if token_end is not None and (isinstance(token_end, bool) or not isinstance(token_end, int)
                                      or token_end <= token_start):
            raise ValueError(f"token_end: must be None or an integer > token_start ({token_start}), got {token_end!r}")
        object.__setattr__(self, "token_start", token_start)
        object.__setattr__(self, "token_end", token_end)
        object.__setattr__(self, "priority", _check_priority(priority, "priority"))
        object.__setattr__(self, "duration_ms", _duration_ms(duration_ms, "duration_ms"))


_TokenRange = TokenRangeRetentionConfig  # the nested name below shadows the class inside KvCacheRetentionConfig


class KvCacheRetentionConfig:
    """Per-request retention: prompt token ranges, and a priority/duration for decode blocks."""

    TokenRangeRetentionConfig = TokenRangeRetentionConfig

    def __init__(self, token_range_retention_configs: list[_TokenRange] | None = None,
                 decode_retention_priority: int = DEFAULT_PRIORITY,
                 decode_duration_ms: timedelta | int | None = None,
                 transfer_mode: KvCacheTransferMode | str | int = KvCacheTransferMode.DRAM,
                 directory: str | None = None):
        ranges = sorted(token_range_retention_configs or [], key=lambda r: r.token_start)
        for i, r in enumerate(ranges):
            if not isinstance(r, _TokenRange):
                raise ValueError(f"token_range_retention_configs[{i}]: must be a TokenRangeRetentionConfig")
            if r.token_end is None and i != len(ranges) - 1:
                raise ValueError("token_range_retention_configs: only the last range may have token_end=None")
            if i > 0:
                prev = ranges[i - 1]
                assert prev.token_end is not None  # checked above for every range but the last
                if r.token_start < prev.token_end:
                    raise ValueError(
                        f"token_range_retention_configs: ranges overlap ([{prev.token_start}, {prev.token_end}) and "
                        f"[{r.token_start}, {r.token_end if r.token_end is not None else 'end'}))")
        self.token_range_retention_configs = ranges
        self.decode_retention_priority = _check_priority(decode_retention_priority, "decode_retention_priority")
        self.decode_duration_ms = _duration_ms(decode_duration_ms, "decode_duration_ms")
        self.transfer_mode = parse_transfer_mode(transfer_mode)
        if directory is not None and not isinstance(directory, str):
            raise ValueError(f"directory: must be a path string or None, got {directory!r}")
        # TensorRT-LLM falls back to DRAM when a non-DRAM mode has no directory ("Transfer mode %d specified
        # without directory, falling back to DRAM mode"); the simulator models DRAM only.
        self.directory = directory
        self.file_tier = self.transfer_mode != KvCacheTransferMode.DRAM and bool(directory)

    def not_modelled(self) -> str | None:
        """What the simulator does not model about this config, in one line, or None."""
        if not self.file_tier:
            return None
        return (f"transfer_mode {self.transfer_mode.name} with directory {self.directory!r}: the file tier's copy "
                f"cost is not modelled (its blocks are timed as host-memory copies over PCIe)")

    def per_block(self, tokens_per_block: int, seq_len: int) -> list[tuple[int | None, int | None]]:
        """``getPerBlockRetentionPriorityDuration``: (priority, duration_ms) for each of ceil(seq_len/tpb) blocks.

        Block i starts at token i*tpb and takes the range with start <= i*tpb < end; (None, None) when no range
        covers it (new blocks then get 35, reused blocks keep their priority).
        """
        out: list[tuple[int | None, int | None]] = []
        ranges = self.token_range_retention_configs
        ri = 0
        for start in range(0, seq_len, tokens_per_block):
            while ri < len(ranges):
                end = ranges[ri].token_end
                if end is None or end > start:
                    break
                ri += 1
            if ri < len(ranges) and ranges[ri].token_start <= start:
                out.append((ranges[ri].priority, ranges[ri].duration_ms))
            else:
                out.append((None, None))
        return out

    def __repr__(self) -> str:
        return (f"KvCacheRetentionConfig({self.token_range_retention_configs!r}, "
                f"decode_retention_priority={self.decode_retention_priority}, "
                f"decode_duration_ms={self.decode_duration_ms})")
