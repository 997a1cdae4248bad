"""The ``python`` backend: pydantic-monty with input/value, limits and workspace host functions.

The host functions are tested here against a fake :class:`WorkspaceAccess` that records the
calls; the runtime's own access (writes become ``fileWritten`` events) is tested with the
runtime.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from backends.access import DirectoryAccess, WorkspaceAccess
from backends.base import (
    CodeExecutor,
    ExecutionLanguage,
    ExecutionRequest,
    ExecutionResult,
    FilesystemPolicy,
    InvalidRequest,
    OutputChunk,
    PolicyPatch,
    Rejected,
    Source,
    UnsupportedLanguage,
    collect,
    narrow,
)
from backends.monty import PythonBackend
from tests.backends.helpers import (
    BOUND_S,
    assert_closed_is_unavailable,
    assert_running_id_is_busy,
    cancel_consumer,
    drain,
    new_request,
    until_running,
)

MIB = 1024 * 1024


class RecordingAccess:
    """A fake workspace: files in a dict, every call recorded."""

    def __init__(self, files: dict[str, bytes] | None = None) -> None:
        self.files = dict(files or {})
        self.calls: list[tuple[Any, ...]] = []

    async def read(self, path: str) -> bytes:
        self.calls.append(("read", path))
        if path not in self.files:
            raise FileNotFoundError(f"no such file: {path!r}")
        return self.files[path]

    async def write(self, path: str, data: bytes) -> None:
        self.calls.append(("write", path, data))
        self.files[path] = data

    async def list(self, prefix: str) -> list[str]:
        self.calls.append(("list", prefix))
        return sorted(p for p in self.files if prefix == "." or p.startswith(prefix))

    async def delete(self, path: str) -> None:
        self.calls.append(("delete", path))
        if path not in self.files:
            raise FileNotFoundError(f"no such file: {path!r}")
        del self.files[path]


@pytest.fixture
async def backend() -> AsyncIterator[PythonBackend]:
    async with PythonBackend() as made:
        yield made


@pytest.fixture
async def read_only() -> AsyncIterator[PythonBackend]:
    async with PythonBackend("python-ro", access="read") as made:
        yield made


def request(backend: PythonBackend, source: str, **kw: Any) -> ExecutionRequest:
    return new_request(backend, language=ExecutionLanguage.PYTHON, payload=Source(source), **kw)


async def run(
    backend: PythonBackend,
    source: str,
    *,
    access: WorkspaceAccess | None = None,
    workdir: Path | None = None,
    session: str | None = None,
    **kw: Any,
) -> tuple[ExecutionResult, list[OutputChunk]]:
    return await drain(
        backend.execute(request(backend, source, **kw), workdir, access=access, session=session)
    )


def test_protocol_and_capabilities(backend: PythonBackend) -> None:
    assert isinstance(backend, CodeExecutor)
    caps = backend.capabilities
    assert caps.isolation == "inProcess"
    assert caps.enforces_timeout and caps.enforces_memory and caps.enforces_network
    assert caps.supports_structured_output and caps.supports_interactive_sessions
    assert caps.languages == {ExecutionLanguage.PYTHON}
    assert backend.available() == (True, "")


async def test_input_and_value(backend: PythonBackend) -> None:
    result, chunks = await run(
        backend,
        "print('doubling', input['n'])\n{'double': input['n'] * 2, 'tags': ['é']}",
        input={"n": 21},
    )
    assert (result.status, result.reason, result.exit_code) == ("completed", "exit", 0)
    assert result.value == {"double": 42, "tags": ["é"]}
    assert result.stdout == b"doubling 21\n"
    assert b"".join(c.data for c in chunks) == b"doubling 21\n"


async def test_no_trailing_expression_means_no_value(backend: PythonBackend) -> None:
    result, _ = await run(backend, "x = 1")
    assert result.status == "completed" and not result.has_value
    none, _ = await run(backend, "None")
    assert none.has_value and none.value is None
    null_input, _ = await run(backend, "input", input=None)
    assert null_input.value is None


async def test_value_json_cannot_hold_is_its_repr(backend: PythonBackend) -> None:
    result, _ = await run(backend, "(1, 2)")
    assert result.value == [1, 2]  # tuples are JSON arrays
    odd, _ = await run(backend, "len")
    assert isinstance(odd.value, str)
    assert any(d.code == "valueNotJson" for d in odd.diagnostics)


async def test_while_true_is_stopped(backend: PythonBackend) -> None:
    async with asyncio.timeout(BOUND_S):
        result, _ = await run(backend, "while True:\n    pass", timeout_ms=300)
    assert (result.status, result.reason, result.exit_code) == ("failed", "timeout", 124)
    assert result.duration_ms >= 300
    after, _ = await run(backend, "1 + 1")  # the pool recovered
    assert after.value == 2


async def test_memory_cap(backend: PythonBackend) -> None:
    policy = narrow(backend.default_policy, PolicyPatch(memory_bytes=16 * MIB))
    result, _ = await run(
        backend, "chunks = []\nwhile True:\n    chunks.append('x' * 100000)", policy=policy
    )
    assert (result.status, result.reason) == ("failed", "memoryLimit")


async def test_exception_is_a_failed_exit_with_traceback(backend: PythonBackend) -> None:
    result, _ = await run(backend, "def f():\n    raise ValueError('boom')\nf()")
    assert (result.status, result.reason, result.exit_code) == ("failed", "exit", 1)
    assert b"ValueError: boom" in result.stderr
    diagnostic = result.diagnostics[0]
    assert diagnostic.message == "ValueError: boom" and diagnostic.data["line"] == 2


async def test_syntax_error_is_compile_failed(backend: PythonBackend) -> None:
    result, _ = await run(backend, "x = 1\ndef f(:\n    pass")
    assert (result.status, result.reason) == ("failed", "compileFailed")
    assert result.diagnostics[0].code == "syntaxError"
    assert result.diagnostics[0].data["line"] == 2


async def test_no_host_filesystem_network_or_environment(
    backend: PythonBackend, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("AGORA_SECRET", "do-not-leak")
    source = (
        "out = []\n"
        "for attempt in ("
        "lambda: open('/etc/passwd').read(),"
        "lambda: __import__('os').getenv('AGORA_SECRET'),"
        "lambda: __import__('socket'),"
        "):\n"
        "    try:\n"
        "        out.append(repr(attempt()))\n"
        "    except Exception as e:\n"
        "        out.append(type(e).__name__)\n"
        "out"
    )
    result, _ = await run(backend, source)
    assert result.status == "completed", result.stderr
    assert "do-not-leak" not in str(result.value)
    assert all("Error" in item for item in result.value), result.value


async def test_write_file_goes_through_the_workspace_access(backend: PythonBackend) -> None:
    access = RecordingAccess({"notes/in.txt": b"hello"})
    source = (
        "text = read_file('notes/in.txt')\n"
        "n = write_file('notes/out.txt', text.upper())\n"
        "files = list_files('notes')\n"
        "delete_file('notes/in.txt')\n"
        "{'n': n, 'files': files}"
    )
    result, _ = await run(backend, source, access=access)
    assert result.status == "completed", result.stderr
    assert result.value == {"n": 5, "files": ["notes/in.txt", "notes/out.txt"]}
    assert access.calls == [
        ("read", "notes/in.txt"),
        ("write", "notes/out.txt", b"HELLO"),
        ("list", "notes"),
        ("delete", "notes/in.txt"),
    ]
    assert access.files == {"notes/out.txt": b"HELLO"}


async def test_write_file_is_refused_on_a_read_only_instance(read_only: PythonBackend) -> None:
    access = RecordingAccess({"a.txt": b"keep"})
    result, _ = await run(read_only, "write_file('a.txt', 'overwrite')", access=access)
    assert (result.status, result.reason) == ("failed", "exit")
    assert b"PermissionError" in result.stderr and b"read-only access" in result.stderr
    assert access.calls == []  # the access object was never asked
    reading, _ = await run(read_only, "read_file('a.txt')", access=access)
    assert reading.value == "keep"
    caught, _ = await run(
        read_only,
        "try:\n    delete_file('a.txt')\nexcept PermissionError as e:\n    r = str(e)\nr",
        access=access,
    )
    assert "read-only" in caught.value and access.files == {"a.txt": b"keep"}


async def test_read_only_instance_cannot_be_widened(read_only: PythonBackend) -> None:
    with pytest.raises(Rejected):
        narrow(
            read_only.default_policy,
            PolicyPatch(filesystem=FilesystemPolicy.workspace_read_write()),
        )


async def test_host_calls_follow_the_filesystem_policy(backend: PythonBackend) -> None:
    access = RecordingAccess({"docs/a.txt": b"a", "src/b.txt": b"b"})
    policy = narrow(
        backend.default_policy,
        PolicyPatch(filesystem=FilesystemPolicy.paths(read_only=["docs"], read_write=["out"])),
    )
    source = (
        "def attempt(f, *a):\n"
        "    try:\n"
        "        return f(*a)\n"
        "    except Exception as e:\n"
        "        return type(e).__name__\n"
        "[attempt(read_file, 'docs/a.txt'), attempt(read_file, 'src/b.txt'),\n"
        " attempt(write_file, 'docs/a.txt', 'x'), attempt(write_file, 'out/c.txt', 'c'),\n"
        " attempt(read_file, '../etc/passwd'), list_files()]"
    )
    result, _ = await run(backend, source, access=access, policy=policy)
    assert result.value == [
        "a",
        "PermissionError",
        "PermissionError",
        1,
        "ValueError",
        ["docs/a.txt", "out/c.txt"],
    ]
    none = narrow(backend.default_policy, PolicyPatch(filesystem=FilesystemPolicy.none()))
    refused, _ = await run(backend, "read_file('docs/a.txt')", access=access, policy=none)
    assert b"PermissionError" in refused.stderr


async def test_missing_file_raises_file_not_found(backend: PythonBackend) -> None:
    result, _ = await run(backend, "read_file('nope.txt')", access=RecordingAccess())
    assert b"FileNotFoundError" in result.stderr


async def test_workdir_is_served_by_directory_access(
    backend: PythonBackend, tmp_path: Path
) -> None:
    (tmp_path / "in.txt").write_text("from disk")
    result, _ = await run(
        backend, "write_file('sub/out.txt', read_file('in.txt') + '!')", workdir=tmp_path
    )
    assert result.status == "completed", result.stderr
    assert (tmp_path / "sub" / "out.txt").read_text() == "from disk!"
    assert isinstance(DirectoryAccess(tmp_path), WorkspaceAccess)


async def test_no_workspace_at_all(backend: PythonBackend) -> None:
    result, _ = await run(backend, "write_file('a.txt', 'x')")
    assert b"no workspace" in result.stderr


async def test_output_is_capped(backend: PythonBackend) -> None:
    result, chunks = await run(
        backend, "for i in range(2000):\n    print('x' * 99)", max_stdout=1000
    )
    assert result.status == "completed"
    assert result.stdout_truncated and len(result.stdout) == 1000
    assert result.stdout_total == 2000 * 100
    assert sum(len(c.data) for c in chunks) == 1000


async def test_cancel_stops_a_running_snippet(backend: PythonBackend) -> None:
    req = request(backend, "while True:\n    pass", timeout_ms=10_000)
    task = asyncio.create_task(collect(backend.execute(req, None)))
    await until_running(backend, req.exec_id)
    async with asyncio.timeout(BOUND_S / 10):  # below the 10 s timeout: the cancel stopped it
        assert await backend.cancel(req.exec_id)
        result = await task
    assert (result.status, result.reason, result.exit_code) == ("cancelled", "killed", 130)
    assert not await backend.cancel(req.exec_id)


async def test_cancel_waits_for_an_accepted_host_call(backend: PythonBackend) -> None:
    started = asyncio.Event()

    class SlowAccess(RecordingAccess):
        async def write(self, path: str, data: bytes) -> None:
            started.set()
            await asyncio.sleep(0.3)
            await super().write(path, data)

    access = SlowAccess()
    req = request(backend, "write_file('a.txt', 'x')\nwrite_file('b.txt', 'y')")
    task = asyncio.create_task(collect(backend.execute(req, None, access=access)))
    await started.wait()
    assert await backend.cancel(req.exec_id)
    result = await task
    assert result.status == "cancelled"
    assert access.files == {"a.txt": b"x"}  # the accepted call finished; no new call began


async def test_cancelled_consumer_stops_the_snippet(backend: PythonBackend) -> None:
    req = request(backend, "while True:\n    pass", timeout_ms=10_000)
    await cancel_consumer(backend, req, settle_s=0.3)
    result, _ = await run(backend, "'again'", exec_id=req.exec_id)
    assert result.value == "again"


async def test_a_running_id_is_busy(backend: PythonBackend) -> None:
    req = request(backend, "while True:\n    pass", timeout_ms=10_000)
    await assert_running_id_is_busy(backend, req, settle_s=0.2)


async def test_session_keeps_state_between_calls(backend: PythonBackend) -> None:
    first, _ = await run(
        backend, "counter = 40\ndef bump():\n    global counter\n    counter += 1", session="s1"
    )
    assert first.status == "completed"
    second, _ = await run(backend, "bump()\nbump()\ncounter", session="s1")
    assert second.value == 42
    other, _ = await run(backend, "counter", session="s2")
    assert other.reason == "exit" and b"NameError" in other.stderr
    assert backend.sessions == ["s1", "s2"]
    assert await backend.close_session("s1")
    assert not await backend.close_session("s1")
    fresh, _ = await run(backend, "counter", session="s1")
    assert b"NameError" in fresh.stderr


async def test_a_session_is_dropped_after_a_timeout(backend: PythonBackend) -> None:
    await run(backend, "x = 1", session="s")
    result, _ = await run(backend, "while True:\n    pass", session="s", timeout_ms=300)
    assert result.reason == "timeout"
    assert "s" not in backend.sessions


async def test_snippets_take_no_stdin_argv_or_env(backend: PythonBackend) -> None:
    with pytest.raises(InvalidRequest):
        await collect(backend.execute(request(backend, "1", stdin=b"x"), None))
    with pytest.raises(InvalidRequest):
        await collect(backend.execute(request(backend, "1", argv=("a",)), None))


async def test_other_languages_are_refused(backend: PythonBackend) -> None:
    bad = ExecutionRequest(
        exec_id="x",
        language=ExecutionLanguage.COMMAND,
        payload=Source("echo"),
        policy=backend.default_policy,
    )
    with pytest.raises(UnsupportedLanguage):
        await collect(backend.execute(bad, None))


async def test_closed_backend_is_unavailable() -> None:
    made = PythonBackend()
    await assert_closed_is_unavailable(made, request(made, "1"))
