"""The backend conformance suite, part 1: the :class:`~backends.base.CodeExecutor` contract on
every backend — ``process``, ``container``, ``wasm``, ``python``, ``rust``, ``javascript`` and
``mock``.

Each backend gets the same behaviours written in its own language (a :class:`Dialect`: shell,
WebAssembly text, Python, Rust, the mock's script), and each case checks what the backend
*declares*: a control it does not enforce must be refused, a workspace mode it declares must
work as declared. Part 2 (test_conformance.py) holds the command-language cases of the shell
backends (``process``, ``container`` warm and cold).
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from backends.access import DirectoryAccess
from backends.base import (
    BackendUnavailable,
    CodeExecutor,
    ExecutionLanguage,
    ExecutionPayload,
    ExecutionRequest,
    ExecutionResult,
    FilesystemPolicy,
    GuestModule,
    OutputChunk,
    PolicyPatch,
    SandboxPolicy,
    Source,
    UnsupportedLanguage,
    UnsupportedPolicy,
    closing_stream,
    narrow,
)
from backends.container import ContainerBackend
from backends.mock import MockBackend
from backends.monty import PythonBackend
from backends.process import ProcessBackend
from backends.rust import RustBackend
from backends.wasm import WasmBackend
from hub.core.errors import Busy
from hub.core.execution.validate import CALLABLE_LANGUAGES
from tests.backends import wat
from tests.backends.helpers import drain, host_rust_settings
from tests.support.docker import TEST_OWNER, docker_available
from tests.support.require import require

KINDS = ["process", "container", "wasm", "python", "rust", "javascript", "mock"]
FIRST_OUTPUT_S = 60.0  # generous: a cold Rust build comes before the first byte


@dataclass(frozen=True)
class Dialect:
    """The behaviours of the suite in one backend's language. ``fail_exit``: the exit code of
    ``out_err_fail``. ``value``: a program returning its input (callable languages only).
    ``write_out``: writes ``written\\n`` to ``out.txt`` at the workspace root (``None``: the
    backend has no workspace); ``needs``: files it expects there first."""

    language: ExecutionLanguage
    out_err_fail: ExecutionPayload
    fail_exit: int
    ok: ExecutionPayload
    loop: ExecutionPayload
    partial_then_loop: ExecutionPayload
    two_mib: ExecutionPayload
    value: ExecutionPayload | None = None
    write_out: ExecutionPayload | None = None
    needs: dict[str, str] = field(default_factory=dict)


def _module(text: str) -> GuestModule:
    return GuestModule(wat.wasm(text))


def _rust(body: str) -> Source:
    return Source(f"fn run(input: serde_json::Value) -> serde_json::Value {{\n{body}\n}}\n")


SHELL = Dialect(
    language=ExecutionLanguage.COMMAND,
    out_err_fail=Source("echo out; echo err >&2; exit 3"),
    fail_exit=3,
    ok=Source("true"),
    loop=Source("while :; do :; done"),
    partial_then_loop=Source("echo partial; while :; do sleep 0.05; done"),
    two_mib=Source("head -c 2097152 /dev/zero | tr '\\0' x"),
    write_out=Source("echo written > out.txt"),
)
PROCESS = Dialect(
    **{
        **SHELL.__dict__,
        "value": Source("import json, sys\nprint(json.dumps(json.load(sys.stdin)))"),
    }
)
DIALECTS: dict[str, Dialect] = {
    "process": PROCESS,
    "container": SHELL,
    "wasm": Dialect(
        language=ExecutionLanguage.WASM,
        out_err_fail=_module(wat.OUT_ERR_EXIT3),
        fail_exit=3,
        ok=_module(wat.HELLO),
        loop=_module(wat.INFINITE_LOOP),
        partial_then_loop=_module(wat.PARTIAL_THEN_LOOP),
        two_mib=_module(wat.TWO_MIB),
        value=_module(wat.ECHO),
        write_out=_module(wat.READ_THEN_WRITE),
        needs={"data.txt": "data\n"},
    ),
    "python": Dialect(
        language=ExecutionLanguage.PYTHON,
        out_err_fail=Source(
            "import sys\nprint('out')\nprint('err', file=sys.stderr)\nraise ValueError('x')"
        ),
        fail_exit=1,  # an exception: failed/exit 1 with the traceback
        ok=Source("1"),
        loop=Source("while True:\n    pass"),
        partial_then_loop=Source("print('partial')\nwhile True:\n    pass"),
        two_mib=Source("for i in range(32):\n    print('x' * 65535)"),
        value=Source("input"),
        write_out=Source("write_file('out.txt', 'written\\n')"),
    ),
    "rust": Dialect(
        language=ExecutionLanguage.RUST,
        out_err_fail=_rust('println!("out"); eprintln!("err"); std::process::exit(3)'),
        fail_exit=3,
        ok=_rust("let _ = input; serde_json::Value::Null"),
        loop=_rust("let _ = input; loop { std::hint::black_box(0); }"),
        partial_then_loop=_rust(
            'let _ = input; println!("partial");\n'
            "loop { std::thread::sleep(std::time::Duration::from_millis(20)); }"
        ),
        two_mib=_rust(
            'let _ = input; let s = "x".repeat(65536);\n'
            'for _ in 0..32 { print!("{}", s); }\nserde_json::Value::Null'
        ),
        value=_rust("input"),
        write_out=_rust('std::fs::write("out.txt", "written\\n").unwrap(); input'),
    ),
    "javascript": Dialect(
        language=ExecutionLanguage.JAVASCRIPT,
        out_err_fail=Source(
            "console.log('out'); console.error('err');\n"
            "export default () => { throw new Error('x'); };"
        ),
        fail_exit=1,  # an exception: failed/exit 1 with the stack
        ok=Source("export default () => null;"),
        loop=Source("export default () => { while (true) {} };"),
        partial_then_loop=Source("console.log('partial');\nwhile (true) {}"),
        two_mib=Source(
            "const s = new TextEncoder().encode('x'.repeat(65536));\n"
            "for (let i = 0; i < 32; i++) Deno.stdout.writeSync(s);"
        ),
        value=Source("export default (input) => input;"),
        write_out=Source(
            'import { writeFile } from "agora:workspace";\n'
            "export default async () => { await writeFile('out.txt', 'written\\n'); };"
        ),
    ),
    "mock": Dialect(
        language=ExecutionLanguage.COMMAND,
        out_err_fail=Source("echo out\nerror err\nexit 3"),
        fail_exit=3,
        ok=Source("exit 0"),
        loop=Source("hang"),
        partial_then_loop=Source("echo partial\nhang"),
        two_mib=Source("flood 2097152"),
    ),
}


@dataclass
class Subject:
    """One backend under the suite, its dialect and the policy its runs use by default."""

    kind: str
    backend: CodeExecutor
    dialect: Dialect
    base: SandboxPolicy

    def request(self, payload: ExecutionPayload, **kw: Any) -> ExecutionRequest:
        kw.setdefault("exec_id", f"{self.kind}-{uuid.uuid4().hex[:12]}")
        kw.setdefault("policy", self.base)
        kw.setdefault("language", self.dialect.language)
        return ExecutionRequest(payload=payload, **kw)

    async def run(
        self,
        payload: ExecutionPayload,
        *,
        workdir: Path | None = None,
        access: DirectoryAccess | None = None,
        **kw: Any,
    ) -> tuple[ExecutionResult, list[OutputChunk]]:
        return await drain(self.backend.execute(self.request(payload, **kw), workdir, access))

    def workspace_policy(self) -> SandboxPolicy:
        """The widest workspace the backend offers, read-write."""
        modes = self.backend.capabilities.filesystem_modes
        if "workspaceReadWrite" in modes:
            fs = FilesystemPolicy.workspace_read_write()
            return narrow(self.backend.default_policy, PolicyPatch(filesystem=fs))
        return self.backend.default_policy


async def _make(kind: str) -> CodeExecutor:
    if kind == "process":
        return ProcessBackend()  # confined: the default
    if kind == "container":
        ok, why = await asyncio.to_thread(docker_available)
        require("docker", ok, why)
        return ContainerBackend(owner=TEST_OWNER, warm_pool=0, max_concurrent=8)
    if kind == "wasm":
        return WasmBackend()
    if kind == "python":
        return PythonBackend()
    if kind == "rust":
        return RustBackend(settings=host_rust_settings())
    if kind == "javascript":
        from backends.javascript import JavaScriptBackend

        return JavaScriptBackend()
    return MockBackend()


@pytest.fixture(params=KINDS)
async def subject(request: pytest.FixtureRequest) -> AsyncIterator[Subject]:
    kind: str = request.param
    backend = await _make(kind)
    try:
        await backend.start()
        ok, why = backend.available()
        require({"container": "docker", "javascript": "deno"}.get(kind, kind), ok, why)
        base = backend.default_policy
        caps = backend.capabilities
        if caps.enforces_network and base.network != "disabled":
            base = narrow(base, PolicyPatch(network="disabled"))
        if "none" in caps.filesystem_modes and base.filesystem.mode != "none":
            base = narrow(base, PolicyPatch(filesystem=FilesystemPolicy.none()))
        yield Subject(kind, backend, DIALECTS[kind], base)
    finally:
        await backend.aclose()


async def _first_output(
    subject: Subject, request: ExecutionRequest
) -> tuple[asyncio.Task[ExecutionResult], list[OutputChunk]]:
    """Consume ``request``'s stream in a task (as the runtime does) until its first chunk."""
    chunks: list[OutputChunk] = []
    first = asyncio.Event()

    async def consume() -> ExecutionResult:
        result: ExecutionResult | None = None
        async for event in subject.backend.execute(request, None):
            if isinstance(event, OutputChunk):
                chunks.append(event)
                first.set()
            else:
                result = event
        assert result is not None
        return result

    task = asyncio.create_task(consume())
    waiter = asyncio.create_task(first.wait())
    await asyncio.wait([task, waiter], timeout=FIRST_OUTPUT_S, return_when="FIRST_COMPLETED")
    waiter.cancel()
    if task.done():
        task.result()  # raises what the run raised
    assert first.is_set(), f"no output within {FIRST_OUTPUT_S} s"
    return task, chunks


