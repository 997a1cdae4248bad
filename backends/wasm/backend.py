"""The ``wasm`` backend: WASI preview 1 modules on wasmtime, in-process (isolation ``inProcess``).

What it runs: a guest module (``language: wasm``) given as bytes (:class:`GuestModule`) or by
the sha256 of a blob (:class:`ModuleBlob`); its ``_start`` export is called (a WASI command).

* **Payload.** Bytes are checked by :func:`validate_wasm_bytes` (at most ``max_module_bytes``,
  at least 8 bytes, the ``\\0asm`` magic) before anything is compiled. A blob hash is resolved by
  the backend itself, through the ``blobs`` object it was built with (anything with
  ``async get(sha256) -> bytes``, e.g. :class:`hub.log.blobs.FileBlobStore`); the bytes are
  checked against the hash. A hash whose module is already compiled runs without a fetch (the
  cache is content-addressed). Without ``blobs``, a blob payload is refused
  (``invalidRequest``) unless it is cached.
* **Compilation cache.** Compiled modules are kept by sha256 in a bounded LRU
  (``cache_entries``); a second run of the same bytes skips compilation (``metadata.warm`` is
  true, :attr:`WasmBackend.cache` counts hits and misses). A module wasmtime rejects gives a
  ``failed/compileFailed`` result with wasmtime's message as the diagnostic; a module without a
  ``_start`` function is refused (``invalidCode``).
* **Harness contract** (adk-code's): ``input`` is written to stdin as one line of JSON when no
  ``stdin`` is given; when the last stdout line parses as JSON it is the result's ``value``.
  ``argv`` is ``["module.wasm", *argv]``; the environment holds only the request's variables
  (each allowed by the policy), never the hub's.
* **Limits, all enforced:**

  - *Timeout and cancel: epoch interruption.* One engine-wide ticker thread advances the epoch
    every ``tick_s`` (10 ms) while runs are active; each store's epoch-deadline callback traps
    the guest when its run is stopped (timeout, ``cancel``, closed stream) and otherwise lets it
    go on. Chosen over fuel: fuel instruments every basic block (slower code, and it is a
    budget of instructions, not time); epochs cost one check per loop header/function entry
    and give wall-clock deadlines. Everything WASI is wasmtime's own (``WasiConfig``) except
    ``poll_oneoff`` (``sleep``), replaced by an interruptible implementation
    (:mod:`backends.wasm.interrupt` says why: a guest blocked in wasmtime's host call never
    reaches an epoch check).
  - *Memory:* ``Store.set_limits(memory_size=policy.memoryBytes or max_memory_bytes)``: a
    ``memory.grow`` past it returns -1 to the guest; a module that needs more than the cap at
    instantiation fails at once. wasmtime's C API does not report a refused grow to the host,
    so a run that fails (trap or non-zero exit) with its memory within one eighth of the cap
    (at least 1 MiB) is reported as ``failed/memoryLimit``.
  - *Output:* each stream capped per the policy (kept bytes stream as chunks; bytes past the
    cap are dropped and counted; the guest never blocks on output).
  - *Filesystem:* only the workspace, through a WASI preopen: the policy's root (``workdir`` /
    root) as ``/workspace`` and the working directory as ``.``, writable only for
    ``workspaceReadWrite``. Mode ``none``: no preopen at all. ``paths`` and ``host`` are not
    offered (refused by ``validate_policy``).
  - *Network:* none (WASI preview 1 on wasmtime has no sockets unless inherited; never done).

* **Threads.** Compilation and the guest run on the backend's own thread pool
  (``max_concurrent`` threads): the event loop never blocks and the default executor is never
  starved by long guest runs.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import ctypes
import hashlib
import shutil
import tempfile
import time
from collections.abc import AsyncGenerator, Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import Final, Protocol

import msgspec
import wasmtime
from wasmtime import _ffi as wasm_ffi

from backends.access import Access, WorkspaceAccess, workspace_filesystem
from backends.captured import captured_result, not_run_result
from backends.lifecycle import BackendLifecycle, elapsed_ms
from backends.runs import Run, RunRegistry, TaskSet, wait_quietly
from backends.sink import ThreadedOutput
from backends.wasm.cache import MIB, Compiled, ModuleCache
from backends.wasm.interrupt import (
    NO_FINALIZER,
    THREAD,
    EpochTicker,
    Interrupted,
    RunControl,
    deadline_callback,
    poll_oneoff,
)
from hub.core.execution.capabilities import (
    BackendCapabilities,
    ExecutionIsolation,
    ExecutionLanguage,
)
from hub.core.execution.errors import CompileFailed, ExecutionFailed, InvalidCode, InvalidRequest
from hub.core.execution.policy import SandboxPolicy, strict
from hub.core.execution.request import ExecutionRequest, GuestModule, ModuleBlob
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
    "MAX_WASM_BYTES",
    "WASM_MAGIC",
    "BlobReader",
    "ModuleCache",
    "WasmBackend",
    "validate_wasm_bytes",
]

WASM_MAGIC: Final = b"\x00asm"
MAX_WASM_BYTES: Final = 64 * MIB
DEFAULT_MAX_MEMORY_BYTES: Final = 256 * MIB
WASM_PAGE: Final = 64 * 1024
GUEST_WORKSPACE: Final = "/workspace"
ARGV0: Final = "module.wasm"
_SHA256_HEX: Final = frozenset("0123456789abcdef")


def validate_wasm_bytes(data: bytes, *, max_bytes: int = MAX_WASM_BYTES) -> None:
    """Refuse what cannot be a WebAssembly binary module, before compiling anything.

    Checks (first failure wins): at most ``max_bytes``; at least 8 bytes (magic and version);
    the ``\\0asm`` magic. Raises :class:`InvalidCode` (``details['reason']``: ``tooLarge``,
    ``tooShort``, ``badMagic``).
    """
    if len(data) > max_bytes:
        raise InvalidCode(
            f"the wasm module is {len(data)} bytes; the limit is {max_bytes}",
            reason="tooLarge",
            size=len(data),
            limit=max_bytes,
        )
    if len(data) < 8:
        raise InvalidCode(
            f"the wasm module is {len(data)} bytes; a module has at least 8 (magic and version)",
            reason="tooShort",
            size=len(data),
        )
    if data[:4] != WASM_MAGIC:
        raise InvalidCode(
            "not a WebAssembly binary module (the \\0asm magic is missing)", reason="badMagic"
        )


class BlobReader(Protocol):
    """Where blob payloads come from (:class:`hub.log.blobs.FileBlobStore` fits)."""

    async def get(self, sha256: str) -> bytes:
        """The blob's bytes; raises (e.g. ``hub.core.errors.NotFound``) if there is none."""
        ...


