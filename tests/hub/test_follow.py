"""hub.follow.LogFollower over a real SQLite store: history then live with no gap and no
duplicate, a slow reader whose buffer overflows catching up from the store, and closing."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from hub.core.events import Event, MessagePayload, MessagePosted
from hub.follow import FollowerClosed, LogFollower
from hub.log.sqlite import SqliteEventStore
from hub.workspaces import Workspaces


@pytest.fixture
async def workspaces(tmp_path: Path) -> AsyncIterator[Workspaces]:
    async with SqliteEventStore(tmp_path / "agora.db", blobs_dir=tmp_path / "blobs") as store:
        ws = Workspaces(store)
        try:
            yield ws
        finally:
            await ws.aclose()


async def publish(ws: Workspaces, n: int, workspace: str = "w") -> None:
    for i in range(n):
        await ws.publish(
            workspace, [MessagePosted(payload=MessagePayload(text=str(i)))], producer="a"
        )


async def take(follower: LogFollower, n: int, after_seq: int = 0) -> list[int]:
    seqs: list[int] = []
    async with asyncio.timeout(30), contextlib.aclosing(follower.follow("w", after_seq)) as events:
        async for ev in events:
            seqs.append(ev.seq)
            if len(seqs) == n:
                break
    return seqs


async def test_history_then_live(workspaces: Workspaces) -> None:
    await publish(workspaces, 5)
    async with LogFollower(workspaces) as follower:
        reader = asyncio.create_task(take(follower, 8, after_seq=2))
        await publish(workspaces, 5)  # live, possibly racing the history read
        assert await reader == list(range(3, 11))
        assert follower.readers() == 0  # the reader left when the caller stopped


async def test_a_slow_reader_overflows_and_catches_up_from_the_store(
    workspaces: Workspaces,
) -> None:
    async with LogFollower(workspaces, buffer=2, poll_interval=30) as follower:
        seen: list[int] = []
        first = asyncio.Event()
        go = asyncio.Event()

        async def slow() -> None:
            async for ev in follower.follow("w"):
                seen.append(ev.seq)
                if ev.seq == 1:
                    first.set()
                    await go.wait()  # stalls while 9 more commit: the buffer (2) overflows
                if ev.seq == 10:
                    return

        task = asyncio.create_task(slow())
        await publish(workspaces, 1)
        async with asyncio.timeout(30):
            await first.wait()
        await publish(workspaces, 9)
        go.set()
        async with asyncio.timeout(30):
            await task
        assert seen == list(range(1, 11))


async def test_closing_ends_the_readers(workspaces: Workspaces) -> None:
    follower = LogFollower(workspaces)
    follower.install()
    events: list[Event] = []

    async def read() -> None:
        async for ev in follower.follow("w"):
            events.append(ev)

    task = asyncio.create_task(read())
    await asyncio.sleep(0)  # the task's first step registers its reader, then reads the store
    assert follower.readers("w") == 1
    await follower.aclose()
    with pytest.raises(FollowerClosed):
        async with asyncio.timeout(30):
            await task
    with pytest.raises(FollowerClosed):
        await anext(follower.follow("w"))
    assert events == []
