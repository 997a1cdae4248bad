"""The follower over PostgreSQL, in-process: two stores on one schema stand for two nodes.

Node A only writes; node B has a :class:`NodeFollower` and a listener standing for its fan-out. B's
listener must get exactly the log, in order, whoever wrote it, including what was committed
while B's LISTEN connection was down.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

import asyncpg
import pytest

from hub.cluster.follower import NodeFollower
from hub.core.events import Event, MessagePayload, MessagePosted
from hub.log.postgres import PostgresEventStore
from hub.workspaces import Workspaces
from tests.support.postgres import POSTGRES_DSN
from tests.support.waiting import wait_for

W = "demo"


class Recorder:
    def __init__(self) -> None:
        self.seen: dict[str, list[tuple[int, str]]] = {}

    def __call__(self, workspace: str, batch: Sequence[Event]) -> None:
        self.seen.setdefault(workspace, []).extend((e.seq, e.id) for e in batch)


@dataclass
class Node:
    store: PostgresEventStore
    workspaces: Workspaces
    recorder: Recorder
    follower: NodeFollower


@pytest.fixture
async def nodes(pg_schema: str) -> AsyncIterator[tuple[Node, Node]]:
    stores = [PostgresEventStore(POSTGRES_DSN, schema=pg_schema, pool_size=3) for _ in range(2)]
    made: list[Node] = []
    async with stores[0], stores[1], asyncio.TaskGroup() as tg:
        tasks = []
        for store in stores:
            workspaces = Workspaces(store, snapshot_every=0)
            recorder = Recorder()
            workspaces.add_listener(recorder)
            follower = NodeFollower(store, workspaces)
            made.append(Node(store, workspaces, recorder, follower))
            tasks.append(tg.create_task(follower.run()))
        await wait_for(lambda: all(n.follower.resumes for n in made))
        yield made[0], made[1]
        for task in tasks:
            task.cancel()


def message(text: str) -> MessagePosted:
    return MessagePosted(payload=MessagePayload(text=text))


async def log_of(store: PostgresEventStore, workspace: str = W) -> list[tuple[int, str]]:
    return [(e.seq, e.id) async for e in store.read(workspace)]


async def test_events_of_another_node_reach_the_listener_in_order(
    nodes: tuple[Node, Node],
) -> None:
    a, b = nodes
    await b.workspaces.head(W)  # open on B, as a subscription does
    for i in range(30):
        await a.workspaces.publish(W, [message(f"a{i}")] * (1 + i % 3), producer="alice")
    full = await log_of(a.store)
    await wait_for(lambda: b.recorder.seen.get(W) == full)
    assert b.follower.delivered == len(full)


async def test_both_nodes_writing_give_both_listeners_the_log(nodes: tuple[Node, Node]) -> None:
    a, b = nodes
    for n in nodes:
        await n.workspaces.head(W)

    async def write(node: Node, name: str) -> None:
        for i in range(40):
            await node.workspaces.publish(W, [message(f"{name}{i}")], producer=name)

    async with asyncio.TaskGroup() as tg:
        for name in ("a1", "a2", "a3"):
            tg.create_task(write(a, name))
        for name in ("b1", "b2", "b3"):
            tg.create_task(write(b, name))
    full = await log_of(a.store)
    assert len(full) == 240
    # Each listener got every event once, in order (its own node's and the other's).
    await wait_for(lambda: a.recorder.seen.get(W) == full and b.recorder.seen.get(W) == full)


async def test_hints_for_workspaces_not_open_here_cost_nothing(nodes: tuple[Node, Node]) -> None:
    a, b = nodes
    await b.workspaces.head(W)
    for i in range(10):
        await a.workspaces.publish("elsewhere", [message(str(i))], producer="alice")
    await a.workspaces.publish(W, [message("x")], producer="alice")
    await wait_for(lambda: len(b.recorder.seen.get(W, [])) == 1)
    assert "elsewhere" not in b.recorder.seen
    assert b.workspaces.open_head("elsewhere") is None
    assert b.follower.catch_ups == 1


async def test_hints_are_coalesced(nodes: tuple[Node, Node]) -> None:
    a, b = nodes
    await b.workspaces.head(W)
    for i in range(200):
        b.follower.notify(W, i + 1)  # a burst, before any catch-up could run
    assert b.follower.catch_ups == 0
    await a.workspaces.publish(W, [message("1")], producer="alice")
    full = await log_of(a.store)
    await wait_for(lambda: b.recorder.seen.get(W) == full)
    assert b.follower.catch_ups <= 3


async def test_lost_listen_connection_loses_nothing(
    nodes: tuple[Node, Node], pg_schema: str
) -> None:
    a, b = nodes
    await b.workspaces.head(W)
    await a.workspaces.publish(W, [message("before")], producer="alice")
    await wait_for(lambda: len(b.recorder.seen.get(W, [])) == 1)
    resumes = b.follower.resumes
    conn = await asyncpg.connect(POSTGRES_DSN)
    try:
        killed = await conn.fetch(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = $1",
            f"agora-follow:{pg_schema}",
        )
        assert len(killed) == 2
        for i in range(20):  # committed while nobody listens: these hints are lost
            await a.workspaces.publish(W, [message(f"during{i}")], producer="alice")
    finally:
        await conn.close()
    full = await log_of(a.store)
    await wait_for(lambda: b.recorder.seen.get(W) == full)
    assert b.follower.resumes > resumes
