"""The execution errors, where users import them from; defined in
:mod:`hub.core.execution.errors`."""

from hub.core.execution.errors import (
    EXEC_CODES,
    BackendUnavailable,
    CompileFailed,
    DependencyNotFound,
    ExecutionError,
    ExecutionFailed,
    ExecutionInternal,
    ExecutionTimeout,
    InvalidCode,
    InvalidRequest,
    Rejected,
    SandboxError,
    UnsupportedLanguage,
    UnsupportedPolicy,
)

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
