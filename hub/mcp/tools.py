"""The MCP tools of ``agora mcp``: one argument Struct per tool (its JSON Schema and its parser
come from the same type) and what the tool does through the Python client.

Every tool acts through an :class:`AgentLink`: one :class:`hub.client.Session` opened with the
caller's token, so the hub checks rights and writes the same events as for any WebSocket
client (the producer is the token's agent, never an argument). A tool returns a JSON object
(MCP structured content); a failure raises an :class:`~hub.core.errors.AgoraError`, which
:mod:`hub.mcp.server` turns into a tool error (``isError``) carrying the stable code.

Hostile by default: arguments are checked before anything is sent (unknown fields, wrong
types, nesting deeper than ``max_depth``, more than ``max_event_bytes`` encoded →
``badRequest``/``tooLarge``, nothing written); the hub then applies its own checks (paths,
rights, sizes). Every wait is bounded (:data:`MAX_WAIT_MS`), every listing too
(:data:`MAX_TIMELINE_EVENTS`, :data:`MAX_RESULT_BYTES`).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Annotated, Any, Final

import msgspec

from backends.code_tool import (
    CODE_EXEC_DESCRIPTION,
    CODE_EXEC_PARAMETERS,
    TOOL_NAME,
    _wasm_bytes,
    parse_arguments,
)
from hub.client import Session, Workspace
from hub.core.decoding import check_value_depth
from hub.core.errors import AgoraError, BadRequest, Forbidden, NotFound, TooLarge
from hub.core.events import Event
from hub.core.execution.errors import ExecutionError
from hub.core.validation import DEFAULT_LIMITS, Limits, validate_workspace

__all__ = [
    "DEFAULT_BACKENDS",
    "MAX_RESULT_BYTES",
    "MAX_TIMELINE_EVENTS",
    "MAX_WAIT_MS",
    "TOOLS",
    "AgentLink",
    "ToolSpec",
    "event_json",
    "run_tool",
]

MAX_WAIT_MS: Final = 60_000
"""The longest a ``wait_for_event`` call waits (its ``timeoutMs`` is clamped to this)."""
DEFAULT_WAIT_MS: Final = 10_000
MAX_TIMELINE_EVENTS: Final = 1000
"""The most events one ``timeline`` call returns (``limit`` is clamped to this)."""
MAX_SCAN_EVENTS: Final = 10_000
"""The most events one ``timeline`` or ``wait_for_event`` call reads while filtering; the
caller pages on with ``nextAfterSeq``."""
MAX_RESULT_BYTES: Final = 1024 * 1024
"""A ``timeline`` result stops growing past about this many bytes of events."""

DEFAULT_BACKENDS: Final[Mapping[str, str]] = MappingProxyType(
    {"rust": "rust", "python": "python", "wasm": "wasm", "shell": "process"}
)
"""``code_exec``'s language → the hub's backend instance it runs on (the hub's default
instances are named after their kind; ``agora mcp --backend LANG=ID`` changes one)."""


@dataclass(eq=False)
class AgentLink:
    """What the tools of one MCP connection act through: the hub session of its token, the
    workspace used when a call names none, and ``code_exec``'s backends."""

    session: Session
    default_workspace: str | None = None
    backends: Mapping[str, str] = field(default_factory=lambda: dict(DEFAULT_BACKENDS))
    limits: Limits = DEFAULT_LIMITS
    token_workspaces: tuple[str, ...] = ()
    """The workspaces the token names, when known (a token naming one makes it the default)."""

    def workspace(self, name: str | None) -> Workspace:
        """The named workspace, else the default one, else the token's only workspace.
        Raises ``BadRequest`` when none of those exists."""
        if name is None:
            name = self.default_workspace
        if name is None and len(self.token_workspaces) == 1 and self.token_workspaces[0] != "*":
            name = self.token_workspaces[0]
        if name is None:
            raise BadRequest(
                "name a workspace: this connection has no default one", field="workspace"
            )
        return self.session.workspace(validate_workspace(name))


# -- argument types ------------------------------------------------------------------------

