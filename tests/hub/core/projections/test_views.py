"""The fold's views of stored events (hub/core/projections/views.py): one per kind, each a
subset of its event with the same names, types and defaults, decoding what the event holds.

That the views fold to the same state as the events is tested beside the fold
(tests/hub/core/projections/test_workspace.py, ``fold_stored``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings

from hub.core.events import KINDS, Event, decode_event, encode_event
from hub.core.projections.views import VIEWS, EventView, decode_views
from tests.strategies import valid_histories

GOLDEN = Path(__file__).resolve().parents[3] / "fixtures" / "events.jsonl"


def _fields(cls: type[Any]) -> dict[str, msgspec.structs.FieldInfo]:
    return {f.encode_name: f for f in msgspec.structs.fields(cls)}


def test_every_kind_has_its_view() -> None:
    assert set(VIEWS) == set(KINDS)
    for kind, view in VIEWS.items():
        assert view.kind == kind
        assert view.__struct_config__.tag == kind


def _check_subset(view: type[Any], full: type[Any], where: str) -> None:
    """Every field of ``view`` is one of ``full``'s, under the same JSON name, with the same
    default; a nested view is checked the same way against the full nested Struct."""
    mine, theirs = _fields(view), _fields(full)
    for name, field in mine.items():
        assert name in theirs, f"{where}: {name} is not a field of {full.__name__}"
        other = theirs[name]
        assert field.required == other.required, f"{where}.{name}"
        assert field.default == other.default, f"{where}.{name}"
        if field.type is other.type or field.type == other.type:
            continue
        assert isinstance(field.type, type) and isinstance(other.type, type), f"{where}.{name}"
        assert issubclass(field.type, msgspec.Struct), f"{where}.{name}: {field.type}"
        _check_subset(field.type, other.type, f"{where}.{name}")


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_a_view_is_a_subset_of_its_event(kind: str) -> None:
    _check_subset(VIEWS[kind], KINDS[kind], kind)


def _same_fields(view: Any, full: Any) -> None:
    for field in msgspec.structs.fields(view):
        mine, theirs = getattr(view, field.name), getattr(full, field.name)
        if isinstance(mine, msgspec.Struct) and type(mine) is not type(theirs):
            _same_fields(mine, theirs)
        else:
            assert mine == theirs, field.name


def test_the_golden_events_decode_to_views_of_themselves() -> None:
    lines = GOLDEN.read_bytes().splitlines()
    views = decode_views(b"[" + b",".join(lines) + b"]")
    assert {v.kind for v in views} == set(KINDS)  # one of every kind
    for view, line in zip(views, lines, strict=True):
        event = decode_event(line)
        assert type(view) is VIEWS[event.kind]
        _same_fields(view, event)


@settings(max_examples=100)
@given(valid_histories(max_size=40))
def test_stored_events_decode_to_views_of_themselves(history: list[Event]) -> None:
    views = decode_views(b"[" + b",".join(map(encode_event, history)) + b"]")
    assert len(views) == len(history)
    for view, event in zip(views, history, strict=True):
        assert isinstance(view, EventView)
        _same_fields(view, event)


@pytest.mark.parametrize(
    "body",
    [
        b'[{"kind":"noSuchKind","seq":1}]',  # a kind this version does not know
        b'[{"kind":"messagePosted","seq":"1"}]',  # the seq, which every fold reads
        b'[{"kind":"memberJoined","seq":1,"payload":{}}]',  # a required field it reads
        b'[{"kind":"execFinished","seq":1,"payload":{"execId":"e","status":"odd","reason":""}}]',
        b'[{"kind":"messagePosted","seq":1,"payload":{"text":"cut',  # not JSON
    ],
)
def test_what_the_fold_reads_is_still_checked(body: bytes) -> None:
    with pytest.raises((msgspec.DecodeError, msgspec.ValidationError)):
        decode_views(body)
