"""The ``mock`` backend: a real, small in-process :class:`~backends.base.CodeExecutor` for tests.

It runs no program: the request's source is a script of one instruction per line, which the
backend plays out on the event loop, honouring the whole contract (validation first, output
chunks within the caps, one result, timeout, cancel, busy ids, a concurrency cap, shielded
ends, ``aclose``)::

    echo TEXT       TEXT and a newline on stdout
    error TEXT      TEXT and a newline on stderr
    flood N         N bytes of "x" on stdout (in 64 KiB chunks)
    sleep SECONDS   wait (a stop or the timeout interrupts it)
    hang            wait until stopped (cancel or the timeout)
    input           the request's ``input`` as one JSON line on stdout
    exit N          end now with exit code N (default at the end of the script: 0)

An unknown instruction is :class:`~hub.core.execution.errors.InvalidCode` before anything
"runs". Its capabilities are what it does, no more: ``inProcess``, language ``command``, no
workspace (``workspace="none"``, filesystem mode ``none`` only), network and environment
enforced (a script can reach neither), the timeout enforced; no memory, pids or cpu limits.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Final

import msgspec

from backends.access import WorkspaceAccess
from backends.captured import captured_result
from backends.lifecycle import BackendLifecycle, elapsed_ms
from backends.output import OutputChannel
from backends.runs import Run, RunRegistry
from hub.core.execution.capabilities import (
    BackendCapabilities,
    ExecutionIsolation,
    ExecutionLanguage,
)
from hub.core.execution.errors import InvalidCode
from hub.core.execution.policy import FilesystemPolicy, SandboxPolicy
from hub.core.execution.request import ExecutionRequest
from hub.core.execution.result import ExecutionEvent, classify

__all__ = ["MOCK_INSTRUCTIONS", "MockBackend", "parse_script"]

MOCK_INSTRUCTIONS: Final = frozenset({"echo", "error", "flood", "sleep", "hang", "input", "exit"})
_CHUNK: Final = 64 * 1024

Instruction = tuple[str, str]


def parse_script(source: str) -> list[Instruction]:
    """The instructions of ``source`` (blank lines skipped). Raises :class:`InvalidCode`."""
    script: list[Instruction] = []
    for number, line in enumerate(source.splitlines(), 1):
        if not line.strip():
            continue
        word, _, argument = line.strip().partition(" ")
        if word not in MOCK_INSTRUCTIONS:
            raise InvalidCode(f"line {number}: unknown instruction {word!r}", line=number)
        if word in ("flood", "exit") and argument and not argument.lstrip("-").isdigit():
            raise InvalidCode(f"line {number}: {word} takes an integer", line=number)
        if word == "sleep":
            try:
                float(argument)
            except ValueError:
                raise InvalidCode(f"line {number}: sleep takes seconds", line=number) from None
        script.append((word, argument))
    return script


class MockBackend(BackendLifecycle):
    """Plays scripted executions (see the module docstring)."""

    def __init__(
        self, name: str = "mock", *, policy: SandboxPolicy | None = None, max_concurrent: int = 16
    ) -> None:
        self._name = name
        self._policy = policy or SandboxPolicy(
            network="disabled", filesystem=FilesystemPolicy.none()
        )
        self._registry = RunRegistry(name, max_concurrent)
        self._caps = BackendCapabilities(
            isolation=ExecutionIsolation.IN_PROCESS,
            enforces_network=True,
            enforces_filesystem=True,
            enforces_environment=True,
            enforces_timeout=True,
            supports_process_execution=False,
            languages=frozenset({ExecutionLanguage.COMMAND}),
            filesystem_modes=frozenset({"none"}),
            workspace="none",
        )

    async def _start(self) -> None:
        return None

    async def aclose(self) -> None:
        await self._registry.aclose()

    async def _validate(self, request: ExecutionRequest) -> None:
        parse_script(request.source or "")

    async def execute(
        self,
        request: ExecutionRequest,
        workdir: Path | None,
        access: WorkspaceAccess | None = None,
    ) -> AsyncGenerator[ExecutionEvent, None]:
        """Play ``request``'s script (contract: :mod:`backends.base`). ``workdir`` and
        ``access`` are not used: the mock has no workspace."""
        await self._check_request(request)
        script = parse_script(request.source or "")
        run = self._registry.admit(request.exec_id)
        started = time.monotonic()
        channel = OutputChannel(request.effective_max_stdout, request.effective_max_stderr)
        timer = asyncio.get_running_loop().call_later(
            request.effective_timeout_ms / 1000, run.request_stop, "timeout"
        )
        stopped = asyncio.Event()
        run.on_stop = lambda _reason: stopped.set()
        player = asyncio.create_task(_play(script, request, channel, run, stopped))
        try:
            while (chunk := await channel.get()) is not None:
                yield chunk
            exit_code = await player
        finally:
            timer.cancel()
            run.on_stop = None
            if not player.done():
                player.cancel()
                await asyncio.wait([player])
            await self._registry.close_run(run)
        outcome = classify(exit_code, cancelled=run.cancelled, timed_out=run.timed_out)
        yield captured_result(
            channel,
            outcome,
            duration_ms=elapsed_ms(started),
            metadata=self._metadata(request),
            notes=run.stop_notes(request.effective_timeout_ms, "the script was stopped"),
        )


async def _play(
    script: list[Instruction],
    request: ExecutionRequest,
    channel: OutputChannel,
    run: Run,
    stopped: asyncio.Event,
) -> int | None:
    """Play ``script`` into ``channel``; its exit code (``None`` when stopped)."""

    async def wait(seconds: float | None) -> bool:
        """Wait ``seconds`` (``None``: forever); False once a stop was requested."""
        try:
            async with asyncio.timeout(seconds):
                await stopped.wait()
        except TimeoutError:
            return True
        return False

    try:
        for word, argument in script:
            if run.stop_reason is not None:
                return None
            if word == "echo":
                await channel.feed("stdout", argument.encode() + b"\n")
            elif word == "error":
                await channel.feed("stderr", argument.encode() + b"\n")
            elif word == "flood":
                left = int(argument or 0)
                while left > 0 and run.stop_reason is None:
                    await channel.feed("stdout", b"x" * min(left, _CHUNK))
                    left -= _CHUNK
            elif word == "input":
                value = request.input if request.has_input else None
                await channel.feed("stdout", msgspec.json.encode(value) + b"\n")
            elif word == "sleep":
                if not await wait(float(argument)):
                    return None
            elif word == "hang":
                await wait(None)
                return None
            elif word == "exit":
                return int(argument or 0)
        return None if run.stop_reason is not None else 0
    finally:
        channel.close("stdout")
        channel.close("stderr")
