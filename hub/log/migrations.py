"""The PostgreSQL schema of the event store, as an ordered list of versioned migrations.

Each :class:`Migration` has a version (1, 2, 3, … with no gaps), a description and SQL
statements in which ``{schema}`` stands for the quoted schema name. The schema records what it
holds in ``schema_version`` (one row per applied migration). :func:`migrate` applies the missing
ones in one transaction under an advisory lock, so two hub nodes starting together never both
apply a migration; :func:`check_version` refuses a schema newer than this code knows.

A new migration is appended to :data:`MIGRATIONS`; a published one is never edited (a database
that already applied it would never see the change). docs/operations.md, "PostgreSQL", lists
the versions.
"""

from __future__ import annotations

import re
from typing import Final, TypeAlias

import asyncpg
import asyncpg.pool
import msgspec

from hub.core.errors import BadRequest, Unavailable

SCHEMA_RE: Final = re.compile(r"[a-z_][a-z0-9_]{0,47}")
"""Schema names the store accepts: a plain lower-case SQL identifier that needs no quoting, at
most 48 characters so that the NOTIFY channel ``<schema>_events`` fits PostgreSQL's 63."""


Conn: TypeAlias = (
    "asyncpg.Connection[asyncpg.Record] | asyncpg.pool.PoolConnectionProxy[asyncpg.Record]"
)
"""A connection, direct or borrowed from a pool."""


class Migration(msgspec.Struct, frozen=True):
    version: int
    description: str
    statements: tuple[str, ...]


