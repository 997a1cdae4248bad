"""The ``rust`` backend's settings (:class:`hub.core.execution.settings.RustSettings`, the
``[runtime.rust]`` table) as the backend uses them.

The backend reads no environment: the composition root (``agora serve``) resolves the settings
once — the file, then the documented override ``$AGORA_RUST_CACHE``, then the toolchain's
environment — and passes them down. A backend made without resolved settings (a test, a
benchmark, a library user that did not resolve them) gets the settings type's own defaults,
filled in without any environment: see :func:`as_passed`.
"""

from __future__ import annotations

from hub.core.execution.settings import RustSettings

__all__ = ["RustSettings", "as_passed"]


def as_passed(settings: RustSettings | None = None) -> RustSettings:
    """``settings`` (default: the defaults) as they are when already resolved, else with the
    settings type's environment-free defaults filled in (:meth:`RustSettings.resolved` of an
    empty environment: the cache under ``/tmp/.cache/agora/rust``, rustc and cargo looked up
    on ``/usr/local/bin:/usr/bin:/bin``). To use this process's environment, resolve them
    against it first: ``RustSettings().resolved(os.environ)``."""
    settings = settings or RustSettings()
    return settings if settings.is_resolved else settings.resolved({})
