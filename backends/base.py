"""The :class:`CodeExecutor` protocol every execution backend implements, and the public API.

This module is the one import the runtime needs::

    from backends.base import CodeExecutor, ExecutionRequest, narrow, collect, ...

Lifecycle of a backend instance (an async context manager, like every resource in Agora)::

    async with ProcessBackend() as backend:          # start(): probes, sweeps, warms up
        ok, why = backend.available()
        policy = narrow(backend.default_policy, wire_policy)   # may raise Rejected
        request = ExecutionRequest(exec_id=..., payload=Source("echo hi"), policy=policy)
        async with closing_stream(backend.execute(request, workdir)) as events:
            async for event in events:                # OutputChunk ..., then ExecutionResult
                ...
        await backend.cancel(exec_id)                 # from any other task
                                                      # aclose(): stops runs, removes leftovers

Contract of :meth:`CodeExecutor.execute` (checked by ``tests/backends/test_conformance.py``):

* :meth:`CodeExecutor.admit` runs the same checks ahead of ``execute`` and holds a slot of the
  concurrency cap (the runtime calls it before writing ``execRequested``, so a request the
  backend would refuse is refused with nothing written).
* It validates first (:func:`hub.core.execution.validate.validate_request`) and raises before
  running
  anything: :class:`~hub.core.execution.errors.UnsupportedLanguage`, ``InvalidRequest``,
  ``UnsupportedPolicy``, ``Rejected``; ``hub.core.errors.Busy`` for a running id or a full backend;
  :class:`~hub.core.execution.errors.BackendUnavailable` when the backend cannot run now. Failures
  of the
  machinery mid-run raise ``ExecutionFailed``/``SandboxError``.
* Otherwise it yields :class:`~hub.core.execution.result.OutputChunk` s (each stream's bytes in
  order,
  at most the stream's cap) and ends with exactly one
  :class:`~hub.core.execution.result.ExecutionResult`. Everything the program does — exit codes,
  timeouts, kills, memory exhaustion — is a result, never an exception.
* By the time the result is yielded the program and everything it started are gone (process
  group killed, container removed).
* Closing the generator early or cancelling the consuming task kills the program; the cleanup
  is shielded, so it completes even then. Consume it from one task, and close it
  (:func:`closing_stream`) when stopping early.
* ``workdir`` is the directory the runtime prepared (workspace files pushed in); the program
  runs in it (``process``) or sees it mounted at ``/workspace`` read-only or read-write per the
  policy (``container``). ``None`` means no workspace: the backend uses a private scratch
  directory. Changes are pulled back by the runtime after the result. The runtime prepares a
  ``workdir`` only for a backend whose capabilities declare ``workspace="files"``.
* ``access`` is the workspace as host functions (:class:`backends.access.WorkspaceAccess`),
  given by the runtime to every backend that declares ``workspace="hostFunctions"`` (and
  ``None`` to the others, which ignore it).

:meth:`CodeExecutor.cancel` stops a running execution (its result is
``cancelled/killed``, exit 130, output so far kept) and returns once the program is gone;
``False`` if no such execution is running.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Protocol, runtime_checkable

from backends.access import WorkspaceAccess
from backends.runs import Admission
from hub.core.execution.capabilities import (
    BackendCapabilities,
    ExecutionIsolation,
    ExecutionLanguage,
    WorkspaceMode,
)
from hub.core.execution.errors import (
    BackendUnavailable,
    CompileFailed,
    DependencyNotFound,
    ExecutionError,
    ExecutionFailed,
    ExecutionInternal,
    ExecutionTimeout,
    InvalidCode,
    InvalidRequest,
    Rejected,
    SandboxError,
    UnsupportedLanguage,
    UnsupportedPolicy,
)
from hub.core.execution.policy import (
    EnvironmentPolicy,
    FilesystemPolicy,
    NetworkPolicy,
    PolicyPatch,
    SandboxPolicy,
    host_local,
    narrow,
    strict,
    strict_js,
    strict_python,
)
from hub.core.execution.request import (
    UNSET,
    ExecutionPayload,
    ExecutionRequest,
    GuestModule,
    ModuleBlob,
    Source,
)
from hub.core.execution.result import (
    Diagnostic,
    ExecutionEvent,
    ExecutionMetadata,
    ExecutionResult,
    OutputChunk,
    classify,
)
from hub.core.execution.validate import validate_policy, validate_request

__all__ = [
    "UNSET",
    "Admission",
    "BackendCapabilities",
    "BackendUnavailable",
    "CodeExecutor",
    "CompileFailed",
    "DependencyNotFound",
    "Diagnostic",
    "EnvironmentPolicy",
    "ExecutionError",
    "ExecutionEvent",
    "ExecutionFailed",
    "ExecutionInternal",
    "ExecutionIsolation",
    "ExecutionLanguage",
    "ExecutionMetadata",
    "ExecutionPayload",
    "ExecutionRequest",
    "ExecutionResult",
    "ExecutionTimeout",
    "FilesystemPolicy",
    "GuestModule",
    "InvalidCode",
    "InvalidRequest",
    "ModuleBlob",
    "NetworkPolicy",
    "OutputChunk",
    "PolicyPatch",
    "Rejected",
    "SandboxError",
    "SandboxPolicy",
    "Source",
    "UnsupportedLanguage",
    "UnsupportedPolicy",
    "WorkspaceAccess",
    "WorkspaceMode",
    "classify",
    "closing_stream",
    "collect",
    "host_local",
    "narrow",
    "strict",
    "strict_js",
    "strict_python",
    "validate_policy",
    "validate_request",
]


@runtime_checkable
class CodeExecutor(Protocol):
    """An execution backend (see the module docstring for the full contract)."""

    @property
    def name(self) -> str:
        """The instance id the runtime routes by (e.g. ``"process"``, ``"container-ro"``)."""
        ...

    @property
    def capabilities(self) -> BackendCapabilities:
        """What this instance enforces (final once :meth:`start` has run)."""
        ...

    @property
    def default_policy(self) -> SandboxPolicy:
        """The instance's defaults: the widest policy it runs; requests may only narrow it."""
        ...

    def available(self) -> tuple[bool, str]:
        """``(True, "")`` if it can run now, else ``(False, reason)``. Never blocks: it reports
        the state found by the last :meth:`start`."""
        ...

    async def start(self) -> None:
        """Probe the host/engine and get ready (idempotent; ``execute`` calls it if needed)."""
        ...

    async def probe(self) -> tuple[bool, str]:
        """Whether it could run here, found without side effects on a hub that may be running
        (``agora backends``): a container backend checks the engine and the image but sweeps
        and starts nothing."""
        ...

    async def admit(self, request: ExecutionRequest) -> Admission:
        """Check ``request`` as ``execute`` would (availability, validation, the backend's own
        checks of the code) and hold a slot of the concurrency cap for it, before anything is
        written: raises what ``execute`` raises before running. ``execute`` of the same id takes
        the slot; :meth:`Admission.release <backends.runs.Admission.release>` gives it back."""
        ...

    def execute(
        self,
        request: ExecutionRequest,
        workdir: Path | None,
        access: WorkspaceAccess | None = None,
    ) -> AsyncIterator[ExecutionEvent]:
        """Run ``request``: yields output chunks, then one :class:`ExecutionResult`."""
        ...

    async def cancel(self, exec_id: str) -> bool:
        """Stop a running execution and wait until it is gone. False if none is running."""
        ...

    async def aclose(self) -> None:
        """Stop every running execution, release everything. Idempotent."""
        ...

    def abandon(self) -> None:
        """Stop waiting for whatever this backend's calls are blocked on, and fail its later
        calls at once (:class:`BackendUnavailable`): the hub's stop has given up on it
        (``close_grace_s``: an engine that stopped answering). What it leaves behind is for
        the next start's sweep. Idempotent; never blocks."""
        ...


@contextlib.asynccontextmanager
async def closing_stream(
    events: AsyncIterator[ExecutionEvent],
) -> AsyncIterator[AsyncIterator[ExecutionEvent]]:
    """``async with closing_stream(backend.execute(...)) as events:`` — iterate, and have the
    stream closed when the block ends (early exit included), which stops the program.

    ``contextlib.aclosing`` for the protocol's ``AsyncIterator`` return type (every backend
    returns an async generator, which has ``aclose``)."""
    try:
        yield events
    finally:
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()


async def collect(events: AsyncIterator[ExecutionEvent]) -> ExecutionResult:
    """Drain an ``execute`` stream and return its result (chunks are already in it).

    Closes the stream in any case. Raises what ``execute`` raises, or
    :class:`ExecutionInternal` if the stream ended without a result.
    """
    result: ExecutionResult | None = None
    async with closing_stream(events) as stream:
        async for event in stream:
            if isinstance(event, ExecutionResult):
                result = event
    if result is None:
        raise ExecutionInternal("the backend's stream ended without a result")
    return result
