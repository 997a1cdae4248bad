"""The must-show of issue 7: real ``agora serve`` nodes over one PostgreSQL schema.

Agents on different nodes publish to one workspace concurrently; every subscriber on every
node receives the identical sequence (the log's), with no gap and no duplicate. A node killed
with SIGKILL during the load loses nothing: its clients reconnect to another node and resume
(publishers re-send unacknowledged ids, subscribers resubscribe with ``afterSeq``), every
acknowledged event is in the log at its acknowledged seq, and ``agora verify --store`` passes.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import asyncpg
import pytest

from hub.auth import TokenSigner
from hub.log.postgres import PostgresEventStore
from tests.hub.cluster.agents import Publisher, Subscriber
from tests.support.hub import HubProcess, StartHub
from tests.support.paths import REPO
from tests.support.peer import peer
from tests.support.postgres import POSTGRES_DSN
from tests.support.tokens import SECRET, mint
from tests.support.waiting import wait_for

pytestmark = pytest.mark.slow

WORKSPACE = "shared"
# A start beats every HEARTBEAT_S (0.2 s); two thirds of NODE_TIMEOUT_S (1.5 s) is a held loop.
BEAT_LAG_MAX_S = 1.0
STARTED_WATCH_S = 0.5  # and for a while after the banners


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
    kill: HubProcess | None = None,
) -> tuple[list[Publisher], list[Subscriber], list[tuple[int, str]]]:
    """Publishers and subscribers spread round-robin over ``urls``; ``kill``: a node to kill
    (SIGKILL) once a third of the events are acknowledged. Its clients find out by themselves
    (the connection drops, reconnecting to it is refused) and move on to the next URL."""
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
            total = publishers * count
            await wait_for(lambda: sum(len(p.acked) for p in pubs) >= total // 3, within=60)
            kill.kill()
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
    # A publisher's node may write its memberLeft after the head was read; a subscriber can
    # receive it before it stops. Only the events up to that head are compared.
    for s in subs:
        s.events = [e for e in s.events if e[0] <= head.seq]
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
    start_node: StartHub,
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
    start_node: StartHub,
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
        kill=started[victim],
    )
    check(pubs, subs, log)
    # The victim's clients moved to a survivor and resumed there.
    agents: list[Publisher | Subscriber] = [*pubs, *subs]
    moved = [a for a in agents if a.start == victim]
    assert moved and all(a.reconnects >= 1 for a in moved)
    proc = started[victim].proc
    assert proc is not None and proc.returncode == -signal.SIGKILL
    result = verify(pg_url, tmp_path / "verify")
    assert result.returncode == 0, result.stderr


async def test_a_node_catches_up_after_losing_its_listen_connection(
    pg_url: str, pg_schema: str, pg_store: PostgresEventStore, start_node: StartHub
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


SH_BACKEND = '[[backends]]\nid = "sh"\nkind = "process"\n'


async def test_a_killed_nodes_execution_is_closed_once_by_a_survivor(
    pg_url: str, pg_schema: str, pg_store: PostgresEventStore, start_node: StartHub
) -> None:
    """An execution running on a node killed with SIGKILL gets exactly one ``execFinished``
    (``failed``/``interrupted``), written by one of the surviving nodes, and a subscriber on a
    survivor receives it."""
    victim = start_node(pg_url, "victim", SH_BACKEND)
    survivors = [start_node(pg_url, f"survivor-{i}", SH_BACKEND) for i in range(2)]
    signer = TokenSigner(SECRET.encode())
    token = signer.issue(
        "runner", ["*"], ["read", "write", "exec"], backends=["sh"], ttl_seconds=600
    )
    async with peer(victim.url, token) as runner, peer(survivors[0].url, token) as watcher:
        assert (await watcher.call("subscribe", workspace=WORKSPACE, afterSeq=0))["op"] == (
            "subscribed"
        )
        accepted = await runner.call(
            "exec", workspace=WORKSPACE, backend="sh", source="sleep 3", execId="long"
        )
        assert accepted["op"] == "execAccepted", accepted
        await wait_for_kinds(pg_store, ["execStarted"])
        victim.kill()
        finished = await wait_for_kinds(pg_store, ["execStarted", "execFinished"], within=15)
        closing = finished[-1]
        assert closing.payload.status == "failed" and closing.payload.reason == "interrupted"
        (note,) = closing.payload.diagnostics
        assert note["node"] == "victim" and note["closedBy"] in {"survivor-0", "survivor-1"}
        got = await watcher.events(WORKSPACE, closing.seq, within=10)
        assert got[-1]["kind"] == "execFinished" and got[-1]["id"] == closing.id
    # Not "a second closing would show by now" after a sleep: the reaper marks the node reaped
    # after closing its executions, and a reaped node is never claimed again, so once the mark
    # is there the log holds every closing there will ever be.
    conn = await asyncpg.connect(POSTGRES_DSN)
    try:
        async with asyncio.timeout(60):
            while True:
                row = await conn.fetchrow(
                    f'SELECT reaped_by, reaped_at FROM "{pg_schema}".nodes WHERE node_id = $1',
                    "victim",
                )
                if row is not None and row["reaped_at"] is not None:
                    break
                await asyncio.sleep(0.05)
    finally:
        await conn.close()
    assert row["reaped_by"] == note["closedBy"]
    kinds = [e.kind async for e in pg_store.read(WORKSPACE) if e.kind.startswith("exec")]
    assert kinds == ["execRequested", "execStarted", "execFinished"]


async def test_a_killed_nodes_execution_never_started_is_closed_once_by_a_survivor(
    pg_url: str, pg_schema: str, pg_store: PostgresEventStore, start_node: StartHub
) -> None:
    """An execution the victim accepted (its ``execRequested`` names it) and had not logged
    as started when it was killed with SIGKILL — a silent program whose ``execStarted``
    waits for output or the coalescing interval — gets exactly one ``execFinished``
    (``failed``/``interrupted``) from a survivor, caused by the request."""
    # No output for 600 s: execStarted waits for it (or for the end), so the log says requested.
    victim = start_node(pg_url, "victim", SH_BACKEND + "\n[runtime]\ncoalesce_interval_s = 600\n")
    survivor = start_node(pg_url, "survivor", SH_BACKEND)
    signer = TokenSigner(SECRET.encode())
    token = signer.issue(
        "runner", ["*"], ["read", "write", "exec"], backends=["sh"], ttl_seconds=600
    )
    async with peer(victim.url, token) as runner:
        accepted = await runner.call(
            "exec", workspace=WORKSPACE, backend="sh", source="sleep 60", execId="quiet"
        )
        assert accepted["op"] == "execAccepted", accepted
    (request,) = [e async for e in pg_store.read(WORKSPACE) if e.kind.startswith("exec")]
    assert request.kind == "execRequested" and request.payload.node == "victim"
    victim.kill()
    (closing,) = await wait_for_kinds(pg_store, ["execFinished"], within=15)
    assert closing.payload.status == "failed" and closing.payload.reason == "interrupted"
    assert closing.causation_id == request.id and closing.producer == "runner"
    (note,) = closing.payload.diagnostics
    assert (note["node"], note["closedBy"]) == ("victim", "survivor")
    # Once the node is marked reaped it is never claimed again: every closing is in the log.
    conn = await asyncpg.connect(POSTGRES_DSN)
    try:
        async with asyncio.timeout(60):
            while True:
                reaped = await conn.fetchval(
                    f'SELECT reaped_at IS NOT NULL FROM "{pg_schema}".nodes WHERE node_id = $1',
                    "victim",
                )
                if reaped:
                    break
                await asyncio.sleep(0.05)
    finally:
        await conn.close()
    kinds = [e.kind async for e in pg_store.read(WORKSPACE) if e.kind.startswith("exec")]
    assert kinds == ["execRequested", "execFinished"]
    assert survivor.running


async def wait_for_kinds(
    store: PostgresEventStore, kinds: list[str], within: float = 10.0
) -> list[Any]:
    """Poll the log until its ``exec*`` events have exactly ``kinds`` after execRequested."""
    async with asyncio.timeout(within):
        while True:
            events = [e async for e in store.read(WORKSPACE) if e.kind.startswith("exec")]
            if [e.kind for e in events[1:]] == kinds:
                return events[1:]
            await asyncio.sleep(0.05)


def test_a_node_id_in_use_by_a_live_node_is_refused(pg_url: str, start_node: StartHub) -> None:
    start_node(pg_url, "twin")
    with pytest.raises(AssertionError, match="is in use by a running node"):
        start_node(pg_url, "twin")


async def test_a_starting_node_keeps_beating(pg_url: str, start_node: StartHub) -> None:
    """From its registration to its last door open (the HTTP banner), a starting node beats
    on time: a start that held its event loop for a second (the MCP SDK imported there) let
    its peers declare it dead (1.5 s here) on a loaded machine, and with ``[cluster] owners``
    drop it from their view for good. The lag is read from the database, by its clock."""
    schema = parse_qs(urlsplit(pg_url).query)["schema"][0]
    query = (
        f'SELECT extract(epoch FROM now() - last_beat)::float8 FROM "{schema}".nodes '
        "WHERE node_id = 'beating'"
    )
    conn = await asyncpg.connect(POSTGRES_DSN)
    lags: list[float] = []
    starting = asyncio.create_task(
        asyncio.to_thread(start_node, pg_url, "beating", "[cluster]\nowners = true\n")
    )
    try:
        settle_until: float | None = None
        while settle_until is None or asyncio.get_running_loop().time() < settle_until:
            with contextlib.suppress(asyncpg.UndefinedTableError):  # (the schema not made yet)
                lag = await conn.fetchval(query)
                if lag is not None:
                    lags.append(lag)
            if settle_until is None and starting.done():
                await starting  # its failure, if any
                settle_until = asyncio.get_running_loop().time() + STARTED_WATCH_S
            await asyncio.sleep(0.02)
    finally:
        await conn.close()
        # A look that failed leaves no start running past the test (the fixture stops it).
        await asyncio.gather(starting, return_exceptions=True)
    assert lags, "the node never registered"
    assert max(lags) < BEAT_LAG_MAX_S, f"beats {max(lags):.2f}s apart at start ({len(lags)} looks)"
