"""The Docker Engine of the tests: whether it answers, the owner label of the containers
this test process creates (so a sweep never touches another run's), and a proxy in front of
it that can stop answering (:class:`EngineProxy`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Final

from tests.support.require import require

TEST_OWNER: Final = f"agora-test-{os.getpid()}"


def docker_available() -> tuple[bool, str]:
    """Whether an engine answers (and why not); the container backend's own probe. Blocking."""
    from backends.container import engine_reachable  # the docker SDK loads only when asked

    return engine_reachable()


def need_docker() -> None:
    """Skip without an engine (fail when ``AGORA_REQUIRE`` lists docker)."""
    ok, why = docker_available()
    require("docker", ok, why)


def owned_containers(owner: str) -> list[str]:
    """The ids of the containers labelled ``agora.owner=<owner>``, running or not. Blocking."""
    import docker

    client = docker.from_env()
    try:
        found = client.api.containers(
            all=True, quiet=True, filters={"label": f"agora.owner={owner}"}
        )
        return [c["Id"] for c in found]
    finally:
        client.close()


def remove_containers_of(data_dirs: Iterable[Path]) -> int:
    """Remove the containers of the hubs on ``data_dirs`` (their ``agora.owner`` labels, every
    worker's); how many. Nothing without an engine. Blocking."""
    from backends.container import owner_label

    return remove_owned(owner_label(data_dir) for data_dir in data_dirs)


def remove_owned(owners: Iterable[str]) -> int:
    """Remove the containers labelled ``agora.owner=<owner>`` for each of ``owners``; how
    many. Nothing without an engine. Blocking."""
    if not docker_available()[0]:
        return 0
    import docker
    import docker.errors

    client = docker.from_env()
    removed = 0
    try:
        for owner in owners:
            for cid in owned_containers(owner):
                with contextlib.suppress(docker.errors.NotFound, docker.errors.APIError):
                    client.api.remove_container(cid, force=True, v=True)
                    removed += 1
    finally:
        client.close()
    return removed


def engine_socket() -> str:
    """The path of the local engine's unix socket (``DOCKER_HOST`` when it names one)."""
    host = os.environ.get("DOCKER_HOST", "")
    return host.removeprefix("unix://") if host.startswith("unix://") else "/var/run/docker.sock"


class EngineProxy:
    """A unix socket in front of the local engine that can stop answering: the engine as a
    hub meets it when dockerd hangs. Every byte is passed on both ways until :meth:`freeze`,
    then nothing more is (the connections stay open, the bytes wait), until :meth:`thaw`.
    Runs on the test's event loop: ``async with EngineProxy(path) as proxy``."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    @property
    def base_url(self) -> str:
        return f"unix://{self.path}"

    def freeze(self) -> None:
        self._flowing.clear()

    def thaw(self) -> None:
        self._flowing.set()

    async def __aenter__(self) -> EngineProxy:
        self._server = await asyncio.start_unix_server(self._serve, str(self.path))
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._server is not None
        self._server.close()
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        await self._server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        try:
            up_reader, up_writer = await asyncio.open_unix_connection(engine_socket())
            try:
                async with asyncio.TaskGroup() as tg:
                    tg.create_task(self._pass(reader, up_writer))
                    tg.create_task(self._pass(up_reader, writer))
            finally:
                up_writer.close()
        except OSError:
            pass  # the engine refused, or a side closed: the connection ends
        finally:
            writer.close()
            self._tasks.discard(task)

    async def _pass(self, source: asyncio.StreamReader, sink: asyncio.StreamWriter) -> None:
        try:
            while chunk := await source.read(65536):
                await self._flowing.wait()
                sink.write(chunk)
                await sink.drain()
            if sink.can_write_eof():
                sink.write_eof()
        except OSError:
            sink.close()  # (a reset: the other direction ends with it)
