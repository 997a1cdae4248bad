"""A hub node in a cluster: the follower, the heartbeat, the execution closer and the member
closer of one ``agora serve`` process whose store other nodes share (PostgreSQL).

:class:`hub.server.app.Hub` builds a :class:`ClusterNode` only for a shared store, awaits
:meth:`ClusterNode.start` (register in ``nodes``; refuses an id a live node holds) before it
accepts connections, and runs :meth:`ClusterNode.run` as a task of its top-level TaskGroup
until its WebSocket server and its runtime have stopped (the runtime records the executions it
stops); the node is then marked stopped, so survivors reap it at once instead of after the
timeout.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from hub.cluster.follower import NodeFollower
from hub.cluster.heartbeat import Heartbeat, NodeHook, NodeInfo
from hub.cluster.interrupted import InterruptedExecutions
from hub.cluster.members import StrandedMembers
from hub.config import ClusterConfig
from hub.log.base import EventStore
from hub.log.postgres import PostgresEventStore
from hub.workspaces import Workspaces

__all__ = ["ClusterNode"]

log = logging.getLogger("agora.cluster")


class ClusterNode:
    """One node's cluster duties over ``store``, for ``workspaces``.

    ``settings``: ``[cluster]`` (the heartbeat timing; ``node_id`` is already resolved).
    With ``close_executions`` (the default) the node closes the executions of the dead nodes it
    reaps (:class:`InterruptedExecutions`); a runtime that does it itself passes False and
    registers its own hook with :meth:`on_node_dead`. The members a dead node left present
    get their ``memberLeft`` (:class:`StrandedMembers`) in either case.
    """

    def __init__(
        self,
        store: EventStore,
        workspaces: Workspaces,
        node_id: str,
        settings: ClusterConfig | None = None,
        *,
        close_executions: bool = True,
    ) -> None:
        settings = settings or ClusterConfig()
        self.node_id = node_id
        self.follower = NodeFollower(store, workspaces)
        self.heartbeat: Heartbeat | None = None
        self.interrupted: InterruptedExecutions | None = None
        self.members: StrandedMembers | None = None
        if isinstance(store, PostgresEventStore):
            self.heartbeat = Heartbeat(
                store.dsn,
                store.schema,
                node_id,
                interval=settings.heartbeat_s,
                timeout=settings.timeout_s,
            )
            if close_executions:
                self.interrupted = InterruptedExecutions(
                    store.dsn, store.schema, workspaces, node_id
                )
                self.heartbeat.on_node_dead(self.interrupted.close)
            # The dead node's members leave (after its executions: a hook that fails stops
            # the ones after it, and the claim expires for another try of them all).
            self.members = StrandedMembers(
                store.dsn, store.schema, workspaces, node_id, timeout=settings.timeout_s
            )
            self.heartbeat.on_node_dead(self.members.close)

    def on_node_dead(self, hook: NodeHook) -> None:
        """See :meth:`Heartbeat.on_node_dead`. Raises ``RuntimeError`` without a heartbeat
        (a store with no ``nodes`` table)."""
        if self.heartbeat is None:
            raise RuntimeError("this store keeps no heartbeats")
        self.heartbeat.on_node_dead(hook)

    async def dead_nodes(self) -> list[NodeInfo]:
        """See :meth:`Heartbeat.dead_nodes` (empty without a heartbeat)."""
        return [] if self.heartbeat is None else await self.heartbeat.dead_nodes()

    async def start(self) -> None:
        """Register this node. Raises :class:`hub.cluster.heartbeat.NodeInUse`,
        :class:`hub.core.errors.Unavailable`."""
        if self.heartbeat is not None:
            await self.heartbeat.register()
        log.info("node %s joined the cluster", self.node_id)

    async def run(self, *until: asyncio.Future[Any]) -> None:
        """Follow the log and beat until every one of ``until`` is done (the hub's server
        and runtime tasks; none: until cancelled), then mark the node stopped. Cancellation stops
        it the same way."""
        try:
            async with asyncio.TaskGroup() as tg:
                tasks = [tg.create_task(self.follower.run(), name="agora-cluster:follower")]
                if self.heartbeat is not None:
                    tasks.append(
                        tg.create_task(self.heartbeat.run(), name="agora-cluster:heartbeat")
                    )
                if until:
                    await asyncio.wait(until)
                else:
                    await asyncio.get_running_loop().create_future()  # until cancelled
                for task in tasks:
                    task.cancel()
        finally:
            if self.heartbeat is not None:
                # Shielded: a cancelled hub still records the stop (bounded by its timeout).
                await asyncio.shield(self.heartbeat.stop())
            log.info("node %s left the cluster", self.node_id)
