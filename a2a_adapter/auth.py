"""Bearer authentication for the A2A listener, with the hub's own capability tokens.

:class:`BearerAuth` is a plain ASGI middleware: every request except the public agent card must
carry ``Authorization: Bearer <token>`` with a token :meth:`hub.auth.TokenSigner.verify`
accepts, else it gets HTTP 401 with ``WWW-Authenticate: Bearer`` (RFC 6750 §3) and the
handler never runs. The verified :class:`~hub.auth.Capability` goes into the ASGI scope, and
:class:`AgoraContextBuilder` hands it to the request handler in the A2A call context; the
token's workspaces and rights then apply to every call (a workspace it does not name is an
A2A error, a task in such a workspace does not exist for the caller).
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Collection, MutableMapping
from typing import Any, Final

from a2a.auth.user import User
from a2a.server.context import ServerCallContext
from a2a.server.routes import DefaultServerCallContextBuilder
from starlette.requests import Request

from a2a_adapter.store import CAPABILITY_KEY
from hub.auth import TokenSigner
from hub.core.capability import Capability
from hub.core.errors import Unauthorized

__all__ = ["AgoraContextBuilder", "AgoraUser", "BearerAuth"]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

SCOPE_KEY: Final = "agora.capability"


class AgoraUser(User):
    """The authenticated agent, as the A2A SDK sees it."""

    def __init__(self, capability: Capability) -> None:
        self.capability = capability

    @property
    def is_authenticated(self) -> bool:
        return True

    @property
    def user_name(self) -> str:
        return self.capability.agent


class BearerAuth:
    """Require a valid capability token on every path but ``public_paths``."""

    def __init__(self, app: ASGIApp, signer: TokenSigner, public_paths: Collection[str]):
        self.app = app
        self.signer = signer
        self.public_paths = frozenset(public_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in self.public_paths:
            await self.app(scope, receive, send)
            return
        token = _bearer(scope)
        if token is None:
            await _unauthorized(
                send, "invalid_request", "an Authorization: Bearer token is required"
            )
            return
        try:
            capability = self.signer.verify(token)
        except Unauthorized as e:
            await _unauthorized(send, "invalid_token", e.message)
            return
        scope[SCOPE_KEY] = capability
        await self.app(scope, receive, send)


class AgoraContextBuilder(DefaultServerCallContextBuilder):
    """The SDK's call context plus the verified capability (``state["agora.capability"]``)."""

    def build(self, request: Request) -> ServerCallContext:
        context = super().build(request)
        capability = request.scope.get(SCOPE_KEY)
        if isinstance(capability, Capability):
            context.state[CAPABILITY_KEY] = capability
        return context

    def build_user(self, request: Request) -> User:
        capability = request.scope.get(SCOPE_KEY)
        if isinstance(capability, Capability):
            return AgoraUser(capability)
        return super().build_user(request)


def _bearer(scope: Scope) -> str | None:
    headers: list[tuple[bytes, bytes]] = scope.get("headers", [])
    for name, value in headers:
        if name.lower() == b"authorization":
            scheme, _, token = value.decode("latin-1").partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
            return None
    return None


async def _unauthorized(send: Send, error: str, message: str) -> None:
    body = json.dumps(
        {"error": {"code": 401, "status": "UNAUTHENTICATED", "message": message}}
    ).encode()
    await send(
        {
            "type": "http.response.start",
            "status": 401,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"www-authenticate", f'Bearer realm="agora", error="{error}"'.encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
