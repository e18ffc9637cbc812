"""SimLLM: TensorRT-LLM's ``LLM`` API over the simulated engine.

Same names as ``tensorrt_llm.LLM`` where they apply (``generate_async``, ``generate``, ``get_stats[_async]``,
``get_kv_cache_events[_async]``, ``shutdown``, ``with``), same config classes (``KvCacheConfig``,
``SamplingParams``, ``KvCacheRetentionConfig``), same 1.2-shaped dicts out, so kvtop's driver and pollers never
know which engine they have. The engine runs in a background thread; ``speed=1.0`` paces simulated time to the
wall clock (live demos), ``speed=0`` runs as fast as it can (sweeps, tests).
"""

from __future__ import annotations

import asyncio
import itertools
import threading
import time
import warnings
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field, fields
from enum import Enum
from typing import Any

from kvtop.engines.gpus import GpuProfile, resolve_gpu
from kvtop.engines.models import ModelShape, resolve_model
from kvtop.engines.sim.block_manager import BlockManager, TokenRuns
from kvtop.engines.sim.core import SimEngineCore, SimRequest
from kvtop.engines.sim.retention import KvCacheRetentionConfig
from kvtop.engines.sim.tokenizer import Tokenizer, load_tokenizer
from kvtop.engines.sizing import primary_blocks, runtime_reserve_bytes, secondary_blocks

_INT_TYPE = frozenset({int})
EVENT_DRAIN_WAIT_S = 1.0  # pace_to_event_drains: the longest an engine step waits for its events to be taken

ENGINE_NAME = "sim"
ENGINE_VERSION = "TensorRT-LLM 1.2 (simulated by kvtop)"


@dataclass
class KvCacheConfig:
    """``tensorrt_llm.llmapi.KvCacheConfig`` (1.2 fields and defaults; unknown names are rejected)."""

    enable_block_reuse: bool = True
    max_tokens: int | None = None
    max_attention_window: list[int] | None = None
    sink_token_length: int | None = None
    free_gpu_memory_fraction: float | None = 0.9
    host_cache_size: int | None = None
    onboard_blocks: bool = True
    cross_kv_cache_fraction: float | None = None
    secondary_offload_min_priority: int | None = None
    event_buffer_max_size: int = 0
    attention_dp_events_gather_period_ms: int = 5
    enable_partial_reuse: bool = True
    copy_on_partial_reuse: bool = True
    use_uvm: bool = False
    max_gpu_total_bytes: int = 0
    dtype: str = "auto"
    tokens_per_block: int = 32

    def __post_init__(self) -> None:
        frac = self.free_gpu_memory_fraction
        if frac is not None and not 0.0 < frac < 1.0:
            raise ValueError(f"free_gpu_memory_fraction: must be in (0, 1), got {frac}")
        if self.max_tokens is not None and self.max_tokens <= 0:
            raise ValueError(f"max_tokens: must be > 0, got {self.max_tokens}")
        if self.host_cache_size is not None and self.host_cache_size < 0:
            raise ValueError(f"host_cache_size: must be >= 0 bytes, got {self.host_cache_size}")
        if self.tokens_per_block <= 0:
            raise ValueError(f"tokens_per_block: must be > 0, got {self.tokens_per_block}")


class CapacitySchedulerPolicy(str, Enum):
    """``tensorrt_llm.llmapi.CapacitySchedulerPolicy`` (llm_args.py: a StrEnum of these three names)."""

    MAX_UTILIZATION = "MAX_UTILIZATION"
    GUARANTEED_NO_EVICT = "GUARANTEED_NO_EVICT"
    STATIC_BATCH = "STATIC_BATCH"


