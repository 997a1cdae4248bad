"""SQLite-only behaviour of :mod:`hub.log.sqlite` (the shared contract is test_conformance.py):
the file format, group commit, a failed transaction, another connection writing behind the
store's back, backpressure and the writer's own cancellation."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import shutil
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest

from hub.core.chain import seal
from hub.core.checkpoint import CheckpointRecord
from hub.core.errors import Unavailable
from hub.core.events import (
    MemberJoined,
    MemberPayload,
    MessagePayload,
    MessagePosted,
    encode_event,
)
from hub.log.base import AppendItem
from hub.log.ids import mint_id
from hub.log.sqlite import SCHEMA_VERSION, SqliteEventStore, _Writer
from tests.support.waiting import wait_for


def msg(text: str = "hi", *, id: str = "") -> MessagePosted:
    return MessagePosted(id=id, producer="p", payload=MessagePayload(text=text))


class FlakyConnection:
    """Delegates to a real connection; fails the next ``fail`` COMMITs with an I/O error."""

    def __init__(self, conn: sqlite3.Connection, fail: int = 1) -> None:
        self.conn = conn
        self.fail = fail

    def execute(self, sql: str, *args: Any) -> Any:
        if sql == "COMMIT" and self.fail > 0:
            self.fail -= 1
            raise sqlite3.OperationalError("disk I/O error (simulated)")
        return self.conn.execute(sql, *args)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.conn, name)


def writer_of(store: SqliteEventStore) -> _Writer:
    writer = store._writer
    assert writer is not None
    return writer


async def test_file_format(tmp_path: Path) -> None:
    db = tmp_path / "sub" / "agora.db"
    async with SqliteEventStore(db) as store:
        result = await store.append("ws", [msg("x")])
    assert (tmp_path / "sub" / "blobs").is_dir()
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        row = conn.execute(
            "SELECT position, workspace, seq, id, kind, timestamp, hash, body FROM events"
        ).fetchone()
    conn.close()
    ev = result.events[0]
    assert row == (
        ev.position,
        "ws",
        1,
        ev.id,
        "messagePosted",
        ev.timestamp,
        ev.hash,
        encode_event(ev),
    )


async def test_a_newer_schema_is_refused(tmp_path: Path) -> None:
    db = tmp_path / "agora.db"
    async with SqliteEventStore(db):
        pass
    with sqlite3.connect(db) as conn:
        conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    conn.close()
    store = SqliteEventStore(db)
    with pytest.raises(Unavailable, match="schema version"):
        await store.open()
    await store.close()  # never opened: a no-op


async def test_not_a_database_is_unavailable(tmp_path: Path) -> None:
    db = tmp_path / "agora.db"
    db.write_bytes(b"this is not a database" * 100)
    with pytest.raises(Exception) as info:
        await SqliteEventStore(db).open()
    assert info.value.__class__.__name__ in {"IntegrityError", "Unavailable"}


async def test_read_kinds_narrows_by_kind_bytes_and_workspace(tmp_path: Path) -> None:
    """The dead-worker scans (hub.server.reaper): rows of the kinds asked for whose body
    holds the bytes, in commit order across workspaces, or in one workspace by seq."""
    async with SqliteEventStore(tmp_path / "a.db") as store:
        await store.append("b", [msg("node-x one"), msg("other")])
        await store.append("a", [msg("node-x two")])
        await store.append(
            "a", [MemberJoined(producer="p", payload=MemberPayload(agent="p", node="node-x"))]
        )
        hits = await store.read_kinds(["messagePosted"], containing=b"node-x")
        assert [(w, seq) for w, seq, _ in hits] == [("b", 1), ("a", 1)]
        assert all(b"node-x" in body for _, _, body in hits)
        joined = await store.read_kinds(["memberJoined", "memberLeft"], containing=b'"node-x"')
        assert [(w, seq) for w, seq, _ in joined] == [("a", 2)]
        every = await store.read_kinds(["messagePosted"], workspace="b")
        assert [(w, seq) for w, seq, _ in every] == [("b", 1), ("b", 2)]
        assert await store.read_kinds(["execStarted"]) == []


async def test_concurrent_appends_share_commits(tmp_path: Path) -> None:
    async with SqliteEventStore(tmp_path / "a.db", batch_max=8) as store:
        sizes: list[int] = []
        writer = writer_of(store)
        real = writer.write

        def counting(batch: list[Any]) -> list[Any]:
            sizes.append(sum(r.size for r in batch))
            return real(batch)

        writer.write = counting  # type: ignore[method-assign]
        results = await asyncio.gather(*(store.append("ws", [msg(str(i))]) for i in range(40)))
        big = await store.append("ws", [msg(str(i)) for i in range(20)])  # > batch_max: alone
    assert sorted(r.seqs[0] for r in results) == list(range(1, 41))
    assert big.seqs == list(range(41, 61))
    assert len(sizes) < 40 and max(sizes[:-1]) <= 8 and sizes[-1] == 20


async def test_a_failed_commit_fails_the_whole_batch_and_recovers(tmp_path: Path) -> None:
    async with SqliteEventStore(tmp_path / "a.db") as store:
        await store.append("ws", [msg("before")])
        writer = writer_of(store)
        assert writer.conn is not None
        real = writer.conn
        writer.conn = FlakyConnection(real)  # type: ignore[assignment]
        outcomes = await asyncio.gather(
            store.append("ws", [msg("a")]),
            store.append("other", [msg("b")]),
            return_exceptions=True,
        )
        for outcome in outcomes:
            assert isinstance(outcome, Unavailable)
            assert isinstance(outcome.__cause__, sqlite3.Error)
        # Nothing of the failed batch is visible, and the next append continues the chain.
        after = await store.append("ws", [msg("after")])
        assert after.seqs == [2]
        assert await store.head("other") is None
        assert (await store.verify("ws")).ok
        writer.conn = real


async def test_another_connection_writing_is_noticed(tmp_path: Path) -> None:
    db = tmp_path / "a.db"
    async with SqliteEventStore(db) as store:
        first = (await store.append("ws", [msg("one")])).events[0]
        # Someone appends seq 2 behind the store's back (a second process, a restore tool…).
        ts = first.timestamp + 1
        foreign = seal(
            msg("foreign"),
            id=mint_id(ts),
            workspace="ws",
            seq=2,
            position=first.position + 1,
            timestamp=ts,
            producer="p",
            prev=first.hash or "",
        )
        with sqlite3.connect(db) as conn:
            conn.execute(
                "INSERT INTO events (position, workspace, seq, id, kind, timestamp, hash, body) "
                "VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                (
                    foreign.position,
                    "ws",
                    2,
                    foreign.id,
                    "messagePosted",
                    ts,
                    foreign.hash,
                    encode_event(foreign),
                ),
            )
        conn.close()
        nxt = await store.append("ws", [msg("three")])
        assert nxt.seqs == [3] and nxt.events[0].prev == foreign.hash
        assert nxt.events[0].position == foreign.position + 1
        assert (await store.verify("ws")).ok


async def test_backpressure_with_a_tiny_queue(tmp_path: Path) -> None:
    async with SqliteEventStore(tmp_path / "a.db", queue_max=2, batch_max=3) as store:
        results = await asyncio.gather(*(store.append("ws", [msg(str(i))]) for i in range(60)))
        assert sorted(r.seqs[0] for r in results) == list(range(1, 61))


async def test_append_many_groups_split_across_transactions_and_a_tiny_queue(
    tmp_path: Path,
) -> None:
    # One append_many call is one queue entry sharing one future: a group larger than
    # batch_max is written across transactions (each request answered in its slot), and
    # groups wait for room in a full queue like single appends, none overtaking another.
    async with SqliteEventStore(tmp_path / "a.db", queue_max=1, batch_max=3) as store:
        sizes: list[int] = []
        writer = writer_of(store)
        real = writer.write

        def counting(batch: list[Any]) -> list[Any]:
            sizes.append(sum(r.size for r in batch))
            return real(batch)

        writer.write = counting  # type: ignore[method-assign]
        group = await store.append_many("ws", [AppendItem([msg(str(i))]) for i in range(7)])
        assert [seqs(o) for o in group] == [[i] for i in range(1, 8)]
        assert sizes == [3, 3, 1]
        calls = [
            store.append_many("ws", [AppendItem([msg(f"{c}.{i}")]) for i in range(4)])
            for c in range(5)
        ]
        *groups, alone = await asyncio.gather(*calls, store.append("ws", [msg("alone")]))
        assert [[seqs(o)[0] for o in g] for g in groups] == [
            list(range(first, first + 4)) for first in range(8, 28, 4)
        ]  # in call order, each contiguous
        assert alone.seqs == [28]
        assert [e.seq async for e in store.read("ws")] == list(range(1, 29))


def seqs(outcome: Any) -> list[int]:
    assert not isinstance(outcome, Exception), outcome
    return list(outcome.seqs)


async def test_close_while_appends_wait_for_queue_room(tmp_path: Path) -> None:
    store = SqliteEventStore(tmp_path / "a.db", queue_max=1, batch_max=1)
    await store.open()
    tasks = [asyncio.create_task(store.append("ws", [msg(str(i))])) for i in range(30)]
    await asyncio.sleep(0)  # most of them now wait for room in the queue
    await store.close()
    results = [t.result() for t in tasks]  # every accepted append committed
    assert sorted(r.seqs[0] for r in results) == list(range(1, 31))


async def test_cancelling_the_writer_fails_pending_appends(tmp_path: Path) -> None:
    store = SqliteEventStore(tmp_path / "a.db")
    await store.open()
    await store.append("ws", [msg()])
    writer_task = store._commits.task
    assert writer_task is not None
    tasks = [asyncio.create_task(store.append("ws", [msg(str(i))])) for i in range(20)]
    await asyncio.sleep(0)
    writer_task.cancel()
    outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    # Each append either committed (its batch was already in the writer thread) or failed
    # cleanly; none hangs.
    assert all(isinstance(o, Unavailable) or not isinstance(o, BaseException) for o in outcomes)
    with pytest.raises(Unavailable):
        await store.append("ws", [msg()])
    await store.close()
    async with SqliteEventStore(tmp_path / "a.db") as reopened:
        assert (await reopened.verify("ws")).ok


async def test_reads_while_the_writer_writes(tmp_path: Path) -> None:
    async with SqliteEventStore(tmp_path / "a.db") as store:

        async def reader() -> int:
            seen = 0
            for _ in range(50):
                seen = max(seen, len(await store.read_batch("ws", limit=10_000)))
                await asyncio.sleep(0)
            return seen

        appends = asyncio.gather(*(store.append("ws", [msg(str(i))]) for i in range(300)))
        seen, _ = await asyncio.gather(reader(), appends)
        assert 0 <= seen <= 300
        assert len(await store.read_batch("ws", limit=10_000)) == 300


async def test_appends_waiting_for_room_fail_when_the_writer_dies(tmp_path: Path) -> None:
    store = SqliteEventStore(tmp_path / "a.db", queue_max=1, batch_max=1)
    await store.open()
    writer_task = store._commits.task
    assert writer_task is not None
    tasks = [asyncio.create_task(store.append("ws", [msg(str(i))])) for i in range(10)]
    await asyncio.sleep(0)  # one queued, nine waiting for room
    writer_task.cancel()
    async with asyncio.timeout(10):  # none may hang
        outcomes = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(o, Unavailable) or not isinstance(o, BaseException) for o in outcomes)
    assert any(isinstance(o, Unavailable) for o in outcomes)
    await store.close()


async def test_a_version_1_file_gains_the_tree_lazily(tmp_path: Path) -> None:
    """A log written before the Merkle tree (schema 1: no tree column, no checkpoints)
    opens, migrates, and gets each workspace's hashes built from its events."""
    path = tmp_path / "old.db"
    async with SqliteEventStore(path) as store:
        first = await store.append("ws", [msg(str(i)) for i in range(5)])
    with sqlite3.connect(path) as conn:
        conn.execute("ALTER TABLE events DROP COLUMN tree")
        conn.execute("DROP TABLE checkpoints")
        conn.execute("PRAGMA user_version=1")
    conn.close()
    async with SqliteEventStore(path) as store:
        assert store.legacy_depth  # schema 1 did not bound nesting
        assert await store.read_hash_map("ws", [0]) == {}
        assert await store.ensure_hashes("ws") == 5
        assert len(await store.read_hash_map("ws", list(range(20)))) == 8  # 5 leaves: 8 hashes
        await store.append("ws", [msg("after")])
        assert await store.list_checkpoints("ws") == []
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 3
    conn.close()
    assert first.seqs == [1, 2, 3, 4, 5]


