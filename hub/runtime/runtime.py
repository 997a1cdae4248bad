"""The execution runtime: ``exec`` / ``kill`` / ``execResult`` / ``getExec`` / ``dispose`` over
the hub's backend instances, every step journaled in the workspace log.

One :class:`Runtime` per hub, the router of the ops: it checks and admits a request
(:mod:`~hub.runtime.request` builds the backend's request from the wire's), writes
``execRequested``, and leaves the run to its task (:mod:`~hub.runtime.execution`), a task of
the ``TaskGroup`` :meth:`Runtime.run` owns (run as a task of the server's top-level group), so
shutdown waits for each execution to be stopped and recorded — for ``close_grace_s``, then as
long again for the backends to close. Past either, the stop gives up on the backends' pending
calls (an engine that stopped answering: ``abandon``), so the runs end, recorded
``failed/interrupted``, and the sandboxes they leave are the next start's sweep's::

    exec ─ checks (rights, backend, request, id, cap) ─ execRequested ─▶ execAccepted
      └─ task: push ─ execStarted ─ run (execOutput…) ─ pull ─ files ─ execFinished

Nothing is written for a refused request. Everything the program does ends in an
``execFinished`` (a failure of the machinery too, as ``failed/error``); a hub that dies mid-run
leaves executions without one, and :meth:`Runtime.recover` (:mod:`~hub.runtime.recovery`)
closes them at the next start as ``failed/interrupted`` with a stderr note. The events of a run
(``execStarted``, ``execOutput``, the pulled files, ``execFinished``) are produced by the agent
that asked for it; ``execCancelRequested`` by the killer, a ``dispose``'s ``execDisposed`` by
the disposer, and what the hub writes on nobody's behalf (recovery, retention) by ``hub``.

Seed 003's rules: an omitted backend is the first instance; an unknown one is ``notFound``;
ids are optional (a UUID is minted), 1-256 UTF-8 bytes, unique per workspace while retained (a
running or starting id is ``busy``, a retained finished one ``exists`` until disposed);
``input`` only on callable backends; at most ``max_executions`` executions per hub (``busy``);
finished executions beyond the newest ``retention_keep`` and older than
``retention_window_s`` are pruned (:mod:`~hub.runtime.pruning`); ``kill`` of an unknown id is
``notFound``, of a finished one a no-op, and concurrent kills share one finalisation;
``dispose`` of a running one is ``busy``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Final

from backends.base import Admission, validate_request
from hub.core.capability import Capability
from hub.core.errors import AgoraError, Busy, Exists, NotFound, Unavailable
from hub.core.events import (
    Event,
    ExecCancelRequested,
    ExecCancelRequestedPayload,
    ExecDisposed,
    ExecDisposedPayload,
    ExecModuleRef,
    ExecOutput,
    ExecRequested,
)
from hub.core.execution.errors import BackendUnavailable
from hub.core.execution.settings import RuntimeSettings
from hub.core.validation import validate_traceparent, validate_workspace
from hub.core.wire.frames import Exec, RuntimeResult
from hub.log.ids import mint_id
from hub.log.intents import BlobStaging
from hub.runtime.artifacts import artifact_globs
from hub.runtime.execution import Execution, supervise
from hub.runtime.journal import ExecFollower, Journals, Resume
from hub.runtime.pruning import Pruner
from hub.runtime.recovery import recover
from hub.runtime.recovery_index import RecoveryIndex
from hub.runtime.registry import BackendRegistry
from hub.runtime.request import execution_request, requested_payload
from hub.runtime.results import TextDecoders, encoding_of, runtime_result
from hub.workspaces import Workspaces

if TYPE_CHECKING:
    from hub.observe.tracing import Tracing

__all__ = ["ExecStream", "Runtime", "default_node"]

log = logging.getLogger("agora.runtime")


def default_node() -> str:
    """This process as a node id (``host:pid``), for a hub that names none."""
    return f"{socket.gethostname()}:{os.getpid()}"


class ExecStream:
    """One ``getExec`` stream: the follower's events, each with its ``execOutput`` text for a
    ``utf8`` execution. Use ``async with``; ``status`` once it ended."""

    def __init__(self, follower: ExecFollower) -> None:
        self.follower = follower
        self.exec_id = follower.exec_id
        self._decoders = TextDecoders() if follower.encoding == "utf8" else None

    @property
    def status(self) -> str:
        return self.follower.status

    async def __aenter__(self) -> ExecStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        self.follower.close()

    async def items(self) -> AsyncIterator[tuple[Event, str | None]]:
        async for event in self.follower.events():
            text = None
            if self._decoders is not None and isinstance(event, ExecOutput):
                text = self._decoders.decode(event.payload.stream, event.payload.data)
            yield event, text


ABANDONED_WAIT_S: Final = 5.0
"""After :meth:`BackendRegistry.abandon <hub.runtime.registry.BackendRegistry.abandon>` the
backends' calls fail at once: how long the stop still waits (a backstop, never reached but by a
backend that ignores the abandon), before it cancels what is left."""


class Runtime:
    """The hub's execution runtime (see the module docstring). ``node``: this hub node's id,
    written in every ``execRequested`` and ``execStarted`` (a survivor closes what it leaves
    open: :mod:`hub.cluster.interrupted`)."""

    def __init__(
        self,
        workspaces: Workspaces,
        registry: BackendRegistry,
        settings: RuntimeSettings | None = None,
        *,
        node: str | None = None,
        index: RecoveryIndex | None = None,
    ) -> None:
        self.workspaces = workspaces
        self.index = index
        self.store = workspaces.store
        self.registry = registry
        self.settings = settings or RuntimeSettings()
        self.node = node or default_node()
        self.journals = Journals(
            workspaces,
            max_readers=self.settings.max_readers,
            cache_bytes=self.settings.journal_cache_bytes,
        )
        workspaces.add_listener(self.journals)
        self.pruner = Pruner(workspaces, self.journals, self.settings)
        self._live: dict[tuple[str, str], Execution] = {}
        self._tg: asyncio.TaskGroup | None = None
        self._runs: set[asyncio.Task[None]] = set()  # the executions' tasks (for the stop)
        self._closing = False
        self.on_finished: Callable[[str, str, float], None] | None = None
        """Told (backend id, final status, seconds) as each execution ends (the metrics)."""
        self.tracing: Tracing | None = None
        """Where the ``agora.exec`` spans go (the hub sets its own; default: nowhere)."""

    # -- lifecycle --------------------------------------------------------------------------------

    @property
    def default_backend(self) -> str | None:
        """The id an ``exec`` without ``backend`` runs on (the first instance)."""
        return self.registry.default_id

    @property
    def running(self) -> int:
        """Executions admitted and not yet finished."""
        return len(self._live)

    async def run(self, stop: asyncio.Event) -> None:
        """Serve executions until ``stop`` is set, then stop the running ones (recorded as
        ``failed/interrupted``), wait for them, and close the backends — each wait bounded by
        ``close_grace_s`` (see the module docstring). Never raises."""
        starter: asyncio.Task[None] | None = None
        grace = self.settings.close_grace_s
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                if self.settings.eager_start:
                    starter = tg.create_task(self.registry.start_all(), name="agora-backends")
                tg.create_task(self.pruner.sweep(stop), name="agora-retention")
                await stop.wait()
                self._closing = True
                if starter is not None:
                    starter.cancel()
                for execution in list(self._live.values()):
                    execution.shutdown = True
                    execution.stop.set()
                if self._runs:
                    await self._within(set(self._runs), grace, "the running executions")
        except Exception:
            log.exception("the runtime failed")
        finally:
            self._closing = True
            self._tg = None
            closing = asyncio.ensure_future(self.registry.aclose())
            await self._within({closing}, grace, "closing the backends")

    async def _within(self, tasks: set[asyncio.Task[None]], grace: float, what: str) -> None:
        """Wait up to ``grace`` for ``tasks`` (a stop's), then give up on the backends' pending
        calls (:meth:`BackendRegistry.abandon`): the runs' cleanups fail fast, each run is
        recorded as the stop ends it, what the backends leave is swept at the next start.
        What is left :data:`ABANDONED_WAIT_S` later is cancelled."""
        _, pending = await asyncio.wait(tasks, timeout=grace)
        if not pending:
            return
        log.warning(
            "%s did not end within %g s (close_grace_s); giving up on the backends' pending "
            "calls (the next start sweeps what they leave)",
            what,
            grace,
        )
        self.registry.abandon()
        _, pending = await asyncio.wait(pending, timeout=ABANDONED_WAIT_S)
        if pending:
            log.error("%s still not done %g s after that; cancelling", what, ABANDONED_WAIT_S)
            for task in pending:
                task.cancel()

    async def recover(self) -> int:
        """Close every execution the log shows unfinished (the hub stopped under it) as
        ``failed/interrupted``, with a stderr note after the output already journaled. Run at
        start, before serving. Returns how many were closed."""
        # Executions admitted by this runtime are running here, not interrupted.
        closed, journals = await recover(
            self.workspaces,
            self.journals,
            closed_by=self.node,
            live=set(self._live),
            index=self.index,
        )
        for journal in journals:
            await self.pruner.prune(journal)
        return closed

    # -- operations -------------------------------------------------------------------------------

    async def exec(
        self,
        workspace: str,
        request: Exec,
        *,
        exec_id: str | None = None,
        capability: Capability,
    ) -> str:
        """Start ``request`` (an ``exec`` op) in ``workspace`` for the holder of
        ``capability``; return its id (``exec_id``, else the request's, else a new UUID) once
        ``execRequested`` is durable.

        Raises (nothing written): ``Forbidden`` (no ``exec`` right, backend not in the
        token, a policy wider than the instance's → ``rejected``), ``NotFound`` (unknown
        backend), ``BadRequest`` (invalid request, ``input`` on a non-callable backend),
        ``Busy`` (id running, concurrency cap), ``Exists`` (id retained),
        ``Unavailable`` (backend unavailable, hub stopping).
        """
        validate_workspace(workspace)
        capability.require("exec", workspace)
        instance = self.registry.get(request.backend)
        capability.require_backend(instance.id)
        if self._tg is None or self._closing:
            raise Unavailable("the runtime is not running (the hub is starting or stopping)")
        await instance.backend.start()
        ok, why = instance.available()
        if not ok:
            raise BackendUnavailable(
                f"backend {instance.id!r} is unavailable: {why}", backend=instance.id
            )
        if exec_id is None:
            exec_id = request.exec_id if request.exec_id is not None else str(uuid.uuid4())
        prepared = execution_request(instance, request, exec_id, capability.agent)
        globs = artifact_globs(request.artifacts)
        validate_request(prepared.request, instance.capabilities)
        self.workspaces.refuse_quarantined(workspace)
        named = prepared.logged_module
        if named is not None and not (
            await self.workspaces.may_reference(workspace, named.blob)
            and await self.store.blobs.has(named.blob)
        ):
            # Knowing a hash runs nothing: only a module this workspace holds or was uploaded.
            raise NotFound(
                f"workspace {workspace!r} holds no blob {named.blob}: upload it first (putBlob)",
                field="module.blob",
            )
        # What the backend would refuse (its cap, its validation of the code) is refused now,
        # before execRequested: the admission holds a slot of its cap until the run takes it.
        admission = await instance.backend.admit(prepared.request)
        try:
            journal = await self.journals.get(workspace)
            # From here to the reservation nothing awaits: the checks and the admission are
            # atomic.
            key = (workspace, exec_id)
            if key in self._live:
                raise Busy(f"execution {exec_id!r} is running", execId=exec_id)
            rec = journal.record(exec_id)
            if rec is not None:
                if rec.finished_seq is None:
                    raise Busy(f"execution {exec_id!r} is running", execId=exec_id)
                raise Exists(
                    f"execution {exec_id!r} exists (finished); dispose it first", execId=exec_id
                )
            limit = self.settings.max_executions
            if len(self._live) >= limit:
                raise Busy(f"the hub is running its maximum of {limit} executions", limit=limit)
            tg = self._tg
            if tg is None or self._closing:
                raise Unavailable("the hub is stopping")
        except BaseException:
            admission.release()
            raise
        execution = Execution(
            self.workspaces,
            workspace,
            instance,
            prepared.request,
            capability.agent,
            globs,
        )
        if request.traceparent is not None:
            execution.traceparent = validate_traceparent(request.traceparent, "$.traceparent")
        self._live[key] = execution
        # The task starts now and pushes the workspace while execRequested commits; it runs
        # the program only once the request is in the log (``accepted``: its event id, or ""
        # when the request could not be written).
        run = tg.create_task(
            self._task(execution, admission), name=f"agora-exec:{workspace}:{exec_id}"
        )
        self._runs.add(run)
        run.add_done_callback(self._runs.discard)
        try:
            if self.index is not None:  # before the request is in the log (see recovery_index)
                await self.index.opening(self.index.executions, key)
            module = prepared.logged_module
            draft_id = mint_id(int(time.time() * 1000))  # time-ordered, as every event id
            # A module sent whole is stored before its execRequested, under that event's
            # intent: a crash between the two leaves no orphan blob.
            async with BlobStaging(self.store, workspace) as staged:
                if prepared.module_bytes is not None:
                    module = ExecModuleRef(blob=await staged.put(draft_id, prepared.module_bytes))
                draft = ExecRequested(
                    id=draft_id,
                    payload=requested_payload(prepared, instance.id, module, self.node),
                    traceparent=execution.traceparent,
                )
                written = await self.workspaces.publish(
                    workspace, [draft], producer=capability.agent, trusted=True
                )
                if prepared.module_bytes is not None and module is not None:
                    await self._grant_module(
                        workspace, module.blob, prepared.module_bytes, capability.agent
                    )
                await staged.committed()
        except BaseException:
            self._live.pop(key, None)
            execution.accepted.set_result("")
            raise
        execution.accepted.set_result(written.events[0].id)
        return exec_id

    async def _grant_module(self, workspace: str, sha256: str, module: bytes, agent: str) -> None:
        """A module sent whole by the agent: the workspace may run it again by its hash.
        Granted once its request is in the log (a crash before leaves no grant); a failure
        only costs that (the request is written: the run goes on)."""
        try:
            await self.store.blobs.grant(workspace, sha256, len(module), agent)
        except AgoraError as e:
            log.warning("the grant of module %s to %s failed: %s", sha256, workspace, e)

    async def _traced(self, execution: Execution, tracing: Tracing) -> None:
        """:func:`supervise` as the span ``agora.exec``, the child of the exec frame's
        ``traceparent``; the run's events (started, output, files, finished) keep the span's."""
        attributes: dict[str, str | int] = {
            "agora.workspace": execution.workspace,
            "agora.exec_id": execution.exec_id,
            "agora.backend": execution.instance.id,
            "agora.agent": execution.agent,
        }
        with tracing.span("agora.exec", execution.traceparent, attributes=attributes) as span:
            execution.traceparent = tracing.traceparent(span) or execution.traceparent
            await supervise(execution, self.settings, self.node)
            if span is not None:
                span.set_attribute("agora.status", execution.status)

    async def _task(self, execution: Execution, admission: Admission) -> None:
        """One execution's task: its lifecycle, then retention for its workspace. The
        backend's slot is released if the run never took it (the request was not written, or
        the run ended before ``execute``)."""
        began = time.monotonic()
        try:
            if self.tracing is None or not self.tracing.enabled:
                await supervise(execution, self.settings, self.node)
            else:
                await self._traced(execution, self.tracing)
        finally:
            if self.on_finished is not None:
                self.on_finished(execution.instance.id, execution.status, time.monotonic() - began)
            admission.release()
            try:
                with contextlib.suppress(Exception):
                    await self._closed_in_index(execution)
            finally:  # (also when a stop that gave up on the run cancels it here)
                if self._live.get(execution.key) is execution:
                    del self._live[execution.key]
                execution.done.set()
        with contextlib.suppress(Exception):
            await self.pruner.prune(await self.journals.get(execution.workspace))

    async def _closed_in_index(self, execution: Execution) -> None:
        """Forget the execution in the recovery index once the log shows it closed (or it was
        never written); one still open there is left for the next start to close."""
        if self.index is None:
            return
        rec = (await self.journals.get(execution.workspace)).record(execution.exec_id)
        if rec is None or rec.finished_seq is not None or not execution.request_event_id:
            await self.index.closed(self.index.executions, execution.key)

    async def kill(self, workspace: str, exec_id: str, *, capability: Capability) -> str:
        """Stop ``exec_id`` and wait until it is recorded as finished; its final status.

        A finished execution is left as it is. Raises ``Forbidden``, ``NotFound``."""
        validate_workspace(workspace)
        capability.require("exec", workspace)
        journal = await self.journals.get(workspace)
        execution = self._live.get((workspace, exec_id))
        if execution is None:
            rec = journal.record(exec_id)
            if rec is None:
                raise NotFound(f"no execution {exec_id!r} in {workspace!r}", execId=exec_id)
            return rec.status
        capability.require_backend(execution.instance.id)
        if not await asyncio.shield(execution.accepted):  # the request was never written
            raise NotFound(f"no execution {exec_id!r} in {workspace!r}", execId=exec_id)
        if execution.killer is None and not execution.done.is_set():
            execution.killer = capability.agent
            await self.workspaces.publish(
                workspace,
                [
                    ExecCancelRequested(
                        causation_id=execution.request_event_id or None,
                        payload=ExecCancelRequestedPayload(exec_id=exec_id, reason="kill"),
                    )
                ],
                producer=capability.agent,
                trusted=True,
            )
            execution.stop.set()
        await execution.done.wait()
        return execution.status

    async def result(
        self, workspace: str, exec_id: str, *, capability: Capability
    ) -> RuntimeResult:
        """Wait until ``exec_id`` has finished; its result read from the log. Raises
        ``Forbidden``, ``NotFound``."""
        validate_workspace(workspace)
        capability.require("read", workspace)
        journal = await self.journals.get(workspace)
        rec = await journal.finished(exec_id)
        encoding = encoding_of(journal.encodings.get(exec_id))
        full = await self.journals.read_execution(journal, rec)
        try:
            value_from_stdout = self.registry.get(rec.backend).capabilities.value_from_stdout
        except NotFound:
            value_from_stdout = False
        return runtime_result(full, encoding, value_from_stdout=value_from_stdout)

    async def follow(
        self, workspace: str, exec_id: str, resume: Resume, *, capability: Capability
    ) -> ExecStream:
        """A ``getExec`` stream (registered now). Raises ``Forbidden``, ``NotFound``,
        ``Busy`` (too many live readers)."""
        validate_workspace(workspace)
        capability.require("read", workspace)
        journal = await self.journals.get(workspace)
        return ExecStream(self.journals.follow(journal, exec_id, resume))

    async def dispose(self, workspace: str, exec_id: str, *, capability: Capability) -> None:
        """Free a finished execution's id and journal. Raises ``Forbidden``, ``NotFound``,
        ``Busy`` (still running)."""
        validate_workspace(workspace)
        capability.require("exec", workspace)
        journal = await self.journals.get(workspace)
        key = (workspace, exec_id)
        rec = journal.record(exec_id)
        disposing = self.pruner.disposing
        if rec is None or key in disposing:
            raise NotFound(f"no execution {exec_id!r} in {workspace!r}", execId=exec_id)
        if key in self._live or rec.finished_seq is None:
            raise Busy(f"execution {exec_id!r} is running; kill it first", execId=exec_id)
        disposing.add(key)
        try:
            await self.workspaces.publish(
                workspace,
                [ExecDisposed(payload=ExecDisposedPayload(exec_id=exec_id))],
                producer=capability.agent,
                trusted=True,
            )
        finally:
            disposing.discard(key)
