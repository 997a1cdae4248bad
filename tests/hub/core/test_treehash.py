"""The writer's Merkle hashing in C (hub/core/_treehash.c) against its Python reference
(hub.core.merkle.extend_canonical_py) and the RFC 9162 reference of the tests: the same
hashes, frontiers and errors on every input, across batch boundaries.

Without the extension built (no compiler or no libssl-dev where the hub was installed) the
C tests skip, and fail when ``AGORA_REQUIRE`` lists ``treehash`` (``.ci/run`` does).
"""

from __future__ import annotations

import hashlib
import re
import sys
import threading
from collections.abc import Callable, Sequence
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hub.checkpoints import root_hash
from hub.core import merkle
from hub.core.chain import canonical_bytes
from hub.core.events import MessagePayload, MessagePosted
from hub.core.merkle import extend_canonical_py, frontier_root
from hub.log.sqlite import SqliteEventStore
from tests.support.require import require

from . import rfc9162_reference as ref

Extend = Callable[
    [Sequence[bytes], int, Sequence[bytes], bool], tuple[list[bytes], tuple[bytes, ...]]
]


def c_extend() -> Extend:
    require("treehash", merkle.accelerated(), "hub/core/_treehash.c was not built")
    from hub.core._treehash import extend

    return extend


def grow(
    extend: Extend, batches: list[list[bytes]], grouped: bool
) -> tuple[list[bytes], tuple[bytes, ...]]:
    """Every batch through ``extend`` in turn, as the writer does; (all hashes, frontier)."""
    frontier: tuple[bytes, ...] = ()
    size = 0
    out: list[bytes] = []
    for batch in batches:
        hashes, frontier = extend(frontier, size, batch, grouped)
        out.extend(hashes)
        size += len(batch)
    return out, frontier


batches = st.lists(st.lists(st.binary(max_size=600), max_size=40), max_size=8)


@given(batches=batches, grouped=st.booleans())
def test_c_and_python_agree(batches: list[list[bytes]], grouped: bool) -> None:
    extend = c_extend()
    assert grow(extend, batches, grouped) == grow(extend_canonical_py, batches, grouped)


@given(batches=batches)
def test_the_root_is_rfc9162s(batches: list[list[bytes]]) -> None:
    extend = c_extend()
    data = [d for batch in batches for d in batch]
    flat, frontier = grow(extend, batches, grouped=False)
    grouped, same = grow(extend, batches, grouped=True)
    assert same == frontier and b"".join(grouped) == b"".join(flat)
    assert frontier_root(frontier) == ref.mth(data)
    # every leaf's own hash is stored first in its group
    assert [g[:32] for g in grouped] == [hashlib.sha256(b"\0" + d).digest() for d in data]


def test_a_large_tree_from_a_large_start() -> None:
    """A frontier of many levels (a size with 40 bits) and a batch crossing several powers
    of two: the stack in C is as deep as the Python one."""
    extend = c_extend()
    size = (1 << 40) - 3
    frontier = tuple(bytes([i]) * 32 for i in range(size.bit_count()))
    data = [bytes([i]) * i for i in range(70)]
    assert extend(frontier, size, data, True) == extend_canonical_py(frontier, size, data, True)
    assert extend(frontier, size, data, False) == extend_canonical_py(frontier, size, data, False)


@pytest.mark.parametrize(
    ("frontier", "size", "canonical", "error"),
    [
        ((), 1, [b"x"], ValueError),  # a frontier that does not match the size
        ((b"\0" * 31,), 1, [b"x"], ValueError),  # a hash that is not 32 bytes
        (("a" * 32,), 1, [b"x"], ValueError),  # not bytes
        ((), -1, [b"x"], ValueError),  # a negative size
        ((), 0, [b"x", "y"], TypeError),  # an item that is not bytes
        ((), 0, [b"x", bytearray(b"y")], TypeError),
    ],
)
def test_bad_input_is_refused_alike(
    frontier: tuple[object, ...], size: int, canonical: list[object], error: type[Exception]
) -> None:
    extend = c_extend()
    for implementation in (extend, extend_canonical_py):
        with pytest.raises(error):
            implementation(frontier, size, canonical, True)  # type: ignore[arg-type]


