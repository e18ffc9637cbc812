"""Many sources at once: one row of figures per source (``host/rank/run``) and the fleet's aggregate row.

Pure functions over TierModels, no Textual, so the dashboard's sources table and anything headless share them
and they are tested with numbers (tests/commands/test_fleet.py).

How the aggregate is formed (the "all" row):
- block counts and per-second rates are sums over the sources;
- hit rates are total hits / total lookups over the sources (cumulative: the counters since start; window: hits/s
  over lookups/s), never an average of the sources' ratios, so a busy source weighs what its lookups weigh;
- TTFT p99 is the *largest* of the sources' p99s: percentiles do not add up, and the samples behind them are
  not kept per fleet. It is an upper bound on the fleet's own p99 (at that latency every source has 99% of its
  requests done, so the fleet has too), and the table's help says "max of the sources'".
- A disk tier (TensorRT-LLM's disk cache) is summed over the sources that have one: a source without a disk tier
  holds 0 disk blocks (known, not unknown), so a fleet with one disk cache reads that cache's size. A fleet with
  no disk tier at all has no disk figures (its rows and JSON are what they were before disk tiers).
- A figure unknown for any counted source (no KV events: host occupancy unknown; one record: no rate yet) is
  unknown for the fleet too (``None``, shown "?"), never a sum of the known part that would read as the whole.
- Sources whose status is ``offline`` (their MQTT last will) keep their row, with their last figures, but are
  left out of the aggregate: their engine is gone, and its last rates would be counted as if it still ran.
- So are ``stale`` ones: a source that vanished without a last will (a cable, a frozen VM, a broker that lost
  the will) or whose only message is an old retained ``meta``. :class:`StaleClock` calls a source stale after
  ``STALE_INTERVALS`` (5) of its own send intervals without a record, and never sooner than ``STALE_MIN_S``
  (5 s: a publisher sends every 0.1-0.25 s, so a healthy source is never near it). It is counted again as soon
  as it sends a record, and only then: staleness is the age of its data, so a status ("online" after "offline",
  a retained one, its agent's) makes a source offline, never fresh (Session.on_source_status).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import asdict
from typing import Any

from kvtop.textsafe import clean
from kvtop.tiers import TierModel, TierSnapshot
from kvtop.tiers.snapshot import reading
from kvtop.values import frozen

__all__ = ["EXCLUDED_STATUSES", "STALE_INTERVALS", "STALE_MIN_S", "FleetRow", "StaleClock", "aggregate", "combine",
           "source_name", "source_row", "source_status"]

EXCLUDED_STATUSES = frozenset({"offline", "stale"})
STALE_INTERVALS = 5.0
STALE_MIN_S = 5.0
_BURST_S = 0.005  # records closer than 5 ms came in one message (a batch): one arrival, not a 0-s interval


class StaleClock:
    """When each source was last heard from, and its usual interval between messages (pure: times are passed).

    ``heard(key, kind, now)`` on every record (returns True if the source was stale: it is back);
    ``newly_stale(now)`` the keys that went stale since the last call. A source whose only records are
    ``meta`` (a retained message from a source that may be long gone) has no interval yet: the floor applies.
    """

    def __init__(self, intervals: float = STALE_INTERVALS, min_s: float = STALE_MIN_S, *, enabled: bool = False):
        self.intervals = intervals
        self.min_s = min_s
        self.enabled = enabled  # off for a local engine (an idle one sends nothing and is not gone)
        self._last: dict[str, float] = {}
        self._gap: dict[str, float] = {}  # EWMA of the interval between arrivals
        self._stale: set[str] = set()

    def heard(self, key: str, kind: str = "stats", now: float | None = None) -> bool:
        if not self.enabled:
            return False
        t = time.monotonic() if now is None else now
        last = self._last.get(key)
        if last is not None and kind != "meta":
            gap = t - last
            if gap > _BURST_S:
                old = self._gap.get(key)
                self._gap[key] = gap if old is None else 0.8 * old + 0.2 * gap
        if kind != "meta" or last is None:
            self._last[key] = t
        if key in self._stale and kind != "meta":
            self._stale.discard(key)
            return True
        return False

    def limit(self, key: str) -> float:
        gap = self._gap.get(key)
        return self.min_s if gap is None else max(self.min_s, self.intervals * gap)

    def silence(self, key: str, now: float) -> float:
        last = self._last.get(key)
        return 0.0 if last is None else now - last

    def newly_stale(self, now: float) -> list[str]:
        if not self.enabled:
            return []
        out = []
        for key, last in self._last.items():
            if key not in self._stale and now - last > self.limit(key):
                self._stale.add(key)
                out.append(key)
        return out

    def is_stale(self, key: str) -> bool:
        """Whether ``key`` was called stale and has sent no record since (a status message does not count)."""
        return key in self._stale

    def stale_keys(self) -> set[str]:
        return set(self._stale)


@frozen
class FleetRow:
    """One source's figures (or the fleet's, for the aggregate row); ``None`` is unknown."""

    key: str
    status: str | None
    gpu_in_use: int | None
    gpu_cached: int | None
    gpu_capacity: int | None
    host_cached: int | None
    host_capacity: int | None
    hits: int                       # reused blocks since start (warm-up excluded)
    lookups: int                    # prompt blocks looked up since start
    hit_cumulative: float | None
    hit_window: float | None
    hits_per_s: float | None        # over the window: the aggregate's window hit rate is their ratio
    lookups_per_s: float | None
    offloaded_per_s: float | None
    onboarded_per_s: float | None
    requests_per_s: float | None
    ttft_p99_s: float | None        # over the window when it has samples, else since start; "all": the max
    sources: int = 1                # sources counted (the aggregate row: those not offline)
    # The disk tier, where the source has one (the aggregate: where any counted source has one); None = unknown.
    has_disk: bool = False
    disk_cached: int | None = None
    disk_capacity: int | None = None
    # Its name on a dashboard (a kvtop agent's ``--run NAME``: its meta's ``source_name``), None: its key is
    name: str | None = None

    @property
    def label(self) -> str:
        """What a table calls the row: its name where it has one, else its key."""
        return self.name or self.key

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        del out["has_disk"]
        if not self.has_disk:  # a two-tier row reads as it did before disk tiers: no disk keys at all
            del out["disk_cached"], out["disk_capacity"]
        return out


def source_status(key: str, status: Mapping[str, str] | None) -> str | None:
    """A source's state from ``Session.status``: its own entry (MQTT's retained ``online``/``offline``), or
    ``disconnected`` while the transport it came through (the ``mqtt`` entry) is down."""
    if not status:
        return None
    own = status.get(key)
    link = status.get("mqtt")
    if own != "offline" and isinstance(link, str) and link.startswith("disconnected"):
        return "disconnected"
    return own


def source_row(key: str, model: TierModel | TierSnapshot, status: str | None = None) -> FleetRow:
    """One source's row, read from its snapshot (a live model gives its own: the same one while it is unchanged)."""
    model = reading(model)
    gpu, host = model.gpu, model.host
    # TierModel.tiers: GPU, host, then disk where the engine has one (a snapshot keeps the same list)
    disk = next((t for t in getattr(model, "tiers", ()) if t.name == "disk"), None)
    hit = model.hit_rate
    rates = model.rates
    moves = model.moves
    # Moves folded from KV events are unknown (not zero) while no event has been seen.
    moves_known = moves.source != "events" or model.quality.events_seen
    req = model.requests
    ttft = req.window_ttft if req.window_ttft.count > 0 else req.ttft
    return FleetRow(
        key=key, status=status,
        gpu_in_use=gpu.in_use_blocks, gpu_cached=gpu.cached_blocks, gpu_capacity=gpu.capacity_blocks,
        host_cached=host.cached_blocks, host_capacity=host.capacity_blocks,
        hits=hit.hits, lookups=hit.lookups, hit_cumulative=hit.cumulative, hit_window=hit.window,
        hits_per_s=rates.hits_per_s, lookups_per_s=rates.lookups_per_s,
        offloaded_per_s=rates.offloaded_per_s if moves_known else None,
        onboarded_per_s=rates.onboarded_per_s if moves_known else None,
        requests_per_s=rates.requests_per_s, ttft_p99_s=ttft.p99_s if ttft.count > 0 else None,
        has_disk=disk is not None, disk_cached=None if disk is None else disk.cached_blocks,
        disk_capacity=None if disk is None else disk.capacity_blocks, name=source_name(model.meta))


