"""The owner of a workspace: a stable, in-range function of the name and the worker count."""

from __future__ import annotations

import collections

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hub.core.sharding import owner_of


@given(st.text(min_size=1, max_size=64), st.integers(1, 64))
def test_the_owner_is_in_range_and_the_same_every_time(workspace: str, workers: int) -> None:
    owner = owner_of(workspace, workers)
    assert 0 <= owner < workers
    assert owner_of(workspace, workers) == owner


@given(st.text(min_size=1, max_size=64))
def test_one_worker_owns_everything(workspace: str) -> None:
    assert owner_of(workspace, 1) == 0


def test_the_same_answer_in_every_process() -> None:
    """Fixed values: a salted or per-process hash would move them (workers would disagree)."""
    assert [owner_of(f"w-{n}", 2) for n in range(8)] == [0, 0, 1, 0, 1, 1, 1, 1]


def test_names_spread_over_the_workers() -> None:
    counts = collections.Counter(owner_of(f"team-{n}", 4) for n in range(4000))
    assert sorted(counts) == [0, 1, 2, 3]
    assert min(counts.values()) > 800  # 1000 each, give or take


def test_no_workers_is_refused() -> None:
    with pytest.raises(ValueError):
        owner_of("w", 0)
