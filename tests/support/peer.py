"""Raw WebSocket clients of a hub (never hub/client.py, which has tests of its own): a
:class:`Peer` only adds JSON framing, rids and an inbox around one ``websockets`` connection;
:class:`ExecPeer` adds the runtime's ops. Plus filters over the event frames they read.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
from collections.abc import AsyncIterator
from typing import Any, Final, TypeVar

from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import ConnectionClosed

from tests.support.tokens import mint_exec

Frame = dict[str, Any]

RECV_TIMEOUT: Final = 10.0
"""Seconds a frame that is due may take (a reply, the next event)."""

EXEC_TIMEOUT: Final = 60.0
"""Seconds an execution's reply may take (a container may have to start first)."""

OPEN_TIMEOUT: Final = 10.0


class Peer:
    """A raw websockets connection with JSON framing, rids and an inbox for other frames."""

    def __init__(self, ws: ClientConnection) -> None:
        self.ws = ws
        self.inbox: list[Frame] = []
        self._rids = itertools.count(1)

    async def send(self, frame: Frame | str | bytes) -> None:
        if isinstance(frame, dict):
            await self.ws.send(json.dumps(frame))
        else:
            await self.ws.send(frame)

    async def recv(self, within: float = RECV_TIMEOUT) -> Frame:
        """The next frame (from the inbox first)."""
        if self.inbox:
            return self.inbox.pop(0)
        async with asyncio.timeout(within):
            data = await self.ws.recv()
        frame: Frame = json.loads(data)
        return frame

    async def call(self, op: str, within: float = RECV_TIMEOUT, **fields: Any) -> Frame:
        """Send ``op`` with a fresh rid; return the reply with that rid (others go to the
        inbox)."""
        rid = next(self._rids)
        await self.send({"op": op, "rid": rid, **fields})
        return await self.reply(rid, within)

    async def reply(self, rid: Any, within: float = RECV_TIMEOUT) -> Frame:
        async with asyncio.timeout(within):
            while True:
                frame: Frame = json.loads(await self.ws.recv())
                if frame.get("rid") == rid:
                    return frame
                self.inbox.append(frame)

    async def publish(self, workspace: str, event: Frame, **fields: Any) -> Frame:
        return await self.call("publish", workspace=workspace, event=event, **fields)

    async def head(self, workspace: str) -> int:
        reply = await self.call("state", workspace=workspace)
        assert reply["op"] == "state", reply
        seq: int = reply["seq"]
        return seq

    async def events(
        self, workspace: str, until_seq: int, within: float = RECV_TIMEOUT
    ) -> list[Frame]:
        """``event`` frames of ``workspace`` until one with ``seq >= until_seq``."""
        out: list[Frame] = []
        async with asyncio.timeout(within):
            while True:
                frame = await self.recv(within)
                if frame.get("op") != "event" or frame.get("workspace") != workspace:
                    continue
                out.append(frame["event"])
                if frame["event"]["seq"] >= until_seq:
                    return out

    async def closed(self, within: float = RECV_TIMEOUT) -> ConnectionClosed:
        """Read (and drop) frames until the connection closes; return the close."""
        async with asyncio.timeout(within):
            try:
                while True:
                    await self.ws.recv()
            except ConnectionClosed as e:
                return e

    async def close(self) -> None:
        await self.ws.close()


