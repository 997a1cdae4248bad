"""``Workspaces.catch_up``: events another writer committed reach this node's listeners in
order, once, however they overlap with this node's own appends and resyncs.

Two :class:`Workspaces` over ONE store instance stand for two hub nodes (each sees only its own
appends until it catches up), so these run on SQLite and need no PostgreSQL.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest

from hub.core.errors import Conflict
from hub.core.events import Event, FileWritten, FileWrittenPayload, MessagePayload, MessagePosted
from hub.log.sqlite import SqliteEventStore
from hub.workspaces import Workspaces

W = "demo"


class Recorder:
    """A listener keeping (seq, id) of every announced event, per workspace."""

    def __init__(self) -> None:
        self.seen: list[tuple[int, str]] = []

    def __call__(self, workspace: str, batch: Sequence[Event]) -> None:
        self.seen.extend((e.seq, e.id) for e in batch)


def message(text: str, id_: str = "") -> MessagePosted:
    return MessagePosted(id=id_, payload=MessagePayload(text=text))


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[SqliteEventStore]:
    async with SqliteEventStore(tmp_path / "log.db", blobs_dir=tmp_path / "blobs") as s:
        yield s


def node(store: SqliteEventStore) -> tuple[Workspaces, Recorder]:
    workspaces = Workspaces(store, snapshot_every=0)
    recorder = Recorder()
    workspaces.add_listener(recorder)
    return workspaces, recorder


async def log_of(store: SqliteEventStore) -> list[tuple[int, str]]:
    return [(e.seq, e.id) async for e in store.read(W)]


async def test_catch_up_delivers_the_other_nodes_events(store: SqliteEventStore) -> None:
    a, _ = node(store)
    b, seen_b = node(store)
    await b.head(W)  # open on B, as a subscriber would
    for i in range(5):
        await a.publish(W, [message(f"m{i}")], producer="alice")
    assert seen_b.seen == []
    assert await b.catch_up(W, 5) == 5
    assert seen_b.seen == await log_of(store)
    assert await b.catch_up(W, 5) == 0  # nothing new: nothing twice
    assert await b.catch_up(W) == 0


async def test_a_workspace_that_is_not_open_is_left_alone(store: SqliteEventStore) -> None:
    a, _ = node(store)
    b, seen_b = node(store)
    await a.publish(W, [message("x")], producer="alice")
    assert b.open_head(W) is None
    assert await b.catch_up(W, 1) == 0
    assert seen_b.seen == []
    assert await b.head(W) == 1  # opened later: read from the log


async def test_after_catching_up_the_node_appends_without_a_conflict(
    store: SqliteEventStore,
) -> None:
    a, _ = node(store)
    b, seen_b = node(store)
    await b.head(W)
    await a.publish(W, [message("from a")], producer="alice")
    await b.catch_up(W, 1)
    result = await b.publish(W, [message("from b")], producer="bob", expected_seq=1)
    assert result.seqs == [2]
    assert [s for s, _ in seen_b.seen] == [1, 2]


async def test_a_stale_node_decides_against_the_log(store: SqliteEventStore) -> None:
    """B missed A's write (no hint yet): a baseRev that is right for the log but stale for B,
    and an expectedSeq a client saw on A, are accepted after B re-reads the log."""
    a, _ = node(store)
    b, seen_b = node(store)
    await b.head(W)
    v1 = FileWritten(payload=FileWrittenPayload(path="f.txt", text="1"))
    await a.publish(W, [v1], producer="alice")
    v2 = FileWritten(payload=FileWrittenPayload(path="f.txt", text="2", base_rev=1))
    assert (await b.publish(W, [v2], producer="bob")).seqs == [2]
    assert (await b.publish(W, [message("m")], producer="bob", expected_seq=2)).seqs == [3]
    with pytest.raises(Conflict):
        await b.publish(W, [message("late")], producer="bob", expected_seq=2)
    assert seen_b.seen == await log_of(store)


async def test_a_subscriber_resuming_from_another_node_is_not_refused(
    store: SqliteEventStore,
) -> None:
    a, _ = node(store)
    b, _ = node(store)
    await b.head(W)
    await a.publish(W, [message("1"), message("2")], producer="alice")
    assert await b.head(W) == 0
    assert await b.head(W, at_least=2) == 2


async def test_two_nodes_writing_one_workspace_announce_one_sequence(
    store: SqliteEventStore,
) -> None:
    """Both nodes publish concurrently and hear each other only through catch-ups fired at
    random moments (as NOTIFY would): each node's listener gets exactly the log, in order."""
    nodes = [node(store) for _ in range(2)]
    for workspaces, _ in nodes:
        await workspaces.head(W)
    rng = random.Random(7)
    stop = asyncio.Event()

    async def writer(workspaces: Workspaces, name: str, count: int) -> None:
        for i in range(count):
            batch = [message(f"{name}{i}.{j}", f"{name}-{i}-{j}") for j in range(rng.randint(1, 3))]
            await workspaces.publish(W, batch, producer=name)
            if rng.random() < 0.3:
                await asyncio.sleep(0)

    async def hinter(workspaces: Workspaces) -> None:
        while not stop.is_set():
            head = await store.head(W)
            if head is not None:
                await workspaces.catch_up(W, head.seq)
            await asyncio.sleep(rng.random() / 500)

    async with asyncio.TaskGroup() as tg:
        hinters = [tg.create_task(hinter(w)) for w, _ in nodes]
        async with asyncio.TaskGroup() as writers:
            for k, (workspaces, _) in enumerate(nodes):
                for p in range(3):
                    writers.create_task(writer(workspaces, f"n{k}p{p}", 40))
        stop.set()
        await asyncio.gather(*hinters)
    for workspaces, _ in nodes:
        await workspaces.catch_up(W)
    full = await log_of(store)
    assert [s for s, _ in full] == list(range(1, len(full) + 1))
    for _, recorder in nodes:
        assert recorder.seen == full
