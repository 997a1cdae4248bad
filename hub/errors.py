"""The one error taxonomy of Agora.

Every failure that can reach a client is an :class:`AgoraError` subclass with a stable wire
``code``. Errors are split by blame, after h11's ``LocalProtocolError``/``RemoteProtocolError``:
:class:`ClientError` means the request was at fault and nothing changed; :class:`ServerError`
means we were. The server maps them to ``error`` frames in one place (``hub.protocol``).
"""

from __future__ import annotations

from typing import Any, ClassVar, Literal

Blame = Literal["client", "server"]


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


ERROR_CODES: tuple[str, ...] = (
    "badRequest",
    "unauthorized",
    "forbidden",
    "notFound",
    "conflict",
    "tooLarge",
    "rateLimited",
    "busy",
    "exists",
    "unavailable",
    "internal",
)
