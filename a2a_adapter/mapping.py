"""Agora events ↔ A2A 1.0 task updates: one table, both directions. Pure (no I/O).

A2A (``specification/a2a.proto`` of A2A v1.0) sees a workspace as a *context* (``contextId`` =
workspace) and each work item (``correlationId``) or execution (``execId``) as a *task*.
:data:`CROSSINGS` says, for every event kind that touches a task, which A2A update it becomes,
the task state it stands for and the role of the message it carries; :func:`to_a2a` and
:func:`from_a2a` read only that table.

Lossless. Several kinds land on the same A2A shape — ``feedbackRequested``/``blocked`` both
mean INPUT_REQUIRED; ``workClaimed``/``feedbackProvided``/``messagePosted`` (and
``execStarted``/``execCancelRequested``) are all WORKING; ``workPublished`` and ``execOutput``
are both artifact updates — so every update carries ``metadata["agora.kind"]`` and the event's
envelope (``metadata["agora.event"]``: id, seq, producer, links, hash chain) and
``from_a2a(to_a2a(e)) == e`` holds for every mapped event (tested with Hypothesis).

Payloads cross as message or artifact *parts* (``metadata["agora.payload"]`` names the shape):

- ``"none"``: no payload, no message.
- ``"text"``: a string payload (or a ``messagePosted`` with only ``text``) is one text part.
- ``"message"``: a payload that *is* an A2A message (``{"messageId", "parts", …}`` in ProtoJSON,
  which is what the adapter writes for a peer's message) crosses as that message.
- ``"artifact"``: a ``workPublished`` payload that is an A2A artifact (``{"artifactId",
  "parts", …}``, plus ``append``/``lastChunk``) crosses as that artifact.
- ``"json"``: anything else is one data part holding the payload's JSON.
- ``"output"``: an ``execOutput`` chunk is a text part when it is valid UTF-8, else a raw part.

JSON numbers inside data parts and metadata travel as ``google.protobuf.Value`` doubles, so
values cross exactly by :func:`exact`/:func:`plain`: integers up to ±2**53 are doubles (the
wire shows them as integers, :mod:`a2a_adapter.responses`), larger ones
``{"agora.int": "<digits>"}``, integral floats ``{"agora.float": "2.0"}`` (docs/a2a.md
"Numbers").
"""

from __future__ import annotations

import base64
import hashlib
import re
from collections.abc import Iterable, Mapping
from typing import Any, Final, Literal, NamedTuple

import msgspec
from a2a.types.a2a_pb2 import (
    Artifact,
    Message,
    Part,
    Role,
    TaskArtifactUpdateEvent,
    TaskState,
    TaskStatus,
    TaskStatusUpdateEvent,
)
from google.protobuf import json_format, struct_pb2

from hub.core.events import (
    ArtifactPublished,
    Event,
    ExecFinished,
    ExecOutput,
    MessagePayload,
    MessagePosted,
    event_from_builtins,
    event_to_builtins,
)
from hub.core.projections.executions import ExecStatus
from hub.core.rules.work import WorkStatus

__all__ = [
    "CROSSINGS",
    "EVENT_KEY",
    "EXEC_STATE",
    "FLOAT_KEY",
    "INTERRUPTED_STATES",
    "INT_KEY",
    "KIND_KEY",
    "PAYLOAD_KEY",
    "TERMINAL_STATES",
    "WORK_STATE",
    "A2AUpdate",
    "Crossing",
    "MappingError",
    "closing_chunks",
    "exact",
    "foreign_kind",
    "foreign_table",
    "from_a2a",
    "mapping_table",
    "message_payload",
    "message_posted_payload",
    "payload_parts",
    "plain",
    "task_id_of",
    "to_a2a",
]

A2AUpdate = TaskStatusUpdateEvent | TaskArtifactUpdateEvent

KIND_KEY: Final = "agora.kind"
EVENT_KEY: Final = "agora.event"
PAYLOAD_KEY: Final = "agora.payload"
CHUNK_KEY: Final = "agora.n"
SYNTHETIC_KEY: Final = "agora.synthetic"

