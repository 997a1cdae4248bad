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
