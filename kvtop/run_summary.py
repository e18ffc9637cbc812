"""What a session says at its end: the ``--headless --json`` object (:func:`summary`) and its text
(:func:`format_summary`), the same for a driven run, an attached one and a replay (kvtop/modes.py prints them)."""

from __future__ import annotations

import json
from typing import Any

from kvtop.engine_words import engine_label, engine_name, size_curve_unknown_why
from kvtop.session import Session
from kvtop.textsafe import clean


def summary(session: Session) -> dict[str, Any]:
    """The ``--headless --json`` object (issue 4's keys, plus what the fold adds)."""
    out: dict[str, Any] = {"engine": session.meta.get("engine"),
                           "engine_version": session.meta.get("engine_version"),
                           "model": session.meta.get("model"),
                           "simulated": session.meta.get("simulated"),
                           "sim_reason": session.meta.get("sim_reason"),
                           "scenario": session.meta.get("scenario"),
                           # the simulator's scheduler, and what it was asked for but does not model (SimLLM)
                           "capacity_scheduler_policy": session.meta.get("capacity_scheduler_policy"),
                           "not_modelled": list(session.meta.get("not_modelled") or [])}
    out.update(session.model.snapshot().summary())  # the same reading Prometheus and the fleet table get
    if out.get("engine") is None:
        # a source heard from by meta alone (a server whose data endpoints all failed) is no model's yet: what it
        # said of itself is still what the run watched. All of it or none: where the model names its engine, the
        # session's meta may be another source's (a fleet's first retained meta), and "vllm-format (TensorRT-LLM
        # 1.2), model Qwen/Qwen3-8B" put one source's engine beside another's version and model.
        for key in ("engine", "engine_version", "model", "gpu"):
            if out.get(key) is None and session.meta.get(key) is not None:
                out[key] = session.meta.get(key)
    out["what_if"] = session.what_if()
    out["size_advice"] = session.size_advice()
    no_curve = size_curve_unknown_why(out.get("stream"))
    if no_curve and isinstance(out["what_if"], dict):
        # a stream folds no block's lookups into the estimate: x2 and x4 read as the run's own rate (no gain),
        # where nothing was estimated at all; unknown, and why
        out["what_if"] = {**out["what_if"], "host_x2_hit_rate": None, "host_x4_hit_rate": None,
                          "unknown_why": no_curve}
    rec = out["size_advice"].get("recommendation") if isinstance(out["size_advice"], dict) else None
    if no_curve and isinstance(rec, dict) and not any(p.get("hit_rate") is not None
                                                      for p in out["size_advice"].get("points") or []):
        # a stream's curve never comes: why, not "no curve yet"
        out["size_advice"] = {**out["size_advice"], "recommendation": {**rec, "text": no_curve}}
    from kvtop.fleet import source_status as _source_status

    # Every source's state (connected / disconnected / offline / stale) and every link's (mqtt, trtllm-serve,
    # mqtt-publish, recorder), so a script can tell "nothing happened" from "could not see".
    out["records"] = session.records_in
    out["sources"] = {k: _source_status(k, session.status) or "connected" for k in session.models}
    out["links"] = {k: link_state(v) for k, v in session.status.items() if k not in session.models}
    out["refused_sources"] = session.refused_sources
    out["problems"] = session.problems.to_json()
    if len(session.models) > 1:  # attached to a fleet: every source and the aggregate row the dashboard shows
        from kvtop.fleet import aggregate, source_row, source_status

        out["fleet"] = {
            "sources": [source_row(k, m, source_status(k, session.status)).to_json()
                        for k, m in session.models.items()],
            "all": aggregate(session.models, session.status),
        }
    return out


def link_state(message: str) -> str:
    """A status message as one word: connected, disconnected, offline, failed, done, or the message's first."""
    text = str(message).lower()
    if text.startswith(("disconnected", "cannot reach", "unreachable")) or "retrying" in text:
        return "disconnected"
    if text.startswith(("connected", "reconnected", "attached", "online", "ok")):
        return "connected"
    if text in ("offline", "failed", "done", "error", "stale"):
        return text
    return text.split(" ", 1)[0] or "unknown"