# ---------------------------------------------------------------------------------------------
# One run, on a worker thread


@dataclass
class _Preopen:
    host: Path
    guest: str
    writable: bool


@dataclass
class _Spec:
    argv: list[str]
    env: dict[str, str]
    stdin: bytes | None
    preopens: list[_Preopen]
    memory_bytes: int


@dataclass
class _Outcome:
    exit_code: int | None = None
    trap: str | None = None
    instantiate_error: str | None = None
    memory_size: int = 0
    error: BaseException | None = None


def _run_sync(
    engine: wasmtime.Engine,
    compiled: Compiled,
    spec: _Spec,
    ctl: RunControl,
    sink: ThreadedOutput,
) -> _Outcome:
    """Instantiate and run ``_start`` (on a worker thread). Never raises."""
    outcome = _Outcome()
    THREAD.control = ctl
    try:
        store = wasmtime.Store(engine)
        store.set_limits(
            memory_size=spec.memory_bytes,
            table_elements=1_000_000,
            instances=4,
            tables=16,
            memories=4,
        )
        wasi = wasmtime.WasiConfig()
        wasi.argv = spec.argv
        wasi.env = list(spec.env.items())
        if spec.stdin:
            _set_stdin(wasi, spec.stdin)
        wasi.stdout_custom = lambda data: sink.feed("stdout", data)
        wasi.stderr_custom = lambda data: sink.feed("stderr", data)
        for preopen in spec.preopens:
            wasi.preopen_dir(str(preopen.host), preopen.guest, preopen.writable)
        store.set_wasi(wasi)
        ctl.wasi_started_ns = time.monotonic_ns()
        callback = deadline_callback(ctl)
        wasm_ffi.wasmtime_store_epoch_deadline_callback(store.ptr(), callback, None, NO_FINALIZER)
        store.set_epoch_deadline(1)
        instance: wasmtime.Instance | None = None
        try:
            instance = compiled.pre.instantiate(store)
        except (wasmtime.WasmtimeError, wasmtime.Trap) as e:
            if isinstance(e, wasmtime.ExitTrap):
                outcome.exit_code = e.code
            elif ctl.interrupted:
                outcome.trap = "interrupted"
            else:
                outcome.instantiate_error = _message(e)
        else:
            start = instance.exports(store).get("_start")
            try:
                assert isinstance(start, wasmtime.Func)
                start(store)
                outcome.exit_code = 0
            except wasmtime.ExitTrap as e:
                outcome.exit_code = e.code
            except Interrupted:
                outcome.trap = "interrupted"
            except (wasmtime.WasmtimeError, wasmtime.Trap) as e:
                outcome.trap = "interrupted" if ctl.interrupted else _message(e)
            memory = instance.exports(store).get("memory")
            if isinstance(memory, wasmtime.Memory):
                outcome.memory_size = memory.data_len(store)
        del callback  # only now: the store may call it until the run is over
    except BaseException as e:  # a bug or a wasmtime failure: reported by the caller
        outcome.error = e
    finally:
        THREAD.control = None
        sink.close()
    return outcome


