"""hub.server.tasks: work owned by the hub's top-level group outlives the caller that started
it, and nothing runs there outside the group's lifetime; the in-flight count."""

from __future__ import annotations

import asyncio

import pytest

from hub.server.tasks import InFlight, OwnedTasks


async def test_owned_work_survives_its_caller_and_the_group_waits_for_it() -> None:
    tasks = OwnedTasks()
    release = asyncio.Event()
    done: list[str] = []

    async def write() -> str:
        await release.wait()
        done.append("written")
        return "ok"

    async with asyncio.TaskGroup() as tg:
        tasks.attach(tg)
        caller = asyncio.create_task(tasks.owned(write()))
        await asyncio.sleep(0)
        caller.cancel()  # the connection went away
        with pytest.raises(asyncio.CancelledError):
            await caller
        assert done == []
        release.set()  # leaving the group waits for the owned write
    tasks.detach()
    assert done == ["written"]


async def test_owned_returns_the_result_and_raises_the_error() -> None:
    tasks = OwnedTasks()

    async def fail() -> None:
        raise ValueError("bad")

    async def value() -> int:
        return 7

    async with asyncio.TaskGroup() as tg:
        tasks.attach(tg)
        assert await tasks.owned(value()) == 7
        with pytest.raises(ValueError, match="bad"):
            await tasks.owned(fail())  # the group itself does not fail
    tasks.detach()


async def test_outside_the_group_spawn_refuses_and_owned_runs_in_the_caller() -> None:
    tasks = OwnedTasks()
    ran: list[str] = []

    async def work() -> None:
        ran.append("x")

    coro = work()
    assert tasks.spawn(coro, "refused") is None
    assert coro.cr_frame is None  # closed, never to run (no "never awaited" warning)
    await tasks.owned(work())
    assert ran == ["x"]


async def test_in_flight_waits_until_below() -> None:
    flight = InFlight(2)
    flight.count = 2
    waiter = asyncio.create_task(flight.wait_below(2))
    await asyncio.sleep(0)
    assert not waiter.done()
    flight.release()
    async with asyncio.timeout(30):
        await waiter
    assert flight.count == 1
    await flight.wait_below(2)  # at once
