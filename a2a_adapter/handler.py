"""The A2A request handler: A2A calls in, events appended to the log, tasks read back from it.

The SDK's ``DefaultRequestHandler`` runs an ``AgentExecutor`` per task and keeps the task in a
store it writes; Agora has no agent behind the adapter — the workspace's members are the agents
— and no second store. So this implements the SDK's :class:`RequestHandler` directly and the
SDK's routes (JSON-RPC, HTTP+JSON, SSE, version check, error encoding) serve it:

- ``SendMessage`` without ``taskId`` appends ``needWork`` (``correlationId`` = a new task id,
  the message as payload, ``producer`` = the authenticated agent); with ``taskId`` it appends
  ``feedbackProvided`` when the item waits for input, else ``messagePosted``. A message with an
  ``agora.exec`` data part starts an execution through the :class:`~a2a_adapter.runtime.A2ARuntime`.
- ``SendStreamingMessage``/``SubscribeToTask``: the Task, then the task's events as updates
  (:mod:`a2a_adapter.mapping`), from the log and then live, until the task ends or waits for
  input. ``SubscribeToTask`` with the header ``Last-Event-ID: <seq>`` first replays every
  update after that seq, so a peer that lost its connection misses nothing.
- ``GetTask``/``ListTasks``/``CancelTask`` go through :class:`~a2a_adapter.store.LogTaskStore`.

Every hub error becomes an A2A error in one place (:func:`a2a_adapter.errors.a2a_error`).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import re
import uuid
from collections.abc import AsyncGenerator
from contextlib import aclosing
from typing import Any, Final, TypeVar

import msgspec
from a2a.server.cluster import ConcurrentTaskModificationError, TaskVersion
from a2a.server.context import ServerCallContext
from a2a.server.events.event_queue import Event as SdkEvent
from a2a.server.request_handlers.request_handler import (
    RequestHandler,
    validate_request_params,
)
from a2a.types.a2a_pb2 import (
    AgentCard,
    CancelTaskRequest,
    DeleteTaskPushNotificationConfigRequest,
    GetExtendedAgentCardRequest,
    GetTaskPushNotificationConfigRequest,
    GetTaskRequest,
    ListTaskPushNotificationConfigsRequest,
    ListTaskPushNotificationConfigsResponse,
    ListTasksRequest,
    ListTasksResponse,
    Message,
    SendMessageRequest,
    SubscribeToTaskRequest,
    Task,
    TaskArtifactUpdateEvent,
    TaskPushNotificationConfig,
    TaskState,
    TaskStatusUpdateEvent,
)
from a2a.utils.errors import (
    ExtendedAgentCardNotConfiguredError,
    InvalidParamsError,
    PushNotificationNotSupportedError,
    TaskNotCancelableError,
    TaskNotFoundError,
    UnsupportedOperationError,
)
from a2a.utils.task import apply_history_length, validate_history_length, validate_page_size
from google.protobuf import json_format

from a2a_adapter.auth import until_token_ends
from a2a_adapter.errors import a2a_error, error_data
from a2a_adapter.files import intake_file_parts
from a2a_adapter.inline import inline_files
from a2a_adapter.mapping import (
    INTERRUPTED_STATES,
    TERMINAL_STATES,
    derived_event_id,
    message_payload,
    message_posted_payload,
    plain,
)
from a2a_adapter.push import PushNotifications
from a2a_adapter.runtime import A2AExecRequest, A2ARuntime, parse_exec_part
from a2a_adapter.store import (
    LogTaskEventStream,
    LogTaskStore,
    TaskRef,
    capability_of,
    load_view,
    traceparent_of,
)
from a2a_adapter.taskview import TaskView
from hub.core.capability import ANY, Capability
from hub.core.errors import AgoraError, Busy, Exists, Forbidden
from hub.core.events import (
    Event,
    FeedbackProvided,
    MemberJoined,
    MemberPayload,
    MessagePosted,
    NeedWork,
)
from hub.core.validation import check_event_size
from hub.follow import FollowerClosed
from hub.revocations import Revocations
from hub.workspaces import Workspaces

__all__ = ["BLOCKING_TIMEOUT_S", "RESUME_HEADER", "AgoraRequestHandler"]

log = logging.getLogger(__name__)

_O = TypeVar("_O", Task, TaskArtifactUpdateEvent, ListTasksResponse)

BLOCKING_TIMEOUT_S: Final = 60.0
"""How long a blocking SendMessage waits for its task to settle before answering with the
task as it is."""

RESUME_HEADER: Final = "last-event-id"
"""SubscribeToTask header: replay the task's updates after this seq (``agora.event.seq``)."""

