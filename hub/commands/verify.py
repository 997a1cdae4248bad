"""``agora verify [WORKSPACE]``: audit one workspace's log, or every workspace's.

Per workspace, two checks:

1. The log: seqs gapless from 1 and every hash linking to the previous one
   (:meth:`hub.log.base.EventStore.verify`). The first bad seq is named.
2. The caches: the state loaded the way the server loads it (newest snapshot plus the log
   after it) equals a rebuild from the first event (:func:`load_state` vs
   :func:`rebuild_state`). Skipped when the workspace has no snapshot (both would be the same
   rebuild) or when check 1 failed.

Prints ``ok WORKSPACE N events`` per sound workspace and a total; a damaged workspace is named
on stderr with its first bad seq, and the exit code is 1.
"""

from __future__ import annotations

import argparse
from typing import Any, Final

from hub.commands._audit import (
    EXIT_FAILED,
    EXIT_OK,
    add_store_args,
    add_workspace_arg,
    progress,
    progress_enabled,
    require_head,
    warn,
    with_store,
)
from hub.commands.common import fail
from hub.core.errors import IntegrityError
from hub.core.projections.snapshots import SNAPSHOT_NAME, SNAPSHOT_VERSION, from_snapshot
from hub.core.projections.workspace import WorkspaceState
from hub.core.records import Head
from hub.log.base import EventStore
from hub.log.loading import load_state, rebuild_state

COMMAND = "verify"

# The fields of WorkspaceState compared (and named when they differ).
_STATE_FIELDS: Final = tuple(WorkspaceState.__struct_fields__)


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        COMMAND,
        help="check hash chains, seqs and snapshots of one or every workspace",
        description=(
            "Check that each workspace's log is gapless and its hash chain intact, and that "
            "the snapshot-based state equals a rebuild from scratch. Exit 1 naming the first "
            "bad seq of each damaged workspace."
        ),
    )
    add_workspace_arg(parser, optional=True)
    add_store_args(parser)
    parser.set_defaults(func=run)


async def run(args: argparse.Namespace) -> int:
    async def body(store: EventStore) -> int:
        if args.workspace is not None:
            heads = [await require_head(store, args.workspace)]
        else:
            heads = await store.heads()
        show = progress_enabled()
        damaged = 0
        total = 0
        for head in heads:
            checked, problem = await verify_workspace(store, head, show_progress=show)
            total += checked
            if problem is None:
                print(f"ok {head.workspace} {checked} events")
            else:
                damaged += 1
                fail(COMMAND, f"workspace {head.workspace}: {problem}")
        workspaces = f"{len(heads)} workspace{'s' if len(heads) != 1 else ''}"
        if damaged:
            print(f"FAILED: {damaged} of {workspaces} damaged ({total} events checked)")
            return EXIT_FAILED
        print(f"ok: {workspaces}, {total} events verified")
        return EXIT_OK

    return await with_store(COMMAND, args, body)


async def verify_workspace(
    store: EventStore, head: Head, *, show_progress: bool = False
) -> tuple[int, str | None]:
    """(events checked, the first problem or None) for one workspace."""
    workspace = head.workspace
    label = f"verify {workspace}: {{}} of {head.seq:,} events"
    try:
        async with progress(label.format("hash chain"), enabled=show_progress):
            report = await store.verify(workspace)
    except IntegrityError as e:  # a stored event that does not even decode
        return 0, e.message
    if report.error is not None:
        return report.checked, f"seq {report.error.seq}: {report.error.problem}"

    snapshot = await store.load_snapshot(
        workspace, SNAPSHOT_NAME, SNAPSHOT_VERSION, at_or_before=report.head
    )
    if snapshot is None:
        return report.checked, None
    if from_snapshot(snapshot, workspace) is None:
        # load_state ignores it, so every reader still gets the right state; only speed suffers.
        warn(COMMAND, f"workspace {workspace}: snapshot at seq {snapshot.seq} is unusable")
        return report.checked, None
    async with progress(label.format("rebuild"), enabled=show_progress):
        rebuilt = await rebuild_state(store, workspace, at_seq=report.head)
        loaded = await load_state(store, workspace, at_seq=report.head)
    if loaded != rebuilt:
        fields = ", ".join(f for f in _STATE_FIELDS if getattr(loaded, f) != getattr(rebuilt, f))
        return report.checked, (
            f"seq {report.head}: the state from the snapshot at seq {snapshot.seq} differs "
            f"from a rebuild from scratch ({fields}); snapshots are disposable caches, "
            "deleting them repairs this"
        )
    return report.checked, None
