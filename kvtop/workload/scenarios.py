"""Workload scenarios: what prompts the driver sends, sized to the engine's GPU pool so that tiers get busy.

Every scenario is deterministic in its seed. Prompts are token id lists (ids in [1, 150000), below every
supported vocabulary); a scenario learns each answer through ``on_result`` (multi-turn chats grow with them).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from kvtop.engines.inputs import RetentionSpec, TraceRequest

VOCAB_LIMIT = 150_000


@dataclass
class WorkItem:
    prompt_ids: Sequence[int]   # a list, or a trace prompt's TokenRuns (the driver makes it a list for an engine
                                # that does not take one)
    max_tokens: int
    retention: RetentionSpec
    label: str
    arrival_s: float | None = None   # open-loop arrival offset (traces); None = as the driver paces
    key: Any = None                  # scenario state (e.g. the chat session)


class Scenario:
    name = "scenario"
    timed = False  # True: every item carries its arrival time, and the driver sends it then (open loop)

    def __init__(self, capacity_tokens: int, max_tokens: int, seed: int = 0,
                 base_retention: RetentionSpec | None = None, max_prompt_tokens: int = 32768):
        self.pool_tokens = capacity_tokens          # the GPU pool as it is (ab sizes its prompts to it)
        self.capacity_tokens = max(capacity_tokens, 1024)
        self.max_tokens = max_tokens
        self.rng = random.Random(seed)
        self.base_retention = base_retention or RetentionSpec()
        self.max_prompt_tokens = max_prompt_tokens

    def tokens(self, n: int) -> list[int]:
        r = self.rng.randrange
        return [r(1, VOCAB_LIMIT) for _ in range(n)]

    def next(self) -> WorkItem | None:
        raise NotImplementedError

    def on_result(self, item: WorkItem, output_ids: list[int] | None) -> None:
        """The engine's answer (None when the request failed)."""


# The A/B demo's prompt when kvtop sizes the GPU pool for it (runner: --scenario ab with no pool given). TensorRT-LLM's
# example has 230 tokens, whose prefill (~5 ms for Qwen3-8B on the simulated H200) is hardly longer than their onboard:
# a presenter could not show the gain. At ~4,100 tokens (131 blocks of 32 with the 64 answer tokens) a miss's TTFT is
# 92 ms and a host hit's, which onboards 128 blocks (0.6 GB over PCIe), 18 ms, on the simulated H200 with Qwen3-8B
# (kvtop --engine sim --scenario ab --host-cache 10GB; tests/commands/test_cli.py holds the gap above 40 ms).
AB_PROMPT_TOKENS = 4096


