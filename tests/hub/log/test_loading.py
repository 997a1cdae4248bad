"""Loading projections from a store (hub/log/loading.py), against an in-memory fake.

The fake implements only what loading uses (reads and snapshots); the real stores run the
store conformance suite under tests/hub/log.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hub.core.errors import IntegrityError
from hub.core.events import Event, MessagePosted, encode_event
from hub.core.projections import executions as journal_mod
from hub.core.projections.snapshots import SNAPSHOT_NAME, SNAPSHOT_VERSION, to_snapshot
from hub.core.projections.workspace import rebuild
from hub.core.records import JoinedPage, Snapshot
from hub.log import loading
from hub.log.base import EventStore
from hub.log.loading import (
    load_journal,
    load_state,
    rebuild_state,
    save_snapshot_if_due,
)
from tests.strategies import seal_all, valid_histories


class FakeStore(EventStore):
    """Events and snapshots in memory; counts the events it hands out."""

    def __init__(self, events: Sequence[Event] = ()) -> None:
        self.events: dict[str, list[Event]] = {}
        for ev in events:
            self.events.setdefault(ev.workspace, []).append(ev)
        self.snapshots: list[Snapshot] = []
        self.read_count = 0

    async def open(self) -> None:
        pass

    async def close(self) -> None:
        pass

    async def read_batch(
        self, workspace: str, *, after_seq: int = 0, until_seq: int | None = None, limit: int = 1000
    ) -> list[Event]:
        out = [
            e
            for e in self.events.get(workspace, [])
            if e.seq > after_seq and (until_seq is None or e.seq <= until_seq)
        ][:limit]
        self.read_count += len(out)
        return out

    async def save_snapshot(self, snapshot: Snapshot) -> None:
        self.snapshots.append(snapshot)

    async def load_snapshot(
        self, workspace: str, name: str, version: int, *, at_or_before: int | None = None
    ) -> Snapshot | None:
        found = [
            s
            for s in self.snapshots
            if (s.workspace, s.name, s.version) == (workspace, name, version)
            and (at_or_before is None or s.seq <= at_or_before)
        ]
        return max(found, key=lambda s: s.seq, default=None)

    async def delete_snapshots(self, workspace: str | None = None) -> int:
        n = len(self.snapshots)
        self.snapshots = [
            s for s in self.snapshots if workspace is not None and s.workspace != workspace
        ]
        return n - len(self.snapshots)


# The rest of the interface (append, heads, ...) is not used by loading; leaving it out keeps
# this fake independent of the store interface as it grows.
FakeStore.__abstractmethods__ = frozenset()


def _store(events: Sequence[Event] = ()) -> FakeStore:
    return FakeStore(events)  # type: ignore[abstract]


def _messages(n: int, workspace: str = "ws") -> list[Event]:
    return seal_all([("alice", MessagePosted())] * n, workspace)


async def test_unknown_workspace_is_empty() -> None:
    state = await load_state(_store(), "nope")
    assert state.seq == 0 and state.workspace == "nope"


async def test_load_uses_the_newest_snapshot_at_or_before_at_seq() -> None:
    history = _messages(20)
    store = _store(history)
    for seq in (5, 10, 15):
        await store.save_snapshot(to_snapshot(rebuild(history[:seq], "ws")))
    store.read_count = 0
    state = await load_state(store, "ws")
    assert state == rebuild(history, "ws") and store.read_count == 5
    store.read_count = 0
    state = await load_state(store, "ws", at_seq=12)
    assert state == rebuild(history[:12], "ws") and store.read_count == 2
    store.read_count = 0
    assert await load_state(store, "ws", at_seq=10) == rebuild(history[:10], "ws")
    assert store.read_count == 0
    assert await load_state(store, "ws", at_seq=0) == rebuild([], "ws")
    assert await load_state(store, "ws", at_seq=99) == rebuild(history, "ws")
    store.read_count = 0
    assert await load_state(store, "ws", use_snapshots=False) == rebuild(history, "ws")
    assert store.read_count == 20


async def test_bad_snapshots_are_ignored() -> None:
    history = _messages(8)
    store = _store(history)
    good = to_snapshot(rebuild(history[:4], "ws"))
    await store.save_snapshot(good)
    await store.save_snapshot(msgspec.structs.replace(good, seq=6, body=b"\x00not msgpack"))
    assert await load_state(store, "ws") == rebuild(history, "ws")
    # another version is never even asked for
    other = msgspec.structs.replace(good, version=SNAPSHOT_VERSION + 1, seq=7)
    await store.save_snapshot(other)
    assert await load_state(store, "ws") == rebuild(history, "ws")


async def test_paging(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loading, "READ_BATCH", 3)
    history = _messages(10)
    store = _store(history)
    assert await rebuild_state(store, "ws") == rebuild(history, "ws")
    assert await rebuild_state(store, "ws", at_seq=6) == rebuild(history[:6], "ws")
    assert await load_journal(store, "ws") == journal_mod.rebuild(history, "ws")


async def test_save_snapshot_if_due() -> None:
    history = _messages(25, "due")
    store = _store(history)
    with pytest.raises(ValueError):
        await save_snapshot_if_due(store, rebuild(history, "due"), 0, {})
    saved = []
    record: dict[str, int] = {}
    for n in range(1, 26):
        state = rebuild(history[:n], "due")
        if await save_snapshot_if_due(store, state, every=10, saved=record):
            saved.append(n)
    assert saved == [10, 20]
    assert [s.seq for s in store.snapshots] == [10, 20]
    assert all((s.name, s.version) == (SNAPSHOT_NAME, SNAPSHOT_VERSION) for s in store.snapshots)
    assert record == {"due": 20}
    # a new process (no record) asks the store for the last one
    assert not await save_snapshot_if_due(store, rebuild(history[:25], "due"), every=10, saved={})
    # deleting snapshots changes nothing but speed
    before = await load_state(store, "due")
    await store.delete_snapshots()
    assert await load_state(store, "due") == before


@settings(max_examples=60, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(valid_histories(max_size=40), st.data())
def test_snapshot_plus_tail_equals_rebuild(history: list[Event], data: st.DataObject) -> None:
    async def run() -> None:
        store = _store(history)
        at = data.draw(st.integers(0, len(history)))
        cut = data.draw(st.integers(0, at))
        if cut:
            await store.save_snapshot(to_snapshot(rebuild(history[:cut], "ws")))
        expected = rebuild(history[:at], "ws")
        assert await load_state(store, "ws", at_seq=at) == expected
        assert await rebuild_state(store, "ws", at_seq=at) == expected

    asyncio.run(run())


async def test_batches_straddling_a_multiple_still_snapshot() -> None:
    history = _messages(40, "straddle")
    store = _store(history)
    record: dict[str, int] = {}
    saved = [
        n
        for n in (7, 13, 19, 21, 26, 33, 40)
        if await save_snapshot_if_due(
            store, rebuild(history[:n], "straddle"), every=10, saved=record
        )
    ]
    assert saved == [13, 21, 33, 40]


class JoiningStore(FakeStore):
    """Joined pages of its own (as the real stores, not through read_batch), damaged on
    demand as a damaged row's bytes would be (or a kind this version does not know);
    counts the read_batch calls, which only a fallback to the events makes."""

    def __init__(self, events: Sequence[Event] = (), *, damaged: bool, bad_reads: bool = False):
        super().__init__(events)
        self.damaged = damaged
        self.bad_reads = bad_reads
        self.batches = 0

    async def read_joined(
        self, workspace: str, *, after_seq: int = 0, until_seq: int | None = None, limit: int = 1000
    ) -> JoinedPage:
        page = [
            e
            for e in self.events.get(workspace, [])
            if e.seq > after_seq and (until_seq is None or e.seq <= until_seq)
        ][:limit]
        body = b"[" + b",".join(map(encode_event, page)) + b"]"
        if self.damaged:
            body = body.replace(b"messagePosted", b"messageLost")
        return JoinedPage(body, len(page), page[-1].seq if page else after_seq)

    async def read_batch(
        self, workspace: str, *, after_seq: int = 0, until_seq: int | None = None, limit: int = 1000
    ) -> list[Event]:
        self.batches += 1
        if self.bad_reads:
            raise IntegrityError(f"stored event at seq {after_seq + 1} cannot be decoded")
        return await super().read_batch(
            workspace, after_seq=after_seq, until_seq=until_seq, limit=limit
        )


def _joining(history: Sequence[Event], *, damaged: bool, bad_reads: bool = False) -> JoiningStore:
    return JoiningStore(history, damaged=damaged, bad_reads=bad_reads)  # type: ignore[abstract]


async def test_loading_folds_the_joined_pages(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loading, "READ_BATCH", 4)
    history = _messages(10)
    store = _joining(history, damaged=False)
    assert await rebuild_state(store, "ws") == rebuild(history, "ws")
    assert await rebuild_state(store, "ws", at_seq=6) == rebuild(history[:6], "ws")
    assert store.batches == 0  # no event decoded in full


async def test_a_page_the_views_refuse_is_folded_from_the_events(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(loading, "READ_BATCH", 4)
    history = _messages(10)
    store = _joining(history, damaged=True)
    assert await rebuild_state(store, "ws") == rebuild(history, "ws")
    assert await rebuild_state(store, "ws", at_seq=6) == rebuild(history[:6], "ws")
    assert store.batches > 0
    before = asyncio.all_tasks()
    with pytest.raises(IntegrityError):  # what the events say of the damage reaches the caller
        await rebuild_state(_joining(history, damaged=True, bad_reads=True), "ws")
    assert asyncio.all_tasks() == before  # and the read ahead was stopped
