"""An accelerator: the block manager's hit-rate-only trace replay, specialised. The same blocks evicted, offloaded,
onboarded and reused, request by request, with only what a hit-rate sweep reads kept.

- Reference: ``sweep.replay_trace`` over TensorRT-LLM's block manager (``block_manager.BlockManager``, the ground
  truth), each onboard noted as tests/oracles/block_manager_replay.py's ``DistanceRecorder`` notes it.
- The test that holds them equal: tests/engines/sim/test_sim_sweep_fast.py,
``test_hit_replay_is_the_block_manager_replay``
  (hypothesis, randomized traces: tiny pools, host tiers of 0 to 3 blocks, repeated prompts, partial blocks, prompts
  longer than their hash ids, the batches on and off at every block size) and
  ``test_hit_replay_is_the_block_manager_replay_on_the_shipped_slice``: counters, each onboard's (distance, offload
  counts) and where each request's onboards start, exactly.
- The measurement that pays for it: bench/JOURNAL.md, "Host-cache sweeps" (the 01:50 UTC run of 2026-12-02): the
  Mooncake trace's replay, 16 host sizes, 0.77 -> ~0.15 s at 512 tokens a block and 4.4 -> ~1.5 s at 32; the
  first cut (aeb335f) 0.77 -> 0.26 s.

``sweep.replay_trace`` drives the block manager through a trace one request at a time: ``add_sequence``,
``store_context_blocks``, ``add_tokens``, ``remove_sequence``. In that use most of what the manager carries is never
read: every block has the default priority 35 and no duration (no retention), events are off, nothing else runs
beside the request, so every block the request does not hold is free, and the host tier's blocks are all free.
``replay`` below takes the same steps in the same order, on state held the cheapest way CPython allows for that
case (profile of the Mooncake trace, 16 sizes: 43% of the general replay was ``_take_free_blocks``, 25% cutting
prompts into keys and walking the tree; 1.9M blocks at 32 tokens a block):

- blocks are ints, their fields lists indexed by block (tier, key, parent, children, offload count);
- one free queue per tier (one priority: TensorRT-LLM's 101 queues reduce to the 35 one), a deque of entries
  ``epoch << shift | block``. A block leaves the middle of a queue only when a request claims it (reuse), which
  raises the block's ``claimed`` mark past every entry of it made so far: an entry is live iff it is not below its
  block's mark. So a release queues a request's blocks with one ``deque.extend`` of a ``map``, no write per block,
  where the general manager stamps each block;
- a block key is an int, the first token id, for a full block of consecutive ids (every block inside a trace
  block), and an interned id past 2^64 for any other key (a partial block, a block across runs), named by its
  tokens as maximal runs of ids. Two keys are equal iff their tokens are, as with the general manager's bytes keys
  (``block_manager.encode_key``), so the reuse tree's dicts behave the same; a request's keys are cut from its
  trace hash ids in C (``range``) for the trace blocks it holds whole;
- a node's children are None, the only child's id, or a dict (``_Block.children``'s three forms);
- where a trace block is 16 KV blocks or more, a batch's takes and a fresh chain's links go a step at a time
  for all its blocks (``take_batch``, ``store``).

What this use guarantees, and the code relies on: a block the request matches is free (it is in no other
request); at release every block of the request is on the GPU; the host tier's free count is its size but during
an onboard (one less: so with one host block the onboard's victim is not offloaded, as in the general manager).
- partial reuse (``_find_matching``'s scan of a node's children for the longest common prefix, the first in
  insertion order on ties) reads only the candidates that share the key's first token: the int child of that id
  and the interned children indexed by (node, first id), ordered by insertion; the general scan read all the
  root's thousands of children once per request.

Each step below names the ``BlockManager`` method it stands for. ``replay`` holds the state and the per-request
steps; ``_take_steps`` and ``_tree_steps`` build the closures over that state once a replay (closures, not methods:
a cell or default-argument read where an attribute read of ``self`` costs more). Split from one 388-line function
for 0.05-0.25% of the instructions (bench/JOURNAL.md, "The sweep's replay accelerator in named steps").
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import field
from itertools import chain

from kvtop.engines.inputs import TRACE_BLOCK_TOKENS, TraceRequest
from kvtop.engines.sim.core import GENERATED_TOKEN_BASE
from kvtop.values import mutable

_INTERNED_BASE = 1 << 64  # past every token id (signed 64-bit), so an interned key never equals a run key
_NO_BLOCK = -1
# take() and store() a step at a time for all blocks from this many (most of a trace's: a prompt's new blocks), when
# a trace block is 16 KV blocks or more. Measured on the Mooncake trace (CPU s of the replay, both in one process,
# alternated, best of 3, dev box at load ~3): 32 tokens a block 1.45 against 1.53 step by step; 64 slower (0.79
# against 0.76) and 512 too (0.164 against 0.142; why is not known), so off there.
BATCH_FROM = 8
BATCH_FROM_BLOCKS_PER_TRACE_BLOCK = 16
_MAX_HASH_ID = ((1 << 63) - TRACE_BLOCK_TOKENS) // TRACE_BLOCK_TOKENS  # its 512 ids fit in signed 64 bits


@mutable  # kvtop.values: no code compiled at import
class ReplayResult:
    replayed: int = 0
    skipped: int = 0
    reused_blocks: int = 0
    missed_blocks: int = 0
    offloaded_blocks: int = 0
    onboarded_blocks: int = 0
    # per onboard, in order: (offloads since the block's own, the offload count at its offload, at the onboard)
    onboards: list[tuple[int, int, int]] = field(default_factory=list)
    request_starts: list[int] = field(default_factory=list)  # index into onboards where each request's start


class _Tokens:
    """A request's token sequence from its last whole trace block on (``start`` is that block's position): the
    runs of ``TraceRequest.prompt_runs`` from there (the block, the last trace block cut to the prompt, or the
    prompt's unique tail), then the run of generated ids ``sweep.replay_trace`` feeds (``GENERATED_TOKEN_BASE``, +1,
    ...). Every key that is not inside a whole trace block lies here."""

    __slots__ = ("whole", "start", "runs")

    def __init__(self, tr: TraceRequest):
        hash_ids = tr.hash_ids
        whole = min(len(hash_ids), tr.input_length // TRACE_BLOCK_TOKENS)  # trace blocks of 512 prompt tokens
        self.whole = whole
        runs: list[tuple[int, int]] = []
        if whole:
            runs.append((hash_ids[whole - 1] * TRACE_BLOCK_TOKENS, TRACE_BLOCK_TOKENS))
        self.start = max(whole - 1, 0) * TRACE_BLOCK_TOKENS
        remaining = tr.input_length - whole * TRACE_BLOCK_TOKENS
        if remaining > 0 and whole < len(hash_ids):  # < 512: the last trace block, cut
            runs.append((hash_ids[whole] * TRACE_BLOCK_TOKENS, remaining))
        elif remaining > 0:  # the hash ids end before the prompt does (prompt_runs' tail)
            runs.append((-((tr.line + 1) << 24), remaining))
        runs.append((GENERATED_TOKEN_BASE, tr.output_length))
        self.runs = runs

    def slice(self, start: int, stop: int) -> tuple[tuple[int, int], ...]:
        """Tokens ``[start, stop)`` (``start >= self.start``) as maximal runs: equal tuples iff equal tokens."""
        pos = self.start
        for first, length in self.runs:  # most slices lie in one run: one run, the maximal form already
            if start < pos + length:
                if stop <= pos + length:
                    return ((first + start - pos, stop - start),)
                break
            pos += length
        out: list[tuple[int, int]] = []
        pos = self.start
        for first, length in self.runs:
            lo, hi = max(start, pos), min(stop, pos + length)
            if lo < hi:
                v = first + lo - pos
                if out and out[-1][0] + out[-1][1] == v:  # continues the run before it
                    out[-1] = (out[-1][0], out[-1][1] + hi - lo)
                else:
                    out.append((v, hi - lo))
            pos += length
            if pos >= stop:
                break
        return tuple(out)


class _Keys:
    """Block keys as ints (see the module docstring): a full block of consecutive ids is its first id; any other
    block's tokens, as maximal runs, are interned under an id from ``_INTERNED_BASE`` on."""

    def __init__(self, tokens_per_block: int):
        self.tpb = tokens_per_block
        self.interned: dict[tuple[tuple[int, int], ...], int] = {}
        self.runs: list[tuple[tuple[int, int], ...]] = []  # per interned id - _INTERNED_BASE

    def of_runs(self, runs: tuple[tuple[int, int], ...]) -> int:
        """The key of one block's tokens, given as maximal runs (fewer tokens than a block's: a partial block)."""
        if len(runs) == 1 and runs[0][1] == self.tpb:
            return runs[0][0]
        k = self.interned.get(runs)
        return self.intern(runs) if k is None else k

    def first_token(self, key: int) -> int:
        return key if key < _INTERNED_BASE else self.runs[key - _INTERNED_BASE][0][0]

    def tokens(self, key: int) -> Iterator[int]:
        if key < _INTERNED_BASE:
            return iter(range(key, key + self.tpb))
        return chain.from_iterable(range(v, v + n) for v, n in self.runs[key - _INTERNED_BASE])

    def full(self, tr: TraceRequest, tokens: _Tokens, count: int) -> list[int]:
        """Keys of the first ``count`` full blocks of the request's tokens: those inside whole trace blocks in C
        (``range``), then block by block from ``tokens``."""
        tpb = self.tpb
        whole = tokens.whole
        if tpb == TRACE_BLOCK_TOKENS:
            keys = [h * TRACE_BLOCK_TOKENS for h in tr.hash_ids[:whole]]
        else:
            keys = []
            extend = keys.extend
            for h in tr.hash_ids[:whole]:
                base = h * TRACE_BLOCK_TOKENS
                extend(range(base, base + TRACE_BLOCK_TOKENS, tpb))
        # (count >= len(keys): a request holds its whole trace blocks' tokens, and blocks divide 512 tokens)
        pos = len(keys) * tpb
        while len(keys) < count:
            keys.append(self.of_runs(tokens.slice(pos, pos + tpb)))
            pos += tpb
        return keys

    def of_request_whole(self, tr: TraceRequest, with_kv: int) -> tuple[list[int], int | None, int | None]:
        """Where a block is a trace block (512 tokens): what ``full``, then ``of_runs`` of the partial blocks, give
        through ``_Tokens`` (the same keys, interned in the same order), without it: the full blocks' keys for the
        first ``with_kv`` tokens, the key of the first ``input_length - 1`` tokens' partial last block (None when
        they fill their blocks) and that of the first ``with_kv`` tokens' (None likewise). Past the whole trace
        blocks the tokens are the runs A (the last trace block cut to the prompt, or the prompt's tail past the
        hash ids; ``rest`` tokens) and G (the generated ids); a block there is a slice of A, of G, or of both: two
        runs, as A never ends where G starts (a cut trace block ends short of a multiple of 512, G starts at one;
        the tail's ids are negative)."""
        hash_ids = tr.hash_ids
        length = tr.input_length
        whole = min(len(hash_ids), length >> 9)
        keys = [h << 9 for h in hash_ids[:whole]]
        rest = length - (whole << 9)  # < 512 where hash ids remain (whole = length // 512)
        a0 = hash_ids[whole] << 9 if whole < len(hash_ids) else -((tr.line + 1) << 24)  # (unread when rest is 0)
        past_whole = self.past_whole
        end = (with_kv >> 9) - whole << 9  # the full blocks past the whole trace blocks, in tokens
        for lo in range(0, end, 512):
            keys.append(past_whole(a0, rest, lo, lo + 512))
        prompt = length - 1
        if not prompt & 511:
            add_last = None
        elif (prompt >> 9) >= whole:  # within A (it ends at rest - 1): one run, fewer than 512 tokens
            lo = (prompt >> 9) - whole << 9
            runs = ((a0 + lo, prompt - (whole << 9) - lo),)
            add_last = self.interned.get(runs)
            if add_last is None:
                add_last = self.intern(runs)
        else:  # the prompt fills its trace blocks: its last 511 tokens, in the last whole trace block
            add_last = self.of_runs(((hash_ids[whole - 1] << 9, 511),))
        last = past_whole(a0, rest, end, with_kv - (whole << 9)) if with_kv & 511 else None
        return keys, add_last, last

    def past_whole(self, a0: int, rest: int, lo: int, hi: int) -> int:
        """The key of tokens [lo, hi) past a request's whole trace blocks (``of_request_whole``: run A from ``a0``,
        ``rest`` tokens, then the generated ids), as ``of_runs`` of ``_Tokens.slice`` gives it."""
        if hi <= rest:
            runs: tuple[tuple[int, int], ...] = ((a0 + lo, hi - lo),)
        elif lo >= rest:
            runs = ((GENERATED_TOKEN_BASE + lo - rest, hi - lo),)
        else:
            runs = ((a0 + lo, rest - lo), (GENERATED_TOKEN_BASE, hi - rest))
        if hi - lo == self.tpb and len(runs) == 1:
            return runs[0][0]
        k = self.interned.get(runs)
        return self.intern(runs) if k is None else k

    def of_request(self, tr: TraceRequest, with_kv: int, add_full: int) -> tuple[list[int], list[int], int | None]:
        """A request's keys: its full blocks' for the first ``with_kv`` tokens, those ``add_sequence`` looks up (the
        first ``add_full`` full ones, then the partial block of the first ``input_length - 1`` tokens, if any), and
        the partial last block's of the first ``with_kv`` tokens (None when they fill their blocks)."""
        tpb = self.tpb
        if tpb == TRACE_BLOCK_TOKENS:
            full, add_last, last = self.of_request_whole(tr, with_kv)
            add_keys = full[:add_full]
            if add_last is not None:
                add_keys.append(add_last)
            return full, add_keys, last
        length = tr.input_length
        tokens = _Tokens(tr)
        full = self.full(tr, tokens, with_kv // tpb)
        add_keys = full[:add_full]
        if (length - 1) % tpb:
            add_keys.append(self.of_runs(tokens.slice(add_full * tpb, length - 1)))
        last = self.of_runs(tokens.slice(len(full) * tpb, with_kv)) if with_kv % tpb else None
        return full, add_keys, last

    def intern(self, runs: tuple[tuple[int, int], ...]) -> int:
        """A new interned key for these tokens (not interned yet)."""
        k = self.interned[runs] = _INTERNED_BASE + len(self.runs)
        self.runs.append(runs)
        return k


def _take_steps(gpu_queue: deque[int], host_queue: deque[int], key: list[int | None], prev: list[int],
                kids: list[int | dict[int, int] | None], claimed: list[int], on_host: list[int], mask: int, H: int,
                batch_from: int, free_children: Callable[[int], None], remove_child: Callable[[int, int], None]
                ) -> Callable[[int, bool, list[int], int, int], int]:
    """``_take_free_blocks``, over ``replay``'s state: returns ``take``."""

    def take(n: int, offload: bool, into: list[int], offloaded: int, epoch_bits: int,
             gpu_pop=gpu_queue.popleft, host_pop=host_queue.popleft, host_push=host_queue.append,
             key=key, prev=prev, kids=kids, claimed=claimed, on_host=on_host, mask=mask) -> int:
        """``_take_free_blocks(n)``: the GPU queue's front ``n`` blocks, each offloaded first when it holds a key and
        ``offload`` (a host block is free; onboard_blocks on, priority 35 >= 30): it goes to the back of the host
        queue and the host front's block, whose data is dropped, takes its GPU slot. What the taken block frees
        leaves the tree. Returns the offload count."""
        if not offload:
            take_in_place(n, into)
            return offloaded
        if batch_from <= n <= H:
            return take_batch(n, into, offloaded, epoch_bits)
        append = into.append
        for _ in range(n):
            e = gpu_pop()
            b = e & mask
            while e < claimed[b]:  # a stale entry (the block was claimed since)
                e = gpu_pop()
                b = e & mask
            if key[b] is not None:
                e = host_pop()
                t = e & mask
                while e < claimed[t]:
                    e = host_pop()
                    t = e & mask
                offloaded += 1
                on_host[b] = offloaded
                on_host[t] = 0
                host_push(epoch_bits | b)
                b = t
            if kids[b] is not None:
                free_children(b)
            else:
                p = prev[b]
                if p != -1:  # a leaf (-1: out of the tree): detach it by key, as free_children would
                    c = kids[p]
                    if c == b:  # its parent's only child (a chain's link, most of the tree)
                        kids[p] = None
                    elif c is not None:
                        remove_child(p, key[b])  # type: ignore[arg-type]
                    prev[b] = -1
            append(b)
        return offloaded

    def take_in_place(n: int, into: list[int], gpu_pop=gpu_queue.popleft, key=key, prev=prev, kids=kids,
                      claimed=claimed, mask=mask) -> None:
        """``take`` without offloads (no host tier, or an onboard's victim with one host block): the GPU front's
        ``n`` blocks, each leaving the tree."""
        append = into.append
        for _ in range(n):
            e = gpu_pop()
            b = e & mask
            while e < claimed[b]:
                e = gpu_pop()
                b = e & mask
            if kids[b] is not None:
                free_children(b)
            else:
                p = prev[b]
                if p != -1:
                    c = kids[p]
                    if c == b:
                        kids[p] = None
                    elif c is not None:
                        remove_child(p, key[b])  # type: ignore[arg-type]
                    prev[b] = -1
            append(b)

    def take_batch(n: int, into: list[int], offloaded: int, epoch_bits: int,
                   gpu_pop=gpu_queue.popleft, host_pop=host_queue.popleft, key=key, prev=prev, kids=kids,
                   claimed=claimed, on_host=on_host, mask=mask) -> int:
        """``take`` of ``n`` blocks, offloading, a step at a time for all of them: the GPU front's ``n`` live
        entries, the host front's as many as hold keys, the tiers and offload counts, the host queue's new entries,
        then each taken block's detach, in take's order. The same as ``take``'s loop when ``n`` is at most the
        host tier's size: its targets are then all entries that were in the host queue before the batch (the
        offloaded blocks go behind every one of them), so popping them all before pushing changes nothing."""
        gpu = [gpu_pop() for _ in range(n)]
        victims = [e & mask for e in gpu if e >= claimed[e & mask]]
        while len(victims) < n:  # stale entries (claimed blocks) were among them
            e = gpu_pop()
            if e >= claimed[e & mask]:
                victims.append(e & mask)
        keyed = [b for b in victims if key[b] is not None]
        host = [host_pop() for _ in range(len(keyed))]
        targets = [e & mask for e in host if e >= claimed[e & mask]]
        while len(targets) < len(keyed):
            e = host_pop()
            if e >= claimed[e & mask]:
                targets.append(e & mask)
        for b, seq in zip(keyed, range(offloaded + 1, offloaded + 1 + len(keyed))):
            on_host[b] = seq
        for t in targets:
            on_host[t] = 0
        host_queue.extend(map(epoch_bits.__or__, keyed))
        if len(keyed) < n:  # blocks without a key are taken themselves, in their place
            from_host = iter(targets)
            targets = [next(from_host) if key[b] is not None else b for b in victims]
        for b in targets:
            if kids[b] is not None:
                free_children(b)
            else:
                p = prev[b]
                if p != -1:
                    c = kids[p]
                    if c == b:
                        kids[p] = None
                    elif c is not None:
                        remove_child(p, key[b])  # type: ignore[arg-type]
                    prev[b] = -1
        into.extend(targets)
        return offloaded + len(keyed)

    return take


def _tree_steps(key: list[int | None], prev: list[int], kids: list[int | dict[int, int] | None], inserted: list[int],
                by_first: dict[tuple[int, int], list[int]], keys_of: _Keys, root: int, batch_from: int) -> tuple[
                    Callable[[int], None], Callable[[int, int], None], Callable[[int], None],
                    Callable[[int, int], int | None], Callable[[list[int], list[int], int, int], int]]:
    """The reuse tree's steps over ``replay``'s state (``_Block``'s children, ``freeChildren``, ``_find_matching``'s
    partial scan, ``_store_blocks``): returns ``free_children``, ``remove_child``, ``detach``, ``partial_match`` and
    ``store``."""
    stores_done = [0]  # store calls so far: a child's ``inserted``

    # A node's children (``_Block.children``): None, the only child's id, or a dict by key in insertion order (two or
    # more at some point; never empty). A single child is compared by its own key, as _Block.child does.

    def child(node: int, k: int) -> int | None:
        c = kids[node]
        if c is None or c.__class__ is int:
            return c if c is not None and key[c] == k else None  # type: ignore[index]
        return c.get(k)  # type: ignore[union-attr]

    def child_list(node: int) -> list[int]:
        c = kids[node]
        if c is None:
            return []
        return [c] if c.__class__ is int else list(c.values())  # type: ignore[list-item,union-attr]

    def remove_child(node: int, k: int) -> None:
        c = kids[node]
        if c is None:
            return
        if c.__class__ is int:
            if key[c] == k:  # type: ignore[index]
                kids[node] = None
            return
        c.pop(k, None)  # type: ignore[union-attr]
        if not c:
            kids[node] = None

    def add_child(node: int, k: int, b: int) -> int:
        """The child now under ``k`` (``_Block.add_child``); ``inserted`` orders a node's children past its first."""
        c = kids[node]
        if c is None:
            kids[node] = b
            return b
        if c.__class__ is int:
            ck = key[c]  # type: ignore[index]
            if ck == k:
                return c  # type: ignore[return-value]
            kids[node] = {ck: c, k: b}  # type: ignore[dict-item]
        else:
            existing = c.setdefault(k, b)  # type: ignore[union-attr]
            if existing != b:
                return existing  # type: ignore[no-any-return]
        inserted[b] = stores_done[0]
        return b

    def free_children(block: int) -> None:
        """``freeChildren``: the block's subtree leaves the tree, children first, each node detached from its parent
        by key; each node's children as they were when it was reached (BlockManager._free_children's order)."""
        stack = [(block, iter(child_list(block)))]
        while stack:
            node, children = stack[-1]
            c = next(children, None)
            if c is not None:
                stack.append((c, iter(child_list(c))))
                continue
            stack.pop()
            detach(node)

    def detach(block: int) -> None:
        p = prev[block]
        if p != -1:
            remove_child(p, key[block])  # type: ignore[arg-type]
            prev[block] = -1

    def partial_match(node: int, k: int) -> int | None:
        """``_find_matching``'s partial scan: the child of ``node`` sharing the longest prefix with key ``k`` (at
        least one token), the first inserted on ties; the candidates are the children whose key starts with the
        same token (the int key of that token and the interned keys indexed under it). A node's first child (put
        under it while it had none) has the oldest ``inserted`` of its children: its own is from before them."""
        v = keys_of.first_token(k)
        candidates = set()
        if k >= _INTERNED_BASE:
            c = child(node, v)
            if c is not None:
                candidates.add(c)
        for c in by_first.get((node, v), ()):
            ck = key[c]
            if ck is not None and ck >= _INTERNED_BASE and prev[c] == node and child(node, ck) == c:
                candidates.add(c)
        best_n, best = 0, None
        for c in sorted(candidates, key=inserted.__getitem__):
            n = 0
            for x, y in zip(keys_of.tokens(key[c]), keys_of.tokens(k)):  # type: ignore[arg-type]
                if x != y:
                    break
                n += 1
            if n > best_n:
                best_n, best = n, c
        return best

    def store(blocks: list[int], keys: list[int], count: int, tree_prefix: int,
              interned_base: int = _INTERNED_BASE) -> int:
        """``_store_blocks`` of the first ``count`` blocks and keys: walk the tree along ``keys`` from the sequence's
        known path; from the first miss on, insert the sequence's blocks. Returns the new ``tree_prefix``."""
        stores_done[0] += 1
        first_new = min(tree_prefix, count)
        search = blocks[first_new - 1] if first_new else root
        on_path = True
        while first_new < count:
            if kids[search] is None:  # (child's first case, inlined: most walks end at once)
                break
            match = child(search, keys[first_new])
            if match is None:
                break
            if on_path and match == blocks[first_new]:
                tree_prefix = first_new + 1
            else:
                on_path = False
            search = match
            first_new += 1
        chain = blocks[first_new:count]
        if len(chain) >= batch_from and list(map(kids.__getitem__, chain[:-1])).count(None) == len(chain) - 1:
            # Every block but the first goes under the one before it, which has no children: a fresh chain (the
            # common case: the new blocks of a prompt, of a decode), its links set a step at a time for all.
            chain_keys = keys[first_new:count]
            for b, k in zip(chain, chain_keys):
                key[b] = k
            b = chain[0]
            prev[b] = search
            for p, b in zip(chain, chain[1:]):
                prev[b] = p
                kids[p] = b
            first = chain[0]
            existing = add_child(search, chain_keys[0], first)
            if existing != first:
                on_path = False
            elif on_path:
                tree_prefix = count
            if max(chain_keys) >= _INTERNED_BASE:
                for j, k in enumerate(chain_keys):
                    if k >= _INTERNED_BASE and (j or existing == first):
                        under = chain[j - 1] if j else search
                        by_first.setdefault((under, keys_of.first_token(k)), []).append(chain[j])
            return tree_prefix
        if on_path and first_new < count:
            tree_prefix = count  # unless a block below finds its key taken
        for b, k in zip(blocks[first_new:count], keys[first_new:count]):
            key[b] = k
            prev[b] = search
            if kids[search] is None:  # a fresh link (add_child's first case, inlined)
                kids[search] = b
            elif add_child(search, k, b) != b:  # the key is another block's: the path leaves the sequence's
                if on_path:
                    on_path = False
                    tree_prefix = blocks.index(b)  # (a request's blocks are distinct)
                search = b
                continue
            if k >= interned_base:
                by_first.setdefault((search, keys_of.first_token(k)), []).append(b)
            search = b
        return tree_prefix

    return free_children, remove_child, detach, partial_match, store


def replay(requests: Sequence[TraceRequest], primary_blocks: int, host_blocks: int, tokens_per_block: int,
           record_onboards: bool = False) -> ReplayResult:
    """``sweep.replay_trace`` of a ``BlockManager(primary_blocks, host_blocks, tokens_per_block)`` (noting each
    onboard as tests/oracles/block_manager_replay.py does, with ``record_onboards``), its counters and onboards (see
    the module docstring)."""
    if primary_blocks <= 0 or host_blocks < 0 or tokens_per_block <= 0:
        raise ValueError(f"replay: expected primary_blocks > 0, host_blocks >= 0, tokens_per_block > 0, got "
                         f"{primary_blocks}, {host_blocks}, {tokens_per_block}")
    tpb, P, H = tokens_per_block, primary_blocks, host_blocks
    root = P + H
    shift = root.bit_length()
    mask = (1 << shift) - 1
    # 0 on the GPU; on the host the offload count at its offload, or -1 for a host block holding no offloaded data
    # (the host blocks at the start, an onboard's victim): one list for the tier and the count, one write an offload
    on_host = [0] * P + [-1] * H + [0]
    key: list[int | None] = [None] * (root + 1)      # None: no key yet (the general manager's empty key)
    prev = [_NO_BLOCK] * (root + 1)                  # parent in the reuse tree, -1 when out of it
    kids: list[int | dict[int, int] | None] = [None] * (root + 1)  # children: see child() below
    inserted = [0] * (root + 1)                      # the store call that last put it under its parent
    claimed = [0] * (root + 1)                       # entries of the block below this are stale
    # Entries of epoch 0: the GPU blocks, then the host blocks, in id order (_EvictionPolicy's first pushes).
    gpu_queue = deque(range(P))
    host_queue = deque(range(P, P + H))
    keys_of = _Keys(tpb)
    by_first: dict[tuple[int, int], list[int]] = {}  # (node, first token) -> interned-key children, in order
    out = ReplayResult()
    onboards = out.onboards
    starts = out.request_starts
    epoch = 1
    offloaded = onboarded = reused = missed = 0
    batch_from = BATCH_FROM if TRACE_BLOCK_TOKENS // tpb >= BATCH_FROM_BLOCKS_PER_TRACE_BLOCK else 1 << 62
    free_children, remove_child, detach, partial_match, store = _tree_steps(key, prev, kids, inserted, by_first,
                                                                            keys_of, root, batch_from)
    take = _take_steps(gpu_queue, host_queue, key, prev, kids, claimed, on_host, mask, H, batch_from, free_children,
                       remove_child)
    request_keys = keys_of.of_request

    offload_any = H > 0
    for tr in requests:
        length, generated = tr.input_length, tr.output_length
        if tr.hash_ids and max(tr.hash_ids) > _MAX_HASH_ID:
            raise OverflowError(f"trace line {tr.line}: hash id {max(tr.hash_ids)} gives token ids past signed 64 "
                                "bits (the block manager's TokenRuns rejects them too)")
        if length == 0 or generated <= 0 or -(-(length + generated) // tpb) > P:
            out.skipped += 1  # the engine rejects a request needing more blocks than the GPU pool
            continue
        out.replayed += 1
        if record_onboards:
            starts.append(len(onboards))
        with_kv = length + generated - 1  # the last generated token has no KV (remove_sequence's final token)
        add_full = (length - 1) // tpb  # addSequence keys the first length - 1 tokens: full blocks, then the rest
        full, add_keys, last = request_keys(tr, with_kv, add_full)
        num_blocks = -(-length // tpb)
        blocks: list[int] = []
        # addSequence: walk the tree while blocks match (stop at the first miss or partial match)
        search = root
        tree_prefix = 0
        for bi, k in enumerate(add_keys):  # (bi == len(blocks): a block per key until the loop breaks)
            c = kids[search]
            if c is None:
                break
            if c.__class__ is int:  # child(search, k), inlined
                m = c if key[c] == k else None  # type: ignore[index]
            else:
                m = c.get(k)  # type: ignore[union-attr]
            partial = bi >= add_full  # an exact match of the partial last key
            if m is None:
                m = partial_match(search, k)
                if m is None:
                    break
                partial = True
            reused += 1
            if partial and kids[m] is not None:  # copy the matched tokens into a new block, which takes the key
                offloaded = take(1, offload_any, blocks, offloaded, epoch << shift)
                key[blocks[-1]] = k
                break
            epoch += 1  # claim: out of its free queue
            claimed[m] = epoch << shift
            if partial:  # an idle leaf: claimed, out of the tree
                detach(m)
            seq = on_host[m]
            if seq:  # onboard: the GPU victim's slot is swapped with the host block's
                now = offloaded
                if record_onboards:
                    onboards.append((now - seq, seq, now))
                victim: list[int] = []
                offloaded = take(1, H > 1, victim, offloaded, epoch << shift)  # m took a host block out
                v = victim[0]
                on_host[m] = 0
                on_host[v] = -1
                onboarded += 1
                host_queue.append((epoch << shift) | v)  # released into the host queue
            blocks.append(m)
            if partial:
                break
            search = m
            tree_prefix = len(blocks)
        # every block from the first miss on is new
        bi = len(blocks)
        epoch_bits = epoch << shift  # (no claims from here on in this request)
        offloaded = take(num_blocks - bi, offload_any, blocks, offloaded, epoch_bits)
        missed += num_blocks - bi
        # the new blocks' keys; storeContextBlocks sets the full ones again, and nothing reads them in between
        for i in range(max(bi, add_full), num_blocks):
            key[blocks[i]] = add_keys[i] if i < len(add_keys) else None
        tree_prefix = store(blocks, full, add_full, tree_prefix)  # storeContextBlocks (add_keys[:add_full] is full's)
        # add_tokens: the generated tokens but the last, new blocks as the sequence fills its last one
        decode_blocks = -(-with_kv // tpb) - num_blocks
        if decode_blocks:
            offloaded = take(decode_blocks, offload_any, blocks, offloaded, epoch_bits)
        # removeSequence: store every block (a partial last one too), then release, last first
        if last is not None:
            full.append(last)
        store(blocks, full, min(len(full), len(blocks)), tree_prefix)
        gpu_queue.extend(map(epoch_bits.__or__, reversed(blocks)))
    out.reused_blocks, out.missed_blocks = reused, missed
    out.offloaded_blocks, out.onboarded_blocks = offloaded, onboarded
    return out