def format_summary(s: dict[str, Any]) -> str:
    def pct(x: Any) -> str:
        return "unknown" if x is None else f"{100 * x:.1f}%"

    lines = [_header(s)]
    lines += [f"not modelled: {note}" for note in s.get("not_modelled") or []]
    req = s.get("requests", {})
    ttft = req.get("ttft_ms", {})
    if req.get("unknown_why"):   # a source with no requests to count: why, not "0 completed"
        lines.append(f"requests: unknown; {req['unknown_why'].removeprefix('requests unknown: ')}")
    else:
        lines.append(f"requests: {_n(req.get('completed', 0))} completed, {_n(req.get('failed', 0))} failed; TTFT "
                     f"p50 {_ms(ttft.get('p50'))}, p99 {_ms(ttft.get('p99'))}")
    by_source = req.get("ttft_ms_by_source") or {}
    if by_source:  # where each request's prefix came from: the verdict's evidence
        lines.append("TTFT by prefix source: " + "; ".join(
            f"{source.replace('_', ' ')} {v.get('count', 0):,} p50 {_ms(v.get('p50'))} p99 {_ms(v.get('p99'))}"
            for source, v in by_source.items()))
    for v in (s.get("verdict") or {}).values():   # the answer: is each tier below the GPU paying off
        if v.get("text"):
            # its basis after it, unless the text says it already ("not priced: no cost model ...", once)
            lines.append(f"verdict: {v['text']}" + (f" ({v['basis']})" if v.get("basis")
                                                    and v["basis"] not in v["text"] else ""))
    tiers = s.get("tiers") or {}
    for tier in dict.fromkeys(["gpu", "host", *tiers]):  # every tier the summary has, GPU and host always
        t = tiers.get(tier, {})
        lines.append(f"{tier:>4}: capacity {_n(t.get('capacity_blocks'))} blocks, in use {_n(t.get('in_use_blocks'))},"
                     f" cached {_n(t.get('cached_blocks'))}, free {_n(t.get('free_blocks'))}")
    cold = s.get("cold")
    if cold:  # the V2 manager's host + disk sum (TierModel.cold)
        lines.append(f"host+disk together: capacity {_n(cold.get('capacity_blocks'))} blocks, in use "
                     f"{_n(cold.get('in_use_blocks'))}, free {_n(cold.get('free_blocks'))}")
    if s.get("stats_schema") not in (None, "1.0-1.2"):
        lines.append(f"stats: TensorRT-LLM {s['stats_schema']}")
    hr = s.get("hit_rate", {})
    lines.append(f"hit rate: {pct(hr.get('cumulative'))} (GPU {pct(hr.get('gpu'))}, host {pct(hr.get('host'))})"
                 + (f"; {hr['unknown_why'].removeprefix('hit rate unknown: ')}" if hr.get("unknown_why") else ""))
    wi = s.get("what_if") or {}
    if wi.get("host_capacity_blocks") == 0:
        # As the dashboard says it: twice no host cache is still none (the estimate once read 17.5% under an
        # actual 15.6% here, being its own since-start rate, not the stats' hit rate on the line above).
        lines.append("what if: no host cache, x2 of 0 is 0")
    elif wi.get("unknown_why"):
        lines.append(f"what if: {wi['unknown_why']}")
    elif wi.get("host_x2_hit_rate") is not None:
        # The estimate's own since-start rate first, the same span and definition as the estimates beside it.
        lines.append(f"what if: all {pct(wi.get('hit_rate'))} -> host cache x2 {pct(wi.get('host_x2_hit_rate'))}, "
                     f"x4 {pct(wi.get('host_x4_hit_rate'))}")
    sa = s.get("size_advice") or {}
    rec = sa.get("recommendation") or {}
    if rec.get("text"):
        # The curve's points as "host size: hit rate (optimum)", then the advice in words.
        points = ", ".join(f"{_size(p.get('host_bytes'), p.get('host_blocks'))} {pct(p.get('hit_rate'))}"
                           + (f" (opt {pct(p['optimal_hit_rate'])})" if p.get("optimal_hit_rate") is not None else "")
                           for p in sa.get("points") or [])
        lines.append(f"size advice: {rec['text']}")
        if points:  # no curve yet: the advice says why, and there is no point to list
            lines.append(f"  hit rate by host size: {points}")
    mv = s.get("moves", {})
    lines.append(f"moves: offloaded {_n(mv.get('offloaded_blocks', 0))}, onboarded {_n(mv.get('onboarded_blocks', 0))}"
                 f", evicted GPU {_n(mv.get('evicted_gpu_blocks', 0))}, evicted host "
                 f"{_n(mv.get('evicted_host_blocks', 0))}")
    if mv.get("disk"):  # the engine has a disk tier: its moves, and its share of the hits where the engine says it
        lines.append(f"disk: prefetched to host {_n(mv.get('disk_prefetched_blocks', 0))}, onboarded to GPU "
                     f"{_n(mv.get('disk_onboarded_blocks', 0))}, offloaded to disk "
                     f"{_n(mv.get('disk_offloaded_blocks', 0))}"
                     + (f", hits {pct(hr['disk'])}" if hr.get("disk") is not None else ""))
    pre = s.get("preemptions") or {}
    if pre.get("suspended") or pre.get("resumed"):  # TensorRT-LLM V2's iterSuspendedRequests / iterResumedRequests
        lines.append(f"preemptions: suspended {_n(pre.get('suspended', 0))}, resumed {_n(pre.get('resumed', 0))}")
    from kvtop.tiers.departures import describe as describe_left

    left = describe_left(mv.get("left_said") or {}, mv.get("left_inferred") or {})
    if left:
        lines.append(f"left: {left}")
    st = s.get("stream")
    if st and not st.get("batches") and st.get("summaries"):  # a fleet's agent: its summaries, not the batches
        lines.append(f"stream: {_n(st['summaries'])} summaries from an agent, {_n(st.get('summaries_lost', 0))} lost")
    elif st:  # the engines' common KV event stream (zmq://, vllm://, sglang://)
        first, last = st.get("first_seq"), st.get("last_seq")
        lines.append(f"stream: {_n(st.get('batches', 0))} batches"
                     + (f" (seq {first}..{last})" if first is not None and last is not None else "")
                     + f", {_n(st.get('lost_batches', 0))} lost, {_n(st.get('replayed_batches', 0))} replayed, "
                     f"{_n(st.get('bad_events', 0))} bad events"
                     + (f", {st['max_lag_s']:.1f} s behind at most ({st.get('max_lag_batches', 0):,} batches waiting"
                        " behind a replay)" if st.get("max_lag_s") else "")
                     + ("; counts are SINCE ATTACH: the engine announced nothing it cached before"
                        if st.get("since_attach") else ""))
    sources = s.get("sources") or {}
    odd = {k: v for k, v in sources.items() if v not in ("connected", "online")}
    if len(sources) > 1 or odd:
        lines.append(f"sources: {len(sources):,}" + "".join(f", {k} {v}" for k, v in list(odd.items())[:10])
                     + (f" (+{len(odd) - 10:,} more not connected)" if len(odd) > 10 else "")
                     + (f"; {s['refused_sources']:,} records of sources past the limit refused"
                        if s.get("refused_sources") else ""))
    for p in s.get("problems") or []:
        lines.append(f"problem: {p['kind']} x{p['count']:,}: {p['message']}")
    # Every string above may have come from outside (model, engine, source names, messages).
    return "\n".join(clean(line, None) for line in lines)


