"""PostgreSQL-only behaviour of :mod:`hub.log.postgres` (what every store shares is in
test_conformance.py, which runs on PostgreSQL too).

* the ordering race: two store instances (two hub nodes, two connection pools) append
  concurrently while a third follows ``read_all`` by position; the follower must see exactly
  the final log, never skipping an event that committed late;
* schema migrations: idempotent, concurrent-safe, refusing a newer schema, ``agora db migrate``;
* NOTIFY ``<workspace>:<seq>`` on commit, received by a LISTEN connection;
* writers of different workspaces in parallel, and read_all's horizon;
* the write lock's timeout, the URL options, the factory scheme, blobs shared between nodes.

Every test gets its own schema (random name), dropped with CASCADE afterwards. The database is
``AGORA_TEST_POSTGRES`` (default ``postgresql://postgres@127.0.0.1:5432/test``); without it the
tests skip, or fail when ``AGORA_REQUIRE`` lists ``postgres``.

Appends/s are measured by ``bench/store_bench.py``, not here.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Final

import asyncpg
import pytest

from hub.cli import main as cli_main
from hub.core.chain import seal
from hub.core.errors import BadRequest, Conflict, IntegrityError, Unavailable
from hub.core.events import Event, MessagePayload, MessagePosted, encode_event
from hub.log.factory import open_store
from hub.log.migrations import LATEST, SchemaVersionError, current_version, migrate
from hub.log.postgres import (
    BATCH_WORKSPACES_MAX,
    PostgresEventStore,
    parse_notification,
    parse_url,
    workspace_lock_key,
)
from tests.hub.log.stores import read_all_from
from tests.support.postgres import POSTGRES_DSN, pg_run, postgres_unavailable
from tests.support.require import require

DSN: Final = POSTGRES_DSN


def new_schema_name() -> str:
    return f"t_{uuid.uuid4().hex[:16]}"


def require_postgres() -> None:
    why = postgres_unavailable()
    require("postgres", why is None, why or "")


@pytest.fixture
async def schema() -> AsyncIterator[str]:
    """A fresh schema name for this test; the schema is dropped (CASCADE) afterwards."""
    require_postgres()
    name = new_schema_name()
    try:
        yield name
    finally:
        await drop_schema(name)


async def drop_schema(name: str) -> None:
    async with connection() as conn:
        await conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE')


@contextlib.asynccontextmanager
async def connection() -> AsyncIterator[asyncpg.Connection]:
    conn = await asyncpg.connect(DSN)
    try:
        yield conn
    finally:
        await conn.close()


def msg(text: str, id: str = "") -> Event:
    return MessagePosted(id=id, payload=MessagePayload(text=text))


# -- the ordering race ------------------------------------------------------------------------


async def test_two_writers_follower_never_skips(schema: str) -> None:
    """Two nodes append concurrently (their transactions overlap, not just their requests);
    a third follows by position. What it followed must be the final log, position by
    position: an event that committed late with a lower position would be skipped."""
    writers_per_node, appends_each = 8, 40
    followed: list[tuple[int, str]] = []

    async with (
        PostgresEventStore(DSN, schema=schema, batch_max=4) as a,
        PostgresEventStore(DSN, schema=schema, batch_max=4) as b,
        PostgresEventStore(DSN, schema=schema, pool_size=1) as follower,
    ):

        async def write(store: PostgresEventStore, node: str, k: int) -> None:
            for i in range(appends_each):
                batch = [msg(f"{node}{k}-{i}-{j}") for j in range(1 + (i % 3))]
                await store.append(f"ws{(k + i) % 5}", batch)

        expected_count = 2 * writers_per_node * sum(1 + (i % 3) for i in range(appends_each))

        async def follow() -> None:
            # Until it has every event: a page may come short, or empty, while any older
            # transaction of the database runs (the horizon), so an empty page is no end.
            after = 0
            while len(followed) < expected_count:
                page = await follower.read_all(after_position=after, limit=37)
                followed.extend((e.position, e.id) for e in page)
                if page:
                    after = page[-1].position
                else:
                    await asyncio.sleep(0)

        follow_task = asyncio.create_task(follow())
        try:
            async with asyncio.TaskGroup() as tg:
                for k in range(writers_per_node):
                    tg.create_task(write(a, "a", k))
                    tg.create_task(write(b, "b", k))
        finally:
            await asyncio.wait_for(follow_task, 30)

        final = await read_all_from(follower, expected_count)
        assert len(final) == expected_count
        # No request refused and no batch failed here, so no position went unused.
        assert [e.position for e in final] == list(range(1, expected_count + 1))
        assert followed == [(e.position, e.id) for e in final]
        for head in await follower.heads():
            report = await follower.verify(head.workspace)
            assert report.ok, report
            assert report.checked == head.seq


async def test_writers_of_different_workspaces_do_not_wait_for_each_other(schema: str) -> None:
    """A transaction holding workspace w's write lock (by hand, as a node in the middle of a
    batch of w) holds back the appends to w only: an append to another workspace commits
    meanwhile, and the one to w commits once that transaction ends, after what it wrote."""
    async with (
        PostgresEventStore(DSN, schema=schema) as a,
        PostgresEventStore(DSN, schema=schema) as b,
        connection() as blocker,
    ):
        await a.append("w", [msg("first")])
        async with blocker.transaction():
            await blocker.execute(
                "SELECT pg_advisory_xact_lock($1)", workspace_lock_key(schema, "w")
            )
            late = asyncio.create_task(b.append("w", [msg("waits")]))
            await asyncio.sleep(0.1)  # b's batch is waiting for the lock
            # (Another node: one node's batches go one after another.)
            other = await asyncio.wait_for(a.append("other", [msg("goes")]), 5)
            assert other.seqs == [1]
            await asyncio.sleep(0.2)
            assert not late.done()
        result = await late
        assert result.seqs == [2]
        assert result.events[0].position > other.events[0].position
        assert [e.workspace for e in await read_all_from(a, 3)] == ["w", "other", "w"]


async def insert_by_hand(conn: asyncpg.Connection, schema: str, position: int) -> None:
    """Write event ``h``, the first of workspace ``other``, at ``position``, as a writer
    outside the store would (in ``conn``'s transaction)."""
    event = seal(
        msg("by hand"),
        id="h",
        workspace="other",
        seq=1,
        position=position,
        timestamp=1,
        producer="",
        prev="",
    )
    await conn.execute(
        f'INSERT INTO "{schema}".events '
        "(position, workspace, seq, id, kind, timestamp, hash, body) "
        "VALUES ($1, 'other', 1, 'h', 'messagePosted', 1, $2, $3)",
        position,
        event.hash,
        encode_event(event),
    )


async def test_a_node_of_the_older_version_writing_meanwhile_shares_no_position(
    schema: str,
) -> None:
    """A node of the version before migration 10 still running takes the table EXCLUSIVE and
    writes max(position) + 1 (by hand here). A new node's batch waits for it (its ROW
    EXCLUSIVE lock) and takes its block past what that wrote: no position is taken twice,
    and a follower by position reads them all, in order."""
    async with (
        PostgresEventStore(DSN, schema=schema) as a,
        PostgresEventStore(DSN, schema=schema) as b,
        connection() as old,
    ):
        await a.append("w", [msg("first")])
        async with old.transaction():
            await old.execute(f'LOCK TABLE "{schema}".events IN EXCLUSIVE MODE')
            late = asyncio.create_task(b.append("w", [msg("waits")]))
            await asyncio.sleep(0.2)
            assert not late.done()
            position = await old.fetchval(f'SELECT max(position) + 1 FROM "{schema}".events')
            await insert_by_hand(old, schema, position)
        result = await late
        assert result.events[0].position > position
        assert [e.id for e in await read_all_from(a, 3)][1:] == ["h", *result.ids]


async def test_read_all_stops_below_a_block_still_being_written(schema: str) -> None:
    """The horizon: a transaction took a block of positions (as a node's batch does) and
    has not committed; an append after it commits with a higher position. read_all shows
    nothing from that block on until the transaction ends, so a follower by position never
    passes the block's event and never skips it: it then reads both, in position order."""
    async with PostgresEventStore(DSN, schema=schema) as store, connection() as slow:
        first = await store.append("w", [msg("first")])
        async with slow.transaction():
            block = await slow.fetchval(
                f'SELECT "{schema}".take_positions(1, \'"{schema}".positions\', 0)'
            )
            after = await store.append("x", [msg("commits first")])
            assert after.events[0].position > block > first.events[0].position
            assert [e.id for e in await read_all_from(store, 1)] == first.ids
            assert await store.read_all(after_position=first.events[0].position) == []
            await insert_by_hand(slow, schema, block)
        followed = await read_all_from(store, 2, after=first.events[0].position)
        assert [e.id for e in followed] == ["h", *after.ids]


async def test_positions_are_refused_to_a_transaction_that_wrote_first(schema: str) -> None:
    """The horizon needs a writer's transaction id to be taken with its block: one that
    already has an id (it wrote before) is refused, not given a block out of order."""
    async with PostgresEventStore(DSN, schema=schema) as store, connection() as conn:
        await store.append("w", [msg("first")])
        take = f"""SELECT "{schema}".take_positions(1, '"{schema}".positions', 0)"""
        async with conn.transaction():
            await conn.fetchval(take)  # the first id of its transaction: given
        with pytest.raises(asyncpg.ObjectNotInPrerequisiteStateError):
            async with conn.transaction():
                await conn.execute("SELECT pg_current_xact_id()")  # as a write would
                await conn.fetchval(take)
        assert (
            await conn.fetchval(
                "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' "
                "AND pid = pg_backend_pid()"
            )
            == 0
        )


async def test_events_restored_from_another_cluster_are_read(schema: str) -> None:
    """A restore (pg_dump, replication) brings each event's tx from the cluster it was
    written on, perhaps far past this one's transaction ids: read_all still returns them (a
    visible event with a tx past the snapshot's xmax cannot be this cluster's, so it was
    committed), and the events written after them."""
    async with (
        PostgresEventStore(DSN, schema=schema) as store,
        connection() as conn,
        connection() as running,
    ):
        await store.append("w", [msg("one"), msg("two")])
        await conn.execute(
            f'UPDATE "{schema}".events SET tx = (pg_current_xact_id()::text::bigint '
            "+ 10000000)::text::xid8"
        )
        async with running.transaction():
            await running.execute("SELECT pg_current_xact_id()")  # an older transaction runs
            later = await store.append("w", [msg("three")])
            # The restored events are read; the one written after the running transaction
            # began waits for it (the horizon).
            assert [e.seq for e in await store.read_all()] == [1, 2]
        got = await read_all_from(store, 3)
        assert [e.seq for e in got] == [1, 2, 3]
        assert got[-1] == later.events[0]


async def test_a_batch_writes_at_most_64_workspaces(schema: str) -> None:
    """Each workspace of a batch takes a lock from PostgreSQL's server-wide lock table, so a
    batch names at most BATCH_WORKSPACES_MAX of them: 150 appends to 150 workspaces queued at
    once go in three transactions or more, every one written."""
    sizes: list[int] = []
    async with PostgresEventStore(DSN, schema=schema) as store:
        store.observe_commits(lambda requests, seconds, failed: sizes.append(requests))
        results = await asyncio.gather(*(store.append(f"w{i}", [msg(str(i))]) for i in range(150)))
        assert [r.seqs for r in results] == [[1]] * 150
        assert len(await store.heads()) == 150
    assert BATCH_WORKSPACES_MAX == 64
    assert max(sizes) <= 64 and sum(sizes) == 150 and len(sizes) >= 3


async def test_lock_timeout_is_unavailable(schema: str) -> None:
    async with (
        PostgresEventStore(DSN, schema=schema, lock_timeout=0.2) as store,
        connection() as blocker,
    ):
        await store.append("w", [msg("one")])
        async with blocker.transaction():
            await blocker.execute(f'LOCK TABLE "{schema}".events IN EXCLUSIVE MODE')
            with pytest.raises(Unavailable) as info:
                await store.append("w", [msg("blocked")])
            assert info.value.details.get("sqlstate") == "55P03"
        result = await store.append("w", [msg("two")])
        assert result.seqs == [2]


async def test_the_writer_opens_a_new_connection_after_losing_its_own(schema: str) -> None:
    """The writer keeps a connection of its own across batches. Killed by the server between
    two batches (an operator's pg_terminate_backend, a server restart), it is found lost
    when the next batch begins, before anything of the batch was sent: that batch is written
    on a new connection, once, with no error and no duplicate."""
    async with PostgresEventStore(DSN, schema=schema) as store, connection() as admin:
        await store.append("w", [msg("one")])
        writer = store._writer  # (the one way to find it among the test database's backends)
        assert writer is not None
        pid = writer.get_server_pid()
        assert await admin.fetchval("SELECT pg_terminate_backend($1)", pid)
        result = await store.append("w", [msg("two")])
        assert result.seqs == [2]
        assert [e.seq for e in await read_all_from(store, 2)] == [1, 2]
        replaced = store._writer
        assert replaced is not None and replaced.get_server_pid() != pid
        await store.append("w", [msg("three")])
        assert store._writer is replaced  # kept across batches again


# -- migrations -------------------------------------------------------------------------------


async def test_migrations_are_idempotent(schema: str) -> None:
    async with connection() as conn:
        assert await current_version(conn, schema) == 0
        assert await migrate(conn, schema) == (0, LATEST)
        assert await migrate(conn, schema) == (LATEST, LATEST)
        rows = await conn.fetch(f'SELECT version FROM "{schema}".schema_version ORDER BY 1')
        assert [r["version"] for r in rows] == list(range(1, LATEST + 1))
    # Opening an up-to-date schema changes nothing, with or without migrate.
    async with PostgresEventStore(DSN, schema=schema) as store:
        await store.append("w", [msg("x")])
    async with PostgresEventStore(DSN, schema=schema, migrate=False) as store:
        assert (await store.head("w")) is not None


async def test_concurrent_migrations_apply_once(schema: str) -> None:
    async def one() -> tuple[int, int]:
        async with connection() as conn:
            return await migrate(conn, schema)

    results = await asyncio.gather(*(one() for _ in range(4)))
    assert sorted(results) == [(0, LATEST)] + [(LATEST, LATEST)] * 3
    async with connection() as conn:
        count = await conn.fetchval(f'SELECT count(*) FROM "{schema}".schema_version')
        assert count == LATEST


async def test_open_refuses_newer_schema(schema: str) -> None:
    async with connection() as conn:
        await migrate(conn, schema)
        await conn.execute(
            f"INSERT INTO \"{schema}\".schema_version (version, description) VALUES ($1, 'x')",
            LATEST + 1,
        )
    store = PostgresEventStore(DSN, schema=schema)
    with pytest.raises(SchemaVersionError) as info:
        await store.open()
    assert info.value.details == {"schema": schema, "found": LATEST + 1, "supported": LATEST}
    assert "newer" in info.value.message
    with pytest.raises(Unavailable):  # nothing was left open
        await store.append("w", [msg("x")])
    await store.close()
    with pytest.raises(SchemaVersionError):
        await PostgresEventStore(DSN, schema=schema).migrate_schema()


async def test_open_without_migrate_refuses_old_schema(schema: str) -> None:
    store = PostgresEventStore(DSN, schema=schema, migrate=False)
    with pytest.raises(SchemaVersionError) as info:
        await store.open()
    assert "agora db migrate" in info.value.message
    assert info.value.details["found"] == 0


def test_db_migrate_command(capsys: pytest.CaptureFixture[str]) -> None:
    require_postgres()
    name = new_schema_name()
    url = f"{DSN}?schema={name}"
    try:
        assert cli_main(["db", "migrate", "--store", url]) == 0
        assert capsys.readouterr().out == f"schema {name}: version {LATEST} (migrated from 0)\n"
        assert cli_main(["db", "migrate", "--store", url]) == 0
        assert capsys.readouterr().out == f"schema {name}: version {LATEST} (up to date)\n"
    finally:
        pg_run(lambda conn: conn.execute(f'DROP SCHEMA IF EXISTS "{name}" CASCADE'))


def test_db_migrate_refuses_other_stores(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["db", "migrate", "--store", "sqlite://"]) == 2
    assert "PostgreSQL" in capsys.readouterr().err


# -- NOTIFY -----------------------------------------------------------------------------------


def hint(payload: str) -> str:
    """``<workspace>:<seq>`` of a notification, without the events it may carry."""
    parsed = parse_notification(payload)
    assert parsed is not None, payload
    return f"{parsed[0]}:{parsed[1]}"


async def test_notify_on_commit(schema: str) -> None:
    heard: asyncio.Queue[str] = asyncio.Queue()

    def on_notify(conn: object, pid: int, channel: str, payload: object) -> None:
        heard.put_nowait(str(payload))

    async with (
        PostgresEventStore(DSN, schema=schema) as store,
        connection() as listener,
    ):
        assert store.channel == f"{schema}_events"
        await listener.add_listener(store.channel, on_notify)
        written = await store.append("alpha", [msg("1"), msg("2"), msg("3")])
        # The head, and the commit's events as stored (they fit in the payload).
        carried = b"[" + b",".join(encode_event(e) for e in written.events) + b"]"
        assert parse_notification(await asyncio.wait_for(heard.get(), 5)) == (
            "alpha",
            3,
            carried,
        )
        await store.append("beta", [msg("1")])
        assert hint(await asyncio.wait_for(heard.get(), 5)) == "beta:1"

        # A refused append commits nothing and announces nothing.
        with pytest.raises(Conflict):
            await store.append("alpha", [msg("x")], expected_seq=1)
        # A retried (duplicate) batch writes nothing and announces nothing.
        first = await store.append("beta", [msg("r", id="retry-1")])
        assert hint(await asyncio.wait_for(heard.get(), 5)) == "beta:2"
        again = await store.append("beta", [msg("r", id="retry-1")])
        assert again.duplicate and again.events == first.events

        # Group commit: one notification per workspace per transaction, with its last seq;
        # seqs announced per workspace only grow and end at the head.
        await asyncio.gather(*(store.append(f"g{i % 2}", [msg(str(i))]) for i in range(20)))
        await store.append("end", [msg("end")])
        payloads: list[str] = []
        while (payload := hint(await asyncio.wait_for(heard.get(), 5))) != "end:1":
            payloads.append(payload)
        assert heard.empty()
        for workspace in ("g0", "g1"):
            seqs = [int(p.split(":")[1]) for p in payloads if p.startswith(f"{workspace}:")]
            assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)
            assert seqs[-1] == 10

        await listener.remove_listener(store.channel, on_notify)


