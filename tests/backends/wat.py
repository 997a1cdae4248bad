"""WebAssembly text modules for the ``wasm`` backend tests (compiled with ``wasmtime.wat2wasm``).

Each is a WASI preview 1 command (``_start``) written by hand, so the tests need no wasm
toolchain (rustc's ``wasm32-wasip1`` target is not installed on this machine).
"""

from __future__ import annotations

from typing import Final

import wasmtime

_WASI: Final = '"wasi_snapshot_preview1"'

HELLO: Final = f"""
(module
  (import {_WASI} "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 16) "hello from wasi\\n")
  (func (export "_start")
    (i32.store (i32.const 0) (i32.const 16))
    (i32.store (i32.const 4) (i32.const 16))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))))
"""

# Copies stdin to stdout (so `input` comes back as the last stdout line: the `value`), then
# writes "note\n" to stderr.
ECHO: Final = f"""
(module
  (import {_WASI} "fd_read" (func $fd_read (param i32 i32 i32 i32) (result i32)))
  (import {_WASI} "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 64) "note\\n")
  (func (export "_start")
    (local $n i32)
    (block $done
      (loop $more
        (i32.store (i32.const 0) (i32.const 1024))
        (i32.store (i32.const 4) (i32.const 4096))
        (br_if $done (call $fd_read (i32.const 0) (i32.const 0) (i32.const 1) (i32.const 8)))
        (local.set $n (i32.load (i32.const 8)))
        (br_if $done (i32.eqz (local.get $n)))
        (i32.store (i32.const 4) (local.get $n))
        (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 12)))
        (br $more)))
    (i32.store (i32.const 0) (i32.const 64))
    (i32.store (i32.const 4) (i32.const 5))
    (drop (call $fd_write (i32.const 2) (i32.const 0) (i32.const 1) (i32.const 12)))))
"""

# Prints its argv and environment (NUL-separated, as WASI returns them), exits with code 3.
ARGS_ENV_EXIT3: Final = f"""
(module
  (import {_WASI} "args_sizes_get" (func $args_sizes (param i32 i32) (result i32)))
  (import {_WASI} "args_get" (func $args_get (param i32 i32) (result i32)))
  (import {_WASI} "environ_sizes_get" (func $env_sizes (param i32 i32) (result i32)))
  (import {_WASI} "environ_get" (func $env_get (param i32 i32) (result i32)))
  (import {_WASI} "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import {_WASI} "proc_exit" (func $proc_exit (param i32)))
  (memory (export "memory") 1)
  (func $print (param $ptr i32) (param $len i32)
    (i32.store (i32.const 0) (local.get $ptr))
    (i32.store (i32.const 4) (local.get $len))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8))))
  (func (export "_start")
    (drop (call $args_sizes (i32.const 16) (i32.const 20)))
    (drop (call $args_get (i32.const 1024) (i32.const 4096)))
    (call $print (i32.const 4096) (i32.load (i32.const 20)))
    (drop (call $env_sizes (i32.const 16) (i32.const 20)))
    (drop (call $env_get (i32.const 2048) (i32.const 8192)))
    (call $print (i32.const 8192) (i32.load (i32.const 20)))
    (call $proc_exit (i32.const 3))))
"""

INFINITE_LOOP: Final = """
(module
  (memory (export "memory") 1)
  (func (export "_start") (loop $forever (br $forever))))
"""

# Grows its memory one page at a time until memory.grow fails, then traps (as an allocator
# that cannot get memory aborts).
GROW_MEMORY: Final = """
(module
  (memory (export "memory") 1)
  (func (export "_start")
    (loop $grow
      (if (i32.eq (memory.grow (i32.const 1)) (i32.const -1)) (then unreachable))
      (br $grow))))
"""

# Grows its memory one page at a time until memory.grow fails, then exits with the number of
# 64 KiB pages it got: the exit code says the size the cap was enforced at.
GROW_MEMORY_REPORT: Final = f"""
(module
  (import {_WASI} "proc_exit" (func $exit (param i32)))
  (memory (export "memory") 1)
  (func (export "_start")
    (loop $grow
      (if (i32.eq (memory.grow (i32.const 1)) (i32.const -1))
        (then (call $exit (memory.size))))
      (br $grow))))
"""

# Sleeps one hour in poll_oneoff (a relative clock subscription).
SLEEP_AN_HOUR: Final = f"""
(module
  (import {_WASI} "poll_oneoff" (func $poll (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (func (export "_start")
    (i64.store (i32.const 0) (i64.const 7))
    (i32.store8 (i32.const 8) (i32.const 0))
    (i32.store (i32.const 16) (i32.const 1))
    (i64.store (i32.const 24) (i64.const 3600000000000))
    (i64.store (i32.const 32) (i64.const 0))
    (i32.store16 (i32.const 40) (i32.const 0))
    (drop (call $poll (i32.const 0) (i32.const 100) (i32.const 1) (i32.const 200)))))
"""

# Sleeps 50 ms, then prints "slept\\n".
SLEEP_BRIEFLY: Final = f"""
(module
  (import {_WASI} "poll_oneoff" (func $poll (param i32 i32 i32 i32) (result i32)))
  (import {_WASI} "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 512) "slept\\n")
  (func (export "_start")
    (i64.store (i32.const 0) (i64.const 7))
    (i32.store8 (i32.const 8) (i32.const 0))
    (i32.store (i32.const 16) (i32.const 1))
    (i64.store (i32.const 24) (i64.const 50000000))
    (i64.store (i32.const 32) (i64.const 0))
    (i32.store16 (i32.const 40) (i32.const 0))
    (drop (call $poll (i32.const 0) (i32.const 100) (i32.const 1) (i32.const 200)))
    (i32.store (i32.const 300) (i32.const 512))
    (i32.store (i32.const 304) (i32.const 6))
    (drop (call $fd_write (i32.const 1) (i32.const 300) (i32.const 1) (i32.const 308)))))
"""

