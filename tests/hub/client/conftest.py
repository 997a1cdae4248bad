"""A real ``agora serve`` in a subprocess for the client tests.

:class:`HubProcess` starts the hub on a free port with a temporary data directory and a known
secret (``AGORA_SECRET``), mints tokens with :class:`hub.auth.TokenSigner`, and can be killed
with SIGKILL and restarted on the same port and data directory.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path

import pytest

from hub.auth import TokenSigner
from hub.client import Session, connect

ROOT = Path(__file__).resolve().parents[3]
SECRET = "client-tests-secret-0123456789abcdef0123456789"
BANNER = re.compile(r"agora serving ws://(?P<host>[^:\s]+):(?P<port>\d+)")


class HubProcess:
    """One ``agora serve`` subprocess; its output goes to ``log`` (a file, so it never blocks)."""

    def __init__(self, data: Path, config: Path | None = None) -> None:
        self.data = data
        self.config = config
        self.port = 0
        self.log = data.parent / f"{data.name}.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.secret = SECRET  # what the hub is started with (a test may rotate it)
        self.signer = TokenSigner(SECRET.encode())

    @property
    def url(self) -> str:
        return f"ws://127.0.0.1:{self.port}"

    def env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["AGORA_SECRET"] = self.secret
        env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
        return env

    def start(self, timeout: float = 20.0) -> None:
        argv = [sys.executable, "-m", "hub", "serve", "--host", "127.0.0.1", "--no-a2a"]
        argv += ["--port", str(self.port), "--data", str(self.data)]
        if self.config is not None:
            argv += ["--config", str(self.config)]
        start = self.log.stat().st_size if self.log.exists() else 0
        out = self.log.open("ab")
        try:
            self.proc = subprocess.Popen(
                argv, stdout=out, stderr=subprocess.STDOUT, env=self.env(), cwd=ROOT
            )
        finally:
            out.close()
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.log.read_bytes()[start:].decode(errors="replace")
            match = BANNER.search(text)
            if match is not None:
                self.port = int(match["port"])
                return
            if self.proc.poll() is not None:
                raise RuntimeError(f"agora serve exited ({self.proc.returncode}):\n{text}")
            time.sleep(0.02)
        self.stop()
        raise RuntimeError(f"agora serve printed no banner in {timeout} s:\n{text}")

    def kill(self) -> None:
        """SIGKILL: no shutdown, no close frames."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
            self.proc.wait(10)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.kill()

    def restart(self) -> None:
        """Start again on the same port and data directory."""
        self.start()

    def token(
        self,
        agent: str,
        workspaces: Sequence[str] = ("*",),
        rights: Sequence[str] = ("read", "write"),
        ttl: int = 3600,
    ) -> str:
        return self.signer.issue(agent, workspaces, rights, ttl_seconds=ttl)

    def output(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""


def _hub(tmp: Path, config: str | None = None) -> Iterator[HubProcess]:
    config_path = None
    if config is not None:
        config_path = tmp / "agora.toml"
        config_path.write_text(config)
    hub = HubProcess(tmp / "data", config_path)
    hub.start()
    try:
        yield hub
    finally:
        hub.stop()


@pytest.fixture(scope="module")
def hub(tmp_path_factory: pytest.TempPathFactory) -> Iterator[HubProcess]:
    """A hub shared by the tests of a module (each test uses its own workspace)."""
    yield from _hub(tmp_path_factory.mktemp("hub"))


@pytest.fixture
def own_hub(tmp_path: Path) -> Iterator[HubProcess]:
    """A hub for one test (which may kill and restart it)."""
    yield from _hub(tmp_path)


SLOW_CONSUMER_CONFIG = """
[limits]
send_queue = 16
"""


@pytest.fixture
def small_queue_hub(tmp_path: Path) -> Iterator[HubProcess]:
    """A hub whose per-connection send queue is tiny, so a paused reader is cut with 4408."""
    yield from _hub(tmp_path, SLOW_CONSUMER_CONFIG)


RATE_LIMITED_CONFIG = """
[limits]
publish_rate = 20.0
publish_burst = 5
"""


@pytest.fixture
def limited_hub(tmp_path: Path) -> Iterator[HubProcess]:
    """A hub that lets each connection publish 5 events at once, then 20 per second."""
    yield from _hub(tmp_path, RATE_LIMITED_CONFIG)


@pytest.fixture
async def alice(hub: HubProcess) -> AsyncIterator[Session]:
    async with connect(hub.url, hub.token("alice")) as session:
        yield session


@pytest.fixture
async def bob(hub: HubProcess) -> AsyncIterator[Session]:
    async with connect(hub.url, hub.token("bob")) as session:
        yield session
