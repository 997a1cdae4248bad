"""Bearer authentication for the A2A listener, with the hub's own capability tokens.

:class:`BearerAuth` is a plain ASGI middleware: every request except the public agent card must
carry ``Authorization: Bearer <token>`` with a token :meth:`hub.auth.TokenSigner.verify`
accepts, else it gets HTTP 401 with ``WWW-Authenticate: Bearer`` (RFC 6750 §3) and the
handler never runs. The verified :class:`~hub.auth.Capability` goes into the ASGI scope, and
:class:`AgoraContextBuilder` hands it to the request handler in the A2A call context; the
token's workspaces and rights then apply to every call (a workspace it does not name is an
A2A error, a task in such a workspace does not exist for the caller).

A revoked token (:mod:`hub.revocations`) is refused like an invalid one, with ``reason:
"revoked"`` in the 401 body. A stream (``SendStreamingMessage``, ``SubscribeToTask``) lasts no
longer than its token: :func:`until_token_ends` ends it with the stream's error event (an
``InvalidParamsError`` whose ``data`` is ``{"agoraCode": "unauthorized", "reason": "expired"
| "revoked"}``) when the token expires or is revoked.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Collection
from typing import Any, Final, TypeVar, cast

from a2a.auth.user import User
from a2a.server.context import ServerCallContext
from a2a.server.routes import DefaultServerCallContextBuilder
from starlette.requests import Request
from starlette.types import ASGIApp, Receive, Scope, Send

from a2a_adapter.store import CAPABILITY_KEY
from hub.auth import TokenSigner, asgi_bearer_token
from hub.core.capability import Capability
from hub.core.errors import Unauthorized
from hub.revocations import Revocations

__all__ = ["AgoraContextBuilder", "AgoraUser", "BearerAuth", "until_token_ends"]

T = TypeVar("T")

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
    """Require a valid, unrevoked capability token on every path but ``public_paths``."""

    def __init__(
        self,
        app: ASGIApp,
        signer: TokenSigner,
        public_paths: Collection[str],
        revocations: Revocations,
    ):
        self.app = app
        self.verify = revocations.verifier(signer.verify)
        self.public_paths = frozenset(public_paths)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("path") in self.public_paths:
            await self.app(scope, receive, send)
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
            await _unauthorized(send, "invalid_token", e.message, e.details.get("reason"))
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


async def until_token_ends(
    items: AsyncIterator[T],
    capability: Capability,
    revocations: Revocations,
    refusal: Callable[[Unauthorized], Exception],
) -> AsyncGenerator[T, None]:
    """``items`` until the token ``capability`` came from expires or is revoked; then raise
    ``refusal(error)`` (the SDK turns an A2A error raised by a stream into its error event)."""
    ended = asyncio.ensure_future(revocations.until_ended(capability))
    try:
        while True:
            step = asyncio.ensure_future(_step(items))
            await asyncio.wait((step, ended), return_when=asyncio.FIRST_COMPLETED)
            if not step.done():
                step.cancel()  # ends ``items`` (the caller closes it)
                with contextlib.suppress(asyncio.CancelledError):
                    await step
                raise refusal(ended.result())
            more, item = step.result()
            if not more:
                return
            yield cast(T, item)
    finally:
        ended.cancel()


async def _step(items: AsyncIterator[T]) -> tuple[bool, T | None]:
    try:
        return True, await anext(items)
    except StopAsyncIteration:
        return False, None


async def _unauthorized(send: Send, error: str, message: str, reason: object = None) -> None:
    detail: dict[str, Any] = {"code": 401, "status": "UNAUTHENTICATED", "message": message}
    if isinstance(reason, str):
        detail["reason"] = reason  # expired, revoked, lifetime, future, invalid_signature, …
    body = json.dumps({"error": detail}).encode()
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