def _to_schema_2(path: Path, run_leaves: int) -> None:
    """Rewrite a schema-3 file as the hub of schema 2 wrote it: the stored hashes of each
    workspace in ``merkle_hashes`` runs (consecutive stored hashes from ``idx`` on, one run
    per ``run_leaves`` events, as batches of that many wrote them), no ``tree`` column."""
    with sqlite3.connect(path) as conn:
        conn.execute(
            "CREATE TABLE merkle_hashes (workspace TEXT NOT NULL, idx INTEGER NOT NULL, "
            "hash BLOB NOT NULL, PRIMARY KEY (workspace, idx))"
        )
        workspaces = [w for (w,) in conn.execute("SELECT DISTINCT workspace FROM events")]
        for workspace in workspaces:
            trees = [
                t
                for (t,) in conn.execute(
                    "SELECT tree FROM events WHERE workspace = ? ORDER BY seq", (workspace,)
                )
            ]
            idx = 0
            for i in range(0, len(trees), run_leaves):
                run = b"".join(trees[i : i + run_leaves])
                conn.execute("INSERT INTO merkle_hashes VALUES (?, ?, ?)", (workspace, idx, run))
                idx += len(run) // 32
        conn.execute("ALTER TABLE events DROP COLUMN tree")
        conn.execute("PRAGMA user_version=2")
    conn.close()


