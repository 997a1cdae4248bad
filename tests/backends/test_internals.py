"""Private internals the backends lean on, pinned: each dependency has an upper bound in
pyproject.toml (the next major) and this test fails loudly, naming the internal, when an
upgrade inside that bound moves it. Without it an upgrade would show only as a confusing
failure deep inside a run (or, for the wasm deadline callback, a guest that cannot be stopped).
"""

from __future__ import annotations

import ctypes
import socket

import docker
import docker.api.container
import wasmtime
from wasmtime import _ffi as wasm_ffi

# What backends/wasm/backend.py and backends/wasm/interrupt.py call through wasmtime._ffi.
WASMTIME_FFI = (
    "wasmtime_store_epoch_deadline_callback",
    "wasmtime_context_t",
    "wasmtime_error_new",
    "bytes_to_capi",
    "wasi_config_set_stdin_bytes",
)


def test_wasmtime_private_ffi_is_there() -> None:
    missing = [name for name in WASMTIME_FFI if not hasattr(wasm_ffi, name)]
    assert not missing, f"wasmtime._ffi no longer has {missing}: backends/wasm relies on them"
    for cls, attr in ((wasmtime.Store, "ptr"), (wasmtime.WasiConfig, "ptr")):
        assert callable(getattr(cls, attr, None)), f"wasmtime.{cls.__name__}.{attr}() is gone"


def test_wasmtime_stdin_bytes_round_trip() -> None:
    """The exact calls _set_stdin makes, on a real WasiConfig: a changed signature raises."""
    wasi = wasmtime.WasiConfig()
    vec = wasm_ffi.bytes_to_capi(b"stdin")
    wasm_ffi.wasi_config_set_stdin_bytes(wasi.ptr(), ctypes.byref(vec))


def test_wasmtime_epoch_deadline_callback_signature() -> None:
    """The callback type interrupt.py builds is accepted by the C function on a live store."""
    from backends.wasm.interrupt import NO_FINALIZER, RunControl, deadline_callback

    engine = wasmtime.Engine(wasmtime.Config())
    store = wasmtime.Store(engine)
    callback = deadline_callback(RunControl())
    wasm_ffi.wasmtime_store_epoch_deadline_callback(store.ptr(), callback, None, NO_FINALIZER)


def test_docker_attach_socket_exposes_sock() -> None:
    """backends/container/backend.py takes the raw socket from ``attach_socket``'s result as its
    ``_sock`` (on a unix or plain-tcp engine that result is a ``socket.SocketIO``)."""
    assert int(docker.__version__.split(".")[0]) < 8, "docker SDK 8: re-check attach_socket"
    attach = getattr(docker.api.container.ContainerApiMixin, "attach_socket", None)
    assert callable(attach), "docker APIClient.attach_socket is gone"
    mine, theirs = socket.socketpair()
    try:
        wrapped = socket.SocketIO(mine, "rb")
        assert getattr(wrapped, "_sock", None) is mine, "socket.SocketIO._sock is gone"
    finally:
        mine.close()
        theirs.close()