async def test_notify_for_import(schema: str, tmp_path: Path) -> None:
    heard: asyncio.Queue[str] = asyncio.Queue()
    other = f"{schema}_src"
    try:
        async with PostgresEventStore(DSN, schema=other) as source:
            await source.append("w", [msg("a"), msg("b")])
            events = await source.read_batch("w")
        async with (
            PostgresEventStore(DSN, schema=schema) as store,
            connection() as listener,
        ):
            await listener.add_listener(store.channel, lambda *a: heard.put_nowait(a[3]))
            assert await store.import_events("w", events) == 2
            assert hint(await asyncio.wait_for(heard.get(), 5)) == "w:2"
            stored = await store.read_batch("w")
            assert [e.hash for e in stored] == [e.hash for e in events]
    finally:
        await drop_schema(other)


# -- configuration, factory, blobs ------------------------------------------------------------


def test_url_options() -> None:
    dsn, options = parse_url("postgresql://u:p@h:5433/db?schema=hub2&pool_size=4&sslmode=disable")
    assert dsn == "postgresql://u:p@h:5433/db?sslmode=disable"
    assert options == {"schema": "hub2", "pool_size": "4"}
    store = PostgresEventStore.from_url("postgres://h/db?schema=hub2&pool_size=4")
    assert (store.schema, store.pool_size, store.channel) == ("hub2", 4, "hub2_events")
    assert "p@" not in repr(PostgresEventStore.from_url("postgresql://u:p@h/db"))
    default = PostgresEventStore.from_url("postgresql://h/db")
    assert (default.schema, default.channel) == ("agora", "agora_events")


