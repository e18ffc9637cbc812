"""The engines' common KV event stream: decoder (kvtop/sources/kv_wire.py: vLLM, SGLang, Dynamo wire shapes) and its
fold into TierModel (kvtop/tiers/stream.py)."""

from __future__ import annotations

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kv_publisher import SRC, batch, cleared, payload, removed, stored

from kvtop.records import Record, RecordError, decode, encode, make
from kvtop.sources.kv_wire import WireError, decode_frames, decode_payload, normalize_event
from kvtop.tiers import TierModel
from kvtop.tiers.stream import tier_of

# ----------------------------------------------------------------------------------------------- decoder

def test_vllm_033_golden_vector_decodes():
    # shared/engines-kv-events.md 7.1: vLLM 0.33's own encoder, BlockRemoved of 111, 222, medium GPU, group 0, rank 0
    raw = bytes.fromhex("93cb41dac3a1a3191ad99184a474797065ac426c6f636b52656d6f766564ac626c6f636b5f686173686573"
                        "926fccdea66d656469756da3475055a967726f75705f6964780000")
    b = decode_payload(raw, topic="kv-events", seq=7)
    assert b.rank == 0 and b.seq == 7 and b.bad_events == 0
    assert b.events == [{"type": "BlockRemoved", "block_hashes": [111, 222], "medium": "GPU", "group_idx": 0}]
    assert 1.7e9 < b.ts < 1.9e9


def test_kthena_vllm_026_batch_keeps_u64_hash_and_drops_tokens():
    # volcano-sh/kthena#1535, verbatim decoded repr of a real vLLM 0.26.0 batch (16 token ids)
    tokens = [151644] + list(range(15))
    ev = {"type": "BlockStored", "block_hashes": [15760518052499183552], "parent_block_hash": None,
          "token_ids": tokens, "block_size": 16, "lora_id": None, "medium": "GPU", "lora_name": None,
          "extra_keys": [None], "group_idx": 0, "kv_cache_spec_kind": "full_attention"}
    b = decode_payload(msgpack.packb([1789095808.8378847, [ev], 0]))
    (out,) = b.events
    assert out["block_hashes"] == [15760518052499183552] and out["block_hashes"][0] > 2**63
    assert out["num_tokens"] == 16 and "token_ids" not in out and "extra_keys" not in out
    assert out["kv_cache_spec_kind"] == "full_attention" and out["medium"] == "GPU" and out["block_size"] == 16


def test_legacy_positional_events_become_the_same_maps():
    # vllm PR #42892's description: ["BlockStored", hashes, parent, tokens, 64, null, "GPU", null, [["mm_hash1",50]]]
    arr = ["BlockStored", [1, 2], 9, list(range(128)), 64, None, "GPU", None, [["mm_hash1", 50]]]
    m = {"type": "BlockStored", "block_hashes": [1, 2], "parent_block_hash": 9, "token_ids": list(range(128)),
         "block_size": 64, "lora_id": None, "medium": "GPU", "lora_name": None, "extra_keys": [["mm_hash1", 50]]}
    assert normalize_event(arr) == normalize_event(m)
    assert normalize_event(["BlockRemoved", [5], "CPU"]) == {"type": "BlockRemoved", "block_hashes": [5],
                                                             "medium": "CPU"}
    assert normalize_event(["AllBlocksCleared"]) == {"type": "AllBlocksCleared"}


def test_hash_encodings_agree():
    digest = bytes(range(32))
    assert normalize_event(["BlockRemoved", [digest], None])["block_hashes"] == [
        int.from_bytes(digest, "big") & (2**64 - 1)]
    assert normalize_event(["BlockRemoved", [-1], None])["block_hashes"] == [2**64 - 1]


@pytest.mark.parametrize("medium,tier", [(None, "gpu"), ("", "gpu"), ("GPU", "gpu"), ("gpu", "gpu"),
                                         ("CPU", "host"), ("cpu", "host"), ("CPU_PINNED", "host"),
                                         ("STORAGE", "disk"), ("DISK", "disk"), ("EXTERNAL", "external"),
                                         ("NVME_OF", None), (3, None)])
def test_medium_vocabularies(medium, tier):
    assert tier_of(medium) == tier


