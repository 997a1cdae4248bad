"""Ordering, no gap and no duplicate across the catch-up → live switch, under concurrent
publishers, with subscribers joining at random times and random ``afterSeq`` (Hypothesis draws
the plan; the real interleaving is whatever the sockets make of it)."""

from __future__ import annotations

import asyncio
import itertools
import uuid
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.support.hub import HubProcess
from tests.support.peer import message, peer
from tests.support.tokens import mint

_workspaces = itertools.count()

publisher_plan = st.lists(
    st.tuples(st.integers(1, 4), st.integers(0, 3)),  # (batch size, ms to sleep after)
    min_size=3,
    max_size=25,
)
subscriber_plan = st.tuples(
    st.floats(0.0, 0.15),  # seconds before joining
    st.one_of(st.none(), st.floats(0.0, 1.0)),  # afterSeq: live only, or a fraction of head
)


async def _publish(url: str, agent: str, workspace: str, plan: list[tuple[int, int]]) -> int:
    count = 0
    async with peer(url, mint(agent)) as p:
        for size, pause in plan:
            events = [message(f"{agent}-{count + i}") for i in range(size)]
            ack = await p.call("publish", workspace=workspace, events=events)
            assert ack["op"] == "ack", ack
            count += size
            await asyncio.sleep(pause / 1000)
    return count


async def _subscribe(
    url: str, agent: str, workspace: str, delay: float, fraction: float | None, done: Any
) -> tuple[int, list[dict[str, Any]]]:
    await asyncio.sleep(delay)
    async with peer(url, mint(agent)) as p:
        head = await p.head(workspace)
        if fraction is None:
            reply = await p.call("subscribe", workspace=workspace)
            after = reply["head"]
        else:
            after = int(head * fraction)
            reply = await p.call("subscribe", workspace=workspace, afterSeq=after)
        assert reply["op"] == "subscribed", reply
        assert reply["head"] >= after
        end_id = await done
        events: list[dict[str, Any]] = []
        async with asyncio.timeout(30):
            while not events or events[-1]["id"] != end_id:
                frame = await p.recv(30)
                assert frame["op"] == "event" and frame["workspace"] == workspace, frame
                events.append(frame["event"])
        return after, events


async def _scenario(
    url: str,
    publishers: list[list[tuple[int, int]]],
    subscribers: list[tuple[float, float | None]],
) -> None:
    workspace = f"order-{next(_workspaces)}-{uuid.uuid4().hex[:6]}"
    async with peer(url, mint("seeder")) as seeder:
        await seeder.call("publish", workspace=workspace, events=[message("seed")] * 3)
        done: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        async with asyncio.TaskGroup() as tg:
            subs = [
                tg.create_task(_subscribe(url, f"sub{i % 3}", workspace, delay, fraction, done))
                for i, (delay, fraction) in enumerate(subscribers)
            ]
            async with asyncio.TaskGroup() as pubs:
                for i, plan in enumerate(publishers):
                    pubs.create_task(_publish(url, f"pub{i}", workspace, plan))
            # Every subscriber has joined once its subscribe returned; wait for that, then end.
            await asyncio.sleep(0.2)
            end = await seeder.publish(workspace, message("END"))
            done.set_result(end["id"])
        # The log itself, read from seq 1.
        await seeder.call("subscribe", workspace=workspace, afterSeq=0)
        log = await seeder.events(workspace, end["seq"], 30)
    ids = {e["seq"]: e["id"] for e in log}
    assert sorted(ids) == list(range(1, end["seq"] + 1))
    for task in subs:
        after, events = task.result()
        seqs = [e["seq"] for e in events]
        assert seqs == list(range(after + 1, end["seq"] + 1)), (after, seqs)
        assert all(ids[e["seq"]] == e["id"] for e in events)


@settings(
    max_examples=8,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(
    publishers=st.lists(publisher_plan, min_size=2, max_size=4),
    subscribers=st.lists(subscriber_plan, min_size=2, max_size=6),
)
def test_no_gap_no_duplicate_across_catch_up_to_live(
    hub: HubProcess,
    publishers: list[list[tuple[int, int]]],
    subscribers: list[tuple[float, float | None]],
) -> None:
    asyncio.run(_scenario(hub.url, publishers, subscribers))


async def test_many_subscribers_joining_during_a_burst(hub: HubProcess) -> None:
    """A fixed, larger case: 4 publishers x 150 events, 12 subscribers joining throughout."""
    publishers = [[(3, 0)] * 50 for _ in range(4)]
    subscribers = [(i * 0.02, None if i % 4 == 0 else (i % 5) / 4) for i in range(12)]
    await _scenario(hub.url, publishers, subscribers)
