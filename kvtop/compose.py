"""What every mode's session shares: where an attached session's records come from, the sinks, the engine's meta,
the machine samplers, and what only the end of a run can tell.

A driven run (kvtop/runner.py), ``kvtop attach`` / ``kvtop replay`` (kvtop/commands/attach.py), ``kvtop agent`` and
``kvtop.watch(llm)`` (kvtop/watcher.py) each build a :class:`kvtop.session.Session` and hand it the same parts from
here; nothing here imports Textual, and what one part needs (the MQTT client, the Prometheus server, psutil, NVML)
is imported where that part is added.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvtop.records import MAX_LINE_BYTES, RecordError, SourceId
from kvtop.session import MAX_SOURCES, Session
from kvtop.settings import Settings, SettingsError
from kvtop.textsafe import clean

# replay: an idle stretch of a recording (a pause overnight, a clock that jumped) lasts at most 10 s on screen.
MAX_GAP_S = 10.0


class RunError(RuntimeError):
    """A run cannot start; the message says what to change (printed as one line by the CLI)."""


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


def check_record(settings: Settings) -> None:
    """A recording holds one run: ``--record FILE`` onto a file that already has something in it is refused (a
    RunError, exit 2) before anything starts, and the file is left as it was; ``--append`` adds the run to it
    (``kvtop report`` splits such a file into its runs). Appended blindly, a second demo run became one run with
    two engines' records folded together."""
    if not settings.record or settings.append:
        return
    try:
        size = os.stat(settings.record).st_size
    except OSError:
        return  # not there (created), or not readable: the open says why
    if size > 0 and os.path.isfile(settings.record):
        raise RunError(f"--record: {clean(settings.record, 200)} already holds a recording ({size:,} bytes); "
                       "give a new file, or --append to add this run to it")


def add_sinks(session: Session, settings: Settings) -> None:
    """--record, --publish and --prometheus-port, wherever the records come from."""
    if settings.record:
        check_record(settings)
        try:
            add_recorder(session, settings.record)
        except OSError as exc:
            raise RunError(f"--record: cannot write {settings.record}: {exc.strerror or exc}") from None
    if settings.publish:
        from kvtop.mqtt_wire import MqttUrlError

        try:
            add_publisher(session, settings.publish, password_file=settings.mqtt_password_file,
                          on_status=session.on_source_status)
        except MqttUrlError as exc:
            raise RunError(f"--publish: {exc}") from None
    if settings.prometheus_port is not None:
        # A scrape reads the snapshots the session publishes (kvtop/tiers/snapshot.py), never the live fold: at the
        # refresh, or once a second at most often (a scrape comes every 15 s by Prometheus's default).
        session.publish_s = max(settings.refresh, 1.0)
        try:
            add_exporter(session, lambda: dict(session.models) or session.model, settings.prometheus_port,
                         settings.prometheus_addr)
        except OSError as exc:
            raise RunError(f"--prometheus-port: cannot listen on {settings.prometheus_addr}:"
                           f"{settings.prometheus_port}: {exc.strerror or exc}") from None
        except OverflowError:
            raise RunError(f"--prometheus-port: {settings.prometheus_port} is not a port (0 to 65535)") from None
        if not is_loopback(settings.prometheus_addr):
            session.problems.report("prometheus.exposed", f"--prometheus-addr {settings.prometheus_addr}: /metrics "
                                    "is served beyond this machine, without authentication (model names, run "
                                    "names and load are readable by anyone who can reach the port)")


def add_recorder(session: Session, path: str | os.PathLike[str], *, close: bool = True) -> Any:
    """Every record the session folds appended to ``path`` (kvtop/sinks/recorder.py); ``close``: closed when the
    session's run ends (else by the caller). OSError where the file cannot be opened."""
    from kvtop.sinks.recorder import Recorder

    recorder = Recorder(path, problems=session.problems)
    session.recorder = recorder
    session.add_sink(recorder.write, recorder.close if close else None)
    return recorder


def add_publisher(session: Session, url: str, *, password_file: str | os.PathLike[str] | None,
                  on_status: Callable[[str, str], None], producer: bool = True) -> Any:
    """Every record published on MQTT at ``url`` (kvtop/sinks/mqtt.py); ``producer``: its connection runs as one of
    the session's producers (else beside the session, by the caller, which stops it). MqttUrlError for a bad URL."""
    from kvtop.sinks import mqtt as mqtt_sink

    publisher = mqtt_sink.publisher_from_url(url, source=session.source, password_file=password_file,
                                             on_status=on_status, problems=session.problems)
    session.publisher = publisher
    session.add_sink(publisher.publish, None)
    if producer:
        session.add_producer("mqtt-publish", publisher.run, publisher.stop)
    return publisher


