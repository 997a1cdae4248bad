"""Every hub error as an A2A error, in one place: the class comes from the core's one error
table (``hub.core.errors``, column ``a2a``); ``data.agoraCode`` keeps the hub's code, and a
client error's details go with it (a server error's do not: the peer is told to retry)."""

from __future__ import annotations

from typing import Any, Final, get_args

import msgspec
from a2a.utils import errors as a2a_errors
from a2a.utils.errors import A2AError

from a2a_adapter.mapping import plain
from hub.core.errors import A2AErrorName, AgoraError, error_row

__all__ = ["a2a_error", "error_data"]

_A2A_ERRORS: Final[dict[str, type[A2AError]]] = {
    name: getattr(a2a_errors, name) for name in get_args(A2AErrorName)
}


def a2a_error(error: AgoraError) -> A2AError:
    """The A2A error for a hub error (``data.agoraCode`` keeps the hub's code)."""
    cls = _A2A_ERRORS[error_row(error.code).a2a]
    if error.blame == "client":
        return cls(message=error.message, data=error_data(error))
    return cls(message="the hub failed; retry", data=error_data(error))


def error_data(error: AgoraError) -> dict[str, Any]:
    """``{"agoraCode": code, **details}`` (the details only for a client error)."""
    data: dict[str, Any] = {"agoraCode": error.code}
    if error.blame == "client":
        data.update(plain(msgspec.to_builtins(error.details)))
    return data
