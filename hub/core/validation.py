"""Validation of names, paths, ids and event drafts. Pure: raises :class:`BadRequest`/`TooLarge`.

Everything a client (or ``agora append``) sends passes :func:`validate_draft` before it can be
decided or appended, so nothing invalid reaches the log.
"""

from __future__ import annotations

import base64
import binascii
import re
from typing import Final

import msgspec

from hub.core.decoding import json_too_deep
from hub.core.errors import BadRequest, TooLarge
from hub.core.events import (
    ArtifactPublished,
    Event,
    ExecRequested,
    FileDeleted,
    FileMoved,
    FileWritten,
    encode_event,
)

WORKSPACE_RE: Final = re.compile(r"[A-Za-z0-9._-]{1,128}")
MAX_PATH_BYTES: Final = 1024
MAX_ID_BYTES: Final = 256
SHA256_RE: Final = re.compile(r"[0-9a-f]{64}")
# Characters no path or id may hold: C0 controls, DEL, C1 controls, and the bidirectional
# controls (U+202A-U+202E, U+2066-U+2069) that make a name display as another (docs/events.md).
UNSAFE_CHARS_RE: Final = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
# RFC 6838 §4.2 type/subtype names, with optional parameters (RFC 9110 §8.3.1).
MEDIA_TYPE_RE: Final = re.compile(
    r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}/[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}"
    r"(?:\s*;\s*[A-Za-z0-9!#$%&'*+.^_`|~-]+=(?:[A-Za-z0-9!#$%&'*+.^_`|~-]+|\"[^\"\\\\]*\"))*"
)
MAX_MEDIA_TYPE_BYTES: Final = 255


ENVELOPE_RESERVE: Final = 256
"""Bytes the log adds to a draft when it seals it (seq, position, timestamp, prev, hash): a
draft's encoding plus this bounds the stored event's."""

EVENT_FRAME_RESERVE: Final = 1024
"""Bytes an ``event`` frame adds around a stored event (op, workspace name, keys). The hub
keeps ``max_event_bytes`` this far below ``[limits] max_frame_bytes``, so every stored event
reaches a reader whose frame limit is the hub's (docs/protocol.md, "Limits")."""


DEFAULT_MAX_FRAME_BYTES: Final = 1024 * 1024
"""``[limits] max_frame_bytes``: the largest WebSocket frame the hub reads or sends."""


DEFAULT_MAX_BLOB_BYTES: Final = 256 * 1024 * 1024
"""``[limits] max_blob_bytes``: the largest blob one upload may store."""

DEFAULT_MAX_WORKSPACE_BYTES: Final = 4 * 1024 * 1024 * 1024
"""``[limits] max_workspace_bytes``: the quota of one workspace (its files and artifacts)."""


class Limits(msgspec.Struct, frozen=True, kw_only=True):
    """Size limits applied to drafts. Defaults are documented in docs/events.md."""

    max_file_bytes: int = 16 * 1024 * 1024
    max_event_bytes: int = DEFAULT_MAX_FRAME_BYTES - EVENT_FRAME_RESERVE
    # File content above this many bytes moves to the blob store; the event keeps its sha256.
    blob_threshold: int = 64 * 1024
    # JSON nested deeper than this is refused at every door (hub.core.decoding).
    max_depth: int = 64
    # The quota of one workspace: its files, artifacts and granted blobs (hub.workspaces).
    max_workspace_bytes: int = DEFAULT_MAX_WORKSPACE_BYTES


DEFAULT_LIMITS: Final = Limits()


def check_event_size(draft: Event, limits: Limits = DEFAULT_LIMITS) -> None:
    """Raise :class:`TooLarge` (details ``field``, ``limit``, ``size``) if ``draft``, once sealed
    and stored, could encode to more than ``limits.max_event_bytes``."""
    _check_size(len(encode_event(draft)), limits)


def _check_size(encoded: int, limits: Limits) -> None:
    size = encoded + ENVELOPE_RESERVE
    if size > limits.max_event_bytes:
        raise TooLarge(
            f"the event would be about {size} bytes stored; the limit is {limits.max_event_bytes}",
            field="event",
            limit=limits.max_event_bytes,
            size=size,
        )


def validate_workspace(name: str, field: str = "workspace") -> str:
    if not isinstance(name, str) or not WORKSPACE_RE.fullmatch(name) or name in {".", ".."}:
        raise BadRequest(
            f"invalid workspace name {name!r}: use 1-128 of [A-Za-z0-9._-]", field=field
        )
    return name


