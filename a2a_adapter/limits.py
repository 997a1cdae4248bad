"""The A2A door's decode policy: a body size limit checked before reading, a nesting limit
checked before parsing (the same policy as the WebSocket door, :mod:`hub.core.decoding`).

:class:`BodyLimits` is an ASGI middleware outside everything else (authentication included),
so a hostile body costs the hub at most ``max_body_bytes`` of memory and never reaches a
recursive parser:

- a ``Content-Length`` over the limit, or a chunked body that grows over it, is answered
  ``413 Content Too Large`` before (or as soon as) the body is read;
- a JSON body nested deeper than ``max_depth`` is answered as the binding says a body that
  cannot be parsed is: JSON-RPC ``-32700`` (Parse error, JSON-RPC 2.0 §5.1) with HTTP 200, or
  HTTP+JSON ``400 INVALID_ARGUMENT`` (A2A §11 error format, the SDK's own payload builder).

Both carry ``data``/``metadata`` with Agora's ``agoraCode``, ``field`` and ``limit``.
"""

from __future__ import annotations

import json
from typing import Any, Final

from a2a.utils.error_handlers import build_rest_error_payload
from a2a.utils.errors import InvalidParamsError, InvalidRequestError
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from hub.core.decoding import json_too_deep

__all__ = ["BodyLimits"]

_JSON_HEADERS: Final = [(b"content-type", b"application/json")]


class BodyLimits:
    """Bound every HTTP request body in size and JSON nesting before the app sees it.
    ``jsonrpc_paths`` are answered in JSON-RPC form, every other path in HTTP+JSON form."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        max_body_bytes: int,
        max_depth: int,
        jsonrpc_paths: frozenset[str],
    ) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes
        self.max_depth = max_depth
        self.jsonrpc_paths = jsonrpc_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") in ("GET", "HEAD", "OPTIONS"):
            await self.app(scope, receive, send)
            return
        declared = _content_length(scope)
        if declared is not None and declared > self.max_body_bytes:
            await self._too_large(send)
            return
        chunks: list[bytes] = []
        size = 0
        more = True
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                await self._too_large(send)
                return
            chunks.append(chunk)
            more = message.get("more_body", False)
        body = b"".join(chunks)
        if json_too_deep(body, self.max_depth):
            await self._too_deep(scope, send)
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.app(scope, replay, send)

    async def _too_large(self, send: Send) -> None:
        error = InvalidRequestError(
            message=f"the request body is over the limit of {self.max_body_bytes} bytes",
            data={"agoraCode": "tooLarge", "limit": str(self.max_body_bytes)},
        )
        payload = build_rest_error_payload(error)
        payload["error"].update(code=413, status="RESOURCE_EXHAUSTED")  # RFC 9110 §15.5.14
        await _respond(send, 413, payload)

    async def _too_deep(self, scope: Scope, send: Send) -> None:
        message = f"the JSON body is nested deeper than the limit of {self.max_depth} levels"
        data = {"agoraCode": "badRequest", "field": "$", "limit": self.max_depth}
        if scope.get("path") in self.jsonrpc_paths:
            body: dict[str, Any] = {
                "jsonrpc": "2.0",
                "id": None,
                "error": {"code": -32700, "message": message, "data": data},
            }
            await _respond(send, 200, body)
            return
        error = InvalidParamsError(message=message, data={k: str(v) for k, v in data.items()})
        payload = build_rest_error_payload(error)  # 400 INVALID_ARGUMENT, as the SDK answers
        await _respond(send, 400, payload)


def _content_length(scope: Scope) -> int | None:
    for name, value in scope.get("headers", ()):
        if name == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


async def _respond(send: Send, status: int, body: dict[str, Any]) -> None:
    data = json.dumps(body).encode()
    headers = [*_JSON_HEADERS, (b"content-length", str(len(data)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": data})
