"""The backend conformance suite, part 2: the command-language cases (a shell program's exit
codes, stdin and argv, signals, process groups, the environment, mounts) of the backends that
run ``command``: ``process``, ``container`` (warm pool) and ``container-cold`` (see
conftest.py). Part 1, the contract on every backend (``process``, ``container``, ``wasm``,
``python``, ``rust``, ``javascript``, ``mock``), is test_every_backend.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import uuid
from pathlib import Path

import pytest

from backends.base import (
    BackendUnavailable,
    CodeExecutor,
    EnvironmentPolicy,
    ExecutionLanguage,
    ExecutionRequest,
    ExecutionResult,
    FilesystemPolicy,
    GuestModule,
    InvalidRequest,
    OutputChunk,
    Rejected,
    UnsupportedLanguage,
    UnsupportedPolicy,
    closing_stream,
    host_local,
    validate_request,
)
from hub.core.errors import Busy
from hub.core.execution.result import ExecutionEvent
from tests.backends.helpers import BOUND_S
from tests.backends.rigs import Listener, Rig

MIB = 1024 * 1024
GRACE_S = 1.0  # the process backend's default kill grace; containers are killed at once
SLACK_S = 3.0


def test_protocol(rig: Rig) -> None:
    assert isinstance(rig.backend, CodeExecutor)
    assert rig.backend.available() == (True, "")
    caps = rig.backend.capabilities
    assert caps.enforces_timeout and caps.enforces_environment
    assert ExecutionLanguage.COMMAND in caps.languages


async def test_stdout_stderr_exit_code(rig: Rig) -> None:
    result = await rig.run("echo out; echo err >&2; exit 3")
    assert (result.status, result.reason, result.exit_code) == ("failed", "exit", 3)
    assert result.stdout == b"out\n" and result.stderr == b"err\n"
    assert rig.streamed("stdout") == b"out\n" and rig.streamed("stderr") == b"err\n"
    assert not result.stdout_truncated and not result.stderr_truncated
    assert result.metadata is not None and result.metadata.backend == rig.backend.name
    assert not result.has_value  # command languages never return a value


async def test_success_is_completed(rig: Rig) -> None:
    result = await rig.run("true")
    assert (result.status, result.reason, result.exit_code) == ("completed", "exit", 0)


async def test_signal_exit_codes_map_to_cancelled(rig: Rig) -> None:
    # Seed 003: an exit status of 130 (or 129/137/143) counts as cancelled.
    result = await rig.run("exit 130")
    assert (result.status, result.reason, result.exit_code) == ("cancelled", "killed", 130)


async def test_stdin_and_argv(rig: Rig) -> None:
    result = await rig.run(
        'cat; printf "[%s]" "$1" "$2"', stdin=b"from stdin\n", argv=("a b", "$HOME")
    )
    assert result.status == "completed"
    assert result.stdout == b"from stdin\n[a b][$HOME]"


async def test_argv_only_command(rig: Rig) -> None:
    result = await rig.run("", argv=("echo", "plain", "argv"))
    assert result.stdout == b"plain argv\n" and result.exit_code == 0


async def test_command_without_source_or_argv_is_invalid(rig: Rig) -> None:
    with pytest.raises(InvalidRequest):
        await rig.run("")


async def test_large_stdin_not_read_does_not_hang(rig: Rig) -> None:
    async with asyncio.timeout(BOUND_S):  # a hang fails here
        result = await rig.run("echo ignored-stdin", stdin=b"x" * (4 * MIB))
    assert result.status == "completed" and result.stdout == b"ignored-stdin\n"


async def test_timeout_stops_an_infinite_loop(rig: Rig) -> None:
    marker = f"loop-{uuid.uuid4().hex}"
    request = rig.request(f"exec sh -c 'while :; do :; done' {marker}", timeout_ms=1000)
    async with asyncio.timeout(BOUND_S):
        result = await rig.run_request(request)
    assert (result.status, result.reason, result.exit_code) == ("failed", "timeout", 124)
    assert result.duration_ms >= 1000  # the backend's own clock: not before the timeout
    assert any(d.code == "timeout" for d in result.diagnostics)
    assert await rig.leftovers(request.exec_id, marker) == []


async def test_kill_mid_run_keeps_partial_output(rig: Rig) -> None:
    marker = f"sleep-{uuid.uuid4().hex}"
    request = rig.request(f"echo partial; exec sh -c 'sleep 30' {marker}")
    events = rig.backend.execute(request, None)
    first = await anext(events)
    assert isinstance(first, OutputChunk) and first.data == b"partial\n"
    async with asyncio.timeout(BOUND_S):
        assert await rig.backend.cancel(request.exec_id) is True
        rest = [event async for event in events]
    result = rest[-1]
    assert isinstance(result, ExecutionResult)
    assert (result.status, result.reason, result.exit_code) == ("cancelled", "killed", 130)
    assert result.stdout == b"partial\n"
    assert await rig.leftovers(request.exec_id, marker) == []
    # Finished: a second kill is a no-op.
    assert await rig.backend.cancel(request.exec_id) is False


async def test_cancel_unknown_is_false(rig: Rig) -> None:
    assert await rig.backend.cancel("no-such-execution") is False


async def test_cancelled_consumer_kills_the_program(rig: Rig) -> None:
    marker = f"consumer-{uuid.uuid4().hex}"
    request = rig.request(f"echo started; exec sh -c 'sleep 30' {marker}")
    first_chunk = asyncio.Event()

    async def consume() -> None:
        async for event in rig.backend.execute(request, None):
            if isinstance(event, OutputChunk):
                first_chunk.set()

    task = asyncio.create_task(consume())
    await asyncio.wait_for(first_chunk.wait(), 20)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    # The cleanup is shielded and owned by the backend: it finishes without the consumer.
    for _ in range(100):
        if not await rig.leftovers(request.exec_id, marker):
            break
        await asyncio.sleep(0.1)
    assert await rig.leftovers(request.exec_id, marker) == []


async def test_closing_the_stream_early_kills_the_program(rig: Rig) -> None:
    marker = f"early-{uuid.uuid4().hex}"
    request = rig.request(f"echo started; exec sh -c 'sleep 30' {marker}")
    async with closing_stream(rig.backend.execute(request, None)) as events:
        async for _event in events:
            break
    assert await rig.leftovers(request.exec_id, marker) == []
    assert await rig.backend.cancel(request.exec_id) is False


async def test_ten_megabytes_of_output_are_truncated_quickly(rig: Rig) -> None:
    async with asyncio.timeout(BOUND_S):
        result = await rig.run("head -c 10000000 /dev/zero | tr '\\0' x; echo done >&2")
    assert result.status == "completed"
    assert result.stdout_truncated and not result.stderr_truncated
    assert len(result.stdout) == MIB and result.stdout == b"x" * MIB
    assert result.stdout_total == 10_000_000
    assert result.stderr == b"done\n"
    assert rig.streamed("stdout") == result.stdout  # chunks are exactly the kept bytes
    assert any(d.code == "outputTruncated" for d in result.diagnostics)


async def test_truncation_keeps_whole_utf8_characters(rig: Rig) -> None:
    result = await rig.run("printf 'a\\303\\251\\303\\251\\303\\251'", max_stdout=4)
    assert result.stdout == "aé".encode() and result.stdout_truncated  # not 'aé' + half an é
    assert result.stdout_total == 7


async def test_network_disabled_means_no_connection(rig: Rig, listener: Listener) -> None:
    policy = rig.policy()
    language, source = rig.connect_program(listener.port)
    if not rig.backend.capabilities.enforces_network:
        # Fail closed: a network-disabled request is refused where it cannot be enforced.
        disabled = host_local().replace(network="disabled")
        with pytest.raises(UnsupportedPolicy):
            validate_request(rig.request(source, policy=disabled), rig.backend.capabilities)
        return
    assert policy.network == "disabled"
    result = await rig.run(source, language=language, policy=policy)
    assert result.status == "failed", result
    assert await listener.settled() == 0


async def test_hub_environment_is_invisible(rig: Rig, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AGORA_SECRET", "hub-secret-value")
    monkeypatch.setenv("AGORA_OTHER", "other")
    # As an operator would configure an instance that lets requests set GREETING.
    policy = rig.base.replace(environment=EnvironmentPolicy.allow_list(["GREETING"]))
    result = await rig.run("env", env={"GREETING": "hello there"}, policy=policy)
    assert result.status == "completed"
    assert b"hub-secret-value" not in result.stdout and b"AGORA_" not in result.stdout
    assert b"GREETING=hello there\n" in result.stdout
    assert b"PATH=" in result.stdout


async def test_environment_outside_the_allow_list_is_rejected(rig: Rig) -> None:
    with pytest.raises(Rejected):
        await rig.run("env", env={"NOT_ALLOWED": "x"})
    with pytest.raises(Rejected):
        rig.policy(environment=EnvironmentPolicy.allow_list(["ANYTHING"]))


async def test_workspace_files_written_are_kept(rig: Rig, tmp_path: Path) -> None:
    (tmp_path / "input.txt").write_text("from the workspace\n")
    result = await rig.run(
        "cat input.txt; mkdir -p out; echo written > out/result.txt",
        workdir=tmp_path,
        policy=rig.workspace_policy(),
    )
    assert result.status == "completed", result
    assert result.stdout == b"from the workspace\n"
    assert (tmp_path / "out" / "result.txt").read_text() == "written\n"


async def test_working_directory_inside_the_workspace(rig: Rig, tmp_path: Path) -> None:
    result = await rig.run(
        "pwd; echo here > here.txt", workdir=tmp_path, cwd="sub/dir", policy=rig.workspace_policy()
    )
    assert result.status == "completed", result
    assert result.stdout.rstrip().endswith(b"/sub/dir")
    assert (tmp_path / "sub" / "dir" / "here.txt").read_text() == "here\n"


async def test_read_only_workspace(rig: Rig, tmp_path: Path) -> None:
    (tmp_path / "input.txt").write_text("read me\n")
    if "workspaceReadOnly" not in rig.backend.capabilities.filesystem_modes:
        # The process backend cannot make anything read-only: the request is refused.
        read_only = rig.base.replace(filesystem=FilesystemPolicy.workspace_read_only())
        with pytest.raises(UnsupportedPolicy):
            await rig.run("cat input.txt", workdir=tmp_path, policy=read_only)
        return
    result = await rig.run(
        "cat input.txt; echo x > new.txt",
        workdir=tmp_path,
        policy=rig.workspace_policy(read_only=True),
    )
    assert result.status == "failed"
    assert result.stdout == b"read me\n"
    assert b"Read-only file system" in result.stderr
    assert not (tmp_path / "new.txt").exists()


async def test_unsupported_language_is_refused_before_running(rig: Rig) -> None:
    request = rig.request("fn run() {}", language=ExecutionLanguage.RUST)
    with pytest.raises(UnsupportedLanguage):
        await rig.run_request(request)
    wasm = ExecutionRequest(exec_id="w1", payload=GuestModule(b"\0asm\1\0\0\0"), policy=rig.base)
    with pytest.raises(InvalidRequest):
        await rig.run_request(wasm)


async def test_limits_the_backend_cannot_enforce_are_refused(rig: Rig) -> None:
    caps = rig.backend.capabilities
    policy = rig.base.replace(memory_bytes=64 * MIB)
    if caps.enforces_memory:
        result = await rig.run("true", policy=policy)
        assert result.status == "completed"
    else:
        with pytest.raises(UnsupportedPolicy):
            await rig.run("true", policy=policy)


async def test_a_running_id_is_busy(rig: Rig) -> None:
    request = rig.request("sleep 5")
    async with closing_stream(rig.backend.execute(request, None)) as events:

        async def first() -> ExecutionEvent:
            return await anext(events)

        task = asyncio.create_task(first())
        await asyncio.sleep(0.5 if rig.is_container else 0.1)
        with pytest.raises(Busy):
            await rig.run_request(request)
        await rig.backend.cancel(request.exec_id)
        with contextlib.suppress(StopAsyncIteration):
            await task


async def test_concurrent_executions(rig: Rig) -> None:
    results = await asyncio.gather(*(rig.run(f"echo {i}; exit {i}") for i in range(6)))
    assert [r.stdout for r in results] == [f"{i}\n".encode() for i in range(6)]
    assert [r.exit_code for r in results] == list(range(6))


async def test_closed_backend_is_unavailable(rig: Rig) -> None:
    await rig.backend.aclose()
    ok, why = rig.backend.available()
    assert not ok and why
    with pytest.raises(BackendUnavailable):
        await rig.run("true")
    await rig.backend.aclose()  # idempotent
