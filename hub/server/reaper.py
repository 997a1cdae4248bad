"""Closing in the log what a dead worker of ``agora serve --workers N`` left open (SQLite).

Every worker runs under a node id of its own, minted by the supervisor for each start of it
(``--worker-node``, :mod:`hub.server.supervisor`): its presence events carry it
(``memberJoined.payload.node``, :class:`hub.server.presence.Presence`) and so do the
executions it accepts and starts (``execRequested.payload.node``,
``execStarted.payload.node``). A worker killed with SIGKILL writes
neither its members' ``memberLeft`` nor its executions' ``execFinished``; before starting it
again, the supervisor calls :meth:`WorkerReaper.close` with the dead incarnation's id, which
writes what a surviving cluster node writes for a dead node (:mod:`hub.cluster.interrupted`,
:mod:`hub.cluster.members`), from the same pure rules:

- every execution started on it and not finished since, and every one it accepted and
  neither started nor finished (:func:`hub.core.rules.recovery.left_open`):
  ``execFinished {status: "failed", reason: "interrupted", diagnostics: [{code:
  "interrupted", node: <dead worker>, closedBy: <supervisor>}]}``
  (:func:`hub.core.rules.recovery.interrupted_drafts` with
  :func:`~hub.core.rules.recovery.node_death_interruption`), produced by the agent that
  asked for it;
- every member present through it alone (:func:`hub.core.rules.presence.stranded`):
  ``memberLeft {reason: "interrupted", node: <dead worker>}``, produced by the agent.

Both through a :class:`hub.workspaces.Workspaces` of the supervisor's own over its store (the
file's one writer, which the workers hand their writes to: :mod:`hub.log.handoff`): the
workers' followers deliver the events to their subscribers, and a client of the dead worker
reads them when it resumes on the restarted one. The ids are derived as the cluster derives
them, so a second run writes nothing (``duplicate``). Each leave is appended at the head its
decision was read at (``expectedSeq``), so a join committed meanwhile makes it a conflict and
the decision is taken again.

As on the cluster, an ``execRequested`` written before requests named their node is not
found. Only on SQLite: on PostgreSQL every worker is a cluster node and the cluster reaps it.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Collection
from typing import Final

import msgspec

from hub.cluster.members import close_stranded
from hub.config import LimitsConfig
from hub.core.errors import Conflict
from hub.core.events import Event, ExecRequested, ExecStarted
from hub.core.rules.presence import Stranded, stranded
from hub.core.rules.recovery import (
    HUB_PRODUCER,
    interrupted_drafts,
    left_open,
    node_death_interruption,
    open_execution,
)
from hub.log.codec import decode_or_skip
from hub.log.handoff import CALL_TIMEOUT_S, HandoffServer
from hub.log.sqlite import SqliteEventStore
from hub.workspaces import Workspaces

__all__ = ["Reaped", "WorkerReaper"]

log = logging.getLogger("agora.server")

_PRESENCE: Final = ("memberJoined", "memberLeft")
_NAMING: Final = ("execRequested", "execStarted")  # the lifecycle events that name a node
_AFTER: Final = ("execStarted", "execFinished")


class Reaped(msgspec.Struct, frozen=True):
    """What one :meth:`WorkerReaper.close` wrote: executions closed, members gone."""

    executions: int = 0
    members: int = 0


class WorkerReaper:
    """Closes what a dead worker left open (module doc). ``store``: the supervisor's store of
    the workers' file, open while the workers run (the file's one writer, which ``handoff``
    serves to the workers: :mod:`hub.log.handoff`); ``limits``: the hub's (the drafts'
    limits); ``closed_by``: the id the closing events name as their writer."""

    def __init__(
        self,
        store: SqliteEventStore,
        limits: LimitsConfig,
        closed_by: str,
        handoff: HandoffServer | None = None,
    ) -> None:
        self.store = store
        self.limits = limits
        self.closed_by = closed_by
        self.handoff = handoff

    async def close(self, node: str, alive: Collection[str], pid: int | None = None) -> Reaped:
        """Close the executions ``node`` left running and record as gone the members it
        left present; ``alive``: the nodes of the workers still running (a member present
        through one of them stays). ``pid``: the dead worker's process, whose last writes
        (still in the handoff's socket when it died) are written first, so that the scan
        sees them (waited for up to :data:`hub.log.handoff.CALL_TIMEOUT_S`, then logged).
        Raises what the store and :meth:`Workspaces.publish` raise."""
        if self.handoff is not None and pid is not None:
            try:
                async with asyncio.timeout(CALL_TIMEOUT_S):
                    await self.handoff.drained(pid)
            except TimeoutError:
                log.error("the last writes of dead worker %s are still being written", node)
        store = self.store
        workspaces = Workspaces(
            store,
            limits=self.limits.draft_limits(),
            snapshot_every=self.limits.snapshot_every,
        )
        try:
            executions = await self._executions(store, workspaces, node)
            members = await self._members(store, workspaces, node, {*alive, self.closed_by})
        finally:
            await workspaces.aclose()
        return Reaped(executions=executions, members=members)

    async def _executions(self, store: SqliteEventStore, workspaces: Workspaces, node: str) -> int:
        needle = b'"node":' + msgspec.json.encode(node)
        lifecycle: list[Event] = []
        first: dict[str, int] = {}  # workspace -> seq of its first event naming the node
        for _, seq, body in await store.read_kinds(_NAMING, containing=needle):
            event = decode_or_skip(body, seq)
            if isinstance(event, ExecRequested | ExecStarted) and event.payload.node == node:
                lifecycle.append(event)
                first[event.workspace] = min(first.get(event.workspace, event.seq), event.seq)
        for workspace in sorted(first):
            # Not execRequested: another node's can only follow a finished run (left_open).
            for _, seq, body in await store.read_kinds(_AFTER, workspace=workspace):
                later = decode_or_skip(body, seq)
                if later is not None and later.seq > first[workspace]:
                    lifecycle.append(later)
        written = 0
        why = node_death_interruption(node, self.closed_by)
        for opening in left_open(node, lifecycle):
            run = open_execution(opening)
            result = await workspaces.publish(
                opening.workspace,
                interrupted_drafts(run, why),
                producer=opening.producer or HUB_PRODUCER,
                trusted=True,
            )
            if not result.duplicate:
                written += 1
                log.warning(
                    "closed execution %s in %s (seq %d) of dead worker %s as failed/interrupted",
                    run.exec_id,
                    run.workspace,
                    result.seqs[0],
                    node,
                )
        return written

    async def _members(
        self, store: SqliteEventStore, workspaces: Workspaces, node: str, alive: set[str]
    ) -> int:
        needle = b'"node":' + msgspec.json.encode(node)
        joined = await store.read_kinds(["memberJoined"], containing=needle)
        written = 0
        for workspace in sorted({w for w, _, _ in joined}):
            written += await self._members_in(store, workspaces, workspace, node, alive)
        return written

    async def _members_in(
        self,
        store: SqliteEventStore,
        workspaces: Workspaces,
        workspace: str,
        node: str,
        alive: set[str],
    ) -> int:
        async def read() -> tuple[int, list[Stranded]]:
            head = await store.head(workspace)
            at = head.seq if head is not None else 0
            events: list[Event] = []
            for _, seq, body in await store.read_kinds(_PRESENCE, workspace=workspace):
                event = decode_or_skip(body, seq)
                if event is not None and event.seq <= at:
                    events.append(event)
            return at, stranded(workspace, events, node, alive)

        try:
            return await close_stranded(workspaces, workspace, node, read, dead="dead worker")
        except Conflict as e:  # kept changing: the next start's recovery closes them
            log.error("%s", e.message)
            return 0
