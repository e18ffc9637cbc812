"""A last-will storm: N kvtop agents (one source each) all drop their connection at once, and the dashboard's
Session gets N "offline" statuses (their MQTT last wills), then N retained "online" as they come back (issue 26).

    python bench/bench_will_storm.py                   # 4,096 agents; today's Session against 3465b90's
    python bench/bench_will_storm.py --agents 1000 --baseline ''

Each source is folded from one real ``summary`` record (``kvtop.agent.summary_data`` of a TierModel that folded a
vLLM-format KV batch) naming its own agent; then the wills go through ``Session.on_source_status``, timed (CPU
time of this process: the status path alone, no broker). The baseline is the same Session at an older commit, read
from git (bench/git_baseline.py), fed the same records in the same run: there each status walked every model to
find the agent's sources (quadratic); today an index (agent -> its sources, kept as summaries come) is read.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from git_baseline import BaselineMissing, module_at  # noqa: E402
from kv_publisher import stored  # noqa: E402
from test_kv_stream import batch  # noqa: E402

from kvtop.agent import summary_data  # noqa: E402
from kvtop.records import Record, SourceId  # noqa: E402
from kvtop.session import Session  # noqa: E402
from kvtop.tiers import TierModel  # noqa: E402


def storm(session_cls: Any, agents: int) -> dict[str, Any]:
    local = TierModel()
    local.apply(batch(0, [stored(list(range(64)))], t=1.0))
    data = summary_data(local, 0, 0.5, "")
    session = session_cls(source=SourceId("dash", 0, ""))
    for i in range(agents):
        session.emit(Record("summary", {**data, "agent": f"agent-{i}/0/r"}, SourceId(f"node-{i}:5557", 0, "r"),
                            1.0))
    assert len(session.models) == agents
    out: dict[str, Any] = {}
    for state in ("offline", "online"):
        t0 = time.process_time()
        for i in range(agents):
            session.on_source_status(f"agent-{i}/0/r", state)
        out[f"{state}_s"] = time.process_time() - t0
        # sources whose row follows its agent's status (all of them, unless statuses were refused)
        out[f"{state}_rows"] = sum(v == state for k, v in session.status.items() if k.startswith("node-"))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--agents", type=int, default=4096)
    p.add_argument("--baseline", default="3465b90", help="commit of kvtop/session.py to compare with ('' none)")
    args = p.parse_args(argv)
    print(f"{platform.node()} {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, "
          f"load {os.getloadavg()[0]:.1f}; {args.agents:,} agents, one source each")
    rows = [("today", Session)]
    if args.baseline:
        try:
            rows.append((args.baseline, module_at("kvtop_session_baseline", args.baseline,
                                                  "kvtop/session.py").Session))
        except BaselineMissing as exc:
            print(f"no baseline: {exc}")
    for name, cls in rows:
        r = storm(cls, args.agents)
        print(f"{name:>8}: {args.agents:,} wills {r['offline_s']:.3f} s CPU "
              f"({r['offline_s'] / args.agents * 1e6:,.1f} us each), {args.agents:,} 'online' {r['online_s']:.3f} s;"
              f" rows following: {r['offline_rows']:,} offline, then {r['online_rows']:,} online")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
