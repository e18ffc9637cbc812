"""``kvtop agent SOURCE --mqtt mqtt://broker/prefix`` (the command: kvtop/commands/agent.py): fold at the edge,
publish summaries for a fleet.

One Python subscriber tops out near 35,000 records/s (BENCHMARKS.md) and a busy GPU emits a few thousand block
events a second, so 1,000 GPUs' raw events cannot reach one process. An agent runs beside each node's engines (one
per node or per engine), attaches to them locally with any source kvtop has (``zmq://``, ``vllm://``, ``sglang://``,
``http://`` for trtllm-serve, ``mqtt://``, a recording), folds them into a TierModel per source and rank, and
publishes each one's summary at 1-2 Hz:

    <prefix>/kvtop/v1/<run>/<host>:<rank>/summary   QoS 0, ~1 KB of JSON: tiers, totals, rates, data quality
    <prefix>/kvtop/v1/<run>/<host>:<rank>/meta      retained (re-sent on reconnect): what the source is
    <prefix>/kvtop/v1/<run>/<agent>:0/status        retained "online"; "offline" is the MQTT last will
    <prefix>/kvtop/v1/<run>/<host>:<rank>/<kind>    the raw records, only with --raw

(the conventions of kvtop/mqtt_wire.py and kvtop/sinks/mqtt.py, whose publisher this reuses: a bounded queue
that never blocks the fold, reconnects with backoff). A summary's totals are cumulative since the agent attached,
so one lost summary loses nothing but its instant; the receiving TierModel diffs them into its own rates
(kvtop/tiers/stream.py, ``apply_summary``) and counts missed ``seq`` numbers. A dashboard (``kvtop attach
mqtt://broker/prefix``) shows every agent's sources in its fleet table, and its Prometheus exporter
(``--prometheus-port``) serves them to a scrape; 1,000 sources at 2 Hz through one mosquitto: BENCHMARKS.md.

Names: ``--run NAME`` is the run of every source the agent publishes (``<host>/<rank>/NAME``, whatever run a
recording it replays named), so two agents replaying one recording are two rows, and each source's retained
``meta`` carries ``source_name``, the row's name on a dashboard: NAME for an agent's one source, NAME/<rank> (or
NAME/<host>:<rank>) for several. A summary carries TTFT (p50 / p99, since the start and over the window) and token
rates as the agent measured them: ``null`` where unknown (no request records: no TTFT; no stats: no engine token
counts), never 0.

The end: ``--duration``, the end of a replayed recording, SIGTERM or Ctrl-C stop the agent the same way: one last
summary of every source (what the fold holds at the end), the queue flushed, then a retained ``offline`` status (a
clean disconnect does not fire the last will), and the one-line (or ``--json``) account on stdout.
"""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

from kvtop.records import Record, SourceId
from kvtop.tiers import TierModel, TierSnapshot
from kvtop.tiers.snapshot import reading

DEFAULT_INTERVAL_S = 0.5  # 2 Hz: a dashboard's 4 Hz refresh sees every other frame move
_RATES = ("hits_per_s", "lookups_per_s", "offloaded_per_s", "onboarded_per_s", "evicted_gpu_per_s",
          "evicted_host_per_s", "requests_per_s")
# Token rates: the finished requests' (request records), the engine's own (iteration stats). A source without
# those records has no such rate: null, not the 0 its counters would give.
_REQUEST_TOKEN_RATES = ("prompt_tokens_per_s", "output_tokens_per_s")
_ENGINE_TOKEN_RATES = ("ctx_tokens_per_s", "gen_tokens_per_s")
FINAL_S = 5.0  # what the end may spend on the last summaries and "offline" (the publisher's own bound is ~2 s)


def _round(v: float | None) -> float | None:
    return None if v is None else round(v, 4)


_VERDICT_KEYS = ("says", "saved_s", "spent_s", "net_s", "net_s_per_min", "ttft_p50_ms_delta", "loaded_blocks",
                 "stored_blocks", "hit_requests", "requests")


