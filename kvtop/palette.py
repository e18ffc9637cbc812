"""kvtop's colour code, as plain data: one colour per tier, everywhere (the dashboard, in every theme, and the
report's charts), so that blue is the GPU, orange the host and purple the disk wherever they are drawn.

Within a tier, what a block is doing is told by shade and glyph, never by another tier's colour: in use is the
tier's colour, solid (``█``); cached is a second shade of it, less bright against the background, dense (``▓``);
empty is the faintest shade, sparse (``░``).
In ``high-contrast`` (projectors wash out mid-tones) the three are one saturated colour and the glyph alone tells
them apart.

This module imports nothing from Textual: ``kvtop/ui/themes.py`` turns it into the screen's theme variables
(``kv-gpu``, ``kv-gpu-cached``, ``kv-gpu-empty``, ``kv-host``...), and ``kvtop/report`` draws its charts in
:data:`REPORT` (the light palette: the page is white). Hues are from the families that stay apart for the two
common colour-vision deficiencies (blue / orange / purple, never red against green).
"""

from __future__ import annotations

from kvtop.values import frozen

TIERS = ("gpu", "host", "disk")
STATES = ("in-use", "cached", "empty")
# The glyph of each state in a bar; a legend draws the same glyph in the same style.
GLYPHS = {"in-use": "█", "cached": "▓", "empty": "░"}
# A tier kvtop has no colour for (an engine's fourth tier): neutral, so it never reads as one of the three.
OTHER_TIER = "other"


@frozen  # kvtop.values: no code compiled at import (replay's first screen defines it)
class TierColours:
    """One tier's colour and its two shades."""

    in_use: str    # the tier's colour: labels, figures that belong to the tier, blocks in use
    cached: str    # a shade of it, weaker against the background: blocks holding reusable KV
    empty: str     # a faint shade of it: blocks holding nothing

    def of(self, state: str) -> str:
        return {"in-use": self.in_use, "cached": self.cached, "empty": self.empty}[state]


# Per kvtop theme (themes/*.toml). "dark" is also what any other dark theme gets (Textual's own, picked from the
# command palette), "light" any other light one: the code stays the same whichever theme draws the screen.
PALETTES: dict[str, dict[str, TierColours]] = {
    "dark": {
        "gpu": TierColours("#58a6ff", "#1f6feb", "#0d419d"),
        "host": TierColours("#ffa657", "#db6d28", "#762d0a"),
        "disk": TierColours("#bc8cff", "#8957e5", "#553098"),
        OTHER_TIER: TierColours("#c9d1d9", "#8b949e", "#484f58"),
    },
    "light": {
        "gpu": TierColours("#0969da", "#54aeff", "#b6e3ff"),
        "host": TierColours("#bc4c00", "#fb8f44", "#ffd8b5"),
        "disk": TierColours("#8250df", "#c297ff", "#e8d5ff"),
        OTHER_TIER: TierColours("#57606a", "#8c959f", "#d0d7de"),
    },
    "high-contrast": {
        "gpu": TierColours("#00ffff", "#00ffff", "#00ffff"),
        "host": TierColours("#ffff00", "#ffff00", "#ffff00"),
        "disk": TierColours("#ff00ff", "#ff00ff", "#ff00ff"),
        OTHER_TIER: TierColours("#ffffff", "#ffffff", "#ffffff"),
    },
}

# The report's page is white: the light palette's.
REPORT = PALETTES["light"]


def palette_for(theme: str, dark: bool = True) -> dict[str, TierColours]:
    """The tier colours of a theme: kvtop's own by name, any other theme's by whether it is dark."""
    return PALETTES.get(theme) or PALETTES["dark" if dark else "light"]


def variable(tier: str, state: str = "in-use") -> str:
    """The theme variable (without ``$``) of a tier's state: ``kv-gpu``, ``kv-gpu-cached``, ``kv-gpu-empty``."""
    name = tier if tier in TIERS else OTHER_TIER
    return f"kv-{name}" if state == "in-use" else f"kv-{name}-{state}"


def variables(theme: str, dark: bool = True) -> dict[str, str]:
    """Every tier variable of a theme, name -> colour."""
    pal = palette_for(theme, dark)
    return {variable(tier, state): colours.of(state) for tier, colours in pal.items() for state in STATES}


__all__ = ["GLYPHS", "OTHER_TIER", "PALETTES", "REPORT", "STATES", "TIERS", "TierColours", "palette_for",
           "variable", "variables"]
