"""Stopping from another thread: every long-running part returns promptly when ``stop()`` comes from a thread
other than its loop's (a user's script, ``WatchHandle.stop``, a signal handler).

``asyncio.Event.set`` called from another thread does not wake a loop that is asleep in its selector; it would
notice only at its next timer. Each case below puts its part into a long wait first (a poll interval, a
reconnect backoff), so without ``StopSignal``'s ``call_soon_threadsafe`` the stop would take seconds.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from typing import Any

import pytest
from conftest import free_port  # a port nothing listens on: connections are refused

from kvtop.records import SourceId
from kvtop.sinks.mqtt import MqttPublisher
from kvtop.sources.mqtt import MqttSubscriber
from kvtop.sources.poller import EnginePoller
from kvtop.sources.trtllm_serve import TrtllmServeSource
from kvtop.stopsignal import StopSignal

SRC = SourceId(host="h", rank=0, run="r")
PROMPT_S = 0.5  # a stop from another thread must end run() within this (the waits below are >= 2 s)


def _stop_from_another_thread(part: Any, ready: Callable[[], bool], settle_s: float) -> float:
    """Run ``part.run()`` on a loop in a thread; once ``ready()`` and ``settle_s`` later (the part is in its long
    wait), call ``part.stop()`` from this thread. Returns how long run() took to return after the stop."""
    returned: list[float] = []

    def loop_thread() -> None:
        asyncio.run(part.run())
        returned.append(time.monotonic())

    thread = threading.Thread(target=loop_thread, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10.0
    while not ready():
        assert time.monotonic() < deadline, "the part never got going"
        time.sleep(0.01)
    time.sleep(settle_s)
    assert thread.is_alive()
    stopped_at = time.monotonic()
    part.stop()
    thread.join(10.0)
    assert returned, "run() did not return within 10 s of stop()"
    return returned[0] - stopped_at


def test_a_stop_before_bind_is_kept_and_one_after_wakes_the_loop_from_another_thread() -> None:
    signal = StopSignal()
    signal.stop()  # before any loop: only the flag

    async def bound_after_stop() -> bool:
        return signal.bind().is_set()

    assert asyncio.run(bound_after_stop()) is True

    signal = StopSignal()
    woke: list[float] = []

    async def waiter() -> None:
        event = signal.bind()
        await asyncio.wait_for(event.wait(), timeout=30.0)
        woke.append(time.monotonic())

    thread = threading.Thread(target=lambda: asyncio.run(waiter()))
    thread.start()
    while signal.event is None:
        time.sleep(0.01)
    time.sleep(0.2)  # asleep in its selector
    stopped_at = time.monotonic()
    signal.stop()
    thread.join(10.0)
    assert woke and woke[0] - stopped_at < PROMPT_S
    assert signal.requested
    signal.stop()  # after the loop closed: nothing to wake, no error


class _IdleEngine:
    """TensorRT-LLM's LLM with nothing to report (synchronous drains, as in 1.x)."""

    def get_stats(self, timeout: float = 0.0) -> list[Any]:
        return []

    def get_kv_cache_events(self, timeout: float = 0.0) -> list[Any]:
        return []


def test_engine_poller() -> None:
    poller = EnginePoller(_IdleEngine(), SRC, interval_s=30.0, sink=lambda r: None)
    took = _stop_from_another_thread(poller, lambda: poller._stop.event is not None, 0.3)
    assert took < PROMPT_S, took


def test_trtllm_serve_source_backing_off_from_an_unreachable_server() -> None:
    source = TrtllmServeSource(f"http://127.0.0.1:{free_port()}", interval_s=5.0, sink=lambda r: None,
                               timeout_s=1.0)
    took = _stop_from_another_thread(source, lambda: source.reachable is False, 0.3)  # now waiting 5-10 s
    assert took < PROMPT_S, took


@pytest.mark.slow
def test_mqtt_subscriber_retrying_a_broker_that_is_down() -> None:
    subscriber = MqttSubscriber(f"mqtt://127.0.0.1:{free_port()}", sink=lambda r: None)
    # backoff 0.25, 0.5, 1, then 2 s: after 2 s of retries it waits 2 s at a time
    took = _stop_from_another_thread(subscriber, lambda: subscriber._stop.event is not None, 2.0)
    assert took < PROMPT_S, took


@pytest.mark.slow
def test_mqtt_publisher_retrying_a_broker_that_is_down() -> None:
    publisher = MqttPublisher(f"mqtt://127.0.0.1:{free_port()}", SRC)
    took = _stop_from_another_thread(publisher, lambda: publisher._stop.event is not None, 2.0)
    assert took < PROMPT_S, took  # (never connected: no goodbye to flush)
