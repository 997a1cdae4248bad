"""The WebSocket server: the I/O shell around :class:`hub.core.wire.session.Session`.

One :class:`Hub` owns, in one top-level ``asyncio.TaskGroup``: the ``websockets`` server, the
appends it started (each publish runs as a task of that group, so a client that disconnects or a
shutdown never interrupts a write half-way) and the presence writes; the store is opened around
it and closed last, which commits every pending append. The fan-out (:mod:`hub.server.fanout`) needs
no task: Workspaces calls it synchronously with every committed batch and it only enqueues.

Per connection (:class:`_Connection`), a second TaskGroup holds a reader (frames in → the
session → actions), a writer (the bounded send queue → the socket) and one catch-up task per
subscription that is still reading history. Any of them may stop the connection; the others are
then cancelled, and the connection is torn down: its subscriptions leave the fan-out, presence
is updated, and the close frame goes out.

Publishes are pipelined: the reader starts each one as a task of the hub's group and reads on,
up to :data:`PUBLISHES_IN_FLIGHT` per connection (then it waits: back-pressure). Each publish
waits until the connection's previous publish to the same workspace has been handed to the
store (the ``submitted`` hook of :meth:`hub.workspaces.Workspaces.publish`), so one
connection's publishes to a workspace are appended in the order they were sent; the ack is
queued when the append completes (acks carry the ``rid``, so they may come in completion
order). Every other request waits for the connection's publishes in flight first.

The writer takes every frame queued at once, frames each with the ``websockets`` protocol
object and writes them with one ``transport.write`` (RFC 6455 frames, one syscall for many).

The execution runtime (:class:`hub.runtime.Runtime`) runs as a task of the same top-level
group and owns a group of its own holding every execution; before the socket listens it closes
the executions a previous run of the hub left unfinished (:meth:`~hub.runtime.Runtime.recover`;
on a shared store the cluster does that for dead nodes). Requests that wait for an execution
(``execResult``, ``kill``, ``getExec``) run as tasks of their connection, beside the reader.

Shutdown (SIGTERM/SIGINT in ``agora serve``), in websockets' order: stop accepting, close every
connection with 1001 (meanwhile the runtime stops the running executions and records them),
wait for the connection handlers, wait for the appends, presence writes and executions, close
the store (which drains its queue).

On a store several nodes share (PostgreSQL), the hub is a cluster node (:mod:`hub.cluster`):
it registers in the ``nodes`` table before accepting connections, and the same TaskGroup runs
its follower (other nodes' events to this node's subscribers) and heartbeat until the server
and the runtime have stopped; the node is then marked stopped in the table.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Sequence
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar

from websockets.asyncio.server import ServerConnection, serve
from websockets.exceptions import ConnectionClosed
from websockets.typing import Subprotocol

from hub.auth import TokenSigner
from hub.cluster.settings import NodeSettings
from hub.config import HubConfig
from hub.core.errors import AgoraError, BadRequest, CloseCode, Internal, Unavailable
from hub.core.events import MemberJoined, MemberLeft, MemberPayload, encode_event
from hub.core.wire.frames import SUBPROTOCOL
from hub.core.wire.session import (
    SERVER_NAME,
    Action,
    Close,
    DisposeRequest,
    ExecRequest,
    ExecResultRequest,
    GetExecRequest,
    KillRequest,
    PublishRequest,
    Request,
    Send,
    Session,
    SessionLimits,
    StateRequest,
    SubscribeRequest,
    UnsubscribeRequest,
    encode_event_frame,
    encode_exec_event_frame,
    encode_frame,
)
from hub.log.base import EventStore
from hub.runtime import BackendRegistry, Runtime, RuntimeSettings
from hub.server.fanout import NOT_AN_EVENT, Fanout, Outgoing, SendQueue, Subscription
from hub.workspaces import Workspaces

if TYPE_CHECKING:
    from hub.cluster.node import ClusterNode

__all__ = ["Hub", "server_options"]

log = logging.getLogger("agora.server")

T = TypeVar("T")

CATCH_UP_PAGE: Final = 256
"""Events read from the store per page while a subscriber catches up."""

PUBLISHES_IN_FLIGHT: Final = 64
"""Publishes one connection may have in flight; the reader then waits for one to finish."""

WRITE_BYTES: Final = 64 * 1024
"""The writer hands the transport at most this much per write (then drains if it must)."""


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


class _Outcome(Generic[T]):
    """The result or exception of an owned task (so the TaskGroup never sees it fail)."""

    __slots__ = ("error", "value")

    def __init__(self, value: T | None = None, error: BaseException | None = None) -> None:
        self.value = value
        self.error = error

    def unwrap(self) -> T:
        if self.error is not None:
            raise self.error
        return self.value  # type: ignore[return-value]


async def _settle(coro: Coroutine[Any, Any, T]) -> _Outcome[T]:
    try:
        return _Outcome(value=await coro)
    except Exception as e:
        return _Outcome(error=e)


class _InFlight:
    """A count of work in flight with a limit, and a way to wait until it drops below n."""

    __slots__ = ("_changed", "count", "limit")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.count = 0
        self._changed = asyncio.Event()

    def release(self) -> None:
        self.count -= 1
        self._changed.set()

    async def wait_below(self, n: int) -> None:
        """Wait until fewer than ``n`` are in flight (at once if they are)."""
        while self.count >= n:
            self._changed.clear()
            await self._changed.wait()


class Hub:
    """A running hub: Workspaces, fan-out, presence and the WebSocket server over ``store``.

    ``clock`` (epoch seconds) checks token expiry on every frame; ``monotonic`` drives the
    publish rate limits. ``node``: this process's node id and heartbeat timing when ``store``
    is shared (default: a generated id). ``runtime``: the execution runtime's settings (its
    backend instances come from ``config.backends``). Use :meth:`run`. Raises
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
        node: NodeSettings | None = None,
        runtime: RuntimeSettings | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.signer = signer
        self.clock = clock
        self.monotonic = monotonic
        limits = config.limits
        self.session_limits = SessionLimits(
            max_batch_events=limits.max_batch_events,
            publish_rate=limits.publish_rate,
            publish_burst=limits.publish_burst,
            max_subscriptions=limits.max_subscriptions,
            garbage_limit=limits.garbage_limit,
            max_exec_waits=config.runtime.max_exec_waits,
        )
        self.fanout = Fanout()
        self.workspaces = Workspaces(
            store,
            limits=limits.draft_limits(),
            snapshot_every=limits.snapshot_every,
            keep_open=self.fanout.subscribers,
        )
        self.workspaces.add_listener(self.fanout)
        self.node = node or NodeSettings()
        self.node_id = self.node.resolved_id()
        self.cluster: ClusterNode | None = None
        self.presence = Presence(self)
        settings = runtime or config.runtime
        registry = BackendRegistry.from_config(
            config.backends,
            blobs=store.blobs,
            data_dir=config.storage.data_dir,
            settings=settings.backend_settings(),
        )
        self.runtime = Runtime(self.workspaces, registry, settings, node=self.node_id)
        self.url: str | None = None
        self.stopping = False
        self._tg: asyncio.TaskGroup | None = None

    async def run(self, stop: asyncio.Event, on_ready: Callable[[str], None] | None = None) -> None:
        """Open the store, serve until ``stop`` is set, then shut down in order (see the module
        docstring). ``on_ready`` gets the URL once the socket listens. Raises ``OSError`` when
        the address cannot be bound, and what the store's ``open`` raises."""
        async with self.store:
            if self.store.shared:
                from hub.cluster.node import ClusterNode  # loads the PostgreSQL driver

                self.cluster = ClusterNode(self.store, self.workspaces, self.node_id, self.node)
                await self.cluster.start()
            try:
                if not self.store.shared:  # shared: the cluster closes dead nodes' executions
                    await self.runtime.recover()
                    await self.presence.recover()
                async with asyncio.TaskGroup() as tg:
                    self._tg = tg
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
                self._tg = None
                await self.workspaces.aclose()

    async def _serve(self, stop: asyncio.Event, on_ready: Callable[[str], None] | None) -> None:
        host, port = self.config.server.host, self.config.server.port
        async with serve(self._handle, host, port, **server_options(self.config)) as server:
            bound = server.sockets[0].getsockname()[1] if server.sockets else port
            shown = f"[{host}]" if ":" in host else host
            self.url = f"ws://{shown}:{bound}"
            if on_ready is not None:
                on_ready(self.url)
            await stop.wait()
            self.stopping = True
            log.info("stopping: closing connections with 1001")
        # Leaving ``serve``: stopped accepting, closed connections (1001), handlers returned.
        log.info("connections closed; finishing pending writes")

    # -- tasks owned by the top-level group ---------------------------------------------------

    def spawn(self, coro: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None] | None:
        """Run ``coro`` as a task of the hub's TaskGroup (it must not raise). Returns None (and
        closes ``coro``) when the hub is not running."""
        tg = self._tg
        if tg is None:
            coro.close()
            return None
        try:
            return tg.create_task(coro, name=name)
        except RuntimeError:  # the group is shutting down
            coro.close()
            return None

    async def owned(self, coro: Coroutine[Any, Any, T]) -> T:
        """Await ``coro`` run as a task of the hub's TaskGroup: cancelling the caller (a
        connection closing) does not cancel it, and shutdown waits for it."""
        tg = self._tg
        if tg is None:
            return await coro
        wrapper = _settle(coro)
        try:
            task = tg.create_task(wrapper)
        except RuntimeError:  # the group is shutting down: run it here
            wrapper.close()
            return await coro
        outcome = await asyncio.shield(task)
        return outcome.unwrap()

    # -- connections ----------------------------------------------------------------------------

    async def _handle(self, ws: ServerConnection) -> None:
        await _Connection(self, ws).run()


