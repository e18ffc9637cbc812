"""kvtop: `top` for the KV cache tiers of LLM inference engines (TensorRT-LLM first).

The package root stays import-light: no Textual, no NVML, no TensorRT-LLM here, so that headless modes, the
simulator and `kvtop.watch(llm)` start fast and work on machines without a GPU.
"""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
