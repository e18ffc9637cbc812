"""kvtop's layer boundaries, checked on the source (design.md: engines -> sources -> records -> tiers -> sinks).

An AST walk over every module of kvtop collects the kvtop modules each one imports, at module level or inside a
function (a lazy import is still a dependency; only ``if TYPE_CHECKING:`` blocks are left out, they never run).
From that graph:

- no import cycles among kvtop modules;
- only ``kvtop/ui/`` imports textual or rich (tests/ui/test_ui_boundary.py checks the same in a fresh interpreter);
- sinks never import sources (both may share neutral modules: kvtop/mqtt_wire.py);
- engines never import the workload (the driver drives engines, not the other way);
- the fold (kvtop.tiers, the engines' stream fold kvtop.tiers.stream among them, kvtop.occupancy) and the records
  import no source, sink, UI, report or tool, even transitively; nothing in kvtop/tiers imports kvtop.sources, not
  even for a type (the stream's wire decoder is kvtop.sources.kv_wire; its fold gets records, not the decoder);
- the tools (kvtop.estimate, kvtop.calibrate: arithmetic over the engines' model and GPU profiles) reach no fold,
  source, sink, UI or report, and the report (kvtop.report: charts from recordings) imports no tool;
- only kvtop.calibrate imports torch, and only inside a function (``kvtop estimate`` and everything else run
  without PyTorch).

A fresh interpreter then imports the fold and the records and checks ``sys.modules`` the same way (harlequin's
habit), so that a dynamic import the AST cannot see is caught too.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "kvtop"

FOLD = ("kvtop.tiers", "kvtop.tiers.stream", "kvtop.occupancy", "kvtop.records")
TOOLS = ("kvtop.estimate", "kvtop.calibrate")
# The commands (kvtop/commands/, one module per subcommand) are the top: only the dispatch (kvtop.cli, and
# ``python -m kvtop``) imports them. Under them, what every mode's session shares (kvtop.compose) and its summary.
COMMANDS = ("kvtop.commands",)
ABOVE_THE_COMMANDS = ("kvtop.cli", "kvtop.__main__")
NOT_UNDER_THE_FOLD = ("kvtop.sources", "kvtop.sinks", "kvtop.ui", "kvtop.session", "kvtop.runner", "kvtop.cli",
                      "kvtop.report", "kvtop.compose", "kvtop.run_summary", *COMMANDS, *TOOLS)


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(REPO).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _imports(tree: ast.AST, package: str, *, module_level: bool = False, for_types: bool = False) -> list[str]:
    """Every module name imported anywhere in ``tree`` (relative imports resolved against ``package``);
    ``module_level``: only those that run on import (not inside a function); ``for_types``: those inside
    ``if TYPE_CHECKING:`` too (a dependency a reader follows, though it never runs)."""
    names: list[str] = []

    def visit(node: ast.AST) -> None:
        if module_level and isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            return
        if isinstance(node, ast.If) and _is_type_checking(node) and not for_types:
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[: len(package.split(".")) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            names.append(module)
            # ``from kvtop.sinks import mqtt`` imports the submodule kvtop.sinks.mqtt
            names.extend(f"{module}.{alias.name}" for alias in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return names


@cache
def graph() -> tuple[dict[str, set[str]], dict[str, set[str]]]:
    """(kvtop module -> kvtop modules it imports, kvtop module -> top-level third-party packages it imports)."""
    paths = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    internal: dict[str, set[str]] = {}
    external: dict[str, set[str]] = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        deps: set[str] = set()
        outside: set[str] = set()
        for imported in _imports(ast.parse(path.read_text(), str(path)), package):
            if imported.split(".")[0] != "kvtop":
                outside.add(imported.split(".")[0])
                continue
            target = imported
            while target and target not in paths:  # kvtop.tiers.TierModel -> kvtop.tiers
                target = target.rpartition(".")[0]
            if target and target != name and target != "kvtop":
                deps.add(target)
        internal[name] = deps
        external[name] = outside
    return internal, external


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def strong(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                strong(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            strong(v)
    return sorted(found)


def _reachable(start: str) -> set[str]:
    edges = graph()[0]
    seen: set[str] = set()
    todo = [start]
    while todo:
        for dep in edges.get(todo.pop(), ()):
            if dep not in seen:
                seen.add(dep)
                todo.append(dep)
    return seen


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


@pytest.mark.slow
def test_the_walk_sees_lazy_imports_and_skips_type_checking() -> None:
    """The checks below are only as good as the walk: a function-level import counts, a TYPE_CHECKING one not."""
    tree = ast.parse("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from kvtop.sinks import a\n"
                     "def f():\n    from kvtop.sources import b\n    import kvtop.ui.app\n"
                     "from . import sibling\n")
    found = _imports(tree, "kvtop.engines")
    assert "kvtop.sources.b" in found and "kvtop.ui.app" in found and "kvtop.engines.sibling" in found
    assert not any(n.startswith("kvtop.sinks") for n in found)
    on_import = _imports(tree, "kvtop.engines", module_level=True)
    assert "kvtop.engines.sibling" in on_import and "kvtop.sources.b" not in on_import
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    assert len(graph()[0]) > 60  # every module of kvtop was walked


def test_no_import_cycles_among_kvtop_modules() -> None:
    cycles = _cycles(graph()[0])
    assert cycles == [], f"import cycles: {cycles}"


def test_only_the_ui_imports_textual_or_rich() -> None:
    leaks = {name: sorted(ext & {"textual", "rich"}) for name, ext in graph()[1].items()
             if ext & {"textual", "rich"} and not _under(name, ("kvtop.ui",))}
    assert leaks == {}


def test_sinks_import_no_sources() -> None:
    bad = {name: sorted(d for d in deps if _under(d, ("kvtop.sources",)))
           for name, deps in graph()[0].items() if _under(name, ("kvtop.sinks",))}
    assert {k: v for k, v in bad.items() if v} == {}


def test_engines_import_no_workload() -> None:
    bad = {name: sorted(d for d in deps if _under(d, ("kvtop.workload",)))
           for name, deps in graph()[0].items() if _under(name, ("kvtop.engines",))}
    assert {k: v for k, v in bad.items() if v} == {}


@pytest.mark.parametrize("module", FOLD)
def test_the_fold_and_records_reach_no_source_sink_or_ui(module: str) -> None:
    modules = [m for m in graph()[0] if _under(m, (module,))]
    assert modules, f"{module} is not a kvtop module any more: update FOLD"
    reached = set().union(*(_reachable(m) for m in modules))
    assert sorted(m for m in reached if _under(m, NOT_UNDER_THE_FOLD)) == []


def test_the_commands_are_the_top_and_each_has_a_main() -> None:
    """Issue 25: the commands lived in four places (``kvtop sim`` inside cli.py, attach.py, agent.py, runner.py's
    helpers that every mode called back). Each is a module of kvtop/commands/ with ``main(argv)``, one per word of
    ``kvtop SUBCOMMAND`` (``run`` is ``kvtop [options]``), and nothing below the dispatch imports one."""
    from kvtop.cli import SUBCOMMANDS

    edges = graph()[0]
    commands = {m for m in edges if _under(m, COMMANDS) and m != "kvtop.commands"}
    assert {f"kvtop.commands.{word}" for word in SUBCOMMANDS} == commands
    for name in sorted(commands):
        tree = ast.parse((PACKAGE / "commands" / f"{name.rpartition('.')[2]}.py").read_text())
        mains = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "main"]
        assert mains and mains[0].args.args[0].arg == "argv", f"{name} has no main(argv)"
    below = {name: sorted(d for d in deps if _under(d, COMMANDS)) for name, deps in edges.items()
             if not _under(name, (*COMMANDS, *ABOVE_THE_COMMANDS))}
    assert {k: v for k, v in below.items() if v} == {}
    # the dispatch reaches every command (a lazy import each, which the walk sees)
    assert commands <= edges["kvtop.cli"]


@pytest.mark.parametrize("tool", TOOLS)
def test_the_tools_reach_no_fold_source_sink_ui_or_report(tool: str) -> None:
    """``kvtop estimate`` and ``kvtop calibrate`` are arithmetic and measurement over the engines' model shapes,
    GPU profiles and cost model; they live beside the commands, not in the report (issue 15)."""
    assert tool in graph()[0], f"{tool} is not a kvtop module any more: update TOOLS"
    reached = _reachable(tool)
    assert sorted(m for m in reached if _under(m, ("kvtop.tiers", *NOT_UNDER_THE_FOLD))) == []


def test_the_report_is_the_report_only() -> None:
    """kvtop/report/ draws charts from recordings; it imports no tool (estimate, calibrate moved out of it)."""
    modules = [m for m in graph()[0] if _under(m, ("kvtop.report",))]
    assert "kvtop.report.report" in modules
    reached = set().union(*(_reachable(m) for m in modules))
    assert sorted(m for m in reached if _under(m, TOOLS)) == []


@pytest.mark.slow
def test_only_calibrate_imports_torch_and_only_when_it_runs() -> None:
    """PyTorch is calibrate's alone (it times kernels on the GPU), imported inside the function that measures, so
    that ``kvtop calibrate --help`` and its 'no PyTorch' message (exit 2) work without it."""
    importers, at_import = [], []
    for path in PACKAGE.rglob("*.py"):
        name = _module_name(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        tree = ast.parse(path.read_text(), str(path))
        if any(m.split(".")[0] == "torch" for m in _imports(tree, package)):
            importers.append(name)
        if any(m.split(".")[0] == "torch" for m in _imports(tree, package, module_level=True)):
            at_import.append(name)
    assert importers == ["kvtop.calibrate"]
    assert at_import == []


PROBE = """
import json, sys
import kvtop.records, kvtop.tiers
from kvtop.records import make
from kvtop.tiers import TierModel
m = TierModel()
# the lazy paths too: the engines' KV event stream fold and a summary
m.apply(make("kv_batch", {"seq": 0, "events": []}, time=1.0))
m.summary()
print(json.dumps(sorted(k for k in sys.modules if k.split(".")[0] in ("kvtop", "textual", "rich"))))
"""


def test_a_fresh_interpreter_folding_records_loads_no_source_sink_or_ui() -> None:
    out = subprocess.run([sys.executable, "-c", PROBE], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout.strip().splitlines()[-1])
    assert "kvtop.tiers" in loaded
    assert [m for m in loaded if _under(m, NOT_UNDER_THE_FOLD) or m.split(".")[0] in ("textual", "rich")] == []


READERS = ("kvtop.ui", "kvtop.sinks", "kvtop.fleet", "kvtop.agent", "kvtop.runner", "kvtop.watcher", "kvtop.modes",
           "kvtop.compose", "kvtop.run_summary", "kvtop.cli", *COMMANDS)
_MODEL_NAMES = {"model", "m", "live", "snap", "snapshot"}


def _private_reads(tree: ast.AST) -> list[str]:
    """``model._x`` or ``getattr(model, "_x")`` (also ``self.session.model._x``): a reader in the fold's internals."""
    found = []
    for node in ast.walk(tree):
        target: ast.AST | None = None
        attr = None
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__"):
            target, attr = node.value, node.attr
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr"
              and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant)
              and isinstance(node.args[1].value, str) and node.args[1].value.startswith("_")):
            target, attr = node.args[0], node.args[1].value
        if target is None:
            continue
        name = target.id if isinstance(target, ast.Name) else target.attr if isinstance(target, ast.Attribute) else ""
        if name in _MODEL_NAMES:
            found.append(f"line {node.lineno}: {name}.{attr}")
    return found


