"""One sanitizer for every string that came from outside before it reaches a terminal.

Model, engine and source names, run names, error messages and file names arrive from engines, brokers, HTTP
servers and recordings. Written raw to a terminal, an escape sequence in one of them can retitle the window
(OSC 0), write the clipboard (OSC 52), clear the screen (CSI 2J) or hide text (bidi overrides). :func:`clean`
removes all of it and keeps every printable character (any script, emoji), so a name reads as it was meant.

What is removed:
- whole escape sequences: CSI (``ESC [`` ... final byte), OSC/DCS/SOS/PM/APC (``ESC ]`` ... ``BEL`` or
  ``ESC \\``, and their 8-bit C1 forms), and two-byte ``ESC x``; an unterminated OSC is dropped to the end;
- then every remaining C0 control (U+0000-U+001F), DEL (U+007F) and C1 control (U+0080-U+009F);
- Unicode bidi controls (U+202A-U+202E, U+2066-U+2069), which reorder what a line appears to say.

Tab and newline become a space (one line stays one line). Long strings are cut (``max_len``, default 200
characters) so a 1 MB "model name" never fills a screen. Cost: ~1 us for a short clean name (the fast path
is one regex search that finds nothing).
"""

from __future__ import annotations

import re
from typing import Any

__all__ = ["MAX_LEN", "clean", "clean_any", "clean_lines"]

MAX_LEN = 200

# Sequences first, so their parameters ("]52;c;SGVsbG8=") go with them instead of staying behind as text.
_SEQUENCES = re.compile(
    r"(?:\x1b\[|\x9b)[\x20-\x3f]*[\x40-\x7e]?"                     # CSI: params, intermediates, final byte
    r"|(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f])[^\x07\x1b\x9c]*(?:\x07|\x1b\\|\x9c)?"  # OSC, DCS, SOS, PM, APC
    r"|\x1b[\x20-\x7e]?"                                            # ESC x (two-byte), or a lone ESC
)
_CONTROLS = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_UNSAFE = re.compile(r"[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_UNSAFE_IN_LINES = re.compile(r"[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def clean(text: Any, max_len: int | None = MAX_LEN) -> str:
    """``text`` (any value; non-strings go through ``str``) with no control characters or escape sequences.

    Tabs and newlines become spaces; the result is at most ``max_len`` characters (``None``: no limit), with a
    trailing "..." when it was cut.
    """
    s = text if isinstance(text, str) else str(text)
    if _UNSAFE.search(s) is not None:
        s = _SEQUENCES.sub("", s)
        s = s.replace("\t", " ").replace("\n", " ").replace("\r", " ")
        s = _CONTROLS.sub("", s)
    if max_len is not None and len(s) > max_len:
        s = s[:max(0, max_len - 3)] + "..."
    return s


def clean_lines(text: str) -> str:
    """``text`` cleaned line by line, its newlines kept (a report of many lines, with outside names in it)."""
    if _UNSAFE_IN_LINES.search(text) is None:  # newlines are what this keeps
        return text
    return "\n".join(clean(line, None) for line in text.split("\n"))


def clean_any(value: Any, max_len: int | None = MAX_LEN, _depth: int = 0) -> Any:
    """``value`` with every string in it (dict keys and values, list items) cleaned; other values as they are.

    For kvtop's own small dicts (meta, gpu, host, request records): never used on an engine's stats or
    events, which are kept verbatim. Nesting deeper than 8 levels is left as it is (nothing kvtop shows).
    """
    if isinstance(value, str):
        return clean(value, max_len)
    if _depth >= 8:
        return value
    if isinstance(value, dict):
        return {clean(k, max_len) if isinstance(k, str) else k: clean_any(v, max_len, _depth + 1)
                for k, v in value.items()}
    if isinstance(value, list):
        return [clean_any(v, max_len, _depth + 1) for v in value]
    return value