def test_frames():
    body = payload([removed([1])])
    assert decode_frames([b"kv", (5).to_bytes(8, "big"), body]).seq == 5
    assert decode_frames([(6).to_bytes(8, "big"), body]).topic == ""
    assert decode_frames([b"k\x1b[2Jv", (1).to_bytes(8, "big"), body]).topic == "kv"  # kvtop.textsafe.clean
    with pytest.raises(WireError, match="3 frames"):
        decode_frames([body])
    with pytest.raises(WireError, match="8 bytes"):
        decode_frames([b"", b"\x01", body])


@pytest.mark.parametrize("raw,match", [
    (b"\xc1", "not msgpack"),
    (msgpack.packb({"nope": 1}), "must be a list"),
    (msgpack.packb([1.0]), r"\[ts, \[events\], dp_rank\]"),
    (msgpack.packb(["x", [], 0]), "ts"),
    (msgpack.packb([1.0, [], -2]), "dp_rank"),
    (msgpack.packb([1.0, {"a": 1}, 0]), "events"),
])
def test_bad_payloads_name_the_problem(raw, match):
    with pytest.raises(WireError, match=match):
        decode_payload(raw)


def test_one_bad_event_is_skipped_and_counted():
    b = decode_payload(payload([removed([1]), {"type": "Nope"}, ["BlockStored", "x"], {"type": "BlockRemoved",
                                                                                       "block_hashes": ["abc"]}]))
    assert [e["block_hashes"] for e in b.events] == [[1]]
    assert b.bad_events == 3 and "events[1].type" in b.first_bad


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=200))
def test_any_bytes_decode_or_raise_wire_error(raw):
    try:
        decode_payload(raw)
    except WireError:
        pass


_scalars = st.one_of(st.none(), st.integers(-(2**63), 2**64 - 1), st.text(max_size=5), st.floats(), st.booleans())
_values = st.recursive(_scalars, lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=4), c,
                                                                                      max_size=4), max_leaves=12)


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(_values, st.fixed_dictionaries({"type": st.sampled_from(
    ["BlockStored", "BlockRemoved", "AllBlocksCleared"]), "block_hashes": _values, "medium": _values}))))
def test_any_events_fold_without_raising(events):
    b = decode_payload(msgpack.packb([1.0, events, 0]))
    assert len(b.events) + b.bad_events == len(events)
    m = TierModel()
    rec = Record(kind="kv_batch", data=b.record_data(), source=SRC, time=1.0)
    m.apply(decode(encode(rec)))  # through JSON too: what crosses a process boundary
    assert m.bad_records == 0


# ----------------------------------------------------------------------------------------------- fold

def test_fold_counts_tiers_and_moves():
    m = TierModel()
    m.apply(batch(0, [stored([1, 2, 3, 4], medium=None)], t=1.0))               # the mocker omits medium
    m.apply(batch(1, [stored([1, 2], medium="CPU", block_size=16)], t=2.0))     # offload copies: GPU keeps them
    m.apply(batch(2, [removed([1, 2, 3], medium="GPU")], t=3.0))                # GPU evicts
    m.apply(batch(3, [stored([1], medium="GPU")], t=4.0))                       # 1 comes back from the CPU
    m.apply(batch(4, [stored([9], medium="STORAGE"), removed([2], medium="cpu")], t=5.0))
    gpu, host = m.gpu, m.host
    assert (gpu.cached_blocks, host.cached_blocks) == (2, 1)   # GPU {1, 4}; CPU {1}
    mv = m.moves
    assert (mv.offloaded_blocks, mv.onboarded_blocks, mv.evicted_gpu_blocks, mv.evicted_host_blocks) == (2, 1, 3, 1)
    s = m.summary()
    assert s["stream"]["since_attach"] is False and s["stream"]["first_seq"] == 0
    assert s["stream"]["stored_blocks"] == {"gpu": 5, "host": 2, "disk": 1, "external": 0}
    assert s["stream"]["onboarded_from"]["host"] == 1
    assert s["tiers"]["disk"]["cached_blocks"] == 1
    assert m.quality.events_seen and not m.quality.counts_approximate
    assert gpu.tokens_per_block == 16


def test_late_attach_is_since_attach_and_approximate():
    m = TierModel()
    m.apply(batch(4711, [stored([1, 2])]))
    m.apply(batch(4712, [removed([77, 1])]))   # 77 was cached before kvtop attached
    s = m.summary()
    assert s["stream"]["since_attach"] is True and s["stream"]["unknown_removals"] == 1
    assert s["tiers"]["gpu"]["cached_blocks"] == 1 and s["tiers"]["gpu"]["cached_approximate"] is True
    assert m.moves.evicted_unknown_blocks == 1 and m.quality.counts_approximate


