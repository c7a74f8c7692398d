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
