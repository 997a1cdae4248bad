"""Executions through a session: ``ws.runtime`` (docs/execution.md, "Runtime").

:class:`WorkspaceRuntime` starts executions (``exec``) and opens handles on existing ones;
an :class:`ExecHandle` reads one execution's event stream (``getExec``), its result, or kills
it. The session routes every reply of an ``exec`` call or a ``getExec`` stream to its
:class:`RidStream` by rid (:class:`~hub.core.wire.client.ClientProtocol`).
"""

from __future__ import annotations

import asyncio
import base64
import logging
import uuid
from collections import deque
from collections.abc import AsyncIterator, Iterable, Mapping
from typing import TYPE_CHECKING, Any, cast

import msgspec

from hub.core.cursor import Step
from hub.core.errors import AgoraError, BadRequest, Internal, Unavailable
from hub.core.events import ArtifactRef, Event, ExecOutput
from hub.core.execution.policy import PolicyPatch
from hub.core.wire import frames
from hub.core.wire.client import ResumeCursor, encode_frame, event_of

if TYPE_CHECKING:
    from hub.client.session import Session
    from hub.client.workspace import Workspace

__all__ = ["ExecHandle", "ExecOutcome", "ExecUpdate", "RidStream", "WorkspaceRuntime"]

log = logging.getLogger(__name__)


class ExecUpdate(msgspec.Struct, frozen=True):
    """One event of an execution's stream: the journal ``event`` (``execRequested``,
    ``execStarted``, ``execOutput`` …, ``execCancelRequested``, ``execFinished``) and, for an
    ``execOutput`` of a ``utf8`` execution, its bytes as ``text``."""

    event: Event
    text: str | None = None


class ExecOutcome(msgspec.Struct, frozen=True, kw_only=True):
    """The outcome of an execution. ``stdout``/``stderr`` are ``str`` for ``encoding="utf8"``
    (invalid bytes as U+FFFD), else ``bytes``. ``has_value``: the program returned ``value``."""

    status: str
    reason: str
    exit_code: int
    stdout: str | bytes
    stderr: str | bytes
    value: Any = None
    has_value: bool = False
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    duration_ms: int = 0
    pushed: int = 0
    pulled: int = 0
    skipped: list[dict[str, Any]] = []
    diagnostics: list[Any] = []
    artifacts: list[ArtifactRef] = []
    """The artifacts the run published (``exec(artifacts=[globs])``)."""


def _exec_result(result: frames.RuntimeResult) -> ExecOutcome:
    def out(text: str) -> str | bytes:
        return text if result.encoding == "utf8" else base64.b64decode(text)

    has_value = result.value is not msgspec.UNSET
    return ExecOutcome(
        status=result.status,
        reason=result.reason,
        exit_code=result.exit_code,
        stdout=out(result.stdout),
        stderr=out(result.stderr),
        value=result.value if has_value else None,
        has_value=has_value,
        stdout_truncated=result.stdout_truncated,
        stderr_truncated=result.stderr_truncated,
        duration_ms=result.duration_ms,
        pushed=result.pushed,
        pulled=result.pulled,
        skipped=[msgspec.to_builtins(s) for s in result.skipped],
        diagnostics=[] if result.diagnostics is msgspec.UNSET else list(result.diagnostics),
        artifacts=list(result.artifacts),
    )


class RidStream:
    """A request the session routes every reply of (by rid) instead of resolving a pending
    future: an ``exec`` call (never resent) or a ``getExec`` stream (resent, resuming, after a
    reconnect)."""

    def on_reply(self, frame: frames.ServerFrame) -> None:
        raise NotImplementedError

    def on_refused(self, error: AgoraError) -> None:
        """An ``error`` frame answered the request (the protocol has forgotten its rid)."""
        raise NotImplementedError

    def on_garbled(self, error: Internal) -> None:
        """A reply of a shape this client cannot read (a newer hub): ignored by default."""
        log.debug("unreadable reply dropped: %s", error)

    def on_attach(self) -> bytes | None:
        """A new connection: the frame to send again, or None."""
        raise NotImplementedError

    def fail(self, error: AgoraError) -> None:
        raise NotImplementedError


class _ExecCall(RidStream):
    """One ``exec``: sent once, never again after a reconnect (the hub may have started it)."""

    def __init__(self, session: Session, rid: int, exec_id: str, data: bytes) -> None:
        self.session = session
        self.rid = rid
        self.exec_id = exec_id
        self.data = data
        self.sent = False
        self.future: asyncio.Future[frames.ServerFrame] = asyncio.get_running_loop().create_future()

    def _done(self) -> None:
        self.session._forget(self.rid)

    def on_reply(self, frame: frames.ServerFrame) -> None:
        self._done()
        if not self.future.done():
            self.future.set_result(frame)

    def on_refused(self, error: AgoraError) -> None:
        self.fail(error)

    def on_garbled(self, error: Internal) -> None:
        self.fail(error)  # the one reply it will get: waiting longer would hang

    def send(self) -> None:
        if self.session._connected():
            self.session._send(self.data)
            self.sent = True

    def on_attach(self) -> bytes | None:
        if not self.sent:  # not sent yet: goes out on this connection
            self.sent = True
            return self.data
        self.fail(
            Unavailable(
                f"the connection dropped before the hub answered exec {self.exec_id!r}; it may "
                "have started: ws.runtime.get_exec(id) tells",
                execId=self.exec_id,
            )
        )
        return None

    def fail(self, error: AgoraError) -> None:
        self._done()
        if not self.future.done():
            self.future.set_exception(error)