_SEQ_TEXT: Final = re.compile(r"[0-9]+(\.0*)?")

CARD_URL_KEY: Final = "agora.cardUrl"
CONSUMER_KEY: Final = "agora.consumer"
TOPIC_KEY: Final = "agora.topic"


def _message_event_id(agent: str, message: Message) -> str:
    """The event id for a message: the same for a retry of the same message (same sender,
    messageId, task, context and parts), different when a sender reuses a messageId for
    another message (some clients do)."""
    body = message.SerializeToString(deterministic=True)
    return derived_event_id(agent, message.message_id, hashlib.sha256(body).hexdigest())


def _metadata(params: SendMessageRequest) -> dict[str, Any]:
    """The request's and the message's metadata, the message's winning."""
    out: dict[str, Any] = {}
    if params.HasField("metadata"):
        out.update(json_format.MessageToDict(params.metadata))
    if params.message.HasField("metadata"):
        out.update(json_format.MessageToDict(params.message.metadata))
    return out


def _optional_id(meta: dict[str, Any], key: str) -> str | None:
    value = meta.get(key)
    if value is None:
        return None
    if not isinstance(value, str) or not value:
        raise InvalidParamsError(message=f"metadata {key} must be a non-empty string")
    return value


class AgoraRequestHandler(RequestHandler):
    """Serves A2A calls from the log. ``blocking_timeout``: how long a blocking
    ``SendMessage`` waits for the task to end or ask for input before returning it as it is;
    ``max_streams``: open streams (``SendStreamingMessage``/``SubscribeToTask``) at once;
    ``revocations``: a stream ends (its error event) when its token expires or is revoked."""

    def __init__(
        self,
        workspaces: Workspaces,
        store: LogTaskStore,
        stream: LogTaskEventStream,
        card: AgentCard,
        *,
        revocations: Revocations,
        runtime: A2ARuntime | None = None,
        push: PushNotifications | None = None,
        blocking_timeout: float = BLOCKING_TIMEOUT_S,
        max_streams: int = 512,
    ) -> None:
        self.workspaces = workspaces
        self.store = store
        self.stream = stream
        self.card = card
        self.revocations = revocations
        self.runtime = runtime
        self.push = push
        self.blocking_timeout = blocking_timeout
        self.max_streams = max_streams
        self._streams = 0
        self._members: set[tuple[str, str]] = set()  # (workspace, agent) known to be present

    # -- reads ------------------------------------------------------------------------------

    @validate_request_params  # the SDK's own required-field and enum checks
    async def on_get_task(self, params: GetTaskRequest, context: ServerCallContext) -> Task:
        """The task folded from the log. Raises TaskNotFoundError (also for a task in a
        workspace the caller may not read)."""
        validate_history_length(params)
        _, view = await self._find(params.id, capability_of(context), copy=False)
        length = params.history_length if params.HasField("history_length") else None
        return await self._out(view.task(history_length=length))

    @validate_request_params  # the SDK's own required-field and enum checks
    async def on_list_tasks(
        self, params: ListTasksRequest, context: ServerCallContext
    ) -> ListTasksResponse:
        validate_history_length(params)
        if params.HasField("page_size"):
            validate_page_size(params.page_size)
        page = await self.store.list(params, context)
        for task in page.tasks:
            if not params.include_artifacts:
                task.ClearField("artifacts")
            trimmed = apply_history_length(task, params)
            if trimmed is not task:
                task.CopyFrom(trimmed)
        return await self._out(page)

    # -- writes -----------------------------------------------------------------------------

    @validate_request_params  # the SDK's own required-field and enum checks
    async def on_cancel_task(self, params: CancelTaskRequest, context: ServerCallContext) -> Task:
        """Append ``workCancelled`` (or ask the runtime to kill an execution). Raises
        TaskNotFoundError, TaskNotCancelableError (terminal, or the caller is neither the
        requester nor the owner), InternalError when the hub cannot take the cancel now (its
        log is locked or down: retry)."""
        cap = capability_of(context)
        ref, view = await self._find(params.id, cap)
        if view.terminal:
            raise TaskNotCancelableError(
                message=f"task {params.id} is {TaskState.Name(view.state)}"
            )
        if ref.kind == "exec":
            if self.runtime is None:
                raise TaskNotCancelableError(message="no execution runtime is configured")
            try:
                await self.runtime.kill(ref.workspace, params.id, capability=cap)
            except AgoraError as e:
                if e.blame != "client":
                    raise a2a_error(e) from e  # the hub failed: retry, the task may yet end
                raise TaskNotCancelableError(message=e.message, data=error_data(e)) from e
        else:
            cancelled = view.task()
            cancelled.status.state = TaskState.TASK_STATE_CANCELED
            update = TaskStatusUpdateEvent(
                task_id=params.id, context_id=ref.workspace, status=cancelled.status
            )
            try:
                await self.store.save(
                    cancelled,
                    event=update,
                    prev=None,
                    prev_version=TaskVersion.MISSING,
                    context=context,
                )
            except (UnsupportedOperationError, InvalidParamsError) as e:
                # The log refused the cancel (a client error); an InternalError (the log
                # cannot take it now) goes out as it is: retry.
                raise TaskNotCancelableError(message=e.message, data=e.data) from e
            except ConcurrentTaskModificationError as e:
                raise TaskNotCancelableError(message=f"task {params.id} has ended") from e
        _, view = await self._find(params.id, cap)
        return await self._out(view.task())

    @validate_request_params  # the SDK's own required-field and enum checks
    async def on_message_send(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> Task | Message:
        """Append the message's event; return the task once it ends or asks for input (or
        at once with ``returnImmediately``, or as it is after ``blocking_timeout``)."""
        validate_history_length(params.configuration)
        await self._check_push(params)
        ref, view = await self._accept(params, context)
        await self._push_from_message(params, ref, view, capability_of(context))
        length = (
            params.configuration.history_length
            if params.configuration.HasField("history_length")
            else None
        )
        if params.configuration.return_immediately or view.terminal or view.interrupted:
            return await self._out(view.task(history_length=length))
        start = view.version
        with contextlib.suppress(TimeoutError, FollowerClosed):
            async with asyncio.timeout(self.blocking_timeout):
                async with aclosing(
                    self.stream.updates(ref, view.task_id, start, view=view)
                ) as updates:
                    async for _seq, update in updates:
                        if isinstance(update, TaskStatusUpdateEvent) and (
                            update.status.state in TERMINAL_STATES | INTERRUPTED_STATES
                        ):
                            break
        return await self._out(view.task(history_length=length))

    @validate_request_params  # the SDK's own required-field and enum checks
    async def on_message_send_stream(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> AsyncGenerator[SdkEvent, None]:
        """The Task, then its updates until it ends or asks for input."""
        validate_history_length(params.configuration)
        self._check_streaming()
        await self._check_push(params)
        ref, view = await self._accept(params, context)
        await self._push_from_message(params, ref, view, capability_of(context))
        length = (
            params.configuration.history_length
            if params.configuration.HasField("history_length")
            else None
        )
        stream = self._task_stream(ref, view, length, capability_of(context))
        async with aclosing(stream) as events:
            async for event in events:
                yield event

    @validate_request_params  # the SDK's own required-field and enum checks
    async def on_subscribe_to_task(
        self, params: SubscribeToTaskRequest, context: ServerCallContext
    ) -> AsyncGenerator[SdkEvent, None]:
        """The current Task, then its updates. With ``Last-Event-ID: <seq>`` the updates
        after that seq are replayed first (also for a task that ended meanwhile). Raises
        TaskNotFoundError, UnsupportedOperationError for a terminal task without a resume
        point."""
        self._check_streaming()
        cap = capability_of(context)
        ref, view = await self._find(params.id, cap)
        resume = self._resume_point(context)
        if view.terminal and (resume is None or resume >= view.version):
            raise UnsupportedOperationError(
                message=f"task {params.id} is in terminal state {TaskState.Name(view.state)}"
            )
        if resume is not None and resume < view.version:
            # The Task as of the resume point, then what followed it: folding the stream
            # gives exactly the live result (nothing twice, nothing lost). A point before
            # the task's first event resumes just after it.
            try:
                earlier = await load_view(
                    self.workspaces, ref, view.task_id, until_seq=max(resume, view.opened_seq)
                )
            except AgoraError as e:
                raise a2a_error(e) from e
            if earlier is not None:
                view = earlier
        async with aclosing(self._task_stream(ref, view, None, cap)) as events:
            async for event in events:
                yield event

    async def _task_stream(
        self,
        ref: TaskRef,
        view: TaskView,
        history_length: int | None,
        cap: Capability,
    ) -> AsyncGenerator[SdkEvent, None]:
        """The Task as of ``view``, then every update after it; ends after a terminal or
        interrupted status newer than the snapshot, or with an error when the token ``cap``
        came from expires or is revoked. Folds into ``view``."""
        if self._streams >= self.max_streams:
            raise UnsupportedOperationError(
                message=f"too many open streams ({self.max_streams}); retry later"
            )
        self._streams += 1
        try:
            yield await self._out(view.task(history_length=history_length))
            if view.terminal:
                return
            with contextlib.suppress(FollowerClosed):
                async with aclosing(
                    self.stream.updates(ref, view.task_id, view.version, view=view)
                ) as updates:
                    bounded = until_token_ends(updates, cap, self.revocations, a2a_error)
                    async with aclosing(bounded) as items:
                        async for _seq, update in items:
                            if isinstance(update, TaskArtifactUpdateEvent):
                                await self._out(update)
                            yield update
                            if (
                                isinstance(update, TaskStatusUpdateEvent)
                                and update.status.state in TERMINAL_STATES | INTERRUPTED_STATES
                            ):
                                return
        finally:
            self._streams -= 1

    async def _out(self, message: _O) -> _O:
        """``message`` with its small blob file parts inlined (a2a_adapter.inline)."""
        await inline_files(message, self.workspaces)
        return message

    def _check_streaming(self) -> None:
        if not self.card.capabilities.streaming:
            raise UnsupportedOperationError(message="streaming is not supported")

    @staticmethod
    def _resume_point(context: ServerCallContext) -> int | None:
        headers = context.state.get("headers") or {}
        raw = headers.get(RESUME_HEADER) or headers.get("Last-Event-ID")
        if raw is None:
            return None
        text = str(raw).strip()
        # SDKs send the id back as they read it: "88", or "88.0" after a JSON double.
        if not _SEQ_TEXT.fullmatch(text):
            raise InvalidParamsError(message=f"Last-Event-ID must be a seq, not {raw!r}")
        seq = int(text.split(".")[0])
        if seq < 0:
            raise InvalidParamsError(message="Last-Event-ID must be >= 0")
        return seq

    async def _find(
        self, task_id: str, cap: Capability, *, copy: bool = True
    ) -> tuple[TaskRef, TaskView]:
        try:
            found = await self.store.find(task_id, cap, copy=copy)
        except AgoraError as e:
            raise a2a_error(e) from e
        if found is None:
            raise TaskNotFoundError(message=f"task {task_id!r} not found")
        return found

    # -- the write path ---------------------------------------------------------------------

    async def _accept(
        self, params: SendMessageRequest, context: ServerCallContext
    ) -> tuple[TaskRef, TaskView]:
        """Append the event(s) a message means; return the task as it is right after."""
        cap = capability_of(context)
        trace = traceparent_of(context)  # kept in the events the message writes
        message = params.message
        if not message.message_id:
            raise InvalidParamsError(message="message.messageId is required")
        if not message.parts:
            raise InvalidParamsError(message="message.parts must not be empty")
        meta = _metadata(params)
        exec_request = self._exec_request(message)

        if message.task_id:
            ref, view = await self._find(message.task_id, cap)
            # A2A: a taskId alone names its context; a different contextId is an error.
            # (a2a-sdk 1.3.0 mints a new context here, issue #1206: we fill it in ourselves.)
            if message.context_id and message.context_id != ref.workspace:
                raise InvalidParamsError(
                    message=f"contextId {message.context_id!r} does not match task "
                    f"{message.task_id!r} (context {ref.workspace!r})"
                )
            message.context_id = ref.workspace
            if view.terminal:
                raise UnsupportedOperationError(
                    message=f"task {message.task_id} is {TaskState.Name(view.state)}; "
                    "it takes no more messages"
                )
            if ref.kind == "exec" or exec_request is not None:
                raise UnsupportedOperationError(message="executions take no further messages")
            self._require(cap, "write", ref.workspace)
            files = await self._intake_files(ref.workspace, message, cap)  # [blobs] file parts
            draft: Event
            if view.interrupted:
                draft = FeedbackProvided(
                    id=_message_event_id(cap.agent, message),
                    correlation_id=message.task_id,
                    payload=message_payload(message),
                )
            else:
                draft = MessagePosted(
                    id=_message_event_id(cap.agent, message),
                    correlation_id=message.task_id,
                    payload=message_posted_payload(message),
                )
            self._check_size(draft)
            await self._join(ref.workspace, cap, meta)
            stored = await self._publish(ref.workspace, draft, cap, trace)
            await self._publish_files(ref.workspace, files, message.task_id, stored.id, cap, trace)
            ref, view = await self._find(message.task_id, cap)
            return ref, await self._as_of(ref, view, stored.seq)

        workspace = self._workspace_for(message, cap)
        message.context_id = workspace
        if exec_request is not None:
            return await self._start_exec(workspace, exec_request, message, cap, meta, trace)
        self._require(cap, "write", workspace)
        files = await self._intake_files(workspace, message, cap)  # [blobs] file parts
        event_id = _message_event_id(cap.agent, message)
        need = NeedWork(
            id=event_id,
            correlation_id=str(uuid.uuid4()),
            consumer=_optional_id(meta, CONSUMER_KEY),
            topic=_optional_id(meta, TOPIC_KEY),
            payload=message_payload(message),
        )
        self._check_size(need)
        await self._join(workspace, cap, meta)
        stored = await self._publish(workspace, need, cap, trace)
        task_id = stored.correlation_id or need.correlation_id or ""
        await self._publish_files(workspace, files, task_id, stored.id, cap, trace)
        message.task_id = task_id
        ref, view = await self._find(task_id, cap)
        return ref, await self._as_of(ref, view, stored.seq)

    async def _as_of(self, ref: TaskRef, view: TaskView, seq: int) -> TaskView:
        """The task as of ``seq`` (the event a message appended), so that a stream starts at
        the message and shows every later step — even ones that were appended before the
        task was read back (a fast execution can be finished by then)."""
        if not seq or view.version <= seq:
            return view
        try:
            earlier = await load_view(self.workspaces, ref, view.task_id, until_seq=seq)
        except AgoraError as e:
            raise a2a_error(e) from e
        return earlier or view

    def _exec_request(self, message: Message) -> A2AExecRequest | None:
        for part in message.parts:
            if part.WhichOneof("content") != "data":
                continue
            try:
                request = parse_exec_part(plain(json_format.MessageToDict(part.data)))
            except msgspec.ValidationError as e:
                raise InvalidParamsError(message=f"invalid agora.exec part: {e}") from e
            if request is not None:
                return request
        return None

    async def _start_exec(
        self,
        workspace: str,
        request: A2AExecRequest,
        message: Message,
        cap: Capability,
        meta: dict[str, Any],
        trace: str | None = None,
    ) -> tuple[TaskRef, TaskView]:
        if self.runtime is None:
            raise UnsupportedOperationError(
                message="this hub has no execution runtime configured (agora.exec)"
            )
        # The token's checks come before anything is written (the runtime checks them again,
        # after the memberJoined below): a refused request leaves no trace in the log.
        self._require(cap, "exec", workspace)
        try:
            cap.require_backend(request.backend)
        except Forbidden as e:
            raise a2a_error(e) from e
        await self._join(workspace, cap, meta)
        # Derived from the message, so a retried request names the same execution.
        exec_id = str(uuid.uuid5(uuid.NAMESPACE_URL, _message_event_id(cap.agent, message)))
        try:
            frame = msgspec.structs.replace(request.frame(workspace), traceparent=trace)
            exec_id = await self.runtime.exec(workspace, frame, exec_id=exec_id, capability=cap)
        except (Busy, Exists) as e:
            # This message already started it (a retry): the same task, nothing run twice.
            found = await self._retried(exec_id, cap, e)
            if found is None:
                raise a2a_error(e) from e
            ref, view = found
        except AgoraError as e:
            raise a2a_error(e) from e
        else:
            ref, view = await self._find(exec_id, cap)
        message.task_id = exec_id
        return ref, await self._as_of(ref, view, view.opened_seq)

    async def _retried(
        self, exec_id: str, cap: Capability, error: AgoraError
    ) -> tuple[TaskRef, TaskView] | None:
        """The execution ``exec_id`` if ``error`` says it exists and ``cap``'s agent asked for
        it (its id is derived from the agent's message, so it is that message's)."""
        if error.details.get("execId") != exec_id:
            return None
        try:
            found = await self.store.find(exec_id, cap)
        except AgoraError:
            return None
        if found is None or found[0].kind != "exec" or found[1].requester != cap.agent:
            return None
        return found

    @staticmethod
    def _workspace_for(message: Message, cap: Capability) -> str:
        """The workspace of a new task: the contextId; else the token's only workspace; else,
        for a token valid in every workspace, a new one named after (agent, messageId) (A2A:
        the server mints contextIds; a retry gets the same one)."""
        if message.context_id:
            return message.context_id
        if len(cap.workspaces) == 1 and cap.workspaces[0] != ANY:
            return cap.workspaces[0]
        if ANY in cap.workspaces:
            # Derived from (agent, messageId), so a retried message lands in the same new
            # workspace and its derived event id makes the retry the same task.
            key = derived_event_id("context", cap.agent, message.message_id)
            return f"a2a-{uuid.uuid5(uuid.NAMESPACE_URL, key)}"
        raise InvalidParamsError(
            message="contextId (the workspace) is required: the token names several workspaces"
        )

    @staticmethod
    def _require(cap: Capability, right: Any, workspace: str) -> None:
        try:
            cap.require(right, workspace)
        except Forbidden as e:
            raise a2a_error(e) from e

    async def _intake_files(self, workspace: str, message: Message, cap: Capability) -> list[Event]:
        """The message's file parts stored as blobs (a2a_adapter/files.py)."""
        try:
            return await intake_file_parts(self.workspaces, workspace, message, cap.agent)
        except AgoraError as e:
            raise a2a_error(e) from e

    async def _publish_files(
        self,
        workspace: str,
        drafts: list[Event],
        task_id: str,
        cause: str,
        cap: Capability,
        trace: str | None = None,
    ) -> None:
        """The artifacts of a message's file parts, in its task (ids derived from it, so a
        message sent again publishes nothing new)."""
        for i, draft in enumerate(drafts):
            event = msgspec.structs.replace(
                draft,
                id=derived_event_id(cause, "file", str(i)),
                correlation_id=task_id,
                causation_id=cause,
            )
            await self._publish(workspace, event, cap, trace)

    async def _publish(
        self, workspace: str, draft: Event, cap: Capability, trace: str | None = None
    ) -> Event:
        """Publish one draft as the token's agent, keeping the request's ``traceparent``
        (duplicates are found by the derived id, so a retry with another trace is still the
        same event)."""
        if trace is not None and draft.traceparent is None:
            draft = msgspec.structs.replace(draft, traceparent=trace)
        try:
            result = await self.workspaces.publish(workspace, [draft], producer=cap.agent)
        except AgoraError as e:
            raise a2a_error(e) from e
        return result.events[0]

    def _check_size(self, draft: Event) -> None:
        """Refuse a message whose event would be over ``max_event_bytes`` stored before the
        ``memberJoined`` of :meth:`_join` is written: a refused request leaves no trace in the
        log (the body limit alone lets through a body just under it whose event, with its
        envelope, is over; the hub would refuse that event only after the join). Checked
        after the file parts became blob URLs: the event holds those, not the bytes."""
        try:
            check_event_size(draft, self.workspaces.limits)
        except AgoraError as e:
            raise a2a_error(e) from e

    async def _join(self, workspace: str, cap: Capability, meta: dict[str, Any]) -> None:
        """Record the peer as a member (``memberJoined``, via ``a2a``) on its first call."""
        if (workspace, cap.agent) in self._members:
            return
        try:
            state = await self.workspaces.state(workspace)
        except AgoraError as e:
            raise a2a_error(e) from e
        member = state.members.get(cap.agent)
        if member is not None and member.present:
            self._remember_member(workspace, cap.agent)
            return
        card_url = meta.get(CARD_URL_KEY)
        joined = MemberJoined(
            id=derived_event_id("join", workspace, cap.agent, str(state.seq if member else 0)),
            payload=MemberPayload(
                agent=cap.agent,
                via="a2a",
                card_url=card_url if isinstance(card_url, str) and card_url else None,
            ),
        )
        try:
            await self.workspaces.publish(workspace, [joined], producer=cap.agent, trusted=True)
        except AgoraError as e:
            raise a2a_error(e) from e
        self._remember_member(workspace, cap.agent)

    def _remember_member(self, workspace: str, agent: str) -> None:
        # Bounded: forgetting costs one state read on the agent's next call.
        if len(self._members) >= 10_000:
            self._members.clear()
        self._members.add((workspace, agent))

    # -- push notifications (a2a_adapter/push.py) ------------------------------------------

    def _push(self) -> PushNotifications:
        if self.push is None:
            raise PushNotificationNotSupportedError
        return self.push

    @validate_request_params  # the SDK's own required-field and enum checks
    async def on_create_task_push_notification_config(
        self, params: TaskPushNotificationConfig, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        """Add a config to a task the caller may read; its state changes go to the URL."""
        push = self._push()
        cap = capability_of(context)
        ref, view = await self._find(params.task_id, cap)
        return await push.create(
            ref, view.task_id, params, cap, after_seq=view.version, terminal=view.terminal
        )

    @validate_request_params  # the SDK's own required-field and enum checks
    async def on_get_task_push_notification_config(
        self, params: GetTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> TaskPushNotificationConfig:
        push = self._push()
        cap = capability_of(context)
        await self._find(params.task_id, cap, copy=False)
        return push.get(params.task_id, params.id, cap)

    @validate_request_params  # the SDK's own required-field and enum checks
    async def on_list_task_push_notification_configs(
        self, params: ListTaskPushNotificationConfigsRequest, context: ServerCallContext
    ) -> ListTaskPushNotificationConfigsResponse:
        push = self._push()
        cap = capability_of(context)
        await self._find(params.task_id, cap, copy=False)
        return push.list(params.task_id, cap)

    @validate_request_params  # the SDK's own required-field and enum checks
    async def on_delete_task_push_notification_config(
        self, params: DeleteTaskPushNotificationConfigRequest, context: ServerCallContext
    ) -> None:
        push = self._push()
        cap = capability_of(context)
        await self._find(params.task_id, cap, copy=False)
        push.delete(params.task_id, params.id, cap)

    async def _check_push(self, params: SendMessageRequest) -> None:
        """A message's push config is checked before its event is written (a refused config
        leaves nothing in the log)."""
        if params.configuration.HasField("task_push_notification_config"):
            await self._push().check(params.configuration.task_push_notification_config)

    async def _push_from_message(
        self, params: SendMessageRequest, ref: TaskRef, view: TaskView, cap: Capability
    ) -> None:
        """``configuration.taskPushNotificationConfig`` of a message: a config for its task,
        delivering from the message's event on."""
        if not params.configuration.HasField("task_push_notification_config"):
            return
        config = TaskPushNotificationConfig()
        config.CopyFrom(params.configuration.task_push_notification_config)
        await self._push().create(
            ref, view.task_id, config, cap, after_seq=view.version, terminal=view.terminal
        )

    async def on_get_extended_agent_card(
        self, params: GetExtendedAgentCardRequest, context: ServerCallContext
    ) -> AgentCard:
        raise ExtendedAgentCardNotConfiguredError