def _verdict_summary(v: dict[str, Any]) -> dict[str, Any]:
    out = {k: (_round(v[k]) if isinstance(v[k], float) else v[k]) for k in _VERDICT_KEYS}
    out["basis"] = v["basis"][:160]
    return out


def _latency(lat: Any) -> dict[str, Any]:
    """A TTFT as a summary carries it: seconds, ``None`` while no request has one."""
    known = lat.count > 0
    return {"p50_s": _round(lat.p50_s) if known else None, "p99_s": _round(lat.p99_s) if known else None,
            "count": lat.count}


def summary_data(model: TierModel | TierSnapshot, seq: int, interval_s: float, agent: str) -> dict[str, Any]:
    """One source's summary: what the fleet table and a Prometheus scrape need, nothing per block. Read from the
    model's snapshot (the same one the fleet table and Prometheus read), never from the fold's internals."""
    snap: TierSnapshot = reading(model)
    mv = snap.moves
    hr = snap.hit_rate
    req = snap.requests
    q = snap.quality
    rates = snap.rates
    stream = snap.summary_data.get("stream")
    tiers = {}
    for t in snap.tiers:
        tiers[t.name] = {"capacity_blocks": t.capacity_blocks, "in_use_blocks": t.in_use_blocks,
                         "cached_blocks": t.cached_blocks, "free_blocks": t.free_blocks,
                         "cached_approximate": t.cached_approximate}
    totals = {"hits": hr.hits, "lookups": hr.lookups, "host_hits": hr.host_hits,
              "offloaded": mv.offloaded_blocks, "onboarded": mv.onboarded_blocks,
              "evicted_gpu": mv.evicted_gpu_blocks, "evicted_host": mv.evicted_host_blocks,
              "evicted_unknown": mv.evicted_unknown_blocks, "completed": req.completed, "failed": req.failed}
    if mv.disk:  # the disk tier's moves (issue 23, item 3), where the engine has one
        totals.update({"disk_prefetched": mv.disk_prefetched_blocks, "disk_onboarded": mv.disk_onboarded_blocks,
                       "disk_offloaded": mv.disk_offloaded_blocks})
    requests_seen = req.completed + req.failed + req.warmup > 0
    stats_seen = snap.stats_schema is not None
    token_rates = {k: _round(getattr(rates, k)) if requests_seen else None for k in _REQUEST_TOKEN_RATES}
    token_rates.update({k: _round(getattr(rates, k)) if stats_seen else None for k in _ENGINE_TOKEN_RATES})
    data: dict[str, Any] = {
        "seq": seq, "interval_s": interval_s, "agent": agent, "engine": snap.meta.get("engine"),
        "tokens_per_block": snap.tokens_per_block, "tiers": tiers, "totals": totals,
        "rates": {**{k: _round(getattr(rates, k)) for k in _RATES}, **token_rates},
        # TTFT as the agent measured it (percentiles do not travel as totals): since the start and over the window;
        # null while no request has one (an event stream's summary stays ~100 B smaller: 1,526 -> 1,446 B)
        "ttft": {**_latency(req.ttft), "window": _latency(req.window_ttft)} if req.ttft.count else None,
        "hit_rate": {"cumulative": _round(hr.cumulative), "window": _round(hr.window), "host": _round(hr.host)},
        "events_seen": q.events_seen, "approximate": q.counts_approximate,
        "since_attach": bool(stream and stream.get("since_attach")), "bad_records": snap.bad_records,
        # the verdict where the agent sees the engine's iterations and requests (a dashboard far away does not):
        # its figures, rounded, and its basis cut to 160 characters (a summary stays ~1 KB)
        "verdict": {tier: _verdict_summary(v.to_json()) for tier, v in snap.verdict.items()},
    }
    if mv.left_said or mv.left_inferred:
        data["left"] = {"said": mv.left_said, "inferred": mv.left_inferred}
    if stream:
        data["stream"] = {k: stream[k] for k in ("lost_batches", "replayed_batches", "publisher_restarts",
                                                 "bad_events", "unknown_removals", "seq_jumps", "lag_s",
                                                 "lag_batches") if k in stream}
    return data


