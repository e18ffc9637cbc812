"""Belady's MIN over a trace (``kvtop sim --belady``): the offline optimum for a cache of GPU + host blocks (the
package docstring says what it bounds). ``belady_curve`` answers every capacity: from one pass of a priority stack
where every trace block takes one unit of room, else one flat pass per capacity. MIN over the prefix tree itself,
the reference both are held to, runs only in the tests (tests/oracles/belady_tree.py)."""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections.abc import Sequence
from typing import Any

from kvtop.engines.inputs import TRACE_BLOCK_TOKENS, TraceRequest
from kvtop.stack_distance import min_levels as _min_levels
from kvtop.stack_distance import next_uses as _next_uses
from kvtop.stack_distance import no_gc as _no_gc
from kvtop.values import mutable


@mutable  # kvtop.values: no code compiled at import
class Plan:
    nodes: list[int]        # per reference (request order, prompt order): its prefix-tree node
    weights: list[int]      # what a hit on it counts: its KV blocks
    next_use: list[int]     # per reference: the next request using the node (len(requests) if none)
    parent: list[int]       # per node
    node_weight: list[int]  # per node: the cache room it takes, in KV blocks
    starts: list[int]       # per request: its first reference


def belady_plan(requests: Sequence[TraceRequest], tokens_per_block: int, as_peer: bool = False) -> Plan:
    """``as_peer``: kvcache-simulator's units (a trace block is a node whatever its length, takes one unit of room,
    and a hit counts its tokens), for the cross-check against it."""
    edges: dict[tuple[int, int, int], int] = {}
    parent = [0]
    node_weight = [0]
    nodes: list[int] = []
    weights: list[int] = []
    starts: list[int] = []
    for tr in requests:
        starts.append(len(nodes))
        node = 0
        remaining = tr.input_length
        for h in tr.hash_ids:
            if remaining <= 0:
                break
            length = min(TRACE_BLOCK_TOKENS, remaining)
            remaining -= length
            key = (node, h, 0 if as_peer else length)
            child = edges.get(key)
            if child is None:
                child = edges[key] = len(parent)
                parent.append(node)
                node_weight.append(1 if as_peer else -(-length // tokens_per_block))
            node = child
            nodes.append(node)
            weights.append(length if as_peer else -(-length // tokens_per_block))
    starts.append(len(nodes))
    never = len(requests)
    next_use = [never] * len(nodes)
    last = [never] * len(parent)
    for r in range(len(requests) - 1, -1, -1):
        for i in range(starts[r], starts[r + 1]):
            next_use[i] = last[nodes[i]]
        for i in range(starts[r], starts[r + 1]):
            last[nodes[i]] = r
    return Plan(nodes, weights, next_use, parent, node_weight, starts)


def belady_curve(requests: Sequence[TraceRequest], capacities: Sequence[int], tokens_per_block: int,
                 measure_from: int = 0, as_peer: bool = False, method: str | None = None) -> list[float]:
    """Belady's MIN hit rate (reused KV blocks / prompt KV blocks) for each capacity in KV blocks, counted over the
    requests from index ``measure_from`` on (kvcache-simulator measures the second half).

    ``method``: ``"levels"``, every capacity from one pass of ``_min_levels`` (where every trace block takes one
    unit of room: ``tokens_per_block`` >= 512, or ``as_peer``); ``"flat"``, one ``_min_hits`` pass per capacity
    over the flat references (any room). None: levels where they apply, else flat.
    tests/engines/sim/test_sim_sweep_fast.py holds both to the same hits as MIN over the prefix tree, one pass per
    capacity (its oracle, tests/oracles/belady_tree.py)."""
    unit_room = as_peer or tokens_per_block >= TRACE_BLOCK_TOKENS
    if method is None:
        method = "levels" if unit_room else "flat"
    if method not in ("levels", "flat"):
        raise ValueError(f"method: expected 'levels' or 'flat', got {method!r}")
    if method == "levels" and not unit_room:
        raise ValueError("method 'levels': needs one unit of room per trace block (tokens_per_block >= 512 or "
                         "as_peer)")
    return _belady_curve_flat(requests, capacities, tokens_per_block, measure_from, as_peer, method == "levels")


# ------------------------------------------------------------------------------ Belady, every size in one pass
#
# Where every node takes one unit of room, MIN over the tree (tests/oracles/belady_tree.py) is Belady's MIN (with
# bypass) over the flat sequence of references (request order, prompt order), each keyed by the index of the next
# reference to its node:
# - a cached node's key is its true next use (a node is cached only under its cached parent, so a request reaching
#   it hits it and moves its key on), and a parent's next use comes before its child's (a request using the child
#   uses the parent first): the farthest leaf is the farthest cached node;
# - live keys are distinct (no two leaves are next used by the same request: both would be on its path, one above
#   the other); the protected leaf (the deepest cached node of the path) is next used no later than the block being
#   inserted, so where it is the farthest, every other leaf is nearer and the block is bypassed either way; and a
#   block with no next use is bypassed on a full cache (the oracle's ``skip_dead``: the same hits).
# MIN with bypass is a stack algorithm (Mattson, Gecsei, Slutz, Traiger 1970): with priority = next use, the cache
# of each size holds the top ``size`` entries of one priority stack. On a reference to x at depth d (a hit for the
# sizes >= d), x enters with its new next use as the carried entry; going down the stack from the top, wherever an
# entry is used later than the carried one they swap (each size's cache, plus x, less its farthest entry); the
# carried entry at the end takes depth d (or, for a miss, leaves the largest cache). Only the sizes asked for
# matter, so the stack is cut into levels (level k: the cache of the k-th size less that of the (k-1)-th), each a
# heap of its entries by next use, the farthest first: a reference to a node at level L walks the levels above L,
# swapping where a level's farthest entry is used later than the carried one. The Mooncake trace at 512 tokens a
# block, 16 sizes: 122k references, 43k walks, 130k swaps; the whole curve in ~0.1 s of CPU against 1.17 s for 16
# passes of MIN over the tree (in one process, alternated, load ~5.7: bench/JOURNAL.md, "Host-cache sweeps"). Not with
# blocks of fewer tokens: a trace block then takes 1 to 512 / tokens_per_block units of room (its last one fewer),
# and MIN over items of several sizes is no stack algorithm (nor optimal).


def _flat_references(requests: Sequence[TraceRequest], as_peer: bool, tokens_per_block: int = TRACE_BLOCK_TOKENS
                     ) -> tuple[list[int], list[int] | None, list[int]] | None:
    """``belady_plan``'s references, without building the tree: per reference its node (the index of the node's
    first reference), what a hit on it counts (None: 1 each; but in the peer's units, that is also the room of the
    node it names first), and where each request's references start. A node is named by its hash id (a ``(hash id,
    length)`` pair for a request's partial last block, but in the peer's units): exact where each name always
    follows the same name (or always opens a request), as then it names its whole prefix (by induction on the
    depth); None where one does not, and the tree is built. In C loops (dict.setdefault over a map): ~0.02 s on
    the Mooncake trace, where ``belady_plan`` takes ~0.09 (no numpy: its import alone is ~0.1 s)."""
    names: list[Any] = []
    extend, append = names.extend, names.append
    weights: list[int] | None = [] if as_peer or tokens_per_block < TRACE_BLOCK_TOKENS else None
    per_block = 1 if as_peer else tokens_per_block  # what a hit counts: tokens (the peer), else KV blocks
    starts = [0]
    block = TRACE_BLOCK_TOKENS
    for tr in requests:
        length = tr.input_length
        ids = tr.hash_ids
        if length > 0 and ids:
            blocks = min(-(-length // block), len(ids))
            last = min(block, length - block * (blocks - 1))
            if last == block or as_peer:  # the peer's units: a block is a node whatever its length
                extend(ids if blocks == len(ids) else ids[:blocks])
            else:
                extend(ids[:blocks - 1])
                append((ids[blocks - 1], last))
            if weights is not None:
                weights.extend([-(-block // per_block)] * (blocks - 1))
                weights.append(-(-last // per_block))
        starts.append(len(names))
    first: dict[Any, int] = {}
    nodes = list(map(first.setdefault, names, range(len(names))))
    before = [-1, *nodes[:-1]]
    for s in starts[:-1]:
        if s < len(before):
            before[s] = -1
    # A node is its first reference's index, so what that reference follows is before[node]: every reference
    # follows the same (a list lookup each, where a dict.setdefault of each node's first took twice the time).
    if list(map(before.__getitem__, nodes)) != before:  # a name after two different names
        return None
    return nodes, weights, starts


def _belady_curve_flat(requests: Sequence[TraceRequest], capacities: Sequence[int], tokens_per_block: int,
                       measure_from: int, as_peer: bool, levels: bool) -> list[float]:
    """``belady_curve`` over the flat references: all sizes from ``_min_levels`` (``levels``), else one
    ``_min_hits`` pass per size."""
    found = _flat_references(requests, as_peer, tokens_per_block)
    if found is not None:
        nodes, weights, starts = found
        room = weights if weights is not None and not as_peer else None  # a node is named by its first reference
    else:
        plan = belady_plan(requests, tokens_per_block, as_peer)
        nodes, starts = plan.nodes, plan.starts
        unit = as_peer or tokens_per_block >= TRACE_BLOCK_TOKENS
        weights = None if unit and not as_peer else plan.weights
        room = None if unit else plan.node_weight
    n = len(nodes)
    first_measured = starts[min(measure_from, len(requests))]
    total = sum(weights[first_measured:]) if weights is not None else n - first_measured
    sizes = sorted(set(int(c) for c in capacities if int(c) > 0))
    hits_at = dict.fromkeys(sizes, 0)
    if sizes and n:
        node_count = max(nodes) + 1
        with _no_gc():
            entries, who = _next_uses(nodes, node_count)
            if levels:
                # What each reference's hit counts, 0 before the measured range.
                counted = [0] * first_measured
                counted += [1] * (n - first_measured) if weights is None else weights[first_measured:]
                by_level = _min_levels(nodes, entries, who, sizes, node_count, counted)
                running = 0
                for k, size in enumerate(sizes):
                    running += by_level[k + 1]
                    hits_at[size] = running
            else:
                ones = [1] * max(n, node_count) if weights is None or room is None else []
                for size in sizes:
                    hits_at[size] = _min_hits(nodes, entries, who, node_count, ones if weights is None else weights,
                                              ones if room is None else room, starts, size, first_measured)
    return [(hits_at.get(int(c), 0) / total if total else 0.0) for c in capacities]


def _min_hits(nodes: list[int], entries: list[int], who: list[int], no_next: int, weights: list[int],
              room: list[int], starts: list[int], capacity: int, first_measured: int = 0) -> int:
    """MIN over the tree (tests/oracles/belady_tree.py) for blocks of any room, over the flat references (see
    above; ``entries``, ``who`` and ``no_next`` as for ``_min_levels``, ``room`` per node): on a miss, evict the
    farthest used cached node until the block fits, or stop at one used no later than it (the block and the rest of
    its request are not inserted: a node is cached only under its cached parent; the evictions made stay made, as
    there). The farthest cached node is the tree's farthest leaf; a node no longer cached, or cached with a newer
    entry, leaves its old entries in the heap, dropped when they come up. ~35% less time a pass than the tree's (no
    children, versions, or pending parents to keep: the Mooncake trace at 32 tokens a block, ~0.047 -> ~0.030 s)."""
    if capacity <= 0:
        return 0
    present = bytearray(len(room))
    current = [0] * len(room)  # per cached node: its live entry
    heap: list[int] = []
    push, pop = heapq.heappush, heapq.heappop
    used = hits = 0
    resume = 0  # after a block not inserted, the rest of its request is not either
    for i, x, c in zip(range(len(nodes)), nodes, entries):
        if present[x]:
            if i >= first_measured:
                hits += weights[i]
            current[x] = c
            push(heap, c)
            continue
        if c < no_next or i < resume:  # no next use (so none for the rest of the request): never inserted
            continue
        w = room[x]
        while used + w > capacity:
            if not heap:
                break
            top = heap[0]
            y = who[top]
            if not present[y] or current[y] != top:
                pop(heap)
                continue
            if top >= c:  # the farthest cached node is used no later than this block: it is not inserted
                break
            pop(heap)
            present[y] = 0
            used -= room[y]
        else:
            present[x] = 1
            used += w
            current[x] = c
            push(heap, c)
            continue
        resume = starts[bisect_right(starts, i)]
    return hits

