"""The verdict: is a cache tier below the GPU paying off, by how many seconds of engine time and how much TTFT.

A host (or disk) hit is a block that did not have to be prefilled again: it was copied back instead. So per tier

    saved_s = loaded blocks x the prefill of a block's tokens (what recomputing the hits would have taken)
    spent_s = loaded blocks x a load + stored blocks x a store: the tier's copies on the critical path
              (TensorRT-LLM offloads on GPU eviction and syncTransfers makes the next forward pass wait for both
              copy streams, so a store delays the run whether or not the block is ever used again)
    net_s   = saved_s - spent_s

``says`` is "pays" (net > 0), "costs" (net <= 0), "idle" (nothing loaded back: its stores are all it did),
"none" (no such tier) or "unknown" (loads, but no price for them: no iteration times and no cost model).

The prices, and ``basis`` names where each came from, so that every number can be traced:

- **measured** from the engine's own iteration stats: ``iterLatencyMS`` against the prompt tokens the
  iteration computed (``inflightBatchingStats.numCtxTokens``), the requests it decoded (``numGenRequests``) and,
  where the stats count them per iteration (1.3's ``kvCacheIterationStats``: ``iterOnboardBlocks``,
  ``iterOffloadBlocks``), its copies; least squares over every iteration past warm-up (``IterationFit``). On
  1.0-1.2 stats the copies are not counted per iteration: they are priced by the cost model, and ``basis`` says
  "measured prefill". TTFT would be the wrong thing to fit: a request's TTFT holds its wait behind the others'
  prefills, and a fit over requests gave 51 us a prefill token on the simulated H200 where its iterations give
  21.5 (Qwen3-8B).
- **estimated** by kvtop's cost model (kvtop/engines/sim/cost.py: the H200's measured anchors, or a profile from
  ``kvtop calibrate``) for the model and GPU the meta names, where the stats carry no iteration times: a block's
  prefill is its tokens' marginal time in a 4,096-token iteration, a copy its bytes at the link's measured
  bandwidth plus a fixed per-block latency. Loads and stores are summed, not overlapped (on their own streams
  they take 1.135x the larger, not the sum): spent_s is an upper bound.

The TTFT line ("-38 ms TTFT p50 on 31% of requests", driven runs: kvtop sees every request and where its prefix
came from) compares the tier's hit requests with themselves as misses: their TTFT plus, per hit block, a prefill
less a load. Checked against the truth the simulator gives, the same workload with and without the tier
(tests/tiers/test_verdict.py): a run it pays on, one it costs on (stores of blocks almost never loaded back), one it is
idle on.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable, Mapping
from typing import Any

from kvtop.values import frozen

__all__ = ["MIN_FIT_ITERATIONS", "SAYS", "CostBasis", "IterationFit", "TierEvidence", "TierVerdict",
           "cost_basis", "decide", "verdict_from_json"]

MIN_FIT_ITERATIONS = 50   # iterations before the engine's own prefill rate is taken as measured
# The TTFT line's hit requests, at most: the p50 as if they had missed is made on read from these
AS_MISS_SAMPLES = 1024
# The cost model's representative iteration for a hit known only as a count (no request record): the marginal
# prefill of a block's tokens in a 4,096-token iteration (TensorRT-LLM's chunks are up to max_num_tokens, 8,192
# by default; the GEMMs are compute-bound from ~1,000 tokens on the H200, so the marginal rate is flat there).
_REPRESENTATIVE_TOKENS = 4096


class CostBasis:
    """The cost model's prices for one model on one GPU: prefill saved by a hit, load and store per block."""

    def __init__(self, cost: Any, tokens_per_block: int, name: str):
        self.tokens_per_block = tokens_per_block
        self.name = name
        tpb = tokens_per_block
        self.load_block_s = cost.onboard_s(1, tpb)
        self.store_block_s = cost.offload_s(1, tpb)
        n = _REPRESENTATIVE_TOKENS
        self.block_saved_s = cost.prefill_s(n, 0) - cost.prefill_s(n - tpb, tpb)


