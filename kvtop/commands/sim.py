"""``kvtop sim --trace FILE ...``: replay a Mooncake trace on the simulator as fast as possible, one replay per host
cache size (a sweep), with the block manager alone (``--hit-rate-only``, ``--one-pass``) or the engine's timing,
and the offline optimum beside it (``--belady``)."""

from __future__ import annotations

import argparse
import json
import math
import sys
from collections.abc import Sequence
from typing import Any

from kvtop import DISTRIBUTION, options
from kvtop.settings import SettingsError

SIM_DEFAULTS = {"max_batch_size": 256}


# --jobs by default: the CPUs kvtop may run on, at most this many forked replays at once. Memory is not the limit (a
# timed replay of the Mooncake trace peaks at ~36 MB resident): a shared login node's 64 cores are not all taken by
# one sweep unless asked
SIM_DEFAULT_MAX_JOBS = 8


def parser() -> argparse.ArgumentParser:
    p = options.UsageParser(prog="kvtop sim",
                            description="replay a Mooncake trace on the simulator, as fast as possible")
    # The settings it shares with a driven run, declared from Settings; a trace replay batches up to 256 requests.
    options.add_settings(p, options.SIM_SETTINGS, defaults=SIM_DEFAULTS, required=("trace",), help={
        "trace": "Mooncake-format JSONL trace (512-token hash blocks)", "json": "print {\"runs\": [...]} as JSON",
        "gpu_cache_fraction": "free_gpu_memory_fraction when --gpu-blocks is not given",
        "capacity_scheduler_policy": "TensorRT-LLM's capacity scheduler for the timed replay"})
    p.add_argument("--gpu-blocks", type=int, default=None, help="GPU pool in blocks (default: sized from the GPU)")
    # not the host_cache setting (one size): a sweep of sizes
    p.add_argument("--host-cache", dest="host_cache_sweep", default="0", metavar="SIZES",
                   help="host cache size, or a comma list for a sweep: 0,2GB,8GB, or "
                        "START:STOP:N for N sizes evenly spaced (0:64GB:16)")
    p.add_argument("--host-blocks", default=None, help="host pool in blocks (or a comma list)")
    p.add_argument("--time-scale", type=float, default=1.0, help="divide trace timestamps by this")
    p.add_argument("--limit", type=int, default=None, help="only the first N requests")
    p.add_argument("--plot", default=None, help="draw hit rate against host cache size into this PNG "
                   f"(matplotlib: pip install '{DISTRIBUTION}[report]')")
    p.add_argument("--hit-rate-only", action="store_true",
                   help="replay the block manager alone, one request at a time, without engine timing")
    p.add_argument("--one-pass", action="store_true",
                   help="every host size from one replay at the largest (stack distances; implies --hit-rate-only)")
    p.add_argument("--belady", action="store_true",
                   help="add the offline optimum per size (Belady's MIN over GPU + host blocks) to the output")
    p.add_argument("--jobs", type=int, default=None,
                   help="processes (forked, on Linux): a sweep replays up to N host sizes at once, and --belady "
                        f"computes the optimum beside the replay; 1: all in this process, one after another "
                        f"(default: the CPUs this process may run on, at most {SIM_DEFAULT_MAX_JOBS})")
    return p


