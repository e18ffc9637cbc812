"""One tier as three parts that never overlap and add up to its capacity: in use | cached and idle | empty.

TensorRT-LLM's own counts (``kvtop.tiers.TierState``) overlap: on the GPU a running request holds blocks that are
also in the reuse tree (its reused prompt blocks, and its own prompt blocks once ``storeContextBlocks`` has run
after prefill), and ``freeNumBlocks`` ("free": held by no request) counts the cached-but-idle blocks as free too.
So GPU in use + cached + free adds up to more than the pool. This module splits the pool so that it does not:

- ``in_use``: held by a running request (TensorRT-LLM: ``capacity - freeNumBlocks``), exact.
- ``cached_idle``: in the reuse tree and held by no request, i.e. reusable and evictable.
- ``empty``: held by no request and holding nothing reusable.

``cached_idle + empty`` is TensorRT-LLM's "free". The split of "free" needs the number of cached blocks that are
also in use, which neither the stats nor the events give. It has bounds: a held block that is not in the tree
(a decode block, or a prompt block before its request's prefill stored it) lowers cached-and-in-use below
``in_use``. kvtop takes the held blocks as cached first (``cached_idle = cached - in_use``, the lower bound): in
TensorRT-LLM 1.2 every prompt block a request holds is in the tree once its prefill ran, so the blocks it misses
are the few decode blocks of each running request (an 8k-token prompt is 256 blocks, 256 output tokens 8).
Where the bounds differ, ``exact`` is False and the screen marks the split with "≈". When the tree covers the whole
pool (the usual steady state of a busy engine) the bounds meet and the split is exact.
"""

from __future__ import annotations

from typing import Any

from kvtop.values import frozen


@frozen
class Occupancy:
    """A tier's blocks in three parts (``None``: unknown) that add up to ``capacity``."""

    capacity: int | None
    in_use: int | None
    cached_idle: int | None
    empty: int | None
    exact: bool = True             # False: the cached-idle / empty split is an estimate (see the module doc);
    # the cached count itself can also be an upper bound (TierState.cached_approximate), said separately
    # The width of the estimate: the true cached-and-idle count lies in [cached_idle, cached_idle + slack].
    slack: int = 0

    @property
    def free(self) -> int | None:
        """TensorRT-LLM's "free": held by no request (cached and idle, or empty)."""
        if self.capacity is None or self.in_use is None:
            return None
        return self.capacity - self.in_use

    @property
    def known(self) -> bool:
        return self.capacity is not None and self.in_use is not None and self.cached_idle is not None

    def fractions(self) -> tuple[float, float, float] | None:
        if not self.known or not self.capacity:
            return None
        cap = self.capacity
        assert self.in_use is not None and self.cached_idle is not None and self.empty is not None
        return self.in_use / cap, self.cached_idle / cap, self.empty / cap


def occupancy(state: Any) -> Occupancy:
    """The three-part split of a ``TierState`` (anything with ``capacity_blocks``, ``in_use_blocks``,
    ``cached_blocks``, ``free_blocks``, ``cached_approximate``)."""
    cap = state.capacity_blocks
    used = state.in_use_blocks
    cached = state.cached_blocks
    free = state.free_blocks
    if cap is None:
        return Occupancy(None, used, None, None, False)
    if used is None and free is not None:
        used = max(cap - free, 0)
    if used is None:
        return Occupancy(cap, None, None, None, False)
    used = min(max(used, 0), cap)
    free = cap - used
    if cached is None:
        return Occupancy(cap, used, None, None, False)
    cached = min(max(cached, 0), cap)
    low = max(cached - used, 0)          # every held block cached
    high = min(cached, free)             # as few held blocks cached as the counts allow
    idle = low
    return Occupancy(cap, used, idle, free - idle, exact=low == high, slack=high - low)


def cells(parts: tuple[int, ...], total: int, width: int) -> tuple[int, ...]:
    """Cell counts for consecutive parts of ``total`` in a bar ``width`` cells wide: they add up to ``width``
    exactly (each boundary rounded from the running sum, so no part's rounding pushes another out), and a part
    that is not zero gets at least one cell while the others can give one up."""
    if total <= 0 or width <= 0:
        return tuple(0 for _ in parts)
    bounds = []
    acc = 0
    for p in parts:
        acc += p
        bounds.append(round(min(acc, total) / total * width))
    out = [b - a for a, b in zip([0, *bounds[:-1]], bounds)]
    out[-1] += width - sum(out)
    for i, p in enumerate(parts):
        if p > 0 and out[i] == 0:
            donor = max(range(len(out)), key=lambda j: out[j])
            if out[donor] > 1:
                out[donor] -= 1
                out[i] += 1
    return tuple(out)


__all__ = ["Occupancy", "cells", "occupancy"]
