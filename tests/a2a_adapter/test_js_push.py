"""Push notifications with @a2a-js/sdk under Node, on JSON-RPC, HTTP+JSON and gRPC, delivered to
a webhook receiver on loopback. The JS dependencies are pinned by
``tests/a2a_adapter/js/package-lock.json`` (``npm ci`` once; node_modules is git-ignored).
Skipped with the reason when node/npm are missing or the install fails — failed instead when
``AGORA_REQUIRE`` names ``node``."""

from __future__ import annotations

import asyncio
import json
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from a2a_adapter.app import A2AService
from hub.auth import TokenSigner
from hub.config import A2AConfig, HubConfig, PushSettings
from hub.core.events import Completed, PushAttempted
from hub.workspaces import Workspaces
from tests.a2a_adapter.peers import WORKSPACE, TokenFactory
from tests.a2a_adapter.webhook import WebhookReceiver
from tests.support.a2a import a2a_listening
from tests.support.require import require
from tests.support.waiting import wait_for

JS_DIR = Path(__file__).with_name("js")


def _installed() -> Path:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        require("node", False, "node/npm are not installed")
    marker = JS_DIR / "node_modules" / "@grpc" / "grpc-js" / "package.json"
    if not marker.exists():
        done = subprocess.run(
            [npm, "ci", "--no-audit", "--no-fund", "--silent"],
            cwd=JS_DIR,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if done.returncode != 0:
            require("node", False, f"npm ci failed: {done.stderr.strip()[-300:]}")
    return JS_DIR


@pytest.fixture
async def js_service(workspaces: Workspaces, signer: TokenSigner) -> AsyncIterator[A2AService]:
    config = HubConfig(a2a=A2AConfig(push=PushSettings(allow_loopback=True)))
    async with a2a_listening(
        A2AService(
            workspaces, signer, config, host="127.0.0.1", port=0, grpc_port=0, blocking_timeout=20
        )
    ) as svc:
        yield svc


@pytest.mark.parametrize("binding", ["jsonrpc", "rest", "grpc"])
async def test_a2a_js_push_notifications(
    js_service: A2AService, token: TokenFactory, workspaces: Workspaces, binding: str
) -> None:
    where = await asyncio.to_thread(_installed)
    async with WebhookReceiver() as hook:
        proc = await asyncio.create_subprocess_exec(
            "node",
            "push.mjs",
            js_service.url,
            token("js-peer"),
            WORKSPACE,
            binding,
            hook.url,
            cwd=where,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
        )
        async with asyncio.timeout(60):
            out, err = await proc.communicate()
        assert proc.returncode == 0, err.decode()
        result = json.loads(out.decode().strip().splitlines()[-1])
        task_id = result["taskId"]
        assert result["created"] == {"id": "js-1", "taskId": task_id, "url": hook.url}
        assert result["got"] == "js-1"
        assert result["listed"] == ["js-1", "js-2"]
        assert result["afterDelete"] == ["js-1"]

        await workspaces.publish(WORKSPACE, [Completed(correlation_id=task_id)], producer="bob")
        [received] = await hook.wait(1)
        assert received.headers["authorization"] == f"Bearer secret-{binding}"
        assert received.headers["x-a2a-notification-token"] == f"token-{binding}"
        assert received.body["statusUpdate"]["status"]["state"] == "TASK_STATE_COMPLETED"

    async def recorded() -> list[PushAttempted]:
        log = await workspaces.store.read_batch(WORKSPACE, limit=1000)
        return [e for e in log if isinstance(e, PushAttempted)]

    await wait_for(recorded)
    [attempt] = await recorded()
    assert (attempt.producer, attempt.payload.config_id) == ("js-peer", "js-1")
    assert attempt.payload.outcome == "delivered"
