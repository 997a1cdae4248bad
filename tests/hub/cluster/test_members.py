"""A dead node's members get ``memberLeft``: in-process over PostgreSQL (who, once), and with
real ``agora serve`` nodes, one of them killed with SIGKILL (seen through the survivor)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from hub.cluster.members import StrandedMembers
from hub.core.events import MemberJoined, MemberLeft, MemberPayload
from hub.core.rules.presence import departures
from hub.log.postgres import PostgresEventStore
from hub.workspaces import Workspaces
from tests.support.hub import StartHub
from tests.support.peer import Frame, Peer, peer
from tests.support.postgres import POSTGRES_DSN
from tests.support.tokens import mint
from tests.support.waiting import wait_for


def joined(agent: str, node: str | None) -> MemberJoined:
    return MemberJoined(payload=MemberPayload(agent=agent, node=node))


def left(agent: str, node: str | None) -> MemberLeft:
    return MemberLeft(payload=MemberPayload(agent=agent, reason="closed", node=node))


@pytest.fixture
async def workspaces(pg_schema: str) -> AsyncIterator[Workspaces]:
    async with PostgresEventStore(POSTGRES_DSN, schema=pg_schema, pool_size=3) as store:
        yield Workspaces(store, snapshot_every=0)


async def write(workspaces: Workspaces, workspace: str, *events: MemberJoined | MemberLeft) -> None:
    for event in events:
        await workspaces.publish(workspace, [event], producer=event.payload.agent, trusted=True)


async def beating(schema: str, *nodes: str) -> None:
    """Rows of live nodes (beating now) in the schema's ``nodes``."""
    conn = await asyncpg.connect(POSTGRES_DSN)
    try:
        for node in nodes:
            await conn.execute(f'INSERT INTO "{schema}".nodes (node_id) VALUES ($1)', node)
    finally:
        await conn.close()


def closer(workspaces: Workspaces, schema: str, node: str = "survivor") -> StrandedMembers:
    return StrandedMembers(POSTGRES_DSN, schema, workspaces, node, timeout=10.0)


async def present(workspaces: Workspaces, workspace: str) -> set[str]:
    state = await workspaces.state(workspace)
    return {agent for agent, m in state.members.items() if m.present}


async def test_only_the_members_present_through_the_dead_node_alone_leave(
    workspaces: Workspaces, pg_schema: str
) -> None:
    await beating(pg_schema, "live")
    await write(
        workspaces,
        "w1",
        joined("ann", "dead"),  # through the dead node only: leaves
        joined("bob", "dead"),
        joined("bob", "live"),  # also through a live node: stays
        joined("cid", "live"),  # another node's: stays
        joined("dan", "dead"),
        left("dan", "dead"),  # gone already: nothing more
        joined("eve", None),  # no node (an A2A member): stays
    )
    await write(workspaces, "w2", joined("ann", "dead"), joined("fay", "gone"))
    members = closer(workspaces, pg_schema)
    found = await members.present_through("dead")
    assert [(m.workspace, m.agent) for m in found] == [("w1", "ann"), ("w2", "ann")]
    assert await members.close("dead") == 2
    assert await members.present_through("dead") == []
    assert await members.close("dead") == 0  # nothing left, nothing twice
    assert await present(workspaces, "w1") == {"bob", "cid", "eve"}
    assert await present(workspaces, "w2") == {"fay"}  # node "gone" is not reaped here

    (last,) = await workspaces.store.read_batch("w1", after_seq=7, limit=10)
    assert isinstance(last, MemberLeft) and last.producer == "ann"
    assert last.payload == MemberPayload(agent="ann", reason="interrupted", node="dead")
    assert last.id == departures(found[0], "dead")[0].id


async def test_a_second_closer_racing_the_first_writes_nothing(
    workspaces: Workspaces, pg_schema: str
) -> None:
    await write(workspaces, "w", joined("ann", "dead"))
    other = Workspaces(workspaces.store, snapshot_every=0)
    pending = await closer(other, pg_schema, "s2").present_through("dead")
    assert await closer(workspaces, pg_schema, "s1").close("dead") == 1
    for member in pending:  # as if the second survivor had read before the first wrote
        result = await other.publish(
            "w", departures(member, "dead"), producer=member.agent, trusted=True
        )
        assert result.duplicate
    assert [e.kind async for e in workspaces.store.read("w")] == ["memberJoined", "memberLeft"]


