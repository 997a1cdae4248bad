"""Fixtures for black-box tests of the WebSocket hub over real sockets.

``hub`` starts a real ``agora serve`` (``python -m hub serve --port 0``) in a subprocess with a
temporary data directory and ``AGORA_SECRET`` set, waits for its banner, and stops it with
SIGTERM afterwards (asserting exit 0). ``start_hub(config=...)`` starts more, e.g. with an
``agora.toml``. ``inproc_hub`` runs :class:`hub.server.app.Hub` in the test's own loop, for tests
that look inside (the fan-out's counters).

Clients are raw ``websockets`` connections (never hub/client.py); :class:`Peer` only adds JSON
and rid bookkeeping around one.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import os
import select
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from hub.auth import TokenSigner

REPO = Path(__file__).resolve().parents[3]
SECRET = "agora-test-secret-0123456789-abcdefghijklmnop"
BANNER_TIMEOUT = 20.0
RECV_TIMEOUT = 10.0

Frame = dict[str, Any]


def mint(
    agent: str = "alice",
    workspaces: tuple[str, ...] | list[str] = ("*",),
    rights: tuple[str, ...] | list[str] = ("read", "write"),
    *,
    ttl: int = 3600,
    secret: str = SECRET,
    clock: Callable[[], float] = time.time,
) -> str:
    """A capability token signed with the test hub's secret (or ``secret``)."""
    signer = TokenSigner(secret.encode(), clock=clock)
    return signer.issue(agent, workspaces, rights, ttl_seconds=ttl)


