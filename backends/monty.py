"""The ``python`` backend: structured Python in the pydantic-monty sandbox (``inProcess``).

`Monty <https://github.com/pydantic/monty>`_ is a Python interpreter written in Rust that runs
a subset of Python with no access to the host: no ``open`` of host files, no ``os.environ``, no
sockets, no imports beyond its own standard modules. pydantic-monty ≥ 1.4 runs the interpreter
in pooled ``monty`` worker subprocesses (so an interpreter crash never takes the hub down); the
isolation boundary is the interpreter itself, hence ``inProcess`` (like a JavaScript isolate),
with every control below enforced.

What it runs (``language: python``):

* ``source`` is a Python snippet. ``input`` (JSON) is bound as the global ``input``; when the
  snippet ends with an expression, its value is the result's ``value`` (converted to JSON; a
  value JSON cannot hold becomes its ``repr`` with a warning). ``print`` goes to stdout (or
  stderr with ``file=sys.stderr``), streamed as chunks and capped per the policy. An uncaught
  exception is ``failed/exit`` with exit code 1, the traceback on stderr and a diagnostic with
  its line and column. A syntax error is ``failed/compileFailed``, likewise.
* Workspace host functions, served through the :class:`~backends.access.WorkspaceAccess` the
  runtime passes to :meth:`PythonBackend.execute` (``access=``), so each write becomes a
  ``fileWritten`` event caused by the execution:

  - ``read_file(path) -> str`` (UTF-8; invalid bytes become U+FFFD),
  - ``write_file(path, content: str | bytes) -> int`` (bytes written),
  - ``list_files(prefix=".") -> list[str]``,
  - ``delete_file(path) -> None``.

  Every path is checked against the request's filesystem policy (``none``: no workspace;
  ``workspaceReadOnly``/``workspaceReadWrite`` under their root; ``paths`` per path) and the
  instance's ``access``: on a ``read`` instance ``write_file``/``delete_file`` raise
  ``PermissionError`` in the sandbox and the access object is never called. Without an access
  object, a ``workdir`` is served by :class:`~backends.access.DirectoryAccess`; with neither,
  the functions raise ``PermissionError``. At most ``max_host_calls`` calls per execution, each
  bounded by ``host_call_timeout_s``.

Limits, all enforced:

* *Timeout:* Monty's ``max_feed_duration_secs`` (preemptive, inside the interpreter: a
  ``while True`` stops) plus a wall-clock deadline covering time spent in host calls; at that
  deadline, or on ``cancel``, the worker process is killed (``SIGKILL``) and the pool replaces
  it. A host call already accepted finishes first (seed 003's kill semantics).
* *Memory:* Monty's ``max_memory`` (heap bytes) = the policy's ``memoryBytes`` or the
  instance's ``max_memory_bytes`` → ``failed/memoryLimit``.
* *Output:* capped per stream (bytes past the cap are dropped and counted).
* *Network, filesystem, environment:* none exist inside the sandbox; the host functions above
  are the only way out.

Sessions (REPL mode): ``execute(..., session="id")`` runs the snippet in a persistent Monty
session — globals, functions and imports survive between calls with the same id. A session
holds one worker; at most ``max_sessions`` are open, idle ones are closed after
``session_idle_s``, :meth:`PythonBackend.close_session` closes one, and a run that times out,
is cancelled or crashes the worker discards its session. Limits are fixed when a session is
opened (its first request's policy); the wall-clock deadline applies per call.

The library is driven so that none of its futures is ever cancelled (cancelling one mid-turn
can abort the interpreter at exit — seen with pydantic-monty 1.4): stops kill the worker and
then wait for the turn to fail.
"""

from __future__ import annotations

import ast
import asyncio
import contextlib
import gc
import os
import signal
import time
from collections.abc import AsyncGenerator, Awaitable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import msgspec
import pydantic_monty as monty

from backends.access import Access, DirectoryAccess, WorkspaceAccess, workspace_filesystem
from backends.captured import captured_result
from backends.hostcalls import MAX_WRITE_BYTES, refuse_process_inputs
from backends.hostcalls import has_readable_below as _has_readable_below
from backends.hostcalls import readable as _readable
from backends.hostcalls import writable as _writable
from backends.lifecycle import BackendLifecycle, elapsed_ms
from backends.runs import Run, RunRegistry, TaskSet, timeout_note, wait_quietly
from backends.sink import ThreadedOutput
from hub.core.errors import Busy
from hub.core.execution.capabilities import (
    BackendCapabilities,
    ExecutionIsolation,
    ExecutionLanguage,
)
from hub.core.execution.errors import ExecutionFailed, InvalidRequest
from hub.core.execution.policy import (
    SandboxPolicy,
    normalise_workspace_path,
    strict_python,
)
from hub.core.execution.request import ExecutionRequest
from hub.core.execution.result import (
    Diagnostic,
    ExecutionEvent,
    ExecutionReason,
    ExecutionResult,
    ExecutionStatus,
    classify,
)

