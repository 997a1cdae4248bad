"""``[cluster] owners`` (issue 16 item 5): one node decides each workspace, the others relay
its frames there. Real ``agora serve`` nodes on one PostgreSQL schema: a client on either node
is served by the workspace's owner (its presence is recorded by the owner's node), subscribers
on every node see one sequence, and when the owner is killed under load its workspace moves to
a survivor with no acknowledged event lost or doubled."""

from __future__ import annotations

import asyncio
import itertools
from urllib.parse import parse_qs, urlsplit

import asyncpg
import pytest
import websockets.asyncio.client

from hub.client import Session, connect
from hub.core.backoff import Backoff
from hub.core.events import MemberJoined, MemberLeft, MessagePosted
from hub.core.sharding import node_owner_of
from hub.log.postgres import PostgresEventStore
from hub.server.workers import RELAY_HEADER
from tests.hub.cluster.agents import NODE_TIMEOUT_S, StartTs, dead_url, publish_pipelined
from tests.support.hub import HubProcess, StartHub
from tests.support.peer import Peer, message, peer
from tests.support.postgres import POSTGRES_DSN
from tests.support.tokens import mint
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

OWNERS = "[cluster]\nowners = true\n"
FAST = Backoff(initial=0.05, maximum=0.3, give_up_after=20.0)
NODES = ("node-a", "node-b")
SETTLE_S = 1.0  # five heartbeats: each node has taken in the others' URLs
PUBLISHED_WITHIN_S = 30.0


def owned_by(node: str, prefix: str, nodes: tuple[str, ...] = NODES) -> str:
    """A workspace name that ``node`` owns among ``nodes``."""
    return next(
        name
        for name in (f"{prefix}-{i}" for i in itertools.count())
        if node_owner_of(name, nodes) == node
    )


async def joins(store: PostgresEventStore, workspace: str, agent: str) -> list[str | None]:
    """The nodes that recorded ``agent`` joining ``workspace``, in order."""
    events = [e async for e in store.read(workspace)]
    return [
        e.payload.node for e in events if isinstance(e, MemberJoined) and e.payload.agent == agent
    ]


async def settled(pg_url: str, nodes: tuple[str, ...] = NODES) -> None:
    """Once every node of ``nodes`` is live as the nodes see it (its URL published, beating,
    neither stopped nor reaped: hub.cluster.heartbeat's query), and five heartbeats more: each
    node's live view, refreshed after every beat, has the others. (A fixed wait from the start
    was not enough on a loaded machine: a node still served a workspace another owned, for
    want of a view.)"""
    schema = parse_qs(urlsplit(pg_url).query)["schema"][0]
    query = (
        f'SELECT node_id FROM "{schema}".nodes WHERE url IS NOT NULL AND stopped_at IS NULL '
        "AND reaped_by IS NULL AND reaped_at IS NULL "
        f"AND last_beat >= now() - make_interval(secs => {NODE_TIMEOUT_S})"
    )
    conn = await asyncpg.connect(POSTGRES_DSN)  # one connection, polled: a light touch
    try:

        async def published() -> bool:
            return set(nodes) <= {row["node_id"] for row in await conn.fetch(query)}

        await wait_for(published, within=PUBLISHED_WITHIN_S)
    finally:
        await conn.close()
    await asyncio.sleep(SETTLE_S)


async def two_nodes(
    pg_url: str, start_node: StartHub, config: str = ""
) -> tuple[HubProcess, HubProcess]:
    a = start_node(pg_url, node_id="node-a", config=OWNERS + config)
    b = start_node(pg_url, node_id="node-b", config=OWNERS + config)
    await settled(pg_url)
    return a, b


async def test_a_client_on_either_node_is_served_by_the_owner(
    pg_url: str, start_node: StartHub, pg_store: PostgresEventStore
) -> None:
    """A subscription's presence is written by the connection that serves it, so its
    ``memberJoined`` names the owner's node, whichever node the client connected to."""
    a, b = await two_nodes(pg_url, start_node)
    on_a, on_b = owned_by("node-a", "wa"), owned_by("node-b", "wb")
    async with (
        connect(b.url, mint("alice"), backoff=FAST) as alice,
        connect(a.url, mint("bob"), backoff=FAST) as bob,
    ):
        for session, workspace in ((alice, on_a), (bob, on_b), (alice, on_b)):
            async with session.workspace(workspace).subscribe(after_seq=0) as sub:
                ack = await session.workspace(workspace).post_message(f"{session.agent} here")
                async for event in sub:
                    if event.seq == ack.seq:
                        break
        assert await joins(pg_store, on_a, "alice") == ["node-a"]  # relayed by b
        assert await joins(pg_store, on_b, "bob") == ["node-b"]  # relayed by a
        assert await joins(pg_store, on_b, "alice") == ["node-b"]  # its own node