def validate_path(path: str, field: str = "path") -> str:
    """A relative, normalised POSIX path: no leading ``/``, no ``.``/``..``/empty parts, no NUL."""
    if not isinstance(path, str) or path == "":
        raise BadRequest("path must be a non-empty string", field=field)
    if "\x00" in path:
        raise BadRequest("path must not contain NUL", field=field)
    if UNSAFE_CHARS_RE.search(path):
        raise BadRequest(
            "path must not contain control characters (C0, DEL, C1) or bidirectional controls",
            field=field,
        )
    if len(path.encode("utf-8", "surrogatepass")) > MAX_PATH_BYTES:
        raise BadRequest(f"path longer than {MAX_PATH_BYTES} bytes", field=field)
    if path.startswith("/"):
        raise BadRequest(f"path {path!r} must be relative", field=field)
    for part in path.split("/"):
        if part in ("", ".", ".."):
            raise BadRequest(
                f"path {path!r} is not normalised (empty, '.' or '..' component)", field=field
            )
    return path


def validate_id(value: str, field: str) -> str:
    if not value or len(value.encode("utf-8", "surrogatepass")) > MAX_ID_BYTES:
        raise BadRequest(f"{field} must be 1-{MAX_ID_BYTES} bytes", field=field)
    if UNSAFE_CHARS_RE.search(value):
        raise BadRequest(
            f"{field} must not contain control characters (C0, DEL, C1) or bidirectional controls",
            field=field,
        )
    return value


def validate_media_type(value: str, field: str) -> str:
    """A media type ``type/subtype`` with optional ``; name=value`` parameters (RFC 6838)."""
    if (
        not isinstance(value, str)
        or len(value.encode("utf-8", "surrogatepass")) > MAX_MEDIA_TYPE_BYTES
        or not MEDIA_TYPE_RE.fullmatch(value)
    ):
        raise BadRequest(f"{field} is not a media type (type/subtype): {value[:64]!r}", field=field)
    return value


def validate_sha256(value: str, field: str) -> str:
    if not SHA256_RE.fullmatch(value):
        raise BadRequest(f"{field} must be a lowercase hex sha256", field=field)
    return value


def file_content(payload_text: str | None, payload_b64: str | None, field: str) -> bytes:
    """Decoded inline content of a ``fileWritten`` (text as UTF-8, or base64)."""
    if payload_text is not None:
        return payload_text.encode("utf-8", "surrogatepass")
    if payload_b64 is not None:
        try:
            return base64.b64decode(payload_b64, validate=True)
        except (binascii.Error, ValueError) as e:
            raise BadRequest("payload.base64 is not valid base64", field=field) from e
    return b""


TRACEPARENT_RE: Final = re.compile(
    r"(?!ff)[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}"
)
"""A W3C Trace Context ``traceparent`` (version, trace id, parent id, flags; lowercase hex,
neither id all zeros, version ``ff`` invalid)."""


def validate_traceparent(value: str, field: str = "traceparent") -> str:
    """``value`` if it is a W3C ``traceparent``; else :class:`BadRequest` naming ``field``."""
    if not TRACEPARENT_RE.fullmatch(value):
        raise BadRequest(
            f"{field} is not a W3C traceparent (00-<32 hex>-<16 hex>-<2 hex>)", field=field
        )
    return value


