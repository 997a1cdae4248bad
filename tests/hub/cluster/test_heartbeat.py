"""The heartbeat over PostgreSQL, in-process: beats, dead nodes, and reaping exactly once."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack

import asyncpg
import pytest

from hub.cluster.heartbeat import Heartbeat, NodeInUse
from hub.log.postgres import PostgresEventStore
from tests.support.postgres import POSTGRES_DSN
from tests.support.waiting import wait_for

INTERVAL = 0.1
TIMEOUT = 0.6


@pytest.fixture
async def schema(pg_schema: str) -> str:
    await PostgresEventStore(POSTGRES_DSN, schema=pg_schema).migrate_schema()
    return pg_schema


class Cluster:
    """Heartbeats on one schema; ``running`` ones beat (and reap) in background tasks."""

    def __init__(self, schema: str, stack: AsyncExitStack, tg: asyncio.TaskGroup) -> None:
        self.schema = schema
        self.stack = stack
        self.tg = tg
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.calls: list[tuple[str, str]] = []  # (reaper, dead)

    def make(self, node_id: str, *, hook: Callable[[str, str], object] | None = None) -> Heartbeat:
        beat = Heartbeat(POSTGRES_DSN, self.schema, node_id, interval=INTERVAL, timeout=TIMEOUT)

        async def record(dead: str) -> None:
            self.calls.append((node_id, dead))
            if hook is not None:
                hook(node_id, dead)

        beat.on_node_dead(record)
        return beat

    async def start(self, node_id: str, **kw: Callable[[str, str], object]) -> Heartbeat:
        beat = self.make(node_id, **kw)
        await beat.register()
        self.tasks[node_id] = self.tg.create_task(beat.run())
        self.stack.push_async_callback(beat.stop)
        return beat

    async def crash(self, beat: Heartbeat) -> None:
        """Stop beating without a word to the database (the process died)."""
        task = self.tasks.pop(beat.node_id)
        task.cancel()
        await asyncio.wait([task])
        beat._drop()  # the connection dies with the process

    def stop_all(self) -> None:
        for task in self.tasks.values():
            task.cancel()


@pytest.fixture
async def cluster(schema: str) -> AsyncIterator[Cluster]:
    async with AsyncExitStack() as stack, asyncio.TaskGroup() as tg:
        c = Cluster(schema, stack, tg)
        try:
            yield c
        finally:
            c.stop_all()


async def row(schema: str, node_id: str) -> asyncpg.Record:
    conn = await asyncpg.connect(POSTGRES_DSN)
    try:
        record = await conn.fetchrow(f'SELECT * FROM "{schema}".nodes WHERE node_id = $1', node_id)
    finally:
        await conn.close()
    assert record is not None
    return record


async def test_live_nodes_are_not_dead(cluster: Cluster) -> None:
    a = await cluster.start("a")
    await cluster.start("b")
    await asyncio.sleep(TIMEOUT * 2)
    assert [n.node_id for n in await a.nodes()] == ["a", "b"]
    assert await a.dead_nodes() == []
    assert cluster.calls == []


async def test_a_crashed_node_is_reaped_by_exactly_one_survivor(cluster: Cluster) -> None:
    survivors = [await cluster.start(name) for name in ("s1", "s2", "s3")]
    victim = await cluster.start("victim")
    await asyncio.sleep(INTERVAL * 3)
    await cluster.crash(victim)
    await wait_for(lambda: cluster.calls, within=TIMEOUT * 10)
    await asyncio.sleep(TIMEOUT * 2)  # time for a second (wrong) reaping to show up
    assert len(cluster.calls) == 1
    reaper, dead = cluster.calls[0]
    assert dead == "victim" and reaper in {"s1", "s2", "s3"}
    record = await row(cluster.schema, "victim")
    assert record["reaped_by"] == reaper and record["reaped_at"] is not None
    assert await survivors[0].dead_nodes() == []


async def test_dead_nodes_lists_a_silent_node_until_it_is_reaped(cluster: Cluster) -> None:
    watcher = cluster.make("watcher")  # registered, never runs: it reaps only when told
    await watcher.register()
    victim = await cluster.start("victim")
    await cluster.crash(victim)
    assert [n.node_id for n in await watcher.dead_nodes()] == []  # still fresh
    await asyncio.sleep(TIMEOUT + INTERVAL * 2)
    dead = await watcher.dead_nodes()
    assert [n.node_id for n in dead] == ["victim"] and dead[0].stopped_at is None
    await watcher.beat()  # (only a node alive itself may claim)
    assert await watcher.reap_one() == "victim"
    assert await watcher.reap_one() is None
    assert await watcher.dead_nodes() == []
    await watcher.stop()


async def test_a_stopped_node_is_reaped_at_once(cluster: Cluster) -> None:
    await cluster.start("s1")
    leaving = cluster.make("leaving")
    await leaving.register()
    await leaving.stop()
    await wait_for(lambda: cluster.calls == [("s1", "leaving")], within=INTERVAL * 10)
    assert (await row(cluster.schema, "leaving"))["stopped_at"] is not None


async def test_a_failing_hook_is_retried_after_the_claim_lease(cluster: Cluster) -> None:
    failures = [1]

    def flaky(reaper: str, dead: str) -> None:
        if failures:
            failures.pop()
            raise RuntimeError("the database went away mid-way")

    watcher = cluster.make("watcher", hook=flaky)
    watcher.claim_lease = 0.3
    await watcher.register()
    victim = cluster.make("victim")
    await victim.register()
    await victim.stop()
    assert await watcher.reap_one() == "victim"  # claimed, hook failed: not reaped
    assert (await row(cluster.schema, "victim"))["reaped_at"] is None
    assert await watcher.reap_one() is None  # the claim still holds
    await asyncio.sleep(0.4)
    await watcher.beat()  # (alive itself, whatever the machine's load)
    assert await watcher.reap_one() == "victim"
    assert (await row(cluster.schema, "victim"))["reaped_at"] is not None
    assert [d for _, d in cluster.calls] == ["victim", "victim"]
    await watcher.stop()


async def test_a_live_node_id_cannot_be_taken(cluster: Cluster) -> None:
    await cluster.start("one")
    twin = cluster.make("one")
    with pytest.raises(NodeInUse):
        await twin.register()
    await twin.stop()


async def test_a_restart_under_the_same_id_reaps_its_predecessor(cluster: Cluster) -> None:
    first = await cluster.start("fixed")
    await cluster.crash(first)
    await asyncio.sleep(TIMEOUT + INTERVAL)
    again = cluster.make("fixed")
    previous = await again.register()
    assert previous is not None and previous.reaped_at is None
    assert cluster.calls == [("fixed", "fixed")]
    record = await row(cluster.schema, "fixed")
    assert record["reaped_at"] is None and record["stopped_at"] is None
    assert record["started_at"] > previous.started_at
    await again.stop()


async def test_a_node_declared_dead_learns_it(cluster: Cluster) -> None:
    await cluster.start("reaper")
    paused = cluster.make("paused")
    told: list[str] = []
    paused.on_fenced = lambda: told.append("fenced")
    await paused.register()
    await paused.beat()
    assert not paused.fenced
    await asyncio.sleep(TIMEOUT + INTERVAL * 3)  # "paused" (no beats): declared dead
    await wait_for(lambda: cluster.calls, within=TIMEOUT * 5)
    await paused.beat()
    assert paused.fenced
    await paused.beat()
    assert told == ["fenced"]  # once
    await paused.stop()


async def test_a_node_declared_dead_can_be_started_again_under_its_id_at_once(
    cluster: Cluster,
) -> None:
    """The fenced process beat a moment ago (its row is fresh), but it is claimed: it is no
    live node, and its restart (exit 75, a supervisor) must not be refused as a twin."""
    await cluster.start("reaper")
    paused = cluster.make("pinned")
    await paused.register()
    await asyncio.sleep(TIMEOUT + INTERVAL * 3)
    await wait_for(lambda: cluster.calls, within=TIMEOUT * 5)
    await paused.beat()
    assert paused.fenced
    await paused.stop()  # (a no-op on a claimed row: its last beat stays fresh)
    again = cluster.make("pinned")
    previous = await again.register()
    assert previous is not None and previous.reaped_by == "reaper"
    await again.beat()
    assert not again.fenced
    await again.stop()


async def test_a_node_whose_own_beat_is_stale_claims_nobody(cluster: Cluster) -> None:
    """A node resuming from a pause longer than the timeout must beat before it may declare
    anyone dead: the others were not dead, it was (else two paused nodes fence each other)."""
    other = cluster.make("other")
    resumed = cluster.make("resumed")
    for beat in (other, resumed):
        await beat.register()
    await asyncio.sleep(TIMEOUT + INTERVAL)  # both stale now
    assert await resumed.reap_one() is None  # its own beat is stale too
    await resumed.beat()
    assert not resumed.fenced
    assert await resumed.reap_one() == "other"  # alive again, it reaps the one still silent
    await other.beat()
    assert other.fenced
    # A claimed node claims nobody, whatever its beat.
    third = cluster.make("third")
    await third.register()
    await asyncio.sleep(TIMEOUT + INTERVAL)
    await other.beat()
    assert await other.reap_one() is None
    for beat in (other, resumed, third):
        await beat.stop()


async def test_lags_are_told_once_an_interval_for_running_nodes(cluster: Cluster) -> None:
    seen: list[list[tuple[str, float]]] = []
    a = cluster.make("a")
    a.on_lags = seen.append
    await a.register()
    cluster.tasks["a"] = cluster.tg.create_task(a.run())
    cluster.stack.push_async_callback(a.stop)
    await cluster.start("b")
    await wait_for(lambda: any(len(lags) == 2 for lags in seen), within=TIMEOUT * 10)
    lags = dict(next(lags for lags in seen if len(lags) == 2))
    assert set(lags) == {"a", "b"}
    assert all(0 <= lag < TIMEOUT for lag in lags.values())  # both beat every interval