class HubProcess:
    """One ``agora serve`` subprocess."""

    def __init__(self, data_dir: Path, config: Path | None = None) -> None:
        self.data_dir = data_dir
        self.config = config
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.banner = ""
        self.stderr_path = data_dir.parent / f"{data_dir.name}.stderr.log"

    def start(self, port: int = 0) -> HubProcess:
        argv = [sys.executable, "-m", "hub", "serve", "--port", str(port), "--no-a2a"]
        argv += ["--data", str(self.data_dir)]
        if self.config is not None:
            argv += ["--config", str(self.config)]
        env = dict(os.environ, AGORA_SECRET=SECRET, PYTHONPATH=str(REPO))
        env.pop("PYTHONASYNCIODEBUG", None)  # the hub under test runs at full speed
        stderr = self.stderr_path.open("ab")
        try:
            self.proc = subprocess.Popen(
                argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=stderr
            )
        finally:
            stderr.close()
        assert self.proc.stdout is not None
        deadline = time.monotonic() + BANNER_TIMEOUT
        line = b""
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            ready, _, _ = select.select([self.proc.stdout], [], [], max(0.0, left))
            if not ready:
                self.kill()
                raise AssertionError(f"no banner within {BANNER_TIMEOUT}s: {self.log()}")
            chunk = os.read(self.proc.stdout.fileno(), 1024)
            if not chunk:
                raise AssertionError(f"agora serve exited early: {self.log()}")
            line += chunk
        self.banner = line.decode().strip()
        assert self.banner.startswith("agora serving ws://"), self.banner
        assert f"(data {self.data_dir})" in self.banner, self.banner
        self.url = self.banner.split()[2]
        return self

    @property
    def port(self) -> int:
        return int(self.url.rsplit(":", 1)[1])

    def log(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def terminate(self, timeout: float = 30.0) -> int:
        """SIGTERM and wait; returns the exit code."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"agora serve ignored SIGTERM for {timeout}s") from None

    def kill(self) -> None:
        """SIGKILL (a crash)."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(10)

    def close_pipes(self) -> None:
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()


@pytest.fixture
def start_hub(tmp_path: Path) -> Iterator[Callable[..., HubProcess]]:
    """Start ``agora serve`` processes; each is stopped with SIGTERM (and must exit 0)."""
    started: list[HubProcess] = []
    counter = itertools.count()

    def start(config: str | None = None, data_dir: Path | None = None) -> HubProcess:
        n = next(counter)
        config_path = None
        if config is not None:
            config_path = tmp_path / f"agora-{n}.toml"
            config_path.write_text(config)
        process = HubProcess(data_dir or tmp_path / f"data-{n}", config_path).start()
        started.append(process)
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
def hub(start_hub: Callable[..., HubProcess]) -> HubProcess:
    """A real ``agora serve`` with the default configuration."""
    return start_hub()


@pytest.fixture
async def inproc_hub(tmp_path: Path) -> AsyncIterator[Any]:
    """A :class:`hub.server.app.Hub` served from this test's event loop (port chosen by the OS)."""
    from hub.config import HubConfig
    from hub.log.factory import open_store
    from hub.server.app import Hub

    config = HubConfig().with_overrides(port=0, data=tmp_path / "inproc")
    store = open_store(None, config.storage.data_dir)
    server = Hub(config, store, TokenSigner(SECRET.encode()))
    stop = asyncio.Event()
    ready = asyncio.Event()
    task = asyncio.create_task(server.run(stop, on_ready=lambda _url: ready.set()))
    async with asyncio.timeout(BANNER_TIMEOUT):
        await ready.wait()
    try:
        yield server
    finally:
        stop.set()
        async with asyncio.timeout(30):
            await task


# ---------------------------------------------------------------------------------------------
# Raw clients


class Peer:
    """A raw websockets connection with JSON framing, rids and an inbox for other frames."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.inbox: list[Frame] = []
        self._rids = itertools.count(1)

    async def send(self, frame: Frame | str | bytes) -> None:
        if isinstance(frame, dict):
            await self.ws.send(json.dumps(frame))
        else:
            await self.ws.send(frame)

    async def recv(self, within: float = RECV_TIMEOUT) -> Frame:
        """The next frame (from the inbox first)."""
        if self.inbox:
            return self.inbox.pop(0)
        async with asyncio.timeout(within):
            data = await self.ws.recv()
        frame: Frame = json.loads(data)
        return frame

    async def call(self, op: str, within: float = RECV_TIMEOUT, **fields: Any) -> Frame:
        """Send ``op`` with a fresh rid; return the reply with that rid (others go to the
        inbox)."""
        rid = next(self._rids)
        await self.send({"op": op, "rid": rid, **fields})
        return await self.reply(rid, within)

    async def reply(self, rid: Any, within: float = RECV_TIMEOUT) -> Frame:
        async with asyncio.timeout(within):
            while True:
                frame: Frame = json.loads(await self.ws.recv())
                if frame.get("rid") == rid:
                    return frame
                self.inbox.append(frame)

    async def publish(self, workspace: str, event: Frame, **fields: Any) -> Frame:
        return await self.call("publish", workspace=workspace, event=event, **fields)

    async def head(self, workspace: str) -> int:
        reply = await self.call("state", workspace=workspace)
        assert reply["op"] == "state", reply
        seq: int = reply["seq"]
        return seq

    async def events(
        self, workspace: str, until_seq: int, within: float = RECV_TIMEOUT
    ) -> list[Frame]:
        """``event`` frames of ``workspace`` until one with ``seq >= until_seq``."""
        out: list[Frame] = []
        async with asyncio.timeout(within):
            while True:
                frame = await self.recv(within)
                if frame.get("op") != "event" or frame.get("workspace") != workspace:
                    continue
                out.append(frame["event"])
                if frame["event"]["seq"] >= until_seq:
                    return out

    async def closed(self, within: float = RECV_TIMEOUT) -> ConnectionClosed:
        """Read (and drop) frames until the connection closes; return the close."""
        async with asyncio.timeout(within):
            try:
                while True:
                    await self.ws.recv()
            except ConnectionClosed as e:
                return e

    async def close(self) -> None:
        await self.ws.close()


@contextlib.asynccontextmanager
async def peer(
    url: str,
    token: str | None = None,
    *,
    header: bool = False,
    hello: bool = True,
    **connect_args: Any,
) -> AsyncIterator[Peer]:
    """A connected :class:`Peer`; with ``token`` it authenticates (``hello`` frame, or the
    ``Authorization`` header with ``header=True``) and checks the ``welcome``."""
    headers = {"Authorization": f"Bearer {token}"} if header and token else None
    connect_args.setdefault("compression", None)
    connect_args.setdefault("open_timeout", 10)
    connect_args.setdefault("max_size", None)
    async with connect(url, additional_headers=headers, **connect_args) as ws:
        p = Peer(ws)
        if token is not None and hello:
            if not header:
                await p.send({"op": "hello", "token": token})
            welcome = await p.recv()
            assert welcome["op"] == "welcome", welcome
        yield p


def message(text: str = "hi", **fields: Any) -> Frame:
    """A ``messagePosted`` draft."""
    return {"kind": "messagePosted", "payload": {"text": text}, **fields}
