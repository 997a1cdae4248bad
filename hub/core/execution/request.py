"""What to run: the payload and the :class:`ExecutionRequest`. Pure.

A request is built by the runtime from an ``exec`` op after the policy has been narrowed
(:func:`hub.core.execution.policy.narrow`); backends check it with
:func:`hub.core.execution.validate.validate_request` before they run anything.
"""

from __future__ import annotations

from typing import Any, Final, Literal

import msgspec

from hub.core.execution.capabilities import ExecutionLanguage
from hub.core.execution.policy import SandboxPolicy, strict

__all__ = [
    "UNSET",
    "ExecutionPayload",
    "ExecutionRequest",
    "GuestModule",
    "ModuleBlob",
    "Source",
]

UNSET: Final = msgspec.UNSET
"""Marks "no ``input`` given" (``None`` is the JSON value ``null``)."""


class Source(msgspec.Struct, frozen=True, tag_field="type", tag="source"):
    """Source text, interpreted by the backend and ``language`` (a shell command, a script)."""

    text: str


class GuestModule(msgspec.Struct, frozen=True, tag_field="type", tag="module"):
    """A precompiled guest module's bytes (base64 in JSON)."""

    data: bytes
    format: Literal["wasm"] = "wasm"


class ModuleBlob(msgspec.Struct, frozen=True, tag_field="type", tag="blob"):
    """A guest module already in the blob store, by the sha256 of its bytes."""

    sha256: str
    format: Literal["wasm"] = "wasm"


ExecutionPayload = Source | GuestModule | ModuleBlob


class ExecutionRequest(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """One execution as a backend sees it.

    * ``exec_id`` — the execution id (1-256 UTF-8 bytes, no control characters).
    * ``language`` / ``payload`` — what to run; see each backend for how it interprets them.
    * ``argv`` — arguments (``$1…`` for a shell source; the whole command line for a
      ``command`` request without source).
    * ``stdin`` — bytes for standard input (``None``: empty input).
    * ``input`` — a JSON value for callable languages (``UNSET``: none given).
    * ``env`` — variables with explicit values; each name must be in the policy's allow-list.
    * ``cwd`` — working directory relative to the workspace (default: the policy's, else the
      workspace root).
    * ``timeout_ms``, ``max_stdout``, ``max_stderr`` — may only lower the policy's values.
    * ``policy`` — the effective (already narrowed) policy.
    * ``identity`` — who asked (the agent id), for audit; copied into the result metadata.
    """

    exec_id: str
    language: ExecutionLanguage = ExecutionLanguage.COMMAND
    payload: ExecutionPayload = Source("")
    argv: tuple[str, ...] = ()
    stdin: bytes | None = None
    input: Any = UNSET
    env: dict[str, str] = {}
    cwd: str | None = None
    timeout_ms: int | None = None
    max_stdout: int | None = None
    max_stderr: int | None = None
    policy: SandboxPolicy = strict()
    identity: str | None = None

    def __repr__(self) -> str:
        # Environment values may be secrets: show the names only.
        return (
            f"ExecutionRequest(exec_id={self.exec_id!r}, language={self.language.value!r}, "
            f"payload={type(self.payload).__name__}, argv={self.argv!r}, "
            f"env_keys={sorted(self.env)!r}, cwd={self.cwd!r}, identity={self.identity!r})"
        )

    @property
    def source(self) -> str | None:
        """The source text, or ``None`` for a module payload."""
        return self.payload.text if isinstance(self.payload, Source) else None

    @property
    def has_input(self) -> bool:
        return self.input is not UNSET

    @property
    def effective_timeout_ms(self) -> int:
        """The request's timeout if it set one, else the policy's."""
        return self.timeout_ms if self.timeout_ms is not None else self.policy.timeout_ms

    @property
    def effective_max_stdout(self) -> int:
        return self.max_stdout if self.max_stdout is not None else self.policy.max_stdout_bytes

    @property
    def effective_max_stderr(self) -> int:
        return self.max_stderr if self.max_stderr is not None else self.policy.max_stderr_bytes

    @property
    def effective_cwd(self) -> str:
        """The working directory relative to the workspace (``"."`` = its root)."""
        if self.cwd is not None:
            return self.cwd
        return self.policy.working_directory or "."