Shape = Literal["none", "text", "message", "artifact", "json", "output"]


BLOBS_PATH: Final = "/blobs"
"""Where the HTTP port serves blobs (a2a_adapter/files.py)."""


def blob_path(workspace: str, sha256: str) -> str:
    """The download path of a blob through ``workspace`` (relative to the HTTP port)."""
    return f"{BLOBS_PATH}/{workspace}/{sha256}"


class MappingError(ValueError):
    """An A2A object that does not carry what :func:`from_a2a` needs (names what is wrong)."""


class Crossing(NamedTuple):
    """How one event kind crosses to A2A."""

    update: Literal["status", "artifact"]
    state: TaskState | None
    """The task state this kind stands for; ``None``: the task keeps its state (the caller
    passes it), or, for ``execFinished``, the state follows the payload's ``status``."""
    role: Role
    """Who speaks in the status message: ROLE_USER for the requester's side, else ROLE_AGENT."""
    task: Literal["work", "exec"]


S = TaskState
# The one table (docs/a2a.md renders it). Kinds not listed (files, presence, artifacts by key,
# execDisposed) are workspace facts, not task updates: to_a2a returns [] for them.
CROSSINGS: Final[Mapping[str, Crossing]] = {
    "needWork": Crossing("status", S.TASK_STATE_SUBMITTED, Role.ROLE_USER, "work"),
    "workClaimed": Crossing("status", S.TASK_STATE_WORKING, Role.ROLE_AGENT, "work"),
    "feedbackRequested": Crossing("status", S.TASK_STATE_INPUT_REQUIRED, Role.ROLE_AGENT, "work"),
    "blocked": Crossing("status", S.TASK_STATE_INPUT_REQUIRED, Role.ROLE_AGENT, "work"),
    "feedbackProvided": Crossing("status", S.TASK_STATE_WORKING, Role.ROLE_USER, "work"),
    "messagePosted": Crossing("status", None, Role.ROLE_USER, "work"),
    "workPublished": Crossing("artifact", None, Role.ROLE_AGENT, "work"),
    # An artifact in a task (a peer's file part, docs/a2a.md "Files"): an A2A artifact whose
    # parts are its payload (data) and a file part with its download URL (a2a_adapter/files.py).
    "artifactPublished": Crossing("artifact", None, Role.ROLE_AGENT, "work"),
    "completed": Crossing("status", S.TASK_STATE_COMPLETED, Role.ROLE_AGENT, "work"),
    "workCancelled": Crossing("status", S.TASK_STATE_CANCELED, Role.ROLE_USER, "work"),
    "execRequested": Crossing("status", S.TASK_STATE_SUBMITTED, Role.ROLE_USER, "exec"),
    "execStarted": Crossing("status", S.TASK_STATE_WORKING, Role.ROLE_AGENT, "exec"),
    "execOutput": Crossing("artifact", None, Role.ROLE_AGENT, "exec"),
    "execCancelRequested": Crossing("status", None, Role.ROLE_USER, "exec"),
    "execFinished": Crossing("status", None, Role.ROLE_AGENT, "exec"),
}

# Work-item status (hub/projections/work.py) → task state. GetTask reads the projection's
# status through this table; the stream computes the same status with the same lifecycle.
WORK_STATE: Final[Mapping[WorkStatus, TaskState]] = {
    "requested": S.TASK_STATE_SUBMITTED,
    "claimed": S.TASK_STATE_WORKING,
    "published": S.TASK_STATE_WORKING,
    "feedbackRequested": S.TASK_STATE_INPUT_REQUIRED,
    "inProgress": S.TASK_STATE_WORKING,
    "blocked": S.TASK_STATE_INPUT_REQUIRED,
    "completed": S.TASK_STATE_COMPLETED,
    "cancelled": S.TASK_STATE_CANCELED,
}

