"""The owner of a workspace: a stable, in-range function of the name and the worker count; and
the owner among nodes (rendezvous hashing): one of them, whatever their order, and a node that
leaves or joins moves only the workspaces it owned or now wins."""

from __future__ import annotations

import collections

import pytest
from hypothesis import given
from hypothesis import strategies as st

from hub.core.sharding import node_owner_of, owner_of


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


NODE_IDS = st.from_regex(r"[A-Za-z0-9._-]{1,16}", fullmatch=True)


@given(st.text(min_size=1, max_size=64), st.sets(NODE_IDS, min_size=1, max_size=8))
def test_the_node_owner_is_one_of_them_in_any_order(workspace: str, nodes: set[str]) -> None:
    owner = node_owner_of(workspace, sorted(nodes))
    assert owner in nodes
    assert node_owner_of(workspace, sorted(nodes, reverse=True)) == owner


@given(
    st.lists(st.text(min_size=1, max_size=16), min_size=1, max_size=40),
    st.sets(NODE_IDS, min_size=2, max_size=6),
    st.data(),
)
def test_a_node_leaving_moves_only_its_own_workspaces(
    workspaces: list[str], nodes: set[str], data: st.DataObject
) -> None:
    gone = data.draw(st.sampled_from(sorted(nodes)))
    rest = nodes - {gone}
    for workspace in workspaces:
        before = node_owner_of(workspace, nodes)
        after = node_owner_of(workspace, rest)
        assert after == before or before == gone  # (and back when it joins again)
        assert after in rest


def test_no_nodes_no_owner() -> None:
    assert node_owner_of("w", []) is None


def test_the_same_node_owner_in_every_process() -> None:
    """Fixed values: every node must compute the same owner."""
    spread = [node_owner_of(f"w-{n}", ["node-a", "node-b"]) for n in range(8)]
    assert spread == ["node-a"] * 4 + ["node-b", "node-a", "node-b", "node-a"]


def test_workspaces_spread_over_the_nodes() -> None:
    counts = collections.Counter(node_owner_of(f"w-{n}", ["a", "b", "c"]) for n in range(3000))
    assert all(900 < counts[n] < 1100 for n in "abc"), counts
