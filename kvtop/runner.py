"""The driven run (``kvtop [options]``): chooses and builds the engine, the workload driver and the engine's
poller, and wires them into a Session with the parts every mode shares (kvtop/compose.py: sinks, meta, samplers).

The same session feeds the dashboard or the headless summary; nothing here imports Textual.
"""

from __future__ import annotations

import gc
import os
import time
from typing import TYPE_CHECKING, Any

from kvtop.compose import (
    RunError,
    add_machine_samplers,
    add_sinks,
    check_record,
    engine_clock,
    engine_meta,
)
from kvtop.records import SourceId
from kvtop.session import Session
from kvtop.settings import Settings
from kvtop.textsafe import clean
from kvtop.values import mutable

if TYPE_CHECKING:
    from kvtop.workload.scenarios import RetentionSpec

# What only a driven run uses: the engine, its poller, the workload, the NVML and host samplers are imported by the
# functions that build it, not here (psutil, the NVML wrapper, the poller, the workload driver, TensorRT-LLM's
# loader: ~0.06 s of CPU under -X importtime, dev box). `kvtop attach` and `kvtop replay` do not import this module.




# The cyclic garbage collector's youngest generation, in a driven run of the simulator: collected every this many
# allocations of container objects, not Python's 700. The engine and the fold make and drop ~2M dicts a 3,000-request
# trace (its KV events), and at 700 the collector ran ~15,000 times over them and, through what survived a
# collection or two (events waiting in the buffer), ~120 times over the fold's and the engine's whole state: ~13%
# of the run's CPU (bench/JOURNAL.md "The driven path's fold"). Garbage in cycles waits longer: at most this many
# objects more.
GC_GEN0_THRESHOLD = 50_000


def collect_less_often() -> None:
    """Raise the collector's first threshold to GC_GEN0_THRESHOLD (never lower it)."""
    gen0, gen1, gen2 = gc.get_threshold()
    if 0 < gen0 < GC_GEN0_THRESHOLD:
        gc.set_threshold(GC_GEN0_THRESHOLD, gen1, gen2)


@mutable
class EngineChoice:
    kind: str            # "trtllm" or "sim"
    reason: str          # why (shown on the SIM badge)
    module: Any = None   # the tensorrt_llm module, when kind == "trtllm"


def choose_engine(settings: Settings) -> EngineChoice:
    from kvtop.engines import trtllm as trtllm_engine

    if settings.engine == "sim":
        return EngineChoice("sim", "--engine sim")
    if settings.engine == "trtllm":
        try:
            return EngineChoice("trtllm", "--engine trtllm", trtllm_engine.import_trtllm())
        except trtllm_engine.EngineUnavailable as exc:
            raise RunError(str(exc)) from None
    ok, why = trtllm_engine.trtllm_available()
    if ok:
        try:
            return EngineChoice("trtllm", why, trtllm_engine.import_trtllm())
        except trtllm_engine.EngineUnavailable as exc:
            return EngineChoice("sim", f"TensorRT-LLM failed to import ({exc})")
    return EngineChoice("sim", why)


def retention_spec(settings: Settings) -> RetentionSpec:
    from kvtop.workload.scenarios import RetentionSpec

    ranges: list[tuple[int, int | None, int, int | None]] = []
    if settings.prompt_priority is not None:
        ranges.append((0, settings.prompt_priority_tokens, settings.prompt_priority,
                       settings.prompt_priority_duration_ms))
    return RetentionSpec(ranges, settings.decode_priority, None)


def build_sim_engine(settings: Settings) -> Any:
    from kvtop.engines import trtllm as trtllm_engine
    from kvtop.engines.sim import KvCacheConfig, SchedulerConfig, SimLLM

    kvc = KvCacheConfig(host_cache_size=settings.host_cache, tokens_per_block=settings.tokens_per_block,
                        max_tokens=settings.gpu_cache_tokens,
                        free_gpu_memory_fraction=settings.gpu_cache_fraction,
                        secondary_offload_min_priority=settings.secondary_offload_min_priority,
                        event_buffer_max_size=trtllm_engine.EVENT_BUFFER_SIZE, dtype=settings.kv_cache_dtype)
    return SimLLM(settings.model, kv_cache_config=kvc, max_batch_size=settings.max_batch_size,
                  tensor_parallel_size=settings.tensor_parallel_size,
                  max_num_tokens=settings.max_num_tokens, enable_iter_perf_stats=True, return_perf_metrics=True,
                  gpu=settings.gpu, speed=settings.speed, trtllm_version=settings.trtllm_version,
                  scheduler_config=SchedulerConfig(capacity_scheduler_policy=settings.capacity_scheduler_policy),
                  kv_event_token_ids=True, pace_to_event_drains=True)


