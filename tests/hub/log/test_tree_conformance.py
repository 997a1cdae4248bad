"""Store conformance for the Merkle tree and checkpoints (docs/audit.md): every store kind.

The stored hashes are checked against the tree built from the events by the pure functions
alone (hub.core.merkle), so a store that skipped, reordered or misnumbered a hash fails.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable

import pytest

from hub.core.chain import canonical_bytes
from hub.core.checkpoint import CheckpointRecord
from hub.core.errors import IntegrityError, NotFound
from hub.core.events import Event, MessagePayload, MessagePosted
from hub.core.merkle import (
    append_leaves,
    check_consistency,
    check_inclusion,
    consistency_proof,
    consistency_proof_indexes,
    frontier_root,
    inclusion_proof,
    inclusion_proof_indexes,
    leaf_hash,
    stored_hash_count,
    tree_hash,
    tree_hash_indexes,
)
from hub.log.base import EventStore
from tests.hub.log.stores import StoreKind


def msg(text: str = "hello", *, id: str = "") -> MessagePosted:
    return MessagePosted(id=id, producer="alice", payload=MessagePayload(text=text))


async def events_of(store: EventStore, workspace: str) -> list[Event]:
    return [e async for e in store.read(workspace)]


async def assert_tree_matches_events(store: EventStore, workspace: str) -> int:
    """Every stored hash equals the one the pure functions derive from the events."""
    events = await events_of(store, workspace)
    leaves = [leaf_hash(canonical_bytes(e)) for e in events]
    _, expected = append_leaves((), 0, leaves)
    assert len(expected) == stored_hash_count(len(events))
    stored = await store.read_hash_map(workspace, list(range(len(expected) + 3)))
    assert stored == dict(enumerate(expected))
    return len(events)


async def root_at(store: EventStore, workspace: str, size: int) -> bytes:
    reader = await store.read_hashes(workspace, tree_hash_indexes(size))
    return tree_hash(size, reader)


async def test_appends_store_the_tree_of_the_events(store: EventStore) -> None:
    for i in range(9):
        await store.append("ws", [msg(f"{i}-{j}") for j in range(1 + i % 4)])
        await store.append("other", [msg(str(i))])
    assert await assert_tree_matches_events(store, "ws") == sum(1 + i % 4 for i in range(9))
    assert await assert_tree_matches_events(store, "other") == 9


async def test_concurrent_appends_keep_the_tree_in_seq_order(store: EventStore) -> None:
    await asyncio.gather(
        *(store.append(f"w{i % 3}", [msg(str(i))] * (1 + i % 2)) for i in range(90))
    )
    for w in range(3):
        await assert_tree_matches_events(store, f"w{w}")


async def test_roots_and_proofs_from_stored_hashes(store: EventStore) -> None:
    await store.append("ws", [msg(str(i)) for i in range(13)])
    events = await events_of(store, "ws")
    leaves = [leaf_hash(canonical_bytes(e)) for e in events]
    for size in range(1, 14):
        frontier, _ = append_leaves((), 0, leaves[:size])
        root = await root_at(store, "ws", size)
        assert root == frontier_root(frontier)
        for index in (0, size // 2, size - 1):
            reader = await store.read_hashes("ws", inclusion_proof_indexes(index, size))
            check_inclusion(index, size, leaves[index], inclusion_proof(index, size, reader), root)
        for old in (1, size // 2, size):
            reader = await store.read_hashes("ws", consistency_proof_indexes(old, size))
            proof = consistency_proof(old, size, reader)
            check_consistency(old, size, await root_at(store, "ws", old), root, proof)


async def test_missing_hashes_are_an_integrity_error(store: EventStore) -> None:
    await store.append("ws", [msg()])
    with pytest.raises(IntegrityError):
        await store.read_hashes("ws", [0, 5])
    assert await store.read_hash_map("nobody", [0]) == {}


async def test_import_stores_the_tree(
    store: EventStore, make_store: Callable[[str], EventStore]
) -> None:
    await store.append("ws", [msg(str(i)) for i in range(11)])
    exported = await events_of(store, "ws")
    async with make_store("restored") as other:
        await other.append("first", [msg("moves the positions")])
        await other.import_events("ws", exported)
        await assert_tree_matches_events(other, "ws")
        # Positions differ, the tree does not: it covers the canonical form only.
        assert await root_at(other, "ws", 11) == await root_at(store, "ws", 11)
        await other.append("ws", [msg("after")])
        await assert_tree_matches_events(other, "ws")


async def test_lost_hashes_are_rebuilt_at_the_next_append(
    store: EventStore, store_kind: StoreKind, make_store: Callable[[str], EventStore]
) -> None:
    await store.append("ws", [msg(str(i)) for i in range(7)])
    await store.close()
    store_kind.delete_hashes(store, "ws")  # a log written before the tree existed
    async with make_store("main") as reopened:
        assert await reopened.read_hash_map("ws", [0]) == {}
        await reopened.append("ws", [msg("next")])
        assert await assert_tree_matches_events(reopened, "ws") == 8


async def test_ensure_and_rebuild_hashes(store: EventStore, store_kind: StoreKind) -> None:
    assert await store.ensure_hashes("nobody") == 0
    await store.append("ws", [msg(str(i)) for i in range(6)])
    store_kind.delete_hashes(store, "ws")
    assert await store.ensure_hashes("ws") == 6
    await assert_tree_matches_events(store, "ws")
    assert await store.rebuild_hashes("ws") == 6
    await assert_tree_matches_events(store, "ws")
    # Appends continue the rebuilt tree.
    await store.append("ws", [msg("7"), msg("8")])
    assert await assert_tree_matches_events(store, "ws") == 8


async def test_a_second_writer_of_the_same_storage_keeps_the_tree_right(
    make_store: Callable[[str], EventStore],
) -> None:
    async with make_store("shared") as a, make_store("shared") as b:
        for i in range(6):
            await a.append("ws", [msg(f"a{i}")])
            await b.append("ws", [msg(f"b{i}")] * 2)
        await assert_tree_matches_events(a, "ws")


async def test_two_writers_racing_on_one_workspace_keep_the_tree_right(
    make_store: Callable[[str], EventStore],
) -> None:
    async with make_store("raced") as a, make_store("raced") as b:
        await asyncio.gather(
            *(s.append("ws", [msg(f"{i}")] * (1 + i % 3)) for i in range(40) for s in (a, b))
        )
        assert await assert_tree_matches_events(b, "ws") == 2 * sum(1 + i % 3 for i in range(40))


async def test_the_tree_survives_reopening(make_store: Callable[[str], EventStore]) -> None:
    async with make_store("again") as store:
        await store.append("ws", [msg(str(i)) for i in range(5)])
    async with make_store("again") as store:
        await store.append("ws", [msg("after reopening")])
        assert await assert_tree_matches_events(store, "ws") == 6


# -- checkpoints -----------------------------------------------------------------------------


async def test_checkpoints_are_kept(store: EventStore) -> None:
    assert await store.load_checkpoint("ws") is None
    assert await store.list_checkpoints("ws") == []
    first = CheckpointRecord(workspace="ws", size=3, note="n3\n\n— k AAAA\n")
    later = CheckpointRecord(workspace="ws", size=10, note="n10\n\n— k BBBB\n")
    assert await store.save_checkpoint(later)
    assert await store.save_checkpoint(first)
    assert await store.save_checkpoint(CheckpointRecord(workspace="other", size=99, note="o"))
    # A second checkpoint of a size already kept does not replace the first.
    assert not await store.save_checkpoint(CheckpointRecord(workspace="ws", size=3, note="x"))
    assert await store.load_checkpoint("ws") == later
    assert await store.load_checkpoint("ws", 3) == first
    assert await store.load_checkpoint("ws", 4) is None
    assert await store.list_checkpoints("ws") == [first, later]

    await store.set_cosignatures("ws", 3, "— witness CCCC\n")
    kept = await store.load_checkpoint("ws", 3)
    assert kept is not None and kept.cosignatures == "— witness CCCC\n"
    assert kept.signed() == first.note + "— witness CCCC\n"
    with pytest.raises(NotFound):
        await store.set_cosignatures("ws", 4, "— witness DDDD\n")


async def test_checkpoints_survive_reopening(make_store: Callable[[str], EventStore]) -> None:
    record = CheckpointRecord(workspace="ws", size=1, note="n\n", cosignatures="c\n")
    async with make_store("kept") as store:
        await store.save_checkpoint(record)
    async with make_store("kept") as store:
        assert await store.list_checkpoints("ws") == [record]
