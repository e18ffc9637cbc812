"""The engines' common KV event stream's wire decoder (vLLM, SGLang, TensorRT-LLM's streaming path, Dynamo's
mocker): ZMQ frames -> :class:`Batch`, whose ``record_data`` is a ``kv_batch`` record's data. Its fold is
:mod:`kvtop.tiers.stream`.

Wire format (read from vLLM 0.33's ``vllm/distributed/kv_events.py``, SGLang 0.5.23's
``sglang/srt/disaggregation/kv_events.py`` and Dynamo's ``docs/integrations/kv-events-custom-engines.md``;
shared/engines-kv-events.md has the details; this decoder is kvtop's own):

- a ZMQ multipart message ``[topic, seq, payload]``: ``seq`` is 8 bytes big-endian, per publisher process (it
  restarts at 0 with the engine); a replay answer may lack the topic frame (vLLM before PR #45177);
- ``payload`` is msgpack ``[ts, [event, ...], dp_rank]`` (``dp_rank`` may be missing or nil);
- an event is a map with ``type`` ``BlockStored`` / ``BlockRemoved`` / ``AllBlocksCleared`` (vLLM since PR #42892,
  SGLang, the mocker), or, from older vLLM, a positional array ``["BlockStored", block_hashes, parent_block_hash,
  token_ids, block_size, lora_id, medium, lora_name, ...]`` / ``["BlockRemoved", block_hashes, medium]`` /
  ``["AllBlocksCleared"]``;
- block hashes are unsigned 64-bit ints (vLLM's default), signed ones (wrapped), or raw digests as bytes (vLLM with
  ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES=0``), which become the u64 that vLLM's own conversion gives
  (``int.from_bytes(digest, "big") & (2**64 - 1)``, the digest's last 8 bytes), so both encodings agree;
- ``medium`` names the tier: ``GPU``/``CPU``/``STORAGE`` (vLLM, sometimes lowercase: LMCache legacy, Mooncake),
  ``GPU``/``CPU_PINNED``/``DISK``/``EXTERNAL`` (SGLang); missing or nil is the GPU (the mocker never sends it).

Records (what crosses a process boundary, design.md): one ``kv_batch`` record per message, ``data`` =
``{"seq", "ts", "rank", "topic", "events": [...], "replayed"}``. Each event keeps the engine's own field names and
``medium`` verbatim (a recording stays a bug report), with two changes: positional events become maps (same
names), and ``token_ids`` is replaced by ``num_tokens`` (the tokens are the user's prompts, ~90% of a batch's
bytes; kvtop's MQTT publisher leaves them out of TensorRT-LLM events for the same reason). Non-scalar fields kvtop
does not read (``extra_keys``: multimodal hashes and cache salts) are dropped too, and so are the user's session
id and cache salt (``EVENT_FIELDS`` says, field by field, what is read, kept or dropped, and why).

The typed decode (kvtop/sources/kv_wire_fast.py) is this decoder's accelerator; :func:`decode_payload` and
:func:`normalize_event` are the spec it is held to (its docstring says by which test, and what it saves).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from kvtop.sources import kv_wire_fast
from kvtop.sources.kv_wire_limits import MAX_EVENTS, MAX_HASHES, MAX_SMALL, U64

__all__ = [
    "EVENT_FIELDS",
    "Batch",
    "WireError",
    "decode_frames",
    "decode_payload",
    "normalize_event",
]

_U64 = U64
_MASK = _U64 - 1
EVENT_TYPES = ("BlockStored", "BlockRemoved", "AllBlocksCleared")
# Positional field order of older vLLM's array-encoded events (vLLM before PR #42892; PR #42892's description shows
# ``["BlockStored", hashes, parent, tokens, 64, null, "GPU", null, [["mm_hash1", 50]]]``).
_POSITIONAL = {
    "BlockStored": ("block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
                    "lora_name", "extra_keys", "group_idx"),
    "BlockRemoved": ("block_hashes", "medium", "group_idx"),
    "AllBlocksCleared": (),
}
# Every field of the engines' BlockStored / BlockRemoved, and what kvtop does with it (read, kept in the record
# unread, or dropped), on purpose: vLLM 0.33.0 / 0.34.0 vllm/distributed/kv_events.py, SGLang 0.5.23
# sglang/srt/disaggregation/kv_events.py. A field no table names is kept when it is a scalar (a newer engine's).
EVENT_FIELDS = {
    "block_hashes": "read: the blocks",
    "parent_block_hash": "kept, not read: the fold counts blocks per tier, not chains",
    "token_ids": "dropped: the user's prompt (its length is kept as num_tokens)",
    "block_size": "read: the tier's tokens per block",
    "lora_id": "kept, not read (deprecated in vLLM 0.33 for lora_name)",
    "medium": "read: the tier (kvtop.tiers.stream MEDIUM_TIERS; vLLM's STORAGE is the disk)",
    "lora_name": "kept, not read",
    "extra_keys": "dropped: not a scalar (multimodal hashes, cache salts)",
    "group_idx": "read: a block is (group, hash); every group's blocks come from one pool (vLLM's "
                 "KVCacheCoordinator has one BlockPool), so a tier's blocks are summed over groups",
    "kv_cache_spec_kind": "kept, not read: the groups share the pool cache_config_info sizes, whatever their kind",
    "kv_cache_spec_sliding_window": "kept, not read (as kv_cache_spec_kind)",
    "locality": "kept, not read: vLLM's own hit attribution maps STORAGE to disk whatever the locality "
                "(vllm/v1/kv_offload/tiering/base.py), and so does kvtop",
    "ownership": "kept, not read: the id of a secondary offloading tier (\"kvcr\"); a hash it announces again is "
                 "refcounted like any repeated announcement",
    "session_id": "dropped: names the user's session (vLLM 0.33, SGLang 0.5.23), read by nothing here",
    "cache_salt": "dropped: the user's cache salt (SGLang 0.5.23); the hashes are namespaced by it already",
    "lookahead_token_ids": "dropped: the user's tokens (vLLM 0.34)",
}
# Fields never kept in a record (see EVENT_FIELDS): the user's tokens, session and salt.
_DROPPED_FIELDS = frozenset(k for k, why in EVENT_FIELDS.items() if why.startswith("dropped"))
_MAX_EVENTS = MAX_EVENTS
_MAX_HASHES = MAX_HASHES
_MAX_SMALL = MAX_SMALL
_SEQ_LIMIT = 1 << 63  # seq is signed on the wire (vLLM packs it so, and -1 ends a replay answer): 2^63 and up is < 0


class WireError(ValueError):
    """A message that is not a KV event batch; ``field`` says where, ``problem`` what."""

    def __init__(self, field: str, problem: str):
        super().__init__(f"{field}: {problem}")
        self.field = field
        self.problem = problem


@dataclass(frozen=True)
class Batch:
    """One decoded message: ``events`` normalized (see the module doc), ``bad_events`` skipped ones."""

    topic: str
    seq: int
    ts: float | None
    rank: int | None
    events: list[dict[str, Any]]
    bad_events: int = 0
    first_bad: str | None = None

    def record_data(self, replayed: bool = False) -> dict[str, Any]:
        data: dict[str, Any] = {"seq": self.seq, "ts": self.ts, "rank": self.rank, "topic": self.topic,
                                "events": self.events}
        if replayed:
            data["replayed"] = True
        if self.bad_events:
            data["bad_events"] = self.bad_events
        return data


def _describe(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _hash(value: Any, path: str) -> int:
    if value.__class__ is int:
        if -(1 << 63) <= value < _U64:
            return value & _MASK
    elif isinstance(value, (bytes, bytearray)) and value:
        return int.from_bytes(value, "big") & _MASK
    raise WireError(path, f"must be a 64-bit integer or a digest, got {_describe(value)}")


def _scalar(value: Any) -> bool:
    # What a record can carry verbatim: JSON without inf or NaN (allow_nan=False), and no number past 2^64
    # (kvtop.records.MAX_MAGNITUDE: a record carrying one is rejected whole wherever it is read back)
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return True
    if isinstance(value, (int, float)):
        return -_U64 <= value <= _U64  # NaN fails the comparison
    return False


def normalize_event(raw: Any, path: str = "event") -> dict[str, Any]:
    """One event (map or positional array) as kvtop keeps it; :class:`WireError` naming what is wrong."""
    if isinstance(raw, (list, tuple)):
        if not raw or not isinstance(raw[0], str):
            raise WireError(f"{path}[0]", f"must be the event type, got {_describe(raw[:1])}")
        etype: Any = raw[0]
        names = _POSITIONAL.get(etype)
        if names is None:
            raise WireError(f"{path}[0]", f"must be one of {', '.join(EVENT_TYPES)}, got {_describe(etype)}")
        fields: dict[Any, Any] = dict(zip(names, raw[1:]))
    elif isinstance(raw, Mapping):
        etype = raw.get("type")
        if not isinstance(etype, str) or etype not in _POSITIONAL:
            raise WireError(f"{path}.type", f"must be one of {', '.join(EVENT_TYPES)}, got {_describe(etype)}")
        fields = dict(raw)
        fields.pop("type", None)
    else:
        raise WireError(path, f"must be a map or an array, got {type(raw).__name__}")
    out: dict[str, Any] = {"type": etype}
    if etype != "AllBlocksCleared":
        hashes = fields.get("block_hashes")
        if not isinstance(hashes, (list, tuple)):
            raise WireError(f"{path}.block_hashes", f"must be a list, got {_describe(hashes)}")
        if len(hashes) > _MAX_HASHES:
            raise WireError(f"{path}.block_hashes", f"has {len(hashes)} hashes (at most {_MAX_HASHES})")
        # Hot path: vLLM's default u64 ints pass as they are (the f-string paths cost 3x the decode when built
        # per hash); anything else (negative i64, bytes digests, junk) takes the checking path.
        if all(h.__class__ is int and 0 <= h < _U64 for h in hashes):
            out["block_hashes"] = list(hashes)
        else:
            out["block_hashes"] = [_hash(h, f"{path}.block_hashes[{i}]") for i, h in enumerate(hashes)]
        medium = fields.get("medium")
        if medium is not None and not isinstance(medium, str):
            raise WireError(f"{path}.medium", f"must be a string, got {_describe(medium)}")
        out["medium"] = medium
    if etype == "BlockStored":
        parent = fields.get("parent_block_hash")
        out["parent_block_hash"] = None if parent is None else _hash(parent, f"{path}.parent_block_hash")
        size = fields.get("block_size")
        if size is not None and (size.__class__ is not int or not 0 < size < _MAX_SMALL):
            raise WireError(f"{path}.block_size", f"must be an integer in [1, {_MAX_SMALL}), got {_describe(size)}")
        out["block_size"] = size
        tokens = fields.get("token_ids")
        if isinstance(tokens, (list, tuple)):
            out["num_tokens"] = len(tokens)
    group = fields.get("group_idx")
    if group is not None and (group.__class__ is not int or not 0 <= group < _MAX_SMALL):
        raise WireError(f"{path}.group_idx", f"must be an integer in [0, {_MAX_SMALL}), got {_describe(group)}")
    for key, value in fields.items():
        if key in out or key in _DROPPED_FIELDS or not isinstance(key, str):
            continue
        if _scalar(value):
            out[key] = value
    return out


def decode_payload(payload: bytes, *, topic: str = "", seq: int = 0) -> Batch:
    """The msgpack body ``[ts, [events], dp_rank]``; a bad event is skipped and counted, a bad body raises.

    A body in vLLM's own shape (map events of the known fields, u64 hashes) goes through the typed decode
    (kvtop/sources/kv_wire_fast.py) first; anything else (and anything that fails it) through the checking path
    below, the spec."""
    if kv_wire_fast.ENABLED:
        typed = kv_wire_fast.decode_typed(payload)
        if typed is not None:
            return Batch(topic, seq, typed[0], typed[1], typed[2])
    import msgpack

    try:
        body = msgpack.unpackb(payload, raw=False, strict_map_key=False, unicode_errors="replace")
    except Exception as exc:  # ExtraData, FormatError, StackError, ValueError...: all "not msgpack"
        raise WireError("payload", f"not msgpack ({type(exc).__name__}: {str(exc)[:60]})") from None
    if isinstance(body, Mapping):  # tolerated: a map envelope {"ts", "events", "data_parallel_rank"}
        ts, events = body.get("ts"), body.get("events")
        rank = body.get("data_parallel_rank", body.get("attn_dp_rank", body.get("dp_rank")))
    elif isinstance(body, (list, tuple)) and len(body) >= 2:
        ts, events = body[0], body[1]
        rank = body[2] if len(body) > 2 else None
    else:
        raise WireError("payload", f"must be [ts, [events], dp_rank], got {_describe(body)}")
    if ts is not None and (isinstance(ts, bool) or not isinstance(ts, (int, float)) or not -_U64 <= ts <= _U64):
        raise WireError("payload.ts", f"must be a finite number, got {_describe(ts)}")
    if not isinstance(events, (list, tuple)):
        raise WireError("payload.events", f"must be a list, got {_describe(events)}")
    if len(events) > _MAX_EVENTS:
        raise WireError("payload.events", f"has {len(events)} events (at most {_MAX_EVENTS})")
    if rank is not None and (rank.__class__ is not int or not 0 <= rank < _MAX_SMALL):
        raise WireError("payload.dp_rank", f"must be an integer in [0, {_MAX_SMALL}), got {_describe(rank)}")
    out: list[dict[str, Any]] = []
    bad = 0
    first_bad: str | None = None
    for i, raw in enumerate(events):
        try:
            out.append(normalize_event(raw, f"events[{i}]"))
        except WireError as exc:
            bad += 1
            first_bad = first_bad or str(exc)
        except Exception as exc:  # anything else an odd event can raise: one bad event, never a dead source
            bad += 1
            first_bad = first_bad or f"events[{i}]: {type(exc).__name__}: {exc}"
    return Batch(topic, seq, None if ts is None else float(ts), rank, out, bad, first_bad)


_TOPICS: dict[bytes, str] = {}   # cleaned topics (a publisher sends one): at most 16 kept


def _clean_topic(raw: bytes) -> str:
    # Strings from outside reach a terminal: kvtop's one sanitizer, length bounded.
    head = raw[:200]
    text = _TOPICS.get(head)
    if text is None:
        from kvtop.textsafe import clean

        text = clean(head.decode("utf-8", "replace"))
        if len(_TOPICS) >= 16:
            _TOPICS.clear()
        _TOPICS[head] = text
    return text


def decode_frames(frames: Sequence[bytes]) -> Batch:
    """A live message ``[topic, seq, payload]`` (or a replayed ``[seq, payload]``)."""
    if len(frames) == 3:
        topic, seq_b, payload = frames
    elif len(frames) == 2:
        topic, (seq_b, payload) = b"", frames
    else:
        raise WireError("message", f"must have 3 frames [topic, seq, payload], got {len(frames)}")
    if len(seq_b) != 8:
        raise WireError("seq", f"must be 8 bytes (big-endian), got {len(seq_b)}")
    seq = int.from_bytes(seq_b, "big")
    if seq >= _SEQ_LIMIT:
        raise WireError("seq", f"is negative as the signed 64-bit number it is ({seq - (1 << 64):,}; -1 ends a "
                               "replay answer): not a batch's")
    return decode_payload(bytes(payload), topic=_clean_topic(bytes(topic)), seq=seq)
