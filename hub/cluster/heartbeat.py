"""The heartbeat: which hub nodes sharing a PostgreSQL log are alive, and who cleans up after
the dead ones.

Every node owns one row of the schema's ``nodes`` table (migration 2, hub/log/migrations.py):
``node_id``, ``started_at``, ``last_beat``, ``stopped_at`` and the reaping columns. It moves
``last_beat`` to the database's ``now()`` every ``interval`` seconds over a dedicated connection
(a busy pool never delays a beat; the database's clock is the only one compared, so nodes'
clocks need not agree). A node is **dead** when its last beat is older than ``timeout``, or
when it stopped (``stopped_at``), and it has not been reaped yet.

Reaping, exactly once. Every ``interval`` each live node tries to *claim* one dead node:

    UPDATE nodes SET reaped_by = me, reap_claimed_at = now()
    WHERE node_id = (SELECT … dead, unclaimed or claim older than the lease
                     ORDER BY last_beat LIMIT 1 FOR UPDATE SKIP LOCKED)

The row lock makes the claim atomic: of several survivors, exactly one gets the row. The
claimer runs the ``on_node_dead`` hooks (hub.cluster.interrupted closes the dead node's running
executions, hub.cluster.members records the members present through it alone as gone) and then
sets ``reaped_at``. A claimer that dies half-way leaves a claim that
expires after ``claim_lease`` seconds, and another survivor runs the hooks again, so hooks must
be idempotent (both hooks write events with deterministic ids: a second run answers
``duplicate`` and writes nothing).

A node only claims while it is alive itself (its own beat within the timeout, its row not
claimed): a node resuming from a long pause beats before it may declare anyone dead, so two
nodes cannot declare each other dead.

A node that finds its own row claimed or reaped (it was paused or cut off for longer than the
timeout) has been declared dead (*fenced*): it logs an error and tells ``on_fenced`` once. The
hub then stops (hub.server.app: its clients move to other nodes, the process exits with
code 75 for its supervisor to start it afresh, docs/operations.md): the survivor
that claimed it closes its executions and members, so nothing it serves any longer is
recorded, and a restarted process registers as a live node again.

Reaped rows are deleted after ``retention`` (a day by default), so the table stays small.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, Final

import asyncpg
import msgspec

from hub.core.backoff import Backoff
from hub.core.errors import Unavailable
from hub.log.migrations import quote

__all__ = ["Heartbeat", "NodeHook", "NodeInUse", "NodeInfo"]

log = logging.getLogger("agora.cluster")

DEFAULT_INTERVAL_S: Final = 2.0
DEFAULT_TIMEOUT_S: Final = 10.0
DEFAULT_CLAIM_LEASE_S: Final = 60.0
DEFAULT_RETENTION_S: Final = 86400.0
BEAT_BACKOFF: Final = Backoff(initial=0.1, maximum=5.0, give_up_after=None)

_DRIVER_ERRORS: Final = (asyncpg.PostgresError, asyncpg.InterfaceError, OSError, TimeoutError)

NodeHook = Callable[[str], Awaitable[object]]
"""``on_node_dead`` hook: awaited with the dead node's id by the one survivor that claimed it."""


class NodeInfo(msgspec.Struct, frozen=True):
    """One row of ``nodes``."""

    node_id: str
    started_at: datetime.datetime
    last_beat: datetime.datetime
    stopped_at: datetime.datetime | None = None
    reaped_by: str | None = None
    reaped_at: datetime.datetime | None = None


class NodeInUse(Unavailable):
    """Another running node already uses this node id (its beat is fresh)."""


