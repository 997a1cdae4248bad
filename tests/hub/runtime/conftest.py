"""Fixtures for the runtime's black-box tests: a real ``agora serve`` subprocess over real
sockets (tests/hub/server/conftest.py's :class:`HubProcess`), driven with raw ``websockets``
connections (:class:`ExecPeer`), and the real Docker Engine for the container backend.

Tests name the backend instances they need in an ``agora.toml`` (:data:`BACKENDS`); a token
minted by :func:`mint` carries the ``exec`` right and the backends it may select.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import select
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import connect

from hub.auth import TokenSigner
from tests.conftest import require
from tests.hub.server.conftest import (
    BANNER_TIMEOUT,
    REPO,
    SECRET,
    Frame,
    HubProcess,
    Peer,
)

BACKENDS = """
[[backends]]
id = "process"
kind = "process"
access = "read-write"

[[backends]]
id = "container"
kind = "container"
access = "read-write"
limits = { memory_bytes = 67108864, pids = 64, warm_pool = 1 }

[[backends]]
id = "ro"
kind = "process"
access = "read"

[[backends]]
id = "python"
kind = "python"
access = "read-write"
"""
"""The instances most tests use: ``process`` first (the default), a ``container`` with a
64 MiB memory and 64 pids limit, a read-only ``ro`` process instance and ``python`` (monty)."""


def mint(
    agent: str = "alice",
    *,
    backends: tuple[str, ...] = ("*",),
    rights: tuple[str, ...] = ("read", "write", "exec"),
    workspaces: tuple[str, ...] = ("*",),
) -> str:
    return TokenSigner(SECRET.encode()).issue(
        agent, workspaces, rights, backends=backends, ttl_seconds=3600
    )


def docker_ok() -> tuple[bool, str]:
    from backends.container import engine_reachable

    return engine_reachable()


def need_docker() -> None:
    ok, why = docker_ok()
    require("docker", ok, why)


class RuntimeHub(HubProcess):
    """``agora serve`` with extra flags (``--max-executions``); no A2A listener."""

    def __init__(self, data_dir: Path, config: Path | None, extra: tuple[str, ...] = ()) -> None:
        super().__init__(data_dir, config)
        self.extra = extra

    def start(self, port: int = 0) -> RuntimeHub:
        argv = [sys.executable, "-m", "hub", "serve", "--port", str(port), "--no-a2a"]
        argv += ["--data", str(self.data_dir), *self.extra]
        if self.config is not None:
            argv += ["--config", str(self.config)]
        env = dict(os.environ, AGORA_SECRET=SECRET, PYTHONPATH=str(REPO))
        env.pop("PYTHONASYNCIODEBUG", None)
        with self.stderr_path.open("ab") as stderr:
            self.proc = subprocess.Popen(
                argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=stderr
            )
        assert self.proc.stdout is not None
        deadline = time.monotonic() + BANNER_TIMEOUT
        line = b""
        while not line.endswith(b"\n"):
            ready, _, _ = select.select(
                [self.proc.stdout], [], [], max(0.0, deadline - time.monotonic())
            )
            if not ready:
                self.kill()
                raise AssertionError(f"no banner within {BANNER_TIMEOUT}s: {self.log()}")
            chunk = os.read(self.proc.stdout.fileno(), 1024)
            if not chunk:
                raise AssertionError(f"agora serve exited early: {self.log()}")
            line += chunk
        self.banner = line.decode().strip()
        assert self.banner.startswith("agora serving ws://"), self.banner
        self.url = self.banner.split()[2]
        return self


class ExecPeer(Peer):
    """A raw connection with helpers for the runtime's ops."""

    async def reply(self, rid: Any, within: float = 60) -> Frame:
        """The next frame with ``rid``, from the inbox first (streams interleave)."""
        for i, frame in enumerate(self.inbox):
            if frame.get("rid") == rid:
                return self.inbox.pop(i)
        return await super().reply(rid, within)

    async def exec(self, workspace: str = "w", **fields: Any) -> Frame:
        """``exec`` (``encoding`` defaults to ``utf8``); the reply."""
        fields.setdefault("encoding", "utf8")
        return await self.call("exec", workspace=workspace, **fields)

    async def run(self, workspace: str = "w", within: float = 60, **fields: Any) -> Frame:
        """``exec`` then ``execResult``: the result (asserting both succeeded)."""
        accepted = await self.exec(workspace, **fields)
        assert accepted["op"] == "execAccepted", accepted
        reply = await self.call(
            "execResult", within=within, workspace=workspace, execId=accepted["execId"]
        )
        assert reply["op"] == "execResult", reply
        result: Frame = reply["result"]
        result["execId"] = accepted["execId"]
        return result

    async def stream(
        self, workspace: str, exec_id: str, resume: Any = "full", within: float = 60
    ) -> tuple[list[Frame], Frame]:
        """``getExec``: the ``execEvent`` frames and the closing ``execEnd`` (or ``error``)."""
        rid = next(self._rids)
        await self.send(
            {
                "op": "getExec",
                "rid": rid,
                "workspace": workspace,
                "execId": exec_id,
                "resume": resume,
            }
        )
        frames: list[Frame] = []
        async with asyncio.timeout(within):
            while True:
                frame = await self.reply(rid, within)
                if frame["op"] == "execEvent":
                    frames.append(frame)
                    continue
                return frames, frame

    async def log(self, workspace: str = "w", after_seq: int = 0) -> list[Frame]:
        """Every event of ``workspace`` (subscribe from ``after_seq``, read to the head,
        unsubscribe)."""
        reply = await self.call("subscribe", workspace=workspace, afterSeq=after_seq)
        assert reply["op"] == "subscribed", reply
        head = reply["head"]
        events: list[Frame] = []
        if head > after_seq:
            events = await self.events(workspace, head)
        done = await self.call("unsubscribe", workspace=workspace)
        assert done["op"] == "unsubscribed", done
        self.inbox = [f for f in self.inbox if f.get("op") != "event"]
        return events