async def test_an_agent_on_both_nodes_stays_present_when_it_leaves_one(
    pg_url: str, start_node: StartHub, pg_store: PostgresEventStore
) -> None:
    """Without owners presence is per node: an agent connected through two nodes that closes
    one connection is written as gone although the other still follows the workspace. With
    owners both connections are counted on the owner, which writes nothing until the last
    one goes."""
    # No grace for leaves: a close is written at once (default: held 5 s for a reconnect).
    a, b = await two_nodes(pg_url, start_node, "\n[server]\npresence_grace_s = 0\n")
    workspace = owned_by("node-a", "here")
    async with (
        connect(a.url, mint("carol"), backoff=FAST) as via_a,
        via_a.workspace(workspace).subscribe(after_seq=0),
    ):
        async with (
            connect(b.url, mint("carol"), backoff=FAST) as via_b,
            via_b.workspace(workspace).subscribe(after_seq=0),
        ):
            await via_b.workspace(workspace).post_message("both here")
        await asyncio.sleep(1.0)  # what b's close writes has been written
        ack = await via_a.workspace(workspace).post_message("still here")
        events = [e async for e in pg_store.read(workspace)]
        left = [e for e in events if isinstance(e, MemberLeft) and e.seq < ack.seq]
        assert left == []
        state = await via_a.workspace(workspace).state()
        assert "carol" in state.members


async def test_subscribers_on_both_nodes_see_one_sequence(
    pg_url: str, start_node: StartHub
) -> None:
    a, b = await two_nodes(pg_url, start_node)
    workspace = owned_by("node-a", "seq")
    total = 40
    async with (
        connect(a.url, mint("ra")) as ra,
        connect(b.url, mint("rb")) as rb,
        connect(a.url, mint("wa"), backoff=FAST) as wa,
        connect(b.url, mint("wb"), backoff=FAST) as wb,
    ):

        async def read(reader: Session) -> list[tuple[int, str]]:
            seen: list[tuple[int, str]] = []
            async with reader.workspace(workspace).subscribe(after_seq=0) as sub:
                async for event in sub:
                    if isinstance(event, MessagePosted):
                        seen.append((event.seq, event.payload.text or ""))
                        if len(seen) == 2 * total:
                            return seen
            return seen

        async with asyncio.TaskGroup() as tg:
            got_a = tg.create_task(read(ra))
            got_b = tg.create_task(read(rb))
            for i in range(total):
                await wa.workspace(workspace).post_message(f"a{i}")
                await wb.workspace(workspace).post_message(f"b{i}")
        assert got_a.result() == got_b.result()
        seqs = [seq for seq, _ in got_a.result()]
        assert seqs == sorted(set(seqs))


async def test_the_owner_killed_under_load_moves_its_workspace_losing_nothing(
    pg_url: str, start_node: StartHub, pg_store: PostgresEventStore
) -> None:
    """Writers on B pipeline publishes into a workspace A owns (relayed to A); A dies by
    SIGKILL with publishes in flight. B's relays close the writers' connections (1013); they
    resume on B, whose frames wait for the owner until A leaves the live nodes (its timeout),
    and B decides the workspace from then on. Every publish is acknowledged, each event is in
    the log once, in one gapless chain."""
    a, b = await two_nodes(pg_url, start_node)
    workspace = owned_by("node-a", "load")
    writers, per_writer, window = 4, 60, 8
    acked: dict[str, int] = {}
    killed = asyncio.Event()

    def kill_at_a_third() -> None:
        if len(acked) == writers * per_writer // 3 and not killed.is_set():
            killed.set()
            a.kill()

    async def write(k: int) -> None:
        async with connect(b.url, mint(f"w{k}"), backoff=FAST) as session:
            ws = session.workspace(workspace)
            # Subscribed too, so that each node that serves it records the writer's join.
            async with ws.subscribe():
                await publish_pipelined(ws, f"w{k}", per_writer, window, acked, kill_at_a_third)
            assert session.reconnects >= 1

    async with asyncio.TaskGroup() as tg:
        for k in range(writers):
            tg.create_task(write(k))
    assert killed.is_set() and len(acked) == writers * per_writer
    events = [e async for e in pg_store.read(workspace)]
    messages = [e for e in events if isinstance(e, MessagePosted)]
    assert len({e.id for e in messages}) == len(messages) == writers * per_writer
    by_id = {e.id: e.seq for e in messages}
    assert all(by_id[i] == seq for i, seq in acked.items())
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    # Served by A, then (after A's timeout) by B.
    for k in range(writers):
        served = await joins(pg_store, workspace, f"w{k}")
        assert served[0] == "node-a" and served[-1] == "node-b", served


