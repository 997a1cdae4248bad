"""Stopping a guest: epoch interruption for running code, and an interruptible
``poll_oneoff`` for a guest asleep in WASI.

The ``wasm`` backend uses wasmtime's own WASI (``wasmtime.WasiConfig``, ``Linker.define_wasi``)
for everything — arguments, environment, stdin, stdout/stderr, the preopened workspace — except
``poll_oneoff``. wasmtime's ``poll_oneoff`` sleeps in a blocking host call, and an epoch
deadline is only checked in guest code: a guest sleeping an hour in it blocked its worker
thread for the hour whatever the epoch did (checked with wasmtime 50 here: ``SLEEP_AN_HOUR``
under a ticking epoch was still asleep after 8 s), so neither the timeout nor ``cancel`` could
stop it. :func:`poll_oneoff` replaces it (``Linker.allow_shadowing``): the same WASI preview 1
semantics for clock subscriptions, but the sleep waits on the run's stop flag.
"""

from __future__ import annotations

import ctypes
import struct
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Final

import wasmtime
from wasmtime import _ffi as wasm_ffi

__all__ = [
    "NO_FINALIZER",
    "THREAD",
    "EpochTicker",
    "Interrupted",
    "RunControl",
    "deadline_callback",
    "poll_oneoff",
]


# ---------------------------------------------------------------------------------------------
# Epoch interruption


class EpochTicker:
    """Advances the engine's epoch every ``interval`` seconds while at least one run is active."""

    def __init__(self, engine: wasmtime.Engine, interval: float) -> None:
        self._engine = engine
        self._interval = interval
        self._cond = threading.Condition()
        self._active = 0
        self._closed = False
        self._thread: threading.Thread | None = None

    def acquire(self) -> None:
        with self._cond:
            self._active += 1
            if self._thread is None and not self._closed:
                self._thread = threading.Thread(
                    target=self._loop, name="agora-wasm-epoch", daemon=True
                )
                self._thread.start()
            self._cond.notify_all()

    def release(self) -> None:
        with self._cond:
            self._active -= 1

    def _loop(self) -> None:
        while True:
            with self._cond:
                while self._active <= 0 and not self._closed:
                    self._cond.wait()
                if self._closed:
                    return
            self._engine.increment_epoch()
            time.sleep(self._interval)

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None:
            thread.join()


class Interrupted(Exception):
    """Raised inside the guest's thread when its run was stopped during a host call."""


_DeadlineCallback = ctypes.CFUNCTYPE(
    ctypes.c_size_t,
    ctypes.POINTER(wasm_ffi.wasmtime_context_t),
    ctypes.c_void_p,
    ctypes.POINTER(ctypes.c_uint64),
    ctypes.POINTER(ctypes.c_uint8),
)
_Finalizer = ctypes.CFUNCTYPE(None, ctypes.c_void_p)


NO_FINALIZER: Any = _Finalizer(lambda _data: None)


_INTERRUPT_MESSAGE: Final = b"agora: execution interrupted"
_UPDATE_CONTINUE: Final = 0


@dataclass
class RunControl:
    """What the guest's thread shares with the loop: the stop flag and what happened."""

    interrupt: threading.Event = field(default_factory=threading.Event)
    wasi_started_ns: int = 0
    interrupted: bool = False


def deadline_callback(ctl: RunControl) -> Any:
    """The store's epoch-deadline callback: trap once ``ctl.interrupt`` is set, else go on for
    one more tick. Returns the ctypes function (keep a reference while the store lives)."""

    def callback(_ctx: Any, _data: Any, delta: Any, kind: Any) -> int:
        if ctl.interrupt.is_set():
            ctl.interrupted = True
            error = wasm_ffi.wasmtime_error_new(_INTERRUPT_MESSAGE)
            return int(ctypes.cast(error, ctypes.c_void_p).value or 0)
        delta[0] = 1
        kind[0] = _UPDATE_CONTINUE
        return 0

    return _DeadlineCallback(callback)


# ---------------------------------------------------------------------------------------------
# An interruptible poll_oneoff (WASI preview 1)

THREAD = threading.local()
_ERRNO_SUCCESS: Final = 0
_ERRNO_FAULT: Final = 21
_ERRNO_INVAL: Final = 28
_SUBSCRIPTION_SIZE: Final = 48
_EVENT_SIZE: Final = 32
_EVENTTYPE_CLOCK: Final = 0
_SUBCLOCKFLAG_ABSTIME: Final = 1
_CLOCK_REALTIME: Final = 0
_CLOCK_MONOTONIC: Final = 1
_MAX_SUBSCRIPTIONS: Final = 4096


def poll_oneoff(
    caller: wasmtime.Caller, in_ptr: int, out_ptr: int, nsubs: int, nevents_ptr: int
) -> int:
    """``poll_oneoff`` that sleeps on the run's stop flag instead of blocking the thread.

    Clock subscriptions sleep (the shortest one wins; absolute deadlines on the realtime and
    monotonic clocks are honoured); fd subscriptions are reported ready at once (stdin is a
    buffer and stdout/stderr never block here). Raises :class:`Interrupted` when the run is
    stopped while sleeping, which ends the guest.
    """
    ctl: RunControl | None = getattr(THREAD, "control", None)
    memory = caller.get("memory")
    if not isinstance(memory, wasmtime.Memory) or ctl is None:
        return _ERRNO_INVAL
    if nsubs <= 0 or nsubs > _MAX_SUBSCRIPTIONS:
        return _ERRNO_INVAL
    size = memory.data_len(caller)
    if in_ptr < 0 or in_ptr + nsubs * _SUBSCRIPTION_SIZE > size:
        return _ERRNO_FAULT
    if out_ptr < 0 or out_ptr + nsubs * _EVENT_SIZE > size or nevents_ptr + 4 > size:
        return _ERRNO_FAULT
    raw = bytes(memory.read(caller, in_ptr, in_ptr + nsubs * _SUBSCRIPTION_SIZE))
    ready_fds: list[tuple[int, int]] = []
    clocks: list[tuple[int, float]] = []
    for i in range(nsubs):
        base = i * _SUBSCRIPTION_SIZE
        userdata, tag = struct.unpack_from("<QB", raw, base)
        if tag == _EVENTTYPE_CLOCK:
            clock_id, timeout, _precision, flags = struct.unpack_from("<IxxxxQQH", raw, base + 16)
            delay_ns = float(timeout)
            if flags & _SUBCLOCKFLAG_ABSTIME:
                if clock_id == _CLOCK_REALTIME:
                    delay_ns = timeout - time.time_ns()
                elif clock_id == _CLOCK_MONOTONIC:
                    delay_ns = timeout - (time.monotonic_ns() - ctl.wasi_started_ns)
            clocks.append((userdata, max(0.0, delay_ns) / 1e9))
        else:
            ready_fds.append((userdata, tag))
    events = bytearray()
    if ready_fds:
        for userdata, tag in ready_fds:
            events += struct.pack("<QHBxxxxxQHxxxxxx", userdata, 0, tag, 0, 0)
    else:
        delay = min(d for _, d in clocks)
        if ctl.interrupt.wait(delay):
            raise Interrupted()
        for userdata, d in clocks:
            if d <= delay:
                events += struct.pack("<QHBxxxxxQHxxxxxx", userdata, 0, _EVENTTYPE_CLOCK, 0, 0)
    memory.write(caller, bytes(events), out_ptr)
    memory.write(caller, struct.pack("<I", len(events) // _EVENT_SIZE), nevents_ptr)
    return _ERRNO_SUCCESS