# Writes 64 KiB of "x" to stdout, forever.
FLOOD: Final = f"""
(module
  (import {_WASI} "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 2)
  (func (export "_start")
    (memory.fill (i32.const 1024) (i32.const 120) (i32.const 65536))
    (i32.store (i32.const 0) (i32.const 1024))
    (i32.store (i32.const 4) (i32.const 65536))
    (loop $more
      (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))
      (br $more))))
"""

# Reads "data.txt" from the preopened directory (fd 3, "/workspace") and prints it, then
# creates "out.txt" there and writes "written\\n" into it. Exit code: 0 when both worked,
# 100 + errno when reading failed, the WASI errno when creating failed (63 = EPERM).
READ_THEN_WRITE: Final = f"""
(module
  (import {_WASI} "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import {_WASI} "fd_read" (func $fd_read (param i32 i32 i32 i32) (result i32)))
  (import {_WASI} "path_open"
    (func $path_open (param i32 i32 i32 i32 i32 i64 i64 i32 i32) (result i32)))
  (import {_WASI} "proc_exit" (func $proc_exit (param i32)))
  (memory (export "memory") 1)
  (data (i32.const 100) "data.txt")
  (data (i32.const 120) "out.txt")
  (data (i32.const 140) "written\\n")
  (func (export "_start")
    (local $fd i32) (local $err i32)
    (local.set $err (call $path_open (i32.const 3) (i32.const 0) (i32.const 100) (i32.const 8)
        (i32.const 0) (i64.const 2) (i64.const 0) (i32.const 0) (i32.const 200)))
    (if (local.get $err) (then (call $proc_exit (i32.add (i32.const 100) (local.get $err)))))
    (local.set $fd (i32.load (i32.const 200)))
    (i32.store (i32.const 300) (i32.const 1024))
    (i32.store (i32.const 304) (i32.const 1024))
    (drop (call $fd_read (local.get $fd) (i32.const 300) (i32.const 1) (i32.const 308)))
    (i32.store (i32.const 304) (i32.load (i32.const 308)))
    (drop (call $fd_write (i32.const 1) (i32.const 300) (i32.const 1) (i32.const 312)))
    (local.set $err (call $path_open (i32.const 3) (i32.const 0) (i32.const 120) (i32.const 7)
        (i32.const 1) (i64.const 64) (i64.const 0) (i32.const 0) (i32.const 200)))
    (if (local.get $err) (then (call $proc_exit (local.get $err))))
    (local.set $fd (i32.load (i32.const 200)))
    (i32.store (i32.const 300) (i32.const 140))
    (i32.store (i32.const 304) (i32.const 8))
    (drop (call $fd_write (local.get $fd) (i32.const 300) (i32.const 1) (i32.const 312)))
    (call $proc_exit (i32.const 0))))
"""

NO_START: Final = '(module (func (export "main")))'

# A module that needs 64 MiB (1024 pages) just to be instantiated.
BIG_INITIAL_MEMORY: Final = '(module (memory (export "memory") 1024) (func (export "_start")))'

DIVIDE_BY_ZERO: Final = """
(module
  (func (export "_start") (drop (i32.div_s (i32.const 1) (i32.const 0)))))
"""


# Writes "out\n" to stdout and "err\n" to stderr, exits with code 3.
OUT_ERR_EXIT3: Final = f"""
(module
  (import {_WASI} "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (import {_WASI} "proc_exit" (func $proc_exit (param i32)))
  (memory (export "memory") 1)
  (data (i32.const 64) "out\\n")
  (data (i32.const 80) "err\\n")
  (func (export "_start")
    (i32.store (i32.const 0) (i32.const 64))
    (i32.store (i32.const 4) (i32.const 4))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))
    (i32.store (i32.const 0) (i32.const 80))
    (i32.store (i32.const 4) (i32.const 4))
    (drop (call $fd_write (i32.const 2) (i32.const 0) (i32.const 1) (i32.const 8)))
    (call $proc_exit (i32.const 3))))
"""

# Writes "partial\n" to stdout, then loops forever.
PARTIAL_THEN_LOOP: Final = f"""
(module
  (import {_WASI} "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 1)
  (data (i32.const 64) "partial\\n")
  (func (export "_start")
    (i32.store (i32.const 0) (i32.const 64))
    (i32.store (i32.const 4) (i32.const 8))
    (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))
    (loop $forever (br $forever))))
"""

# Writes 2 MiB of "x" to stdout (32 writes of 64 KiB), then exits 0.
TWO_MIB: Final = f"""
(module
  (import {_WASI} "fd_write" (func $fd_write (param i32 i32 i32 i32) (result i32)))
  (memory (export "memory") 2)
  (func (export "_start")
    (local $i i32)
    (memory.fill (i32.const 1024) (i32.const 120) (i32.const 65536))
    (i32.store (i32.const 0) (i32.const 1024))
    (i32.store (i32.const 4) (i32.const 65536))
    (loop $more
      (drop (call $fd_write (i32.const 1) (i32.const 0) (i32.const 1) (i32.const 8)))
      (local.set $i (i32.add (local.get $i) (i32.const 1)))
      (br_if $more (i32.lt_u (local.get $i) (i32.const 32))))))
"""


def wasm(text: str) -> bytes:
    """The binary module for WAT ``text``."""
    return bytes(wasmtime.wat2wasm(text))
