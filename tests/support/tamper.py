"""What someone holding a hub's database can do to it, for the audit tests (issue #13).

A :class:`Backdoor` is direct access to the rows of one hub's store (the SQLite file of a data
directory, or a PostgreSQL schema): it reads the stored events and rewrites a workspace's log
with the whole chain re-hashed by the hub's own code (so ``agora verify`` alone says ``ok``).
``rewrite`` also deletes the stored Merkle hashes (SQLite: each event row's ``tree``;
PostgreSQL: the ``merkle_hashes`` table) and the kept checkpoints, as a careful
attacker would so that the hub, restarted, rebuilds them and signs the forged history.
:meth:`Backdoor.copy` copies all of a hub's data (two hubs started on copies of one data
directory, with the same key: a fork).
"""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import asyncpg
import msgspec

from hub.core.chain import compute_hash
from hub.core.events import Event, MessagePosted, decode_event, encode_event
from hub.log.migrations import MIGRATIONS, quote
from tests.support.postgres import new_schema, pg_run, url_for


def _take_positions_sql() -> str:
    """Migration 10's ``CREATE FUNCTION … take_positions`` statement."""
    [statement] = [
        s for m in MIGRATIONS for s in m.statements if "FUNCTION {schema}.take_positions" in s
    ]
    return statement


class Backdoor:
    """Direct access to the store of the hub whose data directory is ``data`` (and, for
    PostgreSQL, whose schema is ``schema``)."""

    def __init__(self, data: Path, schema: str | None = None) -> None:
        self.data = data
        self.schema = schema

    def serve_args(self) -> list[str]:
        """``agora serve`` arguments that select this store (the data directory is the
        launcher's)."""
        return ["--store", url_for(self.schema)] if self.schema is not None else []

    def copy(self, data: Path) -> Backdoor:
        """A copy of all of this hub's data (the key included) at ``data``."""
        shutil.copytree(self.data, data)
        if self.schema is None:
            return Backdoor(data)
        src, dst = self.schema, new_schema("t_fork")

        async def clone(c: asyncpg.Connection) -> None:
            await c.execute(f'CREATE SCHEMA "{dst}"')
            tables = await c.fetch("SELECT tablename FROM pg_tables WHERE schemaname = $1", src)
            for (table,) in tables:
                await c.execute(
                    f'CREATE TABLE "{dst}"."{table}" (LIKE "{src}"."{table}" INCLUDING ALL)'
                )
                await c.execute(f'INSERT INTO "{dst}"."{table}" SELECT * FROM "{src}"."{table}"')
            # And what is not a table: the positions sequence where the source's stands, and
            # the function taking blocks from it (migration 10's own text).
            await c.execute(f'CREATE SEQUENCE "{dst}".positions AS BIGINT MINVALUE 1')
            await c.execute(
                f"""SELECT setval('"{dst}".positions', last_value, is_called) """
                f'FROM "{src}".positions'
            )
            await c.execute(_take_positions_sql().format(schema=quote(dst)))

        pg_run(clone)
        return Backdoor(data, dst)

    def events(self, workspace: str) -> list[tuple[int, Event]]:
        """(position, event) of every stored event, in seq order."""
        if self.schema is None:
            with sqlite3.connect(self.data / "agora.db") as conn:
                rows = conn.execute(
                    "SELECT position, body FROM events WHERE workspace = ? ORDER BY seq",
                    (workspace,),
                ).fetchall()
            conn.close()
        else:
            rows = pg_run(
                lambda c: c.fetch(
                    f'SELECT position, body FROM "{self.schema}".events WHERE workspace = $1 '
                    "ORDER BY seq",
                    workspace,
                )
            )
        return [(int(p), decode_event(bytes(b))) for p, b in rows]

    def rewrite(
        self,
        workspace: str,
        events: list[Event],
        *,
        forget: tuple[str, ...] = ("merkle_hashes", "checkpoints"),
    ) -> None:
        """Replace the workspace's log by ``events``, renumbered from seq 1 with the whole
        chain re-hashed, keeping the original positions (see the module docstring); the
        workspace's rows of the derived tables ``forget`` are deleted too."""
        positions = [p for p, _ in self.events(workspace)]
        sealed: list[Event] = []
        prev = ""
        for i, event in enumerate(events):
            e = msgspec.structs.replace(
                event, seq=i + 1, prev=prev or None, position=positions[i], hash=None
            )
            e = msgspec.structs.replace(e, hash=compute_hash(e))
            sealed.append(e)
            prev = e.hash or ""
        rows = [
            (e.position, e.workspace, e.seq, e.id, e.kind, e.timestamp, e.hash, encode_event(e))
            for e in sealed
        ]
        if self.schema is None:
            with sqlite3.connect(self.data / "agora.db") as conn:
                # SQLite keeps each event's stored Merkle hashes in its row (``tree``): kept
                # by seq across the rewrite unless "merkle_hashes" is forgotten.
                trees = dict(
                    conn.execute("SELECT seq, tree FROM events WHERE workspace = ?", (workspace,))
                )
                if "merkle_hashes" in forget:
                    trees = {}
                conn.execute("DELETE FROM events WHERE workspace = ?", (workspace,))
                conn.executemany(
                    "INSERT INTO events (position, workspace, seq, id, kind, timestamp, hash, "
                    "body, tree) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    [(*row, trees.get(row[2])) for row in rows],
                )
                for table in forget:
                    if table != "merkle_hashes":
                        conn.execute(f"DELETE FROM {table} WHERE workspace = ?", (workspace,))
            conn.close()
            return
        s = f'"{self.schema}"'
        last = sealed[-1]

        async def edit(conn: asyncpg.Connection) -> None:
            async with conn.transaction():
                await conn.execute(f"DELETE FROM {s}.events WHERE workspace = $1", workspace)
                await conn.executemany(
                    f"INSERT INTO {s}.events VALUES ($1, $2, $3, $4, $5, $6, $7, $8)", rows
                )
                await conn.execute(
                    f"UPDATE {s}.heads SET seq = $2, hash = $3, position = $4 WHERE workspace = $1",
                    workspace,
                    last.seq,
                    last.hash,
                    last.position,
                )
                for table in forget:
                    await conn.execute(f"DELETE FROM {s}.{table} WHERE workspace = $1", workspace)

        pg_run(edit)


def forged(event: Event, text: str) -> Event:
    """``event`` (a ``messagePosted``) with its text replaced: a forged body."""
    assert isinstance(event, MessagePosted), event
    payload = msgspec.structs.replace(event.payload, text=text)
    return msgspec.structs.replace(event, payload=payload)
