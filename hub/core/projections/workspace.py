"""The workspace projection: files, artifacts, members, work items, executions, messages. Pure.

:func:`evolve` folds one stored event into a :class:`WorkspaceState`; :func:`rebuild` folds a
whole history. Both are deterministic (the same events give the same state), do no I/O and
never raise on a stored event: the log is the truth, so a fold cannot refuse what is in it.
Rules that may refuse (ownership, ``baseRev``, terminal work items) run *before* append, in
:mod:`hub.core.rules.decide`; an event that reached the log around them (an import) is folded
leniently (an illegal work-item or execution move leaves the status as it was).

Performance decision: **evolve updates the state it is given in place and returns it.**
Replay must fold at least 1M events/s on 2 cores, decoding included; copying the state (or
even one dict) per event would make that impossible. Callers that need to keep a version call
:meth:`WorkspaceState.clone` (a deep copy: frozen entries are shared, mutable ones copied).
Per-event work is one dict lookup on the event's type plus the handler: ``messagePosted``
increments a counter; ``execOutput`` only advances ``seq``.

Replay (:func:`fold_stored`, what loading from a store uses) takes a page of stored bodies as
one JSON array and decodes it into :mod:`hub.core.projections.views` (only the fields the
handlers read) rather than into events: decoding the envelope's ids and hashes and a message's
text was most of a replay's cost. The same handlers fold views and events.

Files: ``rev`` starts at 1 and grows by one on every write and move; a deleted file disappears
(writing it again starts at rev 1). ``fileMoved`` carries the entry over with ``rev + 1`` (if it
lands on an existing entry, which decide refuses, ``max(rev) + 1``). Content up to the blob
threshold is inline (``text`` or ``base64``); above it the entry carries ``blob`` (a sha256).
The hub fills ``sha256``/``size``; when an event lacks them they are computed here (for a blob
reference without ``size`` the size is ``-1``, unknown).
"""

from __future__ import annotations

import base64
import binascii
import copy
import hashlib
import itertools
from collections.abc import Callable, Iterable
from typing import Any, Final

import msgspec

from hub.core.events import (
    ArtifactPublished,
    Blocked,
    Completed,
    Event,
    ExecDisposed,
    ExecFinished,
    ExecRequested,
    ExecStarted,
    FeedbackProvided,
    FeedbackRequested,
    FileDeleted,
    FileMoved,
    FileWritten,
    FileWrittenPayload,
    MemberJoined,
    MemberLeft,
    MessagePosted,
    NeedWork,
    WorkCancelled,
    WorkClaimed,
    WorkPublished,
)
from hub.core.projections.executions import EXEC_LIFECYCLE, ExecStatus, exec_phase
from hub.core.projections.views import (
    VIEWS,
    ArtifactPublishedView,
    EventView,
    ExecDisposedView,
    ExecFinishedView,
    ExecRequestedView,
    ExecStartedView,
    FileDeletedView,
    FileMovedView,
    FileWrittenView,
    MemberJoinedView,
    MemberLeftView,
    MessagePostedView,
    WorkView,
    decode_views,
)
from hub.core.records import JoinedPage
from hub.core.rules.work import WORK_LIFECYCLE, WorkStatus

__all__ = [
    "ArtifactEntry",
    "ExecSummary",
    "FileEntry",
    "Member",
    "WorkItem",
    "WorkspaceState",
    "evolve",
    "fold",
    "fold_stored",
    "rebuild",
]


class FileEntry(msgspec.Struct, frozen=True, rename="camel", omit_defaults=True):
    """One file. Exactly one of ``text``, ``base64``, ``blob`` holds (or names) the content.

    Frozen: a change replaces the entry, so :meth:`WorkspaceState.clone` can share it.
    """

    rev: int
    sha256: str
    size: int
    producer: str
    seq: int
    text: str | None = None
    base64: str | None = None
    blob: str | None = None
    media_type: str | None = None


