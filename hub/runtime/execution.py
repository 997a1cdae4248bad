"""One execution's lifecycle, from admission to ``execFinished`` (docs/execution.md, "Runtime")::

    task: push the workspace ─ execStarted ─ run (execOutput…, coalesced) ─ pull
          ─ fileWritten/fileDeleted (caused by the request) ─ execFinished

:class:`Execution` is the live state of one admitted execution; :func:`supervise` is its task
(run in the :class:`~hub.runtime.runtime.Runtime`'s ``TaskGroup``). What the run gets from the
runtime follows the backend's declared capabilities, never its kind: a ``files`` backend gets the
workspace pushed into a directory and its changes pulled back, a ``hostFunctions`` backend a
:class:`~hub.runtime.access.LogAccess` whose writes are events at once, a ``none`` backend
neither. Once the request is accepted the task always ends with the execution recorded as
finished (unless the log itself fails): a failure of the machinery is ``failed/error``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Final, Literal

import msgspec

from backends.base import ExecutionRequest, ExecutionResult, OutputChunk, closing_stream
from hub.core.errors import ClientError
from hub.core.events import (
    Event,
    ExecFinished,
    ExecFinishedPayload,
    ExecOutput,
    ExecOutputPayload,
    ExecStarted,
    ExecStartedPayload,
    FileDeleted,
    FileWritten,
    SkippedWrite,
)
from hub.core.execution.errors import ExecutionInternal
from hub.core.execution.settings import RuntimeSettings
from hub.log.intents import BlobStaging
from hub.runtime.access import LogAccess
from hub.runtime.artifacts import collect_artifacts
from hub.runtime.coalesce import Coalescer, Flush
from hub.runtime.outcome import (
    bounded,
    failed,
    forced_result,
    raised,
    stop_note,
    stopped_before_start,
)
from hub.runtime.registry import BackendInstance
from hub.runtime.sync import (
    Mirror,
    PushFailed,
    WorkspaceMount,
    diff,
    drafts_for,
    mounts_for,
    plan,
    push,
    read_changes,
    remove_mirror,
    scan,
)
from hub.workspaces import Workspaces

__all__ = ["FILE_BATCH", "Execution", "supervise"]

log = logging.getLogger("agora.runtime")

FILE_BATCH: Final = 64
"""File events appended per batch when a run changed many files."""

_FORCED: Final = ExecutionInternal("the backend did not stop the run in time")
"""Queued by the stopper when it gives up waiting for the backend (compared by identity)."""


class Execution:
    """A live execution (admitted, not yet recorded as finished)."""

    __slots__ = (
        "accepted",
        "agent",
        "artifacts",
        "done",
        "exec_id",
        "instance",
        "killer",
        "last_seq",
        "request",
        "request_event_id",
        "shutdown",
        "staged",
        "status",
        "stop",
        "traceparent",
        "workspace",
        "workspaces",
    )

    def __init__(
        self,
        workspaces: Workspaces,
        workspace: str,
        instance: BackendInstance,
        request: ExecutionRequest,
        agent: str,
        artifacts: tuple[str, ...] = (),
    ) -> None:
        self.workspaces = workspaces
        self.artifacts = artifacts
        """Globs of the output paths to publish as artifacts after the run."""
        self.workspace = workspace
        self.exec_id = request.exec_id
        self.instance = instance
        self.request = request
        self.agent = agent
        self.request_event_id = ""
        self.accepted: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        """The ``execRequested`` id once it is in the log; ``""`` if it could not be written."""
        self.stop = asyncio.Event()
        """Set by ``kill`` (or shutdown): stop the program."""
        self.killer: str | None = None
        self.shutdown = False
        self.done = asyncio.Event()
        """Set once ``execFinished`` is in the log (or could not be written)."""
        self.status = "requested"
        self.traceparent: str | None = None
        """The W3C trace context the run's events keep (the exec frame's, then its span's)."""
        self.last_seq = 0
        """The seq of the last event the run wrote (0: none yet)."""
        self.staged: BlobStaging | None = None
        """While the run's record is written: the staging its blobs (artifacts, pulled
        content) are stored through, settled once the record is written."""

    @property
    def key(self) -> tuple[str, str]:
        return self.workspace, self.exec_id

    async def publish(self, drafts: list[Event]) -> None:
        """Append ``drafts``, produced (like every event of a run) by the agent that asked."""
        if self.traceparent is not None:
            tp = self.traceparent
            drafts = [
                d if d.traceparent else msgspec.structs.replace(d, traceparent=tp) for d in drafts
            ]
        result = await self.workspaces.publish(
            self.workspace, drafts, producer=self.agent, trusted=True, staged=self.staged
        )
        if result.events:
            self.last_seq = result.events[-1].seq


