"""FROZEN COPY for bench/bench_sim.py: kvtop/engines/sim/block_manager.py as of commit 842a6f7, before the speed
work, kept to measure the optimized one against in the same run. Do not edit; do not import from kvtop code.

TensorRT-LLM's KV cache block manager (one attention window, beam width 1), in Python.

This follows ``cpp/tensorrt_llm/batch_manager/kvCacheManager.cpp`` (``WindowBlockManager``), ``evictionPolicy.cpp``
(``LRUEvictionPolicy``) and ``kvCacheEventManager.cpp`` as of TensorRT-LLM 1.2 / main, step by step, so that the
same calls give the same block ids, the same counters and the same event stream. Notes on what TensorRT-LLM does
that a reader may not expect (each one is reproduced on purpose):

- Offload happens only on eviction (``getFreeBlock``): a primary victim holding tokens, with priority >=
  ``secondary_offload_min_priority`` (default 30), while a host block is free and ``onboard_blocks`` is on, swaps
  its memory slot with the front host block. The block keeps its id, key and tree position; its tier flips.
  The offloaded block is re-queued in the host queue *without* its duration (``claimBlock`` clears it).
- A victim that still has a stale key but is not in the reuse tree (a duplicate of an already-stored block, or the
  last block of a finished request) is offloaded too, with no event: PCIe traffic no event stream can show.
  ``silent_offloads`` counts them.
- ``freeChildren`` detaches the victim's whole subtree from the reuse tree (``removed`` events, children first)
  and claims only the victim itself; idle descendants stay in the free queues, no longer reusable. (An older
  TensorRT-LLM claimed every descendant, which took idle ones out of the free pool for good; 1.1/1.2 only
  detach them, and a maintainer confirms it in PR #11173.)
- A prompt that partially matches an idle leaf takes it out of the tree with no ``removed`` event
  (``claimLeafBlock``). ``silent_detaches`` counts them.
- Children of a radix-tree node are searched in insertion order for partial matches. TensorRT-LLM iterates a
  ``std::unordered_map``, whose order is the library's; only ties between equally long partial matches can differ.
- Block hashes are TensorRT-LLM's ``BlockKeyHasher`` (unsigned 64-bit, chained through the parent's hash); they
  are computed only while events are enabled, the one place they are visible.
"""

from __future__ import annotations

import heapq
import time
from bisect import insort
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

from kvtop.engines.sim.retention import DEFAULT_PRIORITY, MAX_PRIORITY, KvCacheRetentionConfig

PRIMARY = 0
SECONDARY = 1
DEFAULT_SECONDARY_OFFLOAD_MIN_PRIORITY = 30  # evictionPolicy.cpp kDefaultSecondaryOffloadMinPriority

_M64 = (1 << 64) - 1
_M32 = (1 << 32) - 1


class NoFreeBlockError(RuntimeError):
    """The pool has no free block at the level asked for (TensorRT-LLM: "No free block found")."""


def block_key_hash(tokens: Sequence[int], parent_hash: int) -> int:
    """TensorRT-LLM's ``BlockKeyHasher::hash`` for a key of plain token ids (no extra ids, no LoRA).

    C++ arithmetic is reproduced: the per-token mix is 32-bit, ``a + 0x9e3779b9`` wraps at 2^32 before it is
    widened, and the seed is 64-bit.
    """
    seed = (len(tokens) ^ (parent_hash * 0xBF58476D1CE4E5B9)) & _M64
    for token in tokens:
        a = token & _M32
        a = (((a >> 16) ^ a) * 0x45D9F3B) & _M32
        a = (((a >> 16) ^ a) * 0x45D9F3B) & _M32
        a = (a >> 16) ^ a
        seed ^= (((a + 0x9E3779B9) & _M32) + ((seed << 6) & _M64) + (seed >> 2)) & _M64
    return seed