class Presence:
    """``memberJoined``/``memberLeft``, per (agent, workspace) across connections.

    An agent joins a workspace when its first subscription to it (on any connection) starts,
    and leaves when its last one ends (unsubscribe or disconnect). :meth:`enter` and
    :meth:`exit` never wait: the events are appended by tasks of the hub's TaskGroup, chained
    per (agent, workspace) so that they reach the log in the order of the transitions.
    """

    def __init__(self, hub: Hub) -> None:
        self._hub = hub
        self._count: dict[tuple[str, str], int] = {}
        self._tail: dict[tuple[str, str], asyncio.Task[None]] = {}

    def count(self, agent: str, workspace: str) -> int:
        return self._count.get((agent, workspace), 0)

    def enter(self, agent: str, workspace: str) -> None:
        key = (agent, workspace)
        self._count[key] = self._count.get(key, 0) + 1
        if self._count[key] == 1:
            self._record(key, joined=True)

    def exit(self, agent: str, workspace: str, reason: str) -> None:
        """``reason`` (for ``memberLeft``): unsubscribed, closed, tooSlow, unauthorized,
        shutdown."""
        key = (agent, workspace)
        left = self._count.get(key, 0) - 1
        if left > 0:
            self._count[key] = left
            return
        self._count.pop(key, None)
        self._record(key, joined=False, reason=reason)

    def _record(self, key: tuple[str, str], *, joined: bool, reason: str | None = None) -> None:
        previous = self._tail.get(key)
        kind = "joined" if joined else "left"
        task = self._hub.spawn(
            self._append(previous, key, joined=joined, reason=reason),
            name=f"agora-presence:{kind}:{key}",
        )
        if task is None:
            log.warning("presence not recorded (hub stopping): %s %s %s", key[0], kind, key[1])
            return
        self._tail[key] = task

        def forget(t: asyncio.Task[None]) -> None:
            if self._tail.get(key) is t:
                del self._tail[key]

        task.add_done_callback(forget)

    async def recover(self) -> int:
        """Record as gone every member a crash left present (``memberLeft`` with reason
        ``interrupted``), so an audit never shows an agent in a workspace after the hub that
        served it died. Only for a store this hub has to itself: on a shared store, members
        present may be connected to another node. Returns how many were closed."""
        closed = 0
        for head in await self._hub.store.heads():
            state = await self._hub.workspaces.state(head.workspace)
            for agent, member in sorted(state.members.items()):
                if not member.present:
                    continue
                payload = MemberPayload(agent=agent, via=member.via, reason="interrupted")
                try:
                    await self._hub.workspaces.publish(
                        head.workspace, [MemberLeft(payload=payload)], producer=agent, trusted=True
                    )
                    closed += 1
                except Exception:  # a damaged workspace must not keep the hub from starting
                    log.exception("could not close the presence of %s in %s", agent, head.workspace)
        if closed:
            log.info("recorded %d member(s) left present by the previous run", closed)
        return closed

    async def _append(
        self,
        previous: asyncio.Task[None] | None,
        key: tuple[str, str],
        *,
        joined: bool,
        reason: str | None,
    ) -> None:
        if previous is not None:
            await asyncio.wait([previous])
        agent, workspace = key
        event: MemberJoined | MemberLeft
        if joined:
            event = MemberJoined(payload=MemberPayload(agent=agent, via="websocket"))
        else:
            payload = MemberPayload(agent=agent, via="websocket", reason=reason)
            event = MemberLeft(payload=payload)
        try:
            await self._hub.workspaces.publish(workspace, [event], producer=agent, trusted=True)
        except Exception:
            log.exception("could not record %s of %s in %s", event.kind, agent, workspace)


