"""hub.http.app, the composition of the one HTTP port: the probes and /metrics are the hub's
own public routes, a door under a prefix gets its requests with the path unchanged,
the fallback door gets every other path unchanged, and bad compositions are refused."""

from __future__ import annotations

from typing import Any

import pytest
from prometheus_client import CollectorRegistry, Counter
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from hub.http.app import Door, create_app


def _echo(name: str) -> Starlette:
    async def endpoint(request: Request) -> JSONResponse:
        scope: dict[str, Any] = request.scope
        return JSONResponse(
            {"door": name, "path": scope["path"], "root": scope.get("root_path", "")}
        )

    return Starlette(routes=[Route("/{rest:path}", endpoint)])


def _locked() -> Starlette:
    """A door with its own auth policy: everything 401 without its header."""

    async def endpoint(request: Request) -> PlainTextResponse:
        if request.headers.get("authorization") != "Bearer ok":
            return PlainTextResponse("no\n", status_code=401)
        return PlainTextResponse("yes\n")

    return Starlette(routes=[Route("/{rest:path}", endpoint)])


def test_probes_and_metrics_are_public_and_doors_keep_their_own_auth() -> None:
    registry = CollectorRegistry()
    Counter("agora_test_things", "things", registry=registry).inc(3)
    ready = {"store": True, "recovered": True}
    app = create_app(
        [Door("", _locked(), name="a2a"), Door("/ui", _echo("ui"))],
        lambda: ready,
        registry=registry,
    )
    with TestClient(app) as client:
        assert client.get("/healthz").text == "ok\n"
        assert client.get("/readyz").json() == {"ready": True, "checks": ready}
        metrics = client.get("/metrics")
        assert metrics.status_code == 200
        assert "agora_test_things_total 3.0" in metrics.text
        assert metrics.headers["content-type"].startswith("text/plain")
        # The fallback's own auth answers every other path; the composition adds none.
        assert client.get("/").status_code == 401
        assert client.get("/a2a/jsonrpc").status_code == 401
        assert client.get("/a2a/jsonrpc", headers={"authorization": "Bearer ok"}).text == "yes\n"
        # A prefixed door: the full path, unchanged; no auth added.
        ui = client.get("/ui/w/demo").json()
        assert ui == {"door": "ui", "path": "/ui/w/demo", "root": ""}
        assert client.get("/ui").json()["door"] == "ui"
        assert client.get("/uix").status_code == 401  # not under /ui: the fallback's
        ready["store"] = False
        not_ready = client.get("/readyz")
        assert not_ready.status_code == 503
        assert not_ready.json() == {"ready": False, "checks": {"store": False, "recovered": True}}


def test_without_a_fallback_an_unknown_path_is_404_and_no_registry_no_metrics() -> None:
    app = create_app([Door("/mcp", _echo("mcp"))], lambda: {})
    with TestClient(app) as client:
        assert client.get("/").status_code == 404
        assert client.get("/metrics").status_code == 404
        assert client.get("/mcp/x").json()["door"] == "mcp"
        assert client.get("/readyz").json() == {"ready": True, "checks": {}}


@pytest.mark.parametrize(
    "doors",
    [
        [Door("/ui/", _echo("a"))],
        [Door("ui", _echo("a"))],
        [Door("/metrics", _echo("a"))],
        [Door("/ui", _echo("a")), Door("/ui", _echo("b"))],
        [Door("", _echo("a")), Door("", _echo("b"))],
    ],
)
def test_bad_compositions_are_refused(doors: list[Door]) -> None:
    with pytest.raises(ValueError):
        create_app(doors, lambda: {})


def test_a_traced_door_continues_the_request_traceparent() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from hub.http.app import traced
    from hub.observe.tracing import Tracing

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    app = create_app([Door("", traced(_locked(), Tracing(provider), "agora.a2a"))], lambda: {})
    parent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    with TestClient(app) as client:
        client.get("/a2a/jsonrpc", headers={"traceparent": parent})
        client.get("/a2a/jsonrpc", headers={"traceparent": "junk", "authorization": "Bearer ok"})
    first, second = exporter.get_finished_spans()
    assert f"{first.context.trace_id:032x}" == "4bf92f3577b34da6a3ce929d0e0e4736"
    assert first.attributes is not None and first.attributes["http.response.status_code"] == 401
    assert second.parent is None  # an invalid header starts a new trace
    assert second.attributes is not None and second.attributes["http.response.status_code"] == 200
    # Off: the door itself, no wrapper.
    door = _locked()
    assert traced(door, Tracing(), "agora.a2a") is door


def test_the_root_sends_a_browser_home() -> None:
    app = create_app([Door("", _locked(), name="a2a"), Door("/ui", _echo("ui"))], dict, home="/ui")
    with TestClient(app) as client:
        root = client.get("/", follow_redirects=False)
        assert (root.status_code, root.headers["location"]) == (307, "/ui/")
        assert client.get("/").json()["door"] == "ui"  # followed: the viewer's page
        assert client.get("/elsewhere").status_code == 401  # the fallback keeps the rest
