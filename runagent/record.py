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

The rest of what a frozen dataclass compiles is shared or put off too: a record's
`__setattr__` and `__delattr__` (which refuse, naming the field) are two functions for all of
them, and its `__init__` is compiled only once many records of that class were made, the first
ones bound by a shared `__init__` (SHARED_INIT_CALLS), so a class a command builds a few times,
or never, costs no compilation (a record costs about a tenth of a frozen dataclass to define,
and a job's path defines some sixty, most built once or never). The compiled `__init__` is the
one dataclasses would write (the same parameters, defaults, `default_factory` calls and
`__post_init__`); the shared one does the same with arguments that fit and hands any others to
it, so a mistake is refused in Python's own words; `inspect.signature` of the class reads the
compiled one. A class that needs more
(no docstring of its own, a base class, `InitVar` or `ClassVar` fields, methods of its own
named as those) is made by dataclasses whole, as before.
"""

from __future__ import annotations

import dataclasses
from _thread import get_ident
from collections.abc import Callable
from dataclasses import MISSING
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
    made = _fields_only(cls)
    if made is None:
        made = dataclasses.dataclass(frozen=True, eq=False, repr=False)(cls)
    made.__eq__ = _eq  # type: ignore[method-assign]
    made.__hash__ = _hash  # type: ignore[method-assign]
    made.__repr__ = _repr  # type: ignore[method-assign]
    return made


_OWN = ("__init__", "__setattr__", "__delattr__", "__signature__")
_SPECIAL = ("ClassVar", "InitVar", "KW_ONLY")  # annotations dataclasses treats apart


def _fields_only(cls: type[T]) -> type[T] | None:
    """`cls` as a frozen dataclass whose methods are shared or made on first use; None when
    it needs dataclasses' whole work (see the module's docstring)."""
    notes = cls.__dict__.get("__annotations__", {})  # noqa: RUF063 (as dataclasses reads them)
    if (
        not cls.__doc__
        or cls.__bases__ != (object,)
        or any(n in cls.__dict__ for n in _OWN)
        or any(word in str(note) for note in notes.values() for word in _SPECIAL)
    ):
        return None  # fmt: skip
    made: Any = dataclasses.dataclass(init=False, repr=False, eq=False)(cls)
    _check_order(dataclasses.fields(made))
    params = made.__dataclass_params__
    params.init = params.repr = params.eq = params.frozen = True
    made.__setattr__, made.__delattr__ = _setattr, _delattr
    made.__init__ = _first_init(made)
    made.__signature__ = _SIGNATURE
    return made  # type: ignore[no-any-return]


def _check_order(fields: tuple[dataclasses.Field[Any], ...]) -> None:
    """The TypeError dataclasses raises when the class is defined, for a parameter without a
    default after one with."""
    defaulted = False
    for f in fields:
        if f.init and not f.kw_only:
            missing = f.default is MISSING and f.default_factory is MISSING
            if defaulted and missing:
                raise TypeError(f"non-default argument {f.name!r} follows default argument")
            defaulted = defaulted or not missing


class _Factory:
    def __repr__(self) -> str:
        return "<factory>"  # as dataclasses shows a default_factory parameter


_HAS_FACTORY = _Factory()


# Records of a class made by the shared `__init__` before the class's own is compiled: most
# classes are built a few times a command (a config's records once), where compiling costs
# more than binding their arguments here; one built often gets its own soon.
SHARED_INIT_CALLS = 32


def _first_init(cls: type) -> Callable[..., None]:
    """An `__init__` that binds the arguments itself while the class is seldom built, then
    compiles the class's own, puts it in its place and runs it. Arguments that do not fit go
    to the compiled one at once, which refuses them in Python's own words."""
    calls = 0
    bind: Callable[[Any, tuple[Any, ...], dict[str, Any]], bool] | None = None

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        nonlocal calls, bind
        calls += 1
        if calls <= SHARED_INIT_CALLS:
            if bind is None:
                bind = _binder(cls)
            if bind(self, args, kwargs):
                return
        _compiled_init(cls)(self, *args, **kwargs)

    __init__.__qualname__ = f"{cls.__qualname__}.__init__"
    __init__.record_stand_in = True  # type: ignore[attr-defined]
    return __init__


