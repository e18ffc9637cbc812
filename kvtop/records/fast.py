"""The accelerators of the record boundary: faster copies of kvtop/records/checks.py's paths, each held to it.

Each function here either gives exactly what the reference gives (the same Record, field for field and repr for
repr: an integer read as a float shows) or ``None``, and the reference then judges and names the input: the
error texts are all checks.py's. What each one copies, the test that holds them equal and the measurement that
pays for it are in its docstring; the figures are bench/JOURNAL.md's ("The record boundary cut", "The records' one
walk", "Stored events as token ids, msgspec"), and ``python bench/bench_records.py --per-kind --callgrind``
measures them today.

orjson (~3x faster than json on records) and msgspec (typed decoding: a stored event's token dicts straight to
ids) are dependencies; without either, ``orjson`` / ``msgspec`` here are ``None`` and every line goes through
checks.py's path (tests/records/test_records.py runs the busy recording both ways).
"""

from __future__ import annotations

from typing import Any

from kvtop.compact import read_event
from kvtop.records.checks import (
    MAX_BLOCKS,
    MAX_MAGNITUDE,
    STRING_LEN,
    TIME_MAX,
    blocks_ok,
    check_kind_data,
    loads,
    own_data,
    within_bounds,
)
from kvtop.records.record import SCHEMA_VERSION, Record, SourceId
from kvtop.textsafe import clean

try:  # a JSON parser ~3x faster than the standard one on records; used only where it gives the same objects
    import orjson
except ImportError:  # pragma: no cover - orjson is a dependency; a kvtop without it parses everything with json
    orjson = None  # type: ignore[assignment]
try:  # typed JSON decoding (a stored event's token dicts straight to ids); used only where it gives json's objects
    import msgspec
except ImportError:  # pragma: no cover - msgspec is a dependency; without it those lines go through orjson
    msgspec = None  # type: ignore[assignment]

_EXACT_FLOAT = float(1 << 63)
# orjson nests up to 1,024 deep, json as deep as the recursion limit lets it (~995 at the top of a process, less
# deeper in the stack): a value nested past this is left to json to judge. A record nests ~6 deep.
_EXACT_DEPTH = 400


def bounded_exact(value: Any, depth: int = 0) -> bool:
    """``within_bounds(value)`` for a value orjson parsed, and no float in it of magnitude 2^63 or more: orjson reads
    an integer past 64 bits (which the standard parser keeps whole, and the bounds then refuse) as a float, so a
    float that large sends the line to the standard parser, whose objects then decide. Unlike ``within_bounds`` it
    walks ``tokens`` too (a token id past 64 bits stays an integer, as the standard parser keeps it), and it is
    ``False`` past ``_EXACT_DEPTH`` levels. Its integers are not compared: orjson's are all within -2^63 ..
    2^64-1 (tests/records/test_records.py holds orjson to that), inside the bounds.

    Reference: checks.within_bounds, on the objects json gives (an integer past 64 bits, which orjson reads as a
    float, must not pass). Held equal by tests/records/test_records.py::test_decode_gives_what_the_standard_parser_gives
    and test_orjson_reads_every_integer_within_the_bounds_or_as_a_float. Pays: what lets orjson parse a line at
    all (bench/JOURNAL.md "The record boundary cut": records.decode 18.2 -> 13.3 us a record, with fast_record).
    """
    if depth > _EXACT_DEPTH:
        return False
    cls = value.__class__
    if cls is float:
        return -_EXACT_FLOAT < value < _EXACT_FLOAT
    if cls is dict:
        items: Any = value.values()
    elif cls is list:
        items = value
    else:
        return True   # an integer of orjson's is within -2^63 .. 2^64-1: inside the bounds
    for v in items:
        c = v.__class__
        if c is float:
            if not -_EXACT_FLOAT < v < _EXACT_FLOAT:
                return False
        elif (c is dict or c is list) and not bounded_exact(v, depth + 1):
            return False
    return True


# SourceId by (host, rank, run) as they came: a stream names a handful of sources, and cleaning two strings and
# building a frozen dataclass for every record cost ~1.3 us of ~6.5 (27,000 records of a busy recording).
_SOURCE_CACHE: dict[tuple[str, int, str], SourceId] = {}
_SOURCE_CACHE_MAX = 4096   # a stream of ever-new names cannot grow it without bound: it is emptied when full
_NO_SOURCE: dict[str, Any] = {}
_ENVELOPE_KEYS = frozenset({"v", "kind", "source", "time", "data"})
_SOURCE_KEYS = frozenset({"host", "rank", "run"})