Workspace_ = Annotated[
    str | None,
    msgspec.Meta(description="The workspace (default: the connection's workspace)."),
]
Path_ = Annotated[str, msgspec.Meta(description="A relative POSIX path in the workspace.")]
NonNegative = Annotated[int, msgspec.Meta(ge=0)]
BaseRev = Annotated[
    NonNegative | None,
    msgspec.Meta(
        description="The file revision this change replaces (0: the file must not exist); a "
        "stale one is refused with `conflict`. Omitted: no check.",
    ),
]
Payload_ = Annotated[Any, msgspec.Meta(description="Any JSON value: the event's payload.")]
Cid = Annotated[str, msgspec.Meta(description="The work item's correlationId.")]
Consumer = Annotated[
    str | None, msgspec.Meta(description="The agent this is addressed to (default: anyone).")
]


class _Args(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True, rename="camel"):
    workspace: Workspace_ = None


class ListFiles(_Args, frozen=True):
    prefix: Annotated[str, msgspec.Meta(description="Only paths starting with this.")] = ""


class ReadFile(_Args, frozen=True):
    path: Path_


class WriteFile(_Args, frozen=True):
    path: Path_
    text: Annotated[str | None, msgspec.Meta(description="The content as text.")] = None
    base64: Annotated[
        str | None, msgspec.Meta(description="The content as base64 (binary files).")
    ] = None
    base_rev: BaseRev = None
    media_type: Annotated[str | None, msgspec.Meta(description="e.g. text/x-python")] = None


class DeleteFile(_Args, frozen=True):
    path: Path_
    base_rev: BaseRev = None


class MoveFile(_Args, frozen=True):
    from_: Annotated[str, msgspec.Meta(description="The file to move.")]
    to: Annotated[str, msgspec.Meta(description="Its new path (must not exist).")]
    base_rev: BaseRev = None


class PostMessage(_Args, frozen=True):
    text: Annotated[str | None, msgspec.Meta(description="The message text.")] = None
    data: Annotated[Any, msgspec.Meta(description="Structured data (any JSON).")] = None


class RequestWork(_Args, frozen=True):
    topic: Annotated[str, msgspec.Meta(description="What kind of work (e.g. 'review').")]
    payload: Payload_ = None
    consumer: Consumer = None


Topic = Annotated[
    str | None,
    msgspec.Meta(description="The item's topic, carried on the event (default: none)."),
]


class WorkStep(_Args, frozen=True):
    correlation_id: Cid
    payload: Payload_ = None
    topic: Topic = None


class AddressedWorkStep(_Args, frozen=True):
    correlation_id: Cid
    payload: Payload_ = None
    consumer: Consumer = None
    topic: Topic = None


class ListOpenWork(_Args, frozen=True):
    topic: Annotated[str | None, msgspec.Meta(description="Only this topic.")] = None


class WaitForEvent(_Args, frozen=True):
    after_seq: Annotated[
        NonNegative | None,
        msgspec.Meta(
            description="Return the first matching event after this seq (from the log, then "
            "live). Omitted: only events appended after the call starts.",
        ),
    ] = None
    correlation_id: Annotated[str | None, msgspec.Meta(description="Only this work item.")] = None
    kinds: Annotated[
        Annotated[list[str], msgspec.Meta(max_length=64)] | None,
        msgspec.Meta(description="Only these event kinds."),
    ] = None
    timeout_ms: Annotated[
        int,
        msgspec.Meta(
            ge=0, description=f"How long to wait, clamped to {MAX_WAIT_MS} (default 10000)."
        ),
    ] = DEFAULT_WAIT_MS


class WorkspaceStateArgs(_Args, frozen=True):
    at_seq: Annotated[
        NonNegative | None, msgspec.Meta(description="The state as of this seq (default: now).")
    ] = None


class TimelineArgs(_Args, frozen=True):
    after_seq: Annotated[int, msgspec.Meta(ge=0, description="Events after this seq.")] = 0
    limit: Annotated[
        int,
        msgspec.Meta(ge=1, description=f"At most this many (clamped to {MAX_TIMELINE_EVENTS})."),
    ] = 100
    kinds: Annotated[
        Annotated[list[str], msgspec.Meta(max_length=64)] | None,
        msgspec.Meta(description="Only these event kinds."),
    ] = None
    correlation_id: Annotated[str | None, msgspec.Meta(description="Only this work item.")] = None


def _schema(cls: type[msgspec.Struct]) -> dict[str, Any]:
    """``cls`` as a self-contained JSON Schema object (its fields are flat: no ``$defs``)."""
    _, components = msgspec.json.schema_components((cls,))
    schema: dict[str, Any] = dict(components[cls.__name__])
    schema.pop("title", None)
    schema["type"] = "object"
    schema.setdefault("required", [])
    return schema


