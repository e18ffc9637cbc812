"""Live what-if: the hit rate a run would have had with a 2x or 4x larger host cache, from its own events.

TensorRT-LLM's two tiers behave, for reuse, like one LRU stack: GPU blocks are evicted least recently
released first, an evicted block is offloaded to the host pool (priority >= 30, the default 35 included), and
the host pool evicts the block offloaded longest ago (trtllm-kv.md 6.3). A host block that is evicted shows up
as a ``removed`` event; if a later prompt needs it again it is a *miss*, recomputed and stored again under the
*same* hash (block hashes are deterministic in the token prefix), so the engine emits a new ``stored`` event.

So: keep a ghost list of the hashes the cache dropped, most recent first. A host ``(1 + k)`` times as large
keeps, beyond what this one keeps, the ``k x H`` most recently dropped blocks that were not asked for again
since (an LRU stack-distance argument, as in ARC's ghost lists). A ``stored`` event for a hash that sits in the
ghost list with fewer than ``k x H`` more recent ghosts ahead of it is a miss that the larger host would have
served as a host hit. Then

    host_xN_hit_rate = (reusedBlocks + min(ghost hits within (N-1) x H, missedBlocks)) / (reused + missed)

with ``reusedBlocks`` / ``missedBlocks`` the kvCacheStats counters since this object started watching.

Details that keep the estimate honest (each is checked against simulated runs in ``bench/bench_whatif.py``):
- Only *prefill* stores can be misses of a later prompt. ``storeContextBlocks`` stores full prompt blocks; the
  store at release adds the partly filled last block and the generated blocks, which were never looked up.
  A stored event whose last block is partly filled is a release store: its hashes leave the ghost list but
  count no hit (in the simulator, generation is deterministic, so repeating a prompt re-creates the same
  generated-block hashes; counting them would overstate the hit rate).
- Blocks that a larger host would not have kept are not ghosted: GPU blocks dropped on eviction because their
  priority is below ``secondary_offload_min_priority`` (30) never reach the host, whatever its size.
  GPU blocks removed together with an evicted host parent (``freeChildren``) are ghosted: the larger host
  keeps the parent, so the children stay reachable.
- The ghost rank is the number of ghosts more recent than the hash *still in the list*: a block asked for
  again leaves the list (it moved to the top of the stack), which is what makes it a stack distance.
- Limits: a hit in the larger run changes later evictions only through order, which the stack model ignores;
  partial-block reuse (no events for silent detaches) is invisible; priorities other than 35 reorder the real
  queues. On the workloads in BENCHMARKS.md the 2x estimate is within 3 points of a real 2x run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from itertools import accumulate
from typing import Any

__all__ = ["DEFAULT_FACTORS", "DEFAULT_PRIORITY", "WhatIf"]

DEFAULT_FACTORS = (2, 4)
MAX_GHOSTS = 1 << 22
NO_HOST_REACH = 4  # with no host pool, ghosts for a host of up to this many times the GPU pool (size advice)
_OFFLOAD_MIN_PRIORITY = 30  # evictionPolicy.cpp kDefaultSecondaryOffloadMinPriority
DEFAULT_PRIORITY = 35  # a block's retention priority when its event gives none (TensorRT-LLM's default)


class _RankedGhosts:
    """Ghost hashes in drop order, with "how many ghosts are more recent than this one" in O(log n).

    Every sequence number after a live ghost's is a live ghost or a ghost taken out again (a hit, or dropped
    anew): the ghosts forgotten as the oldest all came before it. So the ghosts more recent than one are the
    drops after it less the ones taken out after it, and a Fenwick tree over sequence numbers marks only those
    taken out: a drop (the most frequent step, one per removed block) updates no tree, a hit updates it once.
    (Marking the live ghosts instead cost a tree update per drop and one per ghost forgotten: ~14 Python steps
    each, most of the what-if's cost of a removed event.) Sequence numbers grow without bound over a long run,
    so the live ghosts (at most `capacity`) are renumbered 0..n-1 and the tree emptied whenever the numbers
    outgrow it: amortised O(1) per drop.
    """

    def __init__(self, capacity: int):
        self.capacity = max(0, capacity)
        self._seq: dict[int, int] = {}  # hash -> absolute sequence number (insertion order = drop order)
        self._base = 0                  # sequence number of tree slot 0
        self._next = 0
        self._taken = 0                 # marks in the tree: ghosts taken out since the last renumbering
        # The tree grows with the ghosts actually held, not with the capacity claimed: a `created` event
        # claiming a 3e7-block host would otherwise cost 1.2e8 slots (~1 GB) before a single drop.
        self._size = 1024
        self._tree = [0] * (self._size + 1)
        # _order[s - _base]: the hash pushed with sequence number s; _head: the first slot that may still be live.
        # Forgetting the oldest ghost walks it forward (each slot once): ``del seq[next(iter(seq))]`` instead
        # scanned the dict's deleted entries from its start every time, 0.9 of the 1.4 us a drop cost at capacity.
        self._order: list[int] = []
        self._head = 0

    def __len__(self) -> int:
        return len(self._seq)

    def __contains__(self, h: int) -> bool:
        return h in self._seq

    def _rebuild(self) -> None:
        n = len(self._seq)
        self._size = max(1024, 4 * n)  # room for 3x the live ghosts before the next rebuild: O(1) amortised
        self._order = list(self._seq)  # drop order kept (the dict's), no gaps: nothing taken out
        self._seq = dict(zip(self._order, range(n)))
        self._head = 0
        self._tree = [0] * (self._size + 1)
        self._base = 0
        self._next = n
        self._taken = 0

    def push(self, h: int) -> None:
        if self.capacity == 0:
            return
        seq = self._seq
        if h in seq:
            self.discard(h)
        if self._next - self._base >= self._size:
            self._rebuild()
            seq = self._seq
        n = self._next
        seq[h] = n
        self._order.append(h)
        self._next = n + 1
        if len(seq) > self.capacity:  # forget the oldest ghost (before every live one: no mark needed)
            self._forget_oldest()

    def _forget_oldest(self) -> None:
        seq, order, base = self._seq, self._order, self._base
        head = self._head
        while len(seq) > self.capacity:
            h = order[head]
            if seq.get(h) == base + head:  # else a slot left behind: taken out, or pushed again later
                del seq[h]
            head += 1
        self._head = head

    def discard(self, h: int) -> int | None:
        """Remove `h`; returns how many ghosts were more recent than it, or None if it was no ghost."""
        seq = self._seq.pop(h, None)
        if seq is None:
            return None
        tree, size = self._tree, self._size
        i = slot = seq - self._base
        taken_before = 0   # ghosts taken out at slots [0, slot)
        while i > 0:
            taken_before += tree[i]
            i -= i & -i
        newer = self._next - 1 - seq - (self._taken - taken_before)
        i = slot + 1       # mark h's slot as taken out
        while i <= size:
            tree[i] += 1
            i += i & -i
        self._taken += 1
        return newer



def _token_id(t: Any) -> Any:
    """A stored block's token: ``{"token_id": n, ...}`` (TensorRT-LLM's shape) or a bare id."""
    return t.get("token_id") if isinstance(t, dict) else t


def _tokens(block: dict[str, Any]) -> Any:
    """A stored block's tokens: TensorRT-LLM's dicts (an engine's event handed over in-process), else the ids
    that every reader of records gives for plain tokens (``"token_ids"``, kvtop/compact.py ``read_event``)."""
    tokens = block.get("tokens")
    return block.get("token_ids") if tokens is None else tokens

def _fixed_point(served: Callable[[int], int], most: int) -> int:
    """The largest x in [0, most] with served(x) >= x, by bisection: the extra hits a larger host serves, where
    serving more leaves more of its slots empty (``served`` falls as x grows; WhatIf._extra_hits says why)."""
    lo, hi = 0, most
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if served(mid) >= mid:
            lo = mid
        else:
            hi = mid - 1
    return lo


class WhatIf:
    """Estimate hit rates with a larger host cache from a run's KV events and iteration stats.

    `host_capacity_blocks`: the host (secondary) pool size H in blocks; None learns it from the ``created``
    event (``num_blocks_per_cache_level[1]``). `factors`: host sizes to estimate, as multiples of H.
    """

    def __init__(self, host_capacity_blocks: int | None = None, factors: Iterable[int] = DEFAULT_FACTORS,
                 tokens_per_block: int | None = None, offload_min_priority: int = _OFFLOAD_MIN_PRIORITY):
        self.factors = tuple(sorted(set(int(f) for f in factors)))
        if not self.factors or self.factors[0] < 1:
            raise ValueError(f"factors must be integers >= 1, got {factors!r}")
        self.host_capacity_blocks = host_capacity_blocks
        self.gpu_blocks: int | None = None   # the GPU pool, from the created event (sizes the ghosts where H is 0)
        self.tokens_per_block = tokens_per_block
        self.offload_min_priority = offload_min_priority
        self._ghosts = _RankedGhosts(0)
        self._rank_hits: list[int] = []
        if host_capacity_blocks is not None:
            self._set_capacity(host_capacity_blocks)
        self._level: dict[int, int] = {}     # block hash -> cache level (0 GPU, 1 host), from events
        self._prio: dict[int, int] = {}      # block hash -> retention priority
        self._partial: dict[int, tuple[Any, tuple[Any, ...]]] = {}  # partly filled cached block -> (parent, tokens)
        self._ghost_partials: dict[Any, dict[int, tuple[Any, ...]]] = {}  # parent -> dropped partial blocks
        self.ghost_hits = {f: 0 for f in self.factors}  # filled in by estimate()
        self.offloads = 0                    # updated events, cache level 0 -> 1
        self.onboards = 0                    # updated events, cache level 1 -> 0 (host hits)
        self.ghosted = 0                     # blocks that entered the ghost list
        self.dropped_low_priority = 0        # GPU blocks dropped that no host size would have kept
        self.release_store_ghosts = 0        # ghosts re-stored at release: not counted as hits
        self.events = 0
        self._seen_created = False
        self.last_store_was_release = False  # the last stored event's kind (kvtop.tiers.sizeadvice reads it)
        # Hooks for a fold that reads the same events (kvtop.tiers.sizeadvice), called after this one's own step:
        # one parse of each event for both (a wrapper that parsed it again cost 0.7 us an updated event).
        self.on_level: Callable[[int, Any, int], None] | None = None     # (hash, old level, new level)
        self.on_removed: Callable[[Any], None] | None = None             # (block_hashes)
        self.on_stored: Callable[[list[Any], Any, bool], None] | None = None  # (blocks, parent_hash, release)
        self._base: tuple[int, int] | None = None   # kvCacheStats (reused, missed) when watching began
        self._last: tuple[int, int] | None = None
        self._reused = 0
        self._missed = 0

    def _set_capacity(self, blocks: int) -> None:
        if blocks < 0:
            raise ValueError(f"host_capacity_blocks must be >= 0, got {blocks}")
        self.host_capacity_blocks = blocks
        old = self._ghosts
        # At most MAX_GHOSTS: the ghosts are what a flood of distinct hashes could grow (~140 B each with the
        # tree), so a claimed 3e7-block host and a stream of made-up removals stop at ~600 MB. A real host pool
        # that needs more (over 1.4M blocks at x4) gets an estimate that counts only the nearest 4M drops: low.
        # No host pool: ghosts for a host of up to 4x the GPU pool (the size advice's "add a host tier?"); the
        # x2 / x4 estimates stay 0 (x2 of nothing).
        reach = (self.factors[-1] - 1) * blocks if blocks else NO_HOST_REACH * (self.gpu_blocks or 0)
        self._ghosts = _RankedGhosts(min(reach, MAX_GHOSTS))
        # _rank_hits[r]: re-stored ghosts that had r more recent ghosts ahead of them (a stack-distance
        # histogram past the host's reach); grown to the largest rank seen (bounded by the ghosts held, so by
        # the run's own drops), never sized up front from the claimed capacity.
        self._rank_hits = []
        for h in old._seq:  # keep what was ghosted so far, in order
            self._ghosts.push(h)

    # ------------------------------------------------------------------------------------------ input

    def apply(self, record: Any) -> None:
        """A kvtop Record: `kv_event` and `stats` records are used, every other kind is ignored."""
        kind = getattr(record, "kind", None)
        if kind == "kv_event":
            self.apply_kv_event(record.data)
        elif kind == "stats":
            self.apply_stats(record.data)

    def apply_kv_event(self, ev: dict[str, Any]) -> None:
        """One KV cache event dict (TensorRT-LLM 1.2 shape, ``{"event_id", "data": {...}}``, or the data)."""
        data = ev.get("data", ev) if isinstance(ev, dict) else None
        if not isinstance(data, dict):
            return
        self.events += 1
        etype = data.get("type")
        # The most frequent first: updated (43% of a busy stream's events), removed (41%), stored (4%).
        if etype == "updated":
            h = data.get("block_hash")
            level = data.get("cache_level")
            if isinstance(level, dict):
                nv = level.get("new_value")
                if isinstance(nv, int):
                    if isinstance(h, int):
                        self._level[h] = nv
                    if nv == 1:
                        if level.get("old_value") == 0:
                            self.offloads += 1
                    elif nv == 0 and level.get("old_value") == 1:
                        self.onboards += 1
                    on_level = self.on_level
                    if on_level is not None and isinstance(h, int):
                        on_level(h, level.get("old_value"), nv)
            prio = data.get("priority")
            if prio is not None and isinstance(prio, dict) and isinstance(prio.get("new_value"), int) \
                    and isinstance(h, int):
                self._prio[h] = prio["new_value"]
        elif etype == "removed":
            hashes = data.get("block_hashes") or []
            self._removed(hashes)
            if self.on_removed is not None:
                self.on_removed(hashes)
        elif etype == "stored":
            blocks, parent = data.get("blocks") or [], data.get("parent_hash")
            self._stored(blocks, parent)
            if self.on_stored is not None:
                self.on_stored(blocks, parent, self.last_store_was_release)
        elif etype == "created":
            self._seen_created = True
            levels = data.get("num_blocks_per_cache_level") or []
            # a negative count is no pool (hostile or torn input): it must not end the fold (it raised here)
            if levels and isinstance(levels[0], int) and levels[0] >= 0:
                self.gpu_blocks = levels[0]
                if self.host_capacity_blocks == 0:  # told there is no host before the GPU pool was known
                    self._set_capacity(0)
            if self.host_capacity_blocks is None and len(levels) > 1 and isinstance(levels[1], int) \
                    and levels[1] >= 0:
                self._set_capacity(levels[1])

    def _stored(self, blocks: list[dict[str, Any]], parent: Any) -> None:
        tpb = self.tokens_per_block
        if tpb is None:
            lengths = [len(t) for t in map(_tokens, blocks) if isinstance(t, list)]
            if lengths:
                tpb = max(lengths)  # a guess until stats say tokensPerBlock; prefill stores are full blocks
            last = lengths[-1] if lengths else None
        else:  # the last block with a token list is all that is asked of them
            last = next((len(t) for t in map(_tokens, reversed(blocks)) if isinstance(t, list)), None)
        release_store = last is not None and tpb is not None and last < tpb
        self.last_store_was_release = release_store
        if blocks.__class__ is not list:
            blocks = list(blocks)  # read above, so every block has .get: a tuple handed over in-process
        # Token ids are read only where they are used (a release store's last block; a prompt block under a
        # parent with dropped partial blocks): building a tuple per stored block was most of this fold's cost
        # (0.15 -> 0.10 s for a 40 s busy recording, dev box; Session.emit spent 0.27 s on it in all). The maps
        # and the ghosts' own dict are read through locals (neither is replaced while a store is folded).
        level_of, prio_of = self._level, self._prio
        ghosts = self._ghosts
        ghost_seq = ghosts._seq
        ghost_partials = self._ghost_partials
        last_block = blocks[-1] if blocks else None
        for b in blocks:
            h = b.get("block_hash")
            if not isinstance(h, int):
                continue
            level = b.get("cache_level", 0)
            level_of[h] = level if isinstance(level, int) else 0
            prio = b.get("priority", DEFAULT_PRIORITY)
            prio_of[h] = prio if isinstance(prio, int) else DEFAULT_PRIORITY
            if release_store:
                if b is last_block:
                    tokens = _tokens(b)
                    if isinstance(tokens, list) and tokens:  # a later prompt may match it
                        self._partial[h] = (parent, tuple(_token_id(t) for t in tokens))
                parent = h
                if h in ghost_seq:
                    ghosts.discard(h)
                    self.release_store_ghosts += 1
                continue
            if h in ghost_seq:
                newer = ghosts.discard(h)
            elif ghost_partials and (parent.__class__ is not int or ghost_partials.get(parent)):
                # (an int parent with no dropped partial blocks matches nothing: its tokens need no reading)
                tokens = _tokens(b)
                newer = self._partial_ghost_match(parent, tokens) if isinstance(tokens, list) and tokens else None
            else:
                newer = None
            parent = h
            if newer is None:
                continue
            if newer < ghosts.capacity:
                if newer >= len(self._rank_hits):
                    self._rank_hits.extend([0] * (newer + 1 - len(self._rank_hits)))
                self._rank_hits[newer] += 1

    def _partial_ghost_match(self, parent: Any, tokens: list[Any]) -> int | None:
        """A full prompt block that a dropped *partly filled* block under the same parent would have partly
        served (TensorRT-LLM's partial reuse: longest common token prefix > 0). Chats need this: each turn's
        last stored block (prompt tail + answer) is partly matched by the next turn's longer prompt."""
        candidates = self._ghost_partials.get(parent)
        if not candidates:
            return None
        first = _token_id(tokens[0])
        for h, toks in list(candidates.items()):
            if h not in self._ghosts:
                del candidates[h]  # aged out of the ghost list
                continue
            if toks and first == toks[0]:
                del candidates[h]
                return self._ghosts.discard(h)
        return None

    def _removed(self, hashes: Any) -> None:
        level_of, prio_of, partials = self._level, self._prio, self._partial
        push = self._ghosts.push
        min_priority = self.offload_min_priority
        for h in hashes:
            if not isinstance(h, int):
                continue
            level = level_of.pop(h, None)
            prio = prio_of.pop(h, DEFAULT_PRIORITY)
            partial = partials.pop(h, None) if partials else None
            if level == 0 and prio < min_priority:
                self.dropped_low_priority += 1  # never offloaded: a larger host would not have it either
                continue
            push(h)
            self.ghosted += 1
            if partial is not None:
                self._ghost_partials.setdefault(partial[0], {})[h] = partial[1]

    def apply_stats(self, stats: dict[str, Any]) -> None:
        """One iteration-stats dict: takes ``kvCacheStats.reusedBlocks/missedBlocks`` (cumulative counters)."""
        kv = stats.get("kvCacheStats") if isinstance(stats, dict) else None
        if not isinstance(kv, dict):
            return
        if self.tokens_per_block is None and isinstance(kv.get("tokensPerBlock"), int):
            self.tokens_per_block = kv["tokensPerBlock"]
        reused, missed = kv.get("reusedBlocks"), kv.get("missedBlocks")
        if not isinstance(reused, int) or not isinstance(missed, int):
            return
        if self._last is None:
            # Watching from the engine's start (a `created` event seen, or the engine's first iteration): count
            # everything; attached to a running engine: count from here, since the ghost list knows nothing of
            # earlier evictions. (The first iteration's stats come before its events: the created event is
            # folded after them, and the iteration-0 lookups, all misses, were lost: "all" read 0.472 against
            # the run's 0.460.)
            start = self._seen_created or stats.get("iter") == 0
            self._last = (0, 0) if start else (reused, missed)
        d_reused, d_missed = reused - self._last[0], missed - self._last[1]
        if d_reused < 0 or d_missed < 0:  # counters went back: a new engine; its counts start from zero
            d_reused, d_missed = reused, missed
        self._reused += d_reused
        self._missed += d_missed
        self._last = (reused, missed)

    # ------------------------------------------------------------------------------------------ output

    def extra_hits_at(self, host_blocks: int) -> int:
        """Ghost hits a host of ``host_blocks`` (more than the host pool, up to the largest factor's) would have
        served beyond this run's: ``_extra_hits`` at any size, for the size advice's curve. With no host pool, a
        host of up to ``NO_HOST_REACH`` x the GPU pool: every GPU block evicted at an offloadable priority (the
        ghosts) would have been offloaded, and a host of X keeps the latest X(1 - w) of them, w the share of its
        slots left empty by onboards (the x it serves over the ghosts offloaded: as ``_extra_hits`` reasons)."""
        H = self.host_capacity_blocks or 0
        if H:
            return self._extra_hits(host_blocks / H)
        if host_blocks <= 0 or not self._rank_hits or not self.ghosted:
            return 0
        limit = min(host_blocks, len(self._rank_hits))
        cumulative = [0, *accumulate(self._rank_hits[:limit])]
        offloads = self.ghosted

        def served(x: int) -> int:
            window = host_blocks * (1.0 - min(x / offloads, 1.0))
            return cumulative[max(0, min(limit, int(window)))]

        return _fixed_point(served, cumulative[-1])

    def _extra_hits(self, factor: float) -> int:
        """Ghost hits a host `factor` x as large would have served, with its real usable capacity.

        A host pool is never full of reusable blocks: each onboard leaves an empty slot at the tail of the
        host's FIFO (the GPU victim's old slot, swapped in), and an offload takes the *front* slot, so empty
        slots ride the whole queue before they are filled. In steady state the empty share is
        onboards / offloads (w). Measured on the simulator (zipf prefixes, G=64, H=100/200/400 blocks): w =
        0.107 / 0.173 / 0.246 against a time-averaged 10.1% / 15.5% / 22.6% of host slots empty. So the
        larger host holds kH(1 - w_k) reusable blocks, not kH, and w_k grows with the extra host hits x it
        serves (offloads stay the same: every GPU allocation that is not a GPU hit evicts one GPU block):
            w_k = (onboards + x) / offloads,  window_k = kH(1 - w_k) - H(1 - w_1),
            x = ghost hits with rank < window_k.
        x is the fixed point, found by bisection (the right side falls as x grows).
        """
        H = self.host_capacity_blocks or 0
        if factor <= 1 or H == 0 or not self._rank_hits:
            return 0
        limit = min(int((factor - 1) * H), len(self._rank_hits))
        # The running sum in C (itertools.accumulate): up to (factor - 1) x the host pool's ranks, read at every
        # second of a refresh for x2 and x4 (2,730 ranks at 910 host blocks: ~3.6% of a busy refresh in Python).
        cumulative = [0, *accumulate(self._rank_hits[:limit])]
        offloads = max(self.offloads, 1)
        w1 = min(self.onboards / offloads, 1.0)

        def served(x: int) -> int:
            wk = min((self.onboards + x) / offloads, 1.0) if self.offloads else 0.0
            window = factor * H * (1.0 - wk) - H * (1.0 - w1 if self.offloads else 1.0)
            return cumulative[max(0, min(limit, int(window)))]

        return _fixed_point(served, cumulative[-1])

    def estimate(self, hits: int | None = None, lookups: int | None = None) -> dict[str, Any]:
        """``host_x2_hit_rate``, ``host_x4_hit_rate`` (one key per factor; None before any lookup), plus the
        counts behind them. ``hits`` / ``lookups``: the run's own block hits and lookups to add the ghost hits to
        (a session gives its TierModel's, warm-up excluded, so that ``hit_rate`` is the run's cumulative hit rate
        exactly); None: this fold's own counts from the stats."""
        reused, missed = self._reused, self._missed
        if hits is not None and lookups is not None:
            reused, missed = hits, max(0, lookups - hits)
        total = reused + missed
        out: dict[str, Any] = {}
        for f in self.factors:
            self.ghost_hits[f] = self._extra_hits(f)
            extra = min(self.ghost_hits[f], missed)
            out[f"host_x{f}_hit_rate"] = (reused + extra) / total if total else None
        out.update({
            "hit_rate": reused / total if total else None,
            "reused_blocks": reused,
            "missed_blocks": missed,
            "host_capacity_blocks": self.host_capacity_blocks,
            "ghost_blocks": len(self._ghosts),
            "ghost_hits": {f"host_x{f}": n for f, n in self.ghost_hits.items()},
        })
        return out
