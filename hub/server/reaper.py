"""Closing in the log what a dead worker of ``agora serve --workers N`` left open (SQLite).

Every worker runs under a node id of its own, minted by the supervisor for each start of it
(``--worker-node``, :mod:`hub.server.supervisor`): its presence events carry it
(``memberJoined.payload.node``, :class:`hub.server.presence.Presence`) and so do the
executions it starts (``execStarted.payload.node``). A worker killed with SIGKILL writes
neither its members' ``memberLeft`` nor its executions' ``execFinished``; before starting it
again, the supervisor calls :meth:`WorkerReaper.close` with the dead incarnation's id, which
writes what a surviving cluster node writes for a dead node (:mod:`hub.cluster.interrupted`,
:mod:`hub.cluster.members`), from the same pure rules:

- every execution started on it and not finished since:
  ``execFinished {status: "failed", reason: "interrupted", diagnostics: [{code:
  "interrupted", node: <dead worker>, closedBy: <supervisor>}]}``
  (:func:`hub.core.rules.recovery.interrupted_drafts` with
  :func:`~hub.core.rules.recovery.node_death_interruption`), produced by the agent that
  asked for it;
- every member present through it alone (:func:`hub.core.rules.presence.stranded`):
  ``memberLeft {reason: "interrupted", node: <dead worker>}``, produced by the agent.

Both through a :class:`hub.workspaces.Workspaces` of the supervisor's own over the shared
file, like ``agora append`` from another process: the workers' followers deliver the events
to their subscribers, and a client of the dead worker reads them when it resumes on the
restarted one. The ids are derived as the cluster derives them, so a second run writes
nothing (``duplicate``). Each leave is appended at the head its decision was read at
(``expectedSeq``), so a join committed meanwhile makes it a conflict and the decision is taken
again.

Executions requested on the dead worker but not started are not found (``execRequested``
names no node), as on the cluster. Only on SQLite: on PostgreSQL every worker is a cluster
node and the cluster reaps it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection
from typing import Final

import msgspec

from hub.cluster.members import close_stranded
from hub.config import LimitsConfig
from hub.core.errors import Conflict
from hub.core.events import Event, ExecFinished, ExecStarted
from hub.core.rules.presence import Stranded, stranded
from hub.core.rules.recovery import (
    HUB_PRODUCER,
    OpenExecution,
    interrupted_drafts,
    node_death_interruption,
)
from hub.log.codec import decode_or_skip
from hub.log.sqlite import SqliteEventStore
from hub.workspaces import Workspaces

__all__ = ["Reaped", "WorkerReaper"]

log = logging.getLogger("agora.server")

_PRESENCE: Final = ("memberJoined", "memberLeft")


class Reaped(msgspec.Struct, frozen=True):
    """What one :meth:`WorkerReaper.close` wrote: executions closed, members gone."""

    executions: int = 0
    members: int = 0


class WorkerReaper:
    """Closes what a dead worker left open (module doc). ``open_store``: a new, unopened
    store over the workers' file (one per call: a worker dies rarely, and the supervisor
    holds no store meanwhile); ``limits``: the hub's (the drafts' limits);
    ``closed_by``: the id the closing events name as their writer."""

    def __init__(
        self,
        open_store: Callable[[], SqliteEventStore],
        limits: LimitsConfig,
        closed_by: str,
    ) -> None:
        self.open_store = open_store
        self.limits = limits
        self.closed_by = closed_by

    async def close(self, node: str, alive: Collection[str]) -> Reaped:
        """Close the executions ``node`` left running and record as gone the members it
        left present; ``alive``: the nodes of the workers still running (a member present
        through one of them stays). Raises what the store and :meth:`Workspaces.publish`
        raise."""
        store = self.open_store()
        async with store:
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
        running: dict[tuple[str, str], ExecStarted] = {}  # (workspace, execId) -> last start
        for _, seq, body in await store.read_kinds(["execStarted"], containing=needle):
            event = decode_or_skip(body, seq)
            if isinstance(event, ExecStarted) and event.payload.node == node:
                running[(event.workspace, event.payload.exec_id)] = event
        for workspace in sorted({w for w, _ in running}):
            for _, seq, body in await store.read_kinds(["execFinished"], workspace=workspace):
                finished = decode_or_skip(body, seq)
                if isinstance(finished, ExecFinished):
                    opened = running.get((workspace, finished.payload.exec_id))
                    if opened is not None and opened.seq < finished.seq:
                        del running[(workspace, finished.payload.exec_id)]
        written = 0
        why = node_death_interruption(node, self.closed_by)
        for start in sorted(running.values(), key=lambda e: (e.workspace, e.seq)):
            run = OpenExecution(
                workspace=start.workspace,
                exec_id=start.payload.exec_id,
                started=True,
                seq=start.seq,
                event_id=start.id,
            )
            result = await workspaces.publish(
                start.workspace,
                interrupted_drafts(run, why),
                producer=start.producer or HUB_PRODUCER,
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
