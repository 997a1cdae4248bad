"""``agora serve`` sweeps at start the blobs a crash left between storing a publish's content
and committing its event (issue #11; the mechanism: tests/hub/log/test_orphans.py).

The crashed publish is played in-process over the data directory (the store's ``append``
dies, as under SIGKILL) an hour in the past, so its intent is older than the hub's grace
(``ORPHAN_GRACE_S``); then a real hub starts over that directory.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from hub.core.events import Event, FileWritten, FileWrittenPayload
from hub.core.records import AppendResult
from hub.log.factory import BLOBS_DIR_NAME, open_store
from hub.log.intents import ORPHAN_GRACE_S
from hub.workspaces import Workspaces
from tests.support.hub import StartHub
from tests.support.waiting import wait_for


class Crash(BaseException):
    """The process dying in the append."""


async def test_a_start_removes_the_blob_of_a_publish_a_crash_cut(
    tmp_path: Path, start_hub: StartHub, monkeypatch: pytest.MonkeyPatch
) -> None:
    data = tmp_path / "data"
    committed = "committed content, over the 64 KiB blob threshold\n" * 2000
    orphan = "content of a publish that never committed, over the threshold\n" * 2000
    committed_sha = hashlib.sha256(committed.encode()).hexdigest()
    orphan_sha = hashlib.sha256(orphan.encode()).hexdigest()
    blob_file = data / BLOBS_DIR_NAME / orphan_sha[:2] / orphan_sha[2:]

    async with open_store(None, data) as store:
        ws = Workspaces(store)
        await ws.publish(
            "w",
            [FileWritten(payload=FileWrittenPayload(path="kept.txt", text=committed))],
            producer="alice",
        )

        async def die(workspace: str, drafts: Sequence[Event], **kw: Any) -> AppendResult:
            raise Crash

        hour_ago = time.time_ns() - int(3600e9)
        assert ORPHAN_GRACE_S < 3600
        with monkeypatch.context() as m:
            m.setattr(store, "append", die)
            m.setattr(time, "time_ns", lambda: hour_ago)
            with pytest.raises(Crash):
                await ws.publish(
                    "w",
                    [FileWritten(payload=FileWrittenPayload(path="lost.txt", text=orphan))],
                    producer="alice",
                )
    assert blob_file.is_file()  # what main left behind until `agora blobs gc`

    start_hub(data_dir=data)
    intents = data / BLOBS_DIR_NAME / ".intents"
    await wait_for(lambda: not blob_file.is_file() and not any(intents.iterdir()))
    assert (data / BLOBS_DIR_NAME / committed_sha[:2] / committed_sha[2:]).is_file()