def validate_draft(event: Event, limits: Limits = DEFAULT_LIMITS, *, depth: bool = True) -> Event:
    """Check one draft's fields. Raises :class:`BadRequest` naming the field, or ``TooLarge``.
    ``depth=False`` leaves the payload's nesting to the caller, who checks it with the size
    (:func:`check_event_bounds`: one encoding for both)."""
    if event.id:
        validate_id(event.id, "id")
    if depth and _payload_too_deep(getattr(event, "payload", None), limits.max_depth):
        raise _payload_depth_error(limits.max_depth)
    for name in ("correlation_id", "causation_id", "topic", "consumer"):
        value = getattr(event, name)
        if value is not None:
            validate_id(value, _camel(name))
    if event.traceparent is not None:
        validate_traceparent(event.traceparent)
    match event:
        case FileWritten(payload=p):
            validate_path(p.path, "payload.path")
            sources = [s for s in (p.text, p.base64, p.blob) if s is not None]
            if len(sources) != 1:
                raise BadRequest(
                    "fileWritten needs exactly one of payload.text, payload.base64, payload.blob",
                    field="payload",
                )
            if p.blob is not None:
                validate_sha256(p.blob, "payload.blob")
            else:
                size = len(file_content(p.text, p.base64, "payload.base64"))
                if size > limits.max_file_bytes:
                    raise TooLarge(
                        f"file content is {size} bytes; the limit is {limits.max_file_bytes}",
                        field="payload",
                        limit=limits.max_file_bytes,
                    )
            _check_base_rev(p.base_rev)
        case FileDeleted(payload=p):
            validate_path(p.path, "payload.path")
            _check_base_rev(p.base_rev)
        case FileMoved(payload=p):
            validate_path(p.from_, "payload.from")
            validate_path(p.to, "payload.to")
            if p.from_ == p.to:
                raise BadRequest("payload.from and payload.to are the same", field="payload.to")
            _check_base_rev(p.base_rev)
        case ArtifactPublished(payload=p):
            validate_id(p.key, "payload.key")
            validate_media_type(p.media_type, "payload.mediaType")
            if p.blob:
                validate_sha256(p.blob, "payload.blob")
            if p.size_bytes < 0:
                raise BadRequest("payload.sizeBytes must be >= 0", field="payload.sizeBytes")
        case _:
            pass
    return event


_payload_encoder: Final = msgspec.json.Encoder()


def _payload_depth_error(limit: int) -> BadRequest:
    return BadRequest(
        f"payload is nested deeper than the limit of {limit} levels", field="payload", limit=limit
    )


def check_event_bounds(draft: Event, limits: Limits = DEFAULT_LIMITS) -> None:
    """:func:`check_event_size` and the payload's nesting (what :func:`validate_draft` checks
    unless told ``depth=False``) from ONE encoding of ``draft``: only the payload nests in an
    event (every other field is a scalar), so the event is one level deeper than its
    payload. Raises :class:`BadRequest` (details ``field``: ``payload``, ``limit``) or
    :class:`TooLarge` as :func:`check_event_size`."""
    try:
        encoded = encode_event(draft)
    except RecursionError:  # too deep for the encoder's own guard
        raise _payload_depth_error(limits.max_depth) from None
    if json_too_deep(encoded, limits.max_depth + 1):
        raise _payload_depth_error(limits.max_depth)
    _check_size(len(encoded), limits)


def _payload_too_deep(payload: object, limit: int) -> bool:
    """Whether ``payload`` nests deeper than ``limit``: encoded (C speed) and its brackets
    counted (hub.core.decoding), which costs a fraction of walking a typed payload in Python.
    A payload too deep for the encoder's own recursion guard is too deep."""
    try:
        return json_too_deep(_payload_encoder.encode(payload), limit)
    except RecursionError:
        return True


def _check_base_rev(rev: int | None) -> None:
    if rev is not None and rev < 0:
        raise BadRequest("payload.baseRev must be >= 0", field="payload.baseRev")


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)


BACKEND_ID_RE: Final = re.compile(r"[A-Za-z0-9._-]{1,128}")


def validate_backend_id(value: str, field: str = "backend") -> str:
    """A backend instance id: 1-128 of ``[A-Za-z0-9._-]`` (not ``.``/``..``), or raise
    :class:`BadRequest` naming ``field``."""
    if not isinstance(value, str) or not BACKEND_ID_RE.fullmatch(value) or value in {".", ".."}:
        raise BadRequest(f"invalid backend id {value!r}: use 1-128 of [A-Za-z0-9._-]", field=field)
    return value


REFERENCING_KINDS: Final = frozenset({FileWritten, ArtifactPublished, ExecRequested})
"""The event types :func:`blob_refs` can find a reference in (a long walk skips the others
with one set lookup per event)."""


def blob_refs(event: Event) -> list[str]:
    """The sha256 of every blob an event references (file content, artifact, guest module);
    a reference that is not a well-formed sha256 cannot name a blob and is left out."""
    match event:
        case FileWritten(payload=p) if p.blob is not None:
            refs = [p.blob]
        case ArtifactPublished(payload=p) if p.blob:
            refs = [p.blob]
        case ExecRequested(payload=p) if p.module is not None:
            refs = [p.module.blob]
        case _:
            return []
    return [r for r in refs if SHA256_RE.fullmatch(r)]
