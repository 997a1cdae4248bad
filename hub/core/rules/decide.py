"""The decide rules: may this batch of drafts be appended to this workspace? Pure.

:func:`decide` checks a batch against the current :class:`WorkspaceState` without changing it.
Later drafts in the batch see the effects of earlier ones through a small overlay of the files
and work items the batch touched (no clone of the state). The first bad draft raises; the
error's ``details['index']`` is its position in the batch (0-based).

Rules (docs/events.md, "Decide rules"):

- Work items (collaboration kinds with a ``correlationId``; others are not checked):
  the move must be in the work-item table (completed/cancelled are terminal) →
  :class:`~hub.core.rules.lifecycle.IllegalTransition` (a ``Conflict``); ``workClaimed`` on an
  item owned by someone else → ``Conflict``; ``workPublished``/``completed`` on an owned item by
  a non-owner → ``Forbidden``; ``workCancelled`` by neither the requester nor the owner →
  ``Forbidden``.
- Files: ``baseRev`` omitted = no check (last writer wins); ``baseRev: 0`` = the file must not
  exist; otherwise it must equal the file's current ``rev`` → ``Conflict`` with details
  ``{path, baseRev, rev}`` (``rev`` 0 = absent). ``fileDeleted``/``fileMoved`` of a missing
  file → ``NotFound``; ``fileMoved`` onto an existing path → ``Conflict`` (delete or overwrite
  it first: a move never silently replaces a file). The workspace is a tree: creating a path
  (a write or a move's target) whose parent is a file, or that is a directory (a file lies
  below it), → ``Conflict`` with details ``{path, clash}``.
- Hub-only kinds (presence, ``exec*``) are not checked here: the server and the runtime write
  them. Field validation (paths, sizes) is :func:`hub.core.validation.validate_draft`'s job.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Final

from hub.core.errors import Conflict, Forbidden, NotFound
from hub.core.events import (
    COLLABORATION_KINDS,
    Event,
    FileDeleted,
    FileMoved,
    FileWritten,
)
from hub.core.projections.workspace import WorkspaceState
from hub.core.rules.work import WORK_LIFECYCLE, WorkStatus

__all__ = ["FILE_KINDS", "decide", "kinds_read", "reads_state"]

FILE_KINDS: Final = frozenset({FileWritten.kind, FileDeleted.kind, FileMoved.kind})
"""The kinds whose fold changes the files :func:`decide` reads."""

_OWNER_ONLY: Final = frozenset({"workPublished", "completed"})


class _Item:
    """What decide needs of a work item: status, requester, owner."""

    __slots__ = ("owner", "requester", "status")

    def __init__(self, status: WorkStatus, requester: str, owner: str | None) -> None:
        self.status: WorkStatus = status
        self.requester = requester
        self.owner = owner


class _Overlay:
    """The state as the batch has changed it so far: touched file revs and work items."""

    __slots__ = ("files", "items", "state")

    def __init__(self, state: WorkspaceState) -> None:
        self.state = state
        self.files: dict[str, int] = {}  # path -> rev, 0 = absent
        self.items: dict[str, _Item] = {}

    def rev(self, path: str) -> int:
        rev = self.files.get(path)
        if rev is not None:
            return rev
        entry = self.state.files.get(path)
        return 0 if entry is None else entry.rev

    def check_tree(self, path: str, index: int) -> None:
        """Raise :class:`Conflict` if a new file at ``path`` would make the workspace no longer a
        tree: a parent of ``path`` is a file, or ``path`` is a directory (a file lies below it).
        Checked only when a path is created, so it costs nothing for rewrites of a file."""
        parts = path.split("/")
        for end in range(1, len(parts)):
            parent = "/".join(parts[:end])
            if self.rev(parent) != 0:
                raise Conflict(
                    f"cannot create {path!r}: {parent!r} is a file",
                    path=path,
                    clash=parent,
                    index=index,
                )
        below = path + "/"
        # A linear scan, only when a path is created (a directory index would make the state
        # reply and the snapshot format larger; see docs/events.md, "The workspace is a tree").
        clash = next((k for k, rev in self.files.items() if rev and k.startswith(below)), None)
        if clash is None:
            clash = next(
                (k for k in self.state.files if k.startswith(below) and self.rev(k) != 0), None
            )
        if clash is not None:
            raise Conflict(
                f"cannot create {path!r}: it is a directory (it holds {clash!r})",
                path=path,
                clash=clash,
                index=index,
            )

    def item(self, cid: str) -> _Item | None:
        item = self.items.get(cid)
        if item is None:
            w = self.state.work_items.get(cid)
            if w is not None:
                item = self.items[cid] = _Item(w.status, w.requester, w.owner)
        return item


def decide(state: WorkspaceState, drafts: Sequence[Event], producer: str) -> None:
    """Check ``drafts`` (to be written by ``producer``, in order) against ``state``.

    Does not mutate ``state``. Raises, for the first bad draft (``details['index']``):
    :class:`~hub.core.rules.lifecycle.IllegalTransition` or :class:`hub.core.errors.Conflict`
    (terminal work item, item claimed by another agent, stale ``baseRev``, move onto an
    existing path), :class:`hub.core.errors.Forbidden` (publish/complete by a non-owner, cancel by
    neither requester nor owner), :class:`hub.core.errors.NotFound` (delete/move of a missing file).
    """
    overlay = _Overlay(state)
    for index, draft in enumerate(drafts):
        match draft:
            case FileWritten(payload=p):
                rev = overlay.rev(p.path)
                _check_base_rev(p.path, p.base_rev, rev, index)
                if rev == 0:
                    overlay.check_tree(p.path, index)
                overlay.files[p.path] = rev + 1
            case FileDeleted(payload=p):
                rev = overlay.rev(p.path)
                if rev == 0:
                    raise NotFound(f"no file {p.path!r} to delete", path=p.path, index=index)
                _check_base_rev(p.path, p.base_rev, rev, index)
                overlay.files[p.path] = 0
            case FileMoved(payload=p):
                rev = overlay.rev(p.from_)
                if rev == 0:
                    raise NotFound(f"no file {p.from_!r} to move", path=p.from_, index=index)
                _check_base_rev(p.from_, p.base_rev, rev, index)
                target = overlay.rev(p.to)
                if target != 0:
                    raise Conflict(
                        f"cannot move {p.from_!r} onto existing file {p.to!r}",
                        path=p.to,
                        rev=target,
                        index=index,
                    )
                overlay.files[p.from_] = 0
                overlay.check_tree(p.to, index)
                overlay.files[p.to] = rev + 1
            case _ if draft.kind in COLLABORATION_KINDS and draft.correlation_id is not None:
                _decide_work(overlay, draft.kind, draft.correlation_id, producer, index)
            case _:
                pass


def reads_state(drafts: Sequence[Event]) -> bool:
    """Whether :func:`decide` reads the state for ``drafts``: file changes (a new path must keep
    the workspace a tree; ``baseRev``), deletes, moves and work-item moves. Every other draft
    (messages, artifacts, the hub's own kinds) is accepted whatever precedes it, so it may land
    after events another writer appended meanwhile without being decided again."""
    return bool(kinds_read(drafts))


def kinds_read(drafts: Sequence[Event]) -> frozenset[str]:
    """The kinds of events that can change what :func:`decide` reads for ``drafts``: the file
    kinds for a file change (the files, and the tree they make), the collaboration kinds for a
    work-item move (the items). Empty when it reads nothing. A batch decided on a state is
    still decided right after any events of *other* kinds (a flood of messages from another
    node): the store may append it after them (:meth:`hub.log.base.EventStore.append`'s
    ``reads``) instead of refusing it as stale."""
    files = work = False
    for draft in drafts:
        match draft:
            case FileWritten() | FileDeleted() | FileMoved():
                files = True
            case _ if draft.kind in COLLABORATION_KINDS and draft.correlation_id is not None:
                work = True
    if files and work:
        return FILE_KINDS | COLLABORATION_KINDS
    return FILE_KINDS if files else COLLABORATION_KINDS if work else frozenset()


def _check_base_rev(path: str, base_rev: int | None, rev: int, index: int) -> None:
    if base_rev is None or base_rev == rev:
        return
    if base_rev == 0:
        message = f"file {path!r} already exists (rev {rev}); baseRev 0 means it must not"
    elif rev == 0:
        message = f"file {path!r} does not exist; baseRev is {base_rev}"
    else:
        message = f"file {path!r} is at rev {rev}, not baseRev {base_rev}"
    raise Conflict(message, path=path, baseRev=base_rev, rev=rev, index=index)


def _decide_work(overlay: _Overlay, kind: str, cid: str, producer: str, index: int) -> None:
    item = overlay.item(cid)
    status = WORK_LIFECYCLE.next(
        None if item is None else item.status, kind, correlationId=cid, index=index
    )
    if item is None:
        overlay.items[cid] = _Item(status, producer, producer if kind == "workClaimed" else None)
        return
    owner = item.owner
    if kind == "workClaimed":
        if owner is not None and owner != producer:
            raise Conflict(
                f"work item {cid!r} is already claimed by {owner!r}",
                correlationId=cid,
                owner=owner,
                index=index,
            )
        item.owner = producer
    elif kind in _OWNER_ONLY:
        if owner is not None and owner != producer:
            raise Forbidden(
                f"only the owner {owner!r} may send {kind} on work item {cid!r}",
                correlationId=cid,
                owner=owner,
                index=index,
            )
    elif kind == "workCancelled" and producer != item.requester and producer != owner:
        raise Forbidden(
            f"only the requester {item.requester!r} or the owner may cancel work item {cid!r}",
            correlationId=cid,
            requester=item.requester,
            owner=owner,
            index=index,
        )
    item.status = status
