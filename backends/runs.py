"""Bookkeeping every backend shares: running executions, stop requests, shielded cleanup.

* :class:`Run` is one execution's control block: a stop request (``cancel`` or the timeout)
  is recorded once, whichever comes first, so concurrent kills share one finalisation.
* :class:`RunRegistry` admits executions (unique running ids → ``busy``; a concurrency cap →
  ``busy``; a closed backend → ``unavailable``), holds slots for requests the runtime admitted
  before writing them (:meth:`RunRegistry.reserve`, an :class:`Admission`: the cap counts them, so
  a request refused for the cap is refused before anything is logged), cancels runs, and ends
  them: :meth:`close_run`
  runs a run's cleanup as a task the registry owns, so a cancelled ``execute`` still kills and
  removes what it started and ``aclose`` waits for every cleanup.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Coroutine, Iterator
from typing import Any, Literal, TypeVar

from hub.core.errors import Busy
from hub.core.execution.errors import BackendUnavailable
from hub.core.execution.result import Diagnostic

__all__ = [
    "Admission",
    "Run",
    "RunRegistry",
    "StopReason",
    "TaskSet",
    "timeout_note",
    "wait_quietly",
]

StopReason = Literal["cancelled", "timeout"]
T = TypeVar("T")

log = logging.getLogger(__name__)


class Run:
    """The control block of one running execution."""

    __slots__ = ("_stop", "exec_id", "exited", "on_stop", "stop_reason")

    def __init__(self, exec_id: str) -> None:
        self.exec_id = exec_id
        self.stop_reason: StopReason | None = None
        self._stop = asyncio.Event()
        self.exited = asyncio.Event()
        """Set by the backend once the program (and everything it started) is gone."""
        self.on_stop: Callable[[StopReason], object] | None = None
        """Called once with the reason when a stop is requested (an alternative to a task
        waiting in :meth:`wait_stop`)."""

    def request_stop(self, reason: StopReason) -> bool:
        """Record a stop request; the first one wins. False if the program already exited or a
        stop was already requested."""
        if self.exited.is_set() or self.stop_reason is not None:
            return False
        self.stop_reason = reason
        self._stop.set()
        if self.on_stop is not None:
            self.on_stop(reason)
        return True

    async def wait_stop(self, timeout_s: float) -> StopReason | None:
        """Wait for a stop request or, after ``timeout_s``, request the timeout stop. Returns
        the reason, or ``None`` if the program exited first (then nothing is to be stopped)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await self._stop.wait()
        if self.stop_reason is None:
            self.request_stop("timeout")
        return self.stop_reason

    @property
    def cancelled(self) -> bool:
        return self.stop_reason == "cancelled"

    @property
    def timed_out(self) -> bool:
        return self.stop_reason == "timeout"

    def stop_notes(self, timeout_ms: int, how: str) -> list[Diagnostic]:
        """Diagnostics for a stopped run (``how``: what was done, e.g. "the container was
        killed")."""
        if self.timed_out:
            return [timeout_note(timeout_ms, how)]
        if self.cancelled:
            return [Diagnostic(code="killed", message="Execution cancelled.")]
        return []


def timeout_note(timeout_ms: int, how: str) -> Diagnostic:
    """The diagnostic of a run that ran out of its ``timeout_ms`` (``how``: what was done)."""
    return Diagnostic(
        level="error", code="timeout", message=f"timed out after {timeout_ms} ms; {how}"
    )


async def wait_quietly(awaitable: Awaitable[Any]) -> None:
    """Wait for ``awaitable`` to settle, whatever it returns or raises (its outcome is read
    elsewhere, or does not matter any more)."""
    with contextlib.suppress(BaseException):
        await awaitable


