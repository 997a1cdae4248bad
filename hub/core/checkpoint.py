"""Signed checkpoints: C2SP tlog-checkpoint bodies in C2SP signed notes, Ed25519. No I/O.

Formats (written from the specs; docs/audit.md shows examples):

* **Signed note** (c2sp.org/signed-note): UTF-8 text ending in a newline, a blank line, then
  one or more signature lines ``— <key name> <base64(key ID || signature)>``. No control
  characters but newline; the text ends at the last blank line. Key names are non-empty,
  without spaces or ``+``. ``key ID = SHA-256(name || 0x0A || type || public key)[:4]``,
  big-endian; type 0x01 is Ed25519 over the note text.
* **Verifier key** (the ``vkey`` form of golang.org/x/mod/sumdb/note):
  ``<name>+<key ID as 8 hex digits>+<base64(type || public key)>``; the signer key is
  ``PRIVATE+KEY+<name>+<key ID>+<base64(0x01 || 32-byte seed)>`` (what
  ``agora-data/checkpoint.key`` holds).
* **Checkpoint** (c2sp.org/tlog-checkpoint): the note text is the origin line, the tree size
  in decimal (no leading zeroes), the base64 root hash, then optional non-empty extension
  lines. Agora's origin is ``agora.<hub id>/<workspace>``, signed by the hub's key named
  ``agora.<hub id>`` (one key for every workspace of the hub).
* **Cosignature** (c2sp.org/tlog-cosignature, Ed25519 v1): a note signature of type 0x04 whose
  bytes are ``key ID || u64 big-endian timestamp || Ed25519 signature`` over
  ``"cosignature/v1\\ntime <timestamp>\\n" || the whole note text``.

Parsing is strict (:class:`NoteError`, a :class:`hub.core.errors.BadRequest`: whoever handed
over the text is at fault) and formatting exact: ``format_note(parse_note(x)) == x`` for
every note that parses.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from collections.abc import Iterable, Sequence
from typing import Final

import msgspec
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)

from hub.core.errors import BadRequest
from hub.core.merkle import HASH_SIZE

ED25519: Final = 0x01
"""Signature type of an Ed25519 note signature (c2sp.org/signed-note)."""
COSIGNATURE_V1: Final = 0x04
"""Signature type of a timestamped Ed25519 cosignature (c2sp.org/tlog-cosignature)."""

ORIGIN_PREFIX: Final = "agora."
MAX_SIGNATURES: Final = 64  # the spec asks to accept at least 16
MAX_NOTE_BYTES: Final = 64 * 1024
_DASH: Final = "\u2014 "
_PRIVATE: Final = "PRIVATE+KEY+"
_COSIGNATURE_HEADER: Final = "cosignature/v1\n"
_SIZE_RE: Final = re.compile(r"0|[1-9][0-9]{0,18}")
_HEX8_RE: Final = re.compile(r"[0-9a-f]{8}")
_CONTROL_RE: Final = re.compile(r"[\x00-\x09\x0b-\x1f]")
_SPACE_RE: Final = re.compile(r"\s")
_MAX_TIMESTAMP: Final = 2**63 - 1


class NoteError(BadRequest):
    """A note, checkpoint or key that does not parse, or a signature that does not verify.
    ``details``: ``reason`` (a short stable word: ``format``, ``signature``, ``unsigned``,
    ``origin``, ``key``)."""


def _error(message: str, reason: str = "format") -> NoteError:
    return NoteError(message, reason=reason)


def _b64decode(text: str, what: str) -> bytes:
    try:
        data = base64.b64decode(text.encode("ascii"), validate=True)
    except (binascii.Error, UnicodeEncodeError, ValueError) as e:
        raise _error(f"{what} is not valid base64") from e
    if base64.b64encode(data).decode("ascii") != text:
        raise _error(f"{what} is not canonical base64")
    return data


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def check_key_name(name: str) -> str:
    """``name`` if it is a valid note key name (non-empty, no spaces, no ``+``), else
    :class:`NoteError`."""
    if not name or _SPACE_RE.search(name) or "+" in name or _CONTROL_RE.search(name):
        raise _error(f"invalid key name {name!r}", "key")
    return name


def key_id(name: str, sig_type: int, public_key: bytes) -> int:
    """SHA-256(name || 0x0A || type || public key)[:4] as a big-endian uint32."""
    digest = hashlib.sha256(name.encode() + b"\n" + bytes([sig_type]) + public_key).digest()
    return int.from_bytes(digest[:4], "big")


# -- notes ------------------------------------------------------------------------------------


class Signature(msgspec.Struct, frozen=True):
    """One signature line: the key's name and ID, and the signature bytes after the ID."""

    name: str
    key_id: int
    data: bytes

    def line(self) -> str:
        return f"{_DASH}{self.name} {_b64(self.key_id.to_bytes(4, 'big') + self.data)}\n"


