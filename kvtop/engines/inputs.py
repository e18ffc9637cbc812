"""What an engine is asked to do, in kvtop's engine-neutral terms: retention specs and hash-block prompts.

The workload driver builds these and every engine consumes them (the TensorRT-LLM builder turns a RetentionSpec into
``KvCacheRetentionConfig``; the simulator's trace replay reads TraceRequests). They live here, below both, so that
engines never import the workload (tests/test_layers.py); kvtop.workload re-exports them under their old names.
"""

from __future__ import annotations

from dataclasses import dataclass, field

# Mooncake traces hash prompts in blocks of 512 tokens (the FAST'25 trace release; kvtop/workload/trace.py).
TRACE_BLOCK_TOKENS = 512


@dataclass
class RetentionSpec:
    """Engine-independent retention: the driver turns it into the engine's KvCacheRetentionConfig."""

    ranges: list[tuple[int, int | None, int, int | None]] = field(default_factory=list)  # start, end, prio, ms
    decode_priority: int = 35
    decode_duration_ms: int | None = None

    @property
    def priority(self) -> int:
        """The priority a person would name this request by: its first range's, else the default."""
        return self.ranges[0][2] if self.ranges else 35

    def is_default(self) -> bool:
        return not self.ranges and self.decode_priority == 35 and self.decode_duration_ms is None


@dataclass(frozen=True)
class TraceRequest:
    line: int
    timestamp_ms: float
    input_length: int
    output_length: int
    hash_ids: tuple[int, ...]

    def prompt_ids(self) -> list[int]:
        ids: list[int] = []
        for first, length in self.prompt_runs():
            ids.extend(range(first, first + length))  # C-speed: 15k tokens in ~0.1 ms
        return ids

    def prompt_runs(self) -> list[tuple[int, int]]:
        """The prompt as runs of consecutive token ids, ``[(first_id, length), ...]``: ``prompt_ids()`` is their
        concatenation. One run per hash block (the last one cut to ``input_length``), plus the request's unique
        tail when the hash ids cover fewer tokens than ``input_length``."""
        runs: list[tuple[int, int]] = []
        remaining = self.input_length
        for h in self.hash_ids:
            if remaining <= 0:
                break
            length = min(TRACE_BLOCK_TOKENS, remaining)
            runs.append((h * TRACE_BLOCK_TOKENS, length))
            remaining -= length
        if remaining > 0:
            # A trace whose hash ids cover fewer tokens than input_length: the tail is unique to the request.
            # Negative ids, 2^24 apart per line: never a trace token (>= 0) nor a generated one (>= 2^30), and no
            # two requests' tails overlap (the simulator keeps ids as signed 64-bit integers).
            runs.append((-((self.line + 1) << 24), remaining))
        return runs