class _ExecFollow(RidStream):
    """One ``getExec`` stream. After a reconnect it asks again from the last output it got;
    its cursor drops what it already delivered (an execution's events are scattered over the
    workspace's seqs: any later seq is the next one)."""

    def __init__(self, session: Session, rid: int, workspace: str, exec_id: str, resume: Any):
        self.session = session
        self.rid = rid
        self.workspace = workspace
        self.exec_id = exec_id
        self.resume = resume
        self.cursor = ResumeCursor(started=True, contiguous=False)
        self.last_n: int | None = None
        self.items: deque[ExecUpdate | AgoraError | None] = deque()
        self.wake = asyncio.Event()

    def frame(self) -> bytes:
        resume = self.resume
        if self.cursor.position:
            resume = self.last_n if self.last_n is not None else "full"
        getexec = frames.GetExec(workspace=self.workspace, exec_id=self.exec_id, resume=resume)
        return encode_frame(getexec, self.rid)

    def _push(self, item: ExecUpdate | AgoraError | None) -> None:
        self.items.append(item)
        self.wake.set()

    def close(self) -> None:
        self.session._forget(self.rid)

    def on_reply(self, frame: frames.ServerFrame) -> None:
        if isinstance(frame, frames.ExecEvent):
            ev = event_of(frame.event)
            if ev is None or self.cursor.observe(ev.seq) is not Step.NEXT:
                return
            if isinstance(ev, ExecOutput):
                self.last_n = ev.payload.n
            self._push(ExecUpdate(ev, frame.text))
        elif isinstance(frame, frames.ExecEnd):
            self.close()
            self._push(None)

    def on_refused(self, error: AgoraError) -> None:
        self.close()
        self._push(error)

    def on_attach(self) -> bytes | None:
        return self.frame()

    def fail(self, error: AgoraError) -> None:
        self._push(error)

    async def updates(self) -> AsyncIterator[ExecUpdate]:
        try:
            while True:
                while not self.items:
                    self.wake.clear()
                    await self.wake.wait()
                item = self.items.popleft()
                if item is None:
                    return
                if isinstance(item, AgoraError):
                    raise item
                yield item
        finally:
            self.close()


class ExecHandle:
    """One execution: ``id``, its event stream (``async for update in handle``), ``result()``
    and ``kill()``.

    Single consumer (seed 003): read the stream *or* wait for ``result()``; the stream can be
    read once, not after ``result()``, and ``result()`` is refused while the stream is being
    read (after it ended, ``result()`` is fine). ``result()`` is memoised.
    """

    def __init__(self, runtime: WorkspaceRuntime, exec_id: str, resume: Any = "full") -> None:
        self.runtime = runtime
        self.id = exec_id
        self._resume = resume
        self._consumer: str | None = None
        self._streaming = False
        self._result: asyncio.Future[ExecOutcome] | None = None

    def __repr__(self) -> str:
        return f"ExecHandle({self.id!r}, workspace={self.runtime.workspace.name!r})"

    def __aiter__(self) -> AsyncIterator[ExecUpdate]:
        return self.events()

    async def events(self) -> AsyncIterator[ExecUpdate]:
        """The execution's events (per the handle's ``resume``: from ``execRequested`` for a
        new execution), live until ``execFinished``. Raises ``BadRequest`` (a second
        consumer), ``NotFound``, ``Busy`` (too many readers), or what ended the session."""
        if self._consumer is not None:
            raise BadRequest(
                f"execution {self.id!r} is already consumed by {self._consumer} (single consumer)"
            )
        self._consumer = "the event stream"
        session = self.runtime.workspace.session
        session._check_usable()
        rid = session._rid()
        follow = _ExecFollow(session, rid, self.runtime.workspace.name, self.id, self._resume)
        session._expect(rid, follow, once=False)
        session._send(follow.frame())
        self._streaming = True
        try:
            async for update in follow.updates():
                yield update
        finally:
            self._streaming = False

    async def result(self) -> ExecOutcome:
        """Wait for the execution to finish; its result (memoised). Raises ``BadRequest``
        while the stream is being read, ``NotFound``, or what ended the session."""
        if self._streaming:
            raise BadRequest(f"execution {self.id!r} is being read as a stream (single consumer)")
        if self._consumer is None:
            self._consumer = "result()"
        if self._result is None:
            self._result = asyncio.ensure_future(self._fetch())
        return await asyncio.shield(self._result)

    async def _fetch(self) -> ExecOutcome:
        ws = self.runtime.workspace
        reply = await ws.session.request(frames.ExecResultQuery(workspace=ws.name, exec_id=self.id))
        if not isinstance(reply, frames.ExecResult):
            raise Internal(f"unexpected reply to execResult: {type(reply).__name__}")
        return _exec_result(reply.result)

    async def kill(self) -> str:
        """Stop the execution; returns once it is recorded as finished, with its final status
        (a finished execution is left as it is). Raises ``NotFound``, ``Forbidden``."""
        ws = self.runtime.workspace
        reply = await ws.session.request(frames.Kill(workspace=ws.name, exec_id=self.id))
        if not isinstance(reply, frames.Killed):
            raise Internal(f"unexpected reply to kill: {type(reply).__name__}")
        return reply.status


