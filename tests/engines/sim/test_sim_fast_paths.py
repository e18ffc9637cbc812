"""The simulator's batched fast paths against the one-at-a-time calls they stand for.

``kvtop.engines.sim.accel.add_token_each`` (an engine step's decode tokens in one call) against ``add_token`` per
request, and ``find_new_context_block`` on a trace prompt (``TokenRuns``, its keys made once) against the same
prompt as a list (keys cut a few blocks at a time): same results, same block ids, counters and events.
"""

from __future__ import annotations

import random
from typing import Any

from kvtop.engines.sim.accel import add_token_each
from kvtop.engines.sim.block_manager import BlockManager, KvCacheRetentionConfig, NoFreeBlockError, TokenRuns


def _state(bm: BlockManager, ids: list[int]) -> Any:
    return ([bm.block_ids(i) if bm.has_request(i) else None for i in ids], bm.kv_cache_stats(),
            bm.offloaded_blocks, bm.evicted_blocks, bm.take_events())


def test_add_token_each_is_add_token_per_request_until_the_pool_runs_dry() -> None:
    rng = random.Random(7)
    for seed in range(12):
        managers = [BlockManager(40, 8, 4, event_buffer_max_size=10_000) for _ in range(2)]
        ids = list(range(6))
        for bm in managers:
            for i in ids:
                r = random.Random(seed * 100 + i)
                bm.add_sequence(i, [r.randrange(50) for _ in range(r.randrange(3, 18))])
        steps: list[Any] = [[], []]
        for step in range(30):
            tokens = [rng.randrange(1000) for _ in ids]
            live = [i for i in ids if managers[0].has_request(i)]
            fed = [tokens[i] for i in live]
            # one at a time: a request whose block is not there is removed, as the engine does, and the rest go on
            for i, t in zip(live, fed):
                try:
                    managers[0].add_token(i, t)
                except NoFreeBlockError:
                    steps[0].append((step, i))
                    managers[0].remove_sequence(i)
            k = add_token_each(managers[1], live, fed)
            while k < len(live):
                steps[1].append((step, live[k]))
                managers[1].remove_sequence(live[k])
                k = add_token_each(managers[1], live, fed, k + 1)
            assert _state(managers[0], ids) == _state(managers[1], ids)
        assert steps[0] == steps[1]
        assert steps[0], "the pool never ran dry: the failure path was not exercised"


def test_find_new_context_block_is_the_same_for_runs_and_lists() -> None:
    rng = random.Random(3)
    bm = BlockManager(400, 0, 4)
    kinds: set[str] = set()
    prompts = []
    for _ in range(60):
        runs = [(rng.choice([0, 1000, 2000]) + 8 * rng.randrange(4), rng.choice([2, 4, 8, 9]))
                for _ in range(rng.randrange(1, 6))]
        prompts.append(TokenRuns(runs))
    for i, p in enumerate(prompts):
        if i % 3 == 0:
            bm.add_sequence(i, p)
            bm.store_context_blocks(i)
            if i % 2:
                bm.remove_sequence(i)
        for q in prompts:
            found = bm.find_new_context_block(q)
            assert found == bm.find_new_context_block(list(q))
            kinds.add("every block" if found is None else "at the root" if found[0].id < 0 else "deeper")
    assert kinds == {"every block", "at the root", "deeper"}, kinds


def _blocks(bm: BlockManager) -> Any:
    """Every block as the timed replay leaves it (all but its hash, which only events make), and the counters."""
    return ([(b.id, b.primary, b.key, b.prev.id if b.prev is not None else None, b.refs, b.priority, b.duration_ms,
              b.qstamp, b.offload_seq) for b in bm._blocks],
            bm.kv_cache_stats(), bm.offloaded_blocks, bm.silent_offloads, bm.onboarded_blocks, bm.evicted_blocks,
            bm.num_free_blocks(0), bm.num_free_blocks(1), bm._policy.stamp, bm._policy.stale)