class ExecPeer(Peer):
    """A raw connection with helpers for the runtime's ops."""

    async def reply(self, rid: Any, within: float = EXEC_TIMEOUT) -> Frame:
        """The next frame with ``rid``, from the inbox first (streams interleave)."""
        for i, frame in enumerate(self.inbox):
            if frame.get("rid") == rid:
                return self.inbox.pop(i)
        return await super().reply(rid, within)

    async def exec(self, workspace: str = "w", **fields: Any) -> Frame:
        """``exec`` (``encoding`` defaults to ``utf8``); the reply."""
        fields.setdefault("encoding", "utf8")
        return await self.call("exec", workspace=workspace, **fields)

    async def run(self, workspace: str = "w", within: float = EXEC_TIMEOUT, **fields: Any) -> Frame:
        """``exec`` then ``execResult``: the result (asserting both succeeded)."""
        accepted = await self.exec(workspace, **fields)
        assert accepted["op"] == "execAccepted", accepted
        reply = await self.call(
            "execResult", within=within, workspace=workspace, execId=accepted["execId"]
        )
        assert reply["op"] == "execResult", reply
        result: Frame = reply["result"]
        result["execId"] = accepted["execId"]
        return result

    async def stream(
        self, workspace: str, exec_id: str, resume: Any = "full", within: float = EXEC_TIMEOUT
    ) -> tuple[list[Frame], Frame]:
        """``getExec``: the ``execEvent`` frames and the closing ``execEnd`` (or ``error``)."""
        rid = next(self._rids)
        await self.send(
            {
                "op": "getExec",
                "rid": rid,
                "workspace": workspace,
                "execId": exec_id,
                "resume": resume,
            }
        )
        frames: list[Frame] = []
        async with asyncio.timeout(within):
            while True:
                frame = await self.reply(rid, within)
                if frame["op"] == "execEvent":
                    frames.append(frame)
                    continue
                return frames, frame

    async def log(self, workspace: str = "w", after_seq: int = 0) -> list[Frame]:
        """Every event of ``workspace`` (subscribe from ``after_seq``, read to the head,
        unsubscribe)."""
        reply = await self.call("subscribe", workspace=workspace, afterSeq=after_seq)
        assert reply["op"] == "subscribed", reply
        head = reply["head"]
        events: list[Frame] = []
        if head > after_seq:
            events = await self.events(workspace, head)
        done = await self.call("unsubscribe", workspace=workspace)
        assert done["op"] == "unsubscribed", done
        self.inbox = [f for f in self.inbox if f.get("op") != "event"]
        return events


P = TypeVar("P", bound=Peer)


@contextlib.asynccontextmanager
async def open_peer(
    kind: type[P],
    url: str,
    token: str | None = None,
    *,
    header: bool = False,
    hello: bool = True,
    **connect_args: Any,
) -> AsyncIterator[P]:
    """A connected ``kind`` of peer; with ``token`` it authenticates (``hello`` frame, or the
    ``Authorization`` header with ``header=True``) and checks the ``welcome``."""
    headers = {"Authorization": f"Bearer {token}"} if header and token else None
    connect_args.setdefault("compression", None)
    connect_args.setdefault("open_timeout", OPEN_TIMEOUT)
    connect_args.setdefault("max_size", None)
    async with connect(url, additional_headers=headers, **connect_args) as ws:
        p = kind(ws)
        if token is not None and hello:
            if not header:
                await p.send({"op": "hello", "token": token})
            welcome = await p.recv()
            assert welcome["op"] == "welcome", welcome
        yield p


def peer(
    url: str, token: str | None = None, **options: Any
) -> contextlib.AbstractAsyncContextManager[Peer]:
    """A connected :class:`Peer` (see :func:`open_peer` for ``options``)."""
    return open_peer(Peer, url, token, **options)


def exec_peer(
    url: str, token: str | None = None
) -> contextlib.AbstractAsyncContextManager[ExecPeer]:
    """A connected :class:`ExecPeer`, by default with a token that may run code anywhere."""
    return open_peer(ExecPeer, url, token or mint_exec())


def message(text: str = "hi", **fields: Any) -> Frame:
    """A ``messagePosted`` draft."""
    return {"kind": "messagePosted", "payload": {"text": text}, **fields}


def of_kind(events: list[Frame], kind: str) -> list[Frame]:
    """The events of ``kind``."""
    return [e for e in events if e["kind"] == kind]


def of_exec(events: list[Frame], exec_id: str) -> list[Frame]:
    """The events about execution ``exec_id``."""
    return [e for e in events if (e.get("payload") or {}).get("execId") == exec_id]
