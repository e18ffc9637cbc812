"""The workload driver: sends a scenario's requests through any engine with TensorRT-LLM's ``generate_async``.

Closed loop (keep ``concurrency`` requests in flight) or open loop (Poisson arrivals at ``rate`` per second, or
a trace's own arrival times). Each finished or failed request becomes one ``request`` record; a failure is
recorded with its reason and the run goes on.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

from kvtop.records import Record, SourceId, make
from kvtop.workload.scenarios import RetentionSpec, Scenario, WorkItem


def _get(obj: Any, *path: str) -> Any:
    """Read ``a.b.c`` from TensorRT-LLM objects or from the simulator's dicts alike; None when absent."""
    for key in path:
        if obj is None:
            return None
        obj = obj.get(key) if isinstance(obj, dict) else getattr(obj, key, None)
    return obj


def _seconds(value: Any) -> float | None:
    if value is None:
        return None
    if isinstance(value, timedelta):
        return value.total_seconds()
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


class WorkloadDriver:
    def __init__(self, engine: Any, scenario: Scenario, *, emit: Callable[[Record], None],
                 source: SourceId | None = None, concurrency: int | None = 8, rate: float | None = None,
                 duration_s: float | None = None, max_requests: int | None = None,
                 retention_factory: Callable[[RetentionSpec], Any] | None = None,
                 sampling_factory: Callable[[int], Any] | None = None, seed: int = 0,
                 clock: Callable[[], float] | None = None):
        """``clock``: what the request records are stamped with (the simulator's clock when it is not paced to the
        wall clock, kvtop/runner.py engine_clock); None: the wall clock."""
        if rate is None and not concurrency:
            raise ValueError("the driver needs --concurrency (closed loop) or --rate (open loop)")
        if rate is not None and not rate > 0:
            raise ValueError(f"--rate: must be > 0 requests per second, got {rate}")
        self.engine = engine
        self.scenario = scenario
        self.emit = emit
        self.source = source or SourceId()
        self.clock = clock
        self.concurrency = concurrency or 1
        self.rate = rate
        self.duration_s = duration_s
        self.max_requests = max_requests
        self.retention_factory = retention_factory
        self.sampling_factory = sampling_factory
        self.rng = random.Random(seed ^ 0x5EED)
        self.in_flight = 0
        # the requests in flight, by id: (time.monotonic() at submission, prompt tokens, priority); the requests
        # view lists them (kvtop.session.SessionView.requests_in_flight)
        self.running: dict[int, tuple[float, int, int | None]] = {}
        self.submitted = 0
        # each submitted request's planned arrival, seconds after the run's start (open loop or a trace's times)
        self.planned_arrivals_s: list[float] = []
        self.completed = 0
        self.failed = 0
        self.output_tokens = 0
        self._stop = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self._slot_freed = asyncio.Event()

    def stop(self) -> None:
        self._stop.set()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    async def run(self) -> None:
        start = time.monotonic()
        deadline = start + self.duration_s if self.duration_s else None
        open_loop = self.rate is not None
        # A trace's requests go at their own arrival times, however many are in flight (open loop, as the trace was
        # recorded): capped at --concurrency, a trace of thousands of requests ran 8 at a time, its times ignored.
        timed = self.scenario.timed
        next_arrival = start
        try:
            while not self._stop.is_set():
                if deadline is not None and time.monotonic() >= deadline:
                    break
                if self.max_requests is not None and self.submitted >= self.max_requests:
                    break
                if not open_loop and not timed and self.in_flight >= self.concurrency:
                    await self._wait_slot(deadline)
                    continue
                item = self.scenario.next()
                if item is None:
                    if self.in_flight == 0 and not self._tasks:
                        break  # the scenario is done (a trace ran out)
                    await self._wait_slot(deadline)
                    continue
                if item.arrival_s is not None:
                    next_arrival = start + item.arrival_s
                elif open_loop:
                    assert self.rate is not None
                    next_arrival += self.rng.expovariate(self.rate)
                delay = next_arrival - time.monotonic() if (open_loop or item.arrival_s is not None) else 0
                if delay > 0:
                    try:
                        await asyncio.wait_for(self._stop.wait(), timeout=delay)
                        break
                    except asyncio.TimeoutError:
                        pass
                if open_loop or item.arrival_s is not None:
                    self.planned_arrivals_s.append(next_arrival - start)
                self._submit(item)
            if self._tasks and not self._stop.is_set() and deadline is None:
                await asyncio.gather(*list(self._tasks), return_exceptions=True)
        finally:
            for task in list(self._tasks):
                task.cancel()

    async def _wait_slot(self, deadline: float | None) -> None:
        self._slot_freed.clear()
        timeout = 0.5 if deadline is None else max(0.0, min(0.5, deadline - time.monotonic()))
        stop = asyncio.ensure_future(self._stop.wait())
        freed = asyncio.ensure_future(self._slot_freed.wait())
        await asyncio.wait({stop, freed}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        freed.cancel()

    def _submit(self, item: WorkItem) -> None:
        self.in_flight += 1
        self.submitted += 1
        task = asyncio.ensure_future(self._one(item, self.submitted))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _one(self, item: WorkItem, seq: int) -> None:
        submitted = time.monotonic()
        self.running[seq] = (submitted, len(item.prompt_ids), item.retention.priority)
        data: dict[str, Any] = {"request_id": seq, "ok": False, "prompt_tokens": len(item.prompt_ids),
                                "priority": item.retention.priority, "label": item.label,
                                "scenario": self.scenario.name}
        output_ids: list[int] | None = None
        try:
            retention = (self.retention_factory(item.retention)
                         if self.retention_factory and not item.retention.is_default() else None)
            sampling = self.sampling_factory(item.max_tokens) if self.sampling_factory else None
            prompt = item.prompt_ids
            if prompt.__class__ is not list and not getattr(self.engine, "takes_token_runs", False):
                prompt = list(prompt)   # a trace's TokenRuns: TensorRT-LLM takes a list of ids
            out = self.engine.generate_async(prompt, sampling, kv_cache_retention_config=retention)
            res = await out.aresult() if hasattr(out, "aresult") else await out
            completion = res.outputs[0]
            output_ids = list(completion.token_ids)
            perf = getattr(completion, "request_perf_metrics", None)
            arrival = _seconds(_get(perf, "timing_metrics", "arrival_time"))
            first = _seconds(_get(perf, "timing_metrics", "first_token_time"))
            last = _seconds(_get(perf, "timing_metrics", "last_token_time"))
            data.update(ok=True, output_tokens=len(output_ids),
                        ttft_s=(first - arrival) if first is not None and arrival is not None else None,
                        e2e_s=(last - arrival) if last is not None and arrival is not None
                        else time.monotonic() - submitted,
                        reused_blocks=_get(perf, "kv_cache_metrics", "num_reused_blocks"),
                        missed_blocks=_get(perf, "kv_cache_metrics", "num_missed_blocks"),
                        host_hit_blocks=_get(perf, "kv_cache_metrics", "num_onboarded_blocks"),
                        reused_tokens=getattr(res, "cached_tokens", None))
            self.completed += 1
            self.output_tokens += len(output_ids)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # one failed request never ends the run
            data.update(ok=False, error=f"{type(exc).__name__}: {exc}", e2e_s=time.monotonic() - submitted)
            self.failed += 1
        finally:
            self.in_flight -= 1
            self.running.pop(seq, None)
            self._slot_freed.set()
        self.scenario.on_result(item, output_ids)
        self.emit(make("request", data, self.source, None if self.clock is None else self.clock()))
