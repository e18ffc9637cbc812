"""``kvtop estimate --model M --gpu G ...``: reload cached KV from host against recomputing it, the arithmetic
(kvtop/estimate.py) for one model on one GPU."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from kvtop import options
from kvtop.estimate import ESTIMATE_DEFAULTS, run_estimate


def parser() -> argparse.ArgumentParser:
    ap = options.OptionParser(prog="kvtop estimate",
                              description="reload cached KV from host vs recompute it: the arithmetic")
    # The settings it shares with kvtop and kvtop sim, declared from Settings (kvtop.options): same spelling, doc and
    # validation as there.
    options.add_settings(ap, options.ESTIMATE_SETTINGS, defaults=ESTIMATE_DEFAULTS, help={
        "json": "print the figures as JSON", "gpu_cache_fraction": "free_gpu_memory_fraction for the KV pool"})
    ap.add_argument("--link", default=None, help="host link: pcie5, pcie4, c2c, or GB/s (default: the GPU's)")
    ap.add_argument("--prompt-tokens", type=int, default=8192)
    ap.add_argument("--cached-tokens", type=int, default=None, help="cached prefix (default: the whole prompt)")
    ap.add_argument("--batch", type=int, default=1, help="requests of this shape arriving together")
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    """`kvtop estimate --model M --gpu G [--link pcie5|c2c|<GB/s>] [--prompt-tokens N] [--cached-tokens N]
    [--batch N] [--tokens-per-block N] [--kv-cache-dtype D] [--tensor-parallel-size N] [--gpu-cache-fraction F]
    [--json]`. `--gpu` also takes a profile JSON from `kvtop calibrate`. A bad setting raises SettingsError
    (kvtop.cli prints it as one line, exit 2), as in every subcommand."""
    a = parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    vars(a).update(options.converted(a, options.ESTIMATE_SETTINGS, ESTIMATE_DEFAULTS))
    return run_estimate(a.model, a.gpu, a.link, a.prompt_tokens, a.cached_tokens, a.batch, a.json,
                        a.tokens_per_block, a.kv_cache_dtype, a.tensor_parallel_size, a.gpu_cache_fraction)


__all__ = ["main", "parser"]
