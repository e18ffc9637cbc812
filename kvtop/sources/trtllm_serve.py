"""Attach to a running ``trtllm-serve``: its monitoring endpoints, polled into records.

Endpoints (trtllm-kv.md section 5; ``tensorrt_llm/serve/openai_server.py``):

- ``GET /metrics``: a JSON list of iteration-stats dicts (not Prometheus), each a ``stats`` record verbatim.
  Empty unless the server's ``--extra_llm_api_options`` YAML says ``enable_iter_perf_stats: true`` (PyTorch
  backend; the TRT backend always has them).
- ``POST /kv_cache_events``: a JSON list of KV cache event dicts, each a ``kv_event`` record. Empty unless
  ``kv_cache_config: {event_buffer_max_size: N > 0, enable_block_reuse: true}``.
- ``GET /perf_metrics``: finished requests' timings and KV cache counters, each a ``request`` record (with
  ``ttft_s``/``e2e_s`` like the workload driver's). Needs ``return_perf_metrics: true`` and
  ``perf_metrics_max_requests > 0``; returns ``[]`` otherwise.
- ``GET /version`` and ``GET /v1/models`` once, for the ``meta`` record (the model id gives the block size,
  kvtop/engines/meta.py).
- ``GET /prometheus/metrics`` (TensorRT-LLM 1.3+ with ``return_perf_metrics``): its ``trtllm_*`` KV metrics as
  ``stats`` records (kvtop/sources/trtllm_prometheus.py), read only while ``/metrics`` is off, empty or drained.

Drained: 1.3's server runs its own Prometheus collector loop over the same ``get_stats_async`` queue that
``/metrics`` reads, so each iteration reaches one reader only. Iterations missing between two of kvtop's polls
(``iter``, or ``statsSequence`` where the server numbers its frames; not frames it says it dropped itself), or
``/metrics`` staying empty while the collector counts finished requests, mean another reader: said once
(``DRAINED_HINT``), and Prometheus read beside it. ``/v1/kv_cache_hints`` (a client's "truncate" request that
drops blocks) is an action, not a reading: kvtop never calls it; the blocks it drops arrive as ``removed`` events.

All are drain-once queues on the server: whoever polls first gets the items, so only one kvtop (or other
collector) should attach to a server. The server answers an empty ``/metrics`` or ``/kv_cache_events`` only
after waiting 2 s for items (``get_stats_async(2)``), so an idle server's poll takes ~2 s. Each endpoint is
polled in a loop of its own, its next request armed only after its last finished; every request has a total
deadline (``HTTP_TIMEOUT_S``, kvtop/sources/httpfetch.py), so a server that trickles one endpoint's answer holds
neither that endpoint past the deadline nor the others at all, and a run ends on time. An endpoint that answers
an error, garbage or nothing in time is a problem of its own kind (``trtllm-serve.metrics``, ...), counted as
lost data.

An endpoint that is off is not an error to stop on: 404/405/501 means the server has no such route; an endpoint
that stays empty while the other one shows the engine busy is off in the config. Either way ``on_status`` says
which server option turns it on (``HINTS``), ``endpoints[name].hint`` keeps it for the screen, and the source
keeps emitting what the other endpoints give.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.client
import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from kvtop.engines.meta import real_engine_meta
from kvtop.problems import Problems
from kvtop.records import Record, RecordError, SourceId, make, parse_engine_dict
from kvtop.sources.httpfetch import BodyTooLarge, DeadlineExceeded, HttpStatusError, fetch
from kvtop.sources.trtllm_prometheus import PrometheusStats, parse_samples
from kvtop.stopsignal import StopSignal

Sink = Callable[[Record], None]
Callback = Callable[[str, str], None]  # (name, message)

STATS, EVENTS, PERF = "stats", "kv_events", "perf_metrics"
PROM = "prometheus"  # GET /prometheus/metrics: read while /metrics is off or drained (trtllm_prometheus.py)
HINTS = {
    STATS: "iteration stats are off: add `enable_iter_perf_stats: true` to the YAML given to trtllm-serve "
           "--extra_llm_api_options (PyTorch backend; the TRT backend has them on by default)",
    EVENTS: "KV cache events are off: add `kv_cache_config: {event_buffer_max_size: 1024, enable_block_reuse: "
            "true}` to the YAML given to trtllm-serve --extra_llm_api_options",
    PERF: "request metrics are off: add `return_perf_metrics: true` and `perf_metrics_max_requests: 1000` to the "
          "YAML given to trtllm-serve --extra_llm_api_options",
    PROM: "Prometheus metrics are off: add `return_perf_metrics: true` to the YAML given to trtllm-serve "
          "--extra_llm_api_options (its KV cache metrics need TensorRT-LLM 1.3 or later)",
}
DRAINED_HINT = ("another reader is likely draining the iteration-stats queue that /metrics reads (TensorRT-LLM "
                "1.3's own Prometheus collector loop when return_perf_metrics is on, or a second kvtop or collector): "
                "counts summed per iteration undercount; kvtop also reads /prometheus/metrics")
DRAIN_POLLS = 2  # iterations missing between two polls, twice: another reader (a one-off gap may be a restart)
MAX_DP_RANKS = 1024  # an attentionDpRank at or past this is no rank (a row's own source is the server's then)
QUEUE_FULL = 1000  # trtllm-serve's stats queue (iter_stats_max_iterations default): a poll this big may be overflow
# Every request's total deadline (connect, headers, body: kvtop/sources/httpfetch.py). trtllm-serve waits 2 s for
# items before answering an empty /metrics or /kv_cache_events, then sends its answer whole (a few MB at most); 5 s
# is 2.5 times that wait. A server that trickles (one byte every 5 s defeats a socket timeout) or never ends its
# body is cut there, named as a problem, and asked again after a backoff; the other endpoints go on meanwhile.
HTTP_TIMEOUT_S = 5.0
# An answer is read up to 64 MiB: trtllm-serve's largest, a /metrics list of a few thousand ~1 KB iteration dicts,
# is a few MB; a server (or something posing as one) sending gigabytes must not fill kvtop's memory.
MAX_BODY_BYTES = 64 << 20
META_BYTES = 1 << 20  # /version and /v1/models: a few hundred bytes
MAX_BACKOFF_S = 5.0
OFF_RETRY_S = 30.0  # an endpoint found missing (404) is asked again every 30 s: a restarted server may have it
EMPTY_POLLS_OFF = 3  # empty while another endpoint shows activity, 3 polls in a row (~1.5-6 s): off, not a race
IDLE_HINT_S = 30.0  # an endpoint that never delivered in 30 s: say which option turns it on (once; maybe idle)


@dataclass
class Endpoint:
    """What kvtop knows about one endpoint: ``state`` is unknown | ok | empty | off | error."""

    name: str
    method: str
    path: str
    state: str = "unknown"
    hint: str | None = None  # the server option that turns it on, while it looks off
    items: int = 0  # items received in total
    bad: int = 0  # malformed items skipped
    empty_polls: int = 0  # consecutive
    failures: int = 0  # consecutive errors
    due: float = 0.0  # monotonic time before which it is not polled (backoff / off)
    last_error: str | None = None
    enabled: bool = True
    outcome: str = ""  # the last request's: ok | error (it answered, wrongly) | unreachable; "" before the first
    last_count: int = 0  # items of the last answer

    @property
    def problem_kind(self) -> str:
        """Its kind in the problems registry: ``trtllm-serve.metrics``, ``trtllm-serve.kv_cache_events``, ..."""
        return "trtllm-serve" + self.path.replace("/", ".")


@dataclass
class ServePoll:
    """One poll: items received per endpoint, and whether the server answered at all."""

    counts: dict[str, int] = field(default_factory=dict)
    reachable: bool = False


async def _none() -> None:
    return None


class TrtllmServeSource:
    """Polls a ``trtllm-serve`` at ``url`` (``http://host:port``) every ``interval_s`` into ``sink``.

    Same shape as :class:`kvtop.sources.poller.EnginePoller`: ``await run()`` until :meth:`stop`, or
    ``await poll_once()``. ``on_status(name, message)`` gets reachability and endpoint on/off changes
    (``name`` is ``"trtllm-serve"`` or ``"trtllm-serve.<endpoint>"``); ``on_error`` gets malformed items.
    """

    def __init__(
        self,
        url: str,
        source: SourceId | None = None,
        interval_s: float = 0.5,
        sink: Sink | None = None,
        *,
        on_status: Callback | None = None,
        on_error: Callback | None = None,
        perf_metrics: bool = True,
        timeout_s: float = HTTP_TIMEOUT_S,
        clock: Callable[[], float] = time.time,
        problems: Problems | None = None,
    ):
        self.problems = problems  # unreachable server, endpoint errors, malformed items
        parts = urlsplit(url if "://" in url else f"http://{url}")
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"{url}: expected http://host:port of a running trtllm-serve")
        self.base = f"{parts.scheme}://{parts.netloc}{parts.path.rstrip('/')}"
        self.source = source or SourceId(host=parts.netloc, rank=0, run="trtllm-serve")
        if sink is None:
            raise TypeError("TrtllmServeSource needs a sink (a callable taking one Record)")
        self.sink = sink
        self.interval_s = interval_s
        self.on_status = on_status
        self.on_error = on_error
        self.timeout_s = timeout_s
        self.clock = clock
        self.endpoints = {
            STATS: Endpoint(STATS, "GET", "/metrics"),
            EVENTS: Endpoint(EVENTS, "POST", "/kv_cache_events"),
            PERF: Endpoint(PERF, "GET", "/perf_metrics", enabled=perf_metrics),
            PROM: Endpoint(PROM, "GET", "/prometheus/metrics", enabled=False),  # see _want_prometheus
        }
        self.prometheus = PrometheusStats()
        self._rank_sources: dict[int, SourceId] = {}   # attention-DP rank -> its source (_rank_source)
        self.stats_drained = False  # another reader takes iteration stats from the queue /metrics reads
        self.stats_missing = 0      # iterations that never reached kvtop (gaps in ``iter``)
        self._last_iter: dict[Any, int] = {}
        self._gap_polls = 0
        self._engine_dropped = 0  # the last statsDroppedFrames seen (newer main)
        self._prom_completed: float | None = None
        self.reachable: bool | None = None  # None until the first poll
        self.meta: dict[str, Any] | None = None
        self.polls = 0
        self._failures = 0
        self._started = time.monotonic()
        self._busy_events = 0  # the last /kv_cache_events answer's events other than "created"
        self._unreachable: str | None = None  # the last "cannot reach" message
        self._stop = StopSignal()

    # ------------------------------------------------------------------------------------------ lifecycle

    def stop(self) -> None:
        """Ask :meth:`run` to return. Safe from the loop's thread or any other thread, before or during run."""
        self._stop.stop()

    async def run(self) -> None:
        """Poll until :meth:`stop`: each endpoint in a loop of its own (a stuck ``/metrics`` never holds
        ``/kv_cache_events``), each request bounded by ``timeout_s`` in all. Returns at once on stop: the requests
        still in flight are aborted, nothing waits for their threads."""
        stop_event = self._stop.bind()
        meta_tried = asyncio.Event()  # answers are folded after the meta record (model, engine) when there is one
        loops = [asyncio.ensure_future(self._meta_loop(stop_event, meta_tried))]
        loops += [asyncio.ensure_future(self._endpoint_loop(ep, stop_event, meta_tried))
                  for ep in self.endpoints.values()]
        stop_wait = asyncio.ensure_future(stop_event.wait())
        try:
            # The meta loop ends when it has the meta record; an endpoint loop only by raising (the sink's own
            # bug), which ends the run, as it did before.
            waiting: set[asyncio.Future[Any]] = {stop_wait, *loops}
            while not stop_wait.done():
                done, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
                for task in done:
                    if task is not stop_wait:
                        task.result()
        finally:
            for task in (stop_wait, *loops):
                task.cancel()
            await asyncio.gather(stop_wait, *loops, return_exceptions=True)

    async def _meta_loop(self, stop_event: asyncio.Event, tried: asyncio.Event) -> None:
        while self.meta is None and not self._stop.requested:
            self._take_meta(await self._fetch_meta())  # bounded: two requests with timeout_s each, concurrently
            tried.set()
            if self.meta is None:
                delay = self.interval_s if self.reachable else self._backoff(self._failures)
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop_event.wait(), timeout=delay)

    async def _endpoint_loop(self, ep: Endpoint, stop_event: asyncio.Event, meta_tried: asyncio.Event) -> None:
        while not self._stop.requested:
            if ep.name == PROM:
                ep.enabled = self._want_prometheus()
            now = time.monotonic()
            if ep.enabled and ep.due <= now:
                answer = await self._fetch(ep)
                await meta_tried.wait()
                self._take_answer(ep, answer)
                self._settle([e for e in self.endpoints.values() if e.enabled and e.outcome])
                if ep.outcome == "unreachable":  # a host that is down is asked less and less often, up to 5 s
                    ep.due = time.monotonic() + self._backoff(ep.failures)
                delay = self.interval_s
            else:
                # Backing off or off: wake when it is due (a disabled fallback is looked at every interval).
                delay = max(self.interval_s, ep.due - now) if ep.enabled else self.interval_s
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(stop_event.wait(), timeout=delay)

    def _backoff(self, failures: int) -> float:
        return min(self.interval_s * 2.0 ** min(failures, 32), MAX_BACKOFF_S)

    # ------------------------------------------------------------------------------------------ one poll

    async def poll_once(self) -> ServePoll:
        """Poll every endpoint that is due, concurrently, and wait for all (each bounded by ``timeout_s``).
        Never raises for the server's failures. :meth:`run` polls each endpoint on its own instead."""
        self.polls += 1
        self._busy_events = 0
        result = ServePoll()
        now = time.monotonic()
        self.endpoints[PROM].enabled = self._want_prometheus()
        due = [ep for ep in self.endpoints.values() if ep.enabled and ep.due <= now]
        # /version and /v1/models (once) alongside: an unreachable host costs one timeout per poll, not three.
        meta, *answers = await asyncio.gather(self._fetch_meta() if self.meta is None else _none(),
                                              *(self._fetch(ep) for ep in due))
        self._take_meta(meta)
        for ep, answer in zip(due, answers):
            self._take_answer(ep, answer)
        for ep in due:
            if ep.outcome in ("ok", "error"):
                result.reachable = True
            if ep.outcome == "ok":
                result.counts[ep.name] = ep.last_count
        self._settle(due)
        return result

    def _take_meta(self, meta: dict[str, Any] | None) -> None:
        if meta is None or self.meta is not None:
            return
        self.meta = meta
        self.sink(make("meta", dict(meta), self.source, self.clock()))
        for why in meta.get("meta_unknown") or ():  # GiB figures stay "?": say why once
            self._status("trtllm-serve", f"{why}; GiB figures stay unknown (attach on a machine with the "
                                         "model's config.json, or use a built-in model name)")

    def _take_answer(self, ep: Endpoint, answer: tuple[list[Any] | None, HttpStatusError | str | None]) -> None:
        """What one answer of ``ep`` means (``ep.outcome``: ok | error | unreachable); its items to the sink."""
        items, error = answer
        ep.last_count = 0
        if error is None:
            ep.outcome = "ok"
            if ep.name == EVENTS:
                self._busy_events = 0
            ep.last_count = self._emit(ep, items or [])
        elif isinstance(error, HttpStatusError):
            ep.outcome = "error"
            self._http_error(ep, error)
        else:
            ep.outcome = "unreachable"
            ep.failures += 1
            self._unreachable = error

    def _settle(self, polled: list[Endpoint]) -> None:
        """Reachability and the on/off judgement after answers: the server is reachable while any endpoint
        answers (even with an error), unreachable when every one polled could not connect."""
        if any(ep.outcome in ("ok", "error") for ep in polled):
            self._failures = 0
            self._set_reachable(True, f"attached to trtllm-serve at {self.base}")
            self._judge_empty({ep.name: ep.last_count for ep in polled if ep.outcome == "ok"})
        elif polled and self._unreachable is not None:
            self._failures += 1
            self._set_reachable(False, self._unreachable)

    async def _fetch(self, ep: Endpoint) -> tuple[list[Any] | None, HttpStatusError | str | None]:
        url = self.base + ep.path
        try:
            body = await fetch(ep.method, url, deadline_s=self.timeout_s, max_bytes=MAX_BODY_BYTES,
                               headers={"Accept": "application/json"})
        except HttpStatusError as exc:
            return None, exc
        except BodyTooLarge as exc:
            return None, HttpStatusError(200, f"{exc}; is this a trtllm-serve?")
        except DeadlineExceeded as exc:
            if not exc.connected:  # a host that drops the connection attempt: down, not one stuck endpoint
                return None, f"cannot reach {url}: no connection within {self.timeout_s:g} s"
            return None, HttpStatusError(0, "no complete answer", text=str(exc))
        except OSError as exc:
            return None, f"cannot reach {url}: {exc.strerror or exc}"
        except http.client.HTTPException as exc:  # a garbled status line, a body cut short: not a trtllm-serve
            return None, HttpStatusError(200, f"not an HTTP answer kvtop can read ({type(exc).__name__}); "
                                              "is this a trtllm-serve?")
        if ep.name == PROM:
            return self._prometheus_items(body)
        try:
            items = json.loads(body)
        except (ValueError, RecursionError) as exc:  # bad JSON or UTF-8, a 4,300-digit number, deep nesting
            return None, HttpStatusError(200, f"not JSON ({str(exc)[:100]}); is this a trtllm-serve?")
        if not isinstance(items, list):
            return None, HttpStatusError(200, f"expected a JSON list, got {type(items).__name__}; "
                                              "is this a trtllm-serve?")
        return items, None

    async def _fetch_meta(self) -> dict[str, Any] | None:
        """The ``meta`` record's data from /version and /v1/models; None while neither answers."""

        async def get(path: str) -> Any:
            try:
                return json.loads(await fetch("GET", self.base + path, deadline_s=self.timeout_s,
                                              max_bytes=META_BYTES, headers={"Accept": "application/json"}))
            except Exception:  # optional: a server without /version still has stats worth showing
                return None

        version, models = await asyncio.gather(get("/version"), get("/v1/models"))
        if version is None and models is None:
            return None  # unreachable (reported by the poll) or not a trtllm-serve: try again next poll
        model = None
        if isinstance(models, dict) and isinstance(models.get("data"), list) and models["data"]:
            first = models["data"][0]
            model = first.get("id") if isinstance(first, dict) else None
        # The model id is what the server was started with (a hub name or a path on the server): the block size
        # comes from its shape; the tokens per block from the first stats (kvCacheStats.tokensPerBlock).
        return real_engine_meta(model=model if isinstance(model, str) else None,
                                engine_version=version.get("version") if isinstance(version, dict) else None,
                                attached=f"trtllm-serve {self.base}")

    # ------------------------------------------------------------------------------------------ items

    def _emit(self, ep: Endpoint, items: list[Any]) -> int:
        if ep.name == STATS:
            self._check_drained(items)
        if ep.failures:
            if ep.last_error is not None and self.problems is not None:
                self.problems.resolve(ep.problem_kind, f"{self.base}: {ep.method} {ep.path} answers again")
            ep.failures, ep.last_error = 0, None
        ep.due = 0.0
        n = 0
        now = self.clock()
        for item in items:
            try:
                rec = self._record(ep, item, now)
            except RecordError as exc:
                ep.bad += 1
                self._error(f"trtllm-serve.{ep.name}", f"malformed item skipped ({ep.bad} so far): {exc}")
                self._problem("trtllm-serve.malformed", f"{ep.path}: malformed item skipped ({ep.bad} so far): "
                              f"{exc}", lost=True)
                continue
            self.sink(rec)
            n += 1
        ep.items += n
        if n:
            ep.empty_polls = 0
            if ep.state in ("off", "unknown", "empty", "error"):
                was_off = ep.state == "off"
                ep.state, ep.hint = "ok", None
                if was_off:
                    self._status(f"trtllm-serve.{ep.name}", f"{ep.path} is delivering again")
        else:
            ep.empty_polls += 1
            if ep.state in ("unknown", "error"):
                ep.state = "empty"
        return n

    def _rank_source(self, item: dict[str, Any], now: float) -> SourceId:
        """The source of a /metrics row: with attention data parallelism TensorRT-LLM main gives one row per
        attention-DP rank each iteration, tagged ``attentionDpRank`` (py_executor.py ``_append_iter_stats``), each
        with that rank's own cumulative kvCacheStats and its own pool. Each rank is its own source, as MQTT ranks
        are (folded into one stream, two ranks' counters read as one went back and forth: a restart every row,
        hits counted again), and the run's total is their sum (the fleet row). A rank first seen gets the server's
        meta under its own source."""
        rank = item.get("attentionDpRank")
        if rank.__class__ is not int or rank <= 0 or rank >= MAX_DP_RANKS:
            return self.source
        src = self._rank_sources.get(rank)
        if src is None:
            src = self._rank_sources[rank] = SourceId(host=self.source.host, rank=self.source.rank + rank,
                                                      run=self.source.run)
            if self.meta is not None:
                self.sink(make("meta", {**self.meta, "attention_dp_rank": rank}, src, now))
        return src

    def _record(self, ep: Endpoint, item: Any, now: float) -> Record:
        if ep.name == STATS:
            data = parse_engine_dict(item, "stats")
            return make("stats", data, self._rank_source(data, now), now)
        if ep.name == PROM:
            return make("stats", item, self.source, now)
        if ep.name == EVENTS:
            rec = make("kv_event", parse_engine_dict(item, "kv_event"), self.source, now)
            if rec.data["data"].get("type") != "created":
                self._busy_events += 1
            return rec
        return make("request", request_from_perf(parse_engine_dict(item, "perf_metrics")), self.source, now)

    # ------------------------------------------------------------------------------------------ drained / Prometheus

    def _check_drained(self, items: list[Any]) -> None:
        """Iterations missing between polls mean another reader took them from the queue (trtllm-serve answers
        /metrics from ``get_stats_async``, a drain-once queue): counted, and said once."""
        gap = 0
        for item in items:
            if not isinstance(item, dict):
                continue
            # Newer main numbers each stats frame (``statsSequence``, executor/iteration_stats.py) and counts the
            # frames its own buffer dropped (``statsDroppedFrames``): a gap the engine dropped is not a reader.
            seq = item.get("statsSequence")
            it = seq if seq.__class__ is int else item.get("iter")
            if it.__class__ is not int:
                continue
            dropped = item.get("statsDroppedFrames")
            if dropped.__class__ is int and dropped > self._engine_dropped:
                self._engine_dropped = dropped
                self._last_iter.pop(item.get("attentionDpRank") or 0, None)
            rank = item.get("attentionDpRank") or 0
            last = self._last_iter.get(rank)
            if last is not None and it > last + 1:
                gap += it - last - 1
            if last is None or it > last or it < last - QUEUE_FULL:  # far backwards: the engine restarted
                self._last_iter[rank] = it
        if not gap:
            return
        self.stats_missing += gap
        if len(items) >= QUEUE_FULL:
            return  # a full queue drops its oldest: overflow (poll faster), not another reader
        self._gap_polls += 1
        if self._gap_polls >= DRAIN_POLLS:
            self._set_drained(f"{self.stats_missing} iterations never reached kvtop")

    def _set_drained(self, why: str) -> None:
        if self.stats_drained:
            return
        self.stats_drained = True
        self.endpoints[STATS].hint = DRAINED_HINT
        self._status(f"trtllm-serve.{STATS}", f"/metrics: {why}: {DRAINED_HINT}")

    def _want_prometheus(self) -> bool:
        """Read /prometheus/metrics while the JSON stats are off, empty or drained (not while they flow whole)."""
        st = self.endpoints[STATS].state
        return self.stats_drained or st in ("off", "empty", "error")

    def _prometheus_items(self, body: bytes) -> tuple[list[Any] | None, HttpStatusError | str | None]:
        try:
            samples = parse_samples(body.decode("utf-8", "replace"))
        except ValueError as exc:
            return None, HttpStatusError(200, f"not Prometheus text ({exc})")
        # Iterations happen (the collector counts completions) while /metrics gives nothing: it is drained whole.
        done = samples.get("trtllm_num_requests_completed_total")
        if (done is not None and self._prom_completed is not None and done > self._prom_completed
                and not self.endpoints[STATS].items and self.endpoints[STATS].empty_polls >= EMPTY_POLLS_OFF):
            self._set_drained("empty while the server's own Prometheus collector counts finished requests")
        if done is not None:
            self._prom_completed = done
        # Cumulative counters only while no JSON stats arrive (two readers see different iterations).
        data = self.prometheus.stats(samples, counters=self.endpoints[STATS].items == 0)
        return ([] if data is None else [data]), None

    # ------------------------------------------------------------------------------------------ on / off

    def _http_error(self, ep: Endpoint, exc: HttpStatusError) -> None:
        ep.failures += 1
        if exc.status in (404, 405, 501):
            ep.due = time.monotonic() + OFF_RETRY_S
            if ep.name == PROM and not self.stats_drained:
                ep.state, ep.hint = "off", HINTS[PROM]  # only a fallback: worth a line when the stats are drained
                return
            older = "1.3" if ep.name == PROM else "1.0"
            self._set_off(ep, f"{ep.method} {ep.path} answered {exc}: this server has no such endpoint "
                              f"(TensorRT-LLM older than {older}?); {HINTS[ep.name]}")
            return
        ep.due = time.monotonic() + self._backoff(ep.failures)
        message = f"{ep.method} {ep.path}: {exc}"
        # Lost: what the server drained from its queue into this answer never reached kvtop (and an endpoint that
        # only ever answers errors is a run without its data: a non-zero exit, not 0 on /version alone).
        self._problem(ep.problem_kind, f"{self.base}: {message}", lost=True)
        if ep.last_error != message:
            ep.last_error = message
            ep.state = "error"
            self._status(f"trtllm-serve.{ep.name}", message)

    def _set_off(self, ep: Endpoint, message: str) -> None:
        if ep.state != "off":
            ep.state, ep.hint = "off", HINTS[ep.name]
            self._status(f"trtllm-serve.{ep.name}", message)

    def _judge_empty(self, counts: dict[str, int]) -> None:
        stats, events, perf = (self.endpoints[k] for k in (STATS, EVENTS, PERF))
        stats_busy = counts.get(STATS, 0) > 0
        # Events other than the one "created" at start, or finished requests, mean the engine ran iterations.
        events_busy = self._busy_events > 0 or counts.get(PERF, 0) > 0
        idle_long = time.monotonic() - self._started >= IDLE_HINT_S
        for ep, other_busy in ((stats, events_busy), (events, stats_busy)):
            if ep.items or ep.state == "off":
                continue  # it delivered once (so it is on), or it was already judged off
            if ep.empty_polls >= EMPTY_POLLS_OFF and other_busy:
                self._set_off(ep, f"{ep.path} stays empty while the engine is busy: {HINTS[ep.name]}")
            elif idle_long and ep.hint is None:
                ep.hint = HINTS[ep.name]
                self._status(f"trtllm-serve.{ep.name}", f"nothing from {ep.path} for {IDLE_HINT_S:g} s: the server "
                                                        f"is idle, or {HINTS[ep.name]}")
        # /perf_metrics answers [] both when off and while no request has finished: a hint, never "off".
        if perf.enabled and not perf.items and perf.hint is None and perf.empty_polls >= EMPTY_POLLS_OFF \
                and stats_busy and idle_long:
            perf.hint = HINTS[PERF]
            self._status(f"trtllm-serve.{PERF}", f"no finished requests from {perf.path} yet: {HINTS[PERF]}")

    # ------------------------------------------------------------------------------------------ reporting

    def _set_reachable(self, ok: bool, message: str) -> None:
        if not ok:
            self._problem("trtllm-serve.connection", message)
        if self.reachable is ok:
            return
        if ok and self.problems is not None:
            self.problems.resolve("trtllm-serve.connection", message)
        self.reachable = ok
        if not ok:
            message += f"; retrying (every {MAX_BACKOFF_S:g} s at most), showing what was received so far"
        self._status("trtllm-serve", message)

    def _status(self, name: str, message: str) -> None:
        if self.on_status is not None:
            with contextlib.suppress(Exception):
                self.on_status(name, message)

    def _problem(self, kind: str, message: str, *, lost: bool = False) -> None:
        if self.problems is not None:
            self.problems.report(kind, message, lost=lost)

    def _error(self, name: str, message: str) -> None:
        if self.on_error is not None:
            with contextlib.suppress(Exception):
                self.on_error(name, message)