def test_declares_truthful_capabilities(subject: Subject) -> None:
    backend, caps = subject.backend, subject.backend.capabilities
    assert isinstance(backend, CodeExecutor)
    assert backend.available() == (True, "")
    assert caps.enforces_timeout
    assert subject.dialect.language in caps.languages
    if caps.workspace == "hostFunctions":
        assert caps.host_functions  # the sandbox calls something
    else:
        assert not caps.host_functions
    if caps.workspace == "none":
        assert caps.filesystem_modes <= {"none"}
    else:
        assert caps.filesystem_modes - {"none"}
    if caps.value_from_stdout:
        assert caps.supports_structured_output


async def test_output_and_a_failed_exit(subject: Subject) -> None:
    result, chunks = await subject.run(subject.dialect.out_err_fail)
    assert (result.status, result.reason) == ("failed", "exit"), result
    assert result.exit_code == subject.dialect.fail_exit
    assert result.stdout == b"out\n"
    assert result.stderr.startswith(b"err\n")
    assert b"".join(c.data for c in chunks if c.stream == "stdout") == result.stdout
    assert b"".join(c.data for c in chunks if c.stream == "stderr") == result.stderr
    assert result.metadata is not None and result.metadata.backend == subject.backend.name
    assert result.metadata.language == subject.dialect.language


