"""The composition of the one HTTP port: probes, ``/metrics`` and every HTTP door.

:func:`create_app` builds one ASGI app from :class:`Door` values. The hub's own routes come
first and are public: ``GET /healthz`` (the process answers), ``GET /readyz`` (200 when the
store is open and recovery done, 503 with the failing checks otherwise, e.g. while shutting
down) and ``GET /metrics`` (Prometheus text format, when a registry is given).

A door is an ASGI app with **its own auth policy** (the A2A door wraps itself in
:class:`a2a_adapter.auth.BearerAuth`; a viewer keeps its page public and checks tokens on its
API): the composition never authenticates on a door's behalf. A door has a ``prefix``
(``/ui``, ``/mcp``, ``/blobs``): ``/prefix`` and every path under ``/prefix/`` go to it with
the path unchanged (its own routes name the full path). At most one door is the
``fallback`` (prefix ``""``): it gets every path no other route took — the A2A door, whose
routes (``/.well-known/agent-card.json``, ``/a2a/jsonrpc``, ``/a2a/rest/...``) are at the
root. Without a fallback an unknown path is a plain 404.

To add a door: build its app in the door's own package (a factory function), then add a
``Door("/ui", app)`` in :func:`hub.http.serve.doors` — nothing else changes.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

from opentelemetry.trace import SpanKind
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse, RedirectResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from hub.core.validation import TRACEPARENT_RE
from hub.observe.tracing import Tracing

__all__ = [
    "HEALTH_PATH",
    "METRICS_PATH",
    "READY_PATH",
    "Door",
    "Readiness",
    "create_app",
    "traced",
]

Readiness = Callable[[], Mapping[str, bool]]
"""The readiness checks by name (``store``, ``recovered``, ``serving``): ready when all hold."""

HEALTH_PATH: Final = "/healthz"
READY_PATH: Final = "/readyz"
METRICS_PATH: Final = "/metrics"
_RESERVED: Final = frozenset({HEALTH_PATH, READY_PATH, METRICS_PATH})


@dataclass(frozen=True, slots=True)
class Door:
    """An HTTP door: ``app`` served under ``prefix`` (``""``: the fallback, see the module)."""

    prefix: str
    app: ASGIApp
    name: str = ""


def create_app(
    doors: Sequence[Door],
    readiness: Readiness,
    *,
    registry: CollectorRegistry | None = None,
    exposition: Callable[[], Awaitable[bytes]] | None = None,
    home: str | None = None,
) -> ASGIApp:
    """The one port's app. ``/metrics`` answers ``registry``'s metrics, or what
    ``exposition`` returns (the hub's: with ``--workers N``, every worker's); with neither
    there is no ``/metrics``. ``home``: where ``GET /`` sends a browser (307 to
    ``home + "/"``, the viewer's page); without, ``/`` is the fallback door's like any other
    path. Raises
    ``ValueError`` for a prefix that is not ``""`` or
    ``/name`` (no trailing slash), a prefix used twice, a second fallback or a prefix that
    shadows the hub's routes."""
    routes: list[BaseRoute] = [
        Route(HEALTH_PATH, _health, methods=["GET", "HEAD"]),
        Route(READY_PATH, _ready_endpoint(readiness), methods=["GET", "HEAD"]),
    ]
    if exposition is None and registry is not None:
        exposition = _exposition_of(registry)
    if exposition is not None:
        routes.append(Route(METRICS_PATH, _metrics_endpoint(exposition), methods=["GET", "HEAD"]))
    if home is not None:
        target = home.rstrip("/") + "/"

        async def to_home(request: Request) -> Response:
            return RedirectResponse(target, status_code=307)

        routes.append(Route("/", to_home, methods=["GET", "HEAD"]))
    prefixed: dict[str, ASGIApp] = {}
    fallback: ASGIApp | None = None
    for door in doors:
        prefix = door.prefix
        if prefix in prefixed or (prefix == "" and fallback is not None):
            raise ValueError(f"two HTTP doors under {prefix!r}")
        if prefix == "":
            fallback = door.app
            continue
        if not prefix.startswith("/") or prefix.endswith("/") or prefix in _RESERVED:
            raise ValueError(f"bad HTTP door prefix {prefix!r}")
        prefixed[prefix] = door.app
    if fallback is not None:  # last: every path the routes above did not take
        routes.append(Mount("", app=fallback))
    return _Doors(prefixed, Starlette(routes=routes))


class _Doors:
    """``/prefix`` and ``/prefix/…`` go to that door, path unchanged; the rest to ``rest``
    (the hub's routes, then the fallback door)."""

    def __init__(self, doors: dict[str, ASGIApp], rest: ASGIApp) -> None:
        self.doors = doors
        self.rest = rest

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] in ("http", "websocket"):
            path: str = scope.get("path", "")
            for prefix, app in self.doors.items():
                if path == prefix or path.startswith(prefix + "/"):
                    await app(scope, receive, send)
                    return
        await self.rest(scope, receive, send)


async def _health(request: Request) -> Response:
    return PlainTextResponse("ok\n")


def _ready_endpoint(readiness: Readiness) -> Callable[[Request], Awaitable[Response]]:
    async def ready(request: Request) -> Response:
        checks = dict(readiness())
        ok = all(checks.values())
        return JSONResponse({"ready": ok, "checks": checks}, status_code=200 if ok else 503)

    return ready


def _exposition_of(registry: CollectorRegistry) -> Callable[[], Awaitable[bytes]]:
    async def exposition() -> bytes:
        # generate_latest is synchronous but bounded by the metric count (no per-event series).
        return generate_latest(registry)

    return exposition


def _metrics_endpoint(
    exposition: Callable[[], Awaitable[bytes]],
) -> Callable[[Request], Awaitable[Response]]:
    async def metrics(request: Request) -> Response:
        return Response(await exposition(), media_type=CONTENT_TYPE_LATEST)

    return metrics


def traced(app: ASGIApp, tracing: Tracing, name: str) -> ASGIApp:
    """``app`` with each HTTP request a span ``name`` (kind SERVER), the child of the request's
    W3C ``traceparent`` header when it has a valid one (an invalid one starts a new trace).
    Tracing off: ``app`` itself."""
    if not tracing.enabled:
        return app

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return
        parent: str | None = None
        for key, value in scope.get("headers", ()):
            if key == b"traceparent":
                text = value.decode("latin-1").strip()
                parent = text if TRACEPARENT_RE.fullmatch(text) else None
        attributes = {"http.request.method": scope.get("method", ""), "url.path": scope["path"]}
        with tracing.span(name, parent, attributes=attributes, kind=SpanKind.SERVER) as span:

            async def sending(message: MutableMapping[str, Any]) -> None:
                if span is not None and message["type"] == "http.response.start":
                    span.set_attribute("http.response.status_code", message["status"])
                await send(message)

            await app(scope, receive, sending)

    return middleware