@contextlib.asynccontextmanager
async def exec_peer(url: str, token: str | None = None) -> AsyncIterator[ExecPeer]:
    async with connect(url, compression=None, open_timeout=10, max_size=None) as ws:
        p = ExecPeer(ws)
        p._rids = itertools.count(1)
        await p.send({"op": "hello", "token": token or mint()})
        welcome = await p.recv()
        assert welcome["op"] == "welcome", welcome
        yield p


@pytest.fixture
def start_runtime_hub(tmp_path: Path) -> Iterator[Callable[..., RuntimeHub]]:
    """Start ``agora serve`` processes with a config (default :data:`BACKENDS`); each is
    stopped with SIGTERM at the end (and must exit 0) unless the test killed it."""
    started: list[RuntimeHub] = []
    counter = itertools.count()

    def start(
        config: str = BACKENDS, data_dir: Path | None = None, args: tuple[str, ...] = ()
    ) -> RuntimeHub:
        n = next(counter)
        path = tmp_path / f"agora-{n}.toml"
        path.write_text(config)
        process = RuntimeHub(data_dir or tmp_path / f"data-{n}", path, args)
        started.append(process)
        process.start()
        return process

    yield start
    failures = []
    for process in started:
        if process.proc is not None and process.proc.poll() is None:
            code = process.terminate()
            if code != 0:
                failures.append(f"exit {code}: {process.log()}")
        process.close_pipes()
    assert not failures, failures


@pytest.fixture
def runtime_hub(start_runtime_hub: Callable[..., RuntimeHub]) -> RuntimeHub:
    return start_runtime_hub()


def of_kind(events: list[Frame], kind: str) -> list[Frame]:
    return [e for e in events if e["kind"] == kind]


def of_exec(events: list[Frame], exec_id: str) -> list[Frame]:
    return [e for e in events if (e.get("payload") or {}).get("execId") == exec_id]


__all__ = ["BACKENDS", "ExecPeer", "RuntimeHub", "exec_peer", "mint", "need_docker"]
