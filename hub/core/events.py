"""The event model: the envelope every fact in Agora is written as, and one Struct per kind.

Pure: no I/O. JSON is camelCase and a superset of adk-code's ``CollaborationEvent``
(``correlationId, topic, producer, consumer, kind, payload, timestamp``), so an adk-code event
decodes as is. ``kind`` is the tag of a msgspec tagged union; tags are explicit strings and never
derived from class names, so renaming a class cannot orphan stored events.

Schema evolution (msgspec's rule): stored events only ever gain optional fields with defaults;
a field's type never changes. Reading the log ignores unknown fields, so old hubs can read logs
written by newer ones.
"""

from __future__ import annotations

from typing import Any, ClassVar, Final, Literal

import msgspec

# ---------------------------------------------------------------------------------------------
# Payloads


# gc=False: events and payloads never form reference cycles, and untracking them keeps the
# garbage collector from rescanning every decoded event during a replay (3x faster decode).
class Payload(
    msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True, gc=False
):
    """Base of the typed payloads."""


class MessagePayload(Payload, frozen=True):
    """``messagePosted``: free text and/or structured data (e.g. A2A message parts)."""

    text: str | None = None
    data: Any = None
    media_type: str | None = None


class MemberPayload(Payload, frozen=True):
    """``memberJoined`` / ``memberLeft``: who came or went and through which door.

    ``node``: the hub node (``agora serve`` process) whose connection the agent came or went
    through, so that the survivor reaping a dead node can tell who was present only through it
    (:mod:`hub.core.rules.presence`). Absent in events written before it was recorded and in
    memberships not tied to a connection (A2A)."""

    agent: str
    via: str = "websocket"
    card_url: str | None = None
    reason: str | None = None
    node: str | None = None


class FileWrittenPayload(Payload, frozen=True):
    """``fileWritten``. Exactly one of ``text``, ``base64`` or ``blob`` carries the content.

    The hub fills ``sha256`` and ``size`` (of the decoded content) and moves content larger than
    the blob threshold into the blob store, leaving only ``blob`` (its sha256) in the event.
    ``baseRev``: the file revision the writer saw; ``0`` means "the file must not exist".
    """

    path: str
    text: str | None = None
    base64: str | None = None
    blob: str | None = None
    base_rev: int | None = None
    sha256: str | None = None
    size: int | None = None
    media_type: str | None = None


class FileDeletedPayload(Payload, frozen=True):
    path: str
    base_rev: int | None = None


class FileMovedPayload(Payload, frozen=True):
    from_: str = msgspec.field(name="from")
    to: str
    base_rev: int | None = None


class ArtifactPayload(Payload, frozen=True):
    """``artifactPublished``: a named output; content lives in the blob store under ``blob``."""

    key: str
    media_type: str = "application/octet-stream"
    size_bytes: int = 0
    sha256: str = ""
    blob: str = ""
    exec_id: str | None = None


class ExecModuleRef(Payload, frozen=True):
    """A guest module by content hash (an artifact or file already in the blob store)."""

    blob: str


class ExecRequestedPayload(Payload, frozen=True):
    """``execRequested``: the request as accepted, without secrets (env values are dropped).

    ``node``: the hub node (``agora serve`` process) that accepted it and will run it, so that
    the survivor reaping a dead node also closes what it accepted and never started
    (:func:`hub.core.rules.recovery.left_open`). Absent in events written before it was
    recorded."""

    exec_id: str
    backend: str
    language: str | None = None
    source: str | None = None
    module: ExecModuleRef | None = None
    argv: list[str] = []
    stdin: bytes | None = None
    input: Any = None
    env_keys: list[str] = []
    cwd: str | None = None
    timeout_ms: int | None = None
    encoding: str | None = None
    policy: Any = None
    node: str | None = None


class ExecCancelRequestedPayload(Payload, frozen=True):
    exec_id: str
    reason: str | None = None


class ExecStartedPayload(Payload, frozen=True):
    exec_id: str
    backend: str
    isolation: str | None = None
    node: str | None = None


class ExecOutputPayload(Payload, frozen=True):
    """One coalesced chunk of output; ``n`` is 1-based and contiguous per execution."""

    exec_id: str
    stream: Literal["stdout", "stderr"]
    n: int
    data: bytes


class SkippedWrite(Payload, frozen=True):
    path: str
    mount_root: str
    op: Literal["write", "delete"]
    reason: str = "read-only"


class ArtifactRef(Payload, frozen=True):
    key: str
    size_bytes: int
    content_type: str = "application/octet-stream"
    sha256: str | None = None


class ExecFinishedPayload(Payload, frozen=True):
    exec_id: str
    status: Literal["completed", "failed", "cancelled"]
    reason: str
    exit_code: int = -1
    value: Any = None
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration_ms: int = 0
    pushed: int = 0
    pulled: int = 0
    skipped: list[SkippedWrite] = []
    diagnostics: list[Any] = []
    artifacts: list[ArtifactRef] = []


