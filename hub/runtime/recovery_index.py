"""The recovery index: what a start has to close, found without reading every log.

At start the hub closes what its predecessor left open — executions without an
``execFinished`` (:mod:`hub.runtime.recovery`) and members still present
(:meth:`hub.server.presence.Presence.recover`). Finding them by folding every workspace's log
makes start time and memory grow with history; this index names them instead: the
``(workspace, execId)`` of every execution that may be open, the ``(workspace, agent)`` of every
member that may be present, and the workspaces quarantined by the last recovery (with why).

It is derived data, kept as one snapshot of the system workspace (``recoveryIndex``, in the
store's ``snapshots`` table on SQLite and PostgreSQL alike), and it only ever says *more* than
the log: an entry is added before the event that opens it is written and removed only after
the event that closes it is durable, so a crash between the two leaves an entry whose
workspace recovery then reads and finds closed. No index (a data directory from before it, or
snapshots deleted) means one full scan, after which the index is written: it is always
rebuildable from the log.

Only a hub that has its store to itself keeps it (:meth:`RecoveryIndex.open`, called by the
composition root before recovery); on a shared store the cluster recovers dead nodes, and the
index stays closed (every method a no-op).
"""

from __future__ import annotations

import asyncio
import logging
from typing import Final

import msgspec

from hub.core.capability import SYSTEM_WORKSPACE
from hub.core.records import Snapshot
from hub.log.base import EventStore

__all__ = ["INDEX_NAME", "RecoveryIndex", "load_quarantined"]

log = logging.getLogger("agora.runtime")

INDEX_NAME: Final = "recoveryIndex"
INDEX_VERSION: Final = 1
_SEQ: Final = 0  # one row, replaced on every save


class _Body(msgspec.Struct, frozen=True, kw_only=True):
    executions: list[tuple[str, str]] = []
    members: list[tuple[str, str]] = []
    quarantined: dict[str, str] = {}
    # Written by `agora serve --workers` after its start-up recovery: its workers keep no
    # index (one snapshot row cannot be kept by several processes), so the next start of
    # any kind must scan. Such a body still holds what that recovery quarantined (each
    # worker loads it, and `agora workspaces` lists it), never executions or members.
    stale: bool = False


async def _load(store: EventStore, *, stale: bool = False) -> _Body | None:
    """The stored body (``stale``: even one marked stale), None if none or unreadable."""
    snapshot = await store.load_snapshot(SYSTEM_WORKSPACE, INDEX_NAME, INDEX_VERSION)
    if snapshot is None:
        return None
    try:
        body = msgspec.json.decode(snapshot.body, type=_Body)
    except msgspec.DecodeError:
        log.warning("the recovery index is unreadable; recovery scans every workspace")
        return None
    return None if body.stale and not stale else body


async def load_quarantined(store: EventStore) -> dict[str, str]:
    """The workspaces the last start's recovery quarantined, with why: for ``agora
    workspaces``, and for each worker of ``agora serve --workers`` (its supervisor
    recovered)."""
    body = await _load(store, stale=True)
    return dict(body.quarantined) if body is not None else {}


class RecoveryIndex:
    """The hub's recovery index (see the module docstring)."""

    def __init__(self, store: EventStore) -> None:
        self.store = store
        self.executions: set[tuple[str, str]] = set()
        self.members: set[tuple[str, str]] = set()
        self.quarantined: dict[str, str] = {}
        self.enabled = False
        self.complete = False
        """Whether the index was found: false means recovery must scan every workspace."""
        self._lock = asyncio.Lock()

    async def open(self) -> None:
        """Load the index and start keeping it (a hub with its store to itself)."""
        body = await _load(self.store)
        self.enabled = True
        self.complete = body is not None
        if body is not None:
            self.executions = set(body.executions)
            self.members = set(body.members)
            self.quarantined = dict(body.quarantined)

    def workspaces(self) -> set[str]:
        """Where recovery has to look: every workspace with an entry or quarantined before."""
        return (
            {w for w, _ in self.executions} | {w for w, _ in self.members} | set(self.quarantined)
        )

    async def save(self) -> None:
        """Write the index as it is now (one snapshot, replaced). Serialised: the last save
        holds the last state."""
        if not self.enabled:
            return
        async with self._lock:
            body = _Body(
                executions=sorted(self.executions),
                members=sorted(self.members),
                quarantined=dict(sorted(self.quarantined.items())),
            )
            snapshot = Snapshot(
                workspace=SYSTEM_WORKSPACE,
                name=INDEX_NAME,
                version=INDEX_VERSION,
                seq=_SEQ,
                body=msgspec.json.encode(body),
            )
            await self.store.save_snapshot(snapshot)

    async def invalidate(self) -> None:
        """Mark the stored index as not to be trusted (the next start scans every workspace)
        and stop keeping it: processes that do not keep it are about to write. What it
        quarantined is kept (:func:`load_quarantined`)."""
        if not self.enabled:
            return
        async with self._lock:
            body = _Body(quarantined=dict(sorted(self.quarantined.items())), stale=True)
            snapshot = Snapshot(
                workspace=SYSTEM_WORKSPACE,
                name=INDEX_NAME,
                version=INDEX_VERSION,
                seq=_SEQ,
                body=msgspec.json.encode(body),
            )
            await self.store.save_snapshot(snapshot)
            self.enabled = False

    async def opening(self, table: set[tuple[str, str]], key: tuple[str, str]) -> None:
        """Record ``key`` before the event that opens it is written."""
        if self.enabled and key not in table:
            table.add(key)
            await self.save()

    async def closed(self, table: set[tuple[str, str]], key: tuple[str, str]) -> None:
        """Forget ``key`` once the event that closes it is durable."""
        if self.enabled and key in table:
            table.discard(key)
            await self.save()
