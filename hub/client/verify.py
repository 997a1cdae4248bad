"""A verifying client: checks every checkpoint a hub shows against a pinned key and against
the checkpoints it showed before (``connect(..., verify=True, checkpoint_key=…)``;
docs/audit.md, "Verifying clients and witnesses").

What a :class:`CheckpointVerifier` does with each checkpoint the hub shows:

1. its signature must verify with the pinned key, and its origin must be this hub's log of
   the workspace (``<key name>/<workspace>``);
2. against the last checkpoint of the workspace it kept (if any):
   * the same size: the same root;
   * larger: a consistency proof from the kept size to the new one (fetched from the hub)
     must check (RFC 9162 §2.1.4.2); the new checkpoint is kept;
   * smaller (a stale one): a consistency proof from it to the kept size must check;
3. anything else raises :class:`hub.core.errors.TamperDetected` carrying both signed notes
   — two checkpoints signed by the hub's key that no single history explains, or one it
   cannot prove extends the other.

With a ``witness_file`` the last checkpoint per workspace survives the process (JSON, written
atomically): the client is a witness of what it was shown, across runs. The file is bound to
the pinned key; every note in it is checked again when it is read.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import msgspec

from hub.core.checkpoint import (
    Checkpoint,
    NoteError,
    NoteVerifier,
    open_checkpoint,
    origin_for,
    parse_verifier_key,
)
from hub.core.errors import BadRequest, ConfigError, Internal, NotFound, TamperDetected
from hub.core.merkle import ProofError, check_consistency

__all__ = ["CheckpointVerifier", "SignedCheckpoint", "WitnessFile", "verifier_key"]

Prove = Callable[[int, int], Awaitable[Sequence[bytes]]]
"""Fetch the consistency proof from size ``old`` to size ``new`` of one workspace."""

_PROOF_REFUSALS: Final = (NotFound, BadRequest, Internal)
"""A hub answering a consistency proof between two sizes it signed with one of these cannot
prove its history: that is the verdict, not an error to pass on."""


@dataclass(frozen=True, slots=True)
class SignedCheckpoint:
    """A checkpoint as the hub showed it: the parsed tree head, the hub's signed ``note`` and
    the witnesses' ``cosignatures`` (lines to append to the note). ``verified``: checked
    by a :class:`CheckpointVerifier` (False on a session without ``verify``)."""

    workspace: str
    checkpoint: Checkpoint
    note: str
    cosignatures: str = ""
    verified: bool = False

    @property
    def size(self) -> int:
        return self.checkpoint.size

    @property
    def root(self) -> bytes:
        return self.checkpoint.root

    def signed(self) -> str:
        """The whole note: the hub's signature, then every cosignature."""
        return self.note + self.cosignatures


def verifier_key(key: str | NoteVerifier) -> NoteVerifier:
    """The pinned key: a verifier key (``agora.<hub id>+<key ID>+<base64>``) or a file
    holding one. Raises :class:`hub.core.checkpoint.NoteError`."""
    if isinstance(key, NoteVerifier):
        return key
    path = Path(key)
    if "+" not in key or path.is_file():
        try:
            key = path.read_text("utf-8").strip()
        except (OSError, UnicodeDecodeError) as e:
            raise NoteError(f"{key!r} is neither a verifier key nor a readable file") from e
    return parse_verifier_key(key)


class _WitnessDoc(msgspec.Struct, frozen=True):
    key: str
    checkpoints: dict[str, str] = {}


