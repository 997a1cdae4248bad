"""The ``rust`` backend's settings (:class:`hub.core.execution.settings.RustSettings`, the
``[runtime.rust]`` table) as the backend uses them.

The hub resolves them once in its composition root (``agora serve``: the file, then the
documented override ``$AGORA_RUST_CACHE``, then the toolchain's environment). A backend made
without resolved settings — a test, a benchmark, a library user — gets them resolved from this
process's environment here, the one place of the backend that reads it.
"""

from __future__ import annotations

import os

from hub.core.execution.settings import RustSettings

__all__ = ["RustSettings", "host_settings"]


def host_settings(settings: RustSettings | None = None) -> RustSettings:
    """``settings`` (default: the defaults) resolved against this process's environment
    unless already resolved (a cache directory and a toolchain environment set)."""
    settings = settings or RustSettings()
    if settings.cache_dir is not None and "PATH" in settings.tool_env:
        return settings
    return settings.resolved(os.environ)
