"""Drafts of an execution's lifecycle events, as a node writes them (for the tests of what a
dead node or worker left open: tests/hub/cluster/test_interrupted.py, tests/hub/server/
test_reaper.py)."""

from __future__ import annotations

from hub.core.events import (
    ExecFinished,
    ExecFinishedPayload,
    ExecRequested,
    ExecRequestedPayload,
    ExecStarted,
    ExecStartedPayload,
)


def requested(exec_id: str, node: str | None = None) -> ExecRequested:
    """``execRequested`` of ``exec_id``, accepted by ``node`` (None: by a hub that names none)."""
    return ExecRequested(payload=ExecRequestedPayload(exec_id=exec_id, backend="sh", node=node))


def started(exec_id: str, node: str | None) -> ExecStarted:
    return ExecStarted(payload=ExecStartedPayload(exec_id=exec_id, backend="sh", node=node))


def finished(exec_id: str, value: object = None) -> ExecFinished:
    return ExecFinished(
        payload=ExecFinishedPayload(exec_id=exec_id, status="completed", reason="exit", value=value)
    )
