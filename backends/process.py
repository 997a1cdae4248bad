"""The ``process`` backend: a host process per execution (isolation ``hostLocal``).

What it runs (``language``):

* ``command`` with source text → ``/bin/sh -c SOURCE sh ARGV...`` (``$1…`` are ``argv``).
* ``command`` without source → ``argv`` itself (``argv[0]`` looked up on the minimal ``PATH``).
* ``python`` → the hub's own interpreter, isolated: ``python -I -c SOURCE ARGV...``; ``input``
  (JSON) is written to stdin when no ``stdin`` is given, and the last stdout line, if it is
  JSON, is the result's ``value`` (adk-code's harness rule). Not a sandbox: use the ``python``
  backend for untrusted Python.

How it confines the program, and what it does *not* do:

* Own session and process group (``start_new_session``). Timeout or cancel: SIGTERM to the
  group, SIGKILL after ``kill_grace_s``. When the main process exits, whatever it left behind
  in its group is killed too, so nothing outlives the run. A program that calls ``setsid()``
  leaves the group and is not tracked — use the ``container`` backend for real containment.
* Environment cleared: only ``PATH`` (minimal), ``HOME`` (the working directory), ``LANG`` and
  the request's explicit variables (each allowed by the policy). The hub's environment
  (``AGORA_SECRET``…) is never inherited.
* Working directory: the runtime's ``workdir`` (plus the request's relative ``cwd``); without
  one, a private scratch directory removed afterwards.
* Network ``disabled``: the program runs in a new, empty network namespace
  (``unshare --net``, or ``unshare -rn`` for a non-root hub). Whether that works here is probed
  once per process at :meth:`ProcessBackend.start`; if it does not, the capabilities say
  ``enforcesNetwork=false`` and every network-disabled request is refused.
* Filesystem: not confined (it is the hub user's host view), so only mode ``host`` is accepted
  (every restricted mode is refused: ``validate_policy``). Memory/pids/cpu limits are not
  enforced, so policies setting them are refused.
* Output: each stream capped (bytes past the cap are read and dropped, counted, flagged).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncGenerator, Sequence
from pathlib import Path
from typing import Final

import msgspec

from backends.access import WorkspaceAccess
from backends.captured import captured_result, not_run_result
from backends.lifecycle import BackendLifecycle, elapsed_ms
from backends.output import OutputChannel
from backends.runs import Run, RunRegistry, TaskSet
from hub.core.execution.capabilities import (
    BackendCapabilities,
    ExecutionIsolation,
    ExecutionLanguage,
)
from hub.core.execution.errors import ExecutionFailed, InvalidRequest
from hub.core.execution.policy import SandboxPolicy, host_local
from hub.core.execution.request import ExecutionRequest
from hub.core.execution.result import ExecEvent, ExecutionResult, Stream, classify, signal_exit_code

__all__ = ["DEFAULT_PATH", "ProcessBackend", "probe_network_isolation"]

log = logging.getLogger(__name__)

DEFAULT_PATH: Final = "/usr/local/bin:/usr/bin:/bin"
READ_SIZE: Final = 64 * 1024
SHELL: Final = "/bin/sh"
MAX_ARG_SOURCE: Final = 131_071  # the kernel's limit on one argv string, minus the NUL

# The result of the one-per-process probe: the argv prefix that puts a program in a new network
# namespace, or () when none works. None = not probed yet.
_netns_prefix: tuple[str, ...] | None = None
_probe_lock: asyncio.Lock | None = None


async def probe_network_isolation() -> tuple[str, ...]:
    """The command prefix that runs a program without network (``unshare --net --`` as root,
    ``unshare -rn --`` otherwise), or ``()`` if neither works here. Probed once per process."""
    global _netns_prefix, _probe_lock
    if _netns_prefix is not None:
        return _netns_prefix
    if _probe_lock is None:
        _probe_lock = asyncio.Lock()
    async with _probe_lock:
        if _netns_prefix is not None:
            return _netns_prefix
        found: tuple[str, ...] = ()
        unshare = shutil.which("unshare", path=DEFAULT_PATH + ":/usr/sbin:/sbin")
        if unshare is not None:
            candidates = [(unshare, "--net", "--"), (unshare, "-rn", "--")]
            if os.geteuid() != 0:
                candidates.reverse()
            for prefix in candidates:
                if await _runs_ok([*prefix, "true"]):
                    found = prefix
                    break
        _netns_prefix = found
        log.info("process backend network isolation: %s", " ".join(found) or "unavailable")
        return found


async def _runs_ok(argv: Sequence[str]) -> bool:
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={"PATH": DEFAULT_PATH},
            start_new_session=True,
        )
    except OSError:
        return False
    try:
        async with asyncio.timeout(5):
            return await proc.wait() == 0
    except TimeoutError:
        _kill_group(proc.pid, signal.SIGKILL)
        await proc.wait()
        return False


def _kill_group(pgid: int, sig: signal.Signals) -> None:
    """Signal a process group; a group that is already gone is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


