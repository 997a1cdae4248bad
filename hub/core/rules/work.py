"""The work-item lifecycle: one transition table over the collaboration kinds. Pure.

A work item is everything sharing one ``correlationId``. Its status follows the table below
(``state -> kind -> next``); :func:`work_state_diagram` renders it for docs/events.md.

Permissive where adk-code is: any collaboration kind carrying a correlationId not seen before
opens the item implicitly (adk-code agents do not always start with ``needWork``), and while
the item is active every kind is allowed (a repeated ``needWork`` changes nothing). Strict where
it matters: ``completed`` and ``cancelled`` are terminal; any move out of them raises
:class:`~hub.core.rules.lifecycle.IllegalTransition` (a :class:`hub.core.errors.Conflict`).
Ownership rules (who may claim, publish, complete, cancel) are in :mod:`hub.core.rules.decide`.
Events without a correlationId do not touch work items.
"""

from __future__ import annotations

from typing import Final, Literal

from hub.core.rules.lifecycle import IllegalTransition, Lifecycle

__all__ = [
    "ACTIVE_STATUSES",
    "TERMINAL_STATUSES",
    "WORK_LIFECYCLE",
    "IllegalTransition",
    "WorkStatus",
    "next_work_status",
    "work_state_diagram",
]

WorkStatus = Literal[
    "requested",
    "claimed",
    "published",
    "feedbackRequested",
    "inProgress",
    "blocked",
    "completed",
    "cancelled",
]

# The status each kind leads to (from a new or an active item).
_TARGET: Final[dict[str, WorkStatus]] = {
    "needWork": "requested",
    "workClaimed": "claimed",
    "workPublished": "published",
    "feedbackRequested": "feedbackRequested",
    "feedbackProvided": "inProgress",
    "blocked": "blocked",
    "completed": "completed",
    "workCancelled": "cancelled",
}

ACTIVE_STATUSES: Final[tuple[WorkStatus, ...]] = (
    "requested",
    "claimed",
    "published",
    "feedbackRequested",
    "inProgress",
    "blocked",
)
TERMINAL_STATUSES: Final[frozenset[WorkStatus]] = frozenset({"completed", "cancelled"})


def _active_moves(status: WorkStatus) -> dict[str, WorkStatus]:
    # A repeated needWork on an item already under way keeps its status.
    return {kind: (status if kind == "needWork" else nxt) for kind, nxt in _TARGET.items()}


_TABLE: Final[dict[WorkStatus | None, dict[str, WorkStatus]]] = {
    None: dict(_TARGET),
    **{status: _active_moves(status) for status in ACTIVE_STATUSES},
    "completed": {},
    "cancelled": {},
}

WORK_LIFECYCLE: Final[Lifecycle[WorkStatus]] = Lifecycle("work item", _TABLE, TERMINAL_STATUSES)


def next_work_status(status: WorkStatus | None, kind: str, correlation_id: str) -> WorkStatus:
    """The status after ``kind``; ``status`` None = the item does not exist yet.

    Raises :class:`IllegalTransition` (``details``: lifecycle, state, kind, correlationId).
    """
    return WORK_LIFECYCLE.next(status, kind, correlationId=correlation_id)


def work_state_diagram() -> str:
    """The work-item lifecycle as a Mermaid ``stateDiagram-v2`` (included in docs/events.md)."""
    return WORK_LIFECYCLE.mermaid()
