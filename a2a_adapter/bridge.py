"""The client bridge: external A2A agents (``[[a2a.peers]]``) as workspace members.

A ``needWork`` whose ``consumer`` names a configured peer is sent to that peer with
``SendStreamingMessage`` (a2a-sdk client; the message id is the needWork's event id, the parts
are its payload). The peer's replies come back as events *produced by the peer* (trusted
publish, ``producer`` = the peer's name), mapped by :func:`a2a_adapter.mapping.foreign_kind`:

- its first answer → ``workClaimed`` with payload ``{peer, peerTaskId, peerContextId}`` — the
  peer's task id lives in the log, so it can always be found again;
- WORKING with a message → ``messagePosted``; INPUT_REQUIRED → ``feedbackRequested``;
  AUTH_REQUIRED → ``blocked``; COMPLETED → ``completed``; CANCELED/FAILED/REJECTED →
  ``workCancelled`` (payload ``{a2aState, message}``); artifact updates → ``workPublished``
  (payload = the artifact, with ``append``/``lastChunk``); a plain Message reply →
  ``completed`` with that message.

The other way: a ``feedbackProvided`` by a workspace member while the peer waits for input is
sent to the peer's task (``taskId``/``contextId``), and a ``workCancelled`` by someone else
becomes ``CancelTask`` at the peer.

Restart: "open" is derived from the log — every work item whose consumer is a peer and that
has no terminal event. :meth:`Bridge.run` first resumes each (``SubscribeToTask`` on the
recorded ``peerTaskId``, or the send again if the peer never answered) and then follows new
``needWork``. Events written for the peer's updates have ids derived from the update, so an
update seen twice (a resubscription replays the current Task) is written once.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import aclosing
from typing import Any, Final

import httpx
import msgspec
from a2a.client import Client, ClientConfig, ClientFactory
from a2a.types.a2a_pb2 import (
    AgentCard,
    CancelTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    StreamResponse,
    SubscribeToTaskRequest,
    Task,
    TaskArtifactUpdateEvent,
    TaskState,
    TaskStatus,
)
from a2a.utils.errors import A2AError
from google.protobuf import json_format

from a2a_adapter.mapping import (
    TERMINAL_STATES,
    derived_event_id,
    foreign_kind,
    message_payload,
    message_posted_payload,
    payload_parts,
    plain,
)
from hub.config import PeerConfig
from hub.core.backoff import Backoff
from hub.core.errors import AgoraError, Conflict
from hub.core.events import (
    Blocked,
    Completed,
    Event,
    FeedbackProvided,
    FeedbackRequested,
    MemberJoined,
    MemberPayload,
    MessagePosted,
    NeedWork,
    WorkCancelled,
    WorkClaimed,
    WorkPublished,
)
from hub.core.rules.work import TERMINAL_STATUSES
from hub.follow import FollowerClosed, LogFollower
from hub.workspaces import Workspaces

__all__ = ["Bridge", "PeerLink"]

log = logging.getLogger(__name__)

MAX_BACKOFF: Final = 30.0
FAILURE_BACKOFF: Final = Backoff(initial=0.2, maximum=MAX_BACKOFF, give_up_after=None)
"""Before retrying a peer that failed (``delay(n)`` after the n-th failure in a row)."""
RESUBSCRIBE_BACKOFF: Final = Backoff(
    initial=0.1, maximum=MAX_BACKOFF, jitter=0.0, give_up_after=None
)
"""Before resubscribing to a task whose stream ended while it still runs."""


class PeerLink(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """The ``workClaimed`` payload that ties a work item to the peer's task."""

    peer: str
    peer_task_id: str
    peer_context_id: str = ""


# The kinds a peer's status update can become (besides workClaimed and messagePosted).
_PEER_KINDS: Final[dict[str, type[FeedbackRequested | Blocked | Completed | WorkCancelled]]] = {
    "feedbackRequested": FeedbackRequested,
    "blocked": Blocked,
    "completed": Completed,
    "workCancelled": WorkCancelled,
}

# The item's status as far as the bridge cares (the projection's table, reduced).
_STATUS: Final[dict[str, str]] = {
    "workClaimed": "claimed",
    "feedbackRequested": "feedbackRequested",
    "blocked": "blocked",
    "feedbackProvided": "inProgress",
    "completed": "completed",
    "workCancelled": "cancelled",
}


