"""The ``javascript`` backend: JavaScript and TypeScript modules on Deno, deny-by-default.

`Deno <https://deno.com>`_ is a V8 runtime built to run untrusted code: without an
``--allow-*`` flag a program reads no file, opens no socket, sees no environment variable and
starts no process. The PyPI package ``deno`` ships the binary (:func:`find_deno`), so no Node
and no download at run time are needed.

What it runs (``language: javascript | typescript``):

* ``source`` is an ES module (TypeScript is run natively, types stripped, not checked). Its
  default export is called with the request's ``input`` (JSON; ``undefined`` without one) and
  may be async; what it returns (resolves to), as JSON, is the result's ``value``. A default
  export that is not a function is the value itself; no default export: no value. A value JSON
  cannot hold (a ``BigInt``, a cycle) becomes its ``Deno.inspect`` text with a warning.
* ``console.log``/``console.error`` (and ``Deno.stdout``/``Deno.stderr``) are stdout/stderr,
  streamed and capped per the policy.
* An uncaught exception (also an async one in the default export) is ``failed/exit`` with exit
  code 1, its stack on stderr and a diagnostic; a syntax error is ``failed/compileFailed``.
  A value (or a message on the channel) nested deeper than ``[limits] max_depth`` is
  ``failed/exit`` with exit code 1 and a ``tooDeep`` diagnostic.
* ``import { readFile, writeFile, listFiles, deleteFile } from "agora:workspace"`` — the
  workspace through the hub (``workspace="hostFunctions"``), exactly as the python backend's
  host functions: each write is a ``fileWritten`` event caused by the execution, refused on a
  ``read`` instance, paths checked by :mod:`backends.hostcalls`. The calls travel over the
  run's channel (:mod:`backends.javascript.channel`).
* No other module is importable: remote imports (``--no-remote``), ``npm:`` (``--no-npm``) and
  local files (the source is a ``data:`` module, whose imports of ``file:`` need a read
  permission it does not have) are refused; ``node:`` built-ins load but every operation of
  theirs needs a permission too.

Confinement — two walls:

1. Deno's permissions: ``deno run --no-prompt --no-remote --no-npm --cached-only --no-config
   --no-lock --import-map=…`` with only ``--allow-net=unix:<socket>`` and
   ``--allow-read``/``--allow-write`` of that socket: ``Deno.readTextFile``, ``Deno.env``,
   ``fetch``, ``Deno.Command``, ``Deno.dlopen`` … all throw ``NotCapable``.
2. The process backend's bubblewrap sandbox (:mod:`backends.confine`): new user/PID/IPC/UTS/
   network namespaces (the network is never enabled), uid 65534, a read-only view of ``/usr``
   and the deno binary only — no ``/etc``, no workspace, no data directory — a private
   ``/tmp`` (``DENO_DIR``), a per-run cgroup (memory, pids, cpu) where the host offers one.

Limits: the wall-clock timeout kills the process (SIGKILL to bwrap, which takes the PID
namespace and every worker with it; the cgroup is killed too); memory is V8's heap limit
(``--max-old-space-size`` = the policy's ``memoryBytes``) plus, as the second wall, the run's
cgroup at that size plus :data:`RUNTIME_OVERHEAD` (an ``ArrayBuffer`` is not on V8's heap) —
without a cgroup memory controller ``RLIMIT_AS`` stands in, and ``enforcesMemory`` says which;
output capped per stream. :attr:`capabilities` report only what holds here, found at
:meth:`JavaScriptBackend.start`; without bwrap or the deno binary the instance is unavailable.

Warm pool (``warm_workers``, default 2), shipped because it measures faster
(``bench/sandbox_bench.py``: 5-10 ms a warm run against 35-65 ms cold): a warm worker is a
confined deno started ahead with the instance's own limits (heap, cgroup), up and waiting on its
channel for ``start``; a request with those limits takes one, any other shape (another
``memoryBytes``, ``pids``, ``cpus``) starts a deno of its own. Every worker serves exactly one
run and exits (no state crosses runs); the pool is refilled after each run, not during it (a
deno booting beside a run slows it on a small machine). :attr:`JavaScriptBackend.timings` holds
the split of recent runs (until deno asked for its run, and from there to its outcome).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import dataclasses
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import AsyncGenerator, Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import msgspec

from backends.access import Access, DirectoryAccess, WorkspaceAccess, workspace_filesystem
from backends.captured import captured_result
from backends.cgroups import RunCgroup, RunLimits
from backends.confine import Mount, Sandbox, bwrap_argv, launcher_argv
from backends.hostcalls import refuse_process_inputs
from backends.javascript.bootstrap import RUNNER, SOCKET, WORKSPACE
from backends.javascript.channel import HOST_FUNCTIONS, Channel, Report
from backends.lifecycle import BackendLifecycle, elapsed_ms
from backends.output import OutputChannel
from backends.process import Confinement
from backends.runs import Run, RunRegistry, TaskSet
from backends.staging import EtcStaging
from hub.core.execution.capabilities import (
    BackendCapabilities,
    ExecutionIsolation,
    ExecutionLanguage,
)
from hub.core.execution.errors import ExecutionFailed, InvalidRequest
from hub.core.execution.policy import MIB, SandboxPolicy, strict_js
from hub.core.execution.request import ExecutionRequest
from hub.core.execution.result import (
    Diagnostic,
    ExecutionEvent,
    ExecutionResult,
    Stream,
    classify,
    signal_exit_code,
)

__all__ = [
    "DEFAULT_MAX_MEMORY_BYTES",
    "HOST_FUNCTIONS",
    "RUNTIME_OVERHEAD",
    "JavaScriptBackend",
    "deno_argv",
    "find_deno",
]

DEFAULT_MAX_MEMORY_BYTES: Final = 256 * MIB
RUNTIME_OVERHEAD: Final = 192 * MIB  # deno's own RSS (binary, V8 isolate, code) beside the heap
MIN_MEMORY_BYTES: Final = 16 * MIB
WARM_START_S: Final = 30.0  # a warm worker not up by then is dropped (the run goes cold)
# Threads count against it (tokio's and V8's, one set per core, and each Web Worker's); no
# process can be started at all (no --allow-run).
DEFAULT_MAX_PIDS: Final = 256
DEFAULT_MAX_OPEN_FILES: Final = 256
MAX_FILE_BYTES: Final = 16 * MIB  # it writes no file; the bound is for DENO_DIR's caches
READ_SIZE: Final = 64 * 1024
SHELL: Final = "/bin/sh"
STAGE: Final = "/opt/agora-js"  # the runner and the import map, inside the sandbox
CHANNEL_DIR: Final = os.path.dirname(SOCKET)
LANGUAGES: Final = frozenset({ExecutionLanguage.JAVASCRIPT, ExecutionLanguage.TYPESCRIPT})
_OOM_MARKERS: Final = (b"Fatal JavaScript out of memory", b"JavaScript heap out of memory")
SOCKET_PREFIX: Final = "agora-js-"

log = logging.getLogger(__name__)


def find_deno() -> str | None:
    """The deno binary: the one the PyPI package ``deno`` ships, else one on ``PATH``."""
    found: str | None = None
    try:
        import deno as deno_package  # type: ignore[import-untyped]  # (ships no py.typed)

        found = str(deno_package.find_deno_bin())
    except (ImportError, OSError, RuntimeError):
        found = None
    if found and os.access(found, os.X_OK):
        return os.path.realpath(found)
    on_path = shutil.which("deno")
    return os.path.realpath(on_path) if on_path else None


def deno_argv(deno: str, heap_mib: int) -> list[str]:
    """The ``deno run`` command line inside the sandbox: every permission denied but the
    channel socket, no remote/npm modules, no config or lock file discovery. Pure."""
    return [
        deno,
        "run",
        "--no-prompt",
        "--no-remote",
        "--no-npm",
        "--cached-only",
        "--no-config",
        "--no-lock",
        f"--import-map={STAGE}/import_map.json",
        f"--v8-flags=--max-old-space-size={heap_mib}",
        f"--allow-net=unix:{SOCKET}",
        f"--allow-read={SOCKET}",
        f"--allow-write={SOCKET}",
        f"{STAGE}/runner.js",
    ]


def _data_url(source: str) -> str:
    import base64

    return "data:text/javascript;base64," + base64.b64encode(source.encode()).decode()


@dataclass(frozen=True, slots=True)
class _Shape:
    """What a deno process is started with: V8's heap limit and its cgroup's limits."""

    memory: int
    pids: int
    cpus: float | None


@dataclass(slots=True)
class _Worker:
    """One confined deno process and its channel (warm: started before its run is known)."""

    proc: asyncio.subprocess.Process
    group: RunCgroup | None
    channel: Channel
    sockdir: Path


class JavaScriptBackend(BackendLifecycle):
    """Runs JavaScript/TypeScript modules on Deno (see the module docstring).

    ``access``: the instance's authority over the workspace (``read`` refuses
    ``writeFile``/``deleteFile``). ``policy``: the widest policy it runs (default:
    :func:`strict_js`, 5 s, network off, the workspace per ``access``, ``max_memory_bytes`` of
    heap). ``deno``: the binary (default: :func:`find_deno`). ``max_pids``: the run's cgroup
    pids limit when the policy sets none. ``etc_staging``: the hub's staged ``/etc``
    (:mod:`backends.staging`), None for one of its own.
    """

    def __init__(
        self,
        name: str = "js",
        *,
        access: Access = "read-write",
        policy: SandboxPolicy | None = None,
        max_concurrent: int = 8,
        max_memory_bytes: int = DEFAULT_MAX_MEMORY_BYTES,
        max_pids: int = DEFAULT_MAX_PIDS,
        max_host_calls: int = 1000,
        host_call_timeout_s: float = 30.0,
        deno: str | None = None,
        bwrap: str | None = None,
        cgroups: bool = True,
        warm_workers: int = 2,
        etc_staging: EtcStaging | None = None,
    ) -> None:
        self._name = name
        self._access = access
        if policy is None:
            policy = strict_js().replace(
                filesystem=workspace_filesystem(access), memory_bytes=max_memory_bytes
            )
        if policy.network != "disabled":
            raise ValueError("a javascript backend runs without network (network='disabled')")
        self._policy = policy
        self._max_memory = max_memory_bytes
        self._max_pids = max_pids
        self._max_host_calls = max_host_calls
        self._host_call_timeout_s = host_call_timeout_s
        self._deno = deno if deno is not None else (find_deno() or "")
        self._confinement = Confinement(
            bwrap, [self._deno] if self._deno else [], cgroups=cgroups, etc_staging=etc_staging
        )
        self._registry = RunRegistry(name, max_concurrent)
        self._stage: Path | None = None
        self._warm_workers = warm_workers
        self._warm_shape = _Shape(
            memory=max(
                min(policy.memory_bytes or max_memory_bytes, max_memory_bytes), MIN_MEMORY_BYTES
            ),
            pids=max_pids,
            cpus=None,
        )
        self._idle: list[_Worker] = []
        self._filling = 0
        self.timings: collections.deque[tuple[float, float]] = collections.deque(maxlen=256)
        """Per recent run, ``(ms until deno asked for its run, ms from there to its outcome)``:
        the second is what a warm (pre-started) worker would cost (bench/sandbox_bench.py)."""
        self._problem = "not started"
        self._caps = self._capabilities(memory=False, pids=False, cpu=False)

    # -- CodeExecutor (the rest: BackendLifecycle) ----------------------------------------

    @property
    def access(self) -> Access:
        return self._access

    @property
    def idle_workers(self) -> int:
        """How many warm workers are started and waiting for a run."""
        return len(self._idle)

    def _capabilities(self, *, memory: bool, pids: bool, cpu: bool) -> BackendCapabilities:
        return BackendCapabilities(
            isolation=ExecutionIsolation.NAMESPACE,
            enforces_network=True,
            enforces_filesystem=True,
            enforces_environment=True,
            enforces_timeout=True,
            enforces_memory=memory,
            enforces_pids=pids,
            enforces_cpu=cpu,
            supports_structured_output=True,
            languages=LANGUAGES,
            filesystem_modes=frozenset(
                {"none", "workspaceReadOnly", "workspaceReadWrite", "paths"}
            ),
            workspace="hostFunctions",
            host_functions=frozenset(HOST_FUNCTIONS),
            pooled=self._warm_workers > 0,
        )

    def _readiness(self) -> tuple[bool, str]:
        if self._started and self._problem:
            return False, self._problem
        return True, ""

    async def _start(self) -> None:
        """Find deno, probe the confinement (bwrap, cgroups), stage the runner."""
        if not self._deno or not os.access(self._deno, os.X_OK):
            self._problem = (
                "the deno binary is missing: `pip install deno` (the PyPI package ships it)"
            )
            return
        await self._confinement.probe()
        if self._confinement.problem:
            self._problem = self._confinement.problem
            return
        self._stage = Path(await asyncio.to_thread(_stage_files))
        groups = self._confinement.cgroups
        controllers = groups.controllers if groups is not None else frozenset()
        # Memory: a cgroup, else RLIMIT_AS (checked to let V8 start at all: it reserves
        # address space far beyond its heap).
        memory = "memory" in controllers or await self._rlimit_works()
        self._caps = self._capabilities(
            memory=memory, pids="pids" in controllers, cpu="cpu" in controllers
        )
        self._problem = ""
        self._refill()

    async def _rlimit_works(self) -> bool:
        """Whether deno starts under the ``RLIMIT_AS`` this backend would set (no cgroup)."""
        limit_kib = (self._max_memory + RUNTIME_OVERHEAD) // 1024
        with contextlib.suppress(OSError):
            proc = await asyncio.create_subprocess_exec(
                SHELL,
                "-c",
                f'ulimit -v {limit_kib} && exec "$0" --version',
                self._deno,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
            async with asyncio.timeout(10):
                return await proc.wait() == 0
        return False

    async def aclose(self) -> None:
        """Stop every run, the warm workers, remove the staged files. Idempotent."""
        await self._registry.aclose()  # waits for pending refills too
        idle, self._idle = self._idle, []
        for worker in idle:
            await _cleanup(worker, TaskSet())
        await asyncio.to_thread(self._confinement.close)
        if self._stage is not None:
            await asyncio.to_thread(shutil.rmtree, self._stage, True)
            self._stage = None

    async def _validate(self, request: ExecutionRequest) -> None:
        _check_module_request(request)

    async def execute(
        self,
        request: ExecutionRequest,
        workdir: Path | None,
        access: WorkspaceAccess | None = None,
    ) -> AsyncGenerator[ExecutionEvent, None]:
        """Run ``request``'s module (contract: :mod:`backends.base`), on a warm worker when one
        of its shape is idle. ``access``: the workspace for ``agora:workspace`` (default:
        ``workdir`` through :class:`DirectoryAccess`)."""
        await self._check_request(request)
        _check_module_request(request)
        if access is None and workdir is not None:
            access = DirectoryAccess(workdir)
        run = self._registry.admit(request.exec_id)
        started = time.monotonic()
        worker: _Worker | None = None
        tasks = TaskSet()
        try:
            shape = self._shape(request)
            worker = self._checkout(shape)
            warm = worker is not None
            if worker is None:
                worker = await self._spawn(shape)
            worker.channel.assign(request, access)
            proc, group, channel = worker.proc, worker.group, worker.channel
            output = OutputChannel(request.effective_max_stdout, request.effective_max_stderr)
            loop = asyncio.get_running_loop()
            timer = loop.call_later(
                request.effective_timeout_ms / 1000, run.request_stop, "timeout"
            )
            run.on_stop = lambda _reason: _kill(proc, group)
            if run.stop_reason is not None:
                _kill(proc, group)
            try:
                assert proc.stdout is not None and proc.stderr is not None
                tasks.create_task(_pump(proc.stdout, "stdout", output))
                tasks.create_task(_pump(proc.stderr, "stderr", output))
                while (chunk := await output.get()) is not None:
                    yield chunk
                returncode = await proc.wait()
                failure = tasks.failure()
                if failure is not None:
                    raise ExecutionFailed(
                        f"reading the program's output failed: {failure!r}"
                    ) from failure
            finally:
                timer.cancel()
                run.on_stop = None
            oom = group is not None and group.memory_exceeded()
            report = channel.report
            if report.started_at and report.ended_at:
                self.timings.append(
                    (
                        (report.started_at - started) * 1000,
                        (report.ended_at - report.started_at) * 1000,
                    )
                )
            result = self._result(request, run, returncode, output, report, started, oom, warm=warm)
        finally:
            try:
                await self._registry.close_run(run, _cleanup(worker, tasks, self._registry.spawn))
            finally:
                # After the run, not during it: a deno booting beside it would slow it down.
                self._refill()
        yield result

    # -- internals ---------------------------------------------------------------------------

    def _shape(self, request: ExecutionRequest) -> _Shape:
        """The limits a run's deno is started with (fixed at spawn: V8's heap flag, the
        cgroup)."""
        memory = min(request.policy.memory_bytes or self._max_memory, self._max_memory)
        return _Shape(
            memory=max(memory, MIN_MEMORY_BYTES),
            pids=request.policy.pids or self._max_pids,
            cpus=request.policy.cpus,
        )

    def _checkout(self, shape: _Shape) -> _Worker | None:
        """An idle warm worker of ``shape`` that is still alive, or ``None``."""
        while self._idle and shape == self._warm_shape:
            worker = self._idle.pop()
            if worker.proc.returncode is None:
                return worker
            self._registry.spawn(_cleanup(worker, TaskSet()))
        return None

    def _refill(self) -> None:
        """Start warm workers until ``warm_workers`` are idle or on their way."""
        while not self._registry.closed and len(self._idle) + self._filling < self._warm_workers:
            self._filling += 1
            self._registry.spawn(self._fill_one())

    async def _fill_one(self) -> None:
        """Start one warm worker and add it to the pool once deno is up and waiting."""
        worker: _Worker | None = None
        try:
            worker = await self._spawn(self._warm_shape)
            exited = asyncio.ensure_future(worker.proc.wait())
            ready = asyncio.ensure_future(worker.channel.ready.wait())
            try:
                await asyncio.wait(
                    {exited, ready}, timeout=WARM_START_S, return_when="FIRST_COMPLETED"
                )
            finally:
                exited.cancel()
                ready.cancel()
            if not worker.channel.ready.is_set():
                raise ExecutionFailed(f"deno did not get ready within {WARM_START_S} s")
        except Exception as e:  # a pool that cannot fill runs cold
            log.warning("javascript backend %s: a warm worker failed to start: %s", self._name, e)
            if worker is not None:
                await _cleanup(worker, TaskSet())
            return
        finally:
            self._filling -= 1
        if self._registry.closed:
            await _cleanup(worker, TaskSet())
        else:
            self._idle.append(worker)

    async def _spawn(self, shape: _Shape) -> _Worker:
        """Start one confined deno with its channel (not yet given a run). Raises
        :class:`ExecutionFailed`."""
        channel = Channel(
            instance=self._name,
            instance_access=self._access,
            max_host_calls=self._max_host_calls,
            host_call_timeout_s=self._host_call_timeout_s,
        )
        sockdir = Path(await asyncio.to_thread(tempfile.mkdtemp, prefix=SOCKET_PREFIX))
        group: RunCgroup | None = None
        try:
            await channel.open(str(sockdir / os.path.basename(SOCKET)))
            argv, group = self._command(shape, sockdir)
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd="/",
                env=_ENV,
                start_new_session=True,
                limit=READ_SIZE,
            )
        except BaseException as e:
            await channel.aclose()
            if group is not None:
                await asyncio.to_thread(group.remove)
            await asyncio.to_thread(shutil.rmtree, sockdir, True)
            if isinstance(e, OSError):
                raise ExecutionFailed(f"starting deno failed: {e}") from e
            raise
        return _Worker(proc=proc, group=group, channel=channel, sockdir=sockdir)

    def _command(self, shape: _Shape, sockdir: Path) -> tuple[list[str], RunCgroup | None]:
        """The launcher + bwrap + deno command line of one worker, and its cgroup."""
        confinement = self._confinement
        assert self._stage is not None
        group: RunCgroup | None = None
        if confinement.cgroups is not None:
            try:
                group = confinement.cgroups.create(
                    RunLimits(
                        memory_bytes=shape.memory + RUNTIME_OVERHEAD,
                        pids=shape.pids,
                        cpus=shape.cpus,
                    )
                )
            except OSError as e:
                raise ExecutionFailed(f"creating the run's cgroup failed: {e}") from e
        box = Sandbox(
            mounts=(
                Mount(self._stage, STAGE, False),
                Mount(sockdir, CHANNEL_DIR, False),
            ),
            cwd="/tmp",
            network=False,
        )
        # No /etc at all: deno needs none of it, and a sandbox should see nothing it needn't.
        view = dataclasses.replace(confinement.view, etc="", network_etc="")
        launcher = launcher_argv(
            SHELL,
            group.procs_files if group is not None else (),
            open_files=DEFAULT_MAX_OPEN_FILES,
            file_blocks=max(1, MAX_FILE_BYTES // max(1, confinement.file_block)),
            memory_kib=(shape.memory + RUNTIME_OVERHEAD) // 1024
            if group is None or group.memory is None
            else None,
        )
        heap_mib = max(1, shape.memory // MIB)
        return launcher + bwrap_argv(
            confinement.bwrap, view, box, deno_argv(self._deno, heap_mib)
        ), group

    def _result(
        self,
        request: ExecutionRequest,
        run: Run,
        returncode: int | None,
        output: OutputChannel,
        report: Report,
        started: float,
        memory_exceeded: bool,
        *,
        warm: bool,
    ) -> ExecutionResult:
        code = signal_exit_code(returncode)
        # V8's own heap limit aborts deno (a signal, e.g. SIGTRAP: 133): its message counts only
        # then, not when a program merely prints it.
        v8_oom = (
            code is not None
            and code > 128
            and any(m in output.kept("stderr") for m in _OOM_MARKERS)
        )
        oom = memory_exceeded or v8_oom
        outcome = classify(
            code, cancelled=run.cancelled, timed_out=run.timed_out, memory_exceeded=oom
        )
        notes: list[Diagnostic] = []
        value: object = msgspec.UNSET
        stopped = run.stop_reason is not None
        if oom and not stopped:
            outcome = ("failed", "memoryLimit", code if code is not None else 137)
            notes.append(
                Diagnostic(
                    level="error",
                    code="memoryLimit",
                    message=f"the program ran out of its memory limit "
                    f"({min(request.policy.memory_bytes or self._max_memory, self._max_memory)}"
                    " bytes of heap)",
                )
            )
        elif not stopped and report.kind == "compile":
            outcome = ("failed", "compileFailed", 1)
            notes.append(Diagnostic(level="error", code="syntaxError", message=report.message))
        elif not stopped and report.kind == "refused":
            outcome = ("failed", "exit", 1)
            notes.append(Diagnostic(level="error", code="tooDeep", message=report.message))
        elif not stopped and report.kind == "exception":
            outcome = ("failed", "exit", 1)
            notes.append(
                Diagnostic(
                    level="error", code="exception", message=f"{report.name}: {report.message}"
                )
            )
        elif not stopped and report.kind == "result" and code == 0:
            if report.repr is not None:
                value = report.repr
                notes.append(
                    Diagnostic(
                        level="warning",
                        code="valueNotJson",
                        message="the value is not JSON; its Deno.inspect text is returned",
                    )
                )
            else:
                value = report.value
        notes += run.stop_notes(request.effective_timeout_ms, "deno was killed")
        result = captured_result(
            output,
            outcome,
            duration_ms=elapsed_ms(started),
            metadata=self._metadata(request, warm=warm),
            notes=notes,
            value=value,
        )
        if report.skipped:
            result = msgspec.structs.replace(result, skipped=list(report.skipped))
        return result


_ENV: Final = {
    "PATH": "/usr/bin:/bin",
    "HOME": "/tmp",
    "DENO_DIR": "/tmp/deno",
    "DENO_NO_UPDATE_CHECK": "1",
    "DENO_NO_PROMPT": "1",
    "NO_COLOR": "1",
    "LANG": "C.UTF-8",
}


def _stage_files() -> str:
    """The runner and the import map, in a directory bound read-only into every sandbox
    (``agora:workspace`` is a ``data:`` module: nothing of it is read from a file)."""
    stage = tempfile.mkdtemp(prefix="agora-js-stage-")
    os.chmod(stage, 0o755)
    Path(stage, "runner.js").write_text(RUNNER)
    imports = {"imports": {"agora:workspace": _data_url(WORKSPACE)}}
    Path(stage, "import_map.json").write_bytes(msgspec.json.encode(imports))
    for name in ("runner.js", "import_map.json"):
        os.chmod(Path(stage, name), 0o644)
    return stage


def _check_module_request(request: ExecutionRequest) -> None:
    refuse_process_inputs(request, "javascript")
    if not request.source:
        raise InvalidRequest("a javascript execution needs source (an ES module)", field="source")


def _kill(proc: asyncio.subprocess.Process | None, group: RunCgroup | None) -> None:
    """SIGKILL bwrap's process group (the PID namespace, deno and its workers die with it) and
    the run's cgroup."""
    if proc is not None and proc.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
    if group is not None:
        group.kill()


