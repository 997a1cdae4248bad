"""The channel between the ``javascript`` backend and one Deno run: JSON lines on a Unix socket.

Why a socket, and not stdin/stdout: the program's stdout and stderr stay exactly what it
wrote (``console.log`` is the run's stdout, byte for byte, with no framing a program could
forge or break by writing a partial line), and the workspace module and the entry module each
hold their own connection. The socket is the only thing the Deno permissions open
(``--allow-net=unix:…``, ``--allow-read``/``--allow-write`` of that one path): a program that
speaks the protocol itself gets no more than the host functions give — every request is
checked here, as the calls of the ``agora:workspace`` module are.

A channel can be opened before its run is known (a warm worker: deno started, connected and
waiting); :meth:`Channel.assign` gives it the run, and the waiting ``start`` is answered.

Requests (``{"id": n, "op": ...}``), each answered ``{"id": n, "ok": value}`` or
``{"id": n, "error": {"name", "message"}}``:

* ``start`` → ``{"source", "language", "input", "hasInput"}`` (once per run);
* ``result`` with ``json`` (the value's JSON text) or ``repr`` (not JSON) or neither; ``error``
  with ``kind`` (``compile`` | ``exception``), ``name``, ``message`` — the run's outcome, the
  first one reported wins;
* ``readFile``/``writeFile`` (``text`` or ``base64``)/``listFiles``/``deleteFile`` with
  ``path`` — the host functions (:mod:`backends.hostcalls`).

Bounds: a line is at most :data:`MAX_LINE` bytes and nests at most ``max_depth`` levels
(``[limits] max_depth``), as does a result's value; at most ``max_connections`` connections
and ``max_host_calls`` host calls per run; a connection that breaks the protocol is closed.
A line or a value nested deeper is refused before any decoder sees it (a recursive decode
would raise ``RecursionError`` and kill the handler, losing the run's report): the run's
outcome is then ``refused`` (the backend makes it ``failed/exit`` with a ``tooDeep``
diagnostic), whatever the program reports after.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import contextlib
import time
from dataclasses import dataclass, field
from typing import Any, Final, Literal

import msgspec

from backends.access import Access, WorkspaceAccess
from backends.hostcalls import MAX_WRITE_BYTES, HostOp, check_host_path, serve_host_call
from hub.core.decoding import json_too_deep
from hub.core.events import SkippedWrite
from hub.core.execution.errors import InvalidRequest
from hub.core.execution.policy import normalise_workspace_path
from hub.core.execution.request import ExecutionRequest
from hub.core.validation import DEFAULT_LIMITS

__all__ = ["HOST_FUNCTIONS", "MAX_LINE", "MAX_SKIPPED", "Channel", "Report"]

MAX_SKIPPED: Final = 100
MAX_LINE: Final = MAX_WRITE_BYTES * 4 // 3 + 64 * 1024  # a base64 write of the largest file
HOST_FUNCTIONS: Final[dict[str, HostOp]] = {
    "readFile": "read",
    "writeFile": "write",
    "listFiles": "list",
    "deleteFile": "delete",
}
_ERROR_NAMES: Final[tuple[tuple[type[BaseException], str], ...]] = (
    (FileNotFoundError, "NotFound"),
    (IsADirectoryError, "IsADirectory"),
    (PermissionError, "PermissionDenied"),
    (TimeoutError, "TimedOut"),
    (TypeError, "TypeError"),
    (ValueError, "RangeError"),
)


@dataclass
class Report:
    """What the run reported about itself: its outcome (``kind``: ``result``, ``compile``,
    ``exception``, ``refused`` — the channel refused a message or value, ``message`` says
    why; ``None`` if it reported nothing) and its value."""

    kind: str | None = None
    value: Any = msgspec.UNSET
    repr: str | None = None
    name: str = ""
    message: str = ""
    host_calls: int = 0
    started: bool = False
    started_at: float = 0.0
    """When the program asked for its run (``time.monotonic``): deno is up, the module next."""
    ended_at: float = 0.0
    """When it reported its outcome."""
    skipped: list[SkippedWrite] = field(default_factory=list)
    """Writes and deletes a ``read`` instance refused (at most :data:`MAX_SKIPPED`)."""


class _Refused(Exception):
    def __init__(self, name: str, message: str) -> None:
        super().__init__(message)
        self.name = name


class Channel:
    """The server side of one run's socket (see the module docstring)."""

    def __init__(
        self,
        *,
        instance: str,
        instance_access: Access,
        max_host_calls: int,
        host_call_timeout_s: float,
        max_connections: int = 8,
        max_depth: int = DEFAULT_LIMITS.max_depth,
    ) -> None:
        self._request: ExecutionRequest | None = None
        self._access: WorkspaceAccess | None = None
        self._assigned = asyncio.Event()
        self.ready = asyncio.Event()
        """Set when deno is up and has asked for its run (a warm worker is warm from then)."""
        self._instance = instance
        self._instance_access = instance_access
        self._max_host_calls = max_host_calls
        self._timeout_s = host_call_timeout_s
        self._max_connections = max_connections
        self._max_depth = max_depth
        self._connections = 0
        self._server: asyncio.Server | None = None
        self._handlers: set[asyncio.Task[Any]] = set()
        self.report = Report()

    def assign(self, request: ExecutionRequest, access: WorkspaceAccess | None) -> None:
        """Give the channel its run: a ``start`` waiting for one (a warm worker's) goes on."""
        self._request = request
        self._access = access
        self._assigned.set()

    async def open(self, path: str) -> None:
        """Listen on ``path`` (a fresh socket in a private directory)."""
        self._server = await asyncio.start_unix_server(self._serve, path, limit=MAX_LINE)

    async def aclose(self) -> None:
        """Stop listening and end every connection's handler. Idempotent."""
        server, self._server = self._server, None
        if server is not None:
            server.close()
        for task in list(self._handlers):
            task.cancel()
        if self._handlers:
            await asyncio.gather(*self._handlers, return_exceptions=True)
        if server is not None:
            with contextlib.suppress(Exception):
                await server.wait_closed()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        if task is not None:
            self._handlers.add(task)
        self._connections += 1
        try:
            if self._connections > self._max_connections:
                return
            while True:
                try:
                    line = await reader.readline()
                except (ValueError, asyncio.LimitOverrunError, ConnectionError):
                    return  # a line over the limit, or a broken connection: end it
                if not line:
                    return
                if json_too_deep(line, self._max_depth):
                    self._refuse(f"a channel message nests deeper than {self._max_depth} levels")
                    return
                try:
                    message = msgspec.json.decode(line)
                except (msgspec.DecodeError, RecursionError, ValueError):
                    return  # RecursionError: defensive, the depth check above comes first
                if not isinstance(message, dict) or not isinstance(message.get("id"), int):
                    return
                reply: dict[str, Any] = {"id": message["id"]}
                try:
                    reply["ok"] = await self._answer(message)
                except _Refused as e:
                    reply["error"] = {"name": e.name, "message": str(e)}
                except (RecursionError, ValueError) as e:  # defensive: the handler lives on
                    reply["error"] = {"name": "RangeError", "message": str(e)[:200]}
                writer.write(msgspec.json.encode(reply) + b"\n")
                await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            writer.close()
            if task is not None:
                self._handlers.discard(task)

    async def _answer(self, message: dict[str, Any]) -> Any:
        op = message.get("op")
        report = self.report
        if op == "start":
            if report.started:
                raise _Refused("Error", "the run has already started")
            report.started = True
            self.ready.set()
            await self._assigned.wait()  # a warm worker waits here for its run
            report.started_at = time.monotonic()
            request = self._request
            assert request is not None
            return {
                "source": request.source or "",
                "language": str(request.language),
                "input": request.input if request.has_input else None,
                "hasInput": request.has_input,
            }
        if op == "result" or op == "error":
            if report.kind is None:
                report.ended_at = time.monotonic()
                self._record(op, message)
            return None
        if isinstance(op, str) and op in HOST_FUNCTIONS:
            return await self._host_call(op, message)
        raise _Refused("TypeError", f"unknown operation {op!r}")

    def _refuse(self, why: str) -> None:
        """The run fails with ``why`` (unless it already reported its outcome)."""
        report = self.report
        if report.kind is None:
            report.ended_at = time.monotonic()
            report.kind, report.name, report.message = "refused", "RangeError", why

    def _record(self, op: str, message: dict[str, Any]) -> None:
        report = self.report
        if op == "error":
            kind = message.get("kind")
            report.kind = kind if kind in ("compile", "exception") else "exception"
            report.name = str(message.get("name", "Error"))[:200]
            report.message = str(message.get("message", ""))[:4000]
            return
        report.kind = "result"
        text = message.get("json")
        if isinstance(text, str):
            if json_too_deep(text, self._max_depth):
                report.kind = None
                self._refuse(f"the value nests deeper than {self._max_depth} levels")
                return
            try:
                report.value = msgspec.json.decode(text)
            except (msgspec.DecodeError, RecursionError, ValueError):
                report.repr = text[:4000]
        elif isinstance(message.get("repr"), str):
            report.repr = message["repr"][:4000]

    async def _host_call(self, function: str, message: dict[str, Any]) -> Any:
        report = self.report
        if self._request is None:
            raise _Refused("Error", "no run has been assigned yet")
        report.host_calls += 1
        if report.host_calls > self._max_host_calls:
            raise _Refused(
                "RangeError", f"more than {self._max_host_calls} host calls in one execution"
            )
        op = HOST_FUNCTIONS[function]
        fs = self._request.policy.filesystem
        try:
            path = check_host_path(
                op,
                message.get("path"),
                fs,
                instance=self._instance,
                instance_access=self._instance_access,
                has_workspace=self._access is not None,
                function=function,
            )
            data = _content(function, message) if op == "write" else b""
            assert self._access is not None  # check_host_path refuses a missing workspace
            return await serve_host_call(
                op, path, self._access, fs, data=data, timeout_s=self._timeout_s, function=function
            )
        except (OSError, ValueError, TypeError) as e:
            if op in ("write", "delete") and self._instance_access != "read-write":
                self._skip(op, message.get("path"))
            raise _Refused(_error_name(e), str(e)) from e

    def _skip(self, op: HostOp, path: object) -> None:
        """Record a write the read-only instance refused (``execFinished.skipped``)."""
        skipped = self.report.skipped
        if len(skipped) >= MAX_SKIPPED or not isinstance(path, str) or op == "read":
            return
        try:
            normalised = normalise_workspace_path(path, "path")
        except InvalidRequest:
            return
        kind: Literal["write", "delete"] = "write" if op == "write" else "delete"
        skipped.append(SkippedWrite(path=normalised, mount_root=".", op=kind, reason="read-only"))


def _content(function: str, message: dict[str, Any]) -> bytes:
    text, encoded = message.get("text"), message.get("base64")
    if isinstance(text, str):
        return text.encode("utf-8", "replace")
    if isinstance(encoded, str):
        try:
            return base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError) as e:
            raise TypeError(f"{function}: content is not valid base64") from e
    raise TypeError(f"{function}: content must be a string or a Uint8Array")


def _error_name(error: BaseException) -> str:
    for cls, name in _ERROR_NAMES:
        if isinstance(error, cls):
            return name
    return "Error"