def test_plain_take_and_release_are_the_general_loops(monkeypatch: Any) -> None:
    """Events off and no duration given (every trace replay): ``_take_plain`` and ``remove_sequence``'s plain loop
    against the general ones (events on, which take the general loop and choose the same blocks), block by block
    after every call, through offloads, onboards, evictions of subtrees, stale entries, partial reuse, priorities
    below the offload floor and pools running dry."""
    import kvtop.engines.sim.block_manager as module

    plain_calls = [0]
    real = module.BlockManager._take_plain

    def counting(self: BlockManager, *args: Any) -> None:
        plain_calls[0] += 1
        real(self, *args)

    monkeypatch.setattr(module.BlockManager, "_take_plain", counting)
    # remove_sequence's plain loop with onboard_blocks on queues every released block at the GPU: it relies on this
    real_remove = module.BlockManager.remove_sequence
    held_tiers: set[bool] = set()

    def checked_remove(self: BlockManager, request_id: Any, final_tokens: Any = ()) -> None:
        if self.onboard_blocks:
            held_tiers.update(b.primary for b in self._seqs[request_id].blocks)
        real_remove(self, request_id, final_tokens)

    monkeypatch.setattr(module.BlockManager, "remove_sequence", checked_remove)
    kinds: set[str] = set()
    for seed in range(40):
        rng = random.Random(seed)
        tpb = rng.choice([1, 2, 4])
        sizes = (rng.randrange(6, 30), rng.choice([0, 1, 2, 3, 8, 20]))
        onboard = seed % 4 != 3  # off: nothing is offloaded (getFreeBlock), the other release loop
        plain = BlockManager(*sizes, tpb, onboard_blocks=onboard)
        general = BlockManager(*sizes, tpb, onboard_blocks=onboard, event_buffer_max_size=1 << 20)
        live: list[int] = []
        for step in range(120):
            op = rng.random()
            if op < 0.45 or not live:
                rid = step
                prompt = [rng.randrange(3) for _ in range(rng.randrange(1, 5 * tpb + 2))]
                retention = (KvCacheRetentionConfig(decode_retention_priority=rng.choice([10, 35, 80]))
                             if rng.random() < 0.2 else None)
                outcome = []
                for bm in (plain, general):
                    try:
                        bm.add_sequence(rid, prompt, retention)
                        outcome.append("added")
                    except NoFreeBlockError:
                        outcome.append("dry")
                        bm.remove_sequence(rid)
                assert outcome[0] == outcome[1]
                if outcome[0] == "added":
                    live.append(rid)
                    if rng.random() < 0.5:
                        for bm in (plain, general):
                            bm.store_context_blocks(rid)
                else:
                    kinds.add("dry")
            elif op < 0.75:
                rid = rng.choice(live)
                tokens = [rng.randrange(3) for _ in range(rng.randrange(1, 3 * tpb + 1))]
                outcome = []
                for bm in (plain, general):
                    try:
                        bm.add_tokens(rid, tokens)
                        outcome.append("added")
                    except NoFreeBlockError:
                        outcome.append("dry")
                        bm.remove_sequence(rid)
                assert outcome[0] == outcome[1]
                if outcome[0] == "dry":
                    live.remove(rid)
            else:
                rid = live.pop(rng.randrange(len(live)))
                final = [rng.randrange(3)] if rng.random() < 0.5 else []
                for bm in (plain, general):
                    bm.remove_sequence(rid, final)
            assert _blocks(plain) == _blocks(general), (seed, step)
            general.take_events()
        if plain.offloaded_blocks:
            kinds.add("offloads")
        if plain.onboarded_blocks:
            kinds.add("onboards")
        if plain.silent_offloads:
            kinds.add("silent offloads")
        if plain.evicted_blocks[1]:
            kinds.add("host evictions")
        if plain._policy.stale != [0, 0]:
            kinds.add("stale entries")
        assert not plain._policy.timed and not general._policy.timed
    assert plain_calls[0] > 1000
    assert held_tiers == {True}
    assert kinds == {"dry", "offloads", "onboards", "silent offloads", "host evictions", "stale entries"}, kinds