def test_no_reader_reads_the_folds_internals() -> None:
    """Sinks, the dashboard, the fleet table, the agent and watch read TierModel's public fields or its snapshot
    (kvtop/tiers/snapshot.py), never ``model._something`` (the dashboard read ``_req_records``, the agent
    ``_stream``)."""
    assert _private_reads(ast.parse("x = model._a\ny = getattr(m, '_b', None)\nz = self.session.model._c\n"
                                    "ok = model.public\nalso = self._mine\n")) == [
        "line 1: model._a", "line 2: m._b", "line 3: model._c"]
    bad = {}
    for path in PACKAGE.rglob("*.py"):
        name = _module_name(path)
        if _under(name, READERS):
            hits = _private_reads(ast.parse(path.read_text(), str(path)))
            if hits:
                bad[name] = hits
    assert bad == {}


def _private_imports(tree: ast.AST) -> list[str]:
    """``from kvtop.x import _name`` (or ``from . import _name``): a module taking another module's private name."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.level or (node.module or "").split(".")[0] == "kvtop"):
            found += [f"line {node.lineno}: {'.' * node.level}{node.module or ''} import {alias.name}"
                      for alias in node.names if alias.name.startswith("_") and not alias.name.startswith("__")]
    return found


def test_no_module_imports_another_modules_private_name() -> None:
    """Issue 25: ten modules took names another kept private (agent.py the attach command's ``_float`` and the
    headless mode's ``_run_reporting``, the recorder ``records._default``, the MQTT subscriber ``mqtt_wire._level``,
    five tier folds ``tiers.common._Bad`` and its checks, the sweep and the token check the block manager's
    ``_Block`` and ``_MIN_ID``): a name another module needs is public where it is defined. Importing a public
    name under a private alias (``import x as _x``) is the importer's own business."""
    assert _private_imports(ast.parse("from kvtop.attach import _float, main\nfrom . import _x\n"
                                      "from kvtop.y import z as _z\nfrom os import _exit\n"
                                      "from kvtop import __version__\n")) == [
        "line 1: kvtop.attach import _float", "line 2: . import _x"]
    bad = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        hits = _private_imports(ast.parse(path.read_text(), str(path)))
        if hits:
            bad[_module_name(path)] = hits
    assert bad == {}


