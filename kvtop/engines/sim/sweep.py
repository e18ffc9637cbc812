"""Hit-rate sweeps over host cache sizes without engine timing (``kvtop sim --trace ... --hit-rate-only``).

Three answers to "what hit rate would a host tier of size H give on this trace?", from slowest and most exact to
fastest:

- ``replay_hit_rates``: TensorRT-LLM's block manager (``BlockManager``, the project's ground truth) replays the trace
  with no engine in between: one request at a time, in trace order (prefill: ``add_sequence`` +
  ``store_context_blocks``; decode: ``add_token`` per generated token but the last; ``remove_sequence``). No
  batching, so no timing and no requests running side by side. Its hit rates are not the timed replay's
  (``offline.run_trace``: up to 256 requests at once, whose blocks crowd the GPU tier, and requests sharing a prefix
  that prefill side by side before either stores it): on the Mooncake trace 12.5% against 4.2% with no host tier,
  16.8% against 10.9% with 64 GB (BENCHMARKS.md, "Host-cache sweeps"). What it answers fast is how the block
  manager's policy uses a host tier of each size, and how far that is from the optimum. One replay per host size.
- ``host_curve``: every host size from one replay, at the largest size. The host tier is a FIFO of its H slots:
  each offload pushes a block at the back and takes the front slot; an onboard takes a block out of the middle. So
  a block offloaded when the manager's offload count was s is still on the host at an onboard when the count is S
  iff fewer than H slots were taken from the front in between: the ``S - s`` offloads since (stack distance over
  the host tier's queue), plus the onboards of blocks older than it that a tier of size H still held. The curve
  counts a host hit at size H iff the block's distance, and that of every host block before it in the same
  prompt (reuse stops at the first miss), is below H, the older onboards counted for that H. What it assumes: the
  GPU tier evolves as in the largest size's replay whatever H is (an onboarded block and a recomputed one both end
  up on the GPU; their eviction order can differ). The largest size is exact (it is the replay);
  tests/test_sim_sweep.py holds the others within 1 point of full replays. The replay is ``hit_replay.replay``,
  the block manager's steps specialised to this use (the same counters and onboards, exactly: 3x faster at 512
  tokens a block).
- ``belady_curve``: the offline optimum for a cache of GPU + host blocks (Belady's MIN over the trace's prefix tree:
  on a miss with the cache full, evict the cached leaf whose next use is farthest, and do not insert a block used
  later than every candidate), the bound that says how far TensorRT-LLM's LRU-by-priority policy is from what
  any policy could reuse on this trace. Counted over 512-token trace blocks weighted by their KV blocks, prompts
  only. Where every trace block takes one unit of room (512 tokens a block or more, and the peer's units), every
  size comes from one pass (``_min_levels``, in kvtop/stack_distance.py; the argument below): Belady's MIN is a
  stack algorithm there. With smaller blocks, one pass per size over the same flat references (``_min_hits``).
  ``_belady_hits`` over the tree stays as the reference both are held to.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections.abc import Callable, Sequence
from typing import Any

from kvtop.engines.inputs import TRACE_BLOCK_TOKENS, TraceRequest
from kvtop.engines.sim import hit_replay
from kvtop.engines.sim.block_manager import BlockManager, KVCacheBlock, TokenRuns
from kvtop.engines.sim.core import GENERATED_TOKEN_BASE
from kvtop.stack_distance import NUMPY_FROM_ONBOARDS
from kvtop.stack_distance import host_hits_numpy as _host_hits_numpy
from kvtop.stack_distance import host_hits_python as _host_hits_python
from kvtop.stack_distance import min_levels as _min_levels
from kvtop.stack_distance import next_uses as _next_uses
from kvtop.stack_distance import no_gc as _no_gc
from kvtop.values import mutable


def _blocks_of(tr: TraceRequest, tokens_per_block: int) -> int:
    return -(-(tr.input_length + tr.output_length) // tokens_per_block)


def _replay(bm: BlockManager, requests: Sequence[TraceRequest], after_add: Callable[[], None] | None = None
            ) -> tuple[int, int]:
    """Drive ``bm`` through the trace one request at a time. Returns (replayed, skipped): a request needing more
    blocks than the GPU pool is skipped, as the engine rejects it."""
    tpb = bm.tokens_per_block
    primary = bm.primary_blocks
    skipped = 0
    add, store, add_tokens, remove = bm.add_sequence, bm.store_context_blocks, bm.add_tokens, bm.remove_sequence
    for rid, tr in enumerate(requests):
        if tr.input_length == 0 or tr.output_length <= 0 or _blocks_of(tr, tpb) > primary:
            skipped += 1
            continue
        prompt = TokenRuns(tr.prompt_runs())
        add(rid, prompt)
        if after_add is not None:
            after_add()
        store(rid)
        # add_token per generated token but the last, in one call. The engine generates hash((digest, position))
        # ids (core.generated_token); here every request generates the run GENERATED_TOKEN_BASE, +1, +2, ...
        # instead, and the block manager does exactly the same (tests/test_sim_sweep_fast.py holds it to the
        # engine's ids, per request): a generated id is never a prompt id, so a key holding one equals another key
        # only under the same parent block, where both requests' tokens so far are equal, so their prompts are
        # equal (a prompt id and a generated id never stand at the same place), and so are the engine's generated
        # ids; and a partial match stops at the first generated id either way. What it saves: an id per token by
        # hash (595k on the Mooncake trace), and a run's keys are cut in O(1) per block.
        out = tr.output_length
        add_tokens(rid, range(GENERATED_TOKEN_BASE, GENERATED_TOKEN_BASE + out - 1))
        remove(rid, final_tokens=(GENERATED_TOKEN_BASE + out - 1,))
    return len(requests) - skipped, skipped


def _counters(bm: BlockManager, host_blocks: int, replayed: int, skipped: int) -> dict[str, Any]:
    reused, missed = bm.reused_blocks, bm.missed_blocks
    return {
        "secondary_blocks": host_blocks,
        "requests": replayed,
        "failed": skipped,
        "reused_blocks": reused,
        "missed_blocks": missed,
        "cache_hit_rate": reused / (reused + missed) if reused > 0 else 0.0,
        "offloaded_blocks": bm.offloaded_blocks,
        "onboarded_blocks": bm.onboarded_blocks,
    }


def replay_hit_rates(requests: Sequence[TraceRequest], primary_blocks: int, host_blocks: int,
                     tokens_per_block: int) -> dict[str, Any]:
    """One full block-manager replay without timing (see the module docstring)."""
    with _no_gc():
        bm = BlockManager(primary_blocks, host_blocks, tokens_per_block)
        replayed, skipped = _replay(bm, requests)
        return _counters(bm, host_blocks, replayed, skipped)


class _DistanceRecorder(BlockManager):
    """A block manager that notes, at each onboard, where the onboarded block stood in the host tier's queue: the
    general replay that ``hit_replay.replay`` (what ``host_curve`` runs) is held to (tests/test_sim_sweep_fast.py)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        # per onboard, in order: (offloads since the block's own, the offload count at its offload, at the onboard)
        self.onboards: list[tuple[int, int, int]] = []
        self.request_starts: list[int] = []  # index into onboards where each request's onboards start

    def add_sequence(self, request_id: Any, token_ids: Sequence[int], retention: Any = None) -> int:
        self.request_starts.append(len(self.onboards))  # the onboards happen inside add_sequence
        return super().add_sequence(request_id, token_ids, retention)

    def _onboard(self, block: KVCacheBlock) -> None:
        if self.onboard_blocks and not block.primary:
            now = self.offloaded_blocks
            self.onboards.append((now - block.offload_seq, block.offload_seq, now))
        super()._onboard(block)


