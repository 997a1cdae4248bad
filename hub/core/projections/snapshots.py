"""Snapshots of :class:`WorkspaceState`: encode/decode to bytes. Pure.

A snapshot is a disposable cache (ARCHITECTURE.md, principle 1): loading from the newest
snapshot plus the tail of the log gives exactly the state a fold from scratch gives; deleting
every snapshot changes nothing but speed. The body is MessagePack (compact, and msgspec decodes
it straight into the typed Structs).

``SNAPSHOT_VERSION`` must be bumped whenever :class:`WorkspaceState` (or any entry Struct)
changes shape **or** :func:`~hub.core.projections.workspace.evolve` changes meaning; snapshots of
another version are ignored (and rebuilt by the next :func:`~hub.log.loading.
save_snapshot_if_due`). tests/hub/core/projections/test_snapshots.py pins the state schema's hash to
the version so a shape change without a bump fails.
"""

from __future__ import annotations

from typing import Final

import msgspec

from hub.core.projections.workspace import WorkspaceState
from hub.core.records import Snapshot

__all__ = [
    "DEFAULT_SNAPSHOT_EVERY",
    "SNAPSHOT_NAME",
    "SNAPSHOT_VERSION",
    "decode_state",
    "encode_state",
    "from_snapshot",
    "to_snapshot",
]

SNAPSHOT_NAME: Final = "workspace"
SNAPSHOT_VERSION: Final = 1
DEFAULT_SNAPSHOT_EVERY: Final = 1000
"""Events between two snapshots of a workspace (``[limits] snapshot_every``)."""

_encoder: Final = msgspec.msgpack.Encoder()
_decoder: Final = msgspec.msgpack.Decoder(WorkspaceState)


def encode_state(state: WorkspaceState) -> bytes:
    """The snapshot body of ``state`` (MessagePack)."""
    return _encoder.encode(state)


def decode_state(body: bytes) -> WorkspaceState:
    """Decode a snapshot body. Raises ``msgspec.DecodeError`` (incl. ``ValidationError``)."""
    return _decoder.decode(body)


def to_snapshot(state: WorkspaceState) -> Snapshot:
    """A :class:`~hub.log.base.Snapshot` of ``state`` at ``state.seq``, ready to save."""
    return Snapshot(
        workspace=state.workspace,
        name=SNAPSHOT_NAME,
        version=SNAPSHOT_VERSION,
        seq=state.seq,
        body=encode_state(state),
    )


def from_snapshot(snapshot: Snapshot, workspace: str | None = None) -> WorkspaceState | None:
    """The state a snapshot holds, or None if it is unusable: another name or version, a body
    that does not decode, or one whose workspace/seq disagree with the snapshot's. Never raises.
    """
    if snapshot.name != SNAPSHOT_NAME or snapshot.version != SNAPSHOT_VERSION:
        return None
    try:
        state = decode_state(snapshot.body)
    except msgspec.DecodeError:
        return None
    if state.seq != snapshot.seq or state.workspace != snapshot.workspace:
        return None
    if workspace is not None and state.workspace != workspace:
        return None
    return state
