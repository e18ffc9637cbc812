"""Block manager behaviours fixed after the port: deep reuse chains (issue 11) and the order in which timed
priorities expire (issue 12.1). Each test fails on the code before its fix."""

from __future__ import annotations

import sys

from kvtop.engines.sim.block_manager import BlockManager
from kvtop.engines.sim.retention import KvCacheRetentionConfig

TR = KvCacheRetentionConfig.TokenRangeRetentionConfig


def test_evicting_the_root_of_a_chain_deeper_than_the_recursion_limit() -> None:
    """A chain of 3 x the recursion limit blocks whose root has priority 0 (evicted first): freeChildren detaches
    the whole chain, children first. The recursive form raised RecursionError at depth 1,000; a 60k-token prompt is
    a 2,000-block chain in the Mooncake trace."""
    depth = 3 * sys.getrecursionlimit()
    bm = BlockManager(depth + 2, 0, tokens_per_block=1, event_buffer_max_size=100)
    bm.take_events()
    prompt = list(range(depth + 1))  # depth + 1 blocks; the last token has no KV, so depth of them are stored
    bm.add_sequence(1, prompt, KvCacheRetentionConfig([TR(0, 1, 0)]))
    bm.remove_sequence(1)
    assert bm.num_cached_blocks() == depth
    # a prompt sharing nothing takes the free block first, then the priority-0 root: its chain goes with it
    bm.add_sequence(2, [10**6, 10**6 + 1, 10**6 + 2])
    assert bm.num_cached_blocks() == 0
    assert bm.evicted_blocks == [depth, 0]
    removed = [h for e in bm.take_events() if e["data"]["type"] == "removed" for h in e["data"]["block_hashes"]]
    assert len(removed) == len(set(removed)) == depth
