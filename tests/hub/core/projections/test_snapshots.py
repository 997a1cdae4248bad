"""Snapshots of WorkspaceState (hub/core/projections/snapshots.py)."""

from __future__ import annotations

import hashlib
from typing import Any

import msgspec
from hypothesis import given, settings

from hub.core.events import Event
from hub.core.projections.snapshots import (
    SNAPSHOT_NAME,
    SNAPSHOT_VERSION,
    decode_state,
    encode_state,
    from_snapshot,
    to_snapshot,
)
from hub.core.projections.workspace import WorkspaceState, rebuild
from hub.core.records import Snapshot
from tests.strategies import valid_histories

# The shape of WorkspaceState each SNAPSHOT_VERSION was written with. When this test fails you
# changed the state's shape: bump SNAPSHOT_VERSION and add the new fingerprint here (old
# snapshots are then ignored and rebuilt, never misread).
SHAPES = {1: "35d23d8d421d45284774145a264d549a966e735bc8b219bfda3bafa1f3099d43"}


def _shape(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _shape(v) for k, v in obj.items() if k not in ("description", "title")}
    if isinstance(obj, list):
        return [_shape(v) for v in obj]
    return obj


def shape_fingerprint() -> str:
    _, components = msgspec.json.schema_components([WorkspaceState])
    return hashlib.sha256(msgspec.json.encode(_shape(components), order="sorted")).hexdigest()


def test_state_shape_matches_the_snapshot_version() -> None:
    assert SHAPES.get(SNAPSHOT_VERSION) == shape_fingerprint(), (
        "WorkspaceState changed shape: bump SNAPSHOT_VERSION and record the new fingerprint"
    )


@settings(max_examples=100)
@given(valid_histories(max_size=40))
def test_round_trip(history: list[Event]) -> None:
    state = rebuild(history, "ws")
    assert decode_state(encode_state(state)) == state
    snap = to_snapshot(state)
    assert (snap.workspace, snap.name, snap.version, snap.seq) == (
        "ws",
        SNAPSHOT_NAME,
        SNAPSHOT_VERSION,
        state.seq,
    )
    assert from_snapshot(snap, "ws") == state


def test_unusable_snapshots_are_ignored() -> None:
    state = WorkspaceState(workspace="ws", seq=3, messages=3)
    good = to_snapshot(state)
    assert from_snapshot(good) == state
    for bad in (
        msgspec.structs.replace(good, version=SNAPSHOT_VERSION + 1),
        msgspec.structs.replace(good, name="other"),
        msgspec.structs.replace(good, body=b"\xc1garbage"),
        msgspec.structs.replace(good, body=msgspec.msgpack.encode({"workspace": 1})),
        msgspec.structs.replace(good, seq=4),  # body disagrees with the envelope
        msgspec.structs.replace(good, workspace="other"),
    ):
        assert from_snapshot(bad) is None
    assert from_snapshot(good, "elsewhere") is None


def test_snapshot_type_is_the_store_one() -> None:
    assert isinstance(to_snapshot(WorkspaceState(workspace="w")), Snapshot)