def _size_for_ab(settings: Settings) -> str | None:
    """``--scenario ab`` with the GPU pool left at its default: a pool that one prompt of ~4,100 tokens and its
    answer fill exactly (as TensorRT-LLM's example's 256-token pool is filled by 230 + 16 tokens), so that B evicts
    all of A: 0 blocks reused without a host tier, A onboarded from the host with one. A pool set on the command
    line, a config file or the environment is kept. Returns the line the event log says it with."""
    from kvtop.workload.scenarios import AB_PROMPT_TOKENS, ab_pool_tokens

    if settings.scenario != "ab":
        return None
    origin = settings.origin
    if origin.get("gpu_cache_tokens", "default") != "default" or origin.get("gpu_cache_fraction",
                                                                              "default") != "default":
        return None
    settings.gpu_cache_tokens = ab_pool_tokens(settings.max_tokens, settings.tokens_per_block)
    one = ""
    if origin.get("concurrency", "default") == "default" and origin.get("rate", "default") == "default":
        # The example runs one request at a time (max_batch_size=1); 8 in flight on a pool that holds one request
        # only queue, and TTFT measured the queue rather than a reload or a recompute.
        settings.concurrency = 1
        one = ", one request at a time"
    return (f"scenario ab: GPU pool {settings.gpu_cache_tokens} tokens for prompts of ~{AB_PROMPT_TOKENS} "
            f"tokens{one} (as TensorRT-LLM's offloading example: one prompt and its answer fill the pool), so that "
            "B evicts A and A comes back from the host; --gpu-cache sets another size")


