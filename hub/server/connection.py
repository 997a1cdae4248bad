"""One client connection: the thin websockets shell around the pure session.

:class:`Connection` feeds what arrives on the socket to :class:`hub.core.wire.session.ServerSession`
and carries out the actions it returns. In a TaskGroup of its own it holds a reader (frames in
→ the session → actions), a writer (the bounded send queue → the socket) and one catch-up task
per subscription that is still reading history. Any of them may stop the connection; the
others are then cancelled, and the connection is torn down: its subscriptions leave the
fan-out, presence is updated, and the close frame goes out.

Publishes are pipelined: the reader starts them as tasks of the hub's group
(:class:`hub.server.tasks.OwnedTasks`) and reads on, up to :data:`PUBLISHES_IN_FLIGHT` per
connection (then it waits: back-pressure). What the client pipelined and websockets has
already buffered is taken at once (up to :data:`READ_AHEAD` frames, as long as they are
publishes), and each workspace's run of those publishes starts as ONE task: decided in one
pass and handed to the store as one group (:meth:`hub.workspaces.Workspaces.publish_many`),
with one wake-up for the lot, not a task, futures and a wake-up per publish; its acks are
queued together, one per publish, in order (encoded straight to bytes). A single publish takes
the same path (a batch of one). Each batch waits until the connection's previous
batch to the same workspace has been handed to the store (the ``submitted`` hook of
:meth:`hub.workspaces.Workspaces.publish`), so one connection's publishes to a workspace are
appended in the order they were sent; the acks are queued when the appends complete (acks
carry the ``rid``, so they may come in completion order). Every other request waits for the
connection's publishes in flight first. With tracing on, publishes go one by one (a span each).

Requests that wait for an execution (``execResult``, ``kill``, ``getExec``) run as tasks of the
connection, beside the reader.

The writer takes every frame queued at once and writes them with one ``transport.write``
(RFC 6455 frames, one syscall for many). Without extensions it frames them itself (an event
comes framed from the fan-out, built once for every subscriber: ``WireText``); with
permessage-deflate the ``websockets`` protocol object frames and compresses each one.

When the writer is idle (nothing queued, parked waiting for a frame) and the socket keeps up
(the transport buffers nothing), a committed batch from the fan-out and a batch's acks are
written at once by whoever produced them (:meth:`Connection._write_now`): no wake-up of the
writer task and no loop iteration between the commit and the socket. Anything else, and
everything while the writer or the socket is busy, goes through the queue, so frames still
leave in the order they were produced and a slow reader still meets the bounded queue (4408).

On a worker of ``agora serve --workers N``, a frame for a workspace another worker owns goes
to that worker instead of the session (:class:`hub.server.workers.Forwarder`), and what the
owner answers comes back through this connection's send queue.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Coroutine
from typing import TYPE_CHECKING, Any, Final

import msgspec
from websockets.asyncio.server import ServerConnection
from websockets.exceptions import ConnectionClosed
from websockets.frames import Opcode
from websockets.protocol import State

from hub.core.errors import (
    AgoraError,
    BadRequest,
    Busy,
    CloseCode,
    Internal,
    TooLarge,
    Unauthorized,
    Unavailable,
)
from hub.core.events import encode_event
from hub.core.projections.workspace import WorkspaceState
from hub.core.records import AppendResult
from hub.core.wire.session import (
    Action,
    BlobRequest,
    CheckpointRequest,
    Close,
    CosignRequest,
    DisposeRequest,
    ExecRequest,
    ExecResultRequest,
    GetExecRequest,
    KillRequest,
    ProofRequest,
    PublishRequest,
    Request,
    Send,
    ServerSession,
    StateRequest,
    SubscribeRequest,
    UnsubscribeRequest,
    encode_ack,
    encode_event_frame,
    encode_exec_event_frame,
    encode_frame,
)
from hub.server.fanout import (
    NOT_AN_EVENT,
    FanoutSubscription,
    LiveFrames,
    Outgoing,
    SendQueue,
    WireText,
    text_frame,
)
from hub.server.tasks import InFlight
from hub.server.workers import RELAY_HEADER, Forwarder, NodePlacement

if TYPE_CHECKING:
    from hub.server.app import Hub

__all__ = ["CATCH_UP_PAGE", "PUBLISHES_IN_FLIGHT", "READ_AHEAD", "WRITE_BYTES", "Connection"]

log = logging.getLogger("agora.server")

CATCH_UP_PAGE: Final = 256
"""Events read from the store per page while a subscriber catches up."""

PUBLISHES_IN_FLIGHT: Final = 64
"""Publishes one connection may have in flight; the reader then waits for one to finish."""

READ_AHEAD: Final = PUBLISHES_IN_FLIGHT
"""Frames the reader takes at once when the client has pipelined them (already buffered)."""

WRITE_BYTES: Final = 64 * 1024
"""The writer hands the transport at most this much per write (then drains if it must)."""

TOKEN_CLOSE_GRACE_S: Final = 0.5
"""After a token ended (expired, revoked), how long the writer has to send the error and the
4401 close behind what is queued before the connection is closed without them."""


def _relayed_by(hub: Hub, ws: ServerConnection) -> str | None:
    """The node that relays this connection (``[cluster] owners``: a valid ``Agora-Relay``
    header), or None: a client's own connection (a header without a valid proof is ignored)."""
    request = ws.request
    if not isinstance(hub.placement, NodePlacement) or request is None:
        return None
    header = request.headers.get(RELAY_HEADER)
    node = hub.signer.relay_node(header) if header else None
    if node is not None and node == hub.node_id:
        # Its own URL reaches itself: [cluster] url names no address the other nodes reach.
        log.error("node %s relayed a connection to itself: check [cluster] url", node)
    return node