# The fold is a package of small folds (kvtop/tiers/): each owns its state and knows no other fold; the model
# (kvtop/tiers/model.py) composes them, and its read side (capacity.py, summary.py, snapshot.py) reads them. The
# engines' stream fold (stream.py) writes the event, stats and request folds' counters, handed to it by the model.
SMALL_FOLDS = ("kvtop.tiers.events", "kvtop.tiers.stats", "kvtop.tiers.requests", "kvtop.tiers.meta",
               "kvtop.tiers.stream")
COMPOSER = ("kvtop.tiers.model", "kvtop.tiers.capacity", "kvtop.tiers.summary", "kvtop.tiers.snapshot")
FOLD_ATTRS = {"event_fold", "stats_fold", "request_fold", "meta_fold", "stream_fold"}


@pytest.mark.parametrize("fold", SMALL_FOLDS)
def test_each_small_fold_imports_no_other_fold_nor_the_model(fold: str) -> None:
    """The event fold never imports the stats fold (and so on): a fold is told what it needs by the model
    (warm-up, the block size) through its constructor or its arguments."""
    assert fold in graph()[0], f"{fold} is not a kvtop module any more: update SMALL_FOLDS"
    reached = _reachable(fold)
    assert sorted(m for m in reached if m in SMALL_FOLDS + COMPOSER) == []