@dataclass
class SchedulerConfig:
    """``tensorrt_llm.llmapi.SchedulerConfig``: the capacity policy is simulated (MAX_UTILIZATION and
    GUARANTEED_NO_EVICT, not STATIC_BATCH); the other fields are accepted so that real scripts run unchanged."""

    capacity_scheduler_policy: CapacitySchedulerPolicy | str = CapacitySchedulerPolicy.GUARANTEED_NO_EVICT
    context_chunking_policy: Any = None
    dynamic_batch_config: Any = None

    def __post_init__(self) -> None:
        value = self.capacity_scheduler_policy
        name = value.value if isinstance(value, CapacitySchedulerPolicy) else str(value)
        try:
            self.capacity_scheduler_policy = CapacitySchedulerPolicy(name)
        except ValueError:
            raise ValueError(f"capacity_scheduler_policy: must be one of "
                             f"{', '.join(p.value for p in CapacitySchedulerPolicy)}, got {value!r}") from None
        if self.capacity_scheduler_policy is CapacitySchedulerPolicy.STATIC_BATCH:
            raise ValueError("capacity_scheduler_policy: STATIC_BATCH is not simulated (MAX_UTILIZATION and "
                             "GUARANTEED_NO_EVICT are)")


@dataclass
class SamplingParams:
    """The parts of ``tensorrt_llm.SamplingParams`` the simulator uses (outputs are greedy and always
    ``max_tokens`` long; the rest are accepted so that real scripts run unchanged)."""

    max_tokens: int = 32
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    seed: int | None = None
    end_id: int | None = None
    pad_id: int | None = None
    ignore_eos: bool = False
    return_perf_metrics: bool = False
    n: int = 1
    extra: dict[str, Any] = field(default_factory=dict)


class RequestError(RuntimeError):
    """A request failed (TensorRT-LLM raises ``RequestError`` from ``result()`` too)."""


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    request_perf_metrics: dict[str, Any] | None = None

    @property
    def length(self) -> int:
        return len(self.token_ids)


