"""The file blob store under the orphan sweep's races (hub.log.blobs): a blob that a
concurrent publish or upload goes on to reference must never be removed by
:meth:`FileBlobStore.delete_untouched` for another publish's intent.

Each race is forced by holding one worker thread at a point both the store's code paths pass
(the threads are real, as ``asyncio.to_thread`` runs them in the hub), then letting the other
side run to completion.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
import threading
from pathlib import Path
from typing import Any

import pytest

import hub.log.blobs as blobs_module
from hub.log.blobs import FileBlobStore

DATA = b"inline content over the threshold, stored as a blob " * 8
SHA = hashlib.sha256(DATA).hexdigest()


async def test_two_puts_racing_keep_the_later_stamp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Publishes A and B of the same new content both find it absent and store it. B's intent
    is older, but its put installs the file last. A's batch is then refused and its intent
    swept at once: the blob B's committed event references must stay."""
    store = FileBlobStore(tmp_path)
    intent_b = await store.intend("ws-b", "event-b", SHA, len(DATA))
    intent_a = await store.intend("ws-a", "event-a", SHA, len(DATA))
    assert intent_b.stamp < intent_a.stamp

    real_mkdirs = blobs_module._mkdirs
    both_absent = threading.Barrier(2, timeout=10)
    first_in = threading.Event()
    first_done = threading.Event()
    arrivals: list[int] = []
    lock = threading.Lock()

    def mkdirs(directory: Path) -> list[Path]:
        # Reached by a put only once it found the blob absent: both are past that check.
        with lock:
            arrivals.append(1)
            n = len(arrivals)
        if n <= 2:
            if n == 1:
                first_in.set()
            both_absent.wait()
            if n == 2:
                assert first_done.wait(10)  # the second installs only after the first
        return real_mkdirs(directory)

    monkeypatch.setattr(blobs_module, "_mkdirs", mkdirs)
    put_a = asyncio.create_task(store.put(DATA, stamp=intent_a.stamp))
    assert await asyncio.to_thread(first_in.wait, 10)
    put_b = asyncio.create_task(store.put(DATA, stamp=intent_b.stamp))
    assert await put_a == SHA
    first_done.set()
    assert await put_b == SHA

    # A refused: its intent is swept. B committed an event referencing the blob.
    assert not await store.delete_untouched(SHA, intent_a.stamp)
    assert await store.get(SHA) == DATA


async def test_an_upload_committed_beside_a_put_keeps_the_stamp(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An agent's upload of the content commits while publish A stores the same content for
    its intent; A's file lands first, the upload's commit finds it absent but installs
    after. A refused and swept must not take the blob the agent's grant now names."""
    store = FileBlobStore(tmp_path)
    assert await store.upload_offset(SHA, len(DATA), uploader="agent") == 0
    await store.write_chunk(SHA, len(DATA), 0, DATA, uploader="agent")
    intent_a = await store.intend("ws-a", "event-a", SHA, len(DATA))

    real_mkdirs = blobs_module._mkdirs
    hold = threading.Event()
    held = threading.Event()

    def mkdirs(directory: Path) -> list[Path]:
        # Reached by the commit once it found no blob stored: the put stores it meanwhile.
        if not held.is_set():
            held.set()
            assert hold.wait(10)
        return real_mkdirs(directory)

    monkeypatch.setattr(blobs_module, "_mkdirs", mkdirs)
    commit = asyncio.create_task(store.commit(SHA, len(DATA), uploader="agent"))
    assert await asyncio.to_thread(held.wait, 10)

    def put_in_thread() -> None:
        asyncio.run(store.put(DATA, stamp=intent_a.stamp))

    thread = threading.Thread(target=put_in_thread, name="put")
    thread.start()
    await asyncio.to_thread(thread.join, 10)
    hold.set()
    await commit

    assert not await store.delete_untouched(SHA, intent_a.stamp)
    assert await store.get(SHA) == DATA


async def test_a_touch_racing_the_sweep_does_not_report_a_removed_blob(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Publish B finds the blob stored (touch) while A's refused batch sweeps it: either the
    touch wins (the blob stays) or it reports the blob absent (B stores it again). Never a
    touch that succeeds on a file the sweep has unlinked."""
    store = FileBlobStore(tmp_path)
    intent_a = await store.intend("ws-a", "event-a", SHA, len(DATA))
    await store.put(DATA, stamp=intent_a.stamp)
    loop = asyncio.get_running_loop()

    real_utime = os.utime
    swept: list[bool] = []

    def utime(target: Any, *args: Any, **kw: Any) -> None:
        if isinstance(target, int) and not swept:
            # Between the touch's open and its utime, the sweep runs to the end.
            swept.append(
                asyncio.run_coroutine_threadsafe(
                    store.delete_untouched(SHA, intent_a.stamp), loop
                ).result(10)
            )
        real_utime(target, *args, **kw)

    monkeypatch.setattr(os, "utime", utime)
    touched = await store.touch(SHA)
    monkeypatch.setattr(os, "utime", real_utime)

    assert swept == [True]  # the sweep did remove it
    assert not touched, "touch reported a blob the sweep had removed"
    assert not await store.has(SHA)


async def test_listing_beside_a_sweep_skips_a_blob_removed_meanwhile(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`agora blobs list`/`gc` beside a running hub: the hub's sweep may remove a blob
    between the listing of its directory and the stat of it. The listing goes on without it
    (before: the FileNotFoundError escaped, and the command died with a traceback)."""
    store = FileBlobStore(tmp_path)
    other = b"another blob, kept" * 8
    kept = await store.put(other)
    await store.put(DATA)
    victim = store.path_of(SHA)
    real_iterdir = Path.iterdir

    def iterdir(self: Path) -> Any:
        for entry in real_iterdir(self):
            if entry == victim:
                victim.unlink()  # listed, then removed by the sweep (delete_untouched)
            yield entry

    monkeypatch.setattr(Path, "iterdir", iterdir)
    listed = [sha async for sha, _, _ in store.list()]
    assert listed == [kept]