async def test_a_version_2_file_keeps_its_tree_and_its_proofs_verify(tmp_path: Path) -> None:
    """A data directory of schema 2 (hashes in merkle_hashes runs) opens, moves every run into
    its events' rows and drops the table; checkpoints signed before still verify, with
    inclusion and consistency proofs from the moved hashes, and the tree grows on."""
    from hub.checkpoints import Checkpointer
    from hub.core.chain import canonical_bytes
    from hub.core.checkpoint import generate_signer, parse_checkpoint, parse_note
    from hub.core.merkle import check_consistency, check_inclusion, leaf_hash

    path = tmp_path / "v2.db"
    signer = generate_signer("agora.test")
    async with SqliteEventStore(path) as store:
        for i in range(7):
            await store.append("ws", [msg(f"{i}-{j}") for j in range(5)])
            await store.append("other", [msg(str(i))])
        checkpoints = Checkpointer(store, signer)
        old = await checkpoints.on_demand("ws")
        before = await store.read_hash_map("ws", list(range(100)))
    _to_schema_2(path, run_leaves=5)
    async with SqliteEventStore(path) as store:
        assert not store.legacy_depth  # schema 2 bounded nesting already
        assert await store.read_hash_map("ws", list(range(100))) == before
        checkpoints = Checkpointer(store, signer)
        await store.append("ws", [msg("after")])
        new = await checkpoints.on_demand("ws")
        signed_old = parse_checkpoint(parse_note(old.note).text)
        signed_new = parse_checkpoint(parse_note(new.note).text)
        assert (signed_old.size, signed_new.size) == (35, 36)
        events = [e async for e in store.read("ws")]
        for size, root in ((35, signed_old.root), (36, signed_new.root)):
            for seq in (1, 17, size):
                proof = await checkpoints.inclusion_proof("ws", seq, size)
                leaf = leaf_hash(canonical_bytes(events[seq - 1]))
                check_inclusion(seq - 1, size, leaf, proof.hashes, root)
        consistency = await checkpoints.consistency_proof("ws", 35, 36)
        check_consistency(35, 36, signed_old.root, signed_new.root, consistency.hashes)
        assert await store.ensure_hashes("other") == 7
    with sqlite3.connect(path) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        tables = {t for (t,) in conn.execute("SELECT name FROM sqlite_master")}
        assert "merkle_hashes" not in tables
        assert conn.execute("SELECT count(*) FROM events WHERE tree IS NULL").fetchone()[0] == 0
    conn.close()


