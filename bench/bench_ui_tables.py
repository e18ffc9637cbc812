"""What the sources table's sort and filter cost a refresh on a 1,000-source fleet, headless.

    python bench/bench_ui_tables.py                         # 1,000 sources, 200 refreshes per mode
    python bench/bench_ui_tables.py --sources 200 --refreshes 100

The fleet: each source's summary (kvtop.agent.summary_data, the shape ``kvtop agent`` publishes) folded twice, so
every row has its figures. Between two refreshes the source the big panels show folds one more summary, so its row
changes and the table is arranged again (kvtop/ui/table.py: filtered, sorted) and shown, as it is at the 4 Hz
refresh between the table's once-a-second full reads. Modes in one run: the rows in arrival order (what the table
did before it sorted), sorted by hit rate (o), and filtered to one source (/n0042). Only ``refresh_view`` is timed.
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
    from kvtop.agent import summary_data
    from kvtop.records import Record, SourceId
    from kvtop.session import Session
    from kvtop.tiers import TierModel
    from kvtop.ui import app as app_module
    from kvtop.ui.app import build_app

    class Settings:
        refresh = 1000.0   # the timer never fires: every refresh here is one the bench calls and times
        theme = "dark"
        duration = None

    app_module.wall_clock = lambda: 1764430100.0
    base = summary_data(TierModel(), 0, 1.0, "bench")
    ids = [SourceId(f"n{i:04d}", 0, "fleet") for i in range(sources)]
    session = Session(source=SourceId("dash", 0, ""))
    t0 = 1764430000.0

    def summary(i: int, rnd: int) -> Record:
        totals = {**base["totals"], "hits": (i * 7919 % 1000) * rnd, "lookups": 1000 * rnd}
        return Record("summary", {**base, "seq": rnd - 1, "totals": totals}, ids[i], t0 + rnd)

    for rnd in (1, 2):
        for i in range(sources):
            session.emit(summary(i, rnd))
    app = build_app(session, Settings(), run_session=False)
    app.fleet.refresh_s = 1e9   # between full reads: only the shown source's row is read again
    out: dict[str, Any] = {"sources": sources, "refreshes": refreshes}
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        rnd = 2
        for mode, keys in (("arrival_ms", ()), ("sorted_by_hit_ms", ("o",)), ("filtered_ms", ("slash", *"n0042",
                                                                                            "enter"))):
            if keys:
                await pilot.press(*keys)
                await pilot.pause()
            costs = []
            for _ in range(refreshes):
                rnd += 1
                session.emit(summary(0, rnd))   # node 0: the source the big panels show
                t = time.perf_counter()
                app.refresh_view()
                costs.append(time.perf_counter() - t)
            out[mode] = round(statistics.median(costs) * 1e3, 3)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sources", type=int, default=1000)
    ap.add_argument("--refreshes", type=int, default=200)
    args = ap.parse_args()
    sys.path.insert(0, str(ROOT))
    print(json.dumps(asyncio.run(measure(args.sources, args.refreshes))))


if __name__ == "__main__":
    main()
