"""How a run's outcome becomes its ``execFinished`` payload when the runtime, not the backend,
decides it: a failure of the machinery, a kill before the run started, a stop the backend did
not carry out in time, the stderr note of a kill or a shutdown, a value or diagnostics too deep
or too large for the log (:func:`bounded`). Pure.

A backend's own :class:`~hub.core.execution.result.ExecutionResult` becomes the payload through
:meth:`ExecutionResult.finished_payload`; everything here ends in the same
:class:`~hub.core.events.ExecFinishedPayload`, so ``execResult`` reads one shape whoever
decided.
"""

from __future__ import annotations

from typing import Any, Final

import msgspec

from backends.base import Diagnostic, ExecutionResult
from hub.core.decoding import value_too_deep
from hub.core.errors import AgoraError, ClientError
from hub.core.events import ExecFinished, ExecFinishedPayload, encode_event
from hub.core.execution.errors import ExecutionError
from hub.core.execution.result import CANCEL_EXIT_CODE, ExecutionStatus
from hub.core.validation import ENVELOPE_RESERVE, Limits

__all__ = [
    "CANCELLED_NOTE",
    "OUTPUT_LIMIT",
    "SHUTDOWN_NOTE",
    "bounded",
    "failed",
    "forced_result",
    "raised",
    "stop_note",
    "stopped_before_start",
]

SHUTDOWN_NOTE: Final = b"interrupted when the hub shut down\n"
OUTPUT_LIMIT: Final = "outputLimit"
"""The reason of a run whose value or diagnostics could not be stored as they came back."""
CANCELLED_NOTE: Final = b"Execution cancelled.\n"


def failed(
    exec_id: str,
    reason: str,
    message: str,
    *,
    code: str | None = None,
    status: ExecutionStatus = "failed",
) -> ExecFinishedPayload:
    """A run the runtime ends itself, with one error diagnostic (``code`` defaults to
    ``reason``)."""
    diagnostic: dict[str, Any] = {"level": "error", "code": code or reason, "message": message}
    return ExecFinishedPayload(
        exec_id=exec_id, status=status, reason=reason, diagnostics=[diagnostic]
    )


def raised(exec_id: str, error: BaseException, *, shutdown: bool = False) -> ExecFinishedPayload:
    """What the backend raised instead of yielding a result: ``rejected`` for a refusal the
    client caused, else ``error``; the execution error's own code when it has one. During
    the hub's stop (``shutdown``) it is ``interrupted``, as every run the stop ends: the
    backend raised because the stop gave up on it (``close_grace_s``)."""
    blame = "rejected" if isinstance(error, ClientError) else "error"
    if shutdown:
        blame = "interrupted"
    if isinstance(error, ExecutionError):
        return failed(exec_id, blame, error.message, code=error.exec_code)
    if isinstance(error, AgoraError):
        return failed(exec_id, blame, error.message, code=error.code)
    return failed(exec_id, blame, repr(error), code="internal")


def stopped_before_start(exec_id: str, *, shutdown: bool, pushed: int) -> ExecFinishedPayload:
    """A run stopped (``kill``, or the hub shutting down) before the program started."""
    if shutdown:
        return msgspec.structs.replace(
            failed(exec_id, "interrupted", "the hub shut down before the execution started"),
            pushed=pushed,
        )
    return ExecFinishedPayload(
        exec_id=exec_id,
        status="cancelled",
        reason="killed",
        exit_code=CANCEL_EXIT_CODE,
        pushed=pushed,
        diagnostics=[{"level": "note", "code": "killed", "message": "Execution cancelled."}],
    )


def forced_result(backend: str, elapsed_s: float) -> ExecutionResult:
    """The result of a run the runtime closed itself after a stop the backend did not carry
    out in time (the output is what was journaled; truncation is unknown)."""
    return ExecutionResult(
        status="cancelled",
        reason="killed",
        exit_code=CANCEL_EXIT_CODE,
        duration_ms=int(elapsed_s * 1000),
        diagnostics=[
            Diagnostic(code="killed", message="Execution cancelled."),
            Diagnostic(
                level="warning",
                code="forcedStop",
                message=f"backend {backend!r} did not stop the run in time; the runtime closed it",
            ),
        ],
    )


def stop_note(
    result: ExecutionResult, finished: ExecFinishedPayload, *, stopped: bool, shutdown: bool
) -> tuple[bytes, ExecFinishedPayload] | None:
    """The stderr note for a run stopped by ``kill`` (``stopped``) or by shutdown, and the
    payload (a shutdown records it as ``failed/interrupted``); ``None`` for any other run."""
    if result.status != "cancelled" or not stopped:
        return None
    if shutdown:
        return SHUTDOWN_NOTE, msgspec.structs.replace(
            finished, status="failed", reason="interrupted"
        )
    return CANCELLED_NOTE, finished


def bounded(finished: ExecFinishedPayload, limits: Limits) -> ExecFinishedPayload:
    """``finished`` if its ``execFinished`` fits the log, else the run as ``failed/outputLimit``
    without the value and the backend's diagnostics, with one diagnostic naming the limit.

    What comes back from a backend (python's return value, a harness's last stdout line, the
    diagnostics) is the guest's to choose: nested deeper than ``[limits] max_depth`` it would be
    refused by the log's decode policy (and, stored, break recursive readers); larger than
    ``max_event_bytes`` the event could not be written. Either way the run must still end with
    an ``execFinished`` that ``execResult`` reads and a restart replays."""
    too_deep = value_too_deep(finished.value, limits.max_depth) or value_too_deep(
        finished.diagnostics, limits.max_depth
    )
    if too_deep:
        message = (
            f"the execution's value or diagnostics are nested deeper than the limit of "
            f"{limits.max_depth} levels ([limits] max_depth); they were not kept"
        )
        return _over(finished, message)
    size = len(encode_event(ExecFinished(payload=finished))) + ENVELOPE_RESERVE
    if size > limits.max_event_bytes:
        message = (
            f"the execution's value and diagnostics take about {size} bytes; an event holds at "
            f"most {limits.max_event_bytes} ([limits] max_event_bytes); they were not kept"
        )
        return _over(finished, message)
    return finished


def _over(finished: ExecFinishedPayload, message: str) -> ExecFinishedPayload:
    diagnostic: dict[str, Any] = {"level": "error", "code": OUTPUT_LIMIT, "message": message}
    return msgspec.structs.replace(
        finished, status="failed", reason=OUTPUT_LIMIT, value=None, diagnostics=[diagnostic]
    )