def fast_record(obj: dict[str, Any], parsed_fast: bool = False, bounded: bool = False) -> Record | None:
    """The record of ``obj`` when it has the common shape, checked as ``checked_record`` checks it, in fewer
    Python-level steps; ``None`` for anything else (rarer shapes and every bad record), which
    ``checked_record`` then judges and names. Every check of the full path is made here or by delegating to it:
    a record this accepts is one that path accepts, and the same Record comes out (tests/records/test_records.py checks
    that over hypothesis-generated records).

    ``parsed_fast``: ``obj`` came from orjson (``decode``): every number of ``data`` must then also pass
    ``bounded_exact``, else ``None`` (the line is parsed again by the standard parser). The envelope's numbers
    need no more: ``v`` and ``rank`` must be integers (orjson's are exact), ``time`` at most ``TIME_MAX``; but
    the envelope and its source may hold no other key: orjson nests up to 1,024 deep, json ~995 (less deep in
    the stack), and a key the record does not keep could hold what json refuses.
    ``bounded``: the caller has found every number of ``data`` within the bounds (``within_bounds``).

    Measured: 5.8 -> 4.1 us a record over 27,000 records of a busy recording (bench/JOURNAL.md "An attached kvtop").

    Reference: checks.checked_record. Held equal by
    tests/records/test_records.py::test_fast_path_gives_exactly_what_the_full_path_gives (hypothesis: near-valid and odd
    envelopes, the same Record or the same error text) and
    test_fast_path_takes_the_common_records_of_a_busy_recording. Pays: bench/JOURNAL.md "The record boundary cut":
    5.83 -> 4.05 us a record.
    """
    v = obj.get("v")
    if v.__class__ is not int or not 1 <= v <= SCHEMA_VERSION:
        return None
    t = obj.get("time")
    if (t.__class__ is not float and t.__class__ is not int) or not 0 <= t <= TIME_MAX:   # NaN fails the range
        return None
    src = obj.get("source", _NO_SOURCE)
    if src.__class__ is not dict:
        return None
    if parsed_fast and not (obj.keys() <= _ENVELOPE_KEYS and src.keys() <= _SOURCE_KEYS):
        return None
    host, rank, run = src.get("host", ""), src.get("rank", 0), src.get("run", "")
    if host.__class__ is not str or rank.__class__ is not int or run.__class__ is not str:
        return None
    key = (host, rank, run)
    source = _SOURCE_CACHE.get(key)
    if source is None:
        if not -MAX_MAGNITUDE <= rank <= MAX_MAGNITUDE:
            return None
        source = new_source(key)
    data = obj.get("data")
    if data.__class__ is not dict:
        return None
    if parsed_fast:
        try:
            if not bounded_exact(data):
                return None
        except RecursionError:
            return None
    kind = obj.get("kind")
    if kind == "kv_event":
        read_event(data)   # as checked_record does first (in place, and a second call changes nothing)
        if not fast_event_ok(data, parsed_fast or bounded):
            return None
    elif kind == "stats" or kind == "request" or kind == "gpu" or kind == "host":
        # The full checks of these kinds: their errors are the ones checked_record would raise from here, as
        # everything before them in that path has passed.
        check_kind_data(kind, data, parsed_fast)
    else:
        return None
    return new_record(kind, own_data(kind, data), source, float(t), v)


def fast_event_ok(data: dict[str, Any], bounded: bool = False) -> bool:
    """``check_kind_data("kv_event", data)`` would pass (a ``created`` event, rare, is left to it).
    ``bounded``: ``bounded_exact(data)`` passed, which implies ``within_bounds(data)``.

    Reference: checks.check_kind_data("kv_event", data) (checks.check_event). Held equal by
    tests/records/test_records.py::test_fast_event_ok_and_event_exact_hold_to_check_event (hypothesis: valid and invalid
    events, the same verdict; the error text is then checks.py's, as decode gives it). Pays: part of
    fast_record's figure (a kv_event's checks without the paths built).
    """
    if data.get("event_id").__class__ is not int or "data" not in data:
        return False
    ev = data["data"]
    if ev.__class__ is not dict:
        return False
    if not bounded:
        try:
            if not within_bounds(data):
                return False
        except RecursionError:
            return False
    etype = ev.get("type")
    if etype == "removed":
        hashes = ev.get("block_hashes")
        if hashes.__class__ is not list:
            return False
        for h in hashes:
            if h.__class__ is not int:
                return False
        return True
    if etype == "updated":
        return ev.get("block_hash").__class__ is int
    if etype == "stored":
        blocks = ev.get("blocks")
        if blocks.__class__ is not list:
            return False
        for b in blocks:
            if b.__class__ is not dict or b.get("block_hash").__class__ is not int:
                return False
        return True
    return False