class Connection:
    """One client connection: the session, its send queue, subscriptions and tasks.

    ``hub``: the composition root, for the services the connection uses (signer, fan-out,
    presence, workspaces, runtime, the owned tasks) and the settings built there."""

    def __init__(self, hub: Hub, ws: ServerConnection, *, internal: bool = False) -> None:
        self.hub = hub
        self.ws = ws
        self.internal = internal  # an upstream of another worker (hub.server.workers)
        self.peer = "internal" if internal else _peer(ws)
        self.session = ServerSession(
            hub.revocations.verifier(hub.signer.verify),
            limits=hub.config.limits,
            clock=hub.clock,
            monotonic=hub.monotonic,
            default_backend=hub.runtime.default_backend,
            on_error=hub.metrics.request_failed,
            server=hub.server_name,
        )
        limits = hub.config.limits
        self.queue: SendQueue[Outgoing | Close] = SendQueue(
            limits.send_queue, max_bytes=limits.send_queue_bytes, size=_frame_bytes
        )
        self._admitted: str | None = None  # the agent counted in hub.admission
        self.subscriptions: dict[str, FanoutSubscription] = {}
        self.catch_ups: dict[str, asyncio.Task[None]] = {}
        self.present: set[str] = set()  # workspaces this connection counts in Presence
        self.last_sent: dict[str, int] = {}  # per subscribed workspace: last seq to the socket
        self.close_code: int | None = None
        self.close_reason = ""
        self.publishes = InFlight(PUBLISHES_IN_FLIGHT)
        # Per workspace: the ``submitted`` future of the connection's last publish in flight.
        self._publish_tails: dict[str, asyncio.Future[None]] = {}
        self._stopping = False
        # True while the writer waits for a frame with nothing queued: then a producer may
        # write to the transport itself (see _write_now).
        self._writer_idle = False
        self._announced = False
        self._tasks: set[asyncio.Task[None]] = set()
        self._tg: asyncio.TaskGroup | None = None
        self.authorization: str | None = None  # the handshake's Authorization header
        # With workers or [cluster] owners: frames for workspaces another process owns go
        # to it (not on an upstream, whose frames are this process's own; nor on a node's
        # relay: RELAY_HEADER).
        placement = hub.placement
        self.relayed_by = _relayed_by(hub, ws)  # the node relaying this client, if one is
        self.forwarder: Forwarder | None = (
            Forwarder(self, placement, limits.max_depth)
            if placement is not None and not internal and self.relayed_by is None
            else None
        )

    # -- Outlet (called synchronously by the fan-out) ------------------------------------------

    def offer(self, frames: LiveFrames) -> bool:
        if self._stopping:
            return True  # going away: drop silently, the close tells the client where it was
        if self._write_now(frames.wire):
            if frames.workspace in self.last_sent:  # as the writer records it
                self.last_sent[frames.workspace] = frames.last
            return True
        return self.queue.offer_many(frames.items, frames.nbytes)

    def _write_now(self, wire: bytes) -> bool:
        """Write ``wire`` (whole WebSocket frames) to the transport at once if nothing can be
        ahead of it: the writer is idle with nothing queued, the connection is open without
        extensions, and the transport holds nothing (the socket keeps up; else the frames
        queue, and a reader that does not keep up meets the bounded queue). At most
        :data:`WRITE_BYTES`, as the writer hands over. Returns whether it wrote.

        Saves the writer task's wake-up and a loop iteration per connection (the fan-out's
        latency and most of its cost per subscriber). Written synchronously, as the writer
        does inside ``send_context``: a ping, pong or close from websockets only ever comes
        between whole frames."""
        ws = self.ws
        if not self._writer_idle or self.queue or len(wire) > WRITE_BYTES:
            return False
        protocol, transport = ws.protocol, ws.transport
        if (
            protocol.state is not State.OPEN
            or protocol.extensions
            or ws.send_in_progress is not None
            or transport.get_write_buffer_size()
            or transport.is_closing()
        ):
            return False
        transport.write(wire)
        return True

    def overflow(self) -> None:
        self.stop(CloseCode.TOO_SLOW)

    async def _put(self, item: Outgoing, *, paced: bool = False) -> bool:
        """Queue a reply, or a catch-up/stream frame (``paced``: waits for room in bytes too);
        False when that took the queue over ``[limits] send_queue_bytes``: the connection is
        then closed with 4408 (a client that sends requests and reads no replies)."""
        self._fanout_first()
        await self.queue.put(item, paced=paced)
        return self._within_bytes()

    def _push(self, item: Outgoing) -> bool:
        """Queue a frame without waiting (the caller bounds how many); False as :meth:`_put`."""
        self._fanout_first()
        self.queue.push(item)
        return self._within_bytes()

    def _fanout_first(self) -> None:
        """Before anything else goes to this client: the events the fan-out holds for the end
        of the iteration (hub.server.fanout) of a workspace it follows. What was committed
        before a frame was produced reaches a subscriber before it, as when the fan-out wrote
        in its listener call: a client that has the ack of its publish has its events too."""
        subscriptions = self.subscriptions
        if subscriptions and self.hub.fanout.holds(subscriptions):
            self.hub.fanout.flush()

    def _within_bytes(self) -> bool:
        if self.queue.overflowing:
            self.stop(CloseCode.TOO_SLOW)
            return False
        return True

    # -- for the relay to the owner of other workspaces (hub.server.workers) -------------------

    @property
    def authenticated(self) -> bool:
        return self._announced

    def spawn_task(self, coro: Coroutine[Any, Any, None], role: str) -> asyncio.Task[None] | None:
        """Run ``coro`` as a task of the connection (cancelled when it stops)."""
        return self._spawn(coro, role)

    async def relay(self, item: Outgoing) -> bool:
        """Queue a frame another worker sent for this client (paced); False as :meth:`_put`."""
        return await self._put(item, paced=True)

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
        if self.forwarder is not None:
            await self.forwarder.aclose()
        if self._admitted is not None:
            self.hub.admission.release_agent(self._admitted)
            self._admitted = None
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
        self.hub.metrics.closed(sent, by)
        log.info(
            "close agent=%s peer=%s code=%s by=%s%s",
            self._agent,
            self.peer,
            sent,
            by,
            f" reason={reason}" if reason else "",
            extra={"agent": self.session.agent, "peer": self.peer, "code": sent},
        )

    @property
    def _agent(self) -> str:
        return self.session.agent or "-"

    # -- reading ----------------------------------------------------------------------------------

    async def _read(self) -> None:
        request = self.ws.request
        authorization = request.headers.get("Authorization") if request is not None else None
        self.authorization = authorization
        forwarder = self.forwarder
        actions = self.session.open(authorization)
        limits = self.hub.config.limits
        hello_by = asyncio.get_running_loop().time() + limits.hello_timeout_s
        # Traced publishes go one by one (a span each, see _traced_publish): no read-ahead.
        ahead = 1 if self.hub.tracing.enabled else READ_AHEAD
        while True:
            if not await self._perform(actions):
                return
            if not self._announced and self.session.agent is not None:
                self._announced = True
                # An upstream was admitted where the client connected (hub.server.workers).
                if not self.internal and not await self._traced_admit(self.session.agent):
                    return
                log.info(
                    "open agent=%s peer=%s",
                    self.session.agent,
                    self.peer,
                    extra={"agent": self.session.agent, "peer": self.peer},
                )
                self._spawn(self._end_with_token(), "token")
            if self._announced:
                data = await self.ws.recv()  # ConnectionClosed ends it (see _guard)
            else:
                try:
                    # An unauthenticated connection holds memory and a socket for nothing:
                    # it has [limits] hello_timeout_s to send a valid hello.
                    async with asyncio.timeout_at(hello_by):
                        data = await self.ws.recv()
                except TimeoutError:
                    late = Unauthorized(
                        f"no hello within {limits.hello_timeout_s:g} s",
                        reason="helloTimeout",
                    )
                    log.info("hello timeout peer=%s", self.peer)
                    await self._perform(self.session.failed(None, late))
                    return
            if forwarder is not None and isinstance(data, str) and await forwarder.route(data):
                actions = []  # relayed to the workspace's owner
                continue
            actions = self._receive(data)
            # Pipelined frames already buffered (websockets parsed them from the same reads)
            # are taken now, without waiting: a run of publishes then reaches the workspace
            # pipeline as one batch (see _perform). The lookahead stops at anything but a
            # publish, so every other request still sees the effects of what came before.
            taken, more = 1, _publishes_only(actions)
            while more and taken < ahead:
                buffered = _take_buffered(self.ws)
                if buffered is None:
                    break
                if (
                    forwarder is not None
                    and isinstance(buffered, str)
                    and await forwarder.route(buffered)
                ):
                    taken += 1
                    continue
                received = self._receive(buffered)
                actions.extend(received)
                taken, more = taken + 1, _publishes_only(received)

    def _receive(self, data: str | bytes) -> list[Action]:
        if isinstance(data, str):
            return self.session.receive(data)
        return self.session.receive_binary(data)

    async def _traced_admit(self, agent: str) -> bool:
        """:meth:`_admit`, as the span ``agora.hello`` (the child of the hello's
        ``traceparent``) when tracing is on."""
        tracing = self.hub.tracing
        if not tracing.enabled:
            return await self._admit(agent)
        attributes = {"agora.agent": agent, "agora.peer": self.peer}
        with tracing.span(
            "agora.hello", self.session.hello_traceparent, attributes=attributes
        ) as span:
            admitted = await self._admit(agent)
            if span is not None:
                span.set_attribute("agora.admitted", admitted)
            return admitted

    async def _admit(self, agent: str) -> bool:
        """Count the connection under ``agent``; over ``[limits] max_connections_per_agent``
        tell it ``busy`` and close with 1013 (try again later). False when refused."""
        admission = self.hub.admission
        if admission.admit_agent(agent):
            self._admitted = agent
            return True
        log.warning("refused agent=%s peer=%s: max_connections_per_agent", agent, self.peer)
        busy = Busy(
            f"agent {agent!r} has {admission.max_per_agent} connections open",
            limit=admission.max_per_agent,
            field="max_connections_per_agent",
        )
        actions = self.session.failed(None, busy)
        actions.append(Close(int(CloseCode.TRY_AGAIN), "too many connections for this agent"))
        await self._perform(actions)
        return False

    async def _end_with_token(self) -> None:
        """Close the connection (error ``unauthorized``, then 4401) once its token expires or
        is revoked, even while the client only reads (subscriptions, ``getExec``). A second
        ``hello`` with a fresh token moves the end."""
        while True:
            capability = self.session.capability
            assert capability is not None
            error = await self.hub.revocations.until_ended(capability)
            if self.session.capability is not capability:
                continue  # refreshed meanwhile: wait on the new token
            reason = error.details.get("reason")
            log.info("token ended agent=%s peer=%s reason=%s", self._agent, self.peer, reason)
            close: Close | None = None
            for action in self.session.failed(None, error):
                if isinstance(action, Send):
                    self._push((encode_frame(action.frame), None, NOT_AN_EVENT))
                elif isinstance(action, Close):
                    self.queue.push(close := action)
            await asyncio.sleep(TOKEN_CLOSE_GRACE_S)
            if close is not None:  # the writer is stuck behind a slow reader: close now
                self.stop(close.code, close.reason)
            return

    async def _perform(self, actions: list[Action]) -> bool:
        """Carry out the session's actions; False once a ``Close`` was queued.

        A publish is started and left running (see :meth:`_publish`); anything else but a
        plain frame first waits for the publishes in flight, so that it sees their effects
        and their acks go out before a close."""
        publishes: list[PublishRequest] = []
        for action in actions:
            if type(action) is PublishRequest:
                publishes.append(action)
                continue
            if publishes:  # started before what follows them, as one batch
                await self._publish(publishes)
                publishes = []
            match action:
                case Send(frame=frame):
                    if not await self._put((encode_frame(frame), None, NOT_AN_EVENT)):
                        return False
                    continue
            if self.publishes.count:
                await self.publishes.wait_below(1)
            match action:
                case Close():
                    self._fanout_first()
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
                    if not await self._answer(action, self._state(action)):
                        return False
                case ExecRequest() | DisposeRequest():
                    work = self.hub.tasks.owned(self._runtime_op(action))
                    if not await self._answer(action, work):
                        return False
                case ExecResultRequest() | KillRequest():
                    self._beside(action)
                case GetExecRequest():
                    if self._spawn(self._follow(action), f"getExec:{action.exec_id}") is None:
                        self.session.failed(action, Unavailable("the connection is closing"))
                case CheckpointRequest() | ProofRequest() | CosignRequest():
                    if not await self._answer(action, self.hub.audit.answer(action)):
                        return False
                case BlobRequest():
                    if not await self._answer_blob(action):
                        return False
        if publishes:
            await self._publish(publishes)
        return True

    # -- publishing -------------------------------------------------------------------------------

    async def _publish(self, requests: list[PublishRequest]) -> None:
        """Start appending ``requests`` (in the order sent) and return: each workspace's run of
        them as one batch, a task of the hub's group (a publish the hub accepted is written
        even if the connection goes away). Waits first while the connection has
        :data:`PUBLISHES_IN_FLIGHT` publishes in flight (then a batch takes the slots free),
        or while its send queue is at the low-water mark (each publish in flight may push
        one ack)."""
        by_workspace: dict[str, list[PublishRequest]] = {}
        for request in requests:
            by_workspace.setdefault(request.workspace, []).append(request)
        queue, publishes = self.queue, self.publishes
        for batch in by_workspace.values():
            while batch:
                await queue.wait_room()  # in frames and in bytes
                if publishes.count >= publishes.limit:
                    await publishes.wait_below(publishes.limit)
                room = publishes.limit - publishes.count
                self._start(batch[:room])
                batch = batch[room:]

    def _start(self, batch: list[PublishRequest]) -> None:
        """Start one batch of publishes to one workspace, chained after the connection's
        previous batch to it."""
        workspace = batch[0].workspace
        after = self._publish_tails.get(workspace)
        submitted: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._publish_tails[workspace] = submitted
        self.publishes.count += len(batch)
        if self.hub.tasks.spawn(self._append(batch, after, submitted), "agora-publish") is None:
            # The hub is stopping (spawn closed the coroutine, whose finally never ran).
            stopping = Unavailable("the hub is stopping; retry later")
            self._published(batch, submitted, [self._failed(r, stopping) for r in batch])

    async def _append(
        self,
        batch: list[PublishRequest],
        after: asyncio.Future[None] | None,
        submitted: asyncio.Future[None],
    ) -> None:
        """One batch of publishes to one workspace, in the hub's group: wait for the
        connection's previous batch to the workspace to be handed to the store (``after``),
        append (several at once: :meth:`hub.workspaces.Workspaces.publish_many`), queue the
        acks. Never raises (but CancelledError)."""
        replies: list[bytes | list[Action]] = []  # an ack, encoded, or the session's answer
        try:
            if after is not None and not after.done():
                await after  # only ever gets a result (see Workspaces.publish)
            if len(batch) > 1 or not self.hub.tracing.enabled:
                outcomes = await self.hub.workspaces.publish_many(
                    batch[0].workspace,
                    [(r.events, r.expected_seq) for r in batch],
                    producer=batch[0].agent,
                    submitted=submitted,
                )
                for request, outcome in zip(batch, outcomes, strict=True):
                    if isinstance(outcome, Exception):
                        replies.append(self._failed(request, outcome))
                    else:
                        replies.append(encode_ack(request, outcome))
                return
            request = batch[0]  # traced: one by one (no read-ahead), a span each
            try:
                result = await self._traced_publish(request, submitted)
                replies.append(encode_ack(request, result))
            except Exception as e:
                replies.append(self._failed(request, e))
        except Exception as e:
            done = len(replies)
            replies.extend(self._failed(r, e) for r in batch[done:])
        finally:
            self._published(batch, submitted, replies)

    async def _traced_publish(
        self, request: PublishRequest, submitted: asyncio.Future[None]
    ) -> AppendResult:
        """The publish as a span ``agora.publish`` (validate, decide, append, fan-out), the
        child of the first draft's ``traceparent``. The drafts are not stamped with the span:
        a retried publish must stay byte-identical to be recognised as a duplicate."""
        tracing = self.hub.tracing
        parent = next((e.traceparent for e in request.events if e.traceparent), None)
        attributes: dict[str, str | int] = {
            "agora.workspace": request.workspace,
            "agora.agent": request.agent,
            "agora.events": len(request.events),
        }
        with tracing.span("agora.publish", parent, attributes=attributes) as span:
            result = await self.hub.workspaces.publish(
                request.workspace,
                request.events,
                producer=request.agent,
                expected_seq=request.expected_seq,
                submitted=submitted,
            )
            if span is not None and result.events:
                span.set_attribute("agora.seq", result.events[-1].seq)
                subscribers = self.hub.fanout.subscribers(request.workspace)
                span.set_attribute("agora.subscribers", subscribers)
            return result

    def _published(
        self,
        batch: list[PublishRequest],
        submitted: asyncio.Future[None],
        replies: list[bytes | list[Action]],
    ) -> None:
        """A batch of publishes ended: release the next batch's turn and their slots, queue
        their replies (one per publish, in order), or write them at once to an idle socket
        (:meth:`_write_now`). The replies are pushed without waiting: the slots bound how
        many there are (see _start)."""
        if not submitted.done():
            submitted.set_result(None)
        workspace = batch[0].workspace
        if self._publish_tails.get(workspace) is submitted:
            del self._publish_tails[workspace]
        if not self._stopping:
            items: list[Outgoing | Close] = []
            closing = False
            for reply in replies:
                if type(reply) is bytes:
                    items.append((reply, None, NOT_AN_EVENT))
                    continue
                for action in reply:
                    if isinstance(action, Send):
                        items.append((encode_frame(action.frame), None, NOT_AN_EVENT))
                    elif isinstance(action, Close):
                        items.append(action)
                        closing = True
            # Straight to an idle socket, as the fan-out's frames (see _write_now): the acks
            # then leave in the iteration their commit was heard in, after its events when
            # this client follows the workspace.
            self._fanout_first()
            wrote = False
            if not closing and items and self._writer_idle and not self.queue:
                frames = [text_frame(item[0]) for item in items if not isinstance(item, Close)]
                wrote = self._write_now(frames[0] if len(frames) == 1 else b"".join(frames))
            if not wrote:
                self.queue.push_many(items)
                self._within_bytes()
        self.publishes.release(len(batch))

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
                work = self.hub.tasks.owned(
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
                    if not await self._put((frame, None, NOT_AN_EVENT), paced=True):
                        return
            except Exception as e:
                await self._perform(self._failed(request, e))
                return
        await self._perform(self.session.completed(request, stream.status))

    async def _state(self, request: StateRequest) -> WorkspaceState:
        state = await self.hub.workspaces.state(request.workspace, at_seq=request.at_seq)
        return state_reply(state, request, self.hub.config.limits.max_state_contents_bytes)

    async def _answer_blob(self, request: BlobRequest) -> bool:
        """A blob op, answered in the reader (one chunk at a time: the client's window and
        this wait are the transfer's back-pressure); its reply is queued paced, as it may be
        half a megabyte."""
        try:
            result = await self.hub.blob_ops.answer(request)
        except Exception as e:
            return await self._perform(self._failed(request, e))
        for action in self.session.completed(request, result):
            if isinstance(action, Send):
                frame = (encode_frame(action.frame), None, NOT_AN_EVENT)
                if not await self._put(frame, paced=True):
                    return False
        return True

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
        subscription = FanoutSubscription(
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
        subscription.cursor.advance(start)
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
        self, subscription: FanoutSubscription, head: int, request: SubscribeRequest
    ) -> None:
        """Queue the events after ``subscription.cursor`` up to ``head`` from the store,
        then switch the subscription to live (no gap, no duplicate: see hub.server.fanout)."""
        workspace = subscription.workspace
        try:
            cursor = subscription.cursor
            while (last := cursor.last) < head:
                page = await self.hub.workspaces.read_raw(
                    workspace, after_seq=last, limit=min(CATCH_UP_PAGE, head - last)
                )
                if not page:
                    raise Internal(f"the log of {workspace!r} ends at {last}, before {head}")
                for seq, body in page:
                    if seq > head:
                        break
                    item = (encode_event_frame(workspace, body), workspace, seq)
                    if not await self._put(item, paced=True):
                        return
                    cursor.advance(seq)
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
            if not queue:
                self._writer_idle = True  # producers may write themselves meanwhile
                try:
                    await queue.wait()
                finally:
                    self._writer_idle = False
            head = queue.peek()
            if isinstance(head, Close):  # nothing to send before it
                queue.popleft()
                self.stop(head.code, head.reason)
                return
            while ws.send_in_progress is not None:  # a fragmented send (we make none)
                await asyncio.shield(ws.send_in_progress)
            close: Close | None = None
            async with ws.send_context():
                # Without extensions a server frame is header + payload (unmasked): the
                # fan-out's events come framed already (WireText.wire, built once for every
                # subscriber), the rest is framed here; with permessage-deflate the protocol
                # object frames (and compresses) each one.
                plain = not protocol.extensions
                chunks: list[bytes] = []
                for item in queue.take(WRITE_BYTES, _is_close):
                    if isinstance(item, Close):
                        close = item
                        break
                    data, workspace, seq = item
                    if workspace is not None and workspace in last_sent:
                        # Recorded as the frame goes into the transport, ahead of any close
                        # frame: the 4408 reason names the last seq the client will get.
                        last_sent[workspace] = seq
                    if not plain:
                        protocol.send_text(data)
                    elif type(data) is WireText:
                        chunks.append(data.wire)
                    else:
                        chunks.append(text_frame(data))
                if not plain:
                    # send_text only adds frames (never the EOF marker b"").
                    chunks = protocol.data_to_send()
                if chunks:
                    ws.transport.write(chunks[0] if len(chunks) == 1 else b"".join(chunks))
            if close is not None:
                self.stop(close.code, close.reason)
                return


def _publishes_only(actions: list[Action]) -> bool:
    """Whether ``actions`` are publishes and nothing else (the read-ahead goes on past them)."""
    if len(actions) == 1:  # (a frame's answer is one action but for errors)
        return type(actions[0]) is PublishRequest
    return all(type(a) is PublishRequest for a in actions)


def _take_buffered(ws: ServerConnection) -> str | bytes | None:
    """The next message when websockets holds all of it already (one whole frame in its
    assembler's queue), taken at once as ``ws.recv()`` would return it (text decoded), without
    a coroutine per message; else None: ``ws.recv()`` it (a fragmented message, text that is
    not UTF-8, which recv fails with 1007). Should the assembler change shape, reading simply
    goes one message at a time (tests/hub/server/test_internals.py names it)."""
    try:
        messages = ws.recv_messages
        frames = messages.frames.queue
        if messages.get_in_progress or not frames:
            return None
        frame = frames[0]
        if not frame.fin:
            return None
        raw = bytes(frame.data)  # (as recv joins a message's frames: bytes)
        data: str | bytes = raw.decode() if frame.opcode is Opcode.TEXT else raw
    except (AttributeError, UnicodeDecodeError):
        return None
    frames.popleft()
    messages.maybe_resume()  # flow control, as the assembler's get does
    return data


def _is_close(item: Outgoing | Close) -> bool:
    return type(item) is Close


def _frame_bytes(item: Outgoing | Close) -> int:
    """What a queued item costs against ``[limits] send_queue_bytes``."""
    return 0 if isinstance(item, Close) else len(item[0])


def state_reply(state: WorkspaceState, request: StateRequest, max_contents: int) -> WorkspaceState:
    """The state a ``state`` request is answered with: only ``request.paths`` (when given),
    and file contents only when ``request.contents``, at most ``max_contents`` bytes of them
    (inline text/base64 as sent), so that a reply is bounded by the metadata, not by what the
    files hold. Raises :class:`TooLarge` over the cap. The projection is not changed."""
    files = state.files
    if request.paths is not None:
        files = {p: files[p] for p in request.paths if p in files}
    if request.contents:
        total = sum(len(e.text or "") + len(e.base64 or "") for e in files.values())
        if total > max_contents:
            raise TooLarge(
                f"the files' contents are {total} bytes, over max_state_contents_bytes "
                f"{max_contents}: ask for fewer paths",
                field="$.contents",
                limit=max_contents,
                size=total,
            )
    else:
        files = {
            p: e
            if e.text is None and e.base64 is None
            else msgspec.structs.replace(e, text=None, base64=None)
            for p, e in files.items()
        }
    if files is state.files:
        return state
    reply = copy.copy(state)
    reply.files = files
    return reply


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
