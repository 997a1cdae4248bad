"""Reading an execution's output: the ``execResult`` body and text decoding. Pure.

Output is journaled as bytes (``execOutput.data``). It becomes text only when it is read, and
only when the execution asked for ``encoding: "utf8"``: each stream has its own incremental
UTF-8 decoder (a character split across two chunks, or across stdout/stderr interleaving,
decodes whole), and invalid bytes become U+FFFD. Otherwise the bytes travel as base64.
"""

from __future__ import annotations

import base64
import codecs
from typing import Any, Final, Literal

import msgspec

from backends.harness import extract_value
from hub.core.execution.result import Stream
from hub.core.projections.executions import ExecRecord
from hub.core.wire.frames import RuntimeResult, SkippedEntry

__all__ = ["Encoding", "TextDecoders", "encoding_of", "runtime_result"]

Encoding = Literal["utf8", "base64"]
_STREAMS: Final[tuple[Stream, Stream]] = ("stdout", "stderr")


def encoding_of(value: str | None) -> Encoding:
    """The output encoding an execution asked for (anything but ``utf8`` is base64)."""
    return "utf8" if value == "utf8" else "base64"


class TextDecoders:
    """One incremental UTF-8 decoder per stream (invalid bytes → U+FFFD), for one reader."""

    __slots__ = ("_decoders",)

    def __init__(self) -> None:
        factory = codecs.getincrementaldecoder("utf-8")
        self._decoders = {stream: factory(errors="replace") for stream in _STREAMS}

    def decode(self, stream: Stream, data: bytes, *, final: bool = False) -> str:
        return self._decoders[stream].decode(data, final)


def _render(data: bytes, encoding: Encoding, stream: Stream) -> str:
    if encoding == "utf8":
        return TextDecoders().decode(stream, data, final=True)
    return base64.b64encode(data).decode("ascii")


def runtime_result(
    record: ExecRecord, encoding: Encoding, *, value_from_stdout: bool = False
) -> RuntimeResult:
    """The ``execResult`` body of a finished ``record`` (its ``output`` folded from the log).

    ``value_from_stdout``: the backend's harness took the value from the last stdout line
    (adk-code's rule: ``process``'s python, ``wasm``, ``rust``); that line was journaled as
    output and is left out of ``stdout`` here, as the backend's own result does.
    Raises ``ValueError`` if ``record`` has not finished.
    """
    finished = record.result
    if finished is None:
        raise ValueError(f"execution {record.exec_id!r} has not finished")
    stdout = record.stream_bytes("stdout")
    value: Any = msgspec.UNSET if finished.value is None else finished.value
    if value_from_stdout and value is not msgspec.UNSET and not finished.stdout_truncated:
        shown, found = extract_value(stdout)
        if found is not msgspec.UNSET:
            stdout = shown
    return RuntimeResult(
        status=finished.status,
        reason=finished.reason,
        exit_code=finished.exit_code,
        stdout=_render(stdout, encoding, "stdout"),
        stderr=_render(record.stream_bytes("stderr"), encoding, "stderr"),
        encoding=encoding,
        value=value,
        stdout_truncated=finished.stdout_truncated,
        stderr_truncated=finished.stderr_truncated,
        duration_ms=finished.duration_ms,
        pushed=finished.pushed,
        pulled=finished.pulled,
        skipped=[SkippedEntry.of(s) for s in finished.skipped],
        diagnostics=list(finished.diagnostics) if finished.diagnostics else msgspec.UNSET,
        artifacts=list(finished.artifacts),
    )