class _Connection:
    """One client connection: the session, its send queue, subscriptions and tasks."""

    def __init__(self, hub: Hub, ws: ServerConnection) -> None:
        self.hub = hub
        self.ws = ws
        self.peer = _peer(ws)
        self.session = Session(
            hub.signer.verify,
            limits=hub.session_limits,
            clock=hub.clock,
            monotonic=hub.monotonic,
            default_backend=hub.runtime.default_backend,
        )
        self.queue: SendQueue[Outgoing | Close] = SendQueue(hub.config.limits.send_queue)
        self.subscriptions: dict[str, Subscription] = {}
        self.catch_ups: dict[str, asyncio.Task[None]] = {}
        self.present: set[str] = set()  # workspaces this connection counts in Presence
        self.last_sent: dict[str, int] = {}  # per subscribed workspace: last seq to the socket
        self.close_code: int | None = None
        self.close_reason = ""
        self.publishes = _InFlight(PUBLISHES_IN_FLIGHT)
        # Per workspace: the ``submitted`` future of the connection's last publish in flight.
        self._publish_tails: dict[str, asyncio.Future[None]] = {}
        self._stopping = False
        self._announced = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._tg: asyncio.TaskGroup | None = None

    # -- Outlet (called synchronously by the fan-out) ------------------------------------------

    def offer(self, item: Outgoing) -> bool:
        if self._stopping:
            return True  # going away: drop silently, the close tells the client where it was
        return self.queue.offer(item)

    def overflow(self) -> None:
        self.stop(CloseCode.TOO_SLOW)

    # -- lifecycle ------------------------------------------------------------------------------

    def stop(self, code: int | None, reason: str = "") -> None:
        """Stop the connection's tasks; close with ``code`` (None: it is closed already)."""
        if self._stopping:
            return
        self._stopping = True
        self.close_code, self.close_reason = code, reason
        current = asyncio.current_task()
        for task in self._tasks:
            if task is not current:
                task.cancel()

    async def run(self) -> None:
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                self._spawn(self._read(), "reader")
                self._spawn(self._write(), "writer")
        finally:
            self._tg = None
            await self._teardown()

    def _spawn(self, coro: Coroutine[Any, Any, None], role: str) -> asyncio.Task[None] | None:
        if self._tg is None or self._stopping:
            coro.close()
            return None
        task = self._tg.create_task(self._guard(coro, role), name=f"agora-conn:{role}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _guard(self, coro: Coroutine[Any, Any, None], role: str) -> None:
        """Run a connection task; an unexpected failure closes the connection with 1011."""
        try:
            await coro
        except ConnectionClosed:
            self.stop(None)
        except Exception:
            log.exception("connection %s failed (agent=%s peer=%s)", role, self._agent, self.peer)
            self.stop(CloseCode.INTERNAL, "internal error")

    async def _teardown(self) -> None:
        self._stopping = True
        for subscription in self.subscriptions.values():
            self.hub.fanout.remove(subscription)
        agent = self.session.agent
        if agent is not None:
            for workspace in sorted(self.present):
                self.hub.presence.exit(agent, workspace, self._leave_reason())
        self.present.clear()
        code, reason = self.close_code, self.close_reason
        if code == CloseCode.TOO_SLOW:
            close = self.session.too_slow(self.last_sent)
            code, reason = close.code, close.reason
        self.subscriptions.clear()
        if code is not None:
            await self.ws.close(code, reason)
        sent, by = _close_code(self.ws)
        log.info(
            "close agent=%s peer=%s code=%s by=%s%s",
            self._agent,
            self.peer,
            sent,
            by,
            f" reason={reason}" if reason else "",
        )

    @property
    def _agent(self) -> str:
        return self.session.agent or "-"

    # -- reading ----------------------------------------------------------------------------------

    async def _read(self) -> None:
        request = self.ws.request
        authorization = request.headers.get("Authorization") if request is not None else None
        actions = self.session.open(authorization)
        while True:
            if not await self._perform(actions):
                return
            if not self._announced and self.session.agent is not None:
                self._announced = True
                log.info("open agent=%s peer=%s", self.session.agent, self.peer)
            data = await self.ws.recv()  # ConnectionClosed ends the connection (see _guard)
            if isinstance(data, str):
                actions = self.session.receive(data)
            else:
                actions = self.session.receive_binary(data)

    async def _perform(self, actions: list[Action]) -> bool:
        """Carry out the session's actions; False once a ``Close`` was queued.

        A publish is started and left running (see :meth:`_publish`); anything else but a
        plain frame first waits for the publishes in flight, so that it sees their effects
        and their acks go out before a close."""
        for action in actions:
            match action:
                case Send(frame=frame):
                    await self.queue.put((encode_frame(frame), None, NOT_AN_EVENT))
                    continue
                case PublishRequest():
                    await self._publish(action)
                    continue
            if self.publishes.count:
                await self.publishes.wait_below(1)
            match action:
                case Close():
                    await self.queue.put(action)
                    return False
                case SubscribeRequest():
                    if not await self._subscribe(action):
                        return False
                case UnsubscribeRequest():
                    await self._unsubscribe(action)
                    if not await self._perform(self.session.completed(action, None)):
                        return False
                case StateRequest():
                    coro = self.hub.workspaces.state(action.workspace, at_seq=action.at_seq)
                    if not await self._answer(action, coro):
                        return False
                case ExecRequest() | DisposeRequest():
                    if not await self._answer(action, self.hub.owned(self._runtime_op(action))):
                        return False
                case ExecResultRequest() | KillRequest():
                    self._beside(action)
                case GetExecRequest():
                    if self._spawn(self._follow(action), f"getExec:{action.exec_id}") is None:
                        self.session.failed(action, Unavailable("the connection is closing"))
        return True

    # -- publishing -------------------------------------------------------------------------------

    async def _publish(self, request: PublishRequest) -> None:
        """Start appending ``request`` as a task of the hub's group (a publish the hub accepted
        is written even if the connection goes away) and return. Waits first while the
        connection has :data:`PUBLISHES_IN_FLIGHT` publishes in flight, or while its send
        queue is at the low-water mark (each publish in flight may push one ack)."""
        queue, publishes = self.queue, self.publishes
        if len(queue) >= queue.low_water:
            await queue.wait_room()
        if publishes.count >= publishes.limit:
            await publishes.wait_below(publishes.limit)
        workspace = request.workspace
        after = self._publish_tails.get(workspace)
        submitted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._publish_tails[workspace] = submitted
        publishes.count += 1
        if self.hub.spawn(self._append(request, after, submitted), "agora-publish") is None:
            # The hub is stopping (spawn closed the coroutine, whose finally never ran).
            stopping = Unavailable("the hub is stopping; retry later")
            self._published(request, submitted, self._failed(request, stopping))

    async def _append(
        self,
        request: PublishRequest,
        after: asyncio.Future[None] | None,
        submitted: asyncio.Future[None],
    ) -> None:
        """One publish, in the hub's group: wait for the connection's previous publish to the
        workspace to be handed to the store (``after``), append, queue the ack. Never raises
        (but CancelledError)."""
        actions: list[Action] = []
        try:
            if after is not None and not after.done():
                await after  # only ever gets a result (see Workspaces.publish)
            result = await self.hub.workspaces.publish(
                request.workspace,
                request.events,
                producer=request.agent,
                expected_seq=request.expected_seq,
                submitted=submitted,
            )
            actions = self.session.completed(request, result)
        except Exception as e:
            actions = self._failed(request, e)
        finally:
            self._published(request, submitted, actions)

    def _published(
        self, request: PublishRequest, submitted: asyncio.Future[None], actions: list[Action]
    ) -> None:
        """A publish ended: release the next one's turn and its slot, queue its reply. The
        reply is pushed without waiting: the slot bounds how many there are (see _publish)."""
        if not submitted.done():
            submitted.set_result(None)
        if self._publish_tails.get(request.workspace) is submitted:
            del self._publish_tails[request.workspace]
        if not self._stopping:
            for action in actions:
                if isinstance(action, Send):
                    self.queue.push((encode_frame(action.frame), None, NOT_AN_EVENT))
                elif isinstance(action, Close):
                    self.queue.push(action)
        self.publishes.release()

    # -- executions -------------------------------------------------------------------------------

    async def _runtime_op(self, request: ExecRequest | DisposeRequest) -> Any:
        runtime = self.hub.runtime
        if isinstance(request, ExecRequest):
            return await runtime.exec(
                request.workspace, request.frame, capability=request.capability
            )
        await runtime.dispose(request.workspace, request.exec_id, capability=request.capability)
        return None

    def _beside(self, request: ExecResultRequest | KillRequest) -> None:
        """Answer ``request`` from a task of the connection: it waits for an execution."""

        async def answer() -> None:
            runtime = self.hub.runtime
            work: Coroutine[Any, Any, Any]
            if isinstance(request, KillRequest):
                # Owned by the hub: a kill the hub accepted completes even if this connection
                # goes away.
                work = self.hub.owned(
                    runtime.kill(request.workspace, request.exec_id, capability=request.capability)
                )
            else:
                work = runtime.result(
                    request.workspace, request.exec_id, capability=request.capability
                )
            await self._answer(request, work)

        if self._spawn(answer(), f"{type(request).__name__}:{request.exec_id}") is None:
            self.session.failed(request, Unavailable("the connection is closing"))

    async def _follow(self, request: GetExecRequest) -> None:
        """Stream an execution's events as ``execEvent`` frames, then ``execEnd``."""
        try:
            stream = await self.hub.runtime.follow(
                request.workspace, request.exec_id, request.resume, capability=request.capability
            )
        except Exception as e:
            await self._perform(self._failed(request, e))
            return
        async with stream:
            try:
                async for event, text in stream.items():
                    frame = encode_exec_event_frame(
                        request.rid, request.workspace, request.exec_id, encode_event(event), text
                    )
                    await self.queue.put((frame, None, NOT_AN_EVENT))
            except Exception as e:
                await self._perform(self._failed(request, e))
                return
        await self._perform(self.session.completed(request, stream.status))

    async def _answer(self, request: Request, work: Coroutine[Any, Any, Any]) -> bool:
        try:
            result = await work
        except Exception as e:
            return await self._perform(self._failed(request, e))
        return await self._perform(self.session.completed(request, result))

    def _failed(self, request: Request, exc: Exception) -> list[Action]:
        if not isinstance(exc, AgoraError) or exc.code == "internal":
            log.error(
                "request failed (agent=%s peer=%s): %r",
                self._agent,
                self.peer,
                request,
                exc_info=exc,
            )
        return self.session.failed(request, exc)

    # -- subscriptions ------------------------------------------------------------------------

    async def _subscribe(self, request: SubscribeRequest) -> bool:
        agent = self.session.agent
        assert agent is not None
        workspace = request.workspace
        subscription = Subscription(
            self, workspace, agent, pending_limit=self.hub.config.limits.send_queue
        )
        # Registered before the head is read: every later commit reaches the buffer.
        self.hub.fanout.add(subscription)
        self.subscriptions[workspace] = subscription
        try:
            # at_least: a client resuming here may have seen a later seq on another node.
            head = await self.hub.workspaces.head(workspace, at_least=request.after_seq)
            if request.after_seq is not None and request.after_seq > head:
                raise BadRequest(
                    f"afterSeq {request.after_seq} is beyond the head {head}",
                    field="$.afterSeq",
                    head=head,
                )
        except Exception as e:
            self.hub.fanout.remove(subscription)
            del self.subscriptions[workspace]
            return await self._perform(self._failed(request, e))
        start = head if request.after_seq is None else request.after_seq
        subscription.last_seq = start
        self.last_sent[workspace] = start
        if not await self._perform(self.session.completed(request, head)):
            return False
        self.present.add(workspace)
        self.hub.presence.enter(agent, workspace)
        if start < head:
            task = self._spawn(self._catch_up(subscription, head, request), f"catch-up:{workspace}")
            if task is not None:
                self.catch_ups[workspace] = task
        else:
            subscription.go_live()
        return True

    async def _catch_up(
        self, subscription: Subscription, head: int, request: SubscribeRequest
    ) -> None:
        """Queue the events after ``subscription.last_seq`` up to ``head`` from the store,
        then switch the subscription to live (no gap, no duplicate: see hub.server.fanout)."""
        workspace = subscription.workspace
        try:
            last = subscription.last_seq
            while last < head:
                page = await self.hub.store.read_raw(
                    workspace, after_seq=last, limit=min(CATCH_UP_PAGE, head - last)
                )
                if not page:
                    raise Internal(f"the log of {workspace!r} ends at {last}, before {head}")
                for seq, body in page:
                    if seq > head:
                        break
                    await self.queue.put((encode_event_frame(workspace, body), workspace, seq))
                    subscription.last_seq = last = seq
            subscription.go_live()
        except Exception as e:
            # The subscription ends; the error (with the subscribe's rid) says so.
            self._end_subscription(workspace, "closed")
            self.session.ended(workspace)
            await self._perform(self._failed(request, e))
        finally:
            if self.catch_ups.get(workspace) is asyncio.current_task():
                del self.catch_ups[workspace]

    async def _unsubscribe(self, request: UnsubscribeRequest) -> None:
        task = self.catch_ups.pop(request.workspace, None)
        if task is not None:
            task.cancel()
            await asyncio.wait([task])
        self._end_subscription(request.workspace, "unsubscribed")

    def _leave_reason(self) -> str:
        if self.close_code == CloseCode.TOO_SLOW:
            return "tooSlow"
        if self.close_code == CloseCode.UNAUTHORIZED:
            return "unauthorized"
        return "shutdown" if self.hub.stopping else "closed"

    def _end_subscription(self, workspace: str, reason: str) -> None:
        subscription = self.subscriptions.pop(workspace, None)
        if subscription is not None:
            self.hub.fanout.remove(subscription)
        self.last_sent.pop(workspace, None)
        agent = self.session.agent
        if workspace in self.present and agent is not None:
            self.present.discard(workspace)
            self.hub.presence.exit(agent, workspace, reason)

    # -- writing ----------------------------------------------------------------------------------

    async def _write(self) -> None:
        """Send what is queued, in order: every frame queued (up to :data:`WRITE_BYTES`) is
        framed by the protocol object and the lot written with ONE ``transport.write``; the
        writer waits only when the transport is above its high-water mark (``drain``).

        It writes inside ``ws.send_context()``, as ``ws.send`` does: that checks the
        connection is open, and on exit writes anything else pending, drains, and on a
        failure or a close under way waits for the connection to end and raises
        ``ConnectionClosed``. Between entering it and the write nothing yields, so a ping,
        pong or close frame (each written by websockets the same way) only ever comes
        between whole frames (RFC 6455 §5.4), never inside the batch."""
        queue, ws, last_sent = self.queue, self.ws, self.last_sent
        protocol = ws.protocol
        while True:
            await queue.wait()
            head = queue.peek()
            if isinstance(head, Close):  # nothing to send before it
                queue.popleft()
                self.stop(head.code, head.reason)
                return
            while ws.send_in_progress is not None:  # a fragmented send (we make none)
                await asyncio.shield(ws.send_in_progress)
            close: Close | None = None
            async with ws.send_context():
                size = 0
                while queue and size < WRITE_BYTES:
                    item = queue.popleft()
                    if isinstance(item, Close):
                        close = item
                        break
                    data, workspace, seq = item
                    if workspace is not None and workspace in last_sent:
                        # Recorded as the frame goes into the transport, ahead of any close
                        # frame: the 4408 reason names the last seq the client will get.
                        last_sent[workspace] = seq
                    protocol.send_text(data)
                    size += len(data)
                # send_text only adds frames (never the EOF marker b"").
                ws.transport.write(b"".join(protocol.data_to_send()))
            if close is not None:
                self.stop(close.code, close.reason)
                return


def _peer(ws: ServerConnection) -> str:
    try:
        address = ws.remote_address
    except Exception:  # the transport is already gone
        return "?"
    if isinstance(address, tuple) and len(address) >= 2:
        return f"{address[0]}:{address[1]}"
    return str(address)


def _close_code(ws: ServerConnection) -> tuple[int, str]:
    """The close code of a finished connection and who sent it first (hub/client/network)."""
    protocol = ws.protocol
    if protocol.close_sent is not None and protocol.close_rcvd_then_sent is not True:
        return protocol.close_sent.code, "hub"
    if protocol.close_rcvd is not None:
        return protocol.close_rcvd.code, "client"
    return 1006, "network"
