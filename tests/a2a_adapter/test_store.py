"""a2a_adapter.store's TaskLocator: a bounded task id → workspace index, least recently used out."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from a2a_adapter.store import TaskLocator
from hub.core.events import NeedWork
from hub.log.sqlite import SqliteEventStore
from hub.workspaces import Workspaces


@pytest.fixture
async def workspaces(tmp_path: Path) -> AsyncIterator[Workspaces]:
    async with SqliteEventStore(tmp_path / "agora.db", blobs_dir=tmp_path / "blobs") as store:
        yield Workspaces(store)


async def open_items(workspaces: Workspaces, workspace: str, *ids: str) -> None:
    await workspaces.publish(
        workspace, [NeedWork(correlation_id=i, payload={"task": i}) for i in ids], producer="a"
    )


async def test_a_hit_keeps_an_entry_and_the_least_recently_used_goes(
    workspaces: Workspaces,
) -> None:
    locator = TaskLocator(workspaces, max_entries=2)
    locator.install()
    try:
        await open_items(workspaces, "w1", "t-a")
        await open_items(workspaces, "w2", "t-b")
        ref = await locator.locate("t-a", None)  # a hit: t-a is now the most recently used
        assert ref is not None and ref.workspace == "w1"
        await open_items(workspaces, "w3", "t-c")  # over the bound: t-b (not t-a) goes
        assert "t-a" in locator._where and "t-c" in locator._where
        assert "t-b" not in locator._where
        # an evicted id is still found, from the projections, and remembered again
        ref_b = await locator.locate("t-b", None)
        assert ref_b is not None and ref_b.workspace == "w2"
    finally:
        locator.uninstall()
