"""All-reduce time between the GPUs of one host, as tensor parallelism spends it (issue 12 part 2).

    python bench/allreduce_probe.py --out allreduce.json          # needs 2+ GPUs, PyTorch with NCCL
    python bench/allreduce_probe.py --device cpu --out smoke.json  # gloo on the CPU: a smoke test of the script

A tensor-parallel transformer reduces one activation of `hidden` values per token twice a layer (after the
attention's output projection and after the MLP), so what the cost model needs is the time of one all-reduce of
`tokens x hidden` bf16 values, from one token (a decode step of one request) to a long prefill chunk. For each
size this times, one process a GPU:

- `eager_us`: back-to-back `dist.all_reduce` calls on one stream (NCCL launches each from the host);
- `graph_us`: 2 x `layers` all-reduces captured in one CUDA graph and replayed, per all-reduce (how TensorRT-LLM's
  PyTorch backend runs decode steps: in CUDA graphs);
- `symm_one_shot_us` / `symm_two_shot_us`: PyTorch's symmetric-memory all-reduces (peer-to-peer loads over
  NVLink, no NCCL), where this torch has them: the kind of kernel TensorRT-LLM's own ONESHOT / TWOSHOT
  all-reduce is. NVLink multicast is never used (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1 are
  set here before anything starts, as the lent machines require).

What differs from TensorRT-LLM: its AllReduceStrategy AUTO picks its own kernels (and fuses the residual add and
RMSNorm into the all-reduce), so these are upper bounds for its small messages and a like-for-like figure for
NCCL's large ones. Median of the timed repetitions after warm-ups. Writes one JSON object (rank 0).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

# Multicast off before torch or NCCL read the environment (the lent multi-GPU machines' rule).
os.environ.setdefault("NCCL_NVLS_ENABLE", "0")
os.environ.setdefault("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1")
os.environ.setdefault("NVSHMEM_DISABLE_NVLS", "1")

BURST = 20  # all-reduces per timed call outside a graph: one call's host overhead is not the figure
DEFAULT_TOKENS = "1,2,4,8,16,32,64,128,256,512,1024,2048,4096,8192,16384"


def _worker(rank: int, world: int, args: argparse.Namespace, port: int) -> None:
    import torch
    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "127.0.0.1"  # the ranks of one host only
    os.environ["MASTER_PORT"] = str(port)
    cuda = args.device == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank) if cuda else torch.device("cpu")
    dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world,
                            device_id=dev if cuda else None)
    group = dist.group.WORLD
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    hidden, layers = args.hidden, args.layers
    per_graph = 2 * layers

    def timed(fn: Any, reps: int) -> float:
        for _ in range(3):
            fn()
        sync()
        dist.barrier()
        times = []
        for _ in range(reps):
            sync()
            t0 = time.perf_counter()
            fn()
            sync()
            times.append(time.perf_counter() - t0)
        return statistics.median(times)

    symm: Any = None
    if cuda:
        try:
            import torch.distributed._symmetric_memory as symm_mem
            symm = symm_mem
        except ImportError:
            symm = None

    rows = []
    for tokens in [int(t) for t in args.tokens.split(",")]:
        n = tokens * hidden
        x = torch.ones(n, device=dev, dtype=torch.bfloat16 if cuda else torch.float32)
        row: dict[str, Any] = {"tokens": tokens, "bytes": n * x.element_size()}

        def eager(x: Any = x) -> None:
            for _ in range(BURST):
                dist.all_reduce(x, group=group)

        row["eager_us"] = timed(eager, args.reps) / BURST * 1e6
        if cuda:
            try:
                s = torch.cuda.Stream(dev)
                s.wait_stream(torch.cuda.current_stream(dev))
                with torch.cuda.stream(s):
                    for _ in range(3):
                        dist.all_reduce(x, group=group)
                torch.cuda.current_stream(dev).wait_stream(s)
                sync()
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph):
                    for _ in range(per_graph):
                        dist.all_reduce(x, group=group)
                row["graph_us"] = timed(graph.replay, args.reps) / per_graph * 1e6
                del graph
            except Exception as exc:  # a capture this NCCL refuses leaves the eager figure standing
                row["graph_error"] = f"{type(exc).__name__}: {exc}"
            if symm is not None:
                for op in ("one_shot_all_reduce", "two_shot_all_reduce_"):
                    key = "symm_one_shot_us" if op.startswith("one") else "symm_two_shot_us"
                    try:
                        buf = symm.empty(n, dtype=torch.bfloat16, device=dev)
                        symm.rendezvous(buf, group.group_name)
                        buf.fill_(1)
                        fn = getattr(torch.ops.symm_mem, op)

                        def call(buf: Any = buf, fn: Any = fn) -> None:
                            for _ in range(BURST):
                                fn(buf, "sum", group.group_name)

                        row[key] = timed(call, args.reps) / BURST * 1e6
                        del buf
                    except Exception as exc:
                        row[key.replace("_us", "_error")] = f"{type(exc).__name__}: {str(exc)[:200]}"
        if rank == 0:
            print(json.dumps(row), flush=True)
        rows.append(row)
        del x
        if cuda:
            torch.cuda.empty_cache()
    if rank == 0:
        out = {"world_size": world, "hidden": hidden, "layers": layers, "device": args.device,
               "torch": torch.__version__, "reps": args.reps, "rows": rows,
               "env": {k: os.environ.get(k) for k in ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST",
                                                      "NVSHMEM_DISABLE_NVLS")}}
        if cuda:
            out["gpu_name"] = torch.cuda.get_device_name(dev)
            out["nccl"] = ".".join(str(v) for v in torch.cuda.nccl.version())
        Path(args.out).write_text(json.dumps(out, indent=1) + "\n", encoding="utf-8")
    dist.barrier()
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="allreduce.json")
    ap.add_argument("--world-size", type=int, default=0, help="ranks (default: every GPU, or 2 on the CPU)")
    ap.add_argument("--hidden", type=int, default=8192, help="values per token (Llama-3.3-70B: 8,192)")
    ap.add_argument("--layers", type=int, default=80, help="layers in the graphed replay (two all-reduces each)")
    ap.add_argument("--tokens", default=DEFAULT_TOKENS)
    ap.add_argument("--reps", type=int, default=7)
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    args = ap.parse_args(argv)
    import socket

    import torch
    import torch.multiprocessing as mp

    world = args.world_size or (torch.cuda.device_count() if args.device == "cuda" else 2)
    if world < 2:
        print(f"allreduce_probe: needs 2 or more GPUs (found {world})", file=sys.stderr)
        return 2
    with socket.socket() as s:  # a free port on the loopback for the rendezvous
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.spawn(_worker, args=(world, args, port), nprocs=world, join=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