MIGRATIONS: Final[tuple[Migration, ...]] = (
    Migration(
        1,
        "events, heads, blobs, snapshots",
        (
            # The log. ``position`` was assigned from max(position) + 1 under a table lock
            # until migration 10 (a sequence since: see hub.log.postgres, "Ordering").
            """
            CREATE TABLE {schema}.events (
                position  BIGINT PRIMARY KEY,
                workspace TEXT   NOT NULL,
                seq       BIGINT NOT NULL CHECK (seq > 0),
                id        TEXT   NOT NULL,
                kind      TEXT   NOT NULL,
                timestamp BIGINT NOT NULL,
                hash      TEXT   NOT NULL,
                body      BYTEA  NOT NULL,
                CONSTRAINT events_workspace_seq UNIQUE (workspace, seq),
                CONSTRAINT events_workspace_id UNIQUE (workspace, id)
            )
            """,
            # The end of each workspace's log, written in the same transaction as its events
            # (an index: it can be rebuilt from ``events``).
            """
            CREATE TABLE {schema}.heads (
                workspace TEXT   PRIMARY KEY,
                seq       BIGINT NOT NULL,
                hash      TEXT   NOT NULL,
                timestamp BIGINT NOT NULL,
                position  BIGINT NOT NULL
            )
            """,
            """
            CREATE TABLE {schema}.blobs (
                sha256 TEXT  PRIMARY KEY,
                data   BYTEA NOT NULL
            )
            """,
            """
            CREATE TABLE {schema}.snapshots (
                workspace TEXT    NOT NULL,
                name      TEXT    NOT NULL,
                version   INTEGER NOT NULL,
                seq       BIGINT  NOT NULL,
                body      BYTEA   NOT NULL,
                PRIMARY KEY (workspace, name, version, seq)
            )
            """,
        ),
    ),
    Migration(
        2,
        "nodes (heartbeats of the hub nodes sharing the log); index of execution lifecycles",
        (
            # One row per hub process that ever ran on this schema (hub.cluster.heartbeat).
            # Times are the database's (now()), so nodes' clocks never have to agree.
            """
            CREATE TABLE {schema}.nodes (
                node_id         TEXT        PRIMARY KEY,
                started_at      TIMESTAMPTZ NOT NULL DEFAULT now(),
                last_beat       TIMESTAMPTZ NOT NULL DEFAULT now(),
                stopped_at      TIMESTAMPTZ,
                reaped_by       TEXT,
                reap_claimed_at TIMESTAMPTZ,
                reaped_at       TIMESTAMPTZ
            )
            """,
            # Finding the executions a dead node left open reads only these rows.
            """
            CREATE INDEX events_exec_lifecycle ON {schema}.events (workspace, seq)
            WHERE kind IN ('execStarted', 'execFinished')
            """,
        ),
    ),
    Migration(
        3,
        "merkle_hashes (each workspace's Merkle tree), checkpoints (signed tree heads)",
        (
            # The stored hashes of each workspace's Merkle tree (hub.core.merkle's dense
            # sequence), in runs: ``hash`` holds consecutive stored hashes from index ``idx``
            # on, 32 bytes each (hub.log.writer.HashRow). Derived from the events and
            # written in the same transaction; a workspace written before this migration
            # gets its hashes built from its events at its next append or checkpoint.
            """
            CREATE TABLE {schema}.merkle_hashes (
                workspace TEXT   NOT NULL,
                idx       BIGINT NOT NULL,
                hash      BYTEA  NOT NULL,
                PRIMARY KEY (workspace, idx)
            )
            """,
            # Signed checkpoints (hub.core.checkpoint) and the cosignature lines witnesses
            # handed back.
            """
            CREATE TABLE {schema}.checkpoints (
                workspace    TEXT   NOT NULL,
                size         BIGINT NOT NULL,
                note         TEXT   NOT NULL,
                cosignatures TEXT   NOT NULL DEFAULT '',
                PRIMARY KEY (workspace, size)
            )
            """,
        ),
    ),
    Migration(
        4,
        "chunked blobs (blob_parts), uploads in progress (blob_uploads); blobs.size/stored_at",
        (
            # A blob uploaded in chunks (the wire's putBlob) is kept as its chunks, so neither
            # the hub nor the database ever handles it whole; ``blobs`` keeps one row per blob
            # (``data`` empty and ``chunked`` true for those), the one list gc and verify read.
            """
            ALTER TABLE {schema}.blobs
                ADD COLUMN size      BIGINT,
                ADD COLUMN chunked   BOOLEAN     NOT NULL DEFAULT false,
                ADD COLUMN stored_at TIMESTAMPTZ NOT NULL DEFAULT now()
            """,
            """
            CREATE TABLE {schema}.blob_parts (
                sha256 TEXT   NOT NULL,
                off    BIGINT NOT NULL,
                data   BYTEA  NOT NULL,
                PRIMARY KEY (sha256, off)
            )
            """,
            # Chunks of uploads not yet committed, by the (sha256, size) the client announced.
            """
            CREATE TABLE {schema}.blob_uploads (
                sha256     TEXT        NOT NULL,
                size       BIGINT      NOT NULL,
                off        BIGINT      NOT NULL,
                data       BYTEA       NOT NULL,
                written_at TIMESTAMPTZ NOT NULL DEFAULT now(),
                PRIMARY KEY (sha256, size, off)
            )
            """,
        ),
    ),
    Migration(
        5,
        "uploads per uploader (blob_uploads.uploader); blob_grants",
        (
            # One agent's chunks never land in another's upload of the same (sha256, size).
            "ALTER TABLE {schema}.blob_uploads ADD COLUMN uploader TEXT NOT NULL DEFAULT ''",
            "ALTER TABLE {schema}.blob_uploads DROP CONSTRAINT blob_uploads_pkey",
            "ALTER TABLE {schema}.blob_uploads ADD PRIMARY KEY (uploader, sha256, size, off)",
            # Which workspace may reference a blob it does not reference yet (its quota pays).
            """
            CREATE TABLE {schema}.blob_grants (
                workspace  TEXT        NOT NULL,
                sha256     TEXT        NOT NULL,
                size       BIGINT      NOT NULL,
                agent      TEXT        NOT NULL,
                granted_at TIMESTAMPTZ NOT NULL DEFAULT now(),
                PRIMARY KEY (workspace, sha256)
            )
            """,
        ),
    ),
    Migration(
        6,
        "blob_intents (a publish's blobs until its event is committed: the orphan sweep)",
        (
            # ``stamp``: microseconds since the epoch, the hub's clock when it was written and
            # the stored_at of a blob created for it (see hub.log.base.BlobIntent).
            """
            CREATE TABLE {schema}.blob_intents (
                workspace TEXT   NOT NULL,
                event_id  TEXT   NOT NULL,
                sha256    TEXT   NOT NULL,
                size      BIGINT NOT NULL,
                stamp     BIGINT NOT NULL,
                PRIMARY KEY (workspace, event_id, sha256)
            )
            """,
        ),
    ),
    Migration(
        7,
        "blob_intents.written_at (the orphan sweep's grace on the database's clock)",
        (
            # ``stamp`` is the writing node's clock; nodes' clocks may disagree by more than
            # the grace, so an intent's age is read from the one clock they share.
            """
            ALTER TABLE {schema}.blob_intents
                ADD COLUMN written_at TIMESTAMPTZ NOT NULL DEFAULT clock_timestamp()
            """,
        ),
    ),
    Migration(
        8,
        "index of presence events (a dead node's members, hub.cluster.members)",
        (
            # The survivor that reaps a dead node reads only these rows to find the members
            # present through it, instead of every event of the log.
            """
            CREATE INDEX events_presence ON {schema}.events (workspace, seq)
            WHERE kind IN ('memberJoined', 'memberLeft')
            """,
        ),
    ),
    Migration(
        9,
        "index of execution lifecycles extended to execRequested (a dead node's requests)",
        (
            # execRequested names the node that accepted it (payload.node): the survivor also
            # closes what the dead node accepted and never started (hub.cluster.interrupted),
            # so it reads those rows too. Migration 2's index, rebuilt under the same name.
            "DROP INDEX IF EXISTS {schema}.events_exec_lifecycle",
            """
            CREATE INDEX events_exec_lifecycle ON {schema}.events (workspace, seq)
            WHERE kind IN ('execRequested', 'execStarted', 'execFinished')
            """,
        ),
    ),
    Migration(
        10,
        "positions from a sequence, events.tx: writers of different workspaces in parallel",
        (
            # The writing transaction of each event (NULL for the events written before this
            # migration, all committed): read_all's horizon (hub.log.postgres, "Ordering").
            # Nullable then defaulted, so the table is not rewritten.
            "ALTER TABLE {schema}.events ADD COLUMN tx xid8",
            "ALTER TABLE {schema}.events ALTER COLUMN tx SET DEFAULT pg_current_xact_id()",
            "CREATE SEQUENCE {schema}.positions AS BIGINT MINVALUE 1",
            """
            SELECT setval('{schema}.positions',
                          COALESCE((SELECT max(position) FROM {schema}.events), 0) + 1, false)
            """,
            # A batch's block of n positions from the sequence ``positions``, taken with the
            # transaction's id under a lock held for these statements only (a session lock,
            # let go before COMMIT): so the order of the writing transactions' ids is the
            # order of their blocks, which is what read_all's horizon needs. The id must be
            # the transaction's first (it wrote nothing before): else refused, as a bug. The
            # sequence is the caller's argument, not a name written here, so a schema
            # restored under another name keeps working. ``above``: the last position stored
            # (read by the caller after its ROW EXCLUSIVE lock): the block starts past it,
            # so a node of an older version, assigning max(position) + 1 under its EXCLUSIVE
            # lock, never takes positions of the sequence's, nor the reverse.
            """
            CREATE FUNCTION {schema}.take_positions(n BIGINT, positions REGCLASS, above BIGINT)
            RETURNS BIGINT LANGUAGE plpgsql AS $$
            DECLARE
                key CONSTANT BIGINT := positions::oid::bigint;  -- (its name depends on search_path)
                first BIGINT;
            BEGIN
                IF pg_current_xact_id_if_assigned() IS NOT NULL THEN
                    RAISE EXCEPTION 'take_positions: this transaction wrote before it'
                        USING ERRCODE = 'object_not_in_prerequisite_state';
                END IF;
                PERFORM pg_advisory_lock(key);
                BEGIN
                    PERFORM pg_current_xact_id();
                    first := greatest(nextval(positions), above + 1);
                    IF n > 1 OR first > currval(positions) THEN
                        PERFORM setval(positions, first + n - 1);
                    END IF;
                EXCEPTION WHEN OTHERS OR query_canceled THEN  -- (OTHERS leaves out a cancel)
                    PERFORM pg_advisory_unlock(key);
                    RAISE;
                END;
                PERFORM pg_advisory_unlock(key);
                RETURN first;
            END
            $$
            """,
        ),
    ),
    Migration(
        11,
        "nodes.url: where the other nodes reach a node ([cluster] owners)",
        (
            # The WebSocket URL a node serves on, as the other nodes reach it: with
            # ``[cluster] owners`` a node relays a workspace's frames to its owner there.
            # NULL: not reachable (not serving yet, or a node of an older version).
            "ALTER TABLE {schema}.nodes ADD COLUMN url TEXT",
        ),
    ),
)

