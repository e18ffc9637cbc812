"""Pull an engine's Prometheus ``/metrics`` beside its KV event stream: capacities and hits by serving tier, which
the stream does not carry (shared/engines-kv-events.md sections 1-4).

What is kept (``KEEP_PREFIXES``): vLLM's ``vllm:*`` (``cache_config_info`` for the GPU pool and block size,
``kv_offload_config_info`` for the CPU tier, ``prompt_tokens_cached_by_source_total{source}`` for hits by tier,
``prefix_cache_{queries,hits}_total``, ``kv_cache_usage_perc``), SGLang's ``sglang:*`` (``max_total_num_tokens``,
``hicache_host_{used,total}_tokens``, ``cached_tokens_total{cache_source}``, ``prompt_tokens_total``,
``token_usage``), Dynamo's frontend (``dynamo_frontend_*``: cached and input tokens, KV blocks, block size) and
KVBM (``kvbm_*``, port 6880 with ``DYN_KVBM_METRICS=true``), LMCache's ``lmcache*``. Histogram buckets are dropped
(their ``_sum``/``_count`` stay). Each scrape becomes one ``metrics`` record per data-parallel rank, ``data`` =
``{"engine", "url", "samples": [[name, labels, value], ...]}``: the engine's own names and labels, so the fold
(kvtop/tiers/stream.py) and a recording read the same thing.

Ranks: vLLM labels each engine core ``engine="<dp rank>"``; SGLang labels ``dp_rank``. Samples with such a label
go to that rank's source; the rest to every rank's (the capacity info is the same for all). SGLang's per-TP-rank
series (``tp_rank``) report the same logical count on every TP rank (its docs say to read one): only ``tp_rank``
0 is kept.

Parsing is prometheus_client's own text parser (a dependency already, for the exporter). A scrape that fails is
reported through ``on_error`` and retried with backoff; it never stops the stream beside it.
"""

from __future__ import annotations

import asyncio
import json
import math
import time
from collections.abc import Callable, Iterable
from typing import Any
from urllib.parse import urlsplit

from kvtop.problems import Problems
from kvtop.records import Record, RecordError, SourceId, make
from kvtop.sources.httpfetch import DeadlineExceeded, HttpStatusError, fetch, fetch_blocking
from kvtop.stopsignal import StopSignal
from kvtop.textsafe import clean

Sink = Callable[[Record], None]
Callback = Callable[[str, str], None]

KEEP_PREFIXES = ("vllm:", "sglang:", "dynamo_frontend_", "kvbm_", "lmcache")
RANK_LABELS = ("engine", "dp_rank")
HTTP_TIMEOUT_S = 5.0  # a scrape's total deadline (kvtop/sources/httpfetch.py: a trickling page cannot hold it)
MAX_BYTES = 8 << 20  # a /metrics page of a busy vLLM is ~100-300 KB; 8 MB is not a metrics page any more
MAX_BACKOFF_S = 10.0
_MAX_LABEL = 200
_MAX_VALUE = float(1 << 64)


def _clean(text: str) -> str:
    # Label values come from outside and may reach a terminal: kvtop's one sanitizer, bounded.
    return clean(text, _MAX_LABEL)


def parse_metrics(text: str, keep: tuple[str, ...] = KEEP_PREFIXES,
                  bad: list[str] | None = None) -> list[list[Any]]:
    """Prometheus text to ``[[name, labels, value], ...]`` for the kept names (buckets dropped).

    A kept sample whose value is a finite number past 2^64 (no record may carry it) is left out and named in
    ``bad`` (NaN and infinities are Prometheus' own "no value": left out silently). Raises ``ValueError`` for
    text prometheus_client cannot parse."""
    from prometheus_client.parser import text_string_to_metric_families

    out: list[list[Any]] = []
    for family in text_string_to_metric_families(text):
        if not family.name.startswith(keep):
            continue
        for s in family.samples:
            if s.name.endswith("_bucket") or s.name.endswith("_created"):
                continue
            value = float(s.value)
            if not -_MAX_VALUE <= value <= _MAX_VALUE:  # NaN, infinities, numbers past records.MAX_MAGNITUDE
                if bad is not None and math.isfinite(value):
                    bad.append(f"{_clean(s.name)} = {value:g} (at most 2^64)")
                continue
            out.append([_clean(s.name), {_clean(k): _clean(str(v)) for k, v in s.labels.items()}, value])
    return out


def engine_of(samples: Iterable[list[Any]]) -> str:
    names = {s[0].split(":", 1)[0] if ":" in s[0] else s[0].split("_", 1)[0] for s in samples}
    for engine in ("vllm", "sglang", "kvbm", "dynamo", "lmcache"):
        if engine in names:
            return engine
    return "unknown"


def split_by_rank(samples: list[list[Any]]) -> dict[int | None, list[list[Any]]]:
    """Samples per data-parallel rank (``None``: no rank label, for every rank)."""
    out: dict[int | None, list[list[Any]]] = {}
    for s in samples:
        labels = s[1]
        if labels.get("tp_rank") not in (None, "0"):
            continue
        rank: int | None = None
        for key in RANK_LABELS:
            raw = labels.get(key)
            if raw is not None and raw.isdigit():
                rank = int(raw)
                break
        out.setdefault(rank, []).append(s)
    return out


def http_get(url: str, timeout: float = HTTP_TIMEOUT_S) -> bytes:
    """GET ``url`` from code without an event loop (discovery), within ``timeout`` in all."""
    return fetch_blocking("GET", url, deadline_s=timeout, max_bytes=MAX_BYTES, headers={"Accept": "text/plain"})


