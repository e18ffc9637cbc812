"""kvtop: `top` for the KV cache tiers of LLM inference engines (TensorRT-LLM first).

The package root stays import-light: no Textual, no NVML, no TensorRT-LLM here, so that headless modes, the
simulator and `kvtop.watch(llm)` start fast and work on machines without a GPU.
"""

from __future__ import annotations

from typing import Any

__version__ = "0.1.0"
# The distribution's name on the package registry (pyproject.toml's [project] name): "kvtop" there is another
# project (a Rust CLI), so this one installs as kvtop-monitor and keeps the command `kvtop` and the import `kvtop`.
# Every install hint names it (`pip install 'kvtop-monitor[report]'`); tests/test_distribution.py holds the two equal.
DISTRIBUTION = "kvtop-monitor"

__all__ = ["DISTRIBUTION", "__version__", "watch", "WatchHandle"]


def __getattr__(name: str) -> Any:
    # ``kvtop.watch`` (a plain function, kvtop/watcher.py) on first use only: ``import kvtop`` must not pull in
    # asyncio, the sinks, prometheus_client or the TierModel (PEP 562 module __getattr__). No submodule is named
    # ``watch``, so nothing can rebind the name to a module.
    if name in ("watch", "WatchHandle"):
        from kvtop import watcher

        value = getattr(watcher, name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'kvtop' has no attribute {name!r}")