class _Item:
    """What the bridge knows of one bridged work item (from the log, then from the peer)."""

    def __init__(self, workspace: str, need: NeedWork, peer: PeerConfig) -> None:
        self.workspace = workspace
        self.need = need
        self.cid = need.correlation_id or ""
        self.peer = peer
        self.link: PeerLink | None = None
        self.status: str = "requested"
        self.request_seq = 0  # seq of the peer's last feedbackRequested/blocked
        self.feedback: list[FeedbackProvided] = []  # members' answers after request_seq
        self.sent: set[str] = set()  # feedback event ids forwarded to the peer
        self.cancelled_by_member = False
        self.changed = asyncio.Event()

    @property
    def done(self) -> bool:
        return self.status in TERMINAL_STATUSES

    def observe(self, ev: Event) -> None:
        """Fold one of the item's events from the log."""
        if ev.correlation_id != self.cid:
            return
        if isinstance(ev, WorkClaimed) and ev.producer == self.peer.name and self.link is None:
            with contextlib.suppress(msgspec.ValidationError):
                self.link = msgspec.convert(ev.payload, PeerLink)
        if ev.kind in ("feedbackRequested", "blocked") and ev.producer == self.peer.name:
            self.request_seq = ev.seq
            self.feedback = [f for f in self.feedback if f.seq > ev.seq]
        if isinstance(ev, FeedbackProvided) and ev.producer != self.peer.name:
            self.feedback.append(ev)
        if isinstance(ev, WorkCancelled) and ev.producer != self.peer.name:
            self.cancelled_by_member = True
        status = _STATUS.get(ev.kind)
        if status is not None and not self.done:
            self.status = status
        self.changed.set()

    @property
    def waiting(self) -> bool:
        """Whether the peer asked for input and no member answered yet."""
        return self.status in ("feedbackRequested", "blocked")

    def pending_feedback(self) -> FeedbackProvided | None:
        for fb in self.feedback:
            if fb.seq > self.request_seq and fb.id not in self.sent:
                return fb
        return None


