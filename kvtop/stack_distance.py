"""Stack distances over a block stream: how many hits a cache of each size would have had, from one pass.

Shared by the trace sweeps (``kvtop.engines.sim.sweep``: ``host_curve``, ``belady_curve``) and the live size advice
(``kvtop.tiers.sizeadvice``), which give them the onboards and lookups of a replay or of a run's KV events. No
engine, no trace: lists of ints in, counts out (numpy imported only where a count pays for it), so that a fold can
use them without loading the simulator.

- ``host_hits_at``: the host hits a host tier of each size would have had, from each onboard's place in the host
  FIFO (``host_hits_python``, or ``host_hits_numpy`` from ``NUMPY_FROM_ONBOARDS`` onboards;
  tests/engines/sim/test_sim_sweep_fast.py holds both to one Fenwick-tree pass per size, tests/oracles/host_hits.py).
- ``min_hits_at``: Belady's MIN for every cache size in one pass of the priority stack cut into levels
  (``next_uses``, ``min_levels``; the argument is in kvtop/engines/sim/sweep/belady.py's "Belady, every size in one
  pass").
"""

from __future__ import annotations

import gc
import heapq
from bisect import bisect_left, bisect_right, insort
from collections import Counter
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

__all__ = ["NUMPY_FROM_ONBOARDS", "earlier_smaller", "host_hits_at", "host_hits_numpy", "host_hits_python",
           "in_front_at_largest", "min_hits_at", "min_levels", "next_uses", "no_gc"]