def test_the_input_list_may_change_while_it_hashes() -> None:
    """The GIL is released while the C version hashes a large input: another thread that
    empties the list it was given meanwhile must neither crash it nor change its answer (it
    hashes a tuple of its own, taken while it held the GIL)."""
    extend = c_extend()
    data = [bytes([i % 256]) * 4000 for i in range(2000)]  # 8 MB: tens of ms to hash
    expected = extend_canonical_py((), 0, data, True)
    interval = sys.getswitchinterval()
    # This thread is never asked to give the GIL up meanwhile, so the other one runs only
    # while the C code has let it go: the list is whole when the call takes it.
    sys.setswitchinterval(60.0)
    try:
        for _ in range(20):
            shared = list(data)
            go, emptied = threading.Event(), threading.Event()

            def meddle(
                shared: list[bytes] = shared,
                go: threading.Event = go,
                emptied: threading.Event = emptied,
            ) -> None:
                go.wait()
                shared.clear()
                emptied.set()

            thread = threading.Thread(target=meddle)
            thread.start()
            go.set()
            result = extend((), 0, shared, True)
            during = emptied.is_set()
            thread.join()
            assert result == expected
            if during:
                assert shared == []
                break
        else:
            pytest.fail("the other thread never ran while the C code hashed")
    finally:
        sys.setswitchinterval(interval)


# The C module is part of the pure core, but lint-imports reads Python imports only: this is
# its contract. It may include the Python API, libcrypto's digests and memcpy, and call nothing
# that reaches a file, a socket, a process or the environment.
C_SOURCE = Path(merkle.__file__).with_name("_treehash.c")
C_INCLUDES = {"Python.h", "openssl/evp.h", "string.h"}
C_FORBIDDEN = re.compile(
    r"\b(f?open|f?read|f?write|f?printf|puts|socket|connect|getenv|system|popen|exec(?:l|lp|le|v|vp|ve|vpe)|fork|"
    r"dlopen|mmap|syscall|ioctl|PyImport_\w+|PyRun_\w+|PyObject_Call\w*)\s*\("
)


def test_the_c_module_keeps_the_pure_cores_contract() -> None:
    code = re.sub(r"/\*.*?\*/", "", C_SOURCE.read_text("utf-8"), flags=re.S)  # not comments
    assert set(re.findall(r'#include\s*[<"]([^>"]+)[>"]', code)) == C_INCLUDES
    assert [m.group(1) for m in C_FORBIDDEN.finditer(code)] == []


def message(text: str) -> MessagePosted:
    return MessagePosted(producer="t", payload=MessagePayload(text=text))


async def _stored_tree(tmp_path: Path, name: str) -> tuple[bytes, list[bytes]]:
    """Append 100 events in batches of assorted sizes to a new SQLite log; (the writer's
    root, each event's canonical bytes)."""
    async with SqliteEventStore(tmp_path / f"{name}.db") as store:
        for count in (1, 2, 3, 5, 8, 13, 21, 47):
            await store.append("w", [message(f"{name}-{count}-{i}") for i in range(count)])
        head = store.tree_head("w")
        events = [e async for e in store.read("w")]
    assert head is not None and await store_root_matches(tmp_path / f"{name}.db", head.root)
    return head.root, [canonical_bytes(e) for e in events]


async def store_root_matches(db: Path, root: bytes) -> bool:
    """The stored hashes (read back by a fresh store) give the writer's root."""
    async with SqliteEventStore(db) as store:
        return await root_hash(store, "w", 100) == root


async def test_the_store_writes_the_same_tree_with_either(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    c_extend()
    root_c, data_c = await _stored_tree(tmp_path, "c")
    monkeypatch.setattr(merkle, "_extend_c", None)  # as where the extension was not built
    assert not merkle.accelerated()
    root_py, data_py = await _stored_tree(tmp_path, "py")
    assert root_c == ref.mth(data_c) and root_py == ref.mth(data_py)
