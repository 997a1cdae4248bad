"""The backends under test, spoken to generically: a :class:`Rig` is one started backend plus
what the suites need from it (its strictest runnable policy, a request, a run's chunks, the
leftovers of a run), made by :func:`open_rig` for a kind (the fixtures in conftest.py are
parametrized over the kinds); :class:`Listener` counts the TCP connections a program manages to
open (the network tests).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from backends.base import (
    CodeExecutor,
    ExecutionLanguage,
    ExecutionRequest,
    ExecutionResult,
    FilesystemPolicy,
    OutputChunk,
    PolicyPatch,
    SandboxPolicy,
    Source,
    narrow,
)
from backends.container import ContainerBackend
from backends.process import ProcessBackend
from tests.backends.helpers import drain, new_request
from tests.support.docker import TEST_OWNER, docker_available
from tests.support.require import require


@dataclass
class Rig:
    """One backend under test plus what the suite needs to speak to it generically."""

    kind: str
    backend: CodeExecutor
    base: SandboxPolicy
    chunks: list[OutputChunk] = field(default_factory=list)

    @property
    def is_container(self) -> bool:
        return self.kind.startswith("container")

    def policy(self, **changes: Any) -> SandboxPolicy:
        """The rig's baseline (strictest runnable) policy, narrowed by ``changes``."""
        return narrow(self.base, PolicyPatch(**changes)) if changes else self.base

    def workspace_policy(self, *, read_only: bool = False) -> SandboxPolicy:
        """A policy that gives the program the workdir at /workspace (both backends confine
        the filesystem)."""
        return self.with_filesystem(
            FilesystemPolicy.workspace_read_only()
            if read_only
            else FilesystemPolicy.workspace_read_write()
        )

    def with_filesystem(self, fs: FilesystemPolicy) -> SandboxPolicy:
        """The backend's default policy narrowed to the filesystem policy ``fs``."""
        return narrow(self.backend.default_policy, PolicyPatch(filesystem=fs))

    def request(self, source: str = "", **kw: Any) -> ExecutionRequest:
        kw.setdefault("policy", self.base)
        return new_request(self.backend, payload=Source(source), **kw)

    async def run(
        self, source: str = "", *, workdir: Path | None = None, **kw: Any
    ) -> ExecutionResult:
        """Run to the end; the streamed chunks are kept in ``self.chunks``."""
        return await self.run_request(self.request(source, **kw), workdir)

    async def run_request(
        self, request: ExecutionRequest, workdir: Path | None = None
    ) -> ExecutionResult:
        self.chunks = []
        result, self.chunks = await drain(self.backend.execute(request, workdir))
        return result

    def streamed(self, stream: str) -> bytes:
        return b"".join(c.data for c in self.chunks if c.stream == stream)

    def connect_program(self, port: int) -> tuple[ExecutionLanguage, str]:
        """A program that opens a TCP connection to 127.0.0.1:port and exits 0 on success."""
        if self.is_container:
            return ExecutionLanguage.COMMAND, f"echo hello | nc -w 2 127.0.0.1 {port}"
        return (
            ExecutionLanguage.PYTHON,
            "import socket\n"
            f"s = socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
            "s.sendall(b'hello')\n",
        )

    async def leftovers(self, exec_id: str, marker: str | None = None) -> list[str]:
        """What is still around of an execution: containers labelled with its id, or host
        processes whose command line has ``marker``."""
        if self.is_container:
            return await asyncio.to_thread(containers_of, exec_id)
        assert marker is not None
        return await asyncio.to_thread(processes_with, marker)


def containers_of(exec_id: str) -> list[str]:
    import docker

    client = docker.from_env()
    try:
        found = client.api.containers(all=True, filters={"label": f"agora.exec={exec_id}"})
    finally:
        client.close()
    return [c["Id"] for c in found]


def processes_with(marker: str) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(f"{pid}: {cmdline!r}")
    return found


def confined_open() -> SandboxPolicy:
    """The widest policy a confined process backend runs: network on, workspace read-write."""
    return SandboxPolicy(network="enabled", filesystem=FilesystemPolicy.workspace_read_write())


async def make_rig(kind: str) -> tuple[Rig, CodeExecutor]:
    if kind == "process":
        # Confined (the default): the widest policy has the network on and the workspace
        # read-write; the baseline narrows it to no network and no workspace, as containers.
        process = ProcessBackend(policy=confined_open())
        await process.start()
        ok, why = process.available()
        require("bwrap", ok, why)
        base = narrow(
            process.default_policy,
            PolicyPatch(network="disabled", filesystem=FilesystemPolicy.none()),
        )
        return Rig(kind, process, base), process
    ok, why = await asyncio.to_thread(docker_available)
    require("docker", ok, why)
    container = ContainerBackend(
        owner=TEST_OWNER, warm_pool=2 if kind == "container" else 0, max_concurrent=8
    )
    await container.start()
    ok, why = container.available()
    if not ok:
        await container.aclose()
    require("docker", ok, why)
    base = narrow(container.default_policy, PolicyPatch(filesystem=FilesystemPolicy.none()))
    return Rig(kind, container, base), container


@contextlib.asynccontextmanager
async def open_rig(kind: str) -> AsyncIterator[Rig]:
    """A started rig of ``kind``, its backend closed at the end."""
    made, backend = await make_rig(kind)
    try:
        yield made
    finally:
        await backend.aclose()


PROBE: bytes = b"agora-listener-probe"


class Listener:
    """A TCP listener on 127.0.0.1 that counts the connections it accepts (its own probes,
    :meth:`settled`, aside)."""

    def __init__(self) -> None:
        self.accepted = 0
        self.port = 0
        self._probes = 0

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        data = b""
        with contextlib.suppress(Exception):
            data = await asyncio.wait_for(reader.read(100), 2)
        if data == PROBE:
            self.accepted -= 1
            self._probes += 1
        writer.close()

    async def settled(self, within: float = 60.0) -> int:
        """The connections accepted once every one made so far has been: a probe of our own is
        accepted after any connection made before it (one listening socket accepts in order,
        and each handler counts its connection before it reads), so once the probe is seen the
        count is final for everything that came earlier. Replaces "it would show by now"."""
        seen = self._probes
        _reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
        try:
            writer.write(PROBE)
            await writer.drain()
            async with asyncio.timeout(within):
                while True:
                    if self._probes > seen:
                        return self.accepted
                    await asyncio.sleep(0.01)
        finally:
            writer.close()