async def test_a_version_2_file_with_a_gap_in_its_runs_rebuilds_from_the_events(
    tmp_path: Path,
) -> None:
    """Runs with a hole (lost rows) move up to the hole; the rest is rebuilt from the events
    at the next append, and the whole tree then matches the events."""
    from hub.core.chain import canonical_bytes
    from hub.core.merkle import append_leaves, leaf_hash

    path = tmp_path / "gap.db"
    async with SqliteEventStore(path) as store:
        await store.append("ws", [msg(str(i)) for i in range(12)])
    _to_schema_2(path, run_leaves=4)
    with sqlite3.connect(path) as conn:
        conn.execute("DELETE FROM merkle_hashes WHERE idx = (SELECT max(idx) FROM merkle_hashes)")
    conn.close()
    async with SqliteEventStore(path) as store:
        await store.append("ws", [msg("13")])
        events = [e async for e in store.read("ws")]
        _, expected = append_leaves((), 0, [leaf_hash(canonical_bytes(e)) for e in events])
        assert await store.read_hash_map("ws", list(range(len(expected) + 5))) == dict(
            enumerate(expected)
        )


async def test_each_event_row_holds_the_hashes_its_leaf_adds(tmp_path: Path) -> None:
    """Schema 3 keeps the tree in the event rows: no table of its own; the row of leaf n
    holds 1 + trailing-ones(n) hashes. When the log loses its tail behind the store's back,
    those hashes go with the rows, and the tree grows on from the surviving events."""
    from hub.core.chain import canonical_bytes
    from hub.core.merkle import append_leaves, leaf_hash

    path = tmp_path / "cut.db"
    async with SqliteEventStore(path) as store:
        await store.append("ws", [msg(str(i)) for i in range(10)])
    with sqlite3.connect(path) as conn:
        tables = {t for (t,) in conn.execute("SELECT name FROM sqlite_master")}
        assert "merkle_hashes" not in tables
        lengths = [n for (n,) in conn.execute("SELECT length(tree) FROM events ORDER BY seq")]
        assert lengths == [32 * n for n in (1, 2, 1, 3, 1, 2, 1, 4, 1, 2)]
        conn.execute("DELETE FROM events WHERE seq > 7")
    conn.close()
    async with SqliteEventStore(path) as store:
        await store.append("ws", [msg("new 8"), msg("new 9")])
        events = [e async for e in store.read("ws")]
        _, expected = append_leaves((), 0, [leaf_hash(canonical_bytes(e)) for e in events])
        stored = await store.read_hash_map("ws", list(range(len(expected) + 5)))
        assert stored == dict(enumerate(expected))