def add_exporter(session: Session, models: Callable[[], Any], port: int, addr: str, *,
                 source: SourceId | None = None, close: bool = True) -> Any:
    """/metrics served on ``addr:port`` (0: any free port, the exporter's ``port`` says which) from ``models()``'
    published snapshots (kvtop/sinks/prometheus.py); ``close``: stopped when the session's run ends. OSError where
    the port cannot be had, OverflowError for a number that is not a port."""
    from kvtop.sinks.prometheus import PrometheusExporter

    exporter = PrometheusExporter(models, port=port, addr=addr, source=source)
    exporter.start()
    session.add_sink(exporter.observe, exporter.stop if close else None)
    return exporter


def is_loopback(addr: str) -> bool:
    """True for an address only this machine can reach (127.0.0.0/8, ::1, localhost)."""
    import ipaddress

    if addr.strip().lower() in ("localhost", "localhost."):
        return True
    try:
        return ipaddress.ip_address(addr.strip().strip("[]")).is_loopback
    except ValueError:
        return False  # a host name: it may resolve to anything


def finish_problems(session: Session) -> None:
    """What only the end of a run can tell: it never got data; a sink still held records it could not send."""
    publisher = getattr(session, "publisher", None)
    if publisher is not None:
        unsent = publisher.queued
        if unsent:
            session.problems.report("mqtt-publish.dropped", f"{unsent:,} record(s) never reached "
                                    f"{publisher.url.display()} ({publisher.dropped:,} dropped before)",
                                    count=unsent, lost=True)
    if session.records_in == 0:
        where = session.meta.get("attached_to") or "the engine"
        session.problems.report("run.no_data", f"no records from {where} in this run")


def engine_meta(llm: Any, **known: Any) -> dict[str, Any]:
    """The ``meta`` record for an engine: its own ``describe()`` (SimLLM), else what a TensorRT-LLM ``LLM``'s
    ``args`` tell, through the one builder every real-engine path uses (:func:`kvtop.engines.meta.meta_from_llm`).
    ``known``: what the caller knows where the LLM's args say nothing (a driven run's settings: model,
    tokens_per_block, host_cache_bytes, engine_version); without an engine_version, the ``tensorrt_llm`` module's
    where the caller imported it (never imported here: seconds, and a GPU)."""
    describe = getattr(llm, "describe", None)
    if callable(describe):
        with contextlib.suppress(Exception):
            return dict(describe())
    from kvtop.engines.meta import meta_from_llm

    if "engine_version" not in known:
        version = getattr(sys.modules.get("tensorrt_llm"), "__version__", None)
        known["engine_version"] = version if isinstance(version, str) else None
    return meta_from_llm(llm, **known)


def engine_clock(engine: Any, speed: float) -> Callable[[], float] | None:
    """The clock a run's records are stamped with (a driven run's, and ``kvtop.watch(llm)``'s): the simulator's
    own where it is not paced to the wall clock (``--speed`` other than 1), else None (the wall clock). At
    ``--speed 0`` the simulator runs as fast as it can, and wall-clock stamps made every rate a measure of this
    machine: a 64 GB host read -37% output tok/s against no host cache where the simulator's own clock said +40%
    (8 s driven runs, seed 3). On its clock the dashboard's rates, the recording (and so its replay) and
    ``kvtop report`` say what the engine did."""
    if speed == 1 or not isinstance(getattr(engine, "sim_time_s", None), (int, float)):
        return None
    epoch = time.time() - engine.sim_time_s   # the simulated clock's zero, as an epoch time

    def clock() -> float:
        return epoch + engine.sim_time_s
    return clock


def add_machine_samplers(session: Session, meta: dict[str, Any], interval_s: float, *, gpu: bool = True,
                         clock: Callable[[], float] | None = None) -> None:
    """GPU memory (NVML: no driver here is the normal case) and host memory, sampled every ``interval_s`` in a
    worker thread (the calls block); the host's pinned pool sized from what the engine said (its host blocks x
    bytes per block, else its host cache in bytes: /proc cannot measure it, kvtop/sources/host.py). ``clock``:
    what their records are stamped with, the engine's records' clock (engine_clock); None: wall."""
    from kvtop.sources.host import HostSource

    if gpu:
        from kvtop.sources.nvml import NvmlSource

        nvml = NvmlSource(source=session.source, wall_clock=clock or time.time)
        session.add_sampler("nvml", nvml.sample, interval_s)
        session.add_closer(nvml.close)
    host = HostSource(source=session.source, clock=clock or time.time)
    if meta.get("secondary_blocks") and meta.get("bytes_per_block"):
        host.set_pinned_pool_from_blocks(int(meta["secondary_blocks"]), int(meta["bytes_per_block"]))
    elif meta.get("host_cache_bytes"):
        host.set_pinned_pool(int(meta["host_cache_bytes"]))
    session.add_sampler("host", host.sample, interval_s)


__all__ = ["MAX_GAP_S", "RunError", "add_exporter", "add_machine_samplers", "add_publisher", "add_recorder",
           "add_sinks", "build_attach_session", "check_record",
           "engine_meta", "finish_problems", "is_loopback"]
