"""What one dashboard refresh costs on a busy stream: CPU per refresh and bytes a terminal is sent, headless.

    python bench/bench_ui_refresh.py                           # the 40 s full-scale busy recording, 3 rounds
    python bench/bench_ui_refresh.py --tree /tmp/before        # the same against another checkout's kvtop
    python bench/bench_ui_refresh.py --json

How: the app at 120x40 under Textual's test driver, the recording folded into its session 0.25 s of record time
at a time (the fold is not counted), then one ``refresh_view`` and the screen's repaint, as the refresh timer
would. Counted, with ``time.thread_time`` (the main thread's CPU, the event loop's sleeps are not CPU): the whole
step from ``refresh_view`` to the repainted screen (kvtop's panels, Textual's message pumps, its compositor), and
the update turned into the bytes a terminal would get (``render_segments``, what Textual's ``_display`` sends;
the test driver itself writes nothing). Not counted: the writer thread's ``write`` to the terminal (~0.6 ms of
CPU per second on the busy stream, dev box) and the decode of the records. The bench replays the same records
the same way for every tree, so the figures compare; the whole process in a real terminal is
``bench/bench_attached.py``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
STEP_S = 0.25
PAINT_WAIT_S = 0.2   # at most this long (wall) for the screen's repaint after a refresh
# Not Pilot.pause() between refreshes: it waits on every widget's message queue and forces a repaint of its own
# (~5 ms of CPU a call here), more than the refresh it would wait for.


class _Settings:
    refresh = 1000.0   # the timer never fires: every refresh here is one the bench makes and counts
    theme = "dark"
    duration = None


def _callgrind(state: str) -> None:
    """Under ``valgrind --tool=callgrind --instr-atstart=no`` (``--callgrind``), count instructions only in the
    measured steps: a count that the machine's other load does not move, unlike CPU time on a shared VM."""
    if os.environ.get("KVTOP_BENCH_CALLGRIND"):
        subprocess.run(["callgrind_control", "-i", state, str(os.getpid())], check=True, capture_output=True)


async def one_round(records: list[Any], refreshes: int, skip_s: float, fold_only: bool = False) -> dict[str, Any]:
    from textual._compositor import Compositor

    from kvtop.session import Session
    from kvtop.ui import app as app_module
    from kvtop.ui.app import build_app

    t0 = records[0].time
    session = Session()
    now = [t0]
    app_module.wall_clock = lambda: now[0]
    app = build_app(session, _Settings(), run_session=False)
    # The collector as kvtop.modes.run_dashboard sets it for a run: what start-up built frozen, young
    # collections every 10,000 objects.
    gc.collect()
    gc.freeze()
    threshold = gc.get_threshold()
    gc.set_threshold(10_000, *threshold[1:])
    painted = {"updates": 0, "bytes": 0, "cpu": 0.0}
    repainted = asyncio.Event()
    render_update = Compositor.render_update

    def counted(self: Compositor, *args: Any, **kwargs: Any) -> Any:
        update = render_update(self, *args, **kwargs)
        if update is not None and hasattr(update, "render_segments"):
            start = time.thread_time()   # what App._display does with it in a terminal
            painted["bytes"] += len(update.render_segments(app.console).encode())
            painted["cpu"] += time.thread_time() - start
        painted["updates"] += 1
        repainted.set()
        return update

    Compositor.render_update = counted  # type: ignore[method-assign]
    try:
        async with app.run_test(size=(120, 40)) as pilot:
            await pilot.pause()
            i = 0
            t = t0 + skip_s
            while i < len(records) and records[i].time < t:   # the first seconds: warm-up, not counted
                session.emit(records[i])
                i += 1
            now[0] = t
            app.refresh_view()
            await pilot.pause(0.05)
            costs: list[float] = []
            view_costs: list[float] = []
            base = dict(painted)
            _callgrind("on")
            for _ in range(refreshes):
                t += STEP_S
                while i < len(records) and records[i].time < t:
                    session.emit(records[i])
                    i += 1
                now[0] = t
                if fold_only:
                    continue
                repainted.clear()
                start = time.thread_time()
                app.refresh_view()
                view_costs.append(time.thread_time() - start)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(repainted.wait(), PAINT_WAIT_S)
                await asyncio.sleep(0.02)   # whatever the repaint queued (callbacks, idle) runs too
                costs.append(time.thread_time() - start)
            _callgrind("off")
            if fold_only:
                costs = view_costs = [0.0]
            result = {
                "cpu_ms_per_refresh": round(1e3 * sum(costs) / refreshes, 3),
                "cpu_ms_p50": round(1e3 * statistics.median(costs), 3),
                "refresh_view_ms": round(1e3 * sum(view_costs) / refreshes, 3),
                "render_segments_ms": round(1e3 * (painted["cpu"] - base["cpu"]) / refreshes, 3),
                "bytes_per_refresh": round((painted["bytes"] - base["bytes"]) / refreshes),
                "repaints": painted["updates"] - base["updates"], "records_folded": i}
            await pilot.press("q")
    finally:
        Compositor.render_update = render_update  # type: ignore[method-assign]
        gc.set_threshold(*threshold)
        gc.unfreeze()
    return result


