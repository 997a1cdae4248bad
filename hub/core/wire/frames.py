"""Wire frames of the WebSocket protocol ``agora.v1`` (contract: ARCHITECTURE.md "Wire protocol").

Pure. JSON text frames, camelCase. Every frame is tagged by ``op``; client frames may carry a
``rid`` that the reply repeats. Inbound client frames forbid unknown fields (a typo is a
``badRequest`` naming it); server frames are read leniently by the client so the server can
grow fields. Documented in docs/protocol.md; JSON Schema in schemas/protocol.json.
"""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

import msgspec

from hub.core.events import AnyEvent, ArtifactRef, SkippedWrite
from hub.core.execution.policy import PolicyPatch

Rid = str | int | None
Seq = Annotated[int, msgspec.Meta(ge=0)]

SUBPROTOCOL: Final = "agora.v1"


class ClientFrame(
    msgspec.Struct,
    frozen=True,
    kw_only=True,
    rename="camel",
    omit_defaults=True,
    tag_field="op",
    forbid_unknown_fields=True,
):
    rid: Rid = None
    # W3C trace context of the client's action: the hub's spans for this frame continue that
    # trace, and the events the frame writes keep it (docs/operations.md, "Tracing").
    traceparent: str | None = None


class Hello(ClientFrame, tag="hello", frozen=True):
    token: str


class Subscribe(ClientFrame, tag="subscribe", frozen=True):
    """Catch up on every event with ``seq > afterSeq`` then follow live; omitted = live only."""

    workspace: str
    after_seq: Seq | None = None


class Unsubscribe(ClientFrame, tag="unsubscribe", frozen=True):
    workspace: str


class Publish(ClientFrame, tag="publish", frozen=True):
    """One event (``event``) or an atomic batch (``events``), never both."""

    workspace: str
    event: AnyEvent | None = None
    events: list[AnyEvent] | None = None
    expected_seq: Seq | None = None


class GetState(ClientFrame, tag="state", frozen=True):
    """The reply's ``files`` carry metadata only (rev, sha256, size, producer, seq, mediaType,
    blob) unless ``contents`` is true: then inline text/base64 too, at most ``[limits]
    max_state_contents_bytes`` of it (``tooLarge`` over it). ``paths``: only these files."""

    workspace: str
    at_seq: Seq | None = None
    contents: bool = False
    paths: list[str] | None = None


class ExecModuleBlob(msgspec.Struct, frozen=True, rename="camel", forbid_unknown_fields=True):
    """A guest module already in the blob store (``exec {module: {blob}}``)."""

    blob: str


class Exec(ClientFrame, tag="exec", frozen=True):
    """Start an execution (docs/execution.md, "Runtime"); the reply is ``execAccepted``.

    ``backend`` omitted = the hub's first backend instance. ``module``: base64 WASM bytes or
    ``{blob}``. ``input``: a JSON value for callable backends (omitted = none). ``encoding``:
    ``utf8`` to read the output as text (``execResult``, ``execEvent.text``), else base64.
    ``policy`` may only narrow the instance's defaults."""

    workspace: str
    backend: str | None = None
    source: str | None = None
    module: bytes | ExecModuleBlob | None = None
    exec_id: str | None = None
    language: str | None = None
    argv: list[str] = []
    stdin: bytes | None = None
    input: Any | msgspec.UnsetType = msgspec.UNSET
    env: dict[str, str] = {}
    cwd: str | None = None
    timeout_ms: Annotated[int, msgspec.Meta(ge=1)] | None = None
    encoding: Literal["utf8", "base64"] | None = None
    policy: PolicyPatch | None = None
    artifacts: list[str] = []
    """Globs of output paths in the workspace (``out/*.png``): after the run each matching
    file is stored as a blob and published as an artifact (docs/execution.md, "Artifacts")."""


class ExecResultQuery(ClientFrame, tag="execResult", frozen=True):
    """Wait for an execution to finish; the reply is ``execResult``."""

    workspace: str
    exec_id: str


class Kill(ClientFrame, tag="kill", frozen=True):
    """Cancel an execution; the reply ``killed`` comes once it has finished."""

    workspace: str
    exec_id: str


Resume = Literal["full", "tail"] | Annotated[int, msgspec.Meta(ge=0)]


class GetExec(ClientFrame, tag="getExec", frozen=True):
    """Stream an execution's events: ``execEvent`` frames, then ``execEnd``. ``resume``:
    ``full`` (from ``execRequested``), ``tail`` (only new ones), or n (after output n)."""

    workspace: str
    exec_id: str
    resume: Resume = "full"


class Dispose(ClientFrame, tag="dispose", frozen=True):
    """Free a finished execution's id; the reply is ``disposed``."""

    workspace: str
    exec_id: str


class CheckpointQuery(ClientFrame, tag="checkpoint", frozen=True):
    """The latest signed checkpoint of the workspace's Merkle tree (docs/audit.md), signed
    now when none covers the head yet; the reply is ``checkpoint``."""

    workspace: str