def _fold_private_reads(tree: ast.AST) -> list[str]:
    """``x.event_fold._y`` (any of the model's folds): a reader past a fold's public state."""
    return [f"line {node.lineno}: {node.value.attr}.{node.attr}" for node in ast.walk(tree)
            if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__")
            and isinstance(node.value, ast.Attribute) and node.value.attr in FOLD_ATTRS]


@pytest.mark.slow
def test_nothing_outside_the_tier_package_reads_a_folds_private_state() -> None:
    """Outside kvtop/tiers, a fold's state is read through its public attributes only."""
    assert _fold_private_reads(ast.parse("a = m.event_fold._pools\nb = m.event_fold.pools\nc = x._y\n")) == [
        "line 1: event_fold._pools"]
    bad = {}
    paths = [*PACKAGE.rglob("*.py"), *(REPO / "tests").rglob("*.py"), *(REPO / "bench").rglob("*.py")]
    for path in paths:
        if path.is_relative_to(PACKAGE / "tiers"):
            continue
        tree = ast.parse(path.read_text(), str(path))
        hits = _fold_private_reads(tree)
        if hits:
            bad[str(path.relative_to(REPO))] = hits
    assert bad == {}


def _tier_modules_imports(for_types: bool) -> dict[str, list[str]]:
    """Every module of kvtop/tiers -> the kvtop modules it imports, ``for_types``: ``if TYPE_CHECKING:`` ones too."""
    out = {}
    for path in sorted((PACKAGE / "tiers").rglob("*.py")):
        name = _module_name(path)
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        out[name] = _imports(ast.parse(path.read_text(), str(path)), package, for_types=for_types)
    return out


def test_nothing_in_tiers_imports_a_source_not_even_for_a_type() -> None:
    """Issue 25: kvtop/kv_stream.py was both the sources' wire decoder and the fold that wrote the model's counters,
    and imported the model for its type: the house's one cycle (kv_stream <-> tiers/model) and its one arrow back
    up. The decoder is kvtop/sources/kv_wire.py and the fold kvtop/tiers/stream.py; no module of kvtop/tiers names
    kvtop.sources, even in an ``if TYPE_CHECKING:`` block, and the stream fold names not the model (nor its read
    side) even so: the model hands it what it writes."""
    tree = ast.parse("from typing import TYPE_CHECKING\n"
                     "if TYPE_CHECKING:\n    from kvtop.sources.kv_wire import Batch\n")
    assert "kvtop.sources.kv_wire" in _imports(tree, "kvtop.tiers", for_types=True)
    assert "kvtop.sources.kv_wire" not in _imports(tree, "kvtop.tiers")
    found = _tier_modules_imports(for_types=True)
    assert "kvtop.tiers.stream" in found and "kvtop.tiers.model" in found
    assert {name: [m for m in deps if _under(m, ("kvtop.sources",))] for name, deps in found.items()
            if any(_under(m, ("kvtop.sources",)) for m in deps)} == {}
    assert sorted(m for m in found["kvtop.tiers.stream"] if _under(m, COMPOSER)) == []