class ProcessBackend(BackendLifecycle):
    """Runs each execution as a host process (see the module docstring).

    ``policy``: the instance's default policy (default: :func:`host_local` with the network
    disabled — the widest this instance runs; pass ``host_local()`` to allow network).
    ``network_isolation``: ``None`` probes ``unshare``; ``False`` never isolates (then
    network-disabled requests are refused). ``python``: the interpreter for the ``python``
    language (default: the hub's own; ``""`` disables the language).
    """

    def __init__(
        self,
        name: str = "process",
        *,
        policy: SandboxPolicy | None = None,
        network_isolation: bool | None = None,
        kill_grace_s: float = 1.0,
        max_concurrent: int = 24,
        python: str | None = None,
        path: str = DEFAULT_PATH,
    ) -> None:
        self._name = name
        self._policy = policy if policy is not None else host_local().replace(network="disabled")
        self._want_netns = network_isolation
        self._netns: tuple[str, ...] = ()
        self._kill_grace_s = kill_grace_s
        self._python = sys.executable if python is None else python
        self._path = path
        self._registry = RunRegistry(name, max_concurrent)
        self._started = False
        self._caps = self._capabilities(network=False)

    # -- CodeExecutor (the rest: BackendLifecycle) ----------------------------------------

    def _readiness(self) -> tuple[bool, str]:
        if not os.access(SHELL, os.X_OK):
            return False, f"{SHELL} is missing"
        return True, ""

    async def start(self) -> None:
        """Probe network isolation once (idempotent)."""
        if self._started:
            return
        if self._want_netns is not False:
            self._netns = await probe_network_isolation()
        self._caps = self._capabilities(network=bool(self._netns))
        self._started = True

    async def aclose(self) -> None:
        await self._registry.aclose()

    async def execute(
        self,
        request: ExecutionRequest,
        workdir: Path | None,
        access: WorkspaceAccess | None = None,
    ) -> AsyncGenerator[ExecEvent, None]:
        """Run ``request`` as a host process (contract: :mod:`backends.base`)."""
        await self._check_request(request)
        argv, stdin = self._command(request)
        run = self._registry.admit(request.exec_id)
        started = time.monotonic()
        scratch: Path | None = None
        proc: asyncio.subprocess.Process | None = None
        try:
            if workdir is None:
                workdir = scratch = Path(tempfile.mkdtemp(prefix="agora-exec-"))
            cwd = _working_dir(workdir, request.effective_cwd)
            env = self._environment(request, cwd)
            if request.policy.network == "disabled":
                argv = [*self._netns, *argv]
            try:
                proc, exited = await _spawn(
                    argv,
                    stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL,
                    cwd=cwd,
                    env=env,
                )
            except FileNotFoundError as e:
                result = self._spawn_failure(request, started, 127, f"{argv[0]}: not found ({e})")
            except PermissionError as e:
                result = self._spawn_failure(
                    request, started, 126, f"{argv[0]}: permission denied ({e})"
                )
            except OSError as e:
                raise ExecutionFailed(f"starting the program failed: {e}") from e
            else:
                loop = asyncio.get_running_loop()
                channel = OutputChannel(request.effective_max_stdout, request.effective_max_stderr)
                tasks = TaskSet()
                # No helper task for the clock or the exit: a timer, and the protocol's
                # process_exited callback (which kills what the program left in its group).
                timer = loop.call_later(
                    request.effective_timeout_ms / 1000, run.request_stop, "timeout"
                )
                run.on_stop = lambda _reason: tasks.create_task(self._terminate(proc, run))
                if run.stop_reason is not None:  # cancelled while the program was spawning
                    tasks.create_task(self._terminate(proc, run))
                exited.add_done_callback(lambda _: _reaped(proc, run))
                try:
                    assert proc.stdout is not None and proc.stderr is not None
                    tasks.create_task(_pump(proc.stdout, "stdout", channel))
                    tasks.create_task(_pump(proc.stderr, "stderr", channel))
                    if stdin is not None:
                        tasks.create_task(_feed_stdin(proc, stdin))
                    while (chunk := await channel.get()) is not None:
                        yield chunk
                    await run.exited.wait()
                    failure = tasks.failure()
                    if failure is not None:
                        raise ExecutionFailed(
                            f"reading the program's output failed: {failure!r}"
                        ) from failure
                finally:
                    timer.cancel()
                    run.on_stop = None
                    await tasks.aclose()
                result = self._result(request, run, proc.returncode, channel, started)
        finally:
            done = _cleanup_now(proc, scratch)
            await self._registry.close_run(run, None if done else _cleanup(proc, scratch))
        yield result

    # -- internals ---------------------------------------------------------------------------

    def _capabilities(self, *, network: bool) -> BackendCapabilities:
        languages = {ExecutionLanguage.COMMAND}
        if self._python:
            languages.add(ExecutionLanguage.PYTHON)
        return BackendCapabilities(
            isolation=ExecutionIsolation.HOST_LOCAL,
            enforces_network=network,
            enforces_filesystem=False,
            enforces_environment=True,
            enforces_timeout=True,
            supports_structured_output=bool(self._python),
            supports_process_execution=True,
            languages=frozenset(languages),
            filesystem_modes=frozenset({"host"}),
            value_from_stdout=True,
        )

    def _command(self, request: ExecutionRequest) -> tuple[list[str], bytes | None]:
        """``(argv, stdin bytes or None)`` for ``request``. Raises :class:`InvalidRequest`."""
        source = request.source or ""
        stdin = request.stdin
        if len(source.encode("utf-8", "surrogatepass")) > MAX_ARG_SOURCE:
            raise InvalidRequest(
                f"source is passed as one argument, limited to {MAX_ARG_SOURCE} bytes",
                field="source",
            )
        if request.language == ExecutionLanguage.PYTHON:
            if stdin is None and request.has_input:
                stdin = msgspec.json.encode(request.input) + b"\n"
            return [self._python, "-I", "-c", source, *request.argv], stdin
        if source:
            return [SHELL, "-c", source, "sh", *request.argv], stdin
        if not request.argv:
            raise InvalidRequest("a command needs source text or argv", field="source")
        return list(request.argv), stdin

    def _environment(self, request: ExecutionRequest, cwd: Path) -> dict[str, str]:
        env = {"PATH": self._path, "HOME": str(cwd), "LANG": "C.UTF-8"}
        env.update(request.env)  # validated: every name is in the policy's allow-list
        return env

    async def _terminate(self, proc: asyncio.subprocess.Process, run: Run) -> None:
        """On timeout or cancel: SIGTERM the group, then SIGKILL after the grace period."""
        _kill_group(proc.pid, signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(self._kill_grace_s):
                await run.exited.wait()
        _kill_group(proc.pid, signal.SIGKILL)

    def _result(
        self,
        request: ExecutionRequest,
        run: Run,
        returncode: int | None,
        channel: OutputChannel,
        started: float,
    ) -> ExecutionResult:
        return captured_result(
            channel,
            classify(
                signal_exit_code(returncode), cancelled=run.cancelled, timed_out=run.timed_out
            ),
            duration_ms=elapsed_ms(started),
            metadata=self._metadata(request),
            notes=run.stop_notes(request.effective_timeout_ms, "the program was stopped"),
            structured=request.language == ExecutionLanguage.PYTHON,
        )

    def _spawn_failure(
        self, request: ExecutionRequest, started: float, code: int, message: str
    ) -> ExecutionResult:
        """The program could not be started (not found: 127, not executable: 126, as a shell
        says)."""
        return not_run_result(
            "exit",
            code,
            message,
            duration_ms=elapsed_ms(started),
            metadata=self._metadata(request),
        )


def _cleanup_now(proc: asyncio.subprocess.Process | None, scratch: Path | None) -> bool:
    """The cleanup of the usual run, which needs no waiting: the program was reaped and left
    an empty scratch directory (removed here). False if :func:`_cleanup` must run."""
    if proc is not None and proc.returncode is None:
        return False
    if scratch is not None:
        try:
            scratch.rmdir()
        except OSError:
            return False
    return True


async def _cleanup(proc: asyncio.subprocess.Process | None, scratch: Path | None) -> None:
    """Kill whatever is left of the run's process group, reap it, drop the scratch dir."""
    if proc is not None and proc.returncode is None:
        # Not reaped yet (the run was cancelled or failed mid-way): kill the group.
        _kill_group(proc.pid, signal.SIGKILL)
        await proc.wait()
    if scratch is not None:
        await asyncio.to_thread(shutil.rmtree, scratch, True)


def _working_dir(root: Path, cwd: str) -> Path:
    """``root/cwd``, created if missing. Raises :class:`InvalidRequest` if it is not a
    directory."""
    path = root if cwd == "." else root / cwd
    if cwd != ".":
        try:
            path.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise InvalidRequest(f"cwd {cwd!r} is not a usable directory: {e}", field="cwd") from e
    return path


async def _pump(reader: asyncio.StreamReader, stream: Stream, channel: OutputChannel) -> None:
    """Copy one pipe into the channel until EOF (reading on past the cap: nothing blocks).
    The stream is closed whatever happens, so the consumer never waits forever."""
    try:
        while data := await reader.read(READ_SIZE):
            await channel.feed(stream, data)
    finally:
        channel.close(stream)


async def _feed_stdin(proc: asyncio.subprocess.Process, data: bytes) -> None:
    """Write ``data`` to the program's stdin and close it; a program that stops reading is
    fine."""
    assert proc.stdin is not None
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        proc.stdin.write(data)
        await proc.stdin.drain()
    proc.stdin.close()
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        await proc.stdin.wait_closed()


class _Protocol(asyncio.subprocess.SubprocessStreamProtocol):
    """asyncio's subprocess protocol plus a future resolved when the main process exits.

    ``Process.wait()`` only returns once the pipes are closed too, and a background child
    holding stdout open would keep them open: the backend needs the exit itself.
    """

    def __init__(self, limit: int, loop: asyncio.AbstractEventLoop) -> None:
        super().__init__(limit=limit, loop=loop)
        self.exited: asyncio.Future[None] = loop.create_future()

    def process_exited(self) -> None:
        super().process_exited()
        if not self.exited.done():
            self.exited.set_result(None)


async def _spawn(
    argv: Sequence[str], *, stdin: int, cwd: Path, env: dict[str, str]
) -> tuple[asyncio.subprocess.Process, asyncio.Future[None]]:
    """Start ``argv`` in a new session and process group, stdout/stderr piped. Returns the
    process and a future resolved when it exits. Raises ``OSError`` if it cannot be started."""
    loop = asyncio.get_running_loop()
    transport, protocol = await loop.subprocess_exec(
        lambda: _Protocol(limit=READ_SIZE, loop=loop),
        *argv,
        stdin=stdin,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=cwd,
        env=env,
        start_new_session=True,
        close_fds=True,
    )
    return asyncio.subprocess.Process(transport, protocol, loop), protocol.exited


def _reaped(proc: asyncio.subprocess.Process, run: Run) -> None:
    """The main process exited: kill what it left in its group (so the pipes close and nothing
    outlives the run), and mark the run as gone."""
    _kill_group(proc.pid, signal.SIGKILL)
    run.exited.set()
