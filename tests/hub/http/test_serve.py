"""hub.http.serve, the one HTTP port of a real ``agora serve``: ``--http-port`` (and its old
name ``--a2a-port``) serves A2A plus the probes and /metrics; ``--no-a2a`` keeps the port and
drops only the A2A routes; the probes need no token while A2A keeps its bearer auth."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from hub.cli import build_parser
from tests.support.hub import HubStarter


@pytest.fixture
def starter(tmp_path: Path) -> Iterator[HubStarter]:
    hubs = HubStarter(tmp_path)
    yield hubs
    hubs.close()  # SIGTERM: each must exit 0, the HTTP port included


async def test_no_a2a_keeps_the_port_with_probes_and_metrics(starter: HubStarter) -> None:
    hub = starter.start(http_port=0)
    assert hub.http_url.startswith("http://127.0.0.1:") and hub.a2a_url == ""
    async with httpx.AsyncClient(base_url=hub.http_url) as http:
        health = await http.get("/healthz")
        assert (health.status_code, health.text) == (200, "ok\n")
        ready = await http.get("/readyz")
        assert ready.status_code == 200
        assert ready.json() == {
            "ready": True,
            "checks": {"store": True, "recovered": True, "serving": True},
        }
        metrics = await http.get("/metrics")
        assert metrics.status_code == 200 and "agora_connections 0.0" in metrics.text
        # The other doors stay, each with its own policy: the viewer's page is public, MCP
        # wants its bearer token.
        assert (await http.get("/ui/")).status_code == 200
        assert (await http.post("/mcp", json={})).status_code == 401
        # Only the A2A routes are gone: not a 401 of theirs, a plain 404.
        for path in ("/.well-known/agent-card.json", "/a2a/jsonrpc", "/a2a/rest/tasks/x"):
            assert (await http.get(path)).status_code == 404, path
        root = await http.get("/")  # a browser at the root lands on the viewer
        assert (root.status_code, root.headers["location"]) == (307, "/ui/")


@pytest.mark.parametrize("old_name", [False, True])
async def test_http_port_and_its_old_name_serve_a2a_beside_the_probes(
    starter: HubStarter, old_name: bool
) -> None:
    # The old flag given last wins over HubProcess's --http-port: both set the one port.
    hub = starter.start(a2a_port=0, args=["--a2a-port", "0"] if old_name else [])
    url = hub.a2a_url
    async with httpx.AsyncClient(base_url=url) as http:
        card = await http.get("/.well-known/agent-card.json")
        assert card.status_code == 200
        assert card.json()["supportedInterfaces"][0]["url"] == url + "/a2a/jsonrpc"
        assert (await http.get("/healthz")).status_code == 200
        assert (await http.get("/readyz")).json()["ready"] is True
        # A2A keeps its own policy: no token, 401 with its challenge.
        refused = await http.post("/a2a/jsonrpc", json={})
        assert refused.status_code == 401
        assert refused.headers["www-authenticate"].startswith("Bearer")


def test_a2a_port_is_an_alias_of_http_port() -> None:
    parser = build_parser()
    assert parser.parse_args(["serve", "--a2a-port", "9001"]).http_port == 9001
    assert parser.parse_args(["serve", "--http-port", "9002"]).http_port == 9002
    args = parser.parse_args(["serve", "--no-a2a"])
    assert (args.no_a2a, args.no_http, args.http_port) == (True, False, None)
