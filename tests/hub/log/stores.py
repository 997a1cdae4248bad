"""The store kinds the log tests run on, each behind the same ``EventStore`` interface.

:data:`STORE_KINDS` maps a kind to a :class:`StoreKind`: how to build a store over some named,
initially empty storage, a backdoor to damage stored rows (for the tamper tests, which must
bypass the interface), and what to remove after a test. PostgreSQL (:mod:`tests.support.postgres`)
is one entry whose ``build`` starts with :func:`~tests.support.postgres.need_postgres`, so the
kind skips (or fails in CI) where no server runs; each (test, name) gets its own schema, dropped
after the test (the ``store_kind`` fixture calls ``cleanup``).
"""

from __future__ import annotations

import asyncio
import hashlib
import re
import shutil
import sqlite3
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import asyncpg

from hub.core.events import Event
from hub.log.base import EventStore
from hub.log.handoff import HandoffServer, HandoffStore
from hub.log.postgres import PostgresEventStore
from hub.log.sqlite import SqliteEventStore
from tests.support.postgres import (
    POSTGRES_DSN,
    drop_schemas,
    need_postgres,
    pg_run,
    postgres_unavailable,
)


@dataclass(frozen=True)
class StoreKind:
    """``build(tmp_path, name)``: an unopened store over storage ``name`` (same name, same
    data). ``corrupt_body``/``delete_row``: edit the stored event ``(workspace, seq)``
    directly, behind the store's back."""

    build: Callable[[Path, str], EventStore]
    corrupt_body: Callable[[EventStore, str, int, Callable[[bytes], bytes]], None]
    delete_row: Callable[[EventStore, str, int], None]
    cleanup: Callable[[Path], None]
    """``cleanup(tmp_path)``: remove what the test's stores left outside ``tmp_path``."""
    delete_hashes: Callable[[EventStore, str], None]
    """Drop a workspace's stored Merkle hashes (as a log written before the tree existed)."""


def _sqlite_build(tmp_path: Path, name: str) -> EventStore:
    return SqliteEventStore(tmp_path / f"{name}.db", blobs_dir=tmp_path / f"{name}-blobs")


class ServedHandoffStore(HandoffStore):
    """A :class:`HandoffStore` that brings its own writer: opening it opens a
    :class:`SqliteEventStore` of the same file and a :class:`HandoffServer` over it, in this
    process, on a unix socket of its own (``agora serve --workers`` has them in the
    supervisor); closing it closes them after it. Every write crosses the real socket."""

    def __init__(self, path: Path, *, blobs_dir: Path) -> None:
        # A short directory of its own: a unix socket's path must fit in 107 bytes.
        self.socket_dir = Path(tempfile.mkdtemp(prefix="agora-handoff-"))
        super().__init__(path, socket=self.socket_dir / "writer.sock", blobs_dir=blobs_dir)
        self.writer = SqliteEventStore(path, blobs_dir=blobs_dir)
        self.server: HandoffServer | None = None

    async def _open(self) -> None:
        await self.writer.open()
        self.server = HandoffServer(self.writer, self.socket)
        await self.server.__aenter__()
        await super()._open()

    async def _release(self) -> None:
        await super()._release()
        if self.server is not None:
            await self.server.__aexit__(None, None, None)
            self.server = None
        await self.writer.close()
        shutil.rmtree(self.socket_dir, ignore_errors=True)


def _handoff_build(tmp_path: Path, name: str) -> EventStore:
    return ServedHandoffStore(tmp_path / f"{name}.db", blobs_dir=tmp_path / f"{name}-blobs")


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


def _schema_prefix(tmp_path: Path) -> str:
    """What the names of one test's schemas start with (its ``tmp_path`` is its own)."""
    return f"t_{hashlib.sha256(f'{_PG_SALT}{tmp_path}'.encode()).hexdigest()[:12]}_"


def _postgres_build(tmp_path: Path, name: str) -> EventStore:
    need_postgres()
    schema = f"{_schema_prefix(tmp_path)}{re.sub('[^a-z0-9_]', '_', name.lower())}"[:48]
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


def _postgres_cleanup(tmp_path: Path) -> None:
    if postgres_unavailable() is not None:
        return  # the test was skipped before it made a store

    async def names(conn: asyncpg.Connection) -> list[str]:
        query = "SELECT schema_name FROM information_schema.schemata"
        rows = await conn.fetch(
            f"{query} WHERE starts_with(schema_name, $1)", _schema_prefix(tmp_path)
        )
        return [row["schema_name"] for row in rows]

    drop_schemas(pg_run(names))


def _sqlite_delete_hashes(store: EventStore, workspace: str) -> None:
    with sqlite3.connect(_sqlite_path(store)) as conn:
        conn.execute("UPDATE events SET tree = NULL WHERE workspace = ?", (workspace,))
    conn.close()


def _no_cleanup(tmp_path: Path) -> None:
    """SQLite files live in ``tmp_path``, which pytest removes."""


STORE_KINDS: Final[dict[str, StoreKind]] = {
    "sqlite": StoreKind(
        _sqlite_build, _sqlite_corrupt, _sqlite_delete, _no_cleanup, _sqlite_delete_hashes
    ),
    "sqlite-handoff": StoreKind(
        _handoff_build, _sqlite_corrupt, _sqlite_delete, _no_cleanup, _sqlite_delete_hashes
    ),
    "postgres": StoreKind(
        _postgres_build,
        _postgres_corrupt,
        _postgres_delete,
        _postgres_cleanup,
        _postgres_delete_hashes,
    ),
}


async def read_all_from(
    store: EventStore, count: int, *, after: int = 0, page: int = 1000, within: float = 10.0
) -> list[Event]:
    """``count`` events of ``read_all`` past position ``after``, read ``page`` at a time. On
    PostgreSQL a short page is not the end of the log: read_all stops at its horizon while an
    older transaction of the database runs (autovacuum's included), so this reads on until
    ``count`` events came or ``within`` seconds passed (then returns what came, for the
    test's assertion to show)."""
    out: list[Event] = []
    deadline = time.monotonic() + within
    while len(out) < count:
        batch = await store.read_all(after_position=after, limit=min(page, count - len(out)))
        out.extend(batch)
        if batch:
            after = batch[-1].position
        elif time.monotonic() > deadline:
            break
        else:
            await asyncio.sleep(0.01)
    return out
