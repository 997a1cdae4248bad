"""The result every backend builds from its captured output (backends/captured.py), fed
through both producers: the loop-side channel and the worker-thread sink."""

from __future__ import annotations

import asyncio

import msgspec

from backends.captured import CapturedOutput, captured_result, not_run_result
from backends.output import OutputChannel
from backends.sink import ThreadedOutput
from hub.core.execution.capabilities import ExecutionIsolation, ExecutionLanguage
from hub.core.execution.result import Diagnostic, ExecutionMetadata

META = ExecutionMetadata(
    backend="b", language=ExecutionLanguage.PYTHON, isolation=ExecutionIsolation.IN_PROCESS
)


async def _channel(stdout: bytes, stderr: bytes, cap: int) -> CapturedOutput:
    channel = OutputChannel(cap, cap)
    await channel.feed("stdout", stdout)
    await channel.feed("stderr", stderr)
    channel.close("stdout")
    channel.close("stderr")
    while await channel.get() is not None:
        pass
    return channel


async def _sink(stdout: bytes, stderr: bytes, cap: int) -> CapturedOutput:
    sink = ThreadedOutput(cap, cap)
    await asyncio.to_thread(sink.feed, "stdout", stdout)
    await asyncio.to_thread(sink.feed, "stderr", stderr)
    sink.close()
    while await sink.get() is not None:
        pass
    return sink


async def test_both_producers_give_the_same_result() -> None:
    results = []
    for make in (_channel, _sink):
        output = await make(b"0123456789", b"err\n", 6)
        results.append(
            captured_result(
                output,
                ("failed", "exit", 3),
                duration_ms=5,
                metadata=META,
                notes=[Diagnostic(message="first")],
            )
        )
    assert results[0] == results[1]
    result = results[0]
    assert (result.status, result.reason, result.exit_code) == ("failed", "exit", 3)
    assert result.stdout == b"012345" and result.stdout_truncated and result.stdout_total == 10
    assert result.stderr == b"err\n" and not result.stderr_truncated
    assert [d.code for d in result.diagnostics] == [None, "outputTruncated"]  # notes first
    assert "stdout truncated at 6 bytes (10 bytes written)" in result.diagnostics[1].message


async def test_structured_value_only_from_whole_stdout() -> None:
    whole = await _channel(b'log\n{"n": 1}\n', b"", 100)
    result = captured_result(
        whole, ("completed", "exit", 0), duration_ms=0, metadata=META, structured=True
    )
    assert result.value == {"n": 1} and result.stdout == b"log\n"
    cut = await _channel(b'log\n{"n": 1}\n', b"", 8)
    truncated = captured_result(
        cut, ("completed", "exit", 0), duration_ms=0, metadata=META, structured=True
    )
    assert not truncated.has_value and truncated.stdout == b'log\n{"n"'
    given = captured_result(
        whole, ("completed", "exit", 0), duration_ms=0, metadata=META, value=[1]
    )
    assert given.value == [1] and given.stdout == b'log\n{"n": 1}\n'


def test_not_run_result_counts_bytes() -> None:
    result = not_run_result("exit", 127, "é: not found", duration_ms=1, metadata=META)
    assert (result.status, result.reason, result.exit_code) == ("failed", "exit", 127)
    assert result.stderr == "é: not found\n".encode()
    assert result.stderr_total == len(result.stderr)
    assert result.diagnostics == [Diagnostic(level="error", message="é: not found")]
    assert result.value is msgspec.UNSET
