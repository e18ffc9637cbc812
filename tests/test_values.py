"""kvtop/values.py ``@frozen`` / ``@mutable``: every class kvtop defines with them does what its
``@dataclass(frozen=True)`` / ``@dataclass`` copy does (the same fields, construction, errors, equality, hash, repr,
immutability, replace / asdict / pickle / copy, signature), so that the cheaper definition changed nothing but its
cost at import."""

from __future__ import annotations

import copy
import dataclasses
import importlib
import inspect
import pickle
from typing import Any

import pytest

from kvtop.values import frozen, mutable

MODULES = ("kvtop.tiers.state", "kvtop.tiers.snapshot", "kvtop.tiers.verdict", "kvtop.fleet",
           "kvtop.ui.panels.header", "kvtop.ui.panels.tier", "kvtop.ui.panels.hit_rate", "kvtop.ui.panels.moves",
           "kvtop.ui.panels.priority", "kvtop.ui.panels.sources", "kvtop.ui.panels.requests_table",
           "kvtop.ui.panels.requests", "kvtop.ui.panels.memory", "kvtop.ui.panels.events",
           "kvtop.occupancy", "kvtop.session", "kvtop.settings", "kvtop.problems", "kvtop.runner",
           "kvtop.engines.sizing", "kvtop.engines.sim.sweep.replay_accel", "kvtop.engines.sim.sweep.belady",
           "kvtop.ui.table", "kvtop.ui.state", "kvtop.palette")


def _frozen_classes() -> list[type]:
    found = []
    for name in MODULES:
        module = importlib.import_module(name)
        found += [c for c in vars(module).values()
                  if isinstance(c, type) and c.__module__ == name and getattr(c.__init__, "__module__", "") ==
                  "kvtop.values"]
    return found


CLASSES = _frozen_classes()


def _reference(cls: type) -> type:
    """``cls``'s fields as a ``@dataclass(frozen=...)`` of the same name (frozen and slots as ``cls`` has them)."""
    specs = [(f.name, f.type, dataclasses.field(default=f.default, default_factory=f.default_factory, repr=f.repr,
                                                hash=f.hash, compare=f.compare, metadata=f.metadata))
             for f in dataclasses.fields(cls)]
    return dataclasses.make_dataclass(cls.__name__, specs, frozen=cls.__dataclass_params__.frozen,
                                      slots="__slots__" in vars(cls))


def _values(cls: type, salt: int = 0) -> dict[str, Any]:
    return {f.name: 1000 * salt + 7 * i + 1 for i, f in enumerate(dataclasses.fields(cls))}


def _outcome(make: Any, *args: Any, **kwargs: Any) -> str:
    """The TypeError's words, or the repr of what was made."""
    try:
        return repr(make(*args, **kwargs))
    except TypeError as error:
        return f"TypeError: {error}"


def test_the_classes_are_found() -> None:
    names = {c.__name__ for c in CLASSES}
    # @frozen: state 11, widgets 13 (the replay's badge), snapshot, fleet, occupancy, session, verdict, palette 1
    # each; @mutable: Settings, Problem, EngineChoice, LogLine, TableState; engines: @frozen GpuPool, @mutable
    # ReplayResult and sweep.belady.Plan; the app's state (kvtop/ui/state.py): @frozen Layout, 8 @mutable
    assert len(CLASSES) == 47
    assert {"TierState", "Quality", "Requests", "TierSnapshot", "SessionView", "HeaderData", "FleetRow", "Settings",
            "Problem", "LogLine", "EngineChoice", "GpuPool", "ReplayResult", "Plan", "TierVerdict",
            "VerdictLine", "ReplayBadge", "TierColours", "Timing", "FleetView", "Layout"} <= names
    assert sum(not c.__dataclass_params__.frozen for c in CLASSES) == 15


