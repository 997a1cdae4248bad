"""What the log hands back: an append's result, a workspace's head, a snapshot, a verify report,
a page of stored events joined for the replay fold.

Pure value types shared by the stores, the session and the commands; no I/O.
"""

from __future__ import annotations

import msgspec

from hub.core.chain import ChainBreak
from hub.core.events import Event


class AppendResult(msgspec.Struct, frozen=True):
    """What an append wrote, or, for a retried batch (``duplicate``), what was written before."""

    workspace: str
    events: tuple[Event, ...]
    duplicate: bool = False

    @property
    def seqs(self) -> list[int]:
        return [e.seq for e in self.events]

    @property
    def ids(self) -> list[str]:
        return [e.id for e in self.events]


class Head(msgspec.Struct, frozen=True):
    """The end of one workspace's log."""

    workspace: str
    seq: int
    hash: str
    timestamp: int
    position: int


class Snapshot(msgspec.Struct, frozen=True):
    """A disposable cache of a projection's state at ``seq`` (encoded by the projection)."""

    workspace: str
    name: str
    version: int
    seq: int
    body: bytes


class JoinedPage(msgspec.Struct, frozen=True):
    """A page of one workspace's stored events as ONE JSON array of their bodies, in seq order
    (``EventStore.read_joined``): what the replay fold decodes in one call without building
    every event (:func:`hub.core.projections.workspace.fold_stored`).

    ``count`` and ``last_seq`` are what the store counted (``last_seq`` is the ``after_seq``
    asked for when the page is empty), so a fold can check that the body holds them.
    """

    body: bytes
    count: int
    last_seq: int


class VerifyReport(msgspec.Struct, frozen=True):
    workspace: str
    checked: int
    head: int
    error: ChainBreak | None = None

    @property
    def ok(self) -> bool:
        return self.error is None
