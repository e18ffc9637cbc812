"""Themes are files: the shipped ones load, a user's file loads, a bad one is named and skipped."""

from __future__ import annotations

from pathlib import Path

import pytest
from recordings import session_from_recording
from textual.color import Color
from textual.css.stylesheet import Stylesheet

from kvtop.palette import PALETTES
from kvtop.ui.app import build_app
from kvtop.ui.themes import VARIABLE_DEFAULTS, ThemeError, _parse_simple_toml, load_theme, load_themes, theme_dirs


def test_the_shipped_themes_load_with_every_kvtop_colour() -> None:
    themes, errors = load_themes()
    assert errors == []
    names = [t.name for t in themes]
    assert names[:3] == ["dark", "light", "high-contrast"]
    for theme in themes:
        assert set(VARIABLE_DEFAULTS) <= set(theme.variables), theme.name


def test_the_python_310_reader_agrees_with_tomllib() -> None:
    tomllib = pytest.importorskip("tomllib")
    for path in sorted(theme_dirs()[0].glob("*.toml")):
        text = path.read_text()
        assert _parse_simple_toml(text) == tomllib.loads(text), path.name


def test_bad_theme_files_are_named(tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "bad"\nprimary = "#ff0000"\ncolour = "red"\n')
    with pytest.raises(ThemeError, match="bad.toml: unknown key"):
        load_theme(bad)
    bad.write_text('name = "bad"\n')
    with pytest.raises(ThemeError, match="primary is missing"):
        load_theme(bad)
    with pytest.raises(ThemeError, match="cannot read"):
        load_theme(tmp_path / "missing.toml")


class Settings:
    refresh = 0.25
    duration = None

    def __init__(self, theme: str):
        self.theme = theme


async def test_a_user_theme_file_and_a_textual_theme_both_work(tmp_path: Path) -> None:
    mine = tmp_path / "mine.toml"
    mine.write_text('name = "mine"\nprimary = "#00aa00"\ndark = true\n[variables]\nkv-gpu = "#00ff00"\n')
    app = build_app(session_from_recording(), Settings(str(mine)), run_session=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert app.theme == "mine"
        assert app.theme_variables["kv-gpu"] == "#00ff00"
        assert app.theme_variables["kv-host"] == PALETTES["dark"]["host"].in_use  # the colour code fills the rest
        await pilot.press("t")                               # the cycle goes on to the shipped themes
        assert app.theme == "dark"
        for name, code in (("textual-dark", "dark"), ("textual-light", "light")):
            app.theme = name                                 # picked from the palette: no kv-* variables of its own
            await pilot.pause()
            # Textual's themes map onto the colour code: the one for their darkness, not their primary and accent
            for tier, colours in PALETTES[code].items():
                assert app.theme_variables[f"kv-{tier}"] == colours.in_use, (name, tier)
                assert app.theme_variables[f"kv-{tier}-empty"] == colours.empty, (name, tier)
        assert "GPU tier" in app.screen.query_one("#tier-gpu").border_title


async def test_an_unknown_theme_falls_back_and_says_so() -> None:
    app = build_app(session_from_recording(), Settings("no-such-theme"), run_session=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert app.theme == "dark"
        log = app.screen.query_one("#events")
        assert any("no-such-theme" in line.text for line in log.lines)


async def test_the_start_parses_the_stylesheet_once_with_the_themes_colours(monkeypatch: pytest.MonkeyPatch) -> None:
    # Setting the theme at start made Textual's watcher schedule a refresh_css: kvtop.tcss reparsed into a fresh
    # stylesheet whose cache was dropped, then parsed again for the screen (51M instructions of replay's first
    # screen). The theme's variables go in before the first parse instead; a theme change still restyles.
    reparses: list[Stylesheet] = []
    reparse = Stylesheet.reparse

    def counted(self: Stylesheet) -> None:
        reparses.append(self)
        reparse(self)

    monkeypatch.setattr(Stylesheet, "reparse", counted)
    app = build_app(session_from_recording(), Settings("light"), run_session=False)
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        assert app.theme == "light" and reparses == []
        assert app.screen.styles.background == Color.parse("#ffffff")  # light.toml's: the rules read its variables
        assert app.screen.query_one("#header").styles.background == Color.parse(app.theme_variables["surface"])
        await pilot.press("t")
        await pilot.pause()
        assert app.theme == "high-contrast" and len(reparses) == 1
        assert app.screen.styles.background == Color.parse("#000000")


def test_a_typod_theme_stops_the_dashboard_before_it_starts_with_the_nearest_names(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 26: ``theme = "ligth"`` was a warning in the log of a dashboard drawn in the default theme; now exit 2
    with one line (cli.main turns the SettingsError into it) before the screen takes the terminal."""
    from kvtop import modes
    from kvtop.settings import Settings, SettingsError
    from kvtop.ui import app as app_module
    from kvtop.ui.themes import theme_problem

    assert theme_problem("dark") is None and theme_problem("nord") is None   # kvtop's, and Textual's own
    problem = theme_problem("ligth")
    assert problem is not None and problem.startswith("no theme 'ligth' (did you mean 'light'?)")
    assert "dark, light, high-contrast" in problem
    missing = tmp_path / "nope.toml"
    assert theme_problem(str(missing)) == f"theme {missing}: cannot read it (No such file or directory)"

    built = []
    monkeypatch.setattr(app_module, "build_app", lambda *a, **k: built.append(a))
    settings = Settings()
    settings.set("theme", "ligth", "test")
    with pytest.raises(SettingsError, match=r"^--theme: no theme 'ligth' \(did you mean 'light'\?\)"):
        modes.run_dashboard(session=None, settings=settings)
    assert built == []
