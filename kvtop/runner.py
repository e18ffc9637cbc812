"""Builds the session of a driven run (``kvtop [options]``): engine, workload driver, pollers, samplers, sinks.

The same session feeds the dashboard or the headless summary; nothing here imports Textual.
"""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

from kvtop.records import SourceId, make
from kvtop.session import Session
from kvtop.settings import Settings
from kvtop.textsafe import clean
from kvtop.values import mutable

if TYPE_CHECKING:
    from kvtop.workload.scenarios import RetentionSpec

# What only a driven run (`kvtop [options]`) uses: the engine, its poller, the workload, the NVML and host samplers
# are imported by the functions that build it, not here. `kvtop attach` and `kvtop replay` import this module for
# add_sinks / finish_problems / summary only, and those imports (psutil, the NVML wrapper, the poller, the workload
# driver, TensorRT-LLM's loader: ~0.06 s of CPU under -X importtime, dev box) were start-up they never used.


class RunError(RuntimeError):
    """A run cannot start; the message says what to change (printed as one line by the CLI)."""


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
    from kvtop.engines.meta import meta_from_llm
    from kvtop.engines.models import resolve_model
    from kvtop.sources.host import HostSource
    from kvtop.sources.nvml import NvmlSource
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
    if hasattr(engine, "describe"):
        meta = dict(engine.describe())
    else:
        # The LLM's own args first (what TensorRT-LLM resolved), kvtop's settings where it says nothing.
        meta = meta_from_llm(engine, model=settings.model, tokens_per_block=settings.tokens_per_block,
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
    session = Session(source=source, warmup_requests=settings.warmup_requests, meta=meta)
    if ab_note:
        session.note("info", ab_note)

    # The engine itself
    def engine_error(name: str, message: str) -> None:
        # A stream failing (once per streak) or malformed items skipped (data lost): the log and the problems.
        session.on_source_error(name, message)
        session.problems.report(name if name.startswith("engine") else f"engine.{name}", message,
                                lost="malformed" in message)

    poller = EnginePoller(engine, source, interval_s=settings.refresh, sink=session.emit, on_error=engine_error)
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
                                retention_factory=retention, sampling_factory=sampling, seed=settings.seed)
    except ValueError as exc:
        engine.shutdown()
        raise RunError(str(exc)) from None
    session.driver = driver
    session.add_producer("workload", driver.run, driver.stop)

    # Machine samplers: NVML (no driver here is the normal case) and host memory.
    if sample_gpu:
        nvml = NvmlSource(source=source)
        session.add_sampler("nvml", nvml.sample, max(settings.refresh, 1.0))
        session.add_closer(nvml.close)
    host = HostSource(source=source)
    if meta.get("secondary_blocks") and meta.get("bytes_per_block"):
        host.set_pinned_pool_from_blocks(int(meta["secondary_blocks"]), int(meta["bytes_per_block"]))
    session.add_sampler("host", host.sample, max(settings.refresh, 1.0))
    add_sinks(session, settings)
    return session


def check_record(settings: Settings) -> None:
    """A recording holds one run: ``--record FILE`` onto a file that already has something in it is refused (a
    RunError, exit 2) before anything starts, and the file is left as it was; ``--append`` adds the run to it
    (``kvtop report`` splits such a file into its runs). Appended blindly, a second demo run became one run with
    two engines' records folded together."""
    if not settings.record or settings.append:
        return
    try:
        size = os.stat(settings.record).st_size
    except OSError:
        return  # not there (created), or not readable: the open says why
    if size > 0 and os.path.isfile(settings.record):
        raise RunError(f"--record: {clean(settings.record, 200)} already holds a recording ({size:,} bytes); "
                       "give a new file, or --append to add this run to it")