_object_new = object.__new__


def new_record(kind: str, data: dict[str, Any], source: SourceId, time: float, v: int) -> Record:
    """``Record(kind, data, source, time, v)`` without the frozen dataclass's ``__init__`` (its five
    ``object.__setattr__`` calls: 0.69 -> 0.28 us a record, ~10% of decoding a removed event); the same instance,
    field for field (tests/records/test_records.py checks it against ``Record`` and its fields).

    Reference: Record(kind, data, source, time, v). Held equal by
    tests/records/test_records.py::test_new_record_is_the_dataclass_record. Pays: bench/JOURNAL.md "The records' one
    walk": 0.69 -> 0.28 us a record.
    """
    rec = _object_new(Record)
    fields_ = rec.__dict__
    fields_["kind"] = kind
    fields_["data"] = data
    fields_["source"] = source
    fields_["time"] = time
    fields_["v"] = v
    return rec


def loads_exact(text: str | bytes) -> Any:
    """``loads(text)``, through orjson when its objects are json's: every number within the bounds and no float
    of 2^63 or more (how orjson reads an integer past 64 bits), else (or when orjson refuses it) through json,
    so its errors too are json's. For a recording's batch lines and MQTT payloads, which are many records.

    Reference: checks.loads. Held equal by tests/records/test_records.py::test_loads_exact_gives_what_json_gives and
    test_loads_exact_of_what_orjson_reads_otherwise. Pays: orjson ~3x faster than json on a batch line
    (bench/JOURNAL.md "The record boundary cut").
    """
    if orjson is not None and text.__class__ is bytes:
        try:
            obj = orjson.loads(text)
            if bounded_exact(obj):
                return obj
        except Exception:  # orjson.JSONDecodeError, or nesting too deep for the walk: json judges
            pass
    return loads(text)


def fast_safe(raw: bytes) -> bool:
    """Whether ``decode_fast`` is worth trying on ``raw`` (exactness does not rest on this: it walks every
    number). A stored event with its token dicts (~35 KB, ~1,000 tokens) goes to ``decode_tokens_fast``
    instead: walking its tokens in Python for ``bounded_exact`` costs what orjson saves (measured: 0.157 s for
    a busy recording's 540,000 tokens, against 0.117 s saved), a look at its bytes does not. A recording's
    ``token_ids`` lists are cheap to walk."""
    return b'"tokens"' not in raw


# Every digit as "0", other bytes as they are: a run of digits becomes a run of zeros that bytes.find (C speed,
# ~5 us for a 35 KB line) can look for.
_DIGITS_AS_ZERO = bytes.maketrans(b"0123456789", b"0" * 10)
_RUN_20 = b"0" * 20
_NEG_RUN_19 = b"-" + b"0" * 19
_U64_MAX = str((1 << 64) - 1).encode()   # b"18446744073709551615", 20 digits


def ints_exact(raw: bytes) -> bool:
    """Whether orjson reads every integer of ``raw`` exactly: it keeps -2^63 .. 2^64-1 as integers and reads any
    other as a float (the standard parser keeps it whole). Looked for in the bytes, not in the parsed objects
    (walking a stored event's ~1,000 token dicts in Python costs what orjson saves): ``False`` where a run of
    digits could be such an integer, i.e. a run of 21 digits or more, one of 20 above ``2^64-1``, or one of 19 or
    more after a minus sign. Conservative: the run may be in a string or a float's digits, and a ``False`` only
    sends the line to the standard parser. A 64-bit block hash (~half of them have 20 digits) passes.

    Reference: json's integers (orjson's where this says True). Held equal by
    tests/records/test_records.py::test_ints_exact_finds_every_integer_orjson_would_read_as_a_float. Pays:
    decode_tokens_fast's gate without msgspec, ~5 us a 35 KB line where walking its ~1,000 tokens cost what orjson
    saved (0.157 s against 0.117 s, bench/JOURNAL.md "The record boundary cut").
    """
    zeros = raw.translate(_DIGITS_AS_ZERO)
    if _NEG_RUN_19 in zeros:
        return False
    i = zeros.find(_RUN_20)
    while i >= 0:
        end = i + 20
        # the run starts at i (the search starts on a non-digit); 21 digits or more, or 20 above 2^64-1
        if zeros[end:end + 1] == b"0" or raw[i:end] > _U64_MAX:
            return False
        i = zeros.find(_RUN_20, end)
    return True


