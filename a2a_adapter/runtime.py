"""The seam between the A2A adapter and the execution runtime (``agora serve`` passes the
hub's, :class:`hub.runtime.Runtime`).

A peer asks for an execution with a data part ``{"agora.exec": {"backend": …, "source": …,
"input": …}}`` (docs/a2a.md, "The exec data part"). The adapter parses it into an
:class:`A2AExecRequest` and calls :meth:`A2ARuntime.exec` with the ``exec`` frame it stands for
(:meth:`A2AExecRequest.frame`: the one request type the runtime takes); the runtime writes
``execRequested`` … ``execFinished`` to the workspace log like any other execution, and the
A2A task (id = the execId) is read back from those events. With no runtime configured the
adapter answers ``UnsupportedOperation``.
"""

from __future__ import annotations

from typing import Any, Final, Protocol

import msgspec

from hub.core.capability import Capability
from hub.core.wire.frames import Exec

__all__ = ["EXEC_PART_KEY", "A2AExecRequest", "A2ARuntime", "parse_exec_part"]

EXEC_PART_KEY: Final = "agora.exec"


class A2AExecRequest(
    msgspec.Struct, frozen=True, kw_only=True, rename="camel", forbid_unknown_fields=True
):
    """What an ``agora.exec`` data part may ask for (a subset of the ``exec`` op)."""

    backend: str
    source: str | None = None
    input: Any = None
    language: str | None = None
    argv: list[str] = []
    timeout_ms: int | None = None

    def frame(self, workspace: str) -> Exec:
        """The ``exec`` op this part asks for, in ``workspace``."""
        return Exec(
            workspace=workspace,
            backend=self.backend,
            source=self.source,
            input=msgspec.UNSET if self.input is None else self.input,
            language=self.language,
            argv=list(self.argv),
            timeout_ms=self.timeout_ms,
        )


class A2ARuntime(Protocol):
    """What the adapter needs from the execution runtime."""

    async def exec(
        self, workspace: str, request: Exec, *, exec_id: str, capability: Capability
    ) -> str:
        """Start an execution in ``workspace`` for the holder of ``capability``; return its
        execId (``exec_id``) once ``execRequested`` is in the log. The runtime checks the
        ``exec`` right and the backend against the capability (the adapter has checked both
        already, before writing anything) and writes the lifecycle events. Raises
        :class:`hub.core.errors.AgoraError` subclasses (``Forbidden``, ``NotFound`` for an unknown
        backend, ``Busy`` for a running ``exec_id``, ``Exists`` for a finished one kept in the
        log — both with ``details["execId"]`` —, …)."""
        ...

    async def kill(self, workspace: str, exec_id: str, *, capability: Capability) -> object:
        """Ask the runtime to cancel ``exec_id`` (the result, if any, is not used).
        Raises :class:`hub.core.errors.AgoraError`."""
        ...


def parse_exec_part(data: Any) -> A2AExecRequest | None:
    """The :class:`A2AExecRequest` in a data part's value, or None if it is not an exec part.

    Raises ``msgspec.ValidationError`` when the part names ``agora.exec`` but is malformed.
    """
    if not isinstance(data, dict) or EXEC_PART_KEY not in data:
        return None
    return msgspec.convert(data[EXEC_PART_KEY], A2AExecRequest)