@pytest.mark.parametrize("bad", ["Upper", "1abc", "a-b", "x" * 49, 'a"b'])
def test_bad_schema_names(bad: str) -> None:
    with pytest.raises(BadRequest):
        PostgresEventStore(DSN, schema=bad)
    with pytest.raises(BadRequest):
        PostgresEventStore.from_url(f"postgresql://h/db?schema={bad}")


def test_factory_scheme(tmp_path: Path) -> None:
    store = open_store("postgresql://h/db?schema=viafactory", tmp_path)
    assert isinstance(store, PostgresEventStore)
    assert store.schema == "viafactory"


async def test_unreachable_database_is_unavailable() -> None:
    store = PostgresEventStore("postgresql://postgres@127.0.0.1:1/test", command_timeout=5)
    with pytest.raises(Unavailable):
        await store.open()
    await store.close()


async def test_blobs_are_shared_between_nodes(schema: str) -> None:
    async with (
        PostgresEventStore(DSN, schema=schema) as a,
        PostgresEventStore(DSN, schema=schema) as b,
    ):
        digest = await a.blobs.put(b"shared content")
        assert await b.blobs.has(digest)
        assert await b.blobs.get(digest) == b"shared content"
        async with connection() as conn:
            await conn.execute(
                f"UPDATE \"{schema}\".blobs SET data = 'tampered'::bytea WHERE sha256 = $1",
                digest,
            )
        with pytest.raises(IntegrityError):
            await b.blobs.get(digest)


