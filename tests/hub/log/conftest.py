"""Fixtures of the log store tests: every store kind behind the same ``EventStore`` interface.

``STORE_KINDS`` maps a kind to a :class:`StoreKind`: how to build a store over some named,
initially empty storage, and a backdoor to damage stored rows (for the tamper tests, which
must bypass the interface). Adding PostgreSQL is one entry whose ``build`` starts with
``tests.conftest.require("postgres", available, why)`` so the kind skips (or fails in CI)
where no server runs.
"""

from __future__ import annotations

import sqlite3
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from hub.log.base import EventStore
from hub.log.sqlite import SqliteEventStore


@dataclass(frozen=True)
class StoreKind:
    """``build(tmp_path, name)``: an unopened store over storage ``name`` (same name, same
    data). ``corrupt_body``/``delete_row``: edit the stored event ``(workspace, seq)``
    directly, behind the store's back."""

    build: Callable[[Path, str], EventStore]
    corrupt_body: Callable[[EventStore, str, int, Callable[[bytes], bytes]], None]
    delete_row: Callable[[EventStore, str, int], None]


def _sqlite_build(tmp_path: Path, name: str) -> EventStore:
    return SqliteEventStore(tmp_path / f"{name}.db", blobs_dir=tmp_path / f"{name}-blobs")


def _sqlite_path(store: EventStore) -> Path:
    assert isinstance(store, SqliteEventStore)
    return store.path


def _sqlite_corrupt(
    store: EventStore, workspace: str, seq: int, edit: Callable[[bytes], bytes]
) -> None:
    with sqlite3.connect(_sqlite_path(store)) as conn:
        (body,) = conn.execute(
            "SELECT body FROM events WHERE workspace = ? AND seq = ?", (workspace, seq)
        ).fetchone()
        conn.execute(
            "UPDATE events SET body = ? WHERE workspace = ? AND seq = ?",
            (edit(bytes(body)), workspace, seq),
        )
    conn.close()


def _sqlite_delete(store: EventStore, workspace: str, seq: int) -> None:
    with sqlite3.connect(_sqlite_path(store)) as conn:
        conn.execute("DELETE FROM events WHERE workspace = ? AND seq = ?", (workspace, seq))
    conn.close()


STORE_KINDS: dict[str, StoreKind] = {
    "sqlite": StoreKind(_sqlite_build, _sqlite_corrupt, _sqlite_delete),
}


@pytest.fixture(params=sorted(STORE_KINDS))
def store_kind(request: pytest.FixtureRequest) -> StoreKind:
    kind: StoreKind = STORE_KINDS[request.param]
    return kind


@pytest.fixture
def make_store(store_kind: StoreKind, tmp_path: Path) -> Callable[[str], EventStore]:
    """``make_store(name)``: an unopened store of this kind over storage ``name``."""

    def make(name: str = "main") -> EventStore:
        return store_kind.build(tmp_path, name)

    return make


@pytest.fixture
async def store(make_store: Callable[[str], EventStore]) -> AsyncIterator[EventStore]:
    """An open, empty store; closed after the test."""
    async with make_store("main") as s:
        yield s