class Note(msgspec.Struct, frozen=True):
    """A signed note: its text (ending in a newline) and its signatures, in order."""

    text: str
    signatures: tuple[Signature, ...]


def parse_note(data: str | bytes) -> Note:
    """Parse a signed note strictly. Raises :class:`NoteError`."""
    if isinstance(data, bytes):
        if len(data) > MAX_NOTE_BYTES:
            raise _error(f"a note is at most {MAX_NOTE_BYTES} bytes")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise _error("a note must be UTF-8") from e
    else:
        text = data
        if len(text.encode("utf-8", "surrogatepass")) > MAX_NOTE_BYTES:
            raise _error(f"a note is at most {MAX_NOTE_BYTES} bytes")
    if _CONTROL_RE.search(text):
        raise _error("a note must not contain control characters other than newline")
    if not text.endswith("\n"):
        raise _error("a note must end with a newline")
    split = text.rfind("\n\n")
    if split < 0:
        raise _error("a note needs a blank line before its signatures")
    body, sigs = text[: split + 1], text[split + 2 :]
    lines = sigs.split("\n")[:-1]
    if not lines:
        raise _error("a note needs at least one signature", "unsigned")
    if len(lines) > MAX_SIGNATURES:
        raise _error(f"a note has at most {MAX_SIGNATURES} signatures")
    signatures = tuple(_parse_signature_line(line) for line in lines)
    return Note(text=body, signatures=signatures)


def _parse_signature_line(line: str) -> Signature:
    if not line.startswith(_DASH):
        raise _error(f"not a signature line: {line[:40]!r}")
    name, sep, encoded = line[len(_DASH) :].partition(" ")
    if not sep:
        raise _error("a signature line needs a key name and a signature")
    check_key_name(name)
    raw = _b64decode(encoded, f"the signature of {name!r}")
    if len(raw) < 5:
        raise _error(f"the signature of {name!r} is too short")
    return Signature(name=name, key_id=int.from_bytes(raw[:4], "big"), data=raw[4:])


def format_note(note: Note) -> str:
    """The note's text form (the inverse of :func:`parse_note`)."""
    if not note.text.endswith("\n") or not note.signatures:
        raise _error("a note needs text ending in a newline and at least one signature")
    return note.text + "\n" + "".join(s.line() for s in note.signatures)


# -- keys -------------------------------------------------------------------------------------


