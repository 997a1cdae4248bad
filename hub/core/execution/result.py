"""What came out: output chunks, the :class:`ExecutionResult`, and the status mapping. Pure.

Vocabulary (ARCHITECTURE.md "Execution model", reconciling seed 003 with adk-code):
``status`` is ``completed | failed | cancelled``; ``reason`` carries the finer cause.

===================== =========== ============== ==========================================
what happened         status      reason         exitCode
===================== =========== ============== ==========================================
exited 0              completed   exit           0
exited non-zero       failed      exit           the code
exit 129/130/137/143  cancelled   killed         the code (a signal from elsewhere: seed 003)
kill / cancel         cancelled   killed         130 (the runtime's convention)
ran out of time       failed      timeout        124 (as ``timeout(1)``)
memory limit hit      failed      memoryLimit    the code (137 when the kernel killed it)
no exit status        failed      error          -1
===================== =========== ============== ==========================================

Further reasons, set by other layers: ``compileFailed`` and ``rejected`` (refused before it
ran), ``interrupted`` (the hub restarted under it), ``outputLimit`` (a backend that stops a
program at its output cap; ``process`` and ``container`` keep it running and only truncate).
"""

from __future__ import annotations

from typing import Any, Final, Literal

import msgspec

from hub.core.events import ArtifactRef, ExecFinishedPayload, SkippedWrite
from hub.core.execution.capabilities import ExecutionIsolation, ExecutionLanguage

__all__ = [
    "CANCELLED_EXIT_CODES",
    "CANCEL_EXIT_CODE",
    "TIMEOUT_EXIT_CODE",
    "Diagnostic",
    "ExecutionEvent",
    "ExecutionMetadata",
    "ExecutionReason",
    "ExecutionResult",
    "ExecutionStatus",
    "OutputChunk",
    "Stream",
    "classify",
    "signal_exit_code",
]

ExecutionStatus = Literal["completed", "failed", "cancelled"]
ExecutionReason = Literal[
    "exit",
    "timeout",
    "compileFailed",
    "rejected",
    "killed",
    "interrupted",
    "outputLimit",
    "memoryLimit",
    "error",
]
Stream = Literal["stdout", "stderr"]

CANCELLED_EXIT_CODES: Final[frozenset[int]] = frozenset({129, 130, 137, 143})
CANCEL_EXIT_CODE: Final = 130
TIMEOUT_EXIT_CODE: Final = 124


class OutputChunk(msgspec.Struct, frozen=True):
    """Bytes a program wrote to one stream, in order, within that stream's cap."""

    stream: Stream
    data: bytes


class Diagnostic(msgspec.Struct, frozen=True, kw_only=True, omit_defaults=True):
    """A note about the run: why it stopped, a compiler message. ``data``: structured extras
    (e.g. rustc spans)."""

    level: Literal["error", "warning", "note"] = "note"
    message: str
    code: str | None = None
    data: Any = None


class ExecutionMetadata(
    msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True
):
    """Telemetry and audit: which backend ran what, for whom, and the artifacts it produced."""

    backend: str
    language: ExecutionLanguage
    isolation: ExecutionIsolation
    identity: str | None = None
    artifacts: list[ArtifactRef] = []
    image: str | None = None
    warm: bool = False


class ExecutionResult(
    msgspec.Struct, frozen=True, kw_only=True, rename="camel", omit_defaults=True
):
    """The outcome of one execution.

    ``stdout``/``stderr`` are the captured bytes (at most the caps; ``*_truncated`` says bytes
    were dropped, ``*_total`` how many the program wrote in all). ``value`` is the structured
    output (``UNSET`` when the program returned none; command languages never do).
    """

    status: ExecutionStatus
    reason: ExecutionReason
    exit_code: int = -1
    stdout: bytes = b""
    stderr: bytes = b""
    value: Any = msgspec.UNSET
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    stdout_total: int = 0
    stderr_total: int = 0
    duration_ms: int = 0
    metadata: ExecutionMetadata | None = None
    diagnostics: list[Diagnostic] = []
    skipped: list[SkippedWrite] = []
    """Workspace writes the program asked for and the backend refused (a host-function
    backend on a ``read`` instance): the runtime reports them in ``execFinished.skipped``."""

    @property
    def has_value(self) -> bool:
        return self.value is not msgspec.UNSET

    def finished_payload(
        self,
        exec_id: str,
        *,
        pushed: int = 0,
        pulled: int = 0,
        skipped: list[SkippedWrite] | None = None,
    ) -> ExecFinishedPayload:
        """The ``execFinished`` payload for this result (the runtime adds the sync counts)."""
        return ExecFinishedPayload(
            exec_id=exec_id,
            status=self.status,
            reason=self.reason,
            exit_code=self.exit_code,
            value=None if self.value is msgspec.UNSET else self.value,
            stdout_truncated=self.stdout_truncated,
            stderr_truncated=self.stderr_truncated,
            duration_ms=self.duration_ms,
            pushed=pushed,
            pulled=pulled,
            skipped=[*self.skipped, *(skipped or [])],
            diagnostics=[msgspec.to_builtins(d) for d in self.diagnostics],
            artifacts=list(self.metadata.artifacts) if self.metadata else [],
        )


ExecutionEvent = OutputChunk | ExecutionResult
"""What :meth:`backends.base.CodeExecutor.execute` yields: chunks, then one result."""


def signal_exit_code(returncode: int | None) -> int | None:
    """A POSIX wait status as a shell would report it: a negative ``returncode`` (killed by
    signal N, as :mod:`subprocess` reports it) becomes ``128 + N``."""
    if returncode is None:
        return None
    return 128 - returncode if returncode < 0 else returncode


def classify(
    exit_code: int | None,
    *,
    cancelled: bool = False,
    timed_out: bool = False,
    memory_exceeded: bool = False,
) -> tuple[ExecutionStatus, ExecutionReason, int]:
    """``(status, reason, exit code)`` for a finished run (see the module table).

    What the backend knows beats the exit code: a kill it was asked for is ``cancelled``
    (exit 130) even if the program died of SIGKILL; a timeout is ``failed/timeout`` (exit 124);
    a memory-limit kill is ``failed/memoryLimit``. Otherwise seed 003's mapping applies.
    """
    if cancelled:
        return "cancelled", "killed", CANCEL_EXIT_CODE
    if timed_out:
        return "failed", "timeout", TIMEOUT_EXIT_CODE
    if exit_code is None:
        return "failed", "error", -1
    if memory_exceeded and exit_code != 0:
        return "failed", "memoryLimit", exit_code
    if exit_code == 0:
        return "completed", "exit", 0
    if exit_code in CANCELLED_EXIT_CODES:
        return "cancelled", "killed", exit_code
    return "failed", "exit", exit_code
