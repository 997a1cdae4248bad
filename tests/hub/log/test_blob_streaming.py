"""Chunked blob uploads and ranged reads: the same behaviour on every store kind (SQLite's
file blobs and PostgreSQL's blob_parts), through the ``BlobStore`` interface only."""

from __future__ import annotations

import hashlib
import os
import time

import pytest

from hub.core.errors import BadRequest, NotFound, TooLarge
from hub.log.base import EventStore

CHUNK = 64 * 1024


async def _upload(store: EventStore, data: bytes, chunk: int = CHUNK) -> str:
    sha = hashlib.sha256(data).hexdigest()
    blobs = store.blobs
    offset = await blobs.upload_offset(sha, len(data))
    while offset < len(data):
        offset = await blobs.write_chunk(sha, len(data), offset, data[offset : offset + chunk])
    await blobs.commit(sha, len(data))
    return sha


async def test_chunked_upload_then_ranged_reads(store: EventStore) -> None:
    data = os.urandom(5 * CHUNK + 123)
    sha = await _upload(store, data)
    blobs = store.blobs
    assert await blobs.has(sha)
    assert await blobs.size(sha) == len(data)
    assert await blobs.get(sha) == data
    for offset, length in [(0, 10), (CHUNK - 5, 10), (3 * CHUNK, 2 * CHUNK + 500), (len(data), 9)]:
        assert await blobs.read(sha, offset, length) == data[offset : offset + length]
    await blobs.check(sha)
    listed = {s: n async for s, n, _ in blobs.list()}
    assert listed[sha] == len(data)


async def test_small_put_is_readable_by_range(store: EventStore) -> None:
    sha = await store.blobs.put(b"0123456789")
    assert await store.blobs.size(sha) == 10
    assert await store.blobs.read(sha, 3, 4) == b"3456"


async def test_resume_after_interruption(store: EventStore) -> None:
    data = os.urandom(4 * CHUNK)
    sha = hashlib.sha256(data).hexdigest()
    blobs = store.blobs
    assert await blobs.upload_offset(sha, len(data)) == 0
    await blobs.write_chunk(sha, len(data), 0, data[:CHUNK])
    await blobs.write_chunk(sha, len(data), CHUNK, data[CHUNK : 2 * CHUNK])
    # A new connection asks where to resume; a chunk sent twice is harmless.
    offset = await blobs.upload_offset(sha, len(data))
    assert offset == 2 * CHUNK
    await blobs.write_chunk(sha, len(data), CHUNK, data[CHUNK : 2 * CHUNK])
    # Resumed with another chunk size: overlapping chunks stitch to the same bytes.
    await blobs.write_chunk(sha, len(data), offset - 100, data[offset - 100 :])
    await blobs.commit(sha, len(data))
    assert await blobs.get(sha) == data
    assert await blobs.upload_offset(sha, len(data)) == len(data)  # stored: nothing to send


async def test_gap_incomplete_and_wrong_hash_are_refused(store: EventStore) -> None:
    data = os.urandom(2 * CHUNK)
    sha = hashlib.sha256(data).hexdigest()
    blobs = store.blobs
    await blobs.upload_offset(sha, len(data))
    with pytest.raises(BadRequest):
        await blobs.write_chunk(sha, len(data), CHUNK, data[CHUNK:])  # a gap
    with pytest.raises(BadRequest):
        await blobs.write_chunk(sha, len(data), 0, data + b"x")  # past the size
    await blobs.write_chunk(sha, len(data), 0, data[:CHUNK])
    with pytest.raises(BadRequest):
        await blobs.commit(sha, len(data))  # incomplete
    await blobs.write_chunk(sha, len(data), CHUNK, os.urandom(CHUNK))  # other bytes
    with pytest.raises(BadRequest) as info:
        await blobs.commit(sha, len(data))
    assert "hash" in info.value.message
    assert not await blobs.has(sha)
    assert await blobs.upload_offset(sha, len(data)) == 0  # discarded


async def test_missing_blob_and_limits(store: EventStore) -> None:
    blobs = store.blobs
    with pytest.raises(NotFound):
        await blobs.size("ab" * 32)
    with pytest.raises(NotFound):
        await blobs.read("ab" * 32, 0, 1)
    with pytest.raises(TooLarge):
        await blobs.upload_offset("ab" * 32, 1 << 40)
    sha = await blobs.put(b"abc")
    with pytest.raises(BadRequest):
        await blobs.read(sha, 4, 1)


async def test_delete(store: EventStore) -> None:
    sha = await _upload(store, os.urandom(3 * CHUNK))
    small = await store.blobs.put(b"small")
    assert await store.blobs.delete(sha)
    assert await store.blobs.delete(small)
    assert not await store.blobs.delete(small)
    assert not await store.blobs.has(sha)
    assert [s async for s, _, _ in store.blobs.list()] == []


async def test_empty_blob_upload(store: EventStore) -> None:
    sha = await _upload(store, b"")
    assert await store.blobs.get(sha) == b""
    assert await store.blobs.read(sha, 0, 10) == b""


async def test_abandoned_uploads_are_purged(store: EventStore) -> None:
    data = os.urandom(2 * CHUNK)
    sha = hashlib.sha256(data).hexdigest()
    await store.blobs.upload_offset(sha, len(data))
    await store.blobs.write_chunk(sha, len(data), 0, data[:CHUNK])
    assert await store.blobs.purge_uploads(time.time() - 3600) == 0  # still fresh
    assert await store.blobs.purge_uploads(time.time() + 1) == 1
    assert await store.blobs.upload_offset(sha, len(data)) == 0
