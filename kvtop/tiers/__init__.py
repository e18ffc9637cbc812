"""The tier model: small folds from kvtop records to the per-tier state a person wants to see.

- :mod:`kvtop.tiers.model`: ``TierModel``, the fold of TensorRT-LLM's stats, KV events and requests (the fast path);
- :mod:`kvtop.tiers.whatif`: the live what-if (the hit rate with a larger host tier);
- :mod:`kvtop.tiers.state`: the immutable read-side types every sink reads;
- :mod:`kvtop.tiers.snapshot`: ``TierSnapshot``, one immutable reading of a model, published when it changed.

The engines' common KV event stream (vLLM, SGLang, Dynamo), their metrics and agent summaries are folded by
:mod:`kvtop.kv_stream` (its wire decoder and its fold, one module), which ``TierModel`` creates on the first such
record.

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
