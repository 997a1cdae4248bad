"""hub/client.py against a real ``agora serve`` subprocess (fixtures in conftest.py)."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator

import pytest

from hub.client import Ack, Backoff, Session, SessionClosed, Workspace, connect, error_from_frame
from hub.core.errors import (
    BadRequest,
    Conflict,
    Forbidden,
    Internal,
    NotFound,
    RateLimited,
    Unauthorized,
    Unavailable,
)
from hub.core.events import (
    COLLABORATION_KINDS,
    Event,
    FileWritten,
    MessagePayload,
    MessagePosted,
    NeedWork,
    WorkPublished,
)
from hub.core.wire.frames import Error
from tests.support.hub import HubProcess
from tests.support.paths import REPO
from tests.support.tokens import SECRET

WAIT = 10.0  # seconds: generous bound on any single wait in these tests


def name() -> str:
    """A fresh workspace name per test (the module's hub is shared)."""
    return f"w-{uuid.uuid4().hex[:12]}"


def message(text: str) -> MessagePosted:
    return MessagePosted(payload=MessagePayload(text=text))


@pytest.fixture
async def alice(hub: HubProcess) -> AsyncIterator[Session]:
    async with connect(hub.url, hub.token("alice")) as session:
        yield session


@pytest.fixture
async def bob(hub: HubProcess) -> AsyncIterator[Session]:
    async with connect(hub.url, hub.token("bob")) as session:
        yield session


async def collect(ws: Workspace, after_seq: int, count: int) -> list[Event]:
    out: list[Event] = []
    async with asyncio.timeout(WAIT), ws.subscribe(after_seq) as sub:
        async for ev in sub:
            out.append(ev)
            if len(out) == count:
                break
    return out


def text(ev: MessagePosted) -> str:
    assert ev.payload.text is not None
    return ev.payload.text


def assert_contiguous(events: list[Event], first: int, last: int) -> None:
    seqs = [e.seq for e in events]
    assert seqs == list(range(first, last + 1)), f"gap or duplicate: {seqs}"


# ---------------------------------------------------------------------------------------------
# Connecting and errors


async def test_welcome(alice: Session) -> None:
    assert alice.agent == "alice"
    assert set(alice.rights) == {"read", "write"}
    assert alice.server.startswith("agora/")


async def test_bad_token_raises_unauthorized_at_connect(hub: HubProcess) -> None:
    with pytest.raises(Unauthorized):
        async with connect(hub.url, "not-a-token"):
            pass
    forged = HubProcess(hub.data_dir).signer  # same class, but sign with another secret:
    forged = type(forged)(b"x" * 40)
    with pytest.raises(Unauthorized):
        async with connect(hub.url, forged.issue("eve", ["*"], ["read"], ttl_seconds=60)):
            pass


async def test_unreachable_hub_raises_unavailable() -> None:
    with pytest.raises(Unavailable):
        async with connect("ws://127.0.0.1:9", "token", open_timeout=2):
            pass


async def test_forbidden_without_write_right(hub: HubProcess, alice: Session) -> None:
    w = name()
    await alice.workspace(w).post_message("hello")
    async with connect(hub.url, hub.token("reader", rights=("read",))) as reader:
        ws = reader.workspace(w)
        with pytest.raises(Forbidden) as info:
            await ws.post_message("may I?")
        assert info.value.details.get("right") == "write"
        # Reading is allowed, and the session survives the refusal.
        assert [e.seq for e in await ws.events()] == [1]


async def test_forbidden_workspace_subscription(hub: HubProcess) -> None:
    async with connect(hub.url, hub.token("carol", workspaces=("mine",))) as carol:
        with pytest.raises(Forbidden):
            await carol.workspace("theirs").events()
        with pytest.raises(Forbidden):
            await carol.workspace("theirs").state()
        assert (await carol.workspace("mine").state()).seq >= 0  # still usable


async def test_conflict_on_stale_expected_seq(alice: Session) -> None:
    ws = alice.workspace(name())
    first = await ws.publish(message("one"), expected_seq=0)
    assert first.seq == 1
    with pytest.raises(Conflict) as info:
        await ws.publish(message("two"), expected_seq=0)
    assert info.value.details["head"] == 1
    assert (await ws.publish(message("two"), expected_seq=1)).seq == 2


async def test_bad_request_names_the_field(alice: Session) -> None:
    ws = alice.workspace(name())
    with pytest.raises(BadRequest) as info:
        await ws.write_file("../escape", "x")
    assert "path" in str(info.value.details.get("field"))
    with pytest.raises(BadRequest):
        await ws.publish({"kind": "noSuchKind"})  # refused locally, nothing sent


def test_error_codes_map_to_classes() -> None:
    error = error_from_frame(Error(code="conflict", message="m", details={"head": 3}))
    assert isinstance(error, Conflict) and error.details == {"head": 3}
    assert isinstance(
        error_from_frame(Error(code="rateLimited", message="m", details={})), RateLimited
    )
    unknown = error_from_frame(Error(code="brandNew", message="m", details={}))
    assert isinstance(unknown, Internal) and unknown.details["code"] == "brandNew"


async def test_refresh_token(hub: HubProcess) -> None:
    async with connect(hub.url, hub.token("erin", ttl=60)) as session:
        ws = session.workspace(name())
        await session.refresh(hub.token("erin", ttl=3600))
        await ws.post_message("still erin")
        with pytest.raises(Forbidden):
            await session.refresh(hub.token("mallory"))
        assert (await ws.post_message("and again")).producer == "erin"
        with pytest.raises(Unauthorized):
            await session.refresh("garbage")
        with pytest.raises(Unauthorized):
            async with asyncio.timeout(WAIT):
                await ws.post_message("the connection was closed with 4401")


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


async def test_close_is_idempotent_and_final(hub: HubProcess) -> None:
    session = connect(hub.url, hub.token("dave"))
    await session.open()
    ws = session.workspace(name())
    sub = ws.subscribe(0)

    async def drain() -> list[Event]:
        return [ev async for ev in sub]

    reader = asyncio.create_task(drain())
    await asyncio.sleep(0.1)
    await asyncio.gather(session.aclose(), session.aclose())
    await session.aclose()
    async with asyncio.timeout(WAIT):
        await reader  # subscriptions end cleanly
    with pytest.raises(SessionClosed):
        await ws.post_message("too late")
    assert session.closed


async def test_cancelled_call_leaves_the_session_usable(alice: Session) -> None:
    ws = alice.workspace(name())
    waiter = asyncio.create_task(ws.wait_for_kind("nope", "completed", WAIT))
    await asyncio.sleep(0.05)
    waiter.cancel()
    with pytest.raises(asyncio.CancelledError):
        await waiter
    with pytest.raises(TimeoutError):
        await ws.wait_for("nope", 0.2)
    assert (await ws.post_message("still here")).seq >= 1


# ---------------------------------------------------------------------------------------------
# Publishing, subscribing, state


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


async def test_subscribe_history_then_live_no_gap_no_duplicate(
    alice: Session, bob: Session
) -> None:
    w = name()
    writer = bob.workspace(w)
    for i in range(5):
        await writer.post_message(f"before {i}")
    reader = alice.workspace(w)
    got: list[Event] = []
    async with asyncio.timeout(WAIT), reader.subscribe(0) as sub:
        async for ev in sub:
            got.append(ev)
            if ev.seq == 5:
                for i in range(5):
                    await writer.post_message(f"after {i}")
            if len([e for e in got if isinstance(e, MessagePosted)]) == 10:
                break
    assert_contiguous(got, 1, got[-1].seq)
    texts = [e.payload.text for e in got if isinstance(e, MessagePosted)]
    assert texts == [f"before {i}" for i in range(5)] + [f"after {i}" for i in range(5)]


async def test_many_local_subscribers_share_one_feed(alice: Session, bob: Session) -> None:
    w = name()
    writer = bob.workspace(w)
    await writer.publish_batch([message(str(i)) for i in range(20)])
    ws = alice.workspace(w)
    live = ws.subscribe(None)
    head = await live.head()
    assert head == 20
    # Different starting points at once, then more events while they read. (Alice's own
    # subscription adds a memberJoined after the head: 31 events in all.)
    starts = (0, 7, 19, 25)
    tasks = [asyncio.create_task(collect(ws, after, 31 - after)) for after in starts]
    await asyncio.sleep(0.05)
    await writer.publish_batch([message(str(i)) for i in range(20, 30)])
    for after, events in zip(starts, await asyncio.gather(*tasks), strict=True):
        assert_contiguous(events, after + 1, 31)
    live_events = [await anext(live) for _ in range(11)]
    assert_contiguous(live_events, head + 1, 31)
    assert live_events[0].kind == "memberJoined"
    await live.aclose()


async def test_slow_local_subscriber_outside_the_window_is_replayed(hub: HubProcess) -> None:
    w = name()
    async with (
        connect(hub.url, hub.token("alice"), history=8) as alice,
        connect(hub.url, hub.token("bob")) as bob,
    ):
        ws = alice.workspace(w)
        sub = ws.subscribe(0)
        await sub.head()
        for start in range(0, 100, 25):
            await bob.workspace(w).publish_batch(
                [message(str(i)) for i in range(start, start + 25)]
            )
        await asyncio.sleep(0.2)  # the feed's window (8 events) has long moved on
        got = [await anext(sub) for _ in range(100)]
        assert_contiguous(got, 1, 100)
        await sub.aclose()


async def test_state_and_time_travel(alice: Session) -> None:
    ws = alice.workspace(name())
    await ws.write_file("a.txt", "v1")
    await ws.write_file("a.txt", "v2", base_rev=1)
    now = await ws.state()
    assert now.files["a.txt"].rev == 2 and now.files["a.txt"].text == "v2"
    then = await ws.state(at_seq=1)
    assert then.seq == 1 and then.files["a.txt"].text == "v1"


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


# ---------------------------------------------------------------------------------------------
# adk-code's verbs and waiters


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


async def test_events_is_the_whole_history(alice: Session) -> None:
    ws = alice.workspace(name())
    assert await ws.events() == []
    await ws.publish_batch([message(str(i)) for i in range(10)])
    history = await ws.events()
    assert_contiguous(history, 1, history[-1].seq)
    assert [e.payload.text for e in history if isinstance(e, MessagePosted)] == [
        str(i) for i in range(10)
    ]


# ---------------------------------------------------------------------------------------------
# Reconnecting


async def test_reconnect_after_sigkill_resumes_without_gap_or_duplicate(
    own_hub: HubProcess,
) -> None:
    w = "resume"
    backoff = Backoff(initial=0.05, maximum=0.5, give_up_after=30)
    async with (
        connect(own_hub.url, own_hub.token("reader"), backoff=backoff) as reader,
        connect(own_hub.url, own_hub.token("writer"), backoff=backoff) as writer,
    ):
        out = writer.workspace(w)
        got: list[Event] = []
        sub = reader.workspace(w).subscribe(0)

        async def read_until(text: str) -> None:
            async for ev in sub:
                got.append(ev)
                if isinstance(ev, MessagePosted) and ev.payload.text == text:
                    return

        for i in range(50):
            await out.post_message(f"m{i}")
        async with asyncio.timeout(WAIT):
            await read_until("m49")

        own_hub.kill()
        # Published while the hub is down: stays in flight, sent again after the reconnect.
        in_flight = asyncio.create_task(out.post_message("during the outage"))
        await asyncio.sleep(0.3)
        assert not in_flight.done()
        own_hub.restart()
        async with asyncio.timeout(WAIT):
            sent = await in_flight
            for i in range(50, 100):
                await out.post_message(f"m{i}")
            await read_until("m99")
        assert reader.reconnects >= 1 and writer.reconnects >= 1
        assert_contiguous(got, 1, got[-1].seq)
        texts = [e.payload.text for e in got if isinstance(e, MessagePosted)]
        assert texts == (
            [f"m{i}" for i in range(50)] + ["during the outage"] + [f"m{i}" for i in range(50, 100)]
        )
        assert any(e.id == sent.id for e in got)
        # The log agrees: each message exactly once.
        history = await writer.workspace(w).events()
        assert sorted(e.id for e in history) == sorted({e.id for e in history})
        await sub.aclose()


class CuttingProxy:
    """A TCP proxy to the hub that can drop a connection as soon as the hub answers: the
    request reached the hub, the reply never reaches the client."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.cut_next_reply = False
        self.cuts = 0
        self.server: asyncio.Server | None = None

    async def __aenter__(self) -> CuttingProxy:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self.server is not None
        self.server.close()
        await self.server.wait_closed()

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"ws://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.port)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter, reply: bool) -> None:
            try:
                while data := await src.read(65536):
                    if reply and self.cut_next_reply:
                        self.cut_next_reply = False
                        self.cuts += 1
                        break
                    dst.write(data)
                    await dst.drain()
            except ConnectionError:
                pass
            finally:
                for w in (writer, up_writer):
                    w.close()

        await asyncio.gather(pipe(reader, up_writer, False), pipe(up_reader, writer, True))


async def test_request_in_flight_is_resent_and_answered_as_duplicate(hub: HubProcess) -> None:
    async with CuttingProxy(hub.port) as proxy:
        backoff = Backoff(initial=0.01, maximum=0.1)
        async with connect(proxy.url, hub.token("alice"), backoff=backoff) as session:
            ws = session.workspace(name())
            before = await ws.post_message("before")
            proxy.cut_next_reply = True  # the hub appends the next event; its ack is lost
            event = MessagePosted(id=str(uuid.uuid4()), payload=MessagePayload(text="once"))
            async with asyncio.timeout(WAIT):
                ack = await ws.publish(event)
            assert proxy.cuts == 1 and session.reconnects == 1
            assert ack.duplicate and ack.seq == before.seq + 1 and ack.id == event.id
            texts = [e.payload.text for e in await ws.events() if isinstance(e, MessagePosted)]
            assert texts == ["before", "once"]


async def test_reconnect_gives_up_with_unavailable(own_hub: HubProcess) -> None:
    backoff = Backoff(initial=0.05, maximum=0.1, give_up_after=0.5)
    async with connect(own_hub.url, own_hub.token("alice"), backoff=backoff) as session:
        ws = session.workspace("gone")
        await ws.post_message("hi")
        own_hub.kill()
        with pytest.raises(Unavailable):
            async with asyncio.timeout(WAIT):
                await ws.post_message("nobody home")
        with pytest.raises(Unavailable):
            await ws.state()


async def test_unauthorized_on_reconnect_is_not_retried(own_hub: HubProcess) -> None:
    async with connect(own_hub.url, own_hub.token("alice")) as session:
        ws = session.workspace("rotated")
        await ws.post_message("hi")
        own_hub.kill()
        # The hub comes back with another secret: the session's token no longer verifies.
        own_hub.secret = "another-secret-" + "x" * 32
        own_hub.restart()
        with pytest.raises(Unauthorized):
            async with asyncio.timeout(WAIT):
                await ws.post_message("still me?")
        assert session.closed


async def test_slow_consumer_cut_with_4408_resumes_transparently(
    small_queue_hub: HubProcess,
) -> None:
    hub = small_queue_hub
    w = "slow"
    body = "x" * 30_000  # ~30 kB per event: the socket buffers fill after a few hundred
    count = 400
    async with (
        connect(hub.url, hub.token("slow")) as slow,
        connect(hub.url, hub.token("fast")) as fast,
    ):
        sub = slow.workspace(w).subscribe(0)
        await sub.head()
        connection = slow._current
        assert connection is not None
        connection.transport.pause_reading()  # the consumer stops reading its socket
        out = fast.workspace(w)
        for start in range(0, count, 20):
            await out.publish_batch([message(f"{i}:{body}") for i in range(start, start + 20)])
        await asyncio.sleep(0.5)
        connection.transport.resume_reading()
        got: list[Event] = []
        async with asyncio.timeout(WAIT * 3):
            async for ev in sub:
                got.append(ev)
                if isinstance(ev, MessagePosted) and text(ev).startswith(f"{count - 1}:"):
                    break
        assert_contiguous(got, 1, got[-1].seq)
        numbers = [int(text(e).split(":")[0]) for e in got if isinstance(e, MessagePosted)]
        assert numbers == list(range(count))
        assert slow.reconnects >= 1
        assert slow.last_close is not None and slow.last_close[0] == 4408
        await sub.aclose()


# ---------------------------------------------------------------------------------------------
# The example


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
