"""Closing the executions a dead hub node left open, as ``failed``/``interrupted``.

An execution is accepted and run by one node: its ``execRequested`` and ``execStarted`` name
it (``payload.node``). When that node dies, nobody will ever write its ``execFinished``; the
surviving node that claimed the dead one (:mod:`hub.cluster.heartbeat`) calls
:meth:`InterruptedExecutions.close` as its ``on_node_dead`` hook, which appends, for every
execution started on the dead node and not finished since, and every one it accepted and
neither started nor finished (:func:`hub.core.rules.recovery.left_open`)::

    execFinished {execId, status: "failed", reason: "interrupted", exitCode: -1,
                  diagnostics: [{level: "error", code: "interrupted", message: "…",
                                 node: <dead node>, closedBy: <this node>}]}

— the drafts of the one recovery rule, :func:`hub.core.rules.recovery.interrupted_drafts`,
which :meth:`hub.runtime.Runtime.recover` applies on a single node after a restart — through
:class:`hub.workspaces.Workspaces` (so subscribers get it like any event), produced like every
event of an execution by the agent that asked for it (the ``execStarted``'s or
``execRequested``'s producer) and caused by (``causationId``) that event. Its event id is
derived from (workspace, execId, seq of that event), so closing twice (a claim that expired
and was taken over) writes nothing the second time: the store answers ``duplicate``; a
restart's recovery derives the same id for the same run. No stderr note is written: the
survivor does not read the run's output numbering.

An ``execRequested`` written before requests named their node (no ``payload.node``) is not
found: no node can be blamed for it.
"""

from __future__ import annotations

import contextlib
import logging
from typing import Final

import asyncpg
import msgspec

from hub.core.errors import AgoraError, Unavailable
from hub.core.events import Event, ExecRequested, ExecStarted
from hub.core.rules.recovery import (
    HUB_PRODUCER,
    Opening,
    closing_event_id,
    interrupted_drafts,
    left_open,
    node_death_interruption,
    open_execution,
)
from hub.log.codec import decode_or_skip
from hub.log.migrations import quote
from hub.workspaces import Workspaces

__all__ = ["HUB_PRODUCER", "InterruptedExecutions", "closing_event_id"]

log = logging.getLogger("agora.cluster")

_DRIVER_ERRORS: Final = (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError)


class _Sql:
    """The two reads of :meth:`InterruptedExecutions.running_on`; both find their rows through
    the partial index of migration 9 (``kind IN ('execRequested', 'execStarted',
    'execFinished')``, migration 2's extended).

    The bodies are decoded here, not with PostgreSQL's JSON operators: those refuse a whole
    document holding ``\\u0000`` anywhere, and an execution's result value may hold one. The
    byte search only narrows the candidates; the decoded payload decides."""

    def __init__(self, schema: str) -> None:
        s = quote(schema)
        self.naming = (
            f"SELECT seq, body FROM {s}.events "
            "WHERE kind IN ('execRequested', 'execStarted') AND position($1::bytea IN body) > 0 "
            "ORDER BY workspace, seq"
        )
        # Not execRequested: another node's request can only follow a finished run of its
        # id (left_open), and request bodies (source, stdin, input) are the large ones.
        self.after = (
            f"SELECT seq, body FROM {s}.events "
            "WHERE kind IN ('execStarted', 'execFinished') AND workspace = $1 AND seq > $2 "
            "ORDER BY seq"
        )


class InterruptedExecutions:
    """The ``on_node_dead`` hook that closes a dead node's open executions.

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

    async def running_on(self, node: str) -> list[Opening]:
        """The last lifecycle event of every execution ``node`` left open — its
        ``execStarted`` (not finished since), or its ``execRequested`` (neither started nor
        finished since) — by workspace and seq. Raises :class:`Unavailable`."""
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
    ) -> list[Opening]:
        needle = b'"node":' + msgspec.json.encode(node)
        lifecycle: list[Event] = []
        first: dict[str, int] = {}  # workspace -> seq of its first event naming the node
        for seq, body in await conn.fetch(self._sql.naming, needle):
            event = decode_or_skip(body, seq)
            if isinstance(event, ExecRequested | ExecStarted) and event.payload.node == node:
                lifecycle.append(event)
                first.setdefault(event.workspace, event.seq)  # (rows come by seq)
        for workspace, after in first.items():
            for seq, body in await conn.fetch(self._sql.after, workspace, after):
                event = decode_or_skip(body, seq)
                if event is not None:
                    lifecycle.append(event)
        return left_open(node, lifecycle)

    async def close(self, node: str) -> int:
        """Close every execution ``node`` left open; return how many were written now
        (executions closed by an earlier attempt are not counted). Raises what
        :meth:`running_on` and :meth:`Workspaces.publish` raise."""
        written = 0
        for opening in await self.running_on(node):
            workspace, exec_id = opening.workspace, opening.payload.exec_id
            drafts = interrupted_drafts(
                open_execution(opening), node_death_interruption(node, self.node_id)
            )
            try:
                result = await self.workspaces.publish(
                    workspace, drafts, producer=opening.producer or HUB_PRODUCER, trusted=True
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
