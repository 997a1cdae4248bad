"""The protocol session of one WebSocket connection, without I/O (sans-I/O, like
``websockets.protocol.Protocol``).

A :class:`ServerSession` takes what arrived (:meth:`ServerSession.open` with the handshake's
``Authorization`` header, :meth:`ServerSession.receive` for each text frame,
:meth:`ServerSession.receive_binary`) and the outcome of the work it asked for
(:meth:`ServerSession.completed`, :meth:`ServerSession.failed`,
:meth:`ServerSession.too_slow`), and returns
*actions* for the I/O shell (:mod:`hub.server.connection`) to perform: :class:`Send` a frame,
:class:`Close` the connection, or one of the requests (:class:`SubscribeRequest`,
:class:`UnsubscribeRequest`, :class:`PublishRequest`, :class:`StateRequest`) that need the log.
It owns the authentication state, the subscription bookkeeping, rights checks, frame
decoding, the publish rate limit (a token bucket on an injected clock), the bad-frame count,
and the one mapping from errors to ``error`` frames and close codes (:func:`error_frame`,
:func:`hub.core.errors.closes_connection`, 1008 for garbage, 4408 with its reason). It
imports neither asyncio nor websockets,
so it is tested with plain values (tests/hub/core/wire/test_session.py).

The protocol is documented in docs/protocol.md; the frames are in :mod:`hub.core.wire.frames`.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Annotated, Any, Final

import msgspec

from hub import __version__
from hub.core.capability import Capability, Right
from hub.core.checkpoint import CheckpointRecord
from hub.core.decoding import check_json_depth
from hub.core.errors import (
    AgoraError,
    BadRequest,
    Busy,
    CloseCode,
    Exists,
    Forbidden,
    NotFound,
    RateLimited,
    TooLarge,
    Unauthorized,
    closes_connection,
)
from hub.core.events import Event
from hub.core.records import AppendResult
from hub.core.validation import (
    DEFAULT_LIMITS,
    TRACEPARENT_RE,
    validate_traceparent,
    validate_workspace,
)
from hub.core.wire.frames import (
    Ack,
    AnyClientFrame,
    BlobChunk,
    BlobData,
    BlobStatus,
    CheckpointFrame,
    CheckpointQuery,
    CommitBlob,
    Cosign,
    Dispose,
    Disposed,
    Error,
    EventFrame,
    Exec,
    ExecAccepted,
    ExecEnd,
    ExecEvent,
    ExecResult,
    ExecResultQuery,
    GetBlob,
    GetExec,
    GetState,
    Hello,
    Kill,
    Killed,
    ProofFrame,
    ProofQuery,
    Publish,
    PutBlob,
    Resume,
    Rid,
    RuntimeResult,
    ServerFrame,
    StateFrame,
    Subscribe,
    Subscribed,
    Unsubscribe,
    Unsubscribed,
    Welcome,
)

__all__ = [
    "MAX_CLOSE_REASON_BYTES",
    "SERVER_NAME",
    "Action",
    "BlobRequest",
    "CheckpointRequest",
    "Close",
    "CosignRequest",
    "DisposeRequest",
    "ExecRequest",
    "ExecResultRequest",
    "GetExecRequest",
    "KillRequest",
    "Positive",
    "PositiveRate",
    "ProofRequest",
    "PublishRequest",
    "Request",
    "Send",
    "ServerSession",
    "SessionLimits",
    "StateRequest",
    "SubscribeRequest",
    "TokenBucket",
    "UnsubscribeRequest",
    "bearer_token",
    "encode_ack",
    "encode_event_frame",
    "encode_exec_event_frame",
    "encode_frame",
    "error_frame",
    "overflow_reason",
    "parse_overflow_reason",
]

SERVER_NAME: Final = f"agora/{__version__}"
MAX_CLOSE_REASON_BYTES: Final = 123  # RFC 6455 §5.5: a control frame's payload is <= 125 bytes

# ---------------------------------------------------------------------------------------------
# Actions: what the session asks the I/O shell to do.


class Send(msgspec.Struct, frozen=True):
    """Queue ``frame`` for sending (in order with every other frame of the connection)."""

    frame: ServerFrame


class Close(msgspec.Struct, frozen=True):
    """Send what is queued, then close the connection with ``code`` and ``reason``.

    The session accepts no more frames after it returned a ``Close``."""

    code: int
    reason: str


class SubscribeRequest(msgspec.Struct, frozen=True):
    """Start following ``workspace``: register for live events, read the head, answer with
    :meth:`ServerSession.completed` (the head), then send every event after ``after_seq`` (``None``:
    after the head) and follow live."""

    rid: Rid
    workspace: str
    after_seq: int | None


class UnsubscribeRequest(msgspec.Struct, frozen=True):
    """Stop following ``workspace``; answer with :meth:`ServerSession.completed` (``None``)."""

    rid: Rid
    workspace: str


class PublishRequest(msgspec.Struct, frozen=True):
    """Append ``events`` atomically as ``agent``; answer with the :class:`AppendResult`.

    ``batch``: the client sent ``events`` (a list) rather than one ``event``."""

    rid: Rid
    workspace: str
    agent: str
    events: tuple[Event, ...]
    expected_seq: int | None
    batch: bool


class StateRequest(msgspec.Struct, frozen=True):
    """Read the workspace state (at ``at_seq``); answer with the ``WorkspaceState``, its files
    as metadata unless ``contents`` (only ``paths`` when given)."""

    rid: Rid
    workspace: str
    at_seq: int | None
    contents: bool = False
    paths: tuple[str, ...] | None = None


class ExecRequest(msgspec.Struct, frozen=True):
    """Start an execution (``Runtime.exec``) for ``capability``'s holder; answer with its id.
    ``frame.backend`` is already resolved (an omitted backend is the hub's default)."""

    rid: Rid
    workspace: str
    capability: Capability
    frame: Exec


class ExecResultRequest(msgspec.Struct, frozen=True):
    """Wait for an execution to finish (``Runtime.result``); answer with its
    ``RuntimeResult``. May take as long as the execution: run it beside the reader."""

    rid: Rid
    workspace: str
    exec_id: str
    capability: Capability


class KillRequest(msgspec.Struct, frozen=True):
    """Stop an execution (``Runtime.kill``); answer with its final status once finished. Run
    it beside the reader."""

    rid: Rid
    workspace: str
    exec_id: str
    capability: Capability


class GetExecRequest(msgspec.Struct, frozen=True):
    """Stream an execution's events (``Runtime.follow``): ``execEvent`` frames built with
    :func:`encode_exec_event_frame`, then answer with its status (``execEnd``). Run it beside
    the reader."""

    rid: Rid
    workspace: str
    exec_id: str
    resume: Resume
    capability: Capability


class DisposeRequest(msgspec.Struct, frozen=True):
    """Free a finished execution (``Runtime.dispose``); answer with ``None``."""

    rid: Rid
    workspace: str
    exec_id: str
    capability: Capability


class CheckpointRequest(msgspec.Struct, frozen=True):
    """The latest checkpoint of ``workspace``, signed now when none covers its head; answer
    with the ``CheckpointRecord``."""

    rid: Rid
    workspace: str


class ProofRequest(msgspec.Struct, frozen=True):
    """An inclusion proof (``seq`` set: event ``seq`` in the tree of ``new``) or a
    consistency proof (``seq`` None: the tree of ``old`` a prefix of that of ``new``); the
    sizes are checked already. Answer with the proof's hashes."""

    rid: Rid
    workspace: str
    seq: int | None
    old: int
    new: int


class CosignRequest(msgspec.Struct, frozen=True):
    """Keep a witness's cosignature (``note``: the cosigned note, ``key``: the witness's
    verifier key); answer with the updated ``CheckpointRecord``."""

    rid: Rid
    workspace: str
    note: str
    key: str


class BlobRequest(msgspec.Struct, frozen=True):
    """A blob op (``putBlob``, ``blobChunk``, ``commitBlob``, ``getBlob``) of ``agent``, its
    rights checked; answer with the ``blobStatus``/``blobData`` frame (its rid is set here).
    The shell queues the reply paced (``getBlob`` replies are large)."""

    rid: Rid
    workspace: str
    agent: str
    frame: PutBlob | BlobChunk | CommitBlob | GetBlob


Request = (
    BlobRequest
    | SubscribeRequest
    | UnsubscribeRequest
    | PublishRequest
    | StateRequest
    | ExecRequest
    | ExecResultRequest
    | KillRequest
    | GetExecRequest
    | DisposeRequest
    | CheckpointRequest
    | ProofRequest
    | CosignRequest
)
Action = Send | Close | Request

WAITING_REQUESTS: Final = (ExecResultRequest, KillRequest, GetExecRequest)
"""Requests that may wait for an execution: the shell runs them beside the reader, and the
session bounds how many a connection has open (``max_exec_waits``)."""

# ---------------------------------------------------------------------------------------------
# Encoding


_encoder: Final = msgspec.json.Encoder()
_client_decoder: Final = msgspec.json.Decoder(AnyClientFrame)


class _RidOnly(msgspec.Struct):
    """Recovers the ``rid`` of a frame that failed to decode, so the error can repeat it."""

    rid: Rid = None


_rid_decoder: Final = msgspec.json.Decoder(_RidOnly)


def encode_frame(frame: ServerFrame) -> bytes:
    """The JSON text of a server frame."""
    return _encoder.encode(frame)


def encode_exec_event_frame(
    rid: Rid, workspace: str, exec_id: str, stored_event: bytes, text: str | None = None
) -> bytes:
    """An ``execEvent`` frame of a ``getExec`` stream, the event embedded as stored."""
    return _encoder.encode(
        ExecEvent(
            rid=rid,
            workspace=workspace,
            exec_id=exec_id,
            event=msgspec.Raw(stored_event),
            text=text,
        )
    )


def encode_event_frame(workspace: str, stored_event: bytes) -> bytes:
    """The ``event`` frame for an event given as its stored JSON, embedded without decoding
    (``msgspec.Raw``). The fan-out builds each frame once and sends the same bytes to every
    subscriber."""
    return _encoder.encode(EventFrame(workspace=workspace, event=msgspec.Raw(stored_event)))


def _ack(request: PublishRequest, result: AppendResult) -> Ack:
    """The ``ack`` of a publish that succeeded (one event: ``seq``/``id``; a batch:
    ``seqs``/``ids``)."""
    if request.batch:
        return Ack(
            rid=request.rid,
            workspace=request.workspace,
            seqs=result.seqs,
            ids=result.ids,
            duplicate=result.duplicate,
        )
    first = result.events[0]
    return Ack(
        rid=request.rid,
        workspace=request.workspace,
        seq=first.seq,
        id=first.id,
        duplicate=result.duplicate,
    )


def encode_ack(request: PublishRequest, result: AppendResult) -> bytes:
    """The encoded ``ack`` frame :meth:`ServerSession.completed` answers a publish that
    succeeded with, built straight to bytes (one per publish: the shell's hot path)."""
    return _encoder.encode(_ack(request, result))


# ---------------------------------------------------------------------------------------------
# Errors → frames and close codes (the one place; ARCHITECTURE.md principle 5)

_INTERNAL_MESSAGE: Final = "internal error; the hub logged it"


def error_frame(exc: BaseException, rid: Rid = None, *, field: str | None = None) -> Error:
    """The ``error`` frame for ``exc``: an :class:`AgoraError` keeps its code, message and
    details (JSON-safe values only; ``field``, when given, replaces ``details['field']`` in the
    frame, the exception is left as it is); anything else is ``internal`` with no details (the
    caller logs it)."""
    if isinstance(exc, AgoraError) and exc.code != "internal":
        details = _json_safe(exc.details)
        if field is not None:
            details["field"] = field
        return Error(rid=rid, code=exc.code, message=exc.message, details=details)
    return Error(rid=rid, code="internal", message=_INTERNAL_MESSAGE, details={})


def _json_safe(details: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in details.items():
        try:
            _encoder.encode(value)
        except (TypeError, ValueError, OverflowError):
            value = str(value)
        out[key] = value
    return out


_AT: Final = re.compile(r"^(?P<message>.*?)(?: - at `(?P<path>[^`]*)`)?$", re.DOTALL)
_NAMED_FIELD: Final = re.compile(r"(?:unknown|missing required) field `(?P<name>[^`]*)`")


def decode_error(exc: msgspec.MsgspecError) -> BadRequest:
    """A :class:`BadRequest` for a frame msgspec refused, naming the field by its JSON path
    (``$.event.payload.path``; ``$.bogus`` for an unknown field, ``$`` for malformed JSON)."""
    text = str(exc)
    if isinstance(exc, msgspec.ValidationError):
        match = _AT.match(text)
        assert match is not None  # the pattern matches any string
        message, path = match.group("message"), match.group("path") or "$"
        named = _NAMED_FIELD.search(message)
        if named is not None:
            path = f"{path}.{named.group('name')}"
        return BadRequest(f"{message} at {path}", field=path)
    return BadRequest(text, field="$")


def _draft_field(field: str, index: int | None, batch: bool) -> str:
    """The JSON path, in the publish frame, of ``field`` of draft ``index``."""
    if field.startswith("$"):
        return field
    if index is None:
        return f"$.{field}"
    where = f"$.events[{index}]" if batch else "$.event"
    return f"{where}.{field}"


def bearer_token(authorization: str | None) -> str | None:
    """The token of an ``Authorization: Bearer <token>`` header (RFC 6750 §2.1), ``""`` for any
    other value, ``None`` when there is no header."""
    if authorization is None:
        return None
    scheme, _, token = authorization.strip().partition(" ")
    if scheme.lower() != "bearer":
        return ""
    return token.strip()


# ---------------------------------------------------------------------------------------------
# Close reason of 4408


def overflow_reason(last_seqs: Mapping[str, int]) -> str:
    """The close reason for 4408: compact JSON ``{"lastSeq":{"<workspace>":<seq>,…}}``, the seq
    of the last event sent on each subscribed workspace (resume with ``afterSeq`` = it).

    It fits the 123 bytes a close reason may have (RFC 6455 §5.5); when the workspaces do not
    all fit, the ones left out are dropped and ``"partial":true`` says so (the client then
    resumes those from the last seq it received)."""
    entries: dict[str, int] = {}
    for workspace in sorted(last_seqs):
        trial = {**entries, workspace: last_seqs[workspace]}
        if len(_reason_bytes(trial, partial=True)) <= MAX_CLOSE_REASON_BYTES:
            entries = trial
    partial = len(entries) < len(last_seqs)
    return _reason_bytes(entries, partial=partial).decode()


def _reason_bytes(entries: dict[str, int], *, partial: bool) -> bytes:
    doc: dict[str, Any] = {"lastSeq": entries}
    if partial:
        doc["partial"] = True
    return _encoder.encode(doc)


def parse_overflow_reason(reason: str) -> dict[str, int]:
    """The ``lastSeq`` map of a 4408 close reason. Raises ``ValueError`` if it is not one."""
    try:
        doc = msgspec.json.decode(reason, type=dict[str, Any])
        return msgspec.convert(doc["lastSeq"], dict[str, int])
    except (msgspec.MsgspecError, KeyError) as e:
        raise ValueError(f"not a 4408 close reason: {reason!r}") from e


# ---------------------------------------------------------------------------------------------
# Rate limiting


class TokenBucket:
    """A token bucket counted in events: ``rate`` tokens per second up to ``burst``.

    ``clock`` is monotonic seconds (``time.monotonic``); tests inject their own."""

    def __init__(self, rate: float, burst: int, clock: Callable[[], float]) -> None:
        if rate <= 0 or burst < 1:
            raise ValueError("rate must be > 0 and burst >= 1")
        self.rate = rate
        self.burst = burst
        self._clock = clock
        self._tokens = float(burst)
        self._at = clock()

    def take(self, n: int) -> float:
        """Take ``n`` tokens and return 0.0, or take none and return the seconds until ``n``
        are available. ``n`` above ``burst`` can never be taken (returns ``inf``)."""
        now = self._clock()
        self._tokens = min(float(self.burst), self._tokens + (now - self._at) * self.rate)
        self._at = now
        if n > self.burst:
            return math.inf
        if self._tokens >= n:
            self._tokens -= n
            return 0.0
        return (n - self._tokens) / self.rate


# ---------------------------------------------------------------------------------------------
# The session


Positive = Annotated[int, msgspec.Meta(ge=1)]
PositiveRate = Annotated[float, msgspec.Meta(gt=0)]


class SessionLimits(msgspec.Struct, frozen=True, kw_only=True):
    """The per-connection limits the session enforces. These are the one set of defaults:
    ``[limits]`` (:class:`hub.config.LimitsConfig`) extends this type, so the configuration
    *is* the session's limits (behaviour at each in docs/protocol.md and docs/operations.md)."""

    max_batch_events: Positive = 256
    publish_rate: PositiveRate = 2000.0  # events per second per connection (token bucket)
    publish_burst: Positive = 4000  # bucket size
    max_subscriptions: Positive = 64  # per connection
    garbage_limit: Positive = 20  # bad frames before close 1008
    max_exec_waits: Positive = 64
    """``execResult``/``kill``/``getExec`` requests a connection may have waiting at once."""
    max_depth: Annotated[int, msgspec.Meta(ge=2, le=128)] = DEFAULT_LIMITS.max_depth
    """JSON nesting a frame or payload may have (checked before decoding). At most 128, so a
    stored event always stays within what readers accept (hub.log.codec.READ_MAX_DEPTH)."""


def _expired_error() -> Unauthorized:
    return Unauthorized("token has expired", reason="expired")


_WRITABLE_KEPT: Final = 64  # workspaces a session remembers as writable (then it forgets)

_READ: Final[Right] = "read"
_WRITE: Final[Right] = "write"
_EXEC: Final[Right] = "exec"


class ServerSession:
    """The state of one connection's protocol. See the module docstring.

    ``verify`` checks a token (``TokenSigner.verify``: returns a :class:`Capability` or raises
    :class:`Unauthorized`); ``clock`` is wall time in epoch seconds (token expiry);
    ``monotonic`` drives the rate limit.
    """

    def __init__(
        self,
        verify: Callable[[str], Capability],
        *,
        limits: SessionLimits | None = None,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
        server: str = SERVER_NAME,
        default_backend: str | None = None,
        on_error: Callable[[str], None] | None = None,
    ) -> None:
        self.limits = limits if limits is not None else SessionLimits()
        # Told the wire code of every error answer (the hub's metrics; rare, off the hot path).
        self._on_error = on_error
        self.hello_traceparent: str | None = None
        """The last accepted ``hello``'s W3C ``traceparent`` (the hub's ``agora.hello`` span)."""
        self.capability: Capability | None = None
        # The workspaces ``capability`` was found to grant the write right in (named well
        # and allowed): a connection publishing to one workspace checks it once, not on every
        # frame. Only for this capability (a new hello clears it), bounded.
        self._writable: set[str] = set()
        self.subscriptions: set[str] = set()
        self.bad_frames = 0
        self.exec_waits = 0
        """``execResult``/``kill``/``getExec`` requests in progress."""
        self.closed: Close | None = None
        self._default_backend = default_backend
        self._verify = verify
        self._clock = clock
        self._server = server
        self._bucket = TokenBucket(self.limits.publish_rate, self.limits.publish_burst, monotonic)

    @property
    def agent(self) -> str | None:
        return self.capability.agent if self.capability is not None else None

    # -- input ------------------------------------------------------------------------------

    def open(self, authorization: str | None = None) -> list[Action]:
        """The connection opened; ``authorization`` is the handshake's header, if any. A bearer
        token there authenticates now (``welcome`` is sent unprompted); without one the first
        frame must be ``hello``."""
        token = bearer_token(authorization)
        if token is None:
            return []
        return self._authenticate(token, rid=None)

    def receive(self, data: str | bytes) -> list[Action]:
        """One text frame from the client."""
        if self.closed is not None:
            return []
        try:
            check_json_depth(data, self.limits.max_depth)
            frame = _client_decoder.decode(data)
        except (msgspec.MsgspecError, BadRequest) as e:
            rid = _recover_rid(data)
            if self._expired():
                return self._refuse(_expired_error(), rid)
            error = e if isinstance(e, BadRequest) else decode_error(e)
            return self._bad_frame(error, rid)
        if self.capability is None:
            if isinstance(frame, Hello):
                # Before authentication nothing is answered but the hello itself: an
                # invalid traceparent there is ignored (the span starts a new trace).
                if frame.traceparent is not None and TRACEPARENT_RE.fullmatch(frame.traceparent):
                    self.hello_traceparent = frame.traceparent
                return self._authenticate(frame.token, frame.rid)
            return self._unauthenticated(frame.rid)
        if self._expired():
            return self._refuse(_expired_error(), frame.rid)
        try:
            return self._dispatch(frame, self.capability)
        except AgoraError as e:
            return self.failed(None, e, rid=frame.rid)

    def receive_binary(self, data: bytes) -> list[Action]:
        """One binary frame from the client: always a bad frame (the protocol is JSON text)."""
        if self.closed is not None:
            return []
        error = BadRequest("binary frames are not accepted; send JSON text frames", field="$")
        if self.capability is None:
            return self._unauthenticated(None)
        if self._expired():
            return self._refuse(_expired_error(), None)
        return self._bad_frame(error, None)

    def completed(self, request: Request, result: Any) -> list[Action]:
        """``request`` succeeded with ``result``: the head (subscribe), ``None`` (unsubscribe),
        an :class:`AppendResult` (publish), a ``WorkspaceState`` (state), a
        :class:`CheckpointRecord` (checkpoint, cosign) or the proof's hashes (proof)."""
        match request:
            case SubscribeRequest(rid=rid, workspace=workspace):
                return [Send(Subscribed(rid=rid, workspace=workspace, head=int(result)))]
            case UnsubscribeRequest(rid=rid, workspace=workspace):
                return [Send(Unsubscribed(rid=rid, workspace=workspace))]
            case PublishRequest():
                assert isinstance(result, AppendResult)
                return [Send(_ack(request, result))]
            case StateRequest(rid=rid, workspace=workspace):
                state = StateFrame(rid=rid, workspace=workspace, seq=result.seq, state=result)
                return [Send(state)]
            case ExecRequest(rid=rid, workspace=workspace):
                return [Send(ExecAccepted(rid=rid, workspace=workspace, exec_id=str(result)))]
            case DisposeRequest(rid=rid, workspace=workspace, exec_id=exec_id):
                return [Send(Disposed(rid=rid, workspace=workspace, exec_id=exec_id))]
            case ExecResultRequest(rid=rid, workspace=workspace, exec_id=exec_id):
                self._waited()
                assert isinstance(result, RuntimeResult)
                frame = ExecResult(rid=rid, workspace=workspace, exec_id=exec_id, result=result)
                return [Send(frame)]
            case KillRequest(rid=rid, workspace=workspace, exec_id=exec_id):
                self._waited()
                return [
                    Send(Killed(rid=rid, workspace=workspace, exec_id=exec_id, status=str(result)))
                ]
            case GetExecRequest(rid=rid, workspace=workspace, exec_id=exec_id):
                self._waited()
                return [
                    Send(ExecEnd(rid=rid, workspace=workspace, exec_id=exec_id, status=str(result)))
                ]
            case (
                CheckpointRequest(rid=rid, workspace=workspace)
                | CosignRequest(rid=rid, workspace=workspace)
            ):
                assert isinstance(result, CheckpointRecord)
                return [Send(_checkpoint_frame(rid, workspace, result))]
            case ProofRequest():
                return [Send(_proof_frame(request, result))]
            case BlobRequest(rid=rid):
                assert isinstance(result, BlobStatus | BlobData)
                return [Send(msgspec.structs.replace(result, rid=rid))]
        raise AssertionError(f"unknown request {request!r}")  # pragma: no cover

    def failed(
        self, request: Request | None, exc: BaseException, *, rid: Rid = None
    ) -> list[Action]:
        """``request`` (or the frame with ``rid``) failed with ``exc``. A failed subscribe ends
        the subscription; a draft's field is named by its path in the publish frame."""
        if self._on_error is not None:
            self._on_error(exc.code if isinstance(exc, AgoraError) else "internal")
        field: str | None = None
        if isinstance(exc, AgoraError) and isinstance(exc.details.get("field"), str):
            field = exc.details["field"]
        if request is not None:
            rid = request.rid
            if isinstance(request, WAITING_REQUESTS):
                self._waited()
            if isinstance(request, SubscribeRequest):
                self.subscriptions.discard(request.workspace)
            if field is not None and isinstance(request, ExecRequest):
                if not field.startswith("$"):
                    field = f"$.{field}"  # a field of the exec frame
            elif field is not None and isinstance(request, PublishRequest):
                index = exc.details.get("index") if isinstance(exc, AgoraError) else None
                field = _draft_field(
                    field, index if isinstance(index, int) else None, request.batch
                )
        elif field is not None:
            field = _draft_field(field, None, False)
        if isinstance(exc, AgoraError) and closes_connection(exc) is not None:
            return self._refuse(exc, rid)
        return [Send(error_frame(exc, rid, field=field))]

    def too_slow(self, last_seqs: Mapping[str, int]) -> Close:
        """The send queue overflowed: the ``Close`` (4408) whose reason tells the client where
        to resume (``last_seqs``: the last seq handed to the socket per subscribed workspace)."""
        close = Close(
            int(CloseCode.TOO_SLOW),
            overflow_reason({w: s for w, s in last_seqs.items() if w in self.subscriptions}),
        )
        self.closed = close
        return close

    def ended(self, workspace: str) -> None:
        """The shell ended the subscription on ``workspace`` by itself (its catch-up failed)."""
        self.subscriptions.discard(workspace)

    # -- internals --------------------------------------------------------------------------

    def _waited(self) -> None:
        self.exec_waits = max(0, self.exec_waits - 1)

    def _expired(self) -> bool:
        """Whether the connection's token has expired (checked on every frame)."""
        return self.capability is not None and self.capability.expired(self._clock())

    def _authenticate(self, token: str, rid: Rid) -> list[Action]:
        try:
            capability = self._verify(token)
        except Unauthorized as e:
            return self._refuse(e, rid)
        if self.capability is not None:
            # A second hello refreshes the token of the same agent (e.g. before it expires).
            if capability.agent != self.capability.agent:
                return [
                    Send(
                        error_frame(
                            Forbidden(
                                "a connection cannot change its agent; open a new connection",
                                agent=capability.agent,
                            ),
                            rid,
                        )
                    )
                ]
            lost = sorted(w for w in self.subscriptions if not capability.has(_READ, w))
            if lost:
                return [
                    Send(
                        error_frame(
                            Forbidden(
                                "the new token lacks the read right on subscribed workspaces; "
                                "unsubscribe first",
                                workspaces=lost,
                            ),
                            rid,
                        )
                    )
                ]
        self.capability = capability
        self._writable.clear()
        welcome = Welcome(
            rid=rid,
            agent=capability.agent,
            rights=list(capability.rights),
            server=self._server,
            workspaces=list(capability.workspaces),
            backends=list(capability.backends),
            expires_at=capability.expires_at,
        )
        return [Send(welcome)]

    def _unauthenticated(self, rid: Rid) -> list[Action]:
        return self._refuse(
            Unauthorized(
                "not authenticated: send hello {token} first, or the token as "
                "'Authorization: Bearer …' at the handshake",
                reason="missing",
            ),
            rid,
        )

    def _refuse(self, exc: AgoraError, rid: Rid) -> list[Action]:
        code = closes_connection(exc)
        assert code is not None, exc
        reason = exc.details.get("reason", exc.code)
        text = f"{exc.code}: {reason}".encode()[:MAX_CLOSE_REASON_BYTES]
        close = Close(int(code), text.decode(errors="ignore"))
        self.closed = close
        return [Send(error_frame(exc, rid)), close]

    def _bad_frame(self, error: BadRequest, rid: Rid) -> list[Action]:
        if self.capability is None:
            return self._unauthenticated(rid)
        self.bad_frames += 1
        actions: list[Action] = [Send(error_frame(error, rid))]
        if self.bad_frames >= self.limits.garbage_limit:
            close = Close(int(CloseCode.POLICY), f"{self.bad_frames} bad frames")
            self.closed = close
            actions.append(close)
        return actions

    def _dispatch(self, frame: AnyClientFrame, capability: Capability) -> list[Action]:
        match frame:
            case Publish():  # first: the frame nearly every other one is
                return [self._publish(frame, capability)]
            case Hello(token=token, rid=rid):
                return self._authenticate(token, rid)
            case Subscribe(rid=rid, workspace=workspace, after_seq=after_seq):
                self._check(capability, _READ, workspace)
                if workspace in self.subscriptions:
                    raise Exists(f"already subscribed to {workspace!r}", field="$.workspace")
                if len(self.subscriptions) >= self.limits.max_subscriptions:
                    raise Busy(
                        f"at most {self.limits.max_subscriptions} subscriptions per connection",
                        limit=self.limits.max_subscriptions,
                    )
                self.subscriptions.add(workspace)
                return [SubscribeRequest(rid=rid, workspace=workspace, after_seq=after_seq)]
            case Unsubscribe(rid=rid, workspace=workspace):
                validate_workspace(workspace)
                if workspace not in self.subscriptions:
                    raise NotFound(f"not subscribed to {workspace!r}", field="$.workspace")
                self.subscriptions.discard(workspace)
                return [UnsubscribeRequest(rid=rid, workspace=workspace)]
            case GetState(rid=rid, workspace=workspace, at_seq=at_seq):
                self._check(capability, _READ, workspace)
                paths = None if frame.paths is None else tuple(frame.paths)
                return [
                    StateRequest(
                        rid=rid,
                        workspace=workspace,
                        at_seq=at_seq,
                        contents=frame.contents,
                        paths=paths,
                    )
                ]
            case Exec():
                return [self._exec(frame, capability)]
            case Dispose(rid=rid, workspace=workspace, exec_id=exec_id):
                self._check(capability, _EXEC, workspace)
                return [DisposeRequest(rid, workspace, exec_id, capability)]
            case ExecResultQuery(rid=rid, workspace=workspace, exec_id=exec_id):
                self._check(capability, _READ, workspace)
                self._wait()
                return [ExecResultRequest(rid, workspace, exec_id, capability)]
            case Kill(rid=rid, workspace=workspace, exec_id=exec_id):
                self._check(capability, _EXEC, workspace)
                self._wait()
                return [KillRequest(rid, workspace, exec_id, capability)]
            case GetExec(rid=rid, workspace=workspace, exec_id=exec_id, resume=resume):
                self._check(capability, _READ, workspace)
                self._wait()
                return [GetExecRequest(rid, workspace, exec_id, resume, capability)]
            case CheckpointQuery(rid=rid, workspace=workspace):
                self._check(capability, _READ, workspace)
                return [CheckpointRequest(rid, workspace)]
            case ProofQuery():
                self._check(capability, _READ, frame.workspace)
                return [_proof_request(frame)]
            case Cosign(rid=rid, workspace=workspace, cosignature=note, key=key):
                self._check(capability, _WRITE, workspace)
                return [CosignRequest(rid, workspace, note, key)]
            case PutBlob() | BlobChunk() | CommitBlob():
                self._check(capability, _WRITE, frame.workspace)
                return [BlobRequest(frame.rid, frame.workspace, capability.agent, frame)]
            case GetBlob():
                self._check(capability, _READ, frame.workspace)
                return [BlobRequest(frame.rid, frame.workspace, capability.agent, frame)]
        raise AssertionError(f"unhandled frame {frame!r}")  # pragma: no cover

    def _exec(self, frame: Exec, capability: Capability) -> ExecRequest:
        """Rights for ``exec``: the ``exec`` right in the workspace, and the backend (the
        default one when omitted) among the token's backends (the backend argument is routing,
        never authorization)."""
        self._check(capability, _EXEC, frame.workspace)
        backend = frame.backend if frame.backend is not None else self._default_backend
        if backend is None:
            raise NotFound("this hub has no backend instances", field="$.backend")
        capability.require_backend(backend)
        if frame.backend is None:
            frame = msgspec.structs.replace(frame, backend=backend)
        return ExecRequest(frame.rid, frame.workspace, capability, frame)

    def _wait(self) -> None:
        if self.exec_waits >= self.limits.max_exec_waits:
            raise Busy(
                f"at most {self.limits.max_exec_waits} execResult/kill/getExec requests may "
                "wait at once on a connection",
                limit=self.limits.max_exec_waits,
            )
        self.exec_waits += 1

    def _publish(self, frame: Publish, capability: Capability) -> PublishRequest:
        writable = self._writable
        if frame.workspace not in writable:
            self._check(capability, _WRITE, frame.workspace)
            if len(writable) >= _WRITABLE_KEPT:
                writable.clear()
            writable.add(frame.workspace)
        events: Sequence[Event]
        if frame.event is not None and frame.events is not None:
            raise BadRequest("publish takes event or events, not both", field="$.events")
        if frame.event is not None:
            events, batch = (frame.event,), False
        elif frame.events is not None:
            events, batch = frame.events, True
        else:
            raise BadRequest("publish needs event (one) or events (a batch)", field="$.event")
        if not events:
            raise BadRequest("a batch needs at least one event", field="$.events")
        if frame.traceparent is not None:  # the frame's trace, kept by drafts without their own
            validate_traceparent(frame.traceparent, "$.traceparent")
            events = [
                e if e.traceparent else msgspec.structs.replace(e, traceparent=frame.traceparent)
                for e in events
            ]
        if len(events) > self.limits.max_batch_events:
            raise TooLarge(
                f"a batch has at most {self.limits.max_batch_events} events "
                f"(this one has {len(events)})",
                field="$.events",
                limit=self.limits.max_batch_events,
                count=len(events),
            )
        wait = self._bucket.take(len(events))
        if wait == math.inf:
            raise TooLarge(
                f"a batch larger than the publish burst ({self._bucket.burst} events) "
                "can never be accepted",
                field="$.events",
                limit=self._bucket.burst,
                count=len(events),
            )
        if wait > 0:
            raise RateLimited(
                f"publish rate above {self._bucket.rate:g} events/s; retry later",
                retryAfterMs=max(1, math.ceil(wait * 1000)),
                rate=self._bucket.rate,
                burst=self._bucket.burst,
            )
        return PublishRequest(
            rid=frame.rid,
            workspace=frame.workspace,
            agent=capability.agent,
            events=tuple(events),
            expected_seq=frame.expected_seq,
            batch=batch,
        )

    @staticmethod
    def _check(capability: Capability, right: Right, workspace: str) -> None:
        validate_workspace(workspace)
        capability.require(right, workspace)


def _proof_request(frame: ProofQuery) -> ProofRequest:
    """Which proof ``frame`` asks for, its sizes checked (``badRequest`` naming the field)."""
    inclusion = (frame.seq, frame.tree_size)
    consistency = (frame.from_size, frame.to_size)
    if any(v is not None for v in inclusion) and any(v is not None for v in consistency):
        raise BadRequest(
            "proof takes seq and treeSize (inclusion) or fromSize and toSize (consistency), "
            "not both",
            field="$.fromSize",
        )
    if frame.seq is not None or frame.tree_size is not None:
        if frame.seq is None:
            raise BadRequest("an inclusion proof needs seq", field="$.seq")
        if frame.tree_size is None:
            raise BadRequest("an inclusion proof needs treeSize", field="$.treeSize")
        if frame.seq > frame.tree_size:
            raise BadRequest(
                f"seq {frame.seq} is not in a tree of size {frame.tree_size}", field="$.seq"
            )
        return ProofRequest(frame.rid, frame.workspace, frame.seq, 0, frame.tree_size)
    if frame.from_size is None:
        raise BadRequest("proof needs seq and treeSize, or fromSize and toSize", field="$.fromSize")
    if frame.to_size is None:
        raise BadRequest("a consistency proof needs toSize", field="$.toSize")
    if frame.from_size > frame.to_size:
        raise BadRequest(
            f"fromSize {frame.from_size} is larger than toSize {frame.to_size}",
            field="$.fromSize",
        )
    return ProofRequest(frame.rid, frame.workspace, None, frame.from_size, frame.to_size)


def _checkpoint_frame(rid: Rid, workspace: str, record: CheckpointRecord) -> CheckpointFrame:
    return CheckpointFrame(
        rid=rid,
        workspace=workspace,
        size=record.size,
        note=record.note,
        cosignatures=record.cosignatures,
    )


def _proof_frame(request: ProofRequest, hashes: Sequence[bytes]) -> ProofFrame:
    if request.seq is not None:
        return ProofFrame(
            rid=request.rid,
            workspace=request.workspace,
            seq=request.seq,
            tree_size=request.new,
            hashes=list(hashes),
        )
    return ProofFrame(
        rid=request.rid,
        workspace=request.workspace,
        from_size=request.old,
        to_size=request.new,
        hashes=list(hashes),
    )


def _recover_rid(data: str | bytes) -> Rid:
    try:
        return _rid_decoder.decode(data).rid
    except (msgspec.MsgspecError, RecursionError):  # the frame may be nested too deep to skip
        return None
