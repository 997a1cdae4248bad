"""Fixtures of the cluster tests: a PostgreSQL schema per test, and real ``agora serve`` nodes.

``pg_url`` is a ``postgresql://…?schema=<fresh>`` URL (:mod:`tests.support.postgres`); the
schema is dropped (CASCADE) after the test. Without a server the tests skip, unless
``AGORA_REQUIRE`` lists ``postgres`` (then they fail).

``start_node(url, node_id=…)`` starts an ``agora serve`` (:class:`tests.support.hub.HubProcess`,
``--port 0``) with ``[storage] store`` set to the URL, the A2A listener on a free port, the test
secret, and short heartbeat timings; each node is stopped with SIGTERM after the test (exit 0
required, unless the test killed it).

``ts_session(mode, **args)`` runs the TypeScript client's side of a test (``failover.mjs``:
a session given several nodes that reads or writes) and reads what it reports.
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import pytest

from hub.log.postgres import PostgresEventStore
from tests.hub.cluster.agents import (
    FAILOVER_SCRIPT,
    HEARTBEAT_S,
    NODE_TIMEOUT_S,
    StartTs,
    TsSession,
)
from tests.support.hub import HubProcess, HubStarter, StartHub
from tests.support.node import CLIENT_DIR, built_node, node_env
from tests.support.postgres import POSTGRES_DSN, drop_schemas, need_postgres, new_schema, url_for


@pytest.fixture
def pg_schema() -> Iterator[str]:
    """A fresh schema name (created by the first store that opens it), dropped afterwards."""
    need_postgres()
    schema = new_schema("c")
    try:
        yield schema
    finally:
        drop_schemas([schema])


@pytest.fixture
def pg_url(pg_schema: str) -> str:
    return url_for(pg_schema)


@pytest.fixture
async def pg_store(pg_schema: str) -> AsyncIterator[PostgresEventStore]:
    """An open store on the test's schema (a client of the nodes' log, for checks)."""
    async with PostgresEventStore(POSTGRES_DSN, schema=pg_schema, pool_size=4) as store:
        yield store


@pytest.fixture
def start_node(tmp_path: Path) -> Iterator[StartHub]:
    """``start_node(store_url, node_id=None, config="", **env)``: a running node (see the
    module doc); ``config`` is appended to its agora.toml."""
    starter = HubStarter(tmp_path, name="node")

    def start(
        store_url: str, node_id: str | None = None, config: str = "", **env: str
    ) -> HubProcess:
        node_env = {
            "AGORA_NODE_ID": node_id or f"node-{uuid.uuid4().hex[:6]}",
            "AGORA_HEARTBEAT_S": HEARTBEAT_S,
            "AGORA_NODE_TIMEOUT_S": NODE_TIMEOUT_S,
            **env,
        }
        toml = f'[storage]\nstore = "{store_url}"\n\n{config}\n'
        return starter.start(toml, a2a_port=0, env=node_env)

    yield start
    starter.close()


# -- the TypeScript client's sessions (clients/typescript/test/support/failover.mjs) ---------


@pytest.fixture(scope="module")
def node() -> str:
    return built_node()


@pytest.fixture
async def ts_session(node: str) -> AsyncIterator[StartTs]:
    """``await ts_session(mode, **args)``: a started :class:`TsSession` (killed after the
    test if still running)."""
    started: list[asyncio.subprocess.Process] = []

    async def start(mode: str, **args: Any) -> TsSession:
        proc = await asyncio.create_subprocess_exec(
            node,
            str(FAILOVER_SCRIPT),
            mode,
            json.dumps(args),
            cwd=CLIENT_DIR,
            env=node_env(),
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        started.append(proc)
        return TsSession(proc)

    yield start
    for proc in started:
        if proc.returncode is None:
            proc.kill()
        await proc.wait()