# Execution status (hub/projections/executions.py) → task state.
EXEC_STATE: Final[Mapping[ExecStatus, TaskState]] = {
    "requested": S.TASK_STATE_SUBMITTED,
    "running": S.TASK_STATE_WORKING,
    "completed": S.TASK_STATE_COMPLETED,
    "failed": S.TASK_STATE_FAILED,
    "cancelled": S.TASK_STATE_CANCELED,
}

TERMINAL_STATES: Final[frozenset[TaskState]] = frozenset(
    {S.TASK_STATE_COMPLETED, S.TASK_STATE_FAILED, S.TASK_STATE_CANCELED, S.TASK_STATE_REJECTED}
)
INTERRUPTED_STATES: Final[frozenset[TaskState]] = frozenset(
    {S.TASK_STATE_INPUT_REQUIRED, S.TASK_STATE_AUTH_REQUIRED}
)

# The reverse direction for a *foreign* agent (a bridged A2A peer, whose updates carry no
# agora metadata): task state → the kind the bridge writes. WORKING is workClaimed the first
# time (the peer took the item) and messagePosted after that when it carries a message;
# SUBMITTED writes nothing (the needWork already exists). FAILED and REJECTED end the item as
# workCancelled (work items have no failed state), keeping the peer's state in the payload.
_FOREIGN: Final[Mapping[TaskState, str | None]] = {
    S.TASK_STATE_SUBMITTED: None,
    S.TASK_STATE_WORKING: "workClaimed",
    S.TASK_STATE_INPUT_REQUIRED: "feedbackRequested",
    S.TASK_STATE_AUTH_REQUIRED: "blocked",
    S.TASK_STATE_COMPLETED: "completed",
    S.TASK_STATE_CANCELED: "workCancelled",
    S.TASK_STATE_FAILED: "workCancelled",
    S.TASK_STATE_REJECTED: "workCancelled",
}

_MESSAGE_KEYS: Final = frozenset(
    {"messageId", "parts", "metadata", "extensions", "referenceTaskIds"}
)
_ARTIFACT_KEYS: Final = frozenset(
    {"artifactId", "name", "description", "parts", "metadata", "extensions"}
)
_CHUNK_FLAGS: Final = frozenset({"append", "lastChunk"})
_EXACT_INT: Final = 2**53
INT_KEY: Final = "agora.int"
FLOAT_KEY: Final = "agora.float"
_MARKERS: Final = frozenset({INT_KEY, FLOAT_KEY})
_INT_TEXT: Final = re.compile(r"-?[0-9]+")


# ---------------------------------------------------------------------------------------------
# JSON helpers


def exact(value: Any) -> Any:
    """JSON ``value`` made safe for ``google.protobuf.Value`` (which holds every number as a
    double), so that :func:`plain` gives back exactly ``value``: an integer beyond ±2**53
    becomes ``{"agora.int": "<digits>"}``, an integral float (``2.0``, ``-0.0``, ``1e20``)
    ``{"agora.float": "<repr>"}``, and an object whose only key is one of these markers is
    escaped by wrapping it once more. Other numbers are doubles already."""
    if isinstance(value, bool) or value is None or isinstance(value, str):
        return value
    if isinstance(value, int):
        return value if abs(value) <= _EXACT_INT else {INT_KEY: str(value)}
    if isinstance(value, float):
        return {FLOAT_KEY: repr(value)} if value.is_integer() else value
    if isinstance(value, dict):
        out = {k: exact(v) for k, v in value.items()}
        if len(out) == 1 and next(iter(out)) in _MARKERS:
            return {next(iter(out)): out}  # a literal marker-shaped object: escaped
        return out
    if isinstance(value, list | tuple):
        return [exact(v) for v in value]
    return value