class Bridge:
    """Drives every open work item addressed to a configured peer. Run :meth:`run` as a task
    (it returns only when cancelled); at most ``max_items`` items are driven at once."""

    def __init__(
        self,
        workspaces: Workspaces,
        peers: Sequence[PeerConfig],
        *,
        follower: LogFollower | None = None,
        http_timeout: float = 30.0,
        max_items: int = 256,
        queue_size: int = 1024,
    ) -> None:
        self.workspaces = workspaces
        self.peers = {p.name: p for p in peers}
        self.follower = follower or LogFollower(workspaces)
        self._own_follower = follower is None
        self.http_timeout = http_timeout
        self._slots = asyncio.Semaphore(max_items)
        self._queue: asyncio.Queue[tuple[str, str]] = asyncio.Queue(queue_size)
        self._overflow = asyncio.Event()
        self._driving: set[tuple[str, str]] = set()
        self._clients: dict[str, Client] = {}
        self._client_lock = asyncio.Lock()

    @property
    def driving(self) -> int:
        """How many work items are being driven now."""
        return len(self._driving)

    def _on_commit(self, workspace: str, batch: Sequence[Event]) -> None:
        for ev in batch:
            if isinstance(ev, NeedWork) and ev.consumer in self.peers and ev.correlation_id:
                try:
                    self._queue.put_nowait((workspace, ev.correlation_id))
                except asyncio.QueueFull:
                    self._overflow.set()  # rescan the log instead of losing it

    async def run(self) -> None:
        """Resume open items, then follow new ones; close the peer clients on exit."""
        self.workspaces.add_listener(self._on_commit)
        if self._own_follower:
            self.follower.install()
        try:
            async with asyncio.TaskGroup() as tg:
                await self._scan(tg)
                while True:
                    get = asyncio.ensure_future(self._queue.get())
                    overflow = asyncio.ensure_future(self._overflow.wait())
                    try:
                        await asyncio.wait({get, overflow}, return_when=asyncio.FIRST_COMPLETED)
                    finally:
                        overflow.cancel()
                        if not get.done():
                            get.cancel()
                    if get.done() and not get.cancelled():
                        workspace, cid = get.result()
                        self._start(tg, workspace, cid)
                    if self._overflow.is_set():
                        self._overflow.clear()
                        await self._scan(tg)
        finally:
            self.workspaces.remove_listener(self._on_commit)
            if self._own_follower:
                await self.follower.aclose()
            await asyncio.shield(self._close_clients())

    async def _close_clients(self) -> None:
        for client in self._clients.values():
            with contextlib.suppress(Exception):
                await client.close()
        self._clients.clear()

    async def _scan(self, tg: asyncio.TaskGroup) -> None:
        """Start a driver for every open item addressed to a peer (derived from the log)."""
        for workspace in await self.workspaces.store.workspaces():
            state = await self.workspaces.state(workspace)
            for cid, item in state.work_items.items():
                if item.consumer in self.peers and item.status not in TERMINAL_STATUSES:
                    self._start(tg, workspace, cid)

    def _start(self, tg: asyncio.TaskGroup, workspace: str, cid: str) -> None:
        key = (workspace, cid)
        if key in self._driving:
            return
        self._driving.add(key)
        tg.create_task(self._guarded(workspace, cid), name=f"a2a-bridge {workspace}/{cid}")

    async def _guarded(self, workspace: str, cid: str) -> None:
        try:
            async with self._slots:
                await self._drive(workspace, cid)
        except (asyncio.CancelledError, FollowerClosed):
            raise
        except Exception:
            log.exception("bridge: work item %s/%s failed", workspace, cid)
        finally:
            self._driving.discard((workspace, cid))

    # -- one work item ----------------------------------------------------------------------

    async def _drive(self, workspace: str, cid: str) -> None:
        state = await self.workspaces.state(workspace)
        work = state.work_items.get(cid)
        if work is None or work.consumer not in self.peers:
            return
        events = await self._item_events(workspace, cid, work.opened_seq)
        first = events[0] if events else None
        if not isinstance(first, NeedWork):
            log.warning("bridge: item %s/%s does not start with needWork", workspace, cid)
            return
        item = _Item(workspace, first, self.peers[work.consumer])
        for ev in events:
            item.observe(ev)
        if item.done:
            return
        await self._join(item)
        async with asyncio.TaskGroup() as tg:
            watcher = tg.create_task(self._watch(item, events[-1].seq))
            try:
                await self._converse(item)
            finally:
                if not item.done:
                    watcher.cancel()  # else it ends by itself, after telling the peer

    async def _item_events(self, workspace: str, cid: str, opened_seq: int) -> list[Event]:
        out: list[Event] = []
        after = max(opened_seq - 1, 0)
        while True:
            page = await self.workspaces.read_batch(workspace, after_seq=after, limit=2000)
            out.extend(ev for ev in page if ev.correlation_id == cid)
            if len(page) < 2000:
                return out
            after = page[-1].seq
            await asyncio.sleep(0)  # a long item: let the loop serve others between pages

    async def _watch(self, item: _Item, after_seq: int) -> None:
        """Fold the item's new events (live); cancel at the peer when a member cancels."""
        told_peer = False
        async with aclosing(self.follower.follow(item.workspace, after_seq)) as events:
            async for ev in events:
                item.observe(ev)
                if item.cancelled_by_member and not told_peer and item.link is not None:
                    told_peer = True
                    client = await self._client(item.peer)
                    with contextlib.suppress(A2AError, httpx.HTTPError):
                        await client.cancel_task(CancelTaskRequest(id=item.link.peer_task_id))
                if item.done:
                    return

    async def _converse(self, item: _Item) -> None:
        """Send, stream, forward members' feedback, resubscribe after failures: until the
        item ends."""
        attempt = 0
        while not item.done:
            feedback = item.pending_feedback() if item.link is not None else None
            if item.link is not None and feedback is None and item.waiting:
                item.changed.clear()
                await item.changed.wait()  # the peer waits for a member's answer
                continue
            try:
                client = await self._client(item.peer)
                if item.link is None:
                    stream = self._send_need(client, item)
                elif feedback is not None:
                    stream = self._send_feedback(client, item, feedback)
                else:
                    stream = client.subscribe(SubscribeToTaskRequest(id=item.link.peer_task_id))
                peer_state = await self._until_done(item, self._consume(item, stream))
            except (A2AError, httpx.HTTPError, OSError) as e:
                if item.done:
                    return
                attempt += 1
                delay = FAILURE_BACKOFF.delay(attempt)
                log.warning("bridge: peer %s: %s; retrying in %.1fs", item.peer.name, e, delay)
                await asyncio.sleep(delay)
                continue
            if item.done or peer_state in TERMINAL_STATES:
                return
            if peer_state in (
                TaskState.TASK_STATE_INPUT_REQUIRED,
                TaskState.TASK_STATE_AUTH_REQUIRED,
            ):
                attempt = 0
                continue
            attempt += 1  # the stream ended with the task still running: resubscribe
            await asyncio.sleep(RESUBSCRIBE_BACKOFF.delay(attempt))

    async def _until_done(self, item: _Item, consume: Any) -> TaskState | None:
        """Run ``consume`` until it returns or the item ends in the log."""
        task: asyncio.Task[TaskState | None] = asyncio.ensure_future(consume)
        try:
            while not task.done():
                if item.done:
                    task.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await task
                    return None
                item.changed.clear()
                waiter = asyncio.ensure_future(item.changed.wait())
                try:
                    await asyncio.wait({task, waiter}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    waiter.cancel()
            return task.result()
        finally:
            if not task.done():
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    def _send_need(self, client: Client, item: _Item) -> AsyncIterator[StreamResponse]:
        parts, meta = payload_parts(item.need.payload)
        if not parts:
            parts = [Part(text="")]
        message = Message(message_id=item.need.id, role=Role.ROLE_USER, parts=parts)
        if meta:
            message.metadata.update(meta)
        return client.send_message(SendMessageRequest(message=message))

    def _send_feedback(
        self, client: Client, item: _Item, feedback: FeedbackProvided
    ) -> AsyncIterator[StreamResponse]:
        assert item.link is not None
        item.sent.add(feedback.id)
        parts, meta = payload_parts(feedback.payload)
        message = Message(
            message_id=feedback.id,
            role=Role.ROLE_USER,
            task_id=item.link.peer_task_id,
            context_id=item.link.peer_context_id,
            parts=parts,
        )
        if meta:
            message.metadata.update(meta)
        return client.send_message(SendMessageRequest(message=message))

    async def _consume(
        self, item: _Item, stream: AsyncIterator[StreamResponse]
    ) -> TaskState | None:
        """Write the peer's responses as events; return the peer's last task state."""
        last: TaskState | None = None
        async with aclosing(stream) as responses:  # type: ignore[type-var]
            async for response in responses:
                which = response.WhichOneof("payload")
                if which == "task":
                    await self._on_task(item, response.task)
                    last = response.task.status.state
                elif which == "status_update":
                    await self._claim(
                        item, response.status_update.task_id, response.status_update.context_id
                    )
                    await self._on_status(item, response.status_update.status)
                    last = response.status_update.status.state
                elif which == "artifact_update":
                    await self._claim(
                        item, response.artifact_update.task_id, response.artifact_update.context_id
                    )
                    await self._on_artifact(item, response.artifact_update)
                elif which == "message":
                    await self._on_message(item, response.message)
                    last = TaskState.TASK_STATE_COMPLETED
                if item.done:
                    break
        return last

    async def _on_task(self, item: _Item, task: Task) -> None:
        await self._claim(item, task.id, task.context_id)
        for artifact in task.artifacts:
            await self._on_artifact(
                item,
                TaskArtifactUpdateEvent(
                    task_id=task.id, context_id=task.context_id, artifact=artifact
                ),
            )
        await self._on_status(item, task.status)

    async def _claim(self, item: _Item, task_id: str, context_id: str) -> None:
        if item.link is not None or not task_id:
            return
        link = PeerLink(peer=item.peer.name, peer_task_id=task_id, peer_context_id=context_id)
        draft = WorkClaimed(
            id=derived_event_id(item.peer.name, task_id, "claimed"),
            correlation_id=item.cid,
            payload=msgspec.to_builtins(link),
        )
        await self._publish(item, draft)
        item.link = link

    async def _on_status(self, item: _Item, status: TaskStatus) -> None:
        has_message = status.HasField("message") and bool(status.message.parts)
        kind = foreign_kind(status.state, claimed=item.link is not None, has_message=has_message)
        if kind is None or kind == "workClaimed":
            return
        message = status.message if has_message else None
        payload: Any = message_payload(message) if message is not None else None
        if kind == "messagePosted" and message is not None:
            draft: Event = MessagePosted(
                id=self._status_id(item, status),
                correlation_id=item.cid,
                payload=message_posted_payload(message),
            )
        else:
            if kind == "workCancelled" and status.state != TaskState.TASK_STATE_CANCELED:
                payload = {"a2aState": TaskState.Name(status.state), "message": payload}
            draft = _PEER_KINDS[kind](
                id=self._status_id(item, status), correlation_id=item.cid, payload=payload
            )
        await self._publish(item, draft)

    def _status_id(self, item: _Item, status: TaskStatus) -> str:
        assert item.link is not None
        message_id = status.message.message_id if status.HasField("message") else ""
        stamp = str(status.timestamp.ToMilliseconds()) if status.HasField("timestamp") else ""
        return derived_event_id(
            item.peer.name, item.link.peer_task_id, TaskState.Name(status.state), message_id, stamp
        )

    async def _on_artifact(self, item: _Item, update: TaskArtifactUpdateEvent) -> None:
        assert item.link is not None
        payload: dict[str, Any] = plain(json_format.MessageToDict(update.artifact))
        if update.append:
            payload["append"] = True
        if update.last_chunk:
            payload["lastChunk"] = True
        body = json_format.MessageToJson(update.artifact, sort_keys=True)
        draft = WorkPublished(
            id=derived_event_id(
                item.peer.name, item.link.peer_task_id, "artifact", body, str(update.append)
            ),
            correlation_id=item.cid,
            payload=payload,
        )
        await self._publish(item, draft)

    async def _on_message(self, item: _Item, message: Message) -> None:
        await self._claim(
            item, message.task_id or f"message:{message.message_id}", message.context_id
        )
        draft = Completed(
            id=derived_event_id(item.peer.name, message.message_id, "message"),
            correlation_id=item.cid,
            payload=message_payload(message),
        )
        await self._publish(item, draft)

    async def _publish(self, item: _Item, draft: Event) -> None:
        if item.done:
            return
        try:
            result = await self.workspaces.publish(
                item.workspace, [draft], producer=item.peer.name, trusted=True
            )
            for ev in result.events:
                item.observe(ev)
        except Conflict as e:
            # The item ended (or was claimed by a member) meanwhile: the log decides.
            log.info("bridge: %s on %s/%s refused: %s", draft.kind, item.workspace, item.cid, e)
        except AgoraError as e:
            log.warning("bridge: %s on %s/%s refused: %s", draft.kind, item.workspace, item.cid, e)

    async def _join(self, item: _Item) -> None:
        state = await self.workspaces.state(item.workspace)
        member = state.members.get(item.peer.name)
        if member is not None and member.present:
            return
        joined = MemberJoined(
            id=derived_event_id(
                "join", item.workspace, item.peer.name, str(state.seq if member else 0)
            ),
            payload=MemberPayload(agent=item.peer.name, via="a2a", card_url=item.peer.card_url),
        )
        with contextlib.suppress(Conflict):
            await self.workspaces.publish(
                item.workspace, [joined], producer=item.peer.name, trusted=True
            )

    # -- peer clients -----------------------------------------------------------------------

    async def _client(self, peer: PeerConfig) -> Client:
        async with self._client_lock:
            client = self._clients.get(peer.name)
            if client is not None:
                return client
            headers = {"Authorization": f"Bearer {peer.token}"} if peer.token else {}
            http = httpx.AsyncClient(
                headers=headers,
                timeout=httpx.Timeout(self.http_timeout, read=max(self.http_timeout, 120.0)),
            )
            try:
                response = await http.get(peer.card_url)
                response.raise_for_status()
                card = AgentCard()
                json_format.ParseDict(response.json(), card, ignore_unknown_fields=True)
            except BaseException:
                await http.aclose()
                raise
            factory = ClientFactory(
                ClientConfig(
                    httpx_client=http,
                    streaming=True,
                    supported_protocol_bindings=["JSONRPC", "HTTP+JSON"],
                )
            )
            client = factory.create(card)
            self._clients[peer.name] = client
            return client
