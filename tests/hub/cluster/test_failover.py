"""Client failover (issue 16 item 6): ``connect([url1, url2, …])`` over real nodes sharing one
PostgreSQL schema. A node killed with SIGKILL mid-stream: the session moves to the other node
and its subscription resumes with no gap and no duplicate; a publish after the move is
acknowledged; a dead first node at open is skipped. The same for the TypeScript client
(``clients/typescript``, driven through ``test/support/failover.mjs``): a reader and a
pipelining writer whose first node is killed under them."""

from __future__ import annotations

import asyncio

import pytest

from hub.client import Workspace, connect
from hub.core.backoff import Backoff
from hub.core.errors import BadRequest, Unavailable
from hub.core.events import MessagePosted
from tests.hub.cluster.agents import StartTs, dead_url, publish_pipelined
from tests.support.hub import HubProcess, StartHub
from tests.support.tokens import mint

pytestmark = pytest.mark.slow

FAST = Backoff(initial=0.05, maximum=0.3, give_up_after=20.0)


async def post_killing(ws: Workspace, total: int, node: HubProcess) -> None:
    """Post ``m0`` … ``m<total-1>``, killing ``node`` (SIGKILL: no close frame, its sockets
    just die) after a third of them."""
    for i in range(total):
        await ws.post_message(f"m{i}")
        if i == total // 3:
            node.kill()
        await asyncio.sleep(0.01)


async def test_subscription_moves_to_the_next_node_with_no_gap_or_duplicate(
    pg_url: str, start_node: StartHub
) -> None:
    a = start_node(pg_url)
    b = start_node(pg_url)
    total = 60
    async with (
        connect([a.url, b.url], mint("reader"), backoff=FAST) as reader,
        connect(b.url, mint("writer"), backoff=FAST) as writer,
    ):
        assert reader.url == a.url
        seen: list[int] = []
        texts: list[str] = []

        async def read() -> None:
            async with reader.workspace("w").subscribe(after_seq=0) as sub:
                async for event in sub:
                    seen.append(event.seq)
                    if isinstance(event, MessagePosted):
                        texts.append(event.payload.text or "")
                        if len(texts) == total:
                            return

        async with asyncio.TaskGroup() as tg:
            task = tg.create_task(read())
            await post_killing(writer.workspace("w"), total, a)
            await asyncio.wait_for(asyncio.shield(task), 30)
        assert reader.url == b.url and reader.reconnects >= 1
        assert texts == [f"m{i}" for i in range(total)]
        assert seen == sorted(set(seen)) and seen[0] == 1  # in order, once each
        # The session publishes through its new node.
        ack = await reader.workspace("w").post_message("after the move")
        assert ack.seq > seen[-1]


async def test_open_skips_a_node_that_does_not_answer(pg_url: str, start_node: StartHub) -> None:
    b = start_node(pg_url)
    async with connect([dead_url(), b.url], mint("alice"), backoff=FAST) as session:
        assert session.url == b.url
        assert session.agent == "alice"


async def test_no_node_answers() -> None:
    with pytest.raises(Unavailable):
        async with connect([dead_url(), dead_url()], mint("alice"), open_timeout=2):
            pass


@pytest.mark.parametrize("urls", [[], [""]])
def test_an_empty_list_of_urls_is_refused(urls: list[str]) -> None:
    with pytest.raises(BadRequest):
        connect(urls, mint("alice"))


async def test_a_node_killed_under_load_loses_no_acknowledged_event(
    pg_url: str, start_node: StartHub
) -> None:
    """Issue 16: "a kill -9 … under load loses no acknowledged event, and its clients resume
    on another node" (every node decides here: there is no owner yet, docs/operations.md).
    Writers pipeline publishes through node A; A dies by
    SIGKILL with publishes in flight; every publish is still acknowledged (through B, the
    retries answering ``duplicate`` where A had committed), and the log holds each event
    exactly once, in one gapless chain."""
    a = start_node(pg_url)
    b = start_node(pg_url)
    writers, per_writer, window = 6, 60, 8
    acked: dict[str, int] = {}  # event id -> seq the ack named
    killed = asyncio.Event()

    def kill_at_a_third() -> None:
        if len(acked) == writers * per_writer // 3 and not killed.is_set():
            killed.set()
            a.kill()  # SIGKILL with publishes of every writer in flight

    async def write(k: int) -> None:
        async with connect([a.url, b.url], mint(f"w{k}"), backoff=FAST) as session:
            assert session.url == a.url
            await publish_pipelined(
                session.workspace("load"), f"w{k}", per_writer, window, acked, kill_at_a_third
            )
            assert session.url == b.url and session.reconnects >= 1

    async with asyncio.TaskGroup() as tg:
        for k in range(writers):
            tg.create_task(write(k))
    assert killed.is_set()
    assert len(acked) == writers * per_writer
    await _check_log(b, "load", acked)


# -- the TypeScript client ------------------------------------------------------------------


async def test_ts_subscription_moves_to_the_next_node_with_no_gap_or_duplicate(
    pg_url: str, start_node: StartHub, ts_session: StartTs
) -> None:
    a, b = start_node(pg_url), start_node(pg_url)
    total = 60
    reader = await ts_session(
        "read", urls=[a.url, b.url], token=mint("reader"), workspace="w", count=total
    )
    assert (await reader.until("ready"))["ready"] == a.url
    async with connect(b.url, mint("writer"), backoff=FAST) as writer:
        await post_killing(writer.workspace("w"), total, a)
    result = await reader.until("texts")
    assert result["url"] == b.url and result["reconnects"] >= 1
    assert result["texts"] == [f"m{i}" for i in range(total)]
    seqs = result["seqs"]
    assert seqs == sorted(set(seqs)) and seqs[0] == 1  # in order, once each
    assert result["after"] > seqs[-1]  # the session publishes through its new node


async def test_ts_writer_killed_under_load_loses_no_acknowledged_event(
    pg_url: str, start_node: StartHub, ts_session: StartTs
) -> None:
    """A TypeScript writer pipelines publishes (8 in flight) through node A; A dies by SIGKILL
    with publishes in flight; every publish is still acknowledged through B (a retry of one A
    had committed answers ``duplicate`` with its seq) and the log holds each event once."""
    a, b = start_node(pg_url), start_node(pg_url)
    total = 180
    writer = await ts_session(
        "write", urls=[a.url, b.url], token=mint("tsw"), workspace="load", count=total, window=8
    )
    assert (await writer.until("ready"))["ready"] == a.url
    while (await writer.until("progress"))["progress"] < total // 3:
        pass
    a.kill()
    result = await writer.until("acks")
    assert result["url"] == b.url and result["reconnects"] >= 1
    acked = dict(result["acks"])
    assert len(acked) == total
    await _check_log(b, "load", acked)


async def _check_log(node: HubProcess, workspace: str, acked: dict[str, int]) -> None:
    async with connect(node.url, mint("auditor")) as auditor:
        events = await auditor.workspace(workspace).events()
    messages = [e for e in events if isinstance(e, MessagePosted)]
    ids = [e.id for e in messages]
    assert len(ids) == len(set(ids)) == len(acked)  # none lost, none twice
    by_id = {e.id: e.seq for e in messages}
    assert all(by_id[i] == seq for i, seq in acked.items())  # each ack named its stored seq
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
