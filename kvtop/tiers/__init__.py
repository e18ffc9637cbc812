"""The tier model: small folds from kvtop records to the per-tier state a person wants to see.

- :mod:`kvtop.tiers.model`: ``TierModel``, the composer: it routes each record to one of the small folds below and
  builds every reading from them;
- :mod:`kvtop.tiers.events` (TensorRT-LLM's KV cache events, the fast path), :mod:`kvtop.tiers.stats` (iteration
  stats), :mod:`kvtop.tiers.requests` (request records), :mod:`kvtop.tiers.meta` (meta, gpu, host records),
  :mod:`kvtop.tiers.window` (the rate window): the folds, each owning its state and knowing no other fold;
- :mod:`kvtop.tiers.capacity` (the tiers' sizes and occupancy) and :mod:`kvtop.tiers.summary` (the ``--json``
  summary): read from the folds; :mod:`kvtop.tiers.common`: the field checks and the ledger every fold shares;
- :mod:`kvtop.tiers.whatif`: the live what-if (the hit rate with a larger host tier);
- :mod:`kvtop.tiers.state`: the immutable read-side types every sink reads;
- :mod:`kvtop.tiers.snapshot`: ``TierSnapshot``, one immutable reading of a model, published when it changed.

The engines' common KV event stream (vLLM, SGLang, Dynamo), their metrics and agent summaries are folded by
:mod:`kvtop.tiers.stream`, which ``TierModel`` creates on the first such record and hands the folds' counters it
writes (never the model); the wire decoder that makes the ``kv_batch`` records is a source's
(:mod:`kvtop.sources.kv_wire`), and nothing here imports it.

Pure: no I/O, no clock of its own, no Textual; tests/test_layers.py checks that nothing here reaches a source,
a sink or the UI.
"""

from __future__ import annotations

from kvtop.tiers.model import TierModel
from kvtop.tiers.snapshot import TierSnapshot
from kvtop.tiers.state import (
    TIER_LABELS,
    GpuDevice,
    HistoryPoint,
    HitRate,
    HostMemory,
    Latency,
    Moves,
    Quality,
    Rates,
    Requests,
    TierState,
)

__all__ = [
    "GpuDevice",
    "HistoryPoint",
    "HitRate",
    "HostMemory",
    "Latency",
    "Moves",
    "Quality",
    "Rates",
    "Requests",
    "TierModel",
    "TierSnapshot",
    "TIER_LABELS",
    "TierState",
]
