"""The simulator's batched fast paths against the one-at-a-time calls they stand for.

``kvtop.engines.sim.accel.add_token_each`` (an engine step's decode tokens in one call) against ``add_token`` per
request, and ``find_new_context_block`` on a trace prompt (``TokenRuns``, its keys made once) against the same
prompt as a list (keys cut a few blocks at a time): same results, same block ids, counters and events.
"""

from __future__ import annotations

import random
from typing import Any

from kvtop.engines.sim.accel import add_token_each
from kvtop.engines.sim.block_manager import BlockManager, NoFreeBlockError, TokenRuns


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
