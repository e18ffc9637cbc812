"""The oracle of kvtop/engines/sim/sweep/belady.py: Belady's MIN over the trace's prefix tree, one pass per capacity.

``belady_curve`` answers from one pass of a levelled priority stack (512 tokens a block or more) or one pass per
capacity over the flat references (fewer tokens a block); tests/engines/sim/test_sim_sweep_fast.py holds both to this
one, which is MIN as its definition reads over the tree (on a miss with the cache full, evict the cached leaf whose
next use is farthest, and do not insert a block used later than every candidate). It shipped in the sweep as
``belady_curve(method="tree")`` until issue 25 and ran only in the tests, so it lives here. Its own reference (the
tree's MIN before the dead-suffix skip and the pending parent) is in tests/engines/sim/test_sim_sweep_fast.py.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

from kvtop.engines.inputs import TraceRequest
from kvtop.engines.sim.sweep.belady import Plan, belady_plan


def belady_tree_curve(requests: Sequence[TraceRequest], capacities: Sequence[int], tokens_per_block: int,
                      measure_from: int = 0, as_peer: bool = False) -> list[float]:
    """``belady_curve``'s answer (same arguments) from one ``belady_hits`` pass per capacity over the tree."""
    plan = belady_plan(requests, tokens_per_block, as_peer)
    first = plan.starts[min(measure_from, len(requests))]
    total = sum(plan.weights[first:])
    return [(belady_hits(plan, int(c), first) / total if total else 0.0) for c in capacities]


def belady_hits(plan: Plan, capacity: int, first_measured: int = 0, skip_dead: bool = True) -> int:
    """``skip_dead``: insert nothing from a request's first node that no later request uses on (its descendants on
    the path are not used again either: a later use of one goes through it). The hits stay the same: such a node
    is only ever inserted into free room (on a full cache the bypass keeps it out), and a node with no next use is
    the first leaf evicted (its key is the farthest), so free room and dead nodes together stay the same room for
    the nodes that have a next use, whose set is then the same; the nodes not inserted are most of a trace's misses
    (a request's own suffix), 40% less time (tests/engines/sim/test_sim_sweep_fast.py checks it against
    ``skip_dead=False``)."""
    if capacity <= 0:
        return 0
    nodes, weights, next_use, parent, starts = plan.nodes, plan.weights, plan.next_use, plan.parent, plan.starts
    node_weight = plan.node_weight
    n = len(parent)
    present = bytearray(n)
    present[0] = 1
    children = [0] * n
    key = [0] * n           # the next request using a cached node
    version = [0] * n
    # Leaves by (-next use, node, version), the farthest first, each entry packed in one int (the same order):
    # ((last - next use) << use_shift) | (node << version_bits) | version. Ints compare in C where tuples compared
    # item by item through rich comparison, and a push builds no tuple (a pass at 512 tokens a block: ~25% less).
    # Versions grow by one per push of the node: at most a lookup, an insert and an eviction's parent per reference.
    heap: list[int] = []
    last = len(starts) - 1  # the largest next use: no later request
    version_bits = (3 * len(nodes) + 2).bit_length()
    version_mask = (1 << version_bits) - 1
    use_shift = version_bits + n.bit_length()
    node_mask = (1 << n.bit_length()) - 1
    used = 0
    hits = 0
    never = last if skip_dead else -1
    for r in range(len(starts) - 1):
        a, b = starts[r], starts[r + 1]
        # The one leaf of this request's path (what must not be evicted for it): the path's present nodes are a
        # prefix of it (a node is cached only under its cached parent), each but the deepest the parent of the next.
        # It replaced the set of the path's nodes, built for every request (7% of a pass).
        deepest = 0
        for i in range(a, b):  # lookup: the cached prefix is reused, and its next use moves on
            node = nodes[i]
            if not present[node]:
                break
            deepest = node
            if i >= first_measured:
                hits += weights[i]
            key[node] = next_use[i]
            if children[node] == 0:
                version[node] += 1
                heapq.heappush(heap, ((last - next_use[i]) << use_shift) | (node << version_bits) | version[node])
        for i in range(a, b):  # insert what is missing, evicting the farthest-used leaves not on this path
            if next_use[i] == never:
                break
            node = nodes[i]
            if present[node]:
                continue
            if not present[parent[node]]:
                break
            w = node_weight[node]
            skipped: list[int] = []
            fits = True
            # A parent left a leaf by its child's eviction is held here and pushed with the next pop
            # (heappushpop: push then pop, but O(1) when it is the smallest, as a chain's next link usually is:
            # push + pop of each link of an evicted chain were a third of this loop).
            pending = -1  # none
            while used + w > capacity:
                if pending >= 0:
                    top = heapq.heappushpop(heap, pending)
                    pending = -1
                elif not heap:
                    fits = False
                    break
                else:
                    top = heapq.heappop(heap)
                victim = (top >> version_bits) & node_mask
                if not present[victim] or children[victim] or version[victim] != top & version_mask:
                    continue
                if victim == deepest:
                    skipped.append(top)
                    continue
                if last - (top >> use_shift) <= next_use[i]:  # every leaf is used again sooner: do not insert
                    skipped.append(top)
                    fits = False
                    break
                present[victim] = 0
                used -= node_weight[victim]
                p = parent[victim]
                children[p] -= 1
                if p and present[p] and children[p] == 0:
                    version[p] += 1
                    pending = ((last - key[p]) << use_shift) | (p << version_bits) | version[p]
            if pending >= 0:
                heapq.heappush(heap, pending)
            for item in skipped:
                heapq.heappush(heap, item)
            if not fits:
                break
            present[node] = 1
            deepest = node
            used += w
            key[node] = next_use[i]
            p = parent[node]
            children[p] += 1
            version[node] += 1
            heapq.heappush(heap, ((last - next_use[i]) << use_shift) | (node << version_bits) | version[node])
    return hits