def build_session(settings: Settings, *, engine: Any = None, choice: EngineChoice | None = None,
                  sample_gpu: bool = True) -> Session:
    """Everything a driven run needs, wired into one Session. ``engine`` may be injected (tests)."""
    from kvtop.engines import trtllm as trtllm_engine
    from kvtop.engines.models import resolve_model
    from kvtop.sources.poller import EnginePoller
    from kvtop.workload.driver import WorkloadDriver
    from kvtop.workload.scenarios import make_scenario
    from kvtop.workload.trace import read_trace

    check_record(settings)  # before an engine is built
    try:
        resolve_model(settings.model)  # a bad --model fails here, before an engine is built
    except ValueError as exc:
        raise RunError(f"--model: {exc}") from None
    choice = choice or (EngineChoice("sim", "injected engine") if engine is not None else choose_engine(settings))
    ab_note = _size_for_ab(settings) if engine is None else None
    source = SourceId.local(run=settings.run_name or f"{settings.scenario}-{os.getpid()}")
    if settings.disk_cache:  # checked before any engine starts
        if choice.kind == "sim":
            raise RunError("--disk-cache: the simulator has no disk tier (use --engine trtllm, TensorRT-LLM 1.3+)")
        if not settings.disk_cache_path or not os.path.isdir(settings.disk_cache_path):
            raise RunError(f"--disk-cache-path: {settings.disk_cache_path or '(not given)'} is not a directory "
                           "(TensorRT-LLM refuses a disk cache without one)")
    if settings.offload_transfer_mode != "DRAM":  # checked before any engine starts
        if not settings.offload_directory:
            raise RunError(f"--offload-transfer-mode {settings.offload_transfer_mode} needs --offload-directory DIR "
                           "(TensorRT-LLM falls back to DRAM without one)")
        if choice.kind == "sim":
            raise RunError(f"--offload-transfer-mode {settings.offload_transfer_mode}: the simulator models DRAM "
                           "transfers only (use --engine trtllm)")
    if engine is None:
        try:
            engine = (build_sim_engine(settings) if choice.kind == "sim"
                      else trtllm_engine.build_llm(settings, choice.module))
        except ValueError as exc:
            raise RunError(str(exc)) from None
        if choice.kind == "sim":
            collect_less_often()
    # The LLM's own args first (what TensorRT-LLM resolved), kvtop's settings where it says nothing.
    meta = engine_meta(engine, model=settings.model, tokens_per_block=settings.tokens_per_block,
                       host_cache_bytes=int(settings.host_cache),
                       engine_version=getattr(choice.module, "__version__", "unknown"))
    if settings.offload_transfer_mode != "DRAM":
        # Offloaded blocks are written to files: the secondary tier is disk-backed (TierState.medium says so).
        meta["secondary_medium"] = ("files via GDS" if settings.offload_transfer_mode == "GDS"
                                    else "files via POSIX")
        meta["offload_directory"] = settings.offload_directory
    meta["simulated"] = choice.kind == "sim"
    meta["sim_reason"] = choice.reason if choice.kind == "sim" else None
    meta["scenario"] = settings.scenario
    # The load, for the report's table (a run at 8 in flight and one at 64 are not the same experiment).
    meta["concurrency"] = None if settings.rate else settings.concurrency
    meta["rate"] = settings.rate
    clock = engine_clock(engine, settings.speed) if choice.kind == "sim" else None
    # which clock the records' times are on: "simulated" (engine_clock) or "wall"; kvtop report says it
    meta["clock"] = "simulated" if clock is not None else "wall"
    session = Session(source=source, warmup_requests=settings.warmup_requests, meta=meta)
    if ab_note:
        session.note("info", ab_note)

    # The engine itself
    def engine_error(name: str, message: str) -> None:
        # A stream failing (once per streak) or malformed items skipped (data lost): the log and the problems.
        session.on_source_error(name, message)
        session.problems.report(name if name.startswith("engine") else f"engine.{name}", message,
                                lost="malformed" in message)

    poller = EnginePoller(engine, source, interval_s=settings.refresh, sink=session.emit, on_error=engine_error,
                          clock=clock or time.time, sink_many=session.emit_many,
                          sink_events=session.emit_kv_events)
    session.add_producer("engine", poller.run, poller.stop)
    session.add_closer(engine.shutdown)

    # The workload
    capacity_tokens = int(meta.get("primary_blocks") or 0) * settings.tokens_per_block or (
        settings.gpu_cache_tokens or 131072)
    kwargs: dict[str, Any] = {"capacity_tokens": capacity_tokens, "max_tokens": settings.max_tokens,
                              "seed": settings.seed, "base_retention": retention_spec(settings)}
    if settings.scenario == "trace":
        if not settings.trace:
            raise RunError("--scenario trace needs --trace FILE (a Mooncake-format JSONL trace)")
        errors: list[Any] = []
        try:
            kwargs["requests"] = list(read_trace(settings.trace, errors=errors))
        except OSError as exc:
            raise RunError(f"--trace: cannot read {settings.trace}: {exc.strerror or exc}") from None
        if not kwargs["requests"]:
            engine.shutdown()
            first = f" (line {errors[0].line}: {errors[0].problem})" if errors else " (the file is empty)"
            raise RunError(f"--trace: {clean(settings.trace)} holds no trace requests{first}; a Mooncake trace is "
                           "one JSON object per line: timestamp, input_length, output_length, hash_ids")
        for err in errors:
            session.problems.report("trace.bad_line", f"{clean(settings.trace, 80)}: line {err.line}: "
                                    f"{err.problem} ({len(errors):,} bad lines skipped)", lost=True)
        kwargs["time_scale"] = settings.trace_time_scale
    if settings.scenario == "ab":
        kwargs["tokens_per_block"] = settings.tokens_per_block
    scenario = make_scenario(settings.scenario, **kwargs)
    if choice.kind == "trtllm":
        retention = trtllm_engine.retention_factory(choice.module.llmapi, settings.offload_transfer_mode,
                                                    settings.offload_directory)
        sampling = trtllm_engine.sampling_factory(choice.module)
    else:
        from kvtop.engines.sim import KvCacheRetentionConfig, SamplingParams

        def retention(spec: RetentionSpec) -> Any:
            cls = KvCacheRetentionConfig
            return cls([cls.TokenRangeRetentionConfig(s, e, p, d) for s, e, p, d in spec.ranges],
                       spec.decode_priority, spec.decode_duration_ms)

        def sampling(n: int) -> Any:
            return SamplingParams(max_tokens=n)

    try:
        driver = WorkloadDriver(engine, scenario, emit=session.emit, source=source,
                                concurrency=settings.concurrency, rate=settings.rate, duration_s=None,
                                retention_factory=retention, sampling_factory=sampling, seed=settings.seed,
                                clock=clock)
    except ValueError as exc:
        engine.shutdown()
        raise RunError(str(exc)) from None
    session.driver = driver
    if settings.scenario == "trace":
        async def trace_then_last_poll() -> None:
            # A trace ends (every request answered): the engine's last events and stats are folded before the run
            # can end with it (a headless run does: kvtop/commands/run.py)
            await driver.run()
            if not driver.stopped:
                await poller.final_poll()

        session.add_producer("workload", trace_then_last_poll, driver.stop)
    else:
        session.add_producer("workload", driver.run, driver.stop)

    # Machine samplers: NVML (no driver here is the normal case) and host memory.
    add_machine_samplers(session, meta, max(settings.refresh, 1.0), gpu=sample_gpu, clock=clock)
    add_sinks(session, settings)
    return session


























__all__ = ["GC_GEN0_THRESHOLD", "EngineChoice", "RunError", "build_session", "build_sim_engine", "choose_engine",
           "collect_less_often", "engine_clock", "retention_spec"]