class ArtifactEntry(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    """The latest ``artifactPublished`` under one key."""

    media_type: str
    size_bytes: int
    sha256: str
    blob: str
    producer: str
    seq: int
    exec_id: str | None = None


class Member(msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True):
    """An agent that joined the workspace; ``present`` is false after ``memberLeft``."""

    present: bool
    joined_seq: int
    via: str = "websocket"
    card_url: str | None = None


class WorkItem(msgspec.Struct, kw_only=True, rename="camel", omit_defaults=True):
    """Everything sharing one correlationId (mutable: :func:`evolve` updates it in place).

    ``requester`` is the producer of the item's first event (usually ``needWork``); ``owner``
    the producer of the last ``workClaimed``; ``consumer``/``topic`` the first ones seen.
    """

    status: WorkStatus
    requester: str
    owner: str | None = None
    consumer: str | None = None
    topic: str | None = None
    opened_seq: int
    updated_seq: int
    last_kind: str
    last_producer: str


class ExecSummary(msgspec.Struct, kw_only=True, rename="camel", omit_defaults=True):
    """One execution as the workspace sees it; the full record is in the execution journal."""

    status: ExecStatus
    backend: str
    requested_by: str
    reason: str | None = None
    exit_code: int | None = None
    disposed: bool = False


class WorkspaceState(msgspec.Struct, kw_only=True, rename="camel"):
    """The fold of one workspace's log up to ``seq`` (the last folded event's seq)."""

    workspace: str
    seq: int = 0
    files: dict[str, FileEntry] = {}
    artifacts: dict[str, ArtifactEntry] = {}
    members: dict[str, Member] = {}
    work_items: dict[str, WorkItem] = {}
    executions: dict[str, ExecSummary] = {}
    messages: int = 0

    def clone(self) -> WorkspaceState:
        """A deep copy: later :func:`evolve` calls on either leave the other unchanged."""
        return WorkspaceState(
            workspace=self.workspace,
            seq=self.seq,
            files=dict(self.files),
            artifacts=dict(self.artifacts),
            members=dict(self.members),
            work_items={k: copy.copy(v) for k, v in self.work_items.items()},
            executions={k: copy.copy(v) for k, v in self.executions.items()},
            messages=self.messages,
        )


# ---------------------------------------------------------------------------------------------
# Handlers: one per kind, each mutating the state; evolve sets ``seq``.


def _message(state: WorkspaceState, ev: MessagePosted | MessagePostedView) -> None:
    state.messages += 1


def _digest(p: FileWrittenPayload) -> tuple[str, int]:
    """sha256 and size of a ``fileWritten`` payload, computing what the hub did not fill."""
    if p.blob is not None:
        return p.sha256 or p.blob, -1 if p.size is None else p.size
    if p.text is not None:
        data = p.text.encode("utf-8", "surrogatepass")
    elif p.base64 is not None:
        try:
            data = base64.b64decode(p.base64, validate=True)
        except (binascii.Error, ValueError):  # not in a validated log; hash what is there
            data = p.base64.encode()
    else:
        data = b""
    return p.sha256 or hashlib.sha256(data).hexdigest(), len(data) if p.size is None else p.size


def _file_written(state: WorkspaceState, ev: FileWritten | FileWrittenView) -> None:
    p = ev.payload
    sha, size = (p.sha256, p.size) if p.sha256 is not None and p.size is not None else _digest(p)
    files = state.files
    old = files.get(p.path)
    files[p.path] = FileEntry(
        1 if old is None else old.rev + 1,
        sha,
        size,
        ev.producer,
        ev.seq,
        p.text,
        p.base64,
        p.blob,
        p.media_type,
    )


def _file_deleted(state: WorkspaceState, ev: FileDeleted | FileDeletedView) -> None:
    state.files.pop(ev.payload.path, None)


def _file_moved(state: WorkspaceState, ev: FileMoved | FileMovedView) -> None:
    p = ev.payload
    files = state.files
    entry = files.pop(p.from_, None)
    if entry is None:
        return
    landed_on = files.get(p.to)
    rev = entry.rev if landed_on is None else max(entry.rev, landed_on.rev)
    files[p.to] = msgspec.structs.replace(entry, rev=rev + 1, producer=ev.producer, seq=ev.seq)


def _artifact(state: WorkspaceState, ev: ArtifactPublished | ArtifactPublishedView) -> None:
    p = ev.payload
    state.artifacts[p.key] = ArtifactEntry(
        media_type=p.media_type,
        size_bytes=p.size_bytes,
        sha256=p.sha256,
        blob=p.blob,
        producer=ev.producer,
        seq=ev.seq,
        exec_id=p.exec_id,
    )


def _member_joined(state: WorkspaceState, ev: MemberJoined | MemberJoinedView) -> None:
    p = ev.payload
    state.members[p.agent] = Member(present=True, joined_seq=ev.seq, via=p.via, card_url=p.card_url)


def _member_left(state: WorkspaceState, ev: MemberLeft | MemberLeftView) -> None:
    p = ev.payload
    old = state.members.get(p.agent)
    if old is None:
        state.members[p.agent] = Member(present=False, joined_seq=0, via=p.via)
    elif old.present:
        state.members[p.agent] = msgspec.structs.replace(old, present=False)


def _work(state: WorkspaceState, ev: Event | WorkView) -> None:
    cid = ev.correlation_id
    if cid is None:
        return
    kind = ev.kind
    item = state.work_items.get(cid)
    if item is None:
        status = WORK_LIFECYCLE.table[None].get(kind)
        if status is None:
            return
        state.work_items[cid] = WorkItem(
            status=status,
            requester=ev.producer,
            owner=ev.producer if kind == "workClaimed" else None,
            consumer=ev.consumer,
            topic=ev.topic,
            opened_seq=ev.seq,
            updated_seq=ev.seq,
            last_kind=kind,
            last_producer=ev.producer,
        )
        return
    nxt = WORK_LIFECYCLE.table[item.status].get(kind)
    if nxt is not None:
        item.status = nxt
        if kind == "workClaimed":
            item.owner = ev.producer
    item.updated_seq = ev.seq
    item.last_kind = kind
    item.last_producer = ev.producer
    if item.consumer is None:
        item.consumer = ev.consumer
    if item.topic is None:
        item.topic = ev.topic


def _exec_requested(state: WorkspaceState, ev: ExecRequested | ExecRequestedView) -> None:
    p = ev.payload
    old = state.executions.get(p.exec_id)
    if old is None or old.disposed:
        state.executions[p.exec_id] = ExecSummary(
            status="requested", backend=p.backend, requested_by=ev.producer
        )


def _exec_started(state: WorkspaceState, ev: ExecStarted | ExecStartedView) -> None:
    s = state.executions.get(ev.payload.exec_id)
    if s is not None and EXEC_LIFECYCLE.allows(exec_phase(s.status, s.disposed), "execStarted"):
        s.status = "running"
        s.backend = ev.payload.backend


def _exec_finished(state: WorkspaceState, ev: ExecFinished | ExecFinishedView) -> None:
    p = ev.payload
    s = state.executions.get(p.exec_id)
    if s is not None and EXEC_LIFECYCLE.allows(exec_phase(s.status, s.disposed), "execFinished"):
        s.status = p.status
        s.reason = p.reason
        s.exit_code = p.exit_code


def _exec_disposed(state: WorkspaceState, ev: ExecDisposed | ExecDisposedView) -> None:
    s = state.executions.get(ev.payload.exec_id)
    if s is not None and EXEC_LIFECYCLE.allows(exec_phase(s.status, s.disposed), "execDisposed"):
        s.disposed = True


# execOutput and execCancelRequested change nothing here (the journal keeps them).
_HANDLERS: Final[dict[type[Event], Callable[[WorkspaceState, Any], None]]] = {
    MessagePosted: _message,
    FileWritten: _file_written,
    FileDeleted: _file_deleted,
    FileMoved: _file_moved,
    ArtifactPublished: _artifact,
    MemberJoined: _member_joined,
    MemberLeft: _member_left,
    NeedWork: _work,
    WorkClaimed: _work,
    WorkPublished: _work,
    FeedbackRequested: _work,
    FeedbackProvided: _work,
    Blocked: _work,
    Completed: _work,
    WorkCancelled: _work,
    ExecRequested: _exec_requested,
    ExecStarted: _exec_started,
    ExecFinished: _exec_finished,
    ExecDisposed: _exec_disposed,
}


def evolve(state: WorkspaceState, event: Event) -> WorkspaceState:
    """Fold one stored event into ``state`` **in place** and return it. Never raises.

    ``event`` must be the event after ``state.seq`` in the same workspace (not checked: this
    is the replay hot path). Use ``state.clone()`` first to keep the previous version.
    """
    handler = _HANDLERS.get(type(event))
    if handler is not None:
        handler(state, event)
    state.seq = event.seq
    return state


def rebuild(events: Iterable[Event], workspace: str) -> WorkspaceState:
    """The state after folding ``events`` (in seq order) into an empty workspace."""
    return fold(WorkspaceState(workspace=workspace), events)


def fold(state: WorkspaceState, events: Iterable[Event]) -> WorkspaceState:
    """:func:`evolve` every event of ``events`` into ``state`` (in place); return it."""
    get = _HANDLERS.get
    last = state.seq
    for ev in events:
        handler = get(type(ev))
        if handler is not None:
            handler(state, ev)
        last = ev.seq
    state.seq = last
    return state


# The views' handlers: the same functions as the events' (a view has the fields they read).
_VIEW_HANDLERS: Final[dict[type[EventView], Callable[[WorkspaceState, Any], None]]] = {
    VIEWS[t.kind]: handler for t, handler in _HANDLERS.items()
}
_UNDECODABLE: Final = (msgspec.DecodeError, msgspec.ValidationError, RecursionError)


def fold_stored(state: WorkspaceState, page: JoinedPage) -> bool:
    """Fold a page of stored events (the JSON array of their bodies) into ``state`` in place,
    decoding only what the fold reads (:mod:`hub.core.projections.views`): the replay path.
    The state is the one :func:`fold` gives from the same events decoded in full.

    All or nothing: it returns False and leaves ``state`` as it was when the body does not
    decode into ``page.count`` events with increasing seqs after ``state.seq`` ending at
    ``page.last_seq`` (a damaged row, a kind this version does not know, a store that
    miscounted); the caller then reads those events in full, which names a damaged row.
    Never raises.
    """
    try:
        views = decode_views(page.body)
    except _UNDECODABLE:
        return False
    if len(views) != page.count:
        return False
    if not views:
        return True
    seqs = [v.seq for v in views]
    first = seqs[0]
    if first <= state.seq or seqs[-1] != page.last_seq:
        return False
    # A workspace's seqs are contiguous, so one comparison in C settles the order; a gap
    # (which no store writes) is still accepted if the seqs increase.
    if seqs != list(range(first, first + len(seqs))) and any(
        a >= b for a, b in itertools.pairwise(seqs)
    ):
        return False
    get = _VIEW_HANDLERS.get
    messages = 0
    for view in views:
        kind = type(view)
        if kind is MessagePostedView:  # most of a log: counted here, without a call
            messages += 1
            continue
        handler = get(kind)
        if handler is not None:
            handler(state, view)
    state.messages += messages
    state.seq = page.last_seq
    return True