class Agent:
    """Publishes a summary of every source of ``session`` every ``interval_s`` through ``publisher``.

    ``name`` (``--run``): the run its sources are published under, and their rows' name (module docstring);
    without it each source is published under its own id."""

    def __init__(self, session: Any, publisher: Any, *, interval_s: float = DEFAULT_INTERVAL_S,
                 agent: SourceId | None = None, name: str | None = None):
        self.session = session
        self.publisher = publisher
        self.interval_s = interval_s
        self.agent = agent or SourceId(socket.gethostname(), 0, "")
        self.name = name
        self.sources: dict[str, SourceId] = {}   # session key -> the id its records are published under
        self._taken: set[SourceId] = set()
        self._names: dict[str, str] = {}
        self.seq = 0
        self.published = 0
        self._metas: dict[str, Any] = {}
        session.add_sink(self._track)

    def _track(self, record: Record) -> None:
        key = record.source.key()
        if key not in self.sources:
            self.sources[key] = self._published_id(record.source)
            self._names = self._row_names()

    def _published_id(self, src: SourceId) -> SourceId:
        if not self.name:
            return src
        out = SourceId(src.host, src.rank, self.name)
        if out in self._taken:  # a recording of two runs of one host and rank: both kept apart
            out = SourceId(src.host, src.rank, f"{self.name}-{src.run or '-'}")
        self._taken.add(out)
        return out

    def _row_names(self) -> dict[str, str]:
        """Each source's name on a dashboard: the agent's name, with the shortest part of its id that tells the
        agent's sources apart."""
        if not self.name:
            return {}
        ids = self.sources
        if len(ids) == 1:
            return dict.fromkeys(ids, self.name)
        for part in (lambda s: str(s.rank), lambda s: f"{s.host}:{s.rank}", lambda s: s.key()):
            names = {k: f"{self.name}/{part(s)}" for k, s in ids.items()}
            if len(set(names.values())) == len(names):
                return names
        return {k: f"{self.name}/{s.key()}" for k, s in ids.items()}  # unreachable: keys are distinct

    def published_keys(self) -> list[str]:
        return sorted(s.key() for s in self.sources.values())

    def publish_raw(self, record: Record) -> None:
        """--raw: a record as it came, under the id its source's summaries go out under (one row, not two)."""
        src = self.sources.get(record.source.key())
        if src is not None and src != record.source:
            record = Record(record.kind, record.data, src, record.time, record.v)
        self.publisher.publish(record)

    def publish_once(self, now: float | None = None) -> int:
        now = time.time() if now is None else now
        n = 0
        for key, model in list(self.session.models.items()):
            src = self.sources.get(key)
            if src is None:
                continue
            model = model.snapshot()  # one immutable reading; the fold goes on under it
            if model.records_applied == 0:
                continue
            meta = {"engine": str(model.meta.get("engine") or "unknown"), "agent": self.agent.key(),
                    **{k: v for k, v in model.meta.items() if isinstance(v, (str, int, float, bool)) and k != "engine"}}
            name = self._names.get(key)
            if name is not None:
                meta["source_name"] = name
            if self._metas.get(key) != meta:
                self._metas[key] = meta
                self.publisher.publish(Record("meta", meta, src, now))
            data = summary_data(model, self.seq, self.interval_s, self.agent.key())
            self.publisher.publish(Record("summary", data, src, now))
            n += 1
        self.seq += 1
        self.published += n
        return n

    async def run(self) -> None:
        # Stopped by the session (its producers are cancelled when it stops); main() publishes the last round.
        next_at = time.monotonic()
        while True:
            self.publish_once()
            next_at += self.interval_s
            await asyncio.sleep(max(0.0, next_at - time.monotonic()))


__all__ = ["FINAL_S", "Agent", "DEFAULT_INTERVAL_S", "summary_data"]
