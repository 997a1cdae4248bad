"""Closing an execution that nobody will finish: the hub restarted under it, or the node that
ran it died. Pure: given an open execution and why it was interrupted, the drafts to append.

Both paths write the same thing (docs/execution.md, "Restart recovery"; ARCHITECTURE.md: "a
restart finds executions with no terminal event and closes them as failed/interrupted"):

* for a run that had started and whose output numbering is known, an ``execOutput`` on stderr
  (the next ``n``) with the :attr:`Interruption.note`;
* ``execFinished {status: failed, reason: interrupted, exitCode: -1, diagnostics: [{level:
  error, code: interrupted, message, node?, closedBy}]}``, caused by the ``execStarted`` (or
  the ``execRequested`` of a run that never started).

Event ids are derived from (workspace, execId, the seq of the event the run was last known to
reach), so closing the same run twice — two survivors whose claims overlapped, a restart that
died while closing — writes nothing the second time: the store answers ``duplicate``.

Which runs a dead node left open (:func:`left_open`): those whose last lifecycle event names
it — an ``execStarted`` on it with no ``execFinished`` since, or an ``execRequested`` it
accepted (``payload.node``) with neither ``execStarted`` nor ``execFinished`` since. A restart
closes every open run of its log (a single node ran them all).

Callers: :meth:`hub.runtime.Runtime.recover` (restart, single node),
:class:`hub.cluster.interrupted.InterruptedExecutions` (a dead node, shared store) and
:class:`hub.server.reaper.WorkerReaper` (a dead worker of ``agora serve --workers``).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable
from typing import Any, Final, TypeAlias

import msgspec

from hub.core.events import (
    Event,
    ExecFinished,
    ExecFinishedPayload,
    ExecOutput,
    ExecOutputPayload,
    ExecRequested,
    ExecStarted,
)

__all__ = [
    "HUB_PRODUCER",
    "INTERRUPTED_CODE",
    "Interruption",
    "OpenExecution",
    "Opening",
    "closing_event_id",
    "interrupted_drafts",
    "left_open",
    "node_death_interruption",
    "open_execution",
    "restart_interruption",
]

HUB_PRODUCER: Final = "hub"
"""The producer of what the hub writes on nobody's behalf (a restart's recovery, retention, a
dead node's closing events whose ``execStarted`` names no producer)."""
INTERRUPTED_CODE: Final = "interrupted"
_NAMESPACE: Final = uuid.UUID("6f1c2a4e-3b7d-5e8f-9a0b-1c2d3e4f5a6b")
_NOTE_SUFFIX: Final = "\x00note"


def closing_event_id(workspace: str, exec_id: str, seq: int) -> str:
    """The id of the ``execFinished`` that closes the run of ``exec_id`` whose last known
    lifecycle event (``execStarted``, else ``execRequested``) is at ``seq`` (a UUIDv5)."""
    return str(uuid.uuid5(_NAMESPACE, f"{workspace}\x00{exec_id}\x00{seq}"))


class OpenExecution(msgspec.Struct, frozen=True, kw_only=True):
    """What the log says of an execution with no terminal event.

    ``seq``/``event_id``: its ``execStarted`` if it started, else its ``execRequested`` (the
    cause of the closing events). ``next_n``: the ``n`` its next output would have (``None``
    when the caller does not know the output numbering: no stderr note is written then)."""

    workspace: str
    exec_id: str
    started: bool
    seq: int
    event_id: str | None
    next_n: int | None = None


Opening: TypeAlias = ExecRequested | ExecStarted
"""The event a run was last known to reach while open (the cause of its closing events)."""


def left_open(node: str, lifecycle: Iterable[Event]) -> list[Opening]:
    """The runs ``node`` left open, as the :data:`Opening` of each, by workspace and seq.

    ``lifecycle``: ``execRequested``/``execStarted``/``execFinished`` events (others are
    ignored; one seen twice counts once, in any order): every one of them that names ``node``
    (``payload.node``), and every ``execStarted``/``execFinished`` of those workspaces from the
    first of those on. An ``execRequested`` that does not name ``node`` may be left out: it
    can only follow a finished run of its id, and whether it is the id's last event or not,
    what it leaves is not ``node``'s. An id reused after its run finished is judged by its
    last run."""
    unique = {(e.workspace, e.seq): e for e in lifecycle}
    last: dict[tuple[str, str], Opening | None] = {}
    for key in sorted(unique):
        event = unique[key]
        if isinstance(event, ExecRequested | ExecStarted):
            last[(event.workspace, event.payload.exec_id)] = event
        elif isinstance(event, ExecFinished):
            last[(event.workspace, event.payload.exec_id)] = None
    opened = [e for e in last.values() if e is not None and e.payload.node == node]
    return sorted(opened, key=lambda e: (e.workspace, e.seq))


def open_execution(opening: Opening) -> OpenExecution:
    """The open run whose last known lifecycle event is ``opening`` (its output numbering
    unknown: no stderr note)."""
    return OpenExecution(
        workspace=opening.workspace,
        exec_id=opening.payload.exec_id,
        started=isinstance(opening, ExecStarted),
        seq=opening.seq,
        event_id=opening.id,
    )


class Interruption(msgspec.Struct, frozen=True, kw_only=True):
    """Why the runs are closed: ``message`` (the diagnostic of a run that had started),
    ``unstarted`` (the diagnostic of one accepted but never started: it did not run), ``note``
    (the stderr line of a started run), ``node`` (the node that ran them, when known) and
    ``closed_by`` (the node writing the closing events)."""

    message: str
    unstarted: str
    note: bytes
    closed_by: str
    node: str | None = None


def restart_interruption(closed_by: str) -> Interruption:
    """A hub that restarted under its own executions."""
    return Interruption(
        message="interrupted when the hub restarted; output journaled before the restart is kept",
        unstarted="the hub restarted before this started; it did not run",
        note=b"interrupted when the hub restarted\n",
        closed_by=closed_by,
    )


def node_death_interruption(node: str, closed_by: str) -> Interruption:
    """A node (``node``) that died under its executions, closed by a survivor."""
    return Interruption(
        message=f"node {node} stopped while this ran; closed by node {closed_by}",
        unstarted=f"node {node} stopped before this started; it did not run; closed by node "
        f"{closed_by}",
        note=f"interrupted when node {node} stopped\n".encode(),
        node=node,
        closed_by=closed_by,
    )


def interrupted_drafts(run: OpenExecution, why: Interruption) -> list[Event]:
    """The drafts that close ``run`` as ``failed/interrupted`` (see the module docstring)."""
    closing_id = closing_event_id(run.workspace, run.exec_id, run.seq)
    drafts: list[Event] = []
    if run.started and run.next_n is not None:
        drafts.append(
            ExecOutput(
                id=str(uuid.uuid5(_NAMESPACE, closing_id + _NOTE_SUFFIX)),
                causation_id=run.event_id,
                payload=ExecOutputPayload(run.exec_id, "stderr", run.next_n, why.note),
            )
        )
    diagnostic: dict[str, Any] = {
        "level": "error",
        "code": INTERRUPTED_CODE,
        "message": why.message if run.started else why.unstarted,
    }
    if why.node is not None:
        diagnostic["node"] = why.node
    diagnostic["closedBy"] = why.closed_by
    drafts.append(
        ExecFinished(
            id=closing_id,
            causation_id=run.event_id,
            payload=ExecFinishedPayload(
                exec_id=run.exec_id,
                status="failed",
                reason="interrupted",
                exit_code=-1,
                diagnostics=[diagnostic],
            ),
        )
    )
    return drafts