class _Sql:
    def __init__(self, schema: str) -> None:
        n = f"{quote(schema)}.nodes"
        columns = "node_id, started_at, last_beat, stopped_at, reaped_by, reaped_at"
        dead = (
            "reaped_at IS NULL AND node_id <> $1 AND (stopped_at IS NOT NULL "
            "OR last_beat < now() - make_interval(secs => $2))"
        )
        # register(): the row a previous process with this id left (locked), whether it still
        # beats, a claim on it by its successor, then the fresh row.
        self.previous = f"SELECT {columns} FROM {n} WHERE node_id = $1 FOR UPDATE"
        self.register = f"""
            INSERT INTO {n} AS n (node_id) VALUES ($1)
            ON CONFLICT (node_id) DO UPDATE
            SET started_at = now(), last_beat = now(), stopped_at = NULL, reaped_by = NULL,
                reap_claimed_at = NULL, reaped_at = NULL, url = NULL
        """
        # A live twin: beating, not stopped, not claimed. A process declared dead (claimed)
        # may still beat until it stops; its restart under the same id is no twin.
        self.fresh = (
            f"SELECT last_beat >= now() - make_interval(secs => $2) AND stopped_at IS NULL "
            f"AND reaped_by IS NULL AND reaped_at IS NULL FROM {n} WHERE node_id = $1"
        )
        self.claim_own = (
            f"UPDATE {n} SET reaped_by = $1, reap_claimed_at = now() WHERE node_id = $1"
        )
        self.beat = (
            f"UPDATE {n} SET last_beat = now() WHERE node_id = $1 "
            "RETURNING reaped_by IS NOT NULL OR reaped_at IS NOT NULL"
        )
        self.stop = f"UPDATE {n} SET stopped_at = now() WHERE node_id = $1 AND reaped_by IS NULL"
        self.nodes = f"SELECT {columns} FROM {n} ORDER BY started_at, node_id"
        self.dead = f"SELECT {columns} FROM {n} WHERE {dead} ORDER BY last_beat, node_id"
        # Only a claimer that is alive itself (its own beat within the timeout, not stopped,
        # not claimed): a node resuming from a pause longer than the timeout would otherwise
        # claim the nodes that were beating all along before its own first beat is seen, and
        # two such nodes could declare each other dead.
        self.claim = f"""
            UPDATE {n} SET reaped_by = $1, reap_claimed_at = now()
            WHERE node_id = (
                SELECT node_id FROM {n}
                WHERE {dead}
                  AND (reaped_by IS NULL OR reap_claimed_at < now() - make_interval(secs => $3))
                  AND EXISTS (
                    SELECT 1 FROM {n} AS me
                    WHERE me.node_id = $1 AND me.stopped_at IS NULL AND me.reaped_by IS NULL
                      AND me.reaped_at IS NULL
                      AND me.last_beat >= now() - make_interval(secs => $2)
                  )
                ORDER BY last_beat, node_id
                LIMIT 1
                FOR UPDATE SKIP LOCKED
            )
            RETURNING node_id, stopped_at IS NOT NULL AS stopped
        """
        self.reaped = (
            f"UPDATE {n} SET reaped_at = now() WHERE node_id = $1 AND reaped_by = $2 "
            "AND reaped_at IS NULL"
        )
        self.prune = f"DELETE FROM {n} WHERE reaped_at < now() - make_interval(secs => $1)"
        # The nodes alive now that others can reach ([cluster] owners, hub.server.workers.
        # NodePlacement): beating within the timeout, not stopped, not claimed, with a URL
        # (set once serving).
        self.set_url = f"UPDATE {n} SET url = $2 WHERE node_id = $1"
        self.live = (
            f"SELECT node_id, url FROM {n} WHERE url IS NOT NULL AND stopped_at IS NULL "
            "AND reaped_by IS NULL AND reaped_at IS NULL "
            "AND last_beat >= now() - make_interval(secs => $1) ORDER BY node_id"
        )
        # Seconds since each running node's last beat, on the database's clock (the metrics).
        self.lags = (
            f"SELECT node_id, extract(epoch FROM now() - last_beat)::float8 AS lag FROM {n} "
            "WHERE stopped_at IS NULL AND reaped_at IS NULL ORDER BY node_id"
        )


