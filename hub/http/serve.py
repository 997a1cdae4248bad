"""The one HTTP port of ``agora serve``: one uvicorn server in the hub's event loop.

:class:`HttpService` binds the port (0: a free one; :attr:`HttpService.port` tells which) and
serves one ASGI app (:func:`hub.http.app.create_app`) without signal handlers of its own (the
hub owns shutdown). :func:`serve_http` is what ``agora serve`` spawns in the hub's TaskGroup
once the WebSocket socket listens: it mounts the doors (:func:`doors`: the A2A door unless
``--no-a2a``), the probes and ``/metrics``, and serves until ``stop``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import sys
from collections.abc import Callable, Generator
from contextlib import AsyncExitStack
from types import TracebackType
from typing import TYPE_CHECKING, Self

import uvicorn
from starlette.types import ASGIApp

from hub.config import SHUTDOWN_TIMEOUT_S, url_host
from hub.http.app import Door, create_app, traced

if TYPE_CHECKING:
    from hub.auth import TokenSigner
    from hub.config import HubConfig
    from hub.server.app import Hub

__all__ = ["HttpService", "doors", "serve_http", "url_host"]

log = logging.getLogger("agora.http")


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers: ``agora serve`` owns SIGINT/SIGTERM."""

    @contextlib.contextmanager
    def capture_signals(self) -> Generator[None, None, None]:
        yield


class HttpService:
    """One HTTP listener: :meth:`bind` (the port is then known, for URLs the app advertises),
    then :meth:`serve` an app; :meth:`aclose` stops accepting, ends the requests in flight
    within ``shutdown_timeout`` and closes the socket."""

    def __init__(
        self, host: str, port: int, *, shutdown_timeout: float = SHUTDOWN_TIMEOUT_S
    ) -> None:
        self.host = host
        self.port = port
        self.shutdown_timeout = shutdown_timeout
        self._socket: socket.socket | None = None
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None

    @property
    def url(self) -> str:
        return f"http://{url_host(self.host)}:{self.port}"

    def bind(self) -> None:
        """Bind and listen. Raises ``OSError`` when the address cannot be bound."""
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((self.host, self.port))
            sock.listen(128)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._socket = sock
        self.port = sock.getsockname()[1]

    async def serve(self, app: ASGIApp) -> None:
        """Start serving ``app`` on the bound socket; return once it accepts requests."""
        if self._socket is None:
            self.bind()
        assert self._socket is not None
        config = uvicorn.Config(
            app,
            log_config=None,
            log_level="warning",
            lifespan="off",
            ws="none",
            timeout_graceful_shutdown=max(int(self.shutdown_timeout), 1),
        )
        self._server = _Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[self._socket]))
        while not self._server.started:
            if self._task.done():
                self._task.result()  # startup failed: raise its error
                raise RuntimeError("the HTTP listener stopped during startup")
            await asyncio.sleep(0.01)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Stop (idempotent)."""
        if self._server is not None:
            self._server.should_exit = True
        if self._task is not None:
            with contextlib.suppress(asyncio.CancelledError):
                try:
                    async with asyncio.timeout(self.shutdown_timeout + 2):
                        await self._task
                except TimeoutError:
                    self._task.cancel()
            self._task = None
        if self._socket is not None:
            self._socket.close()
            self._socket = None


async def doors(
    hub: Hub, signer: TokenSigner, config: HubConfig, url: str, stack: AsyncExitStack, *, a2a: bool
) -> list[Door]:
    """The HTTP doors of this hub, each opened on ``stack`` (closed before the listener): the
    viewer at ``/ui`` (docs/viewer.md), MCP at ``/mcp`` (docs/mcp.md) and, when ``a2a``, the
    A2A door (the fallback: its routes are at the root; it serves ``/blobs/…`` too). A new
    door is one more ``Door(prefix, app)`` here."""
    from hub.mcp.http import MCP_PATH, McpHttp
    from hub.viewer import VIEWER_PATH, create_viewer_app

    ws_url = hub.url or ""
    viewer = create_viewer_app(
        hub.workspaces, signer, hub.revocations, ws_url=ws_url, settings=config.viewer
    )
    mcp = await stack.enter_async_context(
        McpHttp(
            ws_url,
            signer,
            hub.revocations,
            limits=hub.workspaces.limits,
            settings=config.mcp,
            host=config.server.host,
        )
    )
    hub.metrics.bind_mcp_gauges(sessions=lambda: mcp.sessions, watchers=lambda: mcp.watchers)
    found = [Door(VIEWER_PATH, viewer, name="viewer"), Door(MCP_PATH, mcp.app, name="mcp")]
    if a2a:
        from a2a_adapter.app import A2AService

        service = A2AService(
            hub.workspaces,
            signer,
            config,
            runtime=hub.runtime,
            revocations=hub.revocations,
            public_url=url,
        )
        stack.push_async_callback(service.aclose)
        app = traced(await service.open_app(), hub.tracing, "agora.a2a")
        found.append(Door("", app, name="a2a"))
    return found


async def serve_http(
    hub: Hub,
    signer: TokenSigner,
    config: HubConfig,
    stop: asyncio.Event,
    *,
    a2a: bool = True,
    on_ready: Callable[[str], None] | None = None,
) -> None:
    """Serve the hub's HTTP port (``[server] http_port``) until ``stop``: the probes,
    ``/metrics`` (the hub's :class:`hub.observe.metrics.HubMetrics`) and :func:`doors`.
    Raises ``OSError`` if the port cannot be bound."""
    from hub.viewer import VIEWER_PATH

    service = HttpService(config.server.host, config.server.http_port)
    service.bind()
    async with AsyncExitStack() as stack:
        # Closed last: the doors first end their streams (LIFO), so graceful shutdown is quick.
        stack.push_async_callback(service.aclose)
        found = await doors(hub, signer, config, service.url, stack, a2a=a2a)
        # A browser at the port's root lands on the viewer (docs/viewer.md).
        app = create_app(found, hub.readiness, exposition=hub.metrics_exposition, home=VIEWER_PATH)
        await service.serve(app)
        log.info("agora HTTP listening on %s (%s)", service.url, ", ".join(d.name for d in found))
        if on_ready is not None:
            on_ready(service.url)
        print(f"agora viewer on {service.url}{VIEWER_PATH}/", file=sys.stderr, flush=True)
        await stop.wait()
