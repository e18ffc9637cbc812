"""``@frozen``: an immutable, value-compared dataclass made without compiling any code when its module is imported.

``@dataclass(frozen=True)`` writes each class's ``__init__``, ``__repr__``, ``__eq__``, ``__hash__``,
``__setattr__`` and ``__delattr__`` as source text and compiles it: ~0.55 ms a class on the dev box, and an
attached kvtop defines ~30 of them before its first screen (kvtop.tiers.state's 10 took 5.8 ms, all but 0.06 ms of
it that). ``@frozen`` asks ``dataclasses`` for the fields alone (``init=False, repr=False, eq=False``: nothing
compiled) and gives the class methods that read them from the fields' list: kvtop.tiers.state 5.8 -> ~1.2 ms.

What it makes is a dataclass (``dataclasses.fields``, ``replace``, ``asdict`` and ``is_dataclass`` work) that does
what ``@dataclass(frozen=True)`` does: the same ``__init__`` arguments (positional or by name, defaults, default
factories, the same TypeErrors for a missing, repeated or unknown one), ``FrozenInstanceError`` on assignment or
deletion, equality with an instance of the same class only over the ``compare`` fields, the same hash, the same
repr over the ``repr`` fields; ``slots=True`` as dataclass's. tests/test_values.py holds each of kvtop's ``@frozen``
classes to a ``@dataclass(frozen=True)`` copy of itself. Not supported (a TypeError at definition): ``init=False``
or ``kw_only`` fields, InitVar, ``__post_init__``, inheriting from another dataclass.

An accelerator of ``dataclasses.dataclass`` (its reference; the test that holds them equal: tests/test_values.py).
What pays for it (bench/JOURNAL.md, "kvtop/values.py against a plain dataclass", issue 25): with every class a plain
``@dataclass(frozen=True, slots=True)`` (``@dataclass(slots=True)`` for ``@mutable``) the first screen of ``kvtop
replay`` took 1,399.7M instructions against 1,244.6M (+12.5%), 28-39 ms more CPU on the dev box (270.5 -> 298.6 ms
median), past the 20 ms a user at start-up is taken to feel; so it stays.
"""

from __future__ import annotations

import dataclasses
import reprlib
from collections.abc import Callable
from dataclasses import MISSING, FrozenInstanceError
from operator import attrgetter
from typing import TYPE_CHECKING, Any, TypeVar, overload

if TYPE_CHECKING:  # type checkers read @frozen as the frozen dataclass it is (PEP 681); nothing of it at run time
    from typing_extensions import dataclass_transform
else:
    def dataclass_transform(**_: Any) -> Any:
        return lambda f: f

T = TypeVar("T")

__all__ = ["frozen", "mutable"]


@overload
def frozen(cls: type[T], /) -> type[T]: ...
@overload
def frozen(cls: None = None, /, *, slots: bool = False) -> Callable[[type[T]], type[T]]: ...


@dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field, dataclasses.Field))
def frozen(cls: type[T] | None = None, /, *, slots: bool = False) -> Any:
    """``@frozen`` or ``@frozen(slots=True)`` on a class with annotated fields (see the module docstring)."""
    if cls is None:
        return lambda c: _make(c, slots, True)
    return _make(cls, slots, True)


@overload
def mutable(cls: type[T], /) -> type[T]: ...
@overload
def mutable(cls: None = None, /, *, slots: bool = False) -> Callable[[type[T]], type[T]]: ...


@dataclass_transform(field_specifiers=(dataclasses.field, dataclasses.Field))
def mutable(cls: type[T] | None = None, /, *, slots: bool = False) -> Any:
    """``@mutable``: what ``@dataclass`` makes (``__init__``, ``__repr__``, ``__eq__``, ``__hash__ = None``), with
    nothing compiled, as ``@frozen`` is to ``@dataclass(frozen=True)``."""
    if cls is None:
        return lambda c: _make(c, slots, False)
    return _make(cls, slots, False)


