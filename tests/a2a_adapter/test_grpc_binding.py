"""The gRPC binding against the a2a-sdk Python gRPC client, over a real loopback port: the card
advertises it, the token goes in ``authorization`` metadata, push configs work over it."""

from __future__ import annotations

import contextlib
import time
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import httpx
import pytest
from a2a.client import Client, ClientConfig, ClientFactory
from a2a.types.a2a_pb2 import (
    GetTaskRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    TaskPushNotificationConfig,
    TaskState,
)
from a2a.types.a2a_pb2_grpc import A2AServiceStub
from a2a.utils.errors import TaskNotFoundError

from a2a_adapter.app import A2AService
from hub.auth import TokenSigner
from hub.config import A2AConfig, HubConfig, PushSettings
from hub.core.events import Completed
from hub.workspaces import Workspaces
from tests.a2a_adapter.peers import WORKSPACE, TokenFactory, Worker, fetch_card
from tests.a2a_adapter.webhook import WebhookReceiver
from tests.support.a2a import a2a_listening
from tests.support.hub import HubProcess
from tests.support.tokens import make_signer, mint

S = TaskState


@pytest.fixture
async def grpc_service(workspaces: Workspaces, signer: TokenSigner) -> AsyncIterator[A2AService]:
    config = HubConfig(a2a=A2AConfig(push=PushSettings(allow_loopback=True)))
    async with a2a_listening(
        A2AService(
            workspaces, signer, config, host="127.0.0.1", port=0, grpc_port=0, blocking_timeout=20
        )
    ) as svc:
        yield svc


def _with_token(details: Any, token: str) -> Any:
    metadata = [*(details.metadata or []), ("authorization", f"Bearer {token}")]
    return details._replace(metadata=metadata)


# grpc.aio files an interceptor under its first matching kind only: one class per kind.
class _UnaryAuth(grpc.aio.UnaryUnaryClientInterceptor):  # type: ignore[misc]
    def __init__(self, token: str) -> None:
        self.token = token

    async def intercept_unary_unary(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_token(details, self.token), request)


class _StreamAuth(grpc.aio.UnaryStreamClientInterceptor):  # type: ignore[misc]
    def __init__(self, token: str) -> None:
        self.token = token

    async def intercept_unary_stream(self, continuation: Any, details: Any, request: Any) -> Any:
        return await continuation(_with_token(details, self.token), request)


@contextlib.asynccontextmanager
async def grpc_client(
    base_url: str, token: str, *, streaming: bool = True
) -> AsyncIterator[Client]:
    card = await fetch_card(base_url)
    async with httpx.AsyncClient() as http:
        config = ClientConfig(
            httpx_client=http,
            streaming=streaming,
            supported_protocol_bindings=["GRPC"],
            grpc_channel_factory=lambda url: grpc.aio.insecure_channel(
                url, interceptors=[_UnaryAuth(token), _StreamAuth(token)]
            ),
        )
        client = ClientFactory(config).create(card)
        try:
            yield client
        finally:
            await client.close()


def message(text: str) -> Message:
    return Message(
        message_id=str(uuid.uuid4()),
        role=Role.ROLE_USER,
        parts=[Part(text=text)],
        context_id=WORKSPACE,
    )


async def test_card_advertises_grpc(grpc_service: A2AService) -> None:
    card = await fetch_card(grpc_service.url)
    grpc_ifaces = [i for i in card.supported_interfaces if i.protocol_binding == "GRPC"]
    assert [i.url for i in grpc_ifaces] == [f"127.0.0.1:{grpc_service.grpc_port}"]


async def test_send_stream_get_over_grpc(
    grpc_service: A2AService, token: TokenFactory, workspaces: Workspaces
) -> None:
    async with Worker(workspaces), grpc_client(grpc_service.url, token("grpc-peer")) as client:
        got = [r async for r in client.send_message(SendMessageRequest(message=message("g")))]
        assert got[0].task.status.state == S.TASK_STATE_SUBMITTED
        last = got[-1].status_update.status.state
        assert last == S.TASK_STATE_COMPLETED
        task = await client.get_task(GetTaskRequest(id=got[0].task.id))
        assert task.status.state == S.TASK_STATE_COMPLETED
        assert task.artifacts[0].parts[0].text == "result: g"
        with pytest.raises(TaskNotFoundError):
            await client.get_task(GetTaskRequest(id="no-such-task"))
    log = await workspaces.store.read_batch(WORKSPACE, limit=1000)
    assert {e.producer for e in log if e.kind == "needWork"} == {"grpc-peer"}


