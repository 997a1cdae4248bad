"""hub.server.presence over real Workspaces on SQLite: one ``memberJoined`` for an agent's
first subscription to a workspace and one ``memberLeft`` for its last, in the order of the
transitions, and the presence a crashed run left open closed on start."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from hub.core.events import Event, MemberJoined, MemberPayload
from hub.log.sqlite import SqliteEventStore
from hub.server.presence import Presence
from hub.server.tasks import OwnedTasks
from hub.workspaces import Workspaces
from tests.support.waiting import wait_for


@pytest.fixture
async def workspaces(tmp_path: Path) -> AsyncIterator[Workspaces]:
    async with SqliteEventStore(tmp_path / "agora.db", blobs_dir=tmp_path / "blobs") as store:
        ws = Workspaces(store)
        try:
            yield ws
        finally:
            await ws.aclose()


async def log_of(ws: Workspaces, workspace: str) -> list[tuple[str, str, str | None]]:
    events: list[Event] = [ev async for ev in ws.store.read(workspace)]
    return [
        (ev.kind, ev.payload.agent, ev.payload.reason)  # type: ignore[attr-defined]
        for ev in events
    ]


async def test_first_in_and_last_out_are_recorded_in_order(workspaces: Workspaces) -> None:
    tasks = OwnedTasks()
    presence = Presence(workspaces, tasks, grace_s=0)
    async with asyncio.TaskGroup() as tg:  # waits for every write, as the hub's group does
        tasks.attach(tg)
        presence.enter("alice", "w")
        presence.enter("alice", "w")  # a second connection: no event
        presence.exit("alice", "w", "closed")
        assert presence.count("alice", "w") == 1
        presence.exit("alice", "w", "unsubscribed")
        presence.enter("alice", "w")
        presence.exit("alice", "w", "tooSlow")
        presence.enter("bob", "w")
    tasks.detach()
    assert presence.count("alice", "w") == 0 and presence.count("bob", "w") == 1
    written = await log_of(workspaces, "w")
    # Ordered per (agent, workspace); different agents' writes may interleave.
    assert [e for e in written if e[1] == "alice"] == [
        ("memberJoined", "alice", None),
        ("memberLeft", "alice", "unsubscribed"),
        ("memberJoined", "alice", None),
        ("memberLeft", "alice", "tooSlow"),
    ]
    assert [e for e in written if e[1] == "bob"] == [("memberJoined", "bob", None)]


async def test_every_presence_event_names_the_node_it_was_written_through(
    workspaces: Workspaces,
) -> None:
    """The survivor that reaps a dead node finds its members by this (hub.cluster.members)."""
    tasks = OwnedTasks()
    presence = Presence(workspaces, tasks, grace_s=0, node="node-a")
    async with asyncio.TaskGroup() as tg:
        tasks.attach(tg)
        presence.enter("alice", "w")
        presence.exit("alice", "w", "closed")
    tasks.detach()
    events: list[Event] = [ev async for ev in workspaces.store.read("w")]
    assert [(ev.kind, ev.payload.node) for ev in events] == [  # type: ignore[attr-defined]
        ("memberJoined", "node-a"),
        ("memberLeft", "node-a"),
    ]


async def test_a_return_within_the_grace_window_writes_nothing(workspaces: Workspaces) -> None:
    """A leave is held for ``grace_s``: coming back within it cancels it (no pair in the
    log); a held leave is written when the window passes or the hub stops (flush); a leave
    for shutdown is written at once."""
    tasks = OwnedTasks()
    presence = Presence(workspaces, tasks, grace_s=3600)  # only flush ends a held leave here
    async with asyncio.TaskGroup() as tg:
        tasks.attach(tg)
        presence.enter("alice", "w")
        for _ in range(3):  # three reconnects
            presence.exit("alice", "w", "closed")
            presence.enter("alice", "w")
        assert presence.reconnects_absorbed == 3
        presence.exit("alice", "w", "tooSlow")  # held
        presence.enter("bob", "w")
        presence.exit("bob", "w", "shutdown")  # at once
        presence.flush()  # the hub stops: alice's held leave is written, with its reason
    tasks.detach()
    written = await log_of(workspaces, "w")
    assert [e for e in written if e[1] == "alice"] == [
        ("memberJoined", "alice", None),
        ("memberLeft", "alice", "tooSlow"),
    ]
    assert [e for e in written if e[1] == "bob"] == [
        ("memberJoined", "bob", None),
        ("memberLeft", "bob", "shutdown"),
    ]


async def test_a_held_leave_is_written_when_the_window_passes(workspaces: Workspaces) -> None:
    tasks = OwnedTasks()
    presence = Presence(workspaces, tasks, grace_s=0.05)
    async with asyncio.TaskGroup() as tg:
        tasks.attach(tg)
        presence.enter("carol", "w")
        presence.exit("carol", "w", "closed")

        async def both_written() -> bool:
            return len(await log_of(workspaces, "w")) == 2

        await wait_for(both_written, 30)
    tasks.detach()
    assert await log_of(workspaces, "w") == [
        ("memberJoined", "carol", None),
        ("memberLeft", "carol", "closed"),
    ]


async def test_nothing_is_written_while_the_hub_is_not_running(workspaces: Workspaces) -> None:
    # Never attached: stopping, or not started.
    presence = Presence(workspaces, OwnedTasks(), grace_s=0)
    presence.enter("alice", "w")
    assert presence.count("alice", "w") == 1
    assert await log_of(workspaces, "w") == []


async def test_recover_closes_what_a_crashed_run_left_present(workspaces: Workspaces) -> None:
    joined = MemberJoined(payload=MemberPayload(agent="alice", via="websocket"))
    await workspaces.publish("w", [joined], producer="alice", trusted=True)
    presence = Presence(workspaces, OwnedTasks(), grace_s=0)
    assert await presence.recover() == 1
    assert await log_of(workspaces, "w") == [
        ("memberJoined", "alice", None),
        ("memberLeft", "alice", "interrupted"),
    ]
    assert await presence.recover() == 0  # nobody is left present
