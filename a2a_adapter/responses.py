"""What the A2A listener sends, made exact: integers as integers, an ``id:`` on every SSE event.

The SDK renders protobuf to JSON, where every number of a ``Struct``/``Value`` (metadata, data
parts) is a double: ``2`` goes out as ``2.0``, the seq of an event as ``88.0``. The adapter only
puts integers (up to ±2**53) and non-integral floats in them (:func:`a2a_adapter.mapping.exact`
marks the rest), so :class:`ExactResponses`, an ASGI middleware, writes integral doubles back as
integers in every JSON body and SSE ``data:`` line. It also gives each SSE event the standard
``id:`` field, the seq it stands for — ``metadata["agora.event"].seq`` of an update, the Task's
``metadata["agora.version"]`` for a snapshot — so an EventSource (or any SSE client) reconnects
with ``Last-Event-ID`` and the hub replays exactly what followed
(:meth:`~a2a_adapter.handler.AgoraRequestHandler.on_subscribe_to_task`).
"""

from __future__ import annotations

import json
from typing import Any, Final

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["ExactResponses", "event_seq", "integral"]

_EXACT_INT: Final = 2**53
_UPDATES: Final = ("statusUpdate", "artifactUpdate")


def integral(value: Any) -> Any:
    """``value`` with integral floats (|x| <= 2**53) as ints, recursively."""
    if isinstance(value, float):
        return int(value) if value.is_integer() and abs(value) <= _EXACT_INT else value
    if isinstance(value, dict):
        return {k: integral(v) for k, v in value.items()}
    if isinstance(value, list):
        return [integral(v) for v in value]
    return value


def event_seq(body: Any) -> int | None:
    """The seq an SSE item (a JSON-RPC response or a bare StreamResponse) stands for."""
    if not isinstance(body, dict):
        return None
    result = body.get("result", body)
    if not isinstance(result, dict):
        return None
    seq: Any = None
    task = result.get("task")
    if isinstance(task, dict):
        seq = (task.get("metadata") or {}).get("agora.version")
    for key in _UPDATES:
        update = result.get(key)
        if isinstance(update, dict):
            envelope = (update.get("metadata") or {}).get("agora.event")
            seq = envelope.get("seq") if isinstance(envelope, dict) else None
    if isinstance(seq, int | float) and not isinstance(seq, bool) and seq >= 1:
        return int(seq)
    return None


def _dumps(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def _fix_json(body: bytes) -> bytes:
    try:
        value = json.loads(body)
    except ValueError:
        return body
    return _dumps(integral(value))


def _fix_sse(chunk: bytes) -> bytes:
    """Rewrite each complete event of ``chunk`` (sse-starlette sends one event per chunk)."""
    try:
        text = chunk.decode()
    except UnicodeDecodeError:
        return chunk
    sep = "\r\n" if "\r\n" in text else "\n"
    out: list[str] = []
    for block in text.split(sep * 2):
        if not block:
            continue
        lines = block.split(sep)
        data = [ln[5:].removeprefix(" ") for ln in lines if ln.startswith("data:")]
        if not data:
            out.append(block + sep * 2)  # a comment (ping) or something else: as it is
            continue
        try:
            value = integral(json.loads("\n".join(data)))
        except ValueError:
            out.append(block + sep * 2)
            continue
        kept = [ln for ln in lines if not ln.startswith("data:")]
        seq = event_seq(value)
        if seq is not None and not any(ln.startswith("id:") for ln in kept):
            kept.insert(0, f"id: {seq}")
        kept.append("data: " + _dumps(value).decode())
        out.append(sep.join(kept) + sep * 2)
    return "".join(out).encode()


class ExactResponses:
    """ASGI middleware: JSON bodies and SSE events of ``app`` with exact integers and ids."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        mode = ""
        start: Message | None = None
        parts: list[bytes] = []

        async def wrapped(message: Message) -> None:
            nonlocal mode, start
            if message["type"] == "http.response.start":
                headers = dict(message.get("headers", []))
                content_type = headers.get(b"content-type", b"").decode("latin-1")
                if content_type.startswith("application/json"):
                    mode, start = "json", message  # sent with the rewritten length
                    return
                if content_type.startswith("text/event-stream"):
                    mode = "sse"
                await send(message)
                return
            if message["type"] == "http.response.body" and mode == "json":
                parts.append(message.get("body", b""))
                if message.get("more_body", False):
                    return
                body = _fix_json(b"".join(parts))
                assert start is not None
                fixed = [(k, v) for k, v in start.get("headers", []) if k != b"content-length"]
                fixed.append((b"content-length", str(len(body)).encode()))
                await send({**start, "headers": fixed})
                await send({"type": "http.response.body", "body": body})
                return
            if message["type"] == "http.response.body" and mode == "sse":
                body = message.get("body", b"")
                if body:
                    message = {**message, "body": _fix_sse(body)}
            await send(message)

        await self.app(scope, receive, wrapped)
