"""Size advice: the hit rate a run would have had at other host sizes, the optimum beside it, and a recommendation.

From the run's own block stream (TensorRT-LLM's KV cache events and iteration stats, the records the TierModel
folds), at host sizes 0, H/4, H/2, 3H/4, H (the host pool now: exactly the run's own hit rate), 1.5H, 2H, 3H, 4H:

- **Below H** from the onboards' distances in the host queue, as ``kvtop.engines.sim.sweep.host_curve`` reasons for
  a trace: the host tier is a FIFO of its slots (an offload takes the front slot, an onboard frees one in the
  middle), so a block offloaded at offload count s and onboarded at count S would still be on a host of h blocks
  iff the ``S - s`` offloads since, plus the onboards in front of it that a host of h also served, are fewer than
  h. The events give s and S: the n-th ``updated`` event with ``cache_level`` 0 -> 1 is offload n, and an onboard
  (1 -> 0) counts the offloads before it, less its own victim's (an onboard first takes a GPU block, whose offload
  event comes just before the onboard's). ``kvtop.stack_distance.host_hits_at`` counts them (the trace sweep's
  code). A prompt's reuse stops at its first miss: onboards are grouped as one prompt's while no ``stored`` event
  came between them and the earlier one is an ancestor of the later (parent hashes from the stored events).
- **Above H** from ``kvtop.tiers.whatif``'s ghost list (the hashes the cache dropped, by stack distance): the
  same estimate the x2 / x4 line made, at any size up to 4H.
- **No host pool** (H = 0): the sizes are 0, G/4, G/2, G, 2G, 4G (G the GPU pool, from the ``created`` event), from
  the same ghosts: every GPU block evicted at an offloadable priority would have been offloaded, and a host of X
  keeps the latest of them, less the slots its onboards leave empty (``WhatIf.extra_hits_at``).
- **The optimum** (Belady's MIN, ``kvtop.stack_distance.min_hits_at``) at each size's GPU + host capacity, over
  the lookups the events reveal: a ``stored`` event's parent chain is the prefix the request found cached (each
  of those blocks a lookup that hit, on the GPU or onboarded), its blocks the ones it missed. A request whose
  prompt was all cached stores nothing at prefill; its release store (generated blocks under the prompt's last
  full block) shows its prompt then, unless a prefill store of that same chain already counted it.

Limits (each measured against the simulator in tests/tiers/test_sizeadvice.py: a shared-prefix trace through the block
manager one request at a time, its events folded as they come):
- At and below H the curve is ``kvtop sim --one-pass``'s on the same stream, to 0.05 points. It holds the GPU
  tier as it was: a host hit and a recomputed block both end up on the GPU (as ``host_curve`` assumes; within 1
  point of full replays there). Above H, and with no host pool, the ghost estimate's own limits hold (whatif.py:
  order effects of the extra hits are ignored): within 1.5 points of full replays, measured 0.2-1.2 below them.
- Offloads of blocks outside the reuse tree (a partial-reuse detach) have no event: the distances below H are
  then short by those, the hits below H a little high. Attached mid-run, onboards of blocks offloaded before
  kvtop attached have no distance: they count at each smaller size as the placed ones' share there.
- The grouping of onboards into prompts is a guess from the stream (events of one iteration interleave requests).
- The optimum sees the lookups of full prompt blocks only (no partial-block reuse), in the order the events arrive
  (a prefill store comes after the request's lookups, a full hit's release store after its generation), over the
  last ``MAX_REFERENCES`` lookups; GPU hits whose request stored nothing at all are unseen. It is read as a rate
  over what it saw, and never below the curve at the same size (the policy's own hits are achievable). The
  lookups it counts are within 3% of the block manager's; its bound within 5 points of ``belady_curve`` over the
  trace (1.4-4.4 above: the trace's bound also counts the prompts' partial last blocks).
- The base is the TierModel's hits and lookups (warm-up excluded), the onboards and ghosts all the run's: with a
  warm-up, the sizes other than H mix the two spans a little.
- Memory: the onboards kept are bounded (``MAX_ONBOARDS``; older ones are counted once and frozen), the lookups
  too (``MAX_REFERENCES``, a window), the parent map by the blocks cached. ``curve()`` is O(n log n) over what is
  kept: a reader calls it every few seconds (the dashboard: at most every 5 s of model time), never per event.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from typing import Any

from kvtop.stack_distance import host_hits_at, min_hits_at
from kvtop.tiers.whatif import DEFAULT_PRIORITY, WhatIf

__all__ = ["FRACTIONS", "MAX_ONBOARDS", "MAX_REFERENCES", "MEANINGFUL_POINTS", "NO_HOST_FRACTIONS", "SizeAdvice",
           "advise", "format_size"]

# The sizes of the curve as multiples of the host pool H: H itself is the run's own hit rate.
FRACTIONS = (0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0, 3.0, 4.0)
# With no host pool: host sizes as multiples of the GPU pool (whatif.NO_HOST_REACH: its ghosts reach 4x).
NO_HOST_FRACTIONS = (0.0, 0.25, 0.5, 1.0, 2.0, 4.0)
MAX_ONBOARDS = 200_000      # onboards kept with their distances (3 ints each); older ones are frozen into counts
MAX_REFERENCES = 100_000    # lookups kept for the optimum (a window): MIN over them takes ~47 ms on the dev box
MEANINGFUL_POINTS = 1.0     # a larger host that buys less than this many points of hits is not worth saying
KEEPS_SHARE = 0.99          # a smaller host that keeps this share of the hits is worth saying
_ANCESTRY_WALK = 512        # blocks walked up from an onboard to find the one before it in the same prompt


class SizeAdvice:
    """The fold: hand it every ``kv_event`` and ``stats`` record's data (it feeds its ``whatif`` too); ``curve()``
    and ``advice()`` read it."""

    def __init__(self, whatif: WhatIf | None = None, max_onboards: int = MAX_ONBOARDS,
                 max_references: int = MAX_REFERENCES):
        self.whatif = whatif if whatif is not None else WhatIf()
        self.whatif.on_level, self.whatif.on_removed, self.whatif.on_stored = self._level, self._removed, self._stored
        self.max_onboards = max(2, max_onboards)
        self._offloads = 0                        # offload events so far (cache level 0 -> 1)
        self._offloaded_at: dict[int, int] = {}   # block on the host -> its offload's number
        self._parent: dict[int, Any] = {}         # cached block -> its parent's hash (None: a root block)
        self._onboards: list[tuple[int, int, int]] = []  # (S - s, s, S) per onboard with a known offload
        self._starts: list[int] = []              # index in _onboards where each prompt's onboards start
        self._last_onboard: int | None = None     # hash of the last onboard, while its prompt may go on
        self._last_was_offload = False            # the event before this one was an offload (an onboard's victim)
        self._frozen: dict[int, int] = {}         # host hits per size of the onboards no longer kept
        self._frozen_sizes: tuple[int, ...] = ()
        self.frozen_onboards = 0
        self.unplaced_onboards = 0                # onboards of blocks whose offload was not seen (attached later)
        self._refs: deque[int] = deque(maxlen=max(1, max_references))
        self._pending: dict[int, int] = {}        # last block of a prefill store -> stores awaiting their release
        self.references = 0                       # lookups revealed in all (the window keeps the last ones)

    # ------------------------------------------------------------------------------------------ input

    def apply_kv_event(self, ev: dict[str, Any]) -> None:
        """One KV cache event dict: the what-if folds it and hands this fold its moves, removals and stores."""
        self.whatif.apply_kv_event(ev)

    def apply(self, record: Any) -> None:
        kind = getattr(record, "kind", None)
        if kind == "kv_event":
            self.apply_kv_event(record.data)
        elif kind == "stats":
            self.whatif.apply_stats(record.data)

    def apply_stats(self, stats: dict[str, Any]) -> None:
        self.whatif.apply_stats(stats)

    def apply_kv_events(self, events: list[Any], on_error: Callable[[Exception], None] | None = None) -> None:
        """``apply_kv_event`` of each of ``events`` in turn (a drain: Session.emit_kv_events): the what-if's fold
        and this one's. An event that raises is handed to ``on_error`` and the rest go on, as one by one (None: it
        is raised, the fold as it stood then).

        The frequent ``updated`` and ``removed`` events are folded here, the what-if's steps and this fold's hooks
        written out in one loop with their maps, counts and ghost list held in locals (a drain of a driven trace run
        is ~8,000 events: three calls an event through WhatIf.apply_kv_event, its _removed, the ghosts' push and this
        fold's hooks were most of the fold's cost). Any other event goes to ``WhatIf.apply_kv_event`` as it is, the
        locals written back before and read again after. Held equal to ``apply_kv_event`` one by one after every
        drain of random streams by tests/tiers/test_fold_drain.py."""
        w = self.whatif
        one = w.apply_kv_event
        if w.on_level != self._level or w.on_removed != self._removed or w.on_stored != self._stored:
            for ev in events:  # hooks of someone else's: one by one
                try:
                    one(ev)
                except Exception as exc:
                    if on_error is None:
                        raise
                    on_error(exc)
            return
        level_of, prio_of, partials, ghost_partials = w._level, w._prio, w._partial, w._ghost_partials
        min_priority = w.offload_min_priority
        offloaded_at, parent_of = self._offloaded_at, self._parent
        onboard = self._onboard
        n_events, offloads, onboards = w.events, w.offloads, w.onboards
        ghosted, dropped_low = w.ghosted, w.dropped_low_priority
        sa_offloads, last_was_offload = self._offloads, self._last_was_offload
        ghosts = w._ghosts
        capacity, seq, order, base = ghosts.capacity, ghosts._seq, ghosts._order, ghosts._base
        nxt, head, size = ghosts._next, ghosts._head, ghosts._size
        synced = 0  # 1: this fold's two counts are in its attributes (an onboard's call), 2: everything is
        try:
            for ev in events:
                try:
                    if ev.__class__ is not dict and not isinstance(ev, dict):
                        continue
                    data = ev.get("data", ev)
                    if data.__class__ is not dict and not isinstance(data, dict):
                        continue
                    etype = data.get("type")
                    if etype == "updated":
                        n_events += 1
                        h: Any = data.get("block_hash")
                        level = data.get("cache_level")
                        h_int = h.__class__ is int or isinstance(h, int)
                        if level.__class__ is dict or isinstance(level, dict):
                            nv = level.get("new_value")
                            if nv.__class__ is int or isinstance(nv, int):
                                if h_int:
                                    level_of[h] = nv
                                old = level.get("old_value")
                                # the what-if's counts, then this fold's _level (for an int hash)
                                if nv == 1 and old == 0:
                                    offloads += 1
                                    if h_int:
                                        sa_offloads += 1
                                        offloaded_at[h] = sa_offloads
                                        last_was_offload = True
                                elif nv == 0 and old == 1:
                                    onboards += 1
                                    if h_int:
                                        self._offloads, self._last_was_offload = sa_offloads, last_was_offload
                                        synced = 1
                                        onboard(h)
                                        synced = 0
                                        last_was_offload = False
                                elif h_int:
                                    last_was_offload = False
                        prio = data.get("priority")
                        if prio is not None and isinstance(prio, dict) and isinstance(prio.get("new_value"), int) \
                                and h_int:
                            prio_of[h] = prio["new_value"]
                    elif etype == "removed":
                        n_events += 1
                        hashes = data.get("block_hashes") or []
                        for h in hashes:  # the what-if's _removed
                            if not (h.__class__ is int or isinstance(h, int)):
                                continue
                            level = level_of.pop(h, None)
                            prio = prio_of.pop(h, DEFAULT_PRIORITY)
                            partial = partials.pop(h, None) if partials else None
                            if level == 0 and prio < min_priority:
                                dropped_low += 1  # never offloaded: a larger host would not have it either
                                continue
                            if capacity:  # the ghosts' push
                                if h in seq:
                                    ghosts._next, ghosts._head = nxt, head
                                    ghosts.discard(h)
                                if nxt - base >= size:
                                    ghosts._next, ghosts._head = nxt, head
                                    ghosts._rebuild()
                                    seq, order, base = ghosts._seq, ghosts._order, ghosts._base
                                    nxt, head, size = ghosts._next, ghosts._head, ghosts._size
                                seq[h] = nxt
                                order.append(h)
                                nxt += 1
                                while len(seq) > capacity:  # the oldest ghost forgotten (_forget_oldest)
                                    g = order[head]
                                    if seq.get(g) == base + head:
                                        del seq[g]
                                    head += 1
                            ghosted += 1
                            if partial is not None:
                                ghost_partials.setdefault(partial[0], {})[h] = partial[1]
                        for h in hashes:  # this fold's _removed
                            if h.__class__ is int:
                                if offloaded_at:
                                    offloaded_at.pop(h, None)
                                parent_of.pop(h, None)
                    else:
                        w.events, w.offloads, w.onboards = n_events, offloads, onboards
                        w.ghosted, w.dropped_low_priority = ghosted, dropped_low
                        self._offloads, self._last_was_offload = sa_offloads, last_was_offload
                        ghosts._next, ghosts._head = nxt, head
                        synced = 2
                        one(ev)
                        synced = 0
                        n_events, offloads, onboards = w.events, w.offloads, w.onboards
                        ghosted, dropped_low = w.ghosted, w.dropped_low_priority
                        sa_offloads, last_was_offload = self._offloads, self._last_was_offload
                        ghosts = w._ghosts
                        capacity, seq, order, base = ghosts.capacity, ghosts._seq, ghosts._order, ghosts._base
                        nxt, head, size = ghosts._next, ghosts._head, ghosts._size
                except Exception as exc:
                    if synced:  # it raised in a call: what that call left is the fold's
                        sa_offloads, last_was_offload = self._offloads, self._last_was_offload
                        if synced == 2:
                            n_events, offloads, onboards = w.events, w.offloads, w.onboards
                            ghosted, dropped_low = w.ghosted, w.dropped_low_priority
                            ghosts = w._ghosts
                            capacity, seq, order, base = ghosts.capacity, ghosts._seq, ghosts._order, ghosts._base
                            nxt, head, size = ghosts._next, ghosts._head, ghosts._size
                        synced = 0
                    if on_error is None:
                        raise
                    on_error(exc)
        finally:
            w.events, w.offloads, w.onboards = n_events, offloads, onboards
            w.ghosted, w.dropped_low_priority = ghosted, dropped_low
            self._offloads, self._last_was_offload = sa_offloads, last_was_offload
            ghosts._next, ghosts._head = nxt, head

    def _level(self, h: int, old: Any, new: int) -> None:
        """An ``updated`` event's cache-level change (the what-if's hook: it parsed the event)."""
        if new == 1 and old == 0:
            self._offloads += 1
            self._offloaded_at[h] = self._offloads
            self._last_was_offload = True
            return
        if new == 0 and old == 1:
            self._onboard(h)
        self._last_was_offload = False

    def _removed(self, hashes: Any) -> None:
        offloaded_at, parent = self._offloaded_at, self._parent
        for h in hashes:
            if h.__class__ is int:
                if offloaded_at:
                    offloaded_at.pop(h, None)
                parent.pop(h, None)

    def _onboard(self, h: int) -> None:
        s = self._offloaded_at.pop(h, None)
        # The victim's offload (the GPU block whose slot the onboard takes) came just before: not in front of it.
        now = self._offloads - 1 if self._last_was_offload else self._offloads
        self._last_was_offload = False
        last = self._last_onboard
        self._last_onboard = h
        if s is None:
            self.unplaced_onboards += 1
            return
        onboards = self._onboards
        if last is None or not self._descends(h, last):
            self._starts.append(len(onboards))
        onboards.append((max(0, now - s), s, now))
        if len(onboards) >= self.max_onboards:
            self._freeze()

    def _descends(self, h: int, ancestor: int) -> bool:
        parent = self._parent
        p = parent.get(h)
        for _ in range(_ANCESTRY_WALK):
            if p.__class__ is not int:
                return False
            if p == ancestor:
                return True
            p = parent.get(p)
        return False

    def _chain(self, h: Any) -> list[int]:
        """The blocks from the root down to ``h`` (``h`` last), as far as the parent map knows them."""
        out: list[int] = []
        parent = self._parent
        while isinstance(h, int) and len(out) < 1 << 16:
            out.append(h)
            h = parent.get(h)
        out.reverse()
        return out

    def _stored(self, blocks: list[Any], parent_hash: Any, release: bool) -> None:
        self._last_onboard = None  # a store ends the prompt whose onboards came before it
        self._last_was_offload = False
        hashes = []
        p = parent_hash if parent_hash.__class__ is int else None  # anything else names no block (hostile input)
        parent = self._parent
        for b in blocks:
            h = b.get("block_hash") if isinstance(b, dict) else None
            if h.__class__ is not int:
                break
            parent[h] = p
            hashes.append(h)
            p = h
        refs = self._refs
        if release:
            if not isinstance(parent_hash, int):
                return
            waiting = self._pending.get(parent_hash)
            if waiting:  # the prompt's prefill store counted its lookups already
                if waiting == 1:
                    del self._pending[parent_hash]
                else:
                    self._pending[parent_hash] = waiting - 1
                return
            chain = self._chain(parent_hash)  # a prompt all found cached: its lookups, all hits
        else:
            if not hashes:
                return
            chain = self._chain(parent_hash)
            chain += hashes
            pending = self._pending
            if len(pending) > 4 * MAX_REFERENCES:  # releases never seen (failed requests): start again
                pending.clear()
            pending[hashes[-1]] = pending.get(hashes[-1], 0) + 1
        refs.extend(chain)
        self.references += len(chain)

    def _freeze(self) -> None:
        """Count the older half of the onboards kept, for the sizes of the curve, and drop them. Exact for them (an
        onboard's outcome depends on the onboards before it only); the newer half loses, as context, the onboards in
        front of it among the dropped (blocks that waited longer than half the kept onboards on the host)."""
        sizes = self._sizes()
        if sizes != self._frozen_sizes:
            self._frozen = {}
            self._frozen_sizes = sizes
        onboards, starts = self._onboards, self._starts
        cut = len(onboards) // 2
        k = 0
        while k < len(starts) and starts[k] <= cut:
            k += 1
        cut = starts[k - 1] if k else cut  # at a prompt's start: a prompt is counted whole
        if cut <= 0:
            cut = len(onboards) // 2
        counts = host_hits_at(onboards[:cut], [s for s in starts if s < cut] or [0], [h for h in sizes if h > 0])
        for h, n in counts.items():
            self._frozen[h] = self._frozen.get(h, 0) + n
        self.frozen_onboards += cut
        del onboards[:cut]
        self._starts = [s - cut for s in starts if s >= cut]
        if not self._starts or self._starts[0] != 0:
            self._starts.insert(0, 0)

    # ------------------------------------------------------------------------------------------ output

    def host_blocks(self) -> int | None:
        return self.whatif.host_capacity_blocks

    def _sizes(self) -> tuple[int, ...]:
        H = self.host_blocks() or 0
        if H == 0:  # no host pool: would adding one help? Sizes in multiples of the GPU pool, from the ghosts
            G = self.whatif.gpu_blocks or 0
            return tuple(sorted({int(round(f * G)) for f in NO_HOST_FRACTIONS}))
        return tuple(sorted({int(round(f * H)) for f in FRACTIONS}))

    def curve(self, hits: int | None = None, lookups: int | None = None, optimum: bool = True
              ) -> list[dict[str, Any]]:
        """Per host size (blocks): ``host_blocks``, ``hit_rate``, ``optimal_hit_rate``, ``host_hits`` (None where
        not known). ``hits`` / ``lookups``: the run's own block hits and lookups (the TierModel's, so that the point
        at H is exactly its cumulative rate); None: the what-if's own counts from the stats."""
        wi = self.whatif
        if hits is None or lookups is None:
            hits, lookups = wi._reused, wi._reused + wi._missed
        H = self.host_blocks()
        if H is None:
            return []
        sizes = self._sizes()
        placed = len(self._onboards) + self.frozen_onboards
        all_onboards = placed + self.unplaced_onboards
        below = [h for h in sizes if 0 < h < H]
        counts = host_hits_at(self._onboards, self._starts or [0], below) if below and self._onboards else {}
        refs = list(self._refs)
        gpu = self.whatif.gpu_blocks or 0
        bound = min_hits_at(refs, [gpu + h for h in sizes]) if optimum and refs and gpu + H > 0 else {}
        missed = max(0, lookups - hits)
        out = []
        for h in sizes:
            host_hits: int | None
            if h == H:
                rate_hits = hits
                host_hits = all_onboards
            elif h < H:
                if h == 0:
                    kept = 0.0
                else:
                    frozen = self._frozen.get(h, 0) if self._frozen_sizes == sizes else 0
                    kept_placed = counts.get(h, 0) + frozen
                    # onboards with no known offload: as the placed ones fare at this size
                    kept = kept_placed + (self.unplaced_onboards * kept_placed / placed if placed else 0.0)
                host_hits = int(round(kept))
                rate_hits = max(0, hits - all_onboards + host_hits)
            else:
                extra = min(wi.extra_hits_at(h), missed)
                host_hits = all_onboards + extra
                rate_hits = hits + extra
            rate = rate_hits / lookups if lookups else None
            best = bound.get(gpu + h)
            optimal = None if best is None or not refs else best / len(refs)
            if optimal is not None and rate is not None:
                optimal = max(optimal, rate)
            out.append({"host_blocks": h, "hit_rate": rate, "optimal_hit_rate": optimal, "host_hits": host_hits})
        return out


