"""Stopping work that runs on an asyncio loop, from whichever thread asks.

kvtop's long-running parts (the engine poller, the MQTT publisher and subscriber, the trtllm-serve source, the
watch thread) each run on a loop and are stopped by a caller that may be on that loop (a dashboard key) or on
another thread (a user's script, a signal handler, ``WatchHandle.stop``). ``asyncio.Event.set`` is not
thread-safe: called from another thread it can leave the loop asleep until its next timer, which is seconds for a
source backing off from a lost server.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading


class StopSignal:
    """A stop request any thread may make, and the ``asyncio.Event`` that the running loop waits on.

    ``stop()`` before the loop is bound only raises the flag; ``bind()`` (called by ``run``, on the loop) makes the
    event, set already when the flag is up, so a stop that comes before ``run`` is never lost.
    """

    __slots__ = ("requested", "event", "_loop", "_thread")

    def __init__(self) -> None:
        self.requested = False
        self.event: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: int | None = None

    def bind(self) -> asyncio.Event:
        """Make the event on the running loop (once per ``run``) and return it."""
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()
        self.event = asyncio.Event()
        if self.requested:
            self.event.set()
        return self.event

    def stop(self, *also: asyncio.Event | None) -> None:
        """Raise the flag and set the event (and ``also`` events of the same loop, such as a wake-up)."""
        self.requested = True
        self.set(self.event)
        for event in also:
            self.set(event)

    def set(self, event: asyncio.Event | None) -> None:
        """Set an event of the bound loop from any thread: at once on the loop's own thread, through
        ``call_soon_threadsafe`` from any other; nothing before ``bind`` or after the loop closed."""
        loop = self._loop
        if event is None or loop is None or loop.is_closed():
            return
        if threading.get_ident() == self._thread:
            event.set()
        else:
            with contextlib.suppress(RuntimeError):  # the loop closed between the check and the call
                loop.call_soon_threadsafe(event.set)
