"""The execution runtime: named backend instances, journaled executions, workspace sync,
restart recovery (docs/execution.md, "Runtime").

One concept per module: :mod:`~hub.runtime.registry` (backend instances from agora.toml),
:mod:`~hub.runtime.supervisor` (the :class:`Runtime`: the ops and the task of each
execution), :mod:`~hub.runtime.coalesce` (output coalescing, pure),
:mod:`~hub.runtime.journal` (the execution journals kept current from the log, live readers),
:mod:`~hub.runtime.results` (reading results and text, pure), :mod:`~hub.runtime.sync`
(push/pull of workspace files), :mod:`~hub.runtime.access` (workspace host functions through
the log), :mod:`~hub.runtime.retention` (what to prune, pure). Recovery is
:meth:`Runtime.recover`.
"""

from hub.runtime.registry import BackendInstance, BackendRegistry
from hub.runtime.supervisor import ExecStream, Runtime, RuntimeSettings

__all__ = ["BackendInstance", "BackendRegistry", "ExecStream", "Runtime", "RuntimeSettings"]
