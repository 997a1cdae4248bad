"""``agora blobs gc [--grace 1h] [--dry-run]``: remove the blobs no event references.

A blob is referenced by a ``fileWritten {blob}``, an ``artifactPublished {blob}`` or an
``execRequested`` module of any workspace's log, at any seq (history stays readable: an old
file revision keeps its content). Blobs stored less than ``--grace`` ago are kept, whatever
refers to them: an upload committed a moment ago whose ``fileWritten`` is still on its way
must not vanish under it. Uploads begun and never committed, last written before the grace,
are removed too. A *grant* (a blob uploaded for a workspace, counted against its quota until
referenced) older than the grace whose blob that workspace does not reference is dropped:
the quota is freed and the blob, unless referenced or granted elsewhere, removed. Run it
while the hub is stopped or idle; a blob referenced after the scan began but stored before
the grace is the one race left, which the grace bounds.

Also here: :func:`referenced_blobs`, which ``agora verify`` uses to check every referenced
blob exists and hashes right.
"""

from __future__ import annotations

import argparse
import re
import time
from typing import Any

from hub.commands._audit import EXIT_OK, EXIT_USAGE, PAGE, add_store_args, with_store
from hub.commands.common import fail
from hub.core.events import decode_events
from hub.core.validation import blob_refs
from hub.log.base import EventStore

COMMAND = "blobs"

_DURATION = re.compile(r"^(\d+(?:\.\d+)?)([smhd]?)$")
_UNIT = {"": 1.0, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def duration(text: str) -> float:
    """argparse type: ``90``, ``30s``, ``15m``, ``1h``, ``2d`` as seconds."""
    match = _DURATION.fullmatch(text.strip())
    if match is None:
        raise argparse.ArgumentTypeError(f"not a duration: {text!r} (e.g. 30s, 15m, 1h, 2d)")
    return float(match.group(1)) * _UNIT[match.group(2)]


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        COMMAND, help="manage the blob store (gc: remove unreferenced blobs)"
    )
    sub = parser.add_subparsers(dest="blobs_command", metavar="SUBCOMMAND")
    gc = sub.add_parser(
        "gc",
        help="remove blobs no event of any workspace references",
        description=(
            "Remove every blob that no event of any workspace references and that was stored "
            "longer ago than --grace."
        ),
    )
    gc.add_argument(
        "--grace",
        type=duration,
        default=3600.0,
        metavar="DURATION",
        help="keep blobs stored less than this long ago (default 1h; 0 keeps none)",
    )
    gc.add_argument("--dry-run", action="store_true", help="only list what would be removed")
    add_store_args(gc)
    gc.set_defaults(func=run_gc)
    parser.set_defaults(func=_usage)


async def _usage(args: argparse.Namespace) -> int:
    return fail(COMMAND, "name a subcommand: agora blobs gc", EXIT_USAGE)


async def referenced_blobs(store: EventStore, workspace: str) -> dict[str, int]:
    """Every blob ``workspace``'s log references → the first seq referencing it."""
    refs: dict[str, int] = {}
    after = 0
    while True:
        page = await store.read_raw(workspace, after_seq=after, limit=PAGE)
        if not page:
            return refs
        for event in decode_events(b"[" + b",".join(body for _, body in page) + b"]"):
            for sha in blob_refs(event):
                refs.setdefault(sha, event.seq)
        if len(page) < PAGE:
            return refs
        after = page[-1][0]


async def run_gc(args: argparse.Namespace) -> int:
    async def body(store: EventStore) -> int:
        live: set[str] = set()
        by_workspace: dict[str, set[str]] = {}
        for head in await store.heads():
            refs = set(await referenced_blobs(store, head.workspace))
            by_workspace[head.workspace] = refs
            live.update(refs)
        cutoff = time.time() - args.grace
        dropped = 0
        async for workspace, sha, granted_at in store.blobs.list_grants():
            if sha in by_workspace.get(workspace, set()):
                continue  # referenced: the workspace's files or artifacts pay for it
            if granted_at > cutoff:
                live.add(sha)  # its reference may be on its way
            elif args.dry_run:
                print(f"would drop the grant of {sha} to {workspace}")
            else:
                await store.blobs.revoke(workspace, sha)
                dropped += 1
        if dropped:
            print(f"dropped {dropped} unreferenced grant(s)")
        doomed = [
            (sha, size)
            async for sha, size, stored_at in store.blobs.list()
            if sha not in live and stored_at <= cutoff
        ]
        freed = 0
        for sha, size in doomed:
            if args.dry_run:
                print(f"would remove {sha} ({size} bytes)")
            elif await store.blobs.delete(sha):
                print(f"removed {sha} ({size} bytes)")
            freed += size
        if not args.dry_run:
            # Uploads begun and abandoned (never committed) past the grace go too.
            stale = await store.blobs.purge_uploads(cutoff)
            if stale:
                print(f"removed {stale} abandoned upload(s)")
        verb = "would free" if args.dry_run else "freed"
        print(f"{len(doomed)} unreferenced blob(s), {verb} {freed} bytes; {len(live)} referenced")
        return EXIT_OK

    return await with_store(COMMAND, args, body)
