"""Recording as gone the members a dead hub node left present.

Every node records presence for its own connections with its id in ``payload.node``
(:class:`hub.server.presence.Presence`). A node that dies writes no ``memberLeft`` for the
agents connected through it, so the surviving node that claimed it (:mod:`hub.cluster.heartbeat`)
calls :meth:`StrandedMembers.close` as an ``on_node_dead`` hook. For every workspace where the
dead node recorded a ``memberJoined`` it reads the workspace's presence events (migration 8's
partial index) and the nodes still alive, and :func:`hub.core.rules.presence.stranded` names
the agents present through the dead node only; each gets::

    memberLeft {agent, via, reason: "interrupted", node: <dead node>}

produced by the agent (as its own presence events are), through
:class:`hub.workspaces.Workspaces` (subscribers on every node receive it like any event). An
agent also connected through a live node stays present: nothing is written for it.

Exact under concurrency: each leave is appended with ``expectedSeq`` = the head the decision
was read at, so a ``memberJoined`` that another node commits meanwhile (the agent reconnecting
there) makes the append a ``conflict`` and the decision is taken again on the new log. Idempotent:
the leave's id is derived from (workspace, agent, dead node, the join's seq), so a second run (a
claim that expired and was taken over, racing the first) answers ``duplicate``, and a later run
finds the leave in the log and writes nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from typing import Final

import asyncpg
import msgspec

from hub.core.backoff import Backoff
from hub.core.errors import AgoraError, Conflict, Unavailable
from hub.core.rules.presence import Stranded, departures, stranded
from hub.log.codec import decode_or_skip
from hub.log.migrations import quote
from hub.workspaces import Workspaces

__all__ = ["StrandedMembers", "close_stranded"]

log = logging.getLogger("agora.cluster")

_DRIVER_ERRORS: Final = (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError)
MAX_ATTEMPTS: Final = 20
"""Decisions per workspace before the hook fails (the claim then expires and the node is
reaped again): each conflict means the workspace moved between the read and the append."""
CONFLICT_BACKOFF: Final = Backoff(initial=0.005, maximum=0.5, give_up_after=None)


class _Sql:
    def __init__(self, schema: str) -> None:
        s = quote(schema)
        # The byte search only narrows the candidates; the decoded payload decides.
        self.workspaces = (
            f"SELECT DISTINCT workspace FROM {s}.events "
            "WHERE kind = 'memberJoined' AND position($1::bytea IN body) > 0 ORDER BY workspace"
        )
        self.head = f"SELECT seq FROM {s}.heads WHERE workspace = $1"
        self.presence = (
            f"SELECT seq, body FROM {s}.events WHERE workspace = $1 "
            "AND kind IN ('memberJoined', 'memberLeft') AND seq <= $2 ORDER BY seq"
        )
        # Alive as hub.cluster.heartbeat counts it: beating, neither stopped nor claimed.
        self.alive = (
            f"SELECT node_id FROM {s}.nodes WHERE stopped_at IS NULL AND reaped_by IS NULL "
            "AND reaped_at IS NULL AND last_beat >= now() - make_interval(secs => $1)"
        )


class StrandedMembers:
    """The ``on_node_dead`` hook that records a dead node's members as gone.

    ``dsn``/``schema``: the PostgreSQL store's; ``node_id``: this (surviving) node;
    ``timeout``: the heartbeat's (a node whose beat is older is not alive).
    """

    def __init__(
        self,
        dsn: str,
        schema: str,
        workspaces: Workspaces,
        node_id: str,
        *,
        timeout: float,
        command_timeout: float = 60.0,
    ) -> None:
        self.dsn = dsn
        self.workspaces = workspaces
        self.node_id = node_id
        self.timeout = timeout
        self.command_timeout = command_timeout
        self._sql = _Sql(schema)

    async def _open(self) -> asyncpg.Connection[asyncpg.Record]:
        try:
            # A connection of its own: this runs rarely (a node died) and may read a while.
            return await asyncpg.connect(
                self.dsn, timeout=self.command_timeout, command_timeout=self.command_timeout
            )
        except _DRIVER_ERRORS as e:
            raise Unavailable(f"PostgreSQL unavailable while finding members: {e!r}") from e

    async def _read(
        self, conn: asyncpg.Connection[asyncpg.Record], workspace: str, node: str
    ) -> tuple[int, list[Stranded]]:
        """The workspace's head and the agents ``node`` strands there, as of that head."""
        try:
            head = await conn.fetchval(self._sql.head, workspace)
            alive = {r["node_id"] for r in await conn.fetch(self._sql.alive, self.timeout)}
            rows = await conn.fetch(self._sql.presence, workspace, head or 0)
        except _DRIVER_ERRORS as e:
            raise Unavailable(f"PostgreSQL unavailable while finding members: {e!r}") from e
        alive.add(self.node_id)
        decoded = (decode_or_skip(body, seq) for seq, body in rows)
        events = [event for event in decoded if event is not None]
        return int(head or 0), stranded(workspace, events, node, alive)

    async def present_through(self, node: str) -> list[Stranded]:
        """Every member ``node``'s death strands, by workspace and agent. Raises
        :class:`Unavailable`."""
        conn = await self._open()
        try:
            out: list[Stranded] = []
            for workspace in await self._candidates(conn, node):
                out.extend((await self._read(conn, workspace, node))[1])
            return out
        finally:
            with contextlib.suppress(*_DRIVER_ERRORS):
                await conn.close(timeout=self.command_timeout)

    async def _candidates(self, conn: asyncpg.Connection[asyncpg.Record], node: str) -> list[str]:
        needle = b'"node":' + msgspec.json.encode(node)
        try:
            return [r["workspace"] for r in await conn.fetch(self._sql.workspaces, needle)]
        except _DRIVER_ERRORS as e:
            raise Unavailable(f"PostgreSQL unavailable while finding members: {e!r}") from e

    async def close(self, node: str) -> int:
        """Record as gone every member ``node`` left present through it alone; return how
        many ``memberLeft`` were written now (none twice). Raises :class:`Unavailable`,
        :class:`Conflict` (a workspace that kept moving under every attempt), and what
        :meth:`Workspaces.publish` raises."""
        conn = await self._open()
        written = 0
        try:
            for workspace in await self._candidates(conn, node):
                written += await self._close_in(conn, workspace, node)
        finally:
            with contextlib.suppress(*_DRIVER_ERRORS):
                await conn.close(timeout=self.command_timeout)
        return written

    async def _close_in(
        self, conn: asyncpg.Connection[asyncpg.Record], workspace: str, node: str
    ) -> int:
        return await close_stranded(
            self.workspaces, workspace, node, lambda: self._read(conn, workspace, node)
        )


