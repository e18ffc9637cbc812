"""One computation run beside the caller, in a forked process: ``kvtop sim --one-pass --belady`` computes the
optimum's curve there while it replays the block manager here.

The two are independent passes over the same parsed trace, ~0.14 s (the LRU replay) and ~0.11 s (Belady's MIN)
on the Mooncake trace at 512 tokens a block, 1.5 s and 0.9 s at 32 (bench/JOURNAL.md, "Host-cache sweeps"), so on
two free cores the command takes the longer of them instead of their sum. A fork, not ``multiprocessing``: the
child has the parsed trace and the imported modules already (a spawned interpreter would start Python, import
kvtop and receive the trace again: ~60 ms of imports alone, half the pass it would take over), and only the
result, a few floats, crosses the pipe.

What the caller sees is the same as computing in process, in every case:

- the result, the same value (tests/engines/sim/test_sim_forked.py holds the command's output with and without the
fork);
- an exception the function raised, raised again here (its type and message; the child's traceback is lost);
- a child that ended without a result (killed by a signal, out of memory, a result that does not pickle): the
  function is run again here, and ``on_lost`` is told why (``kvtop sim`` writes it to stderr), so the answer is
  never missing and the loss is never silent.

No fork where it is unsafe or pays nothing: off Linux (macOS forks without exec only with care, Windows has no
fork), with threads running (a fork copies one thread, and any lock another held stays held), or with fewer
than two CPUs for this process (``os.sched_getaffinity``: a container's or ``taskset``'s limit, not the host's).
"""

from __future__ import annotations

import os
import pickle
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from typing import Any


def usable_cpus() -> int:
    """CPUs this process may run on (its affinity mask, where the platform has one)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def fork_refused(need_cpus: bool = True) -> str | None:
    """Why no fork here, or None where one is safe (and, with ``need_cpus``, can pay: two CPUs or more)."""
    if not sys.platform.startswith("linux"):
        return f"not on Linux ({sys.platform})"
    if threading.active_count() > 1:
        return f"{threading.active_count()} threads are running"
    if need_cpus and usable_cpus() < 2:
        return "one CPU"
    return None


class Beside:
    """``fn(*args)``, started in a forked child (or, where ``start`` would not fork, run by ``result()``)."""

    def __init__(self, fn: Callable[..., Any], args: tuple[Any, ...], on_lost: Callable[[str], None] | None):
        self.fn, self.args, self.on_lost = fn, args, on_lost
        self.pid: int | None = None
        self._read_fd: int | None = None

    def _fork(self) -> None:
        read_fd, write_fd = os.pipe()
        sys.stdout.flush()  # what the caller printed before the fork is written once, by the caller
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:  # the child: compute, send, and leave without running the parent's exit handlers
            code = 0
            try:
                os.close(read_fd)
                try:
                    value = self.fn(*self.args)
                except BaseException as exc:  # noqa: BLE001 (raised again in the parent)
                    payload = _pickled_error(exc)
                else:  # a value that does not pickle raises here: no result sent, the parent recomputes
                    payload = pickle.dumps((True, value), pickle.HIGHEST_PROTOCOL)
                view = memoryview(payload)
                while view:
                    view = view[os.write(write_fd, view):]
            except BaseException:  # noqa: BLE001 (a result that does not pickle, a write that fails: no result)
                code = 1
            finally:
                try:  # what the function printed (the caller's buffer was written before the fork: not twice)
                    sys.stdout.flush()
                    sys.stderr.flush()
                finally:
                    os._exit(code)
        os.close(write_fd)
        self.pid, self._read_fd = pid, read_fd

    def result(self) -> Any:
        """The function's value (or its exception, raised); waits for the child."""
        if self.pid is None:
            return self.fn(*self.args)
        assert self._read_fd is not None
        with os.fdopen(self._read_fd, "rb") as pipe:
            self._read_fd = None
            data = pipe.read()
        _, status = os.waitpid(self.pid, 0)
        self.pid = None
        try:
            ok, value = pickle.loads(data)
        except Exception:  # noqa: BLE001 (no result, or a torn one: see why below)
            if self.on_lost is not None:
                self.on_lost(_why_lost(status, len(data)))
            return self.fn(*self.args)
        if ok:
            return value
        raise value

    def close(self) -> None:
        """End a child whose result is no longer wanted (the caller failed first); a no-op after ``result()``."""
        if self._read_fd is not None:
            os.close(self._read_fd)
            self._read_fd = None
        if self.pid is not None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(self.pid, 0)
            self.pid = None

    def __enter__(self) -> Beside:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def start(fn: Callable[..., Any], *args: Any, fork: bool = True, need_cpus: bool = True,
          on_lost: Callable[[str], None] | None = None) -> Beside:
    """``fn(*args)`` in a forked child where ``fork`` and ``fork_refused(need_cpus)`` is None, else in process at
    ``result()``. ``fn`` and its arguments are the caller's objects: the child reads its copy of them."""
    job = Beside(fn, args, on_lost)
    if fork and fork_refused(need_cpus) is None:
        job._fork()
    return job


class InOrder:
    """``fn(*args)`` for each of ``arg_lists``, up to ``jobs`` at once in forked children, the results in order (a
    sweep's host sizes: each a full replay of ~5-20 s, the same cost, so waiting for them in order leaves a slot
    idle for little). With ``jobs`` 1, or where no fork is safe (``fork_refused``), one after another in process.
    ``close()`` (or leaving the ``with``) ends the children still running: a caller that fails or is interrupted
    leaves none behind."""

    def __init__(self, fn: Callable[..., Any], arg_lists: list[tuple[Any, ...]], jobs: int,
                 on_lost: Callable[[str], None] | None = None):
        self.fn, self.arg_lists, self.jobs, self.on_lost = fn, arg_lists, max(1, jobs), on_lost
        self._running: list[Beside] = []

    def __iter__(self) -> Iterator[Any]:
        fork = self.jobs > 1
        waiting = iter(self.arg_lists)
        for args in waiting:
            self._running.append(start(self.fn, *args, fork=fork, need_cpus=False, on_lost=self.on_lost))
            if len(self._running) >= self.jobs:
                break
        while self._running:
            job = self._running.pop(0)
            try:
                value = job.result()
            finally:
                job.close()
            for args in waiting:  # its slot to the next one
                self._running.append(start(self.fn, *args, fork=fork, need_cpus=False, on_lost=self.on_lost))
                break
            yield value

    def close(self) -> None:
        running, self._running = self._running, []
        for job in running:
            job.close()

    def __enter__(self) -> InOrder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _pickled_error(exc: BaseException) -> bytes:
    try:
        return pickle.dumps((False, exc), pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 (an exception that does not pickle: its type's name and message)
        return pickle.dumps((False, RuntimeError(f"{type(exc).__name__}: {exc}")), pickle.HIGHEST_PROTOCOL)


def _why_lost(status: int, received: int) -> str:
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return f"the side process ended by {name} ({sig}) without a result"
    code = os.WEXITSTATUS(status) if os.WIFEXITED(status) else status
    return f"the side process exited with status {code} and sent {received} bytes, not a result"