# -- what the tools do ---------------------------------------------------------------------


def event_json(ev: Event) -> dict[str, Any]:
    """An event as the wire shows it (the envelope, camelCase)."""
    out: dict[str, Any] = msgspec.to_builtins(ev)
    return out


def _ack(ev: Event) -> dict[str, Any]:
    out: dict[str, Any] = {"workspace": ev.workspace, "seq": ev.seq, "id": ev.id, "kind": ev.kind}
    if ev.correlation_id is not None:
        out["correlationId"] = ev.correlation_id
    return out


async def _file_rev(ws: Workspace, path: str, seq: int) -> int | None:
    entry = (await ws.state(at_seq=seq, paths=[path])).files.get(path)
    return entry.rev if entry is not None else None


def _file_meta(path: str, entry: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"path": path, "rev": entry.rev, "size": entry.size}
    out.update(sha256=entry.sha256, seq=entry.seq, producer=entry.producer)
    if entry.media_type is not None:
        out["mediaType"] = entry.media_type
    return out


async def list_files(link: AgentLink, a: ListFiles) -> dict[str, Any]:
    ws = link.workspace(a.workspace)
    state = await ws.state()
    files = [_file_meta(p, e) for p, e in sorted(state.files.items()) if p.startswith(a.prefix)]
    return {"workspace": ws.name, "seq": state.seq, "files": files}


async def read_file(link: AgentLink, a: ReadFile) -> dict[str, Any]:
    ws = link.workspace(a.workspace)
    state = await ws.state(contents=True, paths=[a.path])
    entry = state.files.get(a.path)
    if entry is None:
        raise NotFound(f"no file {a.path!r} in workspace {ws.name!r}", path=a.path)
    out = _file_meta(a.path, entry)
    if entry.text is not None:
        out["text"] = entry.text
    elif entry.base64 is not None:
        out["base64"] = entry.base64
    else:
        raise NotFound(
            f"{a.path!r} is in the blob store ({entry.size} bytes); its content is not inline",
            path=a.path,
            blob=entry.blob,
        )
    return out


async def write_file(link: AgentLink, a: WriteFile) -> dict[str, Any]:
    if (a.text is None) == (a.base64 is None):
        raise BadRequest("give exactly one of text and base64", field="text")
    content: str | bytes
    if a.text is not None:
        content = a.text
    else:
        try:
            content = base64.b64decode(a.base64 or "", validate=True)
        except (binascii.Error, ValueError) as e:
            raise BadRequest(f"base64 is not valid: {e}", field="base64") from e
    ws = link.workspace(a.workspace)
    ev = await ws.write_file(a.path, content, a.base_rev, media_type=a.media_type)
    return {**_ack(ev), "path": a.path, "rev": await _file_rev(ws, a.path, ev.seq)}


async def delete_file(link: AgentLink, a: DeleteFile) -> dict[str, Any]:
    ev = await link.workspace(a.workspace).delete_file(a.path, a.base_rev)
    return {**_ack(ev), "path": a.path}


async def move_file(link: AgentLink, a: MoveFile) -> dict[str, Any]:
    ws = link.workspace(a.workspace)
    ev = await ws.move_file(a.from_, a.to, a.base_rev)
    return {**_ack(ev), "from": a.from_, "to": a.to, "rev": await _file_rev(ws, a.to, ev.seq)}


async def post_message(link: AgentLink, a: PostMessage) -> dict[str, Any]:
    if a.text is None and a.data is None:
        raise BadRequest("give text or data", field="text")
    return _ack(await link.workspace(a.workspace).post_message(a.text, a.data))


async def request_work(link: AgentLink, a: RequestWork) -> dict[str, Any]:
    ws = link.workspace(a.workspace)
    return _ack(await ws.request_work(a.topic, a.payload, a.consumer))


async def claim_work(link: AgentLink, a: WorkStep) -> dict[str, Any]:
    ws = link.workspace(a.workspace)
    return _ack(await ws.claim_work(a.correlation_id, a.payload, topic=a.topic))


async def publish_work(link: AgentLink, a: AddressedWorkStep) -> dict[str, Any]:
    ws = link.workspace(a.workspace)
    return _ack(
        await ws.publish_work(a.correlation_id, a.payload, consumer=a.consumer, topic=a.topic)
    )


