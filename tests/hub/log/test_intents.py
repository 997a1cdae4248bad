"""hub.log.intents: the one intent → store → append → drop sequence of every writer that
stores a blob for an event (:class:`BlobStaging`), on every store kind. The crash paths of
each writer (a publish, a run's artifacts, a module sent whole) are in test_orphans.py; here
what a staging does with one blob several events of one write reference, and with a file."""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from hub.core.errors import Conflict
from hub.core.events import FileWritten, FileWrittenPayload
from hub.core.validation import Limits
from hub.log.base import EventStore
from hub.log.intents import BlobStaging
from hub.workspaces import Workspaces

LIMITS = Limits(blob_threshold=16)
CONTENT = b"content over the blob threshold, referenced twice by one write\n" * 4
SHA = hashlib.sha256(CONTENT).hexdigest()


class Crash(BaseException):
    """The process dying where it is raised."""


def write(event_id: str, path: str) -> FileWritten:
    return FileWritten(id=event_id, payload=FileWrittenPayload(path=path, text=CONTENT.decode()))


async def test_a_blob_of_two_events_stays_when_one_of_them_committed(store: EventStore) -> None:
    """One write stores the content for an event it never appends (refused, say), then
    appends another event with the same content: the blob stays, no intent is left."""
    ws = Workspaces(store, limits=LIMITS)
    async with BlobStaging(store, "w") as staged:
        assert await staged.put("never-appended", CONTENT) == SHA
        await ws.publish("w", [write("appended", "a.txt")], producer="alice", staged=staged)
        assert {i.event_id for i in staged.intents} == {"never-appended", "appended"}
    assert await store.blobs.get(SHA) == CONTENT
    assert await store.blobs.intents(math.inf) == ()
    assert (await ws.files("w"))["a.txt"].blob == SHA


async def test_a_blob_of_two_events_none_committed_is_swept_once(
    make_store: Callable[[str], EventStore],
) -> None:
    async with make_store("main") as store:
        with pytest.raises(Crash):
            async with BlobStaging(store, "w") as staged:
                await staged.put("first", CONTENT)
                await staged.put("second", CONTENT)  # one more intent, the blob not touched
                raise Crash
        assert len(await store.blobs.intents(math.inf)) == 2
    async with make_store("main") as store:
        assert await Workspaces(store).sweep_orphans(before=time.time()) == 1
        assert not await store.blobs.has(SHA)
        assert await store.blobs.intents(math.inf) == ()


async def test_a_refused_write_removes_its_blobs_as_the_staging_closes(store: EventStore) -> None:
    with pytest.raises(Conflict):
        async with BlobStaging(store, "w") as staged:
            await staged.put("refused", CONTENT)
            raise Conflict("refused after its blob was stored")
    assert not await store.blobs.has(SHA)
    assert await store.blobs.intents(math.inf) == ()


async def test_a_file_stored_already_is_touched_and_needs_no_intent(
    store: EventStore, tmp_path: Path
) -> None:
    """Someone else's blob (stored before this write) is only touched, so no sweep of an
    older intent takes it from under this write; a new one gets its intent and its stamp."""
    path = tmp_path / "a.bin"
    path.write_bytes(CONTENT)
    await store.blobs.put(CONTENT)
    async with BlobStaging(store, "w") as staged:
        assert await staged.put_file("e1", path) == (SHA, len(CONTENT))
        assert staged.intents == []
        other = tmp_path / "b.bin"
        other.write_bytes(b"new content")
        sha, _ = await staged.put_file("e2", other)
        (intent,) = staged.intents
        assert (intent.event_id, intent.sha256) == ("e2", sha)
        # Stored with the intent's stamp: untouched since, the sweep may remove it.
        assert await store.blobs.delete_untouched(sha, intent.stamp)
        await store.blobs.settle(intent)
        staged.intents.clear()