def decode_tokens_fast(raw: bytes) -> Record | None:
    """A line ``fast_safe`` leaves out (a stored event with its token dicts, ~35 KB): through msgspec's typed
    decoder (``decode_stored_typed``: 0.13-0.18 ms a busy recording's line), else through orjson where that
    gives the standard parser's objects: every integer in reach of orjson's exact range (``ints_exact``); NaN,
    a byte-order mark, a lone surrogate, 1e400 or nesting past 1,024 make orjson refuse; every number is then
    walked as ``bounded_exact`` walks them. Any record off the fast paths is ``None``, and the standard path
    then judges and names it. (Without msgspec a busy line costs 0.64-0.90 ms this way, the plain tokens turned
    into ids in Python; the json path is no faster: bench/JOURNAL.md "Stored events as token ids".)

    Reference: checks.loads then checks.checked_record. Held equal by
    tests/records/test_records.py::test_stored_event_lines_through_orjson_give_what_the_standard_parser_gives. Pays:
    bench/JOURNAL.md "Stored events through orjson, and the collector".
    """
    if msgspec is not None:
        rec = decode_stored_typed(raw)
        if rec is not None:
            return rec
    if not ints_exact(raw):
        return None
    try:
        obj = orjson.loads(raw)
    except Exception:  # orjson.JSONDecodeError: the standard parser judges
        return None
    if obj.__class__ is not dict:
        return None
    # every number walked, the tokens' too: a token list nested past json's depth must not pass (orjson nests
    # to 1,024); since msgspec's path takes plain tokens, this one is left the rarer lines
    return fast_record(obj, parsed_fast=True)


if msgspec is not None:
    from typing import Literal

    class _PlainToken(msgspec.Struct, tag="unique_token", tag_field="type", forbid_unknown_fields=True,
                      gc=False):
        """A token dict that ``read_event`` turns into its id: exactly these three keys (msgspec refuses any
        other, a repeated "type", an extra id but 0, a token id not an integer, and a bool)."""
        token_id: int
        token_extra_id: Literal[0]

    # A stored event's line, each level's dicts their own type so that a token can be decoded as _PlainToken at
    # one place only, a block's list values (a dict's values are Any; a list at another level as the level
    # below it): line -> "data" (the event) -> "data" (stored) -> "blocks" -> a block -> "tokens".
    _Scalar = None | bool | int | float | str
    _Block = dict[str, _Scalar | list[_PlainToken] | dict[str, Any]]
    _Stored = dict[str, _Scalar | list[_Block] | dict[str, Any]]
    _Event = dict[str, _Scalar | list[Any] | _Stored]
    _STORED_LINE = msgspec.json.Decoder(dict[str, _Scalar | list[Any] | _Event])



