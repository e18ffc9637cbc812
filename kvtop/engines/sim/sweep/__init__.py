"""Hit-rate sweeps over host cache sizes without engine timing (``kvtop sim --trace ... --hit-rate-only``).

Three answers to "what hit rate would a host tier of size H give on this trace?", from slowest and most exact to
fastest, one module each:

- ``replay_hit_rates`` (replay.py): TensorRT-LLM's block manager (``BlockManager``, the project's ground truth)
  replays the trace with no engine in between: one request at a time, in trace order (prefill: ``add_sequence`` +
  ``store_context_blocks``; decode: ``add_token`` per generated token but the last; ``remove_sequence``). No
  batching, so no timing and no requests running side by side. Its hit rates are not the timed replay's
  (``offline.run_trace``: up to 256 requests at once, whose blocks crowd the GPU tier, and requests sharing a prefix
  that prefill side by side before either stores it): on the Mooncake trace 12.5% against 4.2% with no host tier,
  16.8% against 10.9% with 64 GB (bench/JOURNAL.md, "Host-cache sweeps"). What it answers fast is how the block
  manager's policy uses a host tier of each size, and how far that is from the optimum. One replay per host size.
- ``host_curve`` (one_pass.py, ``--one-pass``): every host size from one replay, at the largest size. The host tier
  is a FIFO of its H slots: each offload pushes a block at the back and takes the front slot; an onboard takes a
  block out of the middle. So a block offloaded when the manager's offload count was s is still on the host at an
  onboard when the count is S iff fewer than H slots were taken from the front in between: the ``S - s`` offloads
  since (stack distance over the host tier's queue), plus the onboards of blocks older than it that a tier of size
  H still held. The curve counts a host hit at size H iff the block's distance, and that of every host block before
  it in the same prompt (reuse stops at the first miss), is below H, the older onboards counted for that H. What it
  assumes: the GPU tier evolves as in the largest size's replay whatever H is (an onboarded block and a recomputed
  one both end up on the GPU; their eviction order can differ). The largest size is exact (it is the replay);
  tests/engines/sim/test_sim_sweep.py holds the others within 1 point of full replays. The replay is
  ``replay_accel.replay``, the accelerator of the block manager's replay for this use (the same counters and onboards,
  exactly; its docstring names its reference, its test and its measurement).
- ``belady_curve`` (belady.py, ``--belady``): the offline optimum for a cache of GPU + host blocks (Belady's MIN
  over the trace's prefix tree: on a miss with the cache full, evict the cached leaf whose next use is farthest,
  and do not insert a block used later than every candidate), the bound that says how far TensorRT-LLM's
  LRU-by-priority policy is from what any policy could reuse on this trace. Counted over 512-token trace blocks
  weighted by their KV blocks, prompts only. Where every trace block takes one unit of room (512 tokens a block or
  more, and the peer's units), every size comes from one pass (``min_levels``, in kvtop/stack_distance.py; the
  argument in belady.py): Belady's MIN is a stack algorithm there. With smaller blocks, one pass per size over the
  same flat references (``_min_hits``). MIN over the tree itself, the reference both are held to, runs only in the
  tests: tests/oracles/belady_tree.py.
"""

from __future__ import annotations

from kvtop.engines.sim.sweep.belady import belady_curve
from kvtop.engines.sim.sweep.one_pass import host_curve
from kvtop.engines.sim.sweep.replay import replay_hit_rates, replay_trace

__all__ = ["belady_curve", "host_curve", "replay_hit_rates", "replay_trace"]
