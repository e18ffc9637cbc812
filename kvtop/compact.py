"""Compact KV events in recordings: what made recordings grow by ~1.3-1.5 MB/s.

Three steps, all undone by every reader (``kvtop.records.read_jsonl``), so the fold sees TensorRT-LLM's dicts:
runs of KV events of one source share a line (``BATCH_KIND``, written by kvtop/sinks/recorder.py: one envelope
of ~110 bytes instead of one per event, each event's time kept exactly); an offload or onboard is packed into five
numbers (``pack_event``); and token lists are plain ids (below). Measured in bench/JOURNAL.md "Recording size".

A TensorRT-LLM ``stored`` event lists every token of every block as a dict (``_utils.py``
``KVCacheEventSerializer``: ``{"type": "unique_token", "token_id": int, "token_extra_id": int}``): ~55 bytes of
JSON per token, 86% of a recording's bytes (a 10 s default simulator run: 13.1 of 15.2 MB). A recording keeps
the token ids (the what-if fold matches partly filled blocks by their tokens, and tells release stores by their
length) but writes a block whose tokens are all plain (``unique_token``, extra id 0) as ``"token_ids": [ids]``
instead of ``"tokens": [...]``. Any other block (a multimodal extra id, a token type kvtop does not know) is
written as it came.

An ``updated`` event's ``{"type": "event_diff", "new_value": n, "old_value": o}`` diffs are written as
``"cache_level_diff": [o, n]`` (and ``priority_diff``).

Every reader of records (``kvtop.records.from_obj``) puts a KV event into one form, ``read_event``: ``updated``
diffs as TensorRT-LLM's dicts (what the fold reads), and a block's plain tokens as ``"token_ids"`` (what the
recorder writes), whether the line came from an engine (token dicts), a recording (ids) or an older kvtop, so
the fold sees the same dicts from all three. The ids rather than the dicts because a stored event of a busy
engine carries ~1,000 token dicts (~35 KB of JSON) that nothing reads one by one: building them was most of the
cost of reading such a line (bench/JOURNAL.md "Stored events as token ids"). ``expand_event`` undoes
``compact_event`` whole, back to TensorRT-LLM's shape.
"""

from __future__ import annotations

from typing import Any

__all__ = ["BATCH_KIND", "compact_event", "expand_event", "pack_event", "read_event", "read_form", "unpack_event"]

# A recording's line of several KV events of one source, written by the recorder (kvtop/sinks/recorder.py) and
# expanded into ``kv_event`` records by ``kvtop.records.read_jsonl``; never seen by the fold or sent elsewhere.
BATCH_KIND = "kv_events"

_PLAIN = "unique_token"


def _plain_ids(tokens: Any) -> list[int] | None:
    """The token ids of a list of plain tokens, or None when any token is not plain."""
    if not isinstance(tokens, list):
        return None
    ids = []
    for t in tokens:
        # an extra id of 0 exactly: 0.0 or false would come back as 0
        if (type(t) is not dict or len(t) != 3 or t.get("type") != _PLAIN or type(t.get("token_extra_id")) is not int
                or t["token_extra_id"] != 0):
            return None
        tid = t.get("token_id")
        if type(tid) is not int:
            return None
        ids.append(tid)
    return ids


_DIFFS = (("cache_level", "cache_level_diff"), ("priority", "priority_diff"))


def _diff_pair(value: Any) -> list[int] | None:
    """TensorRT-LLM's ``{"type": "event_diff", "new_value": n, "old_value": o}`` as ``[o, n]``, or None."""
    if (type(value) is dict and len(value) == 3 and value.get("type") == "event_diff"
            and type(value.get("old_value")) is int and type(value.get("new_value")) is int):
        return [value["old_value"], value["new_value"]]
    return None


def _compact_updated(event: dict[str, Any], data: dict[str, Any]) -> dict[str, Any]:
    """An ``updated`` event's diffs as pairs (an offload or onboard: ~275 bytes a line -> ~230)."""
    new = None
    for key, short in _DIFFS:
        pair = _diff_pair(data.get(key))
        if pair is not None and short not in data:
            if new is None:
                new = dict(data)
            del new[key]
            new[short] = pair
    return event if new is None else {**event, "data": new}


def compact_event(event: dict[str, Any]) -> dict[str, Any]:
    """A KV event dict (``{"event_id", "data": {...}, ...}``) with plain token lists as ``token_ids`` and
    ``updated`` diffs as ``[old, new]`` pairs; the input is not changed (a new dict where something was
    compacted, the same one otherwise)."""
    data = event.get("data")
    if type(data) is dict and data.get("type") == "updated":
        return _compact_updated(event, data)
    if type(data) is not dict or data.get("type") != "stored":
        return event
    blocks = data.get("blocks")
    if type(blocks) is not list:
        return event
    out_blocks = []
    changed = False
    for b in blocks:
        if type(b) is dict and "tokens" in b and "token_ids" not in b:
            ids = _plain_ids(b["tokens"])
            if ids is not None:
                nb = {k: v for k, v in b.items() if k != "tokens"}
                nb["token_ids"] = ids
                out_blocks.append(nb)
                changed = True
                continue
        out_blocks.append(b)
    if not changed:
        return event
    return {**event, "data": {**data, "blocks": out_blocks}}


