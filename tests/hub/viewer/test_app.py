"""The viewer's HTTP door over a real ``agora serve``: the public config, the SPA fallback for
deep links, and the read-only JSON endpoints with bearer tokens and read rights."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import socket
import sqlite3
import time
import urllib.parse
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Final

import httpx

from hub.client import connect
from hub.viewer.app import EXPORT_PAGE
from tests.support.hub import HubProcess, HubStarter
from tests.support.peer import message, peer

WAIT: Final = 20.0


async def seed(hub: HubProcess) -> None:
    async with peer(hub.url, hub.token("alice")) as alice:
        for workspace, count in (("demo", 3), ("secret", 2)):
            for i in range(count):
                reply = await alice.publish(workspace, message(f"{workspace} {i}"))
                assert reply["op"] == "ack", reply


def client(hub: HubProcess, token: str | None = None) -> httpx.AsyncClient:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    return httpx.AsyncClient(base_url=hub.a2a_url, headers=headers, timeout=10)


async def test_config_is_public_and_names_the_websocket_url(hub: HubProcess) -> None:
    async with client(hub) as http:
        reply = await http.get("/ui/config.json")
    assert reply.status_code == 200
    assert reply.json()["wsUrl"] == hub.url


async def test_every_page_path_serves_the_app_with_a_strict_policy(hub: HubProcess) -> None:
    async with client(hub) as http:
        root = await http.get("/ui/")
        deep = await http.get("/ui/w/demo?seq=123")
        bare = await http.get("/ui")
        asset_path = next(
            line.split('src="')[1].split('"')[0]
            for line in root.text.splitlines()
            if "<script" in line
        )
        asset = await http.get(asset_path)
        missing = await http.get("/ui/assets/nope.js")
        api_missing = await http.get("/ui/api/nope")
        a2a = await http.get("/a2a/rest/tasks")  # the A2A routes still need a token
    assert root.status_code == deep.status_code == 200
    assert deep.text == root.text and '<div id="app">' in root.text
    assert "script-src 'self'" in root.headers["content-security-policy"]
    assert root.headers["x-content-type-options"] == "nosniff"
    assert bare.status_code == 308 and bare.headers["location"] == "/ui/"
    assert asset.status_code == 200 and "javascript" in asset.headers["content-type"]
    assert missing.status_code == 404
    assert api_missing.status_code == 404
    assert a2a.status_code == 401


async def test_workspaces_lists_only_what_the_token_may_read(hub: HubProcess) -> None:
    await seed(hub)
    async with client(hub, hub.token("carol", ["demo", "empty"], ["read"])) as http:
        rows = (await http.get("/ui/api/workspaces")).json()
    assert [r["workspace"] for r in rows] == ["demo", "empty"]
    assert rows[0]["head"] >= 3 and rows[0]["lastActivity"] > 0
    assert rows[1] == {"workspace": "empty", "head": 0, "lastActivity": 0}
    async with client(hub, hub.token("root", ["*"], ["read"])) as http:
        names = {r["workspace"] for r in (await http.get("/ui/api/workspaces")).json()}
    assert {"demo", "secret"} <= names and "_agora" not in names


async def test_api_refuses_missing_bad_and_foreign_tokens(hub: HubProcess) -> None:
    await seed(hub)
    async with client(hub) as http:
        none = await http.get("/ui/api/workspaces")
    async with client(hub, "not-a-jwt") as http:
        bad = await http.get("/ui/api/workspaces")
    async with client(hub, hub.token("carol", ["demo"], ["read"])) as http:
        other = await http.get("/ui/api/w/secret/verify")
        export = await http.get("/ui/api/w/secret/export")
        name = await http.get("/ui/api/w/bad%20name/verify")
    async with client(hub, hub.token("wo", ["demo"], ["write"])) as http:
        no_read = await http.get("/ui/api/w/demo/verify")
    assert none.status_code == bad.status_code == 401
    assert none.headers["www-authenticate"].startswith("Bearer")
    assert bad.json()["details"]["reason"] == "malformed"
    assert other.status_code == export.status_code == no_read.status_code == 403
    assert other.json()["code"] == "forbidden"
    assert name.status_code == 400


async def test_verify_and_export_read_the_stored_log(hub: HubProcess) -> None:
    await seed(hub)  # 3 messages, no subscriber: nothing else is written meanwhile
    async with client(hub, hub.token("carol", ["demo"], ["read"])) as http:
        verify = (await http.get("/ui/api/w/demo/verify")).json()
        export = await http.get("/ui/api/w/demo/export")
    async with peer(hub.url, hub.token("alice")) as alice:
        assert (await alice.call("subscribe", workspace="demo", afterSeq=0))["head"] >= 3
        stored = await alice.events("demo", 3)
    assert verify == {"workspace": "demo", "ok": True, "checked": 3, "head": 3}
    assert export.headers["content-type"] == "application/x-ndjson"
    assert 'filename="demo.jsonl"' in export.headers["content-disposition"]
    lines = export.text.splitlines()
    assert [json.loads(line) for line in lines] == stored[:3]
    assert all(json.loads(b)["prev"] == json.loads(a)["hash"] for a, b in itertools.pairwise(lines))


async def test_export_tail_gives_the_last_events_only(hub: HubProcess) -> None:
    await seed(hub)
    async with client(hub, hub.token("carol", ["demo"], ["read"])) as http:
        tail = await http.get("/ui/api/w/demo/export", params={"tail": "2"})
        more = await http.get("/ui/api/w/demo/export", params={"tail": "99"})
        bad = [
            (await http.get("/ui/api/w/demo/export", params={"tail": t})).status_code
            for t in ("0", "-1", "x", "1e3", str(10**10))
        ]
    assert [json.loads(line)["seq"] for line in tail.text.splitlines()] == [2, 3]
    assert len(more.text.splitlines()) == 3
    assert bad == [400] * 5


async def test_verify_reports_a_broken_chain(hub: HubProcess) -> None:
    await seed(hub)
    hub.terminate()
    with sqlite3.connect(hub.data_dir / "agora.db") as db:  # an edit the chain does not cover
        (body,) = db.execute(
            "SELECT body FROM events WHERE workspace = 'demo' AND seq = 2"
        ).fetchone()
        forged = bytes(body).replace(b"demo 1", b"demo X")
        db.execute("UPDATE events SET body = ? WHERE workspace = 'demo' AND seq = 2", (forged,))
    hub.restart()
    async with client(hub, hub.token("carol", ["demo"], ["read"])) as http:
        report = (await http.get("/ui/api/w/demo/verify")).json()
    assert report["ok"] is False and report["head"] == 1, report
    assert report["error"]["seq"] == 2


async def test_verify_reports_a_stored_event_that_does_not_decode(hub: HubProcess) -> None:
    """A row that is not even an event (its JSON cut short behind the hub's back) is a
    failed verification naming its seq, as ``agora verify`` reports it, not a 500."""
    await seed(hub)
    hub.terminate()
    with sqlite3.connect(hub.data_dir / "agora.db") as db:
        db.execute("UPDATE events SET body = ? WHERE workspace = 'demo' AND seq = 2", (b'{"id',))
    hub.restart()
    async with client(hub, hub.token("carol", ["demo"], ["read"])) as http:
        response = await http.get("/ui/api/w/demo/verify")
    assert response.status_code == 200, response.text
    report = response.json()
    assert report["ok"] is False and report["head"] == 1 and report["checked"] == 1, report
    assert report["error"]["seq"] == 2 and "cannot be decoded" in report["error"]["problem"]


BIG_EVENTS: Final = 3 * EXPORT_PAGE
"""Events of ~5 KB: an export of three ~5 MB pages, each more than the sockets between a
stalled client and the hub buffer, so a client that stops reading stalls the response after
its first page."""


async def seed_big(hub: HubProcess, workspace: str = "big") -> None:
    async with connect(hub.url, hub.token("alice")) as alice:
        ws = alice.workspace(workspace)
        for start in range(0, BIG_EVENTS, 150):  # a batch within one frame
            await ws.publish_batch([message(f"{start}:" + "x" * 5000)] * 150)


@contextlib.asynccontextmanager
async def stalled_export(
    hub: HubProcess, token: str, workspace: str = "big"
) -> AsyncIterator[asyncio.StreamReader]:
    """An export whose client reads the status line and then nothing (the attack)."""
    assert hub.a2a_url is not None
    url = urllib.parse.urlsplit(hub.a2a_url)
    assert url.hostname is not None and url.port is not None
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    # A small fixed receive buffer (no autotuning up to tcp_rmem's max, 32 MiB here): the
    # hub's response then really waits for this client.
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    sock.setblocking(False)
    await asyncio.get_running_loop().sock_connect(sock, (url.hostname, url.port))
    reader, writer = await asyncio.open_connection(sock=sock)
    writer.write(
        f"GET /ui/api/w/{workspace}/export HTTP/1.1\r\nHost: {url.netloc}\r\n"
        f"Authorization: Bearer {token}\r\n\r\n".encode()
    )
    await writer.drain()
    status = await asyncio.wait_for(reader.readline(), WAIT)
    assert status.startswith(b"HTTP/1.1 200"), status
    try:
        yield reader
    finally:
        writer.close()


async def test_slow_exports_do_not_lock_out_others(hub: HubProcess) -> None:
    """The attack: read tokens of several agents start exports and stop reading. Others still
    export and verify (the store permit is held per page read, not per download), and one
    agent cannot run more than ``exports_per_agent`` at once (429)."""
    await seed_big(hub)
    async with contextlib.AsyncExitStack() as stack:
        for n in range(4):
            for _ in range(2):
                await stack.enter_async_context(
                    stalled_export(hub, hub.token(f"slow{n}", ["big"], ["read"]))
                )
        await asyncio.sleep(0.5)  # the stalled responses fill their sockets
        async with client(hub, hub.token("slow0", ["big"], ["read"])) as http:
            over = await http.get("/ui/api/w/big/export")
        assert over.status_code == 429, over.text
        assert over.json()["code"] == "rateLimited"
        async with client(hub, hub.token("other", ["big"], ["read"])) as http:
            async with asyncio.timeout(WAIT):
                verify = (await http.get("/ui/api/w/big/verify")).json()
                tail = await http.get("/ui/api/w/big/export", params={"tail": "1"})
        assert verify["ok"] is True and verify["checked"] == BIG_EVENTS
        assert [json.loads(line)["seq"] for line in tail.text.splitlines()] == [BIG_EVENTS]


async def test_an_export_has_a_deadline(tmp_path: Path) -> None:
    """A stalled export is cut at ``export_deadline_s`` (an unfinished body, not a short file
    that looks whole), and its agent's export slot is free again."""
    starter = HubStarter(tmp_path)
    hub = starter.start("[viewer]\nexport_deadline_s = 1\nexports_per_agent = 1\n", a2a_port=0)
    try:
        await seed_big(hub)
        token = hub.token("slow", ["big"], ["read"])
        started = time.monotonic()
        async with stalled_export(hub, token) as reader:
            await asyncio.sleep(2)  # past the deadline, never reading
            async with asyncio.timeout(WAIT):
                rest = await reader.read()  # now drain: the hub has cut it
        assert time.monotonic() - started < WAIT
        assert not rest.endswith(b"0\r\n\r\n")  # no final chunk
        async with client(hub, token) as http:
            whole = await http.get("/ui/api/w/big/export", params={"tail": "1"})
        assert whole.status_code == 200, whole.text
    finally:
        starter.close()
