"""Fixtures of the cluster tests: a PostgreSQL schema per test, and real ``agora serve`` nodes.

``pg_url`` is a ``postgresql://…?schema=<fresh>`` URL (``AGORA_TEST_POSTGRES``, default the
local server's ``test`` database); the schema is dropped (CASCADE) after the test. Without a
server the tests skip, unless ``AGORA_REQUIRE`` lists ``postgres`` (then they fail).

``start_node(url, node_id=…)`` starts ``python -m hub serve --port 0`` with ``[storage] store``
set to the URL (and the A2A listener on a free port), the test secret in ``AGORA_SECRET``, and
short heartbeat timings; each node is stopped with SIGTERM after the test (exit 0 required,
unless the test killed it).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import select
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Final

import asyncpg
import pytest

from hub.log.postgres import PostgresEventStore
from tests.conftest import require
from tests.hub.log.conftest import POSTGRES_DSN, pg_run, postgres_unavailable
from tests.hub.server.conftest import SECRET

REPO: Final = Path(__file__).resolve().parents[3]
BANNER_TIMEOUT: Final = 30.0
HEARTBEAT_S: Final = "0.2"
NODE_TIMEOUT_S: Final = "1.5"


def new_schema() -> str:
    return f"c_{uuid.uuid4().hex[:20]}"


def url_for(schema: str) -> str:
    sep = "&" if "?" in POSTGRES_DSN else "?"
    return f"{POSTGRES_DSN}{sep}schema={schema}"


def drop_schema(schema: str) -> None:
    async def drop(conn: asyncpg.Connection) -> None:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

    pg_run(drop)


@pytest.fixture
def pg_schema() -> Iterator[str]:
    """A fresh schema name (created by the first store that opens it), dropped afterwards."""
    why = postgres_unavailable()
    require("postgres", why is None, why or "")
    schema = new_schema()
    try:
        yield schema
    finally:
        drop_schema(schema)


@pytest.fixture
def pg_url(pg_schema: str) -> str:
    return url_for(pg_schema)


@pytest.fixture
async def pg_store(pg_schema: str) -> AsyncIterator[PostgresEventStore]:
    """An open store on the test's schema (a client of the nodes' log, for checks)."""
    async with PostgresEventStore(POSTGRES_DSN, schema=pg_schema, pool_size=4) as store:
        yield store


class NodeProcess:
    """One ``agora serve`` node on a shared store."""

    def __init__(self, data_dir: Path, config: Path, env: dict[str, str]) -> None:
        self.data_dir = data_dir
        self.config = config
        self.env = env
        self.proc: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.stderr_path = data_dir.parent / f"{data_dir.name}.stderr.log"
        self.killed = False

    @property
    def node_id(self) -> str:
        return self.env["AGORA_NODE_ID"]

    def start(self) -> NodeProcess:
        argv = [sys.executable, "-m", "hub", "serve", "--port", "0"]
        argv += ["--data", str(self.data_dir), "--config", str(self.config)]
        env = dict(os.environ, AGORA_SECRET=SECRET, PYTHONPATH=str(REPO), **self.env)
        env.pop("PYTHONASYNCIODEBUG", None)  # the node under test runs at full speed
        with self.stderr_path.open("ab") as stderr:
            self.proc = subprocess.Popen(
                argv, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=stderr
            )
        assert self.proc.stdout is not None
        deadline = time.monotonic() + BANNER_TIMEOUT
        line = b""
        while not line.endswith(b"\n"):
            ready, _, _ = select.select([self.proc.stdout], [], [], deadline - time.monotonic())
            if not ready:
                self.kill()
                raise AssertionError(f"no banner within {BANNER_TIMEOUT}s: {self.log()}")
            chunk = os.read(self.proc.stdout.fileno(), 1)
            if not chunk:
                raise AssertionError(f"agora serve exited early: {self.log()}")
            line += chunk
        banner = line.decode().strip()
        assert banner.startswith("agora serving ws://"), banner
        self.url = banner.split()[2]
        return self

    def log(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")[-6000:]
        except OSError:
            return ""

    def kill(self) -> None:
        """SIGKILL: a crash (no goodbye to the database, no stop mark)."""
        if self.proc is not None and self.proc.poll() is None:
            self.killed = True
            self.proc.kill()
            self.proc.wait(10)

    def terminate(self, timeout: float = 30.0) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"agora serve ignored SIGTERM for {timeout}s") from None

    def close_pipes(self) -> None:
        if self.proc is not None and self.proc.stdout is not None:
            self.proc.stdout.close()


StartNode = Callable[..., NodeProcess]


@pytest.fixture
def start_node(tmp_path: Path) -> Iterator[StartNode]:
    """``start_node(store_url, node_id=None, config="", **env)``: a running node (see the
    module doc); ``config`` is appended to its agora.toml."""
    started: list[NodeProcess] = []
    counter = itertools.count()

    def start(
        store_url: str, node_id: str | None = None, config: str = "", **env: str
    ) -> NodeProcess:
        n = next(counter)
        path = tmp_path / f"node-{n}.toml"
        path.write_text(f'[server]\na2a_port = 0\n\n[storage]\nstore = "{store_url}"\n\n{config}\n')
        node_env = {
            "AGORA_NODE_ID": node_id or f"node-{n}-{uuid.uuid4().hex[:6]}",
            "AGORA_HEARTBEAT_S": HEARTBEAT_S,
            "AGORA_NODE_TIMEOUT_S": NODE_TIMEOUT_S,
            **env,
        }
        node = NodeProcess(tmp_path / f"node-{n}", path, node_env)
        started.append(node)
        return node.start()

    yield start
    failures = []
    for node in started:
        if node.proc is not None and node.proc.poll() is None:
            code = node.terminate()
            if code != 0:
                failures.append(f"{node.node_id} exit {code}: {node.log()}")
        node.close_pipes()
    assert not failures, failures


async def wait_for(predicate: Callable[[], object], within: float = 10.0) -> None:
    """Poll ``predicate`` (sync) until true; AssertionError after ``within`` seconds."""
    deadline = time.monotonic() + within
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"condition not met within {within}s")
        await asyncio.sleep(0.02)