async def test_the_tree_off_leaves_the_rows_without_hashes(tmp_path: Path) -> None:
    """``merkle=False`` (the bench's baseline) writes no hashes; the next store with the tree
    on builds them from the events."""
    path = tmp_path / "off.db"
    async with SqliteEventStore(path, merkle=False) as store:
        await store.append("ws", [msg(str(i)) for i in range(3)])
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT count(*) FROM events WHERE tree IS NULL").fetchone()[0] == 3
    conn.close()
    async with SqliteEventStore(path) as store:
        await store.append("ws", [msg("3")])
        assert len(await store.read_hash_map("ws", list(range(10)))) == 7  # 4 leaves: 7


class CountingConnection(FlakyConnection):
    """Counts the transactions committed (``commits``); fails none unless told."""

    def __init__(self, conn: sqlite3.Connection, fail: int = 0) -> None:
        super().__init__(conn, fail)
        self.commits = 0

    def execute(self, sql: str, *args: Any) -> Any:
        result = super().execute(sql, *args)
        if sql == "COMMIT":
            self.commits += 1
        return result


class Hold:
    """A job holding the store's writer thread until ``release`` is set."""

    def __init__(self) -> None:
        self.started = threading.Event()
        self.release = threading.Event()

    def __call__(self) -> None:
        self.started.set()
        self.release.wait()


