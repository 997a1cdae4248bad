"""What a backend really enforces: its isolation class and capability flags. Pure.

Principle 4 (ARCHITECTURE.md, "Truthful capabilities"): a backend reports only the controls it
really enforces; :func:`hub.core.execution.validate.validate_policy` refuses a request asking for a
control the backend cannot enforce, before any user code runs.
"""

from __future__ import annotations

import enum
from typing import Literal

import msgspec

from hub.core.execution.policy import FilesystemMode

__all__ = [
    "ALL_FILESYSTEM_MODES",
    "BackendCapabilities",
    "ExecutionIsolation",
    "ExecutionLanguage",
    "WorkspaceMode",
]


class ExecutionLanguage(enum.StrEnum):
    """How a backend interprets the payload (adk-code's languages)."""

    RUST = "rust"
    JAVASCRIPT = "javascript"
    TYPESCRIPT = "typescript"
    WASM = "wasm"
    PYTHON = "python"
    COMMAND = "command"


class ExecutionIsolation(enum.StrEnum):
    """Isolation class of a backend (adk-code's), strongest last but one:

    ``inProcess`` (runs inside the hub's process), ``hostLocal`` (an unconfined host process:
    the ``process`` backend configured with ``confine = false``), ``namespace`` (a host process
    in its own user/PID/mount/network namespaces with a minimal read-only host view: the
    confined ``process`` backend), ``containerEphemeral`` (a fresh container per run),
    ``containerPersistent`` (a long-lived container shared by runs), ``providerHosted`` (a
    remote service).
    """

    IN_PROCESS = "inProcess"
    HOST_LOCAL = "hostLocal"
    NAMESPACE = "namespace"
    CONTAINER_EPHEMERAL = "containerEphemeral"
    CONTAINER_PERSISTENT = "containerPersistent"
    PROVIDER_HOSTED = "providerHosted"


ALL_FILESYSTEM_MODES: frozenset[FilesystemMode] = frozenset(
    {"none", "workspaceReadOnly", "workspaceReadWrite", "paths", "host"}
)


WorkspaceMode = Literal["files", "hostFunctions", "none"]
"""How a backend's programs reach the workspace, which decides what the runtime prepares:

* ``files`` — the runtime pushes the workspace into a directory (the ``workdir`` of
  ``execute``) and pulls the changes back after the result;
* ``hostFunctions`` — the sandbox calls host functions (``host_functions``) that the runtime
  serves through the ``access`` argument of ``execute`` (every write is an event at once);
* ``none`` — the backend never sees the workspace.
"""


class BackendCapabilities(msgspec.Struct, frozen=True, kw_only=True, rename="camel"):
    """The controls a backend enforces and the features it supports.

    ``enforces_*``: the backend makes the control true for the program (not merely "passes it
    on"). ``filesystem_modes``: the :class:`~hub.core.execution.policy.FilesystemPolicy` modes it
    can
    provide at all (a container cannot offer ``host``). ``languages``: what it runs.

    What the runtime prepares for a run is read from here, never from a backend's kind:
    ``workspace`` (:data:`WorkspaceMode`), ``host_functions`` (the names a ``hostFunctions``
    sandbox calls), ``value_from_stdout`` (the value harness: a program's returned value is the
    last line of its stdout, adk-code's rule, read back by ``execResult``), ``pooled`` (runs
    may start from warm, pre-started sandboxes kept between executions).
    """

    isolation: ExecutionIsolation
    enforces_network: bool = False
    enforces_filesystem: bool = False
    enforces_environment: bool = False
    enforces_timeout: bool = False
    enforces_memory: bool = False
    enforces_pids: bool = False
    enforces_cpu: bool = False
    supports_structured_output: bool = False
    supports_process_execution: bool = False
    supports_persistent_workspace: bool = False
    supports_interactive_sessions: bool = False
    languages: frozenset[ExecutionLanguage] = frozenset()
    filesystem_modes: frozenset[FilesystemMode] = ALL_FILESYSTEM_MODES
    workspace: WorkspaceMode = "files"
    host_functions: frozenset[str] = frozenset()
    value_from_stdout: bool = False
    pooled: bool = False

    def replace(self, **changes: object) -> BackendCapabilities:
        """A copy with ``changes`` (snake_case field names)."""
        return msgspec.structs.replace(self, **changes)
