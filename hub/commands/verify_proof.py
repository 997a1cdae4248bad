"""``agora verify-proof FILE --key PUBKEY``: check an ``agora prove`` document offline.

No store, no data directory: only the document and the hub's public key (note-verifier form,
as ``agora checkpoint key`` prints it, inline or in a file). Checks, in order: the checkpoint's
signature by that key; its origin names the document's workspace; its tree size is the
document's; the event is the document's workspace and seq and its chain hash matches its
content; the inclusion proof leads from the event's leaf hash to the signed root (RFC 9162
§2.1.3). ``--witness-key`` (repeatable) also requires a valid cosignature by that witness.
Prints ``ok …`` and exits 0, or names the failed check and exits 1.
"""

from __future__ import annotations

import argparse
import base64
import binascii
from pathlib import Path
from typing import Any, Final

import msgspec

from hub.commands._audit import EXIT_FAILED, EXIT_OK, EXIT_USAGE, read_input, report
from hub.commands.checkpoint import read_verifier
from hub.commands.common import fail
from hub.commands.prove import ProofDocument
from hub.core.chain import canonical_bytes, compute_hash
from hub.core.checkpoint import NoteError, NoteVerifier, open_checkpoint, origin_for
from hub.core.errors import AgoraError
from hub.core.events import decode_event
from hub.core.merkle import ProofError, check_inclusion, leaf_hash

COMMAND: Final = "verify-proof"


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        COMMAND,
        help="check an 'agora prove' document offline against the hub's public key",
        description=(
            "Check the signed checkpoint, the event and its inclusion proof in FILE (written "
            "by 'agora prove'; - for stdin) using only the hub's public key. Exit 1 naming "
            "the check that failed."
        ),
    )
    parser.add_argument("file", type=Path, metavar="FILE", help="the proof document")
    parser.add_argument(
        "--key",
        required=True,
        metavar="PUBKEY",
        help="the hub's verifier key (agora checkpoint key), or a file holding it",
    )
    parser.add_argument(
        "--witness-key",
        action="append",
        default=[],
        metavar="PUBKEY",
        help="also require a cosignature by this witness key (repeatable)",
    )
    parser.set_defaults(func=run)


async def run(args: argparse.Namespace) -> int:
    try:
        verifier = read_verifier(args.key)
        witnesses = tuple(read_verifier(k) for k in args.witness_key)
    except NoteError as e:
        return report(COMMAND, e, EXIT_USAGE)
    try:
        document = msgspec.json.decode(read_input(args.file), type=ProofDocument)
    except AgoraError as e:
        return report(COMMAND, e)
    except msgspec.DecodeError as e:
        return fail(COMMAND, f"not a proof document: {e}", EXIT_FAILED)
    try:
        message = check_document(document, verifier, witnesses)
    except (NoteError, ProofError) as e:
        return fail(COMMAND, f"{args.file}: {e.message}", EXIT_FAILED)
    print(f"ok {message}")
    return EXIT_OK


def check_document(
    document: ProofDocument,
    verifier: NoteVerifier,
    witnesses: tuple[NoteVerifier, ...] = (),
) -> str:
    """Check a proof document against the hub's key; return what it proved. Raises
    :class:`NoteError` or :class:`ProofError` naming the failed check."""
    origin = origin_for(verifier.name, document.workspace)
    checkpoint, _ = open_checkpoint(
        document.checkpoint, verifier, origin=origin, witnesses=witnesses
    )
    if checkpoint.size != document.tree_size:
        raise ProofError(
            f"the checkpoint signs size {checkpoint.size}, the proof claims {document.tree_size}"
        )
    try:
        event = decode_event(document.event)
    except (msgspec.DecodeError, AgoraError) as e:
        raise ProofError(f"the event does not decode: {e}") from e
    if event.workspace != document.workspace or event.seq != document.seq:
        raise ProofError(
            f"the event is seq {event.seq} of {event.workspace!r}, not seq {document.seq} "
            f"of {document.workspace!r}"
        )
    if event.hash != compute_hash(event):
        raise ProofError(f"the hash of event {event.seq} does not match its content")
    try:
        path = [base64.b64decode(h, validate=True) for h in document.inclusion]
    except (binascii.Error, ValueError) as e:
        raise ProofError("an inclusion proof hash is not base64") from e
    check_inclusion(
        event.seq - 1, checkpoint.size, leaf_hash(canonical_bytes(event)), path, checkpoint.root
    )
    return (
        f"seq {event.seq} of {document.workspace} is in the tree of size {checkpoint.size} "
        f"signed by {verifier.name}"
    )