def add_sinks(session: Session, settings: Settings) -> None:
    """--record, --publish and --prometheus-port, wherever the records come from."""
    if settings.record:
        from kvtop.sinks.recorder import Recorder

        check_record(settings)

        try:
            recorder = Recorder(settings.record, problems=session.problems)
        except OSError as exc:
            raise RunError(f"--record: cannot write {settings.record}: {exc.strerror or exc}") from None
        session.recorder = recorder
        session.add_sink(recorder.write, recorder.close)
    if settings.publish:
        from kvtop.mqtt_wire import MqttUrlError
        from kvtop.sinks import mqtt as mqtt_sink

        try:
            publisher = mqtt_sink.publisher_from_url(settings.publish, source=session.source,
                                                     password_file=settings.mqtt_password_file,
                                                     on_status=session.on_source_status,
                                                     problems=session.problems)
        except MqttUrlError as exc:
            raise RunError(f"--publish: {exc}") from None
        session.publisher = publisher
        session.add_sink(publisher.publish, None)
        session.add_producer("mqtt-publish", publisher.run, publisher.stop)
    if settings.prometheus_port is not None:
        from kvtop.sinks.prometheus import PrometheusExporter

        exporter = PrometheusExporter(lambda: dict(session.models) or session.model,
                                      port=settings.prometheus_port, addr=settings.prometheus_addr)
        # A scrape reads the snapshots the session publishes (kvtop/tiers/snapshot.py), never the live fold: at the
        # refresh, or once a second at most often (a scrape comes every 15 s by Prometheus's default).
        session.publish_s = max(settings.refresh, 1.0)
        try:
            exporter.start()
        except OSError as exc:
            raise RunError(f"--prometheus-port: cannot listen on {settings.prometheus_addr}:"
                           f"{settings.prometheus_port}: {exc.strerror or exc}") from None
        except OverflowError:
            raise RunError(f"--prometheus-port: {settings.prometheus_port} is not a port (0 to 65535)") from None
        if not is_loopback(settings.prometheus_addr):
            session.problems.report("prometheus.exposed", f"--prometheus-addr {settings.prometheus_addr}: /metrics "
                                    "is served beyond this machine, without authentication (model names, run "
                                    "names and load are readable by anyone who can reach the port)")
        session.add_sink(exporter.observe, exporter.stop)