async def test_success_is_completed(subject: Subject) -> None:
    result, _ = await subject.run(subject.dialect.ok)
    assert (result.status, result.reason, result.exit_code) == ("completed", "exit", 0), result


async def test_timeout_stops_an_endless_program(subject: Subject) -> None:
    result, _ = await subject.run(subject.dialect.loop, timeout_ms=500)
    assert (result.status, result.reason, result.exit_code) == ("failed", "timeout", 124)
    assert any(d.code == "timeout" for d in result.diagnostics)


async def test_cancel_keeps_the_output_so_far(subject: Subject) -> None:
    request = subject.request(subject.dialect.partial_then_loop)
    task, _ = await _first_output(subject, request)
    assert await subject.backend.cancel(request.exec_id) is True
    result = await task
    assert (result.status, result.reason, result.exit_code) == ("cancelled", "killed", 130)
    assert result.stdout == b"partial\n"
    assert await subject.backend.cancel(request.exec_id) is False  # finished: a no-op


async def test_cancel_of_an_unknown_id_is_false(subject: Subject) -> None:
    assert await subject.backend.cancel(f"none-{uuid.uuid4()}") is False


async def test_closing_the_stream_early_stops_the_run(subject: Subject) -> None:
    request = subject.request(subject.dialect.partial_then_loop)
    async with closing_stream(subject.backend.execute(request, None)) as events:
        async with asyncio.timeout(FIRST_OUTPUT_S):
            async for _event in events:
                break
    assert await subject.backend.cancel(request.exec_id) is False  # nothing left running
    again, _ = await drain(
        subject.backend.execute(subject.request(subject.dialect.ok, exec_id=request.exec_id), None)
    )
    assert again.status == "completed"  # the id was released