class RequestOutput:
    """What ``generate_async`` returns: awaitable (``await r`` / ``await r.aresult()``), ``result()``, and an
    async iterator of partial outputs when streaming."""

    def __init__(self, llm: SimLLM, req: SimRequest, prompt: str | None, streaming: bool):
        self._llm = llm
        self._req = req
        self.request_id = req.request_id
        self.prompt = prompt
        # A list of ids, as TensorRT-LLM's; of a TokenRuns prompt (a driven trace), made when first read
        self._prompt_token_ids = None if isinstance(req.prompt_ids, TokenRuns) else list(req.prompt_ids)
        self.streaming = streaming
        self.outputs = [CompletionOutput(0, "", [])]
        self.finished = False
        self.error: str | None = None
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[RequestOutput]]] = []
        self._stream: tuple[asyncio.AbstractEventLoop, asyncio.Queue[bool]] | None = None
        self._sent_tokens = 0

    @property
    def prompt_token_ids(self) -> list[int]:
        if self._prompt_token_ids is None:
            self._prompt_token_ids = list(self._req.prompt_ids)
        return self._prompt_token_ids

    # -- engine side (engine thread, under the engine lock) --
    def _on_token(self, req: SimRequest) -> None:
        # The last token travels with the final response (finished=True), as TensorRT-LLM yields it: one
        # response per token, the last one final.
        if self._stream is not None and len(req.output_ids) < req.max_tokens:
            loop, queue = self._stream
            _call_soon(loop, queue.put_nowait, False)

    def _on_finish(self, req: SimRequest) -> None:
        out = self.outputs[0]
        out.token_ids = list(req.output_ids)
        out.text = self._llm.tokenizer.decode(req.output_ids)
        out.finish_reason = "length" if req.error is None else "error"
        out.request_perf_metrics = self._llm._perf_metrics(req)
        self._llm._finished.append(self.request_id)
        with self._lock:
            self.error = req.error
            self.finished = True
            self._done.set()
            waiters, self._waiters = self._waiters, []
            stream = self._stream
        for loop, fut in waiters:
            _call_soon(loop, _resolve, fut, self)
        if stream is not None:
            _call_soon(stream[0], stream[1].put_nowait, True)

    # -- caller side --
    def _raise_if_failed(self) -> RequestOutput:
        if self.error is not None:
            raise RequestError(f"request {self.request_id} failed: {self.error}")
        return self

    def result(self, timeout: float | None = None) -> RequestOutput:
        if not self._done.wait(timeout):
            raise TimeoutError(f"request {self.request_id} did not finish within {timeout} s")
        return self._raise_if_failed()

    async def aresult(self) -> RequestOutput:
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._done.is_set():
                return self._raise_if_failed()
            fut: asyncio.Future[RequestOutput] = loop.create_future()
            self._waiters.append((loop, fut))
        await fut
        return self._raise_if_failed()

    def __await__(self) -> Any:
        return self.aresult().__await__()

    @property
    def metrics_dict(self) -> dict[str, float]:
        m = self.outputs[0].request_perf_metrics or {}
        t = m.get("timing_metrics", {})
        if not t or t.get("first_token_time") is None:
            return {}
        out = {"ttft": t["first_token_time"] - t["arrival_time"], "e2e": t["last_token_time"] - t["arrival_time"]}
        n = len(self.outputs[0].token_ids)
        if n > 1:
            out["tpot"] = (t["last_token_time"] - t["first_token_time"]) / (n - 1)
        return out

    @property
    def cached_tokens(self) -> int:
        return self._req.reused_tokens

    def __aiter__(self) -> AsyncIterator[RequestOutput]:
        return self._aiter()

    async def _aiter(self) -> AsyncIterator[RequestOutput]:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[bool] = asyncio.Queue()
        with self._lock:
            done = self._done.is_set()
            if not done:
                self._stream = (loop, queue)
        if done:
            yield self._raise_if_failed()
            return
        while True:
            final = await queue.get()
            if final:
                self._sent_tokens = len(self.outputs[0].token_ids)
                yield self._raise_if_failed()
                return
            with self._llm._lock:
                ids = list(self._req.output_ids)
            if len(ids) >= self._req.max_tokens or self._done.is_set():
                # The engine ran ahead of this loop (a stalled loop, a slow consumer) and the request is done:
                # its final response, already queued, carries these tokens. Yielding them here too would send
                # one step with nothing new (TensorRT-LLM sends each token once, the last in the final one).
                continue
            if len(ids) > self._sent_tokens:
                self._sent_tokens = len(ids)
                self.outputs[0].token_ids = ids
                self.outputs[0].text = self._llm.tokenizer.decode(ids)
                yield self


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Any, *args: Any) -> None:
    """Hand a result to the caller's loop. A loop that has closed since (a caller that gave up waiting) is
    no error of the engine's: the result is dropped there, and the engine thread goes on serving the rest."""
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:
        pass


def _resolve(fut: asyncio.Future[RequestOutput], value: RequestOutput) -> None:
    if not fut.done():
        fut.set_result(value)


class _DrainOnce:
    """An async iterable over a drain-once queue, like TensorRT-LLM's ``IterationResult``: yields what is
    queued; when nothing is, waits up to ``timeout`` for more, then ends."""

    def __init__(self, take: Any, timeout: float | None):
        self._take = take
        self._timeout = 2.0 if timeout is None else timeout

    def __aiter__(self) -> AsyncIterator[dict[str, Any]]:
        return self._gen()

    async def _gen(self) -> AsyncIterator[dict[str, Any]]:
        items = self._take()
        deadline = time.monotonic() + self._timeout
        while not items and time.monotonic() < deadline:
            await asyncio.sleep(min(0.01, self._timeout))
            items = self._take()
        for item in items:
            yield item

    async def take_batch(self) -> list[dict[str, Any]]:
        """What iterating would yield, as one list (kvtop's poller takes a drain so: one batch of records for the
        fold, not an async step per item); waits as iterating does."""
        items = self._take()
        deadline = time.monotonic() + self._timeout
        while not items and time.monotonic() < deadline:
            await asyncio.sleep(min(0.01, self._timeout))
            items = self._take()
        return items


