"""The accelerator of the engines' stream decoder (kvtop/sources/kv_wire.py, the spec: ``normalize_event`` and
``decode_payload``'s checking path): a batch exactly as vLLM 0.33 encodes it, decoded by msgspec into typed events
with the token lists left undecoded, or None where the spec must judge the message.

Reference: kv_wire.decode_payload with ``ENABLED`` off. Held equal by tests/sources/test_stream_fuzz.py
test_the_typed_decode_gives_what_the_checking_path_gives (hypothesis: hostile messages and vLLM's own shapes, the
same batch or the same error) and test_the_typed_decode_takes_vllm_shapes_and_leaves_the_rest. Pays:
BENCHMARKS.md "An attached kvtop beside nvitop" (the ZMQ attach): 543 -> 96 us a 50-event batch on the dev box,
the attach at 10,000 events/s 23.4 -> 16.7% of a core on the H200 host; then 61 -> 37 us a batch (the kept fields
copied one by one, the token count read with struct: bench/JOURNAL.md, "The ZMQ attach at 10,000 events/s, halved").
"""

from __future__ import annotations

import struct
from typing import Annotated, Any

import msgspec
from msgspec import UNSET, Meta, Raw, Struct, UnsetType

from kvtop.sources.kv_wire_limits import MAX_EVENTS, MAX_HASHES, MAX_SMALL, U64

ENABLED = True  # tests turn it off to hold the two paths equal (tests/sources/test_stream_fuzz.py)

# msgspec types for a batch exactly as vLLM 0.33 encodes it (kv_events.py: ``KVEventBatch`` array-like, events as
# maps tagged by ``type``), each field bounded as :func:`normalize_event` bounds it: a value it would wrap, refuse or
# drop (a negative or bytes hash, a NaN, a nested value where a scalar goes, an unknown field or event type, a map
# envelope, a positional event) fails here, and the checking path reads the message. Token lists are left undecoded
# (``msgspec.Raw``: their count is in the msgpack header): they are ~90% of a batch's bytes. (msgspec is imported by
# kvtop.records already.)
_u64 = Annotated[int, Meta(ge=0)]          # msgpack has no integer past 2^64
_small = Annotated[int, Meta(ge=0, lt=MAX_SMALL)]
_num = Annotated[float, Meta(ge=-float(U64), le=float(U64))]   # NaN and inf fail the bounds
_extra = str | bool | int | _num | None | UnsetType   # a scalar the checking path keeps verbatim
_hashes = Annotated[list[_u64], Meta(max_length=MAX_HASHES)]   # more: the checking path says so


class _Stored(Struct, tag="BlockStored", tag_field="type", forbid_unknown_fields=True):
    block_hashes: _hashes
    parent_block_hash: _u64 | None = None
    token_ids: Raw | UnsetType = UNSET
    block_size: Annotated[int, Meta(gt=0, lt=MAX_SMALL)] | None = None
    lora_id: _extra = UNSET
    medium: str | None = None
    lora_name: _extra = UNSET
    extra_keys: Raw | UnsetType = UNSET       # dropped whatever it holds (EVENT_FIELDS)
    group_idx: _small | None | UnsetType = UNSET
    kv_cache_spec_kind: _extra = UNSET
    kv_cache_spec_sliding_window: _extra = UNSET
    locality: _extra = UNSET
    ownership: _extra = UNSET
    session_id: Raw | UnsetType = UNSET       # dropped
    cache_salt: Raw | UnsetType = UNSET       # dropped
    lookahead_token_ids: Raw | UnsetType = UNSET   # dropped


class _Removed(Struct, tag="BlockRemoved", tag_field="type", forbid_unknown_fields=True):
    block_hashes: _hashes
    medium: str | None = None
    group_idx: _small | None | UnsetType = UNSET
    kv_cache_spec_kind: _extra = UNSET
    kv_cache_spec_sliding_window: _extra = UNSET
    locality: _extra = UNSET
    ownership: _extra = UNSET
    session_id: Raw | UnsetType = UNSET
    cache_salt: Raw | UnsetType = UNSET


# The scalars both paths keep verbatim (EVENT_FIELDS "kept"): decode_typed copies them one by one, in vLLM's field
# order (lora_id, lora_name, group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window, locality, ownership)


