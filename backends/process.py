"""The ``process`` backend: a host process per execution, confined by bubblewrap.

What it runs (``language``):

* ``command`` with source text → ``/bin/sh -c SOURCE sh ARGV...`` (``$1…`` are ``argv``).
* ``command`` without source → ``argv`` itself (``argv[0]`` looked up on the minimal ``PATH``).
* ``python`` → the hub's own interpreter, isolated: ``python -I -c SOURCE ARGV...``; ``input``
  (JSON) is written to stdin when no ``stdin`` is given, and the last stdout line, if it is
  JSON, is the result's ``value`` (adk-code's harness rule).

**Confined** (the default, isolation ``namespace``): every program runs under ``bwrap``
(:mod:`backends.confine` builds the argument list): new user/PID/IPC/UTS/mount namespaces, a
new network namespace when the policy disables the network, uid 65534, a read-only minimal host
view, the workspace at ``/workspace`` read-only or read-write as the instance's ``access`` and
the policy say (all of :class:`~hub.core.execution.policy.FilesystemPolicy`'s modes but
``host``), a private ``/tmp``, its own ``/proc``; no data directory, no ``/root``. Limits hold:
memory, pids and cpu through a per-run cgroup (:mod:`backends.cgroups`, v2 or v1 as the host
has) where the host offers one — else memory through ``RLIMIT_AS`` — and open files and file
size through rlimits (set by the launcher shell, :func:`backends.confine.launcher_argv`).
:attr:`capabilities` report exactly what this host
enforces, found at :meth:`ProcessBackend.start`; a policy asking for more is refused. Without a
working ``bwrap`` the instance is *unavailable* (with the reason), never silently unconfined.

Kill is total: a timeout or cancel sends SIGTERM to the program's processes, then after
``kill_grace_s`` SIGKILL to ``bwrap``, which tears the PID namespace down (``setsid``, double
fork and ``nohup`` children included); the run's cgroup is killed and removed too;
``--die-with-parent`` covers a hub that is SIGKILLed, and :meth:`start` sweeps cgroups left by
hubs that are gone.

**Unconfined** (``confine=False``; isolation ``hostLocal``): for trusted code only, when the
operator configures it by name. Own session and process group; environment cleared; network
``disabled`` through ``unshare --net`` where that works; the hub user's host filesystem (only
mode ``host`` is accepted); no resource limits; a program that calls ``setsid()`` leaves the
group and is not tracked.

Both: the environment holds only ``PATH`` (minimal), ``HOME`` (the working directory),
``LANG`` and the request's explicit variables (each allowed by the policy) — never the hub's;
each output stream is capped (bytes past the cap are read and dropped, counted, flagged).
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

from backends.access import Access, WorkspaceAccess, workspace_filesystem
from backends.captured import captured_result, not_run_result
from backends.cgroups import CgroupHost, RunCgroup, RunLimits
from backends.confine import (
    HostView,
    Sandbox,
    StagedEtc,
    bwrap_argv,
    host_view,
    launcher_argv,
    workspace_mounts,
)
from backends.lifecycle import BackendLifecycle, elapsed_ms
from backends.output import OutputChannel
from backends.runs import Run, RunRegistry, TaskSet
from backends.staging import EtcStaging
from hub.core.execution.capabilities import (
    BackendCapabilities,
    ExecutionIsolation,
    ExecutionLanguage,
)
from hub.core.execution.errors import ExecutionFailed, InvalidRequest
from hub.core.execution.policy import MIB, FilesystemMode, SandboxPolicy, host_local
from hub.core.execution.request import ExecutionRequest
from hub.core.execution.result import (
    ExecutionEvent,
    ExecutionResult,
    Stream,
    classify,
    signal_exit_code,
)

__all__ = ["DEFAULT_PATH", "Confinement", "ProcessBackend", "probe_network_isolation"]

log = logging.getLogger(__name__)

DEFAULT_PATH: Final = "/usr/local/bin:/usr/bin:/bin"
READ_SIZE: Final = 64 * 1024
SHELL: Final = "/bin/sh"
MAX_ARG_SOURCE: Final = 131_071  # the kernel's limit on one argv string, minus the NUL
# A confined run's limits when its policy sets none (each only where the host enforces it):
# enough for compilers and test suites, far below what would starve the hub.
DEFAULT_MAX_MEMORY: Final = 2048 * MIB
DEFAULT_MAX_PIDS: Final = 512
DEFAULT_MAX_OPEN_FILES: Final = 1024
DEFAULT_MAX_FILE_BYTES: Final = 1024 * MIB
CONFINED_MODES: Final[frozenset[FilesystemMode]] = frozenset(
    {"none", "workspaceReadOnly", "workspaceReadWrite", "paths"}
)


async def probe_network_isolation() -> tuple[str, ...]:
    """The command prefix that runs a program without network (``unshare --net --`` as root,
    ``unshare -rn --`` otherwise), or ``()`` if neither works here. Probed by each unconfined
    instance as it starts (one ``unshare … true`` or two: a few milliseconds; no state kept
    beyond the instance)."""
    unshare = shutil.which("unshare", path=DEFAULT_PATH + ":/usr/sbin:/sbin")
    if unshare is None:
        return ()
    candidates = [(unshare, "--net", "--"), (unshare, "-rn", "--")]
    if os.geteuid() != 0:
        candidates.reverse()
    for prefix in candidates:
        if await _runs_ok([*prefix, "true"]):
            log.info("process backend network isolation: %s", " ".join(prefix))
            return prefix
    log.info("process backend network isolation: unavailable")
    return ()


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


async def _file_block() -> int:
    """Bytes per block of ``/bin/sh``'s ``ulimit -f`` (POSIX says 512; bash uses 1024), read
    back from the kernel's view of the limit. 0 if the shell cannot set it."""
    try:
        proc = await asyncio.create_subprocess_exec(
            SHELL,
            "-c",
            "ulimit -f 8 && exec cat /proc/self/limits",
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            env={"PATH": DEFAULT_PATH},
        )
        out, _ = await proc.communicate()
    except OSError:
        return 0
    for line in out.decode(errors="replace").splitlines():
        if line.startswith("Max file size"):
            soft = line.split()[3]
            return int(soft) // 8 if soft.isdigit() else 0
    return 0


