"""Fixtures of the log store tests: every store kind (:data:`tests.hub.log.stores.STORE_KINDS`)
behind the same ``EventStore`` interface; each test's PostgreSQL schemas are dropped after it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest

from hub.log.base import EventStore
from tests.hub.log.stores import STORE_KINDS, StoreKind


@pytest.fixture(params=sorted(STORE_KINDS))
def store_kind(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreKind]:
    """Each kind in turn; after the test (and after its stores closed), its leftovers go."""
    kind: StoreKind = STORE_KINDS[request.param]
    yield kind
    kind.cleanup(tmp_path)


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
