"""What every backend shares (backends/lifecycle.py, backends/runs.py): availability, async
with, admission, cancel, and the end of a run (shielded cleanup), on a backend that runs
nothing."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator
from pathlib import Path

import pytest

from backends.base import (
    BackendCapabilities,
    BackendUnavailable,
    CodeExecutor,
    ExecutionEvent,
    ExecutionIsolation,
    ExecutionLanguage,
    ExecutionRequest,
    ExecutionResult,
    Source,
    UnsupportedLanguage,
    collect,
    host_local,
)
from backends.lifecycle import BackendLifecycle
from backends.runs import RunRegistry
from tests.backends.helpers import new_request


class Idle(BackendLifecycle):
    """A backend with the shared half and an ``execute`` that runs nothing."""

    def __init__(self) -> None:
        self._name = "idle"
        self._caps = BackendCapabilities(
            isolation=ExecutionIsolation.HOST_LOCAL,
            enforces_network=True,
            enforces_environment=True,
            enforces_timeout=True,
            languages=frozenset({ExecutionLanguage.COMMAND}),
        )
        self._policy = host_local()
        self._registry = RunRegistry("idle", 2)
        self.readiness = (True, "")
        self.starts = 0
        self.gate: asyncio.Event | None = None  # set: _start waits for it
        self.fail: Exception | None = None  # set: _start raises it (once)

    def _readiness(self) -> tuple[bool, str]:
        return self.readiness

    async def _start(self) -> None:
        self.starts += 1
        if self.gate is not None:
            await self.gate.wait()
        failure, self.fail = self.fail, None
        if failure is not None:
            raise failure

    async def aclose(self) -> None:
        await self._registry.aclose()

    async def execute(
        self, request: ExecutionRequest, workdir: Path | None
    ) -> AsyncGenerator[ExecutionEvent, None]:
        """Admits the request, ends the run at once: ``completed`` with the shared metadata."""
        await self._check_request(request)
        run = self._registry.admit(request.exec_id)
        await self._registry.close_run(run)
        yield ExecutionResult(status="completed", reason="exit", metadata=self._metadata(request))


def _request(backend: Idle, **kw: object) -> ExecutionRequest:
    return new_request(backend, payload=Source("true"), **kw)


async def test_async_with_starts_and_closes() -> None:
    async with Idle() as backend:
        assert isinstance(backend, CodeExecutor)
        assert backend.starts == 1 and backend.available() == (True, "")
        assert backend.name == "idle" and backend.default_policy == host_local()
    assert backend.available() == (False, "the backend is closed")


async def test_admission_checks_availability_then_the_request() -> None:
    backend = Idle()
    backend.readiness = (False, "no engine")
    with pytest.raises(BackendUnavailable) as excinfo:
        await backend._check_request(_request(backend))
    assert excinfo.value.details["backend"] == "idle"
    assert "no engine" in excinfo.value.message
    backend.readiness = (True, "")
    with pytest.raises(UnsupportedLanguage):
        await backend._check_request(_request(backend, language=ExecutionLanguage.PYTHON))
    result = await collect(backend.execute(_request(backend, identity="agent-1"), None))
    assert backend.starts == 1 and len(backend._registry) == 0  # started once, by the first
    assert result.metadata is not None
    assert (result.metadata.backend, result.metadata.isolation) == ("idle", "hostLocal")
    assert (result.metadata.language, result.metadata.identity) == ("command", "agent-1")


async def test_starts_that_come_while_one_is_under_way_wait_for_it() -> None:
    """``execute`` starts its backend, so a run reaching a hub that is still starting its
    backends starts one a second time: it waits for the start under way, and ``_start`` runs
    once."""
    backend = Idle()
    backend.gate = asyncio.Event()
    starts = [asyncio.ensure_future(backend.start()) for _ in range(5)]
    await asyncio.sleep(0.01)
    assert backend.starts == 1 and not any(s.done() for s in starts)  # all wait for the first
    backend.gate.set()
    await asyncio.gather(*starts)
    await backend.start()
    assert backend.starts == 1


async def test_a_start_that_raised_or_was_cancelled_is_run_again() -> None:
    backend = Idle()
    backend.fail = OSError("no engine yet")
    with pytest.raises(OSError):
        await backend.start()
    await backend.start()
    assert backend.starts == 2
    cancelled = Idle()
    cancelled.gate = asyncio.Event()
    first = asyncio.ensure_future(cancelled.start())
    waiting = asyncio.ensure_future(cancelled.start())
    await asyncio.sleep(0.01)
    first.cancel()
    await asyncio.sleep(0.01)
    assert cancelled.starts == 2 and not waiting.done()  # the waiter starts it anew
    cancelled.gate.set()
    await waiting
    assert cancelled.starts == 2


async def test_cancel_waits_until_the_run_has_ended() -> None:
    backend = Idle()
    run = backend._registry.admit("x")
    cancelling = asyncio.create_task(backend.cancel("x"))
    await asyncio.sleep(0.01)
    assert run.cancelled and not cancelling.done()
    backend._registry.end(run)
    assert await cancelling is True
    assert await backend.cancel("x") is False and await backend.cancel("unknown") is False


async def test_close_run_cleans_up_even_when_the_caller_is_cancelled() -> None:
    registry = RunRegistry("idle", 2)
    run = registry.admit("x")
    cleaned = asyncio.Event()

    async def cleanup() -> None:
        await asyncio.sleep(0.05)
        cleaned.set()

    closing = asyncio.create_task(registry.close_run(run, cleanup()))
    await asyncio.sleep(0.01)
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    assert not run.exited.is_set() and registry.get("x") is run  # the cleanup goes on
    await registry.aclose()  # waits for it
    assert cleaned.is_set() and run.exited.is_set() and registry.get("x") is None


async def test_close_run_ends_the_run_when_the_cleanup_fails() -> None:
    registry = RunRegistry("idle", 2)
    run = registry.admit("x")

    async def cleanup() -> None:
        raise OSError("disk gone")

    with pytest.raises(OSError):
        await registry.close_run(run, cleanup())
    assert run.exited.is_set() and len(registry) == 0
    registry.admit("x")  # the id is free again
