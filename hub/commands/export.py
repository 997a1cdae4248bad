"""``agora export WORKSPACE``: the stored envelopes (with their hashes) as JSON Lines.

The bytes are the store's own encoding, streamed a page at a time; ``agora import`` restores
them verbatim into another store and the hashes still verify. Large file content and
artifacts live in the blob store and are referenced by sha256 from the events; ``--blobs DIR``
copies every referenced blob into DIR (the same layout as a data directory's ``blobs/``).
``--checkpoints FILE`` writes every checkpoint kept of the workspace, cosignatures included,
as JSON Lines (:class:`CheckpointLine`); ``agora import --checkpoints`` keeps them with the
restored log, which still verifies against them (the tree covers no store-specific field).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import IO, Any

import msgspec

from hub.commands._audit import (
    EXIT_OK,
    PAGE,
    add_store_args,
    add_workspace_arg,
    require_head,
    warn,
    with_store,
    write_bytes,
)
from hub.core.errors import IntegrityError, NotFound
from hub.core.events import decode_events
from hub.core.validation import blob_refs
from hub.log.base import BlobStore, EventStore
from hub.log.blobs import FileBlobStore

COMMAND = "export"


class CheckpointLine(msgspec.Struct, frozen=True, forbid_unknown_fields=True):
    """One line of ``--checkpoints FILE``: a kept checkpoint's whole signed note."""

    workspace: str
    size: int
    note: str


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        COMMAND,
        help="write a workspace's stored events as JSON Lines",
        description=(
            "Write every stored event of WORKSPACE, hashes included, one JSON per line, to "
            "stdout or --output FILE. Blobs are referenced by sha256, not included; "
            "--blobs DIR copies them."
        ),
    )
    add_workspace_arg(parser)
    parser.add_argument(
        "--output",
        "-o",
        type=Path,
        default=None,
        metavar="FILE",
        help="write to FILE (replaced only once the export is complete; default: stdout)",
    )
    parser.add_argument(
        "--blobs",
        type=Path,
        default=None,
        metavar="DIR",
        help="also copy every blob the events reference into DIR",
    )
    parser.add_argument(
        "--checkpoints",
        type=Path,
        default=None,
        metavar="FILE",
        help="also write the workspace's signed checkpoints to FILE (JSON Lines)",
    )
    add_store_args(parser)
    parser.set_defaults(func=run)


async def copy_blobs(
    source: BlobStore, target: BlobStore, shas: Iterable[str]
) -> tuple[int, list[str]]:
    """Copy each blob ``target`` lacks from ``source``: (how many copied, [missing in source]).
    A blob damaged in ``source`` (:class:`IntegrityError`) counts as missing."""
    copied = 0
    missing: list[str] = []
    for sha in shas:
        if await target.has(sha):
            continue
        try:
            data = await source.get(sha)
        except (NotFound, IntegrityError):
            missing.append(sha)
            continue
        await target.put(data)
        copied += 1
    return copied, missing


async def run(args: argparse.Namespace) -> int:
    async def body(store: EventStore) -> int:
        await require_head(store, args.workspace)
        target = FileBlobStore(args.blobs) if args.blobs is not None else None
        if args.blobs is not None:
            # Created even when no event references a blob: `import --blobs DIR` needs it.
            args.blobs.mkdir(parents=True, exist_ok=True)
        with _output(args.output) as out:
            count, copied, missing = await _export(store, args.workspace, out, target)
        where = f" to {args.output}" if args.output is not None else ""
        blobs = f", {copied} blob(s) copied to {args.blobs}" if target is not None else ""
        print(f"exported {count} events of {args.workspace}{where}{blobs}", file=sys.stderr)
        for sha, seq in missing:
            warn(COMMAND, f"blob {sha} (seq {seq}) is not in the blob store; not copied")
        if args.checkpoints is not None:
            records = await store.list_checkpoints(args.workspace)
            lines = b"".join(
                msgspec.json.encode(CheckpointLine(r.workspace, r.size, r.signed())) + b"\n"
                for r in records
            )
            with _output(args.checkpoints) as out:
                assert out is not None
                out.write(lines)
            print(f"exported {len(records)} checkpoints to {args.checkpoints}", file=sys.stderr)
        return EXIT_OK

    return await with_store(COMMAND, args, body)


async def _export(
    store: EventStore, workspace: str, out: IO[bytes] | None, target: BlobStore | None
) -> tuple[int, int, list[tuple[str, int]]]:
    """Stream the log to ``out`` (None: stdout); copy blobs to ``target``.
    Returns (events, blobs copied, [(missing blob, seq referencing it)])."""
    after = count = copied = 0
    seen: set[str] = set()
    missing: list[tuple[str, int]] = []
    while True:
        page = await store.read_raw(workspace, after_seq=after, limit=PAGE)
        if page:
            data = b"\n".join(body for _, body in page) + b"\n"
            if out is None:
                write_bytes(data)
            else:
                out.write(data)
            count += len(page)
        if target is not None and page:
            first_seen: dict[str, int] = {}
            for event in decode_events(b"[" + b",".join(body for _, body in page) + b"]"):
                for sha in blob_refs(event):
                    if sha not in seen:
                        seen.add(sha)
                        first_seen[sha] = event.seq
            n, lacking = await copy_blobs(store.blobs, target, first_seen)
            copied += n
            missing += [(sha, first_seen[sha]) for sha in lacking]
        if len(page) < PAGE:
            return count, copied, missing
        after = page[-1][0]


@contextlib.contextmanager
def _output(path: Path | None) -> Iterator[IO[bytes] | None]:
    """None for stdout; else a temporary file next to ``path``, renamed onto it on success
    and removed on failure (an interrupted export never leaves a truncated FILE)."""
    if path is None:
        yield None
        return
    directory = path.parent if str(path.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".partial")
    try:
        with os.fdopen(fd, "wb") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