async def test_output_beyond_the_cap_is_truncated(subject: Subject) -> None:
    result, chunks = await subject.run(subject.dialect.two_mib, max_stdout=1000)
    assert result.stdout_truncated and result.stdout == b"x" * 1000
    assert result.stdout_total > 1000
    assert b"".join(c.data for c in chunks if c.stream == "stdout") == result.stdout
    assert any(d.code == "outputTruncated" for d in result.diagnostics)


async def test_input_comes_back_as_the_value(subject: Subject) -> None:
    caps = subject.backend.capabilities
    program = subject.dialect.value
    if program is None:
        # Not callable: no language of it takes an input.
        assert not caps.languages & CALLABLE_LANGUAGES
        return
    language = subject.dialect.language
    if subject.kind == "process":
        language = ExecutionLanguage.PYTHON  # the process backend's callable language
    value = {"n": 21, "text": "é", "list": [1, None]}
    result, _ = await subject.run(program, language=language, input=value)
    assert result.status == "completed", result
    assert result.value == value
    if caps.value_from_stdout:
        assert b'"text"' not in result.stdout  # the harness took the value line off stdout


async def test_a_language_it_does_not_run_is_refused(subject: Subject) -> None:
    languages = subject.backend.capabilities.languages
    other = next(lang for lang in ExecutionLanguage if lang not in languages)
    request = subject.request(Source("x"), language=other)
    with pytest.raises(UnsupportedLanguage):
        await drain(subject.backend.execute(request, None))


@pytest.mark.parametrize(
    ("limit", "value"), [("memory_bytes", 256 * 1024 * 1024), ("pids", 64), ("cpus", 1.0)]
)
async def test_a_limit_it_cannot_enforce_is_refused(
    subject: Subject, limit: str, value: Any
) -> None:
    caps = subject.backend.capabilities
    enforced = {"memory_bytes": caps.enforces_memory, "pids": caps.enforces_pids}.get(
        limit, caps.enforces_cpu
    )
    policy = subject.base.replace(**{limit: value})
    if enforced:
        result, _ = await subject.run(subject.dialect.ok, policy=policy)
        assert result.status == "completed", result
    else:
        with pytest.raises(UnsupportedPolicy):
            await subject.run(subject.dialect.ok, policy=policy)


