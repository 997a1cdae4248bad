"""The execution lifecycle table and the execution journal projection. Pure.

Lifecycle (one table, :data:`EXEC_LIFECYCLE`, over *phases*)::

    (none) --execRequested--> requested --execStarted--> running --execFinished--> finished
    requested/running --execCancelRequested--> (same)      running --execOutput--> running
    requested --execFinished--> finished (refused or cancelled before it started)
    finished --execDisposed--> disposed --execRequested--> requested (the id is free again)

A finished execution's ``status`` is the ``execFinished`` payload's (``completed``, ``failed``
or ``cancelled``); :func:`exec_phase` maps a record's status and ``disposed`` flag back to the
phase the table speaks of.

:class:`ExecJournal` keeps every execution's record with its output chunks and result; the
runtime serves ``getExec``/``execResult`` from it and, after a restart, closes the executions
:func:`open_executions` returns. Like the workspace fold, :func:`evolve` updates the journal in
place and returns it (see :mod:`hub.core.projections.workspace` for why); it never raises on a
stored
event: a move the table lacks (only possible for events written around the runtime) is ignored.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Final, Literal

import msgspec

from hub.core.events import (
    Event,
    ExecCancelRequested,
    ExecDisposed,
    ExecFinished,
    ExecFinishedPayload,
    ExecOutput,
    ExecRequested,
    ExecRequestedPayload,
    ExecStarted,
)
from hub.core.rules.lifecycle import IllegalTransition, Lifecycle

__all__ = [
    "EXEC_LIFECYCLE",
    "ExecJournal",
    "ExecPhase",
    "ExecRecord",
    "ExecStatus",
    "IllegalTransition",
    "JournalChunk",
    "evolve",
    "exec_phase",
    "exec_state_diagram",
    "next_exec_phase",
    "open_executions",
    "rebuild",
]

ExecStatus = Literal["requested", "running", "completed", "failed", "cancelled"]
ExecPhase = Literal["requested", "running", "finished", "disposed"]
FINISHED_STATUSES: Final[frozenset[str]] = frozenset({"completed", "failed", "cancelled"})

_TABLE: Final[dict[ExecPhase | None, dict[str, ExecPhase]]] = {
    None: {"execRequested": "requested"},
    "requested": {
        "execCancelRequested": "requested",
        "execStarted": "running",
        "execFinished": "finished",
    },
    "running": {
        "execOutput": "running",
        "execCancelRequested": "running",
        "execFinished": "finished",
    },
    "finished": {"execDisposed": "disposed"},
    "disposed": {"execRequested": "requested"},
}

EXEC_LIFECYCLE: Final[Lifecycle[ExecPhase]] = Lifecycle("execution", _TABLE, frozenset())


def exec_phase(status: ExecStatus, disposed: bool) -> ExecPhase:
    """The lifecycle phase of an execution with this status and ``disposed`` flag."""
    if disposed:
        return "disposed"
    if status == "requested" or status == "running":
        return status
    return "finished"


def next_exec_phase(phase: ExecPhase | None, kind: str, exec_id: str) -> ExecPhase:
    """The phase after ``kind`` (``phase`` None = unknown id).

    Raises :class:`IllegalTransition` (``details``: lifecycle, state, kind, execId).
    """
    return EXEC_LIFECYCLE.next(phase, kind, execId=exec_id)


def exec_state_diagram() -> str:
    """The execution lifecycle as a Mermaid ``stateDiagram-v2`` (included in docs/events.md)."""
    return EXEC_LIFECYCLE.mermaid()


# ---------------------------------------------------------------------------------------------
# The journal


class JournalChunk(msgspec.Struct, frozen=True, rename="camel"):
    """One ``execOutput`` chunk: ``n`` is 1-based and contiguous per execution."""

    stream: Literal["stdout", "stderr"]
    n: int
    data: bytes
    seq: int


class ExecRecord(msgspec.Struct, kw_only=True, rename="camel", omit_defaults=True):
    """Everything the log says about one execution (mutable: :func:`evolve` updates it)."""

    exec_id: str
    status: ExecStatus = "requested"
    backend: str
    requested_by: str
    request_seq: int
    request: ExecRequestedPayload | None = None
    started_seq: int | None = None
    cancel_requested: bool = False
    output: list[JournalChunk] = []
    result: ExecFinishedPayload | None = None
    finished_seq: int | None = None
    disposed: bool = False

    @property
    def phase(self) -> ExecPhase:
        return exec_phase(self.status, self.disposed)

    def stream_bytes(self, stream: Literal["stdout", "stderr"]) -> bytes:
        """The journaled output of one stream, concatenated."""
        return b"".join(c.data for c in self.output if c.stream == stream)


class ExecJournal(msgspec.Struct, kw_only=True, rename="camel"):
    """Every execution of one workspace, by ``execId``, as of ``seq``."""

    workspace: str
    seq: int = 0
    executions: dict[str, ExecRecord] = {}


def _requested(j: ExecJournal, ev: ExecRequested) -> None:
    p = ev.payload
    old = j.executions.get(p.exec_id)
    if old is not None and not old.disposed:
        return  # the id is taken: a second request is not in the table
    j.executions[p.exec_id] = ExecRecord(
        exec_id=p.exec_id,
        backend=p.backend,
        requested_by=ev.producer,
        request_seq=ev.seq,
        request=p,
    )


def _cancel(j: ExecJournal, ev: ExecCancelRequested) -> None:
    rec = j.executions.get(ev.payload.exec_id)
    if rec is not None and EXEC_LIFECYCLE.allows(rec.phase, "execCancelRequested"):
        rec.cancel_requested = True


def _started(j: ExecJournal, ev: ExecStarted) -> None:
    rec = j.executions.get(ev.payload.exec_id)
    if rec is not None and rec.status == "requested":
        rec.status = "running"
        rec.started_seq = ev.seq
        rec.backend = ev.payload.backend


def _output(j: ExecJournal, ev: ExecOutput) -> None:
    p = ev.payload
    rec = j.executions.get(p.exec_id)
    if rec is not None and rec.status == "running":
        rec.output.append(JournalChunk(p.stream, p.n, p.data, ev.seq))


def _finished(j: ExecJournal, ev: ExecFinished) -> None:
    p = ev.payload
    rec = j.executions.get(p.exec_id)
    if rec is not None and (rec.status == "requested" or rec.status == "running"):
        rec.status = p.status
        rec.result = p
        rec.finished_seq = ev.seq


def _disposed(j: ExecJournal, ev: ExecDisposed) -> None:
    rec = j.executions.get(ev.payload.exec_id)
    if rec is not None and rec.status in FINISHED_STATUSES:
        rec.disposed = True


_HANDLERS: Final[dict[type[Event], Callable[[ExecJournal, Any], None]]] = {
    ExecRequested: _requested,
    ExecCancelRequested: _cancel,
    ExecStarted: _started,
    ExecOutput: _output,
    ExecFinished: _finished,
    ExecDisposed: _disposed,
}


def evolve(journal: ExecJournal, event: Event) -> ExecJournal:
    """Fold one stored event into ``journal`` in place and return it. Never raises.

    Only the ``exec*`` kinds change records; every event advances ``journal.seq``.
    """
    handler = _HANDLERS.get(type(event))
    if handler is not None:
        handler(journal, event)
    journal.seq = event.seq
    return journal


def rebuild(events: Iterable[Event], workspace: str) -> ExecJournal:
    """The journal after folding ``events`` (in seq order) into an empty one."""
    journal = ExecJournal(workspace=workspace)
    get = _HANDLERS.get
    last = 0
    for ev in events:
        handler = get(type(ev))
        if handler is not None:
            handler(journal, ev)
        last = ev.seq
    journal.seq = last
    return journal


def open_executions(journal: ExecJournal, *, include_requested: bool = False) -> list[str]:
    """Ids of executions that started and have no terminal event (in request order).

    With ``include_requested``, also those requested but never started. After a restart the
    runtime closes these as ``failed``/``interrupted``.
    """
    return [
        rec.exec_id
        for rec in journal.executions.values()
        if rec.status == "running" or (include_requested and rec.status == "requested")
    ]
