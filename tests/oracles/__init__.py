"""Oracles: reference code that only the tests run, each named after what it checks (issue 25; docs/style: an
accelerator's reference that ships nowhere lives here).

- ``belady_tree``: Belady's MIN over the prefix tree, the oracle of kvtop.engines.sim.sweep.belady;
- ``block_manager_replay``: the block manager's trace replay noting each onboard, the oracle of
  kvtop.engines.sim.sweep.replay_accel;
- ``host_hits``: the host hits of each size counted on its own, the oracle of kvtop.stack_distance's one walk.
"""