def advise(points: list[dict[str, Any]], host_blocks: int | None, bytes_per_block: int | None) -> dict[str, Any]:
    """The recommendation in words from a curve (``SizeAdvice.curve``'s points, with ``host_bytes`` where known):
    the smallest step up that buys ``MEANINGFUL_POINTS`` or more, else the smallest host that keeps
    ``KEEPS_SHARE`` of the hits, else that the curve is flat. ``ttft_ms``: None here (the live verdict's TTFT by
    prefix source fills it)."""
    none = {"text": None, "host_blocks": None, "extra_hit_points": None, "ttft_ms": None}
    here = next((p for p in points if p["host_blocks"] == host_blocks), None)
    if here is None or here["hit_rate"] is None or len(points) < 2:
        return {**none, "text": ("no curve yet: no pool sizes (no created event, meta or /metrics) or no block "
                                 "lookups seen")}
    now = here["hit_rate"]

    def size(blocks: int) -> str:
        return format_size(blocks * bytes_per_block) if bytes_per_block else f"{blocks:,} blocks"

    for p in points:
        if p["host_blocks"] > (host_blocks or 0) and p["hit_rate"] is not None:
            gain = 100 * (p["hit_rate"] - now)
            if gain >= MEANINGFUL_POINTS:
                step = p["host_blocks"] - (host_blocks or 0)
                best = p.get("optimal_hit_rate")
                text = (f"+{size(step)} host: +{gain:.1f} pts hits ({100 * now:.1f}% -> {100 * p['hit_rate']:.1f}%)"
                        + (f"; the optimum at this size is {100 * best:.0f}%" if best is not None else ""))
                return {"text": text, "host_blocks": p["host_blocks"], "extra_hit_points": round(gain, 2),
                        "ttft_ms": None}
    if now > 0:
        for p in points:
            if p["host_blocks"] < (host_blocks or 0) and p["hit_rate"] is not None \
                    and p["hit_rate"] >= KEEPS_SHARE * now:
                lost = 100 * (p["hit_rate"] - now)
                text = (f"a smaller host keeps {100 * p['hit_rate'] / now:.0f}% of the hits: {size(p['host_blocks'])}"
                        f" ({lost:+.1f} pts)")
                return {"text": text, "host_blocks": p["host_blocks"], "extra_hit_points": round(lost, 2),
                        "ttft_ms": None}
    return {**none, "text": "no larger host would help: the curve is flat", "host_blocks": host_blocks,
            "extra_hit_points": 0.0}


def format_size(n: int) -> str:
    """Bytes as the advice says them: ``16 GiB``, ``29.8 GiB``, ``512 MiB``, ``0 B``."""
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20)):
        if n >= size:
            return f"{n / size:.1f} {unit}".replace(".0 ", " ")
    return f"{n:,} B"
