"""A log that already holds an event nested too deep for recursive readers (written before the
nesting limit existed) breaks no reader: reads raise IntegrityError naming the row, `agora
verify` names the workspace and seq and goes on, replay/state fail with a message, never a
traceback (issue 11). On both stores."""

from __future__ import annotations

import asyncio
import sqlite3
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest

from a2a_adapter.app import JSONRPC_PATH
from hub.core.errors import IntegrityError
from hub.core.events import MessagePayload, MessagePosted
from hub.core.projections.snapshots import to_snapshot
from hub.core.projections.workspace import rebuild
from hub.log.base import EventStore
from hub.log.sqlite import SqliteEventStore
from tests.support.hub import HubStarter
from tests.support.peer import peer
from tests.support.tokens import mint

REPO = Path(__file__).resolve().parents[3]


def nested(depth: int) -> object:
    value: object = []
    for _ in range(depth):
        value = [value]
    return value


async def plant(store: EventStore) -> None:
    """What the hub wrote before the limit: a message whose data nests 900 levels deep (the
    store itself never refused it; the door does now)."""
    await store.append("good", [MessagePosted(producer="a", payload=MessagePayload(text="ok"))])
    await store.append("bad", [MessagePosted(producer="a", payload=MessagePayload(text="hi"))])
    await store.append(
        "bad", [MessagePosted(producer="a", payload=MessagePayload(data=nested(900)))]
    )


def as_written_before_schema_2(store: EventStore) -> None:
    """Mark a SQLite file as the previous hub left it (schema 1): opened again, it is flagged
    as holding events that were not bounded on write, and its readers check every page."""
    if isinstance(store, SqliteEventStore):
        with sqlite3.connect(store.path) as conn:
            conn.execute("PRAGMA user_version=1")
        conn.close()


async def test_reading_a_poison_event_names_its_row(
    make_store: Callable[[str], EventStore],
) -> None:
    async with make_store("main") as planted:
        await plant(planted)
    as_written_before_schema_2(planted)
    async with make_store("main") as store:
        await check_reads(store)


async def check_reads(store: EventStore) -> None:
    with pytest.raises(IntegrityError) as info:
        [ev async for ev in store.read("bad")]
    assert info.value.details == {"seq": 2}
    with pytest.raises(IntegrityError) as info:  # the replay fold's undecoded pages too
        await store.read_joined("bad")
    assert info.value.details == {"seq": 2}
    # The raw read is verbatim (export copies it); the doors check it (Workspaces.read_raw).
    assert [seq for seq, _ in await store.read_raw("bad")] == [1, 2]
    assert [ev.seq async for ev in store.read("bad", until_seq=1)] == [1]
    assert [ev.seq async for ev in store.read("good")] == [1]
    report = await store.verify("good")
    assert report.ok


def agora(data: Path, *argv: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "hub", *argv, "--data", str(data)],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )


async def _plant_sqlite(data: Path) -> None:
    async with SqliteEventStore(data / "agora.db", blobs_dir=data / "blobs") as store:
        await plant(store)
    as_written_before_schema_2(store)


def test_the_audit_commands_report_a_poison_event_and_go_on(tmp_path: Path) -> None:
    data = tmp_path / "data"
    asyncio.run(_plant_sqlite(data))
    verify = agora(data, "verify")
    assert verify.returncode == 1
    assert "ok good 1 events" in verify.stdout
    assert "workspace bad: stored event at seq 2" in verify.stderr
    for argv in (("replay", "bad"), ("state", "bad")):
        done = agora(data, *argv)
        assert done.returncode != 0, argv
        assert "seq 2" in done.stderr and "Traceback" not in done.stderr, (argv, done.stderr)
    assert agora(data, "replay", "good").returncode == 0
    # export copies the log verbatim; the import door refuses the poison line by its depth
    exported = agora(data, "export", "bad")
    assert exported.returncode == 0
    restored = agora(tmp_path / "copy", "import", "bad", stdin=exported.stdout)
    assert restored.returncode == 1 and "Traceback" not in restored.stderr
    assert "line 2" in restored.stderr and "nested deeper than the limit" in restored.stderr


