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

import pytest

from hub.core.errors import IntegrityError
from hub.core.events import MessagePayload, MessagePosted
from hub.log.base import EventStore
from hub.log.sqlite import SqliteEventStore

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
