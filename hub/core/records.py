"""What the log hands back: an append's result, a workspace's head, a snapshot, a verify report.

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


class VerifyReport(msgspec.Struct, frozen=True):
    workspace: str
    checked: int
    head: int
    error: ChainBreak | None = None

    @property
    def ok(self) -> bool:
        return self.error is None