@contextlib.contextmanager
def writer_held(store: SqliteEventStore) -> Iterator[Hold]:
    """Hold the store's writer thread inside (released on the way out, whatever happens)."""
    assert store._executor is not None
    hold = Hold()
    store._executor.submit(hold)
    try:
        yield hold
    finally:
        hold.release.set()


def queued_jobs(store: SqliteEventStore) -> int:
    """Jobs waiting for the store's writer thread."""
    assert store._executor is not None
    return store._executor._work_queue.qsize()


def _checkpoint(size: int) -> CheckpointRecord:
    return CheckpointRecord(workspace="ws", size=size, note=f"note {size}\n")


async def test_a_checkpoint_saved_during_a_batch_rides_its_transaction(tmp_path: Path) -> None:
    """A checkpoint saved while a batch is under way is written in that batch's transaction
    (no fsync of its own); one saved while the store is idle is written alone. Either way
    it is kept once, and the first kept wins."""
    async with SqliteEventStore(tmp_path / "ride.db") as store:
        await store.append("ws", [msg("first")])
        writer = writer_of(store)
        assert writer.conn is not None and store._executor is not None
        counting = CountingConnection(writer.conn)
        writer.conn = counting  # type: ignore[assignment]
        with writer_held(store) as hold:  # the writer thread is busy: the next batch waits
            await wait_for(hold.started.is_set)
            appended = asyncio.ensure_future(store.append("ws", [msg("second")]))
            # Until the batch is queued on the writer thread, behind ``hold``.
            await wait_for(lambda: queued_jobs(store) == 1)
            assert store._committing
            saved = asyncio.ensure_future(store.save_checkpoint(_checkpoint(2)))
            await asyncio.sleep(0)
        assert (await appended).seqs == [2]
        assert await saved is True
        assert counting.commits == 1  # the batch's transaction held the checkpoint
        assert await store.save_checkpoint(_checkpoint(2)) is False  # idle: alone
        assert counting.commits == 2
        assert await store.save_checkpoint(_checkpoint(1)) is True
        assert [c.size for c in await store.list_checkpoints("ws")] == [1, 2]


async def test_a_checkpoint_riding_a_failed_batch_fails_with_it(tmp_path: Path) -> None:
    async with SqliteEventStore(tmp_path / "fail.db") as store:
        await store.append("ws", [msg("first")])
        writer = writer_of(store)
        assert writer.conn is not None and store._executor is not None
        writer.conn = FlakyConnection(writer.conn)  # type: ignore[assignment]
        with writer_held(store) as hold:
            await wait_for(hold.started.is_set)
            appended = asyncio.ensure_future(store.append("ws", [msg("second")]))
            await wait_for(lambda: queued_jobs(store) == 1)
            saved = asyncio.ensure_future(store.save_checkpoint(_checkpoint(1)))
            await asyncio.sleep(0)
        with pytest.raises(Unavailable):
            await appended
        with pytest.raises(Unavailable):
            await saved
        assert await store.list_checkpoints("ws") == []
        assert await store.save_checkpoint(_checkpoint(1)) is True  # the next one commits


# Written by the hub of schema 2 (before the tree moved into the event rows): workspaces "ws"
# (21 events, appended in 9 batches of 1-4) and "other" (9 events, one per batch), checkpoints
# of ws at 11 and 21 and of other at 9, signed with this test key.
SCHEMA_2_FILE: Final = Path(__file__).parents[2] / "fixtures" / "sqlite-schema-2.db"
SCHEMA_2_KEY: Final = (
    "PRIVATE+KEY+agora.schema2+291f25fc+AQIN0eDbRq9XARgIpEOqsof+u+PKnhR0HgAOqn8kRX/K"
)