def plain(value: Any) -> Any:
    """JSON read back from protobuf: the inverse of :func:`exact`, and integral doubles
    (|x| <= 2**53) turned into ints, recursively.

    protobuf's ``Value`` stores every JSON number as a double; a peer's ``2`` arrives as
    ``2.0`` and is an int again here.
    """
    if isinstance(value, float):
        if value.is_integer() and abs(value) <= _EXACT_INT:
            return int(value)
        return value
    if isinstance(value, dict):
        if len(value) == 1:
            ((key, inner),) = value.items()
            if key in _MARKERS:
                decoded = _unmark(key, inner)
                if decoded is not _NOT_MARKED:
                    return decoded
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, list):
        return [plain(v) for v in value]
    return value


_NOT_MARKED: Final = object()


def _unmark(key: str, inner: Any) -> Any:
    if isinstance(inner, dict) and len(inner) == 1 and key in inner:
        return {key: plain(inner[key])}  # an escaped literal
    if not isinstance(inner, str):
        return _NOT_MARKED
    try:
        if key == INT_KEY and _INT_TEXT.fullmatch(inner):
            return int(inner)
        if key == FLOAT_KEY:
            number = float(inner)
            if number.is_integer():  # what exact() marks; anything else is a plain object
                return number
    except ValueError:
        pass
    return _NOT_MARKED


def _value(obj: Any) -> struct_pb2.Value:
    value = struct_pb2.Value()
    json_format.ParseDict(exact(obj), value)
    return value


def _struct(obj: Mapping[str, Any]) -> struct_pb2.Struct:
    out = struct_pb2.Struct()
    json_format.ParseDict(exact(dict(obj)), out)
    return out


def _dict(message: Any) -> dict[str, Any]:
    """ProtoJSON of a protobuf message with numbers made plain."""
    out: dict[str, Any] = plain(json_format.MessageToDict(message))
    return out


def _canonical_message(payload: Any) -> Message | None:
    """The A2A message ``payload`` is, if it is exactly one in ProtoJSON (else None)."""
    if not isinstance(payload, dict) or "parts" not in payload or "messageId" not in payload:
        return None
    if not payload.keys() <= _MESSAGE_KEYS:
        return None
    message = Message()
    try:
        json_format.ParseDict(exact(payload), message)
    except (json_format.ParseError, TypeError, ValueError):
        return None
    if not message.parts or _dict(message) != payload:
        return None
    return message


def _canonical_artifact(payload: Any) -> tuple[Artifact, bool, bool] | None:
    """The A2A artifact (with append, lastChunk) ``payload`` is exactly, or None."""
    if not isinstance(payload, dict) or "parts" not in payload or "artifactId" not in payload:
        return None
    if not payload.keys() <= _ARTIFACT_KEYS | _CHUNK_FLAGS:
        return None
    append = payload.get("append", False)
    last = payload.get("lastChunk", False)
    if append not in (True, False) or last not in (True, False):
        return None
    if ("append" in payload and append is False) or ("lastChunk" in payload and last is False):
        return None  # a canonical payload omits false flags, as ProtoJSON does
    body = {k: v for k, v in payload.items() if k not in _CHUNK_FLAGS}
    artifact = Artifact()
    try:
        json_format.ParseDict(exact(body), artifact)
    except (json_format.ParseError, TypeError, ValueError):
        return None
    if not artifact.parts or _dict(artifact) != body:
        return None
    return artifact, bool(append), bool(last)


def _joined_text(parts: Iterable[Part]) -> str | None:
    texts = [p.text for p in parts if p.WhichOneof("content") == "text"]
    return "\n".join(texts) if texts else None


def message_payload(message: Message) -> dict[str, Any]:
    """A peer's message as an event payload: its ProtoJSON without task, context and role."""
    body = Message()
    body.CopyFrom(message)
    body.ClearField("task_id")
    body.ClearField("context_id")
    body.ClearField("role")
    return _dict(body)


def _payload_builtins(event: Event) -> Any:
    payload = getattr(event, "payload", None)
    if isinstance(payload, msgspec.Struct):
        return msgspec.to_builtins(payload)
    return payload


# ---------------------------------------------------------------------------------------------
# Event → A2A