async def test_append_cancelled_while_queued_is_not_written(schema: str) -> None:
    """A caller cancelled before its batch's transaction began leaves nothing behind; one
    cancelled later may see its batch committed (then a retry answers duplicate)."""
    async with (
        PostgresEventStore(DSN, schema=schema) as store,
        connection() as blocker,
    ):
        async with blocker.transaction():
            await blocker.execute(f'LOCK TABLE "{schema}".events IN EXCLUSIVE MODE')
            first = asyncio.create_task(store.append("w", [msg("in flight", id="f")]))
            await asyncio.sleep(0.1)  # the writer now waits for the lock with `first`
            queued = asyncio.create_task(store.append("w", [msg("queued", id="q")]))
            await asyncio.sleep(0.05)
            queued.cancel()
            first.cancel()
            with pytest.raises(asyncio.CancelledError):
                await queued
            with pytest.raises(asyncio.CancelledError):
                await first
        # Let the writer finish the in-flight transaction, then look.
        result = await store.append("w", [msg("after")])
        found = await store.lookup_ids("w", ["f", "q"])
        assert "q" not in found
        assert result.seqs == [len(found) + 1]


async def test_migration_3_adds_the_tree_to_an_existing_log(schema: str) -> None:
    """A schema at version 2 (before the Merkle tree) migrates to 3; the workspace's hashes
    are built from its events at its next append."""
    async with PostgresEventStore(DSN, schema=schema) as store:
        await store.append("ws", [msg(str(i)) for i in range(5)])
    async with connection() as conn:
        await conn.execute(f'DROP TABLE "{schema}".merkle_hashes, "{schema}".checkpoints')
        # Migrations 4 (chunked blobs), 5 (grants) and 6 (blob intents) undone too: as
        # version 2 left it.
        await conn.execute(f'DROP TABLE "{schema}".blob_grants, "{schema}".blob_intents')
        await conn.execute(f'DROP TABLE "{schema}".blob_parts, "{schema}".blob_uploads')
        await conn.execute(
            f'ALTER TABLE "{schema}".blobs DROP COLUMN size, DROP COLUMN chunked, '
            "DROP COLUMN stored_at"
        )
        await conn.execute(f'DROP INDEX "{schema}".events_presence')  # migration 8
        # Migration 10 (positions from a sequence, events.tx): the rows keep no tx.
        await conn.execute(f'DROP FUNCTION "{schema}".take_positions')
        await conn.execute(f'DROP SEQUENCE "{schema}".positions')
        await conn.execute(f'ALTER TABLE "{schema}".events DROP COLUMN tx')
        await conn.execute(f'ALTER TABLE "{schema}".nodes DROP COLUMN url')  # migration 11
        await conn.execute(f'DELETE FROM "{schema}".schema_version WHERE version >= 3')
        assert await current_version(conn, schema) == 2
    async with PostgresEventStore(DSN, schema=schema) as store:
        assert await store.read_hash_map("ws", [0]) == {}
        after = await store.append("ws", [msg("after")])
        # 6 leaves: 6 leaf hashes + 3 + 1 interior ones, every one of them stored.
        assert len(await store.read_hash_map("ws", list(range(20)))) == 10
        # The events from before migration 10 (no tx) are below the horizon; the sequence
        # starts past them.
        assert [e.position for e in await read_all_from(store, 6)] == [1, 2, 3, 4, 5, 6]
        assert after.events[0].position == 6
    async with connection() as conn:
        assert await current_version(conn, schema) == LATEST == 11