class NoteVerifier:
    """A public key that checks note signatures of one type (Ed25519 0x01, cosignature 0x04)."""

    __slots__ = ("_key", "key_id", "name", "public_key", "sig_type")

    def __init__(self, name: str, sig_type: int, public_key: bytes) -> None:
        if sig_type not in (ED25519, COSIGNATURE_V1):
            raise _error(f"unsupported signature type 0x{sig_type:02x}", "key")
        if len(public_key) != 32:
            raise _error("an Ed25519 public key is 32 bytes", "key")
        self.name = check_key_name(name)
        self.sig_type = sig_type
        self.public_key = public_key
        self.key_id = key_id(name, sig_type, public_key)
        self._key = Ed25519PublicKey.from_public_bytes(public_key)

    def __repr__(self) -> str:
        return f"NoteVerifier({self.vkey()!r})"

    def vkey(self) -> str:
        """The verifier key text ``<name>+<key ID hex>+<base64(type || public key)>``."""
        return f"{self.name}+{self.key_id:08x}+{_b64(bytes([self.sig_type]) + self.public_key)}"

    def matches(self, signature: Signature) -> bool:
        """Whether the signature line claims to be by this key (same name and key ID)."""
        return signature.name == self.name and signature.key_id == self.key_id

    def verify(self, text: str, signature: Signature) -> int | None:
        """Check ``signature`` (one of this key's) over the note ``text``. Returns the
        cosignature's timestamp (0 for a plain Ed25519 signature). Raises
        :class:`NoteError` (``reason='signature'``) when it does not verify."""
        message = text.encode("utf-8")
        data = signature.data
        timestamp = 0
        if self.sig_type == COSIGNATURE_V1:
            if len(data) != 8 + 64:
                raise _error(f"the cosignature of {self.name!r} has the wrong size", "signature")
            timestamp = int.from_bytes(data[:8], "big")
            if timestamp > _MAX_TIMESTAMP:
                raise _error(f"the cosignature of {self.name!r} has a bad time", "signature")
            message = cosigned_message(text, timestamp)
            data = data[8:]
        elif len(data) != 64:
            raise _error(f"the signature of {self.name!r} has the wrong size", "signature")
        try:
            self._key.verify(data, message)
        except InvalidSignature as e:
            raise _error(f"the signature of {self.name!r} does not verify", "signature") from e
        return timestamp


def cosigned_message(text: str, timestamp: int) -> bytes:
    """What a cosignature/v1 signs: the header line, the time line, the whole note text."""
    return f"{_COSIGNATURE_HEADER}time {timestamp}\n{text}".encode()


def parse_verifier_key(vkey: str) -> NoteVerifier:
    """Parse ``<name>+<hex key ID>+<base64(type || public key)>``. Raises :class:`NoteError`
    (also when the key ID does not match the name and key)."""
    parts = vkey.strip().split("+", 2)
    if len(parts) != 3 or not _HEX8_RE.fullmatch(parts[1]):
        raise _error("a verifier key is <name>+<8 hex digits>+<base64 key>", "key")
    name, hex_id, encoded = parts
    raw = _b64decode(encoded, "the verifier key")
    if len(raw) != 33:
        raise _error("a verifier key holds a type byte and a 32-byte Ed25519 key", "key")
    verifier = NoteVerifier(name, raw[0], raw[1:])
    if verifier.key_id != int(hex_id, 16):
        raise _error(f"the key ID {hex_id} does not match the key of {name!r}", "key")
    return verifier


class NoteSigner:
    """An Ed25519 private key that signs notes (type 0x01) or cosigns checkpoints (0x04)."""

    __slots__ = ("_key", "seed", "sig_type", "verifier")

    def __init__(self, name: str, seed: bytes, sig_type: int = ED25519) -> None:
        if len(seed) != 32:
            raise _error("an Ed25519 private key seed is 32 bytes", "key")
        self._key = Ed25519PrivateKey.from_private_bytes(seed)
        self.seed = seed
        self.sig_type = sig_type
        public = self._key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)
        self.verifier = NoteVerifier(name, sig_type, public)

    def __repr__(self) -> str:
        return f"NoteSigner({self.verifier.vkey()!r})"  # never the private key

    @property
    def name(self) -> str:
        return self.verifier.name

    def skey(self) -> str:
        """``PRIVATE+KEY+<name>+<key ID hex>+<base64(type || seed)>`` (keep it secret)."""
        v = self.verifier
        return f"{_PRIVATE}{v.name}+{v.key_id:08x}+{_b64(bytes([self.sig_type]) + self.seed)}"

    def sign(self, text: str, *, timestamp: int = 0) -> Signature:
        """A signature over the note ``text`` (for a cosigner: at ``timestamp``, in POSIX
        seconds)."""
        if self.sig_type == COSIGNATURE_V1:
            if not 0 <= timestamp <= _MAX_TIMESTAMP:
                raise _error("a cosignature time is 0..2^63-1", "signature")
            data = timestamp.to_bytes(8, "big") + self._key.sign(cosigned_message(text, timestamp))
        else:
            data = self._key.sign(text.encode("utf-8"))
        return Signature(name=self.name, key_id=self.verifier.key_id, data=data)


