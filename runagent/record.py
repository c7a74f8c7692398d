"""Frozen records: run-agent's immutable value classes, dataclasses whose equality, hash and
repr are written once, here, instead of generated for each class.

Python 3.11 compiles every method a dataclass generates separately, when the class is defined:
a frozen dataclass costs about 0.75 ms at import, 0.3 ms of it its `__eq__`, `__hash__` and
`__repr__`. run-agent defines a hundred such classes and a short command builds some forty of
them before it does anything else, so sharing the three keeps about 10 ms off every `run-agent
job` (docs/performance.md). They behave as the generated ones do: two records are equal when
they are of the same class and their compared fields are equal (as tuples, so a field holding
the very same object is equal to itself); the hash is that of the same fields; the repr is
`Name(field=value, ...)` over the fields shown. `dataclasses.replace`, `fields` and `asdict`
work on a record as on any dataclass.
"""

from __future__ import annotations

import dataclasses
from _thread import get_ident
from collections.abc import Callable
from operator import attrgetter
from typing import Any, TypeVar, dataclass_transform

T = TypeVar("T")

_Key = Callable[[Any], tuple[Any, ...]]
_compared: dict[type, _Key] = {}
_hashed: dict[type, _Key] = {}
_shown: dict[type, tuple[str, ...]] = {}
_in_repr: set[tuple[int, int]] = set()  # (record, thread) whose repr is being written


@dataclass_transform(frozen_default=True, field_specifiers=(dataclasses.field,))
def record(cls: type[T]) -> type[T]:
    """`@dataclass(frozen=True)`, with the shared `__eq__`, `__hash__` and `__repr__`."""
    made = dataclasses.dataclass(frozen=True, eq=False, repr=False)(cls)
    made.__eq__ = _eq  # type: ignore[method-assign]
    made.__hash__ = _hash  # type: ignore[method-assign]
    made.__repr__ = _repr  # type: ignore[method-assign]
    return made


def _key(names: list[str]) -> _Key:
    """A function giving the named fields of a record as a tuple."""
    if not names:
        return lambda obj: ()
    if len(names) == 1:
        one = attrgetter(names[0])
        return lambda obj: (one(obj),)
    return attrgetter(*names)


def _compared_key(cls: type) -> _Key:
    key = _compared.get(cls)
    if key is None:
        key = _compared[cls] = _key([f.name for f in dataclasses.fields(cls) if f.compare])
    return key


def _eq(self: Any, other: Any) -> Any:  # bool, or NotImplemented
    if other.__class__ is not self.__class__:
        return NotImplemented
    key = _compared_key(self.__class__)
    return bool(key(self) == key(other))


def _hash(self: Any) -> int:
    cls = self.__class__
    key = _hashed.get(cls)
    if key is None:
        names = [
            f.name for f in dataclasses.fields(cls) if (f.compare if f.hash is None else f.hash)
        ]
        key = _hashed[cls] = _key(names)
    return hash(key(self))


def _repr(self: Any) -> str:
    cls = self.__class__
    names = _shown.get(cls)
    if names is None:
        names = _shown[cls] = tuple(f.name for f in dataclasses.fields(cls) if f.repr)
    mark = (id(self), get_ident())
    if mark in _in_repr:
        return "..."  # a record that holds itself, as the generated repr says it
    _in_repr.add(mark)
    try:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in names)
    finally:
        _in_repr.discard(mark)
    return f"{cls.__qualname__}({fields})"
