"""KvtopApp keeps bindings, actions and timers; what it keeps between refreshes is in a few typed state objects
(kvtop/ui/state.py), not ~50 loose attributes (issue 25: KvtopApp had 50; harlequin's App has 23, posting's 15)."""

from __future__ import annotations

import ast
import inspect
import textwrap

from recordings import session_from_recording
from textual.app import App

from kvtop.ui.app import KvtopApp, build_app

MOST = 20   # harlequin's App sets 23, posting's 15


def _textuals() -> set[str]:
    """What Textual's own App has or sets (its attributes are not KvtopApp's)."""
    return set(vars(App())) | set(dir(App))


def _assigned_in_class(cls: type) -> set[str]:
    """Every ``self.NAME`` the class's own methods assign (``=``, ``+=``, annotated, in a tuple), wherever they do
    it; not those of the classes nested in it (its messages)."""
    body = ast.parse(textwrap.dedent(inspect.getsource(cls))).body[0]
    assert isinstance(body, ast.ClassDef)
    methods = [n for n in body.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]
    names = set()
    for node in (n for method in methods for n in ast.walk(method)):
        targets: list[ast.expr] = []
        if isinstance(node, ast.Assign):
            targets = list(node.targets)
        elif isinstance(node, (ast.AugAssign, ast.AnnAssign)):
            targets = [node.target]
        for target in targets:
            for t in ast.walk(target):
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self" \
                        and isinstance(t.ctx, ast.Store):
                    names.add(t.attr)
    return names


def test_the_checks_see_what_they_count() -> None:
    class Loose(App[None]):
        class Said:
            def __init__(self) -> None:
                self.not_the_apps = 0

        def __init__(self) -> None:
            super().__init__()
            self.a = 1
            self.b: int = 2
            self.c, self.d = 3, 4
            self.title = "Textual's own"

        def later(self) -> None:
            self.e = 5
            self.a += 1

    assert _assigned_in_class(Loose) - _textuals() == {"a", "b", "c", "d", "e"}
    assert set(vars(Loose())) - _textuals() == {"a", "b", "c", "d"}


def test_the_app_keeps_few_attributes_of_its_own() -> None:
    # KvtopApp as the tests build it, and every attribute its methods assign anywhere (a mount, a refresh, a key)
    app = build_app(session_from_recording(), run_session=False)
    made = sorted(set(vars(app)) - _textuals())
    assigned = sorted(_assigned_in_class(KvtopApp) - _textuals())
    assert len(made) <= MOST, made
    assert len(assigned) <= MOST, assigned
