"""The client's errors: ``error`` frames and fatal close codes as :mod:`hub.core.errors` classes.

Both mappings are read from the one table in :mod:`hub.core.errors` (``ERROR_TABLE``,
``error_class``, ``FATAL_CLOSES``) by the pure client protocol, :mod:`hub.core.wire.client`,
which needs them to match replies; they are re-exported here under the client's public names.
The only error the client adds is :class:`SessionClosed`.
"""

from __future__ import annotations

from hub.core.errors import Unavailable
from hub.core.wire.client import close_error, error_from_frame

__all__ = ["SessionClosed", "close_error", "error_from_frame"]


class SessionClosed(Unavailable):
    """The session was closed (by :meth:`Session.aclose`) before the call could complete."""
