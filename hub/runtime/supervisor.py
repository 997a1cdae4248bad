"""The execution runtime: ``exec`` / ``kill`` / ``execResult`` / ``getExec`` / ``dispose`` over
the hub's backend instances, every step journaled in the workspace log.

One :class:`Runtime` per hub. :meth:`Runtime.run` owns a ``TaskGroup`` (run as a task of the
server's top-level group): every execution is a task of it, so shutdown waits for each to be
stopped and recorded. The lifecycle of one execution (docs/execution.md, "Runtime")::

    exec ─ checks (rights, backend, request, id, cap) ─ execRequested ─▶ execAccepted
      └─ task: push the workspace ─ execStarted ─ run (execOutput…, coalesced) ─ pull
               ─ fileWritten/fileDeleted (caused by the request) ─ execFinished

Nothing is written for a refused request. Everything the program does ends in an
``execFinished`` (a failure of the machinery too, as ``failed/error``); a hub that dies
mid-run leaves executions without one, and :meth:`Runtime.recover` closes them at the next
start as ``failed/interrupted`` with a stderr note. The events of a run (``execStarted``,
``execOutput``, the pulled files, ``execFinished``) are produced by the agent that asked for
it; ``execCancelRequested`` by the killer, a ``dispose``'s ``execDisposed`` by the disposer, and
what the hub writes on nobody's behalf (recovery, retention) by ``hub``.

Seed 003's rules: an omitted backend is the first instance; an unknown one is ``notFound``;
ids are optional (a UUID is minted), 1-256 UTF-8 bytes, unique per workspace while retained (a
running or starting id is ``busy``, a retained finished one ``exists`` until disposed);
``input`` only on callable backends; at most ``max_concurrent`` executions per hub (``busy``);
finished executions beyond the newest 100 and older than 60 min are pruned (``execDisposed``
with ``reason: "retention"``); ``kill`` of an unknown id is ``notFound``, of a finished one a
no-op, and concurrent kills share one finalisation; ``dispose`` of a running one is ``busy``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, Final, Literal, Protocol

import msgspec

from backends.base import (
    Diagnostic,
    ExecutionLanguage,
    ExecutionRequest,
    ExecutionResult,
    GuestModule,
    ModuleBlob,
    OutputChunk,
    PolicyPatch,
    SandboxPolicy,
    Source,
    narrow,
    validate_request,
)
from hub.core.capability import Capability
from hub.core.errors import AgoraError, BadRequest, Busy, ClientError, Exists, NotFound, Unavailable
from hub.core.events import (
    Event,
    ExecCancelRequested,
    ExecCancelRequestedPayload,
    ExecDisposed,
    ExecDisposedPayload,
    ExecFinished,
    ExecFinishedPayload,
    ExecModuleRef,
    ExecOutput,
    ExecOutputPayload,
    ExecRequested,
    ExecRequestedPayload,
    ExecStarted,
    ExecStartedPayload,
    SkippedWrite,
)
from hub.core.execution.errors import BackendUnavailable, ExecutionInternal
from hub.core.execution.result import CANCEL_EXIT_CODE
from hub.core.projections.executions import open_executions
from hub.core.validation import validate_sha256, validate_workspace
from hub.core.wire.frames import RuntimeResult
from hub.runtime.access import LogAccess
from hub.runtime.coalesce import DEFAULT_INTERVAL, DEFAULT_MAX_BYTES, Coalescer, Flush
from hub.runtime.journal import Follower, Journals, Resume, WorkspaceJournal
from hub.runtime.registry import BackendInstance, BackendRegistry
from hub.runtime.results import TextDecoders, encoding_of, runtime_result
from hub.runtime.retention import DEFAULT_KEEP, DEFAULT_WINDOW_MS, Finished, prunable
from hub.runtime.sync import (
    Mirror,
    Mount,
    PushFailed,
    SyncLimits,
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

__all__ = ["INTERRUPTED_NOTE", "ExecSpec", "ExecStream", "Runtime", "RuntimeSettings"]

log = logging.getLogger("agora.runtime")

INTERRUPTED_NOTE: Final = b"interrupted when the hub restarted\n"
SHUTDOWN_NOTE: Final = b"interrupted when the hub shut down\n"
CANCELLED_NOTE: Final = b"Execution cancelled.\n"
FILE_BATCH: Final = 64
HUB_PRODUCER: Final = "hub"
"""The producer of what the runtime writes on nobody's behalf (recovery, retention)."""


