"""The A2A gRPC binding, on its own port (``[a2a] grpc_port`` / ``agora serve --a2a-grpc-port``).

The SDK's :class:`~a2a.server.request_handlers.grpc_handler.GrpcHandler` serves the same
:class:`~a2a_adapter.handler.AgoraRequestHandler` the HTTP bindings use, so every method,
right and limit is the same. Authentication is the same capability token, in the call metadata
``authorization: Bearer <token>``: :class:`BearerInterceptor` refuses a call without a valid,
unrevoked token with ``UNAUTHENTICATED`` (its details say why: ``expired``, ``revoked``, …)
before any handler runs; :class:`AgoraGrpcContextBuilder` hands the capability to the handler.
Metadata ``last-event-id`` resumes a ``SubscribeToTask`` as the SSE header does; an
``a2a-version`` other than 1.x is ``UNIMPLEMENTED`` (VersionNotSupported).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, Final

import grpc
import grpc.aio
from a2a.server.context import ServerCallContext
from a2a.server.request_handlers.grpc_handler import (
    DefaultGrpcServerCallContextBuilder,
    GrpcHandler,
)
from a2a.types import a2a_pb2_grpc

from a2a_adapter.auth import AgoraUser
from a2a_adapter.handler import AgoraRequestHandler
from a2a_adapter.store import CAPABILITY_KEY
from hub.auth import TokenSigner
from hub.config import SHUTDOWN_TIMEOUT_S
from hub.core.capability import Capability
from hub.core.errors import Unauthorized
from hub.revocations import Revocations

__all__ = ["AgoraGrpcContextBuilder", "BearerInterceptor", "GrpcServer", "bearer_of"]

MAX_MESSAGE_BYTES_FLOOR: Final = 64 * 1024

Verify = Callable[[str], Capability]
if TYPE_CHECKING:
    Handler = grpc.RpcMethodHandler[Any, Any]  # generic in the stubs only


def bearer_of(metadata: Any) -> str | None:
    """The token of an ``authorization: Bearer <token>`` metadata entry, if any."""
    for key, value in metadata or ():
        if str(key).lower() == "authorization":
            text = value.decode("latin-1") if isinstance(value, bytes) else str(value)
            scheme, _, token = text.partition(" ")
            if scheme.lower() == "bearer" and token.strip():
                return token.strip()
            return None
    return None


class BearerInterceptor(grpc.aio.ServerInterceptor):
    """Refuse every call without a valid, unrevoked capability token (``UNAUTHENTICATED``)."""

    def __init__(self, verify: Verify) -> None:
        self.verify = verify

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler | None]],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> Handler | None:
        handler = await continuation(handler_call_details)
        version = _metadata_value(handler_call_details.invocation_metadata, "a2a-version")
        if version is not None and version.split(".")[0] != "1":
            # The SDK's GrpcHandler does not check it; the HTTP routes answer -32009.
            return _refusal(
                handler,
                f"A2A version {version!r} is not supported (1.x)",
                grpc.StatusCode.UNIMPLEMENTED,
            )
        token = bearer_of(handler_call_details.invocation_metadata)
        if token is None:
            return _refusal(handler, "an authorization: Bearer token is required")
        try:
            self.verify(token)
        except Unauthorized as e:
            return _refusal(handler, f"{e.message} ({e.details.get('reason', 'invalid')})")
        return handler


def _metadata_value(metadata: Any, name: str) -> str | None:
    for key, value in metadata or ():
        if str(key).lower() == name:
            return value.decode("latin-1") if isinstance(value, bytes) else str(value)
    return None


def _refusal(
    handler: Handler | None,
    message: str,
    code: grpc.StatusCode = grpc.StatusCode.UNAUTHENTICATED,
) -> Handler:
    async def deny(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(code, message)

    async def deny_stream(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await context.abort(code, message)
        yield None  # pragma: no cover - abort raises

    if handler is not None and handler.unary_stream is not None:
        return grpc.unary_stream_rpc_method_handler(
            deny_stream,
            request_deserializer=handler.request_deserializer,
            response_serializer=handler.response_serializer,
        )
    return grpc.unary_unary_rpc_method_handler(
        deny,
        request_deserializer=handler.request_deserializer if handler else None,
        response_serializer=handler.response_serializer if handler else None,
    )


class AgoraGrpcContextBuilder(DefaultGrpcServerCallContextBuilder):
    """The SDK's call context plus the verified capability and the call's metadata."""

    def __init__(self, verify: Verify) -> None:
        self.verify = verify

    def build(self, context: grpc.aio.ServicerContext[Any, Any]) -> ServerCallContext:
        server_context = super().build(context)
        metadata = context.invocation_metadata() or ()
        token = bearer_of(metadata)
        if token is not None:
            # Verified again (the interceptor cannot pass objects on): cheap, and a token
            # revoked between the two is refused by the handler as unauthenticated.
            server_context.state[CAPABILITY_KEY] = self.verify(token)
        server_context.state["headers"] = {
            str(k).lower(): (v.decode("latin-1") if isinstance(v, bytes) else str(v))
            for k, v in metadata
        }
        return server_context

    def build_user(self, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        token = bearer_of(context.invocation_metadata() or ())
        if token is None:
            return super().build_user(context)
        try:
            return AgoraUser(self.verify(token))
        except Unauthorized:
            return super().build_user(context)


class GrpcServer:
    """The gRPC listener: :meth:`bind` (the port is known before the card is built), then
    :meth:`start` with the handler, :meth:`aclose` to stop."""

    def __init__(
        self,
        signer: TokenSigner,
        revocations: Revocations,
        *,
        max_message_bytes: int,
        shutdown_timeout: float = SHUTDOWN_TIMEOUT_S,
    ) -> None:
        self.verify = revocations.verifier(signer.verify)
        limit = max(max_message_bytes, MAX_MESSAGE_BYTES_FLOOR)
        self.server = grpc.aio.server(
            interceptors=[BearerInterceptor(self.verify)],
            options=[
                ("grpc.max_receive_message_length", limit),
                ("grpc.max_send_message_length", 4 * limit),
                ("grpc.max_concurrent_streams", 512),
            ],
        )
        self.shutdown_timeout = shutdown_timeout
        self.port = 0

    def bind(self, host: str, port: int) -> int:
        """Bind ``host:port`` (0: a free port); return the port. Raises ``OSError``."""
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        bound = self.server.add_insecure_port(address)
        if bound == 0:
            raise OSError(f"cannot bind the A2A gRPC port {address}")
        self.port = bound
        return bound

    async def start(self, handler: AgoraRequestHandler) -> None:
        servicer = GrpcHandler(handler, context_builder=AgoraGrpcContextBuilder(self.verify))
        a2a_pb2_grpc.add_A2AServiceServicer_to_server(servicer, self.server)  # type: ignore[no-untyped-call]
        await self.server.start()

    async def aclose(self) -> None:
        await self.server.stop(self.shutdown_timeout)