class WorkspaceRuntime:
    """``ws.runtime``: run code in the workspace on the hub's backend instances."""

    def __init__(self, workspace: Workspace) -> None:
        self.workspace = workspace

    async def exec(
        self,
        source: str | None = None,
        *,
        backend: str | None = None,
        id: str | None = None,
        module: bytes | str | None = None,
        language: str | None = None,
        argv: Iterable[str] = (),
        stdin: bytes | str | None = None,
        input: Any = msgspec.UNSET,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        timeout_ms: int | None = None,
        encoding: str = "utf8",
        policy: PolicyPatch | Mapping[str, Any] | None = None,
        artifacts: Iterable[str] = (),
    ) -> ExecHandle:
        """Start an execution; returns its handle once the hub accepted it (``execRequested``
        is in the log). ``backend``: an instance id (default: the hub's first). ``id``: the
        execution id (default: a UUID). ``module``: WASM bytes, or the sha256 of a blob.
        ``input``: a JSON value for callable backends. ``encoding``: ``"utf8"`` (text) or
        ``"base64"`` (bytes) for the output. ``policy``: narrows the instance's policy.
        ``artifacts``: globs of output files to publish as artifacts after the run (the
        result's ``artifacts``; fetch one with ``ws.get_blob(ref.sha256)``).

        Raises ``Forbidden`` (no ``exec`` right, backend not in the token, a wider policy),
        ``NotFound`` (unknown backend), ``BadRequest`` (invalid, ``input`` on a non-callable
        backend), ``Busy`` (id running, the hub's cap), ``Exists`` (id retained: dispose it),
        ``Unavailable`` (backend unavailable; or the connection dropped before the answer).
        Not sent again after a reconnect (use ``get_exec(id)`` to find out).
        """
        session = self.workspace.session
        session._check_usable()
        exec_id = id if id is not None else str(uuid.uuid4())
        if isinstance(stdin, str):
            stdin = stdin.encode()
        mod: bytes | frames.ExecModuleBlob | None
        mod = frames.ExecModuleBlob(blob=module) if isinstance(module, str) else module
        patch = policy
        if patch is not None and not isinstance(patch, PolicyPatch):
            try:
                patch = msgspec.convert(dict(patch), PolicyPatch)
            except msgspec.ValidationError as e:
                raise BadRequest(f"invalid policy: {e}", field="policy") from e
        if encoding not in ("utf8", "base64"):
            raise BadRequest("encoding is 'utf8' or 'base64'", field="encoding")
        rid = session._rid()
        frame = frames.Exec(
            rid=rid,
            workspace=self.workspace.name,
            backend=backend,
            source=source,
            module=mod,
            exec_id=exec_id,
            language=language,
            argv=list(argv),
            stdin=stdin,
            input=input,
            env=dict(env or {}),
            cwd=cwd,
            timeout_ms=timeout_ms,
            encoding=cast(Any, encoding),
            policy=patch,
            artifacts=list(artifacts),
        )
        call = _ExecCall(session, rid, exec_id, encode_frame(frame))
        session._expect(rid, call, once=True)
        call.send()
        reply = await call.future
        if not isinstance(reply, frames.ExecAccepted):
            raise Internal(f"unexpected reply to exec: {type(reply).__name__}")
        return ExecHandle(self, reply.exec_id)

    def get_exec(self, id: str, *, resume: str | int = "full") -> ExecHandle:
        """A handle on an existing execution. Its stream starts per ``resume``: ``"full"``
        (from the first event, then live), ``"tail"`` (only new events) or ``n`` (after output
        ``n``). ``NotFound`` is raised when it is read."""
        return ExecHandle(self, id, resume)

    async def dispose_exec(self, id: str) -> None:
        """Free a finished execution's id and journal. Raises ``NotFound``, ``Busy`` (it is
        running), ``Forbidden``."""
        ws = self.workspace
        reply = await ws.session.request(frames.Dispose(workspace=ws.name, exec_id=id))
        if not isinstance(reply, frames.Disposed):
            raise Internal(f"unexpected reply to dispose: {type(reply).__name__}")
