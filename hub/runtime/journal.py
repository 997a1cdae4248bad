"""The runtime's view of the execution journals, kept current from the log.

For every workspace the runtime has touched, :class:`Journals` holds a
:class:`~hub.core.projections.executions.ExecJournal` (the projection, folded with its own
``evolve``) that it keeps current as a :class:`hub.workspaces.Workspaces` listener. It is the
*index*: which ids exist, their phase, requester, backend and the seqs of their request and
finish. Output is not kept in memory: ``getExec`` and ``execResult`` read an execution's events
back from the log (:meth:`Journals.read_execution`) and fold them into a fresh journal, so what
a reader sees is exactly what the log says. Finished records also drop their request; disposed
ones are removed.

A workspace's journal is loaded on first use by folding its log; committed batches that arrive
meanwhile are buffered and folded after (skipping seqs already folded), so no event is missed.

:class:`ExecFollower` is one live reader of one execution (``getExec``): the hub's one
history-then-live reader, :class:`hub.follow.LogFollower`, over the execution's workspace,
filtered to the execution and its ``resume`` mode. It replays the execution's events from the
log, then follows the live ones with no gap and no duplicate; live events wait in a bounded
buffer (``max_pending`` events of the workspace), and a reader that falls further behind is
switched back to reading the log (it loses nothing and holds no unbounded memory).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Final

from hub.core.errors import Busy, NotFound
from hub.core.events import (
    Event,
    ExecCancelRequested,
    ExecDisposed,
    ExecFinished,
    ExecOutput,
    ExecRequested,
    ExecStarted,
)
from hub.core.execution.settings import RuntimeSettings
from hub.core.projections.executions import ExecJournal, ExecRecord, evolve, rebuild
from hub.core.wire.frames import Resume
from hub.follow import DEFAULT_BUFFER, LogFollower
from hub.workspaces import Workspaces

__all__ = ["ExecFollower", "Journals", "Resume", "WorkspaceJournal", "exec_id_of"]

log = logging.getLogger("agora.runtime")

READ_BATCH: Final = 2000
_DEFAULTS: Final = RuntimeSettings()  # the defaults of [runtime], written there once
_JOURNAL_BYTES: Final = 1024  # a journal's own tables, about
_RECORD_BYTES: Final = 768  # one execution's record and its entries in the side tables, about
_EXEC_TYPES: Final = (
    ExecRequested,
    ExecCancelRequested,
    ExecStarted,
    ExecOutput,
    ExecFinished,
    ExecDisposed,
)


def exec_id_of(event: Event) -> str | None:
    """The ``execId`` of an ``exec*`` event, else ``None``."""
    if isinstance(event, _EXEC_TYPES):
        return event.payload.exec_id
    return None


class WorkspaceJournal:
    """One workspace's journal plus what the runtime needs beside it: the time each
    execution finished, the ids of its ``execRequested`` (the cause of its file events) and
    ``execStarted``, its output encoding and last output ``n``, and the live readers and
    waiters."""

    __slots__ = (
        "encodings",
        "finished_at",
        "followers",
        "journal",
        "last_n",
        "request_ids",
        "started_ids",
        "waiters",
    )

    def __init__(self, workspace: str) -> None:
        self.journal = ExecJournal(workspace=workspace)
        self.finished_at: dict[str, int] = {}
        self.request_ids: dict[str, str] = {}
        self.started_ids: dict[str, str] = {}
        self.encodings: dict[str, str | None] = {}
        self.last_n: dict[str, int] = {}
        self.followers: dict[str, set[ExecFollower]] = {}
        self.waiters: dict[str, list[asyncio.Future[None]]] = {}

    @property
    def workspace(self) -> str:
        return self.journal.workspace

    @property
    def seq(self) -> int:
        return self.journal.seq

    def record(self, exec_id: str) -> ExecRecord | None:
        """The execution's record; ``None`` if unknown or disposed."""
        rec = self.journal.executions.get(exec_id)
        return None if rec is None or rec.disposed else rec

    def fold(self, event: Event) -> None:
        """Fold one committed event (seq order); notify readers and waiters."""
        if event.seq <= self.journal.seq:
            return
        evolve(self.journal, event)
        exec_id = exec_id_of(event)
        if exec_id is None:
            return
        rec = self.journal.executions.get(exec_id)
        if isinstance(event, ExecRequested) and rec is not None and rec.request_seq == event.seq:
            self.request_ids[exec_id] = event.id
            self.encodings[exec_id] = event.payload.encoding
            self.last_n[exec_id] = 0
            self.finished_at.pop(exec_id, None)
            self.started_ids.pop(exec_id, None)
        elif isinstance(event, ExecStarted) and rec is not None and rec.started_seq == event.seq:
            self.started_ids[exec_id] = event.id
        elif isinstance(event, ExecOutput):
            self.last_n[exec_id] = max(self.last_n.get(exec_id, 0), event.payload.n)
            if rec is not None:
                rec.output.clear()  # read back from the log when needed
        elif isinstance(event, ExecFinished) and rec is not None and rec.finished_seq == event.seq:
            self.finished_at[exec_id] = event.timestamp
            self.started_ids.pop(exec_id, None)  # only recovery reads it, of open runs
            rec.request = None
            for waiter in self.waiters.pop(exec_id, []):
                if not waiter.done():
                    waiter.set_result(None)
        elif isinstance(event, ExecDisposed) and rec is not None and rec.disposed:
            del self.journal.executions[exec_id]
            tables = (
                self.finished_at,
                self.request_ids,
                self.started_ids,
                self.encodings,
                self.last_n,
            )
            for table in tables:
                table.pop(exec_id, None)

    def approx_bytes(self) -> int:
        """A rough size of what this journal holds (for the cache's bound): a fixed cost per
        execution, plus the request an unfinished one keeps."""
        size = _JOURNAL_BYTES + _RECORD_BYTES * len(self.journal.executions)
        for rec in self.journal.executions.values():
            if rec.request is not None:
                size += len(rec.request.source or "") + len(rec.request.stdin or "")
        return size

    async def finished(self, exec_id: str) -> ExecRecord:
        """Wait until ``exec_id`` has finished; its record. Raises :class:`NotFound`."""
        while True:
            rec = self.record(exec_id)
            if rec is None:
                raise NotFound(f"no execution {exec_id!r} in {self.workspace!r}", execId=exec_id)
            if rec.finished_seq is not None:
                return rec
            waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            self.waiters.setdefault(exec_id, []).append(waiter)
            try:
                await waiter
            finally:
                waiters = self.waiters.get(exec_id)
                if waiters is not None and waiter in waiters:
                    waiters.remove(waiter)


