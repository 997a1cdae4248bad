"""Fixtures of the log store tests: every store kind behind the same ``EventStore`` interface.

``STORE_KINDS`` maps a kind to a :class:`StoreKind`: how to build a store over some named,
initially empty storage, and a backdoor to damage stored rows (for the tamper tests, which
must bypass the interface). PostgreSQL (``AGORA_TEST_POSTGRES``, default the local server's
``test`` database) is one entry whose ``build`` starts with
``tests.conftest.require("postgres", available, why)`` so the kind skips (or fails in CI)
where no server runs; each (test, name) gets its own schema, dropped after the test.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import re
import sqlite3
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Final, TypeVar

import asyncpg
import pytest

from hub.log.base import EventStore
from hub.log.postgres import PostgresEventStore
from hub.log.sqlite import SqliteEventStore
from tests.conftest import require


@dataclass(frozen=True)
class StoreKind:
    """``build(tmp_path, name)``: an unopened store over storage ``name`` (same name, same
    data). ``corrupt_body``/``delete_row``: edit the stored event ``(workspace, seq)``
    directly, behind the store's back."""

    build: Callable[[Path, str], EventStore]
    corrupt_body: Callable[[EventStore, str, int, Callable[[bytes], bytes]], None]
    delete_row: Callable[[EventStore, str, int], None]
    delete_hashes: Callable[[EventStore, str], None]
    """Drop a workspace's stored Merkle hashes (as a log written before the tree existed)."""


def _sqlite_build(tmp_path: Path, name: str) -> EventStore:
    return SqliteEventStore(tmp_path / f"{name}.db", blobs_dir=tmp_path / f"{name}-blobs")


def _sqlite_path(store: EventStore) -> Path:
    assert isinstance(store, SqliteEventStore)
    return store.path


def _sqlite_corrupt(
    store: EventStore, workspace: str, seq: int, edit: Callable[[bytes], bytes]
) -> None:
    with sqlite3.connect(_sqlite_path(store)) as conn:
        (body,) = conn.execute(
            "SELECT body FROM events WHERE workspace = ? AND seq = ?", (workspace, seq)
        ).fetchone()
        conn.execute(
            "UPDATE events SET body = ? WHERE workspace = ? AND seq = ?",
            (edit(bytes(body)), workspace, seq),
        )
    conn.close()


def _sqlite_delete(store: EventStore, workspace: str, seq: int) -> None:
    with sqlite3.connect(_sqlite_path(store)) as conn:
        conn.execute("DELETE FROM events WHERE workspace = ? AND seq = ?", (workspace, seq))
    conn.close()


def _sqlite_delete_hashes(store: EventStore, workspace: str) -> None:
    with sqlite3.connect(_sqlite_path(store)) as conn:
        conn.execute("DELETE FROM merkle_hashes WHERE workspace = ?", (workspace,))
    conn.close()


# -- PostgreSQL: a schema per (test, name), dropped (CASCADE) after the test ----------------

POSTGRES_DSN: Final = os.environ.get(
    "AGORA_TEST_POSTGRES", "postgresql://postgres@127.0.0.1:5432/test"
)
_T = TypeVar("_T")
_PG_SALT: Final = uuid.uuid4().hex  # no clash with schemas a crashed run left behind
_pg_probe: dict[str, str | None] = {}
_pg_schemas: set[str] = set()  # created by this test; dropped after it


def pg_run(work: Callable[[asyncpg.Connection], Awaitable[_T]]) -> _T:
    """Run ``work`` on a fresh connection in a thread of its own: callable from sync code and
    from inside a running loop (the tamper backdoors are sync)."""

    async def main() -> _T:
        conn = await asyncpg.connect(POSTGRES_DSN, timeout=5)
        try:
            return await work(conn)
        finally:
            await conn.close()

    with ThreadPoolExecutor(1) as thread:
        return thread.submit(asyncio.run, main()).result()


def postgres_unavailable() -> str | None:
    """Why PostgreSQL cannot be used here, or None (probed once per session)."""
    if "why" not in _pg_probe:
        try:
            pg_run(lambda conn: conn.fetchval("SELECT 1"))
            _pg_probe["why"] = None
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError, TimeoutError) as e:
            _pg_probe["why"] = f"cannot connect to {POSTGRES_DSN.rsplit('@', 1)[-1]}: {e}"
    return _pg_probe["why"]


def _postgres_build(tmp_path: Path, name: str) -> EventStore:
    why = postgres_unavailable()
    require("postgres", why is None, why or "")
    test = hashlib.sha256(f"{_PG_SALT}{tmp_path}".encode()).hexdigest()[:12]
    schema = f"t_{test}_{re.sub('[^a-z0-9_]', '_', name.lower())}"[:48]
    _pg_schemas.add(schema)
    return PostgresEventStore(POSTGRES_DSN, schema=schema, pool_size=4)


def _postgres_table(store: EventStore) -> str:
    assert isinstance(store, PostgresEventStore)
    return f'"{store.schema}".events'


def _postgres_corrupt(
    store: EventStore, workspace: str, seq: int, edit: Callable[[bytes], bytes]
) -> None:
    table = _postgres_table(store)

    async def work(conn: asyncpg.Connection) -> None:
        where = "WHERE workspace = $1 AND seq = $2"
        body = await conn.fetchval(f"SELECT body FROM {table} {where}", workspace, seq)
        await conn.execute(f"UPDATE {table} SET body = $3 {where}", workspace, seq, edit(body))

    pg_run(work)


def _postgres_delete(store: EventStore, workspace: str, seq: int) -> None:
    table = _postgres_table(store)
    pg_run(
        lambda conn: conn.execute(
            f"DELETE FROM {table} WHERE workspace = $1 AND seq = $2", workspace, seq
        )
    )


def _postgres_delete_hashes(store: EventStore, workspace: str) -> None:
    assert isinstance(store, PostgresEventStore)
    table = f'"{store.schema}".merkle_hashes'
    pg_run(lambda conn: conn.execute(f"DELETE FROM {table} WHERE workspace = $1", workspace))


@pytest.fixture(autouse=True)
def _drop_postgres_schemas() -> Iterator[None]:
    """After each test (and after its stores closed), drop the schemas it created."""
    yield
    if not _pg_schemas:
        return
    names = sorted(_pg_schemas)
    _pg_schemas.clear()

    async def drop(conn: asyncpg.Connection) -> None:
        for schema in names:
            await conn.execute(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')

    pg_run(drop)


STORE_KINDS: dict[str, StoreKind] = {
    "sqlite": StoreKind(_sqlite_build, _sqlite_corrupt, _sqlite_delete, _sqlite_delete_hashes),
    "postgres": StoreKind(
        _postgres_build, _postgres_corrupt, _postgres_delete, _postgres_delete_hashes
    ),
}


@pytest.fixture(params=sorted(STORE_KINDS))
def store_kind(request: pytest.FixtureRequest) -> StoreKind:
    kind: StoreKind = STORE_KINDS[request.param]
    return kind


@pytest.fixture
def make_store(store_kind: StoreKind, tmp_path: Path) -> Callable[[str], EventStore]:
    """``make_store(name)``: an unopened store of this kind over storage ``name``."""

    def make(name: str = "main") -> EventStore:
        return store_kind.build(tmp_path, name)

    return make


@pytest.fixture
async def store(make_store: Callable[[str], EventStore]) -> AsyncIterator[EventStore]:
    """An open, empty store; closed after the test."""
    async with make_store("main") as s:
        yield s
