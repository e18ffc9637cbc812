"""The block hashes of the simulator's KV events against TensorRT-LLM's ``BlockKeyHasher::hash``, written out here as
plainly as the C++ reads (a ``uint32_t`` mix per token, ``a + 0x9e3779b9`` in 32 bits, a ``uint64_t`` seed), on keys
that take each of the block manager's ways: ``block_key_hash`` (vocabulary ids, memoized; any other id), and the
allocation's batch (every new block's mixes made at once with numpy, then the seed chain), on run keys and packed
keys, ids near 2^31, 2^32 and 2^63, negative ids, runs that wrap at 2^32, parents 0 and large."""

from __future__ import annotations

import random

from kvtop.engines.sim.block_manager import (
    MAX_TOKEN_ID,
    MIN_TOKEN_ID,
    BlockManager,
    TokenRuns,
    _keys_token_mixes,
    _token_mix,
    block_key_hash,
    encode_key,
)

U32 = (1 << 32) - 1
U64 = (1 << 64) - 1


def plain_hash(tokens: list[int], parent_hash: int) -> int:
    """BlockKeyHasher::hash for plain token ids (no extra ids, no LoRA), one C++ statement a line."""
    seed = (len(tokens) ^ ((parent_hash * 0xBF58476D1CE4E5B9) & U64)) & U64
    for token in tokens:
        a = token & U32                                  # uint32_t a = static_cast<uint32_t>(tokenId)
        a = ((((a >> 16) ^ a) & U32) * 0x45D9F3B) & U32  # a = ((a >> 16) ^ a) * 0x45d9f3b
        a = ((((a >> 16) ^ a) & U32) * 0x45D9F3B) & U32
        a = ((a >> 16) ^ a) & U32
        seed ^= (((a + 0x9E3779B9) & U32) + ((seed << 6) & U64) + (seed >> 2)) & U64
    return seed


EDGES = [0, 1, (1 << 18) - 1, 1 << 18, (1 << 31) - 3, 1 << 31, (1 << 32) - 2, 1 << 32, (1 << 33) + 7,
         MAX_TOKEN_ID - 40, MAX_TOKEN_ID, -1, -(1 << 31), -(1 << 32) - 5, MIN_TOKEN_ID, MIN_TOKEN_ID + 3]


def random_block(rng: random.Random, n: int) -> list[int]:
    """n ids: a run (consecutive ids, a run key) from an edge or anywhere, or ids at random (a packed key)."""
    kind = rng.randrange(4)
    if kind == 0:  # a run from near an edge, kept inside signed 64 bits
        first = min(max(rng.choice(EDGES) + rng.randrange(-40, 40), MIN_TOKEN_ID), MAX_TOKEN_ID - n + 1)
        return list(range(first, first + n))
    if kind == 1:
        first = rng.randrange(MIN_TOKEN_ID, MAX_TOKEN_ID - n + 2)
        return list(range(first, first + n))
    if kind == 2:  # vocabulary ids (block_key_hash's memoized mixes)
        return [rng.randrange(1 << 18) for _ in range(n)]
    return [rng.choice([rng.choice(EDGES), rng.randrange(MIN_TOKEN_ID, MAX_TOKEN_ID + 1),
                        rng.randrange(-(1 << 33), 1 << 33)]) for _ in range(n)]


def test_block_key_hash_is_the_plain_formula() -> None:
    rng = random.Random(22)
    parents = [0, 1, U64, 1 << 63, 0xBF58476D1CE4E5B9]
    for trial in range(600):
        tokens = random_block(rng, rng.randrange(0, 40))
        parent = parents[trial % len(parents)] if trial % 3 else rng.randrange(1 << 64)
        assert block_key_hash(tokens, parent) == plain_hash(tokens, parent), (tokens, parent)
    # a value worked out by hand from the C++ (token 0: a = 0, mix 0x9e3779b9; seed 1 ^ 0 = 1)
    assert block_key_hash([0], 0) == 1 ^ (0x9E3779B9 + (1 << 6) + (1 >> 2))


