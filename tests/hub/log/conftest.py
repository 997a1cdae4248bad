"""Fixtures of the log store tests: every store kind behind the same ``EventStore`` interface.

``STORE_KINDS`` maps a kind to a :class:`StoreKind`: how to build a store over some named,
initially empty storage, and a backdoor to damage stored rows (for the tamper tests, which
must bypass the interface; :class:`tests.hub.log.stores.StoreKind`). PostgreSQL
(:mod:`tests.support.postgres`) is one entry whose ``build`` starts with
:func:`~tests.support.postgres.need_postgres` so the kind skips (or fails in CI) where no server
runs; each (test, name) gets its own schema, dropped after the test.
"""

from __future__ import annotations

import hashlib
import re
import sqlite3
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Final

import asyncpg
import pytest

from hub.log.base import EventStore
from hub.log.postgres import PostgresEventStore
from hub.log.sqlite import SqliteEventStore
from tests.hub.log.stores import StoreKind
from tests.support.postgres import POSTGRES_DSN, drop_schemas, need_postgres, pg_run


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


# -- PostgreSQL: a schema per (test, name), dropped (CASCADE) after the test ----------------

_PG_SALT: Final = uuid.uuid4().hex  # no clash with schemas a crashed run left behind
_pg_schemas: set[str] = set()  # created by this test; dropped after it


def _postgres_build(tmp_path: Path, name: str) -> EventStore:
    need_postgres()
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


@pytest.fixture(autouse=True)
def _drop_postgres_schemas() -> Iterator[None]:
    """After each test (and after its stores closed), drop the schemas it created."""
    yield
    if not _pg_schemas:
        return
    names = sorted(_pg_schemas)
    _pg_schemas.clear()
    drop_schemas(names)


STORE_KINDS: dict[str, StoreKind] = {
    "sqlite": StoreKind(_sqlite_build, _sqlite_corrupt, _sqlite_delete),
    "postgres": StoreKind(_postgres_build, _postgres_corrupt, _postgres_delete),
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
