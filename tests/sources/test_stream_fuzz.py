"""The engines' wire as a hostile peer sends it (issue 26): ZMQ messages and /metrics pages made by hypothesis,
through the decoders (kvtop/sources/kv_wire.py decode_frames, kvtop/sources/engine_metrics.py parse_metrics) into a
TierModel, then rendered the way every mode renders it: the JSON summary (every number finite), the headless text
and the Prometheus page (no control character from outside), and, for a few, the dashboard. Nothing raises, every
message is folded or counted bad, and what is shown is bounded.
"""

from __future__ import annotations

import json
import math
from typing import Any

import msgpack
import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st
from kv_publisher import cleared, removed, stored

from kvtop import run_summary
from kvtop.records import MAX_MAGNITUDE, Record, RecordError, SourceId, decode, encode, make
from kvtop.sinks.prometheus import PrometheusExporter
from kvtop.sources.engine_metrics import engine_of, parse_metrics
from kvtop.sources.kv_wire import WireError, decode_frames
from kvtop.tiers import TierModel

SRC = SourceId("fuzz:5557", 0, "f")
_CONTROL = [chr(c) for c in (*range(0x20), *range(0x7F, 0xA0))]
_HOSTILE_TEXT = st.sampled_from(["GPU", "CPU", "cpu_pinned", "DISK", "STORAGE", "\x1b[2J\x1b]0;pwn\x07", "é" * 300,
                                 "", "x" * 5000])
# what msgpack can carry: a signed or unsigned 64-bit integer, any double
_NUMBERS = st.one_of(st.integers(min_value=-(1 << 63), max_value=(1 << 64) - 1),
                     st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0, 1, (1 << 64) - 1, 1 << 63]))
_ANY = st.recursive(st.one_of(st.none(), st.booleans(), _NUMBERS, _HOSTILE_TEXT, st.binary(max_size=16)),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(_HOSTILE_TEXT, inner, max_size=4),
                    max_leaves=12)
_HASHES = st.lists(st.one_of(st.integers(min_value=0, max_value=(1 << 64) - 1), _NUMBERS), max_size=6)


@st.composite
def _event(draw: Any) -> Any:
    kind = draw(st.sampled_from(["stored", "removed", "cleared", "junk"]))
    array = draw(st.booleans())
    medium = draw(st.one_of(st.none(), _HOSTILE_TEXT))
    if kind == "stored":
        ev = stored(draw(_HASHES), parent=draw(st.one_of(st.none(), _NUMBERS)), medium=medium,
                    block_size=draw(st.one_of(st.integers(min_value=1, max_value=64), _NUMBERS)), tokens=2,
                    array=array)
        if not array and draw(st.booleans()):
            ev["lora_name"] = draw(_HOSTILE_TEXT)
        return ev
    if kind == "removed":
        return removed(draw(_HASHES), medium=medium, array=array)
    if kind == "cleared":
        return cleared(array)
    return draw(_ANY)


@st.composite
def _message(draw: Any) -> list[bytes]:
    seq = draw(st.one_of(st.integers(min_value=0, max_value=50), st.integers(min_value=0, max_value=(1 << 64) - 1)))
    if draw(st.integers(0, 9)) == 0:     # a payload that is not the engines' shape at all
        body = msgpack.packb(draw(_ANY), use_bin_type=True) if draw(st.booleans()) else draw(st.binary(max_size=64))
    else:
        ts = draw(st.one_of(st.floats(min_value=1.6e9, max_value=1.9e9), _NUMBERS, st.none()))
        rank = draw(st.one_of(st.integers(min_value=0, max_value=3), _NUMBERS, st.none()))
        body = msgpack.packb([ts, draw(st.lists(_event(), max_size=5)), rank], use_bin_type=True)
    frames = [b"kv-events", seq.to_bytes(8, "big"), body]
    if draw(st.integers(0, 19)) == 0:
        frames = frames[: draw(st.integers(0, 2))]   # a message cut short
    return frames