def task_id_of(event: Event) -> str | None:
    """The task an event belongs to: its correlationId (work) or execId (execution)."""
    crossing = CROSSINGS.get(event.kind)
    if crossing is None:
        return None
    if crossing.task == "exec":
        exec_id: str = event.payload.exec_id  # type: ignore[attr-defined]
        return exec_id
    return event.correlation_id


def _envelope(event: Event) -> dict[str, Any]:
    env = event_to_builtins(event)
    env.pop("kind", None)
    env.pop("payload", None)
    return env


def _encode(event: Event) -> tuple[Shape, Message | None, list[Part]]:
    """The payload's shape, the A2A message it is (if any) and its parts otherwise."""
    payload = getattr(event, "payload", None)
    if isinstance(event, MessagePosted):
        p = event.payload
        if p.text is not None and p.data is None and p.media_type is None:
            return "text", None, [Part(text=p.text)]
        message = _canonical_message(p.data)
        if message is not None and p.media_type is None and p.text == _joined_text(message.parts):
            return "message", message, []
        return "json", None, [Part(data=_value(msgspec.to_builtins(p)))]
    if isinstance(payload, msgspec.Struct):
        return "json", None, [Part(data=_value(msgspec.to_builtins(payload)))]
    if payload is None:
        return "none", None, []
    if isinstance(payload, str):
        return "text", None, [Part(text=payload)]
    message = _canonical_message(payload)
    if message is not None:
        return "message", message, []
    return "json", None, [Part(data=_value(payload))]


def to_a2a(
    event: Event, *, state: TaskState | None = None, append: bool = False
) -> list[A2AUpdate]:
    """The A2A updates for one stored event (``[]`` for events that are not task updates:
    other kinds, or no correlationId).

    ``state``: the task's state after the event, as the caller's fold computed it (needed for
    kinds that keep the state, e.g. ``messagePosted``; defaults to the table's state, WORKING
    where the table has none). ``append``: for ``execOutput``, whether an earlier chunk of the
    same stream was sent.
    """
    crossing = CROSSINGS.get(event.kind)
    if crossing is None:
        return []
    task_id = task_id_of(event)
    if not task_id:
        return []  # e.g. a messagePosted outside any work item
    context_id = event.workspace
    metadata: dict[str, Any] = {KIND_KEY: event.kind, EVENT_KEY: _envelope(event)}

    if isinstance(event, ExecOutput):
        p = event.payload
        try:
            part = Part(text=p.data.decode("utf-8"), media_type="text/plain")
        except UnicodeDecodeError:
            part = Part(raw=p.data, media_type="application/octet-stream")
        metadata[PAYLOAD_KEY] = "output"
        metadata[CHUNK_KEY] = p.n
        return [
            TaskArtifactUpdateEvent(
                task_id=task_id,
                context_id=context_id,
                artifact=Artifact(
                    artifact_id=f"{p.exec_id}:{p.stream}", name=p.stream, parts=[part]
                ),
                append=append,
                last_chunk=False,
                metadata=_struct(metadata),
            )
        ]

    shape, message, parts = _encode(event)
    if crossing.update == "artifact":
        canonical = _canonical_artifact(getattr(event, "payload", None))
        if canonical is not None:
            artifact, chunk_append, last = canonical
            shape = "artifact"
        else:
            if message is not None:  # a message-shaped payload published as work: keep parts
                shape, parts = "json", [Part(data=_value(_payload_builtins(event)))]
            if shape == "none":
                shape, parts = "json", [Part(data=_value(None))]
            artifact = Artifact(artifact_id=event.id or f"{task_id}:{event.seq}", parts=parts)
            if isinstance(event, ArtifactPublished):
                a = event.payload
                artifact.name = a.key
                artifact.parts.append(
                    Part(url=blob_path(context_id, a.blob), filename=a.key, media_type=a.media_type)
                )
            chunk_append, last = False, False
        metadata[PAYLOAD_KEY] = shape
        return [
            TaskArtifactUpdateEvent(
                task_id=task_id,
                context_id=context_id,
                artifact=artifact,
                append=chunk_append,
                last_chunk=last,
                metadata=_struct(metadata),
            )
        ]

    metadata[PAYLOAD_KEY] = shape
    if state is None:
        if isinstance(event, ExecFinished):
            state = EXEC_STATE[event.payload.status]
        else:
            state = crossing.state if crossing.state is not None else S.TASK_STATE_WORKING
    status = TaskStatus(state=state)
    if event.timestamp:
        status.timestamp.FromMilliseconds(event.timestamp)
    if message is not None or parts:
        msg = Message()
        if message is not None:
            msg.CopyFrom(message)
        else:
            msg.message_id = event.id or f"{task_id}:{event.seq}"
            msg.parts.extend(parts)
        msg.role = crossing.role
        msg.task_id = task_id
        msg.context_id = context_id
        status.message.CopyFrom(msg)
    return [
        TaskStatusUpdateEvent(
            task_id=task_id, context_id=context_id, status=status, metadata=_struct(metadata)
        )
    ]


