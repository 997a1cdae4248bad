"""The ``container`` backend: one fresh Docker container per execution (``containerEphemeral``).

Talks to Docker Engine through the ``docker`` SDK. The SDK is blocking, so every engine call
runs in the backend's own bounded thread pool (never on the event loop); the container's
output is read on the loop itself, from the attach socket handed to asyncio.

Each execution gets a container of the locally built image (default ``agora/busybox:1``, see
:mod:`backends.container.images`; nothing is ever pulled) with:

* network mode ``none`` unless the policy enables the network (then ``network_enabled_mode``,
  default ``bridge``);
* memory (and memory+swap, so no swap), pids and cpu limits from the policy;
* a read-only root filesystem, a ``tmpfs`` on ``/tmp``, a non-root user (``65534:65534`` by
  default), all capabilities dropped, ``no-new-privileges``, no log driver (output is streamed,
  never written to the engine's disk);
* the workspace bind-mounted at ``/workspace`` read-only or read-write per the policy (or only
  the listed ``paths``), the working directory ``/workspace/<cwd>`` (``/tmp`` without a
  workspace), and environment variables with the request's explicit values only;
* the labels ``agora.exec=<execId>``, ``agora.owner=<owner>``, ``agora.backend=<name>``.

Timeout and cancel kill **the container** (SIGKILL through the engine), not just a client
connection. Containers are always removed: at the end of the run, when the run fails or is
cancelled (shielded cleanup), and — for anything a crashed hub left behind — by :meth:`sweep`
at :meth:`ContainerBackend.start`, which removes every container labelled with this owner.

Warm pool (``warm_pool`` containers, default 2). Creating and starting a container costs most of
a run's latency (create ≈ 30 ms, start ≈ 150-350 ms here). The pool keeps containers already
*started* but idle: their command is a small launcher blocked reading one line from stdin.
A request takes one only if it needs nothing a container fixes at creation that differs from
the pool's: filesystem ``none`` (no workspace mount — mounts are fixed at creation), network
disabled, the instance's default memory/pids/cpu, and a command with a small source. The
backend then attaches, sends one base64 line (``cd``, ``export`` of the request's variables,
``exec /bin/sh -c SOURCE``) and the request's stdin; the launcher ``exec``s the program, which
becomes the container's pid 1 exactly as in a cold start. Isolation is unchanged: every
container still runs exactly one execution and is removed after it; nothing but our launcher
ran in it before. Runs with a workspace mount always start a fresh container.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import functools
import logging
import os
import shutil
import socket
import tempfile
import time
from collections.abc import AsyncGenerator, Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

from backends.access import Access, WorkspaceAccess, workspace_filesystem
from backends.captured import captured_result
from backends.container.attach import pump, write_stdin
from backends.container.engine import connect_engine, map_engine_error, owner_label, probe_image
from backends.container.images import DEFAULT_IMAGE, build_busybox_image, image_is_current
from backends.container.mounts import workspace_mounts
from backends.container.spec import (
    DEFAULT_CONTAINER_POLICY,
    LABEL_BACKEND,
    LABEL_EXEC,
    LABEL_OWNER,
    LABEL_POOL,
    LABEL_WORKER,
    LAUNCHER,
    READ_SIZE,
    SCRATCH,
    WARM_MAX_PRELUDE,
    base_environment,
    command_for,
    container_config,
    environment_for,
    warm_prelude,
    working_dir_for,
)
from backends.lifecycle import BackendLifecycle, elapsed_ms
from backends.output import OutputChannel
from backends.runs import Run, RunRegistry, TaskSet
from backends.threads import DaemonThreadPool
from hub.core.execution.capabilities import (
    BackendCapabilities,
    ExecutionIsolation,
    ExecutionLanguage,
)
from hub.core.execution.errors import (
    BackendUnavailable,
    ExecutionError,
    InvalidRequest,
    SandboxError,
)
from hub.core.execution.policy import SandboxPolicy
from hub.core.execution.request import ExecutionRequest
from hub.core.execution.result import Diagnostic, ExecutionEvent, ExecutionResult, classify

__all__ = ["ContainerBackend"]

log = logging.getLogger(__name__)
T = TypeVar("T")


class _Box:
    """What one execution holds in the engine (all released by the cleanup)."""

    __slots__ = ("cid", "create", "exec_id", "release", "scratch", "warm", "writer")

    def __init__(self, exec_id: str) -> None:
        self.exec_id = exec_id
        self.release: asyncio.Task[None] | None = None
        self.cid: str | None = None
        self.create: asyncio.Future[str] | None = None
        self.writer: asyncio.StreamWriter | None = None
        self.scratch: Path | None = None
        self.warm = False


class ContainerBackend(BackendLifecycle):
    """Runs each execution in a fresh Docker container (see the module docstring).

    ``policy``: the instance's default (widest) policy; if omitted,
    :data:`DEFAULT_CONTAINER_POLICY` with the workspace mounted per ``access`` (``read``:
    read-only, ``read-write``). ``base_url``: the engine (default: ``DOCKER_HOST`` or the local
    socket).
    ``user``: ``uid:gid`` inside the container (default ``65534:65534`` when the hub runs as
    root, else the hub's own ids so the workspace stays writable). ``owner``: the label value
    :meth:`sweep` removes by — give each hub node sharing an engine its own; by default
    derived from ``data_dir`` (:func:`~backends.container.engine.owner_label`: one per hub data
    directory), else ``agora``. ``worker``/``workers``: this process is worker ``worker`` of
    ``agora serve --workers <workers>`` on that data directory (the registry passes both):
    its containers also carry ``agora.worker=<worker>`` and its :meth:`sweep` leaves the
    other workers' alone. ``warm_pool``:
    idle started containers kept ready (0 disables). ``auto_build``: build the default image
    at start when it is missing or stale.
    """

    def __init__(
        self,
        name: str = "container",
        *,
        policy: SandboxPolicy | None = None,
        access: Access = "read-write",
        image: str = DEFAULT_IMAGE,
        base_url: str | None = None,
        user: str | None = None,
        owner: str | None = None,
        data_dir: Path | None = None,
        warm_pool: int = 2,
        max_concurrent: int = 24,
        network_enabled_mode: str = "bridge",
        tmpfs_size: str = "64m",
        auto_build: bool = True,
        engine_timeout_s: float = 60.0,
        worker: int | None = None,
        workers: int = 1,
    ) -> None:
        self._name = name
        self._policy = (
            policy
            if policy is not None
            else DEFAULT_CONTAINER_POLICY.replace(filesystem=workspace_filesystem(access))
        )
        self._image = image
        self._base_url = base_url
        if user is None:
            user = "65534:65534" if os.geteuid() == 0 else f"{os.getuid()}:{os.getgid()}"
        self._user = user
        self._uid, self._gid = (int(part) for part in user.split(":", 1))
        if owner is None:
            owner = owner_label(data_dir) if data_dir is not None else "agora"
        self._owner = owner
        self._worker = worker
        self._workers = workers
        self._warm_size = max(0, warm_pool)
        self._network_enabled_mode = network_enabled_mode
        self._tmpfs_size = tmpfs_size
        self._auto_build = auto_build
        self._engine_timeout_s = engine_timeout_s
        self._registry = RunRegistry(name, max_concurrent)
        # Each running execution holds one thread in a blocking ``wait``; the rest is headroom
        # for short calls (create, start, kill, remove) and the warm pool.
        self._threads = 2 * max_concurrent + 4
        # Daemon threads: a call blocked on a hung engine does not hold the process's exit.
        self._executor = DaemonThreadPool(self._threads, thread_name_prefix=f"agora-{name}")
        self._pending: set[asyncio.Future[Any]] = set()  # engine calls under way (abandon)
        self._abandoned = False
        self._client: Any = None
        self._state: tuple[bool, str] = (False, "not started")
        self._idle: collections.deque[str] = collections.deque()
        self._boxes: dict[str, _Box] = {}
        self._filling = False
        self._caps = BackendCapabilities(
            isolation=ExecutionIsolation.CONTAINER_EPHEMERAL,
            enforces_network=True,
            enforces_filesystem=True,
            enforces_environment=True,
            enforces_timeout=True,
            enforces_memory=True,
            enforces_pids=True,
            enforces_cpu=True,
            supports_structured_output=False,
            supports_process_execution=True,
            languages=frozenset({ExecutionLanguage.COMMAND}),
            filesystem_modes=frozenset(
                {"none", "workspaceReadOnly", "workspaceReadWrite", "paths"}
            ),
            pooled=self._warm_size > 0,
        )

    # -- CodeExecutor (the rest: BackendLifecycle) ----------------------------------------

    @property
    def owner(self) -> str:
        """The ``agora.owner`` label of this instance's containers (what :meth:`sweep` removes)."""
        return self._owner

    @property
    def image(self) -> str:
        return self._image

    def _readiness(self) -> tuple[bool, str]:
        return self._state

    async def _start(self) -> None:
        """Connect to the engine, make sure the image is there (building it if allowed),
        sweep leftovers of this owner, and start filling the warm pool. On failure
        :meth:`available` says why (it does not raise)."""
        try:
            self._client = await self._call(
                connect_engine, self._base_url, self._engine_timeout_s, self._threads
            )
            await self._ensure_image()
            removed = await self.sweep()
            if removed:
                log.info("%s: removed %d leftover containers", self._name, removed)
        except ExecutionError as e:
            self._state = (False, e.message)
            log.warning("%s backend unavailable: %s", self._name, e.message)
            return
        self._state = (True, "")
        self._schedule_fill()

    async def aclose(self) -> None:
        """Stop running executions, remove them and the idle warm containers, close the
        engine connection. Idempotent."""
        await self._registry.aclose()
        # Runs whose consumer has not closed its stream yet: their containers are dead (the
        # registry stopped them) but not removed — remove them now, not when the consumer
        # comes back (the engine connection is about to go).
        for box in list(self._boxes.values()):
            await self._release(box)
        idle = list(self._idle)
        self._idle.clear()
        for cid in idle:
            with contextlib.suppress(ExecutionError):
                await self._remove(cid)
        if self._client is not None:
            client, self._client = self._client, None
            with contextlib.suppress(Exception):
                await self._call(client.close)
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def probe(self) -> tuple[bool, str]:
        """Whether the engine answers and has the image (or will build it at start); sweeps
        and starts nothing, so it is safe beside a running hub."""
        return await asyncio.to_thread(
            probe_image, self._base_url, self._image, auto_build=self._auto_build
        )

    async def sweep(self) -> int:
        """Remove the containers labelled ``agora.owner=<owner>`` that are this process's to
        remove (leftovers of a crashed hub, stale warm containers): all of them for a hub of
        one process; for worker ``i`` of ``--workers N``, those labelled ``agora.worker=i``
        — worker 0 also takes the ones no running worker can claim (no worker label: a hub
        of one process before; an index of ``N`` or more: a start with more workers). Never
        another live worker's: its running executions would die. Returns how many were
        removed. Not to be called while this backend runs executions."""
        api = self._api()
        found = await self._call(
            api.containers, all=True, filters={"label": f"{LABEL_OWNER}={self._owner}"}
        )
        mine = [item["Id"] for item in found if self._sweeps(item.get("Labels") or {})]
        for cid in mine:
            await self._remove(cid)
        return len(mine)

    def _sweeps(self, labels: Mapping[str, str]) -> bool:
        """Whether :meth:`sweep` removes a container of this owner with ``labels``."""
        if self._worker is None:
            return True
        index = labels.get(LABEL_WORKER, "")
        if index == str(self._worker):
            return True
        orphan = not index.isdigit() or int(index) >= self._workers
        return self._worker == 0 and orphan

    async def _validate(self, request: ExecutionRequest) -> None:
        command_for(request)

    async def execute(
        self,
        request: ExecutionRequest,
        workdir: Path | None,
        access: WorkspaceAccess | None = None,
    ) -> AsyncGenerator[ExecutionEvent, None]:
        """Run ``request`` in a fresh container (contract: :mod:`backends.base`)."""
        await self._check_request(request)
        command = command_for(request)
        stdin = request.stdin
        run = self._registry.admit(request.exec_id)
        box = self._boxes[request.exec_id] = _Box(request.exec_id)
        started = time.monotonic()
        try:
            reader = await self._open(request, command, workdir, box)
            channel = OutputChannel(request.effective_max_stdout, request.effective_max_stderr)
            tasks = TaskSet()
            try:
                tasks.create_task(pump(reader, channel))
                assert box.cid is not None and box.writer is not None
                if box.warm:
                    payload = warm_prelude(command, request.env, working_dir_for(request)) + (
                        stdin or b""
                    )
                    tasks.create_task(write_stdin(box.writer, payload))
                elif stdin is not None:
                    tasks.create_task(write_stdin(box.writer, stdin))
                waiter = tasks.create_task(self._wait(box.cid, run, request))
                tasks.create_task(self._stopper(box.cid, run, request))
                while (chunk := await channel.get()) is not None:
                    yield chunk
                exit_code, oom = await waiter
                failure = tasks.failure()
                if failure is not None:
                    raise map_engine_error(
                        failure if isinstance(failure, Exception) else RuntimeError(failure),
                        "streaming the container's output",
                    ) from failure
            finally:
                await tasks.aclose()
            result = self._result(request, run, box, exit_code, oom, channel, started)
        finally:
            await self._registry.close_run(run, self._release(box))
        yield result

    # -- engine calls (each in the backend's thread pool) ---------------------------------------

    def _api(self) -> Any:
        if self._client is None:
            raise BackendUnavailable(f"backend {self._name!r} is not connected")
        return self._client.api

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        """``fn(*args, **kwargs)`` in the thread pool, engine errors mapped once."""
        try:
            return await self._engine(functools.partial(fn, *args, **kwargs))
        except Exception as e:
            raise map_engine_error(e, getattr(fn, "__name__", "engine call")) from e

    def _submit(self, fn: Callable[[], T]) -> asyncio.Future[T]:
        """``fn()`` in the thread pool, tracked until done so :meth:`abandon` can stop the
        wait for it; refused once abandoned."""
        if self._abandoned:
            raise BackendUnavailable(
                f"backend {self._name!r} was abandoned by the hub's stop (the engine hung)"
            )
        future = asyncio.get_running_loop().run_in_executor(self._executor, fn)
        self._pending.add(future)
        future.add_done_callback(self._pending.discard)
        return future

    async def _engine(self, fn: Callable[[], T]) -> T:
        """Await ``fn()`` in the thread pool (see :meth:`_answer`)."""
        return await self._answer(self._submit(fn))

    async def _answer(self, future: asyncio.Future[T]) -> T:
        """Await an engine call; :class:`BackendUnavailable` if :meth:`abandon` stopped the
        wait. A cancellation of the awaiting task itself (which cancels the future it awaits
        too, hence ``cancelling()``) stays a cancellation."""
        try:
            return await future
        except asyncio.CancelledError:
            task = asyncio.current_task()
            ours = task is not None and task.cancelling() > 0
            if self._abandoned and future.cancelled() and not ours:
                raise BackendUnavailable(
                    f"backend {self._name!r}: the engine did not answer before the hub "
                    "stopped waiting for it"
                ) from None
            raise

    def abandon(self) -> None:
        """Stop waiting for the engine: every call under way fails at once, and every later
        one (see :meth:`CodeExecutor.abandon <backends.base.CodeExecutor.abandon>`), and the
        runs' attach sockets are cut, so their output ends. The threads blocked in those
        calls are daemons (:mod:`backends.threads`): they do not hold the process's exit.
        The containers left are the next start's sweep's."""
        self._abandoned = True
        for future in list(self._pending):
            future.cancel()
        for box in self._boxes.values():  # the output streams end: the runs finish now
            if box.writer is not None:
                box.writer.transport.abort()

    async def _ensure_image(self) -> None:
        client = self._client
        if await self._call(image_is_current, client, self._image):
            return
        if not self._auto_build:
            raise BackendUnavailable(
                f"image {self._image} is missing or stale: run `agora images build`"
            )
        log.info("%s: building image %s", self._name, self._image)
        await self._call(build_busybox_image, client, self._image)

    async def _remove(self, cid: str) -> None:
        """Force-remove a container (killing it if it runs); gone already is fine."""
        await self._settle("remove", lambda api: api.remove_container(cid, force=True, v=True))

    async def _kill(self, cid: str) -> None:
        """SIGKILL a container; gone or stopped already is fine."""
        await self._settle("kill", lambda api: api.kill(cid))

    async def _settle(self, what: str, call: Callable[[Any], object]) -> None:
        """``call(api)`` for an engine call that takes a container where it may be already:
        not found (404) and conflict (409: removal in progress, not running any more) are
        fine. ``what`` names the call in errors."""

        def settle() -> None:
            import docker.errors

            try:
                call(self._client.api)
            except docker.errors.NotFound:
                pass
            except docker.errors.APIError as e:
                if e.status_code != 409:
                    raise

        settle.__name__ = what
        await self._call(settle)

    async def _attach(
        self, cid: str, *, stdin: bool
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        """Attach to the container's stdio and hand the raw socket to asyncio."""
        api = self._api()
        params = {"stdin": int(stdin), "stdout": 1, "stderr": 1, "stream": 1}

        def attach() -> socket.socket:
            wrapped = api.attach_socket(cid, params=params)
            raw = getattr(wrapped, "_sock", wrapped)
            if not isinstance(raw, socket.socket) or hasattr(raw, "getpeercert"):
                wrapped.close()
                raise SandboxError(
                    "the container backend needs a local engine (unix socket or plain tcp)"
                )
            own = socket.socket(raw.family, raw.type, fileno=os.dup(raw.fileno()))
            wrapped.close()
            raw.close()
            own.setblocking(False)
            return own

        sock = await self._call(attach)
        try:
            return await asyncio.open_connection(sock=sock, limit=READ_SIZE)
        except BaseException:
            sock.close()
            raise

    # -- one execution --------------------------------------------------------------------------

    async def _open(
        self, request: ExecutionRequest, command: list[str], workdir: Path | None, box: _Box
    ) -> asyncio.StreamReader:
        """Get a container for ``request`` running and attached: a warm one if it fits, else a
        fresh one. Fills ``box``; returns the output reader."""
        if self._fits_warm_pool(request, command):
            while self._idle:
                box.cid = self._idle.popleft()
                self._schedule_fill()
                try:
                    reader, box.writer = await self._attach(box.cid, stdin=True)
                except ExecutionError as e:
                    log.info("%s: warm container %s unusable (%s)", self._name, box.cid[:12], e)
                    cid, box.cid = box.cid, None
                    with contextlib.suppress(ExecutionError):
                        await self._remove(cid)
                    continue
                box.warm = True
                return reader
        mounts, working_dir = await self._prepare_workspace(request, workdir, box)
        policy = request.policy
        config = container_config(
            image=self._image,
            command=command,
            user=self._user,
            env=environment_for(request),
            working_dir=working_dir,
            labels=self._labels(request.exec_id),
            network_mode=self._network_mode(policy),
            memory_bytes=policy.memory_bytes,
            pids=policy.pids,
            cpus=policy.cpus,
            mounts=mounts,
            stdin=request.stdin is not None,
            tmpfs_size=self._tmpfs_size,
        )
        api = self._api()
        # Kept in the box: if we are cancelled while the engine creates it, the cleanup waits
        # for the id and removes the container anyway.
        box.create = self._submit(lambda: str(api.create_container_from_config(config)["Id"]))
        try:
            box.cid = await self._answer(box.create)
        except Exception as e:
            raise map_engine_error(e, "creating the container") from e
        reader, box.writer = await self._attach(box.cid, stdin=request.stdin is not None)
        await self._call(api.start, box.cid)
        return reader

    def _fits_warm_pool(self, request: ExecutionRequest, command: list[str]) -> bool:
        policy = request.policy
        return (
            self._warm_size > 0
            and request.language == ExecutionLanguage.COMMAND
            and request.effective_cwd == "."
            and policy.filesystem.mode == "none"
            and policy.network == "disabled"
            and policy.memory_bytes == self._policy.memory_bytes
            and policy.pids == self._policy.pids
            and policy.cpus == self._policy.cpus
            and sum(len(arg) for arg in command) + sum(len(v) for v in request.env.values())
            <= WARM_MAX_PRELUDE // 2
        )

    async def _prepare_workspace(
        self, request: ExecutionRequest, workdir: Path | None, box: _Box
    ) -> tuple[list[dict[str, Any]], str]:
        """The bind mounts and the in-container working directory for ``request``."""
        fs = request.policy.filesystem
        cwd = request.effective_cwd
        if not fs.mounts_workspace:
            if cwd != ".":
                raise InvalidRequest(
                    "cwd needs a workspace, but the filesystem policy is 'none'", field="cwd"
                )
            return [], SCRATCH
        if workdir is None:
            workdir = box.scratch = Path(await self._call(tempfile.mkdtemp, prefix="agora-exec-"))
        return await self._call(workspace_mounts, workdir, fs, cwd, self._uid, self._gid)

    async def _wait(self, cid: str, run: Run, request: ExecutionRequest) -> tuple[int | None, bool]:
        """Wait for the container to exit: ``(exit code, killed for memory)``. Sets
        ``run.exited``."""
        api = self._api()
        bound = request.effective_timeout_ms / 1000 + 60
        try:
            status = await self._call(api.wait, cid, timeout=bound)
            code = status.get("StatusCode")
            oom = False
            if code not in (0, None) and run.stop_reason is None:
                state = (await self._call(api.inspect_container, cid)).get("State") or {}
                oom = bool(state.get("OOMKilled"))
            return (int(code) if code is not None else None), oom
        finally:
            run.exited.set()

    async def _stopper(self, cid: str, run: Run, request: ExecutionRequest) -> None:
        """On timeout or cancel, kill the container (SIGKILL through the engine)."""
        if await run.wait_stop(request.effective_timeout_ms / 1000) is None:
            return
        await self._kill(cid)

    def _release(self, box: _Box) -> asyncio.Task[None]:
        """The one task that releases ``box`` (shared by the run's cleanup and aclose)."""
        if box.release is None:
            box.release = self._registry.spawn(self._release_box(box))
        return box.release

    async def _release_box(self, box: _Box) -> None:
        """Remove everything a run holds: socket, container (even one still being created),
        scratch directory."""
        try:
            if box.writer is not None:
                # abort, not close: a graceful close would wait to flush stdin the program
                # never read, which the engine no longer takes once the container is gone.
                box.writer.transport.abort()
                with contextlib.suppress(Exception):
                    await box.writer.wait_closed()
            if box.cid is None and box.create is not None:
                await asyncio.wait({box.create})  # (abandoned: cancelled, no id to remove)
                created = box.create
                if not created.cancelled() and created.exception() is None:
                    box.cid = created.result()
            if box.cid is not None:
                try:
                    await self._remove(box.cid)
                except ExecutionError as e:
                    log.warning(
                        "%s: could not remove container %s (sweep() will): %s",
                        self._name,
                        box.cid[:12],
                        e.message,
                    )
            if box.scratch is not None:
                # A local directory: not the engine's pool, so done even once abandoned.
                await asyncio.to_thread(shutil.rmtree, box.scratch, True)
        finally:
            if self._boxes.get(box.exec_id) is box:
                del self._boxes[box.exec_id]

    def _result(
        self,
        request: ExecutionRequest,
        run: Run,
        box: _Box,
        exit_code: int | None,
        oom: bool,
        channel: OutputChannel,
        started: float,
    ) -> ExecutionResult:
        notes = run.stop_notes(request.effective_timeout_ms, "the container was killed")
        if oom:
            notes.append(
                Diagnostic(
                    level="error",
                    code="memoryLimit",
                    message="killed by the kernel: memory limit of "
                    f"{request.policy.memory_bytes} bytes exceeded",
                )
            )
        elif run.stop_reason is None and exit_code == 137:
            notes.append(Diagnostic(message="the program was killed by SIGKILL (exit 137)"))
        return captured_result(
            channel,
            classify(
                exit_code, cancelled=run.cancelled, timed_out=run.timed_out, memory_exceeded=oom
            ),
            duration_ms=elapsed_ms(started),
            metadata=self._metadata(request, image=self._image, warm=box.warm),
            notes=notes,
        )

    # -- the warm pool ------------------------------------------------------------------------

    async def wait_warm(self, timeout_s: float = 30.0) -> bool:
        """Wait until the warm pool is full (for benchmarks and tests); False on timeout."""
        self._schedule_fill()
        deadline = time.monotonic() + timeout_s
        while len(self._idle) < self._warm_size:
            if time.monotonic() >= deadline or not self._state[0]:
                return False
            await asyncio.sleep(0.01)
        return True

    def _schedule_fill(self) -> None:
        """Start refilling the pool in the background unless it is full or filling."""
        if (
            self._warm_size
            and not self._filling
            and not self._registry.closed
            and self._state[0]
            and len(self._idle) < self._warm_size
        ):
            self._filling = True
            self._registry.spawn(self._fill())

    async def _fill(self) -> None:
        """Start warm containers until the pool is full (owned by the registry)."""
        try:
            while len(self._idle) < self._warm_size and not self._registry.closed:
                cid = await self._start_warm()
                if self._registry.closed:
                    await self._remove(cid)
                    return
                self._idle.append(cid)
        except ExecutionError as e:
            log.warning("%s: warm pool not refilled: %s", self._name, e.message)
        finally:
            self._filling = False

    async def _start_warm(self) -> str:
        policy = self._policy
        config = container_config(
            image=self._image,
            command=["/bin/sh", "-c", LAUNCHER],
            user=self._user,
            env=base_environment(),
            working_dir=SCRATCH,
            labels={**self._owned(), LABEL_POOL: "1"},
            network_mode="none",
            memory_bytes=policy.memory_bytes,
            pids=policy.pids,
            cpus=policy.cpus,
            mounts=[],
            stdin=True,
            tmpfs_size=self._tmpfs_size,
        )
        api = self._api()
        cid = str((await self._call(api.create_container_from_config, config))["Id"])
        try:
            await self._call(api.start, cid)
        except BaseException:
            with contextlib.suppress(ExecutionError):
                await self._remove(cid)
            raise
        return cid

    # -- helpers --------------------------------------------------------------------------------

    def _labels(self, exec_id: str) -> dict[str, str]:
        return {LABEL_EXEC: exec_id, **self._owned()}

    def _owned(self) -> dict[str, str]:
        """The labels :meth:`sweep` goes by, on every container of this backend."""
        labels = {LABEL_OWNER: self._owner, LABEL_BACKEND: self._name}
        if self._worker is not None:
            labels[LABEL_WORKER] = str(self._worker)
        return labels

    def _network_mode(self, policy: SandboxPolicy) -> str:
        return "none" if policy.network == "disabled" else self._network_enabled_mode