__all__ = [
    "DEFAULT_MAX_MEMORY_BYTES",
    "HOST_FUNCTIONS",
    "PythonBackend",
]

MIB: Final = 1024 * 1024
DEFAULT_MAX_MEMORY_BYTES: Final = 256 * MIB
HOST_FUNCTIONS: Final = ("read_file", "write_file", "list_files", "delete_file")
_WRITING: Final = frozenset({"write_file", "delete_file"})


class _HostError(Exception):
    """A host function refused or failed: ``exc`` is raised inside the sandbox."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(str(exc))
        self.exc = exc


class _Stopped(Exception):
    """The run was stopped while the driver was between turns."""


@dataclass
class _Session:
    """A Monty session checked out of the pool (one worker), for one run or a REPL session."""

    handle: Any
    pid: int | None
    key: str | None = None
    busy: bool = False
    last_used: float = field(default_factory=time.monotonic)


@dataclass
class _Control:
    """Shared by the driver and the stopper: the worker to kill and whether a turn runs."""

    session: _Session | None = None
    in_turn: bool = False
    killed: bool = False

    def kill(self) -> None:
        """Kill the worker if a turn is in flight (the turn then fails with a crash)."""
        self.killed = True
        if self.in_turn and self.session is not None and self.session.pid:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.session.pid, signal.SIGKILL)


@dataclass
class _Outcome:
    value: Any = msgspec.UNSET
    error: BaseException | None = None
    host_calls: int = 0
    notes: list[Diagnostic] = field(default_factory=list)


class PythonBackend(BackendLifecycle):
    """Runs Python snippets in pydantic-monty (see the module docstring).

    ``access``: the instance's authority over the workspace (``read`` refuses
    ``write_file``/``delete_file``). ``policy``: the instance's default (widest) policy;
    default: :func:`strict_python` (10 s) with the workspace per ``access`` and a
    ``max_memory_bytes`` heap cap.
    """

    def __init__(
        self,
        name: str = "python",
        *,
        access: Access = "read-write",
        policy: SandboxPolicy | None = None,
        max_concurrent: int = 8,
        max_sessions: int = 16,
        session_idle_s: float = 600.0,
        max_memory_bytes: int = DEFAULT_MAX_MEMORY_BYTES,
        max_host_calls: int = 1000,
        host_call_timeout_s: float = 30.0,
        warm_workers: int = 1,
    ) -> None:
        fs = workspace_filesystem(access)
        self._name = name
        self._access = access
        self._policy = (
            policy
            if policy is not None
            else strict_python().replace(filesystem=fs, memory_bytes=max_memory_bytes)
        )
        self._max_memory_bytes = max_memory_bytes
        self._max_host_calls = max_host_calls
        self._host_call_timeout_s = host_call_timeout_s
        self._max_sessions = max_sessions
        self._session_idle_s = session_idle_s
        self._warm_workers = warm_workers
        self._max_concurrent = max_concurrent
        self._registry = RunRegistry(name, max_concurrent)
        self._pool: Any = None
        self._pool_error = ""
        self._sessions: dict[str, _Session] = {}
        self._drivers: set[asyncio.Task[_Outcome]] = set()
        self._caps = BackendCapabilities(
            isolation=ExecutionIsolation.IN_PROCESS,
            enforces_network=True,
            enforces_filesystem=True,
            enforces_environment=True,
            enforces_timeout=True,
            enforces_memory=True,
            supports_structured_output=True,
            supports_interactive_sessions=True,
            languages=frozenset({ExecutionLanguage.PYTHON}),
            filesystem_modes=frozenset(
                {"none", "workspaceReadOnly", "workspaceReadWrite", "paths"}
            ),
            workspace="hostFunctions",
            host_functions=frozenset(HOST_FUNCTIONS),
            pooled=warm_workers > 0,
        )

    # -- CodeExecutor (the rest: BackendLifecycle) ----------------------------------------

    @property
    def access(self) -> Access:
        return self._access

    def _readiness(self) -> tuple[bool, str]:
        if self._pool_error:
            return False, self._pool_error
        return True, ""

    async def _start(self) -> None:
        """Start the worker pool (``warm_workers`` spawned at once)."""
        if self._pool is not None or self._registry.closed or self._pool_error:
            return
        pool = monty.AsyncMonty(
            min_processes=self._warm_workers,
            max_processes=self._max_concurrent + self._max_sessions,
            checkout_timeout=10.0,
        )
        try:
            await pool.__aenter__()
        except (OSError, monty.MontyError) as e:
            self._pool_error = f"the monty worker pool cannot start: {e}"
            return
        self._pool = pool

    async def aclose(self) -> None:
        """Stop every run, close every session and the pool. Idempotent."""
        await self._registry.aclose()
        while self._drivers:
            await asyncio.gather(*list(self._drivers), return_exceptions=True)
        for key in list(self._sessions):
            await self.close_session(key)
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.__aexit__(None, None, None)
            # pydantic-monty 1.4 finishes tearing the pool down only when the pool object is
            # collected; left to interpreter shutdown, that teardown can abort the process.
            del pool
            gc.collect()

    async def close_session(self, session: str) -> bool:
        """Close a REPL session (its worker goes back to the pool). False if none is open or it
        is running."""
        entry = self._sessions.get(session)
        if entry is None or entry.busy:
            return False
        del self._sessions[session]
        await _exit_session(entry)
        return True

    @property
    def sessions(self) -> list[str]:
        """The ids of the open REPL sessions."""
        return sorted(self._sessions)

    async def _validate(self, request: ExecutionRequest) -> None:
        refuse_process_inputs(request, "python")

    async def execute(
        self,
        request: ExecutionRequest,
        workdir: Path | None,
        access: WorkspaceAccess | None = None,
        *,
        session: str | None = None,
    ) -> AsyncGenerator[ExecutionEvent, None]:
        """Run ``request``'s snippet (contract: :mod:`backends.base`).

        ``access``: the workspace for the host functions (default: ``workdir`` through
        :class:`DirectoryAccess`, else none). ``session``: a REPL session id (state kept
        between calls). Raises, before running anything: what :func:`validate_request`
        raises; :class:`InvalidRequest` for ``stdin``/``argv``/``env`` (a snippet has none) or a
        bad session id; ``Busy`` (id running, backend full, session running or too many
        sessions); :class:`BackendUnavailable`.
        """
        await self._check_request(request)
        refuse_process_inputs(request, "python")
        if session is not None:
            _check_session_id(session)
            await self._sweep_sessions()
            entry = self._sessions.get(session)
            if entry is not None and entry.busy:
                raise Busy(f"session {session!r} is running", session=session)
            if entry is None and len(self._sessions) >= self._max_sessions:
                raise Busy(
                    f"backend {self._name!r} has its maximum of {self._max_sessions} sessions",
                    limit=self._max_sessions,
                )
        if access is None and workdir is not None:
            access = DirectoryAccess(workdir)
        run = self._registry.admit(request.exec_id)
        started = time.monotonic()
        ctl = _Control()
        sink = ThreadedOutput(request.effective_max_stdout, request.effective_max_stderr)
        tasks = TaskSet()
        # The driver owns every call into the library and is never cancelled (see the module
        # docstring); the registry owns it so aclose() waits for it.
        driver = asyncio.create_task(self._drive(request, run, ctl, sink, access, session))
        self._drivers.add(driver)
        driver.add_done_callback(self._drivers.discard)
        try:
            tasks.create_task(self._stopper(run, ctl, request))
            while (chunk := await sink.get()) is not None:
                yield chunk
            outcome = await asyncio.shield(driver)
        finally:
            stopping: Awaitable[None] | None = None
            if not driver.done():
                run.request_stop("cancelled")
                ctl.kill()
                stopping = wait_quietly(driver)
            try:
                await self._registry.close_run(run, stopping)
            finally:
                await tasks.aclose()
        if outcome.error is not None and not isinstance(outcome.error, monty.MontyError):
            raise ExecutionFailed(
                f"the python sandbox failed: {outcome.error!r}"
            ) from outcome.error
        yield self._result(request, run, ctl, outcome, sink, started)

    # -- internals ---------------------------------------------------------------------------

    async def _stopper(self, run: Run, ctl: _Control, request: ExecutionRequest) -> None:
        if await run.wait_stop(request.effective_timeout_ms / 1000) is not None:
            ctl.kill()

    def _limits(self, request: ExecutionRequest) -> dict[str, Any]:
        memory = min(request.policy.memory_bytes or self._max_memory_bytes, self._max_memory_bytes)
        return {
            "max_feed_duration_secs": request.effective_timeout_ms / 1000,
            "max_memory": memory,
            "max_suspensions": self._max_host_calls + 100,
        }

    async def _drive(
        self,
        request: ExecutionRequest,
        run: Run,
        ctl: _Control,
        sink: ThreadedOutput,
        access: WorkspaceAccess | None,
        key: str | None,
    ) -> _Outcome:
        """Check out a session, run the snippet, serve its host calls. Never raises."""
        outcome = _Outcome()
        entry: _Session | None = None
        try:
            entry = self._sessions.get(key) if key is not None else None
            if entry is None:
                handle = self._pool.checkout(
                    script_name="main.py", limits=self._limits(request), print_flush_interval=0.0
                )
                await handle.__aenter__()
                entry = _Session(handle=handle, pid=handle.worker_pid, key=key)
                if key is not None:
                    self._sessions[key] = entry
            entry.busy = True
            entry.pid = entry.handle.worker_pid or entry.pid
            ctl.session = entry
            if run.stop_reason is not None:
                raise _Stopped()
            outcome.value = await self._feed(request, run, ctl, entry, sink, access, outcome)
        except _Stopped:
            pass
        except Exception as e:
            outcome.error = e
            if isinstance(
                e, monty.MontySyntaxError | monty.MontyRuntimeError
            ) and not _is_limit_error(e):
                sink.feed("stderr", e.display("traceback").encode("utf-8", "replace") + b"\n")
        finally:
            sink.close()
            ctl.in_turn = False
            if entry is not None:
                entry.busy = False
                entry.last_used = time.monotonic()
                if key is None or not _session_survives(outcome, ctl):
                    if key is not None and self._sessions.get(key) is entry:
                        del self._sessions[key]
                    await _exit_session(entry)
        return outcome

    async def _feed(
        self,
        request: ExecutionRequest,
        run: Run,
        ctl: _Control,
        entry: _Session,
        sink: ThreadedOutput,
        access: WorkspaceAccess | None,
        outcome: _Outcome,
    ) -> Any:
        """Run the snippet to completion, answering host calls; returns the last value."""
        source = request.source or ""

        def on_print(stream: str, text: str) -> None:
            sink.feed("stderr" if stream == "stderr" else "stdout", text.encode("utf-8", "replace"))

        inputs = {"input": request.input} if request.has_input else None
        lookups = {name: _host_stub for name in HOST_FUNCTIONS}
        ctl.in_turn = True
        snapshot = await entry.handle.feed_start(
            source, inputs=inputs, print_callback=on_print, external_lookup=lookups
        )
        ctl.in_turn = False
        while not isinstance(snapshot, monty.MontyComplete):
            if run.stop_reason is not None:
                raise _Stopped()
            answer: Any = None
            host = (
                isinstance(snapshot, monty.AsyncFunctionSnapshot)
                and not snapshot.is_os_function
                and snapshot.function_name in HOST_FUNCTIONS
            )
            if host:
                outcome.host_calls += 1
                try:
                    value = await self._host_call(
                        request,
                        access,
                        snapshot.function_name,
                        snapshot.args,
                        snapshot.kwargs,
                        outcome.host_calls,
                    )
                    answer = {"return_value": value}
                except _HostError as e:
                    answer = {"exception": e.exc}
                if run.stop_reason is not None:
                    raise _Stopped()  # accepted call finished; no further turn
            ctl.in_turn = True
            snapshot = await (snapshot.resume(answer) if host else snapshot.resume_auto())
            ctl.in_turn = False
        if not _ends_with_expression(source):
            return msgspec.UNSET
        return snapshot.output

    async def _host_call(
        self,
        request: ExecutionRequest,
        access: WorkspaceAccess | None,
        function: str,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        count: int,
    ) -> Any:
        """Serve one workspace host function. Raises :class:`_HostError` with the exception
        the sandbox should see."""
        if count > self._max_host_calls:
            raise _HostError(
                RuntimeError(f"more than {self._max_host_calls} host calls in one execution")
            )
        try:
            params = _bind(function, args, kwargs)
        except TypeError as e:
            raise _HostError(e) from e
        fs = request.policy.filesystem
        if function in _WRITING and self._access != "read-write":
            raise _HostError(
                PermissionError(
                    f"{function}: backend instance {self._name!r} has read-only access to the "
                    "workspace"
                )
            )
        if access is None or fs.mode == "none":
            raise _HostError(
                PermissionError(f"{function}: no workspace is available to this execution")
            )
        try:
            path = normalise_workspace_path(params["path"], "path")
        except InvalidRequest as e:
            raise _HostError(ValueError(f"{function}: {e.message}")) from e
        writing = function in _WRITING
        if function == "list_files":
            if not _readable(fs, path) and not _has_readable_below(fs, path):
                raise _HostError(
                    PermissionError(f"{function}: {path!r} is outside the workspace policy")
                )
        elif not (_writable(fs, path) if writing else _readable(fs, path)):
            verb = "writable" if writing else "readable"
            raise _HostError(
                PermissionError(f"{function}: {path!r} is not {verb} under the filesystem policy")
            )
        try:
            async with asyncio.timeout(self._host_call_timeout_s):
                if function == "read_file":
                    return (await access.read(path)).decode("utf-8", "replace")
                if function == "write_file":
                    content = params["content"]
                    data = content.encode("utf-8") if isinstance(content, str) else content
                    if not isinstance(data, bytes | bytearray):
                        raise TypeError("write_file: content must be str or bytes")
                    if len(data) > MAX_WRITE_BYTES:
                        raise ValueError(
                            f"write_file: content is larger than {MAX_WRITE_BYTES} bytes"
                        )
                    await access.write(path, bytes(data))
                    return len(data)
                if function == "list_files":
                    return [p for p in await access.list(path) if _readable(fs, p)]
                await access.delete(path)
                return None
        except TimeoutError as e:
            raise _HostError(
                TimeoutError(f"{function}: the workspace did not answer in time")
            ) from e
        except (OSError, ValueError, TypeError) as e:
            raise _HostError(e) from e

    def _result(
        self,
        request: ExecutionRequest,
        run: Run,
        ctl: _Control,
        outcome: _Outcome,
        sink: ThreadedOutput,
        started: float,
    ) -> ExecutionResult:
        notes = list(outcome.notes)
        value: Any = msgspec.UNSET
        status: ExecutionStatus
        reason: ExecutionReason
        error = outcome.error
        if run.stop_reason is not None and (error is None or isinstance(error, monty.MontyError)):
            status, reason, exit_code = classify(
                None, cancelled=run.cancelled, timed_out=run.timed_out
            )
        elif error is None:
            status, reason, exit_code = "completed", "exit", 0
            if outcome.value is not msgspec.UNSET:
                value = _jsonable(outcome.value, notes)
        elif isinstance(error, monty.MontySyntaxError):
            status, reason, exit_code = "failed", "compileFailed", 1
            notes.append(_syntax_diagnostic(error))
        elif isinstance(error, monty.MontyRuntimeError):
            inner = error.exception()
            message = str(inner)
            if isinstance(inner, TimeoutError) and "time limit exceeded" in message:
                status, reason, exit_code = classify(None, timed_out=True)
            elif isinstance(inner, MemoryError) and "limit exceeded" in message:
                status, reason, exit_code = "failed", "memoryLimit", 1
                notes.append(Diagnostic(level="error", code="memoryLimit", message=message))
            else:
                status, reason, exit_code = "failed", "exit", 1
                notes.append(
                    Diagnostic(
                        level="error",
                        code="exception",
                        message=error.display("type-msg"),
                        data=_frame_data(error),
                    )
                )
        else:
            status, reason, exit_code = "failed", "error", -1
            notes.append(
                Diagnostic(level="error", code="sandbox", message=f"the sandbox failed: {error}")
            )
        how = "the snippet was stopped"
        if reason == "timeout" and not run.timed_out:  # Monty's own time limit
            notes.append(timeout_note(request.effective_timeout_ms, how))
        notes += run.stop_notes(request.effective_timeout_ms, how)
        return captured_result(
            sink,
            (status, reason, exit_code),
            duration_ms=elapsed_ms(started),
            metadata=self._metadata(request),
            notes=notes,
            value=value,
        )

    async def _sweep_sessions(self) -> None:
        now = time.monotonic()
        for key, entry in list(self._sessions.items()):
            if not entry.busy and now - entry.last_used > self._session_idle_s:
                await self.close_session(key)


# ---------------------------------------------------------------------------------------------
# Helpers


def _session_survives(outcome: _Outcome, ctl: _Control) -> bool:
    """Whether a REPL session is still usable after a run: not after a kill or a crash, and
    not after a time or memory limit (Monty gives no guarantee about the heap then)."""
    error = outcome.error
    if ctl.killed:
        return False
    if error is None or isinstance(error, monty.MontySyntaxError):
        return True
    if isinstance(error, monty.MontyRuntimeError):
        inner = error.exception()
        return not isinstance(inner, TimeoutError | MemoryError)
    return False


def _host_stub(*_args: Any, **_kwargs: Any) -> Any:
    # Never called: host calls surface as snapshots the driver answers itself. It only makes
    # the name resolve to a host function inside the sandbox.
    raise RuntimeError("host function called outside the driver")


_SIGNATURES: Final[dict[str, tuple[tuple[str, Any], ...]]] = {
    "read_file": (("path", ...),),
    "write_file": (("path", ...), ("content", ...)),
    "list_files": (("path", "."),),
    "delete_file": (("path", ...),),
}
_ALIASES: Final = {"prefix": "path"}


def _bind(function: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """Bind a host call's arguments like a Python signature would. Raises ``TypeError``."""
    signature = _SIGNATURES[function]
    if len(args) > len(signature):
        raise TypeError(f"{function}() takes {len(signature)} arguments ({len(args)} given)")
    bound = {name: arg for (name, _), arg in zip(signature, args, strict=False)}
    for name, arg in kwargs.items():
        name = _ALIASES.get(name, name) if function == "list_files" else name
        if name not in dict(signature) or name in bound:
            raise TypeError(f"{function}() got an unexpected or repeated argument {name!r}")
        bound[name] = arg
    for name, default in signature:
        if name not in bound:
            if default is ...:
                raise TypeError(f"{function}() missing required argument {name!r}")
            bound[name] = default
    if not isinstance(bound["path"], str):
        raise TypeError(f"{function}(): path must be a str")
    return bound


