"""Why a block left its tier: evicted (gone), offloaded (a copy lives on in a lower tier), released (freed by its
request), cleared (the engine dropped everything); said by the engine where its events say it, else inferred.

What each engine's events say (read from their own source; docs/engines.md has the table):

- TensorRT-LLM 1.0-1.2 and main (``tensorrt_llm/_utils.py`` ``KVCacheEventSerializer``, read at NVIDIA/TensorRT-LLM
  ed53795b: ``_removed_to_json`` writes ``{"type": "removed", "block_hashes"}``, ``_updated_to_json`` the
  ``cache_level`` and ``priority`` diffs; C++ ``kvCacheManager.cpp``, where ``enqueueRemovedEvent`` is called from
  ``freeChildren`` only): ``removed`` carries only ``block_hashes``, but TensorRT-LLM emits it only when a block
  leaves the reuse tree (``freeChildren`` of an eviction victim), never when a request releases it (released
  blocks stay cached), and an offload is its own event (``updated`` ``cache_level`` 0 -> 1) before the eviction that
  causes it. So the event type says why: ``removed`` = evicted (from the tier the fold holds the block in),
  ``updated`` 0 -> 1 = offloaded. 1.3's ``kvCacheIterationStats`` say it in counters (``iterOffloadBlocks``,
  ``iterHostDroppedBlocks``).
- vLLM 0.33.0 (``vllm/distributed/kv_events.py`` ``BlockRemoved{block_hashes, medium, group_idx, locality,
  ownership}``) and SGLang 0.5.23 (``sglang/srt/disaggregation/kv_events.py`` ``BlockRemoved{block_hashes,
  medium}``) say which tier a block left, not why. kvtop infers it: a block that leaves a tier while a lower tier
  (host, disk, external) holds the same hash was offloaded (vLLM stores the CPU copy before the GPU block is
  evicted; SGLang HiCache backs a node up before it evicts it); otherwise it was evicted. Neither engine removes a
  cached block when a request ends, so the fold never infers "released".
- A ``reason`` field on ``BlockRemoved`` (proposed for SGLang in sgl-project/sglang#39604 / PR #39620, open
  2026-09: capacity eviction, demotion to a lower tier, release, clear) is read where present: the engine says it.
  Its words are mapped onto kvtop's four (``reason_of``); any other word is kept as the engine spelt it (cleaned,
  at most ``MAX_REASONS`` distinct per tier, the rest counted as "other").
- ``AllBlocksCleared`` (vLLM, SGLang): every live block of the source is "cleared", said by the engine.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

REASONS = ("evicted", "offloaded", "released", "cleared")
MAX_REASONS = 16
# an engine's reason word (case-folded) -> kvtop's: the words of sglang PR #39620's table and their obvious kin
_WORDS = (
    ("evict", "evicted"), ("capacity", "evicted"), ("pressure", "evicted"), ("lru", "evicted"),
    ("demot", "offloaded"), ("offload", "offloaded"), ("backup", "offloaded"), ("spill", "offloaded"),
    ("releas", "released"), ("finish", "released"), ("abort", "released"), ("cancel", "released"),
    ("free", "released"), ("clear", "cleared"), ("flush", "cleared"), ("reset", "cleared"),
)
TIER_WORDS = {"gpu": "GPU", "host": "host", "disk": "disk", "external": "external", "unknown": "unknown tier"}


def reason_of(raw: Any) -> str | None:
    """An engine's ``reason`` value as kvtop names it; None for a missing or empty one."""
    if not isinstance(raw, str):
        return None
    from kvtop.textsafe import clean

    text = clean(raw.strip()[:40], None).lower()
    if not text:
        return None
    for stem, reason in _WORDS:
        if stem in text:
            return reason
    return text


def add(counts: dict[str, dict[str, int]], tier: str, reason: str, n: int = 1) -> None:
    """Count ``n`` blocks that left ``tier`` for ``reason`` (distinct reasons per tier bounded)."""
    per = counts.get(tier)
    if per is None:
        per = counts[tier] = {}
    if reason not in per and reason not in REASONS and len(per) >= MAX_REASONS:
        reason = "other"
    per[reason] = per.get(reason, 0) + n


def nonzero(counts: Mapping[str, Mapping[str, int]]) -> dict[str, dict[str, int]]:
    """A copy without the zero counts and the tiers left empty (what the summary and the screen show)."""
    out: dict[str, dict[str, int]] = {}
    for tier, per in counts.items():
        kept = {r: n for r, n in per.items() if n}
        if kept:
            out[tier] = kept
    return out


def trtllm_said(offloaded: int, evicted_gpu: int, evicted_host: int, evicted_unknown: int) -> dict[str, dict[str, int]]:
    """TensorRT-LLM's moves as reasons its events (or 1.3's counters) state: see the module doc."""
    return nonzero({"gpu": {"evicted": evicted_gpu, "offloaded": offloaded}, "host": {"evicted": evicted_host},
                    "unknown": {"evicted": evicted_unknown}})


def describe(said: Mapping[str, Mapping[str, int]], inferred: Mapping[str, Mapping[str, int]]) -> str | None:
    """One line for the screen and the text summary: ``GPU evicted 3, offloaded 5 (inferred); host evicted 1
    (engine)``; None when no block left any tier. Every count says whether the engine said it or kvtop inferred it."""
    parts: list[str] = []
    order = list(TIER_WORDS)
    for tier in order + sorted((set(said) | set(inferred)) - set(order)):
        items: list[str] = []
        for basis, counts in (("engine", said), ("inferred", inferred)):
            per = counts.get(tier) or {}
            words = [f"{reason} {n:,}" for reason, n in sorted(per.items(), key=lambda kv: (-kv[1], kv[0])) if n]
            if words:
                items.append(f"{', '.join(words)} ({basis})")
        if items:
            parts.append(f"{TIER_WORDS.get(tier, tier)} {'; '.join(items)}")
    return " | ".join(parts) if parts else None


__all__ = ["MAX_REASONS", "REASONS", "add", "describe", "nonzero", "reason_of", "trtllm_said"]