LATEST: Final = MIGRATIONS[-1].version


class SchemaVersionError(Unavailable):
    """The database schema is not the version this code runs on: newer than it knows (a newer
    hub migrated it), or older while the store was opened with ``migrate=False``.
    ``details``: ``schema``, ``found``, ``supported``."""


def validate_schema(schema: str) -> str:
    """Return ``schema`` if it is an acceptable schema name, else raise :class:`BadRequest`."""
    if not isinstance(schema, str) or not SCHEMA_RE.fullmatch(schema):
        raise BadRequest(
            f"invalid PostgreSQL schema name {schema!r}: use 1-48 of [a-z0-9_], "
            "not starting with a digit",
            field="schema",
        )
    return schema


def quote(schema: str) -> str:
    """The schema as a quoted SQL identifier (validated first, so quoting is all it needs)."""
    return f'"{validate_schema(schema)}"'


async def current_version(conn: Conn, schema: str) -> int:
    """The schema's version: 0 when the schema or its ``schema_version`` table is absent."""
    q = quote(schema)
    exists = await conn.fetchval("SELECT to_regclass($1) IS NOT NULL", f"{q}.schema_version")
    if not exists:
        return 0
    version = await conn.fetchval(f"SELECT max(version) FROM {q}.schema_version")
    return int(version or 0)


