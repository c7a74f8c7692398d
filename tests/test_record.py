"""Frozen records behave as `@dataclass(frozen=True)` does: each check below is made on a record
and on its dataclass twin, and the two must answer alike."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

import pytest

from runagent.record import record


@record
class R:
    a: int
    b: str = "x"
    skip: list[int] = field(default_factory=list, compare=False, repr=False)
    shown_not_hashed: float = field(default=0.0, hash=False)


@dataclass(frozen=True)
class D:
    a: int
    b: str = "x"
    skip: list[int] = field(default_factory=list, compare=False, repr=False)
    shown_not_hashed: float = field(default=0.0, hash=False)


@record
class Other:
    a: int
    b: str = "x"


@record
class Empty:
    pass


@record
class One:
    only: Any


def twins(*args: Any, **kwargs: Any) -> tuple[R, D]:
    return R(*args, **kwargs), D(*args, **kwargs)


def test_equality_and_hash_follow_the_compared_fields() -> None:
    (r1, d1), (r2, d2) = twins(1, "y", [1]), twins(1, "y", [2])
    assert (r1 == r2) is (d1 == d2) is True  # `skip` is not compared
    assert (r1 != twins(2)[0]) is (d1 != twins(2)[1]) is True
    assert hash(r1) == hash(r2) and hash(d1) == hash(d2)
    assert hash(R(1, "y", shown_not_hashed=1.0)) == hash(R(1, "y", shown_not_hashed=2.0))
    assert R(1, "y", shown_not_hashed=1.0) != R(1, "y", shown_not_hashed=2.0)
    assert {r1, r2} == {r1} and len({R(1), R(1), R(2)}) == 2


def test_a_record_equals_no_other_class() -> None:
    assert R(1) != Other(1) and Other(1) != R(1)
    assert R(1) != (1, "x") and R(1).__eq__(object()) is NotImplemented


def test_the_same_object_in_a_field_is_equal_to_itself_as_in_a_tuple() -> None:
    nan = math.nan
    assert One(nan) == One(nan) and D(1, shown_not_hashed=nan) == D(1, shown_not_hashed=nan)
    assert R(1, shown_not_hashed=nan) == R(1, shown_not_hashed=nan)
    assert Empty() == Empty() and hash(Empty()) == hash(Empty())


def test_repr_reads_as_the_generated_one() -> None:
    r, d = twins(1, "y", [1], 2.5)
    assert repr(r).replace("R(", "D(", 1) == repr(d) == "D(a=1, b='y', shown_not_hashed=2.5)"
    loop = One([])
    loop.only.append(loop)
    assert repr(loop) == "One(only=[...])"


def test_frozen_and_a_dataclass_to_the_library() -> None:
    r = R(1)
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.a = 2  # type: ignore[misc]
    assert dataclasses.replace(r, a=2) == R(2)
    assert [f.name for f in dataclasses.fields(r)] == ["a", "b", "skip", "shown_not_hashed"]
    assert dataclasses.asdict(r) == {"a": 1, "b": "x", "skip": [], "shown_not_hashed": 0.0}


def both(body: str) -> tuple[Any, Any]:
    """The class `body` defines as a record and as a frozen dataclass, defined here and now (so
    neither has made an instance yet), named alike."""
    made = []
    for decorator in (record, dataclass(frozen=True)):
        space: dict[str, Any] = {"field": field, "ClassVar": Any}
        exec(f"class C:\n{body}", space)
        made.append(decorator(space["C"]))
    return made[0], made[1]


SHAPES = '''    """Each kind of field dataclasses knows, but for InitVar."""
    a: int
    b: list = field(default_factory=list)
    c: str = field(default="c", init=False)
    d: list = field(default_factory=lambda: [1], init=False)
    e: int = field(default=5, kw_only=True)
    g: int = field(kw_only=True)
    seen: list = field(default_factory=list, compare=False)

    def __post_init__(self):
        self.seen.append("post")
'''


def test_init_signature_and_its_errors_are_dataclasses_own() -> None:
    import inspect

    r, d = both(SHAPES)
    assert str(inspect.signature(r)) == str(inspect.signature(d))  # before any instance
    for args, kwargs in (((), {"g": 1}), ((1,), {}), ((1, [], [], 4), {"g": 1}), ((1,), {"x": 1})):
        errors = []
        for cls in (r, d):
            with pytest.raises(TypeError) as caught:
                cls(*args, **kwargs)
            errors.append(str(caught.value))
        assert errors[0] == errors[1], errors
    made = [cls(1, g=2) for cls in (r, d)]
    assert [dataclasses.astuple(m) for m in made] == [(1, [], "c", [1], 5, 2, ["post"])] * 2
    assert made[0] == r(1, g=2) and made[0].b is not r(1, g=2).b  # a new list each time
    assert str(inspect.signature(r)) == str(inspect.signature(d))  # and after
    assert r.__init__.__qualname__ == d.__init__.__qualname__ == "C.__init__"
    assert r.__init__.__annotations__ == d.__init__.__annotations__
    assert r.__match_args__ == d.__match_args__ and r.__dataclass_params__.frozen


def test_frozen_as_the_generated_methods_are() -> None:
    r, d = both('    """A record."""\n    a: int = 0\n')
    for cls in (r, d):
        obj = cls()
        with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'a'"):
            obj.a = 1
        with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'z'"):
            obj.z = 1
        with pytest.raises(dataclasses.FrozenInstanceError, match="cannot delete field 'a'"):
            del obj.a
        sub = type("Sub", (cls,), {})()  # a plain subclass may add attributes, not fields
        sub.z = 1
        assert sub.z == 1 and sub == type(sub)() and repr(sub).endswith("(a=0)")
        with pytest.raises(dataclasses.FrozenInstanceError, match="cannot assign to field 'a'"):
            sub.a = 1


def test_a_class_dataclasses_must_make_whole_is_still_one() -> None:
    for body in (
        "    a: int = 0\n",  # no docstring: dataclasses writes one from the signature
        '    """A record."""\n    a: int = 0\n    n: ClassVar = 3\n',
    ):
        r, d = both(body)
        assert r.__doc__ == d.__doc__ and r(2).a == d(2).a == 2 and r().a == 0
    with pytest.raises(TypeError, match="non-default argument 'b' follows default argument"):
        both('    """A record."""\n    a: int = 0\n    b: int\n')


def test_the_shared_init_builds_as_the_compiled_one_then_gives_way_to_it() -> None:
    from runagent import record as records

    r, d = both(SHAPES)
    calls = [((1,), {"g": 2}), ((1, [5]), {"e": 7, "g": 8}), ((), {"a": 1, "g": 2, "b": [3]})]
    for args, kwargs in calls:  # bound by the shared __init__: no __init__ compiled yet
        made, twin = r(*args, **kwargs), d(*args, **kwargs)
        assert dataclasses.astuple(made) == dataclasses.astuple(twin)
        assert made.seen == twin.seen == ["post"] and made.b is not r(1, g=2).b
    assert getattr(r.__dict__["__init__"], "record_stand_in", False)
    with pytest.raises(TypeError) as caught:
        r(1)  # handed to the compiled __init__, which refuses it
    assert str(caught.value) == "C.__init__() missing 1 required keyword-only argument: 'g'"
    assert not getattr(r.__dict__["__init__"], "record_stand_in", False)
    r2, _ = both(SHAPES)
    for n in range(records.SHARED_INIT_CALLS + 1):
        assert r2(n, g=n).a == n
    assert not getattr(r2.__dict__["__init__"], "record_stand_in", False)  # built often: its own
