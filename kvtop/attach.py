"""``kvtop attach URL`` and ``kvtop replay FILE``: the same dashboard (or headless summary) on records that come
from elsewhere: an MQTT broker (``mqtt://``, ``mqtts://``), a running ``trtllm-serve`` (``http://host:port``), the
KV event stream of vLLM, SGLang or Dynamo (``zmq://``, ``vllm://``, ``sglang://``: kvtop/sources/kv_events_zmq.py),
or a recording (``FILE.jsonl``)."""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence
from pathlib import Path

from kvtop import options
from kvtop.records import MAX_LINE_BYTES, RecordError, SourceId
from kvtop.session import MAX_SOURCES, Session
from kvtop.settings import SettingsError, load_settings
from kvtop.textsafe import clean

# replay: an idle stretch of a recording (a pause overnight, a clock that jumped) lasts at most 10 s on screen.
MAX_GAP_S = 10.0


def _parser(command: str) -> argparse.ArgumentParser:
    p = options.OptionParser(prog=f"kvtop {command}")
    if command == "attach":
        p.add_argument("url", help="mqtt://[user@]host[:port]/prefix, mqtts://..., http://host:port (trtllm-serve), "
                                   "zmq://host:5557[?replay=tcp://host:5558] (vLLM/SGLang KV events), "
                                   "vllm://host:8000, sglang://host:30000, or FILE.jsonl")
        p.add_argument("--run", default=None, help="MQTT: only this run")
        options.add_settings(p, options.ATTACH_ONLY_SETTINGS)
        p.add_argument("--interval", default=None, help="trtllm-serve poll interval in seconds (default 0.5)")
    else:
        p.add_argument("file", help="a kvtop recording (JSONL)")
    p.add_argument("--max-gap", default=None, metavar="SECONDS",
                   help="replay: an idle stretch of the recording lasts at most this long (default 10)")
    p.add_argument("--max-line-bytes", default=None, metavar="BYTES",
                   help="a recording line or MQTT payload larger than this is skipped as bad (default 8 MiB)")
    p.add_argument("--max-sources", default=None, metavar="N",
                   help="keep at most N sources; records of more are refused and counted (default 4096)")
    # --speed is the simulator's pacing setting, here the replay's; from the command line only (KVTOP_SPEED paces
    # the simulator of a driven run, not a replay).
    options.add_settings(p, ("speed",), help={
        "speed": "replay speed: 1 = as recorded, 0 = as fast as possible (default: 1 on the dashboard, where + and "
                 "- change it; headless: as fast as possible)"})
    options.add_settings(p, options.ATTACH_SETTINGS, help={
        "duration": "stop after this many seconds (default: at the recording's end; a live source: never)"})
    options.add_config_option(p)
    return p