def test_the_stream_fold_is_handed_what_it_writes_never_the_model() -> None:
    """design.md: "a fold is handed what it writes, never the model". The stream fold a model makes holds the
    event, stats and request folds it writes, and nothing that is the model."""
    from kvtop.records import make
    from kvtop.tiers import TierModel

    m = TierModel()
    m.apply(make("kv_batch", {"seq": 0, "events": [{"type": "BlockStored", "block_hashes": [1], "medium": "CPU"}]},
                 time=1.0))
    held = list(vars(m.stream_fold).values())
    assert not any(v is m for v in held)
    assert any(v is m.event_fold for v in held) and any(v is m.stats_fold for v in held)
    assert m.moves.offloaded_blocks == 1  # and what it wrote is the model's


def test_the_model_routes_kv_events_straight_to_the_event_folds_hot_path() -> None:
    """``TierModel.apply_kv_event`` is the event fold's own bound method, not a wrapper around it: a wrapper
    would add a call to each of ~50,000 events/s (bench/JOURNAL.md, "Folding KV events")."""
    from kvtop.tiers import TierModel

    m = TierModel()
    assert m.apply_kv_event.__self__ is m.event_fold  # type: ignore[attr-defined]
    assert m.apply_kv_event.__func__ is type(m.event_fold).apply  # type: ignore[attr-defined]


# ---------------------------------------------------------------------------------------------- the dashboard

UI = PACKAGE / "ui"
# The private names the dashboard reads off something not its own, all Textual's and all behind one version check
# with an off switch (kvtop/ui/strip_reuse.py strip_cache_enabled; off, none of the code that reads them is installed):
# the repaint hook, probed for here; the screen's set of widgets to repaint (a panel's changed rows go there
# directly, not through an Update message per panel); a strip's crop cache (the crop of a row written in part,
# made from the segments in hand). Each is read with getattr and a fallback to Textual's public way. Not a read of
# another's object, so not listed: strip_reuse.RowStrip, a Strip subclass that sets Strip's private slots itself (its
# caches made on first use), used only where Strip's slots are exactly the ones it knows and behind the same check.
FOREIGN_PRIVATE_ALLOWED = {("strip_reuse.py", "getattr(Widget, '_set_dirty', None)"),
                           ("strip_reuse.py", "getattr(screen, '_dirty_widgets', None)"),
                           ("strip_reuse.py", "getattr(strip, '_crop_cache', None)")}
_NAME_READERS = ("getattr", "hasattr")


def _named_reads(tree: ast.AST) -> list[tuple[ast.Call, ast.expr, str]]:
    """``getattr(obj, "name", ...)`` and ``hasattr(obj, "name")`` with the name written out: (call, obj, name)."""
    return [(node, node.args[0], node.args[1].value) for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in _NAME_READERS
            and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)]


def _foreign_private_reads(tree: ast.AST, file: str) -> list[str]:
    """``x._name`` or ``getattr(x, "_name")`` where x is not the code's own: ``self``, ``cls``, ``super()`` or a class
    defined in the same module. ``self.session._producers`` and ``model._req_records`` are someone else's."""
    own_classes = {n.name for n in ast.walk(tree) if isinstance(n, ast.ClassDef)}

    def own(target: ast.expr) -> bool:
        if isinstance(target, ast.Name):
            return target.id in ("self", "cls") or target.id in own_classes
        return isinstance(target, ast.Call) and isinstance(target.func, ast.Name) and target.func.id == "super"

    def private(name: str) -> bool:
        return name.startswith("_") and not name.startswith("__")

    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and private(node.attr) \
                and not own(node.value):
            found.append(f"{file}:{node.lineno}: {ast.unparse(node)}")
    for call, target, name in _named_reads(tree):
        if private(name) and not own(target) and (file, ast.unparse(call)) not in FOREIGN_PRIVATE_ALLOWED:
            found.append(f"{file}:{call.lineno}: {ast.unparse(call)}")
    return sorted(found)


def _unexplained_named_reads(source: str, file: str) -> list[str]:
    """A getattr with the attribute's name written out reads a field the code could name by type; it stays only
    where the object may really lack it, and the line says so (``# may lack: why``)."""
    lines = source.splitlines()
    found = []
    for call, _target, _name in _named_reads(ast.parse(source)):
        span = "\n".join(lines[call.lineno - 1:(call.end_lineno or call.lineno)])
        if "may lack" not in span:
            found.append(f"{file}:{call.lineno}: {ast.unparse(call)}")
    return found


