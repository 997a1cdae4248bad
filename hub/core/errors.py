"""The one error taxonomy of Agora.

Every failure that can reach a client is an :class:`AgoraError` subclass with a stable wire
``code``. Errors are split by blame, after h11's ``LocalProtocolError``/``RemoteProtocolError``:
:class:`ClientError` means the request was at fault and nothing changed; :class:`ServerError`
means we were. The server maps them to ``error`` frames in one place (``hub.core.wire.session``).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from typing import Any, ClassVar, Final, Literal, NamedTuple

Blame = Literal["client", "server", "operator"]


class AgoraError(Exception):
    """Root of every error Agora reports. ``code`` is part of the wire contract."""

    code: ClassVar[str] = "internal"
    blame: ClassVar[Blame] = "server"

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details: dict[str, Any] = details

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.message!r}, details={self.details!r})"


class ClientError(AgoraError):
    """The request was wrong; nothing was written."""

    blame: ClassVar[Blame] = "client"


class ServerError(AgoraError):
    """Agora failed; the request may be retried."""

    blame: ClassVar[Blame] = "server"


class BadRequest(ClientError):
    """Malformed input: bad JSON, a wrong type, an invalid path. ``details['field']`` names it."""

    code = "badRequest"


class Unauthorized(ClientError):
    code = "unauthorized"


class Forbidden(ClientError):
    code = "forbidden"


class NotFound(ClientError):
    code = "notFound"


class Conflict(ClientError):
    """A precondition failed (stale ``expectedSeq``/``baseRev``, ownership). Carries ``head``."""

    code = "conflict"


class TooLarge(ClientError):
    code = "tooLarge"


class RateLimited(ClientError):
    code = "rateLimited"


class Busy(ClientError):
    code = "busy"


class Exists(ClientError):
    code = "exists"


class Unavailable(ServerError):
    code = "unavailable"


class Internal(ServerError):
    code = "internal"


class IntegrityError(ServerError):
    """The stored log is damaged: a broken hash link, a gap or a duplicate seq."""

    code = "internal"


class TamperDetected(ServerError):
    """A verifying client's verdict: the hub showed a checkpoint that is not consistent with
    one it showed before (a rewritten, truncated or forked history), or could not prove that
    it is. Both signed notes are kept: ``previous`` (what was seen first) and ``current``
    (what the hub shows now); together, each signed by the hub's key, they are the proof.

    Never sent by a hub (the hub cannot accuse itself), so it has no row in
    :data:`ERROR_TABLE`: it is listed in :data:`CLIENT_VERDICTS` instead."""

    code = "tamperDetected"

    def __init__(
        self, message: str, *, workspace: str, previous: str, current: str, **details: Any
    ) -> None:
        super().__init__(
            message, workspace=workspace, previous=previous, current=current, **details
        )
        self.workspace = workspace
        self.previous = previous
        self.current = current


class ConfigError(AgoraError):
    """The operator's configuration (file, flags, environment or secret) is invalid.

    Blamed on neither a client nor the hub's code: it stops ``agora serve`` or a command before
    anything runs. ``details['source']`` names the file (or ``command line``) when there is one.
    """

    code = "badRequest"
    blame: ClassVar[Blame] = "operator"


# ---------------------------------------------------------------------------------------------
# The one error table: class ↔ stable wire code ↔ close code ↔ A2A error ↔ HTTP status (read
# both ways by the server session, the client, the A2A adapter and the HTTP doors; no other
# module tables error codes).


class CloseCode(enum.IntEnum):
    """WebSocket close codes Agora uses (RFC 6455 §7.4 plus the 4xxx private range)."""

    SHUTDOWN = 1001  # going away: the hub is stopping
    POLICY = 1008  # abuse: too many bad frames
    TOO_BIG = 1009  # a frame over the size limit
    INTERNAL = 1011
    TRY_AGAIN = 1013  # over a connection cap: reconnect later
    UNAUTHORIZED = 4401  # no valid token, or it expired
    TOO_SLOW = 4408  # send queue overflowed; resume with afterSeq


A2AErrorName = Literal["InvalidParamsError", "UnsupportedOperationError", "InternalError"]
"""The A2A error (a2a-sdk's class name in ``a2a.utils.errors``; A2A spec §5.4) a code becomes.
A2A has no authorization error inside a call: a forbidden workspace is an invalid parameter,
with ``data.agoraCode = "forbidden"``."""


class ErrorRow(NamedTuple):
    """One row of :data:`ERROR_TABLE`."""

    error: type[AgoraError]
    closes: CloseCode | None
    """The close code when the error ends the connection (the client does not retry it)."""
    a2a: A2AErrorName
    http: int
    """The HTTP status an HTTP door (the viewer's JSON API) answers the error with."""
    bare_close: CloseCode | None = None
    """The close code the server session ends a connection with for this fault on its own,
    without an ``error`` frame (too many bad frames, a frame over the size limit); a client
    reads it back as this error, as it does ``closes``."""

    @property
    def code(self) -> str:
        return self.error.code

    @property
    def fatal_closes(self) -> tuple[CloseCode, ...]:
        """The close codes a client raises this error for (reconnecting cannot help)."""
        return tuple(code for code in (self.closes, self.bare_close) if code is not None)


ERROR_TABLE: Final[tuple[ErrorRow, ...]] = (
    ErrorRow(BadRequest, None, "InvalidParamsError", 400, bare_close=CloseCode.POLICY),
    ErrorRow(Unauthorized, CloseCode.UNAUTHORIZED, "InvalidParamsError", 401),
    ErrorRow(Forbidden, None, "InvalidParamsError", 403),
    ErrorRow(NotFound, None, "InvalidParamsError", 404),
    ErrorRow(Conflict, None, "UnsupportedOperationError", 409),
    ErrorRow(TooLarge, None, "InvalidParamsError", 413, bare_close=CloseCode.TOO_BIG),
    ErrorRow(RateLimited, None, "UnsupportedOperationError", 429),
    ErrorRow(Busy, None, "UnsupportedOperationError", 429),
    ErrorRow(Exists, None, "UnsupportedOperationError", 409),
    ErrorRow(Unavailable, None, "InternalError", 503),
    ErrorRow(Internal, None, "InternalError", 500),
)
"""Every wire error code, once. ``docs/protocol.md`` lists the same table."""

CLIENT_VERDICTS: Final[tuple[type[AgoraError], ...]] = (TamperDetected,)
"""Errors a client raises on its own judgement, never read from an ``error`` frame: their
codes are in no table row (a hub sending one would be read as ``internal``)."""

_BY_CODE: Final[Mapping[str, ErrorRow]] = {row.code: row for row in ERROR_TABLE}

FATAL_CLOSES: Final[Mapping[int, type[AgoraError]]] = {
    code: row.error for row in ERROR_TABLE for code in row.fatal_closes
}
"""Close codes after which reconnecting cannot help, and the error a client raises for each:
the table read from close code to error (the ``closes`` and ``bare_close`` columns)."""


def error_row(code: str) -> ErrorRow:
    """The table row of wire ``code``; an unknown code is ``internal``'s row."""
    return _BY_CODE.get(code, _BY_CODE[Internal.code])


def error_class(code: str) -> type[AgoraError]:
    """The exception class a wire ``code`` stands for (unknown codes: :class:`Internal`)."""
    return error_row(code).error


def closes_connection(error: AgoraError) -> CloseCode | None:
    """The close code ``error`` ends a connection with, or None when it keeps it open."""
    return error_row(error.code).closes


def is_known_code(code: str) -> bool:
    return code in _BY_CODE
