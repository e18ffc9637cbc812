"""Host memory source: the engine process's memory, the system's, and the engine's pinned host KV pool.

One ``host`` record per :meth:`HostSource.sample` (blocking: psutil reads /proc; run it in a thread worker).
Data keys (``None`` where unknown):

    pid, process_rss_bytes, process_uss_bytes, process_shared_bytes, system_total_bytes,
    system_available_bytes, pinned_pool_bytes, pinned_pool_origin ("engine" | "blocks" | None)

Why the pinned pool is not measured but reported: TensorRT-LLM's host KV pool is CUDA pinned memory
(``cudaHostAlloc``). The CUDA driver pins those pages itself and maps them as shared memory, so they show up in
the process's RSS as *shared* RSS (``RssShmem``, inside psutil's ``shared``), not as locked memory. Measured on
the H200 box (driver 580.159.04, torch 2.11): a 2 GiB ``pin_memory=True`` tensor raised RssShmem by exactly
2,097,152 kB while ``VmLck`` and ``VmPin`` stayed 0 kB; since no other process maps those pages, USS grew by the
same 2 GiB. Nothing in /proc tells the pool apart from other shared memory, so its size comes from the engine:
what it reports (``KvCacheConfig.host_cache_size``, or ``pinnedMemUsage`` of the TRT backend's stats; the
PyTorch backend reports 0 there even with a host pool), or secondary pool blocks x bytes per block.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

import psutil

from kvtop.records import Record, SourceId, make

HOST_FIELDS = (
    "pid", "process_rss_bytes", "process_uss_bytes", "process_shared_bytes", "system_total_bytes",
    "system_available_bytes", "pinned_pool_bytes", "pinned_pool_origin",
)


class HostSource:
    """Samples host memory for one engine process (``pid``; ``None`` means this process).

    ``pinned_pool_bytes``: the engine's pinned host KV pool in bytes, when the engine reports it (for
    TensorRT-LLM, ``KvCacheConfig.host_cache_size``). Set it later with :meth:`set_pinned_pool` or
    :meth:`set_pinned_pool_from_blocks` once a ``meta`` record or ``created`` event tells the pool size.

    ``uss``: read USS (``memory_full_info``). It makes the kernel walk the process's page tables
    (/proc/PID/smaps_rollup): 462 us for a 57 MB process on the H200 box, against 16 us for RSS alone, and it
    grows with resident memory, so an engine holding tens of GiB pays more. Turn off if a sample is too slow.
    """

    def __init__(
        self,
        pid: int | None = None,
        pinned_pool_bytes: int | None = None,
        source: SourceId | None = None,
        *,
        uss: bool = True,
        clock: Callable[[], float] = time.time,
    ):
        self.pid = os.getpid() if pid is None else pid
        self.source = source or SourceId()
        self.uss = uss
        self.clock = clock
        self.pinned_pool_bytes: int | None = None
        self.pinned_pool_origin: str | None = None
        if pinned_pool_bytes is not None:
            self.set_pinned_pool(pinned_pool_bytes)
        self._proc: psutil.Process | None = None

    def set_pinned_pool(self, nbytes: int | None, origin: str = "engine") -> None:
        """The pool size as the engine reports it (``None`` forgets it)."""
        if nbytes is not None and (isinstance(nbytes, bool) or not isinstance(nbytes, int) or nbytes < 0):
            raise ValueError(f"pinned pool size must be a non-negative integer of bytes, got {nbytes!r}")
        self.pinned_pool_bytes = nbytes
        self.pinned_pool_origin = None if nbytes is None else origin

    def set_pinned_pool_from_blocks(self, blocks: int, bytes_per_block: int) -> None:
        """The pool size computed from the secondary pool's blocks x bytes per block.

        For Qwen3-8B in bf16 a 32-token block is 32 x 147,456 B = 4.5 MiB, so 10,000 host blocks are 44 GiB.
        """
        if blocks < 0 or bytes_per_block < 0:
            raise ValueError(f"blocks and bytes_per_block must be >= 0, got {blocks}, {bytes_per_block}")
        self.set_pinned_pool(int(blocks) * int(bytes_per_block), origin="blocks")

    def _process(self) -> psutil.Process | None:
        if self._proc is None:
            try:
                self._proc = psutil.Process(self.pid)
            except psutil.Error:
                return None
        return self._proc

    def read(self) -> dict[str, Any]:
        """The record's data; never raises."""
        data: dict[str, Any] = dict.fromkeys(HOST_FIELDS)
        data["pid"] = self.pid
        proc = self._process()
        if proc is not None:
            try:
                # 13-16 us on the H200 box (anchor and bench/nvml_probe.py): cheap at any sample rate.
                mem = proc.memory_info()
                data["process_rss_bytes"] = mem.rss
                data["process_shared_bytes"] = getattr(mem, "shared", None)  # Linux only; holds pinned pages
            except psutil.Error:
                self._proc = None  # gone (or a reused pid next time): look it up again
            if self.uss and self._proc is not None:
                try:
                    data["process_uss_bytes"] = proc.memory_full_info().uss
                except (psutil.Error, AttributeError, OSError):
                    pass  # another user's process (AccessDenied) or a platform without USS
        try:
            vm = psutil.virtual_memory()
            data["system_total_bytes"] = vm.total
            data["system_available_bytes"] = vm.available
        except Exception:
            pass
        data["pinned_pool_bytes"] = self.pinned_pool_bytes
        data["pinned_pool_origin"] = self.pinned_pool_origin
        return data

    def sample(self) -> list[Record]:
        """One ``host`` record (a list, like the other sources). Never raises."""
        return [make("host", self.read(), self.source, self.clock())]
