"""A deterministic built-in tokenizer, so that text prompts work with no model files.

Words and punctuation map to stable ids below the model's vocabulary size (blake2b of the piece), so equal
text gives equal ids and a shared text prefix gives a shared id prefix, which is what prefix reuse needs.
Generated text is made of a small fixed syllable table, deterministic in the token ids.
A locally cached Hugging Face tokenizer is used instead when `transformers` is installed and the model's
files are already on disk (never downloaded: kvtop runs on machines without network).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from typing import Any, Protocol

_PIECES = re.compile(r"\s*\w+|\s*[^\w\s]")
_SYLLABLES = [c + v for c in "bdfghklmnprstvz" for v in "aeiou"]  # 75 syllables of generated "text"


class Tokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...
    def decode(self, token_ids: Sequence[int]) -> str: ...


class BuiltinTokenizer:
    """Word-level stable hashing into ``[1, vocab_size)``; id 0 is never produced."""

    def __init__(self, vocab_size: int = 151_936):
        if vocab_size < 2:
            raise ValueError(f"vocab_size: must be >= 2, got {vocab_size}")
        self.vocab_size = vocab_size
        self._cache: dict[str, int] = {}

    def _piece_id(self, piece: str) -> int:
        tid = self._cache.get(piece)
        if tid is None:
            digest = hashlib.blake2b(piece.encode("utf-8"), digest_size=8).digest()
            tid = 1 + int.from_bytes(digest, "little") % (self.vocab_size - 1)
            if len(self._cache) < 1_000_000:  # bounded: long runs with unique prompts must not grow forever
                self._cache[piece] = tid
        return tid

    def encode(self, text: str) -> list[int]:
        return [self._piece_id(p) for p in _PIECES.findall(text)]

    def decode(self, token_ids: Sequence[int]) -> str:
        return " ".join(_SYLLABLES[t % len(_SYLLABLES)] + _SYLLABLES[(t // 75) % len(_SYLLABLES)]
                        for t in token_ids)


class _HfTokenizer:
    def __init__(self, tok: Any):
        self._tok = tok

    def encode(self, text: str) -> list[int]:
        return list(self._tok.encode(text))

    def decode(self, token_ids: Sequence[int]) -> str:
        return str(self._tok.decode(list(token_ids)))


def load_tokenizer(model: str, vocab_size: int, prefer_hf: bool = True) -> Tokenizer:
    """A local HF tokenizer for ``model`` if one is cached on disk, else the built-in one."""
    if prefer_hf:
        try:
            from transformers import AutoTokenizer  # optional; never a dependency

            return _HfTokenizer(AutoTokenizer.from_pretrained(model, local_files_only=True))
        except Exception:  # not installed, not cached, or not a tokenizer: all mean "use the built-in one"
            pass
    return BuiltinTokenizer(vocab_size)
