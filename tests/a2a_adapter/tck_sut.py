"""A system under test for the official A2A conformance kit (a2aproject/a2a-tck, 1.0-dev).

    python -m tests.a2a_adapter.tck_sut --port 9999 --grpc-port 9998  # then, in the TCK:
    ./run_tck.py --sut-host http://127.0.0.1:9999 --transport jsonrpc,http_json,grpc

Not a test: the kit is not vendored (fetch it yourself). The hub alone is no agent — its tasks
wait for workspace members — so this runs the A2A listener over a temporary SQLite log with a
member that plays the kit's scenarios (``scenarios/*.feature``: what to do for each messageId
prefix) through Workspaces, the way any WebSocket agent would. The kit sends no credentials
(and picks its own contextIds), so a wrapper adds a token for every workspace to requests that
carry none (HTTP), and the gRPC binding's token lookup is wrapped to the same end (gRPC). Push
webhooks on loopback are allowed (the kit's receiver runs there).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from a2a_adapter import grpc_binding
from a2a_adapter.app import A2AService
from examples.a2a_member import scenario
from hub.auth import TokenSigner
from hub.config import A2AConfig, HubConfig, PushSettings
from hub.core.events import (
    Event,
    FeedbackProvided,
    MessagePosted,
    NeedWork,
)
from hub.log.sqlite import SqliteEventStore
from hub.workspaces import Workspaces
from tests.support.a2a import a2a_listening

SECRET = b"tck-sut-secret-0123456789abcdef0123456789"


async def member(workspaces: Workspaces) -> None:
    """Plays the scenario of every needWork, in whatever workspace (context) it appears."""
    queue: asyncio.Queue[tuple[str, NeedWork]] = asyncio.Queue()

    def on_commit(workspace: str, batch: Sequence[Event]) -> None:
        for ev in batch:
            if isinstance(ev, NeedWork) and ev.correlation_id and isinstance(ev.payload, dict):
                queue.put_nowait((workspace, ev))
            elif (
                isinstance(ev, FeedbackProvided | MessagePosted)
                and ev.correlation_id
                and ev.producer != "tck-member"
            ):  # a follow-up message: the kit's default scenario completes the task
                body = ev.payload.data if isinstance(ev, MessagePosted) else ev.payload
                mid = body.get("messageId", "") if isinstance(body, dict) else ""
                follow_up = {"messageId": mid if "input-required" in mid else ""}
                queue.put_nowait(
                    (workspace, NeedWork(correlation_id=ev.correlation_id, payload=follow_up))
                )

    workspaces.add_listener(on_commit)
    try:
        async with asyncio.TaskGroup() as tg:
            while True:
                workspace, need = await queue.get()
                assert need.correlation_id is not None
                now, delay, later = scenario(
                    str(need.payload.get("messageId", "")), need.correlation_id
                )
                tg.create_task(play(workspaces, workspace, now, delay, later))
    finally:
        workspaces.remove_listener(on_commit)


async def play(
    workspaces: Workspaces, workspace: str, now: list[Event], delay: float, later: list[Event]
) -> None:
    await asyncio.sleep(0.05)
    with contextlib.suppress(Exception):
        await workspaces.publish(workspace, now, producer="tck-member")
        if later:
            await asyncio.sleep(delay)
            await workspaces.publish(workspace, later, producer="tck-member")


class _WithToken:
    """Adds ``Authorization: Bearer <token>`` to requests without one (the kit sends none)."""

    def __init__(self, app: Any, token: str) -> None:
        self.app = app
        self.header = (b"authorization", f"Bearer {token}".encode())

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "http" and not any(
            k.lower() == b"authorization" for k, _ in scope.get("headers", [])
        ):
            scope = dict(scope, headers=[*scope.get("headers", []), self.header])
        await self.app(scope, receive, send)


async def main(port: int, grpc_port: int | None) -> None:
    with tempfile.TemporaryDirectory(prefix="tck-sut-") as tmp:
        store = SqliteEventStore(Path(tmp) / "agora.db", blobs_dir=Path(tmp) / "blobs")
        async with store:
            workspaces = Workspaces(store)
            signer = TokenSigner(SECRET)
            token = signer.issue("tck", ["*"], ["read", "write"], ttl_seconds=86400)
            config = HubConfig(
                a2a=A2AConfig(push=PushSettings(allow_loopback=True), grpc_port=grpc_port)
            )
            service = A2AService(workspaces, signer, config, host="127.0.0.1", port=port)
            given = grpc_binding.bearer_of
            # This harness only: a gRPC call without a token gets the kit's token.
            grpc_binding.bearer_of = lambda metadata: given(metadata) or token
            async with a2a_listening(service, wrap=lambda app: _WithToken(app, token)):
                print(f"tck sut on {service.url}", flush=True)
                await member(workspaces)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=9999)
    parser.add_argument("--grpc-port", type=int, default=None, help="also serve gRPC there")
    args = parser.parse_args()
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main(args.port, args.grpc_port))
