"""``agora verify [WORKSPACE]``: audit one workspace's log, or every workspace's.

Per workspace, three checks, made in one pass over its log (each event read and decoded
once):

1. The log: seqs gapless from 1 and every hash linking to the previous one
   (:func:`hub.core.chain.verify_chain`, as :meth:`hub.log.base.EventStore.verify`). The
   first bad seq is named.
2. The caches: the state loaded the way the server loads it (newest snapshot plus the log
   after it) equals a rebuild from the first event (what :func:`hub.log.loading.load_state`
   and :func:`~hub.log.loading.rebuild_state` give). Skipped when the workspace has no
   usable snapshot (both would be the same rebuild) or when check 1 failed.
3. The blobs the log references are in the blob store and still hash to their names.

Prints ``ok WORKSPACE N events`` per sound workspace and a total; a damaged workspace is named
on stderr with its first bad seq, and the exit code is 1.

``--checkpoint FILE…`` (with WORKSPACE) adds the check a hash chain cannot make: that the log
still contains the Merkle tree each signed checkpoint (``agora checkpoint``, a client, a
witness) covered. The tree is recomputed from the events, so a truncated log, a rewrite with
the whole chain re-hashed, a reorder or a dropped event all fail, naming the checkpoint file
and, where it can be told, the first differing seq. Each checkpoint must be signed by the
hub's key (``--key``, default the data directory's; an auditor pins the key they were given)
for this workspace, and cosigned by every ``--witness-key``. docs/audit.md walks through it.
"""

from __future__ import annotations

import argparse
import contextlib
from pathlib import Path
from typing import Any, Final

from hub.checkpoints import audit_log
from hub.commands._audit import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    add_store_args,
    add_workspace_arg,
    progress,
    progress_enabled,
    require_head,
    warn,
    with_store,
)
from hub.commands.checkpoint import read_verifier, verifier_from_args
from hub.commands.common import fail
from hub.core.chain import ChainWalk
from hub.core.checkpoint import Checkpoint, NoteError, NoteVerifier, open_checkpoint, origin_for
from hub.core.errors import AgoraError, BadRequest, IntegrityError, NotFound
from hub.core.events import Event
from hub.core.projections.snapshots import SNAPSHOT_NAME, SNAPSHOT_VERSION, from_snapshot
from hub.core.projections.workspace import WorkspaceState, fold
from hub.core.records import Head
from hub.core.validation import REFERENCING_KINDS, blob_refs
from hub.log.base import EventStore

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
    parser.add_argument(
        "--checkpoint",
        action="extend",
        nargs="+",
        default=[],
        type=Path,
        metavar="FILE",
        help="signed checkpoints the log must still contain (repeatable; needs WORKSPACE)",
    )
    parser.add_argument(
        "--key",
        default=None,
        metavar="PUBKEY",
        help="the hub's verifier key, or a file holding it (default: the data directory's)",
    )
    parser.add_argument(
        "--witness-key",
        action="append",
        default=[],
        metavar="PUBKEY",
        help="require each checkpoint to be cosigned by this witness key (repeatable)",
    )
    add_store_args(parser)
    parser.set_defaults(func=run)


async def run(args: argparse.Namespace) -> int:
    if args.checkpoint and args.workspace is None:
        return fail(COMMAND, "--checkpoint needs a WORKSPACE", EXIT_USAGE)

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
        unheld = await verify_checkpoints(store, args) if args.checkpoint else 0
        if damaged or unheld:
            parts = [f"{damaged} of {workspaces} damaged"] if damaged else []
            if unheld:
                parts.append(f"{unheld} of {len(args.checkpoint)} checkpoints not held")
            print(f"FAILED: {', '.join(parts)} ({total} events checked)")
            return EXIT_FAILED
        print(f"ok: {workspaces}, {total} events verified")
        return EXIT_OK

    return await with_store(COMMAND, args, body)