def _info(row: asyncpg.Record) -> NodeInfo:
    return NodeInfo(
        node_id=row["node_id"],
        started_at=row["started_at"],
        last_beat=row["last_beat"],
        stopped_at=row["stopped_at"],
        reaped_by=row["reaped_by"],
        reaped_at=row["reaped_at"],
    )


class Heartbeat:
    """This node's heartbeat in ``<schema>.nodes`` and the reaping of dead nodes.

    ``dsn``/``schema``: the PostgreSQL store's (the schema must be migrated: the store does it
    when it opens). Call :meth:`register` once (before serving), then :meth:`run` until
    cancelled, then :meth:`stop`. ``interval``: seconds between beats and between looks for
    dead nodes; ``timeout``: a beat older than this means dead (keep it several intervals);
    ``claim_lease``: how long a claim on a dead node protects it from other survivors.
    """

    def __init__(
        self,
        dsn: str,
        schema: str,
        node_id: str,
        *,
        interval: float = DEFAULT_INTERVAL_S,
        timeout: float = DEFAULT_TIMEOUT_S,
        claim_lease: float = DEFAULT_CLAIM_LEASE_S,
        retention: float = DEFAULT_RETENTION_S,
        command_timeout: float = 10.0,
    ) -> None:
        if not 0 < interval < timeout:
            raise ValueError("need 0 < interval < timeout")
        if claim_lease <= 0 or retention <= 0 or command_timeout <= 0:
            raise ValueError("claim_lease, retention and command_timeout must be > 0")
        self.dsn = dsn
        self.schema = schema
        self.node_id = node_id
        self.interval = interval
        self.timeout = timeout
        self.claim_lease = claim_lease
        self.retention = retention
        self.command_timeout = command_timeout
        self._sql = _Sql(schema)
        self._hooks: list[NodeHook] = []
        self._conn: asyncpg.Connection[asyncpg.Record] | None = None
        self._lock = asyncio.Lock()  # one statement at a time on the dedicated connection
        self.fenced = False  # another node declared this one dead
        # Told (node id, seconds since its last beat) of every running node once an interval,
        # after the reaping (the hub's agora_cluster_heartbeat_lag_seconds); None: not asked.
        self.on_lags: Callable[[list[tuple[str, float]]], None] | None = None
        self.reaped: list[str] = []  # nodes this one reaped (for tests and logs)
        # Told the live nodes that can be reached, {node id: url}, after every beat (and
        # after publish_url): the owners' view of the cluster (hub.server.workers).
        self.on_live: Callable[[dict[str, str]], None] | None = None
        # Told once, on the loop, when a beat finds this node declared dead (fenced).
        self.on_fenced: Callable[[], None] | None = None

    def on_node_dead(self, hook: NodeHook) -> None:
        """Run ``hook(node_id)`` for each dead node this node claims (see the module
        docstring). Hooks run in registration order; one that raises leaves the claim to
        expire, so the node is reaped again later (by any survivor)."""
        self._hooks.append(hook)

    # -- the connection -------------------------------------------------------------------------

    async def _connect(self) -> asyncpg.Connection[asyncpg.Record]:
        conn = self._conn
        if conn is not None and not conn.is_closed():
            return conn
        self._conn = None
        conn = await asyncpg.connect(
            self.dsn,
            timeout=self.command_timeout,
            command_timeout=self.command_timeout,
            server_settings={"application_name": f"agora-node:{self.node_id}"[:63]},
        )
        self._conn = conn
        return conn

    def _drop(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.terminate()

    @contextlib.asynccontextmanager
    async def _connection(self, doing: str) -> AsyncIterator[asyncpg.Connection[asyncpg.Record]]:
        """The dedicated connection, serialized; driver errors become :class:`Unavailable`
        and drop the connection (the next use reconnects)."""
        async with self._lock:
            try:
                yield await self._connect()
            except _DRIVER_ERRORS as e:
                self._drop()
                raise Unavailable(f"PostgreSQL unavailable while {doing}: {e!r}") from e

    async def _fetch(self, sql: str, *args: Any, doing: str) -> list[asyncpg.Record]:
        async with self._connection(doing) as conn:
            return list(await conn.fetch(sql, *args))

    # -- queries ----------------------------------------------------------------------------

    async def nodes(self) -> list[NodeInfo]:
        """Every known node, oldest first. Raises :class:`Unavailable`."""
        return [_info(r) for r in await self._fetch(self._sql.nodes, doing="listing nodes")]

    async def lags(self) -> list[tuple[str, float]]:
        """(node id, seconds since its last beat) of every running node, by the database's
        clock. Raises ``Unavailable``."""
        rows = await self._fetch(self._sql.lags, doing="reading heartbeat lags")
        return [(r["node_id"], float(r["lag"])) for r in rows]

    async def live_urls(self) -> dict[str, str]:
        """{node id: url} of every node alive now (beat within ``timeout``, not stopped, not
        claimed) that published a URL, this one included. Raises :class:`Unavailable`."""
        rows = await self._fetch(self._sql.live, self.timeout, doing="listing live nodes")
        return {r["node_id"]: r["url"] for r in rows}

    async def publish_url(self, url: str) -> None:
        """Record where the other nodes reach this one (once it serves), then tell
        ``on_live``. Raises :class:`Unavailable`."""
        async with self._connection("recording the node's URL") as conn:
            await conn.execute(self._sql.set_url, self.node_id, url)
        await self._tell_live()

    async def withdraw_url(self) -> None:
        """Clear this node's URL (it stops serving): the other nodes take it out of their
        live view at their next look. Best effort: a database that is gone leaves it to the
        stop or the timeout."""
        try:
            async with asyncio.timeout(self.command_timeout):
                async with self._connection("withdrawing the node's URL") as conn:
                    await conn.execute(self._sql.set_url, self.node_id, None)
        except (Unavailable, TimeoutError) as e:
            log.warning("node %s: could not withdraw its URL: %s", self.node_id, e)

    async def _tell_live(self) -> None:
        if self.on_live is not None:
            self.on_live(await self.live_urls())

    async def dead_nodes(self) -> list[NodeInfo]:
        """Other nodes that are dead (beat older than ``timeout``, or stopped) and not reaped
        yet, least recently seen first. Raises :class:`Unavailable`."""
        rows = await self._fetch(
            self._sql.dead, self.node_id, self.timeout, doing="listing dead nodes"
        )
        return [_info(r) for r in rows]

    # -- lifecycle --------------------------------------------------------------------------

    async def register(self) -> NodeInfo | None:
        """Insert (or take over) this node's row, beating now. Returns the row a previous
        process with this id left behind, or None for a new id; when that previous process
        was not reaped, this node reaps it itself first (runs the hooks: nothing of this
        process can be running yet). Raises :class:`NodeInUse` if a live node has this id,
        :class:`Unavailable`."""
        async with self._connection("registering the node") as conn, conn.transaction():
            rows = await conn.fetch(self._sql.previous, self.node_id)
            previous = _info(rows[0]) if rows else None
            if previous is not None:
                fresh = await conn.fetchval(self._sql.fresh, self.node_id, self.timeout)
                if fresh:
                    raise NodeInUse(
                        f"node id {self.node_id!r} is in use by a running node (last beat "
                        f"{previous.last_beat.isoformat()}); give every node its own id",
                        node=self.node_id,
                    )
            if previous is None or previous.reaped_at is not None:
                await conn.execute(self._sql.register, self.node_id)
                return previous
            # Claimed like any dead node, so that no other survivor reaps it meanwhile.
            await conn.execute(self._sql.claim_own, self.node_id)
        # A previous process under this id died unreaped: close what it left, then take over.
        log.warning("node %s: reaping the previous process with this id", self.node_id)
        await self._run_hooks(self.node_id)
        async with self._connection("registering the node") as conn:
            await conn.execute(self._sql.register, self.node_id)
        return previous

    async def run(self) -> None:
        """Beat every ``interval`` and reap dead nodes, until cancelled. A lost connection
        is reopened with backoff; never raises a database error."""
        async with asyncio.TaskGroup() as tg:
            tg.create_task(self._beat_forever(), name="agora-heartbeat:beat")
            tg.create_task(self._reap_forever(), name="agora-heartbeat:reap")

    async def stop(self) -> None:
        """Mark this node stopped (survivors reap it at once) and close the connection.
        Idempotent; best effort (a database that is gone leaves the row to time out)."""
        try:
            async with asyncio.timeout(self.command_timeout):
                async with self._connection("stopping the node") as conn:
                    await conn.execute(self._sql.stop, self.node_id)
        except (Unavailable, TimeoutError) as e:
            log.warning("node %s: could not record the stop: %s", self.node_id, e)
        finally:
            async with self._lock:
                last, self._conn = self._conn, None
            if last is not None:
                with contextlib.suppress(*_DRIVER_ERRORS):
                    await last.close(timeout=self.command_timeout)

    async def beat(self) -> None:
        """One beat. Raises :class:`Unavailable`."""
        rows = await self._fetch(self._sql.beat, self.node_id, doing="beating")
        fenced = bool(rows and rows[0][0]) or not rows
        newly, self.fenced = fenced and not self.fenced, fenced
        if newly:
            log.error(
                "node %s was declared dead by the other nodes (no beat for %.0fs): its "
                "running executions were closed as interrupted and its members as gone",
                self.node_id,
                self.timeout,
            )
            if self.on_fenced is not None:
                self.on_fenced()

    async def reap_one(self) -> str | None:
        """Claim one dead node, run the hooks for it, mark it reaped; its id, or None when
        there was none to claim. Raises :class:`Unavailable`; a failing hook is logged and
        leaves the claim to expire."""
        rows = await self._fetch(
            self._sql.claim, self.node_id, self.timeout, self.claim_lease, doing="claiming"
        )
        if not rows:
            return None
        dead: str = rows[0]["node_id"]
        if rows[0]["stopped"]:
            log.info("node %s: reaping stopped node %s", self.node_id, dead)
        else:
            log.warning(
                "node %s: reaping dead node %s (no beat for %gs)", self.node_id, dead, self.timeout
            )
        if not await self._run_hooks(dead):
            return dead
        async with self._connection("marking a node reaped") as conn:
            await conn.execute(self._sql.reaped, dead, self.node_id)
        self.reaped.append(dead)
        return dead

    async def _run_hooks(self, dead: str) -> bool:
        for hook in self._hooks:
            try:
                await hook(dead)
            except Exception:
                log.exception("node %s: on_node_dead hook failed for %s", self.node_id, dead)
                return False
        return True

    # -- the loops --------------------------------------------------------------------------

    async def _beat_forever(self) -> None:
        # A retry never waits longer than a beat: a missed beat is what makes a node dead.
        backoff = msgspec.structs.replace(
            BEAT_BACKOFF, maximum=min(BEAT_BACKOFF.maximum, self.interval)
        )
        failures = 0
        while True:
            try:
                await self.beat()
                failures = 0
                # The live view with every beat, apart from the reaping (whose hooks may
                # take long): a dead owner leaves it within a beat of its timeout.
                await self._tell_live()
                await asyncio.sleep(self.interval)
            except Unavailable as e:
                delay = backoff.delay(failures)
                failures += 1
                log.warning("node %s: %s; retrying in %.1fs", self.node_id, e.message, delay)
                await asyncio.sleep(delay)

    async def _reap_forever(self) -> None:
        while True:
            await asyncio.sleep(self.interval)
            try:
                while await self.reap_one() is not None:
                    pass
                await self._fetch(self._sql.prune, self.retention, doing="pruning nodes")
                if self.on_lags is not None:
                    self.on_lags(await self.lags())
            except Unavailable as e:
                log.warning("node %s: reaping: %s", self.node_id, e.message)