async def cut_log(schema: str, workspace: str, seq: int) -> None:
    """Cut ``workspace``'s log after ``seq`` behind the store's back (events and head, not
    the stored hashes), as a careless restore would."""
    async with connection() as conn:
        await conn.execute(
            f'DELETE FROM "{schema}".events WHERE workspace = $1 AND seq > $2', workspace, seq
        )
        await conn.execute(
            f'UPDATE "{schema}".heads SET (seq, hash, timestamp, position) = '
            f'(SELECT seq, hash, timestamp, position FROM "{schema}".events '
            "WHERE workspace = $1 AND seq = $2) WHERE workspace = $1",
            workspace,
            seq,
        )


async def test_stored_hashes_past_a_cut_head_are_dropped_when_the_tree_is_read_back(
    schema: str,
) -> None:
    """The log was cut behind the store's back (events 6-8 gone): reading the frontiers back
    (one read-only statement for a batch) finds stored hashes past the head, so they are
    dropped and the run across it is cut (a second statement, only then), and the tree grows
    on from the head it has; another workspace's is left whole."""
    from tests.hub.log.test_tree_conformance import assert_tree_matches_events

    async with PostgresEventStore(DSN, schema=schema) as store:
        await store.append("ws", [msg(str(i)) for i in range(4)])  # run 1: events 1-4
        await store.append("ws", [msg(str(i)) for i in range(4, 7)])  # run 2, across 5
        await store.append("ws", [msg("7")])  # run 3, past 5
        await store.append("other", [msg(str(i)) for i in range(3)])  # not cut
    await cut_log(schema, "ws", 5)
    async with PostgresEventStore(DSN, schema=schema) as store:  # no frontier cached
        # Together: one batch (group commit), both frontiers read back in one statement.
        await asyncio.gather(store.append("ws", [msg("after")]), store.append("other", [msg("")]))
        assert await assert_tree_matches_events(store, "ws") == 6
        assert await assert_tree_matches_events(store, "other") == 4


