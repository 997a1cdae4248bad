"""Closing a dead node's running executions, in-process over PostgreSQL."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from hub.cluster.interrupted import HUB_PRODUCER, InterruptedExecutions, closing_event_id
from hub.core.events import (
    Event,
    ExecFinished,
    ExecFinishedPayload,
    ExecRequested,
)
from hub.log.postgres import PostgresEventStore
from hub.workspaces import Workspaces
from tests.support.lifecycle import finished, requested, started
from tests.support.postgres import POSTGRES_DSN


@pytest.fixture
async def workspaces(pg_schema: str) -> AsyncIterator[Workspaces]:
    async with PostgresEventStore(POSTGRES_DSN, schema=pg_schema, pool_size=3) as store:
        yield Workspaces(store, snapshot_every=0)


async def write(workspaces: Workspaces, workspace: str, *events: Event) -> None:
    for event in events:
        await workspaces.publish(workspace, [event], producer="agent", trusted=True)


async def test_closes_what_the_dead_node_left_running_once(
    workspaces: Workspaces, pg_schema: str
) -> None:
    await write(
        workspaces,
        "w1",
        requested("e1"),
        started("e1", "dead"),  # running on the dead node: closed
        requested("e2"),
        started("e2", "alive"),  # another node's: left alone
        requested("e3"),
        started("e3", "dead"),
        finished("e3", value={"text": "nul \x00 inside"}),  # finished already: left alone
        requested("e4"),  # requested, never started: no node to blame
    )
    await write(workspaces, "w2", requested("e1"), started("e1", "dead"))
    closer = InterruptedExecutions(POSTGRES_DSN, pg_schema, workspaces, "survivor")
    running = await closer.running_on("dead")
    assert [(e.workspace, e.payload.exec_id) for e in running] == [("w1", "e1"), ("w2", "e1")]
    assert await closer.close("dead") == 2
    assert await closer.running_on("dead") == []
    assert await closer.close("dead") == 0  # nothing left, nothing twice

    state = await workspaces.state("w1")
    assert state.executions["e1"].status == "failed"
    assert state.executions["e1"].reason == "interrupted"
    assert state.executions["e2"].status == "running"
    assert state.executions["e3"].status == "completed"
    assert (await workspaces.state("w2")).executions["e1"].status == "failed"

    store = workspaces.store
    last = (await store.read_batch("w1", after_seq=0, limit=100))[-1]
    start = (await store.read_batch("w1", after_seq=1, until_seq=2))[0]
    assert isinstance(last, ExecFinished) and last.producer == "agent"  # who asked for it
    assert last.id == closing_event_id("w1", "e1", start.seq)
    assert last.causation_id == start.id
    (note,) = last.payload.diagnostics
    assert note["code"] == "interrupted" and note["level"] == "error"
    assert (note["node"], note["closedBy"]) == ("dead", "survivor")


async def test_a_second_closer_racing_the_first_writes_nothing(
    workspaces: Workspaces, pg_schema: str
) -> None:
    """Two survivors whose claims overlapped (an expired lease) write one event, not two:
    the closing event's id is the same, and the store answers the second ``duplicate``."""
    await write(workspaces, "w", requested("e"), started("e", "dead"))
    other = Workspaces(workspaces.store, snapshot_every=0)
    first = InterruptedExecutions(POSTGRES_DSN, pg_schema, workspaces, "s1")
    second = InterruptedExecutions(POSTGRES_DSN, pg_schema, other, "s2")
    pending = await second.running_on("dead")
    assert await first.close("dead") == 1
    for start in pending:  # as if `second` had read before `first` wrote
        exec_id = start.payload.exec_id
        result = await other.publish(
            start.workspace,
            [
                ExecFinished(
                    id=closing_event_id(start.workspace, exec_id, start.seq),
                    payload=ExecFinishedPayload(exec_id=exec_id, status="failed", reason="x"),
                )
            ],
            producer=HUB_PRODUCER,
            trusted=True,
        )
        assert result.duplicate
    kinds = [e.kind async for e in workspaces.store.read("w")]
    assert kinds == ["execRequested", "execStarted", "execFinished"]


async def test_closes_what_the_dead_node_accepted_and_never_started_once(
    workspaces: Workspaces, pg_schema: str
) -> None:
    """An ``execRequested`` naming the dead node with neither ``execStarted`` nor
    ``execFinished`` since is closed like a started run, caused by the request, under the id a
    restart derives for it; a second pass writes nothing."""
    await write(
        workspaces,
        "w",
        requested("queued", "dead"),  # accepted on the dead node, never started: closed
        requested("done", "dead"),
        finished("done"),  # finished already: left alone
        requested("moved", "dead"),
        started("moved", "alive"),  # started on another node: left alone
        requested("theirs", "alive"),  # another node's: left alone
        requested("old"),  # names no node (written before requests did): not found
    )
    closer = InterruptedExecutions(POSTGRES_DSN, pg_schema, workspaces, "survivor")
    (opening,) = await closer.running_on("dead")
    assert isinstance(opening, ExecRequested) and opening.payload.exec_id == "queued"
    assert await closer.close("dead") == 1
    assert await closer.running_on("dead") == []
    assert await closer.close("dead") == 0

    state = await workspaces.state("w")
    assert (state.executions["queued"].status, state.executions["queued"].reason) == (
        "failed",
        "interrupted",
    )
    assert state.executions["done"].status == "completed"
    assert state.executions["moved"].status == "running"
    assert state.executions["theirs"].status == "requested"
    events = [e async for e in workspaces.store.read("w")]
    closing = events[-1]
    assert isinstance(closing, ExecFinished) and closing.payload.exec_id == "queued"
    assert [e.kind for e in events].count("execFinished") == 2  # done's and this one
    assert closing.id == closing_event_id("w", "queued", opening.seq)
    assert closing.causation_id == opening.id and closing.producer == "agent"
    (note,) = closing.payload.diagnostics
    assert (note["node"], note["closedBy"]) == ("dead", "survivor")
