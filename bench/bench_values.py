"""What ``@frozen`` / ``@mutable`` (kvtop/values.py) cost against ``@dataclass(frozen=True)`` / ``@dataclass``, for each
of kvtop's classes made with them:
defining the class (the import-time cost it removes), and making an instance (positionally, all fields by keyword,
and the required fields alone), in this interpreter, best of N.

    python bench/bench_values.py            # a table, one row a class, and the totals
    python bench/bench_values.py --json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import timeit
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from test_values import CLASSES, _reference, _values  # noqa: E402  (the classes and their dataclass copies)

from kvtop.values import frozen, mutable  # noqa: E402


def _define_s(cls: type, make: Any, repeat: int) -> float:
    """Seconds to define ``cls`` again from its fields by ``make``."""
    annotations = {f.name: f.type for f in dataclasses.fields(cls)}
    namespace = {f.name: dataclasses.field(default=f.default, default_factory=f.default_factory, repr=f.repr,
                                           hash=f.hash, compare=f.compare, metadata=f.metadata)
                 for f in dataclasses.fields(cls)}
    slots = "__slots__" in vars(cls)

    def define() -> None:
        make(type(cls.__name__, (), {"__annotations__": dict(annotations), "__doc__": "d", **namespace}), slots)

    return min(timeit.repeat(define, number=20, repeat=repeat)) / 20


def _make_s(cls: type, args: tuple[Any, ...], kwargs: dict[str, Any], repeat: int) -> float:
    return min(timeit.repeat(lambda: cls(*args, **kwargs), number=2000, repeat=repeat)) / 2000


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)
    rows = []
    for cls in CLASSES:
        ref = _reference(cls)
        is_frozen = cls.__dataclass_params__.frozen
        values = _values(cls)
        required = {f.name: values[f.name] for f in dataclasses.fields(cls)
                    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING}
        row: dict[str, Any] = {"class": f"{cls.__module__}.{cls.__qualname__}", "fields": len(values)}
        for label, made in (("dataclass", ref), ("frozen", cls)):
            row[f"{label}_define_us"] = 1e6 * _define_s(
                cls, (lambda c, s: dataclasses.dataclass(c, frozen=is_frozen, slots=s)) if label == "dataclass"  # noqa: B023
                else (lambda c, s: (frozen if is_frozen else mutable)(c, slots=s)), a.repeat)  # noqa: B023
            row[f"{label}_positional_ns"] = 1e9 * _make_s(made, tuple(values.values()), {}, a.repeat)
            row[f"{label}_keywords_ns"] = 1e9 * _make_s(made, (), values, a.repeat)
            row[f"{label}_required_ns"] = 1e9 * _make_s(made, (), required, a.repeat)
        rows.append(row)
    keys = [k for k in rows[0] if k.endswith(("_us", "_ns"))]
    totals = {k: sum(r[k] for r in rows) for k in keys}
    if a.json:
        print(json.dumps({"rows": rows, "totals": totals}, indent=1))
        return 0
    print(f"{'class':40} {'n':>3} | define us: dataclass frozen | make ns (dataclass/frozen): positional  keywords"
          "  required")
    for r in [*rows, {"class": "total", "fields": sum(r["fields"] for r in rows), **totals}]:
        print(f"{r['class'][-40:]:40} {r['fields']:3} | {r['dataclass_define_us']:9.1f} {r['frozen_define_us']:6.1f} |"
              f" {r['dataclass_positional_ns']:6.0f}/{r['frozen_positional_ns']:<6.0f}"
              f" {r['dataclass_keywords_ns']:6.0f}/{r['frozen_keywords_ns']:<6.0f}"
              f" {r['dataclass_required_ns']:6.0f}/{r['frozen_required_ns']:<6.0f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
