"""The A2A task store and task event stream, on top of the log and the projections.

Nothing here stores a task. :class:`LogTaskStore` implements the SDK's
:class:`a2a.server.cluster.VersionedTaskStore`: ``get``/``list`` read the derived task index
(:class:`~a2a_adapter.taskindex.TaskIndex`, folded from committed events), the version is
the seq of the task's last event, and ``save`` *appends* the event the SDK hands it
(``workCancelled`` for a CANCELED write) instead of overwriting anything.
:class:`LogTaskEventStream` implements :class:`a2a.server.cluster.TaskEventStream`:
``subscribe(task_id, after=version)`` replays the task's events from the log after that
version and then follows it live, which is what lets a peer that reconnects lose nothing.
``publish`` has nothing to do: the log already carries every event to every reader.

:class:`TaskLocator` answers "which workspace holds task X" (``GetTask`` names no context): an
index learned from committed events, falling back to the task indexes
(:mod:`a2a_adapter.taskindex`) of the workspaces the caller may read. It is derived and
bounded; losing it costs only a scan.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import json
import logging
from collections import OrderedDict
from collections.abc import AsyncGenerator, Sequence
from contextlib import aclosing
from typing import Final, NamedTuple

import msgspec
from a2a.server.cluster import (
    ConcurrentTaskModificationError,
    StoredTask,
    TaskEventStream,
    TaskVersion,
    VersionedEvent,
    VersionedTaskStore,
)
from a2a.server.context import ServerCallContext
from a2a.server.events.event_queue import Event as SdkEvent
from a2a.types.a2a_pb2 import (
    ListTasksRequest,
    ListTasksResponse,
    Task,
    TaskArtifactUpdateEvent,
    TaskState,
    TaskStatusUpdateEvent,
)
from a2a.utils.errors import InvalidParamsError, TaskNotFoundError, UnsupportedOperationError

from a2a_adapter.errors import a2a_error
from a2a_adapter.mapping import CROSSINGS, TERMINAL_STATES, MappingError, from_a2a, task_id_of
from a2a_adapter.taskindex import TaskIndex
from a2a_adapter.taskview import TaskKind, TaskView
from hub.core.capability import ANY, Capability
from hub.core.errors import AgoraError
from hub.core.events import Event, WorkCancelled
from hub.core.validation import TRACEPARENT_RE
from hub.follow import LogFollower
from hub.workspaces import Workspaces

__all__ = [
    "CAPABILITY_KEY",
    "LogTaskEventStream",
    "LogTaskStore",
    "TaskLocator",
    "TaskRef",
    "capability_of",
]

log = logging.getLogger(__name__)

CAPABILITY_KEY: Final = "agora.capability"
READ_BATCH: Final = 2000
DEFAULT_PAGE_SIZE: Final = 50
MAX_PAGE_SIZE: Final = 100


def capability_of(context: ServerCallContext) -> Capability:
    """The verified capability the auth middleware put in the call context.

    Raises :class:`InvalidParamsError` if there is none (a route mounted without the
    middleware: refuse rather than serve anonymously).
    """
    cap = context.state.get(CAPABILITY_KEY)
    if not isinstance(cap, Capability):
        raise InvalidParamsError(message="no authenticated agent for this call")
    return cap


def traceparent_of(context: ServerCallContext) -> str | None:
    """The request's W3C ``traceparent`` header when it is a valid one (an invalid one is
    ignored, as the HTTP port's tracing ignores it): what the events the request writes keep
    in their ``traceparent`` field (docs/operations.md, "Traces")."""
    headers = context.state.get("headers") or {}
    raw = headers.get("traceparent") if isinstance(headers, dict) else None
    if not isinstance(raw, str):
        return None
    text = raw.strip()
    return text if TRACEPARENT_RE.fullmatch(text) else None


def readable_workspaces(cap: Capability) -> list[str] | None:
    """The workspaces ``cap`` may read (None: every workspace)."""
    if ANY in cap.workspaces:
        return None if "read" in cap.rights or "admin" in cap.rights else []
    return [w for w in cap.workspaces if cap.has("read", w)]


class TaskRef(NamedTuple):
    """Where a task lives: workspace, kind, and the seq of its first event (0: unknown)."""

    workspace: str
    kind: TaskKind
    opened_seq: int


class TaskLocator:
    """Task id → workspace, learned from committed events and from the task indexes.

    A :class:`~hub.workspaces.Workspaces` listener; holds at most ``max_entries`` ids (least
    recently used go first). Work items win over executions when an id is both.
    """

    def __init__(
        self, workspaces: Workspaces, index: TaskIndex | None = None, *, max_entries: int = 100_000
    ) -> None:
        self.workspaces = workspaces
        self.index = index if index is not None else TaskIndex(workspaces)
        self.max_entries = max_entries
        self._where: OrderedDict[str, list[TaskRef]] = OrderedDict()
        self._installed = False

    def install(self) -> None:
        if not self._installed:
            self.workspaces.add_listener(self._on_commit)
            self._installed = True

    def uninstall(self) -> None:
        if self._installed:
            self.workspaces.remove_listener(self._on_commit)
            self._installed = False

    def _on_commit(self, workspace: str, batch: Sequence[Event]) -> None:
        for ev in batch:
            crossing = CROSSINGS.get(ev.kind)
            if crossing is None:
                continue
            task_id = task_id_of(ev)
            if task_id:
                self._remember(task_id, TaskRef(workspace, crossing.task, ev.seq))

    def _remember(self, task_id: str, ref: TaskRef) -> None:
        refs = self._where.get(task_id)
        if refs is None:
            self._where[task_id] = [ref]
        else:
            self._where.move_to_end(task_id)
            if not any(r.workspace == ref.workspace and r.kind == ref.kind for r in refs):
                refs.append(ref)
                refs.sort(key=lambda r: (r.kind != "work", r.workspace))
        while len(self._where) > self.max_entries:
            self._where.popitem(last=False)

    async def locate(self, task_id: str, candidates: Sequence[str] | None) -> TaskRef | None:
        """The task's location among ``candidates`` (None: every workspace), or None.

        Raises what the store raises."""
        if not task_id:
            return None
        for ref in self._where.get(task_id, ()):
            if candidates is None or ref.workspace in candidates:
                self._where.move_to_end(task_id)  # a hit makes it the most recently used
                return ref
        names = await self.workspaces.store.workspaces() if candidates is None else candidates
        found: TaskRef | None = None
        for name in sorted(names):
            view = (await self.index.tasks(name)).view(task_id)
            if view is None:
                continue
            ref = TaskRef(name, view.kind, view.opened_seq)
            self._remember(task_id, ref)
            if found is None or (found.kind == "exec" and ref.kind == "work"):
                found = ref
        return found


async def load_view(
    workspaces: Workspaces, ref: TaskRef, task_id: str, *, until_seq: int | None = None
) -> TaskView | None:
    """Fold the task's events from the log (up to ``until_seq``); None if it has none.

    Only for a task as of an earlier seq (a resume point); the current task is in the index."""
    view = TaskView(task_id, ref.workspace, ref.kind)
    after = max(ref.opened_seq - 1, 0)
    while True:
        page = await workspaces.read_batch(
            ref.workspace, after_seq=after, until_seq=until_seq, limit=READ_BATCH
        )
        for ev in page:
            view.apply(ev)
        if len(page) < READ_BATCH:
            break
        after = page[-1].seq
        await asyncio.sleep(0)  # a long task: let the loop serve others between pages
    return view if view.exists else None


class LogTaskStore(VersionedTaskStore):
    """The SDK's versioned task store, read from the log and written by appending to it.

    Scoped by the capability in the call context (:func:`capability_of`): a task in a workspace
    the caller may not read does not exist for it.
    """

    def __init__(self, workspaces: Workspaces, locator: TaskLocator) -> None:
        self.workspaces = workspaces
        self.locator = locator
        self.index = locator.index

    async def find(
        self, task_id: str, cap: Capability, *, copy: bool = True
    ) -> tuple[TaskRef, TaskView] | None:
        """The task's location and current view, if ``cap`` may read it. ``copy=False``: the
        index's own view, to read at once and never fold into."""
        ref = await self.locator.locate(task_id, readable_workspaces(cap))
        if ref is None or not cap.has("read", ref.workspace):
            return None
        view = (await self.index.tasks(ref.workspace)).view(task_id, ref.kind)
        if view is None:
            return None
        return ref, view.copy() if copy else view

    async def get(self, task_id: str, context: ServerCallContext) -> StoredTask | None:
        found = await self.find(task_id, capability_of(context), copy=False)
        if found is None:
            return None
        _, view = found
        return StoredTask(
            view.task(), TaskVersion(view.version) if view.version else TaskVersion.MISSING
        )

    async def list(self, params: ListTasksRequest, context: ServerCallContext) -> ListTasksResponse:
        """Tasks of one context (``contextId``) or of every workspace the caller may read,
        newest status first, paged by an opaque cursor, from the task indexes: a page costs
        its own size (plus a count of the matching tasks), not the history. A context the
        caller may not read has no tasks for it (an empty page: no error, no existence leak).
        Raises :class:`InvalidParamsError` for a bad page size or page token."""
        cap = capability_of(context)
        names: Sequence[str]
        if params.context_id:
            names = [params.context_id] if cap.has("read", params.context_id) else []
        else:
            readable = readable_workspaces(cap)
            names = await self.workspaces.store.workspaces() if readable is None else readable
        page_size = params.page_size or DEFAULT_PAGE_SIZE
        if not 1 <= page_size <= MAX_PAGE_SIZE:
            raise InvalidParamsError(message=f"pageSize must be 1-{MAX_PAGE_SIZE}")
        after_ms = (
            params.status_timestamp_after.ToMilliseconds()
            if params.HasField("status_timestamp_after")
            else None
        )
        state = params.status or None
        cursor = _decode_cursor(params.page_token) if params.page_token else None
        try:
            indexes = [await self.index.tasks(name) for name in sorted(set(names))]
        except AgoraError as e:
            raise a2a_error(e) from e  # (a quarantined workspace is not the caller's error)
        page: list[Task] = []
        more = False
        for view in self.index.merged(indexes, before=cursor, state=state, after_millis=after_ms):
            if len(page) == page_size:
                more = True
                break
            page.append(view.task())
        if state is None and after_ms is None:
            total = sum(len(index) for index in indexes)
        else:
            total = sum(
                1
                for _ in self.index.merged(indexes, before=None, state=state, after_millis=after_ms)
            )
        return ListTasksResponse(
            tasks=page,
            next_page_token=_encode_cursor(_sort_key(page[-1])) if more and page else "",
            page_size=page_size,
            total_size=total,
        )

    async def save(
        self,
        task: Task,
        *,
        event: SdkEvent | None,
        prev: Task | None,
        prev_version: TaskVersion,
        context: ServerCallContext,
    ) -> TaskVersion:
        """Append the event behind this write; return the version (seq) it got.

        A CANCELED write appends ``workCancelled`` by the caller without a version check (SDK
        contract) but raises :class:`ConcurrentTaskModificationError` on a terminal or missing
        task; other writes must carry an update produced by :func:`~a2a_adapter.mapping.to_a2a`
        and ``prev_version`` must be the task's current version. Raises
        :class:`UnsupportedOperationError` for a direct write (no event) or an update the log
        cannot take, and the hub's errors from the append.
        """
        del prev
        cap = capability_of(context)
        found = await self.find(task.id, cap)
        if isinstance(event, TaskStatusUpdateEvent) and (
            event.status.state == TaskState.TASK_STATE_CANCELED
        ):
            if found is None or found[1].terminal:
                raise ConcurrentTaskModificationError(task.id)
            ref, view = found
            if ref.kind != "work":
                raise UnsupportedOperationError(message="executions are cancelled by the runtime")
            draft: Event = WorkCancelled(correlation_id=task.id)
        else:
            if not isinstance(event, TaskStatusUpdateEvent | TaskArtifactUpdateEvent):
                raise UnsupportedOperationError(
                    message="the log is the only task store: a write needs the event behind it"
                )
            if found is None:
                raise TaskNotFoundError
            ref, view = found
            version = TaskVersion(view.version)
            if not prev_version.is_missing and prev_version != version:
                raise ConcurrentTaskModificationError(task.id)
            try:
                mapped = from_a2a(event)
            except MappingError as e:
                raise UnsupportedOperationError(message=f"cannot log this update: {e}") from e
            if mapped is None:
                return version
            draft = mapped
        trace = traceparent_of(context)
        if trace is not None and draft.traceparent is None:
            draft = msgspec.structs.replace(draft, traceparent=trace)
        try:
            result = await self.workspaces.publish(ref.workspace, [draft], producer=cap.agent)
        except AgoraError as e:
            # The one table's class: a log that cannot take the write now (``unavailable``)
            # is a server error the peer retries, not an unsupported operation.
            raise a2a_error(e) from e
        return TaskVersion(result.events[-1].seq)

    async def delete(self, task_id: str, context: ServerCallContext) -> None:
        """Always raises :class:`UnsupportedOperationError`: the log is append-only."""
        raise UnsupportedOperationError(message="tasks live in an append-only log")


