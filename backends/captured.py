"""What one execution's output came to, and the result built from it. Pure.

* :class:`CapturedOutput` holds both streams of one execution: each stream's
  :class:`~backends.harness.OutputCap`, the bytes it kept, how much the program wrote. It is fed
  by :class:`backends.output.OutputChannel` (loop-side, with back-pressure) or
  :class:`backends.sink.ThreadedOutput` (from a worker thread).
* :func:`captured_result` is the :class:`ExecutionResult` of a run that produced such output,
  the same way for every backend: the kept bytes, the truncation flags and totals, the
  structured ``value`` when the harness rule applies, and one warning per truncated stream
  after the backend's own notes.
* :func:`not_run_result` is the result of a run whose program never ran (it could not be
  started or compiled): the message on stderr and as an error diagnostic.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, Final

import msgspec

from backends.harness import OutputCap, extract_value
from hub.core.execution.result import (
    Diagnostic,
    ExecutionMetadata,
    ExecutionReason,
    ExecutionResult,
    ExecutionStatus,
    Stream,
)

__all__ = ["STREAMS", "CapturedOutput", "captured_result", "not_run_result"]

STREAMS: Final[tuple[Stream, Stream]] = ("stdout", "stderr")


class CapturedOutput:
    """The two capped streams of one execution and what they kept.

    Subclasses feed it (they add kept bytes to ``_kept[stream]``); the readers below are what
    :func:`captured_result` needs.
    """

    def __init__(self, max_stdout: int, max_stderr: int) -> None:
        self.caps: dict[Stream, OutputCap] = {
            "stdout": OutputCap(max_stdout),
            "stderr": OutputCap(max_stderr),
        }
        self._kept: dict[Stream, bytearray] = {"stdout": bytearray(), "stderr": bytearray()}

    def kept(self, stream: Stream) -> bytes:
        """The bytes of ``stream`` kept so far (at most its cap)."""
        return bytes(self._kept[stream])

    def truncated(self, stream: Stream) -> bool:
        return self.caps[stream].truncated

    def total(self, stream: Stream) -> int:
        """How many bytes the program wrote to ``stream`` (kept or not)."""
        return self.caps[stream].total

    def truncation_notes(self) -> list[Diagnostic]:
        """One warning per truncated stream: the cap and how much the program wrote."""
        return [
            Diagnostic(
                level="warning",
                code="outputTruncated",
                message=f"{stream} truncated at {self.caps[stream].limit} bytes "
                f"({self.caps[stream].total} bytes written)",
            )
            for stream in STREAMS
            if self.caps[stream].truncated
        ]


def captured_result(
    output: CapturedOutput,
    outcome: tuple[ExecutionStatus, ExecutionReason, int],
    *,
    duration_ms: int,
    metadata: ExecutionMetadata,
    notes: Iterable[Diagnostic] = (),
    value: Any = msgspec.UNSET,
    structured: bool = False,
) -> ExecutionResult:
    """The result of a run whose output ``output`` captured.

    ``outcome``: ``(status, reason, exit code)``, as :func:`~hub.core.execution.result.classify`
    gives
    it. ``notes``: the backend's diagnostics; the truncation warnings follow them.
    ``structured``: the value is stdout's last line when it is JSON
    (:func:`~backends.harness.extract_value`, which also takes it off the displayed stdout),
    unless stdout was truncated; otherwise ``value`` is the result's value.
    """
    status, reason, exit_code = outcome
    stdout = output.kept("stdout")
    if structured and not output.truncated("stdout"):
        stdout, value = extract_value(stdout)
    return ExecutionResult(
        status=status,
        reason=reason,
        exit_code=exit_code,
        stdout=stdout,
        stderr=output.kept("stderr"),
        value=value,
        stdout_truncated=output.truncated("stdout"),
        stderr_truncated=output.truncated("stderr"),
        stdout_total=output.total("stdout"),
        stderr_total=output.total("stderr"),
        duration_ms=duration_ms,
        metadata=metadata,
        diagnostics=[*notes, *output.truncation_notes()],
    )


def not_run_result(
    reason: ExecutionReason,
    exit_code: int,
    message: str,
    *,
    code: str | None = None,
    duration_ms: int,
    metadata: ExecutionMetadata,
) -> ExecutionResult:
    """``failed/<reason>`` for a program that never ran: ``message`` is its stderr (one line)
    and an error diagnostic (``code``)."""
    stderr = message.encode("utf-8", "replace") + b"\n"
    return ExecutionResult(
        status="failed",
        reason=reason,
        exit_code=exit_code,
        stderr=stderr,
        stderr_total=len(stderr),
        duration_ms=duration_ms,
        metadata=metadata,
        diagnostics=[Diagnostic(level="error", code=code, message=message)],
    )