async def test_a_data_file_written_by_the_schema_2_hub_still_proves_its_checkpoints(
    tmp_path: Path,
) -> None:
    """The file of a schema-2 hub opens; its kept checkpoints verify with the key, every
    event's inclusion proof and the consistency proof between them lead to the signed roots
    from the moved hashes, and the hub signs on from there."""
    from hub.checkpoints import Checkpointer
    from hub.core.chain import canonical_bytes
    from hub.core.checkpoint import parse_checkpoint, parse_note, parse_signer_key, verified_by
    from hub.core.merkle import check_consistency, check_inclusion, leaf_hash

    path = tmp_path / "agora.db"
    shutil.copyfile(SCHEMA_2_FILE, path)
    signer = parse_signer_key(SCHEMA_2_KEY)
    async with SqliteEventStore(path) as store:
        checkpoints = Checkpointer(store, signer)
        roots: dict[tuple[str, int], bytes] = {}
        for workspace in ("ws", "other"):
            for record in await store.list_checkpoints(workspace):
                note = parse_note(record.note)
                assert verified_by(note, signer.verifier) is not None
                checkpoint = parse_checkpoint(note.text)
                roots[(workspace, checkpoint.size)] = checkpoint.root
        assert sorted(roots) == [("other", 9), ("ws", 11), ("ws", 21)]
        for (workspace, size), root in roots.items():
            events = [e async for e in store.read(workspace)]
            for seq in range(1, size + 1):
                proof = await checkpoints.inclusion_proof(workspace, seq, size)
                leaf = leaf_hash(canonical_bytes(events[seq - 1]))
                check_inclusion(seq - 1, size, leaf, proof.hashes, root)
        consistency = await checkpoints.consistency_proof("ws", 11, 21)
        check_consistency(11, 21, roots[("ws", 11)], roots[("ws", 21)], consistency.hashes)
        await store.append("ws", [msg("after the migration")])
        latest = await checkpoints.on_demand("ws")  # checks it extends size 21, then signs
        assert parse_checkpoint(parse_note(latest.note).text).size == 22


async def test_a_page_too_big_to_concatenate_is_read_row_by_row(tmp_path: Path) -> None:
    """The replay's concatenating query fails with SQLITE_TOOBIG on a page of huge events;
    read_joined (and read_batch) then read the same page row by row."""
    async with SqliteEventStore(tmp_path / "a.db") as store:
        written = (await store.append("ws", [msg("x" * 400) for _ in range(8)])).events
        raw = await store.read_raw("ws")
        reader = store._reader
        assert reader is not None
        # Longer than any one body, shorter than a page of them joined.
        # On the reader's own thread (sqlite3 connections refuse calls from another).
        await reader._execute(  # type: ignore[no-untyped-call]
            reader._conn.setlimit, sqlite3.SQLITE_LIMIT_LENGTH, 1500
        )
        page = await store.read_joined("ws", after_seq=1, until_seq=7)
        assert page.body == b"[" + b",".join(body for _, body in raw[1:7]) + b"]"
        assert (page.count, page.last_seq) == (6, 7)
        assert await store.read_batch("ws") == list(written)


async def test_a_walk_over_parallel_ranges_reads_past_a_gap(tmp_path: Path) -> None:
    """joined_pages reads ranges of seqs on two connections at once, trusting that seqs are
    gapless; a log missing rows (damaged behind the store's back) still yields every stored
    event, in order, for the fold's checks to name the gap."""
    from hub.core.events import decode_events

    async with SqliteEventStore(tmp_path / "a.db") as store:
        await store.append("ws", [msg(str(i)) for i in range(20)])
        with sqlite3.connect(tmp_path / "a.db") as conn:
            conn.execute("DELETE FROM events WHERE seq BETWEEN 7 AND 9")
        conn.close()

        async def seqs(**kwargs: Any) -> list[int]:
            async with contextlib.aclosing(store.joined_pages("ws", **kwargs)) as pages:
                bodies = [page.body async for page in pages]
            return [e.seq for body in bodies for e in decode_events(body)]

        kept = [s for s in range(1, 21) if not 7 <= s <= 9]
        assert await seqs(batch=4) == kept
        assert await seqs(batch=3, after_seq=2) == kept[2:]
        assert await seqs(batch=4, until_seq=15) == [s for s in kept if s <= 15]
        assert await seqs(batch=100) == kept


