"""Loading projections from an :class:`~hub.log.base.EventStore`: the one I/O module here.

:func:`load_state` starts from the newest usable snapshot at or before ``at_seq`` and folds the
tail of the log; :func:`rebuild_state` ignores snapshots. Both give the same state (snapshots
are disposable caches). :func:`save_snapshot_if_due` writes one about every ``every`` events.
"""

from __future__ import annotations

import contextlib
from typing import Final

from hub.core.projections.executions import ExecJournal
from hub.core.projections.executions import evolve as evolve_journal
from hub.core.projections.snapshots import (
    SNAPSHOT_NAME,
    SNAPSHOT_VERSION,
    from_snapshot,
    to_snapshot,
)
from hub.core.projections.workspace import WorkspaceState, fold, fold_stored
from hub.log.base import EventStore

__all__ = ["fold_log", "load_journal", "load_state", "rebuild_state", "save_snapshot_if_due"]

READ_BATCH: Final = 5000


async def load_state(
    store: EventStore,
    workspace: str,
    *,
    at_seq: int | None = None,
    use_snapshots: bool = True,
) -> WorkspaceState:
    """The workspace's state as of ``at_seq`` (None = the head; beyond the head = the head).

    Uses the newest snapshot with ``seq <= at_seq`` (one of another version, or that fails to
    decode, is ignored) plus the events after it. An unknown workspace gives an empty state.
    Raises only what the store raises.
    """
    state: WorkspaceState | None = None
    if use_snapshots and (at_seq is None or at_seq > 0):
        snap = await store.load_snapshot(
            workspace, SNAPSHOT_NAME, SNAPSHOT_VERSION, at_or_before=at_seq
        )
        if snap is not None and (at_seq is None or snap.seq <= at_seq):
            state = from_snapshot(snap, workspace)
    if state is None:
        state = WorkspaceState(workspace=workspace)
    if at_seq is not None and at_seq <= state.seq:
        return state
    return await fold_log(store, state, until_seq=at_seq)


async def fold_log(
    store: EventStore, state: WorkspaceState, *, until_seq: int | None = None
) -> WorkspaceState:
    """Fold the log of ``state.workspace`` after ``state.seq`` (up to ``until_seq``) into
    ``state``, which is returned. Raises only what the store raises."""
    # Read ahead (EventStore.joined_pages): the next page is fetched while this one is folded,
    # and a page is decoded only as far as the fold reads it.
    async with contextlib.aclosing(
        store.joined_pages(
            state.workspace, after_seq=state.seq, until_seq=until_seq, batch=READ_BATCH
        )
    ) as pages:
        async for page in pages:
            if not fold_stored(state, page):
                # Not the events the store counted (a damaged row, a kind this version does
                # not know): the same range decoded in full, which names a damaged row.
                await _fold_events(store, state, page.last_seq)
    return state


async def _fold_events(store: EventStore, state: WorkspaceState, until_seq: int) -> None:
    async with contextlib.aclosing(
        store.pages(state.workspace, after_seq=state.seq, until_seq=until_seq, batch=READ_BATCH)
    ) as pages:
        async for page in pages:
            fold(state, page)


async def rebuild_state(
    store: EventStore, workspace: str, at_seq: int | None = None
) -> WorkspaceState:
    """The state folded from the first event, ignoring snapshots (for audit and tests)."""
    return await load_state(store, workspace, at_seq=at_seq, use_snapshots=False)


async def save_snapshot_if_due(
    store: EventStore, state: WorkspaceState, every: int, saved: dict[str, int]
) -> bool:
    """Save a snapshot of ``state`` if its seq passed a multiple of ``every`` since the
    workspace's last snapshot (so batches that straddle a multiple still get one); return
    whether it saved. The encoding itself is synchronous, so a state that evolves while this
    awaits still gives a consistent snapshot (at the seq it has then).

    ``saved``: the caller's record of the seq of the last snapshot ``store`` holds per
    workspace (read from the store on a miss, updated here), which saves a store round trip
    per check. Only a hint: a wrong value costs one extra or one late snapshot, never a wrong
    state.

    Raises ``ValueError`` if ``every < 1``; otherwise only what the store raises.
    """
    if every < 1:
        raise ValueError("every must be >= 1")
    if state.seq < every:
        return False
    last = saved.get(state.workspace)
    if last is None:
        snap = await store.load_snapshot(state.workspace, SNAPSHOT_NAME, SNAPSHOT_VERSION)
        last = saved[state.workspace] = 0 if snap is None else snap.seq
    if state.seq // every <= last // every:
        return False
    snapshot = to_snapshot(state)
    await store.save_snapshot(snapshot)
    saved[state.workspace] = snapshot.seq
    return True


async def load_journal(store: EventStore, workspace: str, at_seq: int | None = None) -> ExecJournal:
    """The execution journal as of ``at_seq`` (None = the head), folded from the first event.

    Raises only what the store raises.
    """
    journal = ExecJournal(workspace=workspace)
    async for page in store.pages(workspace, until_seq=at_seq, batch=READ_BATCH):
        for ev in page:
            evolve_journal(journal, ev)
    return journal