def host_curve(requests: Sequence[TraceRequest], primary_blocks: int, host_sizes: Sequence[int],
               tokens_per_block: int, vectorized: bool | None = None) -> list[dict[str, Any]]:
    """Hit rates for every host size (in blocks) from one replay at the largest (see the module docstring).

    ``vectorized``: count the sizes with numpy (None: when the replay onboarded more than ``NUMPY_FROM_ONBOARDS``
    blocks, where it pays for numpy's import); both ways give the same counts (tests/test_sim_sweep.py)."""
    sizes = sorted(set(int(h) for h in host_sizes))
    if not sizes or sizes[0] < 0:
        raise ValueError("host_sizes: expected block counts >= 0")
    largest = sizes[-1]
    with _no_gc():
        # _replay over a _DistanceRecorder, specialised (hit_replay: the same counters and onboards, exactly)
        run = hit_replay.replay(requests, primary_blocks, largest, tokens_per_block, record_onboards=True)
    replayed, skipped = run.replayed, run.skipped
    total = run.reused_blocks + run.missed_blocks
    gpu_hits = run.reused_blocks - run.onboarded_blocks
    smaller = [h for h in sizes if h < largest]
    if vectorized is None:
        vectorized = len(run.onboards) >= NUMPY_FROM_ONBOARDS
    counts = (_host_hits_numpy if vectorized else _host_hits_python)(run.onboards, run.request_starts, smaller)
    counts[largest] = run.onboarded_blocks
    out = []
    for h in sizes:
        host_hits = counts[h]
        reused = gpu_hits + host_hits
        out.append({"secondary_blocks": h, "requests": replayed, "failed": skipped, "reused_blocks": reused,
                    "missed_blocks": total - reused, "cache_hit_rate": reused / total if total else 0.0,
                    "onboarded_blocks": host_hits, "one_pass": h < largest})
    return out


