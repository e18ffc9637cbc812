"""Compact token lists in recorded KV events: what made recordings grow by ~1.5 MB/s.

A TensorRT-LLM ``stored`` event lists every token of every block as a dict (``_utils.py``
``KVCacheEventSerializer``: ``{"type": "unique_token", "token_id": int, "token_extra_id": int}``): ~55 bytes of
JSON per token, 86% of a recording's bytes (a 10 s default simulator run: 13.1 of 15.2 MB). A recording keeps
the token ids (the what-if fold matches partly filled blocks by their tokens, and tells release stores by their
length) but writes a block whose tokens are all plain (``unique_token``, extra id 0) as ``"token_ids": [ids]``
instead of ``"tokens": [...]``. Any other block (a multimodal extra id, a token type kvtop does not know) is
written as it came.

An ``updated`` event's ``{"type": "event_diff", "new_value": n, "old_value": o}`` diffs are written as
``"cache_level_diff": [o, n]`` (and ``priority_diff``).

``expand_event`` turns a compacted event back into TensorRT-LLM's shape, and every reader of records calls it
(``kvtop.records.from_obj``), so the fold sees the same dicts from an old recording, a new one, or the engine.
"""

from __future__ import annotations

from typing import Any

__all__ = ["compact_event", "expand_event"]

_PLAIN = "unique_token"


def _plain_ids(tokens: Any) -> list[int] | None:
    """The token ids of a list of plain tokens, or None when any token is not plain."""
    if not isinstance(tokens, list):
        return None
    ids = []
    for t in tokens:
        if (type(t) is not dict or len(t) != 3 or t.get("type") != _PLAIN or t.get("token_extra_id") != 0):
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


def expand_event(event: Any) -> Any:
    """``compact_event`` undone, in place (the dict was just parsed from a line): each block's ``token_ids``
    back into TensorRT-LLM's token dicts. Anything else is left as it is for the validation to judge."""
    data = event.get("data") if type(event) is dict else None
    if type(data) is dict and data.get("type") == "updated":
        for key, short in _DIFFS:
            pair = data.get(short)
            if short in data and key not in data and type(pair) is list and len(pair) == 2:
                del data[short]
                data[key] = {"type": "event_diff", "new_value": pair[1], "old_value": pair[0]}
        return event
    if type(data) is not dict or data.get("type") != "stored":
        return event
    blocks = data.get("blocks")
    if type(blocks) is not list:
        return event
    for b in blocks:
        if type(b) is dict and "token_ids" in b and "tokens" not in b:
            ids = b.pop("token_ids")
            if type(ids) is list:
                b["tokens"] = [{"type": _PLAIN, "token_id": t, "token_extra_id": 0} for t in ids]
            else:
                b["token_ids"] = ids   # not a list: left for what reads it to find wrong
    return event