@pytest.mark.parametrize("cls", CLASSES, ids=lambda c: c.__name__)
def test_a_class_behaves_as_its_dataclass(cls: type) -> None:
    ref = _reference(cls)
    is_frozen = cls.__dataclass_params__.frozen
    names = [f.name for f in dataclasses.fields(cls)]
    assert dataclasses.is_dataclass(cls) and cls.__match_args__ == ref.__match_args__ == tuple(names)
    params, ref_params = cls.__dataclass_params__, ref.__dataclass_params__
    assert [getattr(params, p) for p in ("init", "repr", "eq", "order", "unsafe_hash", "frozen")] == \
        [getattr(ref_params, p) for p in ("init", "repr", "eq", "order", "unsafe_hash", "frozen")]
    assert str(inspect.signature(cls)) == str(inspect.signature(ref))

    values = _values(cls)
    positional = list(values.values())
    made = [cls(*positional), cls(**values), cls(*positional[:2], **dict(list(values.items())[2:]))]
    expected = ref(*positional)
    for obj in made:
        assert [getattr(obj, n) for n in names] == [getattr(expected, n) for n in names]
        assert repr(obj) == repr(expected)
        assert dataclasses.asdict(obj) == dataclasses.asdict(expected)
        assert obj == made[0] and not obj != made[0] and obj != expected  # another class is never equal
        assert _outcome(hash, obj) == _outcome(hash, expected)  # the same value, or both unhashable
        assert hasattr(obj, "__dict__") == hasattr(expected, "__dict__")
        if hasattr(expected, "__dict__"):
            assert list(vars(obj)) == list(vars(expected))  # the fields' order, as dataclass's __init__ sets them
        for n in names if is_frozen else ():
            with pytest.raises(dataclasses.FrozenInstanceError, match=f"cannot assign to field '{n}'"):
                setattr(obj, n, 0)
            with pytest.raises(dataclasses.FrozenInstanceError, match=f"cannot delete field '{n}'"):
                delattr(obj, n)
        if is_frozen:
            with pytest.raises(dataclasses.FrozenInstanceError):
                obj.not_a_field = 1
    if not is_frozen:  # a mutable one: assigned, it is unequal to what it was, as the dataclass
        changed, theirs = copy.copy(made[1]), copy.copy(expected)
        setattr(changed, names[0], -5)
        setattr(theirs, names[0], -5)
        assert (changed == made[0]) == (theirs == expected) is False and repr(changed) == repr(theirs)
    obj = made[0]
    for copied in (pickle.loads(pickle.dumps(obj)), copy.copy(obj), copy.deepcopy(obj)):
        assert copied == obj and repr(copied) == repr(obj)

    # a changed field: unequal exactly where the dataclass compares it, the same hash where it hashes the same
    for f in dataclasses.fields(cls):
        changed = {**values, f.name: -1}
        mine, theirs = dataclasses.replace(obj, **{f.name: -1}), ref(**changed)
        assert (mine == obj) == (theirs == expected) == (not f.compare)
        assert _outcome(hash, mine) == _outcome(hash, theirs)
        assert repr(mine) == repr(theirs)
        assert mine == cls(**changed)

    # defaults and default factories: each optional field left out
    required = {n: v for n, v in values.items() if n in _required(cls)}
    assert repr(cls(**required)) == repr(ref(**required))
    assert dataclasses.asdict(cls(**required)) == dataclasses.asdict(ref(**required))

    # the same TypeErrors, word for word
    calls = [((), {}), ((*positional, 0), {}), ((), {**values, "not_a_field": 0}),
             ((positional[0],), {names[0]: 0}), ((), dict(list(values.items())[1:]))]
    if len(names) > 2:
        calls.append(((), {names[-1]: values[names[-1]]}))
    for args, kwargs in calls:
        assert _outcome(cls, *args, **kwargs) == _outcome(ref, *args, **kwargs), (args, kwargs)
    assert sum(_outcome(cls, *a, **k).startswith("TypeError") for a, k in calls) >= 3


def _required(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)
            if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]


# the field options kvtop's classes use, in one class, and the error wording with 1, 2 and 3 missing
@frozen(slots=True)
class Example:
    a: int
    b: str
    c: float
    d: int = 4
    e: list[int] = dataclasses.field(default_factory=list, compare=False, repr=False)
    f: int = dataclasses.field(default=6, hash=False)


def test_a_class_of_every_kind_of_field_behaves_as_its_dataclass() -> None:
    ref = _reference(Example)
    assert "__slots__" in vars(Example) and not hasattr(Example(1, "b", 3.0), "__dict__")
    assert repr(Example(1, "b", 3.0)) == repr(ref(1, "b", 3.0)) == "Example(a=1, b='b', c=3.0, d=4, f=6)"
    assert Example(1, "b", 3.0, e=[1]) == Example(1, "b", 3.0, e=[2])  # e is not compared
    assert Example(1, "b", 3.0, f=1) != Example(1, "b", 3.0, f=2)
    assert hash(Example(1, "b", 3.0, f=1)) == hash(Example(1, "b", 3.0, f=2)) == hash(ref(1, "b", 3.0))
    assert Example(1, "b", 3.0).e is not Example(1, "b", 3.0).e  # a new list each time
    for args, kwargs in [((), {}), ((1,), {}), ((1, "b"), {}), ((1, "b", 3.0, 4, [], 6, 7), {}),
                         ((1, "b", 3.0), {"a": 1}), ((1, "b", 3.0), {"g": 1}), ((1,), {"c": 3.0, "zz": 0})]:
        mine = _outcome(Example, *args, **kwargs)
        assert mine.startswith("TypeError") and mine == _outcome(ref, *args, **kwargs), (args, kwargs)


def test_what_frozen_does_not_do_is_refused() -> None:
    with pytest.raises(TypeError, match="__post_init__"):
        @frozen
        class PostInit:
            a: int

            def __post_init__(self) -> None: ...
    with pytest.raises(TypeError, match="defines __eq__"):
        @frozen
        class OwnEq:
            a: int

            def __eq__(self, other: object) -> bool:
                return True
    with pytest.raises(TypeError, match="init=False"):
        @frozen
        class NoInit:
            a: int = dataclasses.field(default=0, init=False)
    with pytest.raises(TypeError, match="__setattr__ is not supported"):
        @mutable
        class OwnSetattr:
            a: int

            def __setattr__(self, name: str, value: object) -> None: ...