def cost_basis(meta: Mapping[str, Any], tokens_per_block: int | None) -> CostBasis | None:
    """The cost basis for the model and GPU a run's meta names, or None (no model shape kvtop knows, no GPU
    profile, no block size). Built-in names and local config.json files only, as every mode reads them."""
    if not tokens_per_block:
        return None
    from kvtop.engines.gpus import resolve_gpu
    from kvtop.engines.meta import shape_for
    from kvtop.engines.sim.cost import CostModel

    gpu_name = meta.get("gpu_profile") or meta.get("gpu")
    tp = meta.get("tensor_parallel_size")
    try:
        # a model named as a local directory is read from its config.json: anyone's file (a 100k-deep one raised
        # RecursionError, not the ValueError of an unknown name), so inside the guard too
        shape, _why = shape_for(meta.get("model"))
        if shape is None:
            return None
        gpu = resolve_gpu(str(gpu_name or "H200"))
        cost = CostModel(shape, gpu, tensor_parallel_size=tp if isinstance(tp, int) and tp > 0 else 1)
        where = f"the {gpu.name} profile" if gpu_name else f"the {gpu.name} profile (no GPU named: assumed)"
        return CostBasis(cost, tokens_per_block, f"cost model: {shape.name} on {where}")
    except Exception:   # a profile or shape kvtop cannot price (a hostile file, an odd tp): no basis, said so
        return None


class IterationFit:
    """Least squares over the engine's own iteration stats: ``iterLatencyMS`` against the prompt tokens it
    computed (``inflightBatchingStats.numCtxTokens``), the requests it decoded (``numGenRequests``) and, where the
    stats count them per iteration (1.3's ``kvCacheIterationStats``), the blocks it onboarded and offloaded. Kept as
    running sums (the normal equations, 5 x 5), solved on read; a column that never varied is left out."""

    NAMES = ("intercept", "prefill_token", "decode_request", "onboard_block", "offload_block")
    __slots__ = ("n", "xtx", "xty", "_solved")

    def __init__(self) -> None:
        self.n = 0
        self.xtx = [0.0] * 25
        self.xty = [0.0] * 5
        self._solved: tuple[int, dict[str, float] | None] = (-1, None)   # (n, solution): read every refresh

    def add(self, seconds: float, ctx_tokens: int, gen_requests: int, onboards: int = 0, offloads: int = 0) -> None:
        x = (1.0, float(ctx_tokens), float(gen_requests), float(onboards), float(offloads))
        xtx, xty = self.xtx, self.xty
        for r in range(5):
            xr = x[r]
            if xr:
                xty[r] += xr * seconds
                row = 5 * r
                for c in range(5):
                    xtx[row + c] += xr * x[c]
        self.n += 1

    def solve(self) -> dict[str, float] | None:
        """Seconds per unit of each column that varied ({NAMES[i]: coefficient}); None with too few iterations,
        no spread in prompt tokens, or a prefill token that costs nothing (the fit is then no measurement)."""
        if self._solved[0] != self.n:
            self._solved = (self.n, self._solve())
        return self._solved[1]

    def _solve(self) -> dict[str, float] | None:
        if self.n < MIN_FIT_ITERATIONS:
            return None
        n, xtx = self.n, self.xtx
        cols = [0] + [c for c in range(1, 5)
                      if xtx[5 * c + c] * n - xtx[c] * xtx[c] > 1e-9 * max(1.0, xtx[5 * c + c] * n)]
        if 1 not in cols:
            return None
        k = len(cols)
        a = [[xtx[5 * r + c] for c in cols] + [self.xty[r]] for r in cols]
        for p in range(k):   # Gaussian elimination with partial pivoting: k <= 5
            piv = max(range(p, k), key=lambda r: abs(a[r][p]))
            if abs(a[piv][p]) < 1e-12:
                return None
            a[p], a[piv] = a[piv], a[p]
            for r in range(k):
                if r != p and a[r][p]:
                    f = a[r][p] / a[p][p]
                    a[r] = [x - f * y for x, y in zip(a[r], a[p])]
        coef = {self.NAMES[c]: a[i][k] / a[i][i] for i, c in enumerate(cols)}
        b = coef["prefill_token"]
        if not (b > 0 and math.isfinite(b)):
            return None
        return coef