class Journals:
    """Every loaded :class:`WorkspaceJournal`; a :class:`hub.workspaces.Workspaces` listener
    (added by the owner), and the :class:`~hub.follow.LogFollower` its live readers share."""

    def __init__(
        self,
        workspaces: Workspaces,
        *,
        max_readers: int = _DEFAULTS.max_readers,
        max_pending: int = DEFAULT_BUFFER,
        cache_bytes: int = _DEFAULTS.journal_cache_bytes,
    ) -> None:
        self.workspaces = workspaces
        self.store = workspaces.store
        self.max_readers = max_readers
        self.cache_bytes = cache_bytes
        self.log = LogFollower(workspaces, buffer=max_pending)
        self.log.install()
        # Least recently used first: evicted from the front (see _evict).
        self._loaded: OrderedDict[str, WorkspaceJournal] = OrderedDict()
        self._loading: dict[str, asyncio.Future[WorkspaceJournal]] = {}
        self._buffers: dict[str, list[Event]] = {}

    def __call__(self, workspace: str, batch: Sequence[Event]) -> None:
        """The listener: fold committed batches into loaded journals (buffer while loading)."""
        journal = self._loaded.get(workspace)
        if journal is not None:
            for event in batch:
                journal.fold(event)
            return
        buffer = self._buffers.get(workspace)
        if buffer is not None:
            buffer.extend(batch)

    @property
    def loaded(self) -> list[WorkspaceJournal]:
        return list(self._loaded.values())

    def forget(self, workspace: str) -> None:
        """Drop the workspace's journal (reloaded from the log on its next use)."""
        self._loaded.pop(workspace, None)

    def _evict(self) -> None:
        """Evict least recently used journals nobody waits on or follows until the estimate
        of what is kept is within ``cache_bytes`` (an evicted journal is reloaded from the log
        on demand; one with readers or waiters stays, they hold it)."""
        total = sum(j.approx_bytes() for j in self._loaded.values())
        for name, journal in list(self._loaded.items()):
            if total <= self.cache_bytes:
                return
            if any(journal.followers.values()) or any(journal.waiters.values()):
                continue
            total -= journal.approx_bytes()
            del self._loaded[name]

    async def get(self, workspace: str) -> WorkspaceJournal:
        """The workspace's journal, loading it from the log on first use. Raises
        ``Unavailable`` for a quarantined workspace."""
        self.workspaces.refuse_quarantined(workspace)
        journal = self._loaded.get(workspace)
        if journal is not None:
            self._loaded.move_to_end(workspace)
            return journal
        pending = self._loading.get(workspace)
        if pending is not None:
            return await asyncio.shield(pending)
        future: asyncio.Future[WorkspaceJournal] = asyncio.get_running_loop().create_future()
        self._loading[workspace] = future
        self._buffers[workspace] = []  # before the first read: no commit slips between
        try:
            journal = WorkspaceJournal(workspace)
            while True:
                page = await self.workspaces.read_batch(
                    workspace, after_seq=journal.seq, limit=READ_BATCH
                )
                for event in page:
                    journal.fold(event)
                if len(page) < READ_BATCH:
                    break
            for event in self._buffers[workspace]:
                journal.fold(event)
            self._loaded[workspace] = journal
            self._evict()
            future.set_result(journal)
            return journal
        except BaseException as e:
            future.set_exception(e)
            future.exception()  # retrieved: waiters re-raise it themselves
            raise
        finally:
            del self._loading[workspace]
            del self._buffers[workspace]

    async def read_execution(self, journal: WorkspaceJournal, rec: ExecRecord) -> ExecRecord:
        """The execution's full record (output and result) folded from its events in the log
        (from its ``execRequested`` to its ``execFinished``, or the journal's seq)."""
        events = [
            ev
            async for ev in self.events_of(
                journal.workspace,
                rec.exec_id,
                after_seq=rec.request_seq - 1,
                until_seq=rec.finished_seq or journal.seq,
            )
        ]
        full = rebuild(events, journal.workspace).executions.get(rec.exec_id)
        if full is None:  # pragma: no cover  (the log has its execRequested)
            raise NotFound(f"no execution {rec.exec_id!r} in the log", execId=rec.exec_id)
        return full

    async def events_of(
        self, workspace: str, exec_id: str, *, after_seq: int, until_seq: int
    ) -> AsyncIterator[Event]:
        """The events of ``exec_id`` with ``after_seq < seq <= until_seq``, in seq order."""
        after = after_seq
        while after < until_seq:
            page = await self.workspaces.read_batch(
                workspace, after_seq=after, until_seq=until_seq, limit=READ_BATCH
            )
            if not page:
                return
            for event in page:
                if exec_id_of(event) == exec_id:
                    yield event
            after = page[-1].seq

    def follow(self, journal: WorkspaceJournal, exec_id: str, resume: Resume) -> ExecFollower:
        """A live reader of ``exec_id`` (register it now; iterate it; close it). Raises
        :class:`NotFound` (unknown or disposed) or :class:`Busy` (``max_readers`` already
        follow it)."""
        rec = journal.record(exec_id)
        if rec is None:
            raise NotFound(f"no execution {exec_id!r} in {journal.workspace!r}", execId=exec_id)
        readers = journal.followers.setdefault(exec_id, set())
        if len(readers) >= self.max_readers:
            raise Busy(
                f"execution {exec_id!r} already has {self.max_readers} live readers",
                execId=exec_id,
                limit=self.max_readers,
            )
        follower = ExecFollower(self.log, journal, rec, resume)
        readers.add(follower)
        return follower