class _Block:
    """``KVCacheBlock``: an identity (id, key, tree links, priority) bound to a memory slot of one tier."""

    __slots__ = ("id", "primary", "key", "is_full", "hash", "prev", "prev_in_seq", "children", "refs",
                 "priority", "duration_ms", "queued")

    def __init__(self, block_id: int, primary: bool):
        self.id = block_id
        self.primary = primary
        self.key: tuple[int, ...] = ()
        self.is_full = False
        self.hash = 0
        self.prev: _Block | None = None          # parent in the radix tree (the root for first blocks)
        self.prev_in_seq: _Block | None = None   # previous block of the sequence that last added it
        self.children: dict[tuple[int, ...], _Block] = {}
        self.refs = 0
        self.priority = DEFAULT_PRIORITY
        self.duration_ms: int | None = None
        self.queued: tuple[int, int] | None = None  # (cache level, priority) of the free queue holding it

    @property
    def level(self) -> int:
        return PRIMARY if self.primary else SECONDARY

    def in_tree(self) -> bool:
        return bool(self.key) and self.prev is not None


class _Sequence:
    __slots__ = ("request_id", "tokens", "blocks", "decode_priority", "decode_duration_ms")

    def __init__(self, request_id: Any, tokens: list[int], retention: KvCacheRetentionConfig | None):
        self.request_id = request_id
        self.tokens = tokens
        self.blocks: list[_Block] = []
        self.decode_priority = retention.decode_retention_priority if retention else DEFAULT_PRIORITY
        self.decode_duration_ms = retention.decode_duration_ms if retention else None


class _EvictionPolicy:
    """``LRUEvictionPolicy``: 101 FIFO queues per cache level, lowest priority and oldest release first."""

    def __init__(self, blocks: list[_Block], sizes: tuple[int, int], offload_min_priority: int,
                 clock_ms: Callable[[], float]):
        self.queues: list[list[OrderedDict[int, _Block]]] = [
            [OrderedDict() for _ in range(MAX_PRIORITY + 1)] for _ in range(2)]
        self.nonempty: list[list[int]] = [[], []]  # sorted priorities whose queue is non-empty, per level
        self.num_free = [0, 0]
        self.offload_min_priority = offload_min_priority
        self.clock_ms = clock_ms
        self.expiry_heap: list[tuple[float, int, _Block]] = []
        self.expiry: dict[int, float] = {}  # block id -> its live expiration (heap entries may be stale)
        start = 0
        for level in (PRIMARY, SECONDARY):
            for block in blocks[start:start + sizes[level]]:
                self._push(block, to_front=False)
            start += sizes[level]

    def _push(self, block: _Block, to_front: bool) -> None:
        level, prio = block.level, block.priority
        q = self.queues[level][prio]
        if not q:
            insort(self.nonempty[level], prio)
        q[block.id] = block
        if to_front:
            q.move_to_end(block.id, last=False)
        block.queued = (level, prio)
        self.num_free[level] += 1

    def _remove(self, block: _Block) -> bool:
        if block.queued is None:
            return False
        level, prio = block.queued  # the stored place, not the block's current tier or priority
        q = self.queues[level][prio]
        del q[block.id]
        if not q:
            self.nonempty[level].remove(prio)
        self.num_free[level] -= 1
        block.queued = None
        return True

    def get_free_block(self, level: int) -> tuple[_Block, bool]:
        prios = self.nonempty[level]
        if not prios:
            tier = "GPU (primary)" if level == PRIMARY else "host (secondary)"
            raise NoFreeBlockError(f"no free block in the {tier} pool")
        prio = prios[0]
        block = next(iter(self.queues[level][prio].values()))
        return block, level == PRIMARY and prio >= self.offload_min_priority

    def release(self, block: _Block, to_front: bool = False) -> None:
        self._push(block, to_front)
        if block.duration_ms is not None and block.priority != DEFAULT_PRIORITY:
            expiration = self.clock_ms() + block.duration_ms
            self.expiry[block.id] = expiration
            heapq.heappush(self.expiry_heap, (expiration, block.id, block))

    def claim(self, block: _Block, priority: int | None = None, duration_ms: int | None = None) -> None:
        if self._remove(block):
            self.expiry.pop(block.id, None)  # only when it left a free queue, as in TensorRT-LLM
        if priority is not None:
            block.priority = priority
        block.duration_ms = duration_ms

    def refresh(self) -> int:
        """Expired timed priorities fall back to 35 (tail of that queue). Returns how many expired."""
        now = self.clock_ms()
        expired = 0
        heap = self.expiry_heap
        while heap:
            expiration, block_id, block = heap[0]
            if self.expiry.get(block_id) != expiration:
                heapq.heappop(heap)  # stale entry: claimed, or re-released with a new expiration
                continue
            if expiration > now:
                break
            heapq.heappop(heap)
            del self.expiry[block_id]
            if self._remove(block):
                block.priority = DEFAULT_PRIORITY
                self._push(block, to_front=False)
                expired += 1
        return expired