def test_gaps_restarts_clears_and_duplicates():
    m = TierModel()
    m.apply(batch(0, [stored([1, 2])], t=1.0))
    m.apply(batch(5, [stored([3])], t=2.0))                 # 1..4 lost
    m.apply(batch(6, [stored([3]), removed([3])], t=3.0))   # a duplicate announcement: refcounted, still live
    assert m.summary()["stream"]["lost_batches"] == 4
    assert m.summary()["stream"]["duplicates"] == 1 and m.gpu.cached_blocks == 3
    m.apply(batch(0, [stored([7])], t=4.0))                 # seq went back: a new engine process
    s = m.summary()["stream"]
    assert s["publisher_restarts"] == 1 and m.gpu.cached_blocks == 1 and s["since_attach"] is False
    m.apply(batch(1, [cleared()], t=5.0))
    assert m.gpu.cached_blocks == 0 and m.summary()["stream"]["clears"] == 1


def test_groups_are_separate_blocks():
    m = TierModel()
    m.apply(batch(0, [stored([1], group_idx=0), stored([1], group_idx=1)]))
    assert m.gpu.cached_blocks == 2 and m.summary()["stream"]["duplicates"] == 0


def test_a_tier_past_its_bound_forgets_its_oldest_once_an_event():
    # LIVE_CAP: a store that takes a tier past its bound forgets, after the event, the oldest stores (the excess
    # and an eighth of the bound more), whichever of the fold's paths the event took (group 0 or not, a GPU store
    # with a host tier holding blocks or none). Forgetting as each hash came forgot 4 of 12 here, keeping 8.
    for group, host in ((0, False), (1, False), (0, True)):
        m = TierModel()
        m.apply(batch(0, [stored([100], medium="CPU")] if host else [], t=1.0))
        fold = m.stream_fold
        fold.live_cap = dict.fromkeys(fold.live_cap, 8)
        m.apply(batch(1, [stored(list(range(12)), group_idx=group)], t=2.0))
        assert fold.forgotten["gpu"] == 12 - 8 + 8 // 8 and m.gpu.cached_blocks == 7, (group, host)
        kept = sorted(k if group == 0 else k[1] for k in fold.live["gpu"])
        assert kept == list(range(5, 12)), (group, host)
        assert m.summary()["stream"]["stored_blocks"]["gpu"] == 12


def test_bad_batch_record_is_counted_not_raised():
    m = TierModel()
    m.apply(Record(kind="kv_batch", data={"seq": -1, "events": []}, source=SRC, time=1.0))
    m.apply(Record(kind="kv_batch", data={"seq": 0, "events": "x"}, source=SRC, time=1.0))
    assert m.bad_records == 2 and "seq" in (m.last_bad_reason or "") or "events" in (m.last_bad_reason or "")


def test_record_kinds_validate():
    assert make("kv_batch", {"seq": 1, "events": []}).kind == "kv_batch"
    with pytest.raises(RecordError, match="data.seq"):
        make("kv_batch", {"events": []})
    with pytest.raises(RecordError, match="data.samples"):
        make("metrics", {"engine": "vllm"})


# ----------------------------------------------------------------------------------------------- metrics

VLLM_METRICS = """\
# HELP vllm:cache_config_info Information of the LLMEngine CacheConfig
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",enable_prefix_caching="True",engine="0",num_gpu_blocks="2048"} 1.0
# TYPE vllm:kv_offload_config_info gauge
vllm:kv_offload_config_info{cpu_num_chunks="8192",cpu_blocks_per_chunk="1",engine="0"} 1.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} {queries}
# TYPE vllm:prompt_tokens_cached_by_source counter
vllm:prompt_tokens_cached_by_source_total{engine="0",model_name="m",source="device"} {device}
vllm:prompt_tokens_cached_by_source_total{engine="0",model_name="m",source="host"} {host}
vllm:prompt_tokens_cached_by_source_total{engine="0",model_name="m",source="disk"} 0
vllm:prompt_tokens_cached_by_source_total{engine="0",model_name="m",source="p2p"} 0
vllm:prompt_tokens_cached_by_source_total{engine="0",model_name="m",source="external_unspecified"} 0
"""


def _metrics(text: str, t: float) -> Record:
    from kvtop.sources.engine_metrics import engine_of, parse_metrics

    samples = parse_metrics(text)
    return Record(kind="metrics", data={"engine": engine_of(samples), "url": "x", "samples": samples}, source=SRC,
                  time=t)


