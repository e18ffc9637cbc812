"""``kvtop.engines.sim.forked``: the optimum's curve computed in a forked process beside the replay, and what the
caller sees when the child fails (the same answer, or the same exception, or a named loss and the answer again);
``kvtop sim --jobs``: the same output with and without the fork."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from test_sim_sweep import SLICE, run_kvtop

from kvtop.engines.sim import forked

ROOT = Path(__file__).resolve().parents[3]
linux_only = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="kvtop forks on Linux only")


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    """kvtop forks only while its process has one thread (forked.why_not). In a parallel run (pytest-xdist) the
    test before this one in the same worker may have left a thread winding down (a server's, a watcher's): wait
    for it, and name any that stays, rather than fail on a fork refused for a reason this test is not about."""
    deadline = time.monotonic() + 15
    while threading.active_count() > 1 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert threading.active_count() == 1, [t.name for t in threading.enumerate()]


def _pid_and_sum(values: list[int]) -> tuple[int, int]:
    return os.getpid(), sum(values)


@linux_only
def test_the_function_runs_in_a_child_and_its_value_comes_back() -> None:
    job = forked.start(_pid_and_sum, list(range(1000)), need_cpus=False)
    assert job.pid is not None and job.pid != os.getpid()
    pid, total = job.result()
    assert pid != os.getpid() and total == 499_500
    assert job.pid is None  # reaped
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def test_without_a_fork_the_function_runs_in_process_at_result() -> None:
    job = forked.start(_pid_and_sum, [1, 2, 3], fork=False)
    assert job.pid is None
    assert job.result() == (os.getpid(), 6)


def _raise_value_error(capacity: int) -> None:
    raise ValueError(f"capacity {capacity} is not a block count")


@linux_only
def test_an_exception_in_the_child_is_raised_again_in_the_caller() -> None:
    job = forked.start(_raise_value_error, 7, need_cpus=False)
    assert job.pid is not None
    with pytest.raises(ValueError, match="capacity 7 is not a block count"):
        job.result()


class _LocalError(Exception):
    def __reduce__(self):  # an exception that does not pickle
        raise TypeError("no pickling")


def _raise_unpicklable() -> None:
    raise _LocalError("the heap ran dry at reference 12")


@linux_only
def test_an_exception_that_does_not_pickle_arrives_as_its_name_and_message() -> None:
    with pytest.raises(RuntimeError, match=r"^_LocalError: the heap ran dry at reference 12$"):
        forked.start(_raise_unpicklable, need_cpus=False).result()


def _killed_in_the_child(parent: int, values: list[int]) -> int:
    if os.getpid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)
    return sum(values)


@linux_only
def test_a_child_killed_by_a_signal_is_named_and_the_answer_computed_again() -> None:
    told: list[str] = []
    job = forked.start(_killed_in_the_child, os.getpid(), [5, 6, 7], need_cpus=False, on_lost=told.append)
    assert job.pid is not None
    assert job.result() == 18
    assert told == ["the side process ended by SIGKILL (9) without a result"]


def _unpicklable_value() -> object:
    return threading.Lock()


@linux_only
def test_a_value_that_does_not_pickle_is_computed_again_in_process() -> None:
    told: list[str] = []
    value = forked.start(_unpicklable_value, need_cpus=False, on_lost=told.append).result()
    assert hasattr(value, "acquire")
    assert told == ["the side process exited with status 1 and sent 0 bytes, not a result"]


@linux_only
def test_close_ends_a_child_whose_result_is_not_wanted() -> None:
    job = forked.start(time.sleep, 60, need_cpus=False)
    pid = job.pid
    assert pid is not None
    t0 = time.monotonic()
    with job:
        pass  # the caller failed first: __exit__ closes
    assert time.monotonic() - t0 < 5
    assert job.pid is None
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


@linux_only
def test_no_fork_while_another_thread_runs() -> None:
    stop = threading.Event()
    other = threading.Thread(target=stop.wait)
    other.start()
    try:
        assert forked.fork_refused(need_cpus=False) == "2 threads are running"
        job = forked.start(_pid_and_sum, [4], need_cpus=False)
        assert job.pid is None and job.result() == (os.getpid(), 4)
    finally:
        stop.set()
        other.join()
    assert forked.fork_refused(need_cpus=False) is None


def test_one_cpu_refuses_the_fork_only_where_cpus_are_needed(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(forked, "usable_cpus", lambda: 1)
    monkeypatch.setattr(forked.sys, "platform", "linux")
    assert forked.fork_refused() == "one CPU"
    assert forked.fork_refused(need_cpus=False) is None
    monkeypatch.setattr(forked.sys, "platform", "darwin")
    assert forked.fork_refused(need_cpus=False) == "not on Linux (darwin)"


@linux_only
def test_what_was_printed_before_the_fork_is_written_once() -> None:
    # stdout to a pipe is block-buffered: the child's copy of the caller's buffer is written by neither (the caller
    # flushes before the fork), what the child prints is written by the child (it flushes before os._exit)
    code = ("from kvtop.engines.sim import forked; print('before the fork', end='', flush=False); "
            "import sys; job = forked.start(sys.stdout.write, ' from the child', need_cpus=False); "
            "import time; time.sleep(0.5); print(' result', job.result())")
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                          env={**{k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"},
                               "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr
    assert done.stdout == "before the fork from the child result 15\n"


def _runs_without_seconds(stdout: str) -> list[dict]:
    out = json.loads(stdout)
    out.pop("wall_seconds", None)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["--one-pass", "--hit-rate-only"])
def test_sim_gives_the_same_curve_and_optimum_with_and_without_the_fork(tmp_path: Path, mode: str) -> None:
    args = ["sim", "--trace", str(SLICE), "--host-cache", "0:64GB:6", mode, "--belady", "--json", "--gpu-blocks",
            "6000"]
    one = run_kvtop([*args, "--jobs", "1"], tmp_path)
    two = run_kvtop([*args, "--jobs", "2"], tmp_path)
    assert one.returncode == 0 and two.returncode == 0, (one.stderr, two.stderr)
    assert one.stderr == two.stderr == ""
    a, b = _runs_without_seconds(one.stdout), _runs_without_seconds(two.stdout)
    assert a == b
    optimum = [r["belady_hit_rate"] for r in a["runs"]]
    assert len(optimum) == 6 and all(o >= r["cache_hit_rate"] for o, r in zip(optimum, a["runs"]))
    assert optimum == sorted(optimum) and optimum[-1] > optimum[0]


@pytest.mark.slow
def test_timed_sim_gives_the_same_optimum_with_and_without_the_fork(tmp_path: Path) -> None:
    args = ["sim", "--trace", str(SLICE), "--host-cache", "0,8GB", "--belady", "--limit", "300", "--gpu-blocks",
            "3000"]
    one = run_kvtop([*args, "--jobs", "1"], tmp_path)
    two = run_kvtop([*args, "--jobs", "2"], tmp_path)
    assert one.returncode == 0 and two.returncode == 0, (one.stderr, two.stderr)
    rows = [[ln for ln in done.stdout.splitlines() if "optimal (Belady" in ln] for done in (one, two)]
    assert len(rows[0]) == 2 and rows[0] == rows[1]


def test_sim_rejects_a_jobs_count_that_is_no_process_count(tmp_path: Path) -> None:
    for bad in ("0", "-1", "1025"):
        done = run_kvtop(["sim", "--trace", str(SLICE), "--host-cache", "0,8GB", "--one-pass", "--belady", "--jobs",
                          bad], tmp_path)
        assert done.returncode == 2, (bad, done.stderr)
        assert "--jobs" in done.stderr and f"got {bad}" in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr


def test_a_trace_error_in_the_replay_ends_the_run_and_its_side_process(tmp_path: Path) -> None:
    big = tmp_path / "big.jsonl"
    big.write_text('{"timestamp": 0, "input_length": 600, "output_length": 3, "hash_ids": [1, 18446744073709551615]}\n')
    done = run_kvtop(["sim", "--trace", str(big), "--host-cache", "0,8GB", "--one-pass", "--belady", "--jobs", "2"],
                     tmp_path)
    assert done.returncode == 2 and "trace line 1: hash id 18446744073709551615" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def _square_in_child(parent: int, x: int) -> tuple[int, bool]:
    return x * x, os.getpid() != parent


def _slow_first(parent: int, x: int) -> tuple[int, int]:
    time.sleep(0.3 if x == 0 else 0.0)  # the first ends last: the results still come in order
    return x, os.getpid()


@linux_only
def test_in_order_runs_up_to_jobs_children_and_gives_the_results_in_order() -> None:
    with forked.InOrder(_slow_first, [(os.getpid(), x) for x in range(5)], jobs=3) as each:
        got = list(each)
    assert [x for x, _ in got] == [0, 1, 2, 3, 4]
    pids = {pid for _, pid in got}
    assert os.getpid() not in pids and len(pids) == 5  # a fresh child per call


def test_in_order_with_one_job_runs_each_in_process_one_after_another() -> None:
    calls: list[int] = []

    def note(x: int) -> int:
        calls.append(x)
        return -x

    each = iter(forked.InOrder(note, [(1,), (2,), (3,)], jobs=1))
    assert next(each) == -1 and calls == [1]  # lazily: the second has not run yet
    assert list(each) == [-2, -3] and calls == [1, 2, 3]


@linux_only
def test_in_order_keeps_at_most_jobs_children_running() -> None:
    job_list = forked.InOrder(time.sleep, [(0.2,)] * 6, jobs=2)
    each = iter(job_list)
    next(each)
    assert len(job_list._running) == 2  # the first's slot went to the third
    job_list.close()
    assert job_list._running == []


def _fail_on_three(x: int) -> int:
    if x == 3:
        raise OverflowError(f"trace line {x}: hash id past 64 bits")
    time.sleep(0.05 if x < 3 else 30)
    return x


@linux_only
def test_in_order_raises_a_childs_exception_in_its_place_and_ends_the_rest() -> None:
    got: list[int] = []
    job_list = forked.InOrder(_fail_on_three, [(x,) for x in range(6)], jobs=3)
    with pytest.raises(OverflowError, match="trace line 3"):
        with job_list:
            for x in job_list:
                got.append(x)
    assert got == [0, 1, 2]
    assert job_list._running == []  # the children sleeping 30 s were killed, not waited for


def _lose_the_second(parent: int, x: int) -> int:
    if x == 1 and os.getpid() != parent:
        os.kill(os.getpid(), signal.SIGKILL)
    return 10 * x


@linux_only
def test_in_order_recomputes_a_lost_child_and_says_so() -> None:
    told: list[str] = []
    got = list(forked.InOrder(_lose_the_second, [(os.getpid(), x) for x in range(3)], jobs=2, on_lost=told.append))
    assert got == [0, 10, 20]
    assert told == ["the side process ended by SIGKILL (9) without a result"]


@pytest.mark.slow
@pytest.mark.parametrize("mode", [[], ["--hit-rate-only"]])
def test_a_sweep_of_sizes_in_parallel_gives_what_one_process_gives(tmp_path: Path, mode: list[str]) -> None:
    args = ["sim", "--trace", str(SLICE), "--host-cache", "0,8GB,32GB", *mode, "--json", "--limit", "400",
            "--gpu-blocks", "3000"]
    one = run_kvtop([*args, "--jobs", "1"], tmp_path)
    three = run_kvtop([*args, "--jobs", "3"], tmp_path)
    assert one.returncode == 0 and three.returncode == 0, (one.stderr, three.stderr)
    a, b = json.loads(one.stdout), json.loads(three.stdout)
    a.pop("wall_seconds", None), b.pop("wall_seconds", None)
    for run in (*a["runs"], *b["runs"]):
        run.pop("wall_seconds", None)
    assert a == b
    assert [r["secondary_blocks"] for r in a["runs"]] == sorted(r["secondary_blocks"] for r in a["runs"])
    reused = [r["reused_blocks"] for r in a["runs"]]
    assert len(reused) == 3 and reused == sorted(reused) and reused[-1] > reused[0]


def test_a_timed_sweep_prints_its_rows_in_the_sweep_order(tmp_path: Path) -> None:
    args = ["sim", "--trace", str(SLICE), "--host-cache", "32GB,0,8GB", "--limit", "300", "--gpu-blocks", "6000"]
    done = run_kvtop([*args, "--jobs", "3"], tmp_path)
    assert done.returncode == 0, done.stderr
    rows = [ln.split("(")[0].split()[1:] for ln in done.stdout.splitlines() if ln.startswith("host")]
    assert rows == [["29.8", "GiB"], ["0", "B"], ["7.45", "GiB"]], done.stdout
    assert "FAILED" not in done.stdout


@linux_only
def test_sigint_during_a_parallel_sweep_ends_it_with_130_and_leaves_no_process(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("KVTOP_")}
    env["PYTHONPATH"] = str(ROOT)
    env["XDG_CONFIG_HOME"] = str(tmp_path / "xdg")
    proc = subprocess.Popen([sys.executable, "-m", "kvtop", "sim", "--trace", str(SLICE), "--host-cache",
                             "0,8GB,16GB,32GB", "--jobs", "2", "--gpu-blocks", "3000"], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # until the children are forked (each replay of the slice takes seconds)
        kids = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        if len(kids) == 2:
            break
        time.sleep(0.05)
    assert len(kids) == 2, "the sweep did not fork two replays"
    proc.send_signal(signal.SIGINT)  # the parent alone, as `kill -INT`: the children must be ended by it
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err
    assert "Traceback" not in err
    for pid in kids:
        with pytest.raises(ProcessLookupError):
            os.kill(int(pid), 0)
    with pytest.raises(ProcessLookupError):
        os.killpg(proc.pid, 0)  # nothing left in its session's group