def _fields(execution: Execution) -> dict[str, str]:
    """The context fields of a log line about ``execution`` (hub.observe.logs)."""
    return {
        "workspace": execution.workspace,
        "execId": execution.exec_id,
        "agent": execution.agent,
    }


async def supervise(execution: Execution, settings: RuntimeSettings, node: str) -> None:
    """The task of one execution: push, run, pull, record (see the module docstring). The
    caller sets :attr:`Execution.done` after it (once the execution is no longer live)."""
    mirror: Mirror | None = None
    workspaces = execution.workspaces
    try:
        capabilities = execution.instance.capabilities
        mounts: tuple[WorkspaceMount, ...] = ()
        if capabilities.workspace == "files":
            mounts = mounts_for(execution.instance.access, execution.request.policy.filesystem)
        push_failed: PushFailed | None = None
        if mounts:
            try:
                files = await workspaces.files(execution.workspace)
                mirror = await push(files, workspaces.store.blobs, settings.sync)
            except PushFailed as e:
                push_failed = e
            except Exception as e:  # e.g. the store failed while reading the state
                push_failed = PushFailed(f"reading the workspace failed: {e!r}")
        execution.request_event_id = await execution.accepted
        if not execution.request_event_id:
            return  # the request was not written: nothing ran, nothing to record
        if push_failed is not None:
            message = f"the workspace could not be pushed: {push_failed.message}"
            await _record(execution, failed(execution.exec_id, "error", message, code="pushFailed"))
            return
        pushed = len(mirror.pushed) if mirror is not None else 0
        if execution.stop.is_set():
            await _record(
                execution,
                stopped_before_start(execution.exec_id, shutdown=execution.shutdown, pushed=pushed),
            )
            return
        access: LogAccess | None = None
        if capabilities.workspace == "hostFunctions":
            access = LogAccess(
                workspaces,
                execution.workspace,
                producer=execution.agent,
                causation_id=execution.request_event_id,
            )
        outcome, pending, next_n = await _run(execution, settings, node, mirror, access)
        if isinstance(outcome, ExecutionResult):
            finished = outcome.finished_payload(execution.exec_id, pushed=pushed)
            notes = stop_note(
                outcome, finished, stopped=execution.stop.is_set(), shutdown=execution.shutdown
            )
            if notes is not None:
                note, finished = notes
                pending.append(
                    ExecOutput(payload=ExecOutputPayload(execution.exec_id, "stderr", next_n, note))
                )
        else:
            finished = raised(execution.exec_id, outcome, shutdown=execution.shutdown)
            finished = msgspec.structs.replace(finished, pushed=pushed)
        if access is not None:
            finished = msgspec.structs.replace(finished, pulled=access.writes)
        drafts: list[Event] = []
        # The artifacts' blobs are stored before their events are appended: each new one
        # under its event's intent, settled once the record is written (or refused).
        async with BlobStaging(workspaces.store, execution.workspace) as staged:
            execution.staged = staged
            try:
                if mirror is not None:
                    drafts, skipped = await _pull(execution, settings, mirror, mounts)
                    finished = msgspec.structs.replace(
                        finished, pulled=len(drafts), skipped=[*finished.skipped, *skipped]
                    )
                    if execution.artifacts:
                        quota = workspaces.limits.max_workspace_bytes
                        used = await workspaces.stored_bytes(execution.workspace)
                        published, refs = await collect_artifacts(
                            staged,
                            mirror.root,
                            execution.artifacts,
                            execution.exec_id,
                            execution.request_event_id,
                            budget=max(0, quota - used),
                        )
                        drafts += published
                        finished = msgspec.structs.replace(
                            finished, artifacts=[*finished.artifacts, *refs]
                        )
                await _record(execution, finished, drafts, pending)
            finally:
                execution.staged = None
    except asyncio.CancelledError:
        raise
    except Exception as e:
        log.exception(
            "execution %s in %s failed",
            execution.exec_id,
            execution.workspace,
            extra=_fields(execution),
        )
        with contextlib.suppress(Exception):
            await _record(execution, failed(execution.exec_id, "error", f"internal error: {e!r}"))
    finally:
        if mirror is not None:
            await asyncio.shield(remove_mirror(mirror))


