"""The must-show of issue 7: real ``agora serve`` nodes over one PostgreSQL schema.

Agents on different nodes publish to one workspace concurrently; every subscriber on every
node receives the identical sequence (the log's), with no gap and no duplicate. A node killed
with SIGKILL during the load loses nothing: its clients reconnect to another node and resume
(publishers re-send unacknowledged ids, subscribers resubscribe with ``afterSeq``), every
acknowledged event is in the log at its acknowledged seq, and ``agora verify --store`` passes.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest

from hub.log.postgres import PostgresEventStore
from tests.hub.cluster.agents import Publisher, Subscriber
from tests.hub.cluster.conftest import REPO, StartNode, wait_for
from tests.hub.log.conftest import POSTGRES_DSN
from tests.hub.server.conftest import SECRET, mint, peer

pytestmark = pytest.mark.slow

WORKSPACE = "shared"


async def log_of(store: PostgresEventStore, workspace: str) -> list[tuple[int, str]]:
    return [(e.seq, e.id) for e in [ev async for ev in store.read(workspace)]]


def verify(url: str, data: Path) -> subprocess.CompletedProcess[str]:
    """``agora verify --store URL`` in a process of its own."""
    return subprocess.run(
        [sys.executable, "-m", "hub", "verify", "--store", url, "--data", str(data)],
        cwd=REPO,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "AGORA_SECRET": SECRET},
        capture_output=True,
        text=True,
        timeout=60,
    )


async def run_load(
    urls: list[str],
    store: PostgresEventStore,
    *,
    publishers: int,
    subscribers: int,
    count: int,
    kill: tuple[int, object] | None = None,
) -> tuple[list[Publisher], list[Subscriber], list[tuple[int, str]]]:
    """Publishers and subscribers spread round-robin over ``urls``; ``kill`` = (node index,
    node) kills that node once a third of the events are acknowledged."""
    token = mint("agent")
    subs = [
        Subscriber(f"s{i}", urls, WORKSPACE, token, start=i % len(urls)) for i in range(subscribers)
    ]
    pubs = [
        Publisher(f"p{i}", urls, WORKSPACE, token, count, start=i % len(urls))
        for i in range(publishers)
    ]
    async with asyncio.TaskGroup() as tg:
        sub_tasks = [tg.create_task(s.run()) for s in subs]
        async with asyncio.timeout(20):
            for s in subs:
                await s.subscribed.wait()
        pub_tasks = [tg.create_task(p.run()) for p in pubs]
        if kill is not None:
            index, node = kill
            total = publishers * count
            await wait_for(lambda: sum(len(p.acked) for p in pubs) >= total // 3, within=60)
            node.kill()  # type: ignore[attr-defined]
            for agent in [*pubs, *subs]:
                agent.dead.add(urls[index])
        async with asyncio.timeout(120):
            await asyncio.gather(*pub_tasks)
        # Every subscriber is (re)subscribed: no presence event is still to come.
        async with asyncio.timeout(20):
            for s in subs:
                await s.subscribed.wait()
        await asyncio.sleep(0.2)
        head = await store.head(WORKSPACE)
        assert head is not None
        for s in subs:
            s.target = head.seq
        async with asyncio.timeout(30):
            await asyncio.gather(*sub_tasks)
    # (Subscribers leaving afterwards add memberLeft events: not part of what they saw.)
    return pubs, subs, (await log_of(store, WORKSPACE))[: head.seq]


def check(pubs: list[Publisher], subs: list[Subscriber], log: list[tuple[int, str]]) -> None:
    assert [seq for seq, _ in log] == list(range(1, len(log) + 1))
    where = {event_id: seq for seq, event_id in log}
    assert len(where) == len(log), "an id is in the log twice"
    for p in pubs:
        assert not p.errors, p.errors
        assert len(p.acked) == len(p.ids)
        for event_id, seq in p.acked.items():
            assert where.get(event_id) == seq, (event_id, seq, where.get(event_id))
    for s in subs:
        assert not s.errors, (s.name, s.errors[:5])
        assert s.events == log[: len(s.events)]
        assert s.events == log, (s.name, len(s.events), len(log))


@pytest.mark.parametrize("nodes", [2, 3])
async def test_subscribers_on_every_node_see_one_sequence(
    nodes: int,
    pg_url: str,
    pg_store: PostgresEventStore,
    start_node: StartNode,
    tmp_path: Path,
) -> None:
    started = [start_node(pg_url) for _ in range(nodes)]
    urls = [n.url for n in started]
    pubs, subs, log = await run_load(
        urls, pg_store, publishers=2 * nodes, subscribers=2 * nodes, count=150
    )
    check(pubs, subs, log)
    messages = sum(1 for _, event_id in log if event_id.startswith("p"))
    assert messages == 2 * nodes * 150
    assert all(s.reconnects == 0 for s in subs)
    result = verify(pg_url, tmp_path / "verify")
    assert result.returncode == 0, result.stderr
    assert f"ok {WORKSPACE} " in result.stdout and "1 workspace" in result.stdout


@pytest.mark.parametrize("nodes", [2, 3])
async def test_kill_a_node_under_load_loses_nothing(
    nodes: int,
    pg_url: str,
    pg_store: PostgresEventStore,
    start_node: StartNode,
    tmp_path: Path,
) -> None:
    started = [start_node(pg_url) for _ in range(nodes)]
    urls = [n.url for n in started]
    victim = nodes - 1
    pubs, subs, log = await run_load(
        urls,
        pg_store,
        publishers=2 * nodes,
        subscribers=2 * nodes,
        count=200,
        kill=(victim, started[victim]),
    )
    check(pubs, subs, log)
    # The victim's clients moved to a survivor and resumed there.
    moved = [a for a in [*pubs, *subs] if a.start == victim]
    assert moved and all(a.reconnects >= 1 for a in moved)
    assert started[victim].proc is not None and started[victim].proc.returncode == -9
    result = verify(pg_url, tmp_path / "verify")
    assert result.returncode == 0, result.stderr


async def test_a_node_catches_up_after_losing_its_listen_connection(
    pg_url: str, pg_schema: str, pg_store: PostgresEventStore, start_node: StartNode
) -> None:
    """NOTIFY is not a queue: what is committed while a node's LISTEN connection is down
    reaches its subscribers once it has reconnected (it re-reads from its committed seq)."""
    a, b = start_node(pg_url), start_node(pg_url)
    token = mint("agent")
    async with peer(b.url, token) as watcher, peer(a.url, token) as writer:
        reply = await watcher.call("subscribe", workspace=WORKSPACE, afterSeq=0)
        assert reply["op"] == "subscribed"
        first = await writer.publish(WORKSPACE, {"kind": "messagePosted", "payload": {"text": "1"}})
        await watcher.events(WORKSPACE, first["seq"])
        # Cut the nodes' LISTEN connections: hints sent meanwhile are lost for good.
        conn = await asyncpg.connect(POSTGRES_DSN)
        try:
            killed = await conn.fetch(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = $1",
                f"agora-follow:{pg_schema}",
            )
        finally:
            await conn.close()
        assert len(killed) == 2
        seqs = []
        for i in range(20):
            ack = await writer.publish(
                WORKSPACE, {"kind": "messagePosted", "payload": {"text": f"m{i}"}}
            )
            seqs.append(ack["seq"])
        got = await watcher.events(WORKSPACE, seqs[-1], within=15)
        assert [e["seq"] for e in got] == list(range(first["seq"] + 1, seqs[-1] + 1))