def is_loopback(addr: str) -> bool:
    """True for an address only this machine can reach (127.0.0.0/8, ::1, localhost)."""
    import ipaddress

    if addr.strip().lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(addr.strip().strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def finish_problems(session: Session) -> None:
    """What only the end of a run can tell: it never got data; a sink still held records it could not send."""
    publisher = getattr(session, "publisher", None)
    if publisher is not None:
        unsent = publisher.queued
        if unsent:
            session.problems.report("mqtt-publish.dropped", f"{unsent:,} record(s) never reached "
                                    f"{publisher.url.display()} ({publisher.dropped:,} dropped before)",
                                    count=unsent, lost=True)
    if session.records_in == 0:
        where = session.meta.get("attached_to") or "the engine"
        session.problems.report("run.no_data", f"no records from {where} in this run")


def summary(session: Session) -> dict[str, Any]:
    """The ``--headless --json`` object (issue 4's keys, plus what the fold adds)."""
    out: dict[str, Any] = {"engine": session.meta.get("engine"),
                           "engine_version": session.meta.get("engine_version"),
                           "model": session.meta.get("model"),
                           "simulated": session.meta.get("simulated"),
                           "sim_reason": session.meta.get("sim_reason"),
                           "scenario": session.meta.get("scenario"),
                           # the simulator's scheduler, and what it was asked for but does not model (SimLLM)
                           "capacity_scheduler_policy": session.meta.get("capacity_scheduler_policy"),
                           "not_modelled": list(session.meta.get("not_modelled") or [])}
    out.update(session.model.snapshot().summary())  # the same reading Prometheus and the fleet table get
    if out.get("engine") is None:
        # a source heard from by meta alone (a server whose data endpoints all failed) is no model's yet: what it
        # said of itself is still what the run watched. All of it or none: where the model names its engine, the
        # session's meta may be another source's (a fleet's first retained meta), and "vllm-format (TensorRT-LLM
        # 1.2), model Qwen/Qwen3-8B" put one source's engine beside another's version and model.
        for key in ("engine", "engine_version", "model", "gpu"):
            if out.get(key) is None and session.meta.get(key) is not None:
                out[key] = session.meta.get(key)
    out["what_if"] = session.what_if()
    out["size_advice"] = session.size_advice()
    from kvtop.fleet import source_status as _source_status

    # Every source's state (connected / disconnected / offline / stale) and every link's (mqtt, trtllm-serve,
    # mqtt-publish, recorder), so a script can tell "nothing happened" from "could not see".
    out["records"] = session.records_in
    out["sources"] = {k: _source_status(k, session.status) or "connected" for k in session.models}
    out["links"] = {k: link_state(v) for k, v in session.status.items() if k not in session.models}
    out["refused_sources"] = session.refused_sources
    out["problems"] = session.problems.to_json()
    if len(session.models) > 1:  # attached to a fleet: every source and the aggregate row the dashboard shows
        from kvtop.fleet import aggregate, source_row, source_status

        out["fleet"] = {
            "sources": [source_row(k, m, source_status(k, session.status)).to_json()
                        for k, m in session.models.items()],
            "all": aggregate(session.models, session.status),
        }
    return out


def link_state(message: str) -> str:
    """A status message as one word: connected, disconnected, offline, failed, done, or the message's first."""
    text = str(message).lower()
    if text.startswith(("disconnected", "cannot reach", "unreachable")) or "retrying" in text:
        return "disconnected"
    if text.startswith(("connected", "reconnected", "attached", "online", "ok")):
        return "connected"
    if text in ("offline", "failed", "done", "error", "stale"):
        return text
    return text.split(" ", 1)[0] or "unknown"


def format_summary(s: dict[str, Any]) -> str:
    def pct(x: Any) -> str:
        return "unknown" if x is None else f"{100 * x:.1f}%"

    lines = [_header(s)]
    lines += [f"not modelled: {note}" for note in s.get("not_modelled") or []]
    req = s.get("requests", {})
    ttft = req.get("ttft_ms", {})
    lines.append(f"requests: {_n(req.get('completed', 0))} completed, {_n(req.get('failed', 0))} failed; TTFT p50 "
                 f"{_ms(ttft.get('p50'))}, p99 {_ms(ttft.get('p99'))}")
    by_source = req.get("ttft_ms_by_source") or {}
    if by_source:  # where each request's prefix came from: the verdict's evidence
        lines.append("TTFT by prefix source: " + "; ".join(
            f"{source.replace('_', ' ')} {v.get('count', 0):,} p50 {_ms(v.get('p50'))} p99 {_ms(v.get('p99'))}"
            for source, v in by_source.items()))
    for v in (s.get("verdict") or {}).values():   # the answer: is each tier below the GPU paying off
        if v.get("text"):
            lines.append(f"verdict: {v['text']}" + (f" ({v['basis']})" if v.get("basis") else ""))
    tiers = s.get("tiers") or {}
    for tier in dict.fromkeys(["gpu", "host", *tiers]):  # every tier the summary has, GPU and host always
        t = tiers.get(tier, {})
        lines.append(f"{tier:>4}: capacity {_n(t.get('capacity_blocks'))} blocks, in use {_n(t.get('in_use_blocks'))},"
                     f" cached {_n(t.get('cached_blocks'))}, free {_n(t.get('free_blocks'))}")
    cold = s.get("cold")
    if cold:  # the V2 manager's host + disk sum (TierModel.cold)
        lines.append(f"host+disk together: capacity {_n(cold.get('capacity_blocks'))} blocks, in use "
                     f"{_n(cold.get('in_use_blocks'))}, free {_n(cold.get('free_blocks'))}")
    if s.get("stats_schema") not in (None, "1.0-1.2"):
        lines.append(f"stats: TensorRT-LLM {s['stats_schema']}")
    hr = s.get("hit_rate", {})
    lines.append(f"hit rate: {pct(hr.get('cumulative'))} (GPU {pct(hr.get('gpu'))}, host {pct(hr.get('host'))})")
    wi = s.get("what_if") or {}
    if wi.get("host_capacity_blocks") == 0:
        # As the dashboard says it: twice no host cache is still none (the estimate once read 17.5% under an
        # actual 15.6% here, being its own since-start rate, not the stats' hit rate on the line above).
        lines.append("what if: no host cache, x2 of 0 is 0")
    elif wi.get("host_x2_hit_rate") is not None:
        # The estimate's own since-start rate first, the same span and definition as the estimates beside it.
        lines.append(f"what if: all {pct(wi.get('hit_rate'))} -> host cache x2 {pct(wi.get('host_x2_hit_rate'))}, "
                     f"x4 {pct(wi.get('host_x4_hit_rate'))}")
    sa = s.get("size_advice") or {}
    rec = sa.get("recommendation") or {}
    if rec.get("text"):
        # The curve's points as "host size: hit rate (optimum)", then the advice in words.
        points = ", ".join(f"{_size(p.get('host_bytes'), p.get('host_blocks'))} {pct(p.get('hit_rate'))}"
                           + (f" (opt {pct(p['optimal_hit_rate'])})" if p.get("optimal_hit_rate") is not None else "")
                           for p in sa.get("points") or [])
        lines.append(f"size advice: {rec['text']}")
        if points:  # no curve yet: the advice says why, and there is no point to list
            lines.append(f"  hit rate by host size: {points}")
    mv = s.get("moves", {})
    lines.append(f"moves: offloaded {_n(mv.get('offloaded_blocks', 0))}, onboarded {_n(mv.get('onboarded_blocks', 0))}"
                 f", evicted GPU {_n(mv.get('evicted_gpu_blocks', 0))}, evicted host "
                 f"{_n(mv.get('evicted_host_blocks', 0))}")
    if mv.get("disk"):  # the engine has a disk tier: its moves, and its share of the hits where the engine says it
        lines.append(f"disk: prefetched to host {_n(mv.get('disk_prefetched_blocks', 0))}, onboarded to GPU "
                     f"{_n(mv.get('disk_onboarded_blocks', 0))}, offloaded to disk "
                     f"{_n(mv.get('disk_offloaded_blocks', 0))}"
                     + (f", hits {pct(hr['disk'])}" if hr.get("disk") is not None else ""))
    pre = s.get("preemptions") or {}
    if pre.get("suspended") or pre.get("resumed"):  # TensorRT-LLM V2's iterSuspendedRequests / iterResumedRequests
        lines.append(f"preemptions: suspended {_n(pre.get('suspended', 0))}, resumed {_n(pre.get('resumed', 0))}")
    from kvtop.tiers.departures import describe as describe_left

    left = describe_left(mv.get("left_said") or {}, mv.get("left_inferred") or {})
    if left:
        lines.append(f"left: {left}")
    st = s.get("stream")
    if st and not st.get("batches") and st.get("summaries"):  # a fleet's agent: its summaries, not the batches
        lines.append(f"stream: {_n(st['summaries'])} summaries from an agent, {_n(st.get('summaries_lost', 0))} lost")
    elif st:  # the engines' common KV event stream (zmq://, vllm://, sglang://)
        first, last = st.get("first_seq"), st.get("last_seq")
        lines.append(f"stream: {_n(st.get('batches', 0))} batches"
                     + (f" (seq {first}..{last})" if first is not None and last is not None else "")
                     + f", {_n(st.get('lost_batches', 0))} lost, {_n(st.get('replayed_batches', 0))} replayed, "
                     f"{_n(st.get('bad_events', 0))} bad events"
                     + (f", {st['max_lag_s']:.1f} s behind at most ({st.get('max_lag_batches', 0):,} batches waiting"
                        " behind a replay)" if st.get("max_lag_s") else "")
                     + ("; counts are SINCE ATTACH: the engine announced nothing it cached before"
                        if st.get("since_attach") else ""))
    sources = s.get("sources") or {}
    odd = {k: v for k, v in sources.items() if v not in ("connected", "online")}
    if len(sources) > 1 or odd:
        lines.append(f"sources: {len(sources):,}" + "".join(f", {k} {v}" for k, v in list(odd.items())[:10])
                     + (f" (+{len(odd) - 10:,} more not connected)" if len(odd) > 10 else "")
                     + (f"; {s['refused_sources']:,} records of sources past the limit refused"
                        if s.get("refused_sources") else ""))
    for p in s.get("problems") or []:
        lines.append(f"problem: {p['kind']} x{p['count']:,}: {p['message']}")
    # Every string above may have come from outside (model, engine, source names, messages).
    return "\n".join(clean(line, None) for line in lines)


def _header(s: dict[str, Any]) -> str:
    """"kvtop: ENGINE (VERSION), model MODEL [SIM: why], scheduler POLICY": a part that is not known says so
    ("engine unknown", "model unknown") or is left out (the version), never Python's None."""
    engine = s.get("engine")
    version = s.get("engine_version")
    head = f"kvtop: {engine}" if engine else "kvtop: engine unknown"
    if version and version != engine:
        head += f" ({version})"
    head += f", model {s['model']}" if s.get("model") else ", model unknown"
    if s.get("simulated"):
        head += f" [SIM: {s['sim_reason']}]" if s.get("sim_reason") else " [SIM]"
    if s.get("capacity_scheduler_policy"):
        head += f", scheduler {s['capacity_scheduler_policy']}"
    return head


def _size(nbytes: Any, blocks: Any) -> str:
    from kvtop.tiers.sizeadvice import format_size

    return format_size(nbytes) if isinstance(nbytes, int) else f"{blocks:,} blocks"


def _n(x: Any) -> str:
    """A count with thousands separators (1,234,567); "unknown" where it is not known."""
    if x is None:
        return "unknown"
    return f"{x:,}" if isinstance(x, (int, float)) and not isinstance(x, bool) else str(x)


def _ms(x: Any) -> str:
    return "n/a" if x is None else f"{x:.1f} ms"


def dumps(obj: Any) -> str:
    return json.dumps(obj, indent=None, sort_keys=False, default=str)


__all__ = ["RunError", "build_session", "summary", "format_summary", "choose_engine", "make"]