class TierEvidence:
    """What the request records say about one tier: how many finished requests had a hit in it, and the latest
    ones' TTFTs with their hit blocks (the TTFT line's "as if they had missed" is made from these on read)."""

    def __init__(self) -> None:
        self.requests = 0            # finished requests with at least one block from this tier (and a TTFT)
        self.hit_blocks = 0
        self.samples: deque[tuple[float, int]] = deque(maxlen=AS_MISS_SAMPLES)   # (TTFT s, hit blocks)
        self._p50_key: tuple[int, float] | None = None
        self._p50: tuple[float, float] | None = None

    def add(self, ttft: float, hit_blocks: int) -> None:
        self.requests += 1
        self.hit_blocks += hit_blocks
        self.samples.append((ttft, hit_blocks))

    def p50_delta(self, per_block_s: float) -> float | None:
        """The hit requests' TTFT p50 less their p50 as if each hit block had been computed instead of loaded
        (``per_block_s``: prefill of a block less its load; < 0 means faster with the tier). Made again only when
        a request came or the price moved (a dashboard reads it every refresh)."""
        if not self.samples:
            return None
        key = (self.requests, round(per_block_s, 9))
        if key != self._p50_key:
            actual = sorted(t for t, _ in self.samples)
            as_miss = sorted(t + n * per_block_s for t, n in self.samples)
            k = max(1, math.ceil(0.5 * len(actual))) - 1   # nearest rank, as the latency tracks
            self._p50_key, self._p50 = key, (actual[k], as_miss[k])
        assert self._p50 is not None
        return self._p50[0] - self._p50[1]


@frozen
class TierVerdict:
    tier: str                       # "host", "disk"
    says: str                       # pays | costs | idle | none | unknown
    saved_s: float | None
    spent_s: float | None
    net_s: float | None
    basis: str
    loaded_blocks: int = 0          # hits the tier served (onboards)
    stored_blocks: int = 0          # blocks it was sent (offloads)
    hit_requests: int = 0           # finished requests with a hit in it (driven runs)
    requests: int = 0               # finished requests classified
    ttft_p50_delta_s: float | None = None   # the hit requests' TTFT p50 against themselves as misses (< 0: faster)
    net_s_per_min: float | None = None
    # the prices behind the figures, seconds a block (None where there was none)
    prefill_block_s: float | None = None
    load_block_s: float | None = None
    store_block_s: float | None = None

    @property
    def request_share(self) -> float | None:
        return self.hit_requests / self.requests if self.requests else None

    def text(self) -> str:
        """The verdict in one line of words (the dashboard's, the headless text's)."""
        name = f"{self.tier} tier"
        if self.says == "none":
            return f"no {name}" + ("" if self.basis == f"no {self.tier} pool" else " seen (its size unknown, nothing "
                                                                                     "stored)")
        if self.says == "idle":
            return f"{name}: idle, {self.stored_blocks:,} blocks stored, none loaded back"
        if self.says == "unknown":
            return f"{name}: {self.loaded_blocks:,} blocks loaded back; {self.basis}"
        parts = [f"{name}: {self.says}"]
        if self.ttft_p50_delta_s is not None and self.request_share is not None:
            parts.append(f"{self.ttft_p50_delta_s * 1000:+,.0f} ms TTFT p50 on {self.request_share:.0%} of requests")
        if self.net_s_per_min is not None:
            verb = "saved" if self.net_s_per_min >= 0 else "lost"
            parts.append(f"{abs(self.net_s_per_min):,.1f} s of prefill {verb} per minute")
        elif self.net_s is not None:
            parts.append(f"net {self.net_s:+,.1f} s")
        return ", ".join(parts)

    def short_text(self) -> str:
        """The same in ~45 characters, for a narrow screen."""
        if self.says == "none":
            return f"no {self.tier} tier" + ("" if self.basis == f"no {self.tier} pool" else " seen")
        if self.says == "idle":
            return f"{self.tier}: idle, {self.stored_blocks:,} stored, 0 loaded"
        if self.says == "unknown":
            return f"{self.tier}: {self.loaded_blocks:,} loads, not priced"
        parts = [f"{self.tier}: {self.says}"]
        if self.ttft_p50_delta_s is not None and self.request_share is not None:
            parts.append(f"{self.ttft_p50_delta_s * 1000:+,.0f} ms TTFT p50 on {self.request_share:.0%}")
        if self.net_s_per_min is not None:
            parts.append(f"{self.net_s_per_min:+,.1f} s/min")
        return ", ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {"says": self.says, "saved_s": self.saved_s, "spent_s": self.spent_s, "net_s": self.net_s,
                "basis": self.basis, "loaded_blocks": self.loaded_blocks, "stored_blocks": self.stored_blocks,
                "hit_requests": self.hit_requests, "requests": self.requests,
                "ttft_p50_ms_delta": None if self.ttft_p50_delta_s is None else self.ttft_p50_delta_s * 1000.0,
                "net_s_per_min": self.net_s_per_min, "text": self.text(),
                "prices_s": {"prefill_block": self.prefill_block_s, "load_block": self.load_block_s,
                             "store_block": self.store_block_s}}