class WitnessFile:
    """The last checkpoint seen per workspace, in a JSON file ``{"key": vkey,
    "checkpoints": {workspace: note}}`` (replaced atomically at each change)."""

    def __init__(self, path: Path, key: NoteVerifier) -> None:
        self.path = path
        self.key = key

    def load(self) -> dict[str, str]:
        """The notes kept (none when the file does not exist yet). Raises
        :class:`ConfigError` for a file that is unreadable or kept for another key."""
        try:
            data = self.path.read_bytes()
        except FileNotFoundError:
            return {}
        except OSError as e:
            raise ConfigError(f"cannot read {self.path}: {e}", source=str(self.path)) from e
        try:
            doc = msgspec.json.decode(data, type=_WitnessDoc)
        except msgspec.MsgspecError as e:
            raise ConfigError(
                f"{self.path} is not a witness file: {e}", source=str(self.path)
            ) from e
        if doc.key != self.key.vkey():
            raise ConfigError(
                f"{self.path} keeps checkpoints of another key ({doc.key})", source=str(self.path)
            )
        return dict(doc.checkpoints)

    def save(self, notes: dict[str, str]) -> None:
        doc = _WitnessDoc(key=self.key.vkey(), checkpoints=dict(sorted(notes.items())))
        directory = self.path.parent
        directory.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=f".{self.path.name}.", suffix=".partial")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(msgspec.json.format(msgspec.json.encode(doc)) + b"\n")
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise


class CheckpointVerifier:
    """Checks checkpoints against the pinned ``key`` and what was seen before (see the module
    docstring); ``witness_file`` keeps what was seen across runs. Raises
    :class:`ConfigError` for a witness file that cannot be used."""

    def __init__(self, key: NoteVerifier, witness_file: Path | None = None) -> None:
        self.key = key
        self._file = WitnessFile(witness_file, key) if witness_file is not None else None
        self._seen: dict[str, SignedCheckpoint] = {}
        if self._file is not None:
            for workspace, note in self._file.load().items():
                try:
                    checkpoint, _ = open_checkpoint(note, key, origin=self.origin(workspace))
                except NoteError as e:
                    raise ConfigError(
                        f"{self._file.path}: the checkpoint of {workspace!r} does not verify: "
                        f"{e.message}",
                        source=str(self._file.path),
                    ) from e
                self._seen[workspace] = SignedCheckpoint(workspace, checkpoint, note, verified=True)

    def origin(self, workspace: str) -> str:
        return origin_for(self.key.name, workspace)

    def last(self, workspace: str) -> SignedCheckpoint | None:
        """The largest checkpoint of ``workspace`` seen (and checked) so far."""
        return self._seen.get(workspace)

    async def check(
        self, workspace: str, note: str, cosignatures: str, prove: Prove
    ) -> SignedCheckpoint:
        """Check the checkpoint the hub shows (``note`` and its ``cosignatures``); ``prove``
        fetches a consistency proof. Returns it verified, or raises
        :class:`TamperDetected`."""
        last = self._seen.get(workspace)
        previous = last.note if last is not None else ""
        try:
            checkpoint, _ = open_checkpoint(note, self.key, origin=self.origin(workspace))
        except NoteError as e:
            raise TamperDetected(
                f"the checkpoint of {workspace!r} the hub showed is not its own: {e.message}",
                workspace=workspace,
                previous=previous,
                current=note,
            ) from e
        shown = SignedCheckpoint(workspace, checkpoint, note, cosignatures, verified=True)
        if last is None:
            self._keep(shown)
            return shown
        old, new = last.checkpoint, checkpoint
        if old.size == new.size:
            if old.root != new.root:
                raise self._split(
                    shown, last, f"two different trees of size {new.size} signed by the hub"
                )
            return shown
        low, high = (new, old) if new.size < old.size else (old, new)
        try:
            proof = await prove(low.size, high.size)
            check_consistency(low.size, high.size, low.root, high.root, list(proof))
        except ProofError as e:
            raise self._split(shown, last, e.message) from e
        except _PROOF_REFUSALS as e:
            raise self._split(
                shown, last, f"the hub cannot prove it ({e.code}: {e.message})"
            ) from e
        if new.size > old.size:
            self._keep(shown)
        return shown

    def _split(self, shown: SignedCheckpoint, last: SignedCheckpoint, why: str) -> TamperDetected:
        return TamperDetected(
            f"the log of {shown.workspace!r} is not consistent with what this client saw "
            f"before: size {last.size} then size {shown.size}: {why}",
            workspace=shown.workspace,
            previous=last.note,
            current=shown.note,
            previousSize=last.size,
            currentSize=shown.size,
        )

    def _keep(self, shown: SignedCheckpoint) -> None:
        self._seen[shown.workspace] = shown
        if self._file is not None:
            self._file.save({w: s.note for w, s in self._seen.items()})
