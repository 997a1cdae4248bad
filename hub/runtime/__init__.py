"""The execution runtime: named backend instances, journaled executions, workspace sync,
restart recovery (docs/execution.md, "Runtime").

One concept per module: :mod:`~hub.runtime.runtime` (the :class:`Runtime`: the router of the
ops), :mod:`~hub.runtime.request` (the wire's ``exec`` → the backend's request, checks),
:mod:`~hub.runtime.execution` (one run's lifecycle: push, run, pull, record),
:mod:`~hub.runtime.outcome` (payloads the runtime decides, pure),
:mod:`~hub.runtime.recovery` (closing what a restart interrupted, by the core's rule),
:mod:`~hub.runtime.registry` (backend instances from agora.toml),
:mod:`~hub.runtime.coalesce` (output coalescing, pure), :mod:`~hub.runtime.journal` (the
execution journals kept current from the log, live readers), :mod:`~hub.runtime.results`
(reading results and text, pure), :mod:`~hub.runtime.sync` (push/pull of workspace files),
:mod:`~hub.runtime.access` (workspace host functions through the log),
:mod:`~hub.runtime.retention` (what to prune, pure) and :mod:`~hub.runtime.pruning` (pruning
it). The settings are :class:`hub.core.execution.settings.RuntimeSettings` (``[runtime]``).
"""

from hub.core.execution.settings import RuntimeSettings
from hub.runtime.registry import BackendInstance, BackendRegistry
from hub.runtime.runtime import ExecStream, Runtime

__all__ = ["BackendInstance", "BackendRegistry", "ExecStream", "Runtime", "RuntimeSettings"]