SAYS = ("pays", "costs", "idle", "none", "unknown")
_MAX_SECONDS = 1e12   # a verdict read from an agent's summary: beyond this (30,000 years) a number is no measurement


def verdict_from_json(tier: str, d: Any) -> TierVerdict | None:
    """A verdict as an agent's summary carries it (``TierVerdict.to_json``), checked: what it says one of SAYS,
    its seconds finite and bounded, its counts non-negative integers, its words stripped of control characters
    and cut to 300 (they reach a terminal). None for anything else."""
    from kvtop.textsafe import clean

    if not isinstance(d, Mapping) or d.get("says") not in SAYS or not isinstance(d.get("basis"), str):
        return None

    def seconds(key: str) -> float | None:
        v = d.get(key)
        if v is None or isinstance(v, bool) or not isinstance(v, (int, float)):
            return None
        return float(v) if math.isfinite(v) and abs(v) < _MAX_SECONDS else None

    def count(key: str) -> int:
        v = d.get(key)
        return v if v.__class__ is int and 0 <= v < 1 << 63 else 0

    delta = seconds("ttft_p50_ms_delta")
    return TierVerdict(tier, d["says"], seconds("saved_s"), seconds("spent_s"), seconds("net_s"),
                       clean(d["basis"], 300),
                       loaded_blocks=count("loaded_blocks"), stored_blocks=count("stored_blocks"),
                       hit_requests=count("hit_requests"), requests=count("requests"),
                       ttft_p50_delta_s=None if delta is None else delta / 1000.0,
                       net_s_per_min=seconds("net_s_per_min"))


def _price(measured: float | None, model: float | None) -> tuple[float | None, bool]:
    """A per-unit price: the measured one when the fit gave it (> 0), else the cost model's; and whether it was
    measured."""
    if measured is not None and measured > 0 and math.isfinite(measured):
        return measured, True
    return model, False