def _wanted(resume: Resume) -> Callable[[Event], bool]:
    """The filter of a ``resume`` mode (``tail`` filters by position, not kind)."""
    if not isinstance(resume, int):
        return lambda _event: True
    after = resume
    state = {"reached": after == 0}

    def wanted(event: Event) -> bool:
        if isinstance(event, ExecOutput):
            if event.payload.n >= after:
                state["reached"] = True
            return event.payload.n > after
        if isinstance(event, ExecRequested | ExecStarted):
            return False
        return state["reached"] or isinstance(event, ExecFinished)

    return wanted


class ExecFollower:
    """One ``getExec`` reader (see the module docstring). Iterate it once, then
    :meth:`close` it (``async with`` does). ``status`` is the execution's status when the
    stream ended."""

    def __init__(
        self, log: LogFollower, journal: WorkspaceJournal, rec: ExecRecord, resume: Resume
    ) -> None:
        self._log = log
        self._journal = journal
        self.exec_id = rec.exec_id
        self.encoding = journal.encodings.get(rec.exec_id)
        self._resume = resume
        self._wanted = _wanted(resume)
        self._request_seq = rec.request_seq
        self._start = journal.seq  # every event of the execution up to here is in the log
        self._finished = rec.finished_seq is not None
        self.status: str = rec.status
        self._closed = False

    def close(self) -> None:
        """Stop following (idempotent)."""
        if self._closed:
            return
        self._closed = True
        readers = self._journal.followers.get(self.exec_id)
        if readers is not None:
            readers.discard(self)
            if not readers:
                del self._journal.followers[self.exec_id]

    async def __aenter__(self) -> ExecFollower:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.close()

    async def events(self) -> AsyncIterator[Event]:
        """The execution's events per ``resume``, ending after its ``execFinished``."""
        if self._resume == "tail":
            if self._finished:
                return  # nothing new will come
            after = self._start
        else:
            after = self._request_seq - 1
        stream = self._log.follow(self._journal.workspace, after_seq=after)
        async with contextlib.aclosing(stream) as events:
            async for event in events:
                if self._closed:
                    return
                if exec_id_of(event) != self.exec_id:
                    continue
                if isinstance(event, ExecFinished):
                    self.status = event.payload.status
                if self._wanted(event):
                    yield event
                if isinstance(event, ExecFinished):
                    return
