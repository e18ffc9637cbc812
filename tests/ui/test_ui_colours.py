"""One colour code (issue 24, item 3): GPU, host and disk keep one colour each in every panel and every theme.

The test reads what the screen paints: each panel's segments (``render_line``, the styles resolved through the
theme), picks the ones that stand for a tier by what they show (a tier's bar and its legend, the "GPU" and "host"
labels of the hit-rate, moves, priority and memory panels, the move sparklines by where their blocks land, the
priority bars by column, the verdict's tier name, the tier panels' titles), and asserts that each tier's colours
are shades of one hue, and that no colour of one tier is another tier's.
"""

from __future__ import annotations

import colorsys
from collections import defaultdict
from typing import Any

import pytest
from recordings import three_tier_session

from kvtop.palette import PALETTES, TIERS
from kvtop.ui.app import build_app
from kvtop.ui.panel import Panel

pytestmark = pytest.mark.usefixtures("frozen_ui_clock")  # tests/conftest.py

THEMES = ("dark", "light", "high-contrast")
BARS = set("█▓░▮")
SPARKS = set("▁▂▃▄▅▆▇█")


class Settings:
    refresh = 0.25
    duration = None

    def __init__(self, theme: str):
        self.theme = theme




def _rows(panel: Panel) -> list[list[tuple[str, str | None]]]:
    """The panel's lines as painted: (text, foreground colour as #rrggbb) per segment."""
    out = []
    for y in range(panel.inner[1]):
        row = []
        for seg in panel.render_line(y):
            color = seg.style.color if seg.style is not None else None
            row.append((seg.text, None if color is None else color.get_truecolor().hex))
        out.append(row)
    return out


def tier_colours(app: Any) -> dict[str, list[tuple[str, str | None]]]:
    """tier -> [(where, colour)] for everything on screen that stands for a tier."""
    found: dict[str, list[tuple[str, str | None]]] = defaultdict(list)
    screen = app.screen

    def add(tier: str, where: str, colour: str | None) -> None:
        found[tier].append((where, None if colour is None else colour.lower()))

    for tier in TIERS:
        panel = screen.query_one(f"#tier-{tier}")
        add(tier, "title", panel.styles.border_title_color.hex)
        for row in _rows(panel):
            for text, colour in row:
                if text.strip() and set(text.strip()) <= BARS | SPARKS:
                    add(tier, f"bar {text[:1]}", colour)   # the bar, its legend, its history
    for row in _rows(screen.query_one("#hit")):
        for text, colour in row:
            if text.strip() in ("GPU", "host"):
                add(text.strip().lower(), "hit label", colour)
    for row in _rows(screen.query_one("#moves")):
        line = "".join(t for t, _ in row).split()
        if not line or line[0] not in ("offload", "onboard", "evict"):
            continue
        # where the blocks land: offload on the host, onboard on the GPU; an eviction in the tier that drops them
        lands = {"offload": "host", "onboard": "gpu"}.get(line[0]) or line[1].lower()
        for text, colour in row:
            if text.strip() and set(text.strip()) <= SPARKS:
                add(lands, f"{line[0]} sparkline", colour)
            elif text.strip() in ("GPU", "host"):
                add(text.strip().lower(), "moves label", colour)
    for row in _rows(screen.query_one("#priorities")):
        bars = [colour for text, colour in row if text.strip() and set(text.strip()) == {"▮"}]
        for tier, colour in zip(("gpu", "host"), bars):
            add(tier, "priority bar", colour)
        for text, colour in row:
            if text.strip() in ("GPU", "host", "GiB GPU", "GiB host", "hit GPU", "hit host"):
                add(text.split()[-1].lower(), "priority heading", colour)
    for row in _rows(screen.query_one("#memory")):
        for text, colour in row:
            if text.strip() and set(text.strip()) <= BARS:
                add("gpu", "memory bar", colour)
            elif text.strip().startswith("GPU") or text.strip() == "host":
                add(text.strip()[:4].rstrip("0123456789").lower(), "memory label", colour)
    header = _rows(screen.query_one("#header"))
    for text, colour in header[-1]:   # the verdict's line: "host tier: costs, ..."
        if text.strip().split(" ")[0] in ("host", "disk"):
            add(text.strip().split(" ")[0], "verdict", colour)
    return found


def _hue(colour: str) -> float:
    r, g, b = (int(colour[i:i + 2], 16) / 255 for i in (1, 3, 5))
    return colorsys.rgb_to_hls(r, g, b)[0] * 360


def _spread(hues: list[float]) -> float:
    """The widest circular distance between two hues, in degrees."""
    return max((min(abs(a - b), 360 - abs(a - b)) for a in hues for b in hues), default=0.0)


@pytest.mark.parametrize("size", [(120, 40), (200, 60)])
@pytest.mark.parametrize("theme", THEMES)
async def test_each_tier_keeps_one_colour_in_every_panel(theme: str, size: tuple[int, int]) -> None:
    app = build_app(three_tier_session(), Settings(theme), run_session=False)
    async with app.run_test(size=size) as pilot:
        await pilot.pause()
        app.refresh_view()
        await pilot.pause()
        found = tier_colours(app)
    where = {tier: {w.split()[0] for w, _ in found[tier]} for tier in TIERS}
    # each kind of evidence was read (the test reads what it means to)
    assert {"title", "bar", "hit", "onboard", "evict", "priority", "memory"} <= where["gpu"], where["gpu"]
    assert {"title", "bar", "hit", "offload", "evict", "priority", "memory", "verdict"} <= where["host"], where["host"]
    assert {"title", "bar"} <= where["disk"], where["disk"]
    colours = {tier: {c for _, c in found[tier]} for tier in TIERS}
    for tier in TIERS:
        assert None not in colours[tier], (theme, tier, found[tier])
        # one colour: its shades (one hue, 20 degrees at most between two of them)
        assert _spread([_hue(c) for c in colours[tier] if c]) <= 20, (theme, tier, sorted(found[tier]))
        assert colours[tier] <= {PALETTES[theme][tier].of(s) for s in ("in-use", "cached", "empty")}, \
            (theme, tier, sorted(found[tier]))
    # never another tier's
    for a in TIERS:
        for b in TIERS:
            if a < b:
                assert not colours[a] & colours[b], (theme, a, b, colours[a] & colours[b])
                assert _spread([_hue(PALETTES[theme][a].in_use), _hue(PALETTES[theme][b].in_use)]) >= 40


def test_every_theme_has_three_tiers_of_three_shades_apart() -> None:
    for theme, tiers in PALETTES.items():
        bases = [tiers[t].in_use for t in TIERS]
        assert len(set(bases)) == 3, theme
        for t in TIERS:
            shades = [tiers[t].of(s) for s in ("in-use", "cached", "empty")]
            assert _spread([_hue(c) for c in shades]) <= 20, (theme, t)
            # the shades differ from each other, or (high-contrast) the glyphs alone tell them apart
            assert len(set(shades)) in (1, 3), (theme, t)
