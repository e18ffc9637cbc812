"""The oracle of kvtop/engines/sim/sweep/replay_accel.py: the block manager's own replay, noting each onboard.

``replay_accel.replay`` is the block manager's trace replay (``sweep.replay_trace`` over a ``BlockManager``)
specialised to a hit-rate sweep; tests/engines/sim/test_sim_sweep_fast.py holds it to ``replay_trace`` over this
recorder exactly: the counters, each onboard's (distance in the host tier's queue, offload count at its offload, at the
onboard) and where each request's onboards start. It shipped in kvtop/engines/sim/sweep.py as
``_DistanceRecorder`` until issue 25 and ran only in the tests, so it lives here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from kvtop.engines.sim.block_manager import BlockManager


class DistanceRecorder(BlockManager):
    """A block manager that notes, at each onboard, where the onboarded block stood in the host tier's queue."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        # per onboard, in order: (offloads since the block's own, the offload count at its offload, at the onboard)
        self.onboards: list[tuple[int, int, int]] = []
        self.request_starts: list[int] = []  # index into onboards where each request's onboards start

    def add_sequence(self, request_id: Any, token_ids: Sequence[int], retention: Any = None) -> int:
        self.request_starts.append(len(self.onboards))  # the onboards happen inside add_sequence
        return super().add_sequence(request_id, token_ids, retention)

    def _onboard(self, block: Any) -> None:  # (a block_manager._Block: a subclass overrides its own step)
        if self.onboard_blocks and not block.primary:
            now = self.offloaded_blocks
            self.onboards.append((now - block.offload_seq, block.offload_seq, now))
        super()._onboard(block)
