"""The store factory: one URL scheme → one store class."""

from __future__ import annotations

from pathlib import Path

import pytest

from hub.core.errors import BadRequest, Unavailable
from hub.core.events import MessagePayload, MessagePosted
from hub.log.factory import open_store
from hub.log.sqlite import SqliteEventStore


def test_default_is_sqlite_in_the_data_dir(tmp_path: Path) -> None:
    data = tmp_path / "data"
    for url in (None, "", "sqlite://", "sqlite:///"):
        store = open_store(url, data)
        assert isinstance(store, SqliteEventStore)
        assert store.path == data / "agora.db"
        assert store.blob_root == data / "blobs"
    assert data.is_dir()


def test_sqlite_url_with_a_path(tmp_path: Path) -> None:
    target = tmp_path / "elsewhere" / "log.db"
    store = open_store(f"sqlite://{target}", tmp_path / "data")
    assert isinstance(store, SqliteEventStore)
    assert store.path == target
    assert store.blob_root == tmp_path / "data" / "blobs"


@pytest.mark.parametrize(
    "url", ["mysql://u:secret@h/db", "nonsense", "sqlite://host/x.db", "sqlite:///x.db?mode=ro"]
)
def test_unknown_or_malformed_urls(tmp_path: Path, url: str) -> None:
    with pytest.raises(BadRequest) as info:
        open_store(url, tmp_path)
    assert "secret" not in info.value.message


async def test_the_built_store_opens(tmp_path: Path) -> None:
    async with open_store(None, tmp_path) as store:
        assert await store.heads() == []
        assert (await store.append("ws", [_draft()])).seqs == [1]
    assert (tmp_path / "agora.db").is_file()


def _draft() -> MessagePosted:
    return MessagePosted(payload=MessagePayload(text="x"))


async def test_a_read_only_store_reads_and_never_writes(tmp_path: Path) -> None:
    """``read_only`` (agora verify's workers): SQLite opens the file ``mode=ro`` with no
    writer: it reads what is there, refuses writes, leaves the file as it was, and neither
    creates a missing data directory nor a missing file."""
    async with open_store(None, tmp_path) as store:
        await store.append("ws", [_draft(), _draft()])
    before = (tmp_path / "agora.db").read_bytes()
    async with open_store(None, tmp_path, read_only=True) as reader:
        assert isinstance(reader, SqliteEventStore) and reader.read_only
        assert [e.seq for e in await reader.read_batch("ws")] == [1, 2]
        assert [h.seq for h in await reader.heads()] == [2]
        with pytest.raises(Unavailable, match="read-only"):
            await reader.append("ws", [_draft()])
        with pytest.raises(Unavailable, match="read-only"):
            await reader.delete_snapshots("ws")
    assert (tmp_path / "agora.db").read_bytes() == before
    missing = tmp_path / "missing"
    with pytest.raises(Unavailable):
        await open_store(None, missing, read_only=True).open()
    assert not missing.exists()
