"""The Python client of the Agora hub (docs/tour.md, "The Python client")."""

from hub.client.session import (
    Ack,
    Backoff,
    BatchAck,
    ExecHandle,
    ExecResult,
    ExecUpdate,
    Session,
    SessionClosed,
    Subscription,
    Workspace,
    WorkspaceRuntime,
    connect,
    error_from_frame,
)

__all__ = [
    "Ack",
    "Backoff",
    "BatchAck",
    "ExecHandle",
    "ExecResult",
    "ExecUpdate",
    "Session",
    "SessionClosed",
    "Subscription",
    "Workspace",
    "WorkspaceRuntime",
    "connect",
    "error_from_frame",
]