def closing_chunks(
    exec_id: str, context_id: str, streams: Iterable[str]
) -> list[TaskArtifactUpdateEvent]:
    """Empty ``lastChunk`` updates that close each output stream of a finished execution.

    Marked ``metadata["agora.synthetic"]``: they stand for no event, and :func:`from_a2a`
    returns None for them.
    """
    return [
        TaskArtifactUpdateEvent(
            task_id=exec_id,
            context_id=context_id,
            artifact=Artifact(
                artifact_id=f"{exec_id}:{stream}",
                name=stream,
                parts=[Part(text="", media_type="text/plain")],
            ),
            append=True,
            last_chunk=True,
            metadata=_struct({KIND_KEY: "execFinished", SYNTHETIC_KEY: True}),
        )
        for stream in streams
    ]


# ---------------------------------------------------------------------------------------------
# A2A → event


def _decode_parts(shape: str, parts: list[Part], kind: str) -> Any:
    if shape == "none":
        return None
    if not parts:
        raise MappingError(f"{kind}: payload shape {shape!r} needs a part")
    part = parts[0]
    if shape == "text":
        if part.WhichOneof("content") != "text":
            raise MappingError(f"{kind}: payload shape 'text' needs a text part")
        return {"text": part.text} if kind == "messagePosted" else part.text
    if shape == "json":
        if part.WhichOneof("content") != "data":
            raise MappingError(f"{kind}: payload shape 'json' needs a data part")
        return plain(json_format.MessageToDict(part.data))
    raise MappingError(f"{kind}: unknown payload shape {shape!r}")


def from_a2a(update: A2AUpdate) -> Event | None:
    """The stored event an update of :func:`to_a2a` stands for; None for a synthetic update.

    Raises :class:`MappingError` when the update lacks the agora metadata (a foreign update:
    use :func:`foreign_kind`) or does not decode to a valid event.
    """
    meta = plain(json_format.MessageToDict(update.metadata)) if update.HasField("metadata") else {}
    if meta.get(SYNTHETIC_KEY):
        return None
    kind = meta.get(KIND_KEY)
    envelope = meta.get(EVENT_KEY)
    if not isinstance(kind, str) or kind not in CROSSINGS or not isinstance(envelope, dict):
        raise MappingError("the update carries no agora.kind/agora.event metadata")
    shape = meta.get(PAYLOAD_KEY, "none")
    payload: Any
    if isinstance(update, TaskArtifactUpdateEvent):
        artifact = update.artifact
        if shape == "output":
            part = artifact.parts[0] if artifact.parts else Part()
            content = part.WhichOneof("content")
            data = part.text.encode("utf-8") if content == "text" else part.raw
            payload = {
                "execId": update.task_id,
                "stream": artifact.name,
                "n": meta.get(CHUNK_KEY),
                "data": base64.b64encode(data).decode("ascii"),
            }
        elif shape == "artifact":
            payload = _dict(artifact)
            if update.append:
                payload["append"] = True
            if update.last_chunk:
                payload["lastChunk"] = True
        else:
            payload = _decode_parts(shape, list(artifact.parts), kind)
    else:
        message = update.status.message if update.status.HasField("message") else None
        if shape == "message":
            if message is None:
                raise MappingError(f"{kind}: payload shape 'message' needs a status message")
            body = message_payload(message)
            payload = (
                {"text": _joined_text(message.parts), "data": body}
                if kind == "messagePosted"
                else body
            )
        else:
            payload = _decode_parts(shape, list(message.parts) if message else [], kind)
    obj = dict(envelope)
    obj["kind"] = kind
    if payload is not None or kind == "messagePosted":
        obj["payload"] = {} if payload is None else payload
    try:
        return event_from_builtins(obj)
    except msgspec.ValidationError as e:
        raise MappingError(f"{kind}: {e}") from e