def _duck_typed_reads(tree: ast.AST, file: str) -> list[str]:
    """getattr on the session, the settings, a model or a snapshot, even with a reason: those have types
    (kvtop.session.SessionView / DashboardSession, kvtop.tiers.snapshot.TierSnapshot), so the screen reads them."""
    typed = {"session", "settings", "model", "live", "snap", "snapshot"}
    found = []
    for call, target, _name in _named_reads(tree):
        names = {n.id for n in ast.walk(target) if isinstance(n, ast.Name)} | \
                {n.attr for n in ast.walk(target) if isinstance(n, ast.Attribute)}
        if names & typed:
            found.append(f"{file}:{call.lineno}: {ast.unparse(call)}")
    return found


def test_the_dashboard_checks_see_what_they_forbid() -> None:
    code = ("class Own:\n    _k = 1\n"
            "a = self.session._producers\nb = getattr(self.session, '_producers', ())\nc = model._req_records\n"
            "d = self._mine\ne = super()._set_dirty\nf = Own._k\ng = getattr(self.session, 'status', None)\n"
            "h = getattr(row, what)\ni = getattr(x, 'y', None)  # may lack: a third-party object\n")
    tree = ast.parse(code)
    assert _foreign_private_reads(tree, "t.py") == [
        "t.py:3: self.session._producers", "t.py:4: getattr(self.session, '_producers', ())",
        "t.py:5: model._req_records"]
    assert _unexplained_named_reads(code, "t.py") == [
        "t.py:4: getattr(self.session, '_producers', ())", "t.py:9: getattr(self.session, 'status', None)"]
    assert _duck_typed_reads(tree, "t.py") == [
        "t.py:4: getattr(self.session, '_producers', ())", "t.py:9: getattr(self.session, 'status', None)"]


def test_the_dashboard_reads_no_private_name_of_anything_not_its_own() -> None:
    """Issue 15: the screen read ``getattr(self.session, "_producers", ())`` (and once the fold's ``_req_records``)."""
    found = [hit for path in sorted(UI.rglob("*.py"))
             for hit in _foreign_private_reads(ast.parse(path.read_text(), str(path)), path.name)]
    assert found == []


def test_the_dashboard_reads_session_and_model_by_type_not_by_getattr() -> None:
    """Issue 15: 46 getattr calls in kvtop/ui/app.py read the session, the settings and the model as if any
    field might be missing (``getattr(model, "history_step_s", 1.0)``, ``getattr(v, "cumulative", v)``)."""
    duck, unexplained = [], []
    for path in sorted(UI.rglob("*.py")):
        source = path.read_text()
        duck += _duck_typed_reads(ast.parse(source, str(path)), path.name)
        unexplained += _unexplained_named_reads(source, path.name)
    assert duck == []
    assert unexplained == []


# `kvtop replay FILE` up to its first screen (Textual's headless test driver at 120x40 in place of the terminal),
# in a fresh interpreter: the modules it loads. What only other modes use is imported where those modes start, so
# that an attached kvtop's start-up (issue 15: < 0.5 s of CPU) does not pay for it.
REPLAY_PROBE = """
import asyncio, json, sys
import textual.app

async def first_screen(app):
    async with app.run_test(size=(120, 40)) as pilot:
        await pilot.pause()
        await asyncio.sleep(0.3)  # the replay's first records folded and drawn
        print(json.dumps({"records_in": app.session.records_in, "modules": sorted(sys.modules),
                          "compiled_dataclasses": compiled_dataclasses()}))

def compiled_dataclasses():
    # kvtop's dataclasses whose methods dataclasses compiled at import (kvtop/values.py makes them without)
    import dataclasses
    return sorted(f"{name}.{c.__qualname__}" for name, module in list(sys.modules.items()) if name.startswith("kvtop")
                  for c in vars(module).values() if isinstance(c, type) and c.__module__ == name
                  and dataclasses.is_dataclass(c) and getattr(c.__init__, "__module__", None) != "kvtop.values")

def run(self, *args, **kwargs):
    asyncio.run(first_screen(self))
    raise SystemExit(0)

textual.app.App.run = run
# The probe's stdout is a pipe, which would make the replay headless (kvtop.modes.headless_wanted): it stands in
# for a terminal here, as the patched App.run stands in for the screen.
import kvtop.modes
kvtop.modes.headless_wanted = lambda settings, stdout=None: bool(settings.headless or settings.json)
from kvtop.cli import main
main(["replay", "tests/data/busy.jsonl", "--refresh", "0.25"])
"""

# What the verdict's pricing loads on a replay's first screen (kvtop/tiers/verdict.py cost_basis: the cost model
# for the recording's model and GPU, ~16 ms of imports on the dev box): every other engine module stays deferred.
PRICING = ("kvtop.engines", "kvtop.engines.models", "kvtop.engines.gpus", "kvtop.engines.meta", "kvtop.engines.sim",
           "kvtop.engines.sim.cost")

