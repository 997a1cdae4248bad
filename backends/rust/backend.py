"""The ``rust`` backend: adk-code's check → build → run pipeline, the binary run by a sandbox
backend (``process`` by default, or a ``container`` backend given as ``runner``).

What it runs (``language: rust``): a source defining
``fn run(input: serde_json::Value) -> serde_json::Value``, wrapped in the harness of
:mod:`backends.rust.source` (JSON ``input`` on stdin, ``Null`` fallback; the returned value as
compact JSON on the last stdout line → the result's ``value``).

Pipeline, each phase under its own timeout:

1. **validate** — :func:`~backends.rust.source.validate_rust_source` (no ``fn main``, no
   ``#![…]``, a ``fn run``) → :class:`InvalidCode` before any compiler runs.
2. **check** — ``rustc --error-format=json --emit=metadata`` (``check_timeout_s``); the
   diagnostics are parsed (:func:`~backends.rust.diagnostics.parse_diagnostics`); any error
   stops the pipeline with a ``failed/compileFailed`` result carrying the diagnostics (level,
   message, code, spans with file/line/column and the highlighted text).
3. **build** — ``rustc -C opt-level=…`` to a binary (``build_timeout_s``). Binaries are cached
   by the sha256 of (wrapped source, rustc version, serde_json build, flags): an identical
   source runs again without compiling (``metadata.warm`` is true). At most
   ``max_cached_binaries`` are kept (least recently used removed first).
4. **run** — the binary through the runner backend with the request's policy, argv, env,
   working directory, timeout and output caps, so it gets exactly that backend's sandbox and
   its enforced controls (the capabilities this backend reports are the runner's).

Confinement (the default, ``confine=True``): ``check`` and ``build`` run under the same
bubblewrap sandbox as the ``process`` backend (:mod:`backends.confine`: no network, uid 65534,
the minimal read-only host view) in which the compiler sees, besides the system directories,
only its read-only sysroot, the serde_json build and the crate registry, and its own build
directory read-write — so ``include_str!("/etc/shadow")`` finds nothing and diagnostics carry
only the build's own files; memory and pids are bounded by a cgroup where the host has one. The
binary then runs in the confined ``process`` runner, which sees the binary cache read-only.
Building serde_json once from the Debian registry (trusted input, no user code) is not confined.

A phase that runs out of time gives ``failed/timeout`` (exit 124) with a diagnostic naming
the phase; ``cancel`` during a compile kills the compiler (``cancelled/killed``).

serde_json comes from Debian's crate registry (``apt-get install librust-serde-json-dev``
puts it in ``/usr/share/cargo/registry``): the first run builds it once, offline, with cargo
(a one-dependency project whose ``.cargo/config.toml`` replaces crates.io with that directory
and sets ``net.offline``) into ``cache_dir`` (``[runtime.rust]``, resolved by ``agora serve``:
``$AGORA_RUST_CACHE``, else ``$XDG_CACHE_HOME/agora/rust``, else ``~/.cache/agora/rust``; the
backend itself reads no environment), keyed by the rustc version.
User code is then compiled with ``rustc --extern serde_json=…/libserde_json-….rlib
-L dependency=…/deps``. A missing crate, cargo or rustc is a :class:`DependencyNotFound`
listing the places searched. Nothing is fetched from the network.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import hashlib
import os
import shutil
import signal
import subprocess
import time
from collections.abc import AsyncGenerator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import msgspec

from backends.access import Access, WorkspaceAccess
from backends.base import CodeExecutor, closing_stream
from backends.cgroups import RunCgroup, RunLimits
from backends.confine import Mount, Sandbox, bwrap_argv, launcher_argv
from backends.harness import extract_value, truncate_utf8
from backends.lifecycle import BackendLifecycle, elapsed_ms
from backends.process import (
    DEFAULT_MAX_FILE_BYTES,
    DEFAULT_MAX_MEMORY,
    DEFAULT_MAX_OPEN_FILES,
    DEFAULT_MAX_PIDS,
    SHELL,
    Confinement,
    ProcessBackend,
)
from backends.runs import Run, RunRegistry, wait_quietly
from backends.rust.diagnostics import errors, parse_diagnostics, to_diagnostic
from backends.rust.settings import RustSettings, as_passed
from backends.rust.source import validate_rust_source, wrap
from backends.staging import EtcStaging
from hub.core.execution.capabilities import BackendCapabilities, ExecutionLanguage
from hub.core.execution.errors import DependencyNotFound, ExecutionInternal
from hub.core.execution.policy import SandboxPolicy
from hub.core.execution.request import ExecutionRequest, Source
from hub.core.execution.result import (
    TIMEOUT_EXIT_CODE,
    Diagnostic,
    ExecutionEvent,
    ExecutionResult,
    OutputChunk,
)

__all__ = [
    "DEBIAN_REGISTRY",
    "RustBackend",
    "RustDeps",
    "RustToolchain",
]

DEBIAN_REGISTRY: Final = Path(RustSettings().registry)
EDITION: Final = "2021"
MAX_COMPILER_OUTPUT: Final = 4 * 1024 * 1024
_DEPS_MANIFEST: Final = """[package]
name = "agora_rust_deps"
version = "0.1.0"
edition = "2021"
publish = false

