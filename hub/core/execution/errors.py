"""Execution errors: one class per stable execution code, each also a :mod:`hub.core.errors` class.

Every error a backend, the validators or a pipeline raises is an :class:`ExecutionError`. Two
codes travel with it:

* ``exec_code`` — the execution taxonomy (adk-code's ``ExecutionError``/``CodeError`` codes,
  camelCase): ``unsupportedPolicy``, ``unsupportedLanguage``, ``compileFailed``, ``timeout``,
  ``executionFailed``, ``rejected``, ``invalidRequest``, ``internal``, ``dependencyNotFound``,
  ``sandbox``, ``invalidCode``, ``unavailable``. It is also put in ``details["execCode"]`` so it
  reaches the wire inside the ``error`` frame.
* ``code`` — the wire error code, inherited from the :mod:`hub.core.errors` class it subclasses, so
  the server's one error table maps execution errors like any other.

===================== ======================== ====================================
class                 exec_code                wire code (blame)
===================== ======================== ====================================
UnsupportedPolicy     unsupportedPolicy        badRequest (client)
UnsupportedLanguage   unsupportedLanguage      badRequest (client)
InvalidRequest        invalidRequest           badRequest (client)
InvalidCode           invalidCode              badRequest (client)
CompileFailed         compileFailed            badRequest (client)
DependencyNotFound    dependencyNotFound       badRequest (client)
ExecutionTimeout      timeout                  badRequest (client)
Rejected              rejected                 forbidden (client)
BackendUnavailable    unavailable              unavailable (server)
ExecutionFailed       executionFailed          internal (server)
SandboxError          sandbox                  internal (server)
ExecutionInternal     internal                 internal (server)
===================== ======================== ====================================

Outcomes of the *program* (it timed out, exited non-zero, was killed) are never raised by a
backend: they are an :class:`hub.core.execution.result.ExecutionResult`. ``CompileFailed`` and
``ExecutionTimeout`` exist for multi-phase pipelines (e.g. Rust's check phase) and LLM tools.

Pure: no I/O.
"""

from __future__ import annotations

from typing import Any, ClassVar, Final

from hub.core.errors import AgoraError, BadRequest, Forbidden, Internal, Unavailable

__all__ = [
    "EXEC_CODES",
    "BackendUnavailable",
    "CompileFailed",
    "DependencyNotFound",
    "ExecutionError",
    "ExecutionFailed",
    "ExecutionInternal",
    "ExecutionTimeout",
    "InvalidCode",
    "InvalidRequest",
    "Rejected",
    "SandboxError",
    "UnsupportedLanguage",
    "UnsupportedPolicy",
]


class ExecutionError(AgoraError):
    """Root of the execution errors. ``exec_code`` is stable; ``code`` is the wire code."""

    exec_code: ClassVar[str] = "internal"

    def __init__(self, message: str, **details: Any) -> None:
        details.setdefault("execCode", self.exec_code)
        super().__init__(message, **details)


class UnsupportedPolicy(ExecutionError, BadRequest):
    """The backend cannot enforce a control the policy asks for (fail-closed refusal).
    ``details['control']`` names it: network, filesystem, environment, timeout, memory, pids,
    cpu."""

    exec_code = "unsupportedPolicy"


class UnsupportedLanguage(ExecutionError, BadRequest):
    """The backend does not run this language. ``details``: ``language``, ``supported``."""

    exec_code = "unsupportedLanguage"


class InvalidRequest(ExecutionError, BadRequest, ValueError):
    """The request or policy is malformed. ``details['field']`` names the field.

    Also a :class:`ValueError`, so ``msgspec`` reports it as a validation error when it is
    raised while decoding a policy or request from JSON.
    """

    exec_code = "invalidRequest"


class InvalidCode(ExecutionError, BadRequest):
    """The source fails a pre-execution check (e.g. a Rust source defining ``fn main``)."""

    exec_code = "invalidCode"


class CompileFailed(ExecutionError, BadRequest):
    """Compilation failed. ``details['diagnostics']``: the parsed diagnostics."""

    exec_code = "compileFailed"


class DependencyNotFound(ExecutionError, BadRequest):
    """A dependency the code needs is missing. ``details['searched']``: places looked in."""

    exec_code = "dependencyNotFound"


class ExecutionTimeout(ExecutionError, BadRequest):
    """A pipeline phase ran out of time (backends report a timed-out run as a result)."""

    exec_code = "timeout"


class Rejected(ExecutionError, Forbidden):
    """The request asks for more than the backend instance allows (a policy wider than the
    instance's defaults, an environment variable outside the allow-list, a larger limit).
    ``details['field']`` names the control."""

    exec_code = "rejected"


class BackendUnavailable(ExecutionError, Unavailable):
    """The backend cannot run anything now (no engine, image missing, shutting down).
    ``details['backend']`` names it."""

    exec_code = "unavailable"


class ExecutionFailed(ExecutionError, Internal):
    """The backend failed to run the program (spawn failed, engine error mid-run)."""

    exec_code = "executionFailed"


class SandboxError(ExecutionError, Internal):
    """Setting up the sandbox failed (namespace, mount, container creation)."""

    exec_code = "sandbox"


class ExecutionInternal(ExecutionError, Internal):
    """A bug or an unexpected state in a backend."""

    exec_code = "internal"


EXEC_CODES: Final[dict[str, type[ExecutionError]]] = {
    cls.exec_code: cls
    for cls in (
        UnsupportedPolicy,
        UnsupportedLanguage,
        CompileFailed,
        ExecutionTimeout,
        ExecutionFailed,
        Rejected,
        InvalidRequest,
        ExecutionInternal,
        DependencyNotFound,
        SandboxError,
        InvalidCode,
        BackendUnavailable,
    )
}
"""Every execution code and its class."""