class ExecDisposedPayload(Payload, frozen=True):
    """``reason``: ``retention`` when the runtime pruned it (absent for a ``dispose`` op)."""

    exec_id: str
    reason: str | None = None


class TokenRevokedPayload(Payload, frozen=True):
    """``tokenRevoked`` (in the hub system workspace only): the token ``tokenId``, and/or
    every token of ``agent`` issued at or before ``before`` (epoch seconds), is refused from
    now on. At least one of ``tokenId`` and ``agent`` is set; ``before`` goes with ``agent``."""

    token_id: str | None = None
    agent: str | None = None
    before: int | None = None
    reason: str | None = None


class PushAttemptedPayload(Payload, frozen=True):
    """``pushAttempted``: one attempt of the A2A adapter to deliver a push notification
    (a2a_adapter/push.py) for task ``taskId`` to the webhook of config ``configId``.

    ``url`` is the webhook without its query or fragment (which may carry secrets); ``seq``
    the event the notification stands for, ``state`` the task state it reports. ``outcome``:
    ``delivered`` (2xx), ``retry`` (failed, another attempt follows), ``failed`` (no more
    attempts), ``refused`` (the URL is no longer allowed, or the config's token ended).
    ``status``: the HTTP status, if one came back; ``error``: why it failed."""

    task_id: str
    config_id: str
    url: str
    seq: int
    state: str
    attempt: int
    outcome: Literal["delivered", "retry", "failed", "refused"]
    status: int | None = None
    error: str | None = None


# ---------------------------------------------------------------------------------------------
# The envelope


class Event(
    msgspec.Struct,
    frozen=True,
    kw_only=True,
    rename="camel",
    omit_defaults=True,
    tag_field="kind",
    gc=False,
):
    """The envelope (contract: ARCHITECTURE.md "The event envelope").

    A *draft* is an Event whose ``seq`` is 0; the log seals it (``hub.core.chain.seal``) by setting
    ``id`` (if empty), ``seq``, ``position``, ``timestamp``, ``producer``, ``prev`` and ``hash``.
    """

    kind: ClassVar[str]

    id: str = ""
    workspace: str = ""
    seq: int = 0
    position: int = 0
    timestamp: int = 0
    producer: str = ""
    consumer: str | None = None
    topic: str | None = None
    correlation_id: str | None = None
    causation_id: str | None = None
    # A W3C trace context (``00-<trace id>-<span id>-<flags>``): the trace the action that
    # wrote this event belongs to (docs/operations.md, "Tracing"). Optional and omitted when
    # None, so events without one encode, and hash, exactly as before the field existed.
    traceparent: str | None = None
    prev: str | None = None
    hash: str | None = None


# Collaboration: adk-code's seven kinds plus workCancelled. Their payload is any JSON, as in
# adk-code (serde_json::Value), so existing agents keep working unchanged.


class NeedWork(Event, tag="needWork", frozen=True):
    kind: ClassVar[str] = "needWork"
    payload: Any = None


class WorkClaimed(Event, tag="workClaimed", frozen=True):
    kind: ClassVar[str] = "workClaimed"
    payload: Any = None


class WorkPublished(Event, tag="workPublished", frozen=True):
    kind: ClassVar[str] = "workPublished"
    payload: Any = None


class FeedbackRequested(Event, tag="feedbackRequested", frozen=True):
    kind: ClassVar[str] = "feedbackRequested"
    payload: Any = None


class FeedbackProvided(Event, tag="feedbackProvided", frozen=True):
    kind: ClassVar[str] = "feedbackProvided"
    payload: Any = None


class Blocked(Event, tag="blocked", frozen=True):
    kind: ClassVar[str] = "blocked"
    payload: Any = None


class Completed(Event, tag="completed", frozen=True):
    kind: ClassVar[str] = "completed"
    payload: Any = None


class WorkCancelled(Event, tag="workCancelled", frozen=True):
    kind: ClassVar[str] = "workCancelled"
    payload: Any = None


class MessagePosted(Event, tag="messagePosted", frozen=True):
    kind: ClassVar[str] = "messagePosted"
    payload: MessagePayload = MessagePayload()


class MemberJoined(Event, tag="memberJoined", frozen=True):
    kind: ClassVar[str] = "memberJoined"
    payload: MemberPayload


class MemberLeft(Event, tag="memberLeft", frozen=True):
    kind: ClassVar[str] = "memberLeft"
    payload: MemberPayload


class FileWritten(Event, tag="fileWritten", frozen=True):
    kind: ClassVar[str] = "fileWritten"
    payload: FileWrittenPayload


class FileDeleted(Event, tag="fileDeleted", frozen=True):
    kind: ClassVar[str] = "fileDeleted"
    payload: FileDeletedPayload


