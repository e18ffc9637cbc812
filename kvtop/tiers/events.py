"""The KV cache event fold: TensorRT-LLM's ``created`` / ``stored`` / ``removed`` / ``updated`` events, keyed by block
hash, into cached blocks per tier and per priority, block moves (offloads, onboards, evictions) and the event
stream's quality counts (drops, duplicates, restarts, unknown hashes, stale entries). What those numbers mean is in
kvtop/tiers/model.py's docstring; this module is how they are folded fast.

Hot path: ``EventFold.apply`` (the model's ``apply_kv_event``) must keep up with an 8-GPU node's ~50,000 events/s
with room to spare (bench/JOURNAL.md, "Folding KV events"). Each block is one packed int in a dict (see ``Pool``),
the frequent offload, onboard and single-block removal are folded inline, nothing is allocated per removed or
updated event, and a zero-cost ``try`` (CPython 3.11+) turns malformed input into a counted bad record whose
reason is found afterwards, off the hot path.

Knows no other fold: the model hands it the shared ``Ledger`` (now, record counts, bad records) and tells it when
warm-up ends (``warming``); the onboards it counts are host hits (``host_hits``, ``warm_host_hits``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvtop.records import RecordError, parse_engine_dict
from kvtop.records.checks import EVENT_TYPES
from kvtop.tiers.common import (
    MAX_PRIORITY,
    U64,
    UNKNOWN_PRIORITY,
    Bad,
    Ledger,
    describe,
    hash64,
    hash64_list,
    priority_in_range,
    required_count,
    tier_level,
)

GPU = 0
HOST = 1
# The fold's block map holds every cached block plus the stale ones the silent detaches left behind. It is
# pruned (orphans first, then oldest) past this many times the pools' total capacity, plus some slack, so that
# memory stays flat over hours. With no capacity known yet, 2^18 entries (~60 MB) is the cap.
_PRUNE_FACTOR = 2
_PRUNE_SLACK = 1024
_PRUNE_UNKNOWN_CAP = 1 << 18
_NO_WINDOW = object()  # a window_size no event has
_NO_ID = object()      # an event id no event has (no number equals it, so the first event takes the slow path)
# A stored block's (cache_level, priority) -> its code's low byte, for every well-formed pair (None = absent).
# One lookup checks and encodes both, in a third of the time of comparing each.
_CODES: dict[tuple[int | None, int | None], int] = {
    (lvl, pr): (lvl or 0) | ((UNKNOWN_PRIORITY if pr is None else pr) << 1)
    for lvl in (None, 0, 1) for pr in (None, *range(MAX_PRIORITY + 1))}



class Pool:
    """The fold's state for one KV cache (one attention window of one attention-DP rank).

    Each block the fold holds is one int, ``level | priority << 1 | fold_children << 8`` (``priority`` 101 =
    unknown), so that the hot path allocates nothing the garbage collector tracks: with a GC-tracked object per
    block, collections walking the map cost 16 us per stored block in the first version of this fold.
    """

    __slots__ = ("blocks", "parents", "prio", "capacity", "limit")

    def __init__(self) -> None:
        self.blocks: dict[int, int] = {}     # block hash -> packed code
        self.parents: dict[int, int] = {}    # block hash -> parent hash (absent for first blocks of the tree)
        self.prio = [0] * 256                # cached blocks per (code & 0xFF) = level + 2 * priority
        self.capacity: list[int] | None = None  # [primary, secondary] from the created event
        self.limit = _PRUNE_UNKNOWN_CAP  # the block map is pruned past this many entries

    def set_capacity(self, primary: int, secondary: int) -> None:
        self.capacity = [primary, secondary]
        self.limit = _PRUNE_FACTOR * (primary + secondary) + _PRUNE_SLACK

    def clear(self) -> None:
        self.blocks.clear()
        self.parents.clear()
        self.prio[:] = [0] * 256

    def cached(self, level: int) -> int:
        return sum(self.prio[level::2])



def _diagnose_event(event: Any) -> None:
    """Raise ``Bad`` naming the first malformed field of a KV cache event (slow; only after the fold failed).

    Not kvtop/records/checks.py's ``check_event``, on purpose: that is what a kv_event record must be for any
    reader (its shape; the event types are its ``EVENT_TYPES``), this is what the fold takes, a different set of
    events. The fold also folds events that never were records (``TierModel.apply_kv_events`` over an engine's
    list, a JSON string, a Record made by hand), and it takes what the record spec refuses, as TensorRT-LLM
    writes it (a V2 SHA-256 block hash as hex, ``hash64``; an integral float count in ``created``), and refuses
    what that spec lets through (a negative event id, a cache level but 0 or 1, a priority past 100). Answering
    with checks.py's verdict would name the wrong field for those. Speed is not the reason: this runs once per
    bad event, off the hot path."""
    if not isinstance(event, dict):
        raise Bad("event", f"must be an object, got {describe(event)}")
    for key in ("event_id", "data"):
        if key not in event:
            raise Bad(key, "is missing")
    eid = event["event_id"]
    if eid.__class__ is not int or eid < 0:
        raise Bad("event_id", f"must be a non-negative integer, got {describe(eid)}")
    for key in ("window_size", "attention_dp_rank"):
        v = event.get(key)
        if v is not None and (v.__class__ is not int or v < 0):
            raise Bad(key, f"must be a non-negative integer, got {describe(v)}")
    data = event["data"]
    if not isinstance(data, dict):
        raise Bad("data", f"must be an object, got {describe(data)}")
    etype = data.get("type")
    required = {"stored": "blocks", "removed": "block_hashes", "updated": "block_hash",
                "created": "num_blocks_per_cache_level"}
    if not isinstance(etype, str) or etype not in required:
        raise Bad("data.type", f"must be one of {', '.join(EVENT_TYPES)}, got {describe(etype)}")
    if required[etype] not in data:
        raise Bad(f"data.{required[etype]}", "is missing")
    if etype == "stored":
        blocks = data["blocks"]
        if not isinstance(blocks, list):
            raise Bad("data.blocks", f"must be a list, got {describe(blocks)}")
        if data.get("parent_hash") is not None:
            hash64(data["parent_hash"], "data.parent_hash")
        for i, b in enumerate(blocks):
            if not isinstance(b, dict):
                raise Bad(f"data.blocks[{i}]", f"must be an object, got {describe(b)}")
            if "block_hash" not in b:
                raise Bad(f"data.blocks[{i}].block_hash", "is missing")
            hash64(b["block_hash"], f"data.blocks[{i}].block_hash")
            if b.get("cache_level") is not None:
                tier_level(b["cache_level"], f"data.blocks[{i}].cache_level")
            if b.get("priority") is not None:
                priority_in_range(b["priority"], f"data.blocks[{i}].priority")
    elif etype == "removed":
        hashes = data["block_hashes"]
        if not isinstance(hashes, list):
            raise Bad("data.block_hashes", f"must be a list, got {describe(hashes)}")
        hash64_list(hashes, "data.block_hashes")
    elif etype == "updated":
        hash64(data["block_hash"], "data.block_hash")
        for key, check in (("cache_level", tier_level), ("priority", priority_in_range)):
            diff = data.get(key)
            if diff is None:
                continue
            if not isinstance(diff, dict):
                raise Bad(f"data.{key}", f"must be an event_diff object or null, got {describe(diff)}")
            if "new_value" not in diff:
                raise Bad(f"data.{key}.new_value", "is missing")
            check(diff["new_value"], f"data.{key}.new_value")
            if diff.get("old_value") is not None:
                check(diff["old_value"], f"data.{key}.old_value")
    else:
        levels = data["num_blocks_per_cache_level"]
        if not isinstance(levels, list) or not 1 <= len(levels) <= 2:
            raise Bad("data.num_blocks_per_cache_level", f"must be a list of 1 or 2 integers, got {describe(levels)}")
        for i, v in enumerate(levels):
            required_count(v, f"data.num_blocks_per_cache_level[{i}]")


class EventFold:
    """TensorRT-LLM KV cache events -> the blocks each tier caches, per priority, and the moves between tiers."""

    def __init__(self, ledger: Ledger):
        self._ledger = ledger
        self.pools: dict[Any, Pool] = {}       # (attention-DP rank, window) or window -> its pool
        self._eid_next: Any = _NO_ID              # next event id without attention DP (_NO_ID: none seen yet)
        self._next_eid: dict[Any, int] = {}       # per attention-DP rank, with attention DP
        self._win_key: Any = _NO_WINDOW           # the last rank-less pool looked up, and its window_size
        self._win_pool = Pool()  # a placeholder until the first lookup (_NO_WINDOW matches no event)
        self.approx_ranks: set[Any] = set()
        self.dropped = 0
        self.unknown_hashes = 0
        self.unknown_parents = 0
        self.stale_dropped = 0
        self.pruned = 0
        self.duplicates = 0
        self.restarts = 0
        self.offloaded = 0
        self.onboarded = 0
        self.evicted = [0, 0]
        self.evicted_unknown = 0
        self.reuse_seen = False
        # Every onboard is a host hit: counted apart while warming (the model says when warm-up ends).
        self.warming = False
        self.host_hits = 0
        self.warm_host_hits = 0

    def apply(self, event: Any, t: float | None = None) -> None:
        """One TensorRT-LLM KV cache event dict (``{"event_id", "data": {"type", ...}, "window_size"}``).

        The hot path: ``updated`` and ``removed`` (98% of a busy engine's events) are folded inline for a block
        the fold knows; everything else (stored, created, unknown hashes, odd ids, bad input) goes to methods.
        """
        led = self._ledger
        led.touched += 1  # the snapshot's version: a duplicate or out-of-order event changes the quality counts too
        if t is not None and t != led.now and not led.tick(t):
            return
        try:
            data = event["data"]
            etype = data["type"]
            eid = event["event_id"]
            rank = event.get("attention_dp_rank")
            # The next id of the usual rank-less stream is an attribute and the last pool is cached: ~0.2 us of
            # the ~2 us an event costs.
            if rank is None:
                if eid != self._eid_next and not self._event_id_ok(None, eid, etype):
                    return
                window = event.get("window_size")
                pool = self._win_pool if window == self._win_key else self._pool_for(window, None)
            else:
                if rank.__class__ is not int or rank < 0:
                    raise Bad("attention_dp_rank", f"must be a non-negative integer, got {describe(rank)}")
                if eid != self._next_eid.get(rank) and not self._event_id_ok(rank, eid, etype):
                    return
                pool = self._pool_for(event.get("window_size"), rank)
            if etype == "updated":
                h = data["block_hash"]
                cl = data.get("cache_level")
                c = pool.blocks.get(h)  # a hit proves h a well-formed hash: only a miss needs checking
                if c is None or cl is None or data.get("priority") is not None:
                    self._updated(pool, data)
                else:
                    # An offload (0->1) or onboard (1->0) of a known block, the bulk of the stream.
                    nv = cl["new_value"]
                    ov = cl.get("old_value")
                    cur = c & 1
                    if nv != cur:
                        if nv != cur ^ 1:
                            tier_level(nv, "data.cache_level.new_value")  # raises: nv is neither 0 nor 1
                        if ov is not None and ov != cur:
                            self._updated(pool, data)  # an old value the fold disagrees with: the slow path decides
                        else:
                            prio = pool.prio
                            prio[c & 0xFF] -= 1
                            c ^= 1
                            prio[c & 0xFF] += 1
                            pool.blocks[h] = c
                            if nv:
                                self.offloaded += 1
                            else:
                                self._onboarded()
                    elif ov is not None:
                        self._updated(pool, data)  # no level change for the fold; the event's old value decides
            elif etype == "removed":
                hashes = data["block_hashes"]
                if len(hashes) == 1 and hashes.__class__ is list:
                    h = hashes[0]
                    c = pool.blocks.get(h)
                    if c is None or c >= 256:
                        self._removed(pool, data)
                    else:
                        # A leaf the fold knows: its eviction, from the tier the fold has it in.
                        del pool.blocks[h]
                        pool.prio[c & 0xFF] -= 1
                        self.evicted[c & 1] += 1
                        par = pool.parents.pop(h, None)
                        if par is not None:
                            pc = pool.blocks.get(par)
                            if pc is not None:
                                pool.blocks[par] = pc - 256
                else:
                    self._removed(pool, data)
            elif etype == "stored":
                self._stored(pool, data)
            elif etype == "created":
                self._created(pool, data)
            else:
                raise Bad("data.type", f"must be one of created, stored, removed, updated, got {describe(etype)}")
            # Only a well-formed event moves the id on, so a malformed one is a gap the next event reports.
            if rank is None:
                self._eid_next = eid + 1
            else:
                self._next_eid[rank] = eid + 1
            led.applied += 1
        except Bad as exc:
            led.bad(exc.field, exc.problem)
        except Exception as exc:
            self._bad_event(event, exc)

    def apply_drain(self, events: list[Any], t: float) -> list[str] | None:
        """``apply(event, t)`` of each of ``events`` in turn: a drain of one source at one time ``t``, a finite float
        (TierModel.apply_kv_event_records). Returns the reasons of those it could not fold, one each in order
        (``last_bad_reason`` after each), or None when it folded them all.

        The drain's hot events (the next id of the rank-less stream, in the last pool: an offload or onboard of a
        known block, a known leaf's removal) are folded here with the pool's maps, the next id and the counts held
        in locals, one time check a drain; any other event goes to ``apply`` as it is, the locals handed back
        before and read again after. Each event is read and checked before anything changes, so that one the
        loop cannot fold is ``apply``'s from the start. Held equal to ``apply`` one by one after every drain of
        random streams by tests/tiers/test_fold_drain.py.
        """
        if not events:
            return None
        led = self._ledger
        if t != led.now:
            led.tick(t)  # a finite float is never refused; ``apply`` would tick once, for the first event
        apply = self.apply
        bad = led.bad_records
        reasons: list[str] | None = None
        eid_next = self._eid_next
        win_key = self._win_key
        pool = self._win_pool
        blocks, parents, prio = pool.blocks, pool.parents, pool.prio
        evicted = self.evicted
        offloaded = onboarded = folded = 0
        eid: Any = None
        h: Any = None
        nv: Any = None
        c: Any = 0
        for event in events:
            code = 0  # 1: a move of a known block, 2: an update that changes nothing, 3: a known leaf removed
            try:
                data = event["data"]
                eid = event["event_id"]
                # (a rank given, even None, is apply's: the simulator gives none)
                if eid == eid_next and "attention_dp_rank" not in event and event.get("window_size") == win_key:
                    etype = data["type"]
                    if etype == "updated":
                        h = data["block_hash"]
                        cl = data.get("cache_level")
                        c = blocks.get(h)
                        if c is not None and cl is not None and data.get("priority") is None:
                            nv = cl["new_value"]
                            ov = cl.get("old_value")
                            cur = c & 1
                            if nv != cur:
                                if nv == cur ^ 1 and (ov is None or ov == cur):
                                    code = 1
                            elif ov is None:
                                code = 2
                    elif etype == "removed":
                        hashes = data["block_hashes"]
                        if len(hashes) == 1 and hashes.__class__ is list:
                            h = hashes[0]
                            c = blocks.get(h)
                            if c is not None and c < 256:
                                code = 3
            except Exception:
                code = 0
            if code == 1:
                prio[c & 0xFF] -= 1
                c ^= 1
                prio[c & 0xFF] += 1
                blocks[h] = c
                if nv:
                    offloaded += 1
                else:
                    onboarded += 1
            elif code == 3:
                del blocks[h]
                prio[c & 0xFF] -= 1
                evicted[c & 1] += 1
                par = parents.pop(h, None)
                if par is not None:
                    pc = blocks.get(par)
                    if pc is not None:
                        blocks[par] = pc - 256
            elif code == 0:
                self._eid_next = eid_next
                if offloaded or onboarded:
                    self._moved(offloaded, onboarded)
                    offloaded = onboarded = 0
                apply(event, None)
                if led.bad_records != bad:
                    bad = led.bad_records
                    if reasons is None:
                        reasons = []
                    reasons.append(led.last_bad_reason or "")
                eid_next = self._eid_next
                win_key = self._win_key
                pool = self._win_pool
                blocks, parents, prio = pool.blocks, pool.parents, pool.prio
                continue
            eid_next = eid + 1
            folded += 1
        self._eid_next = eid_next
        if offloaded or onboarded:
            self._moved(offloaded, onboarded)
        led.touched += folded
        led.applied += folded
        return reasons

    def _moved(self, offloaded: int, onboarded: int) -> None:
        """``apply_drain``'s offloads and onboards, counted as ``apply`` counts each."""
        self.offloaded += offloaded
        if onboarded:
            self.onboarded += onboarded
            self.reuse_seen = True
            if self.warming:
                self.warm_host_hits += onboarded
            else:
                self.host_hits += onboarded

    def _pool_for(self, window: Any, rank: Any) -> Pool:
        key = window if rank is None else (rank, window)
        pool = self.pools.get(key)
        if pool is None:
            if window is not None and (window.__class__ is not int or window < 0):
                raise Bad("window_size", f"must be a non-negative integer, got {describe(window)}")
            if len(self.pools) >= 64:  # 64 windows x ranks is far past any real model; refuse a flood of keys
                raise Bad("window_size", "more than 64 distinct (window, rank) pools")
            pool = self.pools[key] = Pool()
        if rank is None:
            self._win_key = window
            self._win_pool = pool
        return pool

    def _event_id_ok(self, rank: Any, eid: Any, etype: Any) -> bool:
        """An event id that is not the next one: a first event, a gap, a duplicate or a restart."""
        if eid.__class__ is not int or eid < 0:
            raise Bad("event_id", f"must be a non-negative integer, got {describe(eid)}")
        expected = (None if self._eid_next is _NO_ID else self._eid_next) if rank is None else self._next_eid.get(rank)
        if expected is None:
            if eid != 0:
                self.approx_ranks.add(rank)  # attached mid-stream: whatever came before is unknown
            return True
        if eid == expected:
            return True
        if eid > expected:
            self.dropped += eid - expected
            self.approx_ranks.add(rank)
            return True
        if eid == expected - 1 and etype != "created":
            self.duplicates += 1  # the same id again: a re-delivered event, skipped
            return False
        # Ids went backwards: the engine (or its KV cache manager) was re-created. Its tree starts empty.
        self.restarts += 1
        for key in [k for k in self.pools if (k[0] if isinstance(k, tuple) else None) == rank]:
            del self.pools[key]
        self._win_key = _NO_WINDOW
        if eid == 0 and etype == "created":
            self.approx_ranks.discard(rank)
        else:
            self.approx_ranks.add(rank)
        return True

    def _created(self, pool: Pool, data: Mapping[str, Any]) -> None:
        levels = data["num_blocks_per_cache_level"]
        if not isinstance(levels, list) or not 1 <= len(levels) <= 2:
            raise Bad("data.num_blocks_per_cache_level", f"must be a list of 1 or 2 integers, got {describe(levels)}")
        primary = required_count(levels[0], "data.num_blocks_per_cache_level[0]")
        secondary = required_count(levels[1], "data.num_blocks_per_cache_level[1]") if len(levels) > 1 else 0
        # A second created event for the same window without an id restart is a new manager: start over.
        pool.clear()
        pool.set_capacity(primary, secondary)

    def _stored(self, pool: Pool, data: Mapping[str, Any]) -> None:
        blocks_in = data["blocks"]
        if blocks_in.__class__ is not list:
            raise Bad("data.blocks", f"must be a list, got {describe(blocks_in)}")
        parent = data.get("parent_hash")
        if parent is not None and (parent.__class__ is not int or parent < 0 or parent >= U64):
            parent = hash64(parent, "data.parent_hash")
        # Read and check every block before changing anything, so a bad one leaves the fold as it was. A tuple per
        # block is cheaper than reading each dict twice.
        items = []
        codes = _CODES
        for b in blocks_in:
            h = b["block_hash"]
            c = codes.get((b.get("cache_level"), b.get("priority")))
            if c is None or h.__class__ is not int or h < 0 or h >= U64:
                self._stored_slow(pool, blocks_in, parent)
                return
            items.append((h, c))
        blocks = pool.blocks
        parents = pool.parents
        prio = pool.prio
        # Each block's code is written once: the previous block's stays pending in prev_c until we know whether
        # the next block is a new child of it.
        prev_h = parent
        prev_c = -1
        for h, c in items:
            old = blocks.get(h)
            if old is None:
                if prev_c >= 0:
                    prev_c += 256
                elif prev_h is not None:
                    pc = blocks.get(prev_h)
                    if pc is None:
                        self.unknown_parents += 1
                    else:
                        blocks[prev_h] = pc + 256
                if prev_h is not None:
                    parents[h] = prev_h
                code = c
            else:
                # The reuse tree never holds one hash twice, so the entry the fold still has was already gone:
                # a silent partial-reuse detach (or a dropped removed event). Replace it in place.
                if prev_c >= 0:
                    blocks[prev_h] = prev_c  # type: ignore[index]
                    prev_c = -1
                prio[old & 0xFF] -= 1
                self.stale_dropped += 1
                self._reparent(pool, h, prev_h)
                code = c | (old >> 8 << 8)
            prio[c] += 1
            if prev_c >= 0:
                blocks[prev_h] = prev_c  # type: ignore[index]
            prev_h = h
            prev_c = code
        if prev_c >= 0:
            blocks[prev_h] = prev_c  # type: ignore[index]
        if len(blocks) > pool.limit:
            self._prune(pool)

    def _stored_slow(self, pool: Pool, blocks_in: list[Any], parent: int | None) -> None:
        """Validate with field names; a signed 64-bit hash is unwrapped, anything else is a bad record."""
        norm: list[dict[str, Any]] = []
        for i, b in enumerate(blocks_in):
            if not isinstance(b, dict):
                raise Bad(f"data.blocks[{i}]", f"must be an object, got {describe(b)}")
            if "block_hash" not in b:
                raise Bad(f"data.blocks[{i}].block_hash", "is missing")
            h = hash64(b["block_hash"], f"data.blocks[{i}].block_hash")
            lvl = b.get("cache_level")
            pr = b.get("priority")
            norm.append({"block_hash": h,
                         "cache_level": None if lvl is None else tier_level(lvl, f"data.blocks[{i}].cache_level"),
                         "priority": None if pr is None else priority_in_range(pr, f"data.blocks[{i}].priority")})
        self._stored(pool, {"blocks": norm, "parent_hash": parent})

    @staticmethod
    def _reparent(pool: Pool, h: int, new_parent: int | None) -> None:
        """Move ``h`` (already in the map) under ``new_parent``, keeping the parents' child counts right."""
        blocks, parents = pool.blocks, pool.parents
        old_parent = parents.get(h)
        if old_parent == new_parent:
            return
        if old_parent is not None:
            pc = blocks.get(old_parent)
            if pc is not None and pc >= 256:
                blocks[old_parent] = pc - 256
        if new_parent is None:
            parents.pop(h, None)
        else:
            parents[h] = new_parent
            pc = blocks.get(new_parent)
            if pc is not None:
                blocks[new_parent] = pc + 256

    def _removed(self, pool: Pool, data: Mapping[str, Any]) -> None:
        hashes = data["block_hashes"]
        if hashes.__class__ is not list:
            raise Bad("data.block_hashes", f"must be a list, got {describe(hashes)}")
        for h in hashes:  # checked up front, so a bad hash leaves the fold as it was
            if h.__class__ is not int or h < 0 or h >= U64:
                hashes = hash64_list(hashes, "data.block_hashes")
                break
        blocks = pool.blocks
        parents = pool.parents
        prio = pool.prio
        evicted = self.evicted
        for h in hashes:
            c = blocks.pop(h, None)
            if c is None:
                self.unknown_hashes += 1
                self.evicted_unknown += 1
                continue
            prio[c & 0xFF] -= 1
            evicted[c & 1] += 1
            par = parents.pop(h, None)
            if par is not None:
                pc = blocks.get(par)
                if pc is not None:
                    blocks[par] = pc - 256
            if c >= 256:
                # Children still in the fold when their parent goes were already out of the tree: freeChildren
                # removes a subtree children first.
                self._drop_children(pool, h)

    def _drop_children(self, pool: Pool, parent: int) -> None:
        blocks, parents = pool.blocks, pool.parents
        stack = [parent]
        while stack:
            p = stack.pop()
            for h in [k for k, v in parents.items() if v == p]:
                del parents[h]
                c = blocks.pop(h, None)
                if c is None:
                    continue
                pool.prio[c & 0xFF] -= 1
                self.stale_dropped += 1
                if c >= 256:
                    stack.append(h)

    def _updated(self, pool: Pool, data: Mapping[str, Any]) -> None:
        h = data["block_hash"]
        cl = data.get("cache_level")
        pd = data.get("priority")
        blocks = pool.blocks
        c = blocks.get(h)  # a hit proves h a well-formed hash: only a miss needs checking
        if c is None:
            self._updated_unknown(pool, h, cl, pd)
            return
        if cl is not None:
            nv = tier_level(cl["new_value"], "data.cache_level.new_value")
            ov = cl.get("old_value")
            if ov is not None:
                ov = tier_level(ov, "data.cache_level.old_value")
            cur = c & 1
            if pd is not None:
                self._check_priority_diff(pd)
            if nv != cur:
                prio = pool.prio
                prio[c & 0xFF] -= 1
                c ^= 1
                prio[c & 0xFF] += 1
                blocks[h] = c
            # Count the move the event reports (its old value, or the fold's when the event has none).
            if (cur if ov is None else ov) != nv:
                if nv:
                    self.offloaded += 1
                else:
                    self._onboarded()
        if pd is not None:
            new_prio = self._check_priority_diff(pd)
            if new_prio != (c >> 1) & 0x7F:
                prio = pool.prio
                prio[c & 0xFF] -= 1
                c = (c & ~0xFE) | (new_prio << 1)
                prio[c & 0xFF] += 1
                blocks[h] = c

    @staticmethod
    def _check_priority_diff(pd: Any) -> int:
        if pd.__class__ is not dict:
            raise Bad("data.priority", f"must be an event_diff object or null, got {describe(pd)}")
        return priority_in_range(pd.get("new_value"), "data.priority.new_value")

    def _updated_unknown(self, pool: Pool, h: Any, cl: Any, pd: Any) -> None:
        """An ``updated`` event for a hash the fold does not hold (dropped events, or attached mid-stream)."""
        h = hash64(h, "data.block_hash")
        nv = ov = None
        if cl is not None:
            if cl.__class__ is not dict:
                raise Bad("data.cache_level", f"must be an event_diff object or null, got {describe(cl)}")
            nv = tier_level(cl.get("new_value"), "data.cache_level.new_value")
            ov = cl.get("old_value")
            if ov is not None:
                ov = tier_level(ov, "data.cache_level.old_value")
        new_prio = None if pd is None else self._check_priority_diff(pd)
        if h in pool.blocks:  # a signed hash that unwrapped to a known one
            self._updated(pool, {"block_hash": h, "cache_level": cl, "priority": pd})
            return
        self.unknown_hashes += 1
        if nv is None:
            return
        # TensorRT-LLM reports moves only for blocks in the reuse tree: after dropped events, the best the fold can
        # know is that this block is cached in tier nv now.
        c = nv | ((UNKNOWN_PRIORITY if new_prio is None else new_prio) << 1)
        pool.blocks[h] = c
        pool.prio[c] += 1
        if (1 - nv if ov is None else ov) != nv:
            if nv:
                self.offloaded += 1
            else:
                self._onboarded()

    def _onboarded(self) -> None:
        # Every onboard is a reused block served from host memory: a host hit.
        self.onboarded += 1
        self.reuse_seen = True
        if self.warming:
            self.warm_host_hits += 1
        else:
            self.host_hits += 1

    def _prune(self, pool: Pool) -> None:
        """Keep the map bounded: drop orphans (parent gone: certainly stale), then the oldest entries."""
        blocks, parents = pool.blocks, pool.parents
        doomed = [h for h, p in parents.items() if p not in blocks]
        target = pool.limit - _PRUNE_SLACK // 2
        if len(blocks) - len(doomed) > target:
            orphan_set = set(doomed)
            extra = len(blocks) - len(doomed) - target
            doomed += [h for h in blocks if h not in orphan_set][:extra]
        for h in doomed:
            c = blocks.pop(h, None)
            if c is None:
                continue
            pool.prio[c & 0xFF] -= 1
            par = parents.pop(h, None)
            if par is not None:
                pc = blocks.get(par)
                if pc is not None and pc >= 256:
                    blocks[par] = pc - 256
            self.pruned += 1

    def _bad_event(self, event: Any, exc: Exception) -> None:
        """The hot path only knows that something broke; find the field by checking the event thoroughly."""
        if isinstance(event, (str, bytes)):
            # A JSON string: parse it off the hot path (dicts are what TensorRT-LLM's API returns).
            try:
                parsed = parse_engine_dict(event, "event")
            except RecordError as err:
                self._ledger.bad(err.field, err.problem)
                return
            self.apply(parsed)
            return
        try:
            _diagnose_event(event)
        except Bad as bad:
            self._ledger.bad(bad.field, bad.problem)
            return
        self._ledger.bad("event", f"{type(exc).__name__}: {exc}")

    # ============================================================================================ read side

    @property
    def seen(self) -> bool:
        """Whether any TensorRT-LLM event came (the cached counts are known only then)."""
        return self._eid_next is not _NO_ID or bool(self._next_eid)

    @property
    def next_event_id(self) -> int | None:
        """The id the next event of the usual stream (no attention DP) should carry; None before any event."""
        return None if self._eid_next is _NO_ID else self._eid_next  # type: ignore[no-any-return]

    @property
    def approximate(self) -> bool:
        """Counts folded from events may be off: dropped events, a mid-stream attach, unknown hashes, pruning."""
        return bool(self.approx_ranks) or self.unknown_hashes > 0 or self.pruned > 0

    def cached(self, level: int) -> int:
        """Cached blocks in a tier (GPU 0, host 1), over every pool, before any clamp to the tier's capacity."""
        return sum(p.cached(level) for p in self.pools.values())

    def created_capacity(self, level: int) -> int | None:
        """A tier's size from the ``created`` events (summed over attention windows), or None before one."""
        caps = [p.capacity[level] for p in self.pools.values() if p.capacity is not None]
        return sum(caps) if caps else None

    def cached_by_priority(self, level: int) -> dict[int | None, int]:
        """Cached blocks in a tier per retention priority (``None`` = a priority no event gave), unclamped."""
        per: dict[int | None, int] = {}
        for p in self.pools.values():
            for prio in range(UNKNOWN_PRIORITY + 1):
                n = p.prio[level + 2 * prio]
                if n:
                    key = None if prio == UNKNOWN_PRIORITY else prio
                    per[key] = per.get(key, 0) + n
        return per

    @property
    def entries(self) -> int:
        """Blocks the fold holds (cached ones plus not-yet-reconciled stale ones); bounded, see ``_prune``."""
        return sum(len(p.blocks) for p in self.pools.values())