async def verify_workspace(
    store: EventStore, head: Head, *, show_progress: bool = False
) -> tuple[int, str | None]:
    """(events checked, the first problem or None) for one workspace, up to ``head``.

    One pass over the log does every check that needs its events: each page is decoded once
    (:meth:`EventStore.pages`, reading the next page meanwhile) and goes through the chain
    check, the rebuild from scratch and the state from the snapshot (both folds only when
    there is a usable snapshot to compare), and the collection of referenced blobs, which are
    then checked (:func:`verify_blobs`). A page is folded only once its chain checked out.
    """
    workspace = head.workspace
    snapshot = await store.load_snapshot(
        workspace, SNAPSHOT_NAME, SNAPSHOT_VERSION, at_or_before=head.seq
    )
    cached = None if snapshot is None else from_snapshot(snapshot, workspace)
    rebuilt = None if cached is None else WorkspaceState(workspace=workspace)
    refs: dict[str, int] = {}
    walk = ChainWalk()
    try:
        async with (
            progress(f"verify {workspace}: {head.seq:,} events", enabled=show_progress),
            contextlib.aclosing(store.pages(workspace, until_seq=head.seq)) as pages,
        ):
            async for page in pages:
                if walk.check(page) is not None:
                    break
                if rebuilt is not None and cached is not None:
                    fold(rebuilt, page)
                    if page and page[-1].seq > cached.seq:  # the log after the snapshot
                        after = cached.seq
                        fold(cached, page if page[0].seq > after else _after(page, after))
                _collect_blobs(refs, page)
    except IntegrityError as e:  # a stored event that does not even decode
        return 0, e.message
    if walk.error is not None:
        return walk.checked, f"seq {walk.error.seq}: {walk.error.problem}"
    if snapshot is not None and cached is None:
        # load_state ignores it, so every reader still gets the right state; only speed suffers.
        warn(COMMAND, f"workspace {workspace}: snapshot at seq {snapshot.seq} is unusable")
    if snapshot is not None and cached is not None and cached != rebuilt:
        fields = ", ".join(f for f in _STATE_FIELDS if getattr(cached, f) != getattr(rebuilt, f))
        return walk.checked, (
            f"seq {walk.head}: the state from the snapshot at seq {snapshot.seq} differs "
            f"from a rebuild from scratch ({fields}); snapshots are disposable caches, "
            "deleting them repairs this"
        )
    return walk.checked, await verify_blobs(store, refs)


def _after(page: list[Event], seq: int) -> list[Event]:
    return [ev for ev in page if ev.seq > seq]


def _collect_blobs(refs: dict[str, int], page: list[Event]) -> None:
    """Add the blobs ``page`` references to ``refs`` (sha256 → the first seq naming it)."""
    kinds = REFERENCING_KINDS
    for ev in page:
        if type(ev) in kinds:
            for sha in blob_refs(ev):
                refs.setdefault(sha, ev.seq)


async def verify_blobs(store: EventStore, refs: dict[str, int]) -> str | None:
    """The first problem with the referenced blobs ``refs`` (sha256 → the first seq
    referencing it): missing, or content that no longer hashes to its name; or None. Checked
    in seq order, each blob read in ranges."""
    for sha, seq in sorted(refs.items(), key=lambda i: i[1]):
        try:
            await store.blobs.check(sha)
        except NotFound:
            return f"seq {seq}: references blob {sha}, which is not in the blob store"
        except IntegrityError:
            return f"seq {seq}: blob {sha} does not match its hash"
    return None


async def verify_checkpoints(store: EventStore, args: argparse.Namespace) -> int:
    """Check the ``--checkpoint`` files against the log; print one line each; return how
    many failed. A file that does not parse or verify counts as failed."""
    workspace: str = args.workspace
    try:
        verifier = verifier_from_args(args, args.key)
        witnesses = tuple(read_verifier(k) for k in args.witness_key)
    except AgoraError as e:
        raise BadRequest(f"cannot check checkpoints: {e.message}") from e
    failed = 0
    checkpoints: list[tuple[str, Checkpoint]] = []
    for path in args.checkpoint:
        label = str(path)
        try:
            checkpoints.append((label, _read_checkpoint(path, verifier, witnesses, workspace)))
        except (NoteError, OSError, UnicodeDecodeError) as e:
            failed += 1
            message = e.message if isinstance(e, AgoraError) else str(e)
            fail(COMMAND, f"checkpoint {label}: {message}")
    for finding in await audit_log(store, workspace, checkpoints):
        if finding.ok:
            print(
                f"ok checkpoint {finding.label}: {workspace} still holds the tree of size "
                f"{finding.size}"
            )
            continue
        failed += 1
        where = f"; first differing seq {finding.first_seq}" if finding.first_seq else ""
        fail(
            COMMAND,
            f"checkpoint {finding.label} (size {finding.size}): the log of {workspace} no "
            f"longer contains the tree it signed: {finding.problem}{where}",
        )
    return failed


def _read_checkpoint(
    path: Path, verifier: NoteVerifier, witnesses: tuple[NoteVerifier, ...], workspace: str
) -> Checkpoint:
    text = path.read_text("utf-8")
    checkpoint, _ = open_checkpoint(
        text, verifier, origin=origin_for(verifier.name, workspace), witnesses=witnesses
    )
    return checkpoint