@pytest.mark.parametrize("read_only", [False, True])
async def test_the_walkers_are_opened_by_the_first_walk_and_closed_with_the_store(
    tmp_path: Path, read_only: bool
) -> None:
    """A store keeps a thread per connection: the two walkers' are started by the first long
    read, not by opening (most stores never walk), and stopped by closing."""
    import threading

    from hub.core.events import decode_events

    async with SqliteEventStore(tmp_path / "a.db") as writer:
        await writer.append("ws", [msg(str(i)) for i in range(12)])
    before = threading.active_count()
    store = SqliteEventStore(tmp_path / "a.db", read_only=read_only)
    async with store:
        opened = threading.active_count()
        async with contextlib.aclosing(store.joined_pages("ws", batch=5)) as pages:
            seqs = [e.seq async for page in pages for e in decode_events(page.body)]
        assert seqs == list(range(1, 13))
        assert threading.active_count() == opened + 2
        async with contextlib.aclosing(store.joined_pages("ws", batch=5)) as pages:
            assert [p.count async for p in pages] == [5, 5, 2]
        assert threading.active_count() == opened + 2  # opened once
    assert threading.active_count() <= before + 1  # (the writer's executor may linger)


async def test_two_stores_on_one_file_keep_each_other_s_heads(tmp_path: Path) -> None:
    """Two writers of one file (``agora serve --workers``), interleaved: each keeps its own
    cached heads, reloads only those the other moved, and neither forks a chain."""
    db = tmp_path / "shared.db"
    async with SqliteEventStore(db) as a, SqliteEventStore(db) as b:
        for i in range(5):
            await a.append("mine-a", [msg(f"a{i}")])
            await b.append("mine-b", [msg(f"b{i}")])
            # Both write one workspace too: the other's append must be noticed each time.
            await (a if i % 2 else b).append("both", [msg(f"both{i}")])
        for store in (a, b):
            assert [h.seq for h in await store.heads() if h.workspace == "both"] == [5]
        events = await a.read_batch("both")
        assert [e.seq for e in events] == [1, 2, 3, 4, 5]
        assert all(e.prev == p.hash for p, e in itertools.pairwise(events))
        positions = [e.position for e in await a.read_all(limit=100)]
        assert positions == sorted(set(positions))


async def test_follow_reports_other_processes_commits(tmp_path: Path) -> None:
    db = tmp_path / "followed.db"
    seen: list[tuple[str, int]] = []
    resumed: list[bool] = []
    async with SqliteEventStore(db) as follower, SqliteEventStore(db) as other:
        follower.follow_other_writers(0.01)
        task = asyncio.create_task(
            follower.follow(lambda w, s: seen.append((w, s)), resumed=lambda: resumed.append(True))
        )
        try:
            await wait_for(lambda: resumed)
            await follower.append("own", [msg("mine")])  # its own: not reported
            await other.append("x", [msg("1"), msg("2")])
            await other.append("y", [msg("1")])
            await follower.append("x", [msg("3")], expected_seq=2)
            await wait_for(lambda: ("x", 2) in seen and ("y", 1) in seen)
            await other.append("z", [msg("1")])  # a later poll: the "x" 3 row was seen
            await wait_for(lambda: ("z", 1) in seen)
            assert not [w for w, _ in seen if w == "own"], seen
            assert ("x", 3) not in seen, seen
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task


async def test_follow_without_other_writers_returns_at_once(tmp_path: Path) -> None:
    async with SqliteEventStore(tmp_path / "alone.db") as store:
        await asyncio.wait_for(store.follow(lambda w, s: None, resumed=lambda: None), 1)
