"""The ``wasm`` backend: WASI preview 1 commands on wasmtime, in-process
(:mod:`~backends.wasm.backend`)."""

from backends.wasm.backend import (
    DEFAULT_MAX_MEMORY_BYTES,
    MAX_WASM_BYTES,
    WASM_MAGIC,
    BlobSource,
    ModuleCache,
    WasmBackend,
    validate_wasm_bytes,
)

__all__ = [
    "DEFAULT_MAX_MEMORY_BYTES",
    "MAX_WASM_BYTES",
    "WASM_MAGIC",
    "BlobSource",
    "ModuleCache",
    "WasmBackend",
    "validate_wasm_bytes",
]
