"""hub.checkpoints: the checkpoint key file, the production schedule, the refusal to sign a
rewritten history, cosignatures and proofs, on a real SQLite store."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest

from hub.checkpoints import (
    Checkpointer,
    audit_log,
    load_key,
    load_or_create_key,
    prove_consistency,
    prove_inclusion,
    root_hash,
)
from hub.config import AuditConfig, parse_config
from hub.core.chain import canonical_bytes
from hub.core.checkpoint import (
    COSIGNATURE_V1,
    CheckpointRecord,
    NoteError,
    add_signatures,
    format_note,
    generate_signer,
    open_checkpoint,
    parse_checkpoint,
    parse_note,
)
from hub.core.errors import ConfigError, IntegrityError, NotFound, Unavailable
from hub.core.events import MessagePayload, MessagePosted, decode_event, encode_event
from hub.core.merkle import check_consistency, check_inclusion, leaf_hash
from hub.log.sqlite import SqliteEventStore


def msg(text: str = "m") -> MessagePosted:
    return MessagePosted(producer="alice", payload=MessagePayload(text=text))


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteEventStore]:
    async with SqliteEventStore(tmp_path / "agora.db") as s:
        yield s


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


# -- the key ------------------------------------------------------------------------------------


def test_the_key_is_created_once_private_and_named(tmp_path: Path) -> None:
    data = tmp_path / "data"
    with pytest.raises(NotFound):
        load_key(data)
    signer = load_or_create_key(data, "hub-1")
    path = data / "checkpoint.key"
    assert path.stat().st_mode & 0o777 == 0o600
    assert signer.name == "agora.hub-1"
    assert path.read_text().startswith("PRIVATE+KEY+agora.hub-1+")
    again = load_or_create_key(data, "ignored-once-created")
    assert again.verifier.vkey() == signer.verifier.vkey()
    os.chmod(path, 0o644)
    with pytest.raises(ConfigError, match="readable by others"):
        load_key(data)
    os.chmod(path, 0o600)
    path.write_text("not a key\n")
    with pytest.raises(ConfigError):
        load_key(data)
    random_id = load_or_create_key(tmp_path / "other")
    assert random_id.name.startswith("agora.") and random_id.name != signer.name


def test_audit_config_defaults_and_checks() -> None:
    assert parse_config({}).audit == AuditConfig()
    config = parse_config({"audit": {"checkpoint_every_events": 5, "hub_id": "h1"}})
    assert config.audit.checkpoint_every_events == 5 and config.audit.hub_id == "h1"
    with pytest.raises(ConfigError):
        parse_config({"audit": {"checkpoint_every_ms": 0}})
    with pytest.raises(ConfigError):
        parse_config({"audit": {"hub_id": "a b"}})
    with pytest.raises(ConfigError):
        parse_config({"audit": {"every": 1}})


# -- producing ----------------------------------------------------------------------------------


async def test_on_demand_signs_once_per_size(store: SqliteEventStore) -> None:
    signer = generate_signer("agora.t")
    checkpoints = Checkpointer(store, signer)
    with pytest.raises(NotFound):
        await checkpoints.on_demand("ws")
    await store.append("ws", [msg(str(i)) for i in range(5)])
    first = await checkpoints.on_demand("ws")
    assert first.size == 5
    checkpoint, _ = open_checkpoint(first.note, signer.verifier, origin="agora.t/ws")
    assert checkpoint.root == await root_hash(store, "ws", 5)
    assert await checkpoints.on_demand("ws") == first
    assert await checkpoints.latest("ws") == first


async def test_due_after_n_events_or_t_ms(store: SqliteEventStore) -> None:
    clock = Clock()
    config = AuditConfig(checkpoint_every_events=4, checkpoint_every_ms=1000)
    checkpoints = Checkpointer(store, generate_signer("agora.t"), config, clock=clock)
    await store.append("ws", [msg()] * 3)
    checkpoints.appended("ws", 3)
    assert checkpoints.due() == []
    await store.append("ws", [msg()])
    checkpoints.appended("ws", 4)
    assert checkpoints.due() == ["ws"]
    made = await checkpoints.produce_due()
    assert [r.size for r in made] == [4]
    assert checkpoints.due() == []
    await store.append("ws", [msg()])
    checkpoints.appended("ws", 5)
    clock.now += 0.999
    assert checkpoints.due() == []
    clock.now += 0.002
    assert checkpoints.due() == ["ws"]
    assert [r.size for r in await checkpoints.produce_due()] == [5]
    clock.now += 10
    assert checkpoints.due() == []  # nothing new: no checkpoint of a tree already signed


async def test_the_background_task_produces_due_checkpoints(store: SqliteEventStore) -> None:
    config = AuditConfig(checkpoint_every_events=2, checkpoint_every_ms=60_000)
    async with Checkpointer(store, generate_signer("agora.t"), config) as checkpoints:
        await store.append("ws", [msg(), msg()])
        checkpoints.appended("ws", 2)
        async with asyncio.timeout(10):
            # The store has no event to wait on: poll, bounded.
            while await store.load_checkpoint("ws") is None:  # noqa: ASYNC110
                await asyncio.sleep(0.01)
    await checkpoints.close()  # idempotent
    record = await store.load_checkpoint("ws")
    assert record is not None and record.size == 2


async def test_refuses_to_sign_a_history_inconsistent_with_the_last(
    store: SqliteEventStore, tmp_path: Path
) -> None:
    import sqlite3

    checkpoints = Checkpointer(store, generate_signer("agora.t"))
    await store.append("ws", [msg(str(i)) for i in range(6)])
    await checkpoints.on_demand("ws")
    await store.close()
    with sqlite3.connect(tmp_path / "agora.db") as conn:  # cut the log behind the hub's back
        conn.execute("DELETE FROM events WHERE seq > 4")
    conn.close()
    async with SqliteEventStore(tmp_path / "agora.db") as reopened:
        again = Checkpointer(reopened, checkpoints.signer)
        with pytest.raises(IntegrityError, match="truncated"):
            await again.on_demand("ws")


class Reads:
    """Counts the store's reads a checkpoint makes (wrapping the store's own methods)."""

    NAMES = ("head", "read_hash_map", "load_checkpoint", "ensure_hashes")

    def __init__(self, store: SqliteEventStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        for name in self.NAMES:
            real = getattr(store, name)

            async def counted(*args: object, _real: Any = real, **kwargs: object) -> Any:
                self.count += 1
                return await _real(*args, **kwargs)

            monkeypatch.setattr(store, name, counted)


async def test_a_checkpoint_of_a_tree_grown_in_memory_reads_nothing(
    store: SqliteEventStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After one checked checkpoint, the next ones sign the writer's own tree: no round trip
    to the store but the save, and the same root the stored hashes give."""
    signer = generate_signer("agora.t")
    checkpoints = Checkpointer(store, signer)
    await store.append("ws", [msg(str(i)) for i in range(5)])
    await checkpoints.on_demand("ws")  # the first: read back and checked
    reads = Reads(store, monkeypatch)
    for n in range(3):
        await store.append("ws", [msg(f"more {n} {i}") for i in range(n + 2)])
        record = await checkpoints.on_demand("ws")
        checkpoint, _ = open_checkpoint(record.note, signer.verifier, origin="agora.t/ws")
        assert reads.count == 0
        assert checkpoint.root == await root_hash(store, "ws", checkpoint.size)
        reads.count = 0
    assert record.size == 5 + 2 + 3 + 4
    assert await checkpoints.on_demand("ws") == record  # the one kept, as kept now
    assert [c.size for c in await store.list_checkpoints("ws")] == [5, 7, 10, 14]


