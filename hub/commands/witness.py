"""``agora witness``: follow a hub's checkpoints, check each extends what was seen before,
cosign the consistent ones and hand the cosignatures back (docs/audit.md, "Witnesses").

::

    agora witness --hub ws://hub:8765 --token T --workspace demo --dir witness/ \\
        --key witness.key --hub-key hub.vkey [--once] [--interval 5]

* ``--key FILE``: the witness's own key (C2SP cosignature/v1, Ed25519), created mode 0600
  named ``--name`` when the file does not exist; ``--print-key`` prints its verifier key
  (what ``agora verify --witness-key`` takes) and exits.
* ``--dir DIR`` keeps what the witness saw: ``hub.vkey`` (the hub's key, pinned at the first
  run from ``--hub-key``; a later ``--hub-key`` must be the same) and ``checkpoints.json``
  (the last checkpoint seen per workspace, :mod:`hub.client.verify`).
* Each round, per workspace: fetch the latest checkpoint through a verifying client session
  (its signature, origin and consistency with the one kept in DIR, by a consistency proof);
  when it is consistent and not yet cosigned by this witness, cosign it (``time`` = now) and
  send it back (wire op ``cosign``; the token needs the write right).
* A split view (:class:`hub.core.errors.TamperDetected`: a checkpoint that does not extend
  the one kept) is reported on stderr with both signed notes, saved under
  ``DIR/split-<workspace>-<unix time>.txt``, and ends the command with exit 3.

Exit codes: 0 (``--once`` round done, or stopped by SIGINT/SIGTERM), 1 the hub refused or
could not be reached (``--once``), 2 usage, 3 split view.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from hub.commands._audit import EXIT_FAILED, EXIT_OK, EXIT_USAGE, workspace_name
from hub.commands.common import fail
from hub.core.checkpoint import (
    COSIGNATURE_V1,
    NoteError,
    NoteSigner,
    NoteVerifier,
    add_signatures,
    format_note,
    generate_signer,
    parse_note,
    parse_signer_key,
    verified_by,
)
from hub.core.errors import AgoraError, ConfigError, NotFound, TamperDetected

if TYPE_CHECKING:
    from hub.client.workspace import Workspace

COMMAND: Final = "witness"
EXIT_SPLIT: Final = 3
HUB_KEY_FILE: Final = "hub.vkey"
SEEN_FILE: Final = "checkpoints.json"
DEFAULT_INTERVAL_S: Final = 5.0
DEFAULT_NAME: Final = "agora-witness"
_KEY_MODE: Final = 0o600


def register(subparsers: Any) -> None:
    parser: argparse.ArgumentParser = subparsers.add_parser(
        COMMAND,
        help="follow a hub's checkpoints, cosign the consistent ones, report a split view",
        description=(
            "Follow the signed checkpoints of WORKSPACEs on a hub, check each one extends the "
            "last one kept in DIR (consistency proofs), cosign consistent ones (C2SP "
            "cosignature) and hand the cosignatures back to the hub. Exit 3 on a split view."
        ),
    )
    parser.add_argument("--hub", metavar="URL", help="the hub, ws://HOST:PORT")
    parser.add_argument("--token", metavar="T", help="a token with read (and write) rights")
    parser.add_argument(
        "--workspace",
        action="append",
        type=workspace_name,
        default=[],
        metavar="W",
        help="a workspace to witness (repeatable)",
    )
    parser.add_argument("--dir", type=Path, metavar="DIR", help="where the witness keeps state")
    parser.add_argument(
        "--key", type=Path, required=True, metavar="FILE", help="the witness's key file"
    )
    parser.add_argument(
        "--hub-key",
        default=None,
        metavar="PUBKEY",
        help="the hub's verifier key (or a file holding it); needed at the first run",
    )
    parser.add_argument(
        "--name",
        default=DEFAULT_NAME,
        help=f"the witness key's name when --key is created (default: {DEFAULT_NAME})",
    )
    parser.add_argument("--once", action="store_true", help="one round, then exit")
    parser.add_argument(
        "--interval",
        type=float,
        default=DEFAULT_INTERVAL_S,
        metavar="S",
        help=f"seconds between rounds (default: {DEFAULT_INTERVAL_S:g})",
    )
    parser.add_argument(
        "--print-key", action="store_true", help="print the witness's verifier key and exit"
    )
    parser.set_defaults(func=run)


def load_or_create_witness_key(path: Path, name: str) -> NoteSigner:
    """The witness's cosignature/v1 key at ``path``, created (0600) when absent. Raises
    :class:`ConfigError`."""
    if not path.exists():
        signer = generate_signer(name, COSIGNATURE_V1)
        with contextlib.suppress(FileExistsError):  # another process made one: use it
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, _KEY_MODE)
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(signer.skey() + "\n")
    try:
        signer = parse_signer_key(path.read_text("utf-8"))
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read the witness key {path}: {e}", source=str(path)) from e
    except NoteError as e:
        raise ConfigError(f"{path}: {e.message}", source=str(path)) from e
    if signer.sig_type != COSIGNATURE_V1:
        raise ConfigError(f"{path} is not a cosignature/v1 key (type 0x04)", source=str(path))
    return signer


def pinned_hub_key(directory: Path, given: str | None) -> NoteVerifier:
    """The hub's key pinned in ``directory`` (written from ``given`` at the first run).
    Raises :class:`ConfigError`."""
    from hub.client.verify import verifier_key

    path = directory / HUB_KEY_FILE
    try:
        offered = verifier_key(given) if given is not None else None
        pinned = verifier_key(str(path)) if path.exists() else None
    except NoteError as e:
        raise ConfigError(f"the hub key: {e.message}", source="--hub-key") from e
    if pinned is None:
        if offered is None:
            raise ConfigError(
                f"no hub key pinned in {directory}: give --hub-key (agora checkpoint key)",
                source="--hub-key",
            )
        directory.mkdir(parents=True, exist_ok=True)
        path.write_text(offered.vkey() + "\n", encoding="utf-8")
        return offered
    if offered is not None and offered.vkey() != pinned.vkey():
        raise ConfigError(
            f"--hub-key {offered.vkey()} is not the key pinned in {path} ({pinned.vkey()})",
            source="--hub-key",
        )
    return pinned


async def run(args: argparse.Namespace) -> int:
    try:
        signer = load_or_create_witness_key(args.key, args.name)
    except ConfigError as e:
        return fail(COMMAND, e, EXIT_USAGE)
    if args.print_key:
        print(signer.verifier.vkey())
        return EXIT_OK
    given = (("--hub", args.hub), ("--token", args.token), ("--dir", args.dir))
    missing = [flag for flag, value in given if not value]
    if missing or not args.workspace:
        return fail(COMMAND, f"needs {', '.join(missing or ['--workspace'])}", EXIT_USAGE)
    if args.interval <= 0:
        return fail(COMMAND, "--interval must be > 0", EXIT_USAGE)
    try:
        hub_key = pinned_hub_key(args.dir, args.hub_key)
    except ConfigError as e:
        return fail(COMMAND, e, EXIT_USAGE)
    witness = Witness(args.hub, args.token, hub_key, signer, args.dir)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    signals = (signal.SIGTERM, signal.SIGINT)
    for sig in signals:
        loop.add_signal_handler(sig, stop.set)
    try:
        return await witness.run(args.workspace, once=args.once, interval=args.interval, stop=stop)
    finally:
        for sig in signals:
            loop.remove_signal_handler(sig)


class Witness:
    """One witness of one hub (see the module docstring)."""

    def __init__(
        self, url: str, token: str, hub_key: NoteVerifier, signer: NoteSigner, directory: Path
    ) -> None:
        self.url = url
        self.token = token
        self.hub_key = hub_key
        self.signer = signer
        self.directory = directory

    async def run(
        self, workspaces: list[str], *, once: bool, interval: float, stop: asyncio.Event
    ) -> int:
        from hub.client import connect  # websockets only when witnessing

        print(
            f"agora witness {self.signer.verifier.vkey()} watching {len(workspaces)} "
            f"workspace(s) of {self.url}",
            flush=True,
        )
        try:
            async with connect(
                self.url,
                self.token,
                reconnect=not once,
                verify=True,
                checkpoint_key=self.hub_key,
                witness_file=self.directory / SEEN_FILE,
            ) as session:
                while True:
                    for name in workspaces:
                        await self._round(session.workspace(name))
                    if once:
                        return EXIT_OK
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(interval):
                            await stop.wait()
                    if stop.is_set():
                        return EXIT_OK
        except TamperDetected as e:
            return self._split(e)
        except AgoraError as e:
            return fail(COMMAND, e, EXIT_FAILED)

    async def _round(self, ws: Workspace) -> None:
        """Check and cosign the latest checkpoint of workspace ``ws`` (a client Workspace)."""
        try:
            shown = await ws.checkpoint()  # verified: raises TamperDetected on a split view
        except NotFound:
            print(f"{ws.name}: no checkpoint yet", flush=True)
            return
        note = parse_note(shown.signed())
        if verified_by(note, self.signer.verifier) is not None:
            return  # cosigned already (by this witness, at this size)
        signature = self.signer.sign(note.text, timestamp=int(time.time()))
        cosigned = format_note(add_signatures(note, [signature]))
        await ws.cosign(cosigned, self.signer.verifier.vkey())
        print(f"cosigned {ws.name} at size {shown.size}", flush=True)

    def _split(self, error: TamperDetected) -> int:
        evidence = self.directory / f"split-{error.workspace}-{int(time.time())}.txt"
        text = (
            f"{error.message}\n\n-- checkpoint seen before --\n{error.previous}"
            f"-- checkpoint shown now --\n{error.current}"
        )
        with contextlib.suppress(OSError):
            evidence.write_text(text, encoding="utf-8")
        print(
            f"agora {COMMAND}: SPLIT VIEW: {' '.join(error.message.split())} "
            f"(both signed checkpoints in {evidence})",
            file=sys.stderr,
        )
        sys.stderr.write(text)
        return EXIT_SPLIT
