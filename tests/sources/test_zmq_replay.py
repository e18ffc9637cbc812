"""Issue 26: a replay endpoint that does not answer, or drips, never stalls the live stream. A real pyzmq publisher
on 127.0.0.1 (tests/kv_publisher.py: PUB + ROUTER replay, written from the documented format) into kvtop's
subscriber; the replay runs in its own task with a deadline, live batches wait behind it in seq order (the fold
needs them in order), and what the replay did not bring is counted lost (exit status 4)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest
from conftest import free_port
from kv_publisher import Publisher, removed, stored
from test_transport_zmq import _attached, _model, _stop, _until

from kvtop.problems import EXIT_LOST_DATA


def _stream(session) -> dict:
    return _model(session).summary()["stream"] if session.models else {}


@pytest.mark.slow
@pytest.mark.parametrize("answer", ["dead port", "silent router"])
async def test_a_replay_endpoint_that_does_not_answer_does_not_stall_the_stream(answer):
    # Every other batch lost on the way: 149 gaps. Before: each one blocked the rank ~1 s (1 s of replay silence).
    pub = Publisher(replay=answer == "silent router", replay_silent=True)
    replay = pub.replay_port if answer == "silent router" else free_port()
    try:
        session, task, src = await _attached(f"zmq://127.0.0.1:{pub.port}?replay=tcp://127.0.0.1:{replay}", pub)
        for i in range(300):
            pub.send([stored([i])], drop=i % 2 == 1)
        await _until(lambda: _stream(session).get("batches") == 150, timeout=30)
        s = _stream(session)
        assert _model(session).gpu.cached_blocks == 150
        assert s["lost_batches"] == 149 and s["replayed_batches"] == 0 and s["publisher_restarts"] == 0
        st = src.stats()[0]
        assert st["lost"] == 149 and st["gaps"] == 149 and st["received"] == 150
        # one replay asked, then gaps are lost without asking while it backs off (5 s, doubling)
        assert 1 <= st["replays"] <= 2 and st["replays_failed"] == st["replays"]
        gap = session.problems.get("zmq.gap")
        assert gap is not None and gap.lost and gap.count == 149 and session.problems.lost_data
        rp = session.problems.get("zmq.replay")
        assert rp is not None and "did not answer" in rp.message
        # the batches that waited behind the replay are the lag, in the summary
        assert s["max_lag_s"] >= 0.5 and s["max_lag_batches"] >= 1
        await _stop(session, task)
    finally:
        pub.close()


@pytest.mark.slow
async def test_a_dripping_replay_ends_at_its_deadline_and_what_it_brought_is_folded():
    # One batch every 0.9 s: before, the rank stayed in its replay loop as long as the drip went on (200 s here)
    pub = Publisher(replay_drip_s=0.9)
    try:
        session, task, src = await _attached(pub.url, pub)
        src.replay_deadline_s = 3.0
        src.replay_idle_s = 2.5                                           # the deadline ends it, not a pause
        pub.send([stored([0])])                                           # seq 0
        for h in range(1, 21):
            pub.send([stored([h])], drop=True)                            # seq 1..20: in the replay buffer only
        for h in range(21, 221):
            pub.send([stored([h])])                                       # seq 21..220 live
        await _until(lambda: _stream(session).get("last_seq") == 220, timeout=30)
        s = _stream(session)
        got = s["replayed_batches"]
        assert 1 <= got <= 5                                              # ~3 s / 0.9 s of drip
        assert s["batches"] == 201 + got and s["lost_batches"] == 20 - got and s["publisher_restarts"] == 0
        assert _model(session).gpu.cached_blocks == 201 + got            # every live batch, and what came back
        st = src.stats()[0]
        assert st["replayed"] == got and st["lost"] == 20 - got and st["behind"] == 0
        rp = session.problems.get("zmq.replay")
        assert rp is not None and "deadline" in rp.message
        gap = session.problems.get("zmq.gap")
        assert gap is not None and gap.lost and gap.count == 20 - got
        # seq 21 waited behind the replay until its deadline, with the 199 after it
        assert s["max_lag_s"] >= 2.0 and s["max_lag_batches"] == 199
        await _stop(session, task)
    finally:
        pub.close()


@pytest.mark.slow
async def test_batches_waiting_behind_a_replay_are_folded_when_the_run_ends():
    pub = Publisher(replay_drip_s=0.3)
    try:
        session, task, src = await _attached(pub.url, pub)
        src.replay_deadline_s = 120.0
        pub.send([stored([0])])
        for h in range(1, 6):
            pub.send([stored([h])], drop=True)
        for h in range(6, 16):
            pub.send([stored([h])])
        # the live batches keep being read while the replay drips: all 10 wait behind it
        await _until(lambda: src.stats()[0]["received"] == 11 and pub.replay_sent >= 2, timeout=30)
        assert src.stats()[0]["behind"] == 10
        # a replay that holds the stream a second or more is said where the stream's status shows (the header)
        status = f"zmq tcp://127.0.0.1:{pub.port}"
        await _until(lambda: "wait behind it" in session.status.get(status, ""), timeout=30)
        assert session.status[status] == "replay from seq 1: 10 live batch(es) wait behind it (120 s at most)"
        await _stop(session, task)
        s = _stream(session)
        got = s["replayed_batches"]
        assert got >= 2 and s["batches"] == 11 + got and s["lost_batches"] == 5 - got
        assert _model(session).gpu.cached_blocks == 11 + got
    finally:
        pub.close()


@pytest.mark.slow
async def test_a_gap_that_opens_while_a_replay_runs_is_asked_for_again():
    # The answer is what the publisher had when asked: seq 3, dropped after that, is asked for in a second replay
    pub = Publisher(replay_delay_s=1.0)
    try:
        session, task, src = await _attached(pub.url, pub)
        src.replay_deadline_s, src.replay_idle_s = 4.0, 2.5               # 1 s late is slow, not silent
        pub.send([stored([0])])
        pub.send([stored([1])], drop=True)
        pub.send([stored([2])])                                           # gap: replay from 1, answered in 1 s
        await _until(lambda: pub.replay_requests == 1, timeout=20)
        pub.send([stored([3])], drop=True)
        pub.send([stored([4])])                                           # read while the replay runs: waits
        await _until(lambda: src.stats()[0]["received"] == 3, timeout=20)
        assert src.stats()[0]["behind"] == 2 and _stream(session)["batches"] == 1
        await _until(lambda: _stream(session).get("last_seq") == 4, timeout=20)
        s = _stream(session)
        assert (s["batches"], s["replayed_batches"], s["lost_batches"]) == (5, 2, 0)
        assert pub.replay_requests == 2 and _model(session).gpu.cached_blocks == 5
        assert session.problems.get("zmq.gap") is None and not session.problems.lost_data
        await _stop(session, task)
    finally:
        pub.close()


@pytest.mark.slow
async def test_a_replay_asked_again_has_what_is_left_of_the_first_ones_deadline():
    # Answers are complete but 2 s late. Seq 4 comes while the first replay runs, after a gap (seq 3) its answer
    # will not have: the replay asked again for seq 3 has what is left of the 3 s that seq 4 may wait (~1 s), not 3 s
    # more (before: each replay asked again started a deadline of its own, and a chain of them held the stream on)
    pub = Publisher(replay_delay_s=2.0)
    try:
        session, task, src = await _attached(pub.url, pub)
        src.replay_deadline_s, src.replay_idle_s = 3.0, 2.9
        pub.send([stored([0])])
        pub.send([stored([1])], drop=True)
        pub.send([stored([2])])                                           # replay from 1
        await _until(lambda: pub.replay_requests == 1, timeout=20)
        pub.send([stored([3])], drop=True)
        pub.send([stored([4])])
        await _until(lambda: _stream(session).get("last_seq") == 4, timeout=20)
        s = _stream(session)
        assert (s["batches"], s["replayed_batches"], s["lost_batches"]) == (4, 1, 1)
        assert pub.replay_requests == 2 and src.stats()[0]["replays"] == 2
        rp = session.problems.get("zmq.replay")
        assert rp is not None and "(seq 3 on) ran past its 3 s deadline" in rp.message
        assert s["max_lag_s"] < 3.0 + 1.0
        await _stop(session, task)
    finally:
        pub.close()


async def test_a_stream_kvtop_falls_behind_shows_its_lag_and_a_clock_skew_does_not():
    pub = Publisher(replay=False)
    try:
        session, task, src = await _attached(pub.url, pub)
        for i in range(20):                                               # one at a time: kvtop keeps up
            pub.send([stored([i])], ts=time.time() - 3600.0)              # the engine's clock an hour behind
            await _until(lambda i=i: _stream(session).get("last_seq") == i, timeout=20)
        assert _stream(session)["max_lag_s"] == 0.0                       # a skewed clock is no lag
        # 500 batches at once, each published 3 s before it reaches kvtop: kvtop reads them behind
        for i in range(20, 520):
            pub.send([stored([i])], ts=time.time() - 3600.0 - 3.0)
        await _until(lambda: _stream(session).get("last_seq") == 519, timeout=30)
        s = _stream(session)
        assert 2.5 <= s["max_lag_s"] < 60 and s["lag_s"] == s["max_lag_s"] and s["lag_batches"] == 0
        await _stop(session, task)
    finally:
        pub.close()


async def test_messages_left_unread_by_a_run_that_fell_behind_are_lost():
    pub = Publisher(replay=False)
    try:
        session, task, src = await _attached(pub.url, pub)
        pub.send([stored([0])])
        await _until(lambda: _stream(session).get("last_seq") == 0, timeout=20)
        for i in range(1, 20_001):                                        # each published 5 s before kvtop reads it
            pub.send([stored([i])], ts=time.time() - 5.0)
        await _until(lambda: _stream(session).get("batches", 0) > 1, timeout=20)
        await _stop(session, task)
        folded = _stream(session)["batches"]
        p = session.problems.get("zmq.unread")
        assert folded < 20_001 and p is not None and p.lost and session.problems.lost_data
        assert 1 <= p.count <= 20_001 - folded and "s behind the stream" in p.message
    finally:
        pub.close()


async def test_a_replay_answer_is_bounded_in_bytes():
    pub = Publisher()
    try:
        session, task, src = await _attached(pub.url, pub)
        pub.send([stored([0])])
        for h in range(1, 11):
            pub.send([stored([h], tokens=256)], drop=True)                # ~0.9 KB each with its token ids
        frame_bytes = {len(pub.topic) + 8 + len(body) for _seq, body in pub.buffer[1:]}
        assert len(frame_bytes) == 1
        src.replay_max_bytes = 3 * frame_bytes.pop()                      # three of them
        pub.send([stored([11])])
        await _until(lambda: _stream(session).get("last_seq") == 11, timeout=20)
        s = _stream(session)
        assert (s["replayed_batches"], s["lost_batches"]) == (3, 7) and _model(session).gpu.cached_blocks == 5
        await _stop(session, task)
    finally:
        pub.close()


def test_lag_is_shown_in_the_header_and_the_text_summary():
    from test_kv_stream import batch

    from kvtop.run_summary import format_summary
    from kvtop.tiers import TierModel

    m = TierModel()
    m.apply(batch(0, [stored([1])], t=100.0))
    m.apply(batch(1, [stored([2])], t=101.0, lag_s=2.5, behind=40))
    m.apply(batch(2, [stored([3])], t=101.1, lag_s=2.4, behind=39))
    s = m.summary()["stream"]
    assert (s["lag_s"], s["lag_batches"], s["max_lag_s"], s["max_lag_batches"]) == (2.5, 40, 2.5, 40)
    assert "2.5 s behind at most (40 batches waiting behind a replay)" in format_summary(m.summary())
    m.apply(batch(3, [stored([4])], t=112.0))                             # 11 s later: caught up
    s = m.summary()["stream"]
    assert (s["lag_s"], s["lag_batches"], s["max_lag_s"]) == (0.0, 0, 2.5)
    m.apply(batch(4, [stored([5])], t=113.0, lag_s=0.7))                  # a new window: 0.7 s, none behind it
    s = m.summary()["stream"]
    assert (s["lag_s"], s["lag_batches"], s["max_lag_s"], s["max_lag_batches"]) == (0.7, 0, 2.5, 40)


async def test_lag_is_shown_on_the_dashboard():
    from test_kv_stream import batch

    from kvtop.records import SourceId as Sid
    from kvtop.session import Session
    from kvtop.settings import Settings
    from kvtop.ui.app import build_app

    session = Session(source=Sid("127.0.0.1:5557", 0, "t"))
    now = time.time()
    session.emit(batch(0, [stored([1, 2])], t=now))
    session.emit(batch(1, [stored([3])], t=now + 0.1, lag_s=2.9, behind=412))
    app = build_app(session, Settings(), run_session=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert "stream 2.9 s behind (412 batches)" in app.screen.query_one("#header").data.flags


@pytest.mark.slow
def test_headless_run_with_gaps_and_a_dead_replay_port_folds_at_the_stream_rate(tmp_path):
    """The held-out bar: >= 90% of the blocks folded, the loss counted, exit status 4."""
    pub = Publisher(replay=False)
    sent = {"live": 0, "dropped": 0}

    def feed() -> None:
        pub.wait_subscribed()
        end = time.monotonic() + 5.0
        i = 0
        while time.monotonic() < end:
            for _ in range(10):                                           # ~100 batches/s, every 3rd lost
                drop = i % 3 == 2
                pub.send([stored([i, i + 1_000_000])], drop=drop)
                sent["dropped" if drop else "live"] += 1
                i += 1
            time.sleep(0.1)

    t = threading.Thread(target=feed)
    t.start()
    try:
        out = subprocess.run([sys.executable, "-m", "kvtop", "attach",
                              f"zmq://127.0.0.1:{pub.port}?replay=tcp://127.0.0.1:{free_port()}",
                              "--headless", "--json", "--duration", "9"], capture_output=True, text=True, timeout=90)
    finally:
        t.join()
        pub.close()
    assert out.returncode == EXIT_LOST_DATA, out.stderr
    summary = json.loads(out.stdout)
    s = summary["stream"]
    assert s["batches"] >= 0.9 * sent["live"], (s, sent)
    assert summary["tiers"]["gpu"]["cached_blocks"] >= 0.9 * 2 * sent["live"]
    assert s["lost_batches"] >= 0.9 * sent["dropped"]
    kinds = {p["kind"]: p for p in summary["problems"]}
    assert kinds["zmq.gap"]["lost"] and kinds["zmq.gap"]["count"] == s["lost_batches"]
    assert "zmq.gap" in out.stderr


# ------------------------------------------------------------------------------------------ sequence numbers

async def test_an_implausible_seq_is_a_bad_message_not_a_gap_of_2_64_batches():
    pub = Publisher(replay=False)
    try:
        session, task, src = await _attached(pub.url, pub)
        pub.send([stored([1, 2])])                                        # seq 0
        pub.send([stored([3])], seq=(1 << 64) - 1)                        # -1 signed: not a batch's seq
        pub.send([stored([4])], seq=1 << 40)                              # 2^40 batches ahead: not this stream's
        pub.send([stored([5])], seq=1)                                    # the stream goes on
        pub.send([stored([6])], seq=2)
        await _until(lambda: _stream(session).get("batches") == 3, timeout=20)
        s = _stream(session)
        assert s["lost_batches"] == 0 and s["publisher_restarts"] == 0 and s["last_seq"] == 2
        assert _model(session).gpu.cached_blocks == 4                     # 1, 2, 5, 6: the fold was not cleared
        st = src.stats()[0]
        assert st["bad"] == 2 and st["lost"] == 0 and st["restarts"] == 0
        bad = session.problems.get("zmq.bad_message")
        assert bad is not None and bad.count == 2 and "seq jumped from 0 to 1,099,511,627,776" in bad.message
        assert session.problems.get("zmq.gap") is None
        await _stop(session, task)
    finally:
        pub.close()


async def test_a_jump_the_stream_goes_on_from_is_followed_as_a_new_start():
    pub = Publisher(replay=False)
    try:
        session, task, src = await _attached(pub.url, pub)
        pub.send([stored([1, 2])])                                        # seq 0
        far = 1 << 40
        for k in range(4):
            pub.send([stored([10 + k])], seq=far + k)                     # 2 skipped, then followed from far + 2
        await _until(lambda: _stream(session).get("last_seq") == far + 3, timeout=20)
        s = _stream(session)
        assert s["lost_batches"] == 0 and s["since_attach"] is True and s["seq_jumps"] == 1
        assert _model(session).gpu.cached_blocks == 2                     # 12, 13: a new start
        assert src.stats()[0]["bad"] == 2 and src.stats()[0]["seq_jumps"] == 1
        jump = session.problems.get("zmq.seq_jump")
        assert jump is not None and jump.lost and jump.count == 1
        await _stop(session, task)
    finally:
        pub.close()


async def test_restarts_are_problems():
    pub = Publisher(replay=False)
    try:
        session, task, src = await _attached(pub.url, pub)
        for i in range(200):
            pub.send([stored([i])], seq=i % 2)                            # 0, 1, 0, 1, ...
        await _until(lambda: _stream(session).get("batches") == 200, timeout=20)
        assert _stream(session)["publisher_restarts"] == 99 == src.stats()[0]["restarts"]
        p = session.problems.get("zmq.restart")
        assert p is not None and p.count == 99 and "seq went back 1 -> 0" in p.message
        await _stop(session, task)
    finally:
        pub.close()


def test_the_fold_refuses_what_the_source_refuses():
    """A recording carries kv_batch records too: the fold holds the same bounds."""
    from test_kv_stream import batch

    from kvtop.tiers import TierModel

    m = TierModel()
    m.apply(batch(5, [stored([1, 2])]))
    m.apply(batch((1 << 64) - 1, [stored([3])]))
    m.apply(batch(1 << 40, [stored([4])]))
    assert m.bad_records == 2 and "more than 16,777,216" in str(m.last_bad_reason)
    s = m.summary()["stream"]
    assert (s["lost_batches"], s["publisher_restarts"], s["batches"]) == (0, 0, 1) and m.gpu.cached_blocks == 2
    m.apply(batch(1 << 40, [stored([4])], resync=True))                 # the source followed it
    s = m.summary()["stream"]
    assert (s["lost_batches"], s["seq_jumps"], s["since_attach"]) == (0, 1, True) and m.gpu.cached_blocks == 1


# ------------------------------------------------------------------------------------------ memory

async def test_a_message_over_8_mib_is_refused_unread_and_counted():
    """A ~9 MB batch is refused before it is unpacked (a bad message, lost: its batch is the gap the next one shows)
    and the stream goes on, connected. Not by ZMQ's MAXMSGSIZE: libzmq aborted the process refusing the last frame
    of a multipart message (`Assertion failed: !_more (src/fq.cpp:80)`, 2 runs in 12 of this test)."""
    pub = Publisher(replay=False)
    try:
        session, task, src = await _attached(pub.url, pub)
        pub.send([stored([1])])                                           # seq 0
        # seq 1: a valid batch of 1M hashes of 9 bytes each: ~9 MB, refused before kvtop unpacks it
        pub.send([stored([(1 << 40) + h for h in range(1_000_000)], tokens=0)])
        pub.send([stored([2])])                                           # seq 2
        await _until(lambda: _stream(session).get("last_seq") == 2, timeout=20)
        s = _stream(session)
        assert s["batches"] == 2 and s["lost_batches"] == 1 and _model(session).gpu.cached_blocks == 2
        bad = session.problems.get("zmq.bad_message")
        assert bad is not None and bad.lost and "over 8 MiB: refused unread" in bad.message
        gap = session.problems.get("zmq.gap")
        assert gap is not None and gap.lost and gap.count == 1
        assert src.stats()[0]["disconnects"] == 0                          # the connection stayed up
        await _stop(session, task)
    finally:
        pub.close()


def test_the_fold_keeps_a_bounded_number_of_live_blocks():
    """Issue 26: stored hashes never removed cost ~90 B each without limit (2.8M -> 280 MB in 30 s)."""
    from kvtop.records import Record, SourceId
    from kvtop.tiers import TierModel

    m = TierModel()
    src = SourceId("h", 0, "t")
    n = 1_200_000                                                         # distinct blocks, none removed
    for i in range(n // 100):
        ev = {"type": "BlockStored", "block_hashes": list(range(i * 100, i * 100 + 100)), "medium": "GPU"}
        m.apply(Record(kind="kv_batch", data={"seq": i, "events": [ev]}, source=src, time=100.0 + i * 1e-4))
    kept = len(m.stream_fold.live["gpu"])
    assert kept <= (1 << 20) + (1 << 17) and m.gpu.cached_blocks == kept  # 2^20 while the capacity is unknown
    s = m.summary()["stream"]
    assert s["stored_blocks"]["gpu"] == n and s["forgotten_blocks"]["gpu"] == n - kept
    assert m.summary()["tiers"]["gpu"]["cached_approximate"] is True
    m.apply(Record(kind="kv_batch", data={"seq": n // 100, "events": [removed([5])]}, source=src, time=300.0))
    assert m.summary()["stream"]["unknown_removals"] == 1                  # a forgotten block's removal


def test_the_fold_bounds_live_blocks_at_twice_the_capacity_metrics_give():
    from test_kv_stream import VLLM_METRICS, batch

    from kvtop.records import Record, SourceId
    from kvtop.sources.engine_metrics import parse_metrics
    from kvtop.tiers import TierModel

    page = VLLM_METRICS.replace("{queries}", "0").replace("{device}", "0").replace("{host}", "0")

    def metrics(blocks: str) -> Record:
        samples = parse_metrics(page.replace('num_gpu_blocks="2048"', f'num_gpu_blocks="{blocks}"'))
        return Record(kind="metrics", data={"engine": "vllm", "url": "http://x/metrics", "samples": samples},
                      source=SourceId("h", 0, "t"), time=100.0)

    m = TierModel()
    m.apply(metrics("2048"))
    for i in range(100):
        m.apply(batch(i, [stored(list(range(i * 100, i * 100 + 100)))]))  # 10,000 blocks in a 2,048-block GPU
    kept = len(m.stream_fold.live["gpu"])
    assert kept <= 4096 + 512 and m.summary()["stream"]["forgotten_blocks"]["gpu"] == 10_000 - kept
    bad = m.bad_records
    m.apply(metrics("1e300"))               # a hostile capacity: the scrape is refused whole (metrics bounds)
    assert m.bad_records == bad + 1 and m.stream_fold.live_cap["gpu"] == 4096   # the bound stays where it was