async def close_stranded(
    workspaces: Workspaces,
    workspace: str,
    node: str,
    read: Callable[[], Awaitable[tuple[int, list[Stranded]]]],
    *,
    dead: str = "dead node",
) -> int:
    """Write ``memberLeft`` for every agent ``read()`` says ``node`` strands in ``workspace``
    (with the head that was read at), each appended at the head its decision was read at; on
    a conflict (a join committed meanwhile, or the leave written already by another run) read
    and decide again, :data:`MAX_ATTEMPTS` times. Returns the leaves written now. Raises
    :class:`Conflict` when the workspace kept changing, and what :meth:`Workspaces.publish`
    raises. ``dead`` names the node in the logs (a cluster node, or a worker of ``agora serve
    --workers``: hub.server.reaper)."""
    written = 0
    for attempt in range(MAX_ATTEMPTS):
        head, members = await read()
        try:
            for member in members:
                result = await workspaces.publish(
                    workspace,
                    departures(member, node),
                    producer=member.agent,
                    expected_seq=head,
                    trusted=True,
                )
                if result.duplicate:
                    # Written by another run (our expected head is stale now): read again.
                    raise Conflict("written already", head=head)
                written += 1
                head = result.seqs[-1]
                log.warning(
                    "member %s of %s (seq %d) left with %s %s",
                    member.agent,
                    workspace,
                    head,
                    dead,
                    node,
                )
            return written
        except Conflict:
            await asyncio.sleep(CONFLICT_BACKOFF.delay(attempt))
        except AgoraError as e:
            log.error("closing the members of %s %s in %s: %s", dead, node, workspace, e)
            raise
    raise Conflict(
        f"workspace {workspace!r} kept changing while closing {dead} {node}'s members",
        head=0,
    )
