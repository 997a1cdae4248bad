"""Hostile agents at the WebSocket door (issue #11), over real sockets against ``agora serve``
on SQLite and PostgreSQL (the ``door`` fixture: afterwards the hub must restart cleanly and
``agora verify`` exit 0, with no traceback in the hub's stderr).

One test per attack class that lives at this door."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import socket
import time
import uuid
from typing import Any

import pytest
from websockets.asyncio.client import ClientConnection
from websockets.asyncio.client import connect as ws_connect
from websockets.exceptions import ConnectionClosed, InvalidStatus

from hub.core.validation import DEFAULT_MAX_FRAME_BYTES, EVENT_FRAME_RESERVE
from tests.adversarial.door import HELLO_TIMEOUT_S, MAX_CONNECTIONS, Door
from tests.support.peer import peer
from tests.support.tokens import crafted, mint

MAX_EVENT_BYTES = DEFAULT_MAX_FRAME_BYTES - EVENT_FRAME_RESERVE
WAIT = 60.0  # generous bound on any one wait


def ws_name() -> str:
    return f"adv-{uuid.uuid4().hex[:10]}"


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise AssertionError("no VmRSS")


def deep(depth: int) -> str:
    return "[" * depth + "]" * depth


def file_written(path: str, text: str, base_rev: int | None = None) -> dict[str, Any]:
    payload: dict[str, Any] = {"path": path, "text": text}
    if base_rev is not None:
        payload["baseRev"] = base_rev
    return {"kind": "fileWritten", "payload": payload}


def stderr_of(door: Door) -> str:
    return door.hub.stderr_path.read_text(errors="replace")


# -- nesting ------------------------------------------------------------------------------------


async def test_deep_nesting_before_and_after_hello_is_a_typed_error(door: Door) -> None:
    """~1000 levels before ``hello`` and inside an authenticated publish: typed errors, never
    1011, never a traceback; nothing is stored."""
    workspace = ws_name()
    async with ws_connect(door.hub.url, proxy=None) as raw:
        await raw.send(deep(1000))
        reply = json.loads(await asyncio.wait_for(raw.recv(), WAIT))
        assert reply["op"] == "error" and reply["code"] in ("badRequest", "unauthorized"), reply
        with contextlib.suppress(ConnectionClosed, TimeoutError):
            await asyncio.wait_for(raw.recv(), 2)
        assert raw.close_code != 1011
    async with peer(door.hub.url, mint("nester")) as p:
        data = json.loads(deep(900))
        refused = await p.publish(
            workspace, {"kind": "messagePosted", "payload": {"text": "x", "data": data}}
        )
        assert refused["op"] == "error" and refused["code"] == "badRequest", refused
        assert await p.head(workspace) == 0
    assert "RecursionError" not in stderr_of(door)
    assert "Traceback" not in stderr_of(door)


# -- sizes --------------------------------------------------------------------------------------


async def test_a_frame_of_exactly_max_frame_bytes_never_breaks_a_default_reader(door: Door) -> None:
    """A publish frame of exactly max_frame_bytes is refused (tooLarge) or stored within
    max_event_bytes; a websockets client with default limits then reads every event."""
    workspace = ws_name()
    async with peer(door.hub.url, mint("big")) as p:
        payload = {"text": ""}
        frame = {
            "op": "publish",
            "rid": 1,
            "workspace": workspace,
            "events": [{"kind": "messagePosted", "payload": payload}],
        }
        pad = DEFAULT_MAX_FRAME_BYTES - len(json.dumps(frame, separators=(",", ":")))
        payload["text"] = "x" * pad
        data = json.dumps(frame, separators=(",", ":"))
        assert len(data.encode()) == DEFAULT_MAX_FRAME_BYTES
        await p.send(data)
        reply = await p.reply(1)
        assert reply["op"] in ("ack", "error"), reply
        if reply["op"] == "error":
            assert reply["code"] == "tooLarge", reply
        ok = await p.publish(workspace, {"kind": "messagePosted", "payload": {"text": "after"}})
        assert ok["op"] == "ack", ok
        head = ok["seq"]
    # max_size: websockets' default, which a plain client has.
    async with peer(door.hub.url, mint("reader"), max_size=2**20) as default_reader:
        reply = await default_reader.call("subscribe", workspace=workspace, afterSeq=0)
        assert reply["op"] == "subscribed", reply
        events = await default_reader.events(workspace, head, within=WAIT)
        assert [e["seq"] for e in events] == list(range(1, head + 1))
        assert all(len(json.dumps(e).encode()) <= MAX_EVENT_BYTES for e in events)


# -- memory per connection ----------------------------------------------------------------------


def tiny_socket(url: str) -> socket.socket:
    """A connected socket with a small receive buffer: a client that reads nothing."""
    host, port = url.removeprefix("ws://").rsplit(":", 1)
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect((host, int(port)))
    return sock


async def test_unread_replies_are_bounded_in_bytes_and_close_4408(door: Door) -> None:
    """A read-only client sends 250 ``state`` requests (each reply ~2 MB, contents on) and
    reads nothing: the hub closes it with 4408 and its RSS stays bounded."""
    workspace = ws_name()
    async with peer(door.hub.url, mint("filler")) as p:
        for i in range(32):
            ack = await p.publish(workspace, file_written(f"f{i}.txt", f"{i:02d}" * 30_000))
            assert ack["op"] == "ack", ack
    pid = door.hub.proc.pid if door.hub.proc is not None else 0
    before = rss_kib(pid)
    token = mint("reader", rights=("read",))
    async with ws_connect(
        door.hub.url,
        sock=tiny_socket(door.hub.url),
        additional_headers={"Authorization": f"Bearer {token}"},
        max_size=None,
        max_queue=1,
        proxy=None,
    ) as slow:
        request = {"op": "state", "workspace": workspace, "contents": True}
        with contextlib.suppress(ConnectionClosed):
            for rid in range(250):
                await slow.send(json.dumps(request | {"rid": rid}))
            await asyncio.sleep(1)  # the hub has read what reached it
        peak = rss_kib(pid)
        # Now read (and drop) everything: the 4408 close frame comes behind the queued replies.
        with contextlib.suppress(ConnectionClosed):
            async with asyncio.timeout(WAIT):
                while True:
                    await slow.recv()
    assert slow.close_code == 4408, (slow.close_code, slow.close_reason)
    # 250 replies of ~2 MB queued would be ~500 MB; the byte bound keeps it to a few.
    assert peak - before < 200 * 1024, (before, peak)
    print(f"hub RSS before {before} KiB, at the peak {peak} KiB ({door.store})")


# -- connections --------------------------------------------------------------------------------


async def test_unauthenticated_connections_meet_the_cap_and_the_hello_deadline(door: Door) -> None:
    """Over 300 connections that never say hello: past max_connections the handshake is
    refused with 503; every one open is closed with 4401 at the hello deadline."""
    opened: list[ClientConnection] = []
    refused = 0
    started = time.monotonic()

    async def attempt() -> None:
        nonlocal refused
        try:
            opened.append(await ws_connect(door.hub.url, proxy=None, open_timeout=WAIT))
        except InvalidStatus as e:
            assert e.response.status_code == 503
            refused += 1

    try:
        # In bursts, so all are open well within the hello deadline even on a loaded
        # machine (one at a time, the first ones could reach it and free their slots).
        for first in range(0, MAX_CONNECTIONS + 20, 60):
            burst = min(60, MAX_CONNECTIONS + 20 - first)
            await asyncio.gather(*(attempt() for _ in range(burst)))
        assert time.monotonic() - started < HELLO_TIMEOUT_S, "too slow to test the cap"
        assert len(opened) >= 300 and refused >= 20, (len(opened), refused)
        codes = []
        async with asyncio.timeout(WAIT + HELLO_TIMEOUT_S):
            for conn in opened:
                with contextlib.suppress(ConnectionClosed):
                    while True:
                        await conn.recv()
                codes.append(conn.close_code)
        assert set(codes) == {4401}, set(codes)
        assert time.monotonic() - started >= HELLO_TIMEOUT_S  # not closed before the deadline
    finally:
        await asyncio.gather(*(c.close() for c in opened), return_exceptions=True)
    async with peer(door.hub.url, mint("after")) as p:  # room again
        assert await p.head(ws_name()) == 0


# -- the workspace tree, blobs, artifacts, paths ------------------------------------------------


async def test_a_path_cannot_be_a_file_and_a_directory(door: Door) -> None:
    workspace = ws_name()
    async with peer(door.hub.url, mint("tree")) as p:
        assert (await p.publish(workspace, file_written("x", "file")))["op"] == "ack"
        clash = await p.publish(workspace, file_written("x/y", "under a file"))
        assert clash["op"] == "error" and clash["code"] == "conflict", clash
        assert (await p.publish(workspace, file_written("d/e", "dir")))["op"] == "ack"
        clash = await p.publish(workspace, file_written("d", "over a directory"))
        assert clash["op"] == "error" and clash["code"] == "conflict", clash


async def test_a_refused_publish_stores_no_blob(door: Door) -> None:
    """Inline content over the blob threshold in a publish refused for a conflict: its blob
    does not exist afterwards (an artifact naming it is refused as missing)."""
    workspace = ws_name()
    content = uuid.uuid4().hex * 5000  # 160 KB, over the 64 KiB threshold
    sha = hashlib.sha256(content.encode()).hexdigest()
    async with peer(door.hub.url, mint("blobby")) as p:
        assert (await p.publish(workspace, file_written("a.txt", "v1")))["op"] == "ack"
        refused = await p.publish(workspace, file_written("a.txt", content, base_rev=7))
        assert refused["op"] == "error" and refused["code"] == "conflict", refused
        artifact = {
            "kind": "artifactPublished",
            "payload": {"key": "k", "mediaType": "text/plain", "blob": sha},
        }
        missing = await p.publish(workspace, artifact)
        assert missing["op"] == "error", missing


async def test_artifacts_with_a_missing_blob_or_lying_sizes_are_refused(door: Door) -> None:
    workspace = ws_name()
    async with peer(door.hub.url, mint("liar")) as p:
        content = uuid.uuid4().hex * 5000
        ack = await p.publish(workspace, file_written("real.txt", content))
        assert ack["op"] == "ack", ack
        state = await p.call("state", workspace=workspace)
        blob = state["state"]["files"]["real.txt"]["blob"]
        refused = [
            {"key": "a", "blob": "0" * 64},  # no such blob
            {"key": "d", "blob": blob, "mediaType": "not a media type"},
        ]
        for payload in refused:
            reply = await p.publish(workspace, {"kind": "artifactPublished", "payload": payload})
            assert reply["op"] == "error", (payload, reply)
        assert await p.head(workspace) == 1
        # Lying sizes and hashes: what is stored is the hub's, computed from the blob.
        for payload in ({"key": "b", "blob": blob, "sha256": "zz", "sizeBytes": 10**18},):
            reply = await p.publish(workspace, {"kind": "artifactPublished", "payload": payload})
            if reply["op"] == "error":
                continue
            state = await p.call("state", workspace=workspace)
            stored = state["state"]["artifacts"]["b"]
            assert stored["sha256"] == hashlib.sha256(content.encode()).hexdigest(), stored
            assert stored["sizeBytes"] == len(content), stored


@pytest.mark.parametrize("bad", ["a\rb", "a\nb", "a\tb", "evil\u202etxt.exe"])
async def test_control_and_bidi_characters_in_paths_are_refused(door: Door, bad: str) -> None:
    workspace = ws_name()
    async with peer(door.hub.url, mint("paths")) as p:
        reply = await p.publish(workspace, file_written(bad, "x"))
        assert reply["op"] == "error" and reply["code"] == "badRequest", reply
        assert await p.head(workspace) == 0


# -- tokens -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "claims",
    [{"iat": int(time.time()) + 3600, "exp": int(time.time()) + 7200}, {"exp": 2**70}],
    ids=["future-iat", "exp-2^70"],
)
async def test_correctly_signed_tokens_with_absurd_times_are_refused(
    door: Door, claims: dict[str, int]
) -> None:
    async with ws_connect(door.hub.url, proxy=None) as raw:
        await raw.send(json.dumps({"op": "hello", "rid": 0, "token": crafted(**claims)}))
        reply = json.loads(await asyncio.wait_for(raw.recv(), WAIT))
        assert reply["op"] == "error" and reply["code"] == "unauthorized", reply
        with contextlib.suppress(ConnectionClosed):
            await asyncio.wait_for(raw.recv(), WAIT)
        assert raw.close_code == 4401


async def test_a_stream_ends_when_its_token_expires(door: Door) -> None:
    """A subscriber with a 3 s token is closed with 4401 once it expires, while it only reads."""
    workspace = ws_name()
    async with peer(door.hub.url, mint("brief", ttl=3)) as p:
        assert (await p.call("subscribe", workspace=workspace))["op"] == "subscribed"
        started = time.monotonic()
        closed = await p.closed(WAIT)
    assert closed.rcvd is not None and closed.rcvd.code == 4401, closed
    assert time.monotonic() - started < WAIT