async def test_a_join_through_a_live_node_meanwhile_keeps_the_agent(
    workspaces: Workspaces, pg_schema: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent reconnects through a live node between the survivor's read and its append:
    the append (at the head it read) is refused, the decision taken again: no leave."""
    await beating(pg_schema, "live")
    await write(workspaces, "w", joined("ann", "dead"))
    members = closer(workspaces, pg_schema)
    read = members._read  # the moment between the read and the append
    raced = False

    async def read_then_race(*args: Any) -> Any:
        nonlocal raced
        result = await read(*args)
        if not raced:
            raced = True
            other = Workspaces(workspaces.store, snapshot_every=0)
            await write(other, "w", joined("ann", "live"))
        return result

    monkeypatch.setattr(members, "_read", read_then_race)
    assert await members.close("dead") == 0
    assert raced
    assert await present(workspaces, "w") == {"ann"}


# -- real nodes -------------------------------------------------------------------------------

WITHIN = 15.0
"""Seconds the survivor may take: the node timeout (1.5 s in these tests' nodes), a reaping
round (a heartbeat) and the writes, with room for a loaded machine."""


async def until_left(observer: Peer, workspace: str, agent: str) -> Frame:
    """The next ``memberLeft`` of ``agent`` that ``observer`` receives."""
    async with asyncio.timeout(WITHIN):
        while True:
            frame = await observer.recv(within=WITHIN)
            event = frame.get("event") or {}
            if (
                frame.get("op") == "event"
                and frame.get("workspace") == workspace
                and event.get("kind") == "memberLeft"
                and event["payload"]["agent"] == agent
            ):
                return event


async def until_joined(observer: Peer, workspace: str, joins: set[tuple[str, str]]) -> None:
    """Until ``observer`` has seen a ``memberJoined`` of every (agent, node) of ``joins``."""
    seen: set[tuple[str, str]] = set()
    async with asyncio.timeout(WITHIN):
        while not joins <= seen:
            frame = await observer.recv(within=WITHIN)
            event = frame.get("event") or {}
            if frame.get("workspace") == workspace and event.get("kind") == "memberJoined":
                seen.add((event["payload"]["agent"], event["payload"]["node"]))


@pytest.mark.slow
async def test_the_agents_of_a_killed_node_leave_unless_present_through_another(
    pg_url: str, pg_store: PostgresEventStore, start_node: StartHub
) -> None:
    node_a = start_node(pg_url, node_id="node-a")
    node_b = start_node(pg_url, node_id="node-b")
    async with (
        peer(node_b.url, mint("obs")) as observer,
        peer(node_a.url, mint("ann")) as ann,
        peer(node_a.url, mint("bob")) as bob_a,
        peer(node_b.url, mint("bob")) as bob_b,
    ):
        reply = await observer.call("subscribe", workspace="w", afterSeq=0)
        assert reply["op"] == "subscribed", reply
        for p in (ann, bob_a, bob_b):
            assert (await p.call("subscribe", workspace="w", afterSeq=0))["op"] == "subscribed"
        await until_joined(
            observer,
            "w",
            {("obs", "node-b"), ("ann", "node-a"), ("bob", "node-a"), ("bob", "node-b")},
        )

        node_a.kill()  # SIGKILL: node A writes nothing more
        event = await until_left(observer, "w", "ann")
        assert event["payload"] == {"agent": "ann", "reason": "interrupted", "node": "node-a"}
        assert event["producer"] == "ann"

        # Reaped (the hooks ran): bob, still connected through node B, stays; ann left once.
        await wait_for(lambda: reaped(pg_store, "node-a"), within=WITHIN)
        state = await observer.call("state", workspace="w")
        members = state["state"]["members"]
        assert members["ann"]["present"] is False
        assert members["bob"]["present"] is True and members["obs"]["present"] is True
        leaves = [e.payload.agent async for e in pg_store.read("w") if isinstance(e, MemberLeft)]
        assert leaves == ["ann"]


async def reaped(store: PostgresEventStore, node: str) -> bool:
    conn = await asyncpg.connect(POSTGRES_DSN)
    try:
        sql = f'SELECT reaped_at IS NOT NULL FROM "{store.schema}".nodes WHERE node_id = $1'
        return bool(await conn.fetchval(sql, node))
    finally:
        await conn.close()