@contextmanager
def no_gc() -> Iterator[None]:
    """The cyclic collector walked every live key and block again and again (13% of a replay, offline.py)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


# numpy's import (~0.09 s on the dev box) against the Python counts: the Mooncake trace onboards 5,038 blocks at 512
# tokens a block (Python: 0.025 s for 15 sizes) and 82k at 32 (Python: 1.5 s, numpy 0.2)
NUMPY_FROM_ONBOARDS = 20_000


def host_hits_python(onboards: list[tuple[int, int, int]], request_starts: list[int],
                      sizes: Sequence[int]) -> dict[int, int]:
    """Host hits a tier of each size would have had. A block offloaded at count s and onboarded at count S survived
    iff (S - s) + (onboards, hits at this size, of blocks offloaded before s and onboarded after it) < size: each
    offload takes the front slot, each such onboard one in front of it. Reuse stops at a prompt's first miss.

    All sizes in one walk, each onboard's outcome a bit mask over the sorted sizes (bit k: a hit at the k-th). Most
    outcomes are decided by bounds: a miss at the sizes <= S - s (those bits of the request cleared for good), a hit
    at the sizes > S - s + ``in_front_max`` (the count at the largest size, where every onboard is a hit): those
    are two bisections per onboard. The sizes in between count the hits at that size among the onboards in front
    (``[lo, i)``: onboards come in onboard-count order, ``lo`` the first onboarded at or after this block's offload,
    of blocks offloaded before it). One walk replaced one Fenwick-tree pass per size (5,038 onboards, 15 sizes:
    ~0.085 -> ~0.025 s; tests/engines/sim/test_sim_sweep_fast.py holds it to that pass)."""
    order = sorted(set(sizes))
    n = len(onboards)
    in_front_max = in_front_at_largest(onboards)
    onboarded_at = [now for _, _, now in onboards]
    offloaded_at = [seq for _, seq, _ in onboards]
    outcome = [0] * n
    starts = request_starts + [n]
    every = (1 << len(order)) - 1
    for r in range(len(request_starts)):
        alive = every
        for i in range(starts[r], starts[r + 1]):
            since, seq, _ = onboards[i]
            alive &= -1 << bisect_right(order, since)  # a miss at the sizes <= since, and so the rest of the prompt
            if not alive:
                break
            undecided = alive & ((1 << bisect_right(order, since + in_front_max[i])) - 1)
            if undecided:
                in_front = [outcome[j] for j in range(bisect_left(onboarded_at, seq), i) if offloaded_at[j] < seq]
                k = 0
                while undecided:
                    if undecided & 1 and since + sum(x >> k & 1 for x in in_front) >= order[k]:
                        alive &= ~(1 << k)
                    undecided >>= 1
                    k += 1
                if not alive:
                    break
            outcome[i] = alive
    counts = [0] * len(order)
    for mask, times in Counter(outcome).items():  # few distinct masks: mostly the sizes from one on
        k = 0
        while mask:
            if mask & 1:
                counts[k] += times
            mask >>= 1
            k += 1
    by_size = dict(zip(order, counts))
    return {h: by_size[h] for h in sizes}


def in_front_at_largest(onboards: list[tuple[int, int, int]]) -> list[int]:
    """Per onboard: the onboards before it, of blocks offloaded before it and onboarded after it was offloaded (slots
    freed in front of it), at the largest size, where every onboard is a hit: a bound for every smaller size.

    Those are the earlier onboards offloaded before it (a sorted list of their offload counts, ``insort``), less those
    onboarded before its offload (onboard counts never fall: a bisection of them all). The sorted list's insertions
    move only the offload counts above this one's, which are within the host tier's size of the newest (the block
    was offloaded fewer than that many offloads ago): the Mooncake trace's 5,038 onboards at 512 tokens a block, 20.8 ->
    5.0 ms against the two Fenwick trees it replaced (in one process, best of 25;
    tests/engines/sim/test_sim_sweep_fast.py holds it to the definition)."""
    onboarded_at = [now for _, _, now in onboards]
    offloaded_before: list[int] = []
    out = []
    for _, seq, _ in onboards:
        # offload count < seq, less those onboarded before seq too (onboard count < seq: offloaded before it; none
        # later than this onboard has an onboard count < seq, so the whole list is bisected)
        out.append(bisect_left(offloaded_before, seq) - bisect_left(onboarded_at, seq))
        insort(offloaded_before, seq)
    return out


def earlier_smaller(values: Any) -> Any:
    """``out[i] = #{j < i: values[j] < values[i]}`` for distinct values (numpy), one pass per bit of their ranks:
    at bit b the indices stand sorted by (rank >> (b + 1), index), and within each such group an index whose bit b
    is 1 counts the indices before it whose bit is 0 (they agree on the higher bits and are smaller at b). What
    ``in_front_at_largest`` counts one index at a time (82k onboards: 0.25 s with the Fenwick trees it used then;
    ~20 ms)."""
    import numpy as np

    n = len(values)
    out = np.zeros(n, np.int64)
    if n < 2:
        return out
    rank = np.empty(n, np.int64)
    rank[np.argsort(values, kind="stable")] = np.arange(n)
    order = np.arange(n)
    positions = np.arange(n)
    for b in range((n - 1).bit_length() - 1, -1, -1):
        r = rank[order]
        group = r >> (b + 1)
        one = ((r >> b) & 1).astype(bool)
        zeros_before = np.cumsum(~one) - ~one  # zeros at earlier positions, all groups
        new_group = np.empty(n, bool)
        new_group[0] = True
        np.not_equal(group[1:], group[:-1], out=new_group[1:])
        group_start = np.maximum.accumulate(np.where(new_group, positions, 0))
        in_group = zeros_before - zeros_before[group_start]
        out[order[one]] += in_group[one]
        order = order[np.argsort(r >> b, kind="stable")]  # sorted by one more bit, index order kept in ties
    return out


def host_hits_numpy(onboards: list[tuple[int, int, int]], request_starts: list[int],
                     sizes: Sequence[int]) -> dict[int, int]:
    """``host_hits_python``'s counts with numpy. Per size, the onboards that bounds decide (a miss when
    S - s >= size, a hit when S - s + in_front_max < size, and what a prompt's first miss decides after it) are
    counted at once; the rest, in requests whose first undecided onboard is neither, are walked in order, each
    counting the hits among the onboards before it whose block was offloaded before its own and onboarded after
    (those stand in ``[lo, i)``: onboards come in offload-count order, and ``lo`` is the first onboarded at or
    after this block's offload)."""
    import numpy as np

    out: dict[int, int] = {}
    n = len(onboards)
    if n == 0:
        return {h: 0 for h in sizes}
    table = np.array(onboards, dtype=np.int64).reshape(n, 3)
    since, seq, now = table[:, 0], table[:, 1], table[:, 2]
    lo = np.searchsorted(now, seq, side="left")
    in_front_max = earlier_smaller(seq) - lo
    starts = np.array(request_starts + [n], dtype=np.int64)
    start_of = np.repeat(starts[:-1], np.diff(starts))  # per onboard: its request's first onboard
    end_of = np.repeat(starts[1:], np.diff(starts))
    since_l, seq_l, lo_l, front_l, end_l = (since.tolist(), seq.tolist(), lo.tolist(), in_front_max.tolist(),
                                            end_of.tolist())
    for size in sizes:
        if size <= 0:
            out[size] = 0
            continue
        sure_hit = since + in_front_max < size
        undecided = ~sure_hit
        before = np.cumsum(undecided) - undecided
        first_in_request = undecided & (before == before[start_of])  # a request's first not-sure onboard
        alive = sure_hit & (before == before[start_of])  # final, but for the walked onboards below
        for i in np.flatnonzero(first_in_request & (since < size)).tolist():
            for k in range(i, end_l[i]):
                s = since_l[k]
                if s >= size:
                    break
                if s + front_l[k] >= size:
                    a = lo_l[k]
                    if s + int(np.count_nonzero(alive[a:k] & (seq[a:k] < seq_l[k]))) >= size:
                        break
                alive[k] = True
        out[size] = int(np.count_nonzero(alive))
    return out


def next_uses(nodes: list[int], node_count: int) -> tuple[list[int], list[int]]:
    """Per reference, its heap entry, a small int ordering its node's next use (the farthest the smallest):
    ``node_count + len(nodes) - j`` where the node's next reference is ``j``, the node itself where there is none
    (below every entry that has one, the nodes among them in order); and ``who``, the node of an entry
    (``who[entry]``). Entries stay below 2**30, one CPython digit, so the passes' compares take the interpreter's
    int fast path, where the entries packed as ``(n - next use) << shift | node`` (two digits) went through rich
    comparison and the node came back by a mask: 15% fewer instructions in ``min_levels``."""
    n = len(nodes)
    who = list(range(node_count))  # no next use: the entry is the node
    ahead = who[:]  # per node, walking back: the entry of its next reference (a copy: no second 0..node_count)
    entries: list[int] = []
    note = entries.append
    for x, entry in zip(reversed(nodes), range(node_count + 1, node_count + n + 1)):  # reference n - 1, n - 2, ...
        note(ahead[x])
        ahead[x] = entry
    entries.reverse()
    who.append(-1)                 # node_count + n - n: no reference
    who += nodes[:0:-1]            # node_count + n - j: the node of reference j
    return entries, who


def min_levels(nodes: list[int], entries: list[int], who: list[int], sizes: list[int], node_count: int,
                counted: list[int]) -> list[int]:
    """Per level k (1 to ``len(sizes)``), what the references hitting at it count (``counted``, per reference): a
    hit at level k is one for ``sizes[k - 1]`` and every larger size (index 0: 0). Belady's MIN for every size of
    ``sizes`` (sorted, distinct, > 0) in one pass of the priority stack cut into levels (see above). ``entries`` and
    ``who`` as ``next_uses`` gives them: a heap's smallest entry is the farthest used; one below ``node_count``
    has no next use."""
    count = len(sizes)
    no_next = node_count
    level = [0] * node_count
    room = [0] + [sizes[0]] + [sizes[k] - sizes[k - 1] for k in range(1, count)]
    heaps: list[list[int]] = [[] for _ in range(count + 1)]
    hits = [0] * (count + 1)
    push, pushpop = heapq.heappush, heapq.heappushpop
    top_heap = heaps[1]
    n = len(nodes)
    i = 0
    placed = 0
    # Filling: the stack grows at the bottom (a carried entry that reaches a level with room stays there), until
    # every level is full; from then on no level has room and the walk below needs no check.
    while i < n and placed < sizes[-1]:
        x, c = nodes[i], entries[i]
        at = level[x]
        hits[at] += counted[i]
        i += 1
        if at == 1:
            push(top_heap, c)  # the entry with its old next use stays behind: below every live one, never a top
            continue
        if at == 0 and c < no_next:
            continue
        for k in range(1, at if at else count + 1):
            if room[k]:
                room[k] -= 1
                push(heaps[k], c)
                level[who[c]] = k
                placed += 1
                c = -1
                break
            h = heaps[k]
            if h[0] < c:  # this level's farthest is used later than the carried entry: they swap
                c, carried = pushpop(h, c), c
                level[who[carried]] = k
        if c >= 0:
            if at:
                push(heaps[at], c)
                level[who[c]] = at
            else:
                level[who[c]] = 0
    # The walk proper. Level 1 (the smallest cache) apart: a walk past it goes on only where the carried entry is
    # used no later than ``low``, a bound below every entry of levels 2 and down: swaps only raise a level's
    # farthest entry, an entry pushed into a level lowers the bound to it, and a miss's walk to the bottom leaves
    # with the farthest of them all, below every entry left. Of the Mooncake trace's 36k misses walked, 17k swap at
    # most at level 1 (7.6k nowhere): the bound spares them 15 levels' checks.
    deeper = heaps[2:]
    above = [deeper[:k - 2] for k in range(count + 1)]  # levels 2 to k - 1
    low = min([h[0] for h in deeper if h], default=0)  # (empty: the trace ended while filling)
    ones = 0
    for x, c, w in zip(nodes[i:], entries[i:], counted[i:]):
        at = level[x]
        if at == 0:
            if c < no_next:  # not cached anywhere and no next use: bypassed at every size
                continue
            if top_heap[0] < c:
                t = pushpop(top_heap, c)
                level[who[c]] = 1
                c = t
            if c >= low:
                for h in deeper:
                    if h[0] < c:  # this level's farthest is used later than the carried entry: they swap
                        t = pushpop(h, c)
                        level[who[c]] = level[who[t]]
                        c = t
                low = c
            level[who[c]] = 0  # the farthest of the largest cache and x: out of them all
            continue
        if at == 1:
            ones += w
            push(top_heap, c)
            continue
        hits[at] += w
        if c >= no_next:  # with no next use, x is used later than everything: it swaps nowhere
            if top_heap[0] < c:
                t = pushpop(top_heap, c)
                level[who[c]] = 1
                c = t
            if c >= low:
                for h in above[at]:
                    if h[0] < c:
                        t = pushpop(h, c)
                        level[who[c]] = level[who[t]]
                        c = t
        push(heaps[at], c)
        level[who[c]] = at
        if c < low:
            low = c
    hits[1] += ones
    hits[0] = 0
    return hits



def host_hits_at(onboards: list[tuple[int, int, int]], request_starts: list[int], sizes: Sequence[int]
                 ) -> dict[int, int]:
    """Host hits a host tier of each size (in blocks) would have had, from the onboards of a run at a larger size:
    per onboard ``(offloads since the block's own offload, the offload count at its offload, at its onboard)``, in
    onboard order, and where each request's onboards start (reuse stops at a prompt's first miss). What
    ``host_curve`` counts after its replay; ``kvtop.tiers.sizeadvice`` gives it the onboards a live run's KV events
    show. numpy from ``NUMPY_FROM_ONBOARDS`` onboards, where it pays for its import."""
    count = host_hits_numpy if len(onboards) >= NUMPY_FROM_ONBOARDS else host_hits_python
    return count(onboards, request_starts, sizes)


def min_hits_at(references: Sequence[Any], sizes: Sequence[int]) -> dict[int, int]:
    """Belady's MIN: the hits of a cache of each size (in blocks, one unit of room each) over ``references`` (any
    hashable names, one per block looked up, in order; a prefix tree's blocks named by their whole prefix, as KV
    block hashes are), from one pass of ``min_levels``. What ``belady_curve`` counts over a trace's blocks;
    ``kvtop.tiers.sizeadvice`` gives it the blocks a live run's KV events show."""
    order = sorted(set(int(s) for s in sizes if int(s) > 0))
    out = {int(s): 0 for s in sizes}
    if not order or not references:
        return out
    # dense node ids 0..n-1 in order of first reference (``next_uses`` sizes its lists by the node count)
    dense: dict[Any, int] = {}
    nodes = [dense.setdefault(x, len(dense)) for x in references]
    node_count = len(dense)
    with no_gc():
        entries, who = next_uses(nodes, node_count)
        by_level = min_levels(nodes, entries, who, order, node_count, [1] * len(nodes))
    running = 0
    for k, size in enumerate(order):
        running += by_level[k + 1]
        out[size] = running
    return out