class ProofQuery(ClientFrame, tag="proof", frozen=True):
    """An inclusion proof (``seq`` and ``treeSize``: event ``seq`` is in the tree of that
    size) or a consistency proof (``fromSize`` and ``toSize``: the smaller tree is a prefix
    of the larger), never both; the reply is ``proof``."""

    workspace: str
    seq: Annotated[int, msgspec.Meta(ge=1)] | None = None
    tree_size: Seq | None = None
    from_size: Seq | None = None
    to_size: Seq | None = None


class Cosign(ClientFrame, tag="cosign", frozen=True):
    """A witness hands back a checkpoint it cosigned: ``cosignature`` is the whole signed
    note (the hub's signature and the witness's), ``key`` the witness's verifier key (the
    hub keeps only a signature that verifies with it). The reply is ``checkpoint``."""

    workspace: str
    cosignature: str
    key: str


MAX_BLOB_CHUNK: Final = 512 * 1024
"""The most content one ``blobChunk`` or ``blobData`` frame carries (base64 in JSON: about
700 KB, within ``[limits] max_frame_bytes``' default of 1 MiB)."""

Sha256 = Annotated[str, msgspec.Meta(pattern="^[0-9a-f]{64}$")]
Size = Annotated[int, msgspec.Meta(ge=0)]


class PutBlob(ClientFrame, tag="putBlob", frozen=True):
    """Begin, or resume, the upload of a blob of ``size`` bytes hashing to ``sha256``; the
    reply ``blobStatus`` says from which ``offset`` to send (``stored``: nothing to send)."""

    workspace: str
    sha256: Sha256
    size: Size


class BlobChunk(ClientFrame, tag="blobChunk", frozen=True):
    """``data`` (base64, at most 512 KiB decoded) at ``offset`` of the upload begun with
    ``putBlob``; ``offset`` at most what the hub holds (a resent chunk is harmless). The reply
    ``blobStatus`` carries the bytes the hub now holds."""

    workspace: str
    sha256: Sha256
    size: Size
    offset: Size
    data: bytes


class CommitBlob(ClientFrame, tag="commitBlob", frozen=True):
    """The whole blob was sent: the hub hashes it and stores it (``badRequest`` when it does
    not hash to ``sha256``: the upload is then discarded). The reply is ``blobStatus``."""

    workspace: str
    sha256: Sha256
    size: Size


class GetBlob(ClientFrame, tag="getBlob", frozen=True):
    """Read at most ``length`` (default and cap 512 KiB) bytes of a blob the workspace
    references (a file or an artifact), from ``offset``; the reply is ``blobData``."""

    workspace: str
    sha256: Sha256
    offset: Size = 0
    length: Annotated[int, msgspec.Meta(ge=1)] | None = None


AnyClientFrame = (
    Hello
    | Subscribe
    | Unsubscribe
    | Publish
    | GetState
    | Exec
    | ExecResultQuery
    | Kill
    | GetExec
    | Dispose
    | CheckpointQuery
    | ProofQuery
    | Cosign
    | PutBlob
    | BlobChunk
    | CommitBlob
    | GetBlob
)


class ServerFrame(
    msgspec.Struct,
    frozen=True,
    kw_only=True,
    rename="camel",
    omit_defaults=True,
    tag_field="op",
):
    rid: Rid = None


class Welcome(ServerFrame, tag="welcome", frozen=True):
    agent: str
    rights: list[str]
    server: str
    workspaces: list[str] = []
    backends: list[str] = []
    expires_at: int = 0


class Subscribed(ServerFrame, tag="subscribed", frozen=True):
    workspace: str
    head: int


class Unsubscribed(ServerFrame, tag="unsubscribed", frozen=True):
    workspace: str


class EventFrame(ServerFrame, tag="event", frozen=True):
    """``event`` holds the stored JSON as is (``msgspec.Raw`` on the server side)."""

    workspace: str
    event: Annotated[
        Any, msgspec.Meta(description="The stored event (schemas/events.json), as stored.")
    ]


class Ack(ServerFrame, tag="ack", frozen=True, kw_only=True):
    """Single publish: ``seq``/``id``; batch: ``seqs``/``ids``. ``duplicate``: a retry.

    ``duplicate`` has no default so that it is always on the wire, ``false`` included."""

    workspace: str
    seq: int | None = None
    id: str | None = None
    seqs: list[int] | None = None
    ids: list[str] | None = None
    duplicate: bool


class StateFrame(ServerFrame, tag="state", frozen=True):
    workspace: str
    seq: int
    state: Annotated[
        Any, msgspec.Meta(description="The workspace state (schemas/workspace-state.json).")
    ]


class Error(ServerFrame, tag="error", frozen=True, kw_only=True):
    """``details`` has no default so that it is always on the wire, ``{}`` included."""

    code: str
    message: str
    details: dict[str, Any]