def source_name(meta: Mapping[str, Any]) -> str | None:
    """A source's name from its meta (``source_name``: a kvtop agent's ``--run``), cleaned: it came from a broker."""
    name = meta.get("source_name")
    if not isinstance(name, str):
        return None
    name = clean(name, 60).strip()
    return name or None


def _sum(values: list[Any]) -> Any:
    if not values or any(v is None for v in values):
        return None
    return sum(values)


def _disk_sum(rows: list[FleetRow], attr: str) -> int | None:
    """A disk figure over the fleet: 0 for a source with no disk tier, unknown if any disk tier's is unknown."""
    return _sum([getattr(r, attr) if r.has_disk else 0 for r in rows])  # type: ignore[no-any-return]


def combine(rows: Iterable[FleetRow], key: str = "all") -> FleetRow:
    """The aggregate of ``rows`` (those not offline or stale): see the module docstring for each figure's rule."""
    counted = [r for r in rows if r.status not in EXCLUDED_STATUSES]
    has_disk = any(r.has_disk for r in counted)
    hits = sum(r.hits for r in counted)
    lookups = sum(r.lookups for r in counted)
    hps = _sum([r.hits_per_s for r in counted])
    lps = _sum([r.lookups_per_s for r in counted])
    ttfts = [r.ttft_p99_s for r in counted if r.ttft_p99_s is not None]
    return FleetRow(
        key=key, status=None,
        gpu_in_use=_sum([r.gpu_in_use for r in counted]), gpu_cached=_sum([r.gpu_cached for r in counted]),
        gpu_capacity=_sum([r.gpu_capacity for r in counted]),
        host_cached=_sum([r.host_cached for r in counted]), host_capacity=_sum([r.host_capacity for r in counted]),
        hits=hits, lookups=lookups, hit_cumulative=hits / lookups if lookups > 0 else None,
        hit_window=hps / lps if hps is not None and lps else None,
        hits_per_s=hps, lookups_per_s=lps,
        offloaded_per_s=_sum([r.offloaded_per_s for r in counted]),
        onboarded_per_s=_sum([r.onboarded_per_s for r in counted]),
        requests_per_s=_sum([r.requests_per_s for r in counted]),
        ttft_p99_s=max(ttfts) if ttfts else None, sources=len(counted), has_disk=has_disk,
        disk_cached=_disk_sum(counted, "disk_cached") if has_disk else None,
        disk_capacity=_disk_sum(counted, "disk_capacity") if has_disk else None)


def aggregate(models: Mapping[str, TierModel | TierSnapshot],
              status: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The fleet's aggregate row as a JSON-able dict (``FleetRow`` fields), from ``{source key: TierModel}``
    and, optionally, ``Session.status`` (offline sources are left out)."""
    return combine(source_row(k, m, source_status(k, status)) for k, m in models.items()).to_json()
