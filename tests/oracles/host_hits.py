"""The oracle of kvtop/stack_distance.py's one-pass host counts (``host_hits_python``, ``host_hits_numpy``): each
host size counted on its own, one Fenwick-tree pass per size, as the one-pass curve counted before its one walk
over all sizes (commit 7293152). tests/engines/sim/test_sim_sweep_fast.py holds the walk to it; ``Fenwick`` shipped in
kvtop/engines/sim/sweep.py until issue 25 and only this count used it, so both live here.
"""

from __future__ import annotations


class Fenwick:
    """Counts of points over [0, n), prefix counts in O(log n)."""

    __slots__ = ("n", "tree")

    def __init__(self, n: int):
        self.n = n
        self.tree = [0] * (n + 1)

    def add(self, i: int) -> None:
        i += 1
        tree, n = self.tree, self.n
        while i <= n:
            tree[i] += 1
            i += i & -i

    def below(self, i: int) -> int:
        """How many points are < i."""
        tree = self.tree
        total = 0
        while i > 0:
            total += tree[i]
            i -= i & -i
        return total


def per_size_host_hits(onboards: list[tuple[int, int, int]], request_starts: list[int], size: int,
                       in_front_max: list[int]) -> int:
    """Host hits a tier of ``size`` slots would have had. A block offloaded at count s and onboarded at count S
    survived iff (S - s) + (onboards, hits at this size, of blocks offloaded before s and onboarded after it) < size:
    each offload takes the front slot, each such onboard one in front of it. Reuse stops at a prompt's first miss.

    Most onboards are decided by bounds: a miss when S - s >= size, a hit when S - s + ``in_front_max`` < size (the
    count at the largest size, where every onboard is a hit). The others count the hits (or, when most onboards are
    hits, the misses) of this size so far, whichever is the smaller set to keep."""
    if size <= 0:
        return 0
    n = max((now for _, _, now in onboards), default=0) + 2
    few_hits = sum(1 for since, _, _ in onboards if since < size) < len(onboards) // 2
    kept_offloaded, kept_onboarded = Fenwick(n), Fenwick(n)  # the hits so far if few_hits, else misses
    hits = 0
    starts = request_starts + [len(onboards)]
    for r in range(len(request_starts)):
        alive = True
        for i in range(starts[r], starts[r + 1]):
            since, seq, now = onboards[i]
            if alive:
                if since >= size:
                    alive = False
                elif since + in_front_max[i] >= size:
                    kept = kept_offloaded.below(seq) - kept_onboarded.below(seq)
                    alive = since + (kept if few_hits else in_front_max[i] - kept) < size
            if alive:
                hits += 1
            if alive == few_hits:
                kept_offloaded.add(seq)
                kept_onboarded.add(now)
    return hits
