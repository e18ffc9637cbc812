"""Themes are files: ``themes/*.toml`` at the repository root, shipped in the wheel as ``kvtop/_themes``.

A theme file names a ``textual.theme.Theme``'s fields at the top level and kvtop's own colours under
``[variables]`` (``kv-spark``, ``kv-figure``, ``kv-dim``, ``kv-sim-badge``); :data:`VARIABLE_DEFAULTS` fills in any
a file leaves out, so a user's theme file needs only the colours it wants to change. A bad file is reported
(:class:`ThemeError`, naming the file and the problem) and the others still load.

The tier colours are not in the theme files: they are kvtop's colour code (:mod:`kvtop.palette`, one colour per
tier in every panel and in the report), given to every theme as the variables ``kv-gpu``, ``kv-gpu-cached``,
``kv-gpu-empty``, ``kv-host``... (:func:`tier_variables`): kvtop's three by name, any other theme (Textual's own,
from the command palette, or a user's file) by whether it is dark. A user's file may still set them in
``[variables]``. The panels draw a tier only through :func:`tier_style`.
"""

from __future__ import annotations

import re
import sys
from dataclasses import fields
from pathlib import Path
from typing import Any

from textual.theme import Theme

from kvtop import palette

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10: the subset of TOML that theme files use (see _parse_simple_toml)
    tomllib = None

# Order of the `t` key's cycle; any other theme found is appended after these, by name.
PREFERRED_ORDER = ("dark", "light", "high-contrast")
DEFAULT_THEME = "dark"

VARIABLE_DEFAULTS: dict[str, str] = {
    "kv-spark": "$foreground",
    "kv-figure": "$foreground",
    "kv-dim": "$foreground-muted",
    "kv-sim-badge": "$secondary",
}


def tier_variables(theme: str, dark: bool = True) -> dict[str, str]:
    """The colour code as a theme's CSS variables (``kv-gpu``, ``kv-gpu-cached``, ``kv-gpu-empty``, ...)."""
    return palette.variables(theme, dark)


def tier_style(tier: str, state: str = "in-use", bold: bool = False) -> str:
    """The style a panel draws ``tier`` ("gpu", "host", "disk"; a label such as "GPU" too) in: the tier's colour
    (``in-use``, also its labels and the figures that belong to it) or a shade (``cached``, ``empty``). Any other
    tier gets the neutral ``kv-other`` colours, never one of the three."""
    style = "$" + palette.variable(tier.lower(), state)
    return f"bold {style}" if bold else style


def tier_glyph(state: str) -> str:
    """The bar glyph of a state: in use █, cached ▓, empty ░ (kvtop.palette.GLYPHS)."""
    return palette.GLYPHS[state]

_THEME_FIELDS = {f.name for f in fields(Theme)} - {"variables"}


class ThemeError(ValueError):
    def __init__(self, path: Path | str, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"theme {path}: {problem}")


def theme_dirs() -> list[Path]:
    """Where the shipped themes are: the wheel's ``kvtop/_themes``, then a source checkout's ``themes/``."""
    pkg = Path(__file__).resolve().parents[1]
    return [d for d in (pkg / "_themes", pkg.parent / "themes") if d.is_dir()]


def _strip_comment(line: str) -> str:
    in_string = False
    for i, ch in enumerate(line):
        if ch == '"':
            in_string = not in_string
        elif ch == "#" and not in_string:
            return line[:i]
    return line


def _parse_simple_toml(text: str) -> dict[str, Any]:
    """``key = "string" | number | true/false`` lines and ``[table]`` headers; enough for theme files."""
    out: dict[str, Any] = {}
    table = out
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = _strip_comment(raw).strip()
        if not line:
            continue
        if line.startswith("[") and line.endswith("]"):
            table = out.setdefault(line[1:-1].strip(), {})
            continue
        m = re.match(r'^"?([A-Za-z0-9_-]+)"?\s*=\s*(.+)$', line)
        if not m:
            raise ValueError(f"line {lineno}: cannot read {raw!r}")
        key, value = m.group(1), m.group(2).strip()
        if len(value) >= 2 and value.startswith('"') and value.endswith('"'):
            table[key] = value[1:-1]
        elif value in ("true", "false"):
            table[key] = value == "true"
        else:
            table[key] = float(value) if "." in value else int(value)
    return out


