"""``agora checkpoint WORKSPACE [--out FILE]`` and ``agora checkpoint key``.

``agora checkpoint WORKSPACE`` signs a checkpoint of the workspace's whole log now (or
returns the one kept for that size), with the data directory's key, keeps it in the store
and prints it (or writes it to FILE). Give the printed note to someone who does not trust the
operator: ``agora verify WORKSPACE --checkpoint FILE`` later proves the log still holds what
it signed. ``agora checkpoint key`` prints the public key in note-verifier form
(``agora.<hub id>+<key ID>+<base64>``), what auditors and clients pin. Both create the key
(``<data dir>/checkpoint.key``) if the data directory has none yet. (A workspace named
``key`` is reached with ``--workspace key``.)

Also the helpers the other audit commands share: reading a key argument, writing a file
atomically.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import tempfile
from pathlib import Path
from typing import Any, Final

from hub.checkpoints import Checkpointer, load_key, load_or_create_key, signed_text
from hub.commands._audit import (
    EXIT_OK,
    EXIT_USAGE,
    add_store_args,
    report,
    with_store,
    workspace_name,
)
from hub.commands.common import config_from_args
from hub.core.checkpoint import NoteError, NoteSigner, NoteVerifier, parse_verifier_key
from hub.core.errors import AgoraError, BadRequest, ConfigError, NotFound
from hub.log.base import EventStore

COMMAND: Final = "checkpoint"
KEY_ARG: Final = "key"


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        COMMAND,
        help="sign a checkpoint of a workspace's log now, or print the checkpoint key",
        description=(
            "Sign a checkpoint (C2SP tlog-checkpoint in a signed note) of WORKSPACE's Merkle "
            "tree with the data directory's key, keep it, and print it (or write --out FILE). "
            "'agora checkpoint key' prints the public key in note-verifier form."
        ),
    )
    parser.add_argument(
        "target",
        nargs="?",
        metavar="WORKSPACE",
        help="the workspace, or 'key' for the public key",
    )
    parser.add_argument(
        "--workspace",
        type=workspace_name,
        default=None,
        metavar="NAME",
        help="the workspace (for one named 'key')",
    )
    parser.add_argument(
        "--out",
        "-o",
        type=Path,
        default=None,
        metavar="FILE",
        help="write the signed checkpoint to FILE (default: stdout)",
    )
    add_store_args(parser)
    parser.set_defaults(func=run)


def signer_from_args(args: argparse.Namespace) -> NoteSigner:
    """The data directory's checkpoint key, created if absent. Raises :class:`ConfigError`."""
    config = config_from_args(args)
    return load_or_create_key(config.storage.data_dir, config.audit.hub_id)


def verifier_from_args(args: argparse.Namespace, key: str | None) -> NoteVerifier:
    """The log key to check checkpoints with: ``key`` (a verifier key, or a file holding
    one), else the public half of the data directory's key. Raises :class:`NoteError`,
    :class:`NotFound`, :class:`ConfigError`."""
    if key is not None:
        return read_verifier(key)
    return load_key(config_from_args(args).storage.data_dir).verifier


def read_verifier(text: str) -> NoteVerifier:
    """A verifier key given on the command line, inline or as the path of a file holding it.
    Raises :class:`NoteError`."""
    candidate = Path(text)
    if "+" not in text or candidate.is_file():
        try:
            text = candidate.read_text("utf-8").strip()
        except (OSError, UnicodeDecodeError) as e:
            raise NoteError(f"{text!r} is neither a verifier key nor a readable file") from e
    return parse_verifier_key(text)


def write_text_atomically(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` via a temporary file renamed onto it (never half written)."""
    directory = path.parent if str(path.parent) else Path(".")
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{path.name}.", suffix=".partial")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


async def run(args: argparse.Namespace) -> int:
    if args.target == KEY_ARG and args.workspace is None:
        try:
            signer = signer_from_args(args)
        except (ConfigError, OSError) as e:
            error = e if isinstance(e, AgoraError) else ConfigError(str(e))
            return report(COMMAND, error, EXIT_USAGE if isinstance(e, ConfigError) else 1)
        print(signer.verifier.vkey())
        return EXIT_OK
    try:
        workspace = args.workspace or workspace_name(args.target or "")
    except argparse.ArgumentTypeError as e:
        return report(COMMAND, BadRequest(str(e)), EXIT_USAGE)

    async def body(store: EventStore) -> int:
        if await store.head(workspace) is None:
            raise NotFound(f"workspace {workspace!r} has no events", workspace=workspace)
        record = await Checkpointer(store, signer_from_args(args)).on_demand(workspace)
        text = signed_text(record)
        if args.out is None:
            sys.stdout.write(text)
        else:
            write_text_atomically(args.out, text)
            print(f"checkpoint of {workspace} at size {record.size} written to {args.out}")
        return EXIT_OK

    return await with_store(COMMAND, args, body)
