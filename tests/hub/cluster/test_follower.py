"""The follower over PostgreSQL, in-process: two stores on one schema stand for two nodes.

Node A only writes; node B has a :class:`NodeFollower` and a listener standing for its fan-out. B's
listener must get exactly the log, in order, whoever wrote it, including what was committed
while B's LISTEN connection was down.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from typing import Any

import asyncpg
import pytest

from hub.cluster.follower import NodeFollower
from hub.core.events import Event, MessagePayload, MessagePosted, encode_event
from hub.log.postgres import (
    CARRY_MAX,
    PostgresEventStore,
    notifications,
    parse_notification,
)
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


class Reads:
    """Counts a store's read_batch calls (the catch-up's reads back)."""

    def __init__(self, store: PostgresEventStore, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        real = store.read_batch

        async def counted(*args: Any, **kwargs: Any) -> list[Event]:
            self.count += 1
            return await real(*args, **kwargs)

        monkeypatch.setattr(store, "read_batch", counted)


async def test_events_carried_by_the_notification_are_not_read_back(
    nodes: tuple[Node, Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = nodes
    await b.workspaces.head(W)
    reads = Reads(b.store, monkeypatch)
    for i in range(30):
        await a.workspaces.publish(W, [message(f"a{i}")] * (1 + i % 3), producer="alice")
    full = await log_of(a.store)
    await wait_for(lambda: b.recorder.seen.get(W) == full)
    assert b.follower.carried >= 1 and b.follower.carried_events == len(full)
    assert reads.count == 0


async def test_a_commit_too_big_to_carry_is_read_back(
    nodes: tuple[Node, Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = nodes
    await b.workspaces.head(W)
    reads = Reads(b.store, monkeypatch)
    # Three events of 3,000 bytes of text: more than CARRY_MAX in one notification.
    await a.workspaces.publish(W, [message("x" * 3000)] * 3, producer="alice")
    full = await log_of(a.store)
    await wait_for(lambda: b.recorder.seen.get(W) == full)
    assert b.follower.carried == 0 and reads.count >= 1


async def test_a_commit_just_under_the_payload_limit_is_carried(
    nodes: tuple[Node, Node], monkeypatch: pytest.MonkeyPatch
) -> None:
    """PostgreSQL takes the largest payload notifications() builds (it refuses 8000 bytes)."""
    a, b = nodes
    await b.workspaces.head(W)
    reads = Reads(b.store, monkeypatch)
    await a.workspaces.publish(W, [message("")], producer="alice")
    probe = (await a.workspaces.publish(W, [message("")], producer="alice")).events[0]
    await wait_for(lambda: len(b.recorder.seen.get(W, [])) == 2)
    reads.count = 0
    carried_before = b.follower.carried
    # The payload of one event is "demo:3:[" + body + "]": pad the text to just fit (the
    # probe, seq 2, has a prev as seq 3 will).
    overhead = len(f"{W}:3:[]") + len(encode_event(probe))
    text = "y" * (CARRY_MAX - overhead - 8)
    await a.workspaces.publish(W, [message(text)], producer="alice")
    full = await log_of(a.store)
    await wait_for(lambda: b.recorder.seen.get(W) == full)
    assert b.follower.carried == carried_before + 1 and reads.count == 0


async def test_carried_events_that_do_not_continue_the_head_are_read_instead(
    nodes: tuple[Node, Node],
) -> None:
    """A catch-up folds carried events only when they decode as events of the workspace
    continuing its head; anything else is read back from the log. Each case has a workspace
    of its own, open at head 0 on a Workspaces of B's store that no follower feeds (so only
    this catch-up folds), and what its listener gets shows which was folded."""
    a, b = nodes
    here = Workspaces(b.store, snapshot_every=0)
    recorder = Recorder()
    here.add_listener(recorder)
    other = (await a.workspaces.publish("other", [message("o")], producer="alice")).events[0]
    cases = {
        "garbage": lambda events: b"[not json",
        # seq 1, but of another workspace: folded, it would stand in for this one's seq 1
        "foreign": lambda events: b"[" + encode_event(other) + b"]",
        # after a gap (seq 2..4 while the head is 0): left to the read
        "gap": lambda events: b"[" + b",".join(encode_event(e) for e in events[1:]) + b"]",
    }
    for name, carried in cases.items():
        await here.head(name)  # open before A writes
        written = (
            await a.workspaces.publish(name, [message(str(i)) for i in range(4)], producer="a")
        ).events
        assert await here.catch_up(name, 4, [carried(written)]) == 4
        assert recorder.seen.get(name) == [(e.seq, e.id) for e in written], name
    await here.head("valid")
    written = (await a.workspaces.publish("valid", [message("v")], producer="a")).events
    valid = b"[" + encode_event(written[0]) + b"]"
    assert await here.catch_up("valid", 1, [valid]) == 1  # the control: used as carried
    assert recorder.seen.get("valid") == [(1, written[0].id)]
    await here.aclose()


def test_notifications_carry_what_fits_and_parse_back() -> None:
    events = [
        MessagePosted(
            id=f"e{i}", workspace=W, seq=i + 1, position=i + 1, payload=MessagePayload(text="t")
        )
        for i in range(3)
    ]
    rows = [(e, encode_event(e)) for e in events]
    tip = (3, "h", 3, 0)
    (payload,) = notifications(rows, [W], [tip])
    assert payload == f"{W}:3:[" + b",".join(b for _, b in rows).decode() + "]"
    assert parse_notification(payload) == (W, 3, payload.split(":", 2)[2].encode())
    big = [(e, b"x" * 4000) for e in events]
    assert notifications(big, [W], [tip]) == [f"{W}:3"]
    assert parse_notification(f"{W}:3") == (W, 3, None)
    assert parse_notification("someone else's") is None
    assert parse_notification(f"{W}:x:[]") is None