# Each with the mode (or the option) that imports it.
DEFERRED_FROM_REPLAY = (
    "kvtop.engines",            # a driven run's engine and model/GPU tables; `kvtop sim`; a size setting
    "kvtop.workload",           # a driven run's workload driver and scenarios; --trace
    "kvtop.sources.host",       # a driven run's host sampler (and psutil with it)
    "kvtop.sources.nvml",       # a driven run's GPU sampler
    "kvtop.sources.poller",     # a driven run's engine poller
    "kvtop.sources.mqtt",       # kvtop attach mqtt://
    "kvtop.sources.kv_events_zmq",  # kvtop attach zmq://
    "kvtop.sources.trtllm_serve",   # kvtop attach http://
    "kvtop.sinks",              # --record, --publish, --prometheus-port
    "kvtop.report",             # kvtop report
    "psutil", "zmq", "paho", "numpy", "matplotlib", "prometheus_client",
)


@pytest.mark.slow
def test_replay_up_to_its_first_screen_loads_none_of_the_other_modes() -> None:
    out = subprocess.run([sys.executable, "-c", REPLAY_PROBE], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    loaded = result["modules"]
    # The probe saw the dashboard and the replay running: the deferred modules were not just never reached.
    assert {"kvtop.ui.app", "kvtop.ui.panel", "kvtop.ui.panels.header", "kvtop.sources.replay",
            "kvtop.compose"} <= set(loaded)
    assert result["records_in"] > 0
    assert [m for m in loaded if _under(m, DEFERRED_FROM_REPLAY) and m not in PRICING] == []
    # The dataclasses replay's first screen defines are @frozen / @mutable (kvtop/values.py), which compile
    # nothing: a @dataclass(frozen=True) compiles six methods (~0.55 ms a class on the dev box).
    assert result["compiled_dataclasses"] == COMPILED_DATACLASSES


# Made for every record read (by keyword, where @frozen's check after the fact costs ~1.3x dataclass's generated
# __init__ for a class of 5 fields): they stay dataclasses.
# The cost model's two tables (the verdict's pricing, PRICING above) validate themselves in __post_init__, which
# @frozen does not support: they stay dataclasses too (~1.1 ms of the first screen).
COMPILED_DATACLASSES = ["kvtop.engines.gpus.GpuProfile", "kvtop.engines.models.ModelShape",
                        "kvtop.records.record.Record", "kvtop.records.record.SourceId"]


# ------------------------------------------------------------------------------------- Textual's private names

# kvtop/ui/strip_reuse.py is the one dashboard file that may touch Textual's private names (its version check and off
# switch: strip_cache_enabled); Panel takes it as a mixin only when that is on. Anywhere else in kvtop/ui a private
# name of Textual's (its private modules, a private method overridden or called, a private attribute read or
# written, on a panel's own Textual base or on any Textual object) would be code that no version check guards.
PRIVATE_TEXTUAL_ALLOWED = {"strip_reuse.py"}


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


@cache
def _textual_privates_of_module(path: str) -> dict[str, frozenset[str]]:
    """Per class of one Textual source file: the private names it defines (methods, class attributes, slots and the
    ``self._x`` it sets or reads)."""
    tree = ast.parse(Path(path).read_text(), path)
    out = {}
    for node in ast.walk(tree):
        if not isinstance(node, ast.ClassDef):
            continue
        names = set()
        for sub in ast.walk(node):
            if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)) and _private(sub.name):
                names.add(sub.name)
            elif isinstance(sub, ast.Attribute) and isinstance(sub.value, ast.Name) and sub.value.id in ("self", "cls")\
                    and _private(sub.attr):
                names.add(sub.attr)
            elif isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store) and _private(sub.id):
                names.add(sub.id)
            elif isinstance(sub, ast.Constant) and isinstance(sub.value, str) and _private(sub.value):
                names.add(sub.value)   # __slots__ entries
        out[node.name] = frozenset(names)
    return out


def _textual_privates(cls: type) -> frozenset[str]:
    """The private names of the Textual classes in ``cls``'s MRO."""
    import inspect

    names: set[str] = set()
    for k in cls.__mro__:
        if k.__module__.split(".")[0] == "textual":
            names |= _textual_privates_of_module(inspect.getfile(k)).get(k.__name__, frozenset())
    return frozenset(names)


@cache
def _all_textual_privates() -> frozenset[str]:
    import textual

    names: set[str] = set()
    for path in Path(textual.__file__).parent.rglob("*.py"):
        for found in _textual_privates_of_module(str(path)).values():
            names |= found
    return frozenset(names)