def _header(s: dict[str, Any]) -> str:
    """"kvtop: ENGINE (VERSION), model MODEL [SIM: why], scheduler POLICY": a part that is not known says so
    ("engine unknown", "model unknown") or is left out (the version), never Python's None."""
    engine = engine_label(s.get("engine"))
    name = engine_name(s.get("engine"))
    version = s.get("engine_version")
    head = f"kvtop: {engine}" if engine else "kvtop: engine unknown"
    if version and version != engine:
        # a version that names its engine ("TensorRT-LLM 1.2 (simulated by kvtop)") is said alone, not after the name
        head = f"kvtop: {version}" if name and version.startswith(name) else f"{head} ({version})"
    head += f", model {s['model']}" if s.get("model") else ", model unknown"
    if s.get("simulated"):
        head += f" [SIM: {s['sim_reason']}]" if s.get("sim_reason") else " [SIM]"
    if s.get("capacity_scheduler_policy"):
        head += f", scheduler {s['capacity_scheduler_policy']}"
    return head


def _size(nbytes: Any, blocks: Any) -> str:
    from kvtop.tiers.sizeadvice import format_size

    return format_size(nbytes) if isinstance(nbytes, int) else f"{blocks:,} blocks"


def _n(x: Any) -> str:
    """A count with thousands separators (1,234,567); "unknown" where it is not known."""
    if x is None:
        return "unknown"
    return f"{x:,}" if isinstance(x, (int, float)) and not isinstance(x, bool) else str(x)


def _ms(x: Any) -> str:
    return "n/a" if x is None else f"{x:.1f} ms"


def dumps(obj: Any) -> str:
    return json.dumps(obj, indent=None, sort_keys=False, default=str)


__all__ = ["dumps", "format_summary", "link_state", "summary"]
