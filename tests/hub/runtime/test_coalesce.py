"""hub/runtime/coalesce.py: the pure output coalescer (hypothesis for the invariants)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hub.runtime.coalesce import Coalescer, Flush


def test_small_writes_wait_for_the_interval() -> None:
    c = Coalescer(interval=0.05, max_bytes=64)
    assert c.feed("stdout", b"a", 0.0) == []
    assert c.feed("stdout", b"b", 0.01) == []
    assert c.deadline() == pytest.approx(0.05)
    assert c.due(0.049) == []
    assert c.due(0.05) == [Flush("stdout", 1, b"ab")]
    assert c.deadline() is None and c.pending == 0


def test_a_full_buffer_flushes_at_once_in_pieces() -> None:
    c = Coalescer(interval=0.05, max_bytes=4)
    assert c.feed("stdout", b"0123456789", 0.0) == [
        Flush("stdout", 1, b"0123"),
        Flush("stdout", 2, b"4567"),
    ]
    assert c.pending == 2 and c.deadline() == pytest.approx(0.05)
    assert c.drain() == [Flush("stdout", 3, b"89")]


def test_streams_are_buffered_apart_and_numbered_together() -> None:
    c = Coalescer(interval=0.05, max_bytes=100)
    c.feed("stderr", b"e1", 0.00)
    c.feed("stdout", b"o1", 0.02)
    c.feed("stderr", b"e2", 0.03)
    assert c.due(0.06) == [Flush("stderr", 1, b"e1e2")]
    assert c.due(0.07) == [Flush("stdout", 2, b"o1")]


def test_drain_is_oldest_first_and_first_n_continues() -> None:
    c = Coalescer(first_n=5)
    c.feed("stdout", b"late", 1.0)
    c.feed("stderr", b"early", 0.5)
    assert c.drain() == [Flush("stderr", 5, b"early"), Flush("stdout", 6, b"late")]
    assert c.drain() == [] and c.n == 6


def test_invalid_settings() -> None:
    with pytest.raises(ValueError):
        Coalescer(max_bytes=0)


writes = st.lists(
    st.tuples(
        st.sampled_from(["stdout", "stderr"]),
        st.binary(max_size=300),
        st.floats(min_value=0, max_value=0.2),
    ),
    max_size=60,
)


@given(writes, st.integers(min_value=1, max_value=128))
def test_bytes_are_kept_in_order_numbered_contiguously_and_bounded(
    ops: list[tuple[str, bytes, float]], max_bytes: int
) -> None:
    c = Coalescer(interval=0.05, max_bytes=max_bytes)
    now = 0.0
    flushes: list[Flush] = []
    for stream, data, step in ops:
        now += step
        flushes += c.due(now)
        flushes += c.feed(stream, data, now)  # type: ignore[arg-type]
    flushes += c.drain()
    assert [f.n for f in flushes] == list(range(1, len(flushes) + 1))
    assert all(0 < len(f.data) <= max_bytes for f in flushes)
    for stream in ("stdout", "stderr"):
        written = b"".join(d for s, d, _ in ops if s == stream)
        assert b"".join(f.data for f in flushes if f.stream == stream) == written
    assert c.pending == 0 and c.deadline() is None