def _binder(cls: type) -> Callable[[Any, tuple[Any, ...], dict[str, Any]], bool]:
    """What the compiled `__init__` does with arguments that fit its parameters (fields set in
    their order, each default_factory called for a field not given, then `__post_init__`);
    False, having set nothing, for arguments that do not fit."""
    fields = dataclasses.fields(cls)
    positional = tuple(f.name for f in fields if f.init and not f.kw_only)
    accepted = frozenset(f.name for f in fields if f.init)
    required = tuple(f.name for f in fields if f.init and f.default is MISSING
                     and f.default_factory is MISSING)  # fmt: skip
    steps = tuple((f.name, f.init, f.default, f.default_factory) for f in fields
                  if f.init or f.default_factory is not MISSING)  # fmt: skip
    post_init = hasattr(cls, "__post_init__")
    set_ = object.__setattr__

    def bind(self: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
        if len(args) > len(positional):
            return False
        given = dict(zip(positional, args, strict=False))  # fewer given: the rest by name
        for name, value in kwargs.items():
            if name in given or name not in accepted:
                return False
            given[name] = value
        if any(name not in given for name in required):
            return False
        for name, init, default, factory in steps:
            if init and name in given:
                set_(self, name, given[name])
            else:
                set_(self, name, factory() if factory is not MISSING else default)
        if post_init:
            self.__post_init__()
        return True

    return bind


def _compiled_init(cls: type) -> Callable[..., None]:
    """The `__init__` dataclasses writes for a frozen class of these fields, set on `cls`."""
    init: Callable[..., None] = cls.__dict__["__init__"]
    if not getattr(init, "record_stand_in", False):
        return init  # compiled already
    names: dict[str, Any] = {"__name__": cls.__module__, "_set": object.__setattr__,
                             "_HAS_FACTORY": _HAS_FACTORY}  # fmt: skip
    plain, keyword, body = ["self"], list[str](), list[str]()
    for n, f in enumerate(dataclasses.fields(cls)):
        value, default = f.name, ""
        if f.default_factory is not MISSING:
            names[f"_factory{n}"] = f.default_factory
            value = f"_factory{n}()"
            if f.init:
                value, default = (
                    f"{value} if {f.name} is _HAS_FACTORY else {f.name}",
                    "=_HAS_FACTORY",
                )
        elif f.default is not MISSING:
            names[f"_default{n}"] = f.default
            default = f"=_default{n}"
        if f.init:
            (keyword if f.kw_only else plain).append(f"{f.name}{default}")
        elif f.default_factory is MISSING:
            continue  # read from the class's attribute, as dataclasses leaves it
        body.append(f"    _set(self, {f.name!r}, {value})")
    if hasattr(cls, "__post_init__"):
        body.append("    self.__post_init__()")
    params = ", ".join(plain + (["*", *keyword] if keyword else []))
    exec(f"def __init__({params}):\n" + ("\n".join(body) or "    pass"), names)
    init = names["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__annotations__ = {f.name: f.type for f in dataclasses.fields(cls) if f.init}
    init.__annotations__["return"] = None
    cls.__init__ = init  # type: ignore[misc]
    return init


class _Signature:
    """`inspect.signature` of a record's class: that of its `__init__` (compiled to be read)."""

    def __get__(self, obj: Any, owner: type) -> Any:
        if obj is not None:
            raise AttributeError("__signature__")
        import inspect

        init = next(c.__dict__["__init__"] for c in owner.__mro__ if "__init__" in c.__dict__)
        if getattr(init, "record_stand_in", False):
            init = _compiled_init(_record_class(owner))
        signature = inspect.signature(init)
        return signature.replace(parameters=list(signature.parameters.values())[1:])


_SIGNATURE = _Signature()


def _record_class(cls: type) -> type:
    """The record among a class and its bases (a plain subclass of one may add attributes)."""
    return next(c for c in cls.__mro__ if c.__dict__.get("__signature__") is _SIGNATURE)


def _setattr(self: Any, name: str, value: Any) -> None:
    cls: Any = _record_class(type(self))
    if type(self) is cls or name in cls.__dataclass_fields__:
        raise dataclasses.FrozenInstanceError(f"cannot assign to field {name!r}")
    super(cls, self).__setattr__(name, value)


def _delattr(self: Any, name: str) -> None:
    cls: Any = _record_class(type(self))
    if type(self) is cls or name in cls.__dataclass_fields__:
        raise dataclasses.FrozenInstanceError(f"cannot delete field {name!r}")
    super(cls, self).__delattr__(name)


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