class BlockManager:
    """One attention window of TensorRT-LLM 1.2's KV cache manager, beam width 1, block reuse on."""

    def __init__(self, primary_blocks: int, secondary_blocks: int = 0, tokens_per_block: int = 32, *,
                 enable_partial_reuse: bool = True, copy_on_partial_reuse: bool = True, onboard_blocks: bool = True,
                 secondary_offload_min_priority: int | None = DEFAULT_SECONDARY_OFFLOAD_MIN_PRIORITY,
                 event_buffer_max_size: int = 0, clock_ms: Callable[[], float] | None = None,
                 window_size: int | None = None, enable_block_reuse: bool = True):
        if primary_blocks <= 0:
            raise ValueError(f"primary_blocks: must be > 0, got {primary_blocks}")
        if secondary_blocks < 0:
            raise ValueError(f"secondary_blocks: must be >= 0, got {secondary_blocks}")
        if tokens_per_block <= 0:
            raise ValueError(f"tokens_per_block: must be > 0, got {tokens_per_block}")
        if event_buffer_max_size < 0:
            raise ValueError(f"event_buffer_max_size: must be >= 0, got {event_buffer_max_size}")
        self.primary_blocks = primary_blocks
        self.secondary_blocks = secondary_blocks
        self.tokens_per_block = tokens_per_block
        self.enable_partial_reuse = enable_partial_reuse
        self.copy_on_partial_reuse = copy_on_partial_reuse
        self.onboard_blocks = onboard_blocks
        # Without reuse TensorRT-LLM allocates plainly and stores nothing: blocks never get keys, so nothing is
        # ever offloaded either (getFreeBlock offloads only blocks holding tokens).
        self.enable_block_reuse = enable_block_reuse
        self.secondary_offload_min_priority = (DEFAULT_SECONDARY_OFFLOAD_MIN_PRIORITY
                                               if secondary_offload_min_priority is None
                                               else secondary_offload_min_priority)
        self.window_size = window_size if window_size is not None else primary_blocks * tokens_per_block
        self.clock_ms = clock_ms or (lambda: time.monotonic() * 1000.0)

        self._blocks = [_Block(i, True) for i in range(primary_blocks)]
        self._blocks += [_Block(primary_blocks + i, False) for i in range(secondary_blocks)]
        self._root = _Block(-1, True)  # kCachedBlocksRootId; hash 0
        self._policy = _EvictionPolicy(self._blocks, (primary_blocks, secondary_blocks),
                                       self.secondary_offload_min_priority, self.clock_ms)
        self._seqs: dict[Any, _Sequence] = {}

        # kvCacheStats counters (cumulative since construction)
        self.alloc_total_blocks = 0
        self.alloc_new_blocks = 0
        self.reused_blocks = 0
        self.missed_blocks = 0
        # What an outside observer cannot see (the simulator's own truth, for tests and the what-if).
        self.offloaded_blocks = 0        # every GPU->host copy
        self.silent_offloads = 0         # ...of which for blocks not in the reuse tree (no event)
        self.onboarded_blocks = 0        # every host->GPU onboard on reuse
        self.evicted_blocks = [0, 0]     # blocks detached from the tree with a removed event, by tier
        self.silent_detaches = 0         # partial-reuse detaches with no event
        self.reused_tokens = 0
        self.total_input_tokens = 0

        # Events: queued per iteration, flushed into a bounded buffer (kvCacheEventManager.cpp).
        self._events_enabled = event_buffer_max_size > 0
        self._event_buffer_max_size = event_buffer_max_size
        self._event_queue: list[dict[str, Any]] = []
        self._event_buffer: list[dict[str, Any]] = []
        self._next_event_id = 0
        self.dropped_events = 0
        self._enqueue({"type": "created", "num_blocks_per_cache_level": [primary_blocks, secondary_blocks]})

    # ------------------------------------------------------------------------------------------- events

    def _enqueue(self, data: dict[str, Any]) -> None:
        if not self._events_enabled:
            return
        self._event_queue.append({"event_id": self._next_event_id, "data": data, "window_size": self.window_size})
        self._next_event_id += 1

    def _enqueue_removed(self, block: _Block) -> None:
        if not self._events_enabled:
            return
        last = self._event_queue[-1] if self._event_queue else None
        if last is not None and last["data"]["type"] == "removed":
            last["data"]["block_hashes"].append(block.hash)  # coalesced, as enqueueRemovedEvent does
        else:
            self._enqueue({"type": "removed", "block_hashes": [block.hash]})

    def _enqueue_updated(self, block: _Block, cache_level: tuple[int, int] | None,
                         priority: tuple[int, int] | None) -> None:
        if not self._events_enabled:
            return

        def diff(change: tuple[int, int] | None) -> dict[str, Any] | None:
            # TensorRT-LLM 1.x's Python serializer would raise on the missing half (trtllm-kv.md 2.2); kvtop emits
            # null there, which is what a fixed serializer gives and what the fold accepts.
            if change is None:
                return None
            return {"type": "event_diff", "new_value": change[1], "old_value": change[0]}

        self._enqueue({"type": "updated", "block_hash": block.hash, "cache_level": diff(cache_level),
                       "priority": diff(priority)})

    def _enqueue_stored(self, blocks: list[_Block]) -> None:
        if not self._events_enabled or not blocks:
            return
        parent = blocks[0].prev
        self._enqueue({
            "type": "stored",
            "parent_hash": parent.hash if parent is not None and parent.id >= 0 else None,
            "blocks": [{"type": "stored_block", "block_hash": b.hash,
                        "tokens": [{"type": "unique_token", "token_id": t, "token_extra_id": 0} for t in b.key],
                        "cache_level": b.level, "priority": b.priority} for b in blocks],
        })

    def flush_events(self) -> None:
        """End of an iteration: move queued events into the bounded buffer, dropping the oldest past its size."""
        if not self._event_queue:
            return
        self._event_buffer.extend(self._event_queue)
        self._event_queue = []
        excess = len(self._event_buffer) - self._event_buffer_max_size
        if excess > 0:
            del self._event_buffer[:excess]
            self.dropped_events += excess

    def take_events(self) -> list[dict[str, Any]]:
        """Drain the event buffer (flushing this iteration's queue first). Events are drained once."""
        self.flush_events()
        out, self._event_buffer = self._event_buffer, []
        return out

    # ------------------------------------------------------------------------------------------- allocation

    def _set_hash(self, block: _Block, parent_hash: int) -> None:
        if self._events_enabled:
            block.hash = block_key_hash(block.key, parent_hash)

    def _free_children(self, block: _Block) -> None:
        """``freeChildren``: detach the block and its descendants from the tree, children first."""
        for child in list(block.children.values()):
            self._free_children(child)
        if block.in_tree():
            self._enqueue_removed(block)
            self.evicted_blocks[block.level] += 1
        self._detach(block)

    @staticmethod
    def _detach(block: _Block) -> None:
        """``freeLeafBlock``: unlink from the parent (by key, as removeNextBlock does)."""
        if block.prev is not None:
            block.prev.children.pop(block.key, None)
            block.prev = None

    def _claim_leaf(self, block: _Block, priority: int | None, duration_ms: int | None) -> None:
        self._policy.claim(block, priority, duration_ms)
        self._detach(block)

    def _get_free_block(self, priority: int, duration_ms: int | None) -> _Block:
        policy = self._policy
        block, can_offload = policy.get_free_block(PRIMARY)
        if not block.key:
            self.alloc_new_blocks += 1
        self.alloc_total_blocks += 1
        if block.key and can_offload and policy.num_free[SECONDARY] > 0 and self.onboard_blocks:
            policy.claim(block)  # keeps its priority; drops its duration
            target, _ = policy.get_free_block(SECONDARY)
            block.primary, target.primary = target.primary, block.primary  # swap memory slots
            self.offloaded_blocks += 1
            if block.in_tree():
                self._enqueue_updated(block, (PRIMARY, SECONDARY), None)
            else:
                self.silent_offloads += 1
            policy.release(block)  # now in the host queue, same priority
            block = target
        self._free_children(block)
        policy.claim(block, priority, duration_ms)
        return block

    def _onboard(self, block: _Block) -> None:
        if self.onboard_blocks and not block.primary:
            victim = self._get_free_block(DEFAULT_PRIORITY, None)
            block.primary, victim.primary = victim.primary, block.primary
            self.onboarded_blocks += 1
            self._enqueue_updated(block, (SECONDARY, PRIMARY), None)
            self._policy.release(victim)  # the victim object now owns the host slot

    def _find_matching(self, root: _Block, key: tuple[int, ...]) -> tuple[bool, int, _Block | None]:
        if not key or not root.children:
            return False, 0, None
        block = root.children.get(key)
        if block is not None:
            return not block.is_full, len(key), block
        if self.enable_partial_reuse:
            best_n, best = 0, None
            for child_key, child in root.children.items():
                if self.copy_on_partial_reuse or (child.refs == 0 and not child.children):
                    n = 0
                    for a, b in zip(child_key, key):
                        if a != b:
                            break
                        n += 1
                    if n > best_n:
                        best_n, best = n, child
            if best is not None:
                return True, best_n, best
        return False, 0, None

    def _chop(self, tokens: Sequence[int], usable: int, allow_partial: bool) -> list[tuple[int, ...]]:
        tpb = self.tokens_per_block
        full_end = usable - usable % tpb
        keys = [tuple(tokens[i:i + tpb]) for i in range(0, full_end, tpb)]
        if allow_partial and full_end < usable:
            keys.append(tuple(tokens[full_end:usable]))
        return keys

    def _add_to_seq(self, seq: _Sequence, block: _Block) -> None:
        block.refs += 1
        block.prev_in_seq = seq.blocks[-1] if seq.blocks else None
        seq.blocks.append(block)

    # ------------------------------------------------------------------------------------------- public API

    def add_sequence(self, request_id: Any, token_ids: Sequence[int],
                     retention: KvCacheRetentionConfig | None = None) -> int:
        """``addSequence``: match the prompt against the reuse tree, allocate the rest.

        Returns the number of prompt tokens whose KV was reused (the context position), at most ``len - 1``.
        Raises :class:`NoFreeBlockError` when the GPU pool runs out part-way, as TensorRT-LLM does; callers
        schedule only requests that fit.
        """
        if request_id in self._seqs:
            raise ValueError(f"request {request_id!r} is already in the KV cache manager")
        tokens = list(token_ids)
        length = len(tokens)
        if length == 0:
            raise ValueError(f"request {request_id!r}: an empty prompt has no KV cache")
        tpb = self.tokens_per_block
        seq = _Sequence(request_id, tokens, retention)
        self._seqs[request_id] = seq
        keys = self._chop(tokens, length - 1, True)
        if length % tpb == 1:
            keys.append(())  # the last token sits alone in a block of its own
        num_blocks = -(-length // tpb)
        per_block = (retention.per_block(tpb, length) if retention is not None
                     else [(None, None)] * num_blocks)

        matched_tokens = 0
        search: _Block | None = self._root if self.enable_block_reuse else None
        if not self.enable_block_reuse:
            for _ in range(num_blocks):  # allocateBlock: decode retention applies to every block here
                self._add_to_seq(seq, self._get_free_block(seq.decode_priority, seq.decode_duration_ms))
            self.total_input_tokens += length
            return 0
        for bi in range(num_blocks):
            # With one token per block there is one block more than keys (C++ guards blockItr != end)
            key = keys[bi] if bi < len(keys) else ()
            prio, dur = per_block[bi]
            partial, num_matched, match = (self._find_matching(search, key) if search is not None
                                           else (False, 0, None))
            if match is not None:
                matched_tokens += num_matched if num_matched > 0 else len(key)
                if prio is not None and match.priority != prio:
                    self._enqueue_updated(match, None, (match.priority, prio))
                if partial:
                    if match.refs > 0 or match.children:
                        # Somebody uses it, or it has children: copy the matched tokens into a new block, which
                        # takes the whole key of this prompt block (1.2 sets key and hash right after the copy).
                        match = self._get_free_block(match.priority, match.duration_ms)
                        match.key = key
                        match.is_full = len(key) == tpb
                        self._set_hash(match, seq.blocks[-1].hash if seq.blocks else 0)
                    else:
                        if match.in_tree():
                            self.silent_detaches += 1
                        self._claim_leaf(match, prio, dur)
                    search = None
                else:
                    self._policy.claim(match, prio, dur)
                    search = match
                self._onboard(match)
                self._add_to_seq(seq, match)
                self.reused_blocks += 1
            else:
                block = self._get_free_block(prio if prio is not None else DEFAULT_PRIORITY, dur)
                self._add_to_seq(seq, block)
                search = None
                block.key = key
                block.is_full = len(key) == tpb
                self._set_hash(block, block.prev_in_seq.hash if block.prev_in_seq is not None else 0)
                self.missed_blocks += 1
        self.reused_tokens += matched_tokens
        self.total_input_tokens += length
        return matched_tokens

    def add_token(self, request_id: Any, token_id: int) -> None:
        """``addToken``: append one generated token; a new block when the sequence fills its last one."""
        seq = self._seq(request_id)
        if len(seq.tokens) % self.tokens_per_block == 0:
            block = self._get_free_block(seq.decode_priority, seq.decode_duration_ms)
            self._add_to_seq(seq, block)
        seq.tokens.append(token_id)

    def store_context_blocks(self, request_id: Any) -> None:
        """``storeContextBlocks``: put the full prompt blocks into the reuse tree (after prefill)."""
        seq = self._seq(request_id)
        if self.enable_block_reuse:
            self._store_blocks(self._chop(seq.tokens, len(seq.tokens) - 1, False), seq.blocks)

    def remove_sequence(self, request_id: Any, final_tokens: Sequence[int] = ()) -> None:
        """``removeSequence``: store every block for reuse (a partial last one too), then release, last first.

        ``final_tokens``: tokens the request produced after its last ``add_token`` (TensorRT-LLM's engine
        calls ``addToken`` before each decode step, so the last generated token has no KV and no block; it
        is in the request's token list all the same, and ``storeBlocks`` stores ``len - 1`` of them).
        """
        seq = self._seq(request_id)
        seq.tokens.extend(final_tokens)
        if self.enable_block_reuse:
            self._store_blocks(self._chop(seq.tokens, len(seq.tokens) - 1, True), seq.blocks)
        del self._seqs[request_id]
        for block in reversed(seq.blocks):
            block.refs -= 1
            if block.refs == 0:
                self._policy.release(block)

    def refresh(self) -> int:
        """``refreshBlocks``: timed priorities that have expired fall back to 35. Returns how many expired."""
        return self._policy.refresh()

    def block_ids(self, request_id: Any) -> list[int]:
        return [b.id for b in self._seq(request_id).blocks]

    def num_blocks(self, request_id: Any) -> int:
        return len(self._seq(request_id).blocks)

    def num_free_blocks(self, cache_level: int = PRIMARY) -> int:
        return self._policy.num_free[cache_level]

    def kv_cache_stats(self) -> dict[str, Any]:
        """``KVCacheManager::getKvCacheStats`` as serialized in 1.2: maxNumBlocks counts both pools."""
        max_blocks = self.primary_blocks + self.secondary_blocks
        free = self._policy.num_free[PRIMARY]
        reused, missed = self.reused_blocks, self.missed_blocks
        return {
            "maxNumBlocks": max_blocks,
            "freeNumBlocks": free,
            "usedNumBlocks": max_blocks - free,
            "tokensPerBlock": self.tokens_per_block,
            "allocTotalBlocks": self.alloc_total_blocks,
            "allocNewBlocks": self.alloc_new_blocks,
            "reusedBlocks": reused,
            "missedBlocks": missed,
            "cacheHitRate": reused / (reused + missed) if reused > 0 else 0.0,
        }

    # ------------------------------------------------------------------------------------------- introspection

    def block_cache_level(self, block_id: int) -> int:
        return self._blocks[block_id].level

    def block_priority(self, block_id: int) -> int:
        return self._blocks[block_id].priority

    def block_hash(self, block_id: int) -> int:
        return self._blocks[block_id].hash

    def block_in_tree(self, block_id: int) -> bool:
        return self._blocks[block_id].in_tree()

    def num_cached_blocks(self, cache_level: int = PRIMARY) -> int:
        """Blocks in the reuse tree whose memory is in the given tier."""
        return sum(1 for b in self._blocks if b.level == cache_level and b.in_tree())

    def cached_blocks_by_priority(self, cache_level: int = PRIMARY) -> dict[int, int]:
        out: dict[int, int] = {}
        for b in self._blocks:
            if b.level == cache_level and b.in_tree():
                out[b.priority] = out.get(b.priority, 0) + 1
        return out

    def num_in_use_blocks(self, cache_level: int = PRIMARY) -> int:
        """Blocks of the tier held by at least one running request."""
        return sum(1 for b in self._blocks if b.level == cache_level and b.refs > 0)

    def has_request(self, request_id: Any) -> bool:
        return request_id in self._seqs

    def num_tokens(self, request_id: Any) -> int:
        return len(self._seq(request_id).tokens)

    def _seq(self, request_id: Any) -> _Sequence:
        try:
            return self._seqs[request_id]
        except KeyError:
            raise ValueError(f"request {request_id!r} is not in the KV cache manager") from None

    def _store_blocks(self, keys: list[tuple[int, ...]], blocks: list[_Block]) -> None:
        """``storeBlocks``: walk the tree along ``keys``; from the first miss on, insert this sequence's blocks."""
        search = self._root
        need_match = True
        stored: list[_Block] = []
        tpb = self.tokens_per_block
        for key, block in zip(keys, blocks):
            match = search.children.get(key) if need_match and key else None
            if match is not None:
                search = match
                continue
            need_match = False
            block.key = key
            block.is_full = len(key) == tpb
            block.prev = search
            block.prev_in_seq = search
            search.children.setdefault(key, block)
            stored.append(block)
            self._set_hash(block, search.hash)
            search = block
        self._enqueue_stored(stored)