async def _pump(reader: asyncio.StreamReader, stream: Stream, output: OutputChannel) -> None:
    try:
        while data := await reader.read(READ_SIZE):
            await output.feed(stream, data)
    finally:
        output.close(stream)


async def _cleanup(
    worker: _Worker | None,
    tasks: TaskSet,
    defer: Callable[[Coroutine[Any, Any, None]], object] | None = None,
) -> None:
    """Kill what is left of a worker (a run cancelled mid-way, an idle worker at close), reap
    it, close its channel, drop its socket directory and cgroup. With ``defer`` (the run's
    registry), removing the emptied cgroup and directory — milliseconds on a v1 memory
    cgroup — is left to a background task once the program is reaped and gone."""
    try:
        await tasks.aclose()
    finally:
        if worker is not None:
            proc, group = worker.proc, worker.group
            if proc.returncode is None:
                _kill(proc, group)
                await proc.wait()
            await worker.channel.aclose()
            if defer is not None and (group is None or not group.pids()):
                defer(_remove(group, worker.sockdir))
            else:
                await _remove(group, worker.sockdir)


async def _remove(group: RunCgroup | None, sockdir: Path) -> None:
    if group is not None:
        await asyncio.to_thread(group.remove)
    await asyncio.to_thread(shutil.rmtree, sockdir, True)