class _Fenwick:
    """Counts of points over [0, n), prefix counts in O(log n) (the per-size reference count of
    tests/test_sim_sweep_fast.py)."""

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


# ---------------------------------------------------------------------------------------------- Belady

@mutable  # kvtop.values: no code compiled at import
class _Plan:
    nodes: list[int]        # per reference (request order, prompt order): its prefix-tree node
    weights: list[int]      # what a hit on it counts: its KV blocks
    next_use: list[int]     # per reference: the next request using the node (len(requests) if none)
    parent: list[int]       # per node
    node_weight: list[int]  # per node: the cache room it takes, in KV blocks
    starts: list[int]       # per request: its first reference


def _belady_plan(requests: Sequence[TraceRequest], tokens_per_block: int, as_peer: bool = False) -> _Plan:
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
    return _Plan(nodes, weights, next_use, parent, node_weight, starts)


def belady_curve(requests: Sequence[TraceRequest], capacities: Sequence[int], tokens_per_block: int,
                 measure_from: int = 0, as_peer: bool = False, method: str | None = None) -> list[float]:
    """Belady's MIN hit rate (reused KV blocks / prompt KV blocks) for each capacity in KV blocks, counted over the
    requests from index ``measure_from`` on (kvcache-simulator measures the second half).

    ``method``: ``"levels"``, every capacity from one pass of ``_min_levels`` (where every trace block takes one
    unit of room: ``tokens_per_block`` >= 512, or ``as_peer``); ``"flat"``, one ``_min_hits`` pass per capacity
    over the flat references (any room); ``"tree"``, one ``_belady_hits`` pass per capacity over the prefix tree,
    the reference. None: levels where they apply, else flat. tests/test_sim_sweep_fast.py holds all three to the
    same hits."""
    unit_room = as_peer or tokens_per_block >= TRACE_BLOCK_TOKENS
    if method is None:
        method = "levels" if unit_room else "flat"
    if method not in ("levels", "flat", "tree"):
        raise ValueError(f"method: expected 'levels', 'flat' or 'tree', got {method!r}")
    if method == "levels" and not unit_room:
        raise ValueError("method 'levels': needs one unit of room per trace block (tokens_per_block >= 512 or "
                         "as_peer)")
    if method == "tree":
        plan = _belady_plan(requests, tokens_per_block, as_peer)
        first = plan.starts[min(measure_from, len(requests))]
        total = sum(plan.weights[first:])
        return [(_belady_hits(plan, int(c), first) / total if total else 0.0) for c in capacities]
    return _belady_curve_flat(requests, capacities, tokens_per_block, measure_from, as_peer, method == "levels")