async def test_a_run_reaching_past_a_cut_head_is_cut_when_the_tree_is_read_back(
    schema: str,
) -> None:
    """Cut inside the last run (events 6-7 of a run of 5-7, nothing stored past it): the
    read-back sees the run reach past the head's stored count and cuts it to the count, so no
    stale hash is left behind the new ones."""
    from hub.core.merkle import stored_hash_count
    from tests.hub.log.test_tree_conformance import assert_tree_matches_events

    async with PostgresEventStore(DSN, schema=schema) as store:
        await store.append("ws", [msg(str(i)) for i in range(4)])  # run 1: events 1-4
        await store.append("ws", [msg(str(i)) for i in range(4, 7)])  # run 2: events 5-7
    await cut_log(schema, "ws", 5)
    async with PostgresEventStore(DSN, schema=schema) as store:  # no frontier cached
        await store.append("ws", [msg("after")])
        assert await assert_tree_matches_events(store, "ws") == 6
    async with connection() as conn:
        runs = await conn.fetch(
            f'SELECT idx, octet_length(hash) / 32 AS n FROM "{schema}".merkle_hashes '
            "WHERE workspace = $1 ORDER BY idx",
            "ws",
        )
    # Each run ends where the next begins: run 2 was cut to the stored count of 5 events.
    ends = [int(r["idx"]) + int(r["n"]) for r in runs]
    assert [int(r["idx"]) for r in runs[1:]] == ends[:-1]
    assert ends[1] == stored_hash_count(5) and ends[-1] == stored_hash_count(6)


async def test_a_node_reads_the_frontier_another_node_grew_without_rebuilding(
    schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two nodes take turns on one workspace, each batch of 1-3 events, through sizes 1-70
    (every frontier shape up to 7 levels): each append finds the other node's head moved and
    reads its frontier back. Every hash of hub.core.merkle.frontier_indexes of the head must be
    found stored, else the tree is rebuilt from the events, which fails here."""
    from hub.log import postgres
    from tests.hub.log.test_tree_conformance import assert_tree_matches_events

    async def no_rebuild(self: object, conn: object, workspace: str, size: int) -> object:
        raise AssertionError(f"rebuilt {workspace} at size {size}: the read-back missed")

    monkeypatch.setattr(postgres.PostgresEventStore, "_rebuild", no_rebuild)
    async with (
        PostgresEventStore(DSN, schema=schema) as one,
        PostgresEventStore(DSN, schema=schema) as two,
    ):
        size, turn = 0, 0
        while size < 70:
            count = 1 + turn % 3
            store = (one, two)[turn % 2]
            await store.append("ws", [msg(f"{size + i}") for i in range(count)])
            size, turn = size + count, turn + 1
        assert await assert_tree_matches_events(one, "ws") == size
        assert await assert_tree_matches_events(two, "ws") == size
