"""The ``rust`` backend: compile with rustc, run the binary on a process runner.

:mod:`~backends.rust.backend` (the pipeline, :class:`RustBackend`, :class:`RustToolchain`),
:mod:`~backends.rust.source` (the harness and source checks, pure),
:mod:`~backends.rust.diagnostics` (rustc's JSON diagnostics, pure),
:mod:`~backends.rust.settings` (its ``[runtime.rust]`` settings).
"""

from backends.rust.backend import (
    DEBIAN_REGISTRY,
    RustBackend,
    RustDeps,
    RustToolchain,
)
from backends.rust.settings import RustSettings, as_passed

__all__ = [
    "DEBIAN_REGISTRY",
    "RustBackend",
    "RustDeps",
    "RustSettings",
    "RustToolchain",
    "as_passed",
]