def _too_new(schema: str, found: int) -> SchemaVersionError:
    return SchemaVersionError(
        f"PostgreSQL schema {schema!r} is at version {found}, newer than this hub knows "
        f"({LATEST}); upgrade the hub",
        schema=schema,
        found=found,
        supported=LATEST,
    )


async def check_version(conn: Conn, schema: str) -> int:
    """The schema's version, if exactly :data:`LATEST`. Raises :class:`SchemaVersionError`
    when it is newer, or older (then ``agora db migrate`` brings it up to date)."""
    found = await current_version(conn, schema)
    if found > LATEST:
        raise _too_new(schema, found)
    if found < LATEST:
        raise SchemaVersionError(
            f"PostgreSQL schema {schema!r} is at version {found}, this hub needs {LATEST}; "
            "run `agora db migrate --store postgresql://…`",
            schema=schema,
            found=found,
            supported=LATEST,
        )
    return found


async def migrate(conn: Conn, schema: str) -> tuple[int, int]:
    """Bring ``schema`` (created if absent) up to :data:`LATEST`; return (before, after).

    Idempotent. Runs in one transaction holding a transaction-scoped advisory lock keyed by the
    schema name, so concurrent callers (several nodes starting at once) apply each migration
    exactly once. Raises :class:`SchemaVersionError` if the schema is newer than this code,
    and what asyncpg raises on a database error.
    """
    q = quote(schema)
    async with conn.transaction():
        await conn.execute(
            "SELECT pg_advisory_xact_lock(hashtextextended($1, 0))", f"agora.migrate:{schema}"
        )
        await conn.execute(f"CREATE SCHEMA IF NOT EXISTS {q}")
        await conn.execute(
            f"""
            CREATE TABLE IF NOT EXISTS {q}.schema_version (
                version     INTEGER     PRIMARY KEY,
                description TEXT        NOT NULL,
                applied_at  TIMESTAMPTZ NOT NULL DEFAULT now()
            )
            """
        )
        before = await current_version(conn, schema)
        if before > LATEST:
            raise _too_new(schema, before)
        for m in MIGRATIONS:
            if m.version <= before:
                continue
            for statement in m.statements:
                await conn.execute(statement.format(schema=q))
            await conn.execute(
                f"INSERT INTO {q}.schema_version (version, description) VALUES ($1, $2)",
                m.version,
                m.description,
            )
    return before, LATEST


def _check_migrations(migrations: tuple[Migration, ...]) -> None:
    for i, m in enumerate(migrations, start=1):
        if m.version != i:
            raise AssertionError(f"migration versions must be 1, 2, …: got {m.version} at {i}")


_check_migrations(MIGRATIONS)

__all__ = [
    "LATEST",
    "MIGRATIONS",
    "Conn",
    "Migration",
    "SchemaVersionError",
    "check_version",
    "current_version",
    "migrate",
    "quote",
    "validate_schema",
]
