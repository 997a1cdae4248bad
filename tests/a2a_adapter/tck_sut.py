"""A system under test for the official A2A conformance kit (a2aproject/a2a-tck, 1.0-dev).

    python -m tests.a2a_adapter.tck_sut --port 9999     # then, in the TCK's checkout:
    ./run_tck.py --sut-host http://127.0.0.1:9999 --transport jsonrpc,http_json

Not a test: the kit is not vendored (fetch it yourself). The hub alone is no agent — its tasks
wait for workspace members — so this runs the A2A listener over a temporary SQLite log with a
member that plays the kit's scenarios (``scenarios/*.feature``: what to do for each messageId
prefix) through Workspaces, the way any WebSocket agent would. The kit sends no credentials
(and picks its own contextIds), so a wrapper adds a token for every workspace to requests that
carry none.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from a2a_adapter.app import A2AService
from hub.auth import TokenSigner
from hub.config import HubConfig
from hub.core.events import (
    Completed,
    Event,
    FeedbackProvided,
    FeedbackRequested,
    MessagePosted,
    NeedWork,
    WorkCancelled,
    WorkClaimed,
    WorkPublished,
)
from hub.log.sqlite import SqliteEventStore
from hub.workspaces import Workspaces

SECRET = b"tck-sut-secret-0123456789abcdef0123456789"


def _artifact(parts: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"artifactId": extra.pop("artifactId", "a1"), "parts": parts, **extra}


def scenario(message_id: str, cid: str) -> tuple[list[Event], float, list[Event]]:
    """The events for a scenario: (now, delay in seconds, after the delay)."""
    claim = WorkClaimed(correlation_id=cid)
    done = Completed(correlation_id=cid)

    def published(payload: dict[str, Any]) -> WorkPublished:
        return WorkPublished(correlation_id=cid, payload=payload)

    if message_id.startswith("tck-input-required"):
        return [claim, FeedbackRequested(correlation_id=cid, payload="input required")], 0, []
    if message_id.startswith("tck-reject-task"):
        return [claim, WorkCancelled(correlation_id=cid, payload="rejected")], 0, []
    if message_id.startswith("tck-artifact-file-url") or message_id.startswith(
        "tck-stream-artifact-file-url"
    ):
        part = {"url": "https://example.com/output.txt", "filename": "output.txt"}
        part["mediaType"] = "text/plain"
        return [claim, published(_artifact([part])), done], 0, []
    if message_id.startswith(("tck-artifact-file", "tck-stream-artifact-file")):
        part = {"raw": "RmlsZSBjb250ZW50", "filename": "output.txt", "mediaType": "text/plain"}
        return [claim, published(_artifact([part])), done], 0, []
    if message_id.startswith("tck-artifact-data"):
        part = {"data": {"key": "value", "count": 42}}
        return [claim, published(_artifact([part])), done], 0, []
    if message_id.startswith("tck-stream-artifact-chunked"):
        first = published(_artifact([{"text": "chunk-1 "}]))
        last = published(_artifact([{"text": "chunk-2"}], append=True, lastChunk=True))
        return [claim, first, last, done], 0, []
    if message_id.startswith("test-resubscribe-message-id"):
        return [claim], 4.0, [done]
    texts = {
        "tck-artifact-text": "Generated text content",
        "tck-stream-001": "Stream hello from TCK",
        "tck-stream-003": "Stream task lifecycle",
        "tck-stream-ordering-001": "Ordered output",
        "tck-stream-artifact-text": "Streamed text content",
    }
    for prefix, text in texts.items():
        if message_id.startswith(prefix):
            return [claim, published(_artifact([{"text": text}])), done], 0, []
    if message_id.startswith("tck-stream-002"):
        return [claim, done], 0, []
    if not message_id:  # a follow-up on a task the member already holds
        answer = {"messageId": f"{cid}-done", "parts": [{"text": "Hello from TCK"}]}
        return [Completed(correlation_id=cid, payload=answer)], 0, []
    answer = {"messageId": f"{cid}-answer", "parts": [{"text": "Hello from TCK"}]}
    return [claim, Completed(correlation_id=cid, payload=answer)], 0, []


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


async def main(port: int) -> None:
    with tempfile.TemporaryDirectory(prefix="tck-sut-") as tmp:
        store = SqliteEventStore(Path(tmp) / "agora.db", blobs_dir=Path(tmp) / "blobs")
        async with store:
            workspaces = Workspaces(store)
            signer = TokenSigner(SECRET)
            token = signer.issue("tck", ["*"], ["read", "write"], ttl_seconds=86400)
            service = A2AService(workspaces, signer, HubConfig(), host="127.0.0.1", port=port)
            async with service:
                assert service._server is not None
                service._server.config.app = _WithToken(service._server.config.app, token)
                service._server.config.loaded_app = _WithToken(
                    service._server.config.loaded_app, token
                )
                print(f"tck sut on {service.url}", flush=True)
                await member(workspaces)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--port", type=int, default=9999)
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(main(parser.parse_args().port))