def ab_pool_tokens(max_tokens: int, tokens_per_block: int, prompt_tokens: int = AB_PROMPT_TOKENS) -> int:
    """The GPU pool (tokens, whole blocks) that one A/B prompt of about ``prompt_tokens`` and its answer fill
    exactly, as the example's 256-token pool is filled by its 230 + 16 tokens: B then evicts every block of A."""
    tpb = max(tokens_per_block, 1)
    return -(-(prompt_tokens + max_tokens + tpb // 2) // tpb) * tpb


class AbScenario(Scenario):
    """TensorRT-LLM's offloading example: prompts A, B, A, B... each with its answer filling the whole GPU pool (the
    example: 230 + 16 tokens of a 256-token pool), so B evicts all of A (offloaded to host when there is one, else
    dropped: 0 blocks reused) and A's return onboards it."""

    name = "ab"

    def __init__(self, *args: Any, tokens_per_block: int = 32, **kwargs: Any):
        super().__init__(*args, **kwargs)
        # The pool as it is (not the 1,024-token floor the other scenarios size from), less the answer and half a
        # block: prompt + answer end inside the pool's last block. 60% of the pool (as before) left a block of A on
        # the GPU for B's turn: 18% reuse without a host tier, where the example reuses 0 blocks.
        pool = self.pool_tokens if self.pool_tokens > 0 else self.capacity_tokens
        n = max(min(pool - self.max_tokens - max(tokens_per_block, 1) // 2,
                    self.max_prompt_tokens - self.max_tokens), 1)
        self.docs = [self.tokens(n), self.tokens(n)]
        self.i = 0

    def next(self) -> WorkItem:
        which = self.i % 2
        self.i += 1
        return WorkItem(list(self.docs[which]), self.max_tokens, self.base_retention, "AB"[which])


class SystemPromptScenario(Scenario):
    """A long shared system prompt at high priority (90, never lapsing), unique user turns at the default."""

    name = "system-prompt"

    def __init__(self, *args: Any, system_tokens: int | None = None, system_priority: int = 90, **kwargs: Any):
        super().__init__(*args, **kwargs)
        n = system_tokens or min(max(self.capacity_tokens // 8, 1024), 8192)
        self.system = self.tokens(n)
        base = self.base_retention
        ranges = base.ranges or [(0, n, system_priority, None)]
        self.retention = RetentionSpec(ranges, base.decode_priority, base.decode_duration_ms)

    def next(self) -> WorkItem:
        user = self.tokens(self.rng.randint(128, 1024))
        return WorkItem(self.system + user, self.max_tokens, self.retention, "system+user")


class MultiTurnScenario(Scenario):
    """Chat sessions whose context grows by each answer and a new user turn. Enough sessions that their
    contexts together are about 3x the GPU pool: the GPU cannot keep them all, the host tier catches some."""

    name = "multi-turn"

    def __init__(self, *args: Any, sessions: int | None = None, max_turns: int = 12, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.turn_tokens = 384
        self.max_turns = max_turns
        mean_context = (self.turn_tokens + self.max_tokens) * max_turns / 2 + 2048
        self.num_sessions = sessions or max(4, min(256, int(3 * self.capacity_tokens / mean_context)))
        self.histories: list[list[int] | None] = [None] * self.num_sessions
        self.turns = [0] * self.num_sessions
        self.busy: set[int] = set()

    def next(self) -> WorkItem | None:
        free = [s for s in range(self.num_sessions) if s not in self.busy]
        if not free:
            return None
        s = self.rng.choice(free)
        history = self.histories[s]
        if history is None or self.turns[s] >= self.max_turns:
            history = self.tokens(self.rng.randint(1024, 3072))  # a new chat: its own system/context prompt
            self.turns[s] = 0
        prompt = history + self.tokens(self.rng.randint(self.turn_tokens // 2, self.turn_tokens))
        if len(prompt) + self.max_tokens > self.max_prompt_tokens:
            prompt = self.tokens(2048)
            self.turns[s] = 0
        self.busy.add(s)
        return WorkItem(prompt, self.max_tokens, self.base_retention, f"chat {s}", key=s)

    def on_result(self, item: WorkItem, output_ids: list[int] | None) -> None:
        s = item.key
        self.busy.discard(s)
        if output_ids is None:
            self.histories[s] = None
            return
        self.histories[s] = [*item.prompt_ids, *output_ids]
        self.turns[s] += 1


class ZipfScenario(Scenario):
    """Popular documents: a pool of long prefixes picked by a Zipf law (s = 1.1), each followed by a short
    unique question. The pool is about 4x the GPU pool, so the popular head stays on GPU and the tail moves."""

    name = "zipf"

    def __init__(self, *args: Any, s: float = 1.1, **kwargs: Any):
        super().__init__(*args, **kwargs)
        doc_len = (2048, 6144)
        mean = sum(doc_len) / 2
        n_docs = max(8, min(512, int(4 * self.capacity_tokens / mean)))
        self.docs = [self.tokens(self.rng.randint(*doc_len)) for _ in range(n_docs)]
        weights = [1.0 / (i + 1) ** s for i in range(n_docs)]
        total = sum(weights)
        self.cdf: list[float] = []
        acc = 0.0
        for w in weights:
            acc += w / total
            self.cdf.append(acc)

    def next(self) -> WorkItem:
        u = self.rng.random()
        lo, hi = 0, len(self.cdf) - 1
        while lo < hi:
            mid = (lo + hi) // 2
            if self.cdf[mid] < u:
                lo = mid + 1
            else:
                hi = mid
        return WorkItem(self.docs[lo] + self.tokens(64), self.max_tokens, self.base_retention, f"doc {lo}")


class TraceScenario(Scenario):
    """A Mooncake trace, replayed at its own arrival times (divided by ``time_scale``)."""

    name = "trace"
    timed = True

    def __init__(self, *args: Any, requests: list[TraceRequest], time_scale: float = 1.0, **kwargs: Any):
        super().__init__(*args, **kwargs)
        from kvtop.engines.sim.block_manager import TokenRuns  # here: the simulator is not imported for a scenario

        self.requests = requests
        self.time_scale = time_scale
        self.i = 0
        self._runs = TokenRuns

    def next(self) -> WorkItem | None:
        if self.i >= len(self.requests):
            return None
        r = self.requests[self.i]
        self.i += 1
        # As runs (TokenRuns), not a list of ~14k ints a prompt: a trace's requests all arrive within a second at
        # --trace-time-scale 1000, and their lists (three copies each on the way into the simulator) were what the
        # garbage collector walked, again and again, for most of a driven replay's CPU (bench/JOURNAL.md "The
        # driven path's fold").
        return WorkItem(self._runs(r.prompt_runs()), r.output_length, self.base_retention, f"trace line {r.line}",
                        arrival_s=r.timestamp_ms / 1000.0 / self.time_scale)


SCENARIOS: dict[str, Callable[..., Scenario]] = {
    "ab": AbScenario,
    "system-prompt": SystemPromptScenario,
    "multi-turn": MultiTurnScenario,
    "zipf": ZipfScenario,
    "trace": TraceScenario,
}


def make_scenario(name: str, **kwargs: Any) -> Scenario:
    try:
        factory = SCENARIOS[name]
    except KeyError:
        raise ValueError(f"unknown scenario {name!r}; choose one of {', '.join(SCENARIOS)}") from None
    return factory(**kwargs)