def _make(cls: type[T], slots: bool, is_frozen: bool) -> type[T]:
    kind = "@frozen" if is_frozen else "@mutable"
    if any(dataclasses.is_dataclass(b) for b in cls.__mro__[1:]):
        raise TypeError(f"{kind} {cls.__qualname__}: inherits from a dataclass (not supported)")
    for name in ("__post_init__", *(() if is_frozen else ("__setattr__",))):
        if name in cls.__dict__:
            raise TypeError(f"{kind} {cls.__qualname__}: {name} is not supported")
    if cls.__dict__.get("__doc__") is None:
        # dataclass would write one from the generated __init__'s signature (inspect.signature: ~0.1 ms a class)
        cls.__doc__ = f"{cls.__name__}({', '.join(cls.__dict__.get('__annotations__', {}))})"
    cls = dataclasses.dataclass(cls, init=False, repr=False, eq=False, slots=slots)
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    for f in fields:
        if not f.init or f.kw_only is True:
            raise TypeError(f"{kind} {cls.__qualname__}.{f.name}: init=False / kw_only fields are not supported")
    names = tuple(f.name for f in fields)
    params = cls.__dataclass_params__  # type: ignore[attr-defined]
    params.init = params.repr = params.eq = True  # what the class does now (dataclass's own record of it)
    params.frozen = is_frozen
    _set(cls, "__init__", _init(cls, names, fields, slots))
    _set(cls, "__repr__", _repr(tuple(f.name for f in fields if f.repr)))
    compared = tuple(f.name for f in fields if f.compare)
    hashed = tuple(f.name for f in fields if (f.compare if f.hash is None else f.hash))
    _set(cls, "__eq__", _eq(_tuple_of(compared)))
    cls.__signature__ = _Signature(fields)  # type: ignore[attr-defined]
    if "__hash__" in cls.__dict__ and cls.__dict__["__hash__"] is not None:
        pass  # the class's own, kept as dataclass keeps it
    elif not is_frozen:
        cls.__hash__ = None  # type: ignore[assignment]  # a mutable value compared by value: unhashable
    else:
        tuple_of = _tuple_of(hashed)
        _set(cls, "__hash__", lambda self: hash(tuple_of(self)), force=True)
    if not is_frozen:
        return cls
    frozen_names = frozenset(names)

    def __setattr__(self: Any, name: str, value: Any) -> None:
        if type(self) is cls or name in frozen_names:
            raise FrozenInstanceError(f"cannot assign to field {name!r}")
        super(cls, self).__setattr__(name, value)

    def __delattr__(self: Any, name: str) -> None:
        if type(self) is cls or name in frozen_names:
            raise FrozenInstanceError(f"cannot delete field {name!r}")
        super(cls, self).__delattr__(name)

    _set(cls, "__setattr__", __setattr__)
    _set(cls, "__delattr__", __delattr__)
    if slots:
        # dataclass(frozen=True, slots=True) pickles and copies through these (a slot cannot take setattr here)
        def __getstate__(self: Any) -> list[Any]:
            return [getattr(self, n) for n in names]

        def __setstate__(self: Any, state: list[Any]) -> None:
            for n, v in zip(names, state):
                object.__setattr__(self, n, v)

        _set(cls, "__getstate__", __getstate__, force=True)
        _set(cls, "__setstate__", __setstate__, force=True)
    return cls


class _Signature:
    """``inspect.signature(cls)``: what dataclass's generated ``__init__`` would say, made only when asked."""

    def __init__(self, fields: tuple[dataclasses.Field[Any], ...]):
        self.fields = fields

    def __get__(self, obj: Any, owner: type) -> Any:
        if obj is not None:
            raise AttributeError("__signature__")
        import inspect

        def default(f: dataclasses.Field[Any]) -> Any:
            if f.default_factory is not MISSING:
                return getattr(dataclasses, "_HAS_DEFAULT_FACTORY", f.default_factory)  # its repr: <factory>
            return inspect.Parameter.empty if f.default is MISSING else f.default

        return inspect.Signature([inspect.Parameter(f.name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default(f),
                                                    annotation=f.type) for f in self.fields], return_annotation=None)


def _set(cls: type, name: str, fn: Any, force: bool = False) -> None:
    if not force and name in cls.__dict__:
        raise TypeError(f"@frozen / @mutable {cls.__qualname__}: defines {name} itself (dataclass would keep it, "
                        "or refuse)")
    fn.__qualname__ = f"{cls.__qualname__}.{name}"
    setattr(cls, name, fn)


