"""The viewer's HTTP door over a real ``agora serve``: the public config, the SPA fallback for
deep links, and the read-only JSON endpoints with bearer tokens and read rights."""

from __future__ import annotations

import itertools
import json
import sqlite3

import httpx

from tests.support.hub import HubProcess
from tests.support.peer import message, peer


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
