"""``kvtop agent SOURCE --mqtt mqtt://broker/prefix``: fold a local source and publish per-source summaries on MQTT
for a fleet's dashboard (what it publishes and when: kvtop/agent.py)."""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
from collections.abc import Sequence

from kvtop import options
from kvtop.agent import DEFAULT_INTERVAL_S, FINAL_S, Agent
from kvtop.records import SourceId
from kvtop.settings import SettingsError


def parser() -> argparse.ArgumentParser:
    p = options.OptionParser(prog="kvtop agent",
                             description="fold a local source and publish per-source summaries on MQTT")
    p.add_argument("source", help="what to watch: zmq://, vllm://, sglang://, http:// (trtllm-serve), mqtt://, "
                                  "or FILE.jsonl")
    p.add_argument("--mqtt", required=True, help="broker to publish to: mqtt://[user@]host[:port]/prefix")
    p.add_argument("--run", default=None, help="run name in the topics (default: the host name)")
    p.add_argument("--interval", default=str(DEFAULT_INTERVAL_S), help="seconds between summaries (0.5-1 = 1-2 Hz)")
    p.add_argument("--raw", action="store_true", help="also publish the raw records (one source's drill-down)")
    options.add_settings(p, options.AGENT_SETTINGS, help={"json": "at the end, print what was published as JSON"})
    return p


def main(argv: Sequence[str]) -> int:
    """``kvtop agent SOURCE --mqtt URL [options]``: until ``--duration``, the end of a replayed recording, SIGTERM or
    Ctrl-C; then the last summaries, "offline", and the account on stdout (kvtop/agent.py's docstring)."""
    from kvtop.compose import build_attach_session
    from kvtop.mqtt_wire import MqttUrlError, parse_mqtt_url
    from kvtop.session import fold_repeats
    from kvtop.sinks.mqtt import MqttPublisher

    a = parser().parse_args(list(argv))
    interval = options.nonneg_float("--interval", a.interval)
    if not 0.05 <= interval <= 60:
        raise SettingsError("--interval", f"must be 0.05-60 seconds, got {a.interval!r}")
    duration = options.nonneg_float("--duration", a.duration) if a.duration is not None else None
    run = a.run or socket.gethostname()
    try:
        url = parse_mqtt_url(a.mqtt, password_file=a.mqtt_password_file)
    except MqttUrlError as exc:
        raise SettingsError("--mqtt", str(exc)) from None
    session = build_attach_session(a.source, command="attach", run=run)
    me = SourceId(f"agent-{socket.gethostname()}", 0, run)
    pub = MqttPublisher(url, me, on_status=session.on_source_status, problems=session.problems)
    agent = Agent(session, pub, interval_s=interval, agent=me, name=run)
    if a.raw:
        session.add_sink(agent.publish_raw)
    session.add_producer("agent", agent.run)
    # A recording ends: so does the agent (a live source runs until --duration or a signal).
    until = ("replay",) if "replay" in session.producer_names else ()
    from kvtop.modes import print_problems, run_reporting
    from kvtop.problems import EXIT_INTERRUPTED, EXIT_TERMINATED

    terminated: list[int] = []

    async def run_agent() -> None:
        # The publisher runs beside the session, not as one of its producers: it outlives the session by the
        # last summaries and the "offline" it says after them.
        sending = asyncio.ensure_future(pub.run())
        try:
            await run_reporting(session, duration, until, terminated)  # problems to stderr, like headless
        finally:
            agent.publish_once()   # what the fold holds at the end: the replay's last records too
            pub.stop()             # flushes, then says "offline"
            try:
                await asyncio.wait_for(asyncio.shield(sending), FINAL_S)
            except (asyncio.TimeoutError, asyncio.CancelledError):
                sending.cancel()
                await asyncio.gather(sending, return_exceptions=True)

    interrupted = False
    try:
        asyncio.run(run_agent())
    except KeyboardInterrupt:
        interrupted = True
        session.stop()
    unsent = pub.queued  # summaries still queued at the end: the broker never took them (down, unreachable)
    if unsent:
        session.problems.report("mqtt-publish.unsent", f"{unsent:,} record(s) never reached {url.display()}: the "
                                "broker could not be reached before the end", count=unsent, lost=True)
    print_problems(session.problems.take_lines(final=True))
    errors = fold_repeats([text for _, level, text in session.log if level in ("warn", "error")])
    result = {"sources": agent.published_keys(), "summaries": agent.published, "rounds": agent.seq,
              "mqtt_published": pub.published, "mqtt_dropped": pub.dropped, "mqtt_unsent": unsent,
              "broker": url.display(),
              "errors": errors[-10:], "problems": session.problems.to_json()}
    if a.json:
        print(json.dumps(result))
    else:
        print(f"kvtop agent: {len(agent.sources):,} source(s), {agent.published:,} summaries in {agent.seq:,} rounds, "
              f"{pub.published:,} records sent to {url.display()}"
              + (f", {pub.dropped:,} dropped" if pub.dropped else "") + (f", {unsent:,} never sent" if unsent else ""))
    # kvtop's exit statuses: 3 when the source gave nothing, 4 when data was lost (kvtop.problems)
    if interrupted:
        return EXIT_INTERRUPTED
    if terminated:
        return EXIT_TERMINATED
    return session.problems.exit_status(session.records_in)


__all__ = ["main", "parser"]