def _outputs(exec_id: str, flushes: list[Flush]) -> list[Event]:
    return [ExecOutput(payload=ExecOutputPayload(exec_id, f.stream, f.n, f.data)) for f in flushes]


async def _run(
    execution: Execution,
    settings: RuntimeSettings,
    node: str,
    mirror: Mirror | None,
    access: LogAccess | None,
) -> tuple[ExecutionResult | BaseException, list[Event], int]:
    """Run the backend, journaling its output (coalesced). Returns the result (or what the
    backend raised), the events not written yet (``execStarted`` if it was not, the last
    output), to be appended with ``execFinished``, and the next output ``n``.

    ``execStarted`` is written with the first output, or once ``coalesce_interval_s`` has
    passed, or with ``execFinished`` — whichever comes first: a short run costs one commit after
    its request, not three.
    """
    instance = execution.instance
    backend = instance.backend
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[OutputChunk | ExecutionResult | BaseException | None] = asyncio.Queue(
        settings.output_queue
    )
    coalescer = Coalescer(interval=settings.coalesce_interval_s, max_bytes=settings.coalesce_bytes)
    workdir = mirror.root if mirror is not None else None
    start_event: list[Event] = [
        ExecStarted(
            payload=ExecStartedPayload(
                exec_id=execution.exec_id,
                backend=instance.id,
                isolation=instance.capabilities.isolation.value,
                node=node,
            )
        )
    ]

    async def read() -> None:
        try:
            async with closing_stream(
                backend.execute(execution.request, workdir, access)
            ) as events:
                async for item in events:
                    await queue.put(item)
        except Exception as e:
            await queue.put(e)
            return
        await queue.put(None)

    async def stopper() -> None:
        await execution.stop.wait()
        # The backend may not have registered the run yet: try until it has stopped it. A
        # backend that has not stopped it after ``stop_grace_s`` is not waited for: the run is
        # closed from here (closing its stream kills the program, by contract).
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(settings.stop_grace_s):
                stopped = await backend.cancel(execution.exec_id)
                while not stopped:
                    await asyncio.sleep(0.01)
                    stopped = await backend.cancel(execution.exec_id)
                return
        log.warning(
            "backend %s did not stop %s in %g s; closing its stream",
            instance.id,
            execution.exec_id,
            settings.stop_grace_s,
        )
        await queue.put(_FORCED)

    async def write(flushes: list[Flush], *, start: bool = False) -> None:
        events = _outputs(execution.exec_id, flushes)
        if start_event and (events or start):
            events = [*start_event, *events]
            start_event.clear()
            execution.status = "running"
        if events:
            await execution.publish(events)

    outcome: ExecutionResult | BaseException
    started = loop.time()
    start_by = started + settings.coalesce_interval_s
    async with asyncio.TaskGroup() as tg:
        reader = tg.create_task(read(), name=f"agora-exec-read:{execution.exec_id}")
        stop_task = tg.create_task(stopper(), name=f"agora-exec-stop:{execution.exec_id}")
        try:
            while True:
                deadlines = [d for d in (coalescer.deadline(),) if d is not None]
                if start_event:
                    deadlines.append(start_by)
                try:
                    if not deadlines:
                        item = await queue.get()
                    else:
                        async with asyncio.timeout_at(min(deadlines)):
                            item = await queue.get()
                except TimeoutError:
                    now = loop.time()
                    await write(coalescer.due(now), start=now >= start_by)
                    continue
                if isinstance(item, OutputChunk):
                    await write(coalescer.feed(item.stream, item.data, loop.time()))
                    continue
                if isinstance(item, ExecutionResult):
                    outcome = item
                elif item is _FORCED:
                    outcome = forced_result(instance.id, loop.time() - started)
                elif item is None:
                    outcome = ExecutionInternal("the backend's stream ended without a result")
                else:
                    outcome = item
                break
        finally:
            stop_task.cancel()
            if not reader.done():
                reader.cancel()
    pending = [*start_event, *_outputs(execution.exec_id, coalescer.drain())]
    return outcome, pending, coalescer.n + 1


