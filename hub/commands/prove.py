"""``agora prove WORKSPACE SEQ [--size N]``: an event with its inclusion proof and checkpoint.

Prints ONE JSON document (docs/audit.md, "Proof documents")::

    {"workspace": W, "seq": S, "treeSize": N, "event": {…the stored event…},
     "inclusion": [base64 hash, …], "checkpoint": "<signed note>"}

``inclusion`` is the audit path (RFC 9162 §2.1.3.1) of leaf ``S - 1`` in the tree of size
``N`` whose root the checkpoint signs. Without ``--size`` the proof is against the latest
checkpoint kept (a new one is signed when that does not cover SEQ yet); with it, against the
checkpoint kept of exactly that size. ``agora verify-proof`` checks the document offline.
"""

from __future__ import annotations

import argparse
import base64
import sys
from typing import Any, Final

import msgspec

from hub.checkpoints import Checkpointer, prove_inclusion, signed_text
from hub.commands._audit import (
    EXIT_OK,
    add_store_args,
    add_workspace_arg,
    seq_number,
    with_store,
)
from hub.commands.checkpoint import signer_from_args
from hub.core.errors import NotFound
from hub.log.base import EventStore

COMMAND: Final = "prove"


class ProofDocument(msgspec.Struct, frozen=True, rename="camel", forbid_unknown_fields=True):
    """What ``agora prove`` prints and ``agora verify-proof`` reads."""

    workspace: str
    seq: int
    tree_size: int
    event: msgspec.Raw
    inclusion: list[str]
    checkpoint: str


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        COMMAND,
        help="print an event with its inclusion proof and a signed checkpoint, as JSON",
        description=(
            "Print event SEQ of WORKSPACE, its Merkle inclusion proof (RFC 9162) and the "
            "signed checkpoint it leads to, as one JSON document that 'agora verify-proof' "
            "checks offline."
        ),
    )
    add_workspace_arg(parser)
    parser.add_argument("seq", type=seq_number, metavar="SEQ", help="the event's seq")
    parser.add_argument(
        "--size",
        type=seq_number,
        default=None,
        metavar="N",
        help="prove against the checkpoint kept of tree size N (default: the latest)",
    )
    add_store_args(parser)
    parser.set_defaults(func=run)


async def run(args: argparse.Namespace) -> int:
    workspace: str = args.workspace
    seq: int = args.seq

    async def body(store: EventStore) -> int:
        rows = await store.read_raw(workspace, after_seq=seq - 1, limit=1) if seq > 0 else []
        if not rows or rows[0][0] != seq:
            raise NotFound(f"workspace {workspace!r} has no event {seq}", seq=seq)
        if args.size is not None:
            record = await store.load_checkpoint(workspace, args.size)
            if record is None:
                sizes = [r.size for r in await store.list_checkpoints(workspace)]
                raise NotFound(
                    f"no checkpoint of {workspace!r} at size {args.size} (kept: "
                    f"{', '.join(map(str, sizes)) or 'none'})",
                    size=args.size,
                )
        else:
            record = await store.load_checkpoint(workspace)
            if record is None or record.size < seq:
                record = await Checkpointer(store, signer_from_args(args)).on_demand(workspace)
        proof = await prove_inclusion(store, workspace, seq, record.size)
        document = ProofDocument(
            workspace=workspace,
            seq=seq,
            tree_size=record.size,
            event=msgspec.Raw(rows[0][1]),
            inclusion=[base64.b64encode(h).decode() for h in proof.hashes],
            checkpoint=signed_text(record),
        )
        sys.stdout.write(msgspec.json.encode(document).decode() + "\n")
        return EXIT_OK

    return await with_store(COMMAND, args, body)
