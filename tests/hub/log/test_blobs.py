"""The file blob store: content addressing, durability steps, limits and errors."""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

import pytest

from hub.core.errors import BadRequest, IntegrityError, NotFound, TooLarge
from hub.log.blobs import FileBlobStore


async def test_put_get_has(tmp_path: Path) -> None:
    blobs = FileBlobStore(tmp_path / "blobs")
    data = b"hello blobs" * 1000
    digest = await blobs.put(data)
    assert digest == hashlib.sha256(data).hexdigest()
    assert (tmp_path / "blobs" / digest[:2] / digest[2:]).read_bytes() == data
    assert await blobs.has(digest)
    assert await blobs.get(digest) == data
    assert not await blobs.has("0" * 64)


async def test_put_is_idempotent_and_leaves_no_temp_files(tmp_path: Path) -> None:
    blobs = FileBlobStore(tmp_path)
    digests = await asyncio.gather(*(blobs.put(b"same") for _ in range(10)))
    assert len(set(digests)) == 1
    files = await asyncio.to_thread(lambda: [p for p in tmp_path.rglob("*") if p.is_file()])
    assert [p.name for p in files] == [digests[0][2:]]


async def test_empty_blob(tmp_path: Path) -> None:
    blobs = FileBlobStore(tmp_path)
    digest = await blobs.put(b"")
    assert await blobs.get(digest) == b""


async def test_missing_blob_is_not_found(tmp_path: Path) -> None:
    blobs = FileBlobStore(tmp_path)
    with pytest.raises(NotFound):
        await blobs.get("ab" * 32)


@pytest.mark.parametrize("bad", ["", "xyz", "AB" * 32, "ab" * 31, "../" + "a" * 61])
async def test_malformed_ids_are_bad_requests(tmp_path: Path, bad: str) -> None:
    blobs = FileBlobStore(tmp_path)
    with pytest.raises(BadRequest):
        await blobs.get(bad)
    with pytest.raises(BadRequest):
        await blobs.has(bad)


async def test_size_limit(tmp_path: Path) -> None:
    blobs = FileBlobStore(tmp_path, max_bytes=10)
    assert await blobs.put(b"0123456789")
    with pytest.raises(TooLarge) as info:
        await blobs.put(b"01234567890")
    assert info.value.details["limit"] == 10
    with pytest.raises(ValueError):
        FileBlobStore(tmp_path, max_bytes=0)


async def test_a_damaged_blob_is_reported(tmp_path: Path) -> None:
    blobs = FileBlobStore(tmp_path)
    digest = await blobs.put(b"original")
    path = blobs.path_of(digest)
    os.chmod(path, 0o644)
    path.write_bytes(b"tampered")
    with pytest.raises(IntegrityError):
        await blobs.get(digest)
