"""The reading position in one workspace's log, shared by every "history, then live" reader.

A reader that takes events from two sources (the store's history, and the live batches
:class:`hub.workspaces.Workspaces` announces) must never yield one twice nor skip one. Both
the fan-out's subscriptions (:mod:`hub.server.fanout`) and the log follower
(:mod:`hub.follow`) keep a :class:`SeqCursor` and ask it what the next event is:

* :data:`DUPLICATE` (at or below the cursor): already yielded, by the other source; skip it;
* :data:`NEXT` (exactly one past it): yield it, then :meth:`SeqCursor.advance`;
* :data:`GAP` (further on): something between was not seen here; the reader must go back to
  the log (the follower reads the store; a subscription is closed with 4408, naming the
  cursor, and its client resumes from the log).

The Python client's resume cursor (:class:`hub.core.wire.client.ResumeCursor`) is the same
cursor on the other side of the wire, with :data:`UNSTARTED` before its subscription is
confirmed.

Pure: plain integers, no I/O.
"""

from __future__ import annotations

import enum
from typing import Final

__all__ = ["DUPLICATE", "GAP", "NEXT", "UNSTARTED", "SeqCursor", "Step"]


class Step(enum.Enum):
    """What an event is to a cursor: see the module docstring."""

    DUPLICATE = "duplicate"
    NEXT = "next"
    GAP = "gap"
    UNSTARTED = "unstarted"
    """The reader does not know where it stands yet (a client before ``subscribed``)."""


DUPLICATE: Final = Step.DUPLICATE
NEXT: Final = Step.NEXT
GAP: Final = Step.GAP
UNSTARTED: Final = Step.UNSTARTED


class SeqCursor:
    """``last``: the seq of the last event the reader yielded (0: none yet)."""

    __slots__ = ("last",)

    def __init__(self, last: int = 0) -> None:
        self.last = last

    def step(self, seq: int) -> Step:
        """What the event at ``seq`` is to this cursor (it does not move)."""
        last = self.last
        if seq <= last:
            return DUPLICATE
        return NEXT if seq == last + 1 else GAP

    def advance(self, seq: int) -> None:
        """The event at ``seq`` was yielded."""
        self.last = seq

    def __repr__(self) -> str:
        return f"SeqCursor(last={self.last})"