def decode_stored_typed(raw: bytes) -> Record | None:
    """A stored event's line with its token dicts (~35 KB, ~1,000 tokens) decoded by msgspec into the dicts the
    standard parser and ``read_event`` give, its plain tokens straight to their ids (no token dict built: that
    was 94 us of orjson's 128 a line, and a byte check for wide integers 32 more). ``None`` for anything else,
    which the other paths then judge: a token not plain, any token-shaped list in another place, a key of the
    envelope or source that the fast path would not look at (msgspec and json may differ on one nested ~1,000
    deep), and all that msgspec refuses and json takes (NaN, a byte-order mark, lone surrogates, UTF-16).
    What msgspec takes, json takes alike: integers of any size up to the same 4,300 digits, floats correctly
    rounded, the last of repeated keys (tests/records/test_records.py compares them over hypothesis-made lines).

    Reference: checks.loads then checks.checked_record. Held equal by
    tests/records/test_records.py::test_stored_lines_through_msgspec_give_what_the_standard_parser_gives (hypothesis,
    1,500 lines), test_bad_stored_lines_get_the_standard_paths_error and
    test_nesting_near_the_recursion_limit_in_a_stored_line_is_judged_as_json_judges_it. Pays: bench/JOURNAL.md
    "Stored events as token ids, msgspec": 2,092,599 -> 1,286,479 instructions a 35 KB line.
    """
    try:
        obj: Any = _STORED_LINE.decode(raw)
    except Exception:   # msgspec.DecodeError or ValidationError, RecursionError: the other paths judge
        return None
    if not obj.keys() <= _ENVELOPE_KEYS or obj.get("kind") != "kv_event":   # only a kv_event is read_event's
        return None
    src = obj.get("source")
    if src is not None and (src.__class__ is not dict or not src.keys() <= _SOURCE_KEYS):
        return None
    event = obj.get("data")
    if event.__class__ is not dict:
        return None
    stored = event.get("data")
    if stored.__class__ is not dict or stored.get("type") != "stored":
        return None
    blocks = stored.get("blocks")
    if blocks.__class__ is not list:
        return None
    # Every value of the event, the stored data and its blocks a number within the bounds (within_bounds), another
    # scalar, or a block's list (of plain tokens, by the decoder's type; any other list only empty): a dict or a
    # list anywhere else sends the line on (a token could have been decoded inside it, and json may refuse its
    # depth where msgspec takes it). TensorRT-LLM's stored events have nothing else. One pass, which also turns
    # the token lists into ids: a second walk over the blocks cost ~1 us a block.
    for key, value in event.items():
        if key != "data" and not _scalar_ok(value):
            return None
    for key, value in stored.items():
        if key != "blocks" and not _scalar_ok(value):
            return None
    for b in blocks:   # dicts, by the decoder's type
        for key, value in b.items():
            c = value.__class__
            if c is int or c is float:
                if not _NEG_MAGNITUDE <= value <= MAX_MAGNITUDE:
                    return None
            elif c is list:
                if value and key != "tokens":
                    return None
            elif c is dict:
                return None
        tokens = b.get("tokens")
        if tokens.__class__ is list:   # plain tokens only, by the decoder's type: read_event's ids
            if "token_ids" in b:
                return None
            del b["tokens"]
            b["token_ids"] = [t.token_id for t in tokens]
    return fast_record(obj, bounded=True)


_NEG_MAGNITUDE = -MAX_MAGNITUDE


def _scalar_ok(value: Any) -> bool:
    """``value`` is no list or dict, and a number within the bounds (``within_bounds``) if it is one."""
    c = value.__class__
    if c is int or c is float:
        return _NEG_MAGNITUDE <= value <= MAX_MAGNITUDE
    return c is not list and c is not dict


def decode_fast(raw: bytes) -> Record | None:
    """The record of ``raw`` parsed by orjson, when that gives what the standard parser gives; else ``None``.

    orjson refuses what the standard parser takes (NaN and Infinity literals, lone surrogates, a byte-order
    mark, UTF-16, nesting past 1,024) and reads an integer past 64 bits as a float: any of those, and any
    record off the fast path, goes to ``json`` and ``from_obj`` as before, so errors are worded as before.
    Measured: 11.9 -> 4.1 us a line of JSON for a busy recording's 27,000 lines (bench/JOURNAL.md).

    Reference: checks.loads then the package's from_obj. Held equal by
    tests/records/test_records.py::test_decode_gives_what_the_standard_parser_gives and
    test_decode_of_what_orjson_reads_otherwise_is_the_standard_parsers. Pays: bench/JOURNAL.md "The record boundary
    cut": records.decode 18.2 -> 13.3 us a record, with fast_record.
    """
    try:
        obj = orjson.loads(raw)
    except Exception:  # orjson.JSONDecodeError, or anything it cannot take: the standard parser judges
        return None
    if obj.__class__ is not dict:
        return None
    return exact_record(obj)


# What orjson's objects spare a check: its integers are always within -2^63 .. 2^64-1 (inside the bounds), as it
# reads any other integer as a float, so only floats (of magnitude 2^63 or more: such an integer, or a number out
# of the bounds) and nesting (past _EXACT_DEPTH) can make them differ from the standard path's or fail its
# bounds. The walks below look at nothing else; tests/records/test_records.py holds them to bounded_exact and the full
# path over hypothesis-made lines.
_NEG_EXACT_FLOAT = -_EXACT_FLOAT