def request_from_perf(item: dict[str, Any]) -> dict[str, Any]:
    """A ``request`` record's data from one ``/perf_metrics`` item (the driver's keys, plus it verbatim).

    ``{"request_id", "perf_metrics": {"first_iter", "last_iter", "timing_metrics": {"arrival_time",
    "first_token_time", "last_token_time", ...}, "kv_cache_metrics": {"num_reused_blocks", ...}}}``; times are
    seconds on the server's steady clock, so only their differences mean anything here.
    """
    rid = item.get("request_id")
    if isinstance(rid, bool) or not isinstance(rid, (int, str)):
        raise RecordError("perf_metrics.request_id", f"must be an integer or a string, got {rid!r}")
    pm = item.get("perf_metrics")
    if not isinstance(pm, dict):
        raise RecordError("perf_metrics.perf_metrics", "must be an object")
    timing: dict[str, Any] = pm.get("timing_metrics") or {}
    kv: dict[str, Any] = pm.get("kv_cache_metrics") or {}
    if not isinstance(timing, dict):
        raise RecordError("perf_metrics.perf_metrics.timing_metrics", "must be an object")
    if not isinstance(kv, dict):
        raise RecordError("perf_metrics.perf_metrics.kv_cache_metrics", "must be an object")

    def num(d: dict[str, Any], key: str) -> float | None:
        v = d.get(key)
        return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    arrival, first, last = (num(timing, k) for k in ("arrival_time", "first_token_time", "last_token_time"))
    data: dict[str, Any] = {
        "request_id": rid,
        "ok": True,
        "ttft_s": first - arrival if first is not None and arrival is not None and first > 0 else None,
        "e2e_s": last - arrival if last is not None and arrival is not None and last > 0 else None,
        "reused_blocks": kv.get("num_reused_blocks"),
        "missed_blocks": kv.get("num_missed_blocks"),
        "perf_metrics": pm,
    }
    if "ctx_request_id" in item:
        data["ctx_request_id"] = item["ctx_request_id"]
    return data


def serve_source_from_url(url: str, sink: Sink, *, interval_s: float = 0.5, run: str | None = None,
                          on_status: Callback | None = None, on_error: Callback | None = None,
                          problems: Problems | None = None) -> TrtllmServeSource:
    """What ``kvtop attach http://host:port`` calls. Raises ``ValueError`` for a URL it cannot use."""
    src = None
    if run:
        src = SourceId(host=urlsplit(url if "://" in url else f"http://{url}").netloc, rank=0, run=run)
    return TrtllmServeSource(url, src, interval_s, sink, on_status=on_status, on_error=on_error, problems=problems)


__all__ = ["DRAINED_HINT", "HINTS", "PROM", "TrtllmServeSource", "request_from_perf", "serve_source_from_url"]
