"""The MCP Streamable HTTP transport at ``/mcp`` on the hub's HTTP port.

::

    async with McpHttp("ws://127.0.0.1:8765", signer, revocations) as door:
        app = door.app            # an ASGI app: mount it at /mcp

Authorization follows the MCP spec's authorization section for a resource server: every HTTP
request carries ``Authorization: Bearer <capability token>`` (never in the query string).
A missing, malformed, invalid, expired or revoked token gets HTTP 401 with
``WWW-Authenticate: Bearer realm="agora", error="…"`` (RFC 6750 §3) and reaches nothing of
the SDK; the token's rights are then the hub's to enforce.

Sessions: each MCP session (``Mcp-Session-Id``) is bound to the token id that opened it (a
request of the session with another token is answered 404, as if the session did not exist),
and acts through its own hub connection (:func:`hub.client.connect` with that token), opened by
the session's first request and closed when the session ends (the client's ``DELETE``, the idle
timeout ``[mcp] session_idle_s``, shutdown, or its token's end: when the token expires or is
revoked the session ends at once, its open GET stream included). At most ``[mcp] max_sessions``
are open at once; one more is refused with 503. One agent (all its tokens together) holds at
most ``[mcp] max_sessions_per_agent``: its ``initialize`` beyond that ends its own oldest
session (so one token cannot fill every slot, and a client that crashed without ``DELETE`` is
not locked out for the idle timeout); only when all of the agent's slots are openings still in
flight is it answered 429. A session whose hub connection failed to open (e.g. the hub's
per-agent connection limit), or failed for good since, holds no slot: it is discarded before
the next opening of any session and at its own next request (then 404).
A request body over ``max_event_bytes`` plus
:data:`~hub.mcp.server.MESSAGE_RESERVE` is refused with 413 before it is read whole.

``?workspace=W`` on the endpoint URL sets the session's default workspace (a token naming a
single workspace makes that one the default anyway).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import OrderedDict
from collections.abc import AsyncIterator, Callable, MutableMapping
from types import TracebackType
from typing import Any, Final, Self

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser
from mcp.server.auth.provider import AccessToken
from mcp.server.streamable_http import StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.authentication import AuthCredentials
from starlette.requests import Request
from starlette.types import Receive, Scope, Send

from hub.auth import TokenSigner, asgi_bearer_token
from hub.client import Session, connect
from hub.config import McpConfig
from hub.core.capability import Capability
from hub.core.errors import BadRequest, Unauthorized
from hub.core.validation import DEFAULT_LIMITS, Limits, validate_workspace
from hub.mcp.server import MESSAGE_RESERVE, Ctx, build_server
from hub.mcp.tools import DEFAULT_BACKENDS, AgentLink
from hub.revocations import Revocations

__all__ = ["MCP_PATH", "McpHttp"]

log = logging.getLogger(__name__)

MCP_PATH: Final = "/mcp"

_SCOPE_KEY: Final = "agora.mcp"


class McpHttp:
    """The ``/mcp`` door (see the module doc). ``hub_url``: the WebSocket hub the sessions
    connect to; ``host``: the interface the HTTP port binds (loopback ones turn on the SDK's
    DNS-rebinding protection: ``Host`` and ``Origin`` must be loopback)."""

    def __init__(
        self,
        hub_url: str,
        signer: TokenSigner,
        revocations: Revocations,
        *,
        limits: Limits = DEFAULT_LIMITS,
        settings: McpConfig | None = None,
        host: str = "127.0.0.1",
    ) -> None:
        settings = settings or McpConfig()
        self.hub_url = hub_url
        self.signer = signer
        self.revocations = revocations
        self.verify = revocations.verifier(signer.verify)
        self.limits = limits
        self.backends = dict(DEFAULT_BACKENDS)
        self.backends.update(settings.backends.items())
        self.server = build_server(self._open)
        self.manager = _SessionManager(
            self._ended,
            app=self.server,
            security_settings=_security(host),
            max_request_body_size=limits.max_event_bytes + MESSAGE_RESERVE,
            session_idle_timeout=settings.session_idle_s,
            max_sessions=settings.max_sessions,
        )
        self.max_sessions_per_agent = settings.max_sessions_per_agent
        # agent -> its established sessions, oldest first; openings in flight per agent; the
        # sessions whose hub connection failed to open (discarded after their request).
        self._agent_sessions: dict[str, OrderedDict[str, None]] = {}
        self._opening: dict[str, int] = {}
        self._failed: set[str] = set()
        self._hub_sessions: dict[str, Session] = {}  # MCP session id -> its hub connection
        # MCP session id -> the task that ends it when its token expires or is revoked.
        self._token_ends: dict[str, asyncio.Task[None]] = {}
        self._tasks: asyncio.TaskGroup | None = None
        self._stack = contextlib.AsyncExitStack()

    async def __aenter__(self) -> Self:
        await self._stack.enter_async_context(self.manager.run())
        self._tasks = await self._stack.enter_async_context(asyncio.TaskGroup())
        self._stack.callback(self._stop_watching)  # first out: the group then exits at once
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """End every session (and its hub connection). Idempotent."""
        await self._stack.aclose()

    @property
    def sessions(self) -> int:
        """MCP sessions open now."""
        return len(self.manager._server_instances)

    @property
    def watchers(self) -> int:
        """Token watchers running now (one per open session: see :meth:`_watch_token`)."""
        return len(self._token_ends)

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        """The ASGI app (any path: mount it at ``/mcp``)."""
        if scope["type"] != "http":
            return
        token = asgi_bearer_token(scope)
        if token is None:
            await _unauthorized(
                send, "invalid_request", "an Authorization: Bearer token is required"
            )
            return
        try:
            capability = self.verify(token)
        except Unauthorized as e:
            await self._end_session(scope, token)
            await _unauthorized(send, "invalid_token", e.message, e.details.get("reason"))
            return
        access = AccessToken(
            token=token,
            client_id=capability.token_id,
            scopes=list(capability.rights),
            expires_at=capability.expires_at,
            subject=capability.agent,
        )
        # The SDK binds a session to the principal of the request that opened it.
        scope["user"] = AuthenticatedUser(access)
        scope["auth"] = AuthCredentials(list(capability.rights))
        scope[_SCOPE_KEY] = (token, capability)
        session_id = _header(scope, b"mcp-session-id")
        version = _header(scope, b"mcp-protocol-version")
        if session_id is not None or (
            version is not None and version not in HANDSHAKE_PROTOCOL_VERSIONS
        ):
            # An existing session's request, or the sessionless 2026 protocol (no slot). A dead
            # session ends here (then 404), not after the request that found it dead: that
            # one's answer may still be streaming.
            if session_id is not None and self._dead(session_id):
                await self._discard(session_id)
            await self.manager.handle_request(scope, receive, send)
            return
        await self._open_session(capability.agent, scope, receive, send)

    def _dead(self, session_id: str) -> bool:
        """Whether the session's hub connection failed to open or failed for good since (the
        hub refused the agent, e.g. its per-agent connection limit): such a session is useless
        and must not hold a slot."""
        hub_session = self._hub_sessions.get(session_id)
        return session_id in self._failed or (hub_session is not None and hub_session.closed)

    def _live(self, agent: str) -> OrderedDict[str, None]:
        """The agent's sessions still open and alive (ended or dead ones are forgotten here,
        lazily; a dead one stays in ``_failed`` until it is discarded)."""
        held = self._agent_sessions.setdefault(agent, OrderedDict())
        for sid in [s for s in held if s not in self.manager._server_instances or self._dead(s)]:
            del held[sid]
        return held

    async def _open_session(self, agent: str, scope: Scope, receive: Receive, send: Send) -> None:
        """A request without a session id (an ``initialize``): within the agent's cap."""
        for dead in [sid for sid in self.manager._server_instances if self._dead(sid)]:
            await self._discard(dead)  # they hold no slot
        # One marked failed by a request still in flight as its session ended: dropped here.
        self._failed &= self.manager._server_instances.keys()
        held = self._live(agent)
        opening = self._opening.get(agent, 0)
        # No await between the last count and the reservation: concurrent openings see each
        # other.
        while held and len(held) + opening >= self.max_sessions_per_agent:
            oldest, _ = held.popitem(last=False)
            await self._discard(oldest)
            held = self._live(agent)
            opening = self._opening.get(agent, 0)
        if len(held) + opening >= self.max_sessions_per_agent:
            await _too_many(send, self.max_sessions_per_agent)
            return
        self._opening[agent] = opening + 1
        created: list[str] = []

        async def watch(message: MutableMapping[str, Any]) -> None:
            if message["type"] == "http.response.start" and message["status"] < 400:
                sid = _response_header(message, b"mcp-session-id")
                if sid is not None:
                    created.append(sid)
            await send(message)

        try:
            await self.manager.handle_request(scope, receive, watch)
        finally:
            self._opening[agent] -= 1
            if not self._opening[agent]:
                del self._opening[agent]
            held = self._live(agent)
            for sid in created:
                if sid in self.manager._server_instances:
                    held[sid] = None
                    self._watch_token(sid, scope[_SCOPE_KEY][1])
            if not held:
                del self._agent_sessions[agent]  # no entry per agent ever seen

    def _watch_token(self, session_id: str, capability: Capability) -> None:
        """End the session (its open GET stream included) when its token expires or is
        revoked, as a WebSocket connection or an A2A stream ends, not at its next request."""
        if self._tasks is None or session_id in self._token_ends:
            return

        async def watch() -> None:
            try:
                await self.revocations.until_ended(capability)
                await self._discard(session_id)
            except Exception:  # a watcher's failure must not end every other session's
                log.exception("ending MCP session %s at its token's end failed", session_id)
            finally:
                self._token_ends.pop(session_id, None)

        self._token_ends[session_id] = self._tasks.create_task(watch())

    def _ended(self, session_id: str) -> None:
        """The session ended, however it ended (the client's ``DELETE``, the idle timeout, a
        crash of its server task, :meth:`_discard`, shutdown): its watcher goes now, not when
        its token ends (its hub connection closes with the SDK's connection exit stack)."""
        self._failed.discard(session_id)
        task = self._token_ends.pop(session_id, None)
        # A watcher that is ending the session itself finishes on its own.
        if task is not None and task is not asyncio.current_task():
            task.cancel()

    def _stop_watching(self) -> None:
        for task in self._token_ends.values():
            task.cancel()
        self._token_ends.clear()

    async def _discard(self, session_id: str) -> None:
        """End a session and its hub connection (the SDK's private discard; mcp 2.3, pinned
        by tests/hub/mcp/test_http.py)."""
        self._failed.discard(session_id)
        transport = self.manager._server_instances.get(session_id)
        if transport is not None:
            await self.manager._discard_session(session_id, transport)

    async def _end_session(self, scope: Scope, token: str) -> None:
        """A session whose own token was revoked ends now, with its hub connection, if its
        token watcher (:meth:`_watch_token`) has not ended it yet: its next request shows it
        is dead."""
        session_id = _header(scope, b"mcp-session-id")
        if session_id is None:
            return
        try:
            token_id = self.signer.verify(token).token_id  # valid, but revoked
        except Unauthorized:
            return
        # The SDK keeps sessions and their owners privately (mcp 2.3; pinned by
        # tests/hub/mcp/test_http.py): only the session's own token may end it.
        manager = self.manager
        owner = manager._session_owners.get(session_id)
        transport = manager._server_instances.get(session_id)
        if owner is not None and transport is not None and owner["client_id"] == token_id:
            await manager._discard_session(session_id, transport)

    @contextlib.asynccontextmanager
    async def _open(self, ctx: Ctx) -> AsyncIterator[AgentLink]:
        request = ctx.request
        if not isinstance(request, Request) or _SCOPE_KEY not in request.scope:
            raise Unauthorized("no verified token on this request")
        token, capability = request.scope[_SCOPE_KEY]
        assert isinstance(capability, Capability)
        workspace = request.query_params.get("workspace")
        if workspace is not None:
            try:
                validate_workspace(workspace)
            except BadRequest as e:
                raise BadRequest(f"?workspace=: {e.message}", field="workspace") from None
        session_id = request.headers.get("mcp-session-id")
        async with contextlib.AsyncExitStack() as stack:
            try:
                session = await stack.enter_async_context(connect(self.hub_url, token))
            except BaseException:
                # Not counted: discarded at the next opening or at its own next request.
                if session_id is not None:
                    self._failed.add(session_id)
                raise
            if session_id is not None:
                self._hub_sessions[session_id] = session
                stack.callback(self._hub_sessions.pop, session_id, None)
            yield AgentLink(
                session,
                workspace,
                self.backends,
                self.limits,
                token_workspaces=capability.workspaces,
            )