def _textual_private_uses(tree: ast.AST, file: str, classes: dict[str, type]) -> list[str]:
    """Uses of Textual's private names in one module: an import of a private Textual module or name; in a class with
    a Textual base (``classes``: the module's classes by name), a method named as, or ``self.``/``cls.``/``super().``
    attribute of, a private name of that base; anywhere, a private name of any Textual class read off another
    object, by attribute or by ``getattr``/``hasattr``/``setattr`` with the name written out."""
    found = []
    textual_all = _all_textual_privates()

    def hit(node: ast.AST, what: str) -> None:
        found.append(f"{file}:{getattr(node, 'lineno', 0)}: {what}")

    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "textual":
            if any(_private(part) for part in (node.module or "").split(".")) or \
                    any(_private(alias.name) for alias in node.names):
                hit(node, f"from {node.module} import {', '.join(a.name for a in node.names)}")
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] == "textual" and any(_private(p) for p in alias.name.split(".")):
                    hit(node, f"import {alias.name}")
    own_nodes: set[int] = set()
    for cls_node in ast.walk(tree):
        if not isinstance(cls_node, ast.ClassDef) or cls_node.name not in classes:
            continue
        privates = _textual_privates(classes[cls_node.name])
        for sub in ast.walk(cls_node):
            if isinstance(sub, (ast.FunctionDef, ast.AsyncFunctionDef)) and sub.name in privates:
                hit(sub, f"{cls_node.name}.{sub.name}")
            elif isinstance(sub, ast.Attribute) and sub.attr in privates and (
                    (isinstance(sub.value, ast.Name) and sub.value.id in ("self", "cls")) or
                    (isinstance(sub.value, ast.Call) and isinstance(sub.value.func, ast.Name)
                     and sub.value.func.id == "super")):
                hit(sub, ast.unparse(sub))
            if isinstance(sub, ast.Attribute):
                own_nodes.add(id(sub))
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr in textual_all and id(node) not in own_nodes and not (
                isinstance(node.value, ast.Name) and node.value.id in ("self", "cls")):
            hit(node, ast.unparse(node))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) \
                and node.func.id in ("getattr", "hasattr", "setattr") and len(node.args) >= 2 \
                and isinstance(node.args[1], ast.Constant) and node.args[1].value in textual_all:
            hit(node, ast.unparse(node))
    return sorted(set(found), key=lambda hit: (int(hit.split(":")[1]), hit))


def _ui_module_classes(path: Path) -> dict[str, type]:
    import importlib

    module = importlib.import_module(".".join(path.relative_to(REPO).with_suffix("").parts))
    return {name: value for name, value in vars(module).items()
            if isinstance(value, type) and value.__module__ == module.__name__}


def test_the_textual_private_name_check_sees_what_it_forbids() -> None:
    from textual.widget import Widget

    class Mine(Widget):
        pass

    code = ("from textual._compositor import Compositor\nimport textual._context\nfrom textual.widget import _x\n"
            "class Mine(Widget):\n    def _set_dirty(self, *r):\n        super()._set_dirty(*r)\n"
            "    def render_line(self, y):\n        return self._styles_cache\n"
            "    def mine(self):\n        self._own = 1\n        return self._own\n"
            "a = getattr(screen, '_dirty_widgets', None)\nb = strip._crop_cache\nc = row._not_textuals_at_all\n")
    assert _textual_private_uses(ast.parse(code), "t.py", {"Mine": Mine}) == [
        "t.py:1: from textual._compositor import Compositor", "t.py:2: import textual._context",
        "t.py:3: from textual.widget import _x", "t.py:5: Mine._set_dirty", "t.py:6: super()._set_dirty",
        "t.py:8: self._styles_cache", "t.py:12: getattr(screen, '_dirty_widgets', None)", "t.py:13: strip._crop_cache"]


def test_only_strip_reuse_uses_textuals_private_names() -> None:
    """Issue 25: the screen's rendering engine used four private Textual surfaces from widgets.py, beside nine panels.
    They are all in kvtop/ui/strip_reuse.py now (and it does use them: the check sees them there)."""
    found = {}
    for path in sorted(UI.rglob("*.py")):
        hits = _textual_private_uses(ast.parse(path.read_text(), str(path)), path.name, _ui_module_classes(path))
        if hits:
            found[str(path.relative_to(UI))] = hits
    assert set(found) == PRIVATE_TEXTUAL_ALLOWED, found
    assert len(found["strip_reuse.py"]) >= 4   # _set_dirty overridden and called, _dirty_widgets, _crop_cache...