async def test_the_first_checkpoint_of_a_workspace_never_signed_reads_only_that(
    store: SqliteEventStore, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Nothing kept to check against: the writer's tree is signed after one read (whether a
    checkpoint is kept), with the root the stored hashes give. Once one is kept, a new
    checkpointer (a restart) checks the tree against it again."""
    signer = generate_signer("agora.t")
    checkpoints = Checkpointer(store, signer)
    await store.append("ws", [msg(str(i)) for i in range(5)])
    reads = Reads(store, monkeypatch)
    record = await checkpoints.on_demand("ws")
    assert reads.count == 1
    checkpoint, _ = open_checkpoint(record.note, signer.verifier, origin="agora.t/ws")
    assert (checkpoint.size, checkpoint.root) == (5, await root_hash(store, "ws", 5))
    reads.count = 0
    await store.append("ws", [msg("more")])
    assert (await Checkpointer(store, signer).on_demand("ws")).size == 6
    assert reads.count > 1  # a checkpoint was kept: read back and checked


@pytest.mark.parametrize("rewrite", ["truncate", "forge"])
async def test_a_history_rewritten_while_the_hub_runs_is_not_signed(
    store: SqliteEventStore, tmp_path: Path, rewrite: str
) -> None:
    """Another process rewrites the log under a running store; the store's next commit reloads
    its tree from the file, which the checkpointer then checks rather than trusts."""
    import sqlite3

    from hub.core.chain import seal

    checkpoints = Checkpointer(store, generate_signer("agora.t"))
    await store.append("ws", [msg(str(i)) for i in range(6)])
    await checkpoints.on_demand("ws")
    with sqlite3.connect(tmp_path / "agora.db") as conn:
        if rewrite == "truncate":  # cut the last two events (and their hashes)
            conn.execute("DELETE FROM events WHERE seq > 4")
        else:  # forge seq 6, re-hashed, with its stored hashes recomputed to match
            row = conn.execute("SELECT body FROM events WHERE seq = 6").fetchone()
            event = decode_event(row[0])
            forged = seal(
                msgspec.structs.replace(event, payload=MessagePayload(text="forged")),
                id=event.id,
                workspace="ws",
                seq=6,
                position=event.position,
                timestamp=event.timestamp,
                producer=event.producer,
                prev=event.prev or "",
            )
            conn.execute(
                "UPDATE events SET body = ?, hash = ?, tree = NULL WHERE seq = 6",
                (encode_event(forged), forged.hash),
            )
    conn.close()
    # Three new events: the tree the store then holds (size 7) is larger than the one signed.
    await store.append("ws", [msg(f"after {i}") for i in range(3)])
    if rewrite == "forge":
        await store.rebuild_hashes("ws")  # the forger's tree, consistent with the forged row
    with pytest.raises(IntegrityError, match=r"truncated|no longer contains"):
        await checkpoints.on_demand("ws")


# -- cosignatures and proofs ------------------------------------------------------------------


async def test_cosignatures_are_kept_and_served(store: SqliteEventStore) -> None:
    signer = generate_signer("agora.t")
    witness = generate_signer("witness.example/w", COSIGNATURE_V1)
    checkpoints = Checkpointer(store, signer)
    await store.append("ws", [msg()] * 3)
    record = await checkpoints.on_demand("ws")
    note = parse_note(record.note)
    cosigned = format_note(add_signatures(note, [witness.sign(note.text, timestamp=7)]))
    kept = await checkpoints.add_cosignatures("ws", cosigned, (witness.verifier,))
    latest = await checkpoints.latest("ws")
    assert latest == kept
    open_checkpoint(latest.signed(), signer.verifier, witnesses=[witness.verifier])
    # Another text, another workspace's origin, an unknown size: refused.
    with pytest.raises(NotFound):
        await checkpoints.add_cosignatures("ws", cosigned.replace("\n3\n", "\n2\n"))
    with pytest.raises(NoteError):
        await checkpoints.add_cosignatures("other", cosigned)


async def test_proofs_check_against_the_signed_root(store: SqliteEventStore) -> None:
    checkpoints = Checkpointer(store, generate_signer("agora.t"))
    await store.append("ws", [msg(str(i)) for i in range(5)])
    small = parse_checkpoint(parse_note((await checkpoints.on_demand("ws")).note).text)
    await store.append("ws", [msg(str(i)) for i in range(6)])
    large = parse_checkpoint(parse_note((await checkpoints.on_demand("ws")).note).text)
    events = [e async for e in store.read("ws")]
    proof = await prove_inclusion(store, "ws", 3, large.size)
    check_inclusion(2, 11, leaf_hash(canonical_bytes(events[2])), proof.hashes, large.root)
    consistency = await prove_consistency(store, "ws", 5, 11)
    check_consistency(5, 11, small.root, large.root, consistency.hashes)
    findings = await audit_log(store, "ws", [("small", small), ("large", large)])
    assert [f.ok for f in findings] == [True, True]


async def test_the_servers_proof_api(store: SqliteEventStore) -> None:
    checkpoints = Checkpointer(store, generate_signer("agora.t"))
    await store.append("ws", [msg(str(i)) for i in range(9)])
    with pytest.raises(NotFound):
        await checkpoints.inclusion_proof("ws", 3)  # no checkpoint yet
    record = await checkpoints.on_demand("ws")
    signed = parse_checkpoint(parse_note(record.note).text)
    proof = await checkpoints.inclusion_proof("ws", 3)
    events = [e async for e in store.read("ws")]
    check_inclusion(2, 9, leaf_hash(canonical_bytes(events[2])), proof.hashes, signed.root)
    old = await root_hash(store, "ws", 4)
    check_consistency(4, 9, old, signed.root, (await checkpoints.consistency_proof("ws", 4)).hashes)
    with pytest.raises(NotFound):
        await checkpoints.inclusion_proof("ws", 3, 10)


async def test_the_background_task_produces_a_checkpoint_due_by_time(
    store: SqliteEventStore,
) -> None:
    config = AuditConfig(checkpoint_every_events=1000, checkpoint_every_ms=50)
    async with Checkpointer(store, generate_signer("agora.t"), config) as checkpoints:
        await store.append("ws", [msg()])
        checkpoints.appended("ws", 1)
        async with asyncio.timeout(10):
            # The store has no event to wait on: poll, bounded.
            while await store.load_checkpoint("ws") is None:  # noqa: ASYNC110
                await asyncio.sleep(0.01)


class FlakyStore(SqliteEventStore):
    """A store whose ``load_checkpoint`` fails ``failures`` times (the database went away)."""

    failures = 1

    async def load_checkpoint(
        self, workspace: str, size: int | None = None
    ) -> CheckpointRecord | None:
        if self.failures:
            self.failures -= 1
            raise Unavailable("the database is unreachable")
        return await super().load_checkpoint(workspace, size)


async def test_a_store_failure_is_logged_and_retried_not_raised(tmp_path: Path) -> None:
    clock = Clock()
    config = AuditConfig(checkpoint_every_events=2, checkpoint_every_ms=1000)
    async with FlakyStore(tmp_path / "agora.db") as store:
        checkpoints = Checkpointer(store, generate_signer("agora.t"), config, clock=clock)
        await store.append("ws", [msg(), msg()])
        checkpoints.appended("ws", 2)
        assert await checkpoints.produce_due() == []  # failed, logged, not raised
        assert checkpoints.due() == ["ws"]  # kept pending (due by count)...
        assert [r.size for r in await checkpoints.produce_due()] == [2]  # ... and retried


async def test_run_produces_until_stopped(store: SqliteEventStore) -> None:
    config = AuditConfig(checkpoint_every_events=1, checkpoint_every_ms=60_000)
    checkpoints = Checkpointer(store, generate_signer("agora.t"), config)
    stop = asyncio.Event()
    task = asyncio.create_task(checkpoints.run(stop))
    await store.append("ws", [msg()])
    checkpoints.appended("ws", 1)
    async with asyncio.timeout(10):
        while await store.load_checkpoint("ws") is None:  # noqa: ASYNC110
            await asyncio.sleep(0.01)
    stop.set()
    async with asyncio.timeout(10):
        await task
