"""run-agent's own YAML writer: what it writes reads back through PyYAML as exactly the data
given, for generated data of every shape it writes itself, and PyYAML writes the rest."""

from __future__ import annotations

import math
from typing import Any

import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from runagent.store import yamltext

KEYS = st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,12}", fullmatch=True)
SCALARS = (
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False)
    | st.text()
    | st.sampled_from(["yes", "No", "ON", "off", "null", "~", "true", "1.5", "0x1f", "1e3", "-",
                       ".inf", "2026-11-25", "2026-11-25T02:58:49.736Z", "a: b", "#x", "'q'",
                       '"', "\\", "\u2028", "\x85", "\ufeff", "\U0001f600", "é", " lead", ""])
)  # fmt: skip
DATA: Any = st.recursive(
    st.dictionaries(KEYS, SCALARS | st.lists(SCALARS, max_size=4), min_size=1, max_size=6),
    lambda inner: st.dictionaries(KEYS, inner | SCALARS, min_size=1, max_size=4),
    max_leaves=20,
)


@settings(max_examples=400, deadline=None)
@given(DATA, st.booleans(), st.booleans())
def test_what_it_writes_reads_back_as_the_data(data: Any, unicode: bool, sort: bool) -> None:
    text = yamltext.dump(data, sort_keys=sort, allow_unicode=unicode)
    assert yaml.safe_load(text) == data
    assert yamltext.load(text) == data


def test_plain_words_stay_plain_as_pyyaml_writes_them() -> None:
    record = {"status": "completed", "reason": "done_file", "attempt": 2, "cost_usd": None,
              "usage": {"tokens_in": 10}, "flags": ["a", "b"], "ok": True}  # fmt: skip
    assert yamltext.dump(record, sort_keys=False) == yaml.safe_dump(record, sort_keys=False)


@pytest.mark.parametrize("value", [1e16, 1e-05, -2.5e300, math.inf, -math.inf])
def test_floats_read_back_as_floats(value: float) -> None:
    assert yaml.safe_load(yamltext.dump({"x": value})) == {"x": value}


def test_a_nan_reads_back_as_a_nan() -> None:
    assert math.isnan(yaml.safe_load(yamltext.dump({"x": math.nan}))["x"])


def test_what_it_does_not_write_itself_pyyaml_writes() -> None:
    for data in ({1: "a"}, {"on": 1}, {"a": [{"b": 1}]}, [1, 2], "text", {"a b": 1}):
        assert yaml.safe_load(yamltext.dump(data)) == data


def test_a_text_that_is_not_yaml_says_where() -> None:
    with pytest.raises(yamltext.YAMLSyntaxError) as caught:
        yamltext.load("a: [1, 2\nb: 3\n")
    assert caught.value.line is not None and isinstance(caught.value, ValueError)