def _tuple_of(names: tuple[str, ...]) -> Any:
    """The tuple of the named attributes (attrgetter gives the bare value for one name, nothing for none)."""
    if not names:
        return lambda self: ()
    if len(names) == 1:
        get = attrgetter(names[0])
        return lambda self: (get(self),)
    return attrgetter(*names)


def _eq(tuple_of: Any) -> Any:
    def __eq__(self: Any, other: Any) -> Any:
        if other.__class__ is self.__class__:
            return tuple_of(self) == tuple_of(other)
        return NotImplemented

    return __eq__


def _repr(names: tuple[str, ...]) -> Any:
    @reprlib.recursive_repr()
    def __repr__(self: Any) -> str:
        return f"{self.__class__.__qualname__}({', '.join(f'{n}={getattr(self, n)!r}' for n in names)})"

    return __repr__


def _init(cls: type, names: tuple[str, ...], fields: tuple[dataclasses.Field[Any], ...], slots: bool) -> Any:
    n = len(names)
    defaults = {f.name: f.default for f in fields if f.default is not MISSING}
    factories = {f.name: f.default_factory for f in fields if f.default_factory is not MISSING}
    where = f"{cls.__qualname__}.__init__()"

    def call_error(args: tuple[Any, ...], kwargs: dict[str, Any]) -> TypeError:
        """The TypeError Python gives a generated ``__init__`` for this call, in CPython's order of checks."""
        for name in kwargs:
            if name not in names:
                return TypeError(f"{where} got an unexpected keyword argument {name!r}")
            if names.index(name) < len(args):
                return TypeError(f"{where} got multiple values for argument {name!r}")
        if len(args) > n:
            optional = len(defaults) + len(factories)
            takes = f"from {n + 1 - optional} to {n + 1}" if optional else f"{n + 1}"
            return TypeError(f"{where} takes {takes} positional argument{'' if takes == '1' else 's'} "
                             f"but {len(args) + 1} were given")
        missing = [repr(m) for m in names[len(args):] if m not in kwargs and m not in defaults and m not in factories]
        listed = (missing[0] if len(missing) == 1 else f"{missing[0]} and {missing[1]}" if len(missing) == 2
                  else f"{', '.join(missing[:-1])}, and {missing[-1]}")
        return TypeError(f"{where} missing {len(missing)} required positional argument{'s' * (len(missing) > 1)}: "
                         f"{listed}")

    # A call is checked after the values are written (C-speed dict updates, where a loop over the fields in Python
    # took ~1.6x dataclass's time for a call by keywords): the fields without a default are a prefix of the fields
    # (dataclass refuses one after a default), so a call is whole when its positions reach past them or its
    # keywords hold the rest; a keyword that is no field shows as a key too many.
    unset = object()
    template = {name: defaults.get(name, unset) for name in names}
    required = sum(1 for f in fields if f.default is MISSING and f.default_factory is MISSING)
    still_required = [frozenset(names[i:required]) for i in range(required + 1)]
    positional = [frozenset(names[:i]) for i in range(n + 1)]
    made = tuple(factories.items())

    def fill(values: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        given = len(args)
        values.update(template)
        if given:
            if given > n:
                raise call_error(args, kwargs)
            values.update(zip(names, args))
        if kwargs:
            values.update(kwargs)
            if len(values) != n or (given and not positional[given].isdisjoint(kwargs)):
                raise call_error(args, kwargs)
        if given < required and (not kwargs or not still_required[given] <= kwargs.keys()):
            raise call_error(args, kwargs)
        for name, factory in made:
            if values[name] is unset:
                values[name] = factory()

    if slots:
        set_field = object.__setattr__

        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            if len(args) == n and not kwargs:
                for name, value in zip(names, args):
                    set_field(self, name, value)
                return
            values: dict[str, Any] = {}
            fill(values, args, kwargs)
            for name in names:
                set_field(self, name, values[name])
    else:
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:  # type: ignore[misc]
            # into the instance's __dict__ at once, in the fields' order (as dataclass's __init__ leaves it)
            if len(args) == n and not kwargs:
                self.__dict__.update(zip(names, args))
            else:
                fill(self.__dict__, args, kwargs)

    return __init__