def test_keys_token_mixes_are_each_keys_ids_mixes_in_order() -> None:
    rng = random.Random(5)
    for _ in range(300):
        blocks = [random_block(rng, rng.choice([1, 2, 3, 16, 32, 32, 32])) for _ in range(rng.randrange(0, 80))]
        if rng.random() < 0.3:
            blocks.insert(rng.randrange(len(blocks) + 1), [])  # the empty key: no ids
        keys = [encode_key(b) for b in blocks]
        assert _keys_token_mixes(keys) == [[_token_mix(t) for t in b] for b in blocks]
    # long stretches of one kind: a prompt's runs (across 2^32, the last one partial), generated tokens' packed keys,
    # single ids
    blocks = [list(range(v, v + 32)) for v in range((1 << 32) - 40 * 32, (1 << 32) + 60 * 32, 32)]
    blocks += [list(range(7, 19))] + [[rng.randrange(1 << 40) for _ in range(32)] for _ in range(70)]
    blocks += [[rng.randrange(-(1 << 40), 1 << 40)] for _ in range(1200)]
    assert _keys_token_mixes([encode_key(b) for b in blocks]) == [[_token_mix(t) for t in b] for b in blocks]


def _new_blocks_expected(bm: BlockManager, rid: int, prompt: list[int], tpb: int, reused: int) -> list[int]:
    """The hash add_sequence gives each new block of the prompt (those after the ``reused`` ones): its key's (keys
    over len - 1 tokens, the last one partial, a block past them with the empty key) chained to the hash of the block
    before it (0 for the first; a partially matched block before keeps the hash of the key it held)."""
    keyed = prompt[:-1]
    ids = bm.block_ids(rid)
    parent = bm.block_hash(ids[reused - 1]) if reused else 0
    hashes = []
    for i in range(reused, len(ids)):
        parent = plain_hash(keyed[i * tpb:(i + 1) * tpb], parent)
        hashes.append(parent)
    return hashes


def _check_stored(events: list[dict], by_hash_parent: dict[int, int]) -> int:
    checked = 0
    for event in events:
        data = event["data"]
        if data["type"] != "stored":
            continue
        parent = data["parent_hash"] or 0
        for block in data["blocks"]:
            tokens = block["token_ids"] if "token_ids" in block else [t["token_id"] for t in block["tokens"]]
            assert block["block_hash"] == plain_hash(tokens, parent)
            by_hash_parent[block["block_hash"]] = parent
            parent = block["block_hash"]
            checked += 1
    return checked


def test_new_blocks_and_stored_events_carry_the_plain_formulas_hash() -> None:
    """Prompts of run blocks, packed blocks and both, as lists and as TokenRuns, sharing prefixes (so that new blocks
    chain to a reused block's large hash), with partial and empty last blocks: every block's hash just after
    add_sequence, and every stored event's, is the plain formula's."""
    rng = random.Random(11)
    for token_ids_form in (False, True):
        tpb = 8
        bm = BlockManager(64, 16, tpb, event_buffer_max_size=100_000, event_token_ids=token_ids_form)
        prefixes: list[list[int]] = []
        checked = new_blocks = 0
        for rid in range(250):
            if prefixes and rng.random() < 0.5:  # a prompt that starts as an earlier one did
                base = rng.choice(prefixes)
                prompt = base[:rng.randrange(1, len(base) + 1)]
            else:
                prompt = []
            for _ in range(rng.randrange(0, 6)):
                prompt += random_block(rng, rng.choice([tpb, tpb, tpb, rng.randrange(1, tpb)]))
            prompt += random_block(rng, rng.randrange(1, tpb + 2))  # a tail: the last block partial, or one past
            reused = bm.reused_blocks
            runs = rng.random() < 0.5 and len(prompt) > 1
            if runs:  # the same ids as runs of consecutive ids (TokenRuns)
                pairs: list[tuple[int, int]] = []
                for t in prompt:
                    if pairs and pairs[-1][0] + pairs[-1][1] == t:
                        pairs[-1] = (pairs[-1][0], pairs[-1][1] + 1)
                    else:
                        pairs.append((t, 1))
                bm.add_sequence(rid, TokenRuns(pairs))
            else:
                bm.add_sequence(rid, prompt)
            reused = bm.reused_blocks - reused
            new = [bm.block_hash(i) for i in bm.block_ids(rid)[reused:]]
            assert new == _new_blocks_expected(bm, rid, prompt, tpb, reused), (rid, prompt)
            new_blocks += len(new)
            bm.store_context_blocks(rid)
            bm.remove_sequence(rid, [rng.randrange(1 << 40) for _ in range(rng.randrange(3))])
            checked += _check_stored(bm.take_events(), {})
            prefixes.append(prompt)
        assert checked > 500 and new_blocks > 500  # the blocks and events were there to check