def exact_record(obj: dict[str, Any]) -> Record | None:
    """``fast_record(obj, parsed_fast=True)`` for a dict orjson parsed, in fewer Python steps: the common kinds'
    ``data`` walked once (``event_exact``, ``stats_exact``) where ``bounded_exact``, ``read_event`` and the
    kind's checks walked it three times. ``None`` for anything else, which the standard path then judges.

    Reference: fast_record(obj, parsed_fast=True), and so checks.checked_record. Held equal by
    tests/records/test_records.py::test_common_lines_through_the_one_walk_path_give_what_the_standard_parser_gives
    (hypothesis, 2,000 lines) and test_the_one_walk_path_takes_every_common_line_of_the_busy_recording. Pays:
    bench/JOURNAL.md "The records' one walk": all lines 11.1 -> 7.3 us.
    """
    if not obj.keys() <= _ENVELOPE_KEYS:
        return None
    v = obj.get("v")
    if v.__class__ is not int or not 1 <= v <= SCHEMA_VERSION:
        return None
    t = obj.get("time")
    if (t.__class__ is not float and t.__class__ is not int) or not 0 <= t <= TIME_MAX:   # NaN fails the range
        return None
    src = obj.get("source", _NO_SOURCE)
    if src.__class__ is not dict or not src.keys() <= _SOURCE_KEYS:
        return None
    host, rank, run = src.get("host", ""), src.get("rank", 0), src.get("run", "")
    if host.__class__ is not str or rank.__class__ is not int or run.__class__ is not str:
        return None   # (before the cache: True or 1.0 would find the SourceId of rank 1)
    key = (host, rank, run)
    source = _SOURCE_CACHE.get(key)
    if source is None:
        source = new_source(key)
    data = obj.get("data")
    if data.__class__ is not dict:
        return None
    kind = obj.get("kind")
    try:
        if kind == "kv_event":
            if not event_exact(data):
                return None
        elif kind == "stats":
            if not stats_exact(data):
                return None
        elif kind == "request" or kind == "gpu" or kind == "host":
            if not bounded_exact(data):
                return None
            check_kind_data(kind, data, True)   # its errors are the full path's from here (as in fast_record)
            data = own_data(kind, data)
        else:
            return None
    except RecursionError:   # a walk called near the stack's limit: the standard path judges
        return None
    return new_record(kind, data, source, float(t), v)


def new_source(key: tuple[str, int, str]) -> SourceId:
    """The SourceId of a (host, rank, run) not seen before, cached; its rank within the bounds (the caller's check,
    or orjson's integers, which always are).

    Reference: ``SourceId(clean(host, STRING_LEN), rank, clean(run, STRING_LEN))`` as checks.checked_record makes
    it. Held equal by tests/records/test_records.py::test_fast_path_gives_exactly_what_the_full_path_gives. Pays: ~1.3
    us of ~6.5 a record (the cache's comment above; bench/JOURNAL.md "The record boundary cut")."""
    if len(_SOURCE_CACHE) >= _SOURCE_CACHE_MAX:
        _SOURCE_CACHE.clear()
    host, rank, run = key
    source = _SOURCE_CACHE[key] = SourceId(clean(host, STRING_LEN), rank, clean(run, STRING_LEN))
    return source


def _values_exact(values: Any, depth: int, skip: Any = None) -> bool:
    """``bounded_exact`` of each of ``values`` (at ``depth``) but ``skip``, which the caller walks itself."""
    for v in values:
        c = v.__class__
        if c is float:
            if not _NEG_EXACT_FLOAT < v < _EXACT_FLOAT:
                return False
        elif (c is dict or c is list) and v is not skip and not bounded_exact(v, depth):
            return False
    return True


def _ints_list_exact(values: list[Any], depth: int) -> bool:
    """``bounded_exact(values, depth)`` for a list, at C speed where it holds only integers (and bools):
    ``sum`` is then an integer, where one float would make it a float and a string, None or a container raise
    (a stored block's ~32 token ids: 0.9 -> 0.2 us)."""
    try:
        if sum(values).__class__ is int:
            return True
    except TypeError:
        pass
    return bounded_exact(values, depth)