def _set_stdin(wasi: wasmtime.WasiConfig, data: bytes) -> None:
    """Give the guest ``data`` as its stdin (an in-memory buffer; the C API takes the vector)."""
    vec = wasm_ffi.bytes_to_capi(data)
    wasm_ffi.wasi_config_set_stdin_bytes(wasi.ptr(), ctypes.byref(vec))


def _message(error: BaseException) -> str:
    """wasmtime's message without the backtrace noise: the innermost cause when there is one."""
    text = str(error).strip()
    if "Caused by:" in text:
        cause = text.split("Caused by:", 1)[1].strip()
        return cause.splitlines()[0].strip() if cause else text
    if isinstance(error, wasmtime.Trap):
        return text.splitlines()[-1].strip() if "wasm backtrace" in text else text
    return text


# ---------------------------------------------------------------------------------------------
# The backend


class WasmBackend(BackendLifecycle):
    """Runs WASI preview 1 modules on wasmtime (see the module docstring).

    ``access``: the instance's authority over the workspace (``read``: the preopen is never
    writable). ``policy``: the instance's default (widest) policy; default: :func:`strict`
    with the workspace per ``access`` and a ``max_memory_bytes`` memory cap. ``blobs``: where
    blob payloads are fetched from.
    """

    def __init__(
        self,
        name: str = "wasm",
        *,
        access: Access = "read-write",
        policy: SandboxPolicy | None = None,
        blobs: BlobReader | None = None,
        max_concurrent: int = 8,
        max_module_bytes: int = MAX_WASM_BYTES,
        max_memory_bytes: int = DEFAULT_MAX_MEMORY_BYTES,
        cache_entries: int = 64,
        tick_s: float = 0.01,
    ) -> None:
        fs = workspace_filesystem(access)
        self._name = name
        self._access = access
        self._policy = (
            policy
            if policy is not None
            else strict().replace(filesystem=fs, memory_bytes=max_memory_bytes)
        )
        self._blobs = blobs
        self._max_module_bytes = max_module_bytes
        self._max_memory_bytes = max_memory_bytes
        self._tick_s = tick_s
        self._registry = RunRegistry(name, max_concurrent)
        self._max_concurrent = max_concurrent
        self.cache = ModuleCache(max_entries=cache_entries)
        self._engine: wasmtime.Engine | None = None
        self._linker: wasmtime.Linker | None = None
        self._ticker: EpochTicker | None = None
        self._executor: concurrent.futures.ThreadPoolExecutor | None = None
        self._caps = BackendCapabilities(
            isolation=ExecutionIsolation.IN_PROCESS,
            enforces_network=True,
            enforces_filesystem=True,
            enforces_environment=True,
            enforces_timeout=True,
            enforces_memory=True,
            supports_structured_output=True,
            languages=frozenset({ExecutionLanguage.WASM}),
            filesystem_modes=frozenset({"none", "workspaceReadOnly", "workspaceReadWrite"}),
            value_from_stdout=True,
        )

    # -- CodeExecutor (the rest: BackendLifecycle) ----------------------------------------

    async def _start(self) -> None:
        """Create the engine, the linker and the worker threads."""
        if self._engine is not None or self._registry.closed:
            return
        config = wasmtime.Config()
        config.epoch_interruption = True
        engine = wasmtime.Engine(config)
        linker = wasmtime.Linker(engine)
        linker.define_wasi()
        linker.allow_shadowing = True
        i32 = wasmtime.ValType.i32()
        linker.define_func(
            "wasi_snapshot_preview1",
            "poll_oneoff",
            wasmtime.FuncType([i32, i32, i32, i32], [i32]),
            poll_oneoff,
            access_caller=True,
        )
        self._engine = engine
        self._linker = linker
        self._ticker = EpochTicker(engine, self._tick_s)
        self._executor = concurrent.futures.ThreadPoolExecutor(
            max_workers=self._max_concurrent, thread_name_prefix=f"agora-{self._name}"
        )

    async def aclose(self) -> None:
        """Stop every run, then the ticker and the threads; drop the cache. Idempotent."""
        await self._registry.aclose()
        ticker, self._ticker = self._ticker, None
        executor, self._executor = self._executor, None
        if ticker is not None:
            await asyncio.to_thread(ticker.close)
        if executor is not None:
            await asyncio.to_thread(executor.shutdown, True)
        self.cache.clear()

    async def _validate(self, request: ExecutionRequest) -> None:
        """The module must be there and compile: a module wasmtime rejects is refused here
        (``compileFailed``) rather than run into a ``failed`` result after the request is
        logged. The compiled module stays cached for the run."""
        sha256, data = await self._payload(request)
        _preopen_dirs(request, self._access)
        compiled, _warm, failure = await self._compiled(sha256, data)
        if compiled is None:
            raise CompileFailed(f"the wasm module does not compile: {failure}", backend=self._name)

    async def execute(
        self,
        request: ExecutionRequest,
        workdir: Path | None,
        access: WorkspaceAccess | None = None,
    ) -> AsyncGenerator[ExecutionEvent, None]:
        """Run ``request``'s module (contract: :mod:`backends.base`).

        Raises, before running anything: what :func:`validate_request` raises;
        :class:`InvalidCode` (not a wasm module, no ``_start``); :class:`InvalidRequest` (a blob
        that cannot be fetched or does not match its hash, a working directory outside the
        preopened root); ``Busy``; :class:`BackendUnavailable`.
        """
        await self._check_request(request)
        sha256, data = await self._payload(request)
        spec_cwd = _preopen_dirs(request, self._access)  # validates the paths before admitting
        run = self._registry.admit(request.exec_id)
        started = time.monotonic()
        scratch: Path | None = None
        future: asyncio.Future[_Outcome] | None = None
        ctl = RunControl()
        tasks = TaskSet()
        try:
            compiled, warm, failure = await self._compiled(sha256, data)
            if compiled is None:
                result = self._compile_failed(request, started, failure or "")
            else:
                if workdir is None and spec_cwd:
                    workdir = scratch = Path(tempfile.mkdtemp(prefix="agora-wasm-"))
                spec = self._spec(request, workdir, spec_cwd)
                sink = ThreadedOutput(request.effective_max_stdout, request.effective_max_stderr)
                assert self._engine is not None and self._executor is not None
                assert self._ticker is not None
                self._ticker.acquire()
                try:
                    loop = asyncio.get_running_loop()
                    future = loop.run_in_executor(
                        self._executor, _run_sync, self._engine, compiled, spec, ctl, sink
                    )
                    future.add_done_callback(lambda _f: sink.close())
                    tasks.create_task(self._stopper(run, ctl, request))
                    while (chunk := await sink.get()) is not None:
                        yield chunk
                    outcome = await future
                finally:
                    ctl.interrupt.set()
                    if future is not None and not future.done():
                        await self._registry.shielded(wait_quietly(future))
                    self._ticker.release()
                if outcome.error is not None:
                    raise ExecutionFailed(
                        f"wasmtime failed to run the module: {outcome.error!r}"
                    ) from outcome.error
                result = self._result(request, run, outcome, sink, started, warm, spec)
        finally:
            run.exited.set()  # the guest is gone; what is left is the scratch directory
            try:
                await tasks.aclose()
            finally:
                await self._registry.close_run(run, _remove_scratch(scratch))
        yield result

    # -- internals ---------------------------------------------------------------------------

    async def _payload(self, request: ExecutionRequest) -> tuple[str, bytes | None]:
        """``(sha256, bytes or None when the compiled module is cached)``."""
        payload = request.payload
        if isinstance(payload, GuestModule):
            validate_wasm_bytes(payload.data, max_bytes=self._max_module_bytes)
            return hashlib.sha256(payload.data).hexdigest(), payload.data
        if not isinstance(payload, ModuleBlob):  # pragma: no cover - validate_request refuses
            raise InvalidRequest("'wasm' runs a guest module", field="module")
        sha256 = payload.sha256
        if len(sha256) != 64 or not set(sha256) <= _SHA256_HEX:
            raise InvalidRequest("module blob must be a lowercase hex sha256", field="module")
        if sha256 in self.cache:
            return sha256, None
        if self._blobs is None:
            raise InvalidRequest(
                f"backend {self._name!r} has no blob store: send the module's bytes",
                field="module",
            )
        try:
            data = await self._blobs.get(sha256)
        except Exception as e:
            raise InvalidRequest(
                f"module blob {sha256} cannot be fetched: {e}", field="module", sha256=sha256
            ) from e
        if hashlib.sha256(data).hexdigest() != sha256:
            raise InvalidRequest(
                f"module blob {sha256} does not match its hash", field="module", sha256=sha256
            )
        validate_wasm_bytes(data, max_bytes=self._max_module_bytes)
        return sha256, data

    async def _compiled(
        self, sha256: str, data: bytes | None
    ) -> tuple[Compiled | None, bool, str | None]:
        """``(compiled, warm, compile error)`` from the cache, or compiled on a worker thread."""
        cached = self.cache.get(sha256)
        if cached is not None:
            self.cache.hits += 1
            return cached, True, None
        pending = self.cache._pending.get(sha256)
        if pending is not None:
            try:
                return await asyncio.shield(pending), True, None
            except InvalidCode:
                raise
            except Exception as e:
                return None, False, str(e)
        if data is None:  # evicted between the check and now: cannot happen on one loop
            raise InvalidRequest("module blob is no longer cached; send it again", field="module")
        self.cache.misses += 1
        loop = asyncio.get_running_loop()
        assert self._executor is not None
        future = loop.run_in_executor(self._executor, self._compile_sync, data)
        self.cache._pending[sha256] = future
        try:
            compiled = await asyncio.shield(future)
        except InvalidCode:
            raise
        except wasmtime.WasmtimeError as e:
            return None, False, _message(e)
        finally:
            self.cache._pending.pop(sha256, None)
        self.cache.put(sha256, compiled)
        return compiled, False, None

    def _compile_sync(self, data: bytes) -> Compiled:
        assert self._engine is not None and self._linker is not None
        began = time.perf_counter()
        module = wasmtime.Module(self._engine, data)
        start = next((e for e in module.exports if e.name == "_start"), None)
        if start is None or not isinstance(start.type, wasmtime.FuncType):
            raise InvalidCode(
                "the module has no '_start' function: only WASI commands run here",
                reason="noStart",
            )
        pre = self._linker.instantiate_pre(module)
        self.cache.compile_ms_total += (time.perf_counter() - began) * 1000
        return Compiled(module=module, pre=pre, size=len(data))

    def _spec(
        self, request: ExecutionRequest, workdir: Path | None, dirs: list[tuple[str, str, bool]]
    ) -> _Spec:
        stdin = request.stdin
        if stdin is None and request.has_input:
            stdin = msgspec.json.encode(request.input) + b"\n"
        preopens: list[_Preopen] = []
        if dirs:
            assert workdir is not None
            for relative, guest, writable in dirs:
                host = workdir if relative == "." else workdir / relative
                try:
                    host.mkdir(parents=True, exist_ok=True)
                except OSError as e:
                    raise InvalidRequest(
                        f"workspace directory {relative!r} is not usable: {e}", field="filesystem"
                    ) from e
                preopens.append(_Preopen(host=host, guest=guest, writable=writable))
        memory = request.policy.memory_bytes or self._max_memory_bytes
        return _Spec(
            argv=[ARGV0, *request.argv],
            env=dict(request.env),
            stdin=stdin,
            preopens=preopens,
            memory_bytes=min(memory, self._max_memory_bytes),
        )

    async def _stopper(self, run: Run, ctl: RunControl, request: ExecutionRequest) -> None:
        if await run.wait_stop(request.effective_timeout_ms / 1000) is not None:
            ctl.interrupt.set()

    def _result(
        self,
        request: ExecutionRequest,
        run: Run,
        outcome: _Outcome,
        sink: ThreadedOutput,
        started: float,
        warm: bool,
        spec: _Spec,
    ) -> ExecutionResult:
        notes: list[Diagnostic] = []
        status: ExecutionStatus
        reason: ExecutionReason
        memory_hit = False
        if outcome.instantiate_error is not None:
            text = outcome.instantiate_error
            memory_hit = "memory" in text and "limit" in text
            notes.append(
                Diagnostic(
                    level="error",
                    code="memoryLimit" if memory_hit else "instantiate",
                    message=f"the module could not be instantiated: {outcome.instantiate_error}",
                )
            )
        abnormal = outcome.trap is not None and outcome.trap != "interrupted"
        abnormal = abnormal or (outcome.exit_code not in (None, 0))
        if abnormal and run.stop_reason is None and outcome.memory_size:
            headroom = spec.memory_bytes - outcome.memory_size
            memory_hit = headroom < max(MIB, spec.memory_bytes // 8)
        if memory_hit:
            status, reason = "failed", "memoryLimit"
            exit_code = outcome.exit_code if outcome.exit_code not in (None, 0) else -1
            if outcome.instantiate_error is None:
                notes.append(
                    Diagnostic(
                        level="error",
                        code="memoryLimit",
                        message=f"the module reached its memory limit of {spec.memory_bytes} "
                        f"bytes (linear memory {outcome.memory_size} bytes)",
                    )
                )
        else:
            status, reason, exit_code = classify(
                outcome.exit_code, cancelled=run.cancelled, timed_out=run.timed_out
            )
        if outcome.trap is not None and outcome.trap != "interrupted" and not memory_hit:
            trap = outcome.trap.removeprefix("wasm trap: ")
            notes.append(Diagnostic(level="error", code="trap", message=f"wasm trap: {trap}"))
        notes += run.stop_notes(request.effective_timeout_ms, "the module was interrupted")
        return captured_result(
            sink,
            (status, reason, exit_code),
            duration_ms=elapsed_ms(started),
            metadata=self._metadata(request, warm=warm),
            notes=notes,
            structured=True,
        )

    def _compile_failed(
        self, request: ExecutionRequest, started: float, message: str
    ) -> ExecutionResult:
        return not_run_result(
            "compileFailed",
            -1,
            f"the module does not compile: {message}",
            code="compileFailed",
            duration_ms=elapsed_ms(started),
            metadata=self._metadata(request),
        )


def _preopen_dirs(request: ExecutionRequest, access: Access) -> list[tuple[str, str, bool]]:
    """``[(workspace-relative dir, guest path, writable)]`` for the request's policy.

    The policy's root is ``/workspace``; the working directory (inside the root) is ``.``.
    Raises :class:`InvalidRequest` for a working directory outside the root.
    """
    fs = request.policy.filesystem
    if fs.mode == "none":
        return []
    writable = fs.mode == "workspaceReadWrite" and access == "read-write"
    root = fs.root
    cwd = request.effective_cwd
    if cwd == ".":
        cwd = root
    elif root != "." and not (cwd == root or cwd.startswith(root + "/")):
        raise InvalidRequest(f"cwd {cwd!r} is outside the filesystem root {root!r}", field="cwd")
    return [(root, GUEST_WORKSPACE, writable), (cwd, ".", writable)]


def _remove_scratch(scratch: Path | None) -> Awaitable[None] | None:
    """The cleanup of a run with a scratch directory (none without one)."""
    if scratch is None:
        return None
    return asyncio.to_thread(shutil.rmtree, scratch, True)
