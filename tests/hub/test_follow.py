"""The one history-then-live reader (hub/follow.py) on a real SQLite log: every event after
``after_seq`` once, in order, across the switch from the store to live commits, when a slow
reader's buffer overflows, and for events another node appended behind this process's back."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from hub.core.events import Event, MessagePayload, MessagePosted
from hub.follow import FollowerClosed, LogFollower
from hub.log.sqlite import SqliteEventStore
from hub.workspaces import Workspaces
from tests.support.waiting import wait_for

W = "follow"


def texts(n: int, start: int = 0) -> list[Event]:
    return [MessagePosted(payload=MessagePayload(text=str(i))) for i in range(start, start + n)]


@pytest.fixture
async def workspaces(tmp_path: Path) -> AsyncIterator[Workspaces]:
    async with SqliteEventStore(tmp_path / "agora.db", blobs_dir=tmp_path / "blobs") as store:
        ws = Workspaces(store)
        yield ws
        await ws.aclose()


@contextlib.asynccontextmanager
async def following(
    workspaces: Workspaces, after_seq: int = 0, **options: Any
) -> AsyncIterator[tuple[LogFollower, AsyncIterator[Event]]]:
    """An installed follower and one open ``follow`` of :data:`W`, both closed on exit."""
    follower = LogFollower(workspaces, **options)
    async with follower, contextlib.aclosing(follower.follow(W, after_seq)) as events:
        yield follower, events


async def take(events: AsyncIterator[Event], n: int) -> list[int]:
    """The seqs of the next ``n`` events (bounded: a missing event fails, never hangs)."""
    async with asyncio.timeout(30):
        return [(await anext(events)).seq for _ in range(n)]


async def test_history_then_live_without_gap_or_duplicate(workspaces: Workspaces) -> None:
    await workspaces.publish(W, texts(5), producer="alice")
    async with LogFollower(workspaces) as follower:
        events = follower.follow(W)
        assert await take(events, 5) == [1, 2, 3, 4, 5]  # history
        await workspaces.publish(W, texts(3, 5), producer="alice")
        assert await take(events, 3) == [6, 7, 8]  # live
        assert follower.readers(W) == 1
        await events.aclose()
        assert follower.readers() == 0


async def test_after_seq_skips_what_the_reader_has(workspaces: Workspaces) -> None:
    await workspaces.publish(W, texts(4), producer="alice")
    async with following(workspaces, after_seq=3) as (_, events):
        assert await take(events, 1) == [4]


async def test_commits_during_the_catch_up_are_neither_lost_nor_repeated(
    workspaces: Workspaces,
) -> None:
    await workspaces.publish(W, texts(3), producer="alice")
    async with following(workspaces) as (_, events):
        first = await take(events, 1)  # the reader is registered, mid-history
        for i in range(10):  # committed while it is still reading the store
            await workspaces.publish(W, texts(1, 100 + i), producer="bob")
        assert first + await take(events, 12) == list(range(1, 14))


async def test_a_commit_racing_the_store_read_is_yielded_once(
    workspaces: Workspaces, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An event committed while the follower reads the store reaches it twice (in the page
    and in its live buffer); it is yielded once."""
    await workspaces.publish(W, texts(2), producer="alice")
    read_batch = workspaces.store.read_batch
    raced: list[object] = []

    async def racing_read(workspace: str, **kw: Any) -> list[Event]:
        if workspace == W and not raced:
            raced.append(await workspaces.publish(W, texts(1, 2), producer="bob"))
        return await read_batch(workspace, **kw)

    monkeypatch.setattr(workspaces.store, "read_batch", racing_read)
    async with following(workspaces) as (_, events):
        assert await take(events, 3) == [1, 2, 3]
        await workspaces.publish(W, texts(1, 3), producer="alice")
        assert await take(events, 1) == [4]  # not 3 again


async def test_a_slow_reader_overflows_and_catches_up_from_the_store(
    workspaces: Workspaces,
) -> None:
    async with following(workspaces, buffer=4) as (_, events):
        await workspaces.publish(W, texts(1), producer="alice")
        assert await take(events, 1) == [1]
        for i in range(20):  # far more than its buffer while it does not read
            await workspaces.publish(W, texts(1, i), producer="alice")
        assert await take(events, 20) == list(range(2, 22))


async def test_events_appended_by_another_node_arrive_by_polling(workspaces: Workspaces) -> None:
    async with following(workspaces, poll_interval=0.05) as (follower, events):
        reading = asyncio.create_task(take(events, 2))
        await wait_for(lambda: follower.readers(W) == 1)
        # Straight into the store: no listener of this process hears of it.
        await workspaces.store.append(W, texts(2))
        assert await reading == [1, 2]


async def test_closing_ends_every_follow_and_refuses_new_ones(workspaces: Workspaces) -> None:
    follower = LogFollower(workspaces)
    follower.install()
    events = follower.follow(W)
    reading = asyncio.create_task(take(events, 1))
    await wait_for(lambda: follower.readers(W) == 1)
    await follower.aclose()
    with pytest.raises(FollowerClosed):
        await reading
    assert follower.closed and follower.readers() == 0
    with pytest.raises(FollowerClosed):
        await anext(follower.follow(W))


def test_a_buffer_must_hold_an_event(workspaces: Workspaces) -> None:
    with pytest.raises(ValueError, match="buffer"):
        LogFollower(workspaces, buffer=0)
