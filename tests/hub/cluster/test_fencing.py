"""A node declared dead while it was alive (paused longer than the node timeout, SIGSTOP here)
stops once it learns it, with real ``agora serve`` nodes on PostgreSQL: the survivor has
already recorded its members gone and closed its executions, so it must not serve on as if
alive. Its clients are closed and move to a live node; the process exits 75 for its supervisor
to start it afresh (hub.cluster.heartbeat, docs/operations.md)."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from hub.commands.serve import EXIT_FENCED
from hub.core.events import MemberJoined, MemberLeft
from hub.log.postgres import PostgresEventStore
from tests.hub.cluster.test_members import WITHIN, reaped, until_joined, until_left
from tests.support.hub import StartHub
from tests.support.peer import peer
from tests.support.tokens import mint
from tests.support.waiting import wait_for


@pytest.mark.slow
async def test_a_node_declared_dead_while_alive_stops_and_its_clients_move(
    pg_url: str, pg_store: PostgresEventStore, start_node: StartHub
) -> None:
    node_a = start_node(pg_url, node_id="node-a")
    node_b = start_node(pg_url, node_id="node-b")
    assert node_b.proc is not None
    async with (
        peer(node_a.url, mint("obs")) as observer,
        peer(node_b.url, mint("ann")) as ann,
    ):
        for p in (observer, ann):
            assert (await p.call("subscribe", workspace="w", afterSeq=0))["op"] == "subscribed"
        await until_joined(observer, "w", {("obs", "node-a"), ("ann", "node-b")})

        # Node B is paused past the timeout: node A declares it dead and closes its members.
        os.kill(node_b.proc.pid, signal.SIGSTOP)
        try:
            event = await until_left(observer, "w", "ann")
            assert event["payload"] == {"agent": "ann", "reason": "interrupted", "node": "node-b"}
            await wait_for(lambda: reaped(pg_store, "node-b"), within=WITHIN)
        finally:
            os.kill(node_b.proc.pid, signal.SIGCONT)

        # Resumed, node B learns it at its next beat: it closes its clients and exits 75.
        closed = await ann.closed(within=WITHIN)
        assert closed.rcvd is not None and closed.rcvd.code == 1001, closed
        code = await asyncio.to_thread(node_b.proc.wait, WITHIN)
        assert code == EXIT_FENCED, node_b.log()
        assert "declared dead by the other nodes" in node_b.log()

    # The client moves to node A: present again, through the live node.
    async with peer(node_a.url, mint("ann")) as again, peer(node_a.url, mint("obs")) as obs:
        assert (await again.call("subscribe", workspace="w", afterSeq=0))["op"] == "subscribed"

        async def ann_present() -> bool:
            state = await obs.call("state", workspace="w")
            return state["state"]["members"]["ann"]["present"] is True

        await wait_for(ann_present, within=WITHIN)
    presence = [
        (type(e).__name__, e.payload.agent, e.payload.node)
        async for e in pg_store.read("w")
        if isinstance(e, MemberJoined | MemberLeft) and e.payload.agent == "ann"
    ]
    assert presence[:2] == [("MemberJoined", "ann", "node-b"), ("MemberLeft", "ann", "node-b")]
    assert presence[-1] == ("MemberJoined", "ann", "node-a")
    # (Node B's own leave at its stop may follow the survivor's: a second leave changes
    # nothing, the agent was already gone.)
