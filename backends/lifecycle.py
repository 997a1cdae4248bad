"""The parts of :class:`~backends.base.CodeExecutor` every backend implements the same way.

:class:`BackendLifecycle` is the base of the backends: it holds the instance's name,
capabilities, default policy and :class:`~backends.runs.RunRegistry`, and implements from them

* the protocol's properties, :meth:`~BackendLifecycle.available` (a closed backend is
  unavailable; otherwise the backend's own :meth:`~BackendLifecycle._readiness`), ``async with``
  (:meth:`start` … :meth:`aclose`) and :meth:`~BackendLifecycle.cancel`;
* the admission every ``execute`` begins with (:meth:`~BackendLifecycle._check_request`:
  start, availability, :func:`~hub.core.execution.validate.validate_request`), before the backend's
  own checks (:meth:`~BackendLifecycle._validate`) and
  :meth:`RunRegistry.admit <backends.runs.RunRegistry.admit>`;
* :meth:`~BackendLifecycle.admit`, the same checks run *before* the runtime writes
  ``execRequested``, holding a slot of the concurrency cap: what the backend would refuse is
  refused before anything is logged;
* the result's :class:`~hub.core.execution.result.ExecutionMetadata`;
* :meth:`~BackendLifecycle.start`, run once: ``execute`` starts its backend, so a run that
  reaches a hub still starting its backends starts it a second time; that caller waits for the
  start under way instead of probing again (a second probe took a second hold on the staged
  ``/etc`` and, coming halfway through the first, ran bwrap with no host view).

What is left to each backend: :meth:`_start`, :meth:`aclose` and ``execute`` (see
:mod:`backends.base` for the contract; :func:`backends.captured.captured_result` builds the
result and :meth:`RunRegistry.close_run <backends.runs.RunRegistry.close_run>` ends the run).
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import time
from collections.abc import Iterable
from typing import Self

from backends.runs import Admission, RunRegistry
from hub.core.events import ArtifactRef
from hub.core.execution.capabilities import BackendCapabilities
from hub.core.execution.errors import BackendUnavailable
from hub.core.execution.policy import SandboxPolicy
from hub.core.execution.request import ExecutionRequest
from hub.core.execution.result import ExecutionMetadata
from hub.core.execution.validate import validate_request

__all__ = ["BackendLifecycle", "elapsed_ms"]


def elapsed_ms(started: float) -> int:
    """Milliseconds since ``started`` (a :func:`time.monotonic` reading)."""
    return int((time.monotonic() - started) * 1000)


class BackendLifecycle(abc.ABC):
    """The shared half of a backend (see the module docstring). Subclasses set ``_name``,
    ``_caps``, ``_policy`` and ``_registry`` in ``__init__`` (or override the properties)."""

    _name: str
    _caps: BackendCapabilities
    _policy: SandboxPolicy
    _registry: RunRegistry
    # Set by start() (class defaults: a subclass's __init__ need not call one here).
    _started: bool = False
    _start_lock: asyncio.Lock | None = None

    @property
    def name(self) -> str:
        """The instance id the runtime routes by."""
        return self._name

    @property
    def capabilities(self) -> BackendCapabilities:
        return self._caps

    @property
    def default_policy(self) -> SandboxPolicy:
        return self._policy

    def available(self) -> tuple[bool, str]:
        """``(True, "")`` if it can run now, else ``(False, reason)``. Never blocks."""
        if self._registry.closed:
            return False, "the backend is closed"
        return self._readiness()

    def _readiness(self) -> tuple[bool, str]:
        """What :meth:`available` says of an open backend (state found by :meth:`start`)."""
        return True, ""

    async def start(self) -> None:
        """Get ready to run: :meth:`_start`, once (idempotent; ``execute`` calls it). A caller
        that comes while a start is under way waits for it; a start that raised or was
        cancelled is run again by the next caller."""
        if self._started:
            return
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if not self._started:
                await self._start()
                self._started = True

    @abc.abstractmethod
    async def _start(self) -> None:
        """The backend's own start (probe the host, start its pools), run by :meth:`start`
        until one has returned. A failure the backend reports through :meth:`available`
        returns; raising lets the next :meth:`start` try again."""

    @abc.abstractmethod
    async def aclose(self) -> None:
        """Stop every running execution, release everything. Idempotent."""

    async def probe(self) -> tuple[bool, str]:
        """Whether it could run here: start it (idempotent, no effect beyond this process) and
        report :meth:`available`. Backends whose start touches shared state override it."""
        with contextlib.suppress(Exception):
            await self.start()
        return self.available()

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def cancel(self, exec_id: str) -> bool:
        """Stop a running execution and wait until it is gone. False if none is running."""
        return await self._registry.cancel(exec_id)

    def abandon(self) -> None:
        """Nothing to give up by default: a backend whose waits always end (on programs it
        kills itself) needs none; one that waits on a service overrides it (container)."""
        return None

    async def _check_request(self, request: ExecutionRequest) -> None:
        """What every ``execute`` does first: start, check availability, validate ``request``
        against the capabilities. Raises :class:`BackendUnavailable` and what
        :func:`validate_request` raises."""
        await self.start()
        ok, why = self.available()
        if not ok:
            raise BackendUnavailable(
                f"backend {self.name!r} is unavailable: {why}", backend=self.name
            )
        validate_request(request, self.capabilities)

    async def _validate(self, request: ExecutionRequest) -> None:
        """The backend's own checks of a valid request (its command, script, source or module),
        shared by :meth:`admit` and ``execute``. Raises ``InvalidRequest``, ``InvalidCode``,
        ``CompileFailed`` …; the default checks nothing more."""
        return None

    async def admit(self, request: ExecutionRequest) -> Admission:
        """Everything ``execute`` would refuse ``request`` for, checked now, and a slot of the
        concurrency cap held for it (its ``execute`` takes the slot; release the admission if
        it never runs). Raises what ``execute`` raises before running anything."""
        await self._check_request(request)
        await self._validate(request)
        return self._registry.reserve(request.exec_id)

    def _metadata(
        self,
        request: ExecutionRequest,
        *,
        warm: bool = False,
        image: str | None = None,
        artifacts: Iterable[ArtifactRef] = (),
    ) -> ExecutionMetadata:
        """The metadata of ``request``'s result: this instance, the language, the isolation."""
        return ExecutionMetadata(
            backend=self.name,
            language=request.language,
            isolation=self.capabilities.isolation,
            identity=request.identity,
            artifacts=list(artifacts),
            image=image,
            warm=warm,
        )