class RuntimeSettings(msgspec.Struct, frozen=True, kw_only=True):
    """The runtime's bounds (defaults: seed 003's)."""

    max_concurrent: int = 24
    """Executions running at once per hub; more → ``busy``."""
    max_readers: int = 8
    """Live ``getExec`` readers per execution; more → ``busy``."""
    retention_keep: int = DEFAULT_KEEP
    retention_window_ms: int = DEFAULT_WINDOW_MS
    retention_sweep_s: float = 60.0
    coalesce_interval: float = DEFAULT_INTERVAL
    coalesce_bytes: int = DEFAULT_MAX_BYTES
    output_queue: int = 64
    """Chunks buffered between a backend and the journal (back-pressure beyond)."""
    eager_start: bool = False
    """Start every backend instance when the runtime starts (``agora serve``) rather than on
    first use."""
    stop_grace_s: float = 3.0
    """How long ``kill`` (or shutdown) waits for the backend to stop a run before the runtime
    closes the run's stream itself (which kills the program) and records it as killed."""
    sync: SyncLimits = SyncLimits()
    node: str = f"{socket.gethostname()}:{os.getpid()}"


class ExecSpec(Protocol):
    """What :meth:`Runtime.exec` reads from a request: the ``exec`` frame
    (:class:`hub.core.wire.frames.Exec`) or the A2A adapter's ``ExecRequest``. Fields a request type
    lacks are taken as omitted."""

    @property
    def backend(self) -> str | None: ...

    @property
    def source(self) -> str | None: ...

    @property
    def language(self) -> str | None: ...

    @property
    def argv(self) -> list[str]: ...

    @property
    def timeout_ms(self) -> int | None: ...


class _Execution:
    """A live execution (admitted, not yet recorded as finished)."""

    __slots__ = (
        "accepted",
        "agent",
        "done",
        "encoding",
        "exec_id",
        "instance",
        "killer",
        "request",
        "request_event_id",
        "shutdown",
        "status",
        "stop",
        "workspace",
    )

    def __init__(
        self,
        workspace: str,
        exec_id: str,
        instance: BackendInstance,
        request: ExecutionRequest,
        agent: str,
        encoding: str | None,
    ) -> None:
        self.workspace = workspace
        self.exec_id = exec_id
        self.instance = instance
        self.request = request
        self.agent = agent
        self.encoding = encoding
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

    @property
    def key(self) -> tuple[str, str]:
        return self.workspace, self.exec_id


class ExecStream:
    """One ``getExec`` stream: the follower's events, each with its ``execOutput`` text for a
    ``utf8`` execution. Use ``async with``; ``status`` once it ended."""

    def __init__(self, follower: Follower) -> None:
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


_FORCED: Final = ExecutionInternal("the backend did not stop the run in time")
"""Queued by the stopper when it gives up waiting for the backend (compared by identity)."""


def _forced_result(execution: _Execution, elapsed_s: float) -> ExecutionResult:
    """The result of a run the runtime closed itself after a stop the backend did not carry
    out in time (the output is what was journaled; truncation is unknown)."""
    return ExecutionResult(
        status="cancelled",
        reason="killed",
        exit_code=CANCEL_EXIT_CODE,
        duration_ms=int(elapsed_s * 1000),
        diagnostics=[
            Diagnostic(code="killed", message="Execution cancelled."),
            Diagnostic(
                level="warning",
                code="forcedStop",
                message=f"backend {execution.instance.id!r} did not stop the run in time; the "
                "runtime closed it",
            ),
        ],
    )


def _outputs(exec_id: str, flushes: list[Flush]) -> list[Event]:
    return [ExecOutput(payload=ExecOutputPayload(exec_id, f.stream, f.n, f.data)) for f in flushes]


def _finished(
    exec_id: str,
    status: str,
    reason: str,
    *,
    exit_code: int = -1,
    message: str | None = None,
    code: str | None = None,
) -> ExecFinishedPayload:
    diagnostics: list[Any] = []
    if message is not None:
        diagnostics.append({"level": "error", "code": code or reason, "message": message})
    return ExecFinishedPayload(
        exec_id=exec_id,
        status=status,  # type: ignore[arg-type]
        reason=reason,
        exit_code=exit_code,
        diagnostics=diagnostics,
    )