class ExecAccepted(ServerFrame, tag="execAccepted", frozen=True):
    """``execRequested`` is durably in the log; the execution runs."""

    workspace: str
    exec_id: str


class SkippedEntry(SkippedWrite, frozen=True):
    """A change the run made that was not written back (``reason``: ``read-only``,
    ``conflict``, ``tooLarge``, ``invalidPath``, ``tooMany``)."""

    # The stored ``execFinished`` payload's SkippedWrite, on the wire: same fields, except that
    # ``reason`` is required here. SkippedWrite's ``reason`` has a default (``read-only``) that
    # the stored encoding omits (the golden fixtures have skipped entries without it), while
    # the frame always sends it (schemas/protocol.json requires it). msgspec decides omission
    # per Struct class, not per encoder, so the two encodings need two classes; this one only
    # redeclares ``reason`` without a default, and is made from a SkippedWrite by :meth:`of`.
    reason: str

    @classmethod
    def of(cls, skipped: SkippedWrite) -> SkippedEntry:
        return msgspec.convert(skipped, cls, from_attributes=True)


class RuntimeResult(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """The outcome of an execution, read from its journal. ``stdout``/``stderr`` are text when
    ``encoding`` is ``utf8`` (invalid bytes as U+FFFD), else base64. ``value`` only when the
    program returned one; ``diagnostics`` only when there are some."""

    status: Literal["completed", "failed", "cancelled"]
    reason: str
    exit_code: int
    stdout: str
    stderr: str
    encoding: Literal["utf8", "base64"]
    value: Any | msgspec.UnsetType = msgspec.UNSET
    stdout_truncated: bool
    stderr_truncated: bool
    duration_ms: int
    pushed: int
    pulled: int
    skipped: list[SkippedEntry]
    diagnostics: list[Any] | msgspec.UnsetType = msgspec.UNSET
    artifacts: list[ArtifactRef] = []
    """The artifacts the run published (``artifactPublished`` events, key = path)."""


class ExecResult(ServerFrame, tag="execResult", frozen=True):
    workspace: str
    exec_id: str
    result: RuntimeResult


class Killed(ServerFrame, tag="killed", frozen=True):
    """Reply to ``kill`` once the execution has finished; ``status`` is its final status (a
    kill of a finished execution changes nothing)."""

    workspace: str
    exec_id: str
    status: str


class Disposed(ServerFrame, tag="disposed", frozen=True):
    workspace: str
    exec_id: str


class ExecEvent(ServerFrame, tag="execEvent", frozen=True):
    """One journal event of a ``getExec`` stream (``rid`` = the getExec's). ``text``: for an
    ``execOutput`` of a ``utf8`` execution, its bytes decoded (one incremental decoder per
    stream and reader)."""

    workspace: str
    exec_id: str
    event: Annotated[
        Any, msgspec.Meta(description="The stored event (schemas/events.json), as stored.")
    ]
    text: str | None = None


class ExecEnd(ServerFrame, tag="execEnd", frozen=True):
    """The ``getExec`` stream is over (the execution finished); ``status`` is its status."""

    workspace: str
    exec_id: str
    status: str


class CheckpointFrame(ServerFrame, tag="checkpoint", frozen=True):
    """A signed checkpoint: ``note`` is the hub's signed note (C2SP tlog-checkpoint),
    ``cosignatures`` the witnesses' signature lines kept since (append them to ``note`` for
    the whole cosigned note)."""

    workspace: str
    size: int
    note: str
    cosignatures: str = ""


class ProofFrame(ServerFrame, tag="proof", frozen=True):
    """The reply to ``proof``: the request's sizes repeated, and ``hashes`` (base64 SHA-256,
    RFC 9162 §2.1.3.1 audit path or §2.1.4.1 consistency proof, in the RFC's order)."""

    workspace: str
    seq: int | None = None
    tree_size: int | None = None
    from_size: int | None = None
    to_size: int | None = None
    hashes: list[bytes] = []


class BlobStatus(ServerFrame, tag="blobStatus", frozen=True):
    """Where an upload stands: ``offset`` bytes of ``size`` held; ``stored``: the blob is in
    the store (committed, or it was already)."""

    workspace: str
    sha256: str
    size: int
    offset: int
    stored: bool = False


class BlobData(ServerFrame, tag="blobData", frozen=True):
    """The reply to ``getBlob``: ``data`` (base64) from ``offset`` of the blob of ``size``
    bytes (empty at its end)."""

    workspace: str
    sha256: str
    size: int
    offset: int
    data: bytes


AnyServerFrame = (
    Welcome
    | Subscribed
    | Unsubscribed
    | EventFrame
    | Ack
    | StateFrame
    | Error
    | ExecAccepted
    | ExecResult
    | Killed
    | Disposed
    | ExecEvent
    | ExecEnd
    | CheckpointFrame
    | ProofFrame
    | BlobStatus
    | BlobData
)
