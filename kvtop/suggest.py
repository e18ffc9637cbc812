""""Did you mean": the closest known names to a typo, for the one-line errors of every command.

A typo'd option (``--hots-cache``), subcommand (``kvtop repaly``), choice (``--engine trtlm``), model
(``Qwen/Qwen3-8``) or GPU (``H20``) gets the nearest spellings kvtop knows (difflib's ratio, at least 0.6, the
standard library's default cut-off), so that the error names the fix. Pure: no I/O, standard library only, so the
engines' name tables and the option parsers can both use it.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping

__all__ = ["close_names", "did_you_mean"]

MAX_SUGGESTIONS = 3
# Only names about as close as the best one: "--hedless" is "--headless" (0.95), not also "--help" (0.67) and
# "--theme" (0.63), which pass difflib's 0.6 cut-off but would bury the fix in a list.
NEAR_BEST = 0.1


def close_names(word: str, known: Iterable[str] | Mapping[str, str], *, fold: Callable[[str], str] | None = None,
                n: int = MAX_SUGGESTIONS) -> list[str]:
    """The known names nearest ``word``, best first (none when nothing is close).

    ``fold`` compares names in a folded form (lower case; the model table's keys without punctuation) and gives
    back the names as spelled. ``known`` may map the spellings compared to the names shown (a model's short form,
    "Llama-3.1-8B", to its full name)."""
    shown = dict(known) if isinstance(known, Mapping) else {name: name for name in known}
    folded: dict[str, str] = {}
    for spelling, name in shown.items():
        folded.setdefault(spelling if fold is None else fold(spelling), name)
    key = word if fold is None else fold(word)
    matches = difflib.get_close_matches(key, list(folded), n=n)
    if not matches:
        return []
    best = difflib.SequenceMatcher(None, key, matches[0]).ratio()
    near = [folded[m] for m in matches if difflib.SequenceMatcher(None, key, m).ratio() >= best - NEAR_BEST]
    return list(dict.fromkeys(near))


def did_you_mean(word: str, known: Iterable[str] | Mapping[str, str], *, fold: Callable[[str], str] | None = None,
                 quote: bool = False) -> str:
    """``" (did you mean --host-cache?)"`` (``"... --a or --b?"``), to put after the word in an error; ``""``
    when no known name is close."""
    names = close_names(word, known, fold=fold)
    if not names:
        return ""
    said = [repr(name) if quote else name for name in names]
    return " (did you mean " + (said[0] if len(said) == 1 else ", ".join(said[:-1]) + " or " + said[-1]) + "?)"
