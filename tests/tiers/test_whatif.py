"""Live what-if: ghost-list mechanics, and the estimate against real simulated runs with a larger host."""

from __future__ import annotations

import pytest
from sim_runs import chat_workload, simulate, zipf_prefix_workload

from kvtop.tiers.whatif import WhatIf, _RankedGhosts


def _stored(hashes: list[int], level: int = 0, prio: int = 35, tokens: int = 4, parent: int | None = None) -> dict:
    return {"event_id": 0, "data": {"type": "stored", "parent_hash": parent, "blocks": [
        {"type": "stored_block", "block_hash": h, "tokens": [{"type": "unique_token", "token_id": h * 10 + i,
                                                              "token_extra_id": 0} for i in range(tokens)],
         "cache_level": level, "priority": prio} for h in hashes]}}


def _removed(hashes: list[int]) -> dict:
    return {"event_id": 0, "data": {"type": "removed", "block_hashes": hashes}}


def _moved(h: int, old: int, new: int) -> dict:
    return {"event_id": 0, "data": {"type": "updated", "block_hash": h, "priority": None,
                                    "cache_level": {"type": "event_diff", "old_value": old, "new_value": new}}}


def _stats(reused: int, missed: int) -> dict:
    return {"kvCacheStats": {"reusedBlocks": reused, "missedBlocks": missed, "tokensPerBlock": 4}}


def test_ranked_ghosts_count_only_live_newer_entries() -> None:
    g = _RankedGhosts(capacity=5)
    for h in range(1, 6):
        g.push(h)
    assert g.discard(3) == 2           # 4 and 5 were dropped after it
    g.push(6)                          # 1, 2, 4, 5, 6
    assert g.discard(1) == 4
    g.push(7)
    g.push(8)                          # capacity 5: 2, 4, 5, 6, 7, 8 -> 2 forgotten
    assert 2 not in g and len(g) == 5
    assert g.discard(42) is None


def test_ranked_ghosts_survive_renumbering() -> None:
    g = _RankedGhosts(capacity=3)
    for h in range(5000):              # far past the tree's 1,024 slots: rebuilt along the way
        g.push(h)
    assert len(g) == 3
    assert g.discard(4997) == 2 and g.discard(4999) == 0


@pytest.mark.parametrize("capacity, hashes", [(50, 200), (700, 900), (3, 10), (2000, 2500)])
def test_ranked_ghosts_rank_as_a_plain_list_does(capacity: int, hashes: int) -> None:
    """The Fenwick ranks (rebuilt in one pass, the oldest forgotten without a tree update) against a plain
    list of the ghosts in drop order, over 30,000 random drops and hits (several rebuilds on the way)."""
    import random

    rng = random.Random(capacity)
    g, plain = _RankedGhosts(capacity=capacity), []
    for _ in range(30_000):
        h = rng.randrange(hashes)
        if rng.random() < 0.6:
            g.push(h)
            if h in plain:
                plain.remove(h)
            plain.append(h)
            del plain[:max(0, len(plain) - capacity)]
        else:
            want = len(plain) - 1 - plain.index(h) if h in plain else None
            if want is not None:
                plain.remove(h)
            assert g.discard(h) == want
        assert len(g) == len(plain)


def test_ghost_hit_counts_within_the_extra_capacity() -> None:
    wi = WhatIf(host_capacity_blocks=2)     # 2x: 2 extra blocks; 4x: 6
    wi.apply_kv_event({"event_id": 0, "data": {"type": "created", "num_blocks_per_cache_level": [4, 2]}})
    wi.apply_kv_event(_stored([1, 2, 3, 4]))
    wi.apply_stats(_stats(0, 4))
    for h in range(100, 200):              # 100 other offloads: the host's empty-slot share stays ~1%
        wi.apply_kv_event(_moved(h, 0, 1))
    for h in (1, 2, 3, 4):
        wi.apply_kv_event(_moved(h, 0, 1))
    wi.apply_kv_event(_removed([1, 2, 3, 4]))  # dropped from host, oldest first
    wi.apply_kv_event(_stored([4, 1]))         # 4: 0 newer ghosts; 1: 2 newer ghosts (2, 3)
    wi.apply_stats(_stats(0, 6))
    est = wi.estimate()
    assert est["ghost_hits"] == {"host_x2": 1, "host_x4": 2}
    assert est["host_x2_hit_rate"] == pytest.approx(1 / 6)
    assert est["host_x4_hit_rate"] == pytest.approx(2 / 6)
    assert est["hit_rate"] == 0


def test_onboards_shrink_the_larger_hosts_usable_capacity() -> None:
    # Each onboard leaves an empty slot riding the host FIFO: with onboards / offloads = 1/2, a 2x host of
    # 2 x 8 blocks holds 16 x (1 - w2) reusable blocks, and the real one 8 x (1 - 1/2) = 4.
    wi = WhatIf(host_capacity_blocks=8)
    wi.apply_kv_event({"event_id": 0, "data": {"type": "created", "num_blocks_per_cache_level": [4, 8]}})
    wi.apply_kv_event(_stored(list(range(1, 21))))
    for h in range(1, 21):
        wi.apply_kv_event(_moved(h, 0, 1))
    for h in range(1, 11):
        wi.apply_kv_event(_moved(h, 1, 0))     # 10 onboards for 20 offloads
    wi.apply_kv_event(_removed(list(range(1, 21))))
    wi.apply_kv_event(_stored([20, 18, 16, 14]))  # ranks 0, 1, 2, 3
    wi.apply_stats(_stats(0, 24))
    # x hits need rank < 16 (1 - (10 + x) / 20) - 4: x = 2 gives 2.4 (ranks 0, 1 fit), x = 3 gives 1.6
    assert wi.estimate()["ghost_hits"]["host_x2"] == 2


