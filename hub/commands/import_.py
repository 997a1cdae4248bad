"""``agora import WORKSPACE``: restore an ``agora export`` verbatim into an empty workspace.

Same seqs, ids, timestamps, producers and hashes (positions are the new store's own). Refused,
with nothing written: a workspace that already has events, an event of another workspace, and
a broken hash chain (the first bad seq and its input line are named), and a line over the
door's limits (``[limits] max_depth``, and the stored-event size ``max_event_bytes``: an event
larger could never be read back by a client whose frame limit is ``max_frame_bytes``). The
whole export is
read into memory first, because the store restores it as one atomic batch.

Blobs are not in the JSON Lines; ``--blobs DIR`` (as written by ``agora export --blobs``)
copies the referenced ones into the store's blob store before the events are imported, each
new one under the intent of the first event referencing it (as every writer stores a blob:
:class:`hub.log.intents.BlobStaging`): an import refused after the copy removes them, and one
a crash cut leaves them to the hub's orphan sweep. A blob still missing afterwards is a
warning, not an error: the events are the log's truth, and the content can be supplied
later.

``--checkpoints FILE`` (as written by ``agora export --checkpoints``) keeps the source's
signed checkpoints with the restored log. Each must be of this workspace and sign a tree the
imported events make (its root is recomputed before anything is written); the signatures
are kept as they are (the source's key is not this hub's, so they are checked by whoever
holds it: ``agora verify --checkpoint --key``).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec

from hub.commands._audit import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    add_store_args,
    add_workspace_arg,
    decode_lines,
    read_input,
    report,
    report_all,
    warn,
    where,
    with_store,
)
from hub.commands.common import config_from_args, fail
from hub.commands.export import CheckpointLine
from hub.core.chain import canonical_bytes
from hub.core.checkpoint import CheckpointRecord, parse_checkpoint, parse_note
from hub.core.errors import (
    AgoraError,
    BadRequest,
    ConfigError,
    Conflict,
    IntegrityError,
    NotFound,
    TooLarge,
)
from hub.core.events import Event, encode_event
from hub.core.merkle import append_leaf, frontier_root, leaf_hash
from hub.core.validation import blob_refs
from hub.log.base import EventStore
from hub.log.blobs import FileBlobStore
from hub.log.intents import BlobStaging

COMMAND = "import"
# Most missing blobs named one by one; the rest are counted.
MAX_NAMED_BLOBS = 20


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        COMMAND,
        help="restore an 'agora export' into an empty workspace",
        description=(
            "Read the JSON Lines written by 'agora export' (stdin or --input FILE) and restore "
            "the events verbatim, hashes included, into WORKSPACE, which must have no events. "
            "The hash chain is verified first; nothing is written if it is broken."
        ),
    )
    add_workspace_arg(parser)
    parser.add_argument(
        "--input",
        "-i",
        type=Path,
        default=None,
        metavar="FILE",
        help="read the export from FILE (default: stdin)",
    )
    parser.add_argument(
        "--blobs",
        type=Path,
        default=None,
        metavar="DIR",
        help="copy the referenced blobs from DIR (written by 'agora export --blobs DIR')",
    )
    parser.add_argument(
        "--checkpoints",
        type=Path,
        default=None,
        metavar="FILE",
        help="keep the source's checkpoints from FILE ('agora export --checkpoints FILE')",
    )
    add_store_args(parser)
    parser.set_defaults(func=run)


async def run(args: argparse.Namespace) -> int:
    workspace: str = args.workspace
    if args.blobs is not None and not args.blobs.is_dir():
        return report(COMMAND, NotFound(f"no blob directory {str(args.blobs)!r}"))
    try:
        limits = config_from_args(args).limits.draft_limits()
    except ConfigError as e:
        return report(COMMAND, e, EXIT_USAGE)
    try:
        data = read_input(args.input)
    except AgoraError as e:
        return report(COMMAND, e)

    def check(ev: Event) -> None:
        """The stored-event limit holds for imported events too: stored, an event over it
        could never be read by a client whose frame limit is ``max_frame_bytes``."""
        size = len(encode_event(ev))
        if size > limits.max_event_bytes:
            raise TooLarge(
                f"the event is {size} bytes stored; the limit is {limits.max_event_bytes} "
                "([limits] max_frame_bytes less 1 KiB)",
                field="event",
                limit=limits.max_event_bytes,
                size=size,
            )

    numbered, errors = decode_lines(data, check, max_depth=limits.max_depth)
    if errors:
        return report_all(COMMAND, errors)
    if not numbered:
        return report(COMMAND, BadRequest("no events in the input", field="events"))
    for line, ev in numbered:
        if ev.workspace != workspace:
            message = (
                f"the export is of workspace {ev.workspace!r}, not {workspace!r} "
                "(an export is restored under its own name: the name is hashed)"
            )
            return fail(COMMAND, f"badRequest: {where(line, 'workspace', message)}", EXIT_FAILED)
    events = [ev for _, ev in numbered]
    line_of = {ev.seq: line for line, ev in numbered}
    checkpoints: list[CheckpointRecord] = []
    if args.checkpoints is not None:
        try:
            checkpoints = read_checkpoints(read_input(args.checkpoints), workspace, events)
        except AgoraError as e:
            return report(COMMAND, e)

    async def body(store: EventStore) -> int:
        head = await store.head(workspace)
        if head is not None:
            raise Conflict(
                f"workspace {workspace!r} is not empty (head {head.seq}); "
                "import needs a workspace without events",
                head=head.seq,
            )
        refs: dict[str, int] = {}  # blob -> the first seq referencing it
        first: dict[str, str] = {}  # blob -> the id of that event (its intent names it)
        for ev in events:
            for sha in blob_refs(ev):
                refs.setdefault(sha, ev.seq)
                first.setdefault(sha, ev.id)
        # Refused (the chain), the copied blobs go as the staging closes; a crash leaves
        # their intents to the sweep. The events are imported as one batch.
        async with BlobStaging(store, workspace) as staged:
            copied = 0
            if args.blobs is not None:
                # Content first: no imported event ever references a blob that was at hand.
                copied = await _copy_blobs(FileBlobStore(args.blobs), staged, first)
            try:
                count = await store.import_events(workspace, events)
            except IntegrityError as e:
                seq = e.details.get("seq")
                problem = e.details.get("problem")
                if isinstance(seq, int) and isinstance(problem, str):
                    message = where(line_of.get(seq), None, f"seq {seq}: {problem}")
                else:
                    message = e.message
                message = f"badRequest: {message} (hash chain broken; nothing imported)"
                return fail(COMMAND, message, EXIT_FAILED)
            await staged.committed()
        for record in checkpoints:
            await store.save_checkpoint(record)
        blobs = f", {copied} blob(s) copied" if args.blobs is not None else ""
        kept = f", {len(checkpoints)} checkpoint(s) kept" if args.checkpoints is not None else ""
        print(f"imported {count} events into {workspace} (head {events[-1].seq}){blobs}{kept}")
        missing = [(sha, seq) for sha, seq in refs.items() if not await store.blobs.has(sha)]
        for sha, seq in missing[:MAX_NAMED_BLOBS]:
            warn(COMMAND, f"blob {sha} (referenced at seq {seq}) is not in the blob store")
        if len(missing) > MAX_NAMED_BLOBS:
            warn(COMMAND, f"... and {len(missing) - MAX_NAMED_BLOBS} more missing blobs")
        if missing:
            warn(COMMAND, "copy missing blobs in with --blobs DIR (see 'agora export --blobs')")
        return EXIT_OK

    return await with_store(COMMAND, args, body, read_only=False)


async def _copy_blobs(source: FileBlobStore, staged: BlobStaging, first: dict[str, str]) -> int:
    """Copy each blob of ``first`` (sha256 → the id of the first event referencing it) that
    the store lacks from ``source`` through ``staged``; return how many. One stored already
    is touched (the import references it now); one missing or damaged in ``source`` is left
    out (the import warns about it)."""
    copied = 0
    for sha, event_id in first.items():
        if await staged.store.blobs.touch(sha):
            continue
        try:
            data = await source.get(sha)
        except (NotFound, IntegrityError):
            continue
        await staged.put(event_id, data, sha256=sha)
        copied += 1
    return copied


def read_checkpoints(
    data: bytes, workspace: str, events: Sequence[Event]
) -> list[CheckpointRecord]:
    """The checkpoints of a ``--checkpoints`` file, each checked to be of ``workspace`` and
    to sign the tree ``events`` make at its size. Raises :class:`BadRequest` naming the
    line, :class:`IntegrityError` for a checkpoint the events do not match."""
    wanted: dict[int, tuple[int, CheckpointRecord, bytes]] = {}
    for number, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            line = msgspec.json.decode(raw, type=CheckpointLine)
            checkpoint = parse_checkpoint(parse_note(line.note).text)
        except msgspec.DecodeError as e:
            raise BadRequest(f"checkpoints line {number}: {e}") from e
        except AgoraError as e:
            raise BadRequest(f"checkpoints line {number}: {e.message}") from e
        if line.workspace != workspace or not checkpoint.origin.endswith(f"/{workspace}"):
            raise BadRequest(f"checkpoints line {number}: not a checkpoint of {workspace!r}")
        if checkpoint.size != line.size or not 0 < line.size <= len(events):
            raise BadRequest(
                f"checkpoints line {number}: size {checkpoint.size} is not in the export "
                f"({len(events)} events)"
            )
        record = CheckpointRecord(workspace=workspace, size=line.size, note=line.note)
        wanted[number] = (line.size, record, checkpoint.root)
    roots: dict[int, bytes] = {}
    sizes = {size for size, _, _ in wanted.values()}
    frontier: tuple[bytes, ...] = ()
    for i, event in enumerate(events[: max(sizes, default=0)]):
        frontier, _ = append_leaf(frontier, i, leaf_hash(canonical_bytes(event)))
        if i + 1 in sizes:
            roots[i + 1] = frontier_root(frontier)
    for number, (size, _, root) in wanted.items():
        if roots[size] != root:
            raise IntegrityError(
                f"checkpoints line {number}: the export's tree of size {size} is not the one "
                "this checkpoint signed; nothing imported"
            )
    return [record for _, record, _ in wanted.values()]