class FileMoved(Event, tag="fileMoved", frozen=True):
    kind: ClassVar[str] = "fileMoved"
    payload: FileMovedPayload


class ArtifactPublished(Event, tag="artifactPublished", frozen=True):
    kind: ClassVar[str] = "artifactPublished"
    payload: ArtifactPayload


class ExecRequested(Event, tag="execRequested", frozen=True):
    kind: ClassVar[str] = "execRequested"
    payload: ExecRequestedPayload


class ExecCancelRequested(Event, tag="execCancelRequested", frozen=True):
    kind: ClassVar[str] = "execCancelRequested"
    payload: ExecCancelRequestedPayload


class ExecStarted(Event, tag="execStarted", frozen=True):
    kind: ClassVar[str] = "execStarted"
    payload: ExecStartedPayload


class ExecOutput(Event, tag="execOutput", frozen=True):
    kind: ClassVar[str] = "execOutput"
    payload: ExecOutputPayload


class ExecFinished(Event, tag="execFinished", frozen=True):
    kind: ClassVar[str] = "execFinished"
    payload: ExecFinishedPayload


class ExecDisposed(Event, tag="execDisposed", frozen=True):
    kind: ClassVar[str] = "execDisposed"
    payload: ExecDisposedPayload


# The hub's own records, in the system workspace (``hub.core.capability.SYSTEM_WORKSPACE``).


class TokenRevoked(Event, tag="tokenRevoked", frozen=True):
    kind: ClassVar[str] = "tokenRevoked"
    payload: TokenRevokedPayload


class PushAttempted(Event, tag="pushAttempted", frozen=True):
    kind: ClassVar[str] = "pushAttempted"
    payload: PushAttemptedPayload


AnyEvent = (
    NeedWork
    | WorkClaimed
    | WorkPublished
    | FeedbackRequested
    | FeedbackProvided
    | Blocked
    | Completed
    | WorkCancelled
    | MessagePosted
    | MemberJoined
    | MemberLeft
    | FileWritten
    | FileDeleted
    | FileMoved
    | ArtifactPublished
    | ExecRequested
    | ExecCancelRequested
    | ExecStarted
    | ExecOutput
    | ExecFinished
    | ExecDisposed
    | TokenRevoked
    | PushAttempted
)

EVENT_TYPES: Final[tuple[type[Event], ...]] = (
    NeedWork,
    WorkClaimed,
    WorkPublished,
    FeedbackRequested,
    FeedbackProvided,
    Blocked,
    Completed,
    WorkCancelled,
    MessagePosted,
    MemberJoined,
    MemberLeft,
    FileWritten,
    FileDeleted,
    FileMoved,
    ArtifactPublished,
    ExecRequested,
    ExecCancelRequested,
    ExecStarted,
    ExecOutput,
    ExecFinished,
    ExecDisposed,
    TokenRevoked,
    PushAttempted,
)
KINDS: Final[dict[str, type[Event]]] = {t.kind: t for t in EVENT_TYPES}

COLLABORATION_KINDS: Final[frozenset[str]] = frozenset(
    {
        "needWork",
        "workClaimed",
        "workPublished",
        "feedbackRequested",
        "feedbackProvided",
        "blocked",
        "completed",
        "workCancelled",
    }
)
# Kinds only the hub (runtime, presence, ``agora token revoke``) may write; clients get
# ``forbidden``.
HUB_KINDS: Final[frozenset[str]] = frozenset(
    {
        "memberJoined",
        "memberLeft",
        "execStarted",
        "execOutput",
        "execFinished",
        "execDisposed",
        "tokenRevoked",
        "pushAttempted",
    }
)
# Kinds a client may only produce through a dedicated op (``exec``, ``kill``), not ``publish``.
OP_KINDS: Final[frozenset[str]] = frozenset({"execRequested", "execCancelRequested"})

_decoder: Final = msgspec.json.Decoder(AnyEvent)
_list_decoder: Final = msgspec.json.Decoder(list[AnyEvent])
_encoder: Final = msgspec.json.Encoder()


def decode_event(data: bytes | str) -> Event:
    """Decode one event (stored or draft). Raises ``msgspec.ValidationError``/``DecodeError``."""
    return _decoder.decode(data)


def decode_events(data: bytes) -> list[Event]:
    """Decode a JSON array of events in one call (much faster than one call per event)."""
    return list(_list_decoder.decode(data))


def encode_event(event: Event) -> bytes:
    """The wire/storage encoding: camelCase JSON, defaults omitted."""
    return _encoder.encode(event)


def event_to_builtins(event: Event) -> dict[str, Any]:
    out: dict[str, Any] = msgspec.to_builtins(event)
    return out


def event_from_builtins(obj: Any) -> Event:
    """Convert decoded JSON (a dict) into a typed event. Raises ``msgspec.ValidationError``."""
    ev: Event = msgspec.convert(obj, AnyEvent)
    return ev
