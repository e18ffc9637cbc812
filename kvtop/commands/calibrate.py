"""``kvtop calibrate [--model M] [--out FILE] [--quick]``: measure this machine's GPU into a profile, or add a
probe's curves to one (``--merge``); the measuring is kvtop/calibrate.py's (PyTorch, imported only there)."""

from __future__ import annotations

import sys
from collections.abc import Sequence

from kvtop import calibrate, options


def main(argv: Sequence[str] | None = None) -> int:
    """`kvtop calibrate [--model M] [--out FILE] [--quick] [--device N] [--tokens-per-block N]`."""
    ap = options.OptionParser(prog="kvtop calibrate", description=(calibrate.__doc__ or "").split("\n\n")[0])
    ap.add_argument("--model", default="Qwen/Qwen3-8B", help="model shape for the block size and prefill proxy")
    ap.add_argument("--out", default="gpu-profile.json", help="profile JSON to write (default: gpu-profile.json)")
    ap.add_argument("--quick", action="store_true", help="smaller sizes, one prompt length: under a minute")
    ap.add_argument("--device", type=int, default=0, help="CUDA device index")
    ap.add_argument("--tokens-per-block", type=int, default=32)
    ap.add_argument("--merge", action="append", metavar="FILE",
                    help="measure nothing: add a probe's JSON (bench/allreduce_probe.py, bench/gemm_shapes_probe.py) "
                         "to the --profile and write it to --out (repeatable)")
    ap.add_argument("--profile", default=None, help="with --merge: the profile to add to, a JSON file or a built-in "
                                                     "GPU name (default: --out)")
    a = ap.parse_args(list(sys.argv[1:] if argv is None else argv))
    if a.merge:
        return calibrate.merge_probes(a.merge, a.profile or a.out, a.out)
    return calibrate.run_calibrate(a.model, a.out, a.quick, a.device, a.tokens_per_block)


__all__ = ["main"]