async def test_a_running_id_is_busy(subject: Subject) -> None:
    request = subject.request(subject.dialect.partial_then_loop)
    task, _ = await _first_output(subject, request)
    try:
        with pytest.raises(Busy):
            await drain(subject.backend.execute(request, None))
    finally:
        await subject.backend.cancel(request.exec_id)
        with contextlib.suppress(Exception):
            await task


async def test_concurrent_executions(subject: Subject) -> None:
    results = await asyncio.gather(*(subject.run(subject.dialect.ok) for _ in range(4)))
    assert [r.status for r, _ in results] == ["completed"] * 4


async def test_the_workspace_works_as_declared(subject: Subject, tmp_path: Path) -> None:
    caps, program = subject.backend.capabilities, subject.dialect.write_out
    for name, text in subject.dialect.needs.items():
        (tmp_path / name).write_text(text)
    if caps.workspace == "none":
        assert program is None
        workspace = subject.base.replace(filesystem=FilesystemPolicy.workspace_read_write())
        with pytest.raises(UnsupportedPolicy):
            await subject.run(subject.dialect.ok, workdir=tmp_path, policy=workspace)
        return
    assert program is not None
    if caps.workspace == "files":
        result, _ = await subject.run(program, workdir=tmp_path, policy=subject.workspace_policy())
    else:  # hostFunctions: the files are reached through the access object only
        result, _ = await subject.run(
            program,
            access=DirectoryAccess(tmp_path),
            policy=subject.workspace_policy(),
        )
    assert result.status == "completed", result
    assert (tmp_path / "out.txt").read_text() == "written\n"


async def test_a_closed_backend_is_unavailable(subject: Subject) -> None:
    await subject.backend.aclose()
    ok, why = subject.backend.available()
    assert not ok and why
    with pytest.raises(BackendUnavailable):
        await subject.run(subject.dialect.ok)
    await subject.backend.aclose()  # idempotent


ABANDONED_CLOSE_S = 10.0


async def test_abandon_lets_a_run_and_the_close_end_promptly(subject: Subject) -> None:
    """What a stop that gives up calls (hub.runtime, ``close_grace_s``): ``abandon`` never
    blocks and may come twice; the running execution then ends (a result, or unavailable
    for a backend that gave up its calls) and ``aclose`` returns, both within 10 s."""
    request = subject.request(subject.dialect.partial_then_loop)
    task, _ = await _first_output(subject, request)
    subject.backend.abandon()
    subject.backend.abandon()
    async with asyncio.timeout(ABANDONED_CLOSE_S):
        await subject.backend.aclose()
        with contextlib.suppress(BackendUnavailable):
            await task
    if isinstance(subject.backend, ContainerBackend):  # what it left: the next start's sweep
        async with ContainerBackend(owner=subject.backend.owner, warm_pool=0):
            pass


async def test_admit_refuses_what_execute_would(subject: Subject) -> None:
    """``admit`` (run by the runtime before ``execRequested`` is written) refuses what
    ``execute`` would refuse before running, and holds nothing for a refused request."""
    languages = subject.backend.capabilities.languages
    other = next(lang for lang in ExecutionLanguage if lang not in languages)
    with pytest.raises(UnsupportedLanguage):
        await subject.backend.admit(subject.request(Source("x"), language=other))
    caps = subject.backend.capabilities
    if not caps.enforces_cpu:
        with pytest.raises(UnsupportedPolicy):
            await subject.backend.admit(
                subject.request(subject.dialect.ok, policy=subject.base.replace(cpus=1.0))
            )
    request = subject.request(subject.dialect.ok)
    admission = await subject.backend.admit(request)
    with pytest.raises(Busy):  # the id is held until its run takes it
        await subject.backend.admit(request)
    result, _ = await drain(subject.backend.execute(request, None))
    assert result.status == "completed", result
    admission.release()  # a no-op: the run took the slot
    again = await subject.backend.admit(request)  # the id is free again
    again.release()
    await subject.backend.aclose()
    with pytest.raises(BackendUnavailable):
        await subject.backend.admit(subject.request(subject.dialect.ok))
