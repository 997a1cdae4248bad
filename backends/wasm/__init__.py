"""The ``wasm`` backend: WASI preview 1 commands on wasmtime, in-process.

:mod:`~backends.wasm.backend` (the :class:`WasmBackend`), :mod:`~backends.wasm.cache` (the
compiled-module cache), :mod:`~backends.wasm.interrupt` (stopping a guest: epochs, and the
interruptible ``poll_oneoff`` that replaces wasmtime's own).
"""

from backends.wasm.backend import (
    DEFAULT_MAX_MEMORY_BYTES,
    MAX_WASM_BYTES,
    WASM_MAGIC,
    BlobReader,
    WasmBackend,
    validate_wasm_bytes,
)
from backends.wasm.cache import ModuleCache

__all__ = [
    "DEFAULT_MAX_MEMORY_BYTES",
    "MAX_WASM_BYTES",
    "WASM_MAGIC",
    "BlobReader",
    "ModuleCache",
    "WasmBackend",
    "validate_wasm_bytes",
]