class Runtime:
    """The hub's execution runtime (see the module docstring)."""

    def __init__(
        self,
        workspaces: Workspaces,
        registry: BackendRegistry,
        settings: RuntimeSettings | None = None,
    ) -> None:
        self.workspaces = workspaces
        self.store = workspaces.store
        self.registry = registry
        self.settings = settings or RuntimeSettings()
        self.journals = Journals(self.store, max_readers=self.settings.max_readers)
        workspaces.add_listener(self.journals)
        self._live: dict[tuple[str, str], _Execution] = {}
        self._disposing: set[tuple[str, str]] = set()
        self._tg: asyncio.TaskGroup | None = None
        self._closing = False

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
        ``failed/interrupted``), wait for them, and close the backends. Never raises."""
        starter: asyncio.Task[None] | None = None
        try:
            async with asyncio.TaskGroup() as tg:
                self._tg = tg
                if self.settings.eager_start:
                    starter = tg.create_task(self.registry.start_all(), name="agora-backends")
                tg.create_task(self._sweeper(stop), name="agora-retention")
                await stop.wait()
                self._closing = True
                if starter is not None:
                    starter.cancel()
                for execution in list(self._live.values()):
                    execution.shutdown = True
                    execution.stop.set()
        except Exception:
            log.exception("the runtime failed")
        finally:
            self._closing = True
            self._tg = None
            await asyncio.shield(self.registry.aclose())

    async def recover(self) -> int:
        """Close every execution the log shows unfinished (the hub stopped under it) as
        ``failed/interrupted``, with a stderr note after the output already journaled. Run at
        start, before serving. Returns how many were closed."""
        closed = 0
        for head in await self.store.heads():
            journal = await self.journals.get(head.workspace)
            for exec_id in open_executions(journal.journal, include_requested=True):
                if (head.workspace, exec_id) in self._live:
                    continue
                rec = journal.record(exec_id)
                if rec is None:
                    continue
                drafts: list[Event] = []
                if rec.status == "running":
                    n = journal.last_n.get(exec_id, 0) + 1
                    drafts.append(
                        ExecOutput(
                            payload=ExecOutputPayload(exec_id, "stderr", n, INTERRUPTED_NOTE)
                        )
                    )
                drafts.append(
                    ExecFinished(
                        causation_id=journal.request_ids.get(exec_id),
                        payload=_finished(
                            exec_id,
                            "failed",
                            "interrupted",
                            message="interrupted when the hub restarted; output journaled "
                            "before the restart is kept",
                        ),
                    )
                )
                await self.workspaces.publish(
                    head.workspace, drafts, producer=HUB_PRODUCER, trusted=True
                )
                closed += 1
                log.warning("execution %s in %s closed as interrupted", exec_id, head.workspace)
            await self._prune(journal)
        return closed

    # -- operations -------------------------------------------------------------------------------

    async def exec(
        self,
        workspace: str,
        request: ExecSpec,
        *,
        exec_id: str | None = None,
        capability: Capability,
    ) -> str:
        """Start an execution for the holder of ``capability``; return its id once
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
        backend = instance.backend
        await backend.start()
        ok, why = instance.available()
        if not ok:
            raise BackendUnavailable(
                f"backend {instance.id!r} is unavailable: {why}", backend=instance.id
            )
        if exec_id is None:
            exec_id = getattr(request, "exec_id", None)
        if exec_id is None:
            exec_id = str(uuid.uuid4())
        spec, logged_module, module_bytes = self._request(instance, request, exec_id, capability)
        validate_request(spec, instance.capabilities)
        journal = await self.journals.get(workspace)
        # From here to the reservation nothing awaits: the checks and the admission are atomic.
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
        if len(self._live) >= self.settings.max_concurrent:
            raise Busy(
                f"the hub is running its maximum of {self.settings.max_concurrent} executions",
                limit=self.settings.max_concurrent,
            )
        encoding = getattr(request, "encoding", None)
        tg = self._tg
        if tg is None:
            raise Unavailable("the hub is stopping")
        execution = _Execution(workspace, exec_id, instance, spec, capability.agent, encoding)
        self._live[key] = execution
        # The task starts now and pushes the workspace while execRequested commits; it runs
        # the program only once the request is in the log (``accepted``: its event id, or ""
        # when the request could not be written).
        accepted = execution.accepted
        tg.create_task(
            self._supervise(execution, accepted), name=f"agora-exec:{workspace}:{exec_id}"
        )
        try:
            if module_bytes is not None:
                logged_module = ExecModuleRef(blob=await self.store.blobs.put(module_bytes))
            draft = ExecRequested(
                id=str(uuid.uuid4()),
                payload=ExecRequestedPayload(
                    exec_id=exec_id,
                    backend=instance.id,
                    language=spec.language.value,
                    source=spec.source if isinstance(spec.payload, Source) else None,
                    module=logged_module,
                    argv=list(spec.argv),
                    stdin=spec.stdin,
                    input=spec.input if spec.has_input else None,
                    env_keys=sorted(spec.env),  # values may be secrets: never logged
                    cwd=spec.cwd,
                    timeout_ms=spec.timeout_ms,
                    encoding=encoding,
                    policy=msgspec.to_builtins(spec.policy),
                ),
            )
            written = await self.workspaces.publish(
                workspace, [draft], producer=capability.agent, trusted=True
            )
        except BaseException:
            self._live.pop(key, None)
            accepted.set_result("")
            raise
        accepted.set_result(written.events[0].id)
        return exec_id

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
            value_from_stdout = self.registry.get(rec.backend).value_from_stdout
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
        if rec is None or key in self._disposing:
            raise NotFound(f"no execution {exec_id!r} in {workspace!r}", execId=exec_id)
        if key in self._live or rec.finished_seq is None:
            raise Busy(f"execution {exec_id!r} is running; kill it first", execId=exec_id)
        self._disposing.add(key)
        try:
            await self.workspaces.publish(
                workspace,
                [ExecDisposed(payload=ExecDisposedPayload(exec_id=exec_id))],
                producer=capability.agent,
                trusted=True,
            )
        finally:
            self._disposing.discard(key)

    # -- building the request ---------------------------------------------------------------------

    def _request(
        self,
        instance: BackendInstance,
        request: ExecSpec,
        exec_id: str,
        capability: Capability,
    ) -> tuple[ExecutionRequest, ExecModuleRef | None, bytes | None]:
        """The backend request for ``request`` on ``instance``, the module reference to log,
        and inline module bytes to store. Raises ``BadRequest``, ``Rejected``."""
        source = request.source
        module = getattr(request, "module", None)
        if source is not None and module is not None:
            raise BadRequest("exec takes source or module, not both", field="module")
        raw_language = request.language
        if raw_language is None:
            language = ExecutionLanguage.WASM if module is not None else instance.default_language
        else:
            try:
                language = ExecutionLanguage(raw_language)
            except ValueError:
                raise BadRequest(
                    f"unknown language {raw_language!r} "
                    f"(use one of {', '.join(sorted(lang.value for lang in ExecutionLanguage))})",
                    field="language",
                ) from None
        payload: Source | GuestModule | ModuleBlob
        logged: ExecModuleRef | None = None
        module_bytes: bytes | None = None
        if isinstance(module, bytes | bytearray):
            module_bytes = bytes(module)
            payload = GuestModule(module_bytes)
        elif module is not None:
            sha = validate_sha256(getattr(module, "blob", ""), "module.blob")
            payload = ModuleBlob(sha)
            logged = ExecModuleRef(blob=sha)
        else:
            payload = Source(source or "")
        value = getattr(request, "input", msgspec.UNSET)
        if value is None:
            value = msgspec.UNSET
        if value is not msgspec.UNSET and not instance.callable:
            raise BadRequest(
                f"backend {instance.id!r} is not callable: input is only for backends that "
                "run callable languages",
                field="input",
                backend=instance.id,
            )
        patch = getattr(request, "policy", None)
        policy: SandboxPolicy = narrow(
            instance.backend.default_policy, patch if isinstance(patch, PolicyPatch) else None
        )
        try:
            return (
                ExecutionRequest(
                    exec_id=exec_id,
                    language=language,
                    payload=payload,
                    argv=tuple(request.argv or ()),
                    stdin=getattr(request, "stdin", None),
                    input=value,
                    env=dict(getattr(request, "env", None) or {}),
                    cwd=getattr(request, "cwd", None),
                    timeout_ms=request.timeout_ms,
                    policy=policy,
                    identity=capability.agent,
                ),
                logged,
                module_bytes,
            )
        except (TypeError, ValueError, msgspec.ValidationError) as e:
            raise BadRequest(f"invalid exec request: {e}") from e

    # -- one execution ----------------------------------------------------------------------------

    async def _publish(self, execution: _Execution, drafts: list[Event]) -> None:
        await self.workspaces.publish(
            execution.workspace, drafts, producer=execution.agent, trusted=True
        )

    async def _supervise(self, execution: _Execution, accepted: asyncio.Future[str]) -> None:
        """The task of one execution: push, run, pull, record. Once the request is accepted
        it always ends with the execution recorded as finished (unless the log itself
        fails)."""
        mirror: Mirror | None = None
        try:
            instance = execution.instance
            mounts: tuple[Mount, ...] = ()
            if instance.syncs_files:
                mounts = mounts_for(instance.access, execution.request.policy.filesystem)
            failed: PushFailed | None = None
            if mounts:
                try:
                    files = await self.workspaces.files(execution.workspace)
                    mirror = await push(files, self.store.blobs, self.settings.sync)
                except PushFailed as e:
                    failed = e
                except Exception as e:  # e.g. the store failed while reading the state
                    failed = PushFailed(f"reading the workspace failed: {e!r}")
            execution.request_event_id = await accepted
            if not execution.request_event_id:
                return  # the request was not written: nothing ran, nothing to record
            if failed is not None:
                await self._record(
                    execution,
                    _finished(
                        execution.exec_id,
                        "failed",
                        "error",
                        message=f"the workspace could not be pushed: {failed.message}",
                        code="pushFailed",
                    ),
                )
                return
            pushed = len(mirror.pushed) if mirror is not None else 0
            if execution.stop.is_set():
                await self._record(execution, self._stopped_early(execution, pushed))
                return
            access: LogAccess | None = None
            if instance.kind == "python":
                access = LogAccess(
                    self.workspaces,
                    execution.workspace,
                    producer=execution.agent,
                    causation_id=execution.request_event_id,
                )
            outcome, pending, next_n = await self._run(execution, mirror, access)
            if isinstance(outcome, ExecutionResult):
                finished = outcome.finished_payload(execution.exec_id, pushed=pushed)
                notes = self._notes(execution, outcome, finished)
                if notes is not None:
                    note, finished = notes
                    pending.append(
                        ExecOutput(
                            payload=ExecOutputPayload(execution.exec_id, "stderr", next_n, note)
                        )
                    )
            else:
                blame = "rejected" if isinstance(outcome, ClientError) else "error"
                message = outcome.message if isinstance(outcome, AgoraError) else repr(outcome)
                finished = _finished(
                    execution.exec_id,
                    "failed",
                    blame,
                    message=message,
                    code=getattr(outcome, "exec_code", outcome.code)
                    if isinstance(outcome, AgoraError)
                    else "internal",
                )
                finished = msgspec.structs.replace(finished, pushed=pushed)
            if access is not None:
                finished = msgspec.structs.replace(finished, pulled=access.writes)
            drafts: list[Event] = []
            if mirror is not None:
                drafts, skipped = await self._pull(execution, mirror, mounts)
                finished = msgspec.structs.replace(
                    finished, pulled=len(drafts), skipped=[*finished.skipped, *skipped]
                )
            await self._record(execution, finished, drafts, pending)
        except asyncio.CancelledError:
            raise
        except Exception as e:
            log.exception("execution %s in %s failed", execution.exec_id, execution.workspace)
            with contextlib.suppress(Exception):
                await self._record(
                    execution,
                    _finished(
                        execution.exec_id, "failed", "error", message=f"internal error: {e!r}"
                    ),
                )
        finally:
            if self._live.get(execution.key) is execution:
                del self._live[execution.key]
            execution.done.set()
            if mirror is not None:
                await asyncio.shield(remove_mirror(mirror))
        with contextlib.suppress(Exception):
            await self._prune(await self.journals.get(execution.workspace))

    def _stopped_early(self, execution: _Execution, pushed: int) -> ExecFinishedPayload:
        if execution.shutdown:
            return msgspec.structs.replace(
                _finished(
                    execution.exec_id,
                    "failed",
                    "interrupted",
                    message="the hub shut down before the execution started",
                ),
                pushed=pushed,
            )
        return ExecFinishedPayload(
            exec_id=execution.exec_id,
            status="cancelled",
            reason="killed",
            exit_code=CANCEL_EXIT_CODE,
            pushed=pushed,
            diagnostics=[{"level": "note", "code": "killed", "message": "Execution cancelled."}],
        )

    @staticmethod
    def _notes(
        execution: _Execution, result: ExecutionResult, finished: ExecFinishedPayload
    ) -> tuple[bytes, ExecFinishedPayload] | None:
        """The stderr note for a run stopped by ``kill`` or by shutdown, and the payload."""
        if result.status != "cancelled" or not execution.stop.is_set():
            return None
        if execution.shutdown:
            return SHUTDOWN_NOTE, msgspec.structs.replace(
                finished, status="failed", reason="interrupted"
            )
        return CANCELLED_NOTE, finished

    async def _run(
        self, execution: _Execution, mirror: Mirror | None, access: LogAccess | None
    ) -> tuple[ExecutionResult | BaseException, list[Event], int]:
        """Run the backend, journaling its output (coalesced). Returns the result (or what the
        backend raised), the events not written yet (``execStarted`` if it was not, the last
        output), to be appended with ``execFinished``, and the next output ``n``.

        ``execStarted`` is written with the first output, or once ``coalesce_interval`` has
        passed, or with ``execFinished`` — whichever comes first: a short run costs one commit
        after its request, not three.
        """
        backend = execution.instance.backend
        request = execution.request
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[OutputChunk | ExecutionResult | BaseException | None] = asyncio.Queue(
            self.settings.output_queue
        )
        coalescer = Coalescer(
            interval=self.settings.coalesce_interval, max_bytes=self.settings.coalesce_bytes
        )
        workdir = mirror.root if mirror is not None else None
        start_event: list[Event] = [
            ExecStarted(
                payload=ExecStartedPayload(
                    exec_id=execution.exec_id,
                    backend=execution.instance.id,
                    isolation=execution.instance.capabilities.isolation.value,
                    node=self.settings.node,
                )
            )
        ]

        async def read() -> None:
            try:
                if access is not None:
                    stream: Any = backend.execute(request, workdir, access=access)  # type: ignore[call-arg]
                else:
                    stream = backend.execute(request, workdir)
                async with contextlib.aclosing(stream) as events:
                    async for item in events:
                        await queue.put(item)
            except Exception as e:
                await queue.put(e)
                return
            await queue.put(None)

        async def stopper() -> None:
            await execution.stop.wait()
            # The backend may not have registered the run yet: try until it has stopped it.
            # A backend that has not stopped it after ``stop_grace_s`` is not waited for: the
            # run is closed from here (closing its stream kills the program, by contract).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.stop_grace_s):
                    stopped = await backend.cancel(execution.exec_id)
                    while not stopped:
                        await asyncio.sleep(0.01)
                        stopped = await backend.cancel(execution.exec_id)
                    return
            log.warning(
                "backend %s did not stop %s in %g s; closing its stream",
                execution.instance.id,
                execution.exec_id,
                self.settings.stop_grace_s,
            )
            await queue.put(_FORCED)

        async def write(flushes: list[Flush], *, start: bool = False) -> None:
            events = _outputs(execution.exec_id, flushes)
            if start_event and (events or start):
                events = [*start_event, *events]
                start_event.clear()
                execution.status = "running"
            if events:
                await self._publish(execution, events)

        outcome: ExecutionResult | BaseException
        started = loop.time()
        start_by = started + self.settings.coalesce_interval
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
                        outcome = _forced_result(execution, loop.time() - started)
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
        self, execution: _Execution, mirror: Mirror, mounts: tuple[Mount, ...]
    ) -> tuple[list[Event], list[SkippedWrite]]:
        """The file drafts for what the run changed in the mirror, and what is skipped."""
        limits = self.settings.sync
        found = await scan(mirror, limits)
        changes, skipped = plan(
            diff(mirror.sha256s(), found.files), mounts, max_changes=limits.max_changes
        )
        contents = await read_changes(mirror, changes)
        drafts = drafts_for(changes, contents, mirror.revs, execution.request_event_id)
        return drafts, [*found.problems, *skipped]

    async def _record(
        self,
        execution: _Execution,
        finished: ExecFinishedPayload,
        files: list[Event] | None = None,
        pending: list[Event] | None = None,
    ) -> None:
        """Append what the run left unwritten (``pending``: ``execStarted``, the last output),
        the file events and ``execFinished`` — one batch when they fit. File events go in
        batches of :data:`FILE_BATCH`; a batch refused by a conflict is retried file by file,
        the refused ones reported as skipped (``conflict``)."""
        files = list(files or [])
        head = list(pending or [])
        if len(files) > FILE_BATCH:
            if head:
                await self._publish(execution, head)
                head = []
            last = len(files) - (len(files) - 1) % FILE_BATCH - 1
            for start in range(0, last, FILE_BATCH):
                finished = await self._write_files(
                    execution, files[start : start + FILE_BATCH], finished
                )
            files = files[last:]
        final = ExecFinished(causation_id=execution.request_event_id or None, payload=finished)
        try:
            await self._publish(execution, [*head, *files, final])
        except ClientError:
            if not files:
                raise
            if head:
                await self._publish(execution, head)
            finished = await self._write_files(execution, files, finished)
            final = ExecFinished(causation_id=execution.request_event_id or None, payload=finished)
            await self._publish(execution, [final])
        execution.status = finished.status

    async def _write_files(
        self, execution: _Execution, drafts: list[Event], finished: ExecFinishedPayload
    ) -> ExecFinishedPayload:
        try:
            await self._publish(execution, drafts)
            return finished
        except ClientError:
            pass
        skipped = list(finished.skipped)
        refused = 0
        for draft in drafts:
            try:
                await self._publish(execution, [draft])
            except ClientError as e:
                refused += 1
                path = getattr(getattr(draft, "payload", None), "path", "?")
                op: Literal["write", "delete"] = (
                    "delete" if draft.kind == "fileDeleted" else "write"
                )
                skipped.append(SkippedWrite(path=path, mount_root=".", op=op, reason="conflict"))
                log.info("pull of %s refused for %s: %s", path, execution.exec_id, e.message)
        return msgspec.structs.replace(finished, pulled=finished.pulled - refused, skipped=skipped)

    # -- retention --------------------------------------------------------------------------------

    async def _prune(self, journal: WorkspaceJournal) -> int:
        """Dispose the finished executions of ``journal`` that retention lets go."""
        candidates = [
            Finished(rec.exec_id, rec.finished_seq, journal.finished_at.get(rec.exec_id, 0))
            for rec in journal.journal.executions.values()
            if rec.finished_seq is not None
            and not rec.disposed
            and (journal.workspace, rec.exec_id) not in self._disposing
        ]
        if len(candidates) <= self.settings.retention_keep:
            return 0
        ids = prunable(
            candidates,
            int(time.time() * 1000),
            keep=self.settings.retention_keep,
            window_ms=self.settings.retention_window_ms,
        )
        if not ids:
            return 0
        keys = {(journal.workspace, e) for e in ids}
        self._disposing |= keys
        try:
            await self.workspaces.publish(
                journal.workspace,
                [
                    ExecDisposed(payload=ExecDisposedPayload(exec_id=e, reason="retention"))
                    for e in ids
                ],
                producer=HUB_PRODUCER,
                trusted=True,
            )
        finally:
            self._disposing -= keys
        return len(ids)

    async def _sweeper(self, stop: asyncio.Event) -> None:
        """Apply retention to every loaded journal now and then (age alone can make an
        execution prunable)."""
        while not stop.is_set():
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.settings.retention_sweep_s):
                    await stop.wait()
            if stop.is_set():
                return
            for journal in self.journals.loaded:
                try:
                    await self._prune(journal)
                except Exception:
                    log.exception("retention failed in %s", journal.workspace)