def load_theme(path: Path | str) -> Theme:
    """One theme file as a Theme; its name is the file's ``name`` or, failing that, its stem."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise ThemeError(p, f"cannot read it ({exc.strerror or exc})") from None
    try:
        data = tomllib.loads(text) if tomllib is not None else _parse_simple_toml(text)
    except Exception as exc:
        raise ThemeError(p, f"not valid TOML ({exc})") from None
    variables = data.pop("variables", {})
    if not isinstance(variables, dict):
        raise ThemeError(p, "[variables] must be a table")
    unknown = sorted(set(data) - _THEME_FIELDS)
    if unknown:
        raise ThemeError(p, f"unknown key(s) {', '.join(unknown)} (a theme knows {', '.join(sorted(_THEME_FIELDS))})")
    data.setdefault("name", p.stem)
    if "primary" not in data:
        raise ThemeError(p, "primary is missing")
    # The tier colours from the colour code; a file's own [variables] may override them.
    merged = {**tier_variables(str(data["name"]), bool(data.get("dark", True))),
              **{str(k): str(v) for k, v in variables.items()}}
    try:
        return Theme(**data, variables=merged)
    except Exception as exc:  # a bad colour string and the like
        raise ThemeError(p, str(exc)) from None


def load_themes(extra: list[Path | str] | None = None) -> tuple[list[Theme], list[str]]:
    """Every shipped theme (first directory wins for a name), then ``extra`` files. Returns (themes, errors)."""
    found: dict[str, Theme] = {}
    errors: list[str] = []
    paths: list[Path] = [f for d in theme_dirs() for f in sorted(d.glob("*.toml"))]
    paths += [Path(x) for x in extra or []]
    for path in paths:
        try:
            theme = load_theme(path)
        except ThemeError as exc:
            errors.append(str(exc))
            continue
        if theme.name not in found or path in [Path(x) for x in extra or []]:
            found[theme.name] = theme
    order = {name: i for i, name in enumerate(PREFERRED_ORDER)}
    themes = sorted(found.values(), key=lambda t: (order.get(t.name, len(order)), t.name))
    return themes, errors


def theme_problem(wanted: str) -> str | None:
    """What is wrong with ``--theme`` / ``theme =`` before the dashboard starts (a name no shipped theme and no
    Textual theme has, with the nearest names; a theme file that cannot be read), or None. A typo'd theme was a
    warning in the event log of a dashboard in the default theme (issue 26)."""
    from textual.theme import BUILTIN_THEMES

    from kvtop.suggest import did_you_mean

    if wanted.endswith(".toml") or "/" in wanted:
        try:
            load_theme(Path(wanted).expanduser())
        except ThemeError as exc:
            return str(exc)
        return None
    themes, _errors = load_themes()
    ours = [t.name for t in themes]
    if wanted in ours or wanted in BUILTIN_THEMES:
        return None
    return (f"no theme {wanted!r}{did_you_mean(wanted, [*ours, *BUILTIN_THEMES], quote=True)}: kvtop's are "
            f"{', '.join(ours)}, or one of Textual's {len(BUILTIN_THEMES)} (ctrl+p lists them), or a theme file "
            "(.toml)")


__all__ = ["DEFAULT_THEME", "PREFERRED_ORDER", "ThemeError", "VARIABLE_DEFAULTS", "load_theme", "load_themes",
           "theme_dirs", "theme_problem", "tier_glyph", "tier_style", "tier_variables"]