def _expand_diffs(data: dict[str, Any]) -> None:
    """An ``updated`` event's ``[old, new]`` pairs back into TensorRT-LLM's diff dicts, in place."""
    for key, short in _DIFFS:
        pair = data.get(short)
        if short in data and key not in data and type(pair) is list and len(pair) == 2:
            del data[short]
            data[key] = {"type": "event_diff", "new_value": pair[1], "old_value": pair[0]}


def _stored_blocks(event: Any) -> list[Any] | None:
    data = event.get("data") if type(event) is dict else None
    if type(data) is not dict or data.get("type") != "stored":
        return None
    blocks = data.get("blocks")
    return blocks if type(blocks) is list else None


def expand_event(event: Any) -> Any:
    """``compact_event`` undone, in place (the dict was just parsed from a line): ``updated`` diffs and each
    block's ``token_ids`` back into TensorRT-LLM's dicts. Anything else is left as it is."""
    data = event.get("data") if type(event) is dict else None
    if type(data) is dict and data.get("type") == "updated":
        _expand_diffs(data)
        return event
    for b in _stored_blocks(event) or ():
        if type(b) is dict and "token_ids" in b and "tokens" not in b:
            ids = b.pop("token_ids")
            if type(ids) is list:
                b["tokens"] = [{"type": _PLAIN, "token_id": t, "token_extra_id": 0} for t in ids]
            else:
                b["token_ids"] = ids   # not a list: left for what reads it to find wrong
    return event


def read_event(event: Any) -> Any:
    """A KV event as every reader gives it to the fold, in place (the dict was just parsed from a line):
    ``updated`` diffs as TensorRT-LLM's dicts, and a stored block whose tokens are all plain with its ids under
    ``"token_ids"`` (the key last, as ``compact_event`` puts it), so an engine's line and a recording's give
    the same dicts. Anything else is left as it is for the validation to judge."""
    data = event.get("data") if type(event) is dict else None
    if type(data) is dict and data.get("type") == "updated":
        _expand_diffs(data)
        return event
    for b in _stored_blocks(event) or ():
        if type(b) is dict and "tokens" in b and "token_ids" not in b:
            ids = _plain_ids(b["tokens"])
            if ids is not None:
                del b["tokens"]
                b["token_ids"] = ids
    return event


def read_form(event: Any) -> Any:
    """``read_event`` without touching ``event`` (an engine's dict handed over in-process, ``records.make``): a
    new dict where something changes, the same one otherwise."""
    data = event.get("data") if type(event) is dict else None
    if type(data) is dict and data.get("type") == "updated":
        if any(short in data for _, short in _DIFFS):
            return read_event({**event, "data": dict(data)})
        return event
    return compact_event(event)   # for any other event, compact_event changes what read_event changes


def pack_event(event: dict[str, Any]) -> dict[str, Any] | list[Any]:
    """An event as it goes into a recording's batch line: an offload or onboard exactly as TensorRT-LLM writes
    it (``{"event_id", "data": {"type": "updated", "block_hash", "cache_level": diff, "priority": None},
    "window_size"}``, ~135 bytes of JSON) as ``[event_id, block_hash, old level, new level, window_size]`` (~45);
    any other event compacted (``compact_event``). Half of a busy run's events are these."""
    if type(event) is dict and len(event) == 3 and type(event.get("event_id")) is int \
            and type(event.get("window_size")) is int:
        data = event.get("data")
        if (type(data) is dict and len(data) == 4 and data.get("type") == "updated" and "priority" in data
                and data["priority"] is None and type(data.get("block_hash")) is int):
            pair = _diff_pair(data.get("cache_level"))
            if pair is not None:
                return [event["event_id"], data["block_hash"], pair[0], pair[1], event["window_size"]]
    return compact_event(event)


def unpack_event(item: Any) -> Any:
    """``pack_event`` undone: the packed list back into TensorRT-LLM's dict (a dict is left to ``read_event``,
    which every reader calls); anything else is returned as it is, for the validation to name."""
    if type(item) is list:
        if len(item) == 5 and all(type(x) is int for x in item):
            eid, h, old, new, window = item
            return {"event_id": eid, "data": {"type": "updated", "block_hash": h,
                                              "cache_level": {"type": "event_diff", "new_value": new,
                                                              "old_value": old},
                                              "priority": None}, "window_size": window}
    return item
