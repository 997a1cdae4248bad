"""A workspace member that answers the A2A conformance kit's scenarios, over WebSocket.

Run the official kit (``a2aproject/a2a-tck``, branch ``1.0-dev``) against a real ``agora serve``
with a token scoped to one workspace, the way a peer meets the hub (docs/a2a.md,
"Conformance")::

    agora serve --data ./agora-data &
    python examples/a2a_member.py --url ws://127.0.0.1:8765 --data ./agora-data --workspace tck

The hub alone is no agent: A2A tasks are work items that wait for a member. This one connects
as the agent ``tck-member`` (a token minted with the hub's secret from ``--data``/
``AGORA_SECRET``, or ``--token``), follows the workspace and, for every ``needWork``, plays the
kit's scenario for the message's ``messageId`` prefix (``scenarios/*.feature`` of the kit):
claim, publish artifacts, ask for input, reject, complete. A follow-up message on a task it
holds (``feedbackProvided``/``messagePosted`` from someone else) completes the task. Runs until
interrupted; exit status 1 if the hub refuses the token.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import sys
from pathlib import Path
from typing import Any

# Runnable from a checkout without installing: put the repository root on the path.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hub.auth import TokenSigner, load_secret
from hub.client import Workspace, connect
from hub.core.errors import AgoraError
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

AGENT = "tck-member"


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
        data: dict[str, Any] = {"data": {"key": "value", "count": 42}}
        return [claim, published(_artifact([data])), done], 0, []
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


def follow_up_id(event: Event) -> str | None:
    """For a follow-up message on a task (someone else's feedbackProvided/messagePosted), the
    messageId whose scenario answers it ("" = the default: complete); None otherwise."""
    if not isinstance(event, FeedbackProvided | MessagePosted) or not event.correlation_id:
        return None
    if event.producer == AGENT:
        return None
    body = event.payload.data if isinstance(event, MessagePosted) else event.payload
    mid = body.get("messageId", "") if isinstance(body, dict) else ""
    return mid if "input-required" in mid else ""


async def play(ws: Workspace, now: list[Event], delay: float, later: list[Event]) -> None:
    # A refused step (the task was cancelled meanwhile, a duplicate) ends this scenario only.
    with contextlib.suppress(AgoraError):
        if now:
            await ws.publish_batch(now)
        if later:
            await asyncio.sleep(delay)
            await ws.publish_batch(later)


async def run(url: str, token: str, workspace: str) -> None:
    async with connect(url, token) as session, asyncio.TaskGroup() as tg:
        ws = session.workspace(workspace)
        async with ws.subscribe() as events:
            print(f"{AGENT} answering in {workspace!r} on {url}", flush=True)
            async for ev in events:
                cid = ev.correlation_id
                if cid is None:
                    continue
                if isinstance(ev, NeedWork) and isinstance(ev.payload, dict):
                    mid = str(ev.payload.get("messageId", ""))
                else:
                    follow = follow_up_id(ev)
                    if follow is None:
                        continue
                    mid = follow
                tg.create_task(play(ws, *scenario(mid, cid)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="ws://127.0.0.1:8765", help="the hub's WebSocket URL")
    parser.add_argument("--workspace", default="tck", help="the workspace (A2A contextId)")
    parser.add_argument("--data", default="./agora-data", help="hub data dir (for the secret)")
    parser.add_argument("--token", help="a token for tck-member (default: minted from --data)")
    args = parser.parse_args()
    token = args.token or TokenSigner(load_secret(Path(args.data), os.environ)).issue(
        AGENT, [args.workspace], ["read", "write"], ttl_seconds=24 * 3600
    )
    try:
        asyncio.run(run(args.url, token, args.workspace))
    except KeyboardInterrupt:
        pass
    except AgoraError as e:
        print(f"{AGENT}: {e}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