def _host_cache_list(text: str) -> list[int]:
    """``0,8GB,32GB`` or ``START:STOP:N`` (N sizes from START to STOP, evenly spaced) in bytes."""
    from kvtop.engines.sizing import parse_size

    text = text.strip()
    if text.count(":") == 2:
        start_text, stop_text, count_text = text.split(":")
        try:
            count = int(count_text)
        except ValueError:
            raise SettingsError("--host-cache", f"START:STOP:N needs a whole N, got {count_text!r}") from None
        if count < 2:
            raise SettingsError("--host-cache", f"START:STOP:N needs N >= 2, got {count}")
        try:
            start, stop = parse_size(start_text.strip()), parse_size(stop_text.strip())
        except ValueError as exc:
            raise SettingsError("--host-cache", str(exc)) from None
        if stop < start:
            raise SettingsError("--host-cache", f"START:STOP:N needs STOP >= START, got {text!r}")
        if count > MAX_SWEEP_POINTS:
            raise SettingsError("--host-cache", f"START:STOP:N: at most {MAX_SWEEP_POINTS:,} sizes, got {count:,}")
        _check_machine_size(stop, stop_text)
        return [start + (stop - start) * i // (count - 1) for i in range(count)]
    sizes = []
    for part in text.split(","):
        try:
            sizes.append(parse_size(part.strip()))
        except ValueError as exc:
            raise SettingsError("--host-cache", str(exc)) from None
        _check_machine_size(sizes[-1], part)
    return sizes


MAX_SWEEP_POINTS = 10_000  # a sweep of more host sizes is a typo (each is a whole trace replay)


def _check_machine_size(size: int, text: str) -> None:
    from kvtop.settings import MAX_SIZE_BYTES

    if size > MAX_SIZE_BYTES:
        raise SettingsError("--host-cache", f"{text.strip()[:40]} is more than 64 TiB, which no machine holds")


def main(argv: Sequence[str]) -> int:
    """``kvtop sim --trace FILE ...``: a Mooncake trace on the simulator, one replay per host cache size."""
    from kvtop.engines.gpus import resolve_gpu
    from kvtop.engines.models import resolve_model
    from kvtop.engines.sizing import format_bytes, primary_blocks, secondary_blocks
    from kvtop.workload.trace import TraceError, read_trace

    a = parser().parse_args(list(argv))
    vars(a).update(options.converted(a, options.SIM_SETTINGS, SIM_DEFAULTS))  # validated as Settings validates
    if a.plot:
        from kvtop.report.charts import matplotlib_missing

        no_plt = matplotlib_missing("kvtop sim --plot")
        if no_plt:
            raise SettingsError("--plot", no_plt)
    try:
        model = resolve_model(a.model).with_kv_cache_dtype(a.kv_cache_dtype)
    except ValueError as exc:
        raise SettingsError("--model", str(exc)) from None
    try:
        gpu = resolve_gpu(a.gpu)
    except (ValueError, OSError) as exc:
        raise SettingsError("--gpu", str(exc)) from None
    tpb = a.tokens_per_block
    if tpb <= 0 or 512 % tpb:
        raise SettingsError("--tokens-per-block", f"must divide 512 (the trace's block), got {tpb}")
    if a.gpu_blocks is not None and a.gpu_blocks <= 0:
        raise SettingsError("--gpu-blocks", f"must be > 0, got {a.gpu_blocks}")
    if a.jobs is not None and not 1 <= a.jobs <= 1024:
        raise SettingsError("--jobs", f"must be a process count from 1 to 1024, got {a.jobs}")
    if a.limit is not None and a.limit < 1:  # read_trace stops after its first request at a count <= 0
        raise SettingsError("--limit", f"must be a request count >= 1, got {a.limit}")
    if not (math.isfinite(a.time_scale) and a.time_scale > 0):  # 0 divided, nan never arrived, -1 ran backwards
        raise SettingsError("--time-scale", f"must be a finite number > 0, got {a.time_scale}")
    try:
        primary = a.gpu_blocks or primary_blocks(model, gpu, tpb, free_gpu_memory_fraction=a.gpu_cache_fraction,
                                                 tensor_parallel_size=a.tensor_parallel_size)
    except ValueError as exc:  # the model does not fit
        raise SettingsError("--gpu", str(exc)) from None
    sweep: list[tuple[int, int]] = []
    if a.host_blocks is not None:
        for part in str(a.host_blocks).split(","):
            try:
                n = int(part)
            except ValueError:
                raise SettingsError("--host-blocks", f"expected block counts, got {part!r}") from None
            if not 0 <= n <= 1 << 40:
                raise SettingsError("--host-blocks", f"must be a block count from 0 to 2^40, got {part[:40]!r}")
            sweep.append((n * model.kv_bytes_per_block(tpb), n))
    else:
        for size in _host_cache_list(str(a.host_cache_sweep)):
            sweep.append((size, secondary_blocks(model, tpb, size)))
    try:
        requests = list(read_trace(a.trace, limit=a.limit))
    except TraceError as exc:
        raise SettingsError("--trace", f"line {exc.line}: {exc.problem}") from None
    except OSError as exc:
        raise SettingsError("--trace", f"cannot read {a.trace}: {exc.strerror or exc}") from None
    if not requests:  # a table of 0% hit rates over nothing would read as a result
        raise SettingsError("--trace", f"{a.trace} holds no requests (empty, or only blank lines)")
    if a.hit_rate_only or a.one_pass:
        return _sim_hit_rates(a, requests, model, gpu, tpb, primary, sweep)
    from kvtop.engines.sim.offline import TraceRunConfig, run_trace

    # The verdict of each size needs the same trace without the tier: the 0 point, replayed first, so that every
    # row after it can say whether its tier paid. Where the sweep has none it is added, printed as the baseline and
    # kept out of "runs" (the JSON's "baseline"): the runs stay the sizes asked for.
    added_baseline = False
    if any(blocks for _, blocks in sweep) and not any(blocks == 0 for _, blocks in sweep):
        added_baseline = True
        sweep = [(0, 0), *sweep]
    with _optimum_beside(a, requests, [primary + blocks for _, blocks in sweep], tpb) as optimum_job:
        configs = [TraceRunConfig(model, gpu, tpb, primary, host_blocks, host_bytes, max_batch_size=a.max_batch_size,
                                  max_num_tokens=a.max_num_tokens, time_scale=a.time_scale,
                                  capacity_scheduler_policy=a.capacity_scheduler_policy,
                                  tensor_parallel_size=a.tensor_parallel_size) for host_bytes, host_blocks in sweep]
        # replayed with the 0 point first (each verdict needs it), printed and listed in the sweep's order
        first = next((k for k, cfg in enumerate(configs) if cfg.secondary_blocks == 0), 0)
        replay_order = [first, *[k for k in range(len(configs)) if k != first]]
        with _sizes_in_order(a, run_trace, [(requests, configs[k]) for k in replay_order]) as results:
            runs = _timed_runs(a, configs, results, replay_order)
        optimum = optimum_job.result() if a.belady else None
    if optimum is not None:
        for r, best in zip(runs, optimum):
            r["belady_hit_rate"] = best
            if not a.json:
                print(f"host {format_bytes(r['host_cache_bytes']):>10}: optimal (Belady's MIN over GPU + host blocks, "
                      f"prompts only) {100 * best:5.1f}%")
    baseline = runs.pop(0) if added_baseline else None
    if a.plot:
        from kvtop.report.charts import plot_sweep

        plot_sweep(runs, a.plot)
    if a.json:
        out: dict[str, Any] = {"model": model.name, "gpu": gpu.name, "tokens_per_block": tpb, "runs": runs}
        if baseline is not None:
            out["baseline"] = baseline
        print(json.dumps(out))
    return 0


def _sim_jobs(a: argparse.Namespace) -> int:
    """``--jobs``, or the CPUs this process may run on (its affinity: a container's or taskset's limit), capped."""
    from kvtop.engines.sim.forked import usable_cpus

    return a.jobs if a.jobs is not None else min(usable_cpus(), SIM_DEFAULT_MAX_JOBS)


def _lost(part: str) -> Any:
    def tell(why: str) -> None:
        print(f"kvtop sim: {why}; {part} was computed again in this process", file=sys.stderr, flush=True)

    return tell


def _optimum_beside(a: argparse.Namespace, requests: list[Any], capacities: list[int], tpb: int) -> Any:
    """Belady's curve for ``capacities`` (with ``--belady``), started beside what the caller computes next: in a
    forked process where ``--jobs`` allows it (``kvtop.engines.sim.forked``), else at ``result()``. Without
    ``--belady``, a job whose ``result()`` is never asked for."""
    from kvtop.engines.sim import forked
    from kvtop.engines.sim.sweep import belady_curve

    return forked.start(belady_curve, requests, capacities, tpb, fork=a.belady and _sim_jobs(a) >= 2,
                        need_cpus=False, on_lost=_lost("the optimum"))


def _sizes_in_order(a: argparse.Namespace, fn: Any, arg_lists: list[tuple[Any, ...]]) -> Any:
    """``fn(*args)`` per host size, up to ``--jobs`` at once in forked processes, the results in the sweep's order."""
    from kvtop.engines.sim import forked

    return forked.InOrder(fn, arg_lists, min(_sim_jobs(a), len(arg_lists)), on_lost=_lost("a host size's replay"))


def _timed_runs(a: argparse.Namespace, configs: list[Any], results: Any, replay_order: list[int]
                ) -> list[dict[str, Any]]:
    """Each host size's full engine replay (``offline.run_trace``), printed as it comes, in the sweep's order.
    ``results`` come in ``replay_order`` (indices into ``configs``): the 0 point first, the baseline of every
    verdict; a row waits for the rows before it in the sweep's order."""
    done: dict[int, dict[str, Any]] = {}
    runs: list[dict[str, Any]] = []
    baseline: dict[str, Any] | None = None
    for k, result in zip(replay_order, results):
        if configs[k].secondary_blocks == 0 and baseline is None:
            baseline = result
        done[k] = result
        while len(runs) in done:
            row = done.pop(len(runs))
            _timed_row(a, configs[len(runs)], row, baseline, len(configs))
            runs.append(row)
    return runs


def _timed_row(a: argparse.Namespace, cfg: Any, result: dict[str, Any], baseline: dict[str, Any] | None,
               sizes: int) -> None:
    """One timed run's verdict, and its row where the output is text."""
    from kvtop.engines.sizing import format_bytes

    host_bytes, host_blocks = cfg.host_cache_bytes, cfg.secondary_blocks
    failures = result.pop("failures", None) or []
    if failures and not a.json:
        print(f"kvtop sim: {result['failed']:,} requests failed, e.g. {failures[0]}", file=sys.stderr)
    result["verdict"] = v = sweep_verdict(result, baseline)
    if a.json:
        return
    said = (v["says"] or "unknown") if v["net_s"] is None else f"{v['says']} {v['net_s']:+.1f} s"
    if host_blocks == 0 and sizes > 1:
        said += " (the baseline of the verdicts)"
    print(f"host {format_bytes(host_bytes):>10} ({host_blocks:>7,} blocks): hit rate "
          f"{100 * result['cache_hit_rate']:5.1f}%  reused {result['reused_blocks']:>9,}  missed "
          f"{result['missed_blocks']:>9,}  offloaded {result['offloaded_blocks']:>9,}  onboarded "
          f"{result['onboarded_blocks']:>9,}  simulated {result['simulated_seconds']:8.1f} s  "
          f"wall {result['wall_seconds']:6.1f} s  tier: {said}"
          + (f"  FAILED {result['failed']:,} of {result['failed'] + result['requests']:,} requests"
             if result["failed"] else ""), flush=True)


VERDICT_BASIS = ("timed replay: the engine's busy seconds for the same trace and settings without the host tier "
                 "(the 0 point) minus with it")


def sweep_verdict(run: dict[str, Any], baseline: dict[str, Any] | None) -> dict[str, Any]:
    """A timed sweep point's verdict on its host tier: ``net_s`` = the no-tier run's busy seconds minus this run's
    (what the tier's hits saved in prefill less what its copies cost on the critical path, as the engine spent it;
    busy seconds rather than the run's end, which a trace's arrivals set while the engine keeps up, or the sum of
    TTFTs, which queueing multiplies); ``says`` "none" without a tier, "idle" where nothing was onboarded (the
    tier stores but nothing comes back: its offloads still cost, ``net_s`` says how much), else "pays" or "costs"
    by the sign of ``net_s`` ("idle" at exactly 0)."""
    if not run.get("secondary_blocks"):
        return {"says": "none", "net_s": None, "basis": "no host tier"}
    if baseline is None:
        return {"says": None, "net_s": None, "basis": "no run without the tier to compare with"}
    net = float(baseline["busy_seconds"]) - float(run["busy_seconds"])
    if not run.get("onboarded_blocks"):
        says = "idle"
    else:
        says = "pays" if net > 0 else "costs" if net < 0 else "idle"
    return {"says": says, "net_s": net, "basis": VERDICT_BASIS}


def _sim_hit_rates(a: argparse.Namespace, requests: list[Any], model: Any, gpu: Any, tpb: int, primary: int,
                   sweep: list[tuple[int, int]]) -> int:
    """``kvtop sim --hit-rate-only`` / ``--one-pass`` [``--belady``]: block-manager hit rates, no engine timing."""
    import time

    from kvtop.engines.sim.sweep import host_curve, replay_hit_rates
    from kvtop.engines.sizing import format_bytes

    wall0 = time.perf_counter()
    bytes_of = dict((blocks, size) for size, blocks in sweep)
    mode = "one-pass" if a.one_pass else "hit-rate-only"
    host_sizes = sorted(set(blocks for _, blocks in sweep))  # the runs' order, one per size, both ways
    with _optimum_beside(a, requests, [primary + h for h in host_sizes], tpb) as optimum_job:
        try:
            if a.one_pass:
                runs = host_curve(requests, primary, host_sizes, tpb)
            else:
                with _sizes_in_order(a, replay_hit_rates, [(requests, primary, h, tpb) for h in host_sizes]) as each:
                    runs = list(each)
        except OverflowError as exc:  # hash ids whose 512 token ids pass signed 64 bits (the trace allows < 2^64)
            raise SettingsError("--trace", str(exc)) from None
        optimum = optimum_job.result() if a.belady else None
    wall = time.perf_counter() - wall0
    for i, r in enumerate(runs):
        r["host_cache_bytes"] = bytes_of[r["secondary_blocks"]]
        r["primary_blocks"] = primary
        if optimum is not None:
            r["belady_hit_rate"] = optimum[i]
        if not a.json:
            print(f"host {format_bytes(r['host_cache_bytes']):>10} ({r['secondary_blocks']:>7,} blocks): hit rate "
                  f"{100 * r['cache_hit_rate']:5.1f}%  reused {r['reused_blocks']:>9,}  missed "
                  f"{r['missed_blocks']:>9,}  onboarded {r['onboarded_blocks']:>9,}"
                  + (f"  optimal (Belady) {100 * optimum[i]:5.1f}%" if optimum is not None else ""))
    if runs and runs[0]["failed"]:
        print(f"kvtop sim: {runs[0]['failed']:,} requests skipped: each needs more KV blocks than the GPU pool has "
              f"({primary:,})", file=sys.stderr)
    if not a.json:
        print(f"{mode}: {len(runs)} sizes in {wall:.1f} s, one request at a time, no engine timing"
              + ("; Belady's MIN over GPU + host blocks, prompts only" if optimum is not None else ""))
    if a.plot:
        from kvtop.report.charts import plot_sweep

        plot_sweep(runs, a.plot)
    if a.json:
        print(json.dumps({"model": model.name, "gpu": gpu.name, "tokens_per_block": tpb, "mode": mode,
                          "wall_seconds": wall, "runs": runs}))
    return 0


__all__ = ["MAX_SWEEP_POINTS", "SIM_DEFAULTS", "SIM_DEFAULT_MAX_JOBS", "VERDICT_BASIS", "main", "parser",
           "sweep_verdict"]
