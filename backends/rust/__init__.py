"""The ``rust`` backend: compile with rustc, run the binary on a process runner.

:mod:`~backends.rust.backend` (the pipeline, :class:`RustBackend`, :class:`RustToolchain`),
:mod:`~backends.rust.source` (the harness and source checks, pure),
:mod:`~backends.rust.diagnostics` (rustc's JSON diagnostics, pure).
"""

from backends.rust.backend import (
    DEBIAN_REGISTRY,
    RustBackend,
    RustDeps,
    RustToolchain,
    default_cache_dir,
)

__all__ = ["DEBIAN_REGISTRY", "RustBackend", "RustDeps", "RustToolchain", "default_cache_dir"]
