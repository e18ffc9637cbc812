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


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_blocks_expiring_in_the_same_millisecond_keep_their_release_order() -> None:
    """Issue 12.1's minimal case. TensorRT-LLM stamps each release with steady_clock::now() in nanoseconds
    (evictionPolicy.cpp, LRUEvictionPolicy::releaseBlock), so two blocks released at the same simulated millisecond
    with the same duration expire in release order (ExpiringBlockComparator orders by that stamp), and refresh()
    appends each to the tail of the default queue in that order. Release goes last block first, so the chain's leaf
    [3] expires before its root [1, 2] and is evicted first: [1, 2] survives and is reused (2 tokens). Breaking the
    tie by block id put the root first: it was evicted and its leaf went with it (0 tokens)."""
    clock = Clock()
    bm = BlockManager(3, 0, tokens_per_block=2, clock_ms=clock)
    bm.add_sequence("a", [1, 2, 3, 4], KvCacheRetentionConfig([TR(0, None, 50, 10)]))
    bm.remove_sequence("a")  # t = 0: both blocks priority 50 until t = 10
    assert [bm.block_priority(i) for i in range(3)] == [50, 50, 35]
    clock.now = 11.0
    assert bm.refresh() == 2
    assert [bm.block_priority(i) for i in range(3)] == [35, 35, 35]
    bm.add_sequence("b", [7, 8, 9])  # two blocks: the never-used block 2, then the leaf (block 1)
    assert bm.block_ids("b") == [2, 1]
    bm.remove_sequence("b")
    assert bm.add_sequence("c", [1, 2, 5]) == 2
    assert bm.block_ids("c")[0] == 0 and bm.reused_blocks == 1


def test_expiry_order_follows_release_order_not_block_ids() -> None:
    """Two requests released in the same millisecond with the same 10 ms: the one released first expires first and
    is evicted first after the refresh, whichever has the lower block ids."""
    clock = Clock()
    bm = BlockManager(4, 0, tokens_per_block=2, clock_ms=clock)
    timed = KvCacheRetentionConfig([TR(0, None, 80, 10)])
    bm.add_sequence("low_ids", [1, 2, 3], timed)     # blocks 0, 1
    bm.add_sequence("high_ids", [5, 6, 7], timed)    # blocks 2, 3
    bm.remove_sequence("high_ids")                   # released first: blocks 3, 2
    bm.remove_sequence("low_ids")                    # then 1, 0
    clock.now = 10.0  # expiration <= now expires (TensorRT-LLM breaks only on expiration > now)
    assert bm.refresh() == 4
    bm.add_sequence("new", [9, 10, 11, 12, 13])  # three blocks, taken in expiry order: 3, 2, then 1
    assert bm.block_ids("new") == [3, 2, 1]
    assert bm.block_in_tree(0)  # the root of low_ids survives: it expired last
