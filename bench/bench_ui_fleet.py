"""The dashboard's refresh with several sources attached: median ``refresh_view`` time, headless.

    python bench/bench_ui_fleet.py                        # 16 sources, 300 refreshes per mode
    python bench/bench_ui_fleet.py --tree /tmp/before     # the same against another checkout's kvtop

Each source folds the first 1,500 records of tests/data/busy.jsonl, then one iteration-stats record between every
two refreshes (each source's model changes every refresh, as on a busy fleet). Two modes: the sources table as
the dashboard keeps it between its once-a-second full reads (only the selected source's row follows), and read
whole at every refresh (``fleet_refresh_s = 0``). Only ``refresh_view`` is timed, not the fold nor the paint.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent


async def measure(sources: int, refreshes: int) -> dict[str, Any]:
    from recordings import BUSY_RECORDING

    from kvtop.records import SourceId, make, read_jsonl
    from kvtop.session import Session
    from kvtop.ui import app as app_module
    from kvtop.ui.app import build_app

    class Settings:
        refresh = 1000.0   # the timer never fires: every refresh here is one the bench calls and times
        theme = "dark"
        duration = None

    app_module.wall_clock = lambda: 1764430100.0
    records = list(read_jsonl(BUSY_RECORDING))[:1500]
    ids = [SourceId(host=f"n{i}", rank=0, run="r") for i in range(sources)]
    session = Session(source=ids[0])
    for src in ids:
        for r in records:
            session.emit(make(r.kind, r.data, source=src, time=r.time))
    app = build_app(session, Settings(), run_session=False)
    out: dict[str, Any] = {"sources": sources, "refreshes": refreshes}
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        t = records[-1].time
        for mode, fleet_s in (("selected_row_ms", 1e9), ("full_table_ms", 0.0)):
            if hasattr(app, "fleet"):   # kvtop/ui/state.py FleetView; a tree before it had the app's own attribute
                app.fleet.refresh_s = fleet_s
            else:
                app.fleet_refresh_s = fleet_s
            costs = []
            for i in range(refreshes):
                t += 0.25
                for src in ids:
                    session.emit(make("stats", {"iter": 10**6 + i, "numActiveRequests": 1}, source=src, time=t))
                t0 = time.perf_counter()
                app.refresh_view()
                costs.append(time.perf_counter() - t0)
            out[mode] = round(statistics.median(costs) * 1e3, 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sources", type=int, default=16)
    ap.add_argument("--refreshes", type=int, default=300)
    ap.add_argument("--tree", type=Path, default=ROOT, help="the checkout whose kvtop is measured (default: this one)")
    args = ap.parse_args()
    sys.path[:0] = [str(args.tree), str(args.tree / "tests")]   # recordings.py: a test helper, not shipped
    print(json.dumps(asyncio.run(measure(args.sources, args.refreshes))))


if __name__ == "__main__":
    main()