[lib]
path = "src/lib.rs"

[dependencies]
serde_json = "1"
"""
_DEPS_CONFIG: Final = """[source.crates-io]
replace-with = "debian"

[source.debian]
directory = "{registry}"

[net]
offline = true
"""


@dataclass(frozen=True)
class RustDeps:
    """The prebuilt serde_json: its rlib and the directory of its dependencies."""

    serde_json: Path
    deps_dir: Path
    digest: str


@dataclass
class _Proc:
    returncode: int | None
    stdout: bytes
    stderr: bytes
    timed_out: bool = False
    cancelled: bool = False


async def _run_tool(
    argv: Sequence[str],
    *,
    env: dict[str, str],
    cwd: Path,
    timeout_s: float,
    stop: asyncio.Future[Any] | None = None,
) -> _Proc:
    """Run a compiler step in its own process group, in ``env`` (the toolchain's environment:
    nothing else of the hub's reaches it); kill the group on timeout or when ``stop``
    completes. Output beyond :data:`MAX_COMPILER_OUTPUT` per stream is dropped."""
    proc = await asyncio.create_subprocess_exec(
        *argv,
        cwd=cwd,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )

    async def drain(reader: asyncio.StreamReader | None) -> bytes:
        kept = bytearray()
        while reader is not None and (data := await reader.read(65536)):
            room = MAX_COMPILER_OUTPUT - len(kept)
            if room > 0:
                kept += data[:room]
        return bytes(kept)

    gather = asyncio.ensure_future(
        asyncio.gather(drain(proc.stdout), drain(proc.stderr), proc.wait())
    )
    waiters: set[asyncio.Future[Any]] = {gather}
    if stop is not None:
        waiters.add(stop)
    result = _Proc(returncode=None, stdout=b"", stderr=b"")
    try:
        done, _ = await asyncio.wait(
            waiters, timeout=timeout_s, return_when=asyncio.FIRST_COMPLETED
        )
        if gather not in done:
            result.cancelled = stop is not None and stop in done
            result.timed_out = not result.cancelled
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
        out, err, code = await gather
    finally:
        if proc.returncode is None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            await proc.wait()
        if not gather.done():
            gather.cancel()
            with contextlib.suppress(BaseException):
                await gather
    result.returncode, result.stdout, result.stderr = code, out, err
    return result


class RustToolchain:
    """rustc (resolved to the real binary behind any rustup proxy), its version, and the
    serde_json build (:meth:`deps`).

    ``settings``: where builds are cached, the crate registry and the toolchain's environment
    (:class:`~hub.core.execution.settings.RustSettings`, as passed; unresolved ones get the
    type's environment-free defaults, :func:`~backends.rust.settings.as_passed`). ``cache_dir``
    and ``registry`` override them."""

    def __init__(
        self,
        *,
        settings: RustSettings | None = None,
        cache_dir: Path | None = None,
        registry: Path | None = None,
        rustc: str | None = None,
        cargo: str | None = None,
        deps_timeout_s: float = 600.0,
    ) -> None:
        settings = as_passed(settings)
        self.env = dict(settings.tool_env)
        """The environment rustc and cargo run with."""
        self.cache_dir = cache_dir if cache_dir is not None else Path(settings.cache_dir or ".")
        self.registry = registry if registry is not None else Path(settings.registry)
        self._rustc_hint = rustc
        self._cargo_hint = cargo
        self._deps_timeout_s = deps_timeout_s
        self.rustc: str | None = None
        self.version = ""
        self.problem = ""
        self._deps: RustDeps | None = None
        self._lock = asyncio.Lock()

    async def probe(self) -> None:
        """Find rustc and its version (``problem`` says why not). Idempotent."""
        if self.rustc is not None or self.problem:
            return
        found = self._rustc_hint or shutil.which("rustc", path=self.env.get("PATH"))
        if found is None:
            self.problem = f"rustc not found on PATH ({self.env.get('PATH', '')})"
            return
        proc = await _run_tool([found, "-vV"], env=self.env, cwd=Path.cwd(), timeout_s=30)
        if proc.returncode != 0:
            self.problem = f"{found} -vV failed: {proc.stderr.decode(errors='replace')[:500]}"
            return
        self.version = proc.stdout.decode(errors="replace").strip()
        sysroot = await _run_tool(
            [found, "--print", "sysroot"], env=self.env, cwd=Path.cwd(), timeout_s=30
        )
        real = Path(sysroot.stdout.decode(errors="replace").strip()) / "bin" / "rustc"
        self.rustc = str(real) if sysroot.returncode == 0 and real.is_file() else found

    async def deps(self) -> RustDeps:
        """The serde_json build for this rustc, built once (offline) if missing.

        Raises :class:`DependencyNotFound` (``details['searched']``) when the crate, cargo or
        rustc is missing or the build fails.
        """
        await self.probe()
        if self._deps is not None:
            return self._deps
        async with self._lock:
            if self._deps is None:
                self._deps = await self._build_deps()
        return self._deps

    async def _build_deps(self) -> RustDeps:
        if self.rustc is None:
            raise DependencyNotFound(
                f"rustc is needed: {self.problem}",
                dependency="rustc",
                searched=self.env.get("PATH", "").split(":"),
            )
        crates = sorted(self.registry.glob("serde_json-*")) if self.registry.is_dir() else []
        if not crates:
            raise DependencyNotFound(
                f"serde_json was not found in {self.registry} (install Debian's "
                "librust-serde-json-dev: apt-get install -y librust-serde-json-dev)",
                dependency="serde_json",
                searched=[str(self.registry / "serde_json-*")],
            )
        key = hashlib.sha256(
            (self.version + "\n" + "\n".join(c.name for c in crates)).encode()
        ).hexdigest()[:16]
        project = self.cache_dir / "deps" / key
        found = _find_rlib(project)
        if found is not None:
            return found
        cargo = self._cargo_hint or shutil.which("cargo", path=self.env.get("PATH"))
        if cargo is None:
            raise DependencyNotFound(
                "cargo is needed once to build serde_json but was not found",
                dependency="cargo",
                searched=self.env.get("PATH", "").split(":"),
            )
        await asyncio.to_thread(self._write_project, project)
        lock = await asyncio.to_thread(_lock_file, project / ".lock")
        try:
            found = _find_rlib(project)
            if found is None:
                env_rustc = ["env", f"RUSTC={self.rustc}"]
                proc = await _run_tool(
                    [*env_rustc, cargo, "build", "--release", "--offline", "--quiet"],
                    env=self.env,
                    cwd=project,
                    timeout_s=self._deps_timeout_s,
                )
                found = _find_rlib(project)
                if proc.returncode != 0 or found is None:
                    tail = proc.stderr.decode(errors="replace")[-2000:]
                    raise DependencyNotFound(
                        f"building serde_json offline from {self.registry} failed"
                        + (" (timed out)" if proc.timed_out else "")
                        + f": {tail}",
                        dependency="serde_json",
                        searched=[str(self.registry), str(project)],
                    )
        finally:
            await asyncio.to_thread(lock.close)
        return found

    def _write_project(self, project: Path) -> None:
        (project / "src").mkdir(parents=True, exist_ok=True)
        (project / ".cargo").mkdir(exist_ok=True)
        (project / "Cargo.toml").write_text(_DEPS_MANIFEST)
        (project / "src" / "lib.rs").write_text("pub use serde_json;\n")
        (project / ".cargo" / "config.toml").write_text(
            _DEPS_CONFIG.format(registry=str(self.registry).replace("\\", "\\\\"))
        )


def _lock_file(path: Path) -> Any:
    handle = path.open("a+")
    fcntl.flock(handle, fcntl.LOCK_EX)
    return handle


def _find_rlib(project: Path) -> RustDeps | None:
    deps_dir = project / "target" / "release" / "deps"
    rlibs = sorted(deps_dir.glob("libserde_json-*.rlib"), key=lambda p: p.stat().st_mtime)
    if not rlibs:
        return None
    rlib = rlibs[-1]
    stat = rlib.stat()
    digest = hashlib.sha256(f"{rlib}:{stat.st_size}:{stat.st_mtime_ns}".encode()).hexdigest()
    return RustDeps(serde_json=rlib, deps_dir=deps_dir, digest=digest)


class RustBackend(BackendLifecycle):
    """Compiles and runs Rust sources (see the module docstring).

    ``runner``: the backend that runs the binaries (default: a private
    :class:`~backends.process.ProcessBackend` with ``policy`` as its default policy, started and
    closed with this one; a given runner is the caller's to start and close). The default
    policy and the capabilities are the runner's (languages: ``rust``). ``settings``: the
    ``[runtime.rust]`` table (the hub's registry passes it), for the default ``toolchain``.
    ``etc_staging``: the hub's staged ``/etc`` (:mod:`backends.staging`), for the compiler's
    confinement and the default runner's; None for copies of their own.
    """

    def __init__(
        self,
        name: str = "rust",
        *,
        runner: CodeExecutor | None = None,
        policy: SandboxPolicy | None = None,
        access: Access = "read-write",
        confine: bool = True,
        toolchain: RustToolchain | None = None,
        settings: RustSettings | None = None,
        cache_dir: Path | None = None,
        check_timeout_s: float = 60.0,
        build_timeout_s: float = 120.0,
        opt_level: str = "1",
        max_concurrent: int = 4,
        max_cached_binaries: int = 256,
        etc_staging: EtcStaging | None = None,
    ) -> None:
        self._name = name
        self._etc_staging = etc_staging
        self.toolchain = toolchain or RustToolchain(settings=settings, cache_dir=cache_dir)
        self._own_runner = runner is None
        self._runner: CodeExecutor = (
            runner
            if runner is not None
            else ProcessBackend(
                f"{name}-runner",
                policy=policy,
                access=access,
                confine=confine,
                python="",
                expose=[str(self.toolchain.cache_dir / "bin")],  # the built binaries, read-only
                etc_staging=etc_staging,
            )
        )
        self._confine = confine
        self._confinement: Confinement | None = None
        self._check_timeout_s = check_timeout_s
        self._build_timeout_s = build_timeout_s
        self._opt_level = opt_level
        self._max_cached_binaries = max_cached_binaries
        self._registry = RunRegistry(name, max_concurrent)
        self._build_locks: dict[str, asyncio.Lock] = {}
        self._build_waiters: dict[str, int] = {}
        self.builds = 0
        self.cache_hits = 0

    # -- CodeExecutor (the rest: BackendLifecycle) ----------------------------------------

    @property
    def capabilities(self) -> BackendCapabilities:
        return self._runner.capabilities.replace(
            languages=frozenset({ExecutionLanguage.RUST}),
            supports_structured_output=True,
            supports_process_execution=False,
            supports_interactive_sessions=False,
            value_from_stdout=True,
        )

    @property
    def default_policy(self) -> SandboxPolicy:
        return self._runner.default_policy

    def _readiness(self) -> tuple[bool, str]:
        if self.toolchain.problem:
            return False, self.toolchain.problem
        if self._confinement is not None and self._confinement.problem:
            return False, f"the compiler cannot be confined: {self._confinement.problem}"
        return self._runner.available()

    async def _start(self) -> None:
        """Probe rustc, the compiler's confinement, and start the runner. serde_json is built
        on first use."""
        await self.toolchain.probe()
        # The runner and the compiler see these directories: they must exist to be bound.
        for sub in ("bin", "deps", "work"):
            await asyncio.to_thread(
                (self.toolchain.cache_dir / sub).mkdir, parents=True, exist_ok=True
            )
        if self._confine and self.toolchain.rustc is not None:
            if self._confinement is None:  # one (and one hold on /etc), whatever is retried
                shown = await asyncio.to_thread(self._compiler_view, self.toolchain.rustc)
                self._confinement = Confinement(None, shown, etc_staging=self._etc_staging)
            await self._confinement.probe()
        if self._own_runner:
            await self._runner.start()

    async def aclose(self) -> None:
        await self._registry.aclose()
        if self._confinement is not None:
            await asyncio.to_thread(self._confinement.close)
        if self._own_runner:
            await self._runner.aclose()

    async def prepare(self) -> RustDeps:
        """Build serde_json now rather than on the first run. Raises
        :class:`DependencyNotFound`."""
        await self.start()
        return await self.toolchain.deps()

    async def _validate(self, request: ExecutionRequest) -> None:
        validate_rust_source(request.source or "")

    async def execute(
        self,
        request: ExecutionRequest,
        workdir: Path | None,
        access: WorkspaceAccess | None = None,
    ) -> AsyncGenerator[ExecutionEvent, None]:
        """Check, build and run ``request``'s source (contract: :mod:`backends.base`).

        Raises, before running anything: what :func:`validate_request` raises;
        :class:`InvalidCode` (:func:`validate_rust_source`); :class:`DependencyNotFound`;
        ``Busy``; :class:`BackendUnavailable`. Compile errors and phase timeouts are results.
        """
        await self._check_request(request)
        source = request.source or ""
        validate_rust_source(source)
        deps = await self.toolchain.deps()
        run = self._registry.admit(request.exec_id)
        started = time.monotonic()
        stop = asyncio.ensure_future(run.wait_stop(float(1 << 30)))
        result: ExecutionResult | None = None
        try:
            binary, warm, failure = await self._binary(wrap(source), deps, stop)
            if failure is not None:
                # A pipeline failure: its stderr (the compiler's) within the cap.
                stderr, cut = truncate_utf8(failure.stderr, request.effective_max_stderr)
                result = self._stamped(
                    failure, request, started, stderr=stderr, stderr_truncated=cut
                )
            else:
                assert binary is not None
                # Closed explicitly (not left to the garbage collector): closing this stream
                # early must end the runner's run, and release its id, before it returns.
                running = self._run_binary(request, binary, workdir, run, stop)
                async with closing_stream(running) as events:
                    async for event in events:
                        if isinstance(event, OutputChunk):
                            yield event
                        else:
                            result = self._final(event, request, started, warm)
        finally:
            stop.cancel()
            await wait_quietly(stop)
            self._registry.end(run)
        if result is None:
            raise ExecutionInternal("the runner's stream ended without a result")
        yield result

    # -- internals ---------------------------------------------------------------------------

    def _key(self, crate: str, deps: RustDeps) -> str:
        material = "\n".join([self.toolchain.version, deps.digest, EDITION, self._opt_level, crate])
        return hashlib.sha256(material.encode()).hexdigest()

    async def _binary(
        self, crate: str, deps: RustDeps, stop: asyncio.Future[Any]
    ) -> tuple[Path | None, bool, ExecutionResult | None]:
        """``(binary, warm, None)``, or ``(None, False, result)`` when a phase failed."""
        key = self._key(crate, deps)
        bin_dir = self.toolchain.cache_dir / "bin"
        binary = bin_dir / key
        if binary.is_file():
            self.cache_hits += 1
            with contextlib.suppress(OSError):
                os.utime(binary)
            return binary, True, None
        lock = self._build_locks.setdefault(key, asyncio.Lock())
        self._build_waiters[key] = self._build_waiters.get(key, 0) + 1
        try:
            async with lock:
                if binary.is_file():
                    self.cache_hits += 1
                    return binary, True, None
                failure = await self._compile(crate, deps, key, binary, stop)
                if failure is not None:
                    return None, False, failure
                self.builds += 1
        finally:
            self._build_waiters[key] -= 1
            if not self._build_waiters[key]:
                del self._build_waiters[key]
                del self._build_locks[key]
        await asyncio.to_thread(_prune, bin_dir, self._max_cached_binaries)
        return binary, False, None

    async def _compile(
        self, crate: str, deps: RustDeps, key: str, binary: Path, stop: asyncio.Future[Any]
    ) -> ExecutionResult | None:
        assert self.toolchain.rustc is not None
        work = self.toolchain.cache_dir / "work" / key
        await asyncio.to_thread(_prepare_work, work, crate, binary.parent)
        common = [
            self.toolchain.rustc,
            "--edition",
            EDITION,
            "--crate-type",
            "bin",
            "--crate-name",
            "agora_user",
            "--extern",
            f"serde_json={deps.serde_json}",
            "-L",
            f"dependency={deps.deps_dir}",
        ]
        group = self._compile_group()
        try:
            check = await _run_tool(
                self._confined(
                    [
                        *common,
                        "--error-format=json",
                        "--emit=metadata",
                        "-o",
                        "check.rmeta",
                        "main.rs",
                    ],
                    work,
                    group,
                ),
                env=self.toolchain.env,
                cwd=work,
                timeout_s=self._check_timeout_s,
                stop=stop,
            )
            if check.cancelled or check.timed_out:
                return _phase_stopped("check", check, self._check_timeout_s)
            diagnostics = parse_diagnostics(check.stderr)
            if check.returncode != 0 or errors(diagnostics):
                return _compile_failed(check, diagnostics)
            # Built inside the build directory (the only place the compiler may write), then
            # moved into the cache by the hub.
            temp = work / "agora_user.bin"
            build = await _run_tool(
                self._confined(
                    [
                        *common,
                        "-C",
                        f"opt-level={self._opt_level}",
                        "-C",
                        "debuginfo=0",
                        "-o",
                        temp.name,
                        "main.rs",
                    ],
                    work,
                    group,
                ),
                env=self.toolchain.env,
                cwd=work,
                timeout_s=self._build_timeout_s,
                stop=stop,
            )
            if build.cancelled or build.timed_out:
                return _phase_stopped("build", build, self._build_timeout_s)
            if build.returncode != 0 or not temp.is_file():
                return _compile_failed(build, parse_diagnostics(build.stderr))
            await asyncio.to_thread(os.replace, temp, binary)
            return None
        finally:
            if group is not None:
                await asyncio.to_thread(group.remove)
            await asyncio.to_thread(shutil.rmtree, work, True)

    def _compiler_view(self, rustc: str) -> list[str]:
        """What the compiler sees beyond the system directories (read-only): its sysroot,
        the serde_json build, the crate registry. Blocking."""
        shown = [os.path.dirname(os.path.dirname(os.path.realpath(rustc)))]
        shown.append(str(self.toolchain.cache_dir / "deps"))
        if self.toolchain.registry.is_dir():
            shown.append(str(self.toolchain.registry))
        return shown

    def _compile_group(self) -> RunCgroup | None:
        """The cgroup bounding a compile's memory and processes, where the host has one."""
        confinement = self._confinement
        if confinement is None or confinement.cgroups is None:
            return None
        try:
            return confinement.cgroups.create(
                RunLimits(memory_bytes=DEFAULT_MAX_MEMORY, pids=DEFAULT_MAX_PIDS)
            )
        except OSError as e:
            raise ExecutionInternal(f"creating the compiler's cgroup failed: {e}") from e

    def _confined(self, argv: list[str], work: Path, group: RunCgroup | None) -> list[str]:
        """``argv`` (a compiler step) as run in the sandbox: only ``work`` writable, no
        network; ``argv`` itself when the backend is unconfined."""
        confinement = self._confinement
        if confinement is None:
            return argv
        box = Sandbox(mounts=(Mount(work, str(work), True),), cwd=str(work), network=False)
        launcher = launcher_argv(
            SHELL,
            group.procs_files if group is not None else (),
            open_files=DEFAULT_MAX_OPEN_FILES,
            file_blocks=max(1, DEFAULT_MAX_FILE_BYTES // confinement.file_block),
        )
        return launcher + bwrap_argv(confinement.bwrap, confinement.view, box, argv)

    async def _run_binary(
        self,
        request: ExecutionRequest,
        binary: Path,
        workdir: Path | None,
        run: Run,
        stop: asyncio.Future[Any],
    ) -> AsyncGenerator[ExecutionEvent, None]:
        stdin = request.stdin
        if stdin is None and request.has_input:
            stdin = msgspec.json.encode(request.input) + b"\n"
        inner = ExecutionRequest(
            exec_id=request.exec_id,
            language=ExecutionLanguage.COMMAND,
            payload=Source(""),
            argv=(str(binary), *request.argv),
            stdin=stdin,
            env=dict(request.env),
            cwd=request.cwd,
            timeout_ms=request.timeout_ms,
            max_stdout=request.max_stdout,
            max_stderr=request.max_stderr,
            policy=request.policy,
            identity=request.identity,
        )
        events = self._runner.execute(inner, workdir)

        async def forward_cancel() -> None:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.shield(stop)
            # The runner may not have admitted the run yet: retry until it has (or the run
            # ends, which cancels this task).
            for _ in range(1000):
                if not run.cancelled or await self._runner.cancel(request.exec_id):
                    break
                await asyncio.sleep(0.01)

        forwarder = asyncio.ensure_future(forward_cancel())
        try:
            async with closing_stream(events) as stream:
                async for event in stream:
                    yield event
        finally:
            forwarder.cancel()
            with contextlib.suppress(BaseException):
                await forwarder

    def _final(
        self, inner: ExecutionResult, request: ExecutionRequest, started: float, warm: bool
    ) -> ExecutionResult:
        """The runner's result as this backend's: the value taken off stdout (harness rule)."""
        stdout, value = inner.stdout, msgspec.UNSET
        if inner.status == "completed" and not inner.stdout_truncated:
            stdout, value = extract_value(stdout)
        notes = list(inner.diagnostics)
        if warm:
            notes.append(Diagnostic(level="note", code="buildCached", message="build cache hit"))
        return self._stamped(
            inner, request, started, warm=warm, stdout=stdout, value=value, diagnostics=notes
        )

    def _stamped(
        self,
        result: ExecutionResult,
        request: ExecutionRequest,
        started: float,
        *,
        warm: bool = False,
        **changes: Any,
    ) -> ExecutionResult:
        """``result`` (the runner's, or a pipeline failure) with ``changes``, the whole
        pipeline's duration and this backend's metadata (the runner's artifacts and image
        kept)."""
        runner = result.metadata
        return msgspec.structs.replace(
            result,
            duration_ms=elapsed_ms(started),
            metadata=self._metadata(
                request,
                warm=warm,
                image=runner.image if runner else None,
                artifacts=runner.artifacts if runner else (),
            ),
            **changes,
        )


def _prepare_work(work: Path, crate: str, bin_dir: Path) -> None:
    work.mkdir(parents=True, exist_ok=True)
    bin_dir.mkdir(parents=True, exist_ok=True)
    (work / "main.rs").write_text(crate)


def _prune(bin_dir: Path, keep: int) -> None:
    """Remove the least recently used binaries beyond ``keep``."""
    with contextlib.suppress(OSError):
        binaries = [p for p in bin_dir.iterdir() if p.is_file() and not p.name.startswith(".")]
        binaries.sort(key=lambda p: p.stat().st_mtime, reverse=True)
        for stale in binaries[keep:]:
            with contextlib.suppress(OSError):
                stale.unlink()


def _compile_failed(proc: _Proc, diagnostics: list[Any]) -> ExecutionResult:
    kept = [d for d in diagnostics if not d.message.startswith("aborting due to")]
    kept = [d for d in kept if d.level != "failure-note"]
    notes = [to_diagnostic(d) for d in kept]
    if any(d.code == "E0463" or "unresolved import" in d.message for d in kept):
        notes.append(
            Diagnostic(
                level="note",
                code="dependencies",
                message="only the standard library and serde_json are available",
            )
        )
    if not notes:
        text = proc.stderr.decode("utf-8", "replace").strip()[-2000:]
        notes.append(
            Diagnostic(level="error", code="compileFailed", message=text or "rustc failed")
        )
    rendered = "".join(d.rendered or f"{d.level}: {d.message}\n" for d in kept)
    return ExecutionResult(
        status="failed",
        reason="compileFailed",
        exit_code=proc.returncode if proc.returncode is not None else -1,
        stderr=rendered.encode(),
        stderr_total=len(rendered.encode()),
        diagnostics=notes,
    )


def _phase_stopped(phase: str, proc: _Proc, timeout_s: float) -> ExecutionResult:
    if proc.cancelled:
        return ExecutionResult(
            status="cancelled",
            reason="killed",
            exit_code=130,
            diagnostics=[
                Diagnostic(level="note", code="killed", message=f"Execution cancelled ({phase}).")
            ],
        )
    return ExecutionResult(
        status="failed",
        reason="timeout",
        exit_code=TIMEOUT_EXIT_CODE,
        diagnostics=[
            Diagnostic(
                level="error",
                code="timeout",
                message=f"the {phase} phase timed out after {timeout_s:g} s",
            )
        ],
    )