async def test_only_a_file_from_before_the_limit_is_checked_on_every_read(tmp_path: Path) -> None:
    async with SqliteEventStore(tmp_path / "new.db", blobs_dir=tmp_path / "b") as fresh:
        await fresh.append("w", [MessagePosted(producer="a", payload=MessagePayload(text="x"))])
        assert fresh.legacy_depth is False  # bounded on write: the fast read skips the check
    as_written_before_schema_2(fresh)
    async with SqliteEventStore(tmp_path / "new.db", blobs_dir=tmp_path / "b") as upgraded:
        assert upgraded.legacy_depth is True
    async with SqliteEventStore(tmp_path / "new.db", blobs_dir=tmp_path / "b") as again:
        assert again.legacy_depth is True  # the flag is kept in the file


async def test_the_hub_refuses_a_subscription_that_would_hand_on_a_poison_event(
    tmp_path: Path,
) -> None:
    """A subscriber's catch-up hands the stored bytes on undecoded: it sent the event nested
    900 levels deep to the client (whose own reader may not survive it). The hub now finds it
    as every other reader does and quarantines the workspace: the subscriber, and every
    later request for it, gets ``unavailable`` with the reason; the other workspaces are
    served. The workspace's state comes from a snapshot taken after the poison, so opening it
    does not read the poison and the catch-up is the first reader to meet it."""
    data = tmp_path / "data"
    starter = HubStarter(tmp_path)
    try:
        hub = starter.start(
            data_dir=data, a2a_port=0
        )  # its recovery index: later starts read only what
        assert hub.terminate() == 0  # it names (open executions, present members): not "bad"
        async with SqliteEventStore(data / "agora.db", blobs_dir=data / "blobs") as store:
            await plant(store)
            text = MessagePayload(text="x")
            await store.append("bad", [MessagePosted(producer="a", payload=text)])
            history = await store.read_batch("bad")  # a new file's reads do not check depth
            await store.save_snapshot(to_snapshot(rebuild(history, "bad")))
        as_written_before_schema_2(store)
        hub.restart()
        # The A2A adapter's task index, its first reader here: it answered ``internal`` (and
        # ListTasks mapped every hub error to InvalidParams, -32602: the caller's fault).
        token = mint("peer", ["bad"], ["read", "write"])
        headers = {"Authorization": f"Bearer {token}", "A2A-Version": "1.0"}
        async with httpx.AsyncClient(base_url=hub.a2a_url, headers=headers, timeout=30) as http:
            call = {"jsonrpc": "2.0", "id": 1, "method": "ListTasks", "params": {}}
            error = (await http.post(JSONRPC_PATH, json=call)).json()["error"]
        [info] = error["data"]  # (a server error: its details are not told)
        assert (error["code"], info["metadata"]) == (-32603, {"agoraCode": "unavailable"}), error
        assert hub.terminate() == 0
        hub.restart()  # the quarantine is found anew by the next start's first reader
        async with peer(hub.url, hub.token("alice")) as p:
            assert (await p.head("bad")) == 3  # opened from the snapshot
            await p.send({"op": "subscribe", "rid": 1, "workspace": "bad", "afterSeq": 0})
            async with asyncio.timeout(30):
                while True:
                    frame = await p.recv()
                    assert frame.get("op") != "event", frame  # nothing of "bad" is handed on
                    if frame.get("op") == "error":
                        break
            assert (frame["rid"], frame["code"]) == (1, "unavailable"), frame
            assert "IntegrityError" in frame["details"]["quarantined"], frame
            again = await p.call("state", workspace="bad")
            assert (again["op"], again["code"]) == ("error", "unavailable"), again
            assert (await p.head("good")) == 1
    finally:
        starter.close()