def decide(tier: str, capacity_blocks: int | None, loaded: int, stored: int, evidence: TierEvidence | None,
           requests: int, fit: Mapping[str, float] | None, fit_iterations: int, cost: CostBasis | None,
           span_s: float | None, tokens_per_block: int | None, cost_reason: Callable[[], str] | None = None
           ) -> TierVerdict:
    """The verdict for ``tier`` from what the run showed (see the module docstring). ``capacity_blocks``: the
    tier's pool (0 or None: no tier; -1: a tier of unknown size); ``loaded`` / ``stored``: blocks it served back
    and was sent (the engine's own counts); ``evidence``: its hit requests (None where no request is seen);
    ``requests``: the finished requests classified; ``fit``: IterationFit.solve(); ``span_s``: the run so far."""
    common: dict[str, Any] = {"loaded_blocks": loaded, "stored_blocks": stored, "requests": requests,
                               "hit_requests": evidence.requests if evidence is not None else 0}
    if not capacity_blocks and not loaded and not stored:
        return TierVerdict(tier, "none", None, None, None, f"no {tier} pool", **common)
    if capacity_blocks == -1 and not loaded and not stored:
        # A pool of unknown size that has stored nothing (a vLLM stream without CPU events or /metrics): nothing
        # says there is one. "idle" (it stores, nothing comes back) read as if there were.
        return TierVerdict(tier, "none", None, None, None, f"no {tier} pool seen (its size unknown, nothing stored)",
                           **common)
    fit = fit or {}
    tpb = tokens_per_block or (cost.tokens_per_block if cost is not None else None)
    prefill, prefill_measured = _price(fit["prefill_token"] * tpb if "prefill_token" in fit and tpb else None,
                                       None if cost is None else cost.block_saved_s)
    # the onboard/offload columns are the host's copies (1.3's per-iteration counts); a disk tier's are not there
    load, load_measured = _price(fit.get("onboard_block") if tier == "host" else None,
                                 None if cost is None else cost.load_block_s)
    store, store_measured = _price(fit.get("offload_block") if tier == "host" else None,
                                   None if cost is None else cost.store_block_s)
    why = (cost_reason() if cost_reason is not None else "no cost model for this model") if cost is None else ""
    parts = []
    if prefill_measured:
        parts.append(f"prefill measured from {fit_iterations:,} iterations' times "
                     f"({fit['prefill_token'] * 1e6:,.1f} us a token)")
    elif prefill is not None and cost is not None:
        parts.append(f"prefill priced by the {cost.name}")
    if load_measured and store_measured:
        parts.append("copies measured from the same fit")
    elif load is not None and store is not None and cost is not None:
        parts.append(f"copies priced by the {cost.name}" if prefill_measured or prefill is None
                     else "copies by the same model")
    common.update(prefill_block_s=prefill, load_block_s=load, store_block_s=store)
    measured = prefill_measured and load_measured and store_measured
    label = "measured" if measured else "measured prefill" if prefill_measured else "estimated"
    if evidence is not None and evidence.requests:
        parts.append(f"TTFT of {evidence.requests:,} {tier}-hit requests")

    if loaded == 0:
        spent = None if store is None else stored * store
        basis = f"{label}: nothing loaded back" + (f"; stores priced ({'; '.join(parts)})" if spent is not None
                                                    else f"; stores not priced ({why})")
        return TierVerdict(tier, "idle", 0.0, spent, None if spent is None else -spent, basis,
                           net_s_per_min=_per_min(None if spent is None else -spent, span_s), **common)
    if prefill is None or load is None or store is None:
        return TierVerdict(tier, "unknown", None, None, None, f"not priced: {why}", **common)
    saved = loaded * prefill
    spent = loaded * load + stored * store
    delta = evidence.p50_delta(prefill - load) if evidence is not None else None
    net = saved - spent
    return TierVerdict(tier, "pays" if net > 0 else "costs", saved, spent, net, f"{label}: {'; '.join(parts)}",
                       ttft_p50_delta_s=delta,
                       net_s_per_min=_per_min(net, span_s), **common)


def _per_min(net: float | None, span_s: float | None) -> float | None:
    if net is None or not span_s or span_s <= 0:
        return None
    return net * 60.0 / span_s
