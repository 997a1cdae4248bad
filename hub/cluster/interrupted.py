"""Closing the executions a dead hub node left running, as ``failed``/``interrupted``.

An execution runs on the node that started it (``execStarted.payload.node``). When that node
dies, nobody will ever write its ``execFinished``; the surviving node that claimed the dead one
(:mod:`hub.cluster.heartbeat`) calls :meth:`InterruptedExecutions.close` as its
``on_node_dead`` hook, which appends, for every execution started on the dead node and not
finished since::

    execFinished {execId, status: "failed", reason: "interrupted", exitCode: -1,
                  diagnostics: [{level: "error", code: "interrupted", message: "…",
                                 node: <dead node>, closedBy: <this node>}]}

— the drafts of the one recovery rule, :func:`hub.core.rules.recovery.interrupted_drafts`,
which :meth:`hub.runtime.Runtime.recover` applies on a single node after a restart — through
:class:`hub.workspaces.Workspaces` (so subscribers get it like any event), produced like every
event of an execution by the agent that asked for it (the ``execStarted``'s producer) and caused
by (``causationId``) the ``execStarted``. Its event id is derived from (workspace, execId, seq
of the execStarted), so closing twice (a claim that expired and was taken over) writes nothing
the second time: the store answers ``duplicate``. No stderr note is written: the survivor does
not read the run's output numbering.

Executions requested on the dead node but not started yet are not found: ``execRequested``
does not say which node accepted it.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Final

import asyncpg
import msgspec

from hub.core.errors import AgoraError, Unavailable
from hub.core.events import ExecFinished, ExecStarted
from hub.core.rules.recovery import (
    HUB_PRODUCER,
    OpenExecution,
    closing_event_id,
    interrupted_drafts,
    node_death_interruption,
)
from hub.log.codec import decode_or_skip
from hub.log.migrations import quote
from hub.workspaces import Workspaces

__all__ = ["HUB_PRODUCER", "InterruptedExecutions", "closing_event_id"]

log = logging.getLogger("agora.cluster")

_DRIVER_ERRORS: Final = (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError)


class _Sql:
    """The two reads of :meth:`InterruptedExecutions.running_on`; both find their rows through
    the partial index of migration 2 (``kind IN ('execStarted', 'execFinished')``).

    The bodies are decoded here, not with PostgreSQL's JSON operators: those refuse a whole
    document holding ``\\u0000`` anywhere, and an execution's result value may hold one. The
    byte search only narrows the candidates; the decoded payload decides."""

    def __init__(self, schema: str) -> None:
        s = quote(schema)
        self.started = (
            f"SELECT seq, body FROM {s}.events "
            "WHERE kind = 'execStarted' AND position($1::bytea IN body) > 0 "
            "ORDER BY workspace, seq"
        )
        self.finished = (
            f"SELECT seq, body FROM {s}.events "
            "WHERE kind = 'execFinished' AND workspace = $1 AND seq > $2 ORDER BY seq"
        )


class InterruptedExecutions:
    """The ``on_node_dead`` hook that closes a dead node's running executions.

    ``dsn``/``schema``: the PostgreSQL store's; ``node_id``: this (surviving) node.
    """

    def __init__(
        self,
        dsn: str,
        schema: str,
        workspaces: Workspaces,
        node_id: str,
        *,
        command_timeout: float = 60.0,
    ) -> None:
        self.dsn = dsn
        self.workspaces = workspaces
        self.node_id = node_id
        self.command_timeout = command_timeout
        self._sql = _Sql(schema)

    async def running_on(self, node: str) -> list[ExecStarted]:
        """The ``execStarted`` of every execution started on ``node`` and not finished
        since, by workspace and seq. Raises :class:`Unavailable`."""
        conn: asyncpg.Connection[asyncpg.Record] | None = None
        try:
            # A connection of its own: this runs rarely (a node died) and may scan a while.
            conn = await asyncpg.connect(
                self.dsn, timeout=self.command_timeout, command_timeout=self.command_timeout
            )
            return await self._running_on(conn, node)
        except _DRIVER_ERRORS as e:
            raise Unavailable(f"PostgreSQL unavailable while finding executions: {e!r}") from e
        finally:
            if conn is not None:
                with contextlib.suppress(*_DRIVER_ERRORS):
                    await conn.close(timeout=self.command_timeout)

    async def _running_on(
        self, conn: asyncpg.Connection[asyncpg.Record], node: str
    ) -> list[ExecStarted]:
        needle = b'"node":' + msgspec.json.encode(node)
        running: dict[tuple[str, str], ExecStarted] = {}  # (workspace, execId) -> last start
        for seq, body in await conn.fetch(self._sql.started, needle):
            event = decode_or_skip(body, seq)
            if isinstance(event, ExecStarted) and event.payload.node == node:
                running[(event.workspace, event.payload.exec_id)] = event
        first: dict[str, int] = {}
        for (workspace, _), start in running.items():
            first[workspace] = min(first.get(workspace, start.seq), start.seq)
        for workspace, after in first.items():
            for seq, body in await conn.fetch(self._sql.finished, workspace, after):
                event = decode_or_skip(body, seq)
                if isinstance(event, ExecFinished):
                    opened = running.get((workspace, event.payload.exec_id))
                    if opened is not None and opened.seq < event.seq:
                        del running[(workspace, event.payload.exec_id)]
        return sorted(running.values(), key=lambda e: (e.workspace, e.seq))

    async def close(self, node: str) -> int:
        """Close every execution ``node`` left running; return how many were written now
        (executions closed by an earlier attempt are not counted). Raises what
        :meth:`running_on` and :meth:`Workspaces.publish` raise."""
        written = 0
        for start in await self.running_on(node):
            workspace, exec_id = start.workspace, start.payload.exec_id
            drafts = interrupted_drafts(
                OpenExecution(
                    workspace=workspace,
                    exec_id=exec_id,
                    started=True,
                    seq=start.seq,
                    event_id=start.id,
                ),
                node_death_interruption(node, self.node_id),
            )
            try:
                result = await self.workspaces.publish(
                    workspace, drafts, producer=start.producer or HUB_PRODUCER, trusted=True
                )
            except AgoraError as e:
                log.error("closing %s/%s of dead node %s: %s", workspace, exec_id, node, e)
                raise
            if not result.duplicate:
                written += 1
                log.warning(
                    "closed execution %s in %s (seq %d) of dead node %s as failed/interrupted",
                    exec_id,
                    workspace,
                    result.seqs[0],
                    node,
                )
        return written