class _Cleared(Struct, tag="AllBlocksCleared", tag_field="type", forbid_unknown_fields=True):
    pass


class _Body(Struct, array_like=True):
    ts: _num | None
    events: list[_Stored | _Removed | _Cleared]
    rank: _small | None = None


_BODY = msgspec.msgpack.Decoder(_Body)


_HEAD = struct.Struct(">B").unpack_from
_ARRAY16 = struct.Struct(">BH").unpack_from
_ARRAY32 = struct.Struct(">BI").unpack_from


def _token_count(raw: Any) -> int | None:
    """The length of an undecoded msgpack array (fixarray, array 16, array 32); None for anything else (a Raw is
    never empty: it holds one msgpack value). ``struct`` reads the header in place: a memoryview cost 3x as much."""
    b = _HEAD(raw)[0]
    if 0x90 <= b <= 0x9F:
        return b & 0x0F
    if b == 0xDC:
        return _ARRAY16(raw)[1]
    if b == 0xDD:
        return _ARRAY32(raw)[1]
    return None



def _copy_kept(e: _Stored | _Removed, d: dict[str, Any]) -> None:
    """The kept scalars both event kinds carry, into ``d`` where the message has them: unrolled, since a loop of
    getattr cost as much as the rest of the event (one call an event: ~0.06% of a core at 10,000 events/s)."""
    if e.group_idx is not UNSET:
        d["group_idx"] = e.group_idx
    if e.kv_cache_spec_kind is not UNSET:
        d["kv_cache_spec_kind"] = e.kv_cache_spec_kind
    if e.kv_cache_spec_sliding_window is not UNSET:
        d["kv_cache_spec_sliding_window"] = e.kv_cache_spec_sliding_window
    if e.locality is not UNSET:
        d["locality"] = e.locality
    if e.ownership is not UNSET:
        d["ownership"] = e.ownership


def decode_typed(payload: bytes) -> tuple[float | None, int | None, list[dict[str, Any]]] | None:
    """``(ts, rank, events)`` as the checking path gives them, or None where it must judge the message.

    An accelerator. Its reference: :func:`decode_payload` and :func:`normalize_event` (the spec; what this returns
    is what they return, and anything they would wrap, refuse or drop fails here and goes to them). Held equal by
    tests/sources/test_stream_fuzz.py ``test_the_typed_decode_gives_what_the_checking_path_gives`` (hypothesis, both
    paths on the same messages: the same batch, or the same error). Paid for by bench/JOURNAL.md, "A ZMQ attach beside
    nvitop": 543 -> 96 us a 50-event vLLM-shaped batch on the dev box (the token lists left undecoded)."""
    try:
        body = _BODY.decode(payload)
    except (msgspec.MsgspecError, RecursionError):
        return None
    events = body.events
    if len(events) > MAX_EVENTS:
        return None
    out: list[dict[str, Any]] = []
    append = out.append
    for e in events:
        if isinstance(e, _Removed):     # exact classes (msgspec Structs, no subclasses): a C-level check
            d: dict[str, Any] = {"type": "BlockRemoved", "block_hashes": e.block_hashes, "medium": e.medium}
            _copy_kept(e, d)
        elif isinstance(e, _Stored):
            d = {"type": "BlockStored", "block_hashes": e.block_hashes, "medium": e.medium,
                 "parent_block_hash": e.parent_block_hash, "block_size": e.block_size}
            tokens = e.token_ids
            if tokens is not UNSET:
                # _token_count inlined for an array 16 (16 to 65,535 tokens: a prompt's chain of blocks)
                b, n = _ARRAY16(tokens) if len(tokens) >= 3 else (0, 0)
                if b == 0xDC:
                    d["num_tokens"] = n
                else:
                    n = _token_count(tokens)
                    if n is not None:
                        d["num_tokens"] = n
            if e.lora_id is not UNSET:
                d["lora_id"] = e.lora_id
            if e.lora_name is not UNSET:
                d["lora_name"] = e.lora_name
            _copy_kept(e, d)
        else:
            d = {"type": "AllBlocksCleared"}
        append(d)
    return (None if body.ts is None else float(body.ts)), body.rank, out


__all__ = ["ENABLED", "decode_typed"]