_METRIC_LINES = [
    'vllm:cache_config_info{{block_size="{a}",num_gpu_blocks="{b}",engine="0"}} 1.0',
    'vllm:kv_offload_config_info{{cpu_num_chunks="{a}",engine="0"}} 1.0',
    'vllm:kv_cache_usage_perc{{engine="0",model_name="{t}"}} {v}',
    'vllm:prefix_cache_queries_total{{engine="0",model_name="m"}} {v}',
    'vllm:prompt_tokens_cached_by_source_total{{engine="0",model_name="m",source="{t}"}} {v}',
    'sglang:max_total_num_tokens{{model_name="m"}} {v}',
    'sglang:hicache_host_total_tokens{{model_name="m"}} {v}',
    'sglang:cached_tokens_total{{cache_source="{t}",model_name="m"}} {v}',
    'dynamo_frontend_model_total_kv_blocks{{model="{t}"}} {v}',
    '{t} {v}',
]


@st.composite
def _page(draw: Any) -> str:
    def value() -> str:
        return str(draw(st.one_of(_NUMBERS, st.sampled_from(["1e300", "-0", "NaN", "+Inf", "x", "1_0"]))))

    lines = []
    for template in draw(st.lists(st.sampled_from(_METRIC_LINES), max_size=8)):
        lines.append(template.format(a=value(), b=value(), v=value(), t=draw(_HOSTILE_TEXT).replace("\n", " ")))
    return "\n".join(lines) + "\n"


def _fold(messages: list[list[bytes]], pages: list[str]) -> tuple[TierModel, int]:
    m = TierModel()
    refused = 0
    t = 1.7e9
    for i, frames in enumerate(messages):
        t += 0.25
        try:
            batch = decode_frames(frames)
        except WireError:
            refused += 1
            continue
        if i == 0:
            m.apply(make("meta", {"engine": "vllm", "attach": "zmq"}, SRC, t))
        m.apply(decode(encode(Record(kind="kv_batch", data=batch.record_data(False), source=SRC, time=t))))
        if i < len(pages):
            # as the poller takes a page (kvtop/sources/engine_metrics.py): one prometheus_client cannot parse is a
            # failed scrape, one kvtop cannot carry as a record a bad value; both reported there, never folded
            try:
                samples = parse_metrics(pages[i])
                rec = make("metrics", {"engine": engine_of(samples), "url": "http://fuzz/metrics",
                                       "samples": samples}, SRC, t)
            except (ValueError, RecordError):
                refused += 1
                continue
            m.apply(decode(encode(rec)))
    return m, refused


def _clean(text: str, where: str) -> None:
    assert not [c for c in _CONTROL if c in text.replace("\n", "")], (where, text[:300])


def _finite(obj: Any) -> None:
    json.dumps(obj, allow_nan=False)   # NaN or infinity anywhere raises
    if isinstance(obj, dict):
        for v in obj.values():
            _finite(v)
    elif isinstance(obj, list):
        for v in obj:
            _finite(v)
    elif isinstance(obj, int) and not isinstance(obj, bool):
        assert abs(obj) <= MAX_MAGNITUDE, obj


_STORED = [b"kv-events", (0).to_bytes(8, "big"), msgpack.packb([1.7e9, [stored([1, 2])], 0], use_bin_type=True)]


@pytest.mark.slow
@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(_message(), min_size=1, max_size=12), st.lists(_page(), max_size=4))
# vLLM's cache_config_info with a capacity of 1e300 became the GPU's (10^300 in JSON and Prometheus, issue 26)
@example([_STORED], ['vllm:cache_config_info{block_size="16",num_gpu_blocks="1e300",engine="0"} 1.0\n'])
def test_hostile_streams_fold_and_render_headless_json_and_prometheus(messages: list[list[bytes]],
                                                                      pages: list[str]) -> None:
    m, refused = _fold(messages, pages)
    s = m.summary()
    _finite(s)
    text = run_summary.format_summary(s)
    _clean(text, "headless")
    page = PrometheusExporter(lambda: m, port=0, source=SRC).render().decode()
    _clean(page.replace("\\", ""), "prometheus")   # label values are escaped by prometheus_client
    for tier in s["tiers"].values():
        for key in ("capacity_blocks", "cached_blocks", "free_blocks", "in_use_blocks"):
            v = tier.get(key)
            assert v is None or 0 <= v <= MAX_MAGNITUDE, (key, v)
    stream = s.get("stream") or {}
    folded = stream.get("batches", 0)
    assert folded + refused + m.bad_records >= 1        # every message somewhere: folded, refused or bad
    hr = s["hit_rate"]["cumulative"]
    assert hr is None or (math.isfinite(hr) and 0.0 <= hr <= 1.0)