def _ends_with_expression(source: str) -> bool:
    """Whether the snippet's last statement is an expression (then its value is the result's
    ``value``). Monty accepts a subset of Python; if CPython cannot parse it, assume yes."""
    try:
        body = ast.parse(source).body
    except SyntaxError:
        return True
    return bool(body) and isinstance(body[-1], ast.Expr)


def _jsonable(value: Any, notes: list[Diagnostic]) -> Any:
    """``value`` as plain JSON data; its ``repr`` (with a warning) when JSON cannot hold it."""
    try:
        return msgspec.json.decode(msgspec.json.encode(value))
    except (TypeError, ValueError, OverflowError):
        notes.append(
            Diagnostic(
                level="warning",
                code="valueNotJson",
                message=f"the value ({type(value).__name__}) is not JSON; its repr is returned",
            )
        )
        return repr(value)


def _is_limit_error(error: Any) -> bool:
    """Whether a Monty error is its time or memory limit (not an exception of the code)."""
    if not isinstance(error, monty.MontyRuntimeError):
        return False
    inner = error.exception()
    message = str(inner)
    return (isinstance(inner, TimeoutError) and "time limit exceeded" in message) or (
        isinstance(inner, MemoryError) and "limit exceeded" in message
    )


def _frame_data(error: Any) -> dict[str, Any] | None:
    """Where an error happened (the innermost traceback frame): line, column, source text."""
    with contextlib.suppress(Exception):
        frames = error.traceback()
        if frames:
            frame = frames[-1]
            return {
                "line": frame.line,
                "column": frame.column,
                "endLine": frame.end_line,
                "endColumn": frame.end_column,
                "text": frame.source_line,
            }
    return None


def _syntax_diagnostic(error: Any) -> Diagnostic:
    return Diagnostic(
        level="error",
        code="syntaxError",
        message=error.display("msg"),
        data=_frame_data(error),
    )


def _check_session_id(session: str) -> None:
    if (
        not isinstance(session, str)
        or not session
        or len(session.encode("utf-8", "surrogatepass")) > 256
        or any(ord(c) < 0x20 for c in session)
    ):
        raise InvalidRequest(
            "session must be 1-256 UTF-8 bytes without control characters", field="session"
        )


async def _exit_session(entry: _Session) -> None:
    with contextlib.suppress(Exception):
        await entry.handle.__aexit__(None, None, None)