async def _runs_ok_why(argv: Sequence[str]) -> tuple[bool, str]:
    """Whether ``argv`` exits 0 (within 10 s), and else its stderr (or why it did not
    start)."""
    try:
        proc = await asyncio.create_subprocess_exec(
            *argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env={"PATH": DEFAULT_PATH},
            start_new_session=True,
        )
    except OSError as e:
        return False, str(e)
    try:
        async with asyncio.timeout(10):
            _, err = await proc.communicate()
    except TimeoutError:
        _kill_group(proc.pid, signal.SIGKILL)
        await proc.wait()
        return False, "it did not finish within 10 s"
    why = err.decode(errors="replace").strip()[:500]
    return proc.returncode == 0, why or f"exit status {proc.returncode}"


def _kill_group(pgid: int, sig: signal.Signals) -> None:
    """Signal a process group; a group that is already gone is fine."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


class Confinement:
    """What confining a program takes on this host, found once by :meth:`probe`: ``bwrap``
    (and whether it can make namespaces here), the host view, the cgroups, the rlimit unit.
    ``problem`` says why programs cannot be confined ("" when they can). ``etc_staging``: the
    hub's staged ``/etc``, shared by its confined instances (None: one of its own)."""

    def __init__(
        self,
        bwrap: str | None,
        extra: Sequence[str],
        *,
        cgroups: bool = True,
        etc_staging: EtcStaging | None = None,
    ) -> None:
        self._bwrap_hint = bwrap
        self._extra = tuple(extra)
        self._use_cgroups = cgroups
        self.bwrap = ""
        self.view = HostView(dirs=())
        self.cgroups: CgroupHost | None = None
        self.file_block = 0  # bytes per `ulimit -f` block of /bin/sh (dash 512, bash 1024)
        self.problem = "not probed yet"
        # The hub's one staged /etc (backends.staging), else a copy of this instance's own.
        self._etc = EtcStaging() if etc_staging is None else etc_staging
        self._staged: StagedEtc | None = None  # held from self._etc, until close()

    @property
    def memory(self) -> bool:
        """Memory is bounded: a cgroup, else ``RLIMIT_AS`` (``ulimit -v``)."""
        return True

    @property
    def pids(self) -> bool:
        return self.cgroups is not None and "pids" in self.cgroups.controllers

    @property
    def cpu(self) -> bool:
        return self.cgroups is not None and "cpu" in self.cgroups.controllers

    async def probe(self) -> None:
        """Find bwrap and check that it confines here (a trivial program in a sandbox with
        every namespace); find the cgroups (sweeping groups of dead hubs) and the unit of the
        shell's ``ulimit -f``."""
        search = DEFAULT_PATH + ":/usr/sbin:/sbin"
        bwrap = self._bwrap_hint or shutil.which("bwrap", path=search)
        if bwrap is None or not os.access(bwrap, os.X_OK):
            self.problem = (
                "bubblewrap (bwrap) is not installed: install the `bubblewrap` package, or "
                "configure an unconfined instance for trusted code (docs/execution.md)"
            )
            log.warning("process backend: %s", self.problem)
            return
        if self._staged is None:
            self._staged = await self._etc.acquire()
        self.view = await asyncio.to_thread(host_view, self._extra, self._staged)
        argv = bwrap_argv(bwrap, self.view, Sandbox(mounts=()), ["/bin/true"])
        ok, why = await _runs_ok_why(argv)
        if not ok:
            self.problem = f"bwrap cannot create namespaces here: {why}"
            log.warning("process backend: %s", self.problem)
            return
        block = await _file_block()
        if not block:
            self.problem = f"{SHELL} cannot set resource limits (ulimit)"
            return
        self.bwrap = bwrap
        self.file_block = block
        if self._use_cgroups:
            self.cgroups = await asyncio.to_thread(CgroupHost.probe)
        if self.cgroups is not None:
            await asyncio.to_thread(self.cgroups.sweep)
        self.problem = ""
        log.info("process backend confinement: %s, cgroups %s", bwrap, self.cgroups)

    def close(self) -> None:
        """Let go of the staged ``/etc`` (the last instance to hold it removes it) and remove
        this hub's parent cgroups (when empty). Blocking."""
        if self._staged is not None:
            self._staged = None
            self._etc.release()
        if self.cgroups is not None:
            self.cgroups.close()


