"""hub/runtime/results.py: the execResult body read from a journal record; text decoding."""

from __future__ import annotations

import msgspec

from hub.core.events import ExecFinishedPayload, SkippedWrite
from hub.core.projections.executions import ExecRecord, JournalChunk
from hub.core.wire.frames import SkippedEntry
from hub.runtime.results import TextDecoders, encoding_of, runtime_result


def record(*chunks: tuple[str, bytes], **finished: object) -> ExecRecord:
    rec = ExecRecord(exec_id="x", backend="process", requested_by="a", request_seq=1)
    rec.output = [JournalChunk(s, i + 1, d, i + 2) for i, (s, d) in enumerate(chunks)]  # type: ignore[arg-type]
    fields: dict[str, object] = {"exec_id": "x", "status": "completed", "reason": "exit"}
    fields.update(finished)
    rec.result = ExecFinishedPayload(**fields)  # type: ignore[arg-type]
    rec.status = rec.result.status
    return rec


def test_utf8_decodes_each_stream_whole_with_replacement() -> None:
    # "é" split across two stdout chunks, a stderr chunk between them, and an invalid byte.
    rec = record(("stdout", b"caf\xc3"), ("stderr", b"oops\xff"), ("stdout", b"\xa9!"))
    result = runtime_result(rec, "utf8")
    assert (result.stdout, result.stderr) == ("café!", "oops\ufffd")
    assert result.value is msgspec.UNSET and result.diagnostics is msgspec.UNSET


def test_base64_and_the_finished_fields() -> None:
    skipped = [SkippedWrite(path="a", mount_root=".", op="write")]
    rec = record(
        ("stdout", b"\xff"),
        status="failed",
        reason="timeout",
        exit_code=124,
        pushed=2,
        pulled=1,
        skipped=skipped,
        diagnostics=[{"code": "timeout"}],
        stdout_truncated=True,
    )
    result = runtime_result(rec, "base64")
    assert (result.stdout, result.stderr, result.encoding) == ("/w==", "", "base64")
    assert (result.status, result.reason, result.exit_code) == ("failed", "timeout", 124)
    assert (result.pushed, result.pulled, result.stdout_truncated) == (2, 1, True)
    assert msgspec.to_builtins(result.skipped) == [
        {"path": "a", "mountRoot": ".", "op": "write", "reason": "read-only"}
    ]
    assert result.diagnostics == [{"code": "timeout"}]


def test_a_skipped_entry_is_the_stored_skipped_write_with_its_reason_always_sent() -> None:
    # One definition: the frame's entry is the stored payload's type, only ``reason`` made
    # required, so the stored encoding omits the default and the frame always carries it.
    stored = SkippedWrite(path="a", mount_root=".", op="write")
    assert msgspec.json.encode(stored) == b'{"path":"a","mountRoot":".","op":"write"}'
    entry = SkippedEntry.of(stored)
    assert isinstance(entry, SkippedWrite)
    assert msgspec.json.encode(entry) == (
        b'{"path":"a","mountRoot":".","op":"write","reason":"read-only"}'
    )
    names = [f.encode_name for f in msgspec.structs.fields(SkippedWrite)]
    assert [f.encode_name for f in msgspec.structs.fields(SkippedEntry)] == names


def test_a_value_taken_from_stdout_is_left_out_of_it() -> None:
    rec = record(("stdout", b'hello\n{"v": 1}\n'), value={"v": 1})
    assert runtime_result(rec, "utf8", value_from_stdout=True).stdout == "hello\n"
    assert runtime_result(rec, "utf8").stdout == 'hello\n{"v": 1}\n'  # monty: not from stdout
    assert runtime_result(rec, "utf8").value == {"v": 1}


def test_incremental_decoders_are_per_stream() -> None:
    d = TextDecoders()
    assert d.decode("stdout", b"\xc3") == ""
    assert d.decode("stderr", b"x") == "x"
    assert d.decode("stdout", b"\xa9") == "é"
    assert encoding_of("utf8") == "utf8" and encoding_of(None) == "base64"
