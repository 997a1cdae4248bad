"""The Python client of the Agora hub (WebSocket protocol ``agora.v1``, docs/protocol.md;
docs/tour.md, "The Python client").

::

    async with connect("ws://127.0.0.1:8765", token) as session:
        ws = session.workspace("demo")
        item = await ws.request_work("parser", {"spec": "…"})
        reply = await ws.wait_for_kind(item.correlation_id, "workPublished", timeout=60)

One module per concept: :mod:`~hub.client.session` (connect, hello, reconnect, resume),
:mod:`~hub.client.feed` (subscriptions), :mod:`~hub.client.workspace` (publish, state, files,
adk-code's verbs, waiters), :mod:`~hub.client.exec` (``ws.runtime``) and
:mod:`~hub.client.errors`; the protocol itself, without I/O, is :mod:`hub.core.wire.client`.
Every public name (and tunable default) of the former ``hub/client.py`` is importable from
``hub.client``.
"""

from hub.client.errors import SessionClosed, error_from_frame
from hub.client.exec import ExecHandle, ExecOutcome, ExecUpdate, WorkspaceRuntime
from hub.client.feed import CATCH_UP_RETRIES, Subscription
from hub.client.session import (
    DEFAULT_HISTORY,
    DEFAULT_HISTORY_BYTES,
    DEFAULT_MAX_FRAME,
    Session,
    connect,
)
from hub.client.verify import CheckpointVerifier, SignedCheckpoint
from hub.client.workspace import (
    INDEX_SIZE,
    MAX_RATE_LIMIT_WAIT,
    RATE_LIMIT_RETRIES,
    BatchAck,
    PublishAck,
    Workspace,
)
from hub.core.backoff import Backoff

__all__ = [
    "CATCH_UP_RETRIES",
    "DEFAULT_HISTORY",
    "DEFAULT_HISTORY_BYTES",
    "DEFAULT_MAX_FRAME",
    "INDEX_SIZE",
    "MAX_RATE_LIMIT_WAIT",
    "RATE_LIMIT_RETRIES",
    "Ack",
    "Backoff",
    "BatchAck",
    "CheckpointVerifier",
    "ExecHandle",
    "ExecOutcome",
    "ExecResult",
    "ExecUpdate",
    "PublishAck",
    "Session",
    "SessionClosed",
    "SignedCheckpoint",
    "Subscription",
    "Workspace",
    "WorkspaceRuntime",
    "connect",
    "error_from_frame",
]

# The names of 0.1, kept: the classes are named after what they are (an acknowledged publish,
# an execution's outcome) so they do not share a name with the wire frames they come from.
Ack = PublishAck
ExecResult = ExecOutcome