def generate_signer(name: str, sig_type: int = ED25519) -> NoteSigner:
    """A new random key named ``name``."""
    key = Ed25519PrivateKey.generate()
    seed = key.private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    return NoteSigner(name, seed, sig_type)


def parse_signer_key(skey: str) -> NoteSigner:
    """Parse ``PRIVATE+KEY+<name>+<hex key ID>+<base64(type || seed)>``. Raises
    :class:`NoteError` (without echoing the key)."""
    text = skey.strip()
    if not text.startswith(_PRIVATE):
        raise _error("a signer key starts with PRIVATE+KEY+", "key")
    parts = text[len(_PRIVATE) :].split("+", 2)
    if len(parts) != 3 or not _HEX8_RE.fullmatch(parts[1]):
        raise _error("a signer key is PRIVATE+KEY+<name>+<8 hex digits>+<base64 key>", "key")
    name, hex_id, encoded = parts
    raw = _b64decode(encoded, "the signer key")
    if len(raw) != 33:
        raise _error("a signer key holds a type byte and a 32-byte Ed25519 seed", "key")
    signer = NoteSigner(name, raw[1:], raw[0])
    if signer.verifier.key_id != int(hex_id, 16):
        raise _error(f"the key ID {hex_id} does not match the key of {name!r}", "key")
    return signer


def sign_note(text: str, signers: Iterable[NoteSigner], *, timestamp: int = 0) -> str:
    """The signed note of ``text`` by each of ``signers``."""
    signatures = tuple(s.sign(text, timestamp=timestamp) for s in signers)
    return format_note(Note(text=text, signatures=signatures))


def add_signatures(note: Note, signatures: Iterable[Signature]) -> Note:
    """``note`` with ``signatures`` added, replacing any earlier one by the same key."""
    new = list(signatures)
    keys = {(s.name, s.key_id) for s in new}
    kept = [s for s in note.signatures if (s.name, s.key_id) not in keys]
    return Note(text=note.text, signatures=(*kept, *new))


def verified_by(note: Note, verifier: NoteVerifier) -> int | None:
    """The timestamp (0 for type 0x01) of ``verifier``'s signature on ``note``, or None when
    the note has none from that key. Raises :class:`NoteError` when it has one that fails:
    a known key's bad signature rejects the whole note (c2sp.org/signed-note)."""
    found: int | None = None
    for signature in note.signatures:
        if verifier.matches(signature):
            found = verifier.verify(note.text, signature)
    return found


def open_note(data: str | bytes, verifiers: Sequence[NoteVerifier]) -> Note:
    """Parse ``data`` and require a valid signature from the first of ``verifiers`` (the
    log's key); signatures from unknown keys are ignored. Raises :class:`NoteError`."""
    note = parse_note(data)
    if not verifiers:
        raise _error("no key to verify the note with", "key")
    log, *others = verifiers
    if verified_by(note, log) is None:
        raise _error(f"the note is not signed by {log.name!r}", "unsigned")
    for other in others:
        verified_by(note, other)  # optional, but a known key's bad signature still fails
    return note


# -- checkpoints ------------------------------------------------------------------------------