async def request_feedback(link: AgentLink, a: AddressedWorkStep) -> dict[str, Any]:
    ws = link.workspace(a.workspace)
    return _ack(
        await ws.request_feedback(a.correlation_id, a.payload, consumer=a.consumer, topic=a.topic)
    )


async def provide_feedback(link: AgentLink, a: AddressedWorkStep) -> dict[str, Any]:
    ws = link.workspace(a.workspace)
    return _ack(
        await ws.provide_feedback(a.correlation_id, a.payload, consumer=a.consumer, topic=a.topic)
    )


async def block_work(link: AgentLink, a: WorkStep) -> dict[str, Any]:
    ws = link.workspace(a.workspace)
    return _ack(await ws.signal_blocked(a.correlation_id, a.payload, topic=a.topic))


async def complete_work(link: AgentLink, a: WorkStep) -> dict[str, Any]:
    ws = link.workspace(a.workspace)
    return _ack(await ws.signal_completed(a.correlation_id, a.payload, topic=a.topic))


async def cancel_work(link: AgentLink, a: WorkStep) -> dict[str, Any]:
    ws = link.workspace(a.workspace)
    return _ack(await ws.cancel_work(a.correlation_id, a.payload, topic=a.topic))


_FINISHED: Final = frozenset({"completed", "cancelled"})


async def list_open_work(link: AgentLink, a: ListOpenWork) -> dict[str, Any]:
    ws = link.workspace(a.workspace)
    state = await ws.state()
    items = [
        {"correlationId": cid, **msgspec.to_builtins(item)}
        for cid, item in state.work_items.items()
        if item.status not in _FINISHED and (a.topic is None or item.topic == a.topic)
    ]
    return {"workspace": ws.name, "seq": state.seq, "items": items}


def _matches(ev: Event, kinds: frozenset[str] | None, correlation_id: str | None) -> bool:
    if kinds is not None and ev.kind not in kinds:
        return False
    return correlation_id is None or ev.correlation_id == correlation_id


async def wait_for_event(link: AgentLink, a: WaitForEvent) -> dict[str, Any]:
    ws = link.workspace(a.workspace)
    kinds = frozenset(a.kinds) if a.kinds is not None else None
    timeout = min(a.timeout_ms, MAX_WAIT_MS) / 1000
    scanned = 0
    try:
        async with asyncio.timeout(timeout), ws.subscribe(a.after_seq) as sub:
            async for ev in sub:
                if _matches(ev, kinds, a.correlation_id):
                    return {"workspace": ws.name, "timedOut": False, "event": event_json(ev)}
                scanned += 1
                if scanned >= MAX_SCAN_EVENTS:
                    # As timeline: a bounded scan (afterSeq 0 on a long log would replay it
                    # all); the caller continues from the cursor reached.
                    return {
                        "workspace": ws.name,
                        "timedOut": False,
                        "more": True,
                        "nextAfterSeq": ev.seq,
                    }
    except TimeoutError:
        pass
    return {"workspace": ws.name, "timedOut": True}


async def workspace_state(link: AgentLink, a: WorkspaceStateArgs) -> dict[str, Any]:
    ws = link.workspace(a.workspace)
    out: dict[str, Any] = msgspec.to_builtins(await ws.state(a.at_seq))
    return out


async def timeline(link: AgentLink, a: TimelineArgs) -> dict[str, Any]:
    ws = link.workspace(a.workspace)
    kinds = frozenset(a.kinds) if a.kinds is not None else None
    limit = min(a.limit, MAX_TIMELINE_EVENTS)
    events: list[dict[str, Any]] = []
    size = 0
    last = a.after_seq
    async with ws.subscribe(a.after_seq) as sub:
        head = await sub.head()
        if head > a.after_seq:
            scanned = 0
            async for ev in sub:
                last, scanned = ev.seq, scanned + 1
                if _matches(ev, kinds, a.correlation_id):
                    item = event_json(ev)
                    events.append(item)
                    size += len(msgspec.json.encode(item))
                done = len(events) >= limit or size >= MAX_RESULT_BYTES
                if ev.seq >= head or done or scanned >= MAX_SCAN_EVENTS:
                    break
    return {
        "workspace": ws.name,
        "head": head,
        "events": events,
        "nextAfterSeq": last,
        "more": last < head,
    }