def build_attach_session(target: str, *, command: str, speed: float = 1.0, run: str | None = None,
                         password_file: str | None = None, interval_s: float = 0.5,
                         warmup_requests: int = 0, max_gap_s: float | None = MAX_GAP_S,
                         max_line_bytes: int = MAX_LINE_BYTES, max_sources: int = MAX_SOURCES,
                         hold_at_end: bool = False) -> Session:
    """A session whose only producer is the remote source; sinks are added by the caller. A recording's is a
    player (``session.player``); ``hold_at_end``: it waits at the end for a seek back (the dashboard's)."""
    # No meta of its own: the first source with data becomes session.model, and its meta names its engine.
    session = Session(source=SourceId(host=target, rank=0, run=run or ""), warmup_requests=warmup_requests,
                      meta={"attached_to": clean(target)}, max_sources=max_sources)
    lowered = target.lower()
    if command == "attach" and lowered.startswith(("zmq://", "vllm://", "sglang://")):
        from kvtop.sources.kv_events_zmq import ZmqUrlError, attach_stream

        try:
            attach_stream(session, target, run=run, interval_s=max(interval_s, 0.5))
        except ZmqUrlError as exc:
            raise SettingsError("URL", str(exc)) from None
        return session
    if command == "replay" or (not lowered.startswith(("mqtt://", "mqtts://", "http://", "https://"))):
        path = Path(target)
        if not path.exists():
            raise SettingsError("FILE", f"no such recording: {clean(target)}")
        if path.is_dir():
            raise SettingsError("FILE", f"{clean(target)} is a directory, not a recording (a .jsonl file)")
        from kvtop.sources.replay import ReplayPlayer

        bad: list[RecordError] = []
        name = clean(path.name, 80)

        def on_bad(err: RecordError) -> None:
            bad.append(err)  # the fold never sees a bad line; the log names it, with its line number
            session.problems.report("replay.bad_line", f"{name}: {err} ({len(bad):,} bad line(s) so far)",
                                    lost=True)

        def on_end(n: int) -> None:
            if n == 0 and player.generation == 0:
                session.problems.report("replay.no_records", f"{name}: no records"
                                        + (f" ({len(bad):,} bad lines: not a kvtop recording?)" if bad
                                           else " (empty file)"))
            session.note("info", f"replay of {name} finished"
                         + (f" ({len(bad)} bad lines skipped)" if bad else ""))

        # The dashboard drives it (pause, seek, speed) and it waits at the end for a seek back; headless, it ends
        # the run at the recording's end.
        player = ReplayPlayer(path, session.emit_many, speed=speed, on_error=on_bad, max_gap_s=max_gap_s,
                              max_line_bytes=max_line_bytes, restart=session.reset_fold,
                              refold_many=session.fold_many, on_end=on_end, hold_at_end=hold_at_end)

        async def run_replay() -> None:
            await player.run()

        session.player = player
        session.meta["attached_to"] = str(path)
        session.add_producer("replay", run_replay, player.stop)
        return session
    if lowered.startswith(("mqtt://", "mqtts://")):
        from kvtop.sources.mqtt import MqttUrlError, subscriber_from_url

        try:
            sub = subscriber_from_url(target, session.emit, password_file=password_file, run=run,
                                      on_status=session.on_source_status, on_error=_log_only(session),
                                      problems=session.problems)
        except MqttUrlError as exc:
            raise SettingsError("URL", str(exc)) from None
        sub.max_payload_bytes = max_line_bytes
        session.meta["attached_to"] = clean(sub.url.display()) if hasattr(sub.url, "display") else "mqtt"
        session.stale.enabled = True  # remote sources: one that stops sending without a last will goes stale
        session.add_producer("mqtt", sub.run, sub.stop)
        return session
    from kvtop.sources.trtllm_serve import serve_source_from_url

    try:
        src = serve_source_from_url(target, session.emit, interval_s=interval_s, run=run,
                                    on_status=session.on_source_status, on_error=_log_only(session),
                                    problems=session.problems)
    except ValueError as exc:
        raise SettingsError("URL", str(exc)) from None
    session.add_producer("trtllm-serve", src.run, src.stop)
    return session


def _log_only(session: Session) -> Callable[[str, str], None]:
    """on_error for sources that report their problems themselves: the event log only, no second problem."""

    def on_error(name: str, message: str) -> None:
        session.note("warn", f"{name}: {message}")

    return on_error


def main(command: str, argv: Sequence[str]) -> int:
    from kvtop import runner

    a = _parser(command).parse_args(list(argv))
    settings = load_settings(options.given(a, options.ATTACH_SETTINGS), config_path=a.config)
    speed = options.converted(a, ("speed",))["speed"]
    from kvtop.modes import headless_wanted

    headless = headless_wanted(settings)
    if command == "replay" and headless and a.speed is None:
        speed = 0.0   # a headless replay is a summary: as fast as it can, unless --speed says otherwise
    try:
        runner.check_record(settings)  # before anything connects or reads
    except runner.RunError as exc:
        raise SettingsError("--record", str(exc).removeprefix("--record: ")) from None
    target = a.url if command == "attach" else a.file
    interval = options.nonneg_float("--interval", a.interval) if command == "attach" and a.interval else 0.5
    max_gap = options.nonneg_float("--max-gap", a.max_gap) if a.max_gap is not None else MAX_GAP_S
    session = build_attach_session(target, command=command, speed=speed,
                                   run=getattr(a, "run", None), password_file=getattr(a, "mqtt_password_file", None),
                                   interval_s=interval or 0.5, warmup_requests=settings.warmup_requests,
                                   max_gap_s=max_gap or None,
                                   max_line_bytes=options.whole_number("--max-line-bytes", a.max_line_bytes, 1024)
                                   if a.max_line_bytes is not None else MAX_LINE_BYTES,
                                   max_sources=options.whole_number("--max-sources", a.max_sources, 1)
                                   if a.max_sources is not None else MAX_SOURCES,
                                   hold_at_end=not headless)
    try:
        runner.add_sinks(session, settings)
    except runner.RunError as exc:
        # "--record: cannot write ...": the option is named once ("--record: --record: ..." and "sink: ..." were not)
        option, _, problem = str(exc).partition(": ")
        raise SettingsError(option, problem) from None
    if headless:
        from kvtop.modes import run_headless_until

        until = ("replay",) if "replay" in [n for n, _ in session._producers] else ()
        return run_headless_until(session, settings.duration, settings.json, until)
    from kvtop.modes import run_dashboard

    return run_dashboard(session, settings)


__all__ = ["build_attach_session", "main"]