class Checkpoint(msgspec.Struct, frozen=True):
    """A tree head: the log's origin, its size and root hash (c2sp.org/tlog-checkpoint)."""

    origin: str
    size: int
    root: bytes
    extensions: tuple[str, ...] = ()

    def body(self) -> str:
        """The note text: origin, size, base64 root, extension lines, each ending in \\n."""
        lines = [self.origin, str(self.size), _b64(self.root), *self.extensions]
        return "".join(f"{line}\n" for line in lines)


class CheckpointRecord(msgspec.Struct, frozen=True):
    """A checkpoint as a store keeps it: the signed note the hub produced and the
    cosignature lines (``— <witness> <base64>\n`` each) witnesses handed back since."""

    workspace: str
    size: int
    note: str
    cosignatures: str = ""

    def signed(self) -> str:
        """The whole signed note: the hub's signature then every cosignature."""
        return self.note + self.cosignatures


def parse_checkpoint(text: str) -> Checkpoint:
    """Parse a checkpoint note text (not the signatures). Raises :class:`NoteError`."""
    if not text.endswith("\n"):
        raise _error("a checkpoint ends with a newline")
    lines = text[:-1].split("\n")
    if len(lines) < 3 or any(not line for line in lines):
        raise _error("a checkpoint has at least three non-empty lines")
    origin, size, root = lines[0], lines[1], lines[2]
    if _CONTROL_RE.search(text):
        raise _error("a checkpoint must not contain control characters")
    if not _SIZE_RE.fullmatch(size) or int(size) > 2**63 - 1:
        raise _error(f"the tree size {size[:30]!r} is not a decimal without leading zeroes")
    digest = _b64decode(root, "the root hash")
    if len(digest) != HASH_SIZE:
        raise _error(f"the root hash is not {HASH_SIZE} bytes")
    return Checkpoint(origin=origin, size=int(size), root=digest, extensions=tuple(lines[3:]))


def origin_for(key_name: str, workspace: str) -> str:
    """The origin line of ``workspace``'s log on the hub whose key is named ``key_name``."""
    return f"{key_name}/{workspace}"


def key_name_for(hub_id: str) -> str:
    """The checkpoint key name of the hub ``hub_id``: ``agora.<hub id>``."""
    return check_key_name(f"{ORIGIN_PREFIX}{hub_id}")


def sign_checkpoint(checkpoint: Checkpoint, signer: NoteSigner) -> str:
    """The signed note of ``checkpoint`` by the log's ``signer``."""
    return sign_note(checkpoint.body(), [signer])


def open_checkpoint(
    data: str | bytes,
    verifier: NoteVerifier,
    *,
    origin: str | None = None,
    witnesses: Sequence[NoteVerifier] = (),
) -> tuple[Checkpoint, Note]:
    """Parse a signed checkpoint; require the log's signature (``verifier``), the ``origin``
    when given, and a valid cosignature from each of ``witnesses``. Raises
    :class:`NoteError`."""
    note = open_note(data, [verifier])
    checkpoint = parse_checkpoint(note.text)
    if origin is not None and checkpoint.origin != origin:
        raise _error(f"the checkpoint is of {checkpoint.origin!r}, not {origin!r}", "origin")
    for witness in witnesses:
        if verified_by(note, witness) is None:
            raise _error(f"the checkpoint is not cosigned by {witness.name!r}", "unsigned")
    return checkpoint, note


__all__ = [
    "COSIGNATURE_V1",
    "ED25519",
    "Checkpoint",
    "CheckpointRecord",
    "Note",
    "NoteError",
    "NoteSigner",
    "NoteVerifier",
    "Signature",
    "add_signatures",
    "check_key_name",
    "cosigned_message",
    "format_note",
    "generate_signer",
    "key_id",
    "key_name_for",
    "open_checkpoint",
    "open_note",
    "origin_for",
    "parse_checkpoint",
    "parse_note",
    "parse_signer_key",
    "parse_verifier_key",
    "sign_checkpoint",
    "sign_note",
    "verified_by",
]
