"""Helpers the backend tests share: building a request, draining an ``execute`` stream, the
rust settings of this host, and the lifecycle checks
that every backend passes the same way (a running id is busy, a cancelled consumer stops the
run, a closed backend is unavailable).

Registered for pytest's assertion rewriting in ``conftest.py``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest

from backends.base import (
    BackendUnavailable,
    CodeExecutor,
    ExecutionEvent,
    ExecutionRequest,
    ExecutionResult,
    OutputChunk,
    collect,
)
from hub.core.errors import Busy
from hub.core.execution.settings import RustSettings


def host_rust_settings() -> RustSettings:
    """The rust backend's settings resolved against this process's environment (the toolchain
    on its ``PATH``, e.g. rustup's): the tests are their own composition root, the backend
    reads no environment."""
    return RustSettings().resolved(os.environ)


def new_request(backend: CodeExecutor, **fields: Any) -> ExecutionRequest:
    """A request for ``backend``: ``fields``, with a fresh execution id and the backend's
    default policy unless they are given."""
    fields.setdefault("exec_id", f"{backend.name}-{uuid.uuid4().hex[:12]}")
    fields.setdefault("policy", backend.default_policy)
    return ExecutionRequest(**fields)


async def drain(events: AsyncIterator[ExecutionEvent]) -> tuple[ExecutionResult, list[OutputChunk]]:
    """Consume an ``execute`` stream: its one result and the chunks streamed before it (the
    contract's order is checked: no chunk after the result, exactly one result)."""
    chunks: list[OutputChunk] = []
    result: ExecutionResult | None = None
    async for event in events:
        if isinstance(event, OutputChunk):
            assert result is None, "a chunk after the result"
            chunks.append(event)
        else:
            assert result is None, "two results"
            result = event
    assert result is not None, "no result"
    return result, chunks


async def assert_running_id_is_busy(
    backend: CodeExecutor, long_running: ExecutionRequest, settle_s: float = 0.2
) -> None:
    """While ``long_running`` runs, a second request with its id is ``Busy``."""
    task = asyncio.create_task(collect(backend.execute(long_running, None)))
    await asyncio.sleep(settle_s)
    with pytest.raises(Busy):
        await collect(backend.execute(long_running, None))
    await backend.cancel(long_running.exec_id)
    await task


async def cancel_consumer(
    backend: CodeExecutor, long_running: ExecutionRequest, settle_s: float = 0.2
) -> None:
    """Consume ``long_running``'s stream in a task, cancel that task after ``settle_s`` and
    wait for it (the backend must stop the run on its own)."""
    task = asyncio.create_task(collect(backend.execute(long_running, None)))
    await asyncio.sleep(settle_s)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task


async def assert_closed_is_unavailable(backend: CodeExecutor, request: ExecutionRequest) -> None:
    """Start and close ``backend`` (twice: idempotent); then it is unavailable and refuses
    ``request``."""
    await backend.start()
    await backend.aclose()
    await backend.aclose()
    ok, why = backend.available()
    assert not ok and why
    with pytest.raises(BackendUnavailable):
        await collect(backend.execute(request, None))


BOUND_S = 60.0
"""A generous bound for what must happen "promptly": a test waits on the outcome within it
instead of asserting a wall-clock time (a loaded machine is slow, never wrong)."""


async def until_running(backend: CodeExecutor, exec_id: str, within: float = BOUND_S) -> None:
    """Wait until ``exec_id`` is admitted and running on ``backend`` (its registry has it)."""
    registry = getattr(backend, "_registry")  # noqa: B009 - every backend's RunRegistry
    async with asyncio.timeout(within):
        while True:
            if registry.get(exec_id) is not None:
                return
            await asyncio.sleep(0.01)