class LogTaskEventStream(TaskEventStream):
    """The SDK's task event stream, replayed from and following the log."""

    def __init__(self, workspaces: Workspaces, locator: TaskLocator, follower: LogFollower):
        self.workspaces = workspaces
        self.locator = locator
        self.follower = follower

    async def publish(self, task_id: str, event: VersionedEvent) -> None:
        """Nothing to do: every event is in the log, which every subscriber follows."""

    async def destroy(self, task_id: str) -> None:
        """Nothing to release: subscriptions end with their readers."""

    async def subscribe(
        self, task_id: str, *, after: TaskVersion
    ) -> AsyncGenerator[VersionedEvent, None]:
        """The task's updates after ``after`` (replayed from the log), then live ones, until
        the task ends. The caller authorizes; this looks in every workspace."""
        ref = await self.locator.locate(task_id, None)
        if ref is None:
            raise TaskNotFoundError
        after_seq = 0 if after.is_missing else int(after._value)
        async with aclosing(self.updates(ref, task_id, after_seq)) as updates:
            async for seq, update in updates:
                yield VersionedEvent(event=update, version=TaskVersion(seq))

    async def updates(
        self, ref: TaskRef, task_id: str, after_seq: int, *, view: TaskView | None = None
    ) -> AsyncGenerator[tuple[int, TaskStatusUpdateEvent | TaskArtifactUpdateEvent], None]:
        """``(seq, update)`` for each of the task's updates after ``after_seq``, from the log
        then live, ending after the update that makes the task terminal.

        ``view``: a fold of the task up to some seq <= ``after_seq`` to continue from (else
        one is folded from the log up to ``after_seq``)."""
        if view is None:
            view = await load_view(self.workspaces, ref, task_id, until_seq=after_seq)
            if view is None:
                view = TaskView(task_id, ref.workspace, ref.kind)
        start = view.version
        async with aclosing(self.follower.follow(ref.workspace, start)) as events:
            async for ev in events:
                updates = view.apply(ev)
                if ev.seq <= after_seq:
                    continue
                for update in updates:
                    yield ev.seq, update
                if updates and view.state in TERMINAL_STATES:
                    return


# ---------------------------------------------------------------------------------------------


def _sort_key(task: Task) -> tuple[int, str]:
    return task.status.timestamp.ToMilliseconds(), task.id


def _encode_cursor(key: tuple[int, str]) -> str:
    return base64.urlsafe_b64encode(json.dumps(list(key)).encode()).decode().rstrip("=")


def _decode_cursor(token: str) -> tuple[int, str]:
    try:
        raw = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        ts, task_id = raw
        if not isinstance(ts, int) or not isinstance(task_id, str):
            raise ValueError(token)
    except (binascii.Error, ValueError, TypeError) as e:
        raise InvalidParamsError(message=f"invalid page token {token!r}") from e
    return ts, task_id
