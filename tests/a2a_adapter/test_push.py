"""Push notifications (a2a_adapter/push.py) against the a2a-sdk Python client, JSON-RPC and
HTTP+JSON, delivering to a real webhook receiver on loopback (allowed by ``allow_loopback``)."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
from a2a.types.a2a_pb2 import (
    AuthenticationInfo,
    DeleteTaskPushNotificationConfigRequest,
    GetTaskPushNotificationConfigRequest,
    ListTaskPushNotificationConfigsRequest,
    Message,
    Part,
    Role,
    SendMessageRequest,
    TaskPushNotificationConfig,
)
from a2a.utils.errors import InvalidParamsError, TaskNotFoundError, UnsupportedOperationError

from a2a_adapter.app import A2AService
from a2a_adapter.push import UrlPolicy, retry_backoff
from hub.auth import TokenSigner
from hub.config import A2AConfig, HubConfig, PushSettings
from hub.core.events import Completed, PushAttempted, WorkClaimed
from hub.workspaces import Workspaces
from tests.a2a_adapter.peers import WORKSPACE, TokenFactory, open_client
from tests.a2a_adapter.webhook import WebhookReceiver
from tests.support.a2a import a2a_listening
from tests.support.waiting import wait_for

LOOPBACK = PushSettings(allow_loopback=True, backoff_s=0.05, timeout_s=1.0, max_attempts=3)


@pytest.fixture
async def push_service(workspaces: Workspaces, signer: TokenSigner) -> AsyncIterator[A2AService]:
    config = HubConfig(a2a=A2AConfig(push=LOOPBACK))
    async with a2a_listening(
        A2AService(workspaces, signer, config, host="127.0.0.1", port=0, blocking_timeout=20)
    ) as svc:
        yield svc


def message(text: str) -> Message:
    return Message(
        message_id=str(uuid.uuid4()),
        role=Role.ROLE_USER,
        parts=[Part(text=text)],
        context_id=WORKSPACE,
    )


async def open_task(client: Any, text: str = "job") -> str:
    req = SendMessageRequest(message=message(text))
    req.configuration.return_immediately = True
    [r] = [r async for r in client.send_message(req)]
    return str(r.task.id)


async def attempts(workspaces: Workspaces) -> list[PushAttempted]:
    log = await workspaces.store.read_batch(WORKSPACE, limit=10_000)
    return [e for e in log if isinstance(e, PushAttempted)]


@pytest.mark.parametrize("binding", ["JSONRPC", "HTTP+JSON"])
async def test_push_config_crud_and_delivery(
    push_service: A2AService, token: TokenFactory, workspaces: Workspaces, binding: str
) -> None:
    async with (
        WebhookReceiver() as hook,
        open_client(push_service.url, token(), streaming=False, binding=binding) as client,
    ):
        task_id = await open_task(client)
        created = await client.create_task_push_notification_config(
            TaskPushNotificationConfig(
                task_id=task_id,
                url=hook.url,
                token="nt-1",
                authentication=AuthenticationInfo(scheme="Bearer", credentials="hook-secret"),
            )
        )
        assert created.id and created.task_id == task_id and created.url == hook.url
        got = await client.get_task_push_notification_config(
            GetTaskPushNotificationConfigRequest(task_id=task_id, id=created.id)
        )
        assert got == created
        listed = await client.list_task_push_notification_configs(
            ListTaskPushNotificationConfigsRequest(task_id=task_id)
        )
        assert list(listed.configs) == [created]

        await workspaces.publish(WORKSPACE, [WorkClaimed(correlation_id=task_id)], producer="bob")
        await workspaces.publish(WORKSPACE, [Completed(correlation_id=task_id)], producer="bob")
        received = await hook.wait(2)
        assert hook.states() == ["TASK_STATE_WORKING", "TASK_STATE_COMPLETED"]
        first = received[0]
        assert first.method == "POST" and first.path == "/hook?k=secret"
        assert first.headers["x-a2a-notification-token"] == "nt-1"
        assert first.headers["authorization"] == "Bearer hook-secret"  # the config's, only
        assert first.headers["host"] == f"127.0.0.1:{hook.port}"
        assert "cookie" not in first.headers
        update = first.body["statusUpdate"]
        assert update["taskId"] == task_id and update["contextId"] == WORKSPACE
        assert update["metadata"]["agora.kind"] == "workClaimed"
        assert isinstance(update["metadata"]["agora.event"]["seq"], int)

        await wait_for(lambda: _count(workspaces, 2))
        recorded = await attempts(workspaces)
        assert [a.payload.outcome for a in recorded] == ["delivered", "delivered"]
        assert {a.producer for a in recorded} == {"peer"}
        assert recorded[0].payload.url == f"http://127.0.0.1:{hook.port}/hook"  # no query
        assert recorded[0].payload.status == 200 and recorded[0].payload.attempt == 1
        assert recorded[1].payload.state == "TASK_STATE_COMPLETED"
        assert recorded[0].correlation_id is None and recorded[0].causation_id

        await client.delete_task_push_notification_config(
            DeleteTaskPushNotificationConfigRequest(task_id=task_id, id=created.id)
        )
        with pytest.raises(TaskNotFoundError):
            await client.get_task_push_notification_config(
                GetTaskPushNotificationConfigRequest(task_id=task_id, id=created.id)
            )
        await client.delete_task_push_notification_config(  # idempotent
            DeleteTaskPushNotificationConfigRequest(task_id=task_id, id=created.id)
        )


async def _count(workspaces: Workspaces, n: int) -> bool:
    return len(await attempts(workspaces)) >= n


async def test_card_says_push_notifications(push_service: A2AService) -> None:
    assert push_service.handler is not None
    assert push_service.handler.card.capabilities.push_notifications


async def test_config_in_send_message_configuration(
    push_service: A2AService, token: TokenFactory, workspaces: Workspaces
) -> None:
    async with (
        WebhookReceiver() as hook,
        open_client(push_service.url, token(), streaming=False) as client,
    ):
        req = SendMessageRequest(message=message("pushed"))
        req.configuration.return_immediately = True
        req.configuration.task_push_notification_config.url = hook.url
        req.configuration.task_push_notification_config.id = "mine"
        [r] = [r async for r in client.send_message(req)]
        task_id = r.task.id
        await workspaces.publish(WORKSPACE, [Completed(correlation_id=task_id)], producer="bob")
        await hook.wait(1)
        assert hook.states() == ["TASK_STATE_COMPLETED"]
        got = await client.get_task_push_notification_config(
            GetTaskPushNotificationConfigRequest(task_id=task_id, id="mine")
        )
        assert got.url == hook.url


async def test_retries_with_backoff_then_delivers(
    push_service: A2AService, token: TokenFactory, workspaces: Workspaces
) -> None:
    async with (
        WebhookReceiver([503, 500]) as hook,
        open_client(push_service.url, token(), streaming=False) as client,
    ):
        task_id = await open_task(client)
        await client.create_task_push_notification_config(
            TaskPushNotificationConfig(task_id=task_id, url=hook.url)
        )
        await workspaces.publish(WORKSPACE, [Completed(correlation_id=task_id)], producer="bob")
        await hook.wait(3)
        await wait_for(lambda: _count(workspaces, 3))
        recorded = [a.payload for a in await attempts(workspaces)]
        assert [(a.attempt, a.outcome, a.status) for a in recorded] == [
            (1, "retry", 503),
            (2, "retry", 500),
            (3, "delivered", 200),
        ]


@pytest.mark.parametrize(
    ("statuses", "error"), [([404], "HTTP 404"), ([302], "redirect (not followed)")]
)
async def test_client_errors_and_redirects_end_the_delivery(
    push_service: A2AService,
    token: TokenFactory,
    workspaces: Workspaces,
    statuses: list[int],
    error: str,
) -> None:
    async with WebhookReceiver() as target, WebhookReceiver(statuses, location=target.url) as hook:
        async with open_client(push_service.url, token(), streaming=False) as client:
            task_id = await open_task(client)
            await client.create_task_push_notification_config(
                TaskPushNotificationConfig(task_id=task_id, url=hook.url)
            )
        await workspaces.publish(WORKSPACE, [Completed(correlation_id=task_id)], producer="bob")
        await wait_for(lambda: _count(workspaces, 1))
        [only] = [a.payload for a in await attempts(workspaces)]
        assert (only.attempt, only.outcome, only.error) == (1, "failed", error)
        assert len(hook.received) == 1 and target.received == []


async def test_timeouts_are_bounded_attempts(
    push_service: A2AService, token: TokenFactory, workspaces: Workspaces
) -> None:
    async with WebhookReceiver(delay=3.0) as hook:
        async with open_client(push_service.url, token(), streaming=False) as client:
            task_id = await open_task(client)
            await client.create_task_push_notification_config(
                TaskPushNotificationConfig(task_id=task_id, url=hook.url)
            )
        await workspaces.publish(WORKSPACE, [Completed(correlation_id=task_id)], producer="bob")
        await wait_for(lambda: _count(workspaces, 3), within=20)
        recorded = [a.payload for a in await attempts(workspaces)]
        assert [(a.outcome, a.error) for a in recorded] == [
            ("retry", "timeout"),
            ("retry", "timeout"),
            ("failed", "timeout"),
        ]


async def test_configs_are_per_agent_and_bounded(
    push_service: A2AService, token: TokenFactory, workspaces: Workspaces
) -> None:
    async with (
        WebhookReceiver() as hook,
        open_client(push_service.url, token(), streaming=False) as client,
        open_client(push_service.url, token("eve"), streaming=False) as other,
    ):
        task_id = await open_task(client)
        for i in range(LOOPBACK.max_configs_per_task):
            await client.create_task_push_notification_config(
                TaskPushNotificationConfig(task_id=task_id, id=f"c{i}", url=hook.url)
            )
        # the same id replaces, a new one is refused
        await client.create_task_push_notification_config(
            TaskPushNotificationConfig(task_id=task_id, id="c0", url=hook.url)
        )
        with pytest.raises(UnsupportedOperationError):
            await client.create_task_push_notification_config(
                TaskPushNotificationConfig(task_id=task_id, id="one-more", url=hook.url)
            )
        # another reader of the workspace sees none of them
        listed = await other.list_task_push_notification_configs(
            ListTaskPushNotificationConfigsRequest(task_id=task_id)
        )
        assert list(listed.configs) == []
        with pytest.raises(TaskNotFoundError):
            await other.get_task_push_notification_config(
                GetTaskPushNotificationConfigRequest(task_id=task_id, id="c0")
            )


async def test_a_task_outside_the_token_has_no_configs(
    push_service: A2AService, token: TokenFactory
) -> None:
    async with (
        open_client(push_service.url, token(), streaming=False) as client,
        open_client(push_service.url, token("x", workspaces=("elsewhere",))) as stranger,
    ):
        task_id = await open_task(client)
        with pytest.raises(TaskNotFoundError):
            await stranger.create_task_push_notification_config(
                TaskPushNotificationConfig(task_id=task_id, url="http://127.0.0.1:9/x")
            )


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:9/hook",  # loopback: not allowed by default
        "http://[::1]:9/hook",
        "http://10.0.0.5/hook",
        "http://169.254.169.254/latest/meta-data",
        "http://user:pw@127.0.0.1/hook",
        "ftp://127.0.0.1/hook",
        "http:///nohost",
        "http://0.0.0.0:9/",
    ],
)
async def test_ssrf_refused_by_default(
    service: A2AService, token: TokenFactory, workspaces: Workspaces, url: str
) -> None:
    async with open_client(service.url, token(), streaming=False) as client:
        task_id = await open_task(client)
        before = await workspaces.head(WORKSPACE)
        with pytest.raises(InvalidParamsError):
            await client.create_task_push_notification_config(
                TaskPushNotificationConfig(task_id=task_id, url=url)
            )
        req = SendMessageRequest(message=message("with a bad hook"))
        req.configuration.task_push_notification_config.url = url
        req.configuration.return_immediately = True
        with pytest.raises(InvalidParamsError):
            [_ async for _ in client.send_message(req)]
        assert await workspaces.head(WORKSPACE) == before  # nothing written


async def test_a_name_with_one_forbidden_address_is_refused() -> None:
    async def resolver(host: str, port: int) -> list[str]:
        known = {"mixed.example": ["93.184.216.34", "127.0.0.1"], "pub.example": ["1.1.1.1"]}
        if host not in known:
            raise OSError(f"no such host {host}")
        return known[host]

    policy = UrlPolicy(PushSettings(), resolver)
    target = await policy.check("https://pub.example/h?q=1")
    assert target is not None
    assert (target.address, target.host_header, target.path) == ("1.1.1.1", "pub.example", "/h?q=1")
    with pytest.raises(ValueError, match=r"127\.0\.0\.1"):
        await policy.check("https://mixed.example/h", unresolved_ok=True)
    # Not resolvable now: accepted at creation, refused at delivery.
    assert await policy.check("https://nowhere.example/h", unresolved_ok=True) is None
    with pytest.raises(ValueError, match="cannot resolve"):
        await policy.check("https://nowhere.example/h")
    allowed = UrlPolicy(PushSettings(allowed_networks=("10.1.0.0/16",), allow_public=False))
    assert allowed.allows("10.1.2.3") and not allowed.allows("10.2.0.1")
    assert not allowed.allows("1.1.1.1")
    assert not UrlPolicy(PushSettings()).allows("::ffff:127.0.0.1")


async def test_an_unresolvable_webhook_is_refused_at_delivery(
    push_service: A2AService, token: TokenFactory, workspaces: Workspaces
) -> None:
    async with open_client(push_service.url, token(), streaming=False) as client:
        task_id = await open_task(client)
        await client.create_task_push_notification_config(
            TaskPushNotificationConfig(task_id=task_id, url="http://no-such-host.invalid/hook")
        )
    await workspaces.publish(WORKSPACE, [Completed(correlation_id=task_id)], producer="bob")
    await wait_for(lambda: _count(workspaces, 1), within=20)
    [only] = [a.payload for a in await attempts(workspaces)]
    assert (only.attempt, only.outcome) == (1, "refused")
    assert only.error is not None and "cannot resolve" in only.error


def test_delivery_retries_wait_backoff_s_doubling_with_the_one_backoff() -> None:
    backoff = retry_backoff(PushSettings(backoff_s=0.5, max_attempts=4))
    assert [backoff.delay(n) for n in range(3)] == [0.5, 1.0, 2.0]  # no jitter, no cap
    widest = retry_backoff(PushSettings(backoff_s=60.0, max_attempts=20))
    assert widest.delay(18) == 60.0 * 2**18