async def _pull(
    execution: Execution,
    settings: RuntimeSettings,
    mirror: Mirror,
    mounts: tuple[WorkspaceMount, ...],
) -> tuple[list[Event], list[SkippedWrite]]:
    """The file drafts for what the run changed in the mirror, and what is skipped."""
    limits = settings.sync
    found = await scan(mirror, limits)
    changes, skipped = plan(
        diff(mirror.sha256s(), found.files), mounts, max_changes=limits.max_changes
    )
    contents = await read_changes(mirror, changes)
    drafts = drafts_for(changes, contents, mirror.revs, execution.request_event_id)
    return drafts, [*found.problems, *skipped]


async def _record(
    execution: Execution,
    finished: ExecFinishedPayload,
    files: list[Event] | None = None,
    pending: list[Event] | None = None,
) -> None:
    """Append what the run left unwritten (``pending``: ``execStarted``, the last output), the
    file events and ``execFinished`` — one batch when they fit. File events go in batches of
    :data:`FILE_BATCH`; a batch refused by a conflict is retried file by file, the refused ones
    reported as skipped (``conflict``)."""
    finished = bounded(finished, execution.workspaces.limits)
    files = list(files or [])
    head = list(pending or [])
    if len(files) > FILE_BATCH:
        if head:
            await execution.publish(head)
            head = []
        last = len(files) - (len(files) - 1) % FILE_BATCH - 1
        for start in range(0, last, FILE_BATCH):
            finished = await _write_files(execution, files[start : start + FILE_BATCH], finished)
        files = files[last:]
    final = ExecFinished(causation_id=execution.request_event_id or None, payload=finished)
    try:
        await execution.publish([*head, *files, final])
    except ClientError:
        if not files:
            raise
        if head:
            await execution.publish(head)
        finished = await _write_files(execution, files, finished)
        final = ExecFinished(causation_id=execution.request_event_id or None, payload=finished)
        await execution.publish([final])
    execution.status = finished.status
    log.info(
        "exec %s in %s %s (%s)",
        execution.exec_id,
        execution.workspace,
        finished.status,
        execution.instance.id,
        extra={**_fields(execution), "seq": execution.last_seq},
    )


async def _write_files(
    execution: Execution, drafts: list[Event], finished: ExecFinishedPayload
) -> ExecFinishedPayload:
    try:
        await execution.publish(drafts)
        return finished
    except ClientError:
        pass
    skipped = list(finished.skipped)
    refused = 0
    for draft in drafts:
        try:
            await execution.publish([draft])
        except ClientError as e:
            refused += 1
            path = draft.payload.path if isinstance(draft, FileWritten | FileDeleted) else "?"
            op: Literal["write", "delete"] = "delete" if isinstance(draft, FileDeleted) else "write"
            skipped.append(SkippedWrite(path=path, mount_root=".", op=op, reason="conflict"))
            log.info("pull of %s refused for %s: %s", path, execution.exec_id, e.message)
    return msgspec.structs.replace(finished, pulled=finished.pulled - refused, skipped=skipped)
