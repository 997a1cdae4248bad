"""The composition root: one :class:`Hub` builds every part from the settings and runs them.

:class:`Hub` takes the configuration (built once by ``agora serve``) and builds from it the
Workspaces over the store, the fan-out (:mod:`hub.server.fanout`), presence
(:mod:`hub.server.presence`), the execution runtime and, on a shared store, the cluster node;
each part gets its settings from here. It owns, in one top-level ``asyncio.TaskGroup`` (its
handle is :class:`hub.server.tasks.OwnedTasks`): the ``websockets`` server, the appends a
connection started (each publish runs as a task of that group, so a client that disconnects or
a shutdown never interrupts a write half-way) and the presence writes; the store is opened
around it and closed last, which commits every pending append. The fan-out needs no task:
Workspaces calls it synchronously with every committed batch and it only enqueues. Each
connection is a :class:`hub.server.connection.Connection`.

The execution runtime (:class:`hub.runtime.Runtime`) runs as a task of the same top-level
group and owns a group of its own holding every execution; before the socket listens it closes
the executions a previous run of the hub left unfinished (:meth:`~hub.runtime.Runtime.recover`;
on a shared store the cluster does that for dead nodes).

Shutdown (SIGTERM/SIGINT in ``agora serve``), in websockets' order: stop accepting, close every
connection with 1001 (meanwhile the runtime stops the running executions and records them),
wait for the connection handlers, wait for the appends, presence writes and executions, close
the store (which drains its queue).

On a store several nodes share (PostgreSQL), the hub is a cluster node (:mod:`hub.cluster`):
it registers in the ``nodes`` table before accepting connections, and the same TaskGroup runs
its follower (other nodes' events to this node's subscribers) and heartbeat until the server
and the runtime have stopped; the node is then marked stopped in the table.

As one worker of ``agora serve --workers N`` (``worker``, :mod:`hub.server.workers`), the hub
skips the start-up recovery (its supervisor ran it once: :meth:`Hub.recover_for_workers`)
but refuses the workspaces that recovery quarantined (kept in the recovery index), binds
the shared port with ``SO_REUSEPORT``, serves the other workers' upstreams (and its own
metrics, for worker 0's ``/metrics``: :meth:`Hub.metrics_exposition`) on its internal unix
socket, and runs the follower over the SQLite file's cross-process
``follow()`` so that its subscribers hear of commits other processes made.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from http import HTTPStatus
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST
from websockets.asyncio.server import ServerConnection, serve, unix_serve
from websockets.datastructures import Headers
from websockets.http11 import Request, Response
from websockets.typing import Subprotocol

from hub.auth import TokenSigner
from hub.checkpoints import Checkpointer
from hub.cluster.follower import NodeFollower
from hub.cluster.settings import resolve_node_id
from hub.config import HubConfig
from hub.core.checkpoint import NoteSigner, generate_signer, key_name_for
from hub.core.errors import ConfigError
from hub.core.events import Event
from hub.core.wire.frames import SUBPROTOCOL
from hub.core.wire.session import SERVER_NAME
from hub.log.base import EventStore
from hub.log.intents import ORPHAN_GRACE_S
from hub.log.sqlite import SqliteEventStore
from hub.observe.metrics import HubMetrics, merge_expositions
from hub.observe.tracing import Tracing
from hub.revocations import Revocations
from hub.runtime import BackendRegistry, Runtime, RuntimeSettings
from hub.runtime.recovery_index import RecoveryIndex, load_quarantined
from hub.server.admission import ConnectionAdmission
from hub.server.blob_ops import BlobOps
from hub.server.checkpoint_ops import AuditOps
from hub.server.connection import Connection
from hub.server.fanout import Fanout
from hub.server.presence import Presence
from hub.server.tasks import OwnedTasks
from hub.server.workers import (
    METRICS_PATH,
    NodePlacement,
    Placement,
    WorkerPlacement,
    WorkerRole,
    fetch_metrics,
)
from hub.workspaces import Workspaces

if TYPE_CHECKING:
    from hub.cluster.node import ClusterNode

__all__ = ["Hub", "server_options"]

log = logging.getLogger("agora.server")


def _unspecified(host: str) -> bool:
    """Whether ``host`` binds every interface (``0.0.0.0``, ``::``, …): no URL another node
    can reach (``[cluster] url``)."""
    if not host:
        return True
    try:
        return ipaddress.ip_address(host).is_unspecified
    except ValueError:
        return False  # a name


def server_options(config: HubConfig) -> dict[str, Any]:
    """Keyword arguments for ``websockets.asyncio.server.serve`` from the configuration.

    ``max_size`` is ``[limits] max_frame_bytes`` (a larger frame closes the connection with
    1009); permessage-deflate is off unless ``[server] compression = "deflate"``."""
    compression = config.server.compression
    return {
        "max_size": config.limits.max_frame_bytes,
        "compression": compression if compression == "deflate" else None,
        "select_subprotocol": _select_subprotocol,
        "server_header": SERVER_NAME,
    }


def _select_subprotocol(
    connection: ServerConnection, offered: Sequence[Subprotocol]
) -> Subprotocol | None:
    """``agora.v1`` when the client offers it; no subprotocol otherwise (it is optional)."""
    return Subprotocol(SUBPROTOCOL) if SUBPROTOCOL in offered else None


class Hub:
    """A running hub: Workspaces, fan-out, presence and the WebSocket server over ``store``.

    ``config`` is the one settings object, built once (``agora serve``: file, flags and
    environment) and passed down from here: ``[limits]`` is every session's limits as it is,
    ``[cluster]`` the node's id and timing when ``store`` is shared (no ``node_id``: a
    generated one). ``clock`` (epoch seconds) checks token expiry on every frame;
    ``monotonic`` drives the publish rate limits. ``runtime``: the execution runtime's
    settings (its backend instances come from ``config.backends``). ``tracing``: where spans
    go (default: nowhere). Use :meth:`run`. Raises
    :class:`hub.config.ConfigError` for invalid backend instances.
    """

    def __init__(
        self,
        config: HubConfig,
        store: EventStore,
        signer: TokenSigner,
        *,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        runtime: RuntimeSettings | None = None,
        checkpoint_key: NoteSigner | None = None,
        tracing: Tracing | None = None,
        worker: WorkerRole | None = None,
    ) -> None:
        self.config = config
        # One of `agora serve --workers N` (hub.server.workers), or None: the only process.
        self.worker = worker
        # Who decides each workspace's frames, when not always this process: the workers'
        # owner, or with [cluster] owners the nodes' (set once the cluster node started).
        self.placement: Placement | None = WorkerPlacement(worker) if worker is not None else None
        cluster = config.cluster
        if cluster.owners and (worker is not None or config.server.workers > 1):
            raise ConfigError(
                "[cluster] owners cannot be combined with --workers (the workers share one "
                "port: a node's URL does not reach one worker)",
                source="[cluster] owners",
            )
        if cluster.owners and cluster.url is None and _unspecified(config.server.host):
            raise ConfigError(
                f"[cluster] owners with host {config.server.host!r}: set [cluster] url (or "
                "AGORA_NODE_URL), the URL the other nodes reach this one at",
                source="[cluster] url",
            )
        self.server_name = SERVER_NAME if worker is None else f"{SERVER_NAME} worker/{worker.index}"
        # Traces (hub.observe.tracing): off (a no-op per span) unless a provider is given.
        self.tracing = tracing or Tracing()
        self.store = store
        self.signer = signer
        self.clock = clock
        self.monotonic = monotonic
        limits = config.limits
        self.tasks = OwnedTasks()
        self.fanout = Fanout(per_iteration=True)
        self.workspaces = Workspaces(
            store,
            limits=limits.draft_limits(),
            snapshot_every=limits.snapshot_every,
            keep_open=self.fanout.subscribers,
        )
        self.workspaces.add_listener(self.fanout)
        # Each transaction of the store, as it is reported: the Workspaces fold its events
        # (the fan-out holds them), then the fan-out offers them, before the publishers'
        # tasks resume (docs/operations.md "Throughput of one node").
        store.hear_commits(self.workspaces.heard)
        store.hear_commits(self.fanout.heard)
        # Metrics (GET /metrics, hub.observe.metrics): per batch and per transaction, never
        # per event; the gauges are read at scrape time.
        self.metrics = HubMetrics()
        self.workspaces.add_listener(self.metrics.committed)
        store.observe_commits(self.metrics.commit)
        self.connections: set[Connection] = set()
        # Signed checkpoints (docs/audit.md): heard of at every commit, produced in the hub's
        # TaskGroup. Without a key (in-process tests) the hub signs with one of its own, gone
        # at exit; `agora serve` passes the data directory's checkpoint.key.
        audit = config.audit
        key = checkpoint_key or generate_signer(key_name_for(audit.hub_id or "ephemeral"))
        self.checkpointer = Checkpointer(store, key, audit)
        self.audit = AuditOps(self.checkpointer)
        self.blob_ops = BlobOps(self.workspaces, limits)
        self.workspaces.add_listener(self._committed)
        self.node_id = resolve_node_id(config.cluster)
        if worker is not None and worker.node is not None:
            self.node_id = worker.node  # named by the supervisor for this start of the worker
        elif worker is not None and config.cluster.node_id:
            self.node_id = f"{self.node_id}-w{worker.index}"  # one node per worker process
        # With workers on SQLite: the other workers' commits, to this worker's subscribers.
        self.follower: NodeFollower | None = None
        # Revoked tokens (hub.revocations): refused at hello, and they end live connections.
        self.revocations = Revocations(self.workspaces, clock=clock)
        self.cluster: ClusterNode | None = None
        # What start has to close, without reading every log (kept only on a store of our own).
        self.recovery_index = RecoveryIndex(store)
        self.presence = Presence(
            self.workspaces,
            self.tasks,
            self.recovery_index,
            grace_s=config.server.presence_grace_s,
            node=self.node_id,
        )
        self.admission = ConnectionAdmission(
            limits.max_connections, limits.max_connections_per_agent
        )
        settings = runtime or config.runtime
        registry = BackendRegistry.from_config(
            config.backends,
            blobs=store.blobs,
            data_dir=config.storage.data_dir,
            settings=settings.backend_settings(),
            # Each worker sweeps only its own sandboxes (never a live sibling's).
            worker=worker.index if worker is not None else None,
            workers=worker.count if worker is not None else 1,
        )
        self.runtime = Runtime(
            self.workspaces, registry, settings, node=self.node_id, index=self.recovery_index
        )
        self.runtime.on_finished = self.metrics.execution_finished
        self.runtime.tracing = self.tracing
        self.workspaces.tracing = self.tracing
        self.metrics.bind_gauges(
            connections=lambda: self.admission.open,
            subscriptions=lambda: sum(len(c.subscriptions) for c in self.connections),
            fanout_queued=lambda: sum(len(c.queue) for c in self.connections),
            executions_running=lambda: self.runtime.running,
        )
        self.url: str | None = None
        self.stopping = False
        # Readiness (GET /readyz on the HTTP port, hub.http): the store open and recovery done.
        self.store_open = False
        self.recovered = False
        # Declared dead by the other nodes of its cluster (hub.cluster.heartbeat): the hub
        # stopped for that reason (`agora serve` then exits 75 for its supervisor).
        self.fenced = False

    async def run(self, stop: asyncio.Event, on_ready: Callable[[str], None] | None = None) -> None:
        """Open the store, serve until ``stop`` is set, then shut down in order (see the module
        docstring). ``on_ready`` gets the URL once the socket listens. Raises ``OSError`` when
        the address cannot be bound, and what the store's ``open`` raises."""
        async with self.store:
            self.store_open = True
            if self.store.shared:
                from hub.cluster.node import ClusterNode  # loads the PostgreSQL driver

                self.cluster = ClusterNode(
                    self.store, self.workspaces, self.node_id, self.config.cluster
                )
                heartbeat = self.cluster.heartbeat
                if heartbeat is not None:
                    heartbeat.on_lags = self.metrics.heartbeats
                    heartbeat.on_fenced = lambda: self._fence(stop)
                await self.cluster.start()
                if self.config.cluster.owners and heartbeat is not None:
                    # Every workspace served here until the live nodes are known (the URL
                    # published once serving, hub.cluster.heartbeat).
                    timing = self.config.cluster
                    placement = NodePlacement(
                        self.node_id,
                        self.signer.relay_header(self.node_id),
                        hold_s=timing.timeout_s + 2 * timing.heartbeat_s,
                    )
                    heartbeat.on_live = placement.update
                    # The other nodes' URLs before the first connection: none is placed here
                    # for want of a view (this node's own URL follows once it serves).
                    placement.update(await heartbeat.live_urls())
                    self.placement = placement
            elif self.config.cluster.owners:
                log.warning("[cluster] owners has no effect on a store of one node (SQLite)")
            elif self.worker is not None:
                if isinstance(self.store, SqliteEventStore):
                    self.store.follow_other_writers(self.config.server.worker_poll_s)
                self.follower = NodeFollower(self.store, self.workspaces)
            try:
                await self.revocations.load()  # before the first connection is accepted
                began = time.monotonic()
                # Shared: the cluster closes dead nodes' executions; a worker: the supervisor
                # recovered before starting any (hub.server.supervisor).
                if not self.store.shared and self.worker is None:
                    await self.recovery_index.open()
                    await self.runtime.recover()
                    await self.presence.recover()
                elif not self.store.shared:  # what the supervisor's recovery quarantined
                    for name, reason in (await load_quarantined(self.store)).items():
                        self.workspaces.quarantine(name, reason)
                self.metrics.recovery_seconds.set(time.monotonic() - began)
                self.recovered = True
                async with asyncio.TaskGroup() as tg:
                    self.tasks.attach(tg)
                    tg.create_task(self.revocations.run(stop), name="agora-revocations")
                    tg.create_task(self.checkpointer.run(stop), name="agora-checkpoints")
                    if self.worker is None or self.worker.index == 0:  # one sweeper a file
                        tg.create_task(self._sweep_orphans(stop), name="agora-orphan-sweep")
                    if self.follower is not None:
                        tg.create_task(self._follow(stop), name="agora-follower")
                    runtime = tg.create_task(self.runtime.run(stop), name="agora-runtime")
                    server = tg.create_task(self._serve(stop, on_ready), name="agora-server")
                    if self.cluster is not None:
                        # Until both are done: the runtime records the executions it stops.
                        tg.create_task(self.cluster.run(server, runtime), name="agora-cluster")
            except BaseExceptionGroup as group:
                # One failure (typically the bind's OSError) is re-raised as itself.
                if len(group.exceptions) == 1 and isinstance(group.exceptions[0], Exception):
                    raise group.exceptions[0] from group
                raise
            finally:
                self.store_open = False
                self.tasks.detach()
                await self.workspaces.aclose()

    async def recover_for_workers(self) -> None:
        """The start-up recovery of ``agora serve --workers`` (hub.server.supervisor), once,
        before any worker starts: open the store (migrations), close the executions and the
        presence a previous run left open — scanning every workspace, as workers keep no
        recovery index — and mark the stored index stale for whatever start comes next. On a
        shared store (PostgreSQL) only the migrations: the other nodes may be running what
        the log shows open, and the cluster recovers dead nodes (each worker is a node)."""
        async with self.store:
            if self.store.shared:
                return
            try:
                index = self.recovery_index
                await index.open()
                index.complete = False
                await self.runtime.recover()
                await self.presence.recover()
                await index.invalidate()
            finally:
                await self.workspaces.aclose()

    async def _sweep_orphans(self, stop: asyncio.Event) -> None:
        """At start and every ``ORPHAN_GRACE_S`` until ``stop``: remove the blobs a crash
        left between storing a publish's content and committing its event (the intents
        older than the grace; see :meth:`Workspaces.sweep_orphans`). A failure is logged
        and tried again next round; it never ends the hub."""
        while not stop.is_set():
            try:
                removed = await self.workspaces.sweep_orphans(before=time.time() - ORPHAN_GRACE_S)
                if removed:
                    log.info("removed %d orphan blob(s) of publishes never committed", removed)
            except Exception:
                log.exception("the orphan blob sweep failed; trying again later")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), ORPHAN_GRACE_S)

    async def _follow(self, stop: asyncio.Event) -> None:
        """Run the follower until ``stop`` (its tasks only read and deliver)."""
        assert self.follower is not None
        async with asyncio.TaskGroup() as tg:
            follower = tg.create_task(self.follower.run(), name="agora-follower:run")
            await stop.wait()
            follower.cancel()

    def readiness(self) -> dict[str, bool]:
        """The readiness checks (``GET /readyz``): the store is open, the previous run's
        executions and presence are recovered (on a shared store: the cluster node started),
        and the hub is serving, not shutting down."""
        return {
            "store": self.store_open,
            "recovered": self.recovered,
            "serving": self.url is not None and not self.stopping,
        }

    async def _serve(self, stop: asyncio.Event, on_ready: Callable[[str], None] | None) -> None:
        host, port = self.config.server.host, self.config.server.port
        options = server_options(self.config)
        async with contextlib.AsyncExitStack() as stack:
            if self.worker is not None:
                # The other workers' upstreams (hub.server.workers): bound before the shared
                # port, so a worker that takes connections can already be reached.
                path = self.worker.socket(self.worker.index)
                await asyncio.to_thread(path.unlink, missing_ok=True)  # a killed predecessor's
                await stack.enter_async_context(
                    unix_serve(
                        self._handle_internal,
                        str(path),
                        process_request=self._internal_request,
                        **options,
                    )
                )
                # (In a 0700 directory from the start: the mode is a second fence.)
                await asyncio.to_thread(path.chmod, 0o600)
            server = await stack.enter_async_context(
                serve(
                    self._handle,
                    host,
                    port,
                    process_request=self._admit,
                    reuse_port=self.worker is not None,  # every worker on the one port
                    **options,
                )
            )
            bound = server.sockets[0].getsockname()[1] if server.sockets else port
            shown = f"[{host}]" if ":" in host else host
            self.url = f"ws://{shown}:{bound}"
            if isinstance(self.placement, NodePlacement) and self.cluster is not None:
                assert self.cluster.heartbeat is not None
                # From now on the other nodes relay this node's workspaces here.
                await self.cluster.heartbeat.publish_url(self.config.cluster.url or self.url)
            if on_ready is not None:
                on_ready(self.url)
            await stop.wait()
            self.stopping = True
            if isinstance(self.placement, NodePlacement) and self.cluster is not None:
                assert self.cluster.heartbeat is not None
                # First of all: the other nodes stop relaying here at their next look (within
                # a heartbeat), so the clients this shutdown closes are served by new owners.
                await self.cluster.heartbeat.withdraw_url()
            self.presence.flush()  # leaves held for a reconnect are written now
            log.info("stopping: closing connections with 1001")
        # Leaving ``serve``: stopped accepting, closed connections (1001), handlers returned.
        log.info("connections closed; finishing pending writes")

    async def metrics_exposition(self) -> bytes:
        """What ``GET /metrics`` answers: this hub's metrics; as worker 0 of ``--workers N``,
        every worker's, each series labelled with its worker (fetched over their internal
        sockets at once; one that does not answer is left out, ``agora_worker_up`` 0)."""
        own = self.metrics.exposition()
        if self.worker is None:
            return own
        worker = self.worker
        fetched: dict[int, asyncio.Task[bytes | None]] = {}
        async with asyncio.TaskGroup() as tg:
            for i in range(worker.count):
                if i != worker.index:
                    fetched[i] = tg.create_task(fetch_metrics(worker.socket(i)))
        parts = {
            str(i): own if i == worker.index else fetched[i].result() for i in range(worker.count)
        }
        return merge_expositions(parts)

    def _internal_request(self, ws: ServerConnection, request: Request) -> Response | None:
        """A plain ``GET /metrics`` on the internal socket: this worker's own metrics, for
        worker 0's ``/metrics``. Anything else goes on to the WebSocket handshake."""
        if request.path != METRICS_PATH or "Upgrade" in request.headers:
            return None
        body = self.metrics.exposition()
        headers = Headers(
            [
                ("Content-Type", CONTENT_TYPE_LATEST),
                ("Content-Length", str(len(body))),
                ("Connection", "close"),
            ]
        )
        return Response(HTTPStatus.OK.value, HTTPStatus.OK.phrase, headers, body)

    def _fence(self, stop: asyncio.Event) -> None:
        """This node was declared dead (hub.cluster.heartbeat): the survivor that claimed it
        closes its executions and members, so it must not go on serving as if alive. It
        stops as for SIGTERM (its URL withdrawn, its clients closed with 1001: they move to
        another node) and leaves a fresh start to its supervisor."""
        self.fenced = True
        log.error("node %s: declared dead by the other nodes; stopping", self.node_id)
        stop.set()

    def _committed(self, workspace: str, batch: Sequence[Event]) -> None:
        if batch:
            self.checkpointer.appended(workspace, batch[-1].seq)

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None] | None:
        """Run ``coro`` as a task of the hub's TaskGroup (see :meth:`OwnedTasks.spawn`)."""
        return self.tasks.spawn(coro, name)

    # -- connections ----------------------------------------------------------------------------

    def _admit(self, ws: ServerConnection, request: Request) -> Response | None:
        """Refuse the handshake (HTTP 503) when ``[limits] max_connections`` are open."""
        if not self.admission.full:
            return None
        log.warning("refused a connection: %d open (max_connections)", self.admission.open)
        return ws.respond(HTTPStatus.SERVICE_UNAVAILABLE, "too many connections\n")

    async def _handle(self, ws: ServerConnection) -> None:
        self.admission.connected()
        connection = Connection(self, ws)
        self.connections.add(connection)
        try:
            await connection.run()
        finally:
            self.connections.discard(connection)
            self.admission.disconnected()

    async def _handle_internal(self, ws: ServerConnection) -> None:
        """An upstream of another worker: counted and admitted where the client connected."""
        connection = Connection(self, ws, internal=True)
        self.connections.add(connection)
        try:
            await connection.run()
        finally:
            self.connections.discard(connection)