def test_low_priority_drops_and_release_stores_are_not_hits() -> None:
    wi = WhatIf(host_capacity_blocks=10, tokens_per_block=4)
    wi.apply_kv_event({"event_id": 0, "data": {"type": "created", "num_blocks_per_cache_level": [4, 10]}})
    wi.apply_kv_event(_stored([1, 2], prio=10))     # below secondary_offload_min_priority 30: never offloaded
    wi.apply_kv_event(_removed([1, 2]))
    wi.apply_kv_event(_stored([5, 6]))
    wi.apply_kv_event(_removed([5, 6]))
    wi.apply_kv_event(_stored([1]))                  # a GPU drop: a larger host would not have had it
    wi.apply_kv_event(_stored([5]) | {})             # a prefill store of a ghost: a hit
    release = _stored([6])
    release["data"]["blocks"].append(_stored([7], tokens=2)["data"]["blocks"][0])  # partly filled last block
    wi.apply_kv_event(release)                       # the store at release: generated blocks, never looked up
    wi.apply_stats(_stats(3, 7))
    est = wi.estimate()
    assert wi.dropped_low_priority == 2 and wi.release_store_ghosts == 1
    assert est["ghost_hits"]["host_x2"] == 1
    assert est["host_x2_hit_rate"] == pytest.approx(4 / 10)


def test_attach_midway_counts_from_the_first_stats() -> None:
    wi = WhatIf(host_capacity_blocks=4)
    wi.apply_stats(_stats(100, 300))                 # no `created` seen: the engine ran before we attached
    wi.apply_stats(_stats(110, 330))
    est = wi.estimate()
    assert est["reused_blocks"] == 10 and est["missed_blocks"] == 30
    wi.apply_stats(_stats(5, 5))                     # counters went back: a restarted engine
    assert wi.estimate()["reused_blocks"] == 15


def test_capacity_learned_from_created_event() -> None:
    wi = WhatIf(None)
    wi.apply_kv_event({"event_id": 0, "data": {"type": "created", "num_blocks_per_cache_level": [64, 100]}})
    assert wi.host_capacity_blocks == 100
    assert wi.estimate()["host_x2_hit_rate"] is None   # nothing looked up yet


def _validate(items: list, G: int, H: int) -> tuple[dict, dict, dict]:
    wi = WhatIf(H)
    base = simulate(items, primary_blocks=G, secondary_blocks=H, events=True,
                    on_events=lambda evs: [wi.apply_kv_event(e) for e in evs],
                    on_stats=lambda ss: [wi.apply_stats(s) for s in ss])
    x2 = simulate(items, primary_blocks=G, secondary_blocks=2 * H)
    x4 = simulate(items, primary_blocks=G, secondary_blocks=4 * H)
    return base, wi.estimate(), {"x2": x2["hit_rate"], "x4": x4["hit_rate"]}


def test_estimate_matches_a_real_2x_run_zipf_prefixes() -> None:
    items = zipf_prefix_workload(600, 200, 256, 32, zipf_s=0.8, max_tokens=4, seed=1)
    base, est, actual = _validate(items, G=64, H=100)
    assert est["hit_rate"] == pytest.approx(base["hit_rate"])  # the stats diffs add up to the engine's own
    assert actual["x2"] - base["hit_rate"] > 0.05                # the larger host matters here (21% -> 28%)
    assert est["host_x2_hit_rate"] == pytest.approx(actual["x2"], abs=0.03)
    assert est["host_x4_hit_rate"] == pytest.approx(actual["x4"], abs=0.03)


@pytest.mark.slow
def test_estimate_matches_a_real_2x_run_chat() -> None:
    items = chat_workload(100, 5, output_tokens=32, seed=2)
    base, est, actual = _validate(items, G=128, H=150)
    assert actual["x2"] > base["hit_rate"]
    assert est["host_x2_hit_rate"] == pytest.approx(actual["x2"], abs=0.03)


def test_a_created_event_with_a_negative_host_pool_sets_no_capacity_and_ends_nothing() -> None:
    # hypothesis found it (tests/test_trust.py's mutated records): [256, -1] raised ValueError out of the fold and
    # ended `kvtop report`; a negative count is no pool: ignored, and a later real one still counts
    wi = WhatIf()
    wi.apply_kv_event({"event_id": 0, "data": {"type": "created", "num_blocks_per_cache_level": [256, -1]}})
    assert wi.host_capacity_blocks is None
    wi.apply_kv_event({"event_id": 1, "data": {"type": "created", "num_blocks_per_cache_level": [256, 8]}})
    assert wi.host_capacity_blocks == 8
