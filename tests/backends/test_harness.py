"""Output caps, UTF-8-safe truncation, structured output (backends/harness.py), the status
mapping (hub/core/execution/result.py) and the output channel (backends/output.py)."""

from __future__ import annotations

import asyncio

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from backends.harness import OutputCap, extract_value, incomplete_tail, truncate_utf8, utf8_cut
from backends.output import OutputChannel
from hub.core.events import ExecFinishedPayload
from hub.core.execution.result import ExecutionResult, OutputChunk, classify, signal_exit_code


def test_truncate_keeps_whole_characters() -> None:
    data = "aé€😀".encode()  # 1 + 2 + 3 + 4 bytes
    assert [truncate_utf8(data, n)[0].decode() for n in range(11)] == [
        "",
        "a",
        "a",
        "aé",
        "aé",
        "aé",
        "aé€",
        "aé€",
        "aé€",
        "aé€",
        "aé€😀",
    ]
    assert truncate_utf8(data, 10) == (data, False)
    assert truncate_utf8(data, 9)[1] is True


def test_non_utf8_bytes_are_cut_where_asked() -> None:
    assert utf8_cut(b"\xff\xfe\xfd\xfc", 2) == 2
    assert utf8_cut(b"\x80\x80\x80\x80\x80", 4) == 4


@given(st.text(), st.integers(0, 64))
def test_truncation_is_a_valid_utf8_prefix(text: str, limit: int) -> None:
    data = text.encode()
    cut, truncated = truncate_utf8(data, limit)
    assert data.startswith(cut) and len(cut) <= limit
    cut.decode()  # never raises: no half character
    assert truncated == (len(data) > limit)
    assert len(cut) >= min(len(data), limit) - 3


@given(st.text(), st.integers(0, 64), st.lists(st.integers(1, 7), max_size=20))
def test_cap_over_any_chunking_keeps_a_valid_prefix(
    text: str, limit: int, sizes: list[int]
) -> None:
    data = text.encode()
    cap = OutputCap(limit)
    kept = b""
    pos = 0
    for size in [*sizes, len(data)]:
        piece = cap.feed(data[pos : pos + size])
        piece.decode()  # every piece ends on a character boundary
        kept += piece
        pos += size
    kept += cap.flush()
    assert kept == truncate_utf8(data, limit)[0]
    assert cap.truncated == (len(data) > limit)
    assert cap.total == len(data) and cap.kept == len(kept)


def test_incomplete_tail() -> None:
    assert incomplete_tail(b"abc") == 0
    assert incomplete_tail("é".encode()[:1]) == 1
    assert incomplete_tail("😀".encode()[:3]) == 3
    assert incomplete_tail("😀".encode()) == 0
    assert incomplete_tail(b"\xff") == 0


def test_extract_value() -> None:
    assert extract_value(b'log line\n{"a": [1, 2]}\n') == (b"log line\n", {"a": [1, 2]})
    assert extract_value(b"42") == (b"", 42)
    assert extract_value(b"plain\ntext\n") == (b"plain\ntext\n", msgspec.UNSET)
    assert extract_value(b"") == (b"", msgspec.UNSET)
    assert extract_value(b"x\n\n") == (b"x\n\n", msgspec.UNSET)
    assert extract_value(b"\xff\n") == (b"\xff\n", msgspec.UNSET)


@pytest.mark.parametrize(
    ("exit_code", "flags", "expected"),
    [
        (0, {}, ("completed", "exit", 0)),
        (1, {}, ("failed", "exit", 1)),
        (2, {}, ("failed", "exit", 2)),
        (129, {}, ("cancelled", "killed", 129)),
        (130, {}, ("cancelled", "killed", 130)),
        (137, {}, ("cancelled", "killed", 137)),
        (143, {}, ("cancelled", "killed", 143)),
        (None, {}, ("failed", "error", -1)),
        (137, {"cancelled": True}, ("cancelled", "killed", 130)),
        (0, {"cancelled": True}, ("cancelled", "killed", 130)),
        (143, {"timed_out": True}, ("failed", "timeout", 124)),
        (137, {"memory_exceeded": True}, ("failed", "memoryLimit", 137)),
        (0, {"memory_exceeded": True}, ("completed", "exit", 0)),
    ],
)
def test_classify(
    exit_code: int | None, flags: dict[str, bool], expected: tuple[str, str, int]
) -> None:
    assert classify(exit_code, **flags) == expected


def test_signal_exit_code() -> None:
    assert signal_exit_code(-9) == 137 and signal_exit_code(-15) == 143
    assert signal_exit_code(3) == 3 and signal_exit_code(None) is None


def test_result_json_and_finished_payload() -> None:
    result = ExecutionResult(
        status="completed", reason="exit", exit_code=0, stdout=b"hi", value={"x": 1}
    )
    data = msgspec.json.decode(msgspec.json.encode(result))
    assert data["exitCode"] == 0 and data["value"] == {"x": 1} and data["stdout"] == "aGk="
    payload = result.finished_payload("e1", pushed=2)
    assert isinstance(payload, ExecFinishedPayload)
    assert (payload.exec_id, payload.status, payload.value, payload.pushed) == (
        "e1",
        "completed",
        {"x": 1},
        2,
    )
    assert not ExecutionResult(status="failed", reason="error").has_value


async def test_channel_caps_and_orders_chunks() -> None:
    channel = OutputChannel(5, 100)
    await channel.feed("stdout", b"abc")
    await channel.feed("stderr", b"E")
    await channel.feed("stdout", b"defgh")
    channel.close("stdout")
    channel.close("stderr")
    got = []
    while (chunk := await channel.get()) is not None:
        got.append(chunk)
    assert got == [
        OutputChunk("stdout", b"abc"),
        OutputChunk("stderr", b"E"),
        OutputChunk("stdout", b"de"),
    ]
    assert channel.kept("stdout") == b"abcde" and channel.truncated("stdout")
    assert channel.total("stdout") == 8 and not channel.truncated("stderr")


async def test_channel_back_pressure_and_close_never_waits() -> None:
    channel = OutputChannel(1 << 20, 1 << 20, queue_size=2)
    await channel.feed("stdout", b"1")
    await channel.feed("stdout", b"2")
    blocked = asyncio.create_task(channel.feed("stdout", b"3"))
    await asyncio.sleep(0.01)
    assert not blocked.done()  # the queue is full: the producer waits
    channel.close("stderr")  # closing never waits, even with a full queue
    assert await channel.get() == OutputChunk("stdout", b"1")
    await asyncio.wait_for(blocked, 1)
    channel.close("stdout")
    rest = []
    while (chunk := await channel.get()) is not None:
        rest.append(chunk.data)
    assert rest == [b"2", b"3"]