async def test_push_over_grpc(
    grpc_service: A2AService, token: TokenFactory, workspaces: Workspaces
) -> None:
    async with (
        WebhookReceiver() as hook,
        grpc_client(grpc_service.url, token(), streaming=False) as client,
    ):
        req = SendMessageRequest(message=message("p"))
        req.configuration.return_immediately = True
        [r] = [r async for r in client.send_message(req)]
        await client.create_task_push_notification_config(
            TaskPushNotificationConfig(task_id=r.task.id, url=hook.url, token="t")
        )
        await workspaces.publish(WORKSPACE, [Completed(correlation_id=r.task.id)], producer="bob")
        await hook.wait(1)
        assert hook.states() == ["TASK_STATE_COMPLETED"]


@pytest.mark.parametrize("bearer", [None, "Bearer not-a-token", "Basic abc"])
async def test_calls_without_a_valid_token_are_unauthenticated(
    grpc_service: A2AService, workspaces: Workspaces, bearer: str | None
) -> None:
    metadata = [("a2a-version", "1.0")] + ([("authorization", bearer)] if bearer else [])
    async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_service.grpc_port}") as channel:
        stub = A2AServiceStub(channel)  # type: ignore[no-untyped-call]
        with pytest.raises(grpc.aio.AioRpcError) as unary:
            await stub.SendMessage(SendMessageRequest(message=message("x")), metadata=metadata)
        assert unary.value.code() == grpc.StatusCode.UNAUTHENTICATED
        with pytest.raises(grpc.aio.AioRpcError) as streamed:
            async for _ in stub.SendStreamingMessage(
                SendMessageRequest(message=message("x")), metadata=metadata
            ):
                pass
        assert streamed.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert await workspaces.head(WORKSPACE) == 0  # nothing written


async def test_an_expired_token_is_refused(
    grpc_service: A2AService, signer: TokenSigner, workspaces: Workspaces
) -> None:
    # Same secret, a clock an hour behind: the token expired 50 minutes ago.
    past = make_signer(clock=lambda: time.time() - 3600)
    expired = past.issue("late", (WORKSPACE,), ("read", "write"), ttl_seconds=600)
    async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_service.grpc_port}") as channel:
        stub = A2AServiceStub(channel)  # type: ignore[no-untyped-call]
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.GetTask(
                GetTaskRequest(id="x"), metadata=[("authorization", f"Bearer {expired}")]
            )
    assert refused.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert "expired" in (refused.value.details() or "")


async def test_an_unsupported_version_is_unimplemented(
    grpc_service: A2AService, token: TokenFactory
) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{grpc_service.grpc_port}") as channel:
        stub = A2AServiceStub(channel)  # type: ignore[no-untyped-call]
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stub.GetTask(
                GetTaskRequest(id="x"),
                metadata=[("a2a-version", "0.3"), ("authorization", f"Bearer {token()}")],
            )
    assert refused.value.code() == grpc.StatusCode.UNIMPLEMENTED


async def test_agora_serve_with_a2a_grpc_port(tmp_path: Path) -> None:
    """The real ``agora serve --a2a-grpc-port 0``: the card lists the gRPC interface and a
    scoped token works over it (black box, real process and sockets)."""
    hub = HubProcess(tmp_path / "data", a2a_port=0, args=["--a2a-grpc-port", "0"]).start()
    try:
        card = await fetch_card(hub.a2a_url)
        [iface] = [i for i in card.supported_interfaces if i.protocol_binding == "GRPC"]
        assert card.capabilities.push_notifications
        peer = mint("peer", [WORKSPACE], ["read", "write"])
        async with grpc.aio.insecure_channel(iface.url) as channel:
            stub = A2AServiceStub(channel)  # type: ignore[no-untyped-call]
            with pytest.raises(grpc.aio.AioRpcError) as missing:
                await stub.GetTask(
                    GetTaskRequest(id="nope"), metadata=[("authorization", f"Bearer {peer}")]
                )
        assert missing.value.code() == grpc.StatusCode.NOT_FOUND
    finally:
        hub.terminate()
