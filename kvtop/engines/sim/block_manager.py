"""TensorRT-LLM's KV cache block manager (one attention window, beam width 1), in Python.

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

Speed (``kvtop sim --trace`` allocates 1.9M blocks for the synthetic trace; bench/JOURNAL.md, "Simulator speed"). The
steps are TensorRT-LLM's; how the state is held is chosen for CPython, each choice with its invariant where it is
defined, and tests/engines/sim/test_block_manager_golden.py holds the result to the unoptimized implementation's, event
by event:
- block keys are bytes, a run form for consecutive ids and packed ids otherwise (see "block keys" below), cut once
  per request (``_Sequence.full_keys``); a prompt may come as ``TokenRuns`` and is then never expanded to ints;
- allocation takes a batch of blocks in one loop with the eviction policy's operations inlined
  (``_take_free_blocks``), and release inlines the policy's ``release`` (``remove_sequence``);
- a store walks the tree from the end of the sequence's known path (``_Sequence.tree_prefix``), not the root.
"""

from __future__ import annotations

import heapq
import operator
import struct
import sys
import time
from array import array
from bisect import bisect_right, insort
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from itertools import chain, repeat
from typing import Any, overload

from kvtop.engines.sim.retention import DEFAULT_PRIORITY, MAX_PRIORITY, KvCacheRetentionConfig

PRIMARY = 0
SECONDARY = 1
DEFAULT_SECONDARY_OFFLOAD_MIN_PRIORITY = 30  # evictionPolicy.cpp kDefaultSecondaryOffloadMinPriority

_M64 = (1 << 64) - 1
_M32 = (1 << 32) - 1


class NoFreeBlockError(RuntimeError):
    """The pool has no free block at the level asked for (TensorRT-LLM: "No free block found")."""


NO_FREE_GPU_BLOCK = "no free block in the GPU (primary) pool"  # NoFreeBlockError's message


def block_key_hash(tokens: Sequence[int], parent_hash: int) -> int:
    """TensorRT-LLM's ``BlockKeyHasher::hash`` for a key of plain token ids (no extra ids, no LoRA).

    C++ arithmetic is reproduced: the per-token mix is 32-bit, ``a + 0x9e3779b9`` wraps at 2^32 before it is
    widened, and the seed is 64-bit. The mix depends on the token alone: for vocabulary-sized ids it is memoized.
    (The seed step's ``seed << 6`` is not masked before the sum is: the sum is masked, the same bits mod 2^64.)
    """
    seed = (len(tokens) ^ (parent_hash * 0xBF58476D1CE4E5B9)) & _M64
    if tokens and 0 <= min(tokens) and max(tokens) < _MEMO_IDS_BELOW:
        mixes = _TOKEN_MIXES
        for token in tokens:
            mixed = mixes.get(token)
            if mixed is None:
                mixed = mixes[token] = _token_mix(token)
            seed ^= (mixed + (seed << 6) + (seed >> 2)) & _M64
        return seed
    for token in tokens:  # _token_mix, inlined
        a = token & _M32
        a = (((a >> 16) ^ a) * 0x45D9F3B) & _M32
        a = (((a >> 16) ^ a) * 0x45D9F3B) & _M32
        a = (a >> 16) ^ a
        seed ^= (((a + 0x9E3779B9) & _M32) + (seed << 6) + (seed >> 2)) & _M64
    return seed


# Memoized per-token mixes of block_key_hash, for ids below 2^18 (tokenizer vocabularies: Qwen3 152k, Llama-3
# 128k ids): half of the hash's arithmetic, looked up instead (at most 262k entries, ~20 MB). Larger ids (a
# trace's synthetic ids, generated ids) are mostly seen once, so they are mixed every time.
_MEMO_IDS_BELOW = 1 << 18
_TOKEN_MIXES: dict[int, int] = {}


def _token_mix(token: int) -> int:
    a = token & _M32
    a = (((a >> 16) ^ a) * 0x45D9F3B) & _M32
    a = (((a >> 16) ^ a) * 0x45D9F3B) & _M32
    a = (a >> 16) ^ a
    return (a + 0x9E3779B9) & _M32