def test_vllm_metrics_give_capacity_usage_and_hits_by_tier():
    m = TierModel()
    m.apply(_metrics(VLLM_METRICS.replace("{queries}", "1600").replace("{device}", "320").replace("{host}", "0"), 1))
    # since attach: the first scrape is the baseline
    assert m.gpu.capacity_blocks == 2048 and m.gpu.in_use_blocks == 512 and m.host.capacity_blocks == 8192
    assert m.hit_rate.lookups == 0
    m.apply(_metrics(VLLM_METRICS.replace("{queries}", "3200").replace("{device}", "800").replace("{host}", "480"),
                     2))
    hr = m.hit_rate
    # +1600 tokens looked up (100 blocks), +480 device and +480 host tokens (30 + 30 blocks)
    assert (hr.lookups, hr.hits, hr.host_hits) == (100, 60, 30)
    assert hr.cumulative == pytest.approx(0.6) and hr.host == pytest.approx(0.3) and hr.gpu == pytest.approx(0.3)
    assert m.summary()["stream"]["hit_blocks_by_tier"] == {"disk": 0, "external": 0, "gpu": 30, "host": 30}


SGLANG_METRICS = """\
# TYPE sglang:max_total_num_tokens gauge
sglang:max_total_num_tokens{model_name="m",tp_rank="0"} 65536
sglang:max_total_num_tokens{model_name="m",tp_rank="1"} 65536
# TYPE sglang:hicache_host_total_tokens gauge
sglang:hicache_host_total_tokens{model_name="m",tp_rank="0"} 262144
# TYPE sglang:hicache_host_used_tokens gauge
sglang:hicache_host_used_tokens{model_name="m",tp_rank="0"} 4096
# TYPE sglang:token_usage gauge
sglang:token_usage{model_name="m",tp_rank="0"} 0.5
# TYPE sglang:prompt_tokens counter
sglang:prompt_tokens_total{model_name="m",tp_rank="0"} {prompt}
# TYPE sglang:cached_tokens counter
sglang:cached_tokens_total{cache_source="device",model_name="m",tp_rank="0"} {device}
sglang:cached_tokens_total{cache_source="host",model_name="m",tp_rank="0"} {host}
"""


def test_sglang_metrics_host_residency_gauge_and_hits():
    m = TierModel()
    m.apply(batch(0, [stored([1], medium="CPU_PINNED", block_size=64)], t=0.5))
    m.apply(_metrics(SGLANG_METRICS.replace("{prompt}", "0").replace("{device}", "0").replace("{host}", "0"), 1))
    m.apply(_metrics(SGLANG_METRICS.replace("{prompt}", "6400").replace("{device}", "640").replace("{host}",
                                                                                                   "1280"), 2))
    # tokens per block from the events (64): GPU 65536/64, host 262144/64, host used 4096/64 (the gauge wins)
    assert m.gpu.capacity_blocks == 1024 and m.gpu.in_use_blocks == 512
    assert (m.host.capacity_blocks, m.host.cached_blocks) == (4096, 64)
    hr = m.hit_rate
    assert (hr.lookups, hr.hits, hr.host_hits) == (100, 30, 20)


def test_dynamo_frontend_metrics_give_hits():
    text = ('dynamo_frontend_cached_tokens_sum{{model="tiny"}} {c}\ndynamo_frontend_cached_tokens_count{{model="tiny"}}'
            ' 4\ndynamo_frontend_input_sequence_tokens_sum{{model="tiny"}} {i}\n'
            'dynamo_frontend_model_total_kv_blocks{{model="tiny"}} 32\n'
            'dynamo_frontend_model_kv_cache_block_size{{model="tiny"}} 16\n')
    m = TierModel()
    m.apply(_metrics(text.format(c=0, i=0), 1))
    m.apply(_metrics(text.format(c=448, i=948), 2))
    assert m.gpu.capacity_blocks == 32
    assert (m.hit_rate.hits, m.hit_rate.lookups) == (28, 59)


def test_counter_going_back_is_an_engine_restart():
    m = TierModel()
    for t, q, d in ((1, 1600, 0), (2, 3200, 1600), (3, 160, 160)):
        m.apply(_metrics(VLLM_METRICS.replace("{queries}", str(q)).replace("{device}", str(d))
                         .replace("{host}", "0"), t))
    assert (m.hit_rate.lookups, m.hit_rate.hits) == (110, 110)


