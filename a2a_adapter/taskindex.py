"""Derived task indexes: every A2A task of a workspace, folded as events commit.

``GetTask`` and ``ListTasks`` read a :class:`WorkspaceTasks` — task id → its
:class:`~a2a_adapter.taskview.TaskView` (state, last seq, history, artifacts) plus the tasks
ordered by status time — instead of folding the log. :class:`TaskIndex` keeps one per
workspace, fed by a :class:`~hub.workspaces.Workspaces` listener (committed batches come in seq
order and without gaps for an open workspace) and rebuilt from the log the first time a
workspace is read, or after it was evicted, or when the listener missed events (a workspace
another node wrote to while it was closed here). A rebuild reads the log in pages of
:data:`PAGE` events and yields to the event loop between pages, so the WebSocket hub sharing
the loop is never stalled by one long fold.

Everything here is derived and disposable: evicting an index costs one rebuild.
"""

from __future__ import annotations

import asyncio
import bisect
import heapq
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Final

from a2a.types.a2a_pb2 import TaskState

from a2a_adapter.mapping import CROSSINGS, task_id_of
from a2a_adapter.taskview import TaskKind, TaskView
from hub.core.events import Event
from hub.workspaces import Workspaces

__all__ = ["PAGE", "SortKey", "TaskIndex", "WorkspaceTasks"]

PAGE: Final = 1000
"""Events folded per step of a rebuild or catch-up (then the loop gets a turn)."""

SortKey = tuple[int, str, TaskKind]
"""How ListTasks orders tasks (newest first): status time in ms, task id, kind."""


class WorkspaceTasks:
    """The tasks of one workspace as of :attr:`seq` (the last event folded)."""

    __slots__ = ("_keys", "_order", "lock", "seq", "views", "workspace")

    def __init__(self, workspace: str) -> None:
        self.workspace = workspace
        self.seq = 0
        self.views: dict[tuple[TaskKind, str], TaskView] = {}
        self._order: list[SortKey] = []  # ascending; ListTasks walks it backwards
        self._keys: dict[tuple[TaskKind, str], SortKey] = {}
        self.lock = asyncio.Lock()  # one catch-up at a time

    def __len__(self) -> int:
        return len(self.views)

    def apply(self, event: Event) -> bool:
        """Fold ``event`` if it is the next one (seq = :attr:`seq` + 1); ignore one already
        folded. Returns False on a gap (the caller must catch up from the log)."""
        if event.seq <= self.seq:
            return True
        if event.seq != self.seq + 1:
            return False
        self.seq = event.seq
        crossing = CROSSINGS.get(event.kind)
        if crossing is None:
            return True
        task_id = task_id_of(event)
        if not task_id:
            return True
        key = (crossing.task, task_id)
        view = self.views.get(key)
        if view is None:
            view = TaskView(task_id, self.workspace, crossing.task)
        view.apply(event)
        if not view.exists:
            return True
        self.views[key] = view
        new = (view.status_millis, task_id, crossing.task)
        old = self._keys.get(key)
        if old != new:
            if old is not None:
                del self._order[bisect.bisect_left(self._order, old)]
            bisect.insort(self._order, new)
            self._keys[key] = new
        return True

    def view(self, task_id: str, kind: TaskKind | None = None) -> TaskView | None:
        """The task's view (work items before executions when ``kind`` is None). Shared: do
        not fold into it (:meth:`TaskView.copy` first)."""
        kinds: tuple[TaskKind, ...] = ("work", "exec") if kind is None else (kind,)
        for k in kinds:
            view = self.views.get((k, task_id))
            if view is not None:
                return view
        return None

    def newest(self, before: tuple[int, str] | None = None) -> Iterator[tuple[SortKey, TaskView]]:
        """Tasks newest status first, starting after the cursor ``before`` (exclusive)."""
        end = len(self._order)
        if before is not None:
            end = bisect.bisect_left(self._order, before, key=lambda k: (k[0], k[1]))
        for i in range(end - 1, -1, -1):
            key = self._order[i]
            yield key, self.views[(key[2], key[1])]


class TaskIndex:
    """One :class:`WorkspaceTasks` per recently read workspace (at most ``max_workspaces``;
    the least recently used is dropped and rebuilt when read again)."""

    def __init__(self, workspaces: Workspaces, *, max_workspaces: int = 256) -> None:
        self.workspaces = workspaces
        self.max_workspaces = max_workspaces
        self._indexes: OrderedDict[str, WorkspaceTasks] = OrderedDict()
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
        index = self._indexes.get(workspace)
        if index is None:
            return  # not read yet: built from the log when it is
        for ev in batch:
            if not index.apply(ev):
                return  # a gap: the next read catches up from the log

    async def tasks(self, workspace: str) -> WorkspaceTasks:
        """The workspace's index, caught up with its committed head. Raises what the store
        raises (``BadRequest`` for an invalid name)."""
        index = self._indexes.get(workspace)
        if index is None:
            index = WorkspaceTasks(workspace)
            self._indexes[workspace] = index
            while len(self._indexes) > self.max_workspaces:
                self._indexes.popitem(last=False)
        else:
            self._indexes.move_to_end(workspace)
        head = await self.workspaces.head(workspace)
        if index.seq < head:
            async with index.lock:
                await self._catch_up(index, head)
        return index

    async def _catch_up(self, index: WorkspaceTasks, head: int) -> None:
        while index.seq < head:
            page = await self.workspaces.read_batch(
                index.workspace, after_seq=index.seq, until_seq=head, limit=PAGE
            )
            if not page:
                break
            for ev in page:
                if not index.apply(ev):
                    break  # the listener moved on meanwhile; read again from its seq
            await asyncio.sleep(0)  # let the loop serve others between pages

    def merged(
        self,
        indexes: Sequence[WorkspaceTasks],
        *,
        before: tuple[int, str] | None,
        state: TaskState | None,
        after_millis: int | None,
    ) -> Iterator[TaskView]:
        """The tasks of ``indexes``, newest status first, after cursor ``before``, filtered
        by ``state`` and status time >= ``after_millis``; stops at the first older task."""
        streams = [index.newest(before) for index in indexes]
        for key, view in heapq.merge(*streams, key=lambda kv: kv[0], reverse=True):
            if after_millis is not None and key[0] < after_millis:
                return
            if state is not None and view.state != state:
                continue
            yield view