def _keys_token_mixes(keys: Sequence[bytes]) -> list[list[int]]:
    """``_token_mix`` of each id of each key (encoded, see "block keys" below): one list per key, computed with numpy
    over all the keys at once (a run key's ids made there too, not in Python), in ``uint32`` as the C++ computes it
    (its products wrap at 2^32). ``block_key_hash``'s mixes are half its Python steps per token; at a few hundred
    keys a call this costs ~0.6 us a 32-id key instead of ~10 (bench/JOURNAL.md, "The driven path's block hashes").
    numpy is imported on the first call: a run without KV events never makes one."""
    global _np, _RUN_DTYPE
    np = _np
    if np is None:
        import numpy

        _RUN_DTYPE = numpy.dtype([("first", "=i8"), ("count", "=i8"), ("zero", "V1")])  # _pack_run's "qqx"
        np = _np = numpy
    out: list[list[int]] = []
    i, n = 0, len(keys)
    while i < n:  # consecutive keys of one byte length at a time
        size = len(keys[i])
        j = i + 1
        while j < n and len(keys[j]) == size:
            j += 1
        if size == _RUN_KEY_BYTES:  # runs: (first id, count) each, in slices of one count
            runs = np.frombuffer(b"".join(keys[i:j]), _RUN_DTYPE)
            firsts, counts = runs["first"].astype(np.uint32), runs["count"]
            cuts = [0, *(np.flatnonzero(counts[1:] != counts[:-1]) + 1).tolist(), j - i]
            for a, b in zip(cuts, cuts[1:]):
                ids = firsts[a:b, None] + np.arange(int(counts[a]), dtype=np.uint32)  # wraps at 2^32, as ids do
                out += _mix32(np, ids).tolist()
        elif size:  # packed signed 64-bit ids: their low 32 bits (two's complement), as static_cast<uint32_t>
            ids = np.frombuffer(b"".join(keys[i:j]), np.int64).astype(np.uint32).reshape(j - i, size // _ID_BYTES)
            out += _mix32(np, ids).tolist()
        else:
            out += [[] for _ in range(j - i)]
        i = j
    return out


def _mix32(np: Any, a: Any) -> Any:
    """``_token_mix`` of a ``uint32`` array (a new array; ``a`` is left as it is)."""
    mul = np.uint32(0x45D9F3B)
    t = a >> 16
    t ^= a
    t *= mul
    a = t >> 16
    a ^= t
    a *= mul
    t = a >> 16
    t ^= a
    t += np.uint32(0x9E3779B9)
    return t


_np: Any = None  # numpy, once _keys_token_mixes has imported it
_RUN_DTYPE: Any = None  # a run key's fields: the numpy dtype (made with numpy's import)


# ------------------------------------------------------------------------------------------------- block keys
#
# A block's key (TensorRT-LLM's BlockKey: the block's token ids) is kept as bytes, in one of two forms:
# - a run, two or more consecutive ids v, v+1, ..., v+n-1: ``pack(v) + pack(n) + b"\0"`` (17 bytes, one
#   struct call);
# - anything else: the ids packed, ``pack(id)`` each (8 bytes per id, so never 17 bytes long);
# with ``pack`` a native signed 64-bit integer. Which form a key takes depends on its tokens alone, so keys of the
# same tokens are equal bytes however they were made (from a list, from TokenRuns, across prompt and generated
# tokens), and keys of different tokens differ. Both forms start with the first id.
# Why bytes: they cache their hash and compare with memcmp, where a 32-int tuple rehashes its 32 ints on every dict
# operation (~0.35 us on the 2-core reference machine; ~1 us when an equal tuple of another request is compared
# item by item), and the tree is probed 3-4 times per block (match on add, store after prefill, store again on
# release, detach on eviction): that was a quarter of the trace replay. Why runs: a Mooncake trace prompt is one
# run per 512-token hash block, so its keys are made in O(1) each (3.5 ns per token) without an int per token.
# Token ids must be in [-2^63, 2^63) (TensorRT-LLM's are int32); others raise OverflowError.

_ID_BYTES = 8
# The empty key (a block that holds no tokens yet), one object: the allocation loop tests for it by identity, without
# reading the key (every empty key is this object; CPython has one empty bytes object anyway).
_NO_KEY = b""
_RUN_KEY_BYTES = 2 * _ID_BYTES + 1
MIN_TOKEN_ID, MAX_TOKEN_ID = -(1 << 63), (1 << 63) - 1
_pack_run = struct.Struct("qqx").pack  # (first id, count) and the zero byte that makes 17
_unpack_run = struct.Struct("qq").unpack_from
_TOP_BYTE = 7 if sys.byteorder == "little" else 0  # of each id: set above 0x7f for ids >= 2^63 in "Q" lanes
_BELOW_0X80 = bytes(range(0x80))


def _pack_ids(tokens: Sequence[int]) -> bytes:
    """The ids as native signed 64-bit integers. ``array("Q")`` converts a list ~5x faster than ``array("q")``
    (which parses a format per item): 8 ns per id against 37 on the reference machine."""
    try:
        raw = array("Q", tokens).tobytes()
    except OverflowError:  # a negative id: the signed conversion takes it (or rejects an id out of range)
        return array("q", tokens).tobytes()
    if raw[_TOP_BYTE::_ID_BYTES].translate(None, _BELOW_0X80):  # an id >= 2^63, not a signed 64-bit id
        array("q", tokens)  # raises OverflowError
    return raw


def encode_key(tokens: Sequence[int]) -> bytes:
    """The key of one block's tokens (see above)."""
    n = len(tokens)
    if n >= 2 and tokens[-1] - tokens[0] == n - 1 and list(tokens) == list(range(tokens[0], tokens[0] + n)):
        if not MIN_TOKEN_ID <= tokens[0] <= MAX_TOKEN_ID - n + 1:
            raise OverflowError("token ids must fit in signed 64 bits")
        return _pack_run(tokens[0], n)
    return _pack_ids(tokens) if n else _NO_KEY


def _key_ids(key: bytes) -> Sequence[int]:
    if len(key) == _RUN_KEY_BYTES:
        first, count = _unpack_run(key)
        return range(first, first + count)
    return memoryview(key).cast("q")


def _key_token_count(key: bytes) -> int:
    return _unpack_run(key)[1] if len(key) == _RUN_KEY_BYTES else len(key) // _ID_BYTES


def decode_key(key: bytes) -> list[int]:
    """The token ids of a key."""
    return list(_key_ids(key))


def _encode_full_blocks(tokens: Sequence[int], tokens_per_block: int) -> list[bytes]:
    """Keys of consecutive full blocks of a token list: packed all at once, then each block that is a run (its
    first and last ids ``tokens_per_block - 1`` apart, then checked id by id) in the run form."""
    if not isinstance(tokens, list):
        tokens = list(tokens)  # the run check below compares list slices
    step = _ID_BYTES * tokens_per_block
    raw = _pack_ids(tokens)
    keys = [raw[i:i + step] for i in range(0, len(raw), step)]
    if tokens_per_block >= 2:
        span = tokens_per_block - 1
        for j, i in enumerate(range(0, len(tokens), tokens_per_block)):
            first = tokens[i]
            if tokens[i + span] - first == span and tokens[i:i + span + 1] == list(range(first, first + span + 1)):
                keys[j] = _pack_run(first, tokens_per_block)
    return keys


def _common_prefix_tokens(a: bytes, b: bytes) -> int:
    n = 0
    for x, y in zip(_key_ids(a), _key_ids(b)):
        if x != y:
            break
        n += 1
    return n


class TokenRuns(Sequence[int]):
    """An immutable token sequence made of runs of consecutive ids: ``TokenRuns([(100, 3), (7, 2)])`` is
    ``[100, 101, 102, 7, 8]``.

    ``BlockManager.add_sequence`` takes it like any sequence of token ids and gives exactly what the equal list gives
    (same keys, so the same block ids, counters and events), but cuts it into block keys in O(1) per block without
    creating an int per token. A Mooncake trace prompt is one run per 512-token hash block (``kvtop sim --trace``:
    61M prompt tokens, 120k runs). Iterating, ``len``, indexing and slicing (to a list) work as on the list.
    """

    __slots__ = ("runs", "_offsets", "_len", "_full_keys")

    def __init__(self, runs: Iterable[tuple[int, int]]):
        merged: list[tuple[int, int]] = []
        for first, length in runs:
            first, length = operator.index(first), operator.index(length)
            if length <= 0:
                raise ValueError(f"TokenRuns: run lengths must be > 0, got {length}")
            if not MIN_TOKEN_ID <= first <= MAX_TOKEN_ID - length + 1:
                raise OverflowError(f"TokenRuns: ids of the run ({first}, {length}) do not fit in signed 64 bits")
            if merged and merged[-1][0] + merged[-1][1] == first:  # a run that continues the one before
                merged[-1] = (merged[-1][0], merged[-1][1] + length)
            else:
                merged.append((first, length))
        self.runs = tuple(merged)  # maximal: a block across two runs is never a run itself
        offsets = []
        total = 0
        for _, length in self.runs:
            offsets.append(total)
            total += length
        self._offsets = offsets  # position of each run's first token
        self._len = total
        self._full_keys: tuple[int, list[bytes]] | None = None  # (tokens_per_block, full_block_keys' list)

    def __repr__(self) -> str:
        return f"TokenRuns({list(self.runs)!r})"

    def __len__(self) -> int:
        return self._len

    def __iter__(self) -> Iterator[int]:
        return chain.from_iterable(range(first, first + length) for first, length in self.runs)

    @overload
    def __getitem__(self, index: int) -> int: ...

    @overload
    def __getitem__(self, index: slice) -> list[int]: ...

    def __getitem__(self, index: int | slice) -> int | list[int]:
        if isinstance(index, slice):
            start, stop, step = index.indices(self._len)
            return self._slice(start, stop) if step == 1 else list(self)[index]
        i = operator.index(index)
        if i < 0:
            i += self._len
        if not 0 <= i < self._len:
            raise IndexError("TokenRuns index out of range")
        r = bisect_right(self._offsets, i) - 1
        return self.runs[r][0] + i - self._offsets[r]

    def _slice(self, start: int, stop: int) -> list[int]:
        out: list[int] = []
        if start >= stop:
            return out
        r = bisect_right(self._offsets, start) - 1
        while start < stop:
            first, length = self.runs[r]
            offset = self._offsets[r]
            end = min(stop, offset + length)
            out.extend(range(first + start - offset, first + end - offset))
            start = end
            r += 1
        return out

    def full_block_keys(self, tokens_per_block: int) -> list[bytes]:
        """Keys of every full block, made once per block size and kept (the caller must not change the list): the
        scheduler's ``beneficialToSkip`` looks a waiting prompt up in the tree every iteration until it starts
        (``BlockManager.find_new_context_block``), and cutting it anew each time was a tenth of a trace replay."""
        cached = self._full_keys
        if cached is None or cached[0] != tokens_per_block:
            cached = self._full_keys = (tokens_per_block,
                                        self.block_keys(0, self._len // tokens_per_block * tokens_per_block,
                                                        tokens_per_block))
        return cached[1]

    def block_keys(self, start: int, stop: int, tokens_per_block: int) -> list[bytes]:
        """Keys of the full blocks of tokens ``[start, stop)`` (a multiple of ``tokens_per_block`` apart)."""
        keys: list[bytes] = []
        if start >= stop:
            return keys
        runs, offsets = self.runs, self._offsets
        r = bisect_right(offsets, start) - 1
        pos = start
        while pos < stop:
            while offsets[r] + runs[r][1] <= pos:
                r += 1
            first, length = runs[r]
            offset = offsets[r]
            inside_end = min(stop, pos + (offset + length - pos) // tokens_per_block * tokens_per_block)
            if inside_end > pos and tokens_per_block >= 2:  # whole blocks inside this run: run keys, O(1) each
                keys.extend(map(_pack_run, range(first + pos - offset, first + inside_end - offset, tokens_per_block),
                                repeat(tokens_per_block)))
                pos = inside_end
            else:  # a block across runs (or of one token): from its ids
                keys.append(encode_key(self._slice(pos, pos + tokens_per_block)))
                pos += tokens_per_block
        return keys


class KVCacheBlock:
    """``KVCacheBlock``: an identity (id, key, tree links, priority) bound to a memory slot of one tier."""

    __slots__ = ("id", "primary", "key", "hash", "hash_parent", "prev", "children", "refs", "priority",
                 "duration_ms", "qstamp", "offload_seq")

    def __init__(self, block_id: int, primary: bool):
        self.id = block_id
        self.primary = primary
        self.key = _NO_KEY  # encoded token ids (see encode_key); empty until the block holds tokens
        self.hash = 0
        # The parent hash ``hash`` was made with: with events on, ``hash == block_key_hash(decode_key(key),
        # hash_parent)`` always holds, so a block keyed again with the same key under the same parent hash (stored
        # after prefill under the block it was allocated after, or allocated again for the tokens it held) keeps
        # its hash instead of hashing its tokens again (one Python step per token: 39% of a driven trace replay).
        self.hash_parent = 0
        self.prev: KVCacheBlock | None = None          # parent in the radix tree (the root for first blocks)
        # The blocks stored under this one, by key: None (a leaf), the only child itself, or a dict (two or more
        # at some point; never empty). Most blocks of a reuse tree are links of a chain with one child, and a dict
        # per block was ~250 bytes of the ~500 a block takes in all: the replay touches a block's parent's children
        # on every eviction, and 40k blocks with their dicts did not fit in this machine's cache (11% of a
        # replay: best of 6, 5.52 -> 4.89 s on the 16-core Xeon).
        self.children: KVCacheBlock | dict[bytes, KVCacheBlock] | None = None
        self.refs = 0
        self.priority = DEFAULT_PRIORITY
        self.duration_ms: int | None = None
        # The stamp of its live entry in the free queue of its tier and priority (see _EvictionPolicy); -1 when it
        # is in no free queue.
        self.qstamp = -1
        # The manager's offload count just after this block's last offload to the host tier (0: never offloaded).
        # An onboard reads it: offloads since = host queue entries pushed behind the block, what a smaller host
        # tier would have evicted it for (kvtop.engines.sim.sweep's one-pass curve).
        self.offload_seq = 0

    @property
    def level(self) -> int:
        return PRIMARY if self.primary else SECONDARY

    def in_tree(self) -> bool:
        return bool(self.key) and self.prev is not None

    def child(self, key: bytes) -> KVCacheBlock | None:
        """The block stored under this one with ``key`` (``children.get(key)``)."""
        children = self.children
        if children is None:
            return None
        if isinstance(children, dict):
            return children.get(key)
        return children if children.key == key else None

    def child_items(self) -> list[tuple[bytes, KVCacheBlock]]:
        """(key, block) of the children in insertion order."""
        children = self.children
        if children is None:
            return []
        if isinstance(children, dict):
            return list(children.items())
        return [(children.key, children)]

    def add_child(self, key: bytes, block: KVCacheBlock) -> KVCacheBlock:
        """``children.setdefault(key, block)``: the child now under ``key``."""
        children = self.children
        if children is None:
            self.children = block
            return block
        if isinstance(children, dict):
            return children.setdefault(key, block)
        if children.key == key:
            return children
        self.children = {children.key: children, key: block}
        return block

    def remove_child(self, key: bytes) -> None:
        """``children.pop(key, None)``: by key, whichever block is stored under it (as removeNextBlock does)."""
        children = self.children
        if children is None:
            return
        if isinstance(children, dict):
            children.pop(key, None)
            if not children:
                self.children = None
        elif children.key == key:
            self.children = None


class _Sequence:
    __slots__ = ("request_id", "prompt", "prompt_len", "generated", "num_tokens", "blocks", "decode_priority",
                 "decode_duration_ms", "full_keys", "tree_prefix")

    def __init__(self, request_id: Any, prompt: Sequence[int], retention: KvCacheRetentionConfig | None):
        self.request_id = request_id
        self.prompt = prompt  # the block manager's own list copy, or an immutable TokenRuns
        self.prompt_len = len(prompt)
        self.generated: list[int] = []  # tokens added after the prompt (add_token, remove_sequence's final tokens)
        self.num_tokens = self.prompt_len
        self.blocks: list[KVCacheBlock] = []
        self.decode_priority = retention.decode_retention_priority if retention else DEFAULT_PRIORITY
        self.decode_duration_ms = retention.decode_duration_ms if retention else None
        # Keys of the full blocks of the first len(full_keys) * tokens_per_block tokens, made once and shared by
        # add_sequence, store_context_blocks and remove_sequence: tokens are only ever appended, so the keys of a
        # prefix never change. (Cutting a 15k-token prompt into keys used to be done three times per request.)
        self.full_keys: list[bytes] = []
        # blocks[:tree_prefix] are the reuse tree's path for the first keys: blocks[i] is what blocks[i - 1] (the
        # root for i = 0) holds under keys[i]. While the sequence holds them that path cannot change: a block
        # leaves the tree only when it is evicted (it must be free: these are referenced) or when an ancestor is
        # (an ancestor on the path is referenced too), and nothing stored under a path block can take a key that
        # its child on the path holds. So a store walks the tree from blocks[tree_prefix - 1], not from the root:
        # releasing a request re-walked its whole prompt (1.9M dict lookups in the synthetic trace).
        self.tree_prefix = 0

    def tokens(self, start: int, stop: int) -> list[int]:
        """Tokens ``[start, stop)`` across the prompt and the generated tokens."""
        plen = self.prompt_len
        if stop <= plen:
            return list(self.prompt[start:stop])
        if start >= plen:
            return self.generated[start - plen:stop - plen]
        return list(self.prompt[start:plen]) + self.generated[:stop - plen]


# A level's free queues are compacted when their stale entries outnumber the live ones by this much.
STALE_ENTRIES_SLACK = 1024
# Host blocks made at a time: a host pool larger than this is made as the engine first takes its blocks (64 TiB of
# host cache is 14.9M blocks, 3.3 GB of Python objects for a 2 s run that touches a few thousand).
HOST_BLOCKS_CHUNK = 1 << 16


class _EvictionPolicy:
    """``LRUEvictionPolicy``: 101 FIFO queues per cache level, lowest priority and oldest release first.

    A queue is a deque of entries in release order, each entry two items, a stamp and a block, with lazy
    deletion: queueing a block gives it a fresh stamp (``block.qstamp``, the same int object as the entry's), and
    an entry is live only while its block's stamp is the entry's (compared by identity: stamps are unique, and
    reading the int objects would touch two more cold objects). Taking a block from the middle (a reused block
    claimed, a timed priority expiring) sets its stamp to -1 and leaves a stale entry that the front skips. This
    replaced OrderedDicts keyed by block: popping the front of one cost a hash-table probe, a linked-list node and
    a tuple, on cold memory, four times per block over its life; a deque's items are contiguous (and an entry
    as a (stamp, block) tuple was one more cold object: two items instead, 5% of a replay).

    Invariants the block manager's inlined fast paths rely on (``_take_free_blocks``, ``remove_sequence``):
    a block is free iff its ``qstamp`` is not -1, and then it is live in exactly one queue, the one of its tier
    and priority: neither changes while a block is free (the tier changes only for blocks just taken, as offload
    victims and targets, onboarded blocks and their victims; the priority only on claiming and on expiry, after
    the block left its queue). ``nonempty[level]`` lists, sorted, exactly the priorities whose deque is non-empty (live
    or stale entries); ``num_free[level]`` is the number of live entries of the level, ``stale[level]`` of stale
    ones. Stamps only grow (``stamp`` is the next one). The containers are never replaced, only mutated, so the
    block manager may hold references to them.
    """

    def __init__(self, blocks: list[KVCacheBlock], sizes: tuple[int, int], offload_min_priority: int,
                 clock_ms: Callable[[], float]):
        self.queues: list[list[deque[Any]]] = [  # items alternate: stamp (int), block
            [deque() for _ in range(MAX_PRIORITY + 1)] for _ in range(2)]
        self.nonempty: list[list[int]] = [[], []]  # sorted priorities whose deque is non-empty, per level
        self.num_free = [0, 0]
        self.stale = [0, 0]
        self.stamp = 0
        self.offload_min_priority = offload_min_priority
        self.clock_ms = clock_ms
        # Timed priorities: (expiration ms, release stamp, block), smallest first. TensorRT-LLM stamps a release with
        # steady_clock::now() in nanoseconds (releaseBlock), so blocks released in the same simulated millisecond
        # with the same duration still expire in release order: the release's queue stamp stands for those
        # nanoseconds (stamps grow with every release). Exact ties of the nanosecond stamps, which
        # ExpiringBlockComparator breaks by pointer, do not happen: each release reads the clock anew.
        self.expiry_heap: list[tuple[float, int, KVCacheBlock]] = []
        self.expiry: dict[int, int] = {}  # block id -> the release stamp of its live heap entry (others are stale)
        # False until a block is given a duration (``claim`` or ``BlockManager._take_free_blocks`` with one): until
        # then every block's ``duration_ms`` is None and nothing expires, which the block manager's plain loops
        # (``_take_plain``, ``remove_sequence``'s) rely on: no trace replay gives one.
        self.timed = False
        for block in blocks[:sizes[PRIMARY] + sizes[SECONDARY]]:  # primary blocks first, then secondary
            self.push(block)
        # Host blocks not made yet (``make_host_blocks``): as if pushed here after the others, in id order, with
        # the stamps they would have had (the ids and stamps below ``untouched_end``); counted free.
        self.blocks = blocks
        self.unmade = sizes[PRIMARY] + sizes[SECONDARY] - len(blocks)
        self.num_free[SECONDARY] += self.unmade
        self.stamp += self.unmade
        self.untouched_end = self.stamp  # an entry with a smaller stamp is still where the constructor put it

    def make_host_blocks(self, k: int) -> None:
        """Make host blocks not made yet so that the next ``k`` host blocks the queues give are made: the unmade
        ones are the free blocks queued first at their priority (35) and nothing takes them from the middle (they
        hold no key, so no reuse claims them; no release gave them an expiry), so they sit at the front of that
        queue, in id order, behind the made ones still untouched there. The queues then hold what the constructor
        would have queued: the same blocks, ids, stamps and order."""
        if not self.unmade:
            return
        q = self.queues[SECONDARY][DEFAULT_PRIORITY]
        blocks = self.blocks
        first = len(blocks)  # the next id to make, as the blocks are made in id order
        # untouched entries still at the front: the ones of the constructor's stamps (never stale: see above)
        have = first - q[1].id if q and q[0] < self.untouched_end else 0
        if have >= k:
            return
        n = min(self.unmade, max(k - have, HOST_BLOCKS_CHUNK))
        front = [q.popleft() for _ in range(2 * have)]
        if not q and not front:
            insort(self.nonempty[SECONDARY], DEFAULT_PRIORITY)
        stamp0 = self.untouched_end - self.unmade
        made = [KVCacheBlock(first + i, False) for i in range(n)]
        blocks.extend(made)
        for i in range(n - 1, -1, -1):
            block = made[i]
            stamp = stamp0 + i
            block.qstamp = stamp
            q.appendleft(block)
            q.appendleft(stamp)
        q.extendleft(reversed(front))
        self.unmade -= n

    def push(self, block: KVCacheBlock) -> None:
        """Queue a block at the back of the queue of its tier and priority."""
        level = PRIMARY if block.primary else SECONDARY
        prio = block.priority
        q = self.queues[level][prio]
        if not q:
            insort(self.nonempty[level], prio)
        stamp = self.stamp
        q.append(stamp)
        q.append(block)
        block.qstamp = stamp
        self.stamp = stamp + 1
        self.num_free[level] += 1

    def _remove(self, block: KVCacheBlock) -> bool:
        if block.qstamp == -1:
            return False
        level = PRIMARY if block.primary else SECONDARY
        block.qstamp = -1  # its entry goes stale
        self.num_free[level] -= 1
        stale = self.stale[level] + 1
        self.stale[level] = stale
        if stale > self.num_free[level] + STALE_ENTRIES_SLACK:
            self._compact(level)  # stale entries are bounded by the live ones: O(1) amortized
        return True

    def _compact(self, level: int) -> None:
        """Drop the stale entries of a level's queues."""
        nonempty = self.nonempty[level]
        nonempty.clear()
        for prio, q in enumerate(self.queues[level]):
            if q:
                items = iter(q)
                live = [(stamp, block) for stamp, block in zip(items, items) if block.qstamp is stamp]
                q.clear()
                for stamp, block in live:
                    q.append(stamp)
                    q.append(block)
                if q:
                    nonempty.append(prio)
        self.stale[level] = 0

    def pop_front(self, level: int) -> tuple[int, KVCacheBlock]:
        """(priority, block) of the level's first live entry, removed from its queue; the caller knows that one
        exists (``num_free[level] > 0``). Counts are the caller's, except the stale entries it skips."""
        nonempty = self.nonempty[level]
        queues = self.queues[level]
        while True:
            prio = nonempty[0]
            q = queues[prio]
            while q:
                stamp = q.popleft()
                block = q.popleft()
                if block.qstamp is stamp:
                    if not q:
                        del nonempty[0]
                    return prio, block
                self.stale[level] -= 1
            del nonempty[0]

    def release(self, block: KVCacheBlock) -> None:
        self.push(block)
        if block.duration_ms is not None and block.priority != DEFAULT_PRIORITY:
            self.start_expiry(block)

    def start_expiry(self, block: KVCacheBlock) -> None:
        """A released block with a timed priority (just queued: ``qstamp`` is its release's stamp): it falls back
        to 35 ``duration_ms`` from now; ties expire in release order."""
        assert block.duration_ms is not None
        stamp = block.qstamp
        self.expiry[block.id] = stamp
        heapq.heappush(self.expiry_heap, (self.clock_ms() + block.duration_ms, stamp, block))

    def claim(self, block: KVCacheBlock, priority: int | None = None, duration_ms: int | None = None) -> None:
        if duration_ms is not None:
            self.timed = True
        if self._remove(block):
            self.expiry.pop(block.id, None)  # only when it left a free queue, as in TensorRT-LLM
        if priority is not None:
            block.priority = priority
        block.duration_ms = duration_ms

    def refresh(self) -> int:
        """Expired timed priorities fall back to 35 (tail of that queue). Returns how many expired."""
        heap = self.expiry_heap
        if not heap:
            return 0  # nothing timed (every trace replay): no clock read, once per engine iteration
        now = self.clock_ms()
        expired = 0
        while heap:
            expiration, stamp, block = heap[0]
            if self.expiry.get(block.id) != stamp:
                heapq.heappop(heap)  # stale entry: claimed, or released again since
                continue
            if expiration > now:
                break
            heapq.heappop(heap)
            del self.expiry[block.id]
            if self._remove(block):
                block.priority = DEFAULT_PRIORITY
                self.push(block)
                expired += 1
        return expired


class BlockManager:
    """One attention window of TensorRT-LLM 1.2's KV cache manager, beam width 1, block reuse on."""

    def __init__(self, primary_blocks: int, secondary_blocks: int = 0, tokens_per_block: int = 32, *,
                 enable_partial_reuse: bool = True, copy_on_partial_reuse: bool = True, onboard_blocks: bool = True,
                 secondary_offload_min_priority: int | None = DEFAULT_SECONDARY_OFFLOAD_MIN_PRIORITY,
                 event_buffer_max_size: int = 0, clock_ms: Callable[[], float] | None = None,
                 window_size: int | None = None, enable_block_reuse: bool = True, event_token_ids: bool = False):
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

        self._blocks = [KVCacheBlock(i, True) for i in range(primary_blocks)]
        # the host pool's first HOST_BLOCKS_CHUNK blocks; the rest as the engine takes them (make_host_blocks)
        self._blocks += [KVCacheBlock(primary_blocks + i, False)
                         for i in range(secondary_blocks if secondary_blocks <= HOST_BLOCKS_CHUNK else
                                        HOST_BLOCKS_CHUNK)]
        self._root = KVCacheBlock(-1, True)  # kCachedBlocksRootId; hash 0
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
        # stored blocks' tokens as "token_ids": [ids] (kvtop.compact's form) instead of TensorRT-LLM's token dicts
        self._event_token_ids = event_token_ids
        self._event_buffer_max_size = event_buffer_max_size
        self._event_queue: list[dict[str, Any]] = []
        # The last removed event made, and its hash list: one more removed block is appended to it while it is the
        # last event queued (_enqueue_removed)
        self._removed_event: dict[str, Any] | None = None
        self._removed_hashes: list[int] = []
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

    def _enqueue_removed(self, block: KVCacheBlock) -> None:
        if not self._events_enabled:
            return
        queue = self._event_queue
        if queue and queue[-1] is self._removed_event:  # the last event queued is a removed event: coalesced into
            self._removed_hashes.append(block.hash)     # it, as enqueueRemovedEvent does
            return
        hashes = [block.hash]
        event = {"event_id": self._next_event_id, "data": {"type": "removed", "block_hashes": hashes},
                 "window_size": self.window_size}
        queue.append(event)
        self._next_event_id += 1
        self._removed_event, self._removed_hashes = event, hashes

    def _enqueue_updated(self, block: KVCacheBlock, cache_level: tuple[int, int] | None,
                         priority: tuple[int, int] | None) -> None:
        if not self._events_enabled:
            return
        # TensorRT-LLM 1.x's Python serializer would raise on a diff's missing half (trtllm-kv.md 2.2); kvtop emits
        # null there, which is what a fixed serializer gives and what the fold accepts. (_enqueue, inlined: one event
        # per offload and onboard.)
        self._event_queue.append({"event_id": self._next_event_id, "data": {
            "type": "updated", "block_hash": block.hash,
            "cache_level": None if cache_level is None else {"type": "event_diff", "new_value": cache_level[1],
                                                             "old_value": cache_level[0]},
            "priority": None if priority is None else {"type": "event_diff", "new_value": priority[1],
                                                       "old_value": priority[0]},
        }, "window_size": self.window_size})
        self._next_event_id += 1

    def _enqueue_stored(self, blocks: list[KVCacheBlock]) -> None:
        if not self._events_enabled or not blocks:
            return
        parent = blocks[0].prev
        if self._event_token_ids:  # the keys in the order kvtop.compact.compact_event leaves them
            stored = []
            for b in blocks:  # decode_key, inlined
                key = b.key
                if len(key) == _RUN_KEY_BYTES:
                    first, count = _unpack_run(key)
                    ids = list(range(first, first + count))
                else:
                    ids = memoryview(key).cast("q").tolist()
                stored.append({"type": "stored_block", "block_hash": b.hash,
                               "cache_level": PRIMARY if b.primary else SECONDARY, "priority": b.priority,
                               "token_ids": ids})
            self._enqueue({
                "type": "stored",
                "parent_hash": parent.hash if parent is not None and parent.id >= 0 else None,
                "blocks": stored,
            })
            return
        self._enqueue({
            "type": "stored",
            "parent_hash": parent.hash if parent is not None and parent.id >= 0 else None,
            "blocks": [{"type": "stored_block", "block_hash": b.hash,
                        "tokens": [{"type": "unique_token", "token_id": t, "token_extra_id": 0}
                                   for t in decode_key(b.key)],
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

    def buffered_events(self) -> int:
        """Events waiting to be taken (the buffer and this iteration's queue)."""
        return len(self._event_buffer) + len(self._event_queue)

    def take_events(self) -> list[dict[str, Any]]:
        """Drain the event buffer (flushing this iteration's queue first). Events are drained once."""
        self.flush_events()
        out, self._event_buffer = self._event_buffer, []
        return out

    # ------------------------------------------------------------------------------------------- allocation

    def _set_hash(self, block: KVCacheBlock, parent_hash: int) -> None:
        if self._events_enabled:
            block.hash = block_key_hash(decode_key(block.key), parent_hash)
            block.hash_parent = parent_hash

    def _free_children(self, block: KVCacheBlock, data_level: int | None = None) -> None:
        """``freeChildren``: detach the block and its descendants from the tree, children first.

        ``data_level``: the tier whose data the block held, when its slot was swapped just before (an offload
        target: the host copy is what is lost, though the block object now owns a GPU slot).

        Iterative (a stack of each node's children still to visit), in the recursion's order: each child's subtree
        before the next child, a node after its children. Chains are deep: a 60k-token prompt is ~2,000 blocks
        in one chain, past CPython's recursion limit of 1,000 (the recursive form died on the Mooncake trace).
        """
        stack = [(block, iter(block.child_items()))]
        while stack:
            node, children = stack[-1]
            item = next(children, None)
            if item is not None:
                stack.append((item[1], iter(item[1].child_items())))
                continue
            stack.pop()
            if node.in_tree():
                self._enqueue_removed(node)
                self.evicted_blocks[node.level if data_level is None or node is not block else data_level] += 1
            self._detach(node)

    @staticmethod
    def _detach(block: KVCacheBlock) -> None:
        """``freeLeafBlock``: unlink from the parent (by key, as removeNextBlock does)."""
        if block.prev is not None:
            block.prev.remove_child(block.key)
            block.prev = None

    def _claim_leaf(self, block: KVCacheBlock, priority: int | None, duration_ms: int | None) -> None:
        self._policy.claim(block, priority, duration_ms)
        self._detach(block)

    def _get_free_block(self, priority: int, duration_ms: int | None) -> KVCacheBlock:
        """``getFreeBlock`` + ``claimBlock`` for one block (see ``_take_free_blocks``)."""
        taken: list[KVCacheBlock] = []
        self._take_free_blocks(1, priority, duration_ms, taken)
        return taken[0]

    def _take_free_blocks(self, count: int, priority: int, duration_ms: int | None, taken: list[KVCacheBlock]) -> None:
        """``count`` times ``getFreeBlock`` + ``claimBlock``: take the GPU victim, offload it to the host tier when
        1.2 would, detach what it frees from the tree, claim it with the given priority and duration, and append
        it to ``taken``. Raises NoFreeBlockError when the GPU pool runs dry, with the blocks taken so far appended
        and counted, as the same calls one at a time would leave them.

        This runs once per allocated block (1.9M times in the synthetic trace, 1.8M of them offloading), so the
        eviction policy's operations are inlined and everything is looked up once per batch: taking the front
        block of a level is the policy's ``get_free_block`` + ``claim``; queueing the offloaded block is its
        ``release`` (with no expiry: the claim cleared the duration). Popping the host target before queueing the
        offloaded block, where TensorRT-LLM queues first and claims the target after, leaves the same queues: the
        target was the front, and the offloaded block goes to the back. A taken block is not in any queue nor in
        the tree, so what the caller does with one (keys, references) cannot change which block comes next.
        """
        policy = self._policy
        if duration_ms is not None:
            policy.timed = True
        elif not policy.timed and not self._events_enabled:
            self._take_plain(count, priority, taken)
            return
        primary_prios, host_prios = policy.nonempty
        primary_queues, host_queues = policy.queues
        num_free = policy.num_free
        free_primary = num_free[PRIMARY]  # nothing in the batch frees a GPU block
        stamp = policy.stamp
        expiry = policy.expiry
        offload_min_priority = policy.offload_min_priority
        # An offload takes a host block and queues another: the host's free count cannot change in this batch.
        can_offload = self.onboard_blocks and num_free[SECONDARY] > 0
        if can_offload and policy.unmade:
            policy.make_host_blocks(min(count, free_primary))  # each block taken takes at most one host block
        events = self._events_enabled
        no_key = _NO_KEY
        append = taken.append
        taken_before = len(taken)
        new_blocks = silent_offloads = evicted = evicted_host = 0
        offload_seq = self.offloaded_blocks  # the offload count so far, each offloaded block's offload_seq
        free_children = self._free_children
        try:
            for _ in range(min(count, free_primary)):
                prio = primary_prios[0]
                queue = primary_queues[prio]
                entry_stamp = queue.popleft()
                block = queue.popleft()
                if not queue:
                    del primary_prios[0]
                if block.qstamp is not entry_stamp:  # a stale entry: the policy's loop finds the live one
                    policy.stale[PRIMARY] -= 1
                    prio, block = policy.pop_front(PRIMARY)
                if expiry:
                    expiry.pop(block.id, None)
                if block.key is no_key:
                    block.qstamp = -1
                    new_blocks += 1
                elif can_offload and prio >= offload_min_priority:
                    # Offload: the block takes the front host block's slot and goes to the host queue; the target
                    # (now holding a GPU slot, its host data dropped) is the block taken.
                    block.duration_ms = None  # the claim before the offload keeps the priority, drops the duration
                    host_queue = host_queues[host_prios[0]]
                    entry_stamp = host_queue.popleft()
                    target = host_queue.popleft()
                    if not host_queue:
                        del host_prios[0]
                    if target.qstamp is not entry_stamp:
                        policy.stale[SECONDARY] -= 1
                        target = policy.pop_front(SECONDARY)[1]
                    target.qstamp = -1
                    if expiry:
                        expiry.pop(target.id, None)
                    block.primary = False  # swap memory slots
                    target.primary = True
                    offload_seq += 1
                    block.offload_seq = offload_seq
                    if block.prev is None:  # not in the tree (it has a key): no event
                        silent_offloads += 1
                    elif events:
                        self._enqueue_updated(block, (PRIMARY, SECONDARY), None)
                    # release: now in the host queue, same priority (prio: its queue's), no duration so no expiry;
                    # num_free[SECONDARY] lost the target and gains this block (its GPU entry's stamp, never read
                    # since it was popped, is replaced here: no -1 in between)
                    queue = host_queues[prio]
                    if not queue:
                        insort(host_prios, prio)
                    queue.append(stamp)
                    queue.append(block)
                    block.qstamp = stamp
                    stamp += 1
                    # the target's detach (the tail below, for a block whose host data is what gets dropped)
                    if target.children is not None:
                        free_children(target, SECONDARY)
                    else:
                        parent = target.prev
                        if parent is not None:  # a leaf: _free_children without the recursion
                            if target.key is not no_key:
                                if events:
                                    self._enqueue_removed(target)
                                evicted_host += 1
                            if parent.children is target:  # the only child (as remove_child, inlined)
                                parent.children = None
                            else:
                                parent.remove_child(target.key)
                            target.prev = None
                    target.priority = priority
                    target.duration_ms = duration_ms
                    append(target)
                    continue
                # the block keeps its GPU slot
                block.qstamp = -1
                if block.children is not None:
                    free_children(block)
                else:
                    parent = block.prev
                    if parent is not None:  # a leaf: _free_children without the recursion
                        if block.key is not no_key:
                            if events:
                                self._enqueue_removed(block)
                            evicted += 1
                        if parent.children is block:  # the only child (as remove_child, inlined)
                            parent.children = None
                        else:
                            parent.remove_child(block.key)
                        block.prev = None
                block.priority = priority
                block.duration_ms = duration_ms
                append(block)
            if count > free_primary:
                raise NoFreeBlockError(NO_FREE_GPU_BLOCK)
        finally:
            policy.stamp = stamp
            # the counts of the blocks taken, added once (nothing in the loop reads them)
            num_free[PRIMARY] -= len(taken) - taken_before
            self.evicted_blocks[PRIMARY] += evicted
            self.evicted_blocks[SECONDARY] += evicted_host
            self.alloc_total_blocks += len(taken) - taken_before
            self.alloc_new_blocks += new_blocks
            self.offloaded_blocks = offload_seq
            self.silent_offloads += silent_offloads

    def _take_plain(self, count: int, priority: int, taken: list[KVCacheBlock]) -> None:
        """``_take_free_blocks`` with events off and no block ever given a duration (``_EvictionPolicy.timed``):
        the same steps less those that would do nothing then (no expiry to drop, no duration to clear or set, no
        event), and the offload's two conditions in one comparison. Every trace replay of ``kvtop sim`` takes its
        blocks here (4.4M offloads in the Mooncake conversation trace at 32 tokens a block, 64 GB);
        tests/engines/sim/test_sim_fast_paths.py holds it to the general loop block by block."""
        policy = self._policy
        primary_prios, host_prios = policy.nonempty
        primary_queues, host_queues = policy.queues
        num_free = policy.num_free
        free_primary = num_free[PRIMARY]  # nothing in the batch frees a GPU block
        stamp = policy.stamp
        # An offload takes a host block and queues another: the host's free count cannot change in this batch.
        can_offload = self.onboard_blocks and num_free[SECONDARY] > 0
        if can_offload and policy.unmade:
            policy.make_host_blocks(min(count, free_primary))  # each block taken takes at most one host block
        # a victim holding a key is offloaded iff its priority is at least this (none is past MAX_PRIORITY)
        offload_from = policy.offload_min_priority if can_offload else MAX_PRIORITY + 1
        no_key = _NO_KEY
        append = taken.append
        taken_before = len(taken)
        new_blocks = silent_offloads = evicted = evicted_host = 0
        offload_seq = self.offloaded_blocks
        free_children = self._free_children
        # The front queues of both levels, held across the loop (looked up again only when one runs dry, skips a
        # stale entry or, for the host, when a queue in front of it gets its first entry): a free block is live in
        # the queue of its priority, so the victim's priority is its own.
        # (an empty deque where a level has none: the loop then takes nothing from it)
        queue: deque[Any] = primary_queues[primary_prios[0]] if primary_prios else deque()
        host_queue: deque[Any] = host_queues[host_prios[0]] if host_prios else deque()
        try:
            for _ in range(min(count, free_primary)):
                entry_stamp = queue.popleft()
                block = queue.popleft()
                if block.qstamp is not entry_stamp:
                    policy.stale[PRIMARY] -= 1
                    block = policy.pop_front(PRIMARY)[1]
                    if primary_prios:
                        queue = primary_queues[primary_prios[0]]
                elif not queue:
                    del primary_prios[0]
                    if primary_prios:
                        queue = primary_queues[primary_prios[0]]
                prio = block.priority
                if prio >= offload_from and block.key is not no_key:
                    entry_stamp = host_queue.popleft()
                    target = host_queue.popleft()
                    if target.qstamp is not entry_stamp:
                        policy.stale[SECONDARY] -= 1
                        target = policy.pop_front(SECONDARY)[1]
                        if host_prios:
                            host_queue = host_queues[host_prios[0]]
                    elif not host_queue:
                        del host_prios[0]
                        if host_prios:
                            host_queue = host_queues[host_prios[0]]
                    target.qstamp = -1
                    block.primary = False
                    target.primary = True
                    offload_seq += 1
                    block.offload_seq = offload_seq
                    if block.prev is None:
                        silent_offloads += 1
                    into = host_queues[prio]
                    if not into:
                        insort(host_prios, prio)
                        host_queue = host_queues[host_prios[0]]
                    into.append(stamp)
                    into.append(block)
                    block.qstamp = stamp
                    stamp += 1
                    if target.children is not None:
                        free_children(target, SECONDARY)
                    else:
                        parent = target.prev
                        if parent is not None:
                            if target.key is not no_key:
                                evicted_host += 1
                            if parent.children is target:
                                parent.children = None
                            else:
                                parent.remove_child(target.key)
                            target.prev = None
                    target.priority = priority
                    append(target)
                    continue
                block.qstamp = -1
                if block.key is no_key:
                    new_blocks += 1
                if block.children is not None:
                    free_children(block)
                else:
                    parent = block.prev
                    if parent is not None:
                        if block.key is not no_key:
                            evicted += 1
                        if parent.children is block:
                            parent.children = None
                        else:
                            parent.remove_child(block.key)
                        block.prev = None
                block.priority = priority
                append(block)
            if count > free_primary:
                raise NoFreeBlockError(NO_FREE_GPU_BLOCK)
        finally:
            policy.stamp = stamp
            num_free[PRIMARY] -= len(taken) - taken_before
            self.evicted_blocks[PRIMARY] += evicted
            self.evicted_blocks[SECONDARY] += evicted_host
            self.alloc_total_blocks += len(taken) - taken_before
            self.alloc_new_blocks += new_blocks
            self.offloaded_blocks = offload_seq
            self.silent_offloads += silent_offloads

    def _onboard(self, block: KVCacheBlock) -> None:
        if self.onboard_blocks and not block.primary:
            victim = self._get_free_block(DEFAULT_PRIORITY, None)
            block.primary, victim.primary = victim.primary, block.primary
            self.onboarded_blocks += 1
            self._enqueue_updated(block, (SECONDARY, PRIMARY), None)
            self._policy.release(victim)  # the victim object now owns the host slot

    def _find_matching(self, root: KVCacheBlock, key: bytes) -> tuple[bool, int, KVCacheBlock | None]:
        """``findMatchingBlock``: (partial, matched tokens, block) for the child of ``root`` matching ``key``.

        (Signature kept as it was: tests/tiers/test_tiers.py hooks it in a subclass.)"""
        if not key or root.children is None:
            return False, 0, None
        block = root.child(key)
        if block is not None:
            num_tokens = _key_token_count(key)  # an exact match: the block's key is this key
            return num_tokens < self.tokens_per_block, num_tokens, block
        if self.enable_partial_reuse:
            best_n, best = 0, None
            # Only a child starting with the same first id can match a token; skipping the others with a C-level
            # startswith keeps insertion order among the candidates (ties go to the first, as before) and saves
            # a Python loop per child: the root has thousands of children in a trace replay.
            first_id = key[:_ID_BYTES]
            children = root.children
            # The dict's own view, not child_items()'s copy: nothing below changes the children, and copying a
            # root's 8,000 children for every missed block was 40% of an 8,000-prompt replay (7.3 of 18.7 s).
            for child_key, child in (children.items() if isinstance(children, dict) else root.child_items()):
                if child_key.startswith(first_id) and (
                        self.copy_on_partial_reuse or (child.refs == 0 and child.children is None)):
                    n = _common_prefix_tokens(child_key, key)
                    if n > best_n:
                        best_n, best = n, child
            if best is not None:
                return True, best_n, best
        return False, 0, None

    def _block_keys(self, seq: _Sequence, usable: int, allow_partial: bool) -> list[bytes]:
        """The keys of the sequence's first ``usable`` tokens cut into blocks (a fresh list): the full blocks, then
        the partial tail as one more key when ``allow_partial``. Full keys come from ``seq.full_keys``."""
        tpb = self.tokens_per_block
        num_full = usable // tpb
        full_keys = seq.full_keys
        start = len(full_keys) * tpb
        stop = num_full * tpb
        if start < stop:
            prompt = seq.prompt
            in_prompt = min(stop, seq.prompt_len - seq.prompt_len % tpb)  # full blocks of prompt tokens only
            if start < in_prompt:
                full_keys.extend(prompt.full_block_keys(tpb)[start // tpb:in_prompt // tpb]
                                 if isinstance(prompt, TokenRuns)
                                 else _encode_full_blocks(prompt[start:in_prompt], tpb))
                start = in_prompt
            if start < stop:
                full_keys.extend(_encode_full_blocks(seq.tokens(start, stop), tpb))
        keys = full_keys[:num_full]
        if allow_partial and stop < usable:
            keys.append(encode_key(seq.tokens(stop, usable)))
        return keys

    def _add_to_seq(self, seq: _Sequence, block: KVCacheBlock) -> None:
        block.refs += 1
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
        # A private copy, as TensorRT-LLM's request holds its own tokens; a TokenRuns is immutable already.
        prompt = token_ids if isinstance(token_ids, TokenRuns) else list(token_ids)
        length = len(prompt)
        if length == 0:
            raise ValueError(f"request {request_id!r}: an empty prompt has no KV cache")
        tpb = self.tokens_per_block
        seq = _Sequence(request_id, prompt, retention)
        num_blocks = -(-length // tpb)
        if not self.enable_block_reuse:
            self._seqs[request_id] = seq
            for _ in range(num_blocks):  # allocateBlock: decode retention applies to every block here
                self._add_to_seq(seq, self._get_free_block(seq.decode_priority, seq.decode_duration_ms))
            self.total_input_tokens += length
            return 0
        # The last token has no KV yet: keys cover length - 1 tokens, the last one partial. A block past the keys
        # (the last token alone in a block of its own) gets the empty key (C++ guards blockItr != end). Made before
        # the sequence is registered: an id out of 64 bits raises OverflowError here and leaves nothing behind.
        keys = self._block_keys(seq, length - 1, True)
        self._seqs[request_id] = seq
        num_keys = len(keys)
        num_full = (length - 1) // tpb  # keys[:num_full] are full; keys[num_full], if any, holds the rest
        tail_tokens = length - 1 - num_full * tpb
        per_block = retention.per_block(tpb, length) if retention is not None else None

        # Walk the tree while blocks match; TensorRT-LLM stops searching at the first miss or partial match.
        matched_tokens = 0
        search: KVCacheBlock | None = self._root
        bi = 0
        while search is not None and bi < num_blocks:
            key = keys[bi] if bi < num_keys else _NO_KEY
            key_tokens = tpb if bi < num_full else tail_tokens if bi < num_keys else 0
            prio, dur = per_block[bi] if per_block is not None else (None, None)
            partial, num_matched, match = self._find_matching(search, key)
            if match is None:
                break
            matched_tokens += num_matched if num_matched > 0 else key_tokens
            if prio is not None and match.priority != prio:
                self._enqueue_updated(match, None, (match.priority, prio))
            if partial:
                if match.refs > 0 or match.children is not None:
                    # Somebody uses it, or it has children: copy the matched tokens into a new block, which
                    # takes the whole key of this prompt block (1.2 sets key and hash right after the copy).
                    match = self._get_free_block(match.priority, match.duration_ms)
                    match.key = key
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
            bi += 1
            if search is not None:  # a full block found in the tree: the path now runs through blocks[:bi]
                seq.tree_prefix = bi

        # Every block from the first miss on is new. Most of a trace's prompt blocks land here: taken in one batch
        # when they share a priority, then keyed (the keys of a taken block do not affect the next take).
        blocks = seq.blocks
        first_new = len(blocks)
        try:
            if per_block is None:
                self._take_free_blocks(num_blocks - bi, DEFAULT_PRIORITY, None, blocks)
            else:
                for prio, dur in per_block[bi:num_blocks]:
                    self._take_free_blocks(1, prio if prio is not None else DEFAULT_PRIORITY, dur, blocks)
        finally:
            # _add_to_seq, then the key and hash of each block taken (also when the pool ran dry part-way)
            # (a taken block was free, so it had no reference)
            new_blocks = blocks[first_new:]
            if self._events_enabled:
                # block_key_hash of each new block's key, chained: every id's mix made at once (numpy), then the
                # 64-bit seed steps here, one line a token
                new_keys = keys[bi:bi + len(new_blocks)]
                new_keys += [_NO_KEY] * (len(new_blocks) - len(new_keys))  # blocks past the keys: the empty key
                parent_hash = blocks[first_new - 1].hash if first_new else 0
                m64 = _M64
                for block, key, mixes in zip(new_blocks, new_keys, _keys_token_mixes(new_keys)):
                    block.refs = 1
                    if block.key != key or block.hash_parent != parent_hash:  # else its hash is this one already
                        seed = (len(mixes) ^ (parent_hash * 0xBF58476D1CE4E5B9)) & m64
                        for mixed in mixes:
                            seed ^= (mixed + (seed << 6) + (seed >> 2)) & m64
                        block.hash = seed
                        block.hash_parent = parent_hash
                    block.key = key
                    parent_hash = block.hash
            else:
                new_keys = keys[bi:bi + len(new_blocks)]
                new_keys += [_NO_KEY] * (len(new_blocks) - len(new_keys))  # blocks past the keys: the empty key
                for block, fresh_key in zip(new_blocks, new_keys):
                    block.refs = 1
                    block.key = fresh_key
            self.missed_blocks += len(new_blocks)
        self.reused_tokens += matched_tokens
        self.total_input_tokens += length
        return matched_tokens

    def add_token(self, request_id: Any, token_id: int) -> None:
        """``addToken``: append one generated token; a new block when the sequence fills its last one."""
        seq = self._seqs.get(request_id)  # _seq() inlined: once per generated token
        if seq is None:
            raise ValueError(f"request {request_id!r} is not in the KV cache manager")
        if not MIN_TOKEN_ID <= token_id <= MAX_TOKEN_ID:
            raise OverflowError(f"token id {token_id} does not fit in signed 64 bits")
        if seq.num_tokens % self.tokens_per_block == 0:
            block = self._get_free_block(seq.decode_priority, seq.decode_duration_ms)
            self._add_to_seq(seq, block)
        seq.generated.append(token_id)
        seq.num_tokens += 1

    def add_tokens(self, request_id: Any, token_ids: Sequence[int]) -> None:
        """``add_token`` for each id in turn, with nothing else in between (a hit-rate-only replay decodes a
        request alone): the same blocks, counters and events, the new blocks taken in one batch. The per-token
        call was half of a replay at 512 tokens a block (595k generated tokens, 10k new blocks). Raises as the
        per-token calls would, with the tokens before the one that found no block added."""
        seq = self._seqs.get(request_id)
        if seq is None:
            raise ValueError(f"request {request_id!r} is not in the KV cache manager")
        count = len(token_ids)
        if not count:
            return
        if not MIN_TOKEN_ID <= min(token_ids) or not max(token_ids) <= MAX_TOKEN_ID:
            bad = next(i for i, t in enumerate(token_ids) if not MIN_TOKEN_ID <= t <= MAX_TOKEN_ID)
            self.add_tokens(request_id, token_ids[:bad])  # the tokens before it go in, as one call each would
            raise OverflowError(f"token id {token_ids[bad]} does not fit in signed 64 bits")
        tpb = self.tokens_per_block
        first = -seq.num_tokens % tpb  # index of the first token that starts a block
        need = (count - 1 - first) // tpb + 1 if count > first else 0
        blocks = seq.blocks
        before = len(blocks)
        added = count
        try:
            self._take_free_blocks(need, seq.decode_priority, seq.decode_duration_ms, blocks)
        except NoFreeBlockError:
            added = first + (len(blocks) - before) * tpb  # the token that found no block, and those after it
            raise
        finally:
            for block in blocks[before:]:
                block.refs += 1
            seq.generated.extend(token_ids[:added])
            seq.num_tokens += added

    def store_context_blocks(self, request_id: Any) -> None:
        """``storeContextBlocks``: put the full prompt blocks into the reuse tree (after prefill)."""
        seq = self._seq(request_id)
        if self.enable_block_reuse:
            self._store_blocks(seq, self._block_keys(seq, seq.num_tokens - 1, False))

    def remove_sequence(self, request_id: Any, final_tokens: Sequence[int] = ()) -> None:
        """``removeSequence``: store every block for reuse (a partial last one too), then release, last first.

        ``final_tokens``: tokens the request produced after its last ``add_token`` (TensorRT-LLM's engine
        calls ``addToken`` before each decode step, so the last generated token has no KV and no block; it
        is in the request's token list all the same, and ``storeBlocks`` stores ``len - 1`` of them).
        """
        seq = self._seq(request_id)
        for token_id in final_tokens:
            if not MIN_TOKEN_ID <= token_id <= MAX_TOKEN_ID:
                raise OverflowError(f"token id {token_id} does not fit in signed 64 bits")
        seq.generated.extend(final_tokens)
        seq.num_tokens = seq.prompt_len + len(seq.generated)
        if self.enable_block_reuse:
            self._store_blocks(seq, self._block_keys(seq, seq.num_tokens - 1, True))
        del self._seqs[request_id]
        # The eviction policy's release, inlined (hundreds of blocks per trace request); see _EvictionPolicy for
        # the invariants.
        policy = self._policy
        primary_queues, host_queues = policy.queues
        primary_prios, host_prios = policy.nonempty
        first_stamp = stamp = policy.stamp
        released_host = 0  # the primary count is the rest: one stamp per block released
        if policy.timed:
            for block in reversed(seq.blocks):
                refs = block.refs - 1
                block.refs = refs
                if refs:
                    continue
                prio = block.priority
                if block.primary:
                    queue = primary_queues[prio]
                    if not queue:
                        insort(primary_prios, prio)
                else:
                    queue = host_queues[prio]
                    if not queue:
                        insort(host_prios, prio)
                    released_host += 1
                queue.append(stamp)
                queue.append(block)
                block.qstamp = stamp
                stamp += 1
                if block.duration_ms is not None and prio != DEFAULT_PRIORITY:
                    policy.start_expiry(block)
        elif self.onboard_blocks:
            # No duration (_EvictionPolicy.timed): nothing to expire. And every block a sequence holds is on the GPU:
            # a reused host block is onboarded before the sequence takes it, every other block is taken from the
            # GPU pool, and a held block is in no free queue, so never an offload's victim or target.
            for block in reversed(seq.blocks):
                refs = block.refs - 1
                block.refs = refs
                if refs:
                    continue
                queue = primary_queues[block.priority]
                if not queue:
                    insort(primary_prios, block.priority)
                queue.append(stamp)
                queue.append(block)
                block.qstamp = stamp
                stamp += 1
        else:  # no duration, onboard_blocks off: the general form (though nothing is offloaded then either)
            for block in reversed(seq.blocks):
                refs = block.refs - 1
                block.refs = refs
                if refs:
                    continue
                if block.primary:
                    queue = primary_queues[block.priority]
                    if not queue:
                        insort(primary_prios, block.priority)
                else:
                    queue = host_queues[block.priority]
                    if not queue:
                        insort(host_prios, block.priority)
                    released_host += 1
                queue.append(stamp)
                queue.append(block)
                block.qstamp = stamp
                stamp += 1
        policy.stamp = stamp
        policy.num_free[PRIMARY] += stamp - first_stamp - released_host
        policy.num_free[SECONDARY] += released_host

    def scheduling_remove_sequence(self, request_id: Any, scheduling_refs: dict[int, int]) -> int:
        """``schedulingRemoveSequence`` (MAX_UTILIZATION's trial release): how many of the request's blocks would
        become free if it released them, given the trial releases so far. ``scheduling_refs`` (block id ->
        references left) starts empty at each scheduling pass, as ``startScheduling`` copies the reference counts;
        nothing else changes."""
        freed = 0
        for block in self._seq(request_id).blocks:
            refs = scheduling_refs.get(block.id, block.refs) - 1
            scheduling_refs[block.id] = refs
            if refs == 0:
                freed += 1
        return freed

    def find_new_context_block(self, token_ids: Sequence[int]) -> tuple[KVCacheBlock, bytes] | None:
        """``findNewContextBlock`` (kvCacheManager.cpp, WindowBlockManager): the first full block of ``token_ids``
        that the reuse tree does not hold, matched exactly (no partial matches), or None where every full block is
        there (or there is none). The block is named by the tree node its prefix ends at and its own key, which
        names the same prefix of tokens as TensorRT-LLM's BlockKey of the accumulated tokens does: two requests get
        equal results exactly when their tokens agree up to and including that block. Only the capacity
        scheduler's ``beneficialToSkip`` reads it; nothing changes."""
        tpb = self.tokens_per_block
        node = self._root
        if isinstance(token_ids, TokenRuns):  # a trace prompt: its keys are made once (full_block_keys)
            found = self._first_new_block(node, token_ids.full_block_keys(tpb))
            return None if found is None or found[1] is _NO_KEY else found
        stop = len(token_ids) // tpb * tpb
        pos = 0
        # Keys a few blocks at a time: the walk stops at the first miss, usually within the first few blocks of a
        # long prompt, so most of a 10,000-token prompt is never encoded.
        chunk = 4 * tpb
        while pos < stop:
            end = min(stop, pos + chunk)
            keys = _encode_full_blocks(token_ids[pos:end], tpb)
            found = self._first_new_block(node, keys)
            if found is None or found[1] is not _NO_KEY:
                return found
            node = found[0]
            pos = end
            chunk *= 2
        return None

    @staticmethod
    def _first_new_block(node: KVCacheBlock, keys: list[bytes]) -> tuple[KVCacheBlock, bytes] | None:
        """The walk of ``find_new_context_block`` along ``keys`` from ``node`` (``KVCacheBlock.child`` inlined): the
        first key not under its node, or (the last node, the empty key) where there are keys and all match, or
        None where there are none."""
        if not keys:
            return None
        for key in keys:
            children = node.children
            if children is None:
                return node, key
            if isinstance(children, dict):
                child = children.get(key)
                if child is None:
                    return node, key
                node = child
            elif children.key == key:
                node = children
            else:
                return node, key
        return node, _NO_KEY

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

    def _block_at(self, block_id: int) -> KVCacheBlock:
        """The block of an id; a host block not made yet is one as the constructor makes it (make_host_blocks)."""
        if len(self._blocks) <= block_id < self.primary_blocks + self.secondary_blocks:
            return KVCacheBlock(block_id, False)
        return self._blocks[block_id]

    def block_cache_level(self, block_id: int) -> int:
        return self._block_at(block_id).level

    def block_priority(self, block_id: int) -> int:
        return self._block_at(block_id).priority

    def block_hash(self, block_id: int) -> int:
        return self._block_at(block_id).hash

    def block_in_tree(self, block_id: int) -> bool:
        return self._block_at(block_id).in_tree()

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
        return self._seq(request_id).num_tokens

    def _seq(self, request_id: Any) -> _Sequence:
        try:
            return self._seqs[request_id]
        except KeyError:
            raise ValueError(f"request {request_id!r} is not in the KV cache manager") from None

    def _store_blocks(self, seq: _Sequence, keys: list[bytes]) -> None:
        """``storeBlocks``: walk the tree along ``keys``; from the first miss on, insert the sequence's blocks.

        Keys are never empty (``_block_keys`` makes none), so every one is looked up until the first miss (a key
        holds whether its block is full: its token count). The walk starts past the sequence's known path
        (``_Sequence.tree_prefix``), where looking up would find the blocks already known.
        """
        blocks = seq.blocks
        count = min(len(keys), len(blocks))
        first_new = min(seq.tree_prefix, count)
        search = blocks[first_new - 1] if first_new else self._root
        on_path = True  # the path so far is the sequence's own blocks
        while first_new < count:
            match = search.child(keys[first_new])
            if match is None:
                break
            if on_path and match is blocks[first_new]:
                seq.tree_prefix = first_new + 1
            else:
                on_path = False  # through another request's block, which may be evicted: not a stable path
            search = match
            first_new += 1
        if first_new == count:
            return
        events = self._events_enabled
        stored = blocks[first_new:count]
        path_end = count  # the first i whose key another block already held under its node: the path ends there
        for block, key in zip(stored, keys[first_new:count]):
            if events and (block.key != key or block.hash_parent != search.hash):  # else the hash is this one
                block.hash = block_key_hash(decode_key(key), search.hash)
                block.hash_parent = search.hash
            block.key = key
            block.prev = search
            children = search.children  # search.add_child(key, block), inlined (4.4M stored blocks a trace)
            if children is None:  # every block but the first: under the block stored just before
                search.children = block
            else:
                if isinstance(children, dict):
                    added = children.setdefault(key, block)
                elif children.key == key:
                    added = children
                else:
                    search.children = {children.key: children, key: block}
                    added = block
                if added is not block and path_end == count:
                    # (cannot happen on the sequence's own path: its blocks have no such children)
                    path_end = first_new + stored.index(block)
            search = block
        if on_path:
            seq.tree_prefix = path_end
        self._enqueue_stored(stored)