def test_rank_split_and_bad_metrics_text():
    from kvtop.sources.engine_metrics import parse_metrics, split_by_rank

    text = VLLM_METRICS.replace("{queries}", "1").replace("{device}", "1").replace("{host}", "1")
    text += 'vllm:prefix_cache_queries_total{engine="1",model_name="m"} 5\n'
    parts = split_by_rank(parse_metrics(text))
    assert sorted(parts) == [0, 1] and len(parts[1]) == 1
    sg = split_by_rank(parse_metrics(SGLANG_METRICS.replace("{prompt}", "1").replace("{device}", "1")
                                     .replace("{host}", "1")))
    assert all(s[1].get("tp_rank") == "0" for s in sg[None])
    with pytest.raises(ValueError):
        parse_metrics("vllm:x abc\n")
    # control characters in label values never reach a terminal
    (s,) = parse_metrics('vllm:cache_config_info{block_size="16\\u001b[2J"} 1\n'.replace("\\u001b", "\x1b"))
    assert s[1]["block_size"] == "16"


def test_a_counter_that_appears_after_attach_counted_from_zero():
    # Dynamo's frontend creates its histograms on the first request; SGLang its cache_source labels on the first hit
    text = ('dynamo_frontend_model_kv_cache_block_size{{model="tiny"}} 16\n'
            'dynamo_frontend_cached_tokens_sum{{model="tiny"}} {c}\n'
            'dynamo_frontend_input_sequence_tokens_sum{{model="tiny"}} {i}\n')
    m = TierModel()
    m.apply(_metrics('dynamo_frontend_model_kv_cache_block_size{model="tiny"} 16\n', 1))
    m.apply(_metrics(text.format(c=0, i=474), 2))
    m.apply(_metrics(text.format(c=448, i=948), 3))
    assert (m.hit_rate.hits, m.hit_rate.lookups) == (28, 59)


def test_numbers_no_record_may_carry_are_dropped_at_the_edge():
    from kvtop.sources.engine_metrics import parse_metrics

    # kvtop.records bounds every number at 2^64: a metric or an event field past it must not poison a record
    assert parse_metrics("vllm:x_total 1e30\nvllm:y_total 5\n") == [["vllm:y_total", {}, 5.0]]
    ev = normalize_event({"type": "BlockRemoved", "block_hashes": [1], "medium": None, "weird": 1e30, "ok": 3})
    assert "weird" not in ev and ev["ok"] == 3
    with pytest.raises(WireError, match="dp_rank"):
        decode_payload(msgpack.packb([1.0, [], 2**40]))
    with pytest.raises(WireError, match="ts"):
        decode_payload(msgpack.packb([1e30, [], 0]))


_ops = st.lists(st.tuples(st.sampled_from(["BlockStored", "BlockRemoved", "AllBlocksCleared"]),
                          st.sampled_from([None, "GPU", "cpu", "CPU_PINNED", "STORAGE", "DISK"]),
                          st.lists(st.integers(0, 12), max_size=5), st.sampled_from([0, 0, 1])), max_size=40)


@pytest.mark.slow
@settings(max_examples=200, deadline=None)
@given(_ops)
def test_fold_agrees_with_a_refcounted_reference(ops):
    """Per tier, a block is live while more stores than removes of its (group, hash) were announced; a move is
    counted exactly when a hash becomes live (store) or stops being live (remove)."""
    m = TierModel()
    ref: dict[str, dict[tuple[int, int], int]] = {t: {} for t in ("gpu", "host", "disk")}
    offloads = onboards = disk_onboards = evict_gpu = evict_host = unknown = 0
    for i, (etype, medium, hashes, group) in enumerate(ops):
        tier = tier_of(medium)
        if etype == "AllBlocksCleared":
            ev = cleared()
            for live in ref.values():
                live.clear()
        elif etype == "BlockStored":
            ev = stored(hashes, medium=medium, group_idx=group)
            for h in hashes:
                key = (group, h)
                n = ref[tier].get(key, 0)
                ref[tier][key] = n + 1
                if n == 0 and tier == "host":
                    offloads += 1
                elif n == 0 and tier == "gpu" and key in ref["host"]:
                    onboards += 1
                elif n == 0 and tier == "gpu" and key in ref["disk"]:
                    disk_onboards += 1   # from the disk alone: the disk row's move, not a host onboard
        else:
            ev = removed(hashes, medium=medium, group_idx=group)
            for h in hashes:
                key = (group, h)
                n = ref[tier].get(key, 0)
                if n == 0:
                    unknown += tier in ("gpu", "host")
                elif n == 1:
                    del ref[tier][key]
                    evict_gpu += tier == "gpu"
                    evict_host += tier == "host"
                else:
                    ref[tier][key] = n - 1
        m.apply(batch(i, [ev], t=1.0 + i))
    assert m.bad_records == 0
    if ops:
        assert (m.gpu.cached_blocks, m.host.cached_blocks) == (len(ref["gpu"]), len(ref["host"]))
        mv = m.moves
        assert (mv.offloaded_blocks, mv.onboarded_blocks, mv.evicted_gpu_blocks, mv.evicted_host_blocks,
                mv.evicted_unknown_blocks) == (offloads, onboards, evict_gpu, evict_host, unknown)
        assert mv.disk_onboarded_blocks == disk_onboards
        disk = m.disk
        assert (disk.cached_blocks if disk is not None else 0) == len(ref["disk"])


