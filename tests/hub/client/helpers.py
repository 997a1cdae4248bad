"""Helpers shared by the client tests (the hub fixtures are in conftest.py)."""

from __future__ import annotations

import asyncio
import uuid

from hub.client import Workspace
from hub.core.events import Event, MessagePayload, MessagePosted

WAIT = 10.0  # seconds: generous bound on any single wait in these tests


def name() -> str:
    """A fresh workspace name per test (the module's hub is shared)."""
    return f"w-{uuid.uuid4().hex[:12]}"


def message(text: str) -> MessagePosted:
    return MessagePosted(payload=MessagePayload(text=text))


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