@pytest.mark.slow
@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.lists(_message(), min_size=1, max_size=8), st.lists(_page(), max_size=3))
def test_hostile_streams_render_on_the_dashboard(messages: list[list[bytes]], pages: list[str]) -> None:
    from recordings import dashboard_screen

    from kvtop.session import Session

    m, _ = _fold(messages, pages)
    session = Session(source=SRC)
    session.model = m
    session.models = {SRC.key(): m}
    _clean(dashboard_screen(session), "dashboard")


def _decode_both(frames: list[bytes]) -> tuple[Any, Any]:
    from kvtop.sources import kv_wire_fast

    out = []
    for fast in (True, False):
        kv_wire_fast.ENABLED = fast
        try:
            out.append(decode_frames(frames))
        except WireError as exc:
            out.append(("WireError", str(exc)))
        finally:
            kv_wire_fast.ENABLED = True
    return out[0], out[1]


# vLLM's own shapes, with and without each optional field: the typed path takes these (a fuzz of hostile messages
# mostly exercises the fallback)
_VLLM_EVENT = st.one_of(
    st.builds(lambda h, p, n, g, lora, ek, loc: {**stored(h, parent=p, tokens=n), "lora_name": lora,
                                                 **({} if g is None else {"group_idx": g}),
                                                 **({} if ek == "absent" else {"extra_keys": ek}),
                                                 # vLLM 0.34's newer fields (kv_cache_spec_kind, locality...)
                                                 **({} if loc is None else {"locality": loc, "ownership": "kvcr",
                                                                            "kv_cache_spec_kind": "full",
                                                                            "session_id": "s-1"})},
              st.lists(st.integers(0, (1 << 64) - 1), max_size=5), st.one_of(st.none(), st.integers(0, 1 << 63)),
              st.integers(0, 70), st.one_of(st.none(), st.integers(0, 3)), st.one_of(st.none(), st.text(max_size=5)),
              st.sampled_from(["absent", None, [["mm", 3]]]), st.sampled_from([None, "local", "remote"])),
    st.builds(lambda h, m: removed(h, medium=m), st.lists(st.integers(0, (1 << 64) - 1), max_size=5),
              st.sampled_from(["GPU", "CPU", None, "STORAGE"])),
    st.just(cleared()))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(st.one_of(_message(), st.builds(
    lambda evs, ts, rank: [b"kv-events", (3).to_bytes(8, "big"), msgpack.packb([ts, evs, rank], use_bin_type=True)],
    st.lists(_VLLM_EVENT, max_size=6), st.one_of(st.none(), st.floats(1.6e9, 1.9e9)),
    st.one_of(st.none(), st.integers(0, 7)))))
def test_the_typed_decode_gives_what_the_checking_path_gives(frames: list[bytes]) -> None:
    """kv_wire's msgspec path (vLLM 0.33's shape, token lists left undecoded) is an accelerator of
    normalize_event/decode_payload, the spec: for any message both give the same batch, or the same error."""
    fast, checked = _decode_both(frames)
    assert fast == checked


def test_the_typed_decode_takes_vllm_shapes_and_leaves_the_rest() -> None:
    from kvtop.sources.kv_wire_fast import decode_typed

    body = msgpack.packb([1.7e9, [stored([1, 2], tokens=300), removed([1]), cleared()], 0], use_bin_type=True)
    ts, rank, events = decode_typed(body)
    assert (ts, rank, [e["type"] for e in events]) == (1.7e9, 0, ["BlockStored", "BlockRemoved", "AllBlocksCleared"])
    assert events[0]["num_tokens"] == 600 and events[0]["block_hashes"] == [1, 2]
    # what the checking path must judge: a negative (signed) hash, bytes digests, positional events, a map envelope,
    # an unknown field, NaN in a scalar
    for odd in ([1.7e9, [stored([-5])], 0], [1.7e9, [stored([b"\x01" * 32])], 0],
                [1.7e9, [stored([1], array=True)], 0], {"ts": 1.7e9, "events": [], "data_parallel_rank": 0},
                [1.7e9, [{**stored([1]), "new_field": 1}], 0], [1.7e9, [{**stored([1]), "lora_id": math.nan}], 0]):
        assert decode_typed(msgpack.packb(odd, use_bin_type=True)) is None, odd