async def measure(recording: Path, refreshes: int, skip_s: float, rounds: int,
                  fold_only: bool = False) -> dict[str, Any]:
    from kvtop.records import Record, read_jsonl

    records = [r for r in read_jsonl(recording) if isinstance(r, Record)]
    out: dict[str, Any] = {"recording": str(recording), "records": len(records), "refreshes": refreshes,
                           "rounds": [await one_round(records, refreshes, skip_s, fold_only) for _ in range(rounds)]}
    out["best"] = min(out["rounds"], key=lambda r: r["cpu_ms_p50"])
    return out


def callgrind(args: argparse.Namespace) -> None:
    """The bench once under callgrind, with and without the refreshes: the refreshes' instructions, per refresh."""
    counts = {}
    for fold_only in (False, True):
        out = Path(tempfile.mkdtemp()) / "callgrind.out"
        argv = ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={out}",
                sys.executable, __file__, "--tree", str(args.tree), "--rounds", "1", "--refreshes",
                str(args.refreshes), "--skip", str(args.skip), "--json"]
        if args.recording:
            argv += ["--recording", str(args.recording)]
        if fold_only:
            argv.append("--fold-only")
        run = subprocess.run(argv, capture_output=True, text=True, check=True,
                             env={**os.environ, "KVTOP_BENCH_CALLGRIND": "1", "PYTHONHASHSEED": "0"})
        found = re.search(r"Collected : (\d+)", run.stderr)
        if found is None:
            raise SystemExit(f"no instruction count from callgrind: {run.stderr[-500:]}")
        counts["fold_only" if fold_only else "with_refreshes"] = int(found[1])
        if not fold_only:
            counts["bytes_per_refresh"] = json.loads(run.stdout)["best"]["bytes_per_refresh"]
    per = (counts["with_refreshes"] - counts["fold_only"]) / args.refreshes
    print(json.dumps({"tree": str(args.tree), "refreshes": args.refreshes, **counts,
                      "instructions_per_refresh": round(per)}))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recording", type=Path, default=None,
                    help="default: the 40 s full-scale busy recording bench/bench_attached.py makes (in /tmp)")
    ap.add_argument("--refreshes", type=int, default=120, help="refreshes per round (default 120: 30 s of records)")
    ap.add_argument("--skip", type=float, default=5.0, help="record seconds folded before the first counted one")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose kvtop is measured (default: this one)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--fold-only", action="store_true", help="the same steps without the refreshes (callgrind's base)")
    ap.add_argument("--callgrind", action="store_true",
                    help="run under callgrind, instructions counted in the measured steps only (minutes); run it "
                         "again with --fold-only and subtract: what is left is the refreshes' instructions")
    args = ap.parse_args()
    if args.callgrind:
        return callgrind(args)
    sys.path[:0] = [str(args.tree)]
    recording = args.recording
    if recording is None:
        sys.path.insert(0, str(ROOT / "bench"))
        from bench_attached import busy_recording

        recording = busy_recording(40)
    result = asyncio.run(measure(recording, args.refreshes, args.skip, args.rounds, args.fold_only))
    if args.json:
        print(json.dumps(result))
        return
    print(f"{result['recording']}: {args.refreshes} refreshes of {STEP_S} s, {args.rounds} rounds, tree {args.tree}")
    for r in result["rounds"]:
        print(f"  {r['cpu_ms_per_refresh']:6.3f} ms CPU a refresh (p50 {r['cpu_ms_p50']:.3f}; refresh_view "
              f"{r['refresh_view_ms']:.3f}, render_segments {r['render_segments_ms']:.3f})  "
              f"{r['bytes_per_refresh']} bytes a refresh  {r['repaints']} repaints")


if __name__ == "__main__":
    main()