class TaskSet:
    """The helper tasks of one execution (pipe readers, reaper, stopper), owned by its
    ``execute`` generator.

    A TaskGroup cannot span a ``yield`` of an async generator (closing the generator throws
    ``GeneratorExit`` into the group, which 3.11 wraps into an exception group), so the
    generator owns its tasks through this set and always ends them in ``finally`` with
    :meth:`aclose`: cancel what still runs, wait for all of them.
    """

    def __init__(self) -> None:
        self._tasks: list[asyncio.Task[Any]] = []

    def create_task(self, coro: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        task = asyncio.create_task(coro)
        self._tasks.append(task)
        return task

    def failure(self) -> BaseException | None:
        """The first exception a finished task raised (cancellations aside), if any."""
        for task in self._tasks:
            if task.done() and not task.cancelled() and task.exception() is not None:
                return task.exception()
        return None

    async def aclose(self) -> None:
        """Cancel the tasks still running and wait for all of them. Idempotent. What they
        raised is read here (the run's outcome came from :meth:`failure` and its waiter): a
        stopper whose kill the hub's stop abandoned is not an unretrieved error."""
        pending = [task for task in self._tasks if not task.done()]
        for task in pending:
            task.cancel()
        if pending:
            await asyncio.wait(pending)
        for task in self._tasks:
            if not task.cancelled() and (error := task.exception()) is not None:
                log.debug("a helper task of a run ended with %r", error)


class Admission:
    """A slot of a backend's concurrency cap held for one admitted request
    (:meth:`CodeExecutor.admit <backends.base.CodeExecutor.admit>`) until its ``execute``
    takes it, or :meth:`release` gives it back (the request was never run). Idempotent."""

    __slots__ = ("_registry", "exec_id")

    def __init__(self, registry: RunRegistry | None, exec_id: str) -> None:
        self._registry = registry
        self.exec_id = exec_id

    def release(self) -> None:
        """Give the slot back if ``execute`` has not taken it (a no-op after that)."""
        registry, self._registry = self._registry, None
        if registry is not None:
            registry.unreserve(self)

    @property
    def held(self) -> bool:
        return self._registry is not None


class RunRegistry:
    """The running executions of one backend instance and their cleanup tasks."""

    def __init__(self, backend: str, max_concurrent: int) -> None:
        self.backend = backend
        self.max_concurrent = max_concurrent
        self.closed = False
        self._runs: dict[str, Run] = {}
        self._reserved: dict[str, Admission] = {}
        self._cleanups: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._runs)

    def __iter__(self) -> Iterator[Run]:
        return iter(list(self._runs.values()))

    def _check_room(self, exec_id: str) -> None:
        if self.closed:
            raise BackendUnavailable(f"backend {self.backend!r} is closed", backend=self.backend)
        if exec_id in self._runs or exec_id in self._reserved:
            raise Busy(f"execution {exec_id!r} is already running", execId=exec_id)
        if len(self._runs) + len(self._reserved) >= self.max_concurrent:
            raise Busy(
                f"backend {self.backend!r} is running its maximum of "
                f"{self.max_concurrent} executions",
                backend=self.backend,
                limit=self.max_concurrent,
            )

    def reserve(self, exec_id: str) -> Admission:
        """Hold a slot for ``exec_id`` (its ``execute`` takes it). Raises what :meth:`admit`
        raises."""
        self._check_room(exec_id)
        admission = Admission(self, exec_id)
        self._reserved[exec_id] = admission
        return admission

    def unreserve(self, admission: Admission) -> None:
        if self._reserved.get(admission.exec_id) is admission:
            del self._reserved[admission.exec_id]

    def admit(self, exec_id: str) -> Run:
        """Register a new run, in the slot reserved for ``exec_id`` if there is one. Raises
        :class:`BackendUnavailable` when closed, :class:`Busy` when ``exec_id`` is running or
        the concurrency cap is reached."""
        admission = self._reserved.pop(exec_id, None)
        if admission is not None:
            admission._registry = None  # taken: a later release is a no-op
            if self.closed:
                raise BackendUnavailable(
                    f"backend {self.backend!r} is closed", backend=self.backend
                )
        else:
            self._check_room(exec_id)
        run = Run(exec_id)
        self._runs[exec_id] = run
        return run

    def get(self, exec_id: str) -> Run | None:
        return self._runs.get(exec_id)

    def release(self, run: Run) -> None:
        """Let ``run``'s id go (a new run may take it)."""
        if self._runs.get(run.exec_id) is run:
            del self._runs[run.exec_id]

    async def cancel(self, exec_id: str) -> bool:
        """Stop the running execution ``exec_id`` and wait until it is gone
        (:meth:`CodeExecutor.cancel <backends.base.CodeExecutor.cancel>`). False if none is
        running or it is being stopped already."""
        run = self._runs.get(exec_id)
        if run is None or not run.request_stop("cancelled"):
            return False
        await run.exited.wait()
        return True

    def end(self, run: Run) -> None:
        """``run``'s program and everything it started are gone: say so, and let its id go."""
        run.exited.set()
        self.release(run)

    async def close_run(self, run: Run, cleanup: Awaitable[None] | None = None) -> None:
        """The end of every run: await ``cleanup`` (what removes what the run still holds),
        then :meth:`end` the run — also when the cleanup fails.

        The cleanup is shielded (:meth:`shielded`): it completes even if the caller is cancelled
        meanwhile. Without one, the run ends at once. Raises what the cleanup raises.
        """
        if cleanup is None:
            self.end(run)
            return

        async def ending() -> None:
            try:
                await cleanup
            finally:
                self.end(run)

        await self.shielded(ending())

    async def shielded(self, cleanup: Coroutine[Any, Any, None]) -> None:
        """Run ``cleanup`` to the end even if the caller is cancelled meanwhile.

        The cleanup runs as a task this registry owns; a cancelled caller gets its
        ``CancelledError`` at once while the task goes on, and :meth:`aclose` waits for it.
        """
        task = asyncio.create_task(cleanup)
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)
        await asyncio.shield(task)

    def spawn(self, job: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        """Start a background job owned by this registry (awaited by :meth:`aclose`)."""
        task = asyncio.create_task(job)
        self._cleanups.add(task)
        task.add_done_callback(self._cleanups.discard)
        return task

    async def aclose(self) -> None:
        """Refuse new runs, stop the running ones, and wait for them and every cleanup.
        Idempotent."""
        self.closed = True
        runs = list(self._runs.values())
        for run in runs:
            run.request_stop("cancelled")
        for run in runs:
            await run.exited.wait()
        while self._cleanups:
            await asyncio.gather(*list(self._cleanups), return_exceptions=True)
