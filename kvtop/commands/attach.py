"""``kvtop attach URL`` (and ``kvtop replay FILE``, kvtop/commands/replay.py: this command on a recording): the
same dashboard (or headless summary) on records that come from elsewhere: an MQTT broker (``mqtt://``,
``mqtts://``), a running ``trtllm-serve`` (``http://host:port``), the KV event stream of vLLM, SGLang or Dynamo
(``zmq://``, ``vllm://``, ``sglang://``: kvtop/sources/kv_events_zmq.py), or a recording (``FILE.jsonl``)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from kvtop import options
from kvtop.compose import MAX_GAP_S, build_attach_session
from kvtop.records import MAX_LINE_BYTES
from kvtop.session import MAX_SOURCES
from kvtop.settings import SettingsError, load_settings


def parser(command: str = "attach") -> argparse.ArgumentParser:
    """``kvtop attach``'s options (``command="replay"``: ``kvtop replay``'s, a FILE for the URL)."""
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


def main(argv: Sequence[str]) -> int:
    """``kvtop attach URL [options]``."""
    return run("attach", argv)


def run(command: str, argv: Sequence[str]) -> int:
    """``kvtop attach`` or ``kvtop replay`` (``command``) with ``argv``: the session, its sinks, then the
    dashboard or headless."""
    from kvtop import compose

    a = parser(command).parse_args(list(argv))
    settings = load_settings(options.given(a, options.ATTACH_SETTINGS), config_path=a.config)
    speed = options.converted(a, ("speed",))["speed"]
    from kvtop.modes import headless_wanted

    headless = headless_wanted(settings)
    if command == "replay" and headless and a.speed is None:
        speed = 0.0   # a headless replay is a summary: as fast as it can, unless --speed says otherwise
    try:
        compose.check_record(settings)  # before anything connects or reads
    except compose.RunError as exc:
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
        compose.add_sinks(session, settings)
    except compose.RunError as exc:
        # "--record: cannot write ...": the option is named once ("--record: --record: ..." and "sink: ..." were not)
        option, _, problem = str(exc).partition(": ")
        raise SettingsError(option, problem) from None
    if headless:
        from kvtop.modes import run_headless_until

        until = ("replay",) if "replay" in session.producer_names else ()
        return run_headless_until(session, settings.duration, settings.json, until)
    from kvtop.modes import run_dashboard

    return run_dashboard(session, settings)


__all__ = ["main", "parser", "run"]
