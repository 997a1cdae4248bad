"""hub/client/workspace.py against a real ``agora serve`` (fixtures in conftest.py): publishing,
state, files, adk-code's verbs and the waiters, and the two-agent example."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid

import pytest

from hub.client import Ack, Session, connect
from hub.core.errors import Conflict, Forbidden, NotFound, RateLimited
from hub.core.events import (
    COLLABORATION_KINDS,
    FileWritten,
    MessagePayload,
    MessagePosted,
    NeedWork,
    WorkPublished,
)
from tests.hub.client.helpers import WAIT, assert_contiguous, message, name
from tests.support.hub import HubProcess
from tests.support.paths import REPO
from tests.support.tokens import SECRET


async def test_publish_is_idempotent_by_id(alice: Session) -> None:
    ws = alice.workspace(name())
    event = MessagePosted(id=str(uuid.uuid4()), payload=MessagePayload(text="once"))
    first = await ws.publish(event)
    again = await ws.publish(event)
    assert again == Ack(ws.name, first.seq, first.id, duplicate=True)
    batch = [message(str(i)) for i in range(3)]
    acked = await ws.publish_batch(batch)
    assert acked.seqs == [first.seq + 1, first.seq + 2, first.seq + 3]
    assert not acked.duplicate
    assert len(set(acked.ids)) == 3


async def test_the_client_mints_time_ordered_ids(alice: Session) -> None:
    """Publishes without an id get a UUIDv7 from the client (hub.core.ids): the ids the hub
    stores sort as the events were published, so its id index grows at its end."""
    ws = alice.workspace(name())
    ids = [(await ws.post_message(str(i))).id for i in range(3)]
    ids += (await ws.publish_batch([message(str(i)) for i in range(3)])).ids
    parsed = [uuid.UUID(i) for i in ids]
    assert all(u.version == 7 and u.variant == uuid.RFC_4122 for u in parsed)
    assert [i[:13] for i in ids] == sorted(i[:13] for i in ids)  # the millisecond prefix
    stored = [e.id for e in await ws.events() if isinstance(e, MessagePosted)]
    assert stored == ids


async def test_rate_limited_publishes_wait_and_retry(limited_hub: HubProcess) -> None:
    async with connect(limited_hub.url, limited_hub.token("eager")) as session:
        ws = session.workspace("limited")
        acks = await asyncio.gather(*(ws.post_message(str(i)) for i in range(12)))
        assert sorted(a.seq for a in acks) == list(range(1, 13))
    async with connect(
        limited_hub.url, limited_hub.token("eager"), retry_rate_limited=False
    ) as session:
        ws = session.workspace("limited")
        with pytest.raises(RateLimited) as info:
            await asyncio.gather(*(ws.post_message(str(i)) for i in range(12)))
        assert info.value.details["retryAfterMs"] >= 1


async def test_state_and_time_travel(alice: Session) -> None:
    ws = alice.workspace(name())
    await ws.write_file("a.txt", "v1")
    await ws.write_file("a.txt", "v2", base_rev=1)
    now = await ws.state()
    assert now.files["a.txt"].rev == 2 and now.files["a.txt"].text is None  # metadata only
    now = await ws.state(contents=True)
    assert now.files["a.txt"].rev == 2 and now.files["a.txt"].text == "v2"
    then = await ws.state(at_seq=1, contents=True, paths=["a.txt"])
    assert then.seq == 1 and then.files["a.txt"].text == "v1"
    assert await ws.read_file("a.txt") == "v2"


async def test_file_helpers(alice: Session) -> None:
    ws = alice.workspace(name())
    written = await ws.write_file("src/app.py", "print(1)\n", base_rev=0)
    assert isinstance(written, FileWritten) and written.seq >= 1
    assert await ws.read_file("src/app.py") == "print(1)\n"
    await ws.write_file("logo.bin", b"\x00\xffPNG")
    assert await ws.read_file("logo.bin") == b"\x00\xffPNG"
    with pytest.raises(Conflict) as info:
        await ws.write_file("src/app.py", "print(2)\n", base_rev=0)
    assert info.value.details["rev"] == 1
    await ws.move_file("src/app.py", "src/main.py", base_rev=1)
    await ws.delete_file("src/main.py", base_rev=2)
    with pytest.raises(NotFound):
        await ws.read_file("src/main.py")
    with pytest.raises(NotFound):
        await ws.delete_file("src/main.py")


async def test_events_is_the_whole_history(alice: Session) -> None:
    ws = alice.workspace(name())
    assert await ws.events() == []
    await ws.publish_batch([message(str(i)) for i in range(10)])
    history = await ws.events()
    assert_contiguous(history, 1, history[-1].seq)
    assert [e.payload.text for e in history if isinstance(e, MessagePosted)] == [
        str(i) for i in range(10)
    ]


async def test_collaboration_verbs_end_to_end(alice: Session, bob: Session) -> None:
    w = name()
    planner, coder = alice.workspace(w), bob.workspace(w)
    request = await planner.request_work("parser", {"spec": "parse it"}, consumer="bob")
    cid = request.correlation_id
    assert isinstance(request, NeedWork) and cid is not None and request.topic == "parser"

    work = await coder.wait_for_work("parser", WAIT)
    assert work.id == request.id
    claim = await coder.claim_work(cid)
    assert claim.topic == "parser"  # defaulted from the item
    with pytest.raises(Forbidden):
        await planner.publish_work(cid, {"not": "mine"})  # only the owner publishes
    await coder.write_file("parser.py", "def parse(): ...\n")
    published = await coder.publish_work(cid, {"files": ["parser.py"]}, consumer="alice")
    asked = await coder.request_feedback(cid, {"q": "ok?"})

    seen = await planner.wait_for_kind(cid, "feedbackRequested", WAIT, after_seq=request.seq)
    assert seen.id == asked.id
    feedback = await planner.provide_feedback(cid, {"verdict": "revise"}, causation_id=asked.id)
    got = await coder.wait_for_feedback(cid, WAIT, after_seq=asked.seq)
    assert got.id == feedback.id and got.payload == {"verdict": "revise"}
    await coder.signal_blocked(cid, {"waiting": "for a grammar"})
    second = await coder.publish_work(cid, {"files": ["parser.py"], "rev": 2})
    again = await planner.wait_for_kind(cid, WorkPublished, WAIT, after_seq=published.seq)
    assert again.id == second.id
    done = await coder.signal_completed(cid, {"ok": True})

    final = await planner.wait_for(cid, WAIT, after_seq=second.seq)
    assert final.id == done.id
    with pytest.raises(Conflict):
        await planner.provide_feedback(cid, "too late: the item is completed")
    item = (await planner.state()).work_items[cid]
    assert item.status == "completed" and item.owner == "bob" and item.requester == "alice"
    kinds = [e.kind for e in await planner.events() if e.kind in COLLABORATION_KINDS]
    assert kinds == [
        "needWork",
        "workClaimed",
        "workPublished",
        "feedbackRequested",
        "feedbackProvided",
        "blocked",
        "workPublished",
        "completed",
    ]
    assert (await coder.wait_for(cid, WAIT, exclude_self=True)).producer == "alice"


async def test_waiters_see_events_published_before_the_wait(
    hub: HubProcess, alice: Session, bob: Session
) -> None:
    w = name()
    request = await alice.workspace(w).request_work("docs", {"n": 1})
    cid = request.correlation_id
    assert cid is not None
    published = await bob.workspace(w).publish_work(cid, {"done": True})
    feedback = await alice.workspace(w).provide_feedback(cid, "thanks")
    # Every event above is in the log before any wait starts, and bob's handle has never read
    # the workspace: the waiters must find them in the log, immediately.
    async with asyncio.timeout(2), connect(hub.url, hub.token("bob")) as fresh:
        ws = fresh.workspace(w)
        assert (await ws.wait_for_kind(cid, "workPublished")).id == published.id
        assert (await ws.wait_for_feedback(cid)).id == feedback.id
        assert (await ws.wait_for(cid)).id == request.id
        planner = alice.workspace(w)
        assert (await planner.wait_for_kind(cid, "workPublished")).id == published.id


async def test_wait_for_work_skips_taken_items_and_waits_for_new_ones(
    alice: Session, bob: Session
) -> None:
    w = name()
    planner, coder = alice.workspace(w), bob.workspace(w)
    taken = await planner.request_work("build")
    assert taken.correlation_id is not None
    await coder.claim_work(taken.correlation_id)
    other_topic = await planner.request_work("deploy")
    for_someone_else = await planner.request_work("build", consumer="carol")
    open_item = await planner.request_work("build")
    found = await coder.wait_for_work("build", WAIT)
    assert found.id == open_item.id
    assert found.id not in {taken.id, other_topic.id, for_someone_else.id}
    assert (await coder.wait_for_work(None, WAIT)).id == other_topic.id

    # Nothing open on "lint" yet: the waiter follows the live log and gets the next request.
    waiter = asyncio.create_task(coder.wait_for_work("lint", WAIT))
    await asyncio.sleep(0.1)
    assert not waiter.done()
    fresh = await planner.request_work("lint")
    assert (await waiter).id == fresh.id


async def test_wait_times_out(alice: Session) -> None:
    ws = alice.workspace(name())
    with pytest.raises(TimeoutError):
        await ws.wait_for_kind("no-such-item", "completed", 0.2)
    with pytest.raises(TimeoutError):
        await ws.wait_for_work("nothing", 0.2)


async def test_two_agents_example_runs_to_completion(hub: HubProcess) -> None:
    w = name()
    env = dict(os.environ, AGORA_SECRET=SECRET)
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(REPO / "examples" / "two_agents.py"),
        "--url",
        hub.url,
        "--data",
        str(hub.data_dir),
        "--workspace",
        w,
        "--timeout",
        "20",
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=env,
        cwd=REPO,
    )
    output, _ = await asyncio.wait_for(proc.communicate(), 60)
    text = output.decode()
    assert proc.returncode == 0, text
    assert "completed" in text
    async with connect(hub.url, hub.token("auditor", rights=("read",))) as auditor:
        ws = auditor.workspace(w)
        kinds = [
            e.kind
            for e in await ws.events()
            if e.kind in COLLABORATION_KINDS or e.kind == "fileWritten"
        ]
        assert kinds == [
            "needWork",
            "workClaimed",
            "fileWritten",
            "workPublished",
            "feedbackRequested",
            "feedbackProvided",
            "fileWritten",
            "workPublished",
            "feedbackProvided",
            "completed",
        ]
        state = await ws.state()
        assert "def greet" in str(await ws.read_file("hello.py"))
        assert [i.status for i in state.work_items.values()] == ["completed"]