_STATUS: Final = {"compileFailed": "compile_error", "timeout": "timeout"}
_STATUS_MEMORY: Final = {"memoryLimit": "memory_exceeded"}


async def code_exec(link: AgentLink, arguments: dict[str, Any]) -> dict[str, Any]:
    """``code_exec`` with the tool schema of :mod:`backends.code_tool` (plus ``workspace``),
    run by the hub's runtime on the backend instance of the language, as the token's agent
    (the token must name that backend and carry ``exec``)."""
    arguments = dict(arguments)
    name = arguments.pop("workspace", None)
    if name is not None and not isinstance(name, str):
        raise BadRequest("workspace must be a string", field="workspace")
    try:
        parsed, timeout_s = parse_arguments(arguments)
    except ValueError as e:
        raise BadRequest(f"invalid code_exec arguments: {e}", field="arguments") from e
    ws = link.workspace(name)
    backend = link.backends.get(parsed.language)
    if backend is None:
        raise NotFound(f"no backend for {parsed.language!r} on this connection", field="language")
    given: dict[str, Any] = {}
    if parsed.language == "wasm":
        try:
            given["module"] = _wasm_bytes(parsed.code)
        except ExecutionError as e:
            raise BadRequest(e.message, field="code") from e
        given["input"] = parsed.input
    elif parsed.language == "shell":
        given["source"] = parsed.code
        if parsed.input is not msgspec.UNSET:
            given["stdin"] = msgspec.json.encode(parsed.input) + b"\n"
    else:
        given["source"] = parsed.code
        given["input"] = parsed.input
    # No timeout_secs: the instance's own default. A given one is clamped to the instance's
    # ceiling as CodeTool does: the hub names its limit when it refuses one above it (the
    # refused request wrote nothing), and the call is sent once more at that limit.
    timeout_ms = timeout_s * 1000 if "timeout_secs" in arguments else None
    try:
        handle = await ws.runtime.exec(backend=backend, timeout_ms=timeout_ms, **given)
    except Forbidden as e:
        limit = e.details.get("limit")
        field = str(e.details.get("field", ""))
        if not field.endswith("timeoutMs") or not isinstance(limit, int) or limit < 1:
            raise
        handle = await ws.runtime.exec(backend=backend, timeout_ms=limit, **given)
    result = await handle.result()
    if result.status == "completed":
        status = "success"
    else:
        status = {**_STATUS, **_STATUS_MEMORY}.get(result.reason, "error")
    out: dict[str, Any] = {
        "status": status,
        "language": parsed.language,
        "execId": handle.id,
        "backend": backend,
        "reason": result.reason,
        "exit_code": result.exit_code,
        "stdout": result.stdout if isinstance(result.stdout, str) else "",
        "stderr": result.stderr if isinstance(result.stderr, str) else "",
        "stdout_truncated": result.stdout_truncated,
        "stderr_truncated": result.stderr_truncated,
        "duration_ms": result.duration_ms,
        "diagnostics": msgspec.to_builtins(result.diagnostics),
    }
    if result.has_value:
        out["value"] = result.value
    return out


# -- the table -----------------------------------------------------------------------------

Runner = Callable[[AgentLink, Any], Awaitable[dict[str, Any]]]


@dataclass(frozen=True)
class ToolSpec:
    """One tool: its name, description, argument type (None: ``code_exec``, whose schema is
    :data:`backends.code_tool.CODE_EXEC_PARAMETERS`) and what it does."""

    name: str
    description: str
    arguments: type[_Args] | None
    run: Runner
    read_only: bool = False

    @property
    def input_schema(self) -> dict[str, Any]:
        if self.arguments is not None:
            return _schema(self.arguments)
        schema = dict(CODE_EXEC_PARAMETERS)
        schema["properties"] = {
            **CODE_EXEC_PARAMETERS["properties"],
            "workspace": {
                "type": "string",
                "description": "The workspace (default: the connection's workspace).",
            },
        }
        return schema