async def test_a_client_that_leaves_while_its_frame_waits_for_a_dead_owner_frees_the_relay(
    pg_url: str, start_node: StartHub
) -> None:
    """Its owner killed, a workspace's frames wait on B while the dead node is still the
    owner (B tries its URL again). A client that goes away meanwhile ends the wait: B goes on
    serving (it used to place that frame anew forever, without yielding: the node froze)."""
    a, b = await two_nodes(pg_url, start_node)
    dead = owned_by("node-a", "dead")
    alive = owned_by("node-b", "alive")
    a.kill()
    async with peer(b.url, mint("leaver")) as p:
        await p.send({"op": "publish", "rid": 1, "workspace": dead, "event": message("held")})
        await asyncio.sleep(0.1)  # held: node-a refuses, and is the owner for ~1.5 s more
    await asyncio.sleep(1.0)  # node-b has tried node-a again since the client left
    async with asyncio.timeout(5), connect(b.url, mint("other"), backoff=FAST) as other:
        assert (await other.workspace(alive).post_message("b still serves")).seq >= 1


async def test_a_connection_whose_workspace_moves_is_closed_and_resumes_on_the_new_owner(
    pg_url: str, start_node: StartHub, pg_store: PostgresEventStore
) -> None:
    """A workspace stays where a connection's frames first went: when a node joins and wins
    it, the connection that uses it there is closed (1013) at its next frame for it, and its
    client resumes, now relayed to the new owner: every event once, in order."""
    a = start_node(pg_url, node_id="node-a", config=OWNERS)
    workspace = owned_by("node-b", "moving")  # node-a's alone until node-b starts
    async with connect(a.url, mint("mover"), backoff=FAST) as session:
        ws = session.workspace(workspace)
        seen: list[int] = []
        async with ws.subscribe(after_seq=0) as sub:
            first = await ws.post_message("before")
            start_node(pg_url, node_id="node-b", config=OWNERS)
            await settled(pg_url)
            second = await ws.post_message("after")  # closes, resumes, relayed to node-b
            async for event in sub:
                seen.append(event.seq)
                if event.seq >= second.seq:
                    break
        assert session.reconnects >= 1
        assert seen == sorted(set(seen)) and first.seq in seen and second.seq in seen
    served = await joins(pg_store, workspace, "mover")
    assert served[0] == "node-a" and served[-1] == "node-b", served


async def test_a_client_cannot_forge_the_relay_header(
    pg_url: str, start_node: StartHub, pg_store: PostgresEventStore
) -> None:
    """``Agora-Relay`` without the nodes' proof is ignored: the connection is relayed to the
    owner like any other (its join names the owner's node)."""
    _, b = await two_nodes(pg_url, start_node)
    workspace = owned_by("node-a", "forged")
    headers = {RELAY_HEADER: "node-a 00", "Authorization": f"Bearer {mint('forger')}"}
    async with websockets.asyncio.client.connect(b.url, additional_headers=headers) as ws:
        p = Peer(ws)
        assert (await p.recv())["op"] == "welcome"
        assert (await p.call("subscribe", workspace=workspace))["op"] == "subscribed"
        assert (await p.call("publish", workspace=workspace, event=message()))["op"] == "ack"
    assert await joins(pg_store, workspace, "forger") == ["node-a"]


async def test_a_client_given_every_node_moves_off_one_that_cannot_reach_the_owner(
    pg_url: str, start_node: StartHub, pg_store: PostgresEventStore, ts_session: StartTs
) -> None:
    """Node A publishes a URL node B cannot reach (a cut between them; A itself is fine): B
    holds a frame for A's workspace, then closes its client with 1013. A client given both
    nodes then tries the next node first, where the owner serves it (it used to go back to B
    until it gave up). The same for the TypeScript client."""
    a = start_node(pg_url, node_id="node-a", config=OWNERS + f'url = "{dead_url()}"\n')
    b = start_node(pg_url, node_id="node-b", config=OWNERS)
    await settled(pg_url)
    workspace = owned_by("node-a", "cut")
    async with connect([b.url, a.url], mint("cutoff"), backoff=FAST) as session:
        assert session.url == b.url
        ack = await session.workspace(workspace).post_message("via a, after b's 1013")
        assert session.url == a.url and session.reconnects >= 1
        assert session.last_close is not None and session.last_close[0] == 1013
    events = [e async for e in pg_store.read(workspace)]
    assert [e.seq for e in events if isinstance(e, MessagePosted)] == [ack.seq]
    writer = await ts_session(
        "write",
        urls=[b.url, a.url],
        token=mint("ts-cutoff"),
        workspace=workspace,
        count=3,
        window=1,
    )
    assert (await writer.until("ready"))["ready"] == b.url
    result = await writer.until("acks")
    assert result["url"] == a.url and result["reconnects"] >= 1 and len(result["acks"]) == 3
