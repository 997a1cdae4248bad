"""hub/client/session.py against a real ``agora serve`` subprocess (fixtures in conftest.py):
connecting, refreshing, closing, reconnecting."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from hub.client import Backoff, Session, SessionClosed, connect
from hub.core.errors import Forbidden, Unauthorized, Unavailable
from hub.core.events import Event, MessagePayload, MessagePosted
from tests.hub.client.helpers import WAIT, assert_contiguous, name
from tests.support.hub import HubProcess


def test_public_names_stay_importable_from_hub_client() -> None:
    import hub.client

    # Every public name of the former single-module hub/client.py (its __all__ and defaults).
    for public in (
        "Ack", "Backoff", "BatchAck", "ExecHandle", "ExecResult", "ExecUpdate", "Session",
        "SessionClosed", "Subscription", "Workspace", "WorkspaceRuntime", "connect",
        "error_from_frame", "DEFAULT_HISTORY", "DEFAULT_HISTORY_BYTES", "DEFAULT_MAX_FRAME",
        "RATE_LIMIT_RETRIES", "MAX_RATE_LIMIT_WAIT", "CATCH_UP_RETRIES", "INDEX_SIZE",
    ):  # fmt: skip
        assert public in hub.client.__all__ and hasattr(hub.client, public), public
    assert issubclass(SessionClosed, Unavailable)
    assert connect.__module__ == "hub.client.session"


async def test_welcome(alice: Session) -> None:
    assert alice.agent == "alice"
    assert set(alice.rights) == {"read", "write"}
    assert alice.server.startswith("agora/")


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