TOOLS: Final[dict[str, ToolSpec]] = {
    spec.name: spec
    for spec in (
        ToolSpec("list_files", "List the workspace's files (path, rev, size, sha256).",
                 ListFiles, list_files, read_only=True),
        ToolSpec("read_file", "Read a file's content (text, or base64 for binary) and its rev.",
                 ReadFile, read_file, read_only=True),
        ToolSpec("write_file", "Write a file (text or base64). Give baseRev (the rev you read; "
                 "0 for a new file) to refuse a concurrent change with `conflict`.",
                 WriteFile, write_file),
        ToolSpec("delete_file", "Delete a file (baseRev: see write_file).", DeleteFile,
                 delete_file),
        ToolSpec("move_file", "Move a file to a new path (baseRev: see write_file).", MoveFile,
                 move_file),
        ToolSpec("post_message", "Post a message to the workspace's conversation.",
                 PostMessage, post_message),
        ToolSpec("request_work", "Open a work item (needWork) on a topic; returns its "
                 "correlationId.", RequestWork, request_work),
        ToolSpec("claim_work", "Claim a work item (workClaimed).", WorkStep, claim_work),
        ToolSpec("publish_work", "Publish a work product for an item (workPublished).",
                 AddressedWorkStep, publish_work),
        ToolSpec("request_feedback", "Ask for feedback on an item (feedbackRequested).",
                 AddressedWorkStep, request_feedback),
        ToolSpec("provide_feedback", "Give feedback on an item (feedbackProvided).",
                 AddressedWorkStep, provide_feedback),
        ToolSpec("block_work", "Say an item cannot progress (blocked).", WorkStep, block_work),
        ToolSpec("complete_work", "Close an item as done (completed).", WorkStep,
                 complete_work),
        ToolSpec("cancel_work", "Cancel an item (workCancelled).", WorkStep, cancel_work),
        ToolSpec("list_open_work", "The work items not completed or cancelled.", ListOpenWork,
                 list_open_work, read_only=True),
        ToolSpec("wait_for_event", f"Wait (at most {MAX_WAIT_MS} ms) for the next event "
                 "matching kinds/correlationId after afterSeq; after scanning "
                 f"{MAX_SCAN_EVENTS} other events it answers more: true with nextAfterSeq "
                 "(call again from there).", WaitForEvent, wait_for_event,
                 read_only=True),
        ToolSpec("workspace_state", "The workspace state (files, work items, executions, "
                 "artifacts, members), now or at a seq.", WorkspaceStateArgs, workspace_state,
                 read_only=True),
        ToolSpec("timeline", "The workspace's events after a seq, oldest first (paged: "
                 "nextAfterSeq).", TimelineArgs, timeline, read_only=True),
        ToolSpec(TOOL_NAME, CODE_EXEC_DESCRIPTION + " Runs on the hub's backends named by "
                 "your token; pulled file changes become workspace events.", None, code_exec),
    )
}  # fmt: skip
"""Every tool, by name, in the order ``tools/list`` shows them."""


def _field(e: msgspec.ValidationError) -> str:
    text = str(e)
    at = text.rfind("`$.")
    return text[at + 3 : text.find("`", at + 1)] if at >= 0 else "arguments"


async def run_tool(
    link: AgentLink, name: str, arguments: Mapping[str, Any] | None
) -> dict[str, Any]:
    """Run tool ``name`` on ``arguments``. Raises :class:`AgoraError` (``notFound`` for an
    unknown tool, ``badRequest``/``tooLarge`` for bad arguments, whatever the hub refused)."""
    spec = TOOLS.get(name)
    if spec is None:
        raise NotFound(f"no tool {name!r}", tool=name)
    args = dict(arguments or {})
    limits = link.limits
    check_value_depth(args, limits.max_depth - 2, "arguments")  # the event wraps them twice
    size = len(msgspec.json.encode(args))
    if size > limits.max_event_bytes:
        raise TooLarge(
            f"the arguments are {size} bytes encoded; the limit is {limits.max_event_bytes}",
            field="arguments",
            limit=limits.max_event_bytes,
            size=size,
        )
    if spec.arguments is None:
        return await spec.run(link, args)
    try:
        parsed = msgspec.convert(args, spec.arguments, strict=True)
    except msgspec.ValidationError as e:
        raise BadRequest(f"invalid arguments for {name}: {e}", field=_field(e)) from e
    return await spec.run(link, parsed)


def error_json(error: AgoraError) -> dict[str, Any]:
    """The structured content of a tool error: ``{"error": {code, message, details}}``."""
    details = msgspec.to_builtins(error.details, str_keys=True, enc_hook=repr)
    return {"error": {"code": error.code, "message": error.message, "details": details}}
