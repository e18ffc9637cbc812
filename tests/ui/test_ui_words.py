"""The screen's words (issue 24, item 5): the memory panel says what is simulated and "none" for no host pool,
the header's parts are separated, and no Python ``None`` reaches the screen at 80x24, 120x40 or 200x60."""

from __future__ import annotations

import html
import re
from typing import Any

import pytest
from recordings import BUSY_RECORDING, FROZEN_STARTED_AT, dashboard_screen, session_from_recording

from kvtop.records import SourceId, make, read_jsonl
from kvtop.session import Session
from kvtop.ui.app import build_app

pytestmark = pytest.mark.usefixtures("frozen_ui_clock")  # tests/conftest.py

SIZES = ((80, 24), (120, 40), (200, 60))


class Settings:
    refresh = 0.25
    theme = "dark"
    duration = None


def _session(simulated: bool, host_blocks: int, pinned: bool = True) -> Session:
    """The busy recording's stats and samples under a meta of our own: simulated or not, with a host pool of
    ``host_blocks`` (0: none), the host samples with or without a pinned pool."""
    source = SourceId(host="node", rank=0, run="words")
    session = Session(source=source)
    meta: dict[str, Any] = {"engine": "sim" if simulated else "trtllm", "model": "Qwen/Qwen3-8B", "gpu": "H200",
                            "tokens_per_block": 32, "primary_blocks": 256, "secondary_blocks": host_blocks,
                            "bytes_per_block": 4718592}
    if simulated:
        meta.update({"simulated": True, "sim_reason": "no GPU: built-in simulator"})
    session.emit(make("meta", meta, source=source, time=FROZEN_STARTED_AT - 3600))
    for rec in read_jsonl(BUSY_RECORDING):
        if isinstance(rec, Exception) or rec.kind not in ("stats", "gpu", "host"):
            continue
        data = dict(rec.data)
        if rec.kind == "host" and not pinned:
            data.pop("pinned_pool_bytes", None)
            data.pop("pinned_pool_origin", None)
        session.emit(make(rec.kind, data, source=source, time=rec.time))
    session.started_at = FROZEN_STARTED_AT
    return session


async def _memory(session: Session, size: tuple[int, int] = (120, 40)) -> tuple[str, str]:
    app = build_app(session, Settings(), run_session=False)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        panel = app.screen.query_one("#memory")
        return str(panel.border_title), panel.text()


async def test_the_memory_panel_says_simulated_for_the_simulators_pools() -> None:
    title, text = await _memory(_session(simulated=True, host_blocks=227))
    assert title == "Memory · simulated"
    assert "KV pool 4.00 GiB" in text
    title, text = await _memory(_session(simulated=False, host_blocks=227))
    assert title == "Memory"          # a real engine's pools are not marked
    assert "KV pool 4.00 GiB" in text


async def test_the_memory_panel_says_none_for_no_host_pool() -> None:
    _, text = await _memory(_session(simulated=False, host_blocks=0, pinned=False))
    assert re.search(r"KV pool none\b", text), text
    # a host pool of unknown size stays unknown, not "none"
    _, text = await _memory(_session(simulated=False, host_blocks=227, pinned=False))
    assert "KV pool ?" in text and "none" not in text


def _screen_text(svg: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", svg)).replace("\xa0", " ")


@pytest.mark.slow
def test_the_header_separates_its_parts_and_no_none_reaches_the_screen() -> None:
    """The busy recording, and sessions with the least they can say (no host pool, no pinned pool, a bare meta),
    at each size. (No ``None`` showed on the screen before this test either: the check keeps it so.)"""
    bare = Session(source=SourceId(host="x", rank=0, run="r"))
    bare.emit(make("meta", {"engine": "trtllm", "primary_blocks": 100}, source=bare.source, time=FROZEN_STARTED_AT))
    sessions = {"busy": session_from_recording(), "no host pool": _session(False, 0, pinned=False),
                "simulated": _session(True, 227), "bare meta": bare}
    for name, session in sessions.items():
        for size in SIZES:
            text = _screen_text(dashboard_screen(session, size))
            assert "None" not in text, (name, size, re.findall(r".{0,30}None.{0,30}", text))
            if name != "busy":
                continue
            # the model, the GPU, the engine: each after a rule, never run together
            if size[0] >= 110:
                assert re.search(r"Qwen/Qwen3-8B │ H200 │ TensorRT-LLM 1\.2", text), size
                assert re.search(r"data \d\d:\d\d:\d\d │ up \d+:\d\d:\d\d", text), size
            else:
                assert re.search(r"Qwen3-8B │ up \d+:\d\d:\d\d │", text), size


async def test_a_stream_without_metrics_says_the_pool_size_is_missing_not_the_events() -> None:
    """`kvtop attach zmq://` on a vLLM stream and no /metrics (seen in tmux at 120x40): the GPU panel said "no KV
    events: cached vs empty unknown" over the blocks the events had announced, and the host panel said its note
    twice. The pool's size is what is missing; each note once."""
    from kv_publisher import batch, stored

    from kvtop.records import make

    session = Session(source=batch(0, []).source)
    session.emit(make("meta", {"engine": "vllm", "attach": "zmq"}, session.source, 100.0))
    for i in range(5):
        session.emit(batch(i, [stored(list(range(i * 40, i * 40 + 40)), tokens=16)], t=100.0 + i))
    app = build_app(session, Settings(), run_session=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        gpu, host = app.screen.query_one("#tier-gpu").text(), app.screen.query_one("#tier-host").text()
    assert "no KV events" not in gpu
    assert gpu.count("GPU pool size unknown (no created event, meta or /metrics yet)") == 1
    assert host.count("host pool size unknown (no created event, meta or /metrics yet)") == 1
    assert "reuse tree 200 blocks" in gpu
