"""hub/runtime/retention.py: which finished executions retention prunes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hub.runtime.retention import Finished, prunable

HOUR = 3_600_000


def test_the_newest_are_kept_whatever_their_age() -> None:
    old = [Finished(f"e{i}", i, 0) for i in range(1, 6)]
    assert prunable(old, 10 * HOUR, keep=5) == []
    assert prunable(old, 10 * HOUR, keep=3) == ["e1", "e2"]


def test_young_executions_beyond_the_newest_are_kept() -> None:
    now = 10 * HOUR
    items = [Finished("old", 1, now - 2 * HOUR), Finished("young", 2, now - 1000)]
    items += [Finished(f"n{i}", 10 + i, now) for i in range(2)]
    assert prunable(items, now, keep=2, window_ms=HOUR) == ["old"]


def test_invalid_bounds() -> None:
    with pytest.raises(ValueError):
        prunable([], 0, keep=-1)


@given(
    st.lists(st.integers(min_value=0, max_value=10 * HOUR), max_size=40),
    st.integers(min_value=0, max_value=20),
)
def test_pruned_are_beyond_keep_and_old(times: list[int], keep: int) -> None:
    items = [Finished(f"e{i}", i + 1, t) for i, t in enumerate(times)]
    now = 10 * HOUR
    pruned = set(prunable(items, now, keep=keep, window_ms=HOUR))
    newest = {f.exec_id for f in sorted(items, key=lambda f: -f.finished_seq)[:keep]}
    assert not pruned & newest
    for f in items:
        should = f.exec_id not in newest and f.finished_at <= now - HOUR
        assert (f.exec_id in pruned) == should