KVBM_METRICS = """\
# TYPE kvbm_offload_blocks_d2h counter
kvbm_offload_blocks_d2h {d2h}
# TYPE kvbm_onboard_blocks_h2d counter
kvbm_onboard_blocks_h2d {h2d}
# TYPE kvbm_host_cache_hit_rate gauge
kvbm_host_cache_hit_rate 0.25
"""


def test_kvbm_counters_are_the_moves_when_present():
    # Dynamo KVBM :6880/metrics (DYN_KVBM_METRICS=true): its own offload/onboard counters beat the events' guess
    m = TierModel()
    m.apply(batch(0, [stored([1, 2], medium="CPU")], t=0.5))
    m.apply(_metrics(KVBM_METRICS.format(d2h=100, h2d=10), 1))
    m.apply(_metrics(KVBM_METRICS.format(d2h=164, h2d=42), 2))
    assert (m.moves.offloaded_blocks, m.moves.onboarded_blocks, m.moves.source) == (64, 32, "stats")
    assert m.summary()["stream"]["engine_gauges"]["kvbm_host_cache_hit_rate"] == 0.25


def test_vllm_url_defaults():
    from kvtop.sources.kv_events_zmq import parse_stream_url

    u = parse_stream_url("vllm://gpu-7", discover=lambda base, host: {})
    assert (u.http, u.events, u.replay, u.metrics) == ("http://gpu-7:8000", ("tcp://gpu-7:5557",), (None,),
                                                        ("http://gpu-7:8000/metrics",))
    u = parse_stream_url("sglang://gpu-7?events=6000&replay=6001&ranks=2", discover=lambda base, host: {})
    assert u.events == ("tcp://gpu-7:6000", "tcp://gpu-7:6001") and u.replay == ("tcp://gpu-7:6001",
                                                                                  "tcp://gpu-7:6002")
    assert u.http == "http://gpu-7:30000"


@pytest.mark.parametrize("old, new", [
    ('num_gpu_blocks="2048"', 'num_gpu_blocks="1e300"'),
    ('num_gpu_blocks="2048"', f'num_gpu_blocks="{(1 << 40) + 1}"'),  # one past records.MAX_BLOCKS
    ('block_size="16"', 'block_size="1e300"'),
    ('cpu_num_chunks="8192"', 'cpu_num_chunks="inf"'),
    ('num_gpu_blocks="2048"', 'num_gpu_blocks="nan"'),
])
def test_metrics_capacities_past_the_records_bounds_are_bad_records_never_folded(old: str, new: str) -> None:
    """issue 26: ``vllm:cache_config_info{num_gpu_blocks="1e300"}`` became the GPU capacity (10^300 in JSON and
    Prometheus). A capacity from /metrics gets the records' bounds (a block count <= 2^40): the scrape is a bad
    record and none of it is folded."""
    page = VLLM_METRICS.replace("{queries}", "1600").replace("{device}", "320").replace("{host}", "0")
    m = TierModel()
    m.apply(_metrics(page, 1))
    assert (m.gpu.capacity_blocks, m.host.capacity_blocks, m.bad_records) == (2048, 8192, 0)
    assert old in page
    m.apply(_metrics(page.replace(old, new).replace("1600", "3200"), 2))
    assert m.bad_records == 1 and "out of bounds" in (m.last_bad_reason or "")
    assert (m.gpu.capacity_blocks, m.host.capacity_blocks) == (2048, 8192)  # the bad scrape folded nothing
    assert m.hit_rate.lookups == 0  # not even its counters
    fresh = TierModel()
    fresh.apply(_metrics(page.replace(old, new), 1))
    assert fresh.bad_records == 1 and fresh.gpu.capacity_blocks is None