def payload_parts(payload: Any) -> tuple[list[Part], dict[str, Any] | None]:
    """The parts (and message metadata) to send a peer for an event payload: a payload that
    is an A2A message gives its own parts, a string one text part, anything else one data
    part; ``None`` gives no parts."""
    if isinstance(payload, MessagePayload):
        payload = payload.data if _canonical_message(payload.data) else msgspec.to_builtins(payload)
    if payload is None:
        return [], None
    if isinstance(payload, str):
        return [Part(text=payload)], None
    message = _canonical_message(payload)
    if message is not None:
        meta = _dict(message.metadata) if message.HasField("metadata") else None
        return list(message.parts), meta
    return [Part(data=_value(payload))], None


def foreign_kind(state: TaskState, *, claimed: bool, has_message: bool) -> str | None:
    """The kind a bridged peer's status update becomes (None: write nothing).

    ``claimed``: whether the peer already claimed the work item; ``has_message``: whether the
    update carries a status message.
    """
    kind = _FOREIGN.get(state)
    if kind == "workClaimed" and claimed:
        return "messagePosted" if has_message else None
    return kind


def mapping_table() -> str:
    """:data:`CROSSINGS` as a Markdown table (docs/a2a.md includes it; a test keeps it fresh)."""
    rows = [
        "| event kind | A2A update | task state | message role | task |",
        "|---|---|---|---|---|",
    ]
    for kind, c in CROSSINGS.items():
        if c.state is not None:
            state = TaskState.Name(c.state).removeprefix("TASK_STATE_")
        elif kind == "execFinished":
            state = "COMPLETED / FAILED / CANCELED (payload status)"
        else:
            state = "unchanged"
        update = "TaskStatusUpdateEvent" if c.update == "status" else "TaskArtifactUpdateEvent"
        role = Role.Name(c.role).removeprefix("ROLE_") if c.update == "status" else "-"
        task = "work item (correlationId)" if c.task == "work" else "execution (execId)"
        rows.append(f"| `{kind}` | {update} | {state} | {role} | {task} |")
    return "\n".join(rows)


def foreign_table() -> str:
    """The reverse table for bridged peers, as Markdown."""
    rows = ["| peer's task state | event written (producer = the peer) |", "|---|---|"]
    for state, kind in _FOREIGN.items():
        name = TaskState.Name(state).removeprefix("TASK_STATE_")
        if kind == "workClaimed":
            text = "`workClaimed` the first time, then `messagePosted` if it carries a message"
        else:
            text = "nothing" if kind is None else f"`{kind}`"
        rows.append(f"| {name} | {text} |")
    return "\n".join(rows)


def message_posted_payload(message: Message) -> MessagePayload:
    """A peer's message (not a state change) as a ``messagePosted`` payload."""
    return MessagePayload(text=_joined_text(message.parts), data=message_payload(message))


def derived_event_id(*parts: str) -> str:
    """A deterministic event id from ``parts``, so a retried A2A request (or a bridge step
    replayed after a restart) appends nothing new: ``a2a-`` and 40 hex digits of SHA-256."""
    digest = hashlib.sha256("\x00".join(parts).encode("utf-8", "surrogatepass")).hexdigest()
    return f"a2a-{digest[:40]}"