class SimLLM:
    """A TensorRT-LLM ``LLM`` whose KV cache manager is simulated exactly and whose GPU is a cost model."""

    # generate_async takes a prompt as TokenRuns too (kvtop's driver hands a trace's prompts so; the block manager
    # cuts it into the keys of the equal list, and its outputs are those kvtop sim --trace gives it)
    takes_token_runs = True

    @property
    def trusted_records(self) -> bool:
        """Its stats and KV events are dicts kvtop made in this process, already in the form ``records.make`` gives
        them (``kv_event_token_ids``): kvtop's poller makes their records without the checks an outside engine's
        dicts need (kvtop.records.trusted_record; tests/engines/sim/test_sim_llm.py holds the two paths equal on a
        driven run's every stat and event)."""
        return self._kv_event_token_ids

    def __init__(self, model: str | ModelShape = "Qwen/Qwen3-8B", *, kv_cache_config: KvCacheConfig | None = None,
                 max_batch_size: int = 2048, max_num_tokens: int = 8192, max_seq_len: int | None = None,
                 enable_iter_perf_stats: bool = False, enable_iter_req_stats: bool = False,
                 return_perf_metrics: bool = False, gpu: str | GpuProfile = "H200", speed: float = 1.0,
                 tokenizer: Tokenizer | str | None = None, max_stats_len: int = 1000, trtllm_version: str = "1.2",
                 scheduler_config: SchedulerConfig | None = None, tensor_parallel_size: int = 1,
                 kv_event_token_ids: bool = False, pace_to_event_drains: bool = False,
                 max_input_len: int | None = 1024, **unsupported: Any):
        """``max_input_len`` (TensorRT-LLM's LLM argument, default 1,024 as its BuildConfig / LlmArgs): where the
        emulated version caps it (kvtop.engines.sim.core.PAUSE_CAPS_PROMPT), the most prompt a request paused by
        MAX_UTILIZATION resumes with; None: no cap.

        ``kv_event_token_ids`` (kvtop's own driven session, runner.build_sim_engine): a stored event's blocks
        carry their tokens as ``"token_ids": [ids]`` instead of TensorRT-LLM's token dicts, the form every reader
        of records puts them in (kvtop.compact.read_event), so that the ~32 dicts a block are never built only to
        be read back into ids; off, the events are TensorRT-LLM's as they are.

        ``pace_to_event_drains`` (kvtop's driven session too): at ``speed=0`` the engine waits, before a step,
        for the KV events to be taken while its buffer is over half full (at most ``EVENT_DRAIN_WAIT_S`` a step),
        so that a reader that keeps draining loses none: flat out, the engine filled the buffer faster than a
        driven session folds it and dropped most of a trace's events. The iteration stats likewise, once they have
        been read: their queue keeps ``max_stats_len``, and an engine that ran ~1,000 steps between two drains lost
        the oldest (a driven trace run's ``quality.stats_iterations_missing``). Off (TensorRT-LLM's way, and a
        script's SimLLM that never reads its events), a full buffer drops the oldest."""
        if unsupported:
            # TensorRT-LLM's args are strict pydantic models: an unknown name is an error, not a silent no-op.
            raise TypeError(f"SimLLM: unsupported argument(s): {', '.join(sorted(unsupported))}")
        if speed < 0:
            raise ValueError(f"speed: must be >= 0 (0 = as fast as possible), got {speed}")
        self.model: ModelShape = model if isinstance(model, ModelShape) else resolve_model(model)
        self.gpu: GpuProfile = gpu if isinstance(gpu, GpuProfile) else resolve_gpu(gpu)
        self.kv_cache_config = kv_cache_config or KvCacheConfig()
        self.not_modelled: list[str] = []  # what requests asked for that the simulator does not model
        self.scheduler_config = scheduler_config or SchedulerConfig()
        policy = self.scheduler_config.capacity_scheduler_policy
        self.capacity_scheduler_policy = policy.value if isinstance(policy, CapacitySchedulerPolicy) else str(policy)
        kvc = self.kv_cache_config
        # KvCacheConfig.dtype: "auto" keeps the checkpoint's KV dtype (FP8 for FP8 checkpoints), "fp8" etc. set it.
        self.model = self.model.with_kv_cache_dtype(kvc.dtype)
        self.tensor_parallel_size = tensor_parallel_size
        tpb = kvc.tokens_per_block
        self.tokens_per_block = tpb
        self.speed = speed
        self.return_perf_metrics = return_perf_metrics
        self.max_seq_len = max_seq_len or getattr(self.model, "max_position_embeddings", None) or 40960
        self.primary_blocks = primary_blocks(self.model, self.gpu, tpb, max_tokens=kvc.max_tokens,
                                             free_gpu_memory_fraction=kvc.free_gpu_memory_fraction or 0.9,
                                             tensor_parallel_size=tensor_parallel_size, max_num_tokens=max_num_tokens)
        self.secondary_blocks = secondary_blocks(self.model, tpb, kvc.host_cache_size or 0)
        self.bytes_per_block = self.model.kv_bytes_per_block(tpb)
        window = min(kvc.max_attention_window) if kvc.max_attention_window else self.max_seq_len
        self._clock_s = 0.0
        self.block_manager = BlockManager(
            self.primary_blocks, self.secondary_blocks, tpb,
            enable_partial_reuse=kvc.enable_partial_reuse, copy_on_partial_reuse=kvc.copy_on_partial_reuse,
            onboard_blocks=kvc.onboard_blocks, secondary_offload_min_priority=kvc.secondary_offload_min_priority,
            event_buffer_max_size=kvc.event_buffer_max_size if kvc.enable_block_reuse else 0,
            clock_ms=lambda: self._core.now_s * 1000.0, window_size=window,
            enable_block_reuse=kvc.enable_block_reuse, event_token_ids=kv_event_token_ids)
        gpu_mem = (self.model.weight_bytes + runtime_reserve_bytes(self.model, max_num_tokens)
                   + self.primary_blocks * self.bytes_per_block)
        self._core = SimEngineCore(self.model, self.gpu, self.block_manager, max_batch_size=max_batch_size,
                                   max_num_tokens=max_num_tokens, max_seq_len=self.max_seq_len,
                                   enable_iter_perf_stats=enable_iter_perf_stats,
                                   enable_iter_req_stats=enable_iter_req_stats, max_stats_len=max_stats_len,
                                   gpu_mem_usage_bytes=gpu_mem, epoch_s=time.time(),
                                   trtllm_version=trtllm_version,
                                   capacity_scheduler_policy=self.capacity_scheduler_policy,
                                   tensor_parallel_size=tensor_parallel_size, max_input_len=max_input_len)
        self.trtllm_version = trtllm_version
        if isinstance(tokenizer, str) or tokenizer is None:
            self.tokenizer: Tokenizer = load_tokenizer(self.model.name, self.model.vocab_size,
                                                        prefer_hf=tokenizer == "auto")
        else:
            self.tokenizer = tokenizer
        self._ids = itertools.count(1)
        self._lock = threading.RLock()  # the engine's state: held for a step, a drain of stats or events
        self._pending_lock = threading.Lock()  # _pending and request ids alone
        self._wake = threading.Event()  # set after a request is queued, or at shutdown
        self._lock_wanted = threading.Event()  # set by a drain about to wait for the engine lock
        self._pace_to_event_drains = pace_to_event_drains
        self._kv_event_token_ids = kv_event_token_ids
        self._events_taken = threading.Event()  # set by each drain of the KV events or the stats
        # called (from the engine thread) as pace_to_event_drains starts waiting for a drain: kvtop's poller starts
        # one at once instead of at its next interval (notify_drain_wanted)
        self._drain_wanted: Callable[[], None] | None = None
        self._stats_read = False  # the stats have been drained once: pace_to_event_drains waits for them too
        self._pending: list[tuple[SimRequest, RequestOutput]] = []
        self._outputs: dict[int, RequestOutput] = {}
        self._finished: list[int] = []  # request ids finished since the engine thread last dropped their outputs
        self._shutdown = False
        self._wall0 = time.monotonic()
        self._thread = threading.Thread(target=self._run, name="kvtop-simllm", daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------------------------------ info

    def describe(self) -> dict[str, Any]:
        """What kvtop's ``meta`` record says about this engine."""
        return {
            "engine": ENGINE_NAME,
            "engine_version": ENGINE_VERSION.replace("1.2", self.trtllm_version),
            "model": self.model.name,
            "gpu": self.gpu.name,
            "tokens_per_block": self.tokens_per_block,
            "primary_blocks": self.primary_blocks,
            "secondary_blocks": self.secondary_blocks,
            "bytes_per_block": self.bytes_per_block,
            "host_cache_bytes": self.kv_cache_config.host_cache_size or 0,
            "speed": self.speed,
            "capacity_scheduler_policy": self.capacity_scheduler_policy,
            "not_modelled": list(self.not_modelled),
            "simulated": True,
        }

    @property
    def sim_time_s(self) -> float:
        return self._core.now_s

    # ------------------------------------------------------------------------------------------ requests

    def _encode(self, inputs: Any) -> tuple[Sequence[int], str | None]:
        if isinstance(inputs, TokenRuns):  # immutable, its ids checked when it was made: taken as it is
            return inputs, None
        if isinstance(inputs, str):
            return self.tokenizer.encode(inputs), inputs
        if isinstance(inputs, dict):
            if "prompt_token_ids" in inputs:
                return [int(t) for t in inputs["prompt_token_ids"]], None
            if "prompt" in inputs:
                return self.tokenizer.encode(str(inputs["prompt"])), str(inputs["prompt"])
        # the types present, from C (map): a generator testing each of a 15,000-token prompt's ids was a tenth of a
        # driven trace replay
        if isinstance(inputs, Sequence) and set(map(type, inputs)) <= _INT_TYPE:
            return list(inputs), None
        if isinstance(inputs, Sequence) and all(isinstance(t, int) and not isinstance(t, bool) for t in inputs):
            return list(inputs), None  # int subclasses other than bool (numpy's are not Python ints)
        raise TypeError(f"inputs: expected text, a list of token ids, or a dict with 'prompt'/'prompt_token_ids', "
                        f"got {type(inputs).__name__}")

    def generate_async(self, inputs: Any, sampling_params: SamplingParams | None = None,
                       lora_request: Any = None, prompt_adapter_request: Any = None, streaming: bool = False,
                       kv_cache_retention_config: KvCacheRetentionConfig | None = None,
                       **kwargs: Any) -> RequestOutput:
        if self._shutdown:
            raise RuntimeError("SimLLM has been shut down")
        sp = sampling_params or SamplingParams()
        prompt_ids, prompt = self._encode(inputs)
        note = kv_cache_retention_config.not_modelled() if kv_cache_retention_config is not None else None
        if note is not None and note not in self.not_modelled:
            # said once per distinct config, where a script sees it (stderr) and in describe() (the meta record)
            self.not_modelled.append(note)
            warnings.warn(f"kvtop simulator: {note}", stacklevel=2)
        # The queue's own lock, not the engine's: a caller never waits for an engine step to end (the engine
        # thread took the engine lock back before a waiting caller woke, and an asyncio driver's loop stalled in
        # here for most of a driven trace replay, its poller with it).
        with self._pending_lock:
            req = SimRequest(next(self._ids), prompt_ids, sp.max_tokens,  # type: ignore[arg-type]
                             arrival_s=self._now_for_arrival(),
                             retention=kv_cache_retention_config)
            out = RequestOutput(self, req, prompt, streaming)
            req.on_token = out._on_token
            req.on_finish = out._on_finish
            self._pending.append((req, out))
        self._wake.set()
        return out

    def generate(self, inputs: Any, sampling_params: SamplingParams | None = None,
                 kv_cache_retention_config: KvCacheRetentionConfig | list[KvCacheRetentionConfig] | None = None,
                 **kwargs: Any) -> Any:
        single = isinstance(inputs, str) or (isinstance(inputs, Sequence) and inputs
                                             and isinstance(inputs[0], int))
        batch = [inputs] if single else list(inputs)
        cfgs = (kv_cache_retention_config if isinstance(kv_cache_retention_config, list)
                else [kv_cache_retention_config] * len(batch))
        outs = [self.generate_async(p, sampling_params, kv_cache_retention_config=c) for p, c in zip(batch, cfgs)]
        results = [o.result() for o in outs]
        return results[0] if single else results

    def _now_for_arrival(self) -> float:
        if self.speed > 0:
            return max(self._core.now_s, (time.monotonic() - self._wall0) * self.speed)
        return self._core.now_s

    def _perf_metrics(self, req: SimRequest) -> dict[str, Any]:
        """``RequestPerfMetrics`` as TensorRT-LLM reports it (times in seconds of simulated time)."""
        reused, missed = req.reused_blocks, req.missed_blocks
        return {
            "first_iter": req.first_iter, "last_iter": req.last_iter,
            "timing_metrics": {"arrival_time": req.arrival_s, "first_scheduled_time": req.scheduled_s,
                               "first_token_time": req.first_token_s, "last_token_time": req.last_token_s},
            "kv_cache_metrics": {"num_total_allocated_blocks": req.alloc_total_blocks,
                                 "num_new_allocated_blocks": req.alloc_new_blocks,
                                 "num_reused_blocks": reused, "num_missed_blocks": missed,
                                 "kv_cache_hit_rate": reused / (reused + missed) if reused > 0 else 0.0,
                                 # simulator-only: which reused blocks came back from host memory
                                 "num_onboarded_blocks": req.onboarded_blocks},
            "prompt_tokens": req.prompt_len, "reused_tokens": req.reused_tokens, "error": req.error,
        }

    # ------------------------------------------------------------------------------------------ engine thread

    def _run(self) -> None:
        core = self._core
        while True:
            self._wake.clear()  # a request queued from here on sets it again
            if self._pace_to_event_drains and self.speed == 0 and not self._shutdown:
                self._wait_for_event_drain()
            with self._lock:
                with self._pending_lock:
                    pending, self._pending = self._pending, []
                for req, out in pending:
                    self._outputs[req.request_id] = out
                    core.submit(req)
                if self._shutdown:
                    break
                runnable = core.has_runnable()
                if runnable:
                    core.step()
                    sim_now = core.now_s
                if self._finished:
                    # the outputs finished since (a scan of every output each step was 5% of a driven trace
                    # replay's CPU with 3,000 requests queued)
                    for rid in self._finished:
                        self._outputs.pop(rid, None)
                    self._finished.clear()
            if not runnable:
                self._wake.wait(0.05 if core.waiting else 0.5)
                if self.speed > 0:  # idle time passes on the simulated clock too
                    with self._lock:
                        core.now_s = max(core.now_s, (time.monotonic() - self._wall0) * self.speed)
                continue
            if self.speed > 0:
                lag = sim_now / self.speed - (time.monotonic() - self._wall0)
                if lag > 0:
                    time.sleep(min(lag, 0.5))
            elif self._lock_wanted.is_set():
                # A drain of events or stats waits for the engine lock: let it have it (released and taken straight
                # back by this thread, the lock went to it again and again, and the drains fell behind the engine,
                # whose event buffer then dropped events). Only then: each yield hands the GIL over for a while.
                self._lock_wanted.clear()
                time.sleep(0)
        with self._lock:
            for req in list(core.waiting) + list(core.running):
                core._fail(req, "the engine was shut down")
            core.waiting.clear()
            core.running.clear()

    # ------------------------------------------------------------------------------------------ telemetry

    def _take_stats(self) -> list[dict[str, Any]]:
        self._lock_wanted.set()
        with self._lock:
            stats = self._core.take_stats()
        self._stats_read = True
        self._events_taken.set()
        return stats

    def _take_events(self) -> list[dict[str, Any]]:
        self._lock_wanted.set()
        with self._lock:
            events = self.block_manager.take_events()
        self._events_taken.set()
        return events

    def _wait_for_event_drain(self) -> None:
        """``pace_to_event_drains``: while the event buffer is over half full, or the iteration stats queue is (when
        stats are on: it keeps ``max_stats_len``, the oldest dropped), wait for a drain (a bounded wait: a reader
        that stopped reading costs at most ``EVENT_DRAIN_WAIT_S`` a step, then events drop as before)."""
        bm = self.block_manager
        limit = bm._event_buffer_max_size // 2
        stats = self._core.stats
        stats_limit = (stats.maxlen or 0) // 2 if self._stats_read else None

        def behind() -> bool:
            return bm.buffered_events() > limit or (stats_limit is not None and len(stats) > stats_limit)

        if not behind():
            return
        wanted = self._drain_wanted
        if wanted is not None:
            # Say so to the reader: a driven trace run waited here ~5 s of its 14 s (1,000 requests) while the
            # poller slept out its interval, neither thread running. A callback that fails is the reader's
            # problem, not the engine's: the wait goes on as a plain bounded one.
            try:
                wanted()
            except Exception:
                pass
        deadline = time.monotonic() + EVENT_DRAIN_WAIT_S
        while behind() and not self._shutdown:
            self._events_taken.clear()
            left = deadline - time.monotonic()
            if left <= 0 or not self._events_taken.wait(left):
                return

    def notify_drain_wanted(self, callback: Callable[[], None] | None) -> None:
        """``callback()`` (None: no more) is called from the engine thread each time ``pace_to_event_drains`` starts
        waiting for its events or stats to be taken; it must not block (kvtop's poller hands it to its loop with
        ``call_soon_threadsafe`` and drains at once). The wait stays bounded as before, called back or not."""
        self._drain_wanted = callback

    def _wait_for(self, take: Any, timeout: float | None) -> list[dict[str, Any]]:
        deadline = time.monotonic() + (2.0 if timeout is None else timeout)
        items = take()
        while not items and time.monotonic() < deadline:
            time.sleep(0.01)
            items = take()
        return items

    def get_stats(self, timeout: float | None = 2) -> list[dict[str, Any]]:
        """Iteration stats since the last call (drained once). Empty unless ``enable_iter_perf_stats``."""
        return self._wait_for(self._take_stats, timeout)

    def get_stats_async(self, timeout: float | None = 2) -> _DrainOnce:
        return _DrainOnce(self._take_stats, timeout)

    def get_kv_cache_events(self, timeout: float | None = 2) -> list[dict[str, Any]]:
        """KV cache events since the last call (drained once). Empty unless ``event_buffer_max_size > 0``."""
        return self._wait_for(self._take_events, timeout)

    def get_kv_cache_events_async(self, timeout: float | None = 2) -> _DrainOnce:
        return _DrainOnce(self._take_events, timeout)

    # ------------------------------------------------------------------------------------------ lifecycle

    def wait_idle(self, timeout: float = 60.0) -> bool:
        """Test helper: block until every submitted request has finished."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                if not self._pending and self._core.idle():
                    return True
            time.sleep(0.005)
        return False

    def shutdown(self) -> None:
        with self._lock:
            self._shutdown = True
        self._wake.set()
        if self._thread.is_alive() and threading.current_thread() is not self._thread:
            self._thread.join(timeout=5)

    def __enter__(self) -> SimLLM:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()

    def __del__(self) -> None:
        try:
            self._shutdown = True
        except Exception:
            pass


def kv_cache_config_fields() -> list[str]:
    return [f.name for f in fields(KvCacheConfig)]


__all__ = ["KvCacheConfig", "SamplingParams", "SimLLM", "RequestOutput", "CompletionOutput", "RequestError",
           "ENGINE_NAME", "ENGINE_VERSION"]
