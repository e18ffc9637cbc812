"""Sources: the engine poller (against small fake engines), NVML (no driver for real; a fake NVML module for
the field mapping) and host memory (psutil, for real)."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any

import pytest

from kvtop.compact import read_form
from kvtop.records import Record, SourceId, decode, encode
from kvtop.sources.host import HOST_FIELDS, HostSource
from kvtop.sources.nvml import GPU_FIELDS, NvmlSource
from kvtop.sources.poller import EnginePoller

SRC = SourceId(host="test", rank=0, run="t")

STATS = {"iter": 7, "gpuMemUsage": 76665782272, "numActiveRequests": 1,
         "kvCacheStats": {"maxNumBlocks": 101256, "freeNumBlocks": 101253, "usedNumBlocks": 3,
                          "tokensPerBlock": 32, "allocTotalBlocks": 3126, "allocNewBlocks": 3126,
                          "reusedBlocks": 4, "missedBlocks": 3121, "cacheHitRate": 0.00128}}
CREATED = {"event_id": 0, "data": {"type": "created", "num_blocks_per_cache_level": [2231, 512]},
           "window_size": 256}
STORED = {"event_id": 1, "window_size": 256,
          "data": {"type": "stored", "parent_hash": None,
                   "blocks": [{"type": "stored_block", "block_hash": 9622824665191806685,  # >= 2^63
                               "tokens": [{"type": "unique_token", "token_id": 1, "token_extra_id": 0}],
                               "cache_level": 0, "priority": 35}]}}


# ------------------------------------------------------------------------------------------ fake engines


class BatchDrain:
    """A drain that hands its items over as one list (``take_batch``, as kvtop's simulator does)."""

    def __init__(self, queue: deque[Any]):
        self.queue = queue

    def __aiter__(self) -> Any:
        raise AssertionError("the poller takes a batch drain whole")

    async def take_batch(self) -> list[Any]:
        out = list(self.queue)
        self.queue.clear()
        return out


class BatchEngine:
    def __init__(self, stats: Sequence[Any] = (), events: Sequence[Any] = (), trusted: bool = False):
        self.stats: deque[Any] = deque(stats)
        self.events: deque[Any] = deque(events)
        self.trusted_records = trusted

    def get_stats_async(self, timeout: float = 2) -> BatchDrain:
        return BatchDrain(self.stats)

    def get_kv_cache_events_async(self, timeout: float = 2) -> BatchDrain:
        return BatchDrain(self.events)


class Drain:
    """An async iterable over a queue, ending when the queue is empty (like a drained IterationResult).

    Counts how many drains of its method are running at once, to prove polls never overlap.
    """

    def __init__(self, engine: FakeEngine, method: str, queue: deque[Any]):
        self.engine, self.method, self.queue = engine, method, queue
        self.started = False

    def __aiter__(self) -> Drain:
        return self

    async def __anext__(self) -> Any:
        eng = self.engine
        if not self.started:
            self.started = True
            eng.calls[self.method] += 1
            eng.call_times[self.method].append(time.monotonic())
        # "Concurrent calls": awaits on this method in progress at the same time, over all drains.
        eng.active[self.method] += 1
        eng.max_active[self.method] = max(eng.max_active[self.method], eng.active[self.method])
        try:
            if eng.delay_s:
                await asyncio.sleep(eng.delay_s)
            if eng.hang is not None:
                await eng.hang.wait()
            if not self.queue:
                raise StopAsyncIteration
            return self.queue.popleft()
        finally:
            eng.active[self.method] -= 1


class FakeEngine:
    """The part of TensorRT-LLM's LLM the poller uses, over two in-memory queues."""

    def __init__(self, stats: Sequence[Any] = (), events: Sequence[Any] = (), delay_s: float = 0.0,
                 hang: bool = False):
        self.stats: deque[Any] = deque(stats)
        self.events: deque[Any] = deque(events)
        self.delay_s = delay_s
        self.hang = asyncio.Event() if hang else None
        names = ("stats", "events")
        self.calls = dict.fromkeys(names, 0)
        self.active = dict.fromkeys(names, 0)
        self.max_active = dict.fromkeys(names, 0)
        self.call_times: dict[str, list[float]] = {n: [] for n in names}
        self.timeouts: list[float] = []

    def get_stats_async(self, timeout: float = 2) -> Drain:
        self.timeouts.append(timeout)
        return Drain(self, "stats", self.stats)

    def get_kv_cache_events_async(self, timeout: float = 2) -> Drain:
        return Drain(self, "events", self.events)


class FailingStatsEngine(FakeEngine):
    failing = True

    def get_stats_async(self, timeout: float = 2) -> Drain:
        if not self.failing:
            return super().get_stats_async(timeout)
        self.calls["stats"] += 1
        self.call_times["stats"].append(time.monotonic())
        raise RuntimeError("executor is down")


class SyncEventsEngine:
    """Has the async stats method but only the blocking events method (run in a thread by the poller)."""

    def __init__(self, events: list[Any], block_s: float = 0.0):
        self.stats: deque[Any] = deque()
        self.events = list(events)
        self.block_s = block_s
        self.lock = threading.Lock()
        self.active = 0
        self.max_active = 0
        self.calls = 0
        self.threads: set[int] = set()

    def get_stats_async(self, timeout: float = 2) -> Drain:
        return Drain(FakeEngine(), "stats", self.stats)

    def get_kv_cache_events(self, timeout: float = 2) -> list[Any]:
        with self.lock:
            self.calls += 1
            self.active += 1
            self.max_active = max(self.max_active, self.active)
            self.threads.add(threading.get_ident())
        try:
            time.sleep(self.block_s)
            out, self.events = self.events, []
            return out
        finally:
            with self.lock:
                self.active -= 1


class LatchingResult:
    """TensorRT-LLM 1.x's IterationResult: one long-lived object; once a drain ends it stays done until
    mark_undone() (which generate_async calls on every new prompt)."""

    def __init__(self) -> None:
        self.queue: deque[Any] = deque()
        self.done = False
        self.undone_calls = 0

    def mark_undone(self) -> None:
        self.undone_calls += 1
        self.done = False

    def __aiter__(self) -> LatchingResult:
        return self

    async def __anext__(self) -> Any:
        if self.done:
            raise StopAsyncIteration
        if not self.queue:
            self.done = True
            raise StopAsyncIteration
        return json.dumps(self.queue.popleft())  # the real one json.loads; strings must work too


class LatchingEngine:
    def __init__(self) -> None:
        self.result = LatchingResult()

    def get_stats_async(self, timeout: float = 2) -> LatchingResult:
        return self.result


class Collector:
    def __init__(self) -> None:
        self.records: list[Record] = []
        self.errors: list[tuple[str, str]] = []

    def __call__(self, record: Record) -> None:
        self.records.append(record)

    def on_error(self, name: str, message: str) -> None:
        self.errors.append((name, message))

    def kinds(self, kind: str) -> list[Record]:
        return [r for r in self.records if r.kind == kind]


def poller(engine: Any, col: Collector, **kw: Any) -> EnginePoller:
    kw.setdefault("interval_s", 0.01)
    return EnginePoller(engine, SRC, sink=col, on_error=col.on_error, clock=lambda: 1764430000.5, **kw)


async def run_for(p: EnginePoller, seconds: float) -> None:
    task = asyncio.create_task(p.run())
    await asyncio.sleep(seconds)
    p.stop()
    await asyncio.wait_for(task, 1.0)


# ------------------------------------------------------------------------------------------ poller


async def test_dicts_and_json_strings_become_verbatim_records() -> None:
    eng = FakeEngine(stats=[STATS, json.dumps({**STATS, "iter": 8}), json.dumps(STATS).encode()],
                     events=[CREATED, STORED])
    col = Collector()
    res = await poller(eng, col).poll_once()
    assert (res.stats, res.kv_events, res.bad, res.failed) == (3, 2, 0, [])
    stats = col.kinds("stats")
    assert [r.data["iter"] for r in stats] == [7, 8, 7]
    assert stats[0].data == STATS  # verbatim
    events = col.kinds("kv_event")
    assert [e.data for e in events] == [CREATED, read_form(STORED)]   # plain tokens as their ids, as decode gives
    assert events[1].data["data"]["blocks"][0]["block_hash"] == 9622824665191806685
    assert events[1].data["data"]["blocks"][0]["token_ids"] == [1]
    assert all(r.source == SRC and r.time == 1764430000.5 for r in col.records)
    assert decode(encode(events[1])).data == events[1].data  # survives the codec
    assert col.errors == []
    assert eng.timeouts == [0.05]  # a short drain timeout: TensorRT-LLM waits this long after the last item


async def test_malformed_items_are_counted_and_reported_once_per_poll() -> None:
    eng = FakeEngine(stats=["{not json", STATS, "[1, 2]"], events=[{"event_id": 3, "data": {"type": "moved"}}])
    col = Collector()
    p = poller(eng, col)
    res = await p.poll_once()
    assert (res.stats, res.bad) == (1, 3)
    assert p.bad_items == 3
    names = sorted(name for name, _ in col.errors)
    assert names == ["engine.kv_events", "engine.stats"]
    stats_msg = dict(col.errors)["engine.stats"]
    assert "2 malformed stats" in stats_msg and "must be an object" in stats_msg
    assert res.failed == []  # bad input is not a failing source: no backoff
    assert all(s.failures == 0 and s.due == 0.0 for s in p.streams)


async def test_a_batch_drain_goes_to_sink_many_in_one_call_its_bad_items_named() -> None:
    """An engine whose drain hands over one list (take_batch): the poll's records of a stream go to sink_many in one
    call, the same records the item-by-item path gives; a malformed item is counted and said as there."""
    eng = BatchEngine(stats=["{not json", STATS], events=[CREATED, STORED, {"event_id": 3, "data": {"type": "moved"}}])
    col = Collector()
    calls: list[list[Record]] = []
    p = poller(eng, col, sink_many=calls.append)
    res = await p.poll_once()
    assert (res.stats, res.kv_events, res.bad) == (1, 2, 2)
    assert col.records == []   # all through sink_many, one call per stream
    assert sorted(len(c) for c in calls) == [1, 2]
    by_kind = {c[0].kind: c for c in calls}
    assert by_kind["stats"][0].data == STATS
    assert [r.data for r in by_kind["kv_event"]] == [CREATED, read_form(STORED)]
    assert sorted(name for name, _ in col.errors) == ["engine.kv_events", "engine.stats"]
    assert "1 malformed kv_events item(s)" in dict(col.errors)["engine.kv_events"]
    # without sink_many, the same records one by one
    eng2 = BatchEngine(stats=[STATS], events=[CREATED, STORED])
    col2 = Collector()
    await poller(eng2, col2).poll_once()
    assert sorted((r.kind, repr(r.data)) for r in col2.records) == sorted(
        (r.kind, repr(r.data)) for c in calls for r in c)


async def test_a_trusted_engines_dicts_become_records_unchecked() -> None:
    """trusted_records (kvtop's own simulator in this process): each dict is the record's data as it is, at one
    clock reading; an engine that does not say so has its dicts checked and put in read form."""
    eng = BatchEngine(events=[CREATED, STORED], trusted=True)
    calls: list[list[Record]] = []
    await poller(eng, Collector(), sink_many=calls.append).poll_once()
    [records] = calls
    assert [r.data for r in records] == [CREATED, STORED] and records[1].data is STORED   # not put in read form
    assert all(r.source == SRC and r.time == 1764430000.5 and r.v == 1 for r in records)
    calls.clear()
    await poller(BatchEngine(events=[STORED]), Collector(), sink_many=calls.append).poll_once()
    assert calls[0][0].data == read_form(STORED) != STORED
    # with sink_events (Session.emit_kv_events), a trusted drain's events go there as the dicts, the stats as records
    drains: list[tuple[SourceId, float, list[Any]]] = []
    calls.clear()
    eng = BatchEngine(stats=[STATS], events=[CREATED, STORED], trusted=True)
    res = await poller(eng, Collector(), sink_many=calls.append,
                       sink_events=lambda *a: drains.append(a)).poll_once()
    assert drains == [(SRC, 1764430000.5, [CREATED, STORED])] and drains[0][2][1] is STORED
    assert [[r.kind for r in c] for c in calls] == [["stats"]] and (res.stats, res.kv_events) == (1, 2)


async def test_events_disabled_empty_forever_is_fine() -> None:
    eng = FakeEngine(stats=[STATS])
    col = Collector()
    p = poller(eng, col)
    await run_for(p, 0.1)
    assert len(col.kinds("stats")) == 1 and col.kinds("kv_event") == []
    assert col.errors == [] and p.errors == 0
    assert eng.calls["events"] >= 3


async def test_polls_never_overlap_with_a_slow_engine() -> None:
    # Each drain takes ~40 ms (two items and the end, 13 ms each), the interval is 1 ms: a naive timer would
    # start ~40 overlapping drains per slow one.
    eng = FakeEngine(stats=[STATS] * 40, events=[CREATED] * 40, delay_s=0.013)
    col = Collector()
    p = poller(eng, col, interval_s=0.001, max_poll_s=0.02)
    start = time.monotonic()
    await run_for(p, 0.4)
    elapsed = time.monotonic() - start
    assert eng.max_active == {"stats": 1, "events": 1}
    assert 3 <= eng.calls["stats"] <= elapsed / 0.02 + 1
    # max_poll_s ended each drain early, and the next poll continued where it stopped: nothing lost or repeated
    assert [r.data["iter"] for r in col.kinds("stats")] == [7] * len(col.kinds("stats"))
    assert len(col.kinds("stats")) + len(eng.stats) == 40


async def test_a_busy_engine_is_drained_again_at_once() -> None:
    """A poll that drained BUSY_POLL_ITEMS or more is followed by the next at once, not after an interval (a
    simulator at speed 0 waits for its events to be taken, and ran at one buffer a quarter second); a quiet poll
    still waits its interval."""
    from kvtop.sources.poller import BUSY_POLL_ITEMS

    eng = FakeEngine(stats=[STATS] * BUSY_POLL_ITEMS, events=[CREATED] * 3)
    col = Collector()
    p = poller(eng, col, interval_s=30.0)
    task = asyncio.create_task(p.run())
    deadline = time.monotonic() + 10.0
    while eng.calls["stats"] < 2 and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    calls_after_busy = eng.calls["stats"]
    await asyncio.sleep(0.3)  # the second poll drained 0 items: the next one waits its 30 s
    calls_later = eng.calls["stats"]
    p.stop()
    await asyncio.wait_for(task, 1.0)
    assert calls_after_busy == 2 and calls_later == 2
    assert len(col.kinds("stats")) == BUSY_POLL_ITEMS and len(col.kinds("kv_event")) == 3


async def test_endless_stream_is_cut_at_max_poll_s() -> None:
    class Endless:
        def get_stats_async(self, timeout: float = 2) -> Any:
            async def gen() -> Any:
                while True:
                    await asyncio.sleep(0.001)
                    yield STATS
            return gen()

    col = Collector()
    p = poller(Endless(), col, max_poll_s=0.05)
    t0 = time.monotonic()
    res = await p.poll_once()
    assert time.monotonic() - t0 < 0.5
    assert res.stats >= 5 and res.failed == []


async def test_failing_stream_reports_once_and_backs_off_alone() -> None:
    eng = FailingStatsEngine(events=[CREATED])
    col = Collector()
    p = poller(eng, col, interval_s=0.01, max_backoff_s=0.08)
    await run_for(p, 0.6)
    assert col.errors == [("engine.stats", "RuntimeError: executor is down")]  # once per streak
    assert p.errors == eng.calls["stats"] >= 3
    # backoff: 0.02, 0.04, 0.08, 0.08, ... s between attempts, while events are polled every ~10 ms
    assert eng.calls["stats"] <= 13
    assert eng.calls["events"] >= 2 * eng.calls["stats"]
    gaps = [b - a for a, b in zip(eng.call_times["stats"], eng.call_times["stats"][1:])]
    assert gaps[0] >= 0.019 and gaps[1] >= 0.039 and gaps[2] >= 0.079
    assert max(gaps) < 0.08 + 0.06
    assert len(col.kinds("kv_event")) == 1


async def test_backoff_schedule_doubles_and_caps_at_5_s() -> None:
    eng = FailingStatsEngine()
    col = Collector()
    p = poller(eng, col, interval_s=0.25)
    stats = p.streams[0]
    delays = []
    for _ in range(7):
        res = await p.poll_once()
        assert res.failed == ["engine.stats"]
        delays.append(round(stats.due - time.monotonic(), 1))
        stats.due = 0.0  # let the next poll try at once
    assert delays == [0.5, 1.0, 2.0, 4.0, 5.0, 5.0, 5.0]
    assert len(col.errors) == 1
    # recovery resets the streak; a new failure is reported again
    eng.failing = False
    res = await p.poll_once()
    assert res.failed == [] and stats.failures == 0 and stats.due == 0.0
    eng.failing = True
    await p.poll_once()
    assert len(col.errors) == 2


async def test_stop_is_prompt_even_mid_poll() -> None:
    eng = FakeEngine(stats=[STATS], hang=True)  # every drain waits forever
    col = Collector()
    p = poller(eng, col)
    task = asyncio.create_task(p.run())
    await asyncio.sleep(0.05)
    assert eng.active == {"stats": 1, "events": 1}
    t0 = time.monotonic()
    p.stop()
    await asyncio.wait_for(task, 0.5)
    assert time.monotonic() - t0 < 0.1
    assert eng.active == {"stats": 0, "events": 0}  # the hung drains were cancelled
    assert col.errors == []


async def test_stop_from_another_thread_and_before_run() -> None:
    col = Collector()
    p = poller(FakeEngine(), col, interval_s=10.0)  # sleeping between polls when stopped
    task = asyncio.create_task(p.run())
    await asyncio.sleep(0.02)
    t0 = time.monotonic()
    await asyncio.to_thread(p.stop)
    await asyncio.wait_for(task, 0.5)
    assert time.monotonic() - t0 < 0.2
    q = poller(FakeEngine(), col)
    q.stop()
    await asyncio.wait_for(q.run(), 0.5)
    assert q.polls == 0


async def test_sync_events_method_runs_in_a_thread() -> None:
    eng = SyncEventsEngine([CREATED, json.dumps(STORED)])
    col = Collector()
    res = await poller(eng, col).poll_once()
    assert res.kv_events == 2
    assert [r.data for r in col.kinds("kv_event")] == [CREATED, read_form(STORED)]
    assert threading.get_ident() not in eng.threads


async def test_a_stalled_blocking_call_is_reported_and_never_duplicated() -> None:
    eng = SyncEventsEngine([CREATED], block_s=0.25)
    col = Collector()
    p = poller(eng, col, stall_s=0.05, max_backoff_s=0.02)
    await run_for(p, 0.4)
    assert eng.max_active == 1  # later polls waited on the same call instead of starting threads
    assert eng.calls <= 2
    assert col.errors and col.errors[0] == ("engine.kv_events", "no answer within 0.05 s")
    assert [r.data for r in col.kinds("kv_event")] == [CREATED]  # the stalled call's result was not lost


async def test_engine_without_any_events_method_is_said_once() -> None:
    class StatsOnly:
        def __init__(self) -> None:
            self.inner = FakeEngine(stats=[STATS])

        def get_stats_async(self, timeout: float = 2) -> Drain:
            return self.inner.get_stats_async(timeout)

    col = Collector()
    p = poller(StatsOnly(), col)
    await run_for(p, 0.08)
    assert len(col.kinds("stats")) == 1
    assert len(col.errors) == 1 and col.errors[0][0] == "engine.kv_events"
    assert "get_kv_cache_events" in col.errors[0][1]
    assert not p.streams[1].enabled


async def test_async_method_unusable_falls_back_to_the_blocking_one() -> None:
    class NoLoopAtInit:  # an LLM built outside an event loop: its async queue is None
        def get_stats_async(self, timeout: float = 2) -> Any:
            assert None, "The asyncio event loop was not present during initialization"

        def get_stats(self, timeout: float = 2) -> list[Any]:
            return [json.dumps(STATS)]

    col = Collector()
    p = poller(NoLoopAtInit(), col)
    res = await p.poll_once()
    assert res.stats == 1 and res.failed == []
    assert p.streams[0].use_sync
    assert "polling get_stats in a thread" in col.errors[0][1]


async def test_latched_result_is_marked_undone_before_each_drain() -> None:
    eng = LatchingEngine()
    col = Collector()
    p = poller(eng, col)
    eng.result.queue.append(STATS)
    assert (await p.poll_once()).stats == 1
    # more iterations finish while no new prompt is submitted: TensorRT-LLM alone would hide them
    eng.result.queue.extend([{**STATS, "iter": 8}, {**STATS, "iter": 9}])
    assert (await p.poll_once()).stats == 2
    assert [r.data["iter"] for r in col.kinds("stats")] == [7, 8, 9]
    assert eng.result.undone_calls == 2


async def test_a_raising_sink_propagates() -> None:
    def sink(record: Record) -> None:
        raise KeyError("consumer bug")

    p = EnginePoller(FakeEngine(stats=[STATS]), SRC, sink=sink)
    with pytest.raises(KeyError, match="consumer bug"):
        await p.poll_once()
    assert p.errors == 0


async def test_coroutine_and_list_returning_engines() -> None:
    class CoroutineEngine:
        async def get_stats_async(self, timeout: float = 2) -> list[Any]:
            return [STATS]

        def get_kv_cache_events_async(self, timeout: float = 2) -> list[Any]:
            return [CREATED]

    col = Collector()
    res = await poller(CoroutineEngine(), col).poll_once()
    assert (res.stats, res.kv_events) == (1, 1)


# ------------------------------------------------------------------------------------------ NVML


def _nvml_usable() -> bool:
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
        return True
    except Exception:
        return False


@pytest.mark.skipif(_nvml_usable(), reason="this machine has an NVIDIA driver")
def test_no_driver_for_real_gives_one_record_then_silence() -> None:
    src = NvmlSource(source=SRC)
    first = src.sample()
    assert len(first) == 1
    rec = first[0]
    assert rec.kind == "gpu" and rec.source == SRC
    assert rec.data["index"] == -1
    assert rec.data["error"].startswith("no NVIDIA driver")
    assert decode(encode(rec)).data == rec.data
    assert not src.available
    t0 = time.perf_counter()
    assert all(src.sample() == [] for _ in range(1000))
    # no init retry per call: 1000 silent samples cost well under a millisecond each
    assert time.perf_counter() - t0 < 0.05


class NVMLError(Exception):
    pass


class NVMLError_LibraryNotFound(NVMLError):  # noqa: N801 (the binding's own name)
    pass


class FakeNvml:
    """The slice of pynvml NvmlSource uses, with switches to make calls fail."""

    nvmlMemory_v2 = 0x02000028
    NVML_PCIE_UTIL_TX_BYTES = 0
    NVML_PCIE_UTIL_RX_BYTES = 1
    NVML_TEMPERATURE_GPU = 0
    NVMLError = NVMLError
    NVMLError_LibraryNotFound = NVMLError_LibraryNotFound

    def __init__(self, gpus: int = 2, v2: bool = True, fail: tuple[str, ...] = (), init_error: bool = False,
                 procs: list[Any] | None = None):
        self.gpus, self.v2, self.fail, self.init_error = gpus, v2, set(fail), init_error
        self.procs = procs or []
        self.calls: dict[str, int] = {}
        self.inits = 0
        self.shutdowns = 0

    def _count(self, name: str) -> None:
        self.calls[name] = self.calls.get(name, 0) + 1
        if name in self.fail:
            raise NVMLError(f"{name} failed")

    def nvmlInit(self) -> None:
        self.inits += 1
        if self.init_error:
            raise NVMLError_LibraryNotFound("NVML Shared Library Not Found")

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return "580.159.04"

    def nvmlDeviceGetCount(self) -> int:
        return self.gpus

    def nvmlDeviceGetHandleByIndex(self, i: int) -> Any:
        self._count(f"handle{i}")
        return ("h", i)

    def nvmlDeviceGetName(self, h: Any) -> bytes:
        return b"NVIDIA H200"  # old bindings return bytes

    def nvmlDeviceGetUUID(self, h: Any) -> str:
        return f"GPU-0000-{h[1]}"

    def nvmlDeviceGetMemoryInfo(self, h: Any, version: int | None = None) -> Any:
        if version is not None:
            self._count("mem_v2")
            if not self.v2:
                raise NVMLError("Function Not Found")
            return SimpleNamespace(version=version, total=150_754_820_096, reserved=581_042_176,
                                   free=100_000_000_000, used=50_173_777_920)
        self._count("mem_v1")
        return SimpleNamespace(total=150_754_820_096, free=100_000_000_000, used=50_754_820_096)

    def nvmlDeviceGetUtilizationRates(self, h: Any) -> Any:
        self._count("util")
        return SimpleNamespace(gpu=87, memory=41)

    def nvmlDeviceGetPcieThroughput(self, h: Any, counter: int) -> int:
        self._count("pcie")
        return 53_000_000 if counter == 0 else 1_000  # KB/s

    def nvmlDeviceGetComputeRunningProcesses(self, h: Any) -> list[Any]:
        self._count("procs")
        return self.procs if h[1] == 0 else []

    def nvmlDeviceGetTemperature(self, h: Any, sensor: int) -> int:
        self._count("temp")
        return 44

    def nvmlDeviceGetPowerUsage(self, h: Any) -> int:
        self._count("power")
        return 412_345  # mW


def test_fake_nvml_field_mapping_v2() -> None:
    procs = [SimpleNamespace(pid=4242, usedGpuMemory=80 << 30), SimpleNamespace(pid=1, usedGpuMemory=1 << 30)]
    nv = FakeNvml(procs=procs)
    src = NvmlSource(pid=4242, source=SRC, nvml=nv, wall_clock=lambda: 5.0)
    recs = src.sample()
    assert [r.data["index"] for r in recs] == [0, 1]
    d = recs[0].data
    assert set(d) == {"index", "name", "uuid", *GPU_FIELDS}
    assert d["name"] == "NVIDIA H200" and d["uuid"] == "GPU-0000-0"
    assert d["memory_info_version"] == "v2"
    assert (d["memory_total_bytes"], d["memory_used_bytes"], d["memory_reserved_bytes"], d["memory_free_bytes"]) \
        == (150_754_820_096, 50_173_777_920, 581_042_176, 100_000_000_000)
    assert (d["utilization_gpu_pct"], d["utilization_memory_pct"]) == (87, 41)
    assert d["pcie_tx_bytes_per_s"] == 53_000_000 * 1024 and d["pcie_rx_bytes_per_s"] == 1_024_000
    assert d["process_used_bytes"] == 80 << 30 and d["compute_processes"] == 2
    assert d["temperature_c"] == 44 and d["power_w"] == pytest.approx(412.345)
    assert recs[1].data["process_used_bytes"] is None  # the engine is not on GPU 1: unknown, not 0
    assert recs[0].time == 5.0 and recs[0].source == SRC
    assert src.driver_version == "580.159.04"
    assert decode(encode(recs[0])).data == d
    src.sample()
    assert nv.calls["mem_v2"] == 4 and "mem_v1" not in nv.calls
    src.close()
    assert nv.shutdowns == 1


def test_fake_nvml_v2_falls_back_to_v1_and_stops_trying_v2() -> None:
    nv = FakeNvml(gpus=1, v2=False)
    src = NvmlSource(nvml=nv)
    for _ in range(3):
        d = src.sample()[0].data
        assert d["memory_info_version"] == "v1"
        assert d["memory_used_bytes"] == 50_754_820_096 and d["memory_reserved_bytes"] is None
        assert d["memory_total_bytes"] == 150_754_820_096
    assert nv.calls["mem_v2"] == 1 and nv.calls["mem_v1"] == 3


def test_fake_nvml_failing_fields_are_none_never_raise() -> None:
    nv = FakeNvml(gpus=2, fail=("util", "pcie", "procs", "temp", "power", "mem_v2", "mem_v1", "handle1"))
    src = NvmlSource(nvml=nv, pcie=True)
    recs = src.sample()
    d0, d1 = recs[0].data, recs[1].data
    for key in GPU_FIELDS:
        assert d0[key] is None, key
        assert d1[key] is None, key
    assert d0["name"] == "NVIDIA H200" and "error" not in d0
    assert d1["error"] == "nvmlDeviceGetHandleByIndex(1) failed"
    assert nv.calls["util"] == 1  # GPU 1 without a handle was never asked anything


def test_fake_nvml_pcie_off_skips_the_20ms_calls() -> None:
    nv = FakeNvml(gpus=1)
    d = NvmlSource(nvml=nv, pcie=False).sample()[0].data
    assert d["pcie_tx_bytes_per_s"] is None and "pcie" not in nv.calls


def test_fake_nvml_no_driver_retries_init_at_most_every_60_s() -> None:
    nv = FakeNvml(init_error=True)
    now = [1000.0]
    src = NvmlSource(nvml=nv, clock=lambda: now[0])
    recs = src.sample()
    assert recs[0].data == {"index": -1, "error": "no NVIDIA driver: NVML library (libnvidia-ml.so.1) not found"}
    for _ in range(100):
        now[0] += 0.5
        assert src.sample() == []
    assert nv.inits == 1  # 50 s later: not retried yet
    now[0] += 11.0
    assert src.sample() == []  # retried, failed again: silence, no second record
    assert nv.inits == 2
    nv.init_error = False  # the driver shows up
    now[0] += 61.0
    recs = src.sample()
    assert nv.inits == 3 and src.available
    assert [r.data["index"] for r in recs] == [0, 1]


def test_fake_nvml_other_init_failures_and_no_gpus() -> None:
    class Broken(FakeNvml):
        def nvmlInit(self) -> None:
            raise OSError("libnvidia-ml.so.1: cannot open shared object file")

    d = NvmlSource(nvml=Broken()).sample()[0].data
    assert d["index"] == -1 and d["error"].startswith("no NVIDIA driver: NVML init failed (OSError")
    src = NvmlSource(nvml=FakeNvml(gpus=0))
    assert src.sample()[0].data == {"index": -1, "error": "NVML found no GPUs"}
    assert src.sample() == []


def test_nvml_process_memory_includes_child_processes() -> None:
    # TensorRT-LLM's GPU memory lives in its MPI worker: a child of the process kvtop is given.
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(5)"])
    try:
        procs = [SimpleNamespace(pid=child.pid, usedGpuMemory=3 << 30)]
        d = NvmlSource(pid=os.getpid(), nvml=FakeNvml(gpus=1, procs=procs)).sample()[0].data
        assert d["process_used_bytes"] == 3 << 30
    finally:
        child.kill()
        child.wait()


# ------------------------------------------------------------------------------------------ host


def test_host_fields_are_sane() -> None:
    src = HostSource(source=SRC, clock=lambda: 7.0)
    (rec,) = src.sample()
    d = rec.data
    assert rec.kind == "host" and rec.time == 7.0 and set(d) == set(HOST_FIELDS)
    assert d["pid"] == os.getpid()
    for key in ("process_rss_bytes", "process_uss_bytes", "process_shared_bytes", "system_total_bytes",
                "system_available_bytes"):
        assert isinstance(d[key], int) and d[key] >= 0, key
    assert 1 << 20 < d["process_rss_bytes"] < d["system_total_bytes"]
    assert 0 < d["process_uss_bytes"] <= d["process_rss_bytes"]
    assert 0 < d["system_available_bytes"] <= d["system_total_bytes"]
    assert d["pinned_pool_bytes"] is None and d["pinned_pool_origin"] is None
    assert decode(encode(rec)).data == d


def test_host_pinned_pool_reported_or_computed() -> None:
    src = HostSource(pinned_pool_bytes=8 << 30, uss=False)
    d = src.read()
    assert (d["pinned_pool_bytes"], d["pinned_pool_origin"]) == (8 << 30, "engine")
    assert d["process_uss_bytes"] is None
    src.set_pinned_pool_from_blocks(10_000, 32 * 147_456)  # Qwen3-8B bf16, 32 tokens per block
    d = src.read()
    assert (d["pinned_pool_bytes"], d["pinned_pool_origin"]) == (47_185_920_000, "blocks")
    with pytest.raises(ValueError):
        src.set_pinned_pool(-1)
    with pytest.raises(ValueError):
        src.set_pinned_pool_from_blocks(-5, 10)


def test_host_process_gone_gives_none_not_an_exception() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    d = HostSource(pid=child.pid).read()
    assert d["pid"] == child.pid
    assert d["process_rss_bytes"] is None and d["process_uss_bytes"] is None
    assert d["system_total_bytes"] > 0


# ------------------------------------------------------------------------------------------ boundaries


def test_sources_import_no_ui_libraries() -> None:
    code = ("import sys, kvtop.sources.poller, kvtop.sources.nvml, kvtop.sources.host; "
            "bad = [m for m in sys.modules if m.split('.')[0] in ('textual', 'rich', 'pynvml')]; "
            "print(bad); sys.exit(1 if bad else 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