class ProcessBackend(BackendLifecycle):
    """Runs each execution as a host process (see the module docstring).

    ``confine``: run every program under bubblewrap (default); ``False`` is the unconfined
    host instance, for trusted code only. ``access``: the instance's authority over the
    workspace (``read``: it is bound read-only whatever a policy says). ``policy``: the
    instance's default policy, the widest it runs (default, confined: the workspace per
    ``access``, network disabled; unconfined: :func:`host_local` with the network disabled).
    A confined instance cannot offer filesystem mode ``host``: such a policy is a
    :class:`ValueError`. ``max_memory_bytes``, ``max_pids``, ``max_open_files``,
    ``max_file_bytes``: a confined run's limits when its policy sets none (each applied where
    the host enforces it). ``cgroups``: use the host's cgroups where it offers them (``False``:
    rlimits only, so memory is bounded but pids and cpu limits are refused). ``expose``:
    further host paths shown read-only at the same path (the python interpreter's prefix is
    added when it is not under ``/usr``).
    ``network_isolation`` (unconfined only): ``None`` probes ``unshare``; ``False`` never
    isolates (then network-disabled requests are refused). ``python``: the interpreter for the
    ``python`` language (default: the hub's own; ``""`` disables the language).
    ``etc_staging``: the hub's staged ``/etc`` (:mod:`backends.staging`; the registry gives
    every instance the same one), None for one of its own.
    """

    def __init__(
        self,
        name: str = "process",
        *,
        policy: SandboxPolicy | None = None,
        confine: bool = True,
        access: Access = "read-write",
        network_isolation: bool | None = None,
        kill_grace_s: float = 1.0,
        max_concurrent: int = 24,
        python: str | None = None,
        path: str = DEFAULT_PATH,
        bwrap: str | None = None,
        cgroups: bool = True,
        expose: Sequence[str] = (),
        max_memory_bytes: int = DEFAULT_MAX_MEMORY,
        max_pids: int = DEFAULT_MAX_PIDS,
        max_open_files: int = DEFAULT_MAX_OPEN_FILES,
        max_file_bytes: int = DEFAULT_MAX_FILE_BYTES,
        etc_staging: EtcStaging | None = None,
    ) -> None:
        self._name = name
        self._confine = confine
        self._access = access
        self._python = sys.executable if python is None else python
        if policy is None:
            if confine:
                policy = SandboxPolicy(network="disabled", filesystem=workspace_filesystem(access))
            else:
                policy = host_local().replace(network="disabled")
        if confine and policy.filesystem.mode not in CONFINED_MODES:
            raise ValueError(
                f"a confined process backend cannot offer filesystem mode "
                f"{policy.filesystem.mode!r}; use confine=False (trusted code only) for that"
            )
        self._policy = policy
        self._want_netns = network_isolation
        self._netns: tuple[str, ...] = ()
        shown = list(expose)
        if self._python and not os.path.realpath(sys.base_prefix).startswith("/usr/"):
            # The interpreter and its standard library, nothing else of its home directory.
            shown.append(
                sys.base_prefix if python is None else str(Path(self._python).parent.parent)
            )
        self._confinement = Confinement(bwrap, shown, cgroups=cgroups, etc_staging=etc_staging)
        self._max_memory = max_memory_bytes
        self._max_pids = max_pids
        self._max_open_files = max_open_files
        self._max_file_bytes = max_file_bytes
        self._kill_grace_s = kill_grace_s
        self._path = path
        self._registry = RunRegistry(name, max_concurrent)
        self._caps = self._capabilities(network=False)

    # -- CodeExecutor (the rest: BackendLifecycle) ----------------------------------------

    def _readiness(self) -> tuple[bool, str]:
        if not os.access(SHELL, os.X_OK):
            return False, f"{SHELL} is missing"
        if self._confine and self._started and self._confinement.problem:
            return False, self._confinement.problem
        return True, ""

    async def _start(self) -> None:
        """Probe confinement (bwrap, cgroups, rlimits; sweeping cgroups of dead hubs) or, for
        an unconfined instance, network isolation."""
        if self._confine:
            await self._confinement.probe()
            self._caps = self._capabilities(network=not self._confinement.problem)
        else:
            if self._want_netns is not False:
                self._netns = await probe_network_isolation()
            self._caps = self._capabilities(network=bool(self._netns))

    async def aclose(self) -> None:
        await self._registry.aclose()
        await asyncio.to_thread(self._confinement.close)

    async def _validate(self, request: ExecutionRequest) -> None:
        self._command(request)

    async def execute(
        self,
        request: ExecutionRequest,
        workdir: Path | None,
        access: WorkspaceAccess | None = None,
    ) -> AsyncGenerator[ExecutionEvent, None]:
        """Run ``request`` as a host process (contract: :mod:`backends.base`)."""
        await self._check_request(request)
        argv, stdin = self._command(request)
        run = self._registry.admit(request.exec_id)
        started = time.monotonic()
        scratch: Path | None = None
        group: RunCgroup | None = None
        proc: asyncio.subprocess.Process | None = None
        try:
            if self._confine:
                argv, cwd, env, group = await self._confined(request, workdir, argv)
            else:
                if workdir is None:
                    workdir = scratch = Path(tempfile.mkdtemp(prefix="agora-exec-"))
                cwd = _working_dir(workdir, request.effective_cwd)
                env = self._environment(request, str(cwd))
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
                exited.add_done_callback(lambda _: _reaped(proc, run, group))
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
                oom = group is not None and group.memory_exceeded()
                result = self._result(request, run, proc.returncode, channel, started, oom)
        finally:
            done = _cleanup_now(proc, scratch)
            if done and group is not None and not group.try_remove():
                # Killed, but the PID namespace is still being torn down: the empty group
                # goes a moment later, without holding the result back.
                self._registry.spawn(asyncio.to_thread(group.remove))
            await self._registry.close_run(run, None if done else _cleanup(proc, scratch, group))
        yield result

    # -- internals ---------------------------------------------------------------------------

    def _capabilities(self, *, network: bool) -> BackendCapabilities:
        languages = {ExecutionLanguage.COMMAND}
        if self._python:
            languages.add(ExecutionLanguage.PYTHON)
        if self._confine:
            confinement = self._confinement
            return BackendCapabilities(
                isolation=ExecutionIsolation.NAMESPACE,
                enforces_network=network,
                enforces_filesystem=True,
                enforces_environment=True,
                enforces_timeout=True,
                enforces_memory=confinement.memory,
                enforces_pids=confinement.pids,
                enforces_cpu=confinement.cpu,
                supports_structured_output=bool(self._python),
                supports_process_execution=True,
                languages=frozenset(languages),
                filesystem_modes=CONFINED_MODES,
                value_from_stdout=True,
            )
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

    async def _confined(
        self, request: ExecutionRequest, workdir: Path | None, command: list[str]
    ) -> tuple[list[str], Path, dict[str, str], RunCgroup | None]:
        """``(argv, host cwd, env, cgroup)`` that run ``command`` confined for ``request``:
        the launcher (cgroup join, rlimits) and ``bwrap`` in front of it. Raises
        :class:`InvalidRequest` for a filesystem path that leads out of the workspace."""
        confinement = self._confinement
        policy = request.policy
        mounts, cwd = await asyncio.to_thread(
            workspace_mounts,
            workdir,
            policy.filesystem,
            request.effective_cwd,
            writable=self._access == "read-write",
        )
        box = Sandbox(mounts=mounts, cwd=cwd, network=policy.network == "enabled")
        memory = policy.memory_bytes or self._max_memory
        limits = RunLimits(
            memory_bytes=memory,
            pids=policy.pids or self._max_pids,
            cpus=policy.cpus,
        )
        group: RunCgroup | None = None
        if confinement.cgroups is not None:
            try:
                group = confinement.cgroups.create(limits)
            except OSError as e:
                raise ExecutionFailed(f"creating the run's cgroup failed: {e}") from e
        launcher = launcher_argv(
            SHELL,
            group.procs_files if group is not None else (),
            open_files=self._max_open_files,
            file_blocks=max(1, self._max_file_bytes // confinement.file_block),
            memory_kib=memory // 1024 if group is None or group.memory is None else None,
        )
        argv = launcher + bwrap_argv(confinement.bwrap, confinement.view, box, command)
        return argv, Path("/"), self._environment(request, cwd), group

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
        if self._confine:
            # Looked up inside the sandbox: a shell says "not found" (127) as a host spawn would.
            return [SHELL, "-c", 'exec "$@"', "sh", *request.argv], stdin
        return list(request.argv), stdin

    def _environment(self, request: ExecutionRequest, cwd: str) -> dict[str, str]:
        env = {"PATH": self._path, "HOME": cwd, "LANG": "C.UTF-8"}
        env.update(request.env)  # validated: every name is in the policy's allow-list
        return env

    async def _terminate(self, proc: asyncio.subprocess.Process, run: Run) -> None:
        """On timeout or cancel: SIGTERM the program (confined: every process of its sandbox,
        bwrap aside, which would otherwise kill them at once), then SIGKILL after the grace
        period (confined: bwrap, which takes the PID namespace down with it)."""
        if self._confine:
            for pid in _sandboxed(proc.pid):
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.kill(pid, signal.SIGTERM)
        else:
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
        memory_exceeded: bool = False,
    ) -> ExecutionResult:
        return captured_result(
            channel,
            classify(
                signal_exit_code(returncode),
                cancelled=run.cancelled,
                timed_out=run.timed_out,
                memory_exceeded=memory_exceeded,
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


async def _cleanup(
    proc: asyncio.subprocess.Process | None, scratch: Path | None, group: RunCgroup | None
) -> None:
    """Kill whatever is left of the run's process group (and cgroup), reap it, drop the
    scratch dir and the cgroup."""
    if proc is not None and proc.returncode is None:
        # Not reaped yet (the run was cancelled or failed mid-way): kill the group.
        _kill_group(proc.pid, signal.SIGKILL)
        if group is not None:
            group.kill()
        await proc.wait()
    if group is not None:
        await asyncio.to_thread(group.remove)
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


def _reaped(proc: asyncio.subprocess.Process, run: Run, group: RunCgroup | None) -> None:
    """The main process exited: kill what it left in its group and cgroup (so the pipes close
    and nothing outlives the run), and mark the run as gone."""
    _kill_group(proc.pid, signal.SIGKILL)
    if group is not None:
        group.kill()
    run.exited.set()


def _sandboxed(bwrap_pid: int) -> list[int]:
    """The processes of a confined run: every descendant of ``bwrap_pid`` but bwrap's own
    (its direct children: the PID namespace's init). Reparented orphans (``setsid``, double
    fork) are the init's children, so they are found too."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses.
        fields = stat[stat.rfind(")") + 2 :].split()
        if len(fields) > 1 and fields[1].isdigit():
            children.setdefault(int(fields[1]), []).append(int(entry))
    found: list[int] = []
    frontier = [
        grandchild
        for child in children.get(bwrap_pid, [])
        for grandchild in children.get(child, [])
    ]
    while frontier:
        pid = frontier.pop()
        found.append(pid)
        frontier.extend(children.get(pid, []))
    return found