def _belady_hits(plan: _Plan, capacity: int, first_measured: int = 0, skip_dead: bool = True) -> int:
    """``skip_dead``: insert nothing from a request's first node that no later request uses on (its descendants on
    the path are not used again either: a later use of one goes through it). The hits stay the same: such a node
    is only ever inserted into free room (on a full cache the bypass keeps it out), and a node with no next use is
    the first leaf evicted (its key is the farthest), so free room and dead nodes together stay the same room for
    the nodes that have a next use, whose set is then the same; the nodes not inserted are most of a trace's misses
    (a request's own suffix), 40% less time (tests/test_sim_sweep_fast.py checks it against ``skip_dead=False``)."""
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


# ------------------------------------------------------------------------------ Belady, every size in one pass
#
# Where every node takes one unit of room, ``_belady_hits`` is Belady's MIN (with bypass) over the flat sequence of
# references (request order, prompt order), each keyed by the index of the next reference to its node:
# - a cached node's key is its true next use (a node is cached only under its cached parent, so a request reaching
#   it hits it and moves its key on), and a parent's next use comes before its child's (a request using the child
#   uses the parent first): the farthest leaf is the farthest cached node;
# - live keys are distinct (no two leaves are next used by the same request: both would be on its path, one above
#   the other); the protected leaf (the deepest cached node of the path) is next used no later than the block being
#   inserted, so where it is the farthest, every other leaf is nearer and the block is bypassed either way; and a
#   block with no next use is bypassed on a full cache (``skip_dead``: the same hits).
# MIN with bypass is a stack algorithm (Mattson, Gecsei, Slutz, Traiger 1970): with priority = next use, the cache
# of each size holds the top ``size`` entries of one priority stack. On a reference to x at depth d (a hit for the
# sizes >= d), x enters with its new next use as the carried entry; going down the stack from the top, wherever an
# entry is used later than the carried one they swap (each size's cache, plus x, less its farthest entry); the
# carried entry at the end takes depth d (or, for a miss, leaves the largest cache). Only the sizes asked for
# matter, so the stack is cut into levels (level k: the cache of the k-th size less that of the (k-1)-th), each a
# heap of its entries by next use, the farthest first: a reference to a node at level L walks the levels above L,
# swapping where a level's farthest entry is used later than the carried one. The Mooncake trace at 512 tokens a
# block, 16 sizes: 122k references, 43k walks, 130k swaps; the whole curve in ~0.1 s of CPU against 1.17 s for 16
# passes of ``_belady_hits`` (in one process, alternated, load ~5.7: BENCHMARKS.md, "Host-cache sweeps"). Not with
# blocks of fewer tokens: a trace block then takes 1 to 512 / tokens_per_block units of room (its last one fewer),
# and MIN over items of several sizes is no stack algorithm (nor optimal).


def _flat_references(requests: Sequence[TraceRequest], as_peer: bool, tokens_per_block: int = TRACE_BLOCK_TOKENS
                     ) -> tuple[list[int], list[int] | None, list[int]] | None:
    """``_belady_plan``'s references, without building the tree: per reference its node (the index of the node's
    first reference), what a hit on it counts (None: 1 each; but in the peer's units, that is also the room of the
    node it names first), and where each request's references start. A node is named by its hash id (a ``(hash id,
    length)`` pair for a request's partial last block, but in the peer's units): exact where each name always
    follows the same name (or always opens a request), as then it names its whole prefix (by induction on the
    depth); None where one does not, and the tree is built. In C loops (dict.setdefault over a map): ~0.02 s on
    the Mooncake trace, where ``_belady_plan`` takes ~0.09 (no numpy: its import alone is ~0.1 s)."""
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
        plan = _belady_plan(requests, tokens_per_block, as_peer)
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
    """``_belady_hits`` for blocks of any room, over the flat references (see above; ``entries``, ``who`` and
    ``no_next`` as for ``_min_levels``, ``room`` per node): on a miss, evict the farthest used cached node until the
    block fits, or stop at one used no later than it (the block and the rest of its request are not inserted: a node is
    cached only under its cached parent; the evictions made stay made, as there). The farthest cached node is the
    tree's farthest leaf; a node no longer cached, or cached with a newer entry, leaves its old entries in the heap,
    dropped when they come up. ~35% less time a pass than ``_belady_hits`` (no children, versions, or pending
    parents to keep: the Mooncake trace at 32 tokens a block, ~0.047 -> ~0.030 s)."""
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

