"""The ``javascript`` backend (JavaScript and TypeScript on Deno): :mod:`.backend`."""

from backends.javascript.backend import (
    DEFAULT_MAX_MEMORY_BYTES,
    HOST_FUNCTIONS,
    JavaScriptBackend,
    find_deno,
)

__all__ = ["DEFAULT_MAX_MEMORY_BYTES", "HOST_FUNCTIONS", "JavaScriptBackend", "find_deno"]