def event_exact(data: dict[str, Any]) -> bool:
    """For a kv_event's ``data`` orjson parsed: ``bounded_exact(data)`` and, after ``read_event(data)`` (made
    here where it changes something), ``fast_event_ok(data, True)``; one walk. A stored block with ``"tokens"``
    (its key escaped in the line, else the line went to ``decode_tokens_fast``) is left to the standard path.

    Reference: bounded_exact(data), read_event(data) and checks.check_kind_data("kv_event", data). Held equal by
    tests/records/test_records.py::test_fast_event_ok_and_event_exact_hold_to_check_event and the one-walk path's test.
    Pays: bench/JOURNAL.md "The records' one walk": a removed line 5.36 -> 3.09 us, a stored one 91.9 -> 44.3 us.
    """
    ev = data.get("data")
    if ev.__class__ is not dict or data.get("event_id").__class__ is not int:
        return False
    for v in data.values():   # _values_exact(data.values(), 1, ev), inline: most events have three
        c = v.__class__
        if c is float:
            if not _NEG_EXACT_FLOAT < v < _EXACT_FLOAT:
                return False
        elif (c is dict or c is list) and v is not ev and not bounded_exact(v, 1):
            return False
    etype = ev.get("type")
    if etype == "updated":
        if ev.get("block_hash").__class__ is not int:
            return False
        for v in ev.values():   # _values_exact(ev.values(), 2), inline
            c = v.__class__
            if c is float:
                if not _NEG_EXACT_FLOAT < v < _EXACT_FLOAT:
                    return False
            elif (c is dict or c is list) and not bounded_exact(v, 2):
                return False
        if "cache_level_diff" in ev or "priority_diff" in ev:
            read_event(data)   # a recording's [old, new] pairs as TensorRT-LLM's dicts
        return True
    if etype == "removed":
        hashes = ev.get("block_hashes")
        if hashes.__class__ is not list:
            return False
        for h in hashes:   # integers, so within the bounds (orjson's)
            if h.__class__ is not int:
                return False
        return _values_exact(ev.values(), 2, hashes)
    if etype == "stored":
        blocks = ev.get("blocks")
        if blocks.__class__ is not list or not _values_exact(ev.values(), 2, blocks):
            return False
        for b in blocks:
            if b.__class__ is not dict or b.get("block_hash").__class__ is not int or "tokens" in b:
                return False
            for v in b.values():
                c = v.__class__
                if c is float:
                    if not _NEG_EXACT_FLOAT < v < _EXACT_FLOAT:
                        return False
                elif c is list:
                    if not _ints_list_exact(v, 4):
                        return False
                elif c is dict and not bounded_exact(v, 4):
                    return False
        return True
    return False   # created (one a run) and anything else: the standard path


def stats_exact(data: dict[str, Any]) -> bool:
    """For a stats ``data`` orjson parsed: ``bounded_exact(data)`` and ``check_kind_data("stats", data, True)``
    passes; one walk, the block counts of ``kvCacheStats`` / ``kvCacheIterationStats`` checked in it.

    Reference: bounded_exact(data) and checks.check_kind_data("stats", data). Held equal by
    tests/records/test_records.py::test_common_lines_through_the_one_walk_path_give_what_the_standard_parser_gives.
    Pays: bench/JOURNAL.md "The records' one walk": a stats line 12.41 -> 8.89 us.
    """
    kv = data.get("kvCacheStats")
    if kv is not None and kv.__class__ is not dict:
        return False   # must be an object: the standard path names it
    for k, v in data.items():
        c = v.__class__
        if c is float:
            if not _NEG_EXACT_FLOAT < v < _EXACT_FLOAT:
                return False
        elif c is dict:
            if k == "kvCacheStats" or k == "kvCacheIterationStats":
                if not _block_counts_exact(v):
                    return False
            elif not bounded_exact(v, 1):
                return False
        elif c is list and not (bounded_exact(v, 1) and (k != "kvCacheIterationStats" or blocks_ok(v))):
            return False
    return True


def _block_counts_exact(part: dict[str, Any]) -> bool:
    """``bounded_exact(part, 1)`` and ``blocks_ok(part)``, one walk (a block count is at most 2^40)."""
    for k, v in part.items():
        c = v.__class__
        if c is int:
            if v > MAX_BLOCKS and "Block" in k:
                return False
        elif c is float:
            if not _NEG_EXACT_FLOAT < v < _EXACT_FLOAT or (v > MAX_BLOCKS and "Block" in k):
                return False
        elif (c is dict or c is list) and not (bounded_exact(v, 2) and blocks_ok(v)):
            return False
    return True
