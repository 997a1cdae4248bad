"""A task folded from its events, as A2A shows it: status, history, artifacts. Pure.

:class:`TaskView` folds the events of one work item (same ``correlationId``) or execution
(same ``execId``) in seq order. :meth:`TaskView.apply` returns the A2A updates each event
becomes (:func:`a2a_adapter.mapping.to_a2a`), so a stream and a ``GetTask`` snapshot are two
readings of the same fold and cannot disagree. The work-item status moves by the projection's
own lifecycle table (:data:`hub.core.rules.work.WORK_LIFECYCLE`), so the state here is the
state ``WorkspaceState.work_items`` holds, mapped through :data:`~a2a_adapter.mapping.WORK_STATE`.
"""

from __future__ import annotations

from typing import Final, Literal

from a2a.types.a2a_pb2 import (
    Artifact,
    Message,
    Task,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from google.protobuf import struct_pb2

from a2a_adapter.mapping import (
    CROSSINGS,
    EXEC_STATE,
    INTERRUPTED_STATES,
    TERMINAL_STATES,
    WORK_STATE,
    A2AUpdate,
    closing_chunks,
    task_id_of,
    to_a2a,
)
from hub.core.events import Event, ExecFinished, ExecOutput
from hub.core.projections.executions import ExecStatus
from hub.core.rules.work import WORK_LIFECYCLE, WorkStatus

__all__ = ["TaskKind", "TaskView"]

TaskKind = Literal["work", "exec"]

_EXEC_MOVES: Final[dict[str, ExecStatus]] = {"execRequested": "requested", "execStarted": "running"}


class TaskView:
    """One task as of ``version`` (the seq of the last event folded). Mutable; not shared."""

    __slots__ = (
        "_artifacts",
        "_history",
        "_status",
        "consumer",
        "context_id",
        "exec_status",
        "kind",
        "opened_seq",
        "owner",
        "requester",
        "streams",
        "task_id",
        "version",
        "work_status",
    )

    def __init__(self, task_id: str, context_id: str, kind: TaskKind) -> None:
        self.task_id = task_id
        self.context_id = context_id
        self.kind: TaskKind = kind
        self.version = 0
        self.opened_seq = 0
        self.work_status: WorkStatus | None = None
        self.exec_status: ExecStatus | None = None
        self.requester: str | None = None
        self.owner: str | None = None
        self.consumer: str | None = None
        self.streams: list[str] = []
        self._status = TaskStatus(state=TaskState.TASK_STATE_UNSPECIFIED)
        self._history: list[Message] = []
        self._artifacts: dict[str, Artifact] = {}

    def copy(self) -> TaskView:
        """An independent copy (to fold on without touching the original)."""
        other = TaskView(self.task_id, self.context_id, self.kind)
        for name in ("version", "opened_seq", "work_status", "exec_status", "requester"):
            setattr(other, name, getattr(self, name))
        other.owner = self.owner
        other.consumer = self.consumer
        other.streams = list(self.streams)
        other._status = self._status  # replaced, never changed in place, by a fold
        other._history = list(self._history)
        for artifact_id, artifact in self._artifacts.items():
            copy = Artifact()
            copy.CopyFrom(artifact)  # chunks are appended in place: copy
            other._artifacts[artifact_id] = copy
        return other

    @property
    def status_millis(self) -> int:
        """The status time in ms since the epoch (ListTasks orders by it)."""
        return int(self._status.timestamp.ToMilliseconds())

    @property
    def exists(self) -> bool:
        return self.opened_seq > 0

    @property
    def state(self) -> TaskState:
        if self.kind == "work":
            return WORK_STATE[self.work_status] if self.work_status else self._status.state
        return EXEC_STATE[self.exec_status] if self.exec_status else self._status.state

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES

    @property
    def interrupted(self) -> bool:
        return self.state in INTERRUPTED_STATES

    def belongs(self, event: Event) -> bool:
        """Whether ``event`` is one of this task's events."""
        crossing = CROSSINGS.get(event.kind)
        return (
            crossing is not None
            and crossing.task == self.kind
            and event.workspace == self.context_id
            and task_id_of(event) == self.task_id
        )

    def apply(self, event: Event) -> list[A2AUpdate]:
        """Fold ``event`` (ignored unless :meth:`belongs`); return the A2A updates it becomes.

        Events must come in seq order; an event at or before :attr:`version` is ignored.
        """
        if (event.seq and event.seq <= self.version) or not self.belongs(event):
            return []
        if not self.exists:
            self.opened_seq = event.seq or 1
            self.requester = event.producer
        if self.consumer is None:
            self.consumer = event.consumer
        kind = event.kind
        append = False
        updates: list[A2AUpdate] = []
        if self.kind == "work":
            nxt = WORK_LIFECYCLE.table.get(self.work_status, {}).get(kind)
            if nxt is not None:  # an illegal move leaves the status as it was (as the fold does)
                self.work_status = nxt
                if kind == "workClaimed":
                    self.owner = event.producer
        elif kind in _EXEC_MOVES:
            if kind == "execRequested" or self.exec_status == "requested":
                self.exec_status = _EXEC_MOVES[kind]
        elif isinstance(event, ExecFinished):
            if self.exec_status in ("requested", "running"):
                self.exec_status = event.payload.status
                updates.extend(closing_chunks(self.task_id, self.context_id, self.streams))
        elif isinstance(event, ExecOutput):
            stream = event.payload.stream
            append = stream in self.streams
            if not append:
                self.streams.append(stream)
        updates.extend(to_a2a(event, state=self.state, append=append))
        for update in updates:
            self._fold(update)
        if event.seq:
            self.version = event.seq
        return updates

    def _fold(self, update: A2AUpdate) -> None:
        if isinstance(update, TaskStatusUpdateEvent):
            status = update.status
            self._status = TaskStatus()
            self._status.CopyFrom(status)
            if status.HasField("message"):
                self._history.append(status.message)
            return
        artifact = update.artifact
        old = self._artifacts.get(artifact.artifact_id)
        if old is None or not update.append:
            copy = Artifact()
            copy.CopyFrom(artifact)
            self._artifacts[artifact.artifact_id] = copy
            return
        # As the SDK's own fold (a2a.server.tasks.task_manager.append_artifact_to_task)
        # does, so a snapshot and a client's fold of the updates are the same artifact.
        old.parts.extend(artifact.parts)
        old.metadata.update(dict(artifact.metadata.items()))

    def task(self, *, history_length: int | None = None, include_artifacts: bool = True) -> Task:
        """The A2A Task as of :attr:`version`. ``history_length``: keep only the newest n
        messages (None: all; 0: none)."""
        status = TaskStatus()
        status.CopyFrom(self._status)
        status.state = self.state
        history = self._history if history_length is None else self._history[-history_length:]
        if history_length == 0:
            history = []
        task = Task(id=self.task_id, context_id=self.context_id, status=status, history=history)
        if include_artifacts:
            task.artifacts.extend(self._artifacts.values())
        meta = struct_pb2.Struct()
        meta.update(
            {
                "agora.task": "workItem" if self.kind == "work" else "execution",
                "agora.version": self.version,
                "agora.openedSeq": self.opened_seq,
                **({"agora.requester": self.requester} if self.requester else {}),
                **({"agora.owner": self.owner} if self.owner else {}),
                **({"agora.consumer": self.consumer} if self.consumer else {}),
            }
        )
        task.metadata.CopyFrom(meta)
        return task