def describe_http_error(exc: BaseException) -> str:
    if isinstance(exc, (HttpStatusError, DeadlineExceeded)):
        return str(exc)
    if isinstance(exc, OSError):
        return f"cannot connect ({exc.strerror or exc})"
    return f"{type(exc).__name__}: {exc}"


class MetricsPoller:
    """Scrapes ``urls`` every ``interval_s`` into ``metrics`` records for ``source_for(rank)``."""

    def __init__(self, urls: list[str], sink: Sink, source_for: Callable[[int], SourceId], *,
                 ranks: int = 1, interval_s: float = 1.0, on_status: Callback | None = None,
                 on_error: Callback | None = None, problems: Problems | None = None):
        self.urls = urls
        self.sink = sink
        self.source_for = source_for
        self.ranks = max(1, ranks)
        self.interval_s = interval_s
        self.on_status = on_status
        self.on_error = on_error
        self.problems = problems  # a page that cannot be read: a problem (not lost data: the stream goes on)
        self.scrapes = 0
        self.failures = 0
        self.last_error: str | None = None
        self._stop = StopSignal()
        self._ok: dict[str, bool] = {}

    def stop(self) -> None:
        self._stop.stop()

    async def run(self) -> None:
        stop = self._stop.bind()
        backoff = self.interval_s
        while not stop.is_set():
            ok = True
            for url in self.urls:
                ok = await self.poll_once(url) and ok
            backoff = self.interval_s if ok else min(max(backoff * 2, 1.0), MAX_BACKOFF_S)
            try:
                await asyncio.wait_for(stop.wait(), timeout=backoff)
            except asyncio.TimeoutError:
                pass

    async def poll_once(self, url: str) -> bool:
        bad: list[str] = []
        try:
            body = await fetch("GET", url, deadline_s=HTTP_TIMEOUT_S, max_bytes=MAX_BYTES,
                               headers={"Accept": "text/plain"})
            samples = parse_metrics(body.decode("utf-8", "replace"), bad=bad)
        except Exception as exc:  # a scrape that fails is reported, then retried
            self.failures += 1
            self.last_error = describe_http_error(exc)
            if self.problems is not None:
                self.problems.report("metrics.scrape", f"{url}: {self.last_error}")
            if self._ok.get(url, True) and self.on_error is not None:
                self.on_error(f"metrics {url}", self.last_error)
            self._ok[url] = False
            return False
        if not self._ok.get(url, False):
            if self.on_status is not None:
                self.on_status(f"metrics {url}", f"scraping ({len(samples)} samples)")
            if self.problems is not None and self.problems.get("metrics.scrape") is not None:
                self.problems.resolve("metrics.scrape", f"{url}: scraping again")
        self._ok[url] = True
        self.scrapes += 1
        if bad and self.problems is not None:  # values out of bounds: left out (never folded), counted, lost
            self.problems.report("metrics.bad_value", f"{url}: {len(bad)} sample(s) out of bounds left out "
                                 f"(first: {bad[0]})", count=len(bad), lost=True)
        engine = engine_of(samples)
        now = time.time()
        parts = split_by_rank(samples)
        common = parts.pop(None, [])
        ranks = sorted(set(range(self.ranks)) | {r for r in parts if r is not None})
        for rank in ranks:
            own = parts.get(rank, [])
            try:
                rec = make("metrics", {"engine": engine, "url": url, "samples": common + own},
                           self.source_for(rank), now)
            except RecordError as exc:  # a page kvtop cannot carry as a record: reported, the poller goes on
                self.failures += 1
                self.last_error = str(exc)
                if self.problems is not None:
                    self.problems.report("metrics.bad_value", f"{url}: {exc}", lost=True)
                if self.on_error is not None:
                    self.on_error(f"metrics {url}", self.last_error)
                return False
            self.sink(rec)
        return True


# ------------------------------------------------------------------------------------------------ discovery

def _swap_host(endpoint: str, host: str) -> str:
    """``tcp://*:5557`` / ``tcp://0.0.0.0:5557`` as an engine's config writes it, seen from here."""
    parts = urlsplit(endpoint)
    if parts.scheme != "tcp" or parts.port is None:
        return endpoint
    bound = parts.hostname or "*"
    if bound in ("*", "0.0.0.0", "::", "") or endpoint.startswith("tcp://*"):
        return f"tcp://{host}:{parts.port}"
    return endpoint


def discover_events(base: str, host: str) -> dict[str, Any]:
    """What ``GET /server_info`` says of the KV event publisher (SGLang always; vLLM only in dev mode):
    ``{"endpoint", "replay", "topic", "ranks"}`` (missing keys: not advertised)."""
    try:
        info = json.loads(http_get(base.rstrip("/") + "/server_info"))
    except Exception:
        return {}
    if not isinstance(info, dict):
        return {}
    cfg: Any = info.get("kv_events_config")
    if cfg is None and isinstance(info.get("vllm_config"), dict):
        cfg = info["vllm_config"].get("kv_events_config")
    if isinstance(cfg, str):
        try:
            cfg = json.loads(cfg)
        except ValueError:
            cfg = None
    out: dict[str, Any] = {}
    if isinstance(cfg, dict):
        if isinstance(cfg.get("endpoint"), str):
            out["endpoint"] = _swap_host(cfg["endpoint"], host)
        if isinstance(cfg.get("replay_endpoint"), str):
            out["replay"] = _swap_host(cfg["replay_endpoint"], host)
        if isinstance(cfg.get("topic"), str):
            out["topic"] = cfg["topic"]
    dp = info.get("dp_size")
    if isinstance(dp, int) and dp > 1 and info.get("enable_dp_attention"):
        out["ranks"] = dp
    return out
