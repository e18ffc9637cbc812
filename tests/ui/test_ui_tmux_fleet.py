"""The bar of issue 24, item 2, in a real terminal: ``kvtop attach mqtt://`` in tmux (120x40) on a fleet of 1,000
sources publishing agent summaries through a real mosquitto; filtering to one source takes ``/`` and Enter beyond
its name, and sorting by hit rate one key (``o``).

The fleet: one publisher (a thread here, one MQTT connection) sends each source's summary (what ``kvtop agent``
publishes, kvtop.agent.summary_data) once a second, with totals that grow every round; source i looks up 1,000
blocks a round and hits ``i * 7919 % 1000`` of them (a permutation of 0..999), so every source has its own hit
rate and exactly one has the highest (99.9%).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from recordings import REPO
from tmux_pane import Pane

from kvtop.agent import summary_data
from kvtop.mqtt_wire import topic_for
from kvtop.records import Record, SourceId, encode
from kvtop.tiers import TierModel

pytestmark = [pytest.mark.tmux, pytest.mark.mqtt, pytest.mark.slow,
              pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")]

SOURCES = 1000
LOOKUPS = 1000   # per source and round


def hits_of(i: int) -> int:
    return i * 7919 % SOURCES   # 7919 is prime to 1,000: each source its own count of hits a round


def publish_fleet(host: str, port: int, prefix: str, stop: threading.Event) -> None:
    import paho.mqtt.client as mqtt

    base = summary_data(TierModel(), 0, 1.0, "agent-tmux")
    client = mqtt.Client(mqtt.CallbackAPIVersion.VERSION2, client_id=f"fleet-{uuid.uuid4().hex[:6]}")
    client.connect(host, port)
    client.loop_start()
    try:
        ids = [SourceId(f"n{i:04d}", 0, "fleet") for i in range(SOURCES)]
        rnd = 0
        while not stop.is_set():
            rnd += 1
            now = time.time()
            for i, src in enumerate(ids):
                totals = {**base["totals"], "hits": hits_of(i) * rnd, "lookups": LOOKUPS * rnd}
                data = {**base, "seq": rnd - 1, "totals": totals}
                client.publish(topic_for(prefix, src, "summary"), encode(Record("summary", data, src, now)), qos=0)
            stop.wait(1.0)
    finally:
        client.loop_stop()
        client.disconnect()


@pytest.fixture
def fleet_pane(tmp_path: Path, mqtt_broker) -> Iterator[tuple[Pane, Path]]:  # noqa: ANN001 (conftest's broker)
    stop = threading.Event()
    publisher = threading.Thread(target=publish_fleet, args=(mqtt_broker.host, mqtt_broker.port, "fleet", stop),
                                 daemon=True)
    publisher.start()
    server = f"kvtop-fleet-{uuid.uuid4().hex[:8]}"
    status = tmp_path / "status"
    cmd = (f"cd {shlex.quote(str(REPO))} && {shlex.quote(sys.executable)} -m kvtop attach "
           f"{shlex.quote(mqtt_broker.url('fleet'))} --refresh 0.25; echo $? > {shlex.quote(str(status))}; sleep 60")
    env = dict(os.environ, TERM="xterm-256color", XDG_CONFIG_HOME=str(tmp_path / "config"),
               PYTHONPATH=os.pathsep.join([str(REPO), *filter(None, [os.environ.get("PYTHONPATH")])]))
    subprocess.run(["tmux", "-L", server, "-f", "/dev/null", "new-session", "-d", "-s", "kvtop", "-x", "120",
                    "-y", "40", cmd], check=True, env=env, timeout=10)
    try:
        yield Pane(server, "kvtop"), status
    finally:
        subprocess.run(["tmux", "-L", server, "kill-server"], capture_output=True, timeout=10)
        stop.set()
        publisher.join(10)


def _filter_line(screen: str) -> str | None:
    """The filter's input as the pane shows it (the line under the sources table: its text, or its placeholder when
    empty), None while it is closed."""
    lines = screen.splitlines()
    at = next((i for i, ln in enumerate(lines) if ln.startswith("╰") and "all: sums" in ln), None)
    if at is None or at + 1 >= len(lines) or lines[at + 1].startswith("╭"):
        return None
    return lines[at + 1].strip()


def _table(screen: str) -> list[str]:
    """The sources table's data rows as the pane shows them (between its header and the aggregate row)."""
    lines = screen.splitlines()
    at = next(i for i, ln in enumerate(lines) if "GPU use/cch/cap" in ln)
    out = []
    for ln in lines[at + 1:]:
        if "Σ" in ln or "more sources" in ln:
            break
        out.append(ln)
    return out


def test_a_1000_source_fleet_filters_to_one_source_and_sorts_by_hit_rate_in_a_few_keys(
        fleet_pane: tuple[Pane, Path]) -> None:
    p, status = fleet_pane
    p.wait_for(lambda t: "Sources · 1,000" in t, timeout=60)
    # Filter: "/" then the name then Enter (2 keys beyond the name). The name is typed once the filter's input is on
    # screen: keys sent before it is mounted go to the dashboard (on a loaded machine the test lost them so).
    p.keys("/")
    p.wait_for(lambda t: (_filter_line(t) or "").startswith("filter: type part of a name"), timeout=20)
    p.keys("-l", "n0042")
    p.keys("Enter")
    screen = p.wait_for(lambda t: "Sources · 1 of 1,000 · /n0042" in t, timeout=20)
    rows = _table(screen)
    assert len(rows) == 1 and "n0042/0/fleet" in rows[0]
    assert f"{100 * hits_of(42) / LOOKUPS:.1f}%" in rows[0]
    # ...and Enter opens it: the big panels (the header's source) show it.
    p.keys("Enter")
    p.wait_for(lambda t: re.search(r"\d+/1000 n0042/0/fleet", t) is not None, timeout=20)
    # Clear the filter (/ then Escape), then sort by hit rate: one key, o.
    p.keys("/")
    p.wait_for(lambda t: _filter_line(t) == "n0042", timeout=20)   # open again, with the text it kept
    p.keys("Escape")
    p.wait_for(lambda t: "Sources · 1,000" in t and " of 1,000" not in t and _filter_line(t) is None, timeout=20)
    p.keys("o")
    best = max(range(SOURCES), key=hits_of)
    screen = p.wait_for(lambda t: "by hit win ▼" in t and f"n{best:04d}/0/fleet" in _table(t)[0], timeout=20)
    rows = _table(screen)
    assert "99.9%" in rows[0], screen
    # the rows below it come down in order: the pane's next rows are the next-highest hit rates
    shown = [float(m.group(1)) for ln in rows if (m := re.search(r"(\d+\.\d)%", ln))]
    assert shown == sorted(shown, reverse=True) and shown[:3] == [99.9, 99.8, 99.7]
    p.keys("q")
    deadline = time.monotonic() + 20
    while not status.exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert status.exists(), f"kvtop did not exit; last screen:\n{p.text()}"
    assert status.read_text().strip() == "0"
