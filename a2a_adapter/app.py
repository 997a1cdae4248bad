"""The A2A door of ``agora serve``: the agent card, JSON-RPC and HTTP+JSON, in-process.

``agora serve`` mounts it on the one HTTP port (:mod:`hub.http.serve`, through
:meth:`A2AService.open_app`), in the same event loop as the WebSocket server.
:class:`A2AService` has no listener of its own: the tests, the conformance-kit harness and the
A2A benchmark serve it on ``hub.http``'s listener too (``tests/support/a2a.py``). It starts the
client bridge (:mod:`a2a_adapter.bridge`) when ``[[a2a.peers]]`` are configured.

Routes: ``GET /.well-known/agent-card.json`` (public; ``Cache-Control`` and a weak ``ETag``,
304 on ``If-None-Match``), JSON-RPC at ``POST /a2a/jsonrpc``, HTTP+JSON under ``/a2a/rest``
(``/a2a/rest/message:send``, ``/a2a/rest/tasks/{id}``, …). Every route but the card needs
``Authorization: Bearer <capability token>`` (:mod:`a2a_adapter.auth`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Final

from a2a.server.routes import (
    create_agent_card_routes,
    create_jsonrpc_routes,
    create_rest_routes,
)
from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentProvider,
    AgentSkill,
    HTTPAuthSecurityScheme,
    SecurityRequirement,
    SecurityScheme,
    StringList,
)
from a2a.utils.constants import AGENT_CARD_WELL_KNOWN_PATH
from starlette.applications import Starlette
from starlette.routing import Mount
from starlette.types import ASGIApp

from a2a_adapter.auth import AgoraContextBuilder, BearerAuth
from a2a_adapter.bridge import Bridge
from a2a_adapter.files import BLOBS_PATH, create_blob_app
from a2a_adapter.grpc_binding import GrpcServer
from a2a_adapter.handler import BLOCKING_TIMEOUT_S, AgoraRequestHandler
from a2a_adapter.limits import BodyLimits
from a2a_adapter.push import PushNotifications
from a2a_adapter.responses import ExactResponses
from a2a_adapter.runtime import A2ARuntime
from a2a_adapter.store import LogTaskEventStream, LogTaskStore, TaskLocator
from a2a_adapter.taskindex import TaskIndex
from hub import __version__
from hub.auth import TokenSigner
from hub.config import SHUTDOWN_TIMEOUT_S, HubConfig, url_host
from hub.core.validation import DEFAULT_LIMITS, Limits
from hub.follow import LogFollower
from hub.revocations import Revocations
from hub.workspaces import Workspaces

__all__ = [
    "CARD_CACHE_CONTROL",
    "JSONRPC_PATH",
    "REST_PREFIX",
    "A2AService",
    "build_card",
    "create_app",
]

log = logging.getLogger(__name__)

JSONRPC_PATH: Final = "/a2a/jsonrpc"
REST_PREFIX: Final = "/a2a/rest"
CARD_CACHE_CONTROL: Final = "public, max-age=300"
SECURITY_SCHEME: Final = "agoraBearer"
PROTOCOL_VERSION: Final = "1.0"


def build_card(
    base_url: str,
    *,
    executions: bool = False,
    push: bool = False,
    grpc_url: str | None = None,
) -> AgentCard:
    """The hub's AgentCard, with its interfaces under ``base_url`` (``http://host:port``),
    and the gRPC one at ``grpc_url`` (``host:port``) when given."""
    base_url = base_url.rstrip("/")
    skills = [
        AgentSkill(
            id="work-item",
            name="Work items",
            description=(
                "Open a work item in a workspace (contextId = workspace) for its members to "
                "claim, discuss and complete; follow every step as task updates."
            ),
            tags=["collaboration", "work-item"],
            examples=["Review the parser in src/parser.py"],
        )
    ]
    if executions:
        skills.append(
            AgentSkill(
                id="exec",
                name="Executions",
                description=(
                    'Run code in a sandboxed backend: send a data part {"agora.exec": '
                    "{backend, source, input}}; output arrives as artifact chunks."
                ),
                tags=["execution", "sandbox"],
            )
        )
    interfaces = [
        AgentInterface(
            url=base_url + JSONRPC_PATH,
            protocol_binding="JSONRPC",
            protocol_version=PROTOCOL_VERSION,
        ),
        AgentInterface(
            url=base_url + REST_PREFIX,
            protocol_binding="HTTP+JSON",
            protocol_version=PROTOCOL_VERSION,
        ),
    ]
    if grpc_url is not None:
        interfaces.append(
            AgentInterface(url=grpc_url, protocol_binding="GRPC", protocol_version=PROTOCOL_VERSION)
        )
    return AgentCard(
        name="Agora hub",
        description=(
            "An event-sourced collaboration hub: A2A tasks are work items and executions in "
            "Agora workspaces, shared with the agents connected over WebSocket."
        ),
        version=__version__,
        provider=AgentProvider(organization="Agora", url=base_url),
        supported_interfaces=interfaces,
        capabilities=AgentCapabilities(
            streaming=True, push_notifications=push, extended_agent_card=False
        ),
        security_schemes={
            SECURITY_SCHEME: SecurityScheme(
                http_auth_security_scheme=HTTPAuthSecurityScheme(
                    scheme="Bearer",
                    bearer_format="JWT",
                    description="An Agora capability token (agora token issue …).",
                )
            )
        },
        security_requirements=[SecurityRequirement(schemes={SECURITY_SCHEME: StringList()})],
        default_input_modes=["text/plain", "application/json"],
        default_output_modes=["text/plain", "application/json", "application/octet-stream"],
        skills=skills,
    )


def create_app(
    handler: AgoraRequestHandler,
    signer: TokenSigner,
    revocations: Revocations,
    *,
    limits: Limits = DEFAULT_LIMITS,
) -> ASGIApp:
    """The ASGI app: the SDK's card, JSON-RPC and REST routes (their output made exact:
    :mod:`a2a_adapter.responses`) behind bearer authentication, behind the body limits (size
    before reading, nesting before parsing)."""
    builder = AgoraContextBuilder()
    routes = [
        # GET /blobs/{workspace}/{sha256} (a2a_adapter/files.py): the URLs of the file parts
        # this door sends, behind its bearer auth. First: the REST routes would take its paths.
        Mount(BLOBS_PATH, app=create_blob_app(handler.workspaces)),
        *create_agent_card_routes(handler.card, cache_control=CARD_CACHE_CONTROL),
        *create_jsonrpc_routes(handler, JSONRPC_PATH, context_builder=builder),
        # Clients that join the interface URL with "/" post here: answer, do not redirect.
        *create_jsonrpc_routes(handler, JSONRPC_PATH + "/", context_builder=builder),
        *create_rest_routes(handler, context_builder=builder, path_prefix=REST_PREFIX),
    ]
    authenticated = BearerAuth(
        ExactResponses(Starlette(routes=routes)), signer, {AGENT_CARD_WELL_KNOWN_PATH}, revocations
    )
    return BodyLimits(
        authenticated,
        max_body_bytes=limits.max_event_bytes,
        max_depth=limits.max_depth,
        jsonrpc_paths=frozenset({JSONRPC_PATH, JSONRPC_PATH + "/"}),
    )


class A2AService:
    """The A2A door (and bridge): :meth:`open_app` gives the ASGI app to mount on a listener,
    :meth:`aclose` ends it.

    ``host``/``port`` (default ``config.server.host``/``http_port``): where the listener that
    serves the app is bound (set ``port`` to the bound one before :meth:`open_app`); the gRPC
    binding binds ``host`` too. ``public_url`` is the base URL the card advertises (default
    ``http://host:port``). Closing ends open streams, stops the gRPC binding (waiting up to
    ``shutdown_timeout`` for its calls in flight), push deliveries and the bridge.
    ``revocations``: the hub's revoked tokens (``agora serve`` shares the WebSocket hub's);
    without, the service loads and follows the system workspace itself. ``grpc_port`` (default
    ``[a2a] grpc_port``): also serve the gRPC binding there (0: a free one, :attr:`grpc_port`
    tells)."""

    def __init__(
        self,
        workspaces: Workspaces,
        signer: TokenSigner,
        config: HubConfig,
        *,
        host: str | None = None,
        port: int | None = None,
        runtime: A2ARuntime | None = None,
        public_url: str | None = None,
        blocking_timeout: float = BLOCKING_TIMEOUT_S,
        shutdown_timeout: float = SHUTDOWN_TIMEOUT_S,
        bridge: bool = True,
        revocations: Revocations | None = None,
        grpc_port: int | None = None,
    ) -> None:
        self.workspaces = workspaces
        self.revocations = revocations or Revocations(workspaces)
        self._own_revocations = revocations is None
        self._revocations_stop = asyncio.Event()
        self.signer = signer
        self.config = config
        self.host = host if host is not None else config.server.host
        self.port = port if port is not None else config.server.http_port
        self.runtime = runtime
        self.public_url = public_url
        self.blocking_timeout = blocking_timeout
        self.shutdown_timeout = shutdown_timeout
        self.with_bridge = bridge and bool(config.a2a.peers)
        self.follower = LogFollower(workspaces)
        self.index = TaskIndex(workspaces)
        self.locator = TaskLocator(workspaces, self.index)
        self.handler: AgoraRequestHandler | None = None
        self.push: PushNotifications | None = None
        self.grpc: GrpcServer | None = None
        self.grpc_port = grpc_port if grpc_port is not None else config.a2a.grpc_port
        self.bridge: Bridge | None = None
        self._tasks: list[asyncio.Task[None]] = []

    @property
    def url(self) -> str:
        """The base URL the card advertises."""
        return self.public_url or f"http://{url_host(self.host)}:{self.port}"

    async def open_app(self) -> ASGIApp:
        """The A2A door to mount on a listener (``hub.http`` mounts it on the one HTTP port):
        load and follow revocations, start the bridge, and return the ASGI app whose
        card advertises :attr:`url` (set ``port``/``public_url`` first). :meth:`aclose` ends
        it."""
        if self._own_revocations:
            await self.revocations.load()
        self.follower.install()
        self.index.install()
        self.locator.install()
        store = LogTaskStore(self.workspaces, self.locator)
        stream = LogTaskEventStream(self.workspaces, self.locator, self.follower)
        grpc_url = None
        if self.grpc_port is not None:
            self.grpc = GrpcServer(
                self.signer,
                self.revocations,
                max_message_bytes=self.workspaces.limits.max_event_bytes,
                shutdown_timeout=self.shutdown_timeout,
            )
            self.grpc_port = self.grpc.bind(self.host, self.grpc_port)
            grpc_url = f"{url_host(self.host)}:{self.grpc_port}"
        settings = self.config.a2a.push
        if settings.enabled:
            self.push = PushNotifications(self.workspaces, stream, self.revocations, settings)
        card = build_card(
            self.url,
            executions=self.runtime is not None,
            push=settings.enabled,
            grpc_url=grpc_url,
        )
        self.handler = AgoraRequestHandler(
            self.workspaces,
            store,
            stream,
            card,
            revocations=self.revocations,
            runtime=self.runtime,
            push=self.push,
            blocking_timeout=self.blocking_timeout,
        )
        if self.grpc is not None:
            await self.grpc.start(self.handler)
        app = create_app(
            self.handler,
            self.signer,
            self.revocations,
            limits=self.workspaces.limits,
        )
        if self._own_revocations:
            stop = self._revocations_stop
            self._tasks.append(asyncio.create_task(self.revocations.run(stop)))
        if self.with_bridge:
            self.bridge = Bridge(self.workspaces, self.config.a2a.peers, follower=self.follower)
            self._tasks.append(asyncio.create_task(self.bridge.run()))
        return app

    async def aclose(self) -> None:
        """Stop (idempotent; survives cancellation of the caller)."""
        await asyncio.shield(self._close())

    async def _close(self) -> None:
        await self.follower.aclose()  # ends every open stream
        self._revocations_stop.set()
        self.locator.uninstall()
        self.index.uninstall()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                try:
                    async with asyncio.timeout(self.shutdown_timeout + 2):
                        await task
                except TimeoutError:
                    task.cancel()
                except Exception:
                    log.exception("A2A door task failed")
        self._tasks.clear()
        if self.grpc is not None:
            await self.grpc.aclose()
        if self.push is not None:
            await self.push.aclose()
