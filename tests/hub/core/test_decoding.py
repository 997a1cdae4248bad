"""hub.core.decoding: the nesting limit, checked against a reference depth on any JSON."""

from __future__ import annotations

import json
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hub.core.decoding import check_json_depth, check_value_depth, json_too_deep, value_too_deep
from hub.core.errors import BadRequest

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(alphabet='[]{}"\\ax,:', max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=40,
)


def reference_depth(value: Any) -> int:
    """Depth by plain recursion (fine for the small values generated here)."""
    if isinstance(value, dict):
        return 1 + max((reference_depth(v) for v in value.values()), default=0)
    if isinstance(value, list):
        return 1 + max((reference_depth(v) for v in value), default=0)
    return 0


@settings(max_examples=500)
@given(json_values, st.integers(0, 12))
def test_too_deep_agrees_with_the_reference(value: Any, limit: int) -> None:
    depth = reference_depth(value)
    text = json.dumps(value)
    assert json_too_deep(text, limit) is (depth > limit)
    assert json_too_deep(text.encode(), limit) is (depth > limit)
    assert value_too_deep(value, limit) is (depth > limit)


@settings(max_examples=300)
@given(st.binary(max_size=300), st.integers(0, 70))
def test_any_bytes_give_an_answer_never_an_exception(data: bytes, limit: int) -> None:
    assert json_too_deep(data, limit) in (True, False)


@pytest.mark.parametrize("depth", [65, 10_000, 1_000_000])
def test_very_deep_input_is_refused_without_recursion(depth: int) -> None:
    text = "[" * depth + "]" * depth
    with pytest.raises(BadRequest) as info:
        check_json_depth(text, 64)
    assert info.value.details == {"field": "$", "limit": 64}
    value: Any = []
    for _ in range(min(depth, 100_000)):
        value = [value]
    with pytest.raises(BadRequest):
        check_value_depth(value, 64, "payload")


def test_brackets_inside_strings_do_not_count() -> None:
    text = json.dumps({"s": "[" * 1000 + '\\"{' * 100})
    assert not json_too_deep(text, 1)
    check_json_depth(text, 1)


def test_typed_payloads_nest_through_their_fields() -> None:
    class Inner(msgspec.Struct):
        data: Any = None

    deep: Any = 1
    for _ in range(10):
        deep = {"k": deep}
    assert value_too_deep(Inner(data=deep), 10)
    assert not value_too_deep(Inner(data=deep), 11)
