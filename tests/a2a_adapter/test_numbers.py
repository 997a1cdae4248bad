"""Values cross exactly between events and A2A: integers stay integers (also beyond 2**53),
floats stay floats, through protobuf Value, the JSON wire and back."""

from __future__ import annotations

import json
from typing import Any

from a2a.types.a2a_pb2 import Part
from google.protobuf import json_format, struct_pb2
from hypothesis import given
from hypothesis import strategies as st

from a2a_adapter.mapping import FLOAT_KEY, INT_KEY, exact, from_a2a, plain, to_a2a
from a2a_adapter.responses import integral
from hub.core.events import WorkPublished

KEYS = st.sampled_from([INT_KEY, FLOAT_KEY, "a", "n", ""]) | st.text(max_size=5)
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.sampled_from([2.0, -0.0, 1e20, 2**53 + 1, -(2**53) - 1, 2**53])
    | st.text(max_size=8)
    | st.sampled_from(["9007199254740993", "2.0"]),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(KEYS, inner, max_size=4),
    max_leaves=20,
)


def same(a: Any, b: Any) -> bool:
    """Equal and of the same types all the way down (2 != 2.0 here)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, float):
        return repr(a) == repr(b)  # tells -0.0 from 0.0
    return bool(a == b)


def over_the_wire(value: Any) -> Any:
    """Event value → protobuf Value → the JSON a peer reads → a peer's protobuf → back."""
    pb = struct_pb2.Value()
    json_format.ParseDict(exact(value), pb)
    text = json.dumps(integral(json_format.MessageToDict(pb)))
    again = struct_pb2.Value()
    json_format.ParseDict(json.loads(text), again)
    return plain(json_format.MessageToDict(again))


@given(JSON)
def test_any_json_round_trips_exactly(value: Any) -> None:
    assert same(over_the_wire(value), value)


@given(JSON)
def test_any_json_payload_round_trips_through_an_update(value: Any) -> None:
    event = WorkPublished(correlation_id="t", payload={"value": value}, seq=3, workspace="w")
    [update] = to_a2a(event)
    wire = json.dumps(integral(json_format.MessageToDict(update)))
    back = type(update)()
    json_format.ParseDict(json.loads(wire), back)
    again = from_a2a(back)
    assert again is not None and same(again.payload, event.payload)


def test_the_wire_shows_integers_and_markers() -> None:
    part = Part()
    json_format.ParseDict({"data": exact({"two": 2, "big": 2**53 + 1, "f": 2.0})}, part)
    shown = integral(json_format.MessageToDict(part))["data"]
    assert shown == {"two": 2, "big": {INT_KEY: "9007199254740993"}, "f": {FLOAT_KEY: "2.0"}}
    assert isinstance(shown["two"], int)