class _SessionManager(StreamableHTTPSessionManager):
    """The SDK's session manager, telling ``ended`` each time a session is discarded: every
    end of a session passes through ``_discard_session`` (the client's ``DELETE``, the idle
    timeout, its server task's end or crash, a refused opening; mcp 2.3, pinned by
    tests/hub/mcp/test_http.py), which the SDK offers no public hook for. ``ended`` may be
    told more than once per session."""

    def __init__(self, ended: Callable[[str], None], **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._ended = ended

    async def _discard_session(
        self, session_id: str, transport: StreamableHTTPServerTransport
    ) -> None:
        self._ended(session_id)
        await super()._discard_session(session_id, transport)


def _security(host: str) -> TransportSecuritySettings | None:
    if host not in ("127.0.0.1", "localhost", "::1"):
        return None
    return TransportSecuritySettings(
        enable_dns_rebinding_protection=True,
        allowed_hosts=["127.0.0.1:*", "localhost:*", "[::1]:*"],
        allowed_origins=["http://127.0.0.1:*", "http://localhost:*", "http://[::1]:*"],
    )


def _header(scope: Scope, wanted: bytes) -> str | None:
    headers: list[tuple[bytes, bytes]] = scope.get("headers", [])
    for name, value in headers:
        if name.lower() == wanted:
            return value.decode("latin-1")
    return None


def _response_header(message: MutableMapping[str, Any], wanted: bytes) -> str | None:
    headers: list[tuple[bytes, bytes]] = message.get("headers", [])
    for name, value in headers:
        if name.lower() == wanted:
            return value.decode("latin-1")
    return None


async def _too_many(send: Send, cap: int) -> None:
    body = json.dumps(
        {
            "jsonrpc": "2.0",
            "id": None,
            "error": {"code": -32000, "message": f"this agent is opening {cap} sessions already"},
        }
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 429,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"retry-after", b"1"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


async def _unauthorized(send: Send, error: str, message: str, reason: object = None) -> None:
    detail: dict[str, Any] = {"error": error, "error_description": message}
    if isinstance(reason, str):
        detail["reason"] = reason  # expired, revoked, invalid_signature, …
    body = json.dumps(detail).encode()
    description = message.replace("\\", "").replace('"', "'")
    challenge = f'Bearer realm="agora", error="{error}", error_description="{description}"'
    await send(
        {
            "type": "http.response.start",
            "status": 401,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"www-authenticate", challenge.encode("latin-1", "replace")),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
